"""Pre-training end to end, in this process, on a tiny prepared corpus: the loss falls and a tiny
model memorises it; its model/ is read by transformers and starts a second phase; a run stopped by
SIGTERM and resumed equals an uninterrupted one, and so does an extended run; accumulation equals a
bigger micro-batch; a checkpoint that dies mid-write leaves the previous one usable; a run stopped
between metrics lines and resumed logs the uninterrupted lines; a finished run resumed evaluates once;
incompatible resumes are refused; MLM-only data, held-out evaluation, plots, YAML configs, bf16 and auto precision.
(Runs in other processes: tests/test_pretrain_processes.py.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from pretrain_fixtures import cli_args, config, evaluate_folder, lines, losses_by_step, make_data
from pretrain_fixtures import no_plots, nsp_data, one_thread, root, tok  # noqa: F401 - fixtures

from bertforge import cli
from bertforge.train import loop as trainer
from bertforge.model.checkpoint import read_state_dict
from bertforge.model.heads import BertForMaskedLM, BertForPreTraining
from bertforge.train.optim import lr_factor
from bertforge.train.pretrain import pretrain
from bertforge.text.tokenizer import BertTokenizer
from bertforge.serving.predictor import Predictor
from bertforge.train.rundir import STOP_MARKER, latest_checkpoint, open_run_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def mlm_data(root, tok) -> Path:
    return make_data(root, tok, "mlm", nsp=False)


@pytest.fixture(scope="module")
def memorised(root, tok, nsp_data) -> Path:
    """A run that learns the 21 training instances by heart (dropout 0, fixed masks, 60 steps)."""
    out = root / "memorised"
    pretrain(config(nsp_data, tok, out, batch_size=16, max_steps=60, lr=3e-3, warmup_steps=5, schedule="linear",
                    end_lr_ratio=0.1, weight_decay=0.0, log_every=1))
    return out


def _weights_equal(a: Path, b: Path) -> None:
    wa, wb = load_file(a / "model" / "model.safetensors"), load_file(b / "model" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


# ------------------------------------------------------------------------------ learning


def test_a_tiny_model_memorises_a_tiny_corpus_and_its_outputs_are_usable(memorised, nsp_data, tok, tmp_path,
                                                                        capsys):
    train = lines(memorised)
    assert [r["step"] for r in train] == list(range(1, 61))
    first, last = train[0], train[-1]
    assert first["loss"] > 5.0  # about ln(vocab) + ln(2) at the start
    assert last["loss"] < 0.1 * first["loss"]
    assert last["mlm_accuracy"] >= 0.9 and last["nsp_accuracy"] >= 0.9
    # The saved model predicts every masked token of the training data (static masks) and every NSP label.
    model = BertForPreTraining.from_pretrained(memorised / "model")
    got = evaluate_folder(model, nsp_data)
    assert got["mlm_accuracy"] >= 0.95, got
    assert got["nsp_accuracy"] >= 0.95, got
    # Each line's lr is the one the next step runs at: peak * lr_factor(step) (0-based steps).
    expected = [3e-3 * lr_factor(r["step"], total_steps=60, warmup_steps=5, end_factor=0.1) for r in train]
    assert [r["lr"] for r in train] == pytest.approx(expected, abs=1e-9)

    # model/ is transformers' BertForPreTraining, with the same logits.
    folder = memorised / "model"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    theirs = transformers.BertForPreTraining.from_pretrained(folder).eval()
    enc = BertTokenizer.from_pretrained(tok)(["the old house", "walking by the river"], ["a good book", "no"],
                                             padding=True, return_tensors="pt")
    with torch.no_grad():
        a = model.eval()(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
        b = theirs(**enc)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(a.prediction_logits[real], b.prediction_logits[real], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(a.seq_relationship_logits, b.seq_relationship_logits, atol=1e-5, rtol=1e-5)

    # model/ starts a second phase (its tokenizer too): the first loss is the trained model's.
    phase2 = tmp_path / "phase2"
    pretrain(config(nsp_data, "", phase2, model="base", init_from=str(folder), max_steps=1))
    assert lines(phase2)[0]["loss"] < 0.1 * first["loss"]

    # The run drew its curves, and `bertforge plot` redraws them.
    assert (memorised / "curves.png").read_bytes()[:8] == PNG_MAGIC
    png = tmp_path / "again.png"
    assert cli.main(["plot", str(memorised), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert str(png) in capsys.readouterr().out


def test_mlm_only_data_trains_a_masked_lm(root, tok, mlm_data):
    out = root / "mlm-only"
    result = pretrain(config(mlm_data, tok, out, batch_size=16, max_steps=30, lr=3e-3, warmup_steps=3))
    train = lines(out)
    assert "nsp_accuracy" not in train[-1] and "nsp_loss" not in train[-1]
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    assert result.final_metrics["loss"] == train[-1]["loss"]
    folder = out / "model"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    ours = BertForMaskedLM.from_pretrained(folder).eval()
    theirs = transformers.BertForMaskedLM.from_pretrained(folder).eval()
    ids = BertTokenizer.from_pretrained(tok)("the little garden of stones", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-4, rtol=1e-5)
    assert evaluate_folder(ours, mlm_data)["mlm_accuracy"] > 0.3


def test_dynamically_masked_data_is_masked_in_the_loader_and_trains(root, tok):
    """Data stored unmasked: pretrain hands the tokenizer's special ids to the loader, which masks
    every batch afresh."""
    data = make_data(root, tok, "dynamic", dynamic_masking=True)
    out = root / "dynamic-run"
    pretrain(config(data, tok, out, batch_size=16, max_steps=60, lr=3e-3, warmup_steps=3))
    train = lines(out)
    assert len(train) == 60 and all(0.0 <= r["mlm_accuracy"] <= 1.0 for r in train)
    assert sum(r["loss"] for r in train[-5:]) < 0.8 * sum(r["loss"] for r in train[:5])


def test_bf16_first_step_loss_is_close_to_fp32(root, tok, nsp_data, monkeypatch, caplog):
    got = {}
    monkeypatch.setattr("bertforge.train.precision.native_bf16", lambda device: False)  # as on an AVX2-only CPU
    for precision in ("fp32", "bf16"):
        out = root / f"precision-{precision}"
        caplog.clear()
        pretrain(config(nsp_data, tok, out, max_steps=2, precision=precision))
        got[precision] = [r["loss"] for r in lines(out)]
        assert ("emulated" in caplog.text) == (precision == "bf16")  # the warning names the slow path
    assert got["fp32"][0] == pytest.approx(got["bf16"][0], rel=2e-2)
    assert got["fp32"][1] == pytest.approx(got["bf16"][1], rel=5e-2)
    assert got["fp32"] != got["bf16"]  # bf16 really ran in bf16


@pytest.mark.parametrize("native", [False, True])
def test_auto_precision_trains_in_bf16_where_the_cpu_runs_it_natively_else_fp32(root, tok, nsp_data, monkeypatch,
                                                                                  caplog, native):
    monkeypatch.setattr("bertforge.train.precision.native_bf16", lambda device: native)
    expected = "bf16" if native else "fp32"
    got, said = {}, {}
    for precision in ("auto", expected):
        out = root / f"auto-{native}-{precision}"
        caplog.clear()
        with caplog.at_level("INFO", logger="bertforge"):
            pretrain(config(nsp_data, tok, out, max_steps=2, precision=precision))
        got[precision] = [r["loss"] for r in lines(out)]
        said[precision] = next(m for m in caplog.messages if m.startswith("pretrain: "))
    assert said["auto"].endswith(f"precision {expected} (auto)")
    assert said[expected].endswith(f"precision {expected}")
    assert got["auto"] == got[expected]  # auto ran exactly the precision it chose
    assert json.loads((root / f"auto-{native}-auto" / "run_config.json").read_text())["precision"] == "auto"


# ------------------------------------------------------------------------------ exactness


def test_a_run_stopped_by_sigterm_and_resumed_equals_an_uninterrupted_one(root, tok, nsp_data, monkeypatch, capsys):
    """Dropout on: the resumed half must restore weights, optimizer, schedule, data position and
    the random generators exactly. A real SIGTERM, sent to this process during step 4 of 8. The
    stopped run's model/ is marked partial (exit code 143, `bertforge info`, the predictor) until
    the resumed run replaces it."""
    settings = dict(max_steps=8, dropout=0.1, warmup_steps=2, schedule="linear", optimizer="adamw")
    straight = root / "straight"
    pretrain(config(nsp_data, tok, straight, **settings))
    halves = root / "halves"
    real_step, handler = trainer.Trainer.train_step, signal.getsignal(signal.SIGTERM)

    def step_and_signal(self, micro):
        if self.step == 3:  # the step counter moves on after train_step
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, micro)

    monkeypatch.setattr(trainer.Trainer, "train_step", step_and_signal)
    first = pretrain(config(nsp_data, tok, halves, **settings))
    assert first.stopped_early and first.step == 4
    assert signal.getsignal(signal.SIGTERM) is handler  # the loop's handler is gone again
    assert latest_checkpoint(halves).name == "step-00000004"
    assert first.exit_code == 128 + signal.SIGTERM
    marker = json.loads((halves / "model" / STOP_MARKER).read_text())
    assert (marker["step"], marker["max_steps"], marker["reason"]) == (4, 8, "SIGTERM")
    capsys.readouterr()
    assert cli.main(["info", str(halves / "model")]) == 0
    assert "stopped early at step 4 of 8 (SIGTERM)" in capsys.readouterr().out
    assert Predictor.from_pretrained(halves / "model", device="cpu").stopped_early["step"] == 4
    monkeypatch.setattr(trainer.Trainer, "train_step", real_step)
    second = pretrain(config(nsp_data, tok, halves, resume=True, **settings))
    assert second.step == 8 and not second.stopped_early and second.exit_code == 0
    assert not (halves / "model" / STOP_MARKER).exists()
    assert Predictor.from_pretrained(halves / "model", device="cpu").stopped_early is None
    assert cli.main(["info", str(halves / "model")]) == 0
    assert "stopped early" not in capsys.readouterr().out
    a, b = losses_by_step(straight), losses_by_step(halves)
    assert list(a) == list(range(1, 9))
    assert b == a
    assert len(set(a.values())) == 8
    _weights_equal(straight, halves)


def test_gradient_accumulation_equals_one_big_micro_batch(root, tok, nsp_data):
    with pytest.raises(ValueError, match="fewer than grad_accum"):  # 21 instances, 32 a step
        pretrain(config(nsp_data, tok, root / "accum-too-big", batch_size=32, grad_accum=32))
    outs = {}
    for accum in (1, 2, 4):
        outs[accum] = root / f"accum-{accum}"
        pretrain(config(nsp_data, tok, outs[accum], grad_accum=accum, max_steps=3))
    one = losses_by_step(outs[1])
    for accum in (2, 4):
        other = losses_by_step(outs[accum])
        assert list(other) == list(one)
        assert list(other.values()) == pytest.approx(list(one.values()), abs=1e-5)
        a, b = read_state_dict(outs[1] / "model"), read_state_dict(outs[accum] / "model")
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4, msg=k)


# ------------------------------------------------------------------------------ checkpoints and resume


class _Clock:
    """A perf_counter that advances one second per reading: every training step takes 1 s, so a time
    limit stops a run at a chosen step."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 1.0
        return self.now


