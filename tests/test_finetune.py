"""Fine-tuning for sequence classification and regression, end to end on generated data.

GLUE's own file layouts (SST-2, MRPC, STS-B, CoLA without header, MNLI matched / mismatched, ...) and
generic CSV / JSONL are read as they are written; errors name file and line; skipped rows are
counted. A tiny model learns an easy task (the label is the word "good" or "bad") to near-perfect
accuracy, also when that word lies beyond the first window of a long text; STS-B-style regression
learns; the fine-tuned folder is transformers' BertForSequenceClassification with equal logits and
the right id2label; a run stopped by SIGTERM and resumed equals an uninterrupted one; a warmup setting
given wins over the default and the run records the warmup used; the CLI runs finetune / evaluate / predict.
An evaluation label the model was not trained on is scored as wrong with a warning (a GLUE training file's
stays an error); best/ keeps the dev predictions with their gold labels; the run summary has no empty parts.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from finetune_fixtures import FILLER, base, root, write  # noqa: F401 - fixtures: a tiny "pre-trained" BERT, a folder
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models
from safetensors.torch import load_file

from bertforge import cli
from bertforge.train import loop as trainer
from bertforge.train.config import TrainConfig
from bertforge.train.rundir import STOP_MARKER
from bertforge.tasks import TaskSettings
from bertforge.tasks.finetune import (FinetuneConfig, evaluate, finetune, finetune_grid, load_finetuned, parse_grid,
                                      predict)
from bertforge.model.heads import BertForSequenceClassification
from bertforge.tasks.classification import (
    ClassificationObjective,
    Example,
    encode_examples,
    glue_files,
    label_list,
    read_examples,
    targets,
)
from bertforge.tasks.encoding import EncodedBatches, Windows
from bertforge.text.tokenizer import BertTokenizer


def polar(rng: random.Random, n_words: tuple[int, int] = (3, 8), at: int | None = None) -> tuple[str, str]:
    """A sentence of filler words with "good" (label pos) or "bad" (neg) in it (at word ``at``, or anywhere)."""
    words = [rng.choice(FILLER) for _ in range(rng.randint(*n_words))]
    label = rng.choice(["pos", "neg"])
    words.insert(rng.randint(0, len(words)) if at is None else at, "good" if label == "pos" else "bad")
    return " ".join(words), label


def write_csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    return write(path, "review,sentiment\n" + "".join(f'"{t}, really",{y}\n' for t, y in rows))


def config(base: Path, out: Path, **overrides) -> FinetuneConfig:
    settings = dict(model=str(base), out=str(out), lr=1e-3, batch_size=16, warmup_ratio=0.1, weight_decay=0.0,
                    log_every=1, progress=False, seed=7)
    return FinetuneConfig(**{**settings, **overrides})


def train_lines(out: Path, split: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


# ------------------------------------------------------------------------------ reading files
def test_glue_layouts_are_read_as_written(tmp_path):
    sst = write(tmp_path / "sst.tsv", 'sentence\tlabel\nit \'s a "charming" film \t1\nflat , dull\t0\n')
    ex, _ = read_examples(sst, "sst2")
    assert ex == [Example('it \'s a "charming" film ', None, "1", 2), Example("flat , dull", None, "0", 3)]

    mrpc = write(tmp_path / "mrpc.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
                                        "1\t702876\t702977\tAmrozi accused his brother .\tReferring to him .\n")
    assert read_examples(mrpc, "mrpc")[0] == [Example("Amrozi accused his brother .", "Referring to him .", "1", 2)]

    sts = write(tmp_path / "sts.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                                      "sentence2\tscore\n0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\t"
                                      "A plane is taking off.\tAn air plane is taking off.\t5.000\n")
    ex, _ = read_examples(sts, "stsb")
    assert ex == [Example("A plane is taking off.", "An air plane is taking off.", "5.000", 2)]
    assert targets(ex, sts, None).tolist() == [5.0]

    cola = write(tmp_path / "cola.tsv", "gj04\t1\t\tOur friends won't buy this analysis.\n"
                                        "gj04\t0\t*\tThey drank the pub.\n")
    ex, _ = read_examples(cola, "cola")
    assert ex == [Example("Our friends won't buy this analysis.", None, "1", 1),
                  Example("They drank the pub.", None, "0", 2)]
    cola_test = write(tmp_path / "cola_test.tsv", "index\tsentence\n0\tBill whistled past the house.\n")
    assert read_examples(cola_test, "cola", require_labels=False)[0] == [
        Example("Bill whistled past the house.", None, None, 2)]

    qqp = write(tmp_path / "qqp.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                                      "1\t2\t3\tHow do I learn?\tHow can I learn?\t1\n")
    assert read_examples(qqp, "qqp")[0] == [Example("How do I learn?", "How can I learn?", "1", 2)]
    for task, a, b in (("qnli", "question", "sentence"), ("rte", "sentence1", "sentence2")):
        f = write(tmp_path / f"{task}.tsv", f"index\t{a}\t{b}\tlabel\n0\tx y\tz\tnot_entailment\n")
        ex, _ = read_examples(f, task)
        assert ex == [Example("x y", "z", "not_entailment", 2)]
        assert targets(ex, f, {n: i for i, n in enumerate(label_list(ex, task))}).tolist() == [1]


def test_mnli_folder_gives_matched_and_mismatched_and_skips_rows_without_gold_label(tmp_path):
    head = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
    folder = tmp_path / "MNLI"
    folder.mkdir()
    write(folder / "train.tsv", head + "0\t1\t1n\tgov\tA man eats.\tA person eats.\tentailment\tentailment\n"
                                       "1\t2\t2n\tgov\tA man eats.\tNobody eats.\tneutral\t-\n")
    for name in ("dev_matched.tsv", "dev_mismatched.tsv"):
        write(folder / name, head + "0\t1\t1n\tgov\tIt rains.\tIt is dry.\tcontradiction\tcontradiction\n")
    assert [f.name for f in glue_files("mnli", folder, "dev")] == ["dev_matched.tsv", "dev_mismatched.tsv"]
    ex, report = read_examples(glue_files("mnli", folder, "train")[0], "mnli")
    assert ex == [Example("A man eats.", "A person eats.", "entailment", 2)]
    assert report.skipped == {"no gold label '-'": [3]} and "skipped 1 rows" in report.summary()
    assert label_list(ex, "mnli") == ["contradiction", "entailment", "neutral"]
    with pytest.raises(FileNotFoundError, match="test_matched.tsv"):
        glue_files("mnli", folder, "test")


def test_generic_csv_and_jsonl_with_named_columns(tmp_path):
    csv_file = write(tmp_path / "d.csv", 'text,other,y\n"a, quoted ""text""",1,b\nplain,2,a\n')
    ex, _ = read_examples(csv_file, text_column="text", label_column="y")
    assert ex == [Example('a, quoted "text"', None, "b", 2), Example("plain", None, "a", 3)]
    assert label_list(ex) == ["a", "b"]
    assert label_list([Example("", None, y, 1) for y in ("10", "2", "1")]) == ["1", "2", "10"]
    jsonl = tmp_path / "d.jsonl.gz"
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        f.write('{"q": "first?", "p": "yes.", "label": 1}\n\n{"q": "second?", "p": "no.", "label": 0}\n')
    ex, report = read_examples(jsonl, text_column="q", text_pair_column="p")
    assert ex == [Example("first?", "yes.", "1", 1), Example("second?", "no.", "0", 3)]
    assert report.blank_lines == 1 and report.num_skipped == 0


