"""Multiple choice (SWAG), end to end on generated data.

SWAG's own CSVs (an unnamed index column, ``sent1`` the context, ``sent2`` the start of every
ending, ``test.csv`` without labels) and generic CSV / JSONL are read as written; errors name file
and line; skips are counted. Every (context, choice) pair is ``[CLS] context [SEP] choice [SEP]``,
cut longest-first as the TF release cuts (transformers' tokenizer agrees up to the odd token of a
halved odd room), counted when cut. A tiny model learns to pick the ending that reads "good" (to
perfection on train and dev) and keeps the dev predictions beside its best model; evaluate / predict
work through Python and the CLI; the fine-tuned folder is transformers' BertForMultipleChoice with
equal logits and loss.
"""

from __future__ import annotations

import itertools
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models
from finetune_fixtures import FILLER, base, root, write  # noqa: F401 - base: the tiny "pre-trained" BERT fixture

from bertforge import cli
from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune, predict
from bertforge.model.heads import BertForMultipleChoice
from bertforge.tasks import family_for
from bertforge.tasks.multiple_choice import (
    ChoiceExample,
    MultipleChoiceObjective,
    encode_choices,
    longest_first,
    read_choices,
)
from bertforge.text.tokenizer import BertTokenizer

SWAG_HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"


@pytest.fixture(scope="module")
def tok(base) -> BertTokenizer:
    return BertTokenizer.from_pretrained(base)


def words(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(FILLER) for _ in range(rng.randint(lo, hi)))


def swag_rows(rng: random.Random, n: int, labelled: bool = True) -> str:
    """SWAG rows of filler words where the right ending (at a random place) ends in "good", the three
    others in "bad"; commas inside quoted fields."""
    rows = []
    for i in range(n):
        sent1, sent2 = f"{words(rng, 1, 3)}, {words(rng, 1, 3)}", words(rng, 1, 2)
        label = rng.randrange(4)
        endings = [f'"{words(rng, 1, 3)} {"good" if k == label else "bad"}"' for k in range(4)]
        row = [str(i), f"anetv_{i}", str(1000 + i), f'"{sent1} {sent2}"', f'"{sent1}"', sent2, "gold", *endings]
        rows.append(",".join(row + ([str(label)] if labelled else [])) + "\n")
    return "".join(rows)


def swag_folder(folder: Path, seed: int, n_train: int, n_val: int, n_test: int) -> Path:
    rng = random.Random(seed)
    folder.mkdir()
    write(folder / "train.csv", SWAG_HEADER + swag_rows(rng, n_train))
    write(folder / "val.csv", SWAG_HEADER + swag_rows(rng, n_val))
    write(folder / "test.csv", SWAG_HEADER.replace(",label", "") + swag_rows(rng, n_test, labelled=False))
    return folder


def config(base: Path, out: Path, **overrides) -> FinetuneConfig:
    settings = dict(model=str(base), out=str(out), task="swag", lr=2e-3, batch_size=16, warmup_ratio=0.1,
                    weight_decay=0.0, log_every=1, progress=False, seed=3)
    return FinetuneConfig(**{**settings, **overrides})


