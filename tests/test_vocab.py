"""learn_vocab: BERT's vocab.txt layout, size bound, round trips, compressed input, bad UTF-8."""

from __future__ import annotations

import bz2
import gzip
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.text.tokenizer import BertTokenizer
from bertforge.text.vocab import iter_text_lines, learn_vocab

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "shi", "po", "ven", "dar", "qu", "ix", "zé", "ño"]


def _corpus_lines(n_docs: int, seed: int) -> list[str]:
    """Sentences of made-up words with a Zipf-like word distribution; blank line between documents."""
    rng = random.Random(seed)
    lexicon = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(400)})
    weights = [1 / (rank + 1) for rank in range(len(lexicon))]
    lines = []
    for _ in range(n_docs):
        for _ in range(rng.randint(2, 6)):
            words = rng.choices(lexicon, weights, k=rng.randint(4, 14))
            words[0] = words[0].capitalize()
            lines.append(" ".join(words) + rng.choice([".", "!", "?", ", 12."]))
        lines.append("")
    return lines


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("corpus")
    lines = _corpus_lines(300, seed=1)
    third = len(lines) // 3
    plain = root / "part1.txt"
    plain.write_text("\n".join(lines[:third]) + "\n", encoding="utf-8")
    gz = root / "part2.txt.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines[third:2 * third]) + "\n")
    bz = root / "part3.txt.bz2"
    with bz2.open(bz, "wt", encoding="utf-8") as f:
        f.write("\r\n".join(lines[2 * third:]) + "\r\n")  # CRLF line ends too
    return {"files": [plain, gz, bz], "lines": [line for line in lines if line], "root": root}


@pytest.fixture(scope="module")
def learned(corpus) -> BertTokenizer:
    return learn_vocab(corpus["files"], corpus["root"] / "vocab", vocab_size=400, show_progress=False)


def test_reads_plain_gzip_and_bz2_line_by_line(corpus):
    got = [line for f in corpus["files"] for line in iter_text_lines(f)]
    assert got == corpus["lines"]