def test_a_json_array_a_parquet_file_and_a_text_column_found_without_a_flag(tmp_path):
    rows = [{"text": "first", "label": 1}, {"text": "second", "label": 0}]
    want = [Example("first", None, "1", 1), Example("second", None, "0", 2)]  # positions: the records' from 1
    array = write(tmp_path / "a.json", json.dumps(rows, indent=2))  # what json.dump of a list writes
    assert read_examples(array)[0] == want
    with pytest.raises(ValueError, match=r"b\.json:2: item 2 of the array: expected a JSON object, got list"):
        read_examples(write(tmp_path / "b.json", json.dumps([rows[0], ["x"]])))
    with pytest.raises(ValueError, match=r"c\.json:1: not a JSON array of records"):
        read_examples(write(tmp_path / "c.json", "[{"))
    with pytest.raises(ValueError, match=r"e\.jsonl:1: no key 'text' \(keys: review, label\); name the text column"):
        read_examples(write(tmp_path / "e.jsonl", '{"review": "x", "label": 1}\n'))
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    assert read_examples(tmp_path / "d.parquet")[0] == want
    (tmp_path / "f.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match=r"f\.parquet: not a readable Parquet file"):
        read_examples(tmp_path / "f.parquet")


def test_errors_name_file_and_line_and_skips_are_counted(tmp_path):
    f = write(tmp_path / "a.tsv", "sentence\tlabel\nfine\t1\ntoo\tmany\tfields\n\t\n")
    with pytest.raises(ValueError, match=r"a\.tsv:3: 3 fields"):
        read_examples(f, "sst2")
    ex, report = read_examples(f, "sst2", skip_bad_rows=True)
    assert len(ex) == 1 and report.skipped == {"malformed": [3], "no label": [4]}
    ex, report = read_examples(f, "sst2", skip_bad_rows=True, require_labels=False)  # to predict: every row
    assert ex[1] == Example("", None, None, 4) and report.skipped == {"malformed": [3]}
    with pytest.raises(ValueError, match=r"b\.tsv:1: no column 'label' \(columns: sentence, y\)"):
        read_examples(write(tmp_path / "b.tsv", "sentence\ty\nx\t1\n"), "sst2")
    assert read_examples(tmp_path / "b.tsv", "sst2", require_labels=False)[0] == [Example("x", None, None, 2)]
    with pytest.raises(ValueError, match=r"c\.jsonl:2: not a JSON record"):
        read_examples(write(tmp_path / "c.jsonl", '{"text": "x", "label": 1}\n{"text": "y", \n'),
                      text_column="text")
    with pytest.raises(ValueError, match=r"d\.jsonl:1: no key 'label'"):
        read_examples(write(tmp_path / "d.jsonl", '{"text": "x"}\n'), text_column="text")
    dev = write(tmp_path / "dev.csv", "text,label\nx,pos\ny,maybe\n")
    ex, _ = read_examples(dev, text_column="text")
    with pytest.raises(ValueError, match=r"dev\.csv:3: unknown label 'maybe'"):
        targets(ex, dev, {"neg": 0, "pos": 1})
    with pytest.raises(ValueError, match=r"s\.tsv:2: the score 'high' is not a number"):
        sts = write(tmp_path / "s.tsv", "sentence1\tsentence2\tscore\na\tb\thigh\n")
        targets(read_examples(sts, "stsb")[0], sts, None)
    with pytest.raises(ValueError, match="unknown file type"):
        read_examples(write(tmp_path / "e.xml", ""), text_column="text")


class ConstantClassifier(torch.nn.Module):
    """Gives every input the same logits."""

    def __init__(self, logits: list[float], id2label: dict[int, str]):
        super().__init__()
        self.config = SimpleNamespace(num_labels=len(logits), id2label=id2label)
        self.register_buffer("logits", torch.tensor(logits))

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return SimpleNamespace(logits=self.logits.expand(len(input_ids), -1))


def test_an_evaluation_label_the_model_was_not_trained_on_counts_as_wrong_with_a_warning(tmp_path, base, caplog):
    """Always "pos" on pos, neg, meh, meh ("meh" unseen): accuracy 1/4; F1 of pos: 1 right, 3 predicted, 1 true
    -> 2/5. A training file's label outside a GLUE task's set stays an error naming file and line."""
    from bertforge.tasks import family_for

    family, tok = family_for("classification"), BertTokenizer.from_pretrained(base)
    cfg = family.configure(config(base, tmp_path, task="classification", text_column="review",
                                  label_column="sentiment"))
    dev = write_csv(tmp_path / "dev.csv", [("good", "pos"), ("bad", "neg"), ("so so", "meh"), ("fine", "meh")])
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        data = family.eval_data(cfg, tok, dev, {"neg": 0, "pos": 1})
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"{dev}: 2 examples carry a label the model was not trained on ('meh': 2): it cannot predict them, so they "
        "count as wrong predictions"]
    result = family.evaluate(ConstantClassifier([0.0, 1.0], {0: "neg", 1: "pos"}), data, cfg, "cpu")
    assert result.metrics == pytest.approx({"accuracy": 0.25, "f1": 0.4})
    train = write(tmp_path / "train.tsv", "sentence\tlabel\ngood\t1\nbad\t2\n")
    with pytest.raises(ValueError, match=r"train\.tsv:3: unknown label '2' \(the model's labels: 0, 1\)"):
        family.train_data(family.configure(config(base, tmp_path, task="sst2", train_file=str(train))), tok)


