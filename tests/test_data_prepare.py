"""``bertforge prepare``: inputs (formats, compression, bad data), shard contents and statistics,
determinism (runs, workers, machines), resuming, and the command line."""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import shutil

import numpy as np
import pytest
from data_fixtures import (
    CLS,
    MASK,
    SEP,
    SPECIAL,
    TOKENS,
    check_layout,
    documents,
    expected_mask_count,
    google_words,
    original_ids,
    read_instances,
    shard_hashes,
    tokenize_docs,
    write_bytes,
    write_google,
    write_jsonl,
    write_text,
    write_wiki_json,
)

import bertforge.data.prepare as prepare_module
from bertforge.cli import main
from bertforge.data.corpus import (
    CorpusStats,
    expand_inputs,
    iter_documents,
    split_sentences,
)
from bertforge.data.instances import create_packed_instances
from bertforge.data.loader import PretrainingDataset, PretrainingLoader
from bertforge.data.prepare import PrepareConfig, format_stats, load_manifest, prepare
from bertforge.data.shards import ShardError
from bertforge.text.tokenizer import BertTokenizer

BASE = {"max_seq_length": 64, "dupe_factor": 2, "shard_chars": 15_000}


def run(inputs, out, tok_dir, workers=1, **cfg):
    return prepare([str(i) for i in inputs], out, tok_dir, PrepareConfig(**{**BASE, **cfg}), workers=workers,
                   progress=False)


def sentences_of(files, **kw):
    stats = CorpusStats()
    docs = [d.sentences() for d in iter_documents(files, stats=stats, **kw)]
    return docs, stats


@pytest.fixture(scope="module")
def docs():
    """120 documents of 1-30 sentences, a few of one sentence."""
    d = documents(seed=1, n_docs=120, min_sents=3, max_sents=30)
    for k in range(0, 120, 15):
        d[k] = d[k][:1]
    return d


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, docs):
    """The documents in Google's format, split over a plain and a gzipped file."""
    folder = tmp_path_factory.mktemp("corpus")
    write_google(folder / "part-0.txt", docs[:60])
    write_google(folder / "part-1.txt.gz", docs[60:])
    return folder


@pytest.fixture(scope="module")
def base(tmp_path_factory, corpus, tok_dir):
    out = tmp_path_factory.mktemp("base") / "data"
    manifest = run([corpus / "part-*"], out, tok_dir)
    return out, manifest


# ------------------------------------------------------------------------------ inputs
def test_globs_expand_sorted_and_missing_inputs_fail(tmp_path, tok_dir):
    for name in ("b.txt", "a.txt", "c.txt.gz", "sub/d.txt"):
        write_google(tmp_path / name, [["One sentence."]])
    assert expand_inputs([tmp_path / "*.txt*"]) == [tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "c.txt.gz"]
    assert expand_inputs([str(tmp_path / "**" / "d.txt"), tmp_path / "b.txt"]) == [tmp_path / "sub/d.txt",
                                                                                    tmp_path / "b.txt"]
    with pytest.raises(FileNotFoundError, match="nothing.txt"):
        expand_inputs([tmp_path / "a.txt", tmp_path / "nothing.txt"])
    with pytest.raises(FileNotFoundError, match=r"\*\.jsonl"):
        expand_inputs([tmp_path / "*.jsonl"])
    with pytest.raises(FileNotFoundError):
        expand_inputs([tmp_path / "sub"])  # a folder is not an input file
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        run([tmp_path / "a.txt", tmp_path / "missing.txt"], tmp_path / "out", tok_dir)
    assert not (tmp_path / "out").exists()  # nothing written for a bad call


