"""A hostile user's values, refused before any work and without changing what is on disk: settings given in
Python held to the types flags and files hold them to; labels that no label can be (NaN is a missing value,
infinities and lists are refused, naming the file and line); a dict that is not columns; metric names,
callbacks and early stopping checked before the data is read; and an earlier run's files kept until the new
run's settings, data and model are accepted. A run without dev data trains and keeps its final model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from finetune_fixtures import base, root, write  # noqa: F401 - fixtures: a tiny "pre-trained" BERT, a folder
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models

from bertforge.tasks.classification import read_examples, targets
from bertforge.tasks.finetune import FinetuneConfig, finetune
from bertforge.tasks.memory import rows_of
from bertforge.train.callbacks import EarlyStopping
from bertforge.train.pretrain import PretrainConfig


def rows(n: int = 16) -> list[dict]:
    return [{"text": f"{'good' if i % 2 else 'bad'} film number {i}", "label": i % 2} for i in range(n)]


def config(base: Path, out: Path, **overrides) -> FinetuneConfig:
    settings = dict(task="classification", model=str(base), out=str(out), lr=1e-3, batch_size=8, warmup_ratio=0.1,
                    weight_decay=0.0, log_every=1, progress=False, seed=7, max_steps=2, checkpoint_every=1000)
    return FinetuneConfig(**{**settings, **overrides})


# ------------------------------------------------------------------------------ settings in Python
@pytest.mark.parametrize("cls, name, value, expected", [
    (FinetuneConfig, "batch_size", True, "batch_size: expected an integer, got True"),
    (FinetuneConfig, "batch_size", 16.0, "batch_size: expected an integer, got 16.0"),
    (FinetuneConfig, "max_steps", 2.5, "max_steps: expected an integer, got 2.5"),
    (FinetuneConfig, "lr", math.nan, "lr must be a finite number > 0, got nan"),
    (FinetuneConfig, "null_score_diff_threshold", math.nan, "expected a finite number"),
    (FinetuneConfig, "keep_best", 1, "keep_best: expected true or false, got 1"),
    (PretrainConfig, "shuffle_shards", 2.0, "shuffle_shards: expected an integer, got 2.0"),
    (PretrainConfig, "masked_lm_prob", math.inf, "masked_lm_prob must be a finite number"),
])
def test_a_constructor_refuses_a_value_of_the_wrong_type_naming_the_setting(cls, name, value, expected):
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        cls(**{name: value})


def test_a_path_where_a_setting_takes_text_is_accepted(tmp_path):
    assert Path(FinetuneConfig(out=tmp_path).out) == tmp_path
    assert FinetuneConfig(lr=1).lr == 1  # an integer for a number


def test_label_names_take_a_list_in_python():
    assert FinetuneConfig(label_names=["negative", "positive"]).named_labels() == ["negative", "positive"]
    with pytest.raises(ValueError, match="label_names must be names without commas"):
        FinetuneConfig(label_names=["a,b", "c"])


def test_early_stopping_refuses_text_for_a_count():
    with pytest.raises(ValueError, match="EarlyStopping patience: expected an integer, got '2'"):
        EarlyStopping(patience="2")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ labels
def test_labels_no_label_can_be_are_refused_or_read_as_missing_naming_the_line(tmp_path):
    path = tmp_path / "train.jsonl"
    lines = [{"text": "a", "label": 1.0}, {"text": "b", "label": float("nan")}, {"text": "c", "label": 0.0},
             {"text": "d", "label": 0}]
    write(path, "".join(json.dumps(r) + "\n" for r in lines))
    examples, report = read_examples(path)
    assert [e.label for e in examples] == ["1", "0", "0"]  # 1.0 is the 1 of a column widened by a NaN
    assert report.num_skipped == 1  # NaN is a missing value, as an empty field is: skipped and counted

    for bad, message in (({"text": "e", "label": float("inf")}, "label inf is not a finite number"),
                         ({"text": "e", "label": [0, 1]}, "a label is one value"),
                         ({"text": "e", "label": {"a": 1}}, "a label is one value")):
        write(path, json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=f"{path}:1: .*{message}"):
            read_examples(path)


@pytest.mark.parametrize("score", ["nan", "inf", "-Infinity", "1e40"])
def test_a_score_that_is_not_finite_is_refused_naming_the_file_and_line(tmp_path, score):
    path = write(tmp_path / "train.csv", f"text,label\ngood,0.5\nbad,{score}\n")
    examples, _ = read_examples(path)
    with pytest.raises(ValueError, match=f"{path}:3: the score '{score}' is not a finite number"):
        targets(examples, path, None)


# ------------------------------------------------------------------------------ in memory
def test_a_dict_that_is_not_columns_is_refused_saying_what_to_pass():
    with pytest.raises(TypeError, match="column 'text' is str .* pass one record as a list of records"):
        rows_of({"text": "abcdefghijklmnop", "label": [0, 1] * 8})
    with pytest.raises(TypeError, match="column 'text' is str"):
        rows_of({"text": "good film"})

    class Split(list):
        column_names = ["text", "label"]

    with pytest.raises(TypeError, match=r"DatasetDict of 'train', 'test'.*data\['train'\]"):
        rows_of({"train": Split(), "test": Split()})


# ------------------------------------------------------------------------------ before any work
def test_a_metric_no_evaluation_reports_is_refused_before_an_overwrite_deletes_anything(base, tmp_path):
    out = tmp_path / "run"
    finetune(config(base, out), train=rows(), dev=rows(8))
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert (out / "best").is_dir() and (out / "model").is_dir()
    with pytest.raises(ValueError, match="metric_for_best 'bleu' is not a metric of task classification: its "
                                         "evaluation reports accuracy, f1"):
        finetune(config(base, out, overwrite=True, metric_for_best="bleu"), train=rows(), dev=rows(8))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    # the task's other metric is accepted, and the overwrite then goes ahead
    finetune(config(base, out, overwrite=True, metric_for_best="f1"), train=rows(), dev=rows(8))


def test_an_overwrite_keeps_the_earlier_run_until_the_new_one_s_model_is_accepted(base, tmp_path):
    out = tmp_path / "run"
    finetune(config(base, out), train=rows(), dev=rows(8))
    before = sorted(p.relative_to(out) for p in out.rglob("*") if "inputs" not in p.parts)
    with pytest.raises(Exception):
        finetune(config(base, out, overwrite=True, model=str(tmp_path / "no-such-model")), train=rows(), dev=rows(8))
    assert sorted(p.relative_to(out) for p in out.rglob("*") if "inputs" not in p.parts) == before


def test_callbacks_and_early_stopping_are_checked_before_the_data_is_read(base, tmp_path):
    missing = str(tmp_path / "missing.csv")  # read only after the checks: a refusal here names no file
    with pytest.raises(TypeError, match=r"callbacks\[0\] is int 5, not a callable"):
        finetune(config(base, tmp_path / "a", train_file=missing), callbacks=[5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"callbacks\[0\] \(EarlyStopping\) metric 'bleu' is not a metric"):
        finetune(config(base, tmp_path / "a", train_file=missing, dev_file=missing),
                 callbacks=[EarlyStopping("bleu")])
    with pytest.raises(ValueError, match="early stopping reads the dev metrics: give dev data"):
        finetune(config(base, tmp_path / "a", train_file=missing, early_stopping_patience=2))
    assert not (tmp_path / "a").exists()


def test_a_run_without_dev_data_trains_and_keeps_its_final_model(base, tmp_path, caplog):
    out = tmp_path / "run"
    with caplog.at_level("INFO", logger="bertforge"):
        finetune(config(base, out), train=rows())
    assert (out / "model" / "config.json").is_file() and not (out / "best").exists()
    assert sum("keep_best=False" in r.getMessage() for r in caplog.records) == 1


def test_prepare_refuses_shard_and_worker_counts_before_writing_anything(tmp_path, tok_dir):
    from bertforge.data.prepare import prepare

    text = write(tmp_path / "text.txt", "a cat sat .\nthe dog ran .\n\nanother document here .\n")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"workers must be in \[1, 1024\] .*got a 20-digit number"):
        prepare([text], out, tok_dir, workers=10**19)
    with pytest.raises(ValueError, match="num_shards must be >= 1"):
        prepare([text], out, tok_dir, num_shards=0)
    assert not out.exists()


@pytest.mark.parametrize("name, text, message", [
    ("c.yaml", "max_steps: 010\n", r"c.yaml, line 1, column 12: not valid YAML \(010 has a leading zero"),
    ("c.yaml", "lr: 0.1\nlr: 0.2\n", r"c.yaml, line 2, column 1: not valid YAML \(the key 'lr' is given twice"),
    ("c.json", '{"lr": 0.1, "lr": 0.2}', r"c.json: the key 'lr' is given twice in one object"),
])
def test_a_config_file_that_says_two_things_is_refused(tmp_path, name, text, message):
    from bertforge.settings import config_from_file

    with pytest.raises(ValueError, match=message):
        config_from_file(FinetuneConfig, write(tmp_path / name, text))
    assert config_from_file(FinetuneConfig, write(tmp_path / "ok.yaml", "max_steps: 10\nlr: '1e-4'\n")).max_steps == 10


@pytest.mark.parametrize("grid", ["lr=nan", "lr=inf", "epochs=2,nan", "lr=-1e-5"])
def test_a_grid_value_that_is_not_a_finite_positive_number_is_refused_by_the_constructor(grid):
    with pytest.raises(ValueError, match="values must be finite numbers > 0"):
        FinetuneConfig(grid=grid)


def test_a_model_with_named_labels_scores_a_file_of_ids_and_one_of_its_names(base, tmp_path):
    from bertforge.tasks.finetune import evaluate, predict

    out = tmp_path / "run"
    finetune(config(base, out, label_names="negative,positive", max_steps=6), train=rows(32), dev=rows(8))
    ids = rows(16)
    names = [{**r, "label": ["negative", "positive"][r["label"]]} for r in ids]
    by_ids, by_names = evaluate(out / "model", ids), evaluate(out / "model", names)
    assert by_ids == by_names and by_ids["accuracy"] > 0  # the ids read through the model's id2label
    assert [p["label"] for p in predict(out / "model", names)] == [p["label"] for p in predict(out / "model", ids)]


def test_an_error_in_data_given_in_memory_names_the_row_not_a_temporary_file(base, tmp_path):
    from bertforge.tasks.finetune import evaluate

    out = tmp_path / "run"
    finetune(config(base, out), train=rows(), dev=rows(8))
    bad = rows(4)
    bad[2]["label"] = [0, 1]
    with pytest.raises(ValueError) as e:
        evaluate(out / "model", bad)
    assert "dev data, row 3: a label is one value" in str(e.value) and "bertforge-" not in str(e.value)


def test_a_missing_column_is_named_with_the_setting_that_names_it(tmp_path):
    path = write(tmp_path / "t.jsonl", json.dumps({"text": "a", "stars": 1}) + "\n")
    with pytest.raises(ValueError, match=r"no key 'label' \(keys: text, stars\); name the label column with "
                                         r"label_column$"):
        read_examples(path)


def test_resume_where_no_run_was_recorded_says_so(tmp_path, capsys):
    from bertforge import cli

    (tmp_path / "empty").mkdir()
    assert cli.main(["finetune", "--out", str(tmp_path / "empty"), "--resume"]) == 2
    assert "holds no run_config.json, so no run there got as far as its first checkpoint" in capsys.readouterr().err


def test_data_in_memory_holding_a_lone_surrogate_is_refused_naming_the_row(base, tmp_path):
    bad = rows(16)
    bad[4]["text"] = "a good \udc80 film"
    with pytest.raises(ValueError, match=r"train data: row 5: a lone surrogate '\\udc80'"):
        finetune(config(base, tmp_path / "run"), train=bad, dev=rows(8))


def test_json_nested_too_deep_is_a_bad_row_not_a_traceback(tmp_path):
    path = write(tmp_path / "deep.jsonl", json.dumps({"text": "a", "label": 1}) + "\n" + "[" * 100_000 + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: JSON nested too deep"):
        read_examples(path)
    array = write(tmp_path / "deep.json", "[" * 100_000)
    with pytest.raises(ValueError, match="nested too deep|not a JSON array"):
        read_examples(array)


def test_a_library_warning_is_one_line_of_the_command(tmp_path, tok_dir, capsys):
    from bertforge import cli

    text = write(tmp_path / "text.txt", "".join(f"sentence number {i} of a text .\n" for i in range(40)))
    args = ["prepare", str(text), "--out", str(tmp_path / "data"), "--tokenizer", str(tok_dir), "--no-nsp",
            "--dynamic-masking", "--no-progress"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "identical copies" in line]
    assert len(warned) == 1 and warned[0].startswith("WARNING:bertforge:no NSP with dynamic masking")
    assert "warnings.warn" not in err and "UserWarning" not in err


def test_a_run_record_is_a_config_file_under_any_name_and_an_unknown_key_is_refused_in_any_file(base, tmp_path):
    import dataclasses

    from bertforge.settings import RUN_FACTS, config_from_file

    out = tmp_path / "run"
    finetune(config(base, out), train=rows(), dev=rows(8))
    record = json.loads((out / "run_config.json").read_text())
    assert set(record) - {f.name for f in dataclasses.fields(FinetuneConfig)} <= set(RUN_FACTS)
    copied = write(tmp_path / "settings.json", json.dumps(record))
    assert config_from_file(FinetuneConfig, copied).lr == 1e-3
    named = write(tmp_path / "run_config.json", json.dumps({"lr": 1e-3, "lrr": 2}))
    with pytest.raises(ValueError, match="unknown key 'lrr'"):
        config_from_file(FinetuneConfig, named)


def test_predict_to_a_folder_and_of_an_empty_text_say_what_they_are(base, tmp_path, capsys):
    from bertforge import cli

    out = tmp_path / "run"
    finetune(config(base, out), train=rows(), dev=rows(8))
    (tmp_path / "folder").mkdir()
    capsys.readouterr()
    assert cli.main(["predict", str(out / "model"), "a good film", "--out", str(tmp_path / "folder")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'folder'}: a folder is there; give a file's path" in err and ".tmp" not in err
    assert cli.main(["predict", str(out / "model"), ""]) == 0  # an empty text, not the working folder
    assert "GLUE" not in capsys.readouterr().err
    assert cli.main(["predict", str(out / "model"), "a good film", "--batch-size", "0"]) == 2
    assert "--batch-size must be >= 1, got 0" in capsys.readouterr().err
    assert cli.main(["predict", str(out / "model"), "a good film", "--top-k", "1", "--format", "jsonl"]) == 0
    assert len(json.loads(capsys.readouterr().out.splitlines()[-1])["probabilities"]) == 1


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_an_epoch_s_last_incomplete_batch_is_trained_unless_drop_last(base, tmp_path, monkeypatch, grad_accum):
    """13 examples in batches of 8: two steps an epoch, the second of 5 (as transformers trains them);
    with drop_last one step; 5 examples, fewer than a batch, train one step of 5."""
    from bertforge.train.loop import Trainer

    sizes: list[list[int]] = []
    step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda self, micro: (
        sizes.append([len(b["input_ids"]) for b in micro]), step(self, micro))[1])
    half = [4, 4] if grad_accum == 2 else [8]
    for n, drop_last, want in ((13, False, [half, [4, 1] if grad_accum == 2 else [5]] * 2), (13, True, [half] * 2),
                               (5, False, [[4, 1] if grad_accum == 2 else [5]] * 2)):
        sizes.clear()
        out = tmp_path / f"run-{n}-{drop_last}"
        result = finetune(config(base, out, max_steps=0, epochs=2, drop_last=drop_last, grad_accum=grad_accum),
                          train=rows(n))
        assert sizes == want and result.train.step == len(want)


def test_a_run_recorded_when_last_batches_were_dropped_resumes_with_drop_last_only(base, tmp_path):
    """A record without drop_last predates training the last batch: its epochs left it out, so resuming it
    otherwise is refused naming the setting, and with drop_last it continues."""
    from bertforge.train.rundir import latest_checkpoint

    out = tmp_path / "earlier"
    finetune(config(base, out, max_steps=1, drop_last=True, checkpoint_every=1), train=rows(13))
    for path in (latest_checkpoint(out) / "trainer_state.json", out / "run_config.json"):
        text = path.read_text()
        path.write_text(text.replace('"drop_last": true,', "").replace(', "drop_last": true', ""))
        assert "drop_last" not in path.read_text()
    with pytest.raises(ValueError, match="drop_last: True -> False"):
        finetune(config(base, out, max_steps=2, resume=True), train=rows(13))
    assert finetune(config(base, out, max_steps=2, resume=True, drop_last=True), train=rows(13)).train.step == 2


def test_a_run_of_data_in_memory_moved_elsewhere_resumes_there(base, tmp_path, monkeypatch):
    """The record names the kept copy of in-memory data inside its run folder: moved, the folder resumes
    from the command line with --resume alone, and from Python with the same data given again."""
    import shutil

    from bertforge import cli

    old, new, again = tmp_path / "old", tmp_path / "elsewhere" / "new", tmp_path / "again"
    finetune(config(base, old, max_steps=1, checkpoint_every=1), train=rows(), dev=rows(8))
    new.parent.mkdir()
    shutil.copytree(old, again)
    shutil.move(old, new)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert cli.main(["finetune", "--out", "new", "--resume", "--max-steps", "2", "--no-progress"]) == 0
    assert json.loads((new / "run_config.json").read_text())["train_file"] == str(Path("new/inputs/train.jsonl"))
    result = finetune(config(base, again, max_steps=2, resume=True), train=rows(), dev=rows(8))
    assert result.train.step == 2


@pytest.mark.parametrize("args, message", [
    (["vocab", "corpus.txt", "--out", "v", "--vocab-size", "1e26"], "--vocab-size: expected an integer, got '1e26'"),
    (["vocab", "corpus.txt", "--out", "v", "--vocab-size=abc"], "--vocab-size: expected an integer, got 'abc'"),
    (["vocab", "corpus.txt", "--out", "v", "--vocab-size"], "--vocab-size: expected an integer after it"),
    (["finetune", "--task", "sst2", "--lr", "fast"], "--lr: expected a number, got 'fast'"),
    (["features", "m", "in.txt", "--out", "f.npy", "--pooling", "last"],
     "--pooling: expected one of mean, cls, pooler, got 'last'"),
    (["predict", "m", "a text", "--precision", "fp99"], "--precision: expected one of auto, fp32, bf16, fp16, int8, "
                                                         "got 'fp99'"),
])
def test_a_flag_value_of_the_wrong_type_is_one_line_naming_the_flag(tmp_path, monkeypatch, capsys, args, message):
    from bertforge import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err == f"bertforge {args[0]}: error: {message}\n" and not (tmp_path / "v").exists()


def test_a_message_names_a_setting_as_python_takes_it_and_as_the_command_line_does(base, tmp_path, capsys):
    """The same refusal speaks of resume=True / overwrite=True to a Python caller and of --resume /
    --overwrite on the command line."""
    from bertforge import cli

    out = tmp_path / "run"
    finetune(config(base, out, max_steps=1, checkpoint_every=1), train=rows())
    with pytest.raises(ValueError) as python:
        finetune(config(base, out, max_steps=1), train=rows())
    assert "resume=True continues it" in str(python.value) and "overwrite=True deletes them" in str(python.value)
    assert "--" not in str(python.value)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows()), encoding="utf-8")
    assert cli.main(["finetune", "--task", "classification", "--model", str(base), "--train-file", str(train),
                     "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--resume continues it" in err and "--overwrite deletes them" in err and "resume=True" not in err
    with pytest.raises(ValueError, match=r"metric_for_best 'bleu' is not a metric of task classification"):
        finetune(config(base, tmp_path / "other", metric_for_best="bleu"), train=rows())


def test_max_seq_length_follows_the_model_s_positions_unless_given_and_more_is_refused_before_the_data(tmp_path):
    """A 64-position model fine-tunes at 64 tokens when max_seq_length is left unset; 128 given is refused
    naming the model before any data is read (a file that does not exist is never opened)."""
    from finetune_fixtures import saved

    from bertforge.model.heads import BertForPreTraining

    short = saved(tmp_path / "short", BertForPreTraining, 0, positions=64)
    result = finetune(config(short, tmp_path / "run"), train=rows())
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["max_seq_length"] == 64
    assert result.train.step == 2
    with pytest.raises(ValueError, match=rf"max_seq_length=128 exceeds the 64 positions of {short}$"):
        finetune(config(short, tmp_path / "other", max_seq_length=128, train_file=str(tmp_path / "absent.jsonl")))


def test_a_bad_row_of_data_given_in_memory_is_named_by_its_row_not_the_run_s_copy(base, tmp_path):
    bad = [{"text": "a", "label": 1.0}] * 8 + [{"text": "b", "label": math.inf}]
    with pytest.raises(ValueError, match=r"^train data, row 9: label inf is not a finite number$"):
        finetune(config(base, tmp_path / "run", task="regression"), train=bad)