@pytest.mark.parametrize("name", ["big.csv", "big.tsv", "big.jsonl", "big.csv.gz"])
def test_invalid_utf8_names_the_exact_line_and_byte_offset(name, tmp_path):
    # the text reader decodes ahead of the line it returns: the error must still name the exact place
    if name.endswith(".jsonl"):
        lines = [f'{{"text": "row {i}", "label": "pos"}}\n' for i in range(2000)]
    else:
        sep = "," if ".csv" in name else "\t"
        lines = [f"text{sep}label\n"] + [f"row {i}{sep}pos\n" for i in range(2000)]
    text, rest = "".join(lines[:1200]), "".join(lines[1200:])  # well beyond the reader's look-ahead
    data = text.encode() + b"caf\xe9 au lait" + rest.encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    line = text.count("\n") + 1
    offset = len(text.encode()) + 3
    where = "the decompressed text" if name.endswith(".gz") else "the file"
    with pytest.raises(ValueError, match=rf"{name.replace('.', '[.]')}:{line}: not UTF-8 text: b'\\xe9' "
                                         rf"at byte offset {offset} of {where} \(3 bytes into the line"):
        read_examples(path, text_column="text")


def test_the_utf8_error_place_does_not_depend_on_how_the_file_is_read(tmp_path):
    from bertforge.tasks.base import not_utf8

    path = tmp_path / "a.csv"
    path.write_bytes("text,label\nnaïve,pos\n".encode() + b"a longer line, then caf\xc3\xa9 \xff here,neg\n")
    expected = str(not_utf8(path))
    assert expected.startswith(f"{path}:3: not UTF-8 text: b'\\xff' at byte offset 48 of the file (26 bytes into")
    for size in (1, 2, 3, 7, 30):  # chunk boundaries inside the é, inside the line, at the line's start
        assert str(not_utf8(path, chunk_size=size)) == expected


# ------------------------------------------------------------------------------ windows and batches
def test_long_texts_become_overlapping_windows_covering_every_token(base):
    tok = BertTokenizer.from_pretrained(base)
    words = [f"{w}" for w in FILLER[:40]]
    ex = [Example(" ".join(words), None, None, 1), Example("a short one", None, None, 2),
          Example("the old house", " ".join(words), None, 3)]
    f = encode_examples(ex, tok, max_seq_length=16, stride=8, long_inputs="windows")
    ids = tok.encode_batch_ids([" ".join(words)])[0]
    windows = [w for w, e in zip(f.input_ids, f.example) if e == 0]
    assert len(ids) == 40 and len(windows) == 5  # windows of 14 tokens every 8, until one reaches the end
    assert [w[1:-1].tolist() for w in windows] == [ids[s:s + 14] for s in (0, 8, 16, 24, 32)]
    assert f.windowed == 2 and f.num_examples == 3
    pair = [(w, n) for w, n, e in zip(f.input_ids, f.num_a, f.example) if e == 2]
    short = tok.encode_batch_ids(["the old house"])[0]
    for w, n_a in pair:  # the shorter segment whole in every window, the longer one windowed
        assert len(w) <= 16 and w[1:n_a - 1].tolist() == short
    batch = f.collate([0, 5, len(f) - 1])  # a full window, "a short one", a pair window
    assert batch["input_ids"].shape == (3, 16) and batch["attention_mask"][1].sum() == 5
    assert batch["token_type_ids"][2].tolist()[:n_a] == [0] * n_a and batch["token_type_ids"][2, n_a] == 1
    with pytest.raises(ValueError, match="stride 20 is longer than a window"):
        encode_examples(ex, tok, max_seq_length=16, stride=20, long_inputs="windows")


def test_batches_are_seeded_per_epoch_split_by_rank_and_resume_exactly(base):
    tok = BertTokenizer.from_pretrained(base)
    f = encode_examples([Example(" ".join(FILLER[:i % 7 + 1]), None, None, i) for i in range(20)], tok, 32)
    f.with_labels(np.arange(20))
    one = EncodedBatches(f, 4, seed=1)
    epochs = [[b["labels"].tolist() for b in one] for _ in range(2)]
    assert sorted(sum(epochs[0], [])) == list(range(20)) and epochs[0] != epochs[1]
    ranks = [EncodedBatches(f, 2, seed=1, rank=r, world_size=2) for r in (0, 1)]
    assert [a["labels"].tolist() + b["labels"].tolist() for a, b in zip(*ranks)] == epochs[0]
    again = EncodedBatches(f, 4, seed=1)
    it = iter(again)
    next(it), next(it)
    state = again.state_dict()
    resumed = EncodedBatches(f, 4, seed=1)
    resumed.load_state_dict(state)
    assert [b["labels"].tolist() for b in resumed] == epochs[0][2:]
    first = next(iter(EncodedBatches(f, 4, seed=1)))
    assert first["input_ids"].shape[1] == max(len(f.input_ids[i]) for i in epochs[0][0])  # padded to the longest