def test_formats_and_compression_give_the_same_documents(tmp_path, docs):
    sample = docs[:25]
    files = {
        "google": [write_google(tmp_path / f"g{s}", sample) for s in (".txt", ".txt.gz", ".txt.bz2", ".txt.xz")],
        "text": [write_text(tmp_path / f"t{s}", sample) for s in (".txt", ".txt.bz2")],
        "jsonl": [write_jsonl(tmp_path / f"j{s}", sample) for s in (".jsonl", ".jsonl.gz", ".jsonl.xz")],
        "wiki-json": [write_wiki_json(tmp_path / f"w{s}", sample) for s in (".json", ".json.gz", ".json.bz2")],
    }
    # Prose is split into sentences (blingfire): mostly back into the generated sentences.
    split = [split_sentences(" ".join(d)) for d in sample]
    assert sum(a == b for a, b in zip(split, sample)) >= 20
    for fmt, paths in files.items():
        for path in paths:
            for how in (fmt, "auto") if fmt != "text" else (fmt,):
                got, stats = sentences_of([path], fmt=how)
                assert got == (sample if fmt == "google" else split), (path, how)
                assert stats.files == 1 and stats.documents == 25
                if fmt == "google":
                    assert stats.characters == sum(len(s) for d in sample for s in d)
    # plain text read as Google's format: each paragraph line is one "sentence"
    got, _ = sentences_of([files["text"][0]], fmt="google")
    assert got == [[" ".join(d)] for d in sample]


def test_blank_lines_and_whitespace_do_not_make_documents(tmp_path):
    path = write_bytes(tmp_path / "g.txt", b"\n\n  \nFirst one.\nFirst two.\n\n\n \t \n\nSecond one.\r\n\r\n")
    got, stats = sentences_of([path])
    assert got == [["First one.", "First two."], ["Second one."]]
    assert stats.documents == 2 and stats.empty_documents == 0


def test_invalid_utf8_is_counted_and_the_text_around_kept(tmp_path, tok_dir, tokenizer):
    good = documents(seed=5, n_docs=6, min_sents=3, max_sents=5)
    raw = ("\n\n".join("\n".join(d) for d in good)).encode()
    bad_line = b"Good house \xff\xfe more tree."
    raw = raw.replace(good[2][1].encode(), bad_line, 1) + b"\n"
    path = write_bytes(tmp_path / "g.txt", raw)
    line_no = raw[:raw.index(bad_line)].count(b"\n") + 1
    got, stats = sentences_of([path])
    assert stats.invalid_utf8_lines == 1
    assert stats.first_problem["invalid_utf8_lines"] == f"{path}:{line_no}"
    assert got[2][1] == "Good house \ufffd\ufffd more tree."
    assert got[2][0] == good[2][0] and got[3] == good[3]

    # prepared (packed, unmasked, so every token is in the output once): the words either side
    # of the bad bytes are there, the bad bytes are dropped (not [UNK]).
    out = tmp_path / "data"
    manifest = run([path], out, tok_dir, nsp=False, dynamic_masking=True, dupe_factor=1)
    assert manifest["corpus"]["invalid_utf8_lines"] == 1
    words = tokenizer.convert_tokens_to_ids(["good", "house", "more", "tree", "."])
    streams = [x.input_ids.tolist() for x in read_instances(out)]
    assert any(words == s[i:i + 5] for s in streams for i in range(len(s)))
    assert not any(tokenizer.convert_tokens_to_ids("[UNK]") in s for s in streams)
    assert "invalid UTF-8 lines 1" in format_stats(manifest)


def test_overlong_lines_are_skipped_and_counted(tmp_path):
    limit = 1_000_000
    lines = [b"Before one.", b"a" * (limit + 1), b"Middle " + b"x" * (limit - 7), "\u00e9".encode() * (limit + 1),
             b"b" * (4 * limit + 1), b"After one."]
    path = write_bytes(tmp_path / "g.txt.gz", b"\n".join(lines) + b"\n")
    got, stats = sentences_of([path])
    assert stats.long_lines_skipped == 3
    assert stats.first_problem["long_lines_skipped"] == f"{path}:2"
    assert len(got) == 1 and got[0][0] == "Before one." and got[0][-1] == "After one."
    assert len(got[0]) == 3 and len(got[0][1]) == limit  # a line of exactly the limit is kept