def metric_lines(out: Path, split: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


# ------------------------------------------------------------------------------ reading files
def test_swag_files_are_read_as_written(tmp_path):
    text = (SWAG_HEADER + '0,lsmdc3001_X-1,18313,"Students lower their eyes. She","Students lower their eyes.",She,'
            'gold,"pats her shoulder, then leaves.",turns with two students.,walks slowly.,wheels around.,2\n')
    train = write(tmp_path / "train.csv", text)
    ex, report = read_choices(train, "swag")
    assert ex == [ChoiceExample("Students lower their eyes.", ("She pats her shoulder, then leaves.",
                                "She turns with two students.", "She walks slowly.", "She wheels around."), 2, 2)]
    assert report.examples == 1 and report.num_skipped == 0
    test = write(tmp_path / "test.csv", SWAG_HEADER.replace(",label", "") + text.splitlines()[1].rsplit(",", 1)[0])
    assert read_choices(test, "swag", require_labels=False)[0] == [ex[0]._replace(label=None)]
    with pytest.raises(ValueError, match=r"test\.csv:1: no column 'label' \(columns: , video-id, fold-ind"):
        read_choices(test, "swag")
    write(tmp_path / "val.csv", text)
    family = family_for("swag")
    cfg = FinetuneConfig(task="swag")
    assert family.files(cfg, str(tmp_path), "dev") == [tmp_path / "val.csv"]  # the swagaf data folder
    assert family.files(cfg, str(tmp_path), "test") == [tmp_path / "test.csv"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty/val\.csv: no such file \(a SWAG folder holds"):
        family.files(cfg, str(tmp_path / "empty"), "dev")


def test_generic_jsonl_and_csv_layouts(tmp_path):
    jsonl = write(tmp_path / "d.jsonl", '{"context": "a man sits.", "choices": ["he eats.", "he flies."], "label": 0}'
                                        '\n\n{"context": "it rains.", "choices": ["wet.", "dry."], "label": "1"}\n')
    ex, report = read_choices(jsonl)
    assert ex == [ChoiceExample("a man sits.", ("he eats.", "he flies."), 0, 1),
                  ChoiceExample("it rains.", ("wet.", "dry."), 1, 3)] and report.blank_lines == 1
    # COPA-like numbered keys from 1, other column names
    copa = write(tmp_path / "copa.jsonl", '{"premise": "x", "choice1": "y", "choice2": "z", "answer": 1}\n')
    assert read_choices(copa, context_column="premise", choices_column="choice", label_column="answer")[0] == [
        ChoiceExample("x", ("y", "z"), 1, 1)]
    tsv = write(tmp_path / "d.tsv", 'context\tchoices0\tchoices1\tchoices2\tlabel\n"quoted"\ta\tb\tc\t2\n')
    assert read_choices(tsv)[0] == [ChoiceExample('"quoted"', ("a", "b", "c"), 2, 2)]  # TSV: no quoting


def test_errors_name_file_and_line_and_skips_are_counted(tmp_path):
    f = write(tmp_path / "a.csv", "context,choices0,choices1,label\nx,a,b,1\ny,a,b,2\nz,a,b\nw,a,b,\nv,a,b,one\n")
    with pytest.raises(ValueError, match=r"a\.csv:3: the label '2' is not a choice index \(0\.\.1\)"):
        read_choices(f)
    ex, report = read_choices(f, skip_bad_rows=True)
    assert [e.line for e in ex] == [2] and report.skipped == {"malformed": [3, 4, 6], "no label": [5]}
    assert "skipped 3 rows (malformed; lines 3, 4, 6)" in report.summary()
    ex, report = read_choices(f, skip_bad_rows=True, require_labels=False)  # to predict: labels are not read
    assert [e.line for e in ex] == [2, 3, 5, 6] and report.skipped == {"malformed": [4]}
    with pytest.raises(ValueError, match=r"b\.csv:1: no column choices0, choices1, \.\.\. \(columns: context, ending0"):
        read_choices(write(tmp_path / "b.csv", "context,ending0,ending1,label\nx,a,b,0\n"))
    with pytest.raises(ValueError, match=r"c\.jsonl:2: 3 choices where line 1 has 2"):
        read_choices(write(tmp_path / "c.jsonl", '{"context": "x", "choices": ["a", "b"], "label": 0}\n'
                                                 '{"context": "y", "choices": ["a", "b", "c"], "label": 0}\n'))
    with pytest.raises(ValueError, match=r"c\.jsonl:1: 2 choices where the first file has 4"):
        read_choices(tmp_path / "c.jsonl", num_choices=4)
    with pytest.raises(ValueError, match=r"d\.jsonl:1: no key choices0, choices1, \.\.\. or a list 'choices' "
                                         r"\(keys: context, options"):
        read_choices(write(tmp_path / "d.jsonl", '{"context": "x", "options": ["a", "b"], "label": 0}\n'))
    with pytest.raises(ValueError, match=r"e\.jsonl:2: not a JSON record"):
        read_choices(write(tmp_path / "e.jsonl", '{"context": "x", "choices": ["a", "b"], "label": 0}\n{"con\n'))
    with pytest.raises(ValueError, match=r"f\.jsonl:1: the context and choices must be strings"):
        read_choices(write(tmp_path / "f.jsonl", '{"context": "x", "choices": ["a", 7], "label": 0}\n'))
    with pytest.raises(ValueError, match=r"g\.jsonl:1: 1 choice: multiple choice needs 2 or more"):
        read_choices(write(tmp_path / "g.jsonl", '{"context": "x", "choices": ["a"], "label": 0}\n'))
    with pytest.raises(FileNotFoundError, match=r"nope\.csv: no such file"):
        read_choices(tmp_path / "nope.csv")


# ------------------------------------------------------------------------------ features
def test_features_are_cls_context_sep_choice_sep_padded_per_batch(tok):
    ex = [ChoiceExample("the old house", ("a river", "the big grey road", "no"), 1, 2),
          ChoiceExample("one", ("two", "three", "four five six seven"), 0, 3)]
    f = encode_choices(ex, tok, max_seq_length=32).with_labels(np.array([1, 0]))
    assert len(f) == 2 and f.lengths.tolist() == [10, 8]  # the longest of each example's choices
    batch = f.collate([1, 0])
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (2, 3, 10), "attention_mask": (2, 3, 10), "token_type_ids": (2, 3, 10), "labels": (2,)}
    assert batch["labels"].tolist() == [0, 1]
    ids = tok.encode_batch_ids
    cls, sep = tok.cls_token_id, tok.sep_token_id
    row = batch["input_ids"][1, 1].tolist()  # "the old house" / "the big grey road"
    assert row == [cls, *ids(["the old house"])[0], sep, *ids(["the big grey road"])[0], sep]
    assert batch["token_type_ids"][1, 1].tolist() == [0] * 5 + [1] * 5
    assert batch["attention_mask"][1, 2].tolist() == [1] * 7 + [0] * 3  # "no": padded to the batch's longest
    assert batch["token_type_ids"][1, 2].tolist() == [0] * 5 + [1, 1, 0, 0, 0]
    assert f.cut_pairs == 0 and f.summary() == "2 examples x 3 choices"


def test_pairs_are_cut_longest_first_and_counted(tok, base):
    def tf_loop(a: int, b: int, room: int) -> tuple[int, int]:  # the TF release's _truncate_seq_pair
        while a + b > room:
            a, b = (a - 1, b) if a > b else (a, b - 1)
        return a, b

    assert all(longest_first(a, b, r) == tf_loop(a, b, r) for a, b, r in itertools.product(range(20), range(20),
                                                                                          range(1, 40)))
    hf = transformers.AutoTokenizer.from_pretrained(base)
    rng = random.Random(0)
    balanced = same = 0
    for la, lb, L in itertools.product(range(1, 10), range(1, 10), range(4, 14)):
        a, b = " ".join(rng.choice(FILLER) for _ in range(la)), " ".join(rng.choice(FILLER) for _ in range(lb))
        f = encode_choices([ChoiceExample(a, (b, "x"), None, 1)], tok, L)
        theirs = hf(a, b, truncation="longest_first", max_length=L)
        mine = f.collate([0])
        n_a, n_b = int(f.sequences.num_a[0]) - 2, len(f.sequences.input_ids[0]) - int(f.sequences.num_a[0]) - 1
        if la + lb - (L - 3) > abs(la - lb) and (L - 3) % 2 and la <= lb:  # both cut to halves of an odd room:
            assert (n_a, n_b) == ((L - 2) // 2, (L - 3) // 2)  # the TF loop keeps the odd token in the context,
            assert theirs["token_type_ids"].count(0) - 2 == n_a - 1  # transformers in the longer, the choice
            balanced += 1
            continue
        same += 1
        assert len(f.sequences.input_ids[0]) == len(theirs["input_ids"])
        assert mine["input_ids"][0, 0, :len(theirs["input_ids"])].tolist() == theirs["input_ids"]
        assert mine["token_type_ids"][0, 0, :len(theirs["input_ids"])].tolist() == theirs["token_type_ids"]
    assert balanced > 50 and same > 500
    long = ChoiceExample(" ".join(FILLER[:20]), ("a b", " ".join(FILLER[:30]), "c"), 0, 7)
    f = encode_choices([long, ChoiceExample("x", ("y", "z", "w"), 0, 8)], tok, max_seq_length=16)
    assert f.cut_pairs == 3 and f.cut_examples == 1 and f.lengths.tolist() == [16, 5]
    assert f.sequences.input_ids[1].tolist()[1:9] == [*tok.encode_batch_ids([" ".join(FILLER[:7])])[0],
                                                      tok.sep_token_id]  # 20 and 30 tokens in 13: 7 + 6
    assert "3 (context, choice) pairs of 1 examples were longer than 16 tokens and cut" in f.summary()


def test_the_task_sums_the_loss_over_examples_and_counts_correct_choices(base, tok):
    torch.manual_seed(1)
    model = BertForMultipleChoice.from_pretrained(base).eval()
    ex = [ChoiceExample("the old house", ("a river", "the big grey road"), 1, 2),
          ChoiceExample("one", ("two", "three four"), 0, 3), ChoiceExample("a", ("b", "c d e"), 1, 4)]
    batch = encode_choices(ex, tok, 32).with_labels(np.array([1, 0, 1])).collate([0, 1, 2])
    task = MultipleChoiceObjective()
    with torch.no_grad():
        sums, stats = task.forward(model, batch)
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], labels=batch["labels"])
    assert task.counts(batch) == {"multiple_choice": 3.0}
    torch.testing.assert_close(sums["multiple_choice"], out.loss * 3)
    assert stats["correct"].item() == (out.logits.argmax(-1) == batch["labels"]).sum().item()
    assert task.metrics({}, {"multiple_choice": 4.0}, {"correct": 3.0}) == {"accuracy": 0.75}


# ------------------------------------------------------------------------------ learning
@pytest.fixture(scope="module")
def learned(root, base) -> tuple[Path, Path]:
    """The tiny model fine-tuned on a generated SWAG folder (96 train, 32 val, 8 test examples)."""
    folder = swag_folder(root / "swag", seed=1, n_train=96, n_val=32, n_test=8)
    out = root / "swag-run"
    finetune(config(base, out, train_file=str(folder), dev_file=str(folder), epochs=15, checkpoint_every=1000))
    return out, folder


def test_a_tiny_model_learns_to_pick_the_right_ending(learned):
    out, folder = learned
    lines = metric_lines(out)
    assert len(lines) == 90 and np.mean([r["accuracy"] for r in lines[:6]]) < 0.6  # 6 steps an epoch
    assert min(r["accuracy"] for r in lines[-6:]) == 1.0  # the last epoch: every training example right
    evals = metric_lines(out, "eval")
    best = json.loads((out / "best" / "eval_metrics.json").read_text())
    assert best["metric"] == "accuracy" and set(best["metrics"]) == {"accuracy"}
    assert best["value"] == max(r["accuracy"] for r in evals) >= 0.9
    assert evaluate(out / "best", file=folder / "train.csv")["accuracy"] >= 0.97
    assert evaluate(out / "best", file=folder) == pytest.approx(best["metrics"], abs=1e-6)  # val.csv
    settings = json.loads((out / "model" / "config.json").read_text())["bertforge_finetune"]
    assert settings["task"] == "swag" and settings["max_seq_length"] == 128


def test_predictions_of_an_unlabelled_swag_test_file(learned, tmp_path):
    out, folder = learned
    records = predict(out / "best", folder, tmp_path / "p.csv")  # the folder's test.csv
    assert [r["index"] for r in records] == list(range(8)) and [r["line"] for r in records] == list(range(2, 10))
    assert all(len(r["probabilities"]) == 4 and r["choice"] == int(np.argmax(r["probabilities"])) for r in records)
    assert all(r["text"] == r["choices"][r["choice"]] and sum(r["probabilities"]) == pytest.approx(1) for r in records)
    lines = (tmp_path / "p.csv").read_text().splitlines()
    assert lines[0] == "index,prediction" and lines[1:] == [f"{r['index']},{r['choice']}" for r in records]
    predict(out / "best", folder / "test.csv", tmp_path / "p.tsv")
    assert (tmp_path / "p.tsv").read_text().splitlines()[1] == f"0\t{records[0]['choice']}"
    predict(out / "best", folder / "test.csv", tmp_path / "p.jsonl")
    assert [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()] == records
    # on the labelled val.csv the predictions score what evaluate reports
    labels = [int(line.rsplit(",", 1)[1]) for line in (folder / "val.csv").read_text().splitlines()[1:]]
    preds = [r["choice"] for r in predict(out / "best", folder / "val.csv")]
    assert np.mean(np.array(preds) == labels) == pytest.approx(evaluate(out / "best", file=folder)["accuracy"])


def test_the_best_model_keeps_the_dev_predictions_beside_it(learned, tmp_path):
    """best/predictions.tsv: predict's table of val.csv with the gold choice, the predictions that scored best."""
    out, folder = learned
    lines = (out / "best" / "predictions.tsv").read_text().splitlines()
    records = predict(out / "best", folder / "val.csv")
    gold = [e.label for e in read_choices(folder / "val.csv", "swag")[0]]
    assert lines == ["index\tprediction\tgold",
                     *(f"{r['index']}\t{r['choice']}\t{g}" for r, g in zip(records, gold))]
    best = json.loads((out / "best" / "eval_metrics.json").read_text())
    assert np.mean([r["choice"] == g for r, g in zip(records, gold)]) == pytest.approx(best["value"])
    evaluate(out / "best", file=folder, out=tmp_path)
    assert (tmp_path / "predictions.tsv").read_text().splitlines() == lines


def test_the_fine_tuned_folder_is_transformers_bert_for_multiple_choice(learned, tmp_path):
    out, folder = learned
    assert json.loads((out / "best" / "config.json").read_text())["architectures"] == ["BertForMultipleChoice"]
    theirs = transformers.BertForMultipleChoice.from_pretrained(out / "best").eval()
    ours = BertForMultipleChoice.from_pretrained(out / "best").eval()
    tok = BertTokenizer.from_pretrained(out / "best")
    examples, _ = read_choices(folder / "val.csv", "swag")
    batch = encode_choices(examples[:6], tok, 128).with_labels(np.array([e.label for e in examples[:6]])).collate(
        range(6))
    with torch.no_grad():
        a = ours(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], labels=batch["labels"])
        b = theirs(**batch)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.loss, b.loss, atol=1e-5, rtol=0)
    # transformers' own save (no bertforge settings in config.json) is read as SWAG
    plain = tmp_path / "hf"
    del theirs.config.bertforge_finetune
    theirs.save_pretrained(plain)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(out / "best" / name, plain / name)
    assert "bertforge_finetune" not in json.loads((plain / "config.json").read_text())
    assert evaluate(plain, file=folder) == pytest.approx(evaluate(out / "best", file=folder), abs=1e-6)