def _take(source: EncodedBatches, n: int) -> list[dict[str, torch.Tensor]]:
    """The next ``n`` batches, into the following epochs as the training loop goes on (a new iter())."""
    out, it = [], iter(source)
    while len(out) < n:
        try:
            out.append(next(it))
        except StopIteration:
            it = iter(source)
    return out


def test_batches_follow_the_seeded_permutation_of_each_epoch():
    """Epoch e visits the items in the permutation drawn from (seed, e, 0): the pre-training
    loader's order over one shard; ranks take consecutive slices of each global batch. With drop_last the
    last incomplete global batch is left out; without it, its items are shared out in equal rank slices,
    padded from the epoch's first items, so every item is trained every epoch."""
    n = 23
    f = Windows([np.arange(2 + i % 5) for i in range(n)], np.ones(n, dtype=np.int64), np.arange(n), n)
    f.with_labels(np.arange(n))
    for seed, batch, world in ((0, 4, 1), (7, 2, 2), (12345, 3, 1), (3, 4, 3)):
        for drop_last in (True, False):
            ranks = [EncodedBatches(f, batch, seed=seed, rank=r, world_size=world, drop_last=drop_last)
                     for r in range(world)]
            full, left = divmod(n, batch * world)
            per = -(-left // world)  # the last slice of each rank, without drop_last
            assert all(len(b) == full + (not drop_last) for b in ranks)
            for epoch in range(3):
                perm = np.random.default_rng([seed, epoch, 0]).permutation(n)
                want = [[perm[k * batch * world + r * batch:][:batch].tolist() for k in range(full)]
                        for r in range(world)]
                if not drop_last:
                    for r in range(world):
                        want[r].append(perm[(full * batch * world + r * per + np.arange(per)) % n].tolist())
                got = [[b["labels"].tolist() for b in source] for source in ranks]
                assert got == want, (seed, world, drop_last, epoch)
                if not drop_last:
                    assert set(sum((sum(g, []) for g in got), [])) == set(range(n))


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("stop", [1, 3, 5, 6, 7, 12])
def test_resuming_anywhere_gives_the_uninterrupted_batches(stop, drop_last):
    """A loader stopped after ``stop`` batches (mid-epoch, at an epoch's end, in a later epoch) and a
    fresh one loaded with its state give, together, the batches of one that never stopped."""
    n = 23  # 5 batches of 4 per epoch, and 3 items dropped or a 6th batch of 3
    per_epoch = 5 if drop_last else 6
    f = Windows([np.arange(2 + i % 7) for i in range(n)], np.full(n, 2, dtype=np.int64), np.arange(n), n)
    f.with_labels(np.arange(n))
    uninterrupted = _take(EncodedBatches(f, 4, seed=5, drop_last=drop_last), 15)
    first = EncodedBatches(f, 4, seed=5, drop_last=drop_last)
    seen = _take(first, stop)
    state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
    kept = {} if drop_last else {"drop_last": False}
    assert state == {"epoch": stop // per_epoch, "position": 4 * (stop % per_epoch), "seed": 5, "global_batch": 4,
                     **kept}
    resumed = EncodedBatches(f, 4, seed=5, drop_last=drop_last)
    resumed.load_state_dict(state)
    together = seen + _take(resumed, 15 - stop)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(together, uninterrupted) for k in a)
    with pytest.raises(ValueError, match="seed 5"):
        EncodedBatches(f, 4, seed=6, drop_last=drop_last).load_state_dict(state)
    with pytest.raises(ValueError, match=f"drop_last {drop_last}; this loader has {not drop_last}"):
        EncodedBatches(f, 4, seed=5, drop_last=not drop_last).load_state_dict(state)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        next(iter(EncodedBatches(f, 8, world_size=3, name="tiny.csv", drop_last=True)))
    assert len(next(iter(EncodedBatches(f, 8, world_size=3, name="tiny.csv")))["labels"]) == 8



def test_two_gloo_processes_train_an_epoch_s_padded_last_batch(base, tmp_path):
    """13 examples, global batch 8 on 2 processes: two steps an epoch, the second's 5 examples shared out
    as 3 and 3 (one padded from the epoch's start); both processes finish every step and agree."""
    rows = [{"text": f"{'good' if i % 2 else 'bad'} film number {i}", "label": i % 2} for i in range(13)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "bertforge",
           "finetune", "--task", "classification", "--model", str(base), "--train-file", str(train), "--out", str(out),
           "--batch-size", "8", "--epochs", "2", "--lr", "1e-3", "--log-every", "1", "--no-progress"]
    done = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line).get("split") == "train"]
    assert steps == [1, 2, 3, 4] and (out / "model" / "config.json").is_file()

def test_families_read_task_settings_and_never_import_the_recipe():
    """FinetuneConfig is TaskSettings plus the loop's settings: a family takes either; no family
    module imports the recipe (tasks.finetune) or another family's module."""
    import ast

    import bertforge.tasks as tasks

    assert issubclass(FinetuneConfig, TaskSettings) and issubclass(FinetuneConfig, TrainConfig)
    folder = Path(tasks.__file__).parent
    families = {"classification", "tagging", "squad", "multiple_choice"}
    for name in [*families, "base", "encoding"]:
        tree = ast.parse((folder / f"{name}.py").read_text(encoding="utf-8"))
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        assert "bertforge.tasks.finetune" not in imported and "bertforge.tasks" not in imported, name
        assert not {f"bertforge.tasks.{other}" for other in families - {name}} & imported, name


