"""Pre-training on a time budget: the schedule laid over training time, the named recipes, re-masking
at a chosen rate, and the CLI's --recipe under --config and flags."""

from __future__ import annotations

import json
import shutil

import pytest

from pretrain_fixtures import config, lines, make_data
from pretrain_fixtures import no_plots, nsp_data, one_thread, root, tok  # noqa: F401 - fixtures

from bertforge import cli
from bertforge.train import loop
from bertforge.train.config import BUDGET_WARMUP_SHARE, TrainConfig
from bertforge.train.rundir import STOP_MARKER, latest_checkpoint
from bertforge.train.optim import lr_factor
from bertforge.train.pretrain import RECIPES, PretrainConfig, pretrain


class FakeClock:
    """``time.perf_counter`` for the loop: every call advances ``tick`` seconds (a step reads it twice, so it takes one tick)."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_a_time_budget_lays_the_schedule_over_the_clock_and_ends_with_it(root, tok, nsp_data, monkeypatch):
    monkeypatch.setattr(loop.time, "perf_counter", FakeClock(0.5))  # a step takes 0.5 s of training time
    out = root / "budget-run"
    cfg = config(nsp_data, tok, out, max_steps=10**6, warmup_steps=None, warmup_ratio=0.2, budget_minutes=5 / 60,
                 checkpoint_every=4)
    result = pretrain(cfg)
    assert result.step == 10 and not result.stopped_early  # 5 s of 0.5 s steps: the budget, not max_steps, ended it
    assert not (out / "model" / STOP_MARKER).exists()  # a finished model
    train = lines(out)
    assert [r["step"] for r in train] == list(range(1, 11))
    assert [r["time"] for r in train] == [0.5 * s for s in range(1, 11)]
    # the rate logged at step s, the next step's, is the one the clock gives after s steps: warmup over
    # the first 20 % of the budget (1 s), then linear decay to 0 at 5 s
    units = 1_000_000
    expected = [1e-3 * lr_factor(int(0.5 * s / 5 * units), total_steps=units, warmup_steps=units // 5)
                for s in range(1, 11)]
    assert [r["lr"] for r in train] == pytest.approx(expected, rel=1e-6)
    assert train[-1]["lr"] == 0.0 and max(r["lr"] for r in train) == pytest.approx(1e-3, rel=1e-6)
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["budget_minutes"] == 5 / 60


def test_a_budget_run_resumes_on_its_clock(root, tok, nsp_data, monkeypatch):
    """Stopped by the safety limit after 3 s of its 5 s budget, then resumed: the clock, the schedule's
    position, goes on from 3 s, and the run ends at 5 s as one run would."""
    monkeypatch.setattr(loop.time, "perf_counter", FakeClock(0.5))
    out = root / "budget-resumed"
    cfg = config(nsp_data, tok, out, max_steps=10**6, warmup_steps=None, warmup_ratio=0.2, budget_minutes=5 / 60,
                 max_time_minutes=3 / 60)
    first = pretrain(cfg)
    assert first.step == 6 and first.stopped_early and (out / "model" / STOP_MARKER).is_file()
    second = pretrain(config(nsp_data, tok, out, max_steps=10**6, warmup_steps=None, warmup_ratio=0.2,
                             budget_minutes=5 / 60, resume=True))
    assert second.step == 10 and not second.stopped_early
    train = lines(out)
    assert [r["step"] for r in train] == list(range(1, 11))
    assert [r["time"] for r in train] == [0.5 * s for s in range(1, 11)]
    units = 1_000_000
    assert train[6]["lr"] == pytest.approx(1e-3 * lr_factor(int(3.5 / 5 * units), total_steps=units,
                                                            warmup_steps=units // 5), rel=1e-6)


def test_budget_settings_are_checked():
    with pytest.raises(ValueError, match="warmup_ratio"):
        TrainConfig(budget_minutes=5, warmup_steps=100)
    with pytest.raises(ValueError, match="budget_minutes"):
        TrainConfig(budget_minutes=-1)
    with pytest.raises(ValueError, match="budget_minutes"):
        TrainConfig(budget_minutes=float("nan"))
    with pytest.raises(ValueError, match="masked_lm_prob"):
        PretrainConfig(masked_lm_prob=1.5)
    with pytest.raises(ValueError, match="recipe"):
        PretrainConfig(recipe="fast")
    with pytest.raises(ValueError, match="unknown recipe 'fast'"):
        PretrainConfig.from_recipe("fast")
    assert TrainConfig(budget_minutes=5).budget_warmup_share == BUDGET_WARMUP_SHARE
    assert TrainConfig(budget_minutes=5, warmup_ratio=0.3).budget_warmup_share == 0.3


def test_the_paper_recipe_is_the_defaults_and_the_budget_recipe_yields_to_given_settings():
    assert PretrainConfig.from_recipe("paper") == PretrainConfig()
    budget = PretrainConfig.from_recipe("budget", lr=2e-3)
    assert budget.recipe == "budget" and budget.lr == 2e-3
    for key, value in RECIPES["budget"].items():
        if key != "lr":
            assert getattr(budget, key) == value, key
    assert budget.objective == "mlm" and budget.dropout == 0.0  # no NSP, no dropout
    data = {"max_seq_length": 128, "mask_token_prob": 0.5, "random_token_prob": 0.2, "whole_word_mask": True}
    masking = budget.masking(data)
    assert masking.masked_lm_prob == RECIPES["budget"]["masked_lm_prob"]
    assert masking.max_predictions_per_seq == -(-128 * RECIPES["budget"]["masked_lm_prob"] // 1)
    # what replaces a chosen token stays as the data was prepared (Table 8's variants)
    assert (masking.mask_token_prob, masking.random_token_prob, masking.whole_word_mask) == (0.5, 0.2, True)
    assert PretrainConfig().masking(data) is None  # the paper: the data's masks as prepared


def test_cli_recipe_then_config_file_then_flags(root, tok, nsp_data, tmp_path, monkeypatch, capsys):
    """``--recipe budget`` sets the recipe's settings, a --config file overrides them, flags override both;
    the run re-masks the statically masked data at the recipe's rate and trains MLM only."""
    monkeypatch.setattr(loop.time, "perf_counter", FakeClock(0.5))
    out = tmp_path / "run"
    file = tmp_path / "run.yaml"
    file.write_text(f"data: {nsp_data}\ntokenizer: {tok}\nout: {out}\nmodel: tiny\nbatch_size: 8\nlr: 2e-3\n"
                    "log_every: 1\nprogress: false\n")
    assert cli.main(["pretrain", "--recipe", "budget", "--config", str(file), "--budget-minutes", str(2 / 60),
                     "--batch-size", "4"]) == 0
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["recipe"] == "budget" and saved["objective"] == "mlm"
    assert saved["masked_lm_prob"] == RECIPES["budget"]["masked_lm_prob"] and saved["dropout"] == 0.0
    assert saved["lr"] == 2e-3 and saved["batch_size"] == 4  # the file over the recipe, the flag over the file
    train = lines(out)
    assert len(train) == 4 and "nsp_accuracy" not in train[-1]  # 2 s of 0.5 s steps, MLM only
    capsys.readouterr()
    assert cli.main(["pretrain", "--recipe", "fast", "--data", str(nsp_data), "--tokenizer", str(tok), "--out",
                     str(tmp_path / "other")]) == 2
    assert "unknown recipe 'fast'" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_a_checkpoint_recorded_before_the_budget_settings_still_resumes(root, tok, nsp_data):
    """A run's recorded settings without ``budget_minutes``, ``recipe`` and ``masked_lm_prob`` mean the
    paper's: such a checkpoint resumes."""
    out = root / "older-run"
    pretrain(config(nsp_data, tok, out, max_steps=2, checkpoint_every=1))
    ckpt = latest_checkpoint(out)
    info = json.loads((ckpt / "trainer_state.json").read_text())
    for key in ("budget_minutes", "recipe", "masked_lm_prob"):
        del info["run_config"][key]
    (ckpt / "trainer_state.json").write_text(json.dumps(info))
    assert pretrain(config(nsp_data, tok, out, max_steps=3, resume=True)).step == 3
    shutil.rmtree(out)
    pretrain(config(nsp_data, tok, out, max_steps=2, checkpoint_every=1))
    with pytest.raises(ValueError, match="masked_lm_prob"):  # a real change is still refused
        pretrain(config(nsp_data, tok, out, max_steps=3, resume=True, masked_lm_prob=0.3))