def test_a_checkpoint_that_dies_mid_write_leaves_the_previous_one(root, tok, nsp_data, monkeypatch):
    out = root / "crash"
    settings = dict(max_steps=4, checkpoint_every=1, keep_checkpoints=0)
    monkeypatch.setattr(trainer, "time", _Clock())
    assert pretrain(config(nsp_data, tok, out, max_time_minutes=1.5 / 60, **settings)).step == 2

    real_save = torch.save

    def save_then_die(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)
        Path(path).write_bytes(Path(path).read_bytes()[:100])  # truncated, as by a crash mid-write
        raise OSError("No space left on device")

    monkeypatch.setattr(trainer.torch, "save", save_then_die)
    with pytest.raises(OSError, match=f"^no space left on {out / 'checkpoints' / 'step-00000003'}$"):
        pretrain(config(nsp_data, tok, out, resume=True, **settings))
    monkeypatch.undo()
    half = out / "checkpoints" / f".step-00000003.tmp-{os.getpid()}"
    assert not half.exists()  # the failed write cleared its temporary folder
    # Leftovers of deaths that leave no time to clear up (SIGKILL mid-write): this process's temporary
    # folder with a torn state file, an older process's, and a folder with no state.
    shutil.copytree(out / "checkpoints" / "step-00000002", half)
    (half / "trainer_state.pt").write_bytes((half / "trainer_state.pt").read_bytes()[:100])
    shutil.copytree(half, out / "checkpoints" / ".step-00000009.tmp-1")
    (out / "checkpoints" / "step-00000010").mkdir()
    assert latest_checkpoint(out).name == "step-00000002"
    assert [r["step"] for r in lines(out)] == [1, 2, 3]

    result = pretrain(config(nsp_data, tok, out, resume=True, **settings))
    assert result.step == 4
    assert [r["step"] for r in lines(out)] == [1, 2, 3, 4]  # step 3's first attempt is dropped
    left = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert left == ["step-00000001", "step-00000002", "step-00000003", "step-00000004", "step-00000010"]
    # The same run without the crash: identical (dropout 0 and 1 thread make it deterministic).
    clean = root / "no-crash"
    pretrain(config(nsp_data, tok, clean, **settings))
    assert losses_by_step(clean) == losses_by_step(out)