# ------------------------------------------------------------------------------ learning
@pytest.fixture(scope="module")
def learned(root, base) -> tuple[Path, Path, Path]:
    """A generic CSV task (the word "good" or "bad" decides) learned by the tiny model."""
    rng = random.Random(1)
    train = write_csv(root / "train.csv", [polar(rng) for _ in range(64)])
    dev = write_csv(root / "dev.csv", [polar(rng) for _ in range(32)])
    out = root / "polar"
    finetune(config(base, out, task="classification", train_file=str(train), dev_file=str(dev),
                    text_column="review", label_column="sentiment", epochs=25, checkpoint_every=1000))
    return out, train, dev


def test_a_tiny_model_learns_an_easy_task_and_keeps_the_best_on_dev(learned):
    out, train, dev = learned
    lines = train_lines(out)
    assert len(lines) == 100 and lines[0]["accuracy"] < 0.8 and min(r["accuracy"] for r in lines[-10:]) == 1.0
    evals = train_lines(out, "eval")
    assert [r["step"] for r in evals] == [4 * k for k in range(1, 26)]  # every epoch (64 / 16 steps)
    best = json.loads((out / "best" / "eval_metrics.json").read_text())
    assert best["metric"] == "accuracy" and best["value"] == max(r["accuracy"] for r in evals) >= 0.75
    assert set(best["metrics"]) == {"accuracy", "f1"}
    assert evaluate(out / "best", file=train)["accuracy"] >= 0.95  # near-perfect on the training data
    assert evaluate(out / "best", file=dev) == pytest.approx(best["metrics"], abs=1e-6)