def test_bad_json_records_are_counted_with_their_place(tmp_path):
    lines = ['{"text": "First record. Two sentences."}', '{"text": "broken', '{"title": "no text"}',
             '{"text": 5}', "[1, 2]", "", '{"text": "Last one."}', '{"text": ""}', '{"text": "   "}']
    path = write_bytes(tmp_path / "d.jsonl", "\n".join(lines).encode() + b"\n")
    got, stats = sentences_of([path])
    assert got == [["First record.", "Two sentences."], ["Last one."]]
    assert stats.bad_json_records == 4
    assert stats.first_problem["bad_json_records"].startswith(f"{path}:2 (JSONDecodeError")
    assert stats.empty_documents == 2
    # another text field
    path2 = write_bytes(tmp_path / "e.jsonl", b'{"body": "Here it is."}\n{"text": "Not this."}\n')
    got, stats = sentences_of([path2], text_field="body")
    assert got == [["Here it is."]] and stats.bad_json_records == 1
    assert stats.first_problem["bad_json_records"].startswith(f"{path2}:2 (KeyError")


def test_wiki_json_variants(tmp_path):
    data = [{"text": "A text. Two."}, {"extract": "An extract."}, {"title": "nothing"}, 5, {"extract": ""}]
    path = write_bytes(tmp_path / "w.json", json.dumps(data).encode())
    got, stats = sentences_of([path])
    assert got == [["A text.", "Two."], ["An extract."]]
    assert stats.bad_json_records == 2 and stats.empty_documents == 1
    assert stats.first_problem["bad_json_records"] == f"{path}: article 3"
    with pytest.raises(ValueError, match="not a valid JSON document"):
        sentences_of([write_bytes(tmp_path / "x.json", b'{"a": {"extract": "cut')])
    # invalid UTF-8 inside the JSON: counted per line, the article kept
    raw = b'{\n "A": {"extract": "First one. Bad \xff\xfe here."},\n "B": {"extract": "Fine."}\n}'
    got, stats = sentences_of([write_bytes(tmp_path / "y.json.gz", raw)])
    assert got == [["First one.", "Bad \ufffd\ufffd here."], ["Fine."]]
    assert stats.invalid_utf8_lines == 1
    assert stats.first_problem["invalid_utf8_lines"] == f"{tmp_path / 'y.json.gz'}:2"


def test_corrupt_compressed_input_is_a_clear_error(tmp_path, docs):
    path = write_google(tmp_path / "g.txt.gz", docs)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt compressed"):
        sentences_of([path])
    with pytest.raises(ValueError, match="unknown input format"):
        sentences_of([path], fmt="csv")


def test_empty_and_one_sentence_documents_are_counted(tmp_path, tok_dir):
    recs = [{"text": "Alpha one walked. Alpha two read."}, {"text": ""}, {"text": "Beta only one."},
            {"text": "  \n "}, {"text": "Gamma one sang. Gamma two. Gamma three!"}, {"text": "Delta only!"}]
    path = write_bytes(tmp_path / "d.jsonl", "".join(json.dumps(r) + "\n" for r in recs).encode())
    manifest = run([path], tmp_path / "data", tok_dir)
    assert manifest["corpus"]["empty_documents"] == 2
    assert manifest["corpus"]["documents"] == 4
    assert manifest["totals"]["documents"] == 4
    assert manifest["totals"]["one_sentence_documents"] == 2
    assert manifest["totals"]["sentences"] == 7
    text = format_stats(manifest)
    assert "documents 4 (2 of one sentence); sentences 7" in text
    assert "empty documents 2" in text