def test_cli_finetune_evaluate_predict_on_a_swag_folder(root, base, capsys):
    folder = swag_folder(root / "swag-cli", seed=2, n_train=24, n_val=8, n_test=5)
    out = root / "swag-cli-run"
    assert cli.main(["finetune", "--task", "swag", "--model", str(base), "--train-file", str(folder),
                     "--dev-file", str(folder), "--out", str(out), "--max-steps", "3", "--batch-size", "8",
                     "--max-seq-length", "12", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "train 24 examples x 4 choices; " in printed and "pairs of" in printed  # length 12 cuts, counted
    assert set(json.loads(printed.strip().splitlines()[-1])) == {"accuracy"}
    assert cli.main(["evaluate", str(out / "model"), "--file", str(folder / "val.csv")]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["accuracy"] <= 1.0
    assert cli.main(["predict", str(out / "model"), str(folder), "--out", str(root / "swag.csv")]) == 0
    lines = (root / "swag.csv").read_text().splitlines()
    assert len(lines) == 6 and lines[0] == "index,prediction" and lines[1].split(",")[1] in "0123"
    assert cli.main(["evaluate", str(out / "model"), "--file", str(folder / "test.csv")]) == 2
    assert "test.csv:1: no column 'label'" in capsys.readouterr().err


def test_a_files_records_are_the_records_of_the_same_texts(learned):
    """predict on a file and the Predictor's predict_texts give the same fields (the file's with its line)."""
    from bertforge.tasks.finetune import load_finetuned

    out, folder = learned
    from_file = predict(out / "best", folder / "test.csv")
    ft = load_finetuned(out / "best")
    examples, _ = read_choices(folder / "test.csv", "swag", require_labels=False)
    from_texts = ft.family.predict_texts(ft.model, ft.tokenizer, ft.settings,
                                         [(e.context, *e.choices) for e in examples], ft.device)
    for f, t in zip(from_file, from_texts, strict=True):
        assert set(f) == {*t, "line"} and (f["choice"], f["text"]) == (t["choice"], t["text"])
        assert f["probabilities"] == pytest.approx(t["probabilities"], abs=1e-5)