def test_integer_labels_are_named_by_label_names_in_the_model_predictions_and_evaluation(root, base, tmp_path):
    rng = random.Random(3)
    rows = [(t, "1" if y == "pos" else "0") for t, y in (polar(rng) for _ in range(32))]
    train = write(tmp_path / "train.jsonl", "".join(json.dumps({"text": t, "label": int(y)}) + "\n" for t, y in rows))
    out = tmp_path / "named"
    finetune(config(base, out, task="classification", train_file=str(train), dev_file=str(train), max_steps=2,
                    label_names="negative,positive"))
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["id2label"] == {"0": "negative", "1": "positive"}  # in the names' order, not sorted
    assert {r["label"] for r in predict(out / "model", train)} <= {"negative", "positive"}
    assert set(evaluate(out / "model", file=train)) == {"accuracy", "f1"}  # the dev's 0 / 1 named as in training
    bad = write(tmp_path / "bad.jsonl", json.dumps({"text": "x", "label": 2}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: label '2' is not one of 0\.\.1, the indexes of label_names"):
        evaluate(out / "model", file=bad)
    for settings, message in (({"label_names": "a,,b"}, "label_names must be distinct, non-empty names"),
                              ({"label_names": "a,a"}, "label_names must be distinct")):
        with pytest.raises(ValueError, match=message):
            config(base, out, **settings)
    with pytest.raises(ValueError, match="label_names names integer class labels; regression has scores"):
        finetune(config(base, tmp_path / "r", task="regression", train_file=str(train), label_names="a,b",
                        keep_best=False))
    with pytest.raises(ValueError, match="label_names names the labels of classification and the tags of "
                                         "tagging; multiple_choice"):
        finetune(config(base, tmp_path / "t", task="multiple_choice", train_file=str(train), label_names="a,b",
                        keep_best=False))


def test_the_best_model_keeps_the_dev_predictions_beside_it(learned, tmp_path):
    """best/predictions.tsv: predict's table of the dev file with the gold label, the predictions that scored best."""
    out, _, dev = learned
    lines = (out / "best" / "predictions.tsv").read_text().splitlines()
    records = predict(out / "best", dev)
    gold = [e.label for e in read_examples(dev, text_column="review", label_column="sentiment")[0]]
    assert lines == ["index\tprediction\tgold",
                     *(f"{r['index']}\t{r['label']}\t{g}" for r, g in zip(records, gold))]
    best = json.loads((out / "best" / "eval_metrics.json").read_text())
    assert np.mean([r["label"] == g for r, g in zip(records, gold)]) == best["metrics"]["accuracy"]
    evaluate(out / "best", file=dev, out=tmp_path)  # evaluate --out writes the same table
    assert (tmp_path / "predictions.tsv").read_text().splitlines() == lines


def test_load_finetuned_gives_what_evaluation_and_prediction_use(learned, tmp_path):
    out, _, _ = learned
    ft = load_finetuned(out / "best", {"max_seq_length": 16, "eval_batch_size": 3})
    assert ft.family.name == "classification" and not ft.model.training
    assert (ft.settings.task, ft.settings.text_column, ft.settings.max_seq_length, ft.settings.eval_batch_size) == \
        ("classification", "review", 16, 3)  # the run's settings, with those given instead
    rng = random.Random(9)
    texts = [polar(rng, n_words=(3, 30))[0] for _ in range(12)]  # some longer than a window of 16
    records = ft.family.predict_texts(ft.model, ft.tokenizer, ft.settings, [(t,) for t in texts], ft.device)
    assert [r["text"] for r in records] == texts and all(set(r["probabilities"]) == {"neg", "pos"} for r in records)
    # The records of raw texts are those of the same texts read from a file (the same long-input handling).
    file = write(tmp_path / "texts.csv", "review\n" + "".join(f'"{t}"\n' for t in texts))
    from_file = predict(out / "best", file, settings={"max_seq_length": 16})
    for r, f in zip(records, from_file, strict=True):  # the same fields (the batches differ: values to 1e-5)
        assert set(f) == {*r, "line"} and (f["text"], f["label"]) == (r["text"], r["label"])
        assert f["probabilities"] == pytest.approx(r["probabilities"], abs=1e-5)
    assert [f["line"] for f in from_file] == list(range(2, 14))
    with pytest.raises(ValueError, match="^unknown key 'lr'; expected "):
        load_finetuned(out / "best", {"lr": 1e-3})


def test_dropout_is_the_checkpoints_unless_set(root, base):
    """--dropout replaces the checkpoint's (e.g. 0.1 for one pre-trained without dropout); by default it stays."""
    rng = random.Random(5)
    train = write_csv(root / "drop.csv", [polar(rng) for _ in range(16)])
    for dropout, expected in ((None, 0.1), (0.0, 0.0), (0.3, 0.3)):
        out = root / f"drop-{dropout}"
        finetune(config(base, out, task="classification", train_file=str(train), text_column="review",
                        label_column="sentiment", max_steps=1, dropout=dropout, keep_best=False))
        saved = json.loads((out / "model" / "config.json").read_text())
        assert (saved["hidden_dropout_prob"], saved["attention_probs_dropout_prob"]) == (expected, expected)
    with pytest.raises(ValueError, match="dropout"):
        config(base, root / "bad", dropout=1.0)


def test_the_fine_tuned_folder_is_transformers_bert_for_sequence_classification(learned, tmp_path):
    out, _, dev = learned
    folder = out / "best"
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["BertForSequenceClassification"]
    assert cfg["id2label"] == {"0": "neg", "1": "pos"} and cfg["label2id"] == {"neg": 0, "pos": 1}
    theirs = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    assert theirs.config.id2label == {0: "neg", 1: "pos"}
    ours = BertForSequenceClassification.from_pretrained(folder).eval()
    enc = BertTokenizer.from_pretrained(folder)(["the good house", "a bad road by the river"], padding=True,
                                                return_tensors="pt")
    with torch.no_grad():
        a, b = ours(**enc).logits, theirs(**enc).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # predict(): one record per example, label names, TSV (GLUE's submission layout) or JSONL.
    records = predict(folder, dev, tmp_path / "p.tsv")
    assert len(records) == 32 and {r["label"] for r in records} <= {"neg", "pos"}
    tsv = (tmp_path / "p.tsv").read_text().splitlines()
    assert tsv[0] == "index\tprediction" and tsv[1] == f"0\t{records[0]['label']}"
    predict(folder, dev, tmp_path / "p.jsonl")
    assert json.loads((tmp_path / "p.jsonl").read_text().splitlines()[3]) == records[3]


def test_the_label_word_beyond_the_first_window_is_found(root, base):
    """Texts of 40-50 tokens in windows of 14: the word that decides sits after token 28, so only the
    last windows see it; the averaged window logits must still classify every example."""
    rng = random.Random(3)
    rows = [polar(rng, n_words=(40, 50), at=rng.randint(30, 39)) for _ in range(48)]
    train = write_csv(root / "long.csv", rows)
    out = root / "long"
    result = finetune(config(base, out, task="classification", train_file=str(train), dev_file=str(train),
                             text_column="review", label_column="sentiment", max_seq_length=16, long_inputs="windows",
                             stride=8, epochs=8, keep_best=False, log_every=50))
    assert result.eval_metrics["accuracy"] >= 0.95
    settings = json.loads((out / "model" / "config.json").read_text())["bertforge_finetune"]
    assert (settings["max_seq_length"], settings["long_inputs"], settings["stride"]) == (16, "windows", 8)  # reused
    assert evaluate(out / "model", file=train)["accuracy"] == pytest.approx(result.eval_metrics["accuracy"], abs=1e-6)


def test_stsb_regression_learns_the_score(root, base):
    rng = random.Random(5)
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    rows = []
    for i in range(64):
        a, y = polar(rng)
        b = " ".join(rng.choice(FILLER) for _ in range(4))
        rows.append(f"{i}\tmain\tx\t2012\t{i}\tnone\tnone\t{a}\t{b}\t{4.5 if y == 'pos' else 0.5:.3f}\n")
    train = write(root / "sts.tsv", head + "".join(rows))
    out = root / "sts"
    result = finetune(config(base, out, task="stsb", train_file=str(train), dev_file=str(train), epochs=25))
    losses = [r["loss"] for r in train_lines(out)]
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:10])  # Adam moves the output bias ~lr a step: slow
    assert set(result.eval_metrics) == {"pearson", "spearman", "corr"} and result.best["metric"] == "pearson"
    assert result.eval_metrics["pearson"] > 0.85 and result.eval_metrics["spearman"] > 0.8
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["num_labels"] == 1 and saved["problem_type"] == "regression"
    assert set(predict(out / "model", train)[0]) == {"index", "line", "text", "text_pair", "score"}
    table = [line.split("\t") for line in (out / "best" / "predictions.tsv").read_text().splitlines()]
    assert table[0] == ["index", "prediction", "gold"] and len(table) == 65  # the predicted and the gold score
    scores = np.array([[float(x) for x in row[1:]] for row in table[1:]])
    assert np.corrcoef(scores.T)[0, 1] == pytest.approx(result.best["metrics"]["pearson"], abs=1e-6)