# ------------------------------------------------------------------------------ what is written
def test_shards_hold_well_formed_instances_and_true_statistics(base, docs, tokenizer):
    out, manifest = base
    assert manifest["complete"] and manifest["total_shards"] == len(manifest["shards"]) >= 4
    insts = read_instances(out)
    t = manifest["totals"]
    assert len(insts) == t["instances"] > 1000
    for inst in insts:
        check_layout(inst, 64)
        L = len(inst.input_ids)
        assert len(inst.masked_positions) == expected_mask_count(L, 20)
        assert not np.isin(inst.masked_labels, [CLS, SEP]).any()
        assert not np.isin(inst.masked_positions, [0, inst.num_a - 1, L - 1]).any()
    # The manifest's statistics are those of the shards.
    lengths = np.bincount([len(x.input_ids) for x in insts], minlength=65)
    assert t["length_histogram"] == lengths.tolist()
    assert t["not_next"] == sum(x.is_random_next for x in insts)
    assert t["predictions_histogram"] == np.bincount([len(x.masked_positions) for x in insts], minlength=21).tolist()
    at = np.concatenate([x.input_ids[x.masked_positions] for x in insts])
    labels = np.concatenate([x.masked_labels for x in insts])
    assert t["replacements"]["mask"] == int((at == MASK).sum())
    assert t["replacements"]["keep"] == int(((at == labels) & (at != MASK)).sum())
    assert sum(t["replacements"].values()) == len(at)
    # ... and of the input.
    tokenized = tokenize_docs(tokenizer, docs)
    assert t["documents"] == manifest["corpus"]["documents"] == 120
    assert t["one_sentence_documents"] == 8
    assert t["sentences"] == sum(len(d) for d in tokenized)
    assert t["input_tokens"] == sum(len(s) for d in tokenized for s in d)
    assert t["tokens"] == int((lengths * np.arange(65)).sum())
    assert manifest["corpus"]["files"] == 2


def test_special_token_strings_in_the_text_are_plain_text(tmp_path, tok_dir, tokenizer):
    """Google's tokenizer splits "[MASK]" written in the corpus into "[", "mask", "]": raw text must
    never inject a real [MASK] / [SEP] / [CLS] into the data."""
    d = documents(seed=9, n_docs=20, min_sents=4, max_sents=8)
    for doc in d:
        doc[1] = "Papers write [MASK] and [SEP] and [CLS] in the text."
    path = write_google(tmp_path / "g.txt", d)
    out = tmp_path / "data"
    run([path], out, tok_dir, dynamic_masking=True)
    insts = read_instances(out)
    bracket, mask_word = tokenizer.convert_tokens_to_ids(["[", "mask"])
    assert any(bracket in x.input_ids and mask_word in x.input_ids for x in insts)
    for inst in insts:
        assert MASK not in inst.input_ids
        check_layout(inst, 64)  # [CLS] / [SEP] only where the layout puts them


def test_dynamic_masking_stores_no_masks(tmp_path, corpus, tok_dir):
    out = tmp_path / "data"
    manifest = run([corpus / "part-0.txt"], out, tok_dir, dynamic_masking=True)
    insts = read_instances(out)
    assert len(insts) > 200
    for inst in insts:
        assert len(inst.masked_positions) == 0 and len(inst.masked_labels) == 0
        assert MASK not in inst.input_ids
        check_layout(inst, 64)
    assert manifest["totals"]["predictions_histogram"][0] == len(insts)
    assert "masking: dynamic (in the loader)" in format_stats(manifest)