def test_a_stopped_run_logs_the_steps_since_its_last_metrics_line(root, tok, nsp_data, monkeypatch):
    out = root / "stopped-between-lines"
    monkeypatch.setattr(trainer, "time", _Clock())
    result = pretrain(config(nsp_data, tok, out, max_steps=10, log_every=4, max_time_minutes=5.5 / 60))
    assert result.stopped_early and result.step == 6
    train = lines(out)
    assert [r["step"] for r in train] == [4, 6]
    assert result.final_metrics == {k: v for k, v in train[-1].items() if k not in ("split", "step", "time")}


def test_a_run_stopped_between_metrics_lines_and_resumed_logs_the_uninterrupted_lines(root, tok, nsp_data,
                                                                                     monkeypatch):
    """Stopped at step 4 with a line every 3 steps: the stopped run's line for steps 4..4 is replaced,
    and the resumed run's line at 6 covers steps 4..6, as in the uninterrupted run."""
    settings = dict(max_steps=8, log_every=3)
    straight, halves = root / "windows-straight", root / "windows-halves"
    pretrain(config(nsp_data, tok, straight, **settings))
    monkeypatch.setattr(trainer, "time", _Clock())
    first = pretrain(config(nsp_data, tok, halves, max_time_minutes=3.5 / 60, **settings))
    assert first.stopped_early and first.step == 4
    assert [r["step"] for r in lines(halves)] == [3, 4]  # the partial window is logged when the run stops
    pretrain(config(nsp_data, tok, halves, resume=True, **settings))

    def curve(out: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("time", "tokens_per_s")} for r in lines(out)]

    assert [r["step"] for r in curve(straight)] == [3, 6, 8]
    assert curve(halves) == curve(straight)