def test_a_run_stopped_by_sigterm_and_resumed_equals_an_uninterrupted_one(root, base, monkeypatch):
    rng = random.Random(2)
    train = write_csv(root / "resume.csv", [polar(rng) for _ in range(48)])
    settings = dict(task="classification", train_file=str(train), dev_file=str(train), text_column="review",
                    label_column="sentiment", epochs=2, checkpoint_every=2)  # 6 steps, evaluated at 3 and 6
    straight, halves = root / "straight", root / "halves"
    finetune(config(base, straight, **settings))
    real_step = trainer.Trainer.train_step

    def step_and_signal(self, micro):
        if self.step == 3:  # during step 4: mid-epoch, after an evaluation
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, micro)

    monkeypatch.setattr(trainer.Trainer, "train_step", step_and_signal)
    first = finetune(config(base, halves, **settings))
    assert first.train.stopped_early and first.train.step == 4
    assert first.train.exit_code == 128 + signal.SIGTERM
    assert json.loads((halves / "model" / STOP_MARKER).read_text())["reason"] == "SIGTERM"
    monkeypatch.setattr(trainer.Trainer, "train_step", real_step)
    with pytest.raises(ValueError, match="resume=True continues it"):
        finetune(config(base, halves, **settings))
    # What a kill during the saves of model/ and best/ leaves: cleared by the resumed run.
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    for name in ("model", "best"):
        for kind in ("tmp", "old"):
            (halves / f".{name}.{kind}-{proc.pid}").mkdir()
    second = finetune(config(base, halves, resume=True, **settings))
    assert second.train.step == 6
    assert not (halves / "model" / STOP_MARKER).exists()
    assert not [p.name for p in halves.iterdir() if p.name.startswith(".")]
    assert [r["loss"] for r in train_lines(halves)] == [r["loss"] for r in train_lines(straight)]
    untimed = lambda out: [{k: v for k, v in r.items() if k != "time"} for r in train_lines(out, "eval")]  # noqa: E731
    assert [r["step"] for r in untimed(halves)] == [3, 6] and untimed(halves) == untimed(straight)
    assert json.loads((halves / "best" / "eval_metrics.json").read_text()) == json.loads(
        (straight / "best" / "eval_metrics.json").read_text())
    for folder in ("model", "best"):
        a, b = load_file(straight / folder / "model.safetensors"), load_file(halves / folder / "model.safetensors")
        assert all(torch.equal(a[k], b[k]) for k in a), folder
    # A finished run without its checkpoints is refused, its files as they were.
    shutil.rmtree(straight / "checkpoints")
    before = {p: p.read_bytes() for p in sorted(straight.rglob("*")) if p.is_file()}
    with pytest.raises(ValueError, match="already holds a previous run's files .*metrics.jsonl.*model/.*best/.*"
                                         "no checkpoint to resume from, overwrite=True"):
        finetune(config(base, straight, **settings))
    assert {p: p.read_bytes() for p in sorted(straight.rglob("*")) if p.is_file()} == before


def test_a_given_warmup_setting_wins_over_the_default_and_the_run_records_the_warmup_used(root, base):
    """Not given, a warmup setting takes the recipe's default (fine-tuning 10% of the steps, pre-training
    10,000 steps); given, it wins; both given is an error."""
    from bertforge.train.optim import lr_factor
    from bertforge.train.pretrain import PretrainConfig

    assert FinetuneConfig(max_steps=40).warmup == 4
    assert FinetuneConfig(max_steps=40, warmup_steps=2).warmup == 2
    assert FinetuneConfig(max_steps=40, warmup_ratio=0.5).warmup == 20
    assert PretrainConfig().warmup == 10_000
    assert PretrainConfig(max_steps=100, warmup_ratio=0.2).warmup == 20
    for cls in (FinetuneConfig, PretrainConfig):
        with pytest.raises(ValueError, match="warmup_steps .* and warmup_ratio .* are both set"):
            cls(warmup_steps=2, warmup_ratio=0.1)
    rng = random.Random(3)
    train = write_csv(root / "warmup.csv", [polar(rng) for _ in range(32)])
    out = root / "warmup-steps"
    finetune(config(base, out, task="classification", train_file=str(train), text_column="review",
                    label_column="sentiment", keep_best=False, max_steps=4, warmup_ratio=None, warmup_steps=2))
    expected = [1e-3 * lr_factor(step, total_steps=4, warmup_steps=2) for step in range(1, 5)]
    assert [r["lr"] for r in train_lines(out)] == pytest.approx(expected)
    saved = json.loads((out / "run_config.json").read_text())
    assert (saved["warmup_steps"], saved["warmup_ratio"], saved["warmup_steps_used"]) == (2, None, 2)


def test_the_run_summary_without_a_dev_file_has_no_empty_parts(root, base, caplog):
    """The summary line joins only the parts a run has: without --dev-file there is no dev part (and no "; ;")."""
    caplog.set_level(logging.INFO, logger="bertforge")
    rng = random.Random(6)
    train = write_csv(root / "summary.csv", [polar(rng) for _ in range(32)])
    finetune(config(base, root / "summary", task="classification", train_file=str(train), text_column="review",
                    label_column="sentiment", keep_best=False, max_steps=2, device="cpu"))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("finetune: classification"))
    assert line == ("finetune: classification, 2 labels (neg, pos); train 32 examples; "
                    "2 steps of 16 (2 per epoch, warmup 0) on cpu")