def test_no_nsp_packs_whole_sentences(tmp_path, docs, tokenizer, tok_dir):
    path = write_google(tmp_path / "g.txt", docs[:40])
    out = tmp_path / "data"
    manifest = run([path], out, tok_dir, nsp=False, dupe_factor=3, shard_chars=10**9)
    insts = read_instances(out)
    # Exactly Google-format sentences packed greedily per document, once per dupe pass.
    expected = collections.Counter()
    for doc in tokenize_docs(tokenizer, docs[:40]):
        for x in create_packed_instances(doc, max_seq_length=64, special=SPECIAL):
            expected[tuple(x.input_ids.tolist())] += 3
    got = collections.Counter(tuple(original_ids(x).tolist()) for x in insts)
    assert got == expected
    for inst in insts:
        check_layout(inst, 64, nsp=False)
        assert len(inst.masked_positions) == expected_mask_count(len(inst.input_ids), 20)
    assert manifest["totals"]["not_next"] == 0
    assert "no NSP (packed sentences)" in format_stats(manifest)
    # The three passes are the same packings, each copy masked afresh: the copies' masks differ.
    masks = collections.defaultdict(set)
    for x in insts:
        masks[tuple(original_ids(x).tolist())].add(tuple(x.masked_positions.tolist()))
    assert sum(len(m) == 1 for m in masks.values()) < 0.02 * len(masks)


def test_no_nsp_with_dynamic_masking_stores_one_pass(tmp_path, docs, tokenizer, tok_dir):
    """Unmasked copies of the same packing would be byte-identical: stored once, with a warning."""
    path = write_google(tmp_path / "g.txt", docs[:40])
    with pytest.warns(UserWarning, match="identical copies, so one is stored"):
        manifest = run([path], tmp_path / "data", tok_dir, nsp=False, dynamic_masking=True, dupe_factor=3)
    packed = [tuple(x.input_ids.tolist()) for d in tokenize_docs(tokenizer, docs[:40])
              for x in create_packed_instances(d, max_seq_length=64, special=SPECIAL)]
    got = [tuple(x.input_ids.tolist()) for x in read_instances(tmp_path / "data")]
    assert sorted(got) == sorted(packed)
    assert manifest["totals"]["instances"] == len(packed) and manifest["config"]["dupe_factor"] == 3


def test_a_window_of_one_document_warns(tmp_path, base, tok_dir):
    """NotNext segments come from the window; a window of one document can only draw from itself."""
    one = documents(seed=33, n_docs=1, min_sents=40, max_sents=40)
    with pytest.warns(UserWarning, match=r"shard 0: its window holds a single document"):
        m = run([write_google(tmp_path / "one.txt", one)], tmp_path / "one", tok_dir, shard_chars=10**9)
    assert m["totals"]["not_next"] > 0 and "single document" in m["shards"][0]["warnings"][0]
    assert all(e["warnings"] == [] for e in base[1]["shards"])  # windows of many documents: none


def test_whole_word_masking_in_prepared_shards(tmp_path, corpus, tok_dir):
    out = tmp_path / "data"
    run([corpus / "part-0.txt"], out, tok_dir, whole_word_mask=True)
    multi = 0
    for inst in read_instances(out):
        orig = original_ids(inst)
        masked = set(inst.masked_positions.tolist())
        assert 1 <= len(masked) <= expected_mask_count(len(orig), 20)
        for word in google_words(orig):
            hit = [p in masked for p in word]
            assert all(hit) or not any(hit)
            multi += all(hit) and len(word) > 1
    assert multi > 100


def test_nsp_share_long_documents_and_one_sentence_documents(tmp_path, tok_dir):
    long_docs = documents(seed=31, n_docs=30, min_sents=150, max_sents=250)
    m = run([write_google(tmp_path / "long.txt", long_docs)], tmp_path / "long", tok_dir,
            short_seq_prob=0.0, shard_chars=10**9)
    n = m["totals"]["instances"]
    share = m["totals"]["not_next"] / n
    sd = (0.25 / n) ** 0.5
    assert n > 3000
    assert 0.5 - 4 * sd < share < 0.5 + 4 * sd + 0.5 * 2 * 30 / n, share  # single chunks: <= 1 per doc pass
    assert f"NotNext share {share:.3f}" in format_stats(m)

    one = documents(seed=32, n_docs=400, min_sents=1, max_sents=1)
    m = run([write_google(tmp_path / "one.txt", one)], tmp_path / "one", tok_dir)
    assert m["totals"]["instances"] == 2 * 400
    assert m["totals"]["not_next"] == 2 * 400  # the documented quirk: all NotNext
    assert "NotNext share 1.000" in format_stats(m)