def test_a_finished_run_resumed_evaluates_once(root, tok, nsp_data, monkeypatch):
    """Killed while saving its final model, then resumed twice: one eval line at the last step, and
    the result reports it."""
    out = root / "evaluated-once"
    settings = dict(max_steps=3, eval_shards=1)

    real_save = trainer.Trainer.save_model

    def die(self, folder, extra_files=None):
        raise OSError("killed")

    monkeypatch.setattr(trainer.Trainer, "save_model", die)
    with pytest.raises(OSError, match="killed"):
        pretrain(config(nsp_data, tok, out, **settings))
    monkeypatch.setattr(trainer.Trainer, "save_model", real_save)
    assert [r["step"] for r in lines(out, "eval")] == [3]
    for _ in range(2):
        result = pretrain(config(nsp_data, tok, out, resume=True, **settings))
        evals = lines(out, "eval")
        assert [r["step"] for r in evals] == [3]
        assert result.eval_metrics == {k: v for k, v in evals[0].items() if k not in ("split", "step", "time")}
    assert [r["step"] for r in lines(out)] == [1, 2, 3]
    assert (out / "model" / "model.safetensors").is_file()


def test_an_extended_run_continues_on_the_longer_schedule(root, tok, nsp_data):
    """max_steps may grow on resume: the steps after it run at the new schedule's rates. With one
    warmup step and linear decay, runs of 2 and 4 steps both take their first two steps at the peak,
    so a run of 2 extended to 4 equals a run of 4."""
    straight, extended = root / "four-steps", root / "two-then-four"
    pretrain(config(nsp_data, tok, straight, max_steps=4))
    pretrain(config(nsp_data, tok, extended, max_steps=2))
    assert lines(extended)[-1]["lr"] == 0.0
    pretrain(config(nsp_data, tok, extended, max_steps=4, resume=True))
    assert losses_by_step(extended) == losses_by_step(straight)
    assert [r["lr"] for r in lines(extended)][2:] == [r["lr"] for r in lines(straight)][2:]
    _weights_equal(straight, extended)