def test_special_token_layout(learned, corpus):
    tokens = (corpus["root"] / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert tokens[0] == "[PAD]"
    assert tokens[1:100] == [f"[unused{i}]" for i in range(99)]
    assert tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (learned.pad_token_id, learned.unk_token_id, learned.cls_token_id, learned.sep_token_id,
            learned.mask_token_id) == (0, 100, 101, 102, 103)
    assert learned.convert_ids_to_tokens(list(range(104))) == tokens[:104]
    assert len(set(tokens)) == len(tokens)


def test_the_same_text_gives_the_same_vocab_file_every_time(learned, corpus):
    # tokenizers' trainer numbers the "##" pieces in hash-map order (a new order each run); the file must not
    first = (corpus["root"] / "vocab" / "vocab.txt").read_bytes()
    for k in range(3):
        learn_vocab(corpus["files"], corpus["root"] / f"again{k}", vocab_size=400, show_progress=False)
        assert (corpus["root"] / f"again{k}" / "vocab.txt").read_bytes() == first
    pieces = first.decode("utf-8").splitlines()[104:]
    groups = [[p for p in pieces if (len(p.removeprefix("##")) > 1, p.startswith("##")) == g]
              for g in ((False, False), (False, True), (True, False), (True, True))]
    assert all(groups) and pieces == [p for g in groups for p in sorted(g)]


def test_vocab_size_is_an_upper_bound(learned, corpus):
    assert 104 < len(learned) <= 400
    assert len(learned) == 400  # this corpus has more than enough merges to fill it
    big = learn_vocab(corpus["files"], corpus["root"] / "big", vocab_size=50_000, show_progress=False)
    assert 104 < len(big) < 50_000  # a small corpus runs out of merges first
    assert big.vocab_size == len((corpus["root"] / "big" / "vocab.txt").read_text(encoding="utf-8").splitlines())


def test_learned_tokenizer_round_trips_text(learned, corpus):
    for line in corpus["lines"][:300]:
        ids = learned(line)["input_ids"]
        assert ids[0] == 101 and ids[-1] == 102
        assert learned.unk_token_id not in ids, line  # every character of the corpus is in the alphabet
        expected = " ".join(learned.basic_tokenize(line))
        for punct in ".,!?":
            expected = expected.replace(" " + punct, punct)
        assert learned.decode(ids) == expected
    # Uncased: accents stripped, case folded; frequent words are whole tokens.
    pieces = learned.convert_ids_to_tokens(list(range(104, len(learned))))
    assert all(t == t.lower() and "é" not in t and "ñ" not in t for t in pieces)
    top_word = max(set(w.lower() for line in corpus["lines"] for w in line.split()[1:-1]),
                   key=lambda w: sum(line.split().count(w) for line in corpus["lines"][:200]))
    assert learned.tokenize(top_word) == [top_word.replace("é", "e").replace("ñ", "n")]


def test_saved_folder_loads_back(learned, corpus):
    folder = corpus["root"] / "vocab"
    assert sorted(p.name for p in folder.iterdir()) == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    again = BertTokenizer.from_pretrained(folder)
    assert again.vocab_hash == learned.vocab_hash
    assert again(corpus["lines"][:20])["input_ids"] == learned(corpus["lines"][:20])["input_ids"]


def test_text_iterator_cased_and_no_unused(tmp_path):
    lines = _corpus_lines(60, seed=2)
    tok = learn_vocab(iter(lines), tmp_path / "cased", vocab_size=300, do_lower_case=False, num_unused=0,
                      show_progress=False)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert not tok.do_lower_case
    assert any(t[:1].isupper() for t in tok.vocab)  # capitalised sentence starts survive
    assert "é" in "".join(tok.vocab)  # accents are kept when cased
    assert tok.unk_token_id not in tok(lines[0])["input_ids"]


def test_invalid_utf8_names_file_line_and_offset(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("first line\nsecond ok\n".encode() + b"thi\xffrd\n")
    with pytest.raises(ValueError, match=r"bad\.txt, line 3: invalid UTF-8 at byte offset 24"):
        learn_vocab([bad], tmp_path / "out", vocab_size=200, show_progress=False)
    assert not (tmp_path / "out" / "vocab.txt").exists()
    bad_gz = tmp_path / "bad.txt.gz"
    with gzip.open(bad_gz, "wb") as f:
        f.write(b"ok\n\xc3\x28\n")
    with pytest.raises(ValueError, match=r"bad\.txt\.gz, line 2: invalid UTF-8 at byte offset 3"):
        list(iter_text_lines(bad_gz))


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="no room"):
        learn_vocab(iter(["a b c"]), tmp_path / "x", vocab_size=104, show_progress=False)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        learn_vocab([tmp_path / "missing.txt"], tmp_path / "x", vocab_size=500, show_progress=False)
    with pytest.raises(ValueError, match="num_unused"):
        learn_vocab(iter(["a b c"]), tmp_path / "x", vocab_size=500, num_unused=-1, show_progress=False)


def test_single_path_is_accepted(tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("\n".join(_corpus_lines(30, seed=3)), encoding="utf-8")
    tok = learn_vocab(f, tmp_path / "one", vocab_size=200, show_progress=False)
    assert isinstance(tok, BertTokenizer) and Path(tmp_path / "one" / "vocab.txt").is_file()
    assert len(tok) <= 200


_STEMS = ("govern nation work people year free right law health school family budget power secure trade "
          "build market energy child war peace state congress job tax cost plan help hope serve protect "
          "grow vote reform honor teach care strong fair defend invest create recover unite promise move "
          "veteran border citizen worker business farmer student nurse soldier neighbor leader judge").split()
_PREFIXES = ("", "", "", "re", "un", "pre", "over", "under", "co", "mis")
_SUFFIXES = ("", "", "s", "ed", "ing", "er", "ers", "ment", "ly", "ness", "ful", "ity", "able", "ance", "ive")
_GLUE = ("the of and to a in that we our for is it will this with have are on not be all must by who "
         "more than they can new from every american now as an what at more tonight together").split()


def _prose(seed: int, n_sentences: int) -> str:
    """Speech-like English prose of many word forms: frequent glue words, stems with affixes, numbers."""
    rng = random.Random(seed)
    words = [p + s + x for s in _STEMS for p in _PREFIXES for x in _SUFFIXES]
    out = []
    for _ in range(n_sentences):
        n = rng.randint(6, 22)
        sent = [rng.choice(_GLUE) if rng.random() < 0.45 else rng.choice(words) for _ in range(n)]
        if rng.random() < 0.15:
            sent.insert(rng.randrange(n), f"{rng.randint(1, 2030):,}")
        sent[0] = sent[0].capitalize()
        out.append(" ".join(sent) + rng.choice(".....?!;"))
    return "\n".join(" ".join(out[i:i + 4]) for i in range(0, len(out), 4)) + "\n"


def test_a_small_corpus_gives_a_byte_identical_vocab_in_every_process(tmp_path):
    # Thousands of word forms and a 2,000-piece budget: the trainer stops among many equally frequent
    # merges, and each process has its own hash-map order (Python's and the trainer's own).
    corpus = tmp_path / "speeches.txt"
    corpus.write_text(_prose(seed=7, n_sentences=1500), encoding="utf-8")
    assert 100_000 < corpus.stat().st_size < 300_000
    script = ("import sys; from bertforge.text.vocab import learn_vocab; "
              "learn_vocab([sys.argv[1]], sys.argv[2], vocab_size=2000, show_progress=False)")
    files = []
    for k in range(4):
        out = tmp_path / f"vocab{k}"
        env = {**os.environ, "PYTHONHASHSEED": str(k), "PYTHONPATH": os.pathsep.join(sys.path)}
        subprocess.run([sys.executable, "-c", script, str(corpus), str(out)], env=env, check=True, timeout=120)
        files.append((out / "vocab.txt").read_bytes())
    assert len(files[0].splitlines()) == 2000  # the budget, not the corpus, ends training
    assert all(f == files[0] for f in files[1:])


def test_a_vocab_size_out_of_range_is_refused_before_reading_text(tmp_path):
    with pytest.raises(ValueError, match="leaves no room beside 104 special and unused tokens"):
        learn_vocab([tmp_path / "absent.txt"], tmp_path / "v", vocab_size=104)
    with pytest.raises(ValueError, match=r"^vocab_size must be at most 4,294,967,296 \(token ids are stored as "
                                         r"uint32\), got a 27-digit number$"):
        learn_vocab([tmp_path / "absent.txt"], tmp_path / "v", vocab_size=10 ** 26)
    assert not (tmp_path / "v").exists()