def test_dynamic_masking_special_ids_must_match_the_dataset_vocab(tmp_path, corpus, tok_dir):
    out = tmp_path / "data"
    run([corpus / "part-0.txt"], out, tok_dir, dynamic_masking=True, dupe_factor=1)
    ds = PretrainingDataset(out)
    PretrainingLoader(ds, 4, special=SPECIAL)  # the dataset's own vocab: fine
    bad = {"vocab of 31 tokens": dataclasses.replace(SPECIAL, vocab_size=31, continuation=None),
           "outside the vocab": dataclasses.replace(SPECIAL, mask=len(TOKENS)),
           "continuation has 5 entries": dataclasses.replace(SPECIAL, continuation=np.zeros(5, dtype=bool))}
    for message, special in bad.items():
        with pytest.raises(ValueError, match=message):
            PretrainingLoader(ds, 4, special=special)


# ------------------------------------------------------------------------------ determinism
def test_same_inputs_and_seed_give_identical_shards(tmp_path, base, corpus, tok_dir):
    out, manifest = base
    reference = shard_hashes(out)
    assert len(reference) == manifest["total_shards"] >= 4
    assert {e["file"]: e["sha256"] for e in manifest["shards"]} == reference
    again = run([corpus / "part-*"], tmp_path / "again", tok_dir)
    assert shard_hashes(tmp_path / "again") == reference
    assert again["totals"] == manifest["totals"]
    parallel = run([corpus / "part-*"], tmp_path / "parallel", tok_dir, workers=2)
    assert shard_hashes(tmp_path / "parallel") == reference
    assert parallel["complete"]
    run([corpus / "part-*"], tmp_path / "seed", tok_dir, seed=7)
    other = shard_hashes(tmp_path / "seed")
    assert other.keys() == reference.keys()
    assert all(other[k] != reference[k] for k in reference)


def test_split_across_machines_gives_the_single_run(tmp_path, base, corpus, tok_dir):
    out, manifest = base
    target = tmp_path / "split"
    cfg = PrepareConfig(**BASE)
    first = prepare([str(corpus / "part-*")], target, tok_dir, cfg, num_shards=2, shard_index=0, progress=False)
    total = manifest["total_shards"]
    assert not first["complete"]
    assert first["missing_shards"] == list(range(1, total, 2))
    assert sorted(shard_hashes(target)) == [f"shard-{i:05d}.safetensors" for i in range(0, total, 2)]
    with pytest.raises(ShardError, match="incomplete"):
        PretrainingDataset(target)
    second = prepare([str(corpus / "part-*")], target, tok_dir, cfg, num_shards=2, shard_index=1, progress=False)
    assert second["complete"] and second["missing_shards"] == []
    assert shard_hashes(target) == shard_hashes(out)
    strip = lambda m: [{k: v for k, v in e.items() if k != "seconds"} for e in m["shards"]]
    assert strip(second) == strip(manifest)
    assert second["totals"] == manifest["totals"]
    with pytest.raises(ValueError, match="shard_index"):
        prepare([str(corpus / "part-*")], target, tok_dir, cfg, num_shards=2, shard_index=2, progress=False)


def test_rerun_skips_finished_shards(tmp_path, base, corpus, tok_dir, monkeypatch):
    out, _ = base
    target = tmp_path / "copy"
    shutil.copytree(out, target)
    files = sorted(target.glob("shard-*"))
    before = {p.name: p.stat().st_mtime_ns for p in files}
    hashes = shard_hashes(target)
    built = []
    real = prepare_module.build_shard
    monkeypatch.setattr(prepare_module, "build_shard", lambda task: built.append(task.index) or real(task))
    manifest = run([corpus / "part-*"], target, tok_dir)
    assert built == [] and manifest["complete"]
    assert {p.name: p.stat().st_mtime_ns for p in files} == before
    # A shard without its sidecar (killed between the two writes) is built again, identically.
    (target / "shard-00002.json").unlink()
    (target / "shard-00003.safetensors").unlink()
    manifest = run([corpus / "part-*"], target, tok_dir)
    assert built == [2, 3] and manifest["complete"]
    assert shard_hashes(target) == hashes


