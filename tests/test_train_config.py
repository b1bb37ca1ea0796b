"""Settings declared once, on their fields (`bertforge.train.config`): each setting's range and choices
hold whether the value comes from Python, a config file or a study file; the resume rules a config class
declares (inherited through a new default); a named recipe is applied or refused, never recorded and
ignored; the schedule of a time budget is a scheduler of its own; the metrics history trims TensorBoard's
events as it trims metrics.jsonl."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from bertforge.settings import config_from_file
from bertforge.tasks.finetune import FinetuneConfig
from bertforge.settings import out_of_range
from bertforge.train.config import ResumeRules, TrainConfig
from bertforge.train.history import MetricsLog
from bertforge.train.optim import CLOCK_UNITS, build_schedule, lr_factor
from bertforge.train.pretrain import RECIPES, PretrainConfig


@pytest.mark.parametrize(("settings", "message"), [
    ({"lr": 0.0}, r"^lr must be a finite number > 0, got 0.0$"),
    ({"lr": -1}, r"^lr must be > 0, got -1$"),
    ({"lr": float("nan")}, r"^lr must be a finite number > 0, got nan$"),
    ({"power": -2.0, "schedule": "polynomial"}, r"^power must be a finite number > 0, got -2.0$"),
    ({"end_lr_ratio": 5.0}, r"^end_lr_ratio must be a finite number in \[0, 1\], got 5.0$"),
    ({"max_grad_norm": -1.0}, r"^max_grad_norm must be a finite number >= 0, got -1.0$"),
    ({"max_time_minutes": -5.0}, r"^max_time_minutes must be a finite number in \[0, 52560000\], got -5.0$"),
    ({"budget_minutes": float("inf")}, r"^budget_minutes must be a finite number in \[0, 52560000\], got inf$"),
    ({"warmup_ratio": 1.0}, r"^warmup_ratio must be a finite number in \[0, 1\), got 1.0$"),
    ({"adam_beta2": 1.0}, r"^adam_beta2 must be a finite number in \[0, 1\), got 1.0$"),
    ({"seed": -1}, r"^seed must be >= 0, got -1$"),
    ({"batch_size": 0}, r"^batch_size must be >= 1, got 0$"),
    ({"schedule": "cosin"}, r"^schedule must be one of linear, polynomial, cosine, constant, range, got 'cosin'$"),
    ({"optimizer": "sgd"}, r"^optimizer must be one of adamw, lamb, got 'sgd'$"),
    ({"strategy": "zero"}, r"^strategy must be one of ddp, fsdp, got 'zero'$"),
])
def test_a_setting_out_of_its_range_or_choices_is_refused_naming_it(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings)


def test_a_subclass_keeps_the_range_of_a_setting_it_gives_a_new_default():
    with pytest.raises(ValueError, match=r"^lr must be a finite number > 0, got -2e-05$"):
        FinetuneConfig(lr=-2e-5)
    with pytest.raises(ValueError, match=r"^dropout must be a finite number in \[0, 1\), got 1.5$"):
        PretrainConfig(dropout=1.5)
    with pytest.raises(ValueError, match=r"^objective must be one of auto, mlm\+nsp, mlm, ltr, got 'xlnet'$"):
        PretrainConfig(objective="xlnet")
    for settings, message in (({"epochs": 1e300}, r"^epochs must be a finite number in \(0, 1000000\], got 1e\+300$"),
                              ({"epochs": 0}, r"^epochs must be in \(0, 1000000\], got 0$"),
                              ({"dropout": -0.1}, r"^dropout must be a finite number in \[0, 1\), got -0.1$"),
                              ({"bilstm_size": 0}, r"^bilstm_size must be >= 1, got 0$")):
        with pytest.raises(ValueError, match=message):
            FinetuneConfig(**settings)
    assert out_of_range(FinetuneConfig, "lr", 0.0) == "must be a finite number > 0, got 0.0"
    assert out_of_range(FinetuneConfig, "lr", 3e-5) is None


def test_resume_rules_are_declared_on_the_fields_and_inherited_through_a_new_default():
    pretrain, finetune = ResumeRules.of(PretrainConfig), ResumeRules.of(FinetuneConfig)
    for name in ("max_steps", "checkpoint_every", "keep_checkpoints", "log_every", "eval_every", "progress",
                 "compile", "max_time_minutes", "device", "out"):
        assert name in pretrain.resumable and name in finetune.resumable, name
    assert "eval_batches" in pretrain.resumable and "eval_batch_size" in finetune.resumable
    assert "epochs" in finetune.resumable  # FinetuneConfig's own
    for name in ("lr", "batch_size", "seed", "schedule", "budget_minutes"):
        assert name not in pretrain.resumable and name not in finetune.resumable, name
    assert pretrain.absent == {"budget_minutes": 0.0, "recipe": "paper", "masked_lm_prob": None,
                               "head_warmup_ratio": None, "shuffle_shards": 1}
    assert (finetune.default_warmup_ratio, pretrain.default_warmup_steps) == (0.1, 10_000)
    assert "warmup_steps_used" in pretrain.with_facts(("warmup_steps_used",)).resumable


def test_a_named_recipe_is_applied_or_refused_never_recorded_and_ignored(tmp_path):
    with pytest.raises(ValueError, match=r"recipe 'budget' is named but none of its settings is applied: build "
                                         r"the config with PretrainConfig.from_recipe\('budget', ...\)"):
        PretrainConfig(recipe="budget")
    cfg = PretrainConfig.from_recipe("budget", lr=1e-3, dropout=0.1)  # settings given over the recipe stay
    assert (cfg.lr, cfg.dropout, cfg.batch_size, cfg.model) == (1e-3, 0.1, 32, "tiny")
    file = tmp_path / "run.yaml"
    file.write_text("recipe: budget\nlr: 1.0e-3\n")
    from_file = config_from_file(PretrainConfig, file)
    assert {k: getattr(from_file, k) for k in RECIPES["budget"] if k != "lr"} == \
        {k: v for k, v in RECIPES["budget"].items() if k != "lr"}
    assert from_file.lr == 1e-3 and from_file.recipe == "budget"


def test_a_time_budget_schedule_follows_the_clock_and_its_state_is_the_step_count():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = build_schedule(opt, budget_seconds=100.0, total_steps=CLOCK_UNITS, warmup_steps=CLOCK_UNITS // 10)
    for seconds in (0.0, 5.0, 10.0, 55.0, 100.0, 250.0):
        sched.set_elapsed(seconds)
        at = min(CLOCK_UNITS, int(seconds / 100.0 * CLOCK_UNITS))
        expected = lr_factor(at, total_steps=CLOCK_UNITS, warmup_steps=CLOCK_UNITS // 10)
        assert opt.param_groups[0]["lr"] == pytest.approx(expected)
        assert sched.get_last_lr() == [opt.param_groups[0]["lr"]]
    steps = build_schedule(torch.optim.SGD(model.parameters(), lr=2.0), total_steps=20, warmup_steps=4)
    legacy = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(model.parameters(), lr=2.0), lambda s: 1.0)
    for _ in range(7):
        legacy.optimizer.step()
        legacy.step()
    steps.load_state_dict(legacy.state_dict())  # a checkpoint written by a LambdaLR resumes at its step
    assert steps.state_dict() == {"last_epoch": 7}
    assert steps.get_last_lr() == [pytest.approx(2.0 * lr_factor(7, total_steps=20, warmup_steps=4))]


class _Writer:
    """A stand-in for TensorBoard's SummaryWriter: what it was opened with and what it was given."""

    made: list[_Writer] = []

    def __init__(self, log_dir: str, purge_step: int | None = None):
        self.log_dir, self.purge_step, self.scalars = log_dir, purge_step, []
        _Writer.made.append(self)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.append((tag, value, step))

    def close(self) -> None:
        pass