def test_cli_finetune_evaluate_predict_on_an_mnli_folder(root, base, capsys):
    rng = random.Random(4)
    folder = root / "MNLI"
    folder.mkdir()
    head = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
    labels = ["contradiction", "entailment", "neutral"]

    def rows(n: int, labelled: bool = True) -> str:
        out = []
        for i in range(n):
            a, _ = polar(rng)
            y = rng.choice(labels)
            ids = f"{i}\t{i}\t{i}n\tgov"
            out.append(f"{ids}\t{a}\tthe {y}\t{y}\t{y}\n" if labelled else f"{ids}\t{a}\tx\n")
        return "".join(out)

    write(folder / "train.tsv", head + rows(32))
    for name in ("dev_matched.tsv", "dev_mismatched.tsv"):
        write(folder / name, head + rows(8))
    write(folder / "test_matched.tsv", "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\n" + rows(5, False))
    out = root / "mnli-run"
    assert cli.main(["finetune", "--task", "mnli", "--model", str(base), "--train-file", str(folder),
                     "--dev-file", str(folder), "--out", str(out), "--max-steps", "3", "--batch-size", "8",
                     "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "3 labels (contradiction, entailment, neutral)" in printed  # the log, as the command prints it
    metrics = json.loads(printed.strip().splitlines()[-1])
    assert set(metrics) == {"dev_matched_accuracy", "dev_mismatched_accuracy"}
    assert json.loads((out / "best" / "eval_metrics.json").read_text())["metric"] == "dev_matched_accuracy"
    assert cli.main(["evaluate", str(out / "model"), "--file", str(folder / "dev_matched.tsv")]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"accuracy"}
    assert cli.main(["predict", str(out / "model"), str(folder / "test_matched.tsv"), "--out",
                     str(root / "mnli.tsv")]) == 0
    lines = (root / "mnli.tsv").read_text().splitlines()
    assert len(lines) == 6 and lines[1].split("\t")[1] in labels
    assert cli.main(["evaluate", str(out / "model"), "--file", str(root / "nope.tsv")]) == 2
    assert "nope.tsv: no such file" in capsys.readouterr().err
    # resumed from the run folder alone: its recorded settings, --max-steps over them
    assert cli.main(["finetune", "--out", str(out), "--resume", "--max-steps", "4"]) == 0
    capsys.readouterr()
    saved = json.loads((out / "run_config.json").read_text())
    assert (saved["task"], saved["max_steps"], saved["batch_size"]) == ("mnli", 4, 8)
    assert max(json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()) == 4


# ------------------------------------------------------------------------------ the paper's grid
def test_parse_grid_reads_the_paper_grid_and_subsets():
    assert parse_grid("paper") == {"lr": (5e-5, 3e-5, 2e-5), "batch_size": (16, 32), "epochs": (2.0, 3.0, 4.0)}
    assert parse_grid("lr=5e-5,3e-5;batch=16 epochs=2") == {"lr": (5e-5, 3e-5), "batch_size": (16,),
                                                           "epochs": (2.0,)}
    for bad in ("lr=", "warmup=0.1", "batch_size=1.5", "lr=-1", "lr 5e-5"):
        with pytest.raises(ValueError, match="grid"):
            parse_grid(bad)
    with pytest.raises(ValueError, match="grid"):
        FinetuneConfig(grid="epochs=two")


def test_grid_runs_every_configuration_keeps_the_best_on_dev_and_resumes(root, base, caplog):
    caplog.set_level(logging.INFO, logger="bertforge")
    rng = random.Random(11)
    train = write_csv(root / "grid_train.csv", [polar(rng) for _ in range(32)])
    dev = write_csv(root / "grid_dev.csv", [polar(rng) for _ in range(16)])
    out = root / "grid"
    cfg = config(base, out, task="classification", train_file=str(train), dev_file=str(dev), text_column="review",
                 label_column="sentiment", grid="lr=1e-3,1e-6 batch_size=16,32 epochs=3")
    result = finetune_grid(cfg)
    assert [(r["lr"], r["batch_size"]) for r in result.runs] == [(1e-3, 16), (1e-3, 32), (1e-6, 16), (1e-6, 32)]
    assert [r["steps"] for r in result.runs] == [6, 3, 6, 3]  # 3 epochs of 32 examples
    for r in result.runs:
        evals = train_lines(Path(r["folder"]), "eval")
        assert r["value"] == max(e["accuracy"] for e in evals)  # each run's own best on dev
    assert result.best["value"] == max(r["value"] for r in result.runs)
    kept = json.loads((out / "best" / "eval_metrics.json").read_text())
    assert kept == json.loads((Path(result.best["folder"]) / "best" / "eval_metrics.json").read_text())
    assert evaluate(out / "best", dev)["accuracy"] == pytest.approx(result.best["value"], abs=1e-9)
    table = (out / "grid.tsv").read_text().splitlines()
    assert table[0].split("\t")[:8] == ["lr", "batch_size", "epochs", "steps", "minutes", "best_step", "metric",
                                        "value"]
    assert len(table) == 5 and table[1].startswith("0.001\t16\t3\t6\t")
    with pytest.raises(ValueError, match="already holds a grid; resume=True continues it, overwrite=True runs it"):
        finetune_grid(cfg)
    # Resume: finished runs are read back, not trained again; a removed one is run again.
    shutil.rmtree(out / "grid" / "lr1e-06-bs32-ep3")
    caplog.clear()
    again = finetune_grid(dataclasses.replace(cfg, resume=True))
    assert [r["value"] for r in again.runs] == [r["value"] for r in result.runs]
    assert "run 4 of 4" in caplog.text and "run 1 of 4" not in caplog.text


def test_cli_grid_flag_alone_is_the_paper_grid(monkeypatch):
    seen = []

    def grid(cfg):
        seen.append(cfg.grid)
        return SimpleNamespace(stopped_early=False, best=None)

    def single(cfg):
        seen.append(cfg.grid)
        return SimpleNamespace(train=SimpleNamespace(stopped_early=False), eval_metrics={})

    monkeypatch.setattr("bertforge.tasks.finetune.finetune_grid", grid)
    monkeypatch.setattr("bertforge.tasks.finetune.finetune", single)
    for args, expected in ((["--grid"], "paper"), (["--grid", "--lr", "3e-5"], "paper"),
                           (["--grid", "lr=3e-5"], "lr=3e-5"), ([], "")):
        seen.clear()
        assert cli.main(["finetune", *args]) == 0
        assert seen == [expected], args


def test_a_fine_tuned_head_continues_for_the_same_task_and_labels_and_starts_afresh_otherwise(learned, root,
                                                                                              monkeypatch):
    out, train, _ = learned
    old = BertForSequenceClassification.from_pretrained(out / "model").classifier.weight
    first: list[torch.Tensor] = []  # the head as training starts
    forward = ClassificationObjective.forward

    def spy(self, model, batch):
        first.append(model.classifier.weight.detach().clone())
        return forward(self, model, batch)

    monkeypatch.setattr(ClassificationObjective, "forward", spy)
    relabelled = write(root / "relabelled.csv", train.read_text().replace(",pos\n", ",POS\n").replace(",neg\n", ",NEG\n"))
    for name, data, same in (("same", train, True), ("relabelled", relabelled, False)):
        first.clear()
        finetune(config(out / "model", root / f"continue-{name}", task="classification", train_file=str(data),
                        text_column="review", label_column="sentiment", max_steps=1, keep_best=False))
        assert torch.equal(first[0], old) == same