def test_other_settings_into_an_existing_folder_is_an_error(tmp_path, base, corpus, tok_dir, docs):
    out, _ = base
    target = tmp_path / "copy"
    shutil.copytree(out, target)
    settings = (target / "settings.json").read_text()
    with pytest.raises(ValueError, match=r"other settings \(dupe_factor\)"):
        run([corpus / "part-*"], target, tok_dir, dupe_factor=3)
    with pytest.raises(ValueError, match=r"other settings \(masked_lm_prob, seed\)"):
        run([corpus / "part-*"], target, tok_dir, seed=1, masked_lm_prob=0.2)
    other_tok = tmp_path / "tok2"
    BertTokenizer([*TOKENS, "zebra"]).save_pretrained(other_tok)
    with pytest.raises(ValueError, match=r"other settings \(vocab\)"):
        run([corpus / "part-*"], target, tok_dir=other_tok)
    # Other input text, same settings: the finished shards are not of this text.
    changed = write_google(tmp_path / "changed" / "part-0.txt", docs[:59])
    shutil.copy(corpus / "part-1.txt.gz", changed.parent)
    with pytest.raises(ValueError, match=r"other settings \(inputs\)"):
        run([changed.parent / "part-*"], target, tok_dir)
    assert (target / "settings.json").read_text() == settings  # left as it was
    assert shard_hashes(target) == shard_hashes(out)


def test_bad_settings_are_rejected():
    for bad in ({"max_seq_length": 4}, {"dupe_factor": 0}, {"short_seq_prob": 1.5}, {"format": "xml"},
                {"masked_lm_prob": 0.0}, {"mask_token_prob": 0.9, "random_token_prob": 0.2},
                {"max_predictions_per_seq": 0}, {"shard_chars": 0}):
        with pytest.raises(ValueError):
            PrepareConfig(**bad)
    huge = 10 ** 23
    for bad, message in (({"dupe_factor": huge}, r"^dupe_factor must be in \[1, 1000\], got a 24-digit number$"),
                         ({"seed": -1}, r"^seed must be >= 0, got -1$"),
                         ({"seed": huge}, r"^seed must be below 2\*\*63, got a 24-digit number$"),
                         ({"max_seq_length": huge}, r"^max_seq_length must be in \[8, 65535\], got a 24-digit number$"),
                         ({"random_token_prob": 2.0},
                          r"^random_token_prob must be a finite number in \[0, 1\], got 2.0$")):
        with pytest.raises(ValueError, match=message):  # each one line naming the setting, before any work
            PrepareConfig(**bad)


# ------------------------------------------------------------------------------ the command line
def test_cli_prepare_and_stats(tmp_path, corpus, tok_dir, base, capsys):
    out = tmp_path / "cli"
    rc = main(["prepare", str(corpus / "part-*"), "--out", str(out), "--tokenizer", str(tok_dir),
               "--max-seq-length", "64", "--dupe-factor", "2", "--shard-chars", "15000"])
    assert rc == 0
    printed = capsys.readouterr().out
    manifest = load_manifest(out)
    assert manifest["complete"]
    assert shard_hashes(out) == shard_hashes(base[0])  # the same as the API with the same settings
    share = manifest["totals"]["not_next"] / manifest["totals"]["instances"]
    assert f"NotNext share {share:.3f}" in printed

    assert main(["prepare", "--stats", str(out)]) == 0
    stats = capsys.readouterr().out
    assert stats.strip() == format_stats(manifest)
    assert re.search(rf"shards {manifest['total_shards']}/{manifest['total_shards']}; instances "
                     rf"{manifest['totals']['instances']:,}", stats)
    assert f"NotNext share {share:.3f}" in stats
    assert "replacements: [MASK] 0.8" in stats or "replacements: [MASK] 0.7" in stats

    # no NSP and a JSON config file, flags over the file
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"max_seq_length": 32, "dupe_factor": 5, "nsp": False}))
    out2 = tmp_path / "cli2"
    rc = main(["prepare", str(corpus / "part-0.txt"), "-o", str(out2), "-t", str(tok_dir), "--config", str(cfg),
               "--dupe-factor", "1"])
    assert rc == 0
    m2 = load_manifest(out2)
    assert (m2["config"]["max_seq_length"], m2["config"]["dupe_factor"], m2["config"]["nsp"]) == (32, 1, False)
    assert "no NSP" in capsys.readouterr().out