def test_remasking_trains_at_its_rate(root, tok):
    data = make_data(root, tok, "static-for-remask")
    out = root / "remask-run"
    pretrain(config(data, tok, out, batch_size=16, max_steps=40, lr=3e-3, warmup_steps=3, masked_lm_prob=0.4,
                    objective="mlm"))
    train = lines(out)
    assert sum(r["loss"] for r in train[-5:]) < 0.8 * sum(r["loss"] for r in train[:5])


def test_the_stop_marker_of_a_time_budget_run_speaks_of_minutes():
    import json

    from bertforge.train.loop import TrainResult
    from bertforge.train.rundir import STOP_MARKER, stop_marker, stopped_where

    stopped = dict(stopped_early=True, final_metrics={}, eval_metrics={}, checkpoint=None, interrupted=True,
                   stop_signal=15)
    record = json.loads(stop_marker(TrainResult(step=473, max_steps=1_000_000, budget_minutes=5,
                                                elapsed_seconds=78, **stopped))[STOP_MARKER])
    assert stopped_where(record) == "1.3 of its 5 budget minutes (step 473)"
    record = json.loads(stop_marker(TrainResult(step=473, max_steps=1000, **stopped))[STOP_MARKER])
    assert stopped_where(record) == "step 473 of 1000" and "budget_minutes" not in record


def test_info_says_where_a_time_budget_run_stopped_in_minutes(tmp_path, capsys):
    import json

    from data_fixtures import VOCAB_SIZE, write_tokenizer

    from bertforge import cli
    from bertforge.model.config import BertConfig
    from bertforge.model.heads import BertForMaskedLM
    from bertforge.train.rundir import STOP_MARKER

    BertForMaskedLM(BertConfig(vocab_size=VOCAB_SIZE, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)).save_pretrained(tmp_path)
    write_tokenizer(tmp_path)
    (tmp_path / STOP_MARKER).write_text(json.dumps({"step": 257, "max_steps": 1_000_000, "reason": "SIGTERM",
                                                    "budget_minutes": 5, "minutes": 1.3}))
    assert cli.main(["info", str(tmp_path)]) == 0
    assert "stopped early at 1.3 of its 5 budget minutes (step 257) (SIGTERM)" in capsys.readouterr().out
    assert cli.main(["ablate", "--out", str(tmp_path)]) == 2
    assert "no study_source.json" in capsys.readouterr().err
