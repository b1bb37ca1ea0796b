"""Data in memory and the callbacks of a fine-tuning run. A `datasets.Dataset`, a pandas DataFrame, a list
of records and a dict of columns train every family as the same file does (equal losses), the run keeps
what it was given in OUT/inputs/ and resumes from it, a ClassLabel names the labels, evaluation and
prediction take the same objects; bad input is refused naming what was expected. Callbacks end a run
after an evaluation, and early stopping on a named metric stops where an unbroken run would after a resume.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import datasets
import pandas as pd
import pytest
from finetune_fixtures import FILLER, base, root, write  # noqa: F401 - fixtures: a tiny "pre-trained" BERT, a folder
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models

from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune, predict
from bertforge.tasks.memory import input_text, rows_of, write_input
from bertforge.tasks.squad import read_squad
from bertforge.train.callbacks import EarlyStopping


def polar_rows(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randrange(2)
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]
        words.insert(rng.randint(0, len(words)), "good" if label else "bad")
        rows.append({"text": " ".join(words), "label": label})
    return rows


def config(base: Path, out: Path, **overrides) -> FinetuneConfig:
    settings = dict(task="classification", model=str(base), out=str(out), lr=1e-3, batch_size=8, warmup_ratio=0.1,
                    weight_decay=0.0, log_every=1, progress=False, seed=7, max_steps=4, checkpoint_every=1000)
    return FinetuneConfig(**{**settings, **overrides})


def losses(out: Path, split: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


CLASSES = datasets.ClassLabel(names=["negative", "positive"])


def test_every_in_memory_form_trains_as_the_file_does_and_a_classlabel_names_the_labels(base, tmp_path):
    rows = polar_rows(1, 32)
    file = write(tmp_path / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    finetune(config(base, tmp_path / "file", train_file=str(file), dev_file=str(file)))
    reference = losses(tmp_path / "file")
    dataset = datasets.Dataset.from_list(rows, features=datasets.Features({"text": datasets.Value("string"),
                                                                           "label": CLASSES}))
    columns = {"text": [r["text"] for r in rows], "label": [r["label"] for r in rows]}
    for name, data in (("records", rows), ("frame", pd.DataFrame(rows)), ("columns", columns),
                       ("dataset", dataset)):
        out = tmp_path / name
        result = finetune(config(base, out), train=data, dev=data)
        assert [r["loss"] for r in losses(out)] == [r["loss"] for r in reference], name
        recorded = json.loads((out / "run_config.json").read_text())
        assert recorded["train_file"] == str(out / "inputs" / "train.jsonl") and (out / "inputs" / "dev.jsonl").is_file()
        id2label = json.loads((result.model_dir / "config.json").read_text())["id2label"]
        assert id2label == ({"0": "negative", "1": "positive"} if name == "dataset" else {"0": "0", "1": "1"}), name
    out = tmp_path / "dataset"
    assert set(evaluate(out / "model", dataset)) == {"accuracy", "f1"}
    assert evaluate(out / "model", dataset) == evaluate(out / "model", pd.DataFrame(rows))  # ints named as trained
    predicted = predict(out / "model", [{"text": r["text"]} for r in rows[:3]])
    assert len(predicted) == 3 and {r["label"] for r in predicted} <= {"negative", "positive"}


def test_a_run_given_data_resumes_from_its_folder_and_refuses_other_data(base, tmp_path):
    rows = polar_rows(2, 32)
    out = tmp_path / "run"
    finetune(config(base, out, keep_best=False), train=rows)
    finetune(config(base, out, keep_best=False, max_steps=6, resume=True), train=rows)
    assert [r["step"] for r in losses(out)] == list(range(1, 7))
    with pytest.raises(ValueError, match="train data differs from what the run in .* was started with"):
        finetune(config(base, out, keep_best=False, max_steps=8, resume=True), train=rows[:-1])
    with pytest.raises(ValueError, match="give the train data once: train= or train_file"):
        finetune(config(base, out, train_file="x.jsonl", keep_best=False), train=rows)


def test_bad_in_memory_data_is_refused_naming_what_was_expected(base, tmp_path):
    with pytest.raises(TypeError, match="train data: expected a file path, a datasets.Dataset, a pandas DataFrame"):
        finetune(config(base, tmp_path / "a", keep_best=False), train=[1, 2, 3])
    with pytest.raises(ValueError, match="train data: columns of different lengths: text: 2, label: 1"):
        finetune(config(base, tmp_path / "b", keep_best=False), train={"text": ["a", "b"], "label": [1]})
    with pytest.raises(ValueError, match=r"^train data, row 2: no key 'text'"):
        finetune(config(base, tmp_path / "c", keep_best=False), train=[{"text": "good", "label": 1}, {"review": "bad", "label": 0}])
    with pytest.raises(ValueError, match="train data: row 1: 2 words but 1 tags"):
        finetune(config(base, tmp_path / "d", task="ner", keep_best=False),
                 train=[{"tokens": ["John", "ran"], "ner_tags": ["B-PER"]}])


def test_tagging_rows_with_classlabel_tags_train_and_predict(base, tmp_path):
    rng = random.Random(3)
    names = ["O", "B-PER", "I-PER"]
    rows = []
    for _ in range(16):
        tokens = [rng.choice(FILLER) for _ in range(4)] + ["john", "smith"]
        rows.append({"tokens": tokens, "ner_tags": [0, 0, 0, 0, 1, 2]})
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    dataset = datasets.Dataset.from_list(rows, features=features)
    out = tmp_path / "ner"
    finetune(config(base, out, task="ner"), train=dataset, dev=dataset)
    conll = (out / "inputs" / "train.conll").read_text().splitlines()
    assert conll[:7] == [f"{w}\t{names[t]}" for w, t in zip(rows[0]["tokens"], rows[0]["ner_tags"])] + [""]
    assert "f1" in evaluate(out / "model", dataset)
    tagged = predict(out / "model", [{"tokens": r["tokens"]} for r in rows[:2]])
    assert [len(r["tags"]) for r in tagged] == [6, 6]


def test_a_tagging_classlabel_keeps_its_order_as_the_model_s_ids(base, tmp_path):
    names = ["O", "I-PER", "B-PER"]  # not the order the tags sort in
    rows = [{"tokens": ["the", "man", "john", "smith"], "ner_tags": [0, 0, 2, 1]} for _ in range(16)]
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    out = tmp_path / "ner"
    finetune(config(base, out, task="ner"), train=datasets.Dataset.from_list(rows, features=features))
    id2label = json.loads((out / "model" / "config.json").read_text())["id2label"]
    assert [id2label[str(i)] for i in range(3)] == names


def test_squad_rows_as_datasets_writes_them_read_as_the_official_file(tmp_path):
    context = "Paris is the capital of France."
    rows = [{"id": "q1", "title": "France", "context": context, "question": "What is the capital?",
             "answers": {"text": ["Paris"], "answer_start": [0]}},
            {"id": "q2", "title": "France", "context": context, "question": "Of what?",
             "answers": {"text": ["France"], "answer_start": [24]}}]
    nested = {"version": "1.1", "data": [{"title": "France", "paragraphs": [{"context": context, "qas": [
        {"id": r["id"], "question": r["question"], "answers": [{"text": r["answers"]["text"][0],
                                                              "answer_start": r["answers"]["answer_start"][0]}]}
        for r in rows]}]}]}
    official = write(tmp_path / "dev.json", json.dumps(nested))
    squad = FinetuneConfig(task="squad")
    written = write_input(input_text(datasets.Dataset.from_list(rows), squad, "dev")[0], squad, tmp_path / "in", "dev")
    a, b = read_squad(official, mode="train"), read_squad(written, mode="train")
    same = [q._replace(where="") for q in a.questions] == [q._replace(where="") for q in b.questions]
    assert a.contexts == b.contexts and same and len(b.questions) == 2
    unanswerable = [{**rows[0], "answers": {"text": [], "answer_start": []}}]
    squad2 = FinetuneConfig(task="squad2")
    written = write_input(input_text(unanswerable, squad2, "dev")[0], squad2, tmp_path / "in2", "dev")
    assert read_squad(written, "2.0").questions[0].is_impossible


def test_multiple_choice_records_train(base, tmp_path):
    rng = random.Random(4)
    rows = []
    for _ in range(16):
        label = rng.randrange(3)
        rows.append({"context": " ".join(rng.choice(FILLER) for _ in range(3)),
                     "choices": [f"{rng.choice(FILLER)} {'good' if k == label else 'bad'}" for k in range(3)],
                     "label": label})
    out = tmp_path / "mc"
    finetune(config(base, out, task="multiple_choice"), train=rows, dev=pd.DataFrame(rows))
    assert "accuracy" in evaluate(out / "model", rows)


def test_rows_of_reads_the_classlabel_names_of_a_dataset():
    data = datasets.Dataset.from_dict({"text": ["a"], "label": [1]},
                                      features=datasets.Features({"text": datasets.Value("string"), "label": CLASSES}))
    assert rows_of(data) == ([{"text": "a", "label": 1}], {"label": ["negative", "positive"]})


# ------------------------------------------------------------------------------ callbacks
def test_early_stopping_counts_evaluations_without_improvement():
    stop = EarlyStopping("f1", patience=2, min_delta=0.01)
    answers = [stop(step, {"f1": f1}) for step, f1 in enumerate([0.5, 0.6, 0.605, 0.61, 0.7, 0.69, 0.7], 1)]
    assert [bool(a) for a in answers] == [False, False, False, True, False, False, True]
    assert answers[3] == "f1 has not improved for 2 evaluations (best 0.6 at step 2)"
    loss = EarlyStopping("loss", patience=1, higher_is_better=False)
    assert not loss(1, {"loss": 2.0}) and not loss(2, {"loss": 1.0}) and loss(3, {"loss": 1.5})
    with pytest.raises(ValueError, match="patience must be at least 1"):
        EarlyStopping("f1", patience=0)
    with pytest.raises(ValueError, match="early stopping on 'f2', which is not among the metrics"):
        EarlyStopping("f2")(1, {"f1": 1.0})


def test_a_callback_ends_the_run_after_an_evaluation_as_a_finished_run(base, tmp_path):
    rows = polar_rows(5, 32)
    seen = []

    def second(step: int, metrics: dict) -> bool:
        seen.append((step, sorted(metrics)))
        return len(seen) == 2

    out = tmp_path / "cb"
    result = finetune(config(base, out, max_steps=10, eval_every=2), train=rows, dev=rows, callbacks=[second])
    assert seen == [(2, ["accuracy", "f1"]), (4, ["accuracy", "f1"])]
    assert result.train.step == 4 and not result.train.stopped_early and "second asked to stop" in result.train.early_stop
    assert [r["step"] for r in losses(out, "eval")] == [2, 4]  # no second evaluation at the stop
    assert not (out / "model" / "stopped_early.json").exists() and (out / "model" / "config.json").is_file()


def test_early_stopping_after_a_resume_stops_where_an_unbroken_run_does(base, tmp_path):
    rows = polar_rows(6, 32)
    still = dict(lr=1e-12, eval_every=1, checkpoint_every=1)  # the dev accuracy never moves
    whole = finetune(config(base, tmp_path / "whole", max_steps=10, early_stopping_patience=3, **still),
                     train=rows, dev=rows)
    assert whole.train.step == 4 and "accuracy has not improved for 3 evaluations" in whole.train.early_stop
    out = tmp_path / "parts"
    finetune(config(base, out, max_steps=2, **still), train=rows, dev=rows)
    resumed = finetune(config(base, out, max_steps=10, early_stopping_patience=3, resume=True, **still),
                       train=rows, dev=rows)
    assert resumed.train.step == 4 and resumed.train.early_stop == whole.train.early_stop
    with pytest.raises(ValueError, match="early_stopping_patience must be"):
        config(base, out, early_stopping_patience=-1)