def test_cli_errors_are_one_line(tmp_path, corpus, tok_dir, capsys):
    rc = main(["prepare", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o"), "--tokenizer", str(tok_dir)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "bertforge prepare: error: no input file matches" in err and "nope.txt" in err
    assert main(["prepare", "--out", str(tmp_path / "o")]) == 2
    assert "needs input files" in capsys.readouterr().err
    assert main(["prepare", "--stats", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    out = tmp_path / "data"
    args = ["prepare", str(corpus / "part-0.txt"), "--out", str(out), "--tokenizer", str(tok_dir),
            "--max-seq-length", "32", "--dupe-factor", "1"]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args[:-1], "2"]) == 2
    assert "other settings (dupe_factor)" in capsys.readouterr().err


@pytest.mark.parametrize("content, reason", [
    (b"", r"no documents to prepare \(1 file\(s\), 0 document\(s\), 0 characters\)"),
    (b"\n  \n\t\n\n", r"no documents to prepare \(1 file\(s\), 0 document\(s\), 0 characters\)"),
    (b"word " * 250_000, r"no documents to prepare \(1 file\(s\), 0 document\(s\), 0 characters, 1 line\(s\) over "
                         r"the limit of 1,000,000 characters skipped \(first at .*in.txt:1\)\)"),
])
def test_input_without_documents_is_an_error_with_counts(tmp_path, tok_dir, capsys, content, reason):
    path = write_bytes(tmp_path / "in.txt", content)
    out = tmp_path / "data"
    with pytest.raises(ValueError, match=reason):
        run([path], out, tok_dir)
    assert not (out / "manifest.json").exists()
    assert main(["prepare", str(path), "--out", str(tmp_path / "cli"), "--tokenizer", str(tok_dir)]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the progress bar
    assert last.startswith("bertforge prepare: error:") and "no documents to prepare" in last
    assert "Traceback" not in err


def test_too_little_text_for_one_instance_is_an_error(tmp_path, tok_dir, capsys):
    path = write_bytes(tmp_path / "in.txt", b"\xe2\x80\x8b\n")  # a zero-width space: a document of no tokens
    with pytest.raises(ValueError, match=r"no sentence pairs could be built: 0 document\(s\) with tokens, 0 "
                                         r"sentence\(s\), 0 token\(s\) \(read: 1 file\(s\), 1 document\(s\)"):
        run([path], tmp_path / "data", tok_dir)
    assert not (tmp_path / "data" / "manifest.json").exists()


def test_a_folder_prepared_with_another_normalisation_is_not_added_to(tmp_path, tok_dir):
    path = write_google(tmp_path / "in.txt", documents(seed=3, n_docs=6, min_sents=3, max_sents=6))
    manifest = run([path], tmp_path / "data", tok_dir)
    assert manifest["normalization"] == {"do_lower_case": True, "strip_accents": True, "tokenize_chinese_chars": True}
    cased = tmp_path / "cased"
    BertTokenizer.from_pretrained(tok_dir, do_lower_case=False).save_pretrained(cased)
    with pytest.raises(ValueError, match=r"other settings \(tokenizer normalization\)"):
        run([path], tmp_path / "data", cased)
