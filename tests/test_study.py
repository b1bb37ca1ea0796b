"""Study files are checked whole when they load: every setting held to the type of the config field it
sets, no setting the runner makes itself, every run's config in range, every metric one its task
reports; each error one line naming the file and the field. (What needs the machine or the data is
checked when the study runs, before any work: tests/test_ablate.py.)"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

import pytest
import yaml

from bertforge.experiments import runner, study as study_module
from bertforge.experiments.study import StudyError, load_study
from bertforge.settings import SettingValueError, check_device, check_value, config_from_file
from bertforge.tasks.finetune import FinetuneConfig

TINY = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 64}


def _write(tmp_path: Path, text: str | None = None, **changes) -> Path:
    """A small valid study (its files need not exist to load), with ``changes`` at the top level."""
    data = {
        "name": "toy", "seeds": [0, 1],
        "pretraining": {"corpus": "corpus.txt", "vocab": "vocab",
                        "prepare": {"max_seq_length": 32, "dupe_factor": 2},
                        "pretrain": {"model": TINY, "max_steps": 4, "batch_size": 8, "lr": 1.0e-3}},
        "finetune": {"epochs": 1, "lr": 1.0e-3, "batch_size": 16, "max_seq_length": 32},
        "tasks": [{"name": "CLS", "task": "classification", "train_file": "cls.train.jsonl",
                   "dev_file": "cls.dev.jsonl"},
                  {"name": "TAG", "task": "tagging", "train_file": "tag.train.txt", "dev_file": "tag.dev.txt"}],
        "variants": [{"name": "A", "pretrain": {"objective": "mlm"}}, {"name": "B"}],
        "figure": {"task": "CLS", "variants": ["A"], "every": 2},
    }
    data.update(changes)
    path = tmp_path / "toy.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _task(**settings) -> list[dict]:
    return [{"name": "CLS", "task": "classification", "train_file": "cls.train.jsonl", "dev_file": "cls.dev.jsonl",
             **settings}]


# ---------------------------------------------------------------------------- types
@pytest.mark.parametrize("change, message", [
    ({"finetune": {"lr": "fast"}}, r"toy.yaml: finetune.lr: expected a number, got 'fast'$"),
    ({"finetune": {"lr": float("nan")}}, r"toy.yaml: finetune.lr: expected a finite number, got nan$"),
    ({"finetune": {"lr": -1.0e-3}}, r"toy.yaml: finetune.lr: must be a finite number > 0, got -0.001$"),
    ({"finetune": {"bilstm": "yes"}}, r"toy.yaml: finetune.bilstm: expected true or false, got 'yes'$"),
    ({"finetune": {"features": -1}}, r"toy.yaml: finetune.features: expected a string, got -1$"),
    ({"finetune": {"warmup_steps": 1.5}}, r"finetune.warmup_steps: expected an integer or none, got 1.5$"),
    ({"finetune": {"long_inputs": "sometimes"}},
     r"finetune.long_inputs: expected one of 'auto', 'truncate', 'windows', got 'sometimes'$"),
    ({"pretraining": {"pretrain": {"max_steps": True}}},
     r"toy.yaml: pretraining.pretrain.max_steps: expected an integer, got True$"),
    ({"pretraining": {"pretrain": {"max_steps": "four"}}},
     r"toy.yaml: pretraining.pretrain.max_steps: expected an integer, got 'four'$"),
    ({"pretraining": {"pretrain": {"seed": -1}}}, r"toy.yaml: pretraining.pretrain.seed: must be >= 0, got -1$"),
    ({"pretraining": {"pretrain": {"power": -2.0}}},
     r"toy.yaml: pretraining.pretrain.power: must be a finite number > 0, got -2.0$"),
    ({"pretraining": {"pretrain": {"model": {"hidden_sise": 64}}}},
     r"toy.yaml: pretraining.pretrain.model: unknown key 'hidden_sise'; expected .*hidden_size"),
    ({"pretraining": {"pretrain": {"model": {"hidden_size": "wide"}}}},
     r"toy.yaml: pretraining.pretrain.model.hidden_size: expected an integer, got 'wide'$"),
    ({"pretraining": {"pretrain": {"model": {"hidden_size": 60, "num_attention_heads": 8}}}},
     r"toy.yaml: pretraining.pretrain.model: .*60.*8"),
    ({"pretraining": {"prepare": {"masked_lm_prob": "high"}}},
     r"toy.yaml: pretraining.prepare.masked_lm_prob: expected a number, got 'high'$"),
    ({"pretraining": {"vocab_size": True}}, r"toy.yaml: pretraining.vocab_size: expected an integer >= 100"),
    ({"pretraining": {"corpus": 5}}, r"toy.yaml: pretraining.corpus: expected a non-empty string, got 5$"),
    ({"tasks": _task(max_steps="four")}, r"toy.yaml: tasks\[0\] \(CLS\)\.max_steps: expected an integer, got 'four'$"),
    ({"tasks": _task(metric=1)}, r"toy.yaml: tasks\[0\] \(CLS\)\.metric: expected a string, got 1$"),
    ({"variants": [{"name": "A", "finetune": {"epochs": [3]}}]},
     r"toy.yaml: variants\[0\] \(A\)\.finetune\.epochs: expected a number, got \[3\]$"),
    ({"variants": [{"name": "A", "checkpoint": 7}]}, r"variants\[0\] \(A\)\.checkpoint: expected a string, got 7$"),
    ({"title": 5}, r"toy.yaml: title: expected a string, got 5$"),
    ({"paper": {"A": {"CLS": "high"}}}, r"toy.yaml: paper.A.CLS: expected a number, got 'high'$"),
])
def test_every_setting_is_held_to_its_fields_type(tmp_path, change, message):
    with pytest.raises(StudyError, match=message):
        load_study(_write(tmp_path, **change))


def test_numbers_yaml_reads_as_text_are_numbers(tmp_path):
    """YAML 1.1 reads 1e-4 (no dot) as a string: a float setting takes it as the number."""
    text = _write(tmp_path).read_text().replace("lr: 0.001\n  batch_size: 16", "lr: 1e-4\n  batch_size: 16")
    assert "lr: 1e-4" in text
    study = load_study(_write(tmp_path, text))
    assert study.tasks[0].settings["lr"] == 1e-4 and isinstance(study.tasks[0].settings["lr"], float)
    assert study.tasks[0].settings["epochs"] == 1 and isinstance(study.tasks[0].settings["epochs"], int)


# ---------------------------------------------------------------------------- the runner's settings
@pytest.mark.parametrize("change, message", [
    ({"finetune": {"eval_every": 5}},
     r"toy.yaml: finetune.eval_every: set by the runner, not the study: each cell is scored once"),
    ({"finetune": {"keep_best": False}}, r"toy.yaml: finetune.keep_best: set by the runner"),
    ({"tasks": _task(seed=3)}, r"tasks\[0\] \(CLS\)\.seed: set by the runner, not the study: the study's seeds"),
    ({"variants": [{"name": "A", "finetune": {"metric_for_best": "f1"}}]},
     r"variants\[0\] \(A\)\.finetune\.metric_for_best: set by the runner, not the study: a task's metric key"),
    ({"variants": [{"name": "A", "pretrain": {"tokenizer": "x"}}]},
     r"variants\[0\] \(A\)\.pretrain\.tokenizer: set by the runner"),
    ({"variants": [{"name": "A", "pretrain": {"checkpoint_every": 5}}]},
     r"variants\[0\] \(A\)\.pretrain\.checkpoint_every: set by the runner for the figure's variants"),
    ({"pretraining": {"pretrain": {"keep_checkpoints": 2}}},
     r"pretraining.pretrain.keep_checkpoints: set by the runner for the figure's variants \(A\)"),
])
def test_a_setting_the_runner_makes_is_refused(tmp_path, change, message):
    with pytest.raises(StudyError, match=message):
        load_study(_write(tmp_path, **change))


def test_the_runner_sets_exactly_the_settings_a_study_is_refused():
    task = study_module.TaskSpec("T", {})
    cell = runner._finetune_owned(task, "model", "out", 0, False)
    assert set(cell) == set(study_module._FINETUNE_OWNED) - {"grid"}
    assert set(runner._pretrain_owned("data", "held", "vocab", "out", True)) == set(study_module._PRETRAIN_OWNED)


def test_a_non_figure_variant_keeps_its_checkpoint_settings(tmp_path):
    study = load_study(_write(tmp_path, variants=[{"name": "A"}, {"name": "B", "pretrain": {"checkpoint_every": 3}}]))
    assert study.variant("B").pretrain == {"checkpoint_every": 3}


# ---------------------------------------------------------------------------- ranges and metrics
@pytest.mark.parametrize("change, message", [
    ({"tasks": _task(max_steps=-3)}, r"toy.yaml: tasks\[0\] \(CLS\)\.max_steps: must be >= 0, got -3$"),
    ({"pretraining": {"vocab_size": 10 ** 40}},
     r"toy.yaml: pretraining.vocab_size: expected an integer in \[100, 4,294,967,296\], got a 41-digit number$"),
    ({"seeds": [0, 10 ** 40]}, r"toy.yaml: seeds\[1\]: must be below 2\*\*63, got a 41-digit number$"),
    ({"finetune": {"features": "top-3"}}, r"toy.yaml: finetune: features='top-3': choose one of"),
    ({"finetune": {"epochs": 0}}, r"toy.yaml: finetune.epochs: must be in \(0, 1000000\], got 0$"),
    ({"finetune": {"device": "tpu"}}, r"toy.yaml: finetune.device: expected auto, cpu, cuda or cuda:K, got 'tpu'$"),
    ({"pretraining": {"prepare": {"dupe_factor": 0}}},
     r"toy.yaml: pretraining.prepare.dupe_factor: must be in \[1, 1000\], got 0$"),
    ({"pretraining": {"pretrain": {"model": "hugee"}}},
     r"pretraining.pretrain.model: expected a model size \(tiny, .*\), a config.json path, or a mapping"),
    ({"variants": [{"name": "A", "pretrain": {"objective": "xlnet"}}]},
     r"variants\[0\] \(A\)\.pretrain\.objective: expected one of 'auto', 'mlm\+nsp', 'mlm', 'ltr', got 'xlnet'$"),
    ({"variants": [{"name": "A", "prepare": {"mask_token_prob": 0.9, "random_token_prob": 0.3}}]},
     r"variants\[0\] \(A\)\.prepare: "),
    ({"variants": [{"name": "A", "finetune": {"bilstm_size": 0}}]},
     r"variants\[0\] \(A\)\.finetune\.bilstm_size: must be >= 1, got 0$"),
    ({"tasks": _task(metric="bleu")},
     r"tasks\[0\] \(CLS\)\.metric: 'bleu' is not a metric of task classification \(it reports accuracy, f1\)$"),
    ({"tasks": [{"name": "MR", "source": "movie-reviews", "metric": "bleu"}]},
     r"tasks\[0\] \(MR\)\.metric: 'bleu' is not a metric of any task$"),
])
def test_each_runs_settings_are_in_range_at_load(tmp_path, change, message):
    changes = {"figure": None, **change} if "tasks" in change else change
    with pytest.raises(StudyError, match=message):
        load_study(_write(tmp_path, **changes))


def test_metrics_of_each_family_and_of_several_dev_files(tmp_path):
    for task, metric in (("ner", "f1_PER"), ("mrpc", "acc_and_f1"), ("regression", "spearman"),
                         ("squad2", "HasAns_f1"), ("classification", "dev_matched_accuracy")):
        train = "squad/train.json" if task.startswith("squad") else "t.tsv"
        tasks = [{"name": "T", "task": task, "train_file": train, "dev_file": train, "metric": metric}]
        assert load_study(_write(tmp_path, tasks=tasks, figure=None)).tasks[0].metric == metric
    squad = study_module.metric_names("squad")
    assert study_module.metric_fits("exact_match", squad, prefixed=False)
    assert not study_module.metric_fits("dev_f1", squad, prefixed=False) and study_module.metric_fits("dev_f1", squad)


# ---------------------------------------------------------------------------- bertforge.settings
def test_check_value_holds_values_to_their_type():
    assert check_value("1e-4", float) == 1e-4
    assert check_value(3, float) == 3 and type(check_value(3, float)) is int
    assert type(check_value(3, float, ints_as_floats=True)) is float
    assert check_value(None, int | None) is None and check_value(2, int | None) == 2
    assert check_value("windows", Literal["auto", "windows"]) == "windows"
    assert check_value([1, 2], tuple[int, ...]) == (1, 2)
    assert check_value({"a": {"b": 1}}, dict[str, dict[str, float]]) == {"a": {"b": 1}}
    for value, kind in ((True, int), (1, bool), ("1", int), (1, str), (float("inf"), float), ("nan", float),
                        ("x", Literal["a"]), ([1, "x"], tuple[int, ...]), ({"a": "b"}, dict[str, float])):
        with pytest.raises(SettingValueError):
            check_value(value, kind)
    assert math.isclose(check_value("2.5E+3", float | None), 2500.0)


def test_check_device():
    assert check_device("auto") == "auto" and check_device("cpu") == "cpu" and check_device("cuda:1") == "cuda:1"
    for bad in ("tpu", "gpu", "cuda:x", "cpu:3", ""):
        with pytest.raises(ValueError, match="expected auto, cpu, cuda or cuda:K"):
            check_device(bad)


def test_config_files_are_checked_the_same_way(tmp_path):
    file = tmp_path / "ft.yaml"
    file.write_text("lr: 1e-4\nepochs: 2\nlong_inputs: windows\n")
    cfg = config_from_file(FinetuneConfig, file)
    assert (cfg.lr, cfg.epochs, cfg.long_inputs) == (1e-4, 2.0, "windows") and type(cfg.epochs) is float
    for text, message in (("max_steps: true\n", "max_steps: expected an integer, got True"),
                          ("lr: fast\n", "lr: expected a number, got 'fast'"),
                          ("lr: 0\n", "lr: must be a finite number > 0, got 0.0"),
                          ("device: tpu\n", "device: expected auto, cpu, cuda or cuda:K, got 'tpu'"),
                          ("long_inputs: sometimes\n",
                           "long_inputs: expected one of 'auto', 'truncate', 'windows', got 'sometimes'")):
        file.write_text(text)
        with pytest.raises(ValueError, match=r"ft\.yaml: " + re.escape(message) + "$"):
            config_from_file(FinetuneConfig, file)