def test_the_history_trims_tensorboard_as_it_trims_metrics_jsonl(tmp_path, monkeypatch):
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = _Writer
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    lines = [{"split": "train", "step": s, "time": 1.0, "loss": 2.0} for s in (10, 20, 25)]
    lines += [{"split": "eval", "step": 25, "time": 1.0, "accuracy": 0.5},
              {"split": "train", "step": 30, "time": 2.0, "loss": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    log = MetricsLog(tmp_path, main=True)
    # resumed at step 25 inside a logging window: the train line at 25 and everything after go, in both
    assert log.open(25, reopened=True) == {"accuracy": 0.5}
    kept = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["split"], r["step"]) for r in kept] == [("train", 10), ("train", 20), ("eval", 25)]
    writer = _Writer.made[-1]
    assert writer.log_dir == str(tmp_path / "tensorboard") and writer.purge_step == 25
    assert ("eval/accuracy", 0.5, 25) in writer.scalars  # the kept eval line, written again after the purge
    log.close()
    MetricsLog(tmp_path, main=True).open(20, reopened=False)  # resumed below: events after 20 go
    assert _Writer.made[-1].purge_step == 21
    MetricsLog(tmp_path / "fresh", main=True).open(0, reopened=False)
    assert _Writer.made[-1].purge_step is None


def test_huge_numbers_are_refused_at_once_naming_the_setting(tmp_path):
    with pytest.raises(ValueError, match=r"^seed must be below 2\*\*63, got a 401-digit number$"):
        TrainConfig(seed=10 ** 400)
    with pytest.raises(ValueError, match=r"^max_steps must be below 2\*\*63, got a 400-digit number$"):
        PretrainConfig(max_steps=int("9" * 400))
    with pytest.raises(ValueError, match=r"^max_time_minutes must be a finite number in \[0, 52560000\], "
                                         r"got 2.9e\+306$"):
        TrainConfig(max_time_minutes=2.9e306)
    with pytest.raises(ValueError, match=r"^budget_minutes must be a finite number in \[0, 52560000\], "
                                         r"got 1e\+300$"):
        TrainConfig(budget_minutes=1e300)
    file = tmp_path / "huge.yaml"
    file.write_text("lr: 1" + "0" * 400 + "\n")
    with pytest.raises(ValueError, match=r"huge.yaml: lr: expected a finite number, got a 401-digit number$"):
        config_from_file(PretrainConfig, file)