def test_resume_checks_refuse_incompatible_runs(root, tok, nsp_data):
    out = root / "guarded"
    with pytest.raises(ValueError, match="no complete checkpoint"):
        pretrain(config(nsp_data, tok, out, resume=True, max_steps=1))
    pretrain(config(nsp_data, tok, out, max_steps=1))
    with pytest.raises(ValueError, match="already holds a previous run's files.*resume=True continues it from "
                                         "checkpoints/step-00000001.*overwrite=True"):
        pretrain(config(nsp_data, tok, out, max_steps=2))
    with pytest.raises(ValueError, match=r"settings differ \(.*model: 'tiny' -> 'mini'"):
        pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, model="mini"))
    with pytest.raises(ValueError, match=r"settings differ \(.*lr: 0.001 -> 0.002"):
        pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, lr=2e-3))
    # Data prepared with another vocab (and its tokenizer): the vocab hash and the model's size differ.
    other_tok = root / "other-tok"
    base = BertTokenizer.from_pretrained(tok)
    BertTokenizer(base.convert_ids_to_tokens(list(range(base.vocab_size))) + ["zebra", "violin"]
                  ).save_pretrained(other_tok)
    other_data = make_data(root, other_tok, "other-vocab")
    with pytest.raises(ValueError, match="data_vocab_hash"):
        pretrain(config(other_data, other_tok, out, resume=True, max_steps=2))
    # The tokenizer must be the data's.
    with pytest.raises(ValueError, match="vocab"):
        pretrain(config(other_data, tok, root / "mismatch", max_steps=1))
    # Changes that do not alter the run are allowed: more steps, other logging.
    result = pretrain(config(nsp_data, tok, out, resume=True, max_steps=2, log_every=2))
    assert result.step == 2


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_finished_run_without_its_checkpoints_is_refused_and_left_byte_identical(root, tok, nsp_data, capsys):
    """Only --overwrite starts afresh over an earlier run's metrics and model/; refused, the folder
    stays as it was, and the message names it, what it holds and both flags."""
    out = root / "finished"
    pretrain(config(nsp_data, tok, out, max_steps=2))
    shutil.rmtree(out / "checkpoints")
    before = _files(out)
    with pytest.raises(ValueError) as refused:
        pretrain(config(nsp_data, tok, out, max_steps=3))
    message = str(refused.value)
    assert str(out) in message and "metrics.jsonl" in message and "model/" in message
    assert "no checkpoint to resume from" in message and "overwrite=True" in message
    with pytest.raises(ValueError, match="no complete checkpoint.*overwrite=True"):
        pretrain(config(nsp_data, tok, out, max_steps=3, resume=True))
    with pytest.raises(ValueError, match="resume=True.*overwrite=True.*one of them"):
        pretrain(config(nsp_data, tok, out, max_steps=3, resume=True, overwrite=True))
    assert cli.main(["pretrain", *cli_args(config(nsp_data, tok, out, max_steps=3))]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert _files(out) == before
    result = pretrain(config(nsp_data, tok, out, max_steps=3, overwrite=True))
    assert result.step == 3 and [r["step"] for r in lines(out)] == [1, 2, 3]  # one run's metrics, not two
    assert not (out / "model" / STOP_MARKER).exists()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_run_clears_the_temporary_folders_a_killed_run_left(root, tok, nsp_data):
    """A kill while model/ was being swapped in leaves no model/ but .model.old-PID (put back) and
    .model.tmp-PID (removed), and a torn checkpoint folder; a stranger's hidden folder stays."""
    out = root / "leftovers"
    pretrain(config(nsp_data, tok, out, max_steps=2, checkpoint_every=1))
    dead = _dead_pid()
    os.replace(out / "model", out / f".model.old-{dead}")
    shutil.copytree(out / f".model.old-{dead}", out / f".model.tmp-{dead}")
    (out / "checkpoints" / f".step-00000003.tmp-{dead}").mkdir()
    (out / f".notes.tmp-{dead}").mkdir()
    open_run_dir(out, resume=True)
    assert (out / "model" / "model.safetensors").is_file()
    hidden = sorted(p.name for p in out.rglob(".*"))
    assert hidden == [f".notes.tmp-{dead}"]
    assert pretrain(config(nsp_data, tok, out, max_steps=3, checkpoint_every=1, resume=True)).step == 3


def test_nsp_data_with_one_token_type_is_one_error_naming_the_config(root, tok, nsp_data, tmp_path, capsys):
    # not an IndexError from the token-type embedding at the first step
    from bertforge.model.config import BertConfig

    model = tmp_path / "one-type.json"
    BertConfig.preset("tiny", type_vocab_size=1).save(model)
    code = cli.main(["pretrain"] + cli_args(config(nsp_data, tok, tmp_path / "run", model=str(model))))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{model}: type_vocab_size is 1" in err and "next sentence prediction" in err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ evaluation and configuration


def test_held_out_shards_are_evaluated(root, tok, nsp_data):
    out = root / "held-out"
    result = pretrain(config(nsp_data, tok, out, eval_shards=1, eval_every=2, max_steps=5))
    evals = lines(out, "eval")
    assert [r["step"] for r in evals] == [2, 4, 5]
    assert {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"} <= set(evals[-1])
    # The last evaluation is the final model on the whole held-out shard (8 instances, one batch).
    model = BertForPreTraining.from_pretrained(out / "model")
    expected = evaluate_folder(model, nsp_data, shards=[2])
    for k, v in expected.items():
        assert evals[-1][k] == pytest.approx(v, abs=1e-5), k
    assert result.eval_metrics == {k: evals[-1][k] for k in result.eval_metrics}
    with pytest.raises(ValueError, match="hold out all 3 shards"):
        pretrain(config(nsp_data, tok, root / "all-held-out", eval_shards=3))


def test_a_run_resumes_from_its_folder_alone_and_its_record_is_a_config_file(root, tok, nsp_data, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["pretrain", "--data", str(nsp_data), "--tokenizer", str(tok), "--out", str(out), "--model", "tiny",
                     "--batch-size", "8", "--max-steps", "2", "--lr", "2e-3", "--log-every", "1", "--no-progress"]) == 0
    assert cli.main(["pretrain", "--out", str(out), "--resume", "--max-steps", "3"]) == 0  # no flag typed again
    assert [r["step"] for r in lines(out) if r["split"] == "train"] == [1, 2, 3]
    saved = json.loads((out / "run_config.json").read_text())
    assert (saved["lr"], saved["batch_size"], saved["max_steps"]) == (2e-3, 8, 3)
    assert cli.main(["pretrain", "--config", str(out / "run_config.json"), "--resume", "--max-steps", "4"]) == 0
    assert [r["step"] for r in lines(out) if r["split"] == "train"] == [1, 2, 3, 4]
    capsys.readouterr()
    assert cli.main(["pretrain", "--out", str(out), "--resume", "--lr", "0.5"]) == 2  # not a resumable setting
    assert "the run's settings differ (lr: 0.002 -> 0.5)" in capsys.readouterr().err
    assert cli.main(["pretrain", "--out", str(tmp_path / "never-ran"), "--resume"]) == 2  # nothing recorded there
    assert "holds no run_config.json, so no run there got as far as its first checkpoint" in capsys.readouterr().err


def test_a_yaml_config_file_is_honoured_and_flags_override_it(root, tok, nsp_data, tmp_path, capsys):
    out = tmp_path / "run"
    file = tmp_path / "run.yaml"
    file.write_text(f"data: {nsp_data}\ntokenizer: {tok}\nout: {out}\nmodel: tiny\nbatch_size: 8\n"
                    "max_steps: 5\nlr: 2e-3\nwarmup_steps: 0\nschedule: constant\nlog_every: 1\n"
                    "progress: false\ndropout: 0.0\n")
    assert cli.main(["pretrain", "--config", str(file), "--max-steps", "2"]) == 0
    train = lines(out)
    assert [r["step"] for r in train] == [1, 2]  # the flag beats the file
    assert [r["lr"] for r in train] == [2e-3, 2e-3]  # YAML's 2e-3 (a string to YAML 1.1) read as a number
    saved = json.loads((out / "run_config.json").read_text())
    assert saved["lr"] == 2e-3 and saved["batch_size"] == 8 and saved["schedule"] == "constant"
    capsys.readouterr()

    file.write_text(f"data: {nsp_data}\ntokenizer: {tok}\nout: {tmp_path / 'other'}\nlearning_rate: 0.1\n")
    assert cli.main(["pretrain", "--config", str(file)]) == 2
    assert "unknown key 'learning_rate'; expected " in capsys.readouterr().err
    file.write_text(f"data: {nsp_data}\ntokenizer: {tok}\nout: {tmp_path / 'other'}\nmax_steps: many\n")
    assert cli.main(["pretrain", "--config", str(file)]) == 2
    assert "max_steps" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_a_tokenizer_of_the_same_vocab_with_other_normalisation_is_refused(root, tok, nsp_data):
    # Same vocab.txt, so the same vocab hash; read cased, the same text gets other ids.
    cased = root / "cased-tok"
    BertTokenizer.from_pretrained(tok, do_lower_case=False).save_pretrained(cased)
    assert BertTokenizer.from_pretrained(cased).vocab_hash == BertTokenizer.from_pretrained(tok).vocab_hash
    out = root / "cased-run"
    with pytest.raises(ValueError, match=r"do_lower_case=True.*do_lower_case=False"):
        pretrain(config(nsp_data, cased, out, max_steps=1))
    assert not (out / "model").exists()


def test_a_damaged_shard_stops_the_run_before_its_first_step(root, tok, nsp_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(nsp_data, data)
    manifest = json.loads((data / "manifest.json").read_text())
    # The shard the first epoch visits last, so reading batches alone would meet it late.
    from bertforge.data.loader import epoch_permutation

    last = data / manifest["shards"][int(epoch_permutation(len(manifest["shards"]), 0, 0)[-1])]["file"]
    last.write_bytes(last.read_bytes()[:-50])
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=rf"{last.name}: .* bytes, the manifest says"):
        pretrain(config(data, tok, out, max_steps=1, seed=0))
    assert not (out / "metrics.jsonl").exists()


def test_a_device_bertforge_cannot_run_on_is_one_clear_line_before_any_work(root, tok, nsp_data, capsys):
    """`resolve_device`, which every command goes through, refuses it as bad input (not a torch traceback)."""
    out = root / "on-a-tpu"
    assert cli.main(["pretrain", *cli_args(config(nsp_data, tok, out, device="tpu"))]) == 2
    assert "bertforge pretrain: error: device: expected auto, cpu, cuda, cuda:K or another device PyTorch knows, got 'tpu'" \
        in capsys.readouterr().err
    assert not out.exists()
