"""Pre-training in other processes: two gloo processes under torchrun equal one process with the
same global batch, under DDP and FSDP; a run killed with SIGKILL while it checkpoints resumes from
what is left; SIGINT saves a checkpoint, marks the partial model/ and exits 130 with the "continue with
--resume" message."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pretrain_fixtures import (bertforge_command, cli_args, config, lines, losses_by_step, run_cli,
                               subprocess_env)
from pretrain_fixtures import no_plots, nsp_data, one_thread, root, tok  # noqa: F401 - fixtures

from bertforge.model.checkpoint import read_state_dict
from bertforge.train.pretrain import pretrain
from bertforge.train.rundir import STOP_MARKER, latest_checkpoint


def _start(cfg, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(bertforge_command("pretrain", *cli_args(cfg)), cwd=cwd, env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 90.0, poll: float = 0.01) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended early ({proc.returncode}):\n{out}\n{err}")
        if time.monotonic() > end:
            proc.kill()
            pytest.fail("timed out")
        time.sleep(poll)


def _step(folder: Path | None) -> int:
    return int(folder.name.split("-")[1]) if folder is not None else 0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_gloo_processes_equal_one_process(root, tok, nsp_data, strategy):
    """Global batch 8: 2 processes x 4 against 1 x 8; dropout 0. Losses, held-out evaluation and
    final weights agree to float rounding."""
    settings = dict(max_steps=4, eval_shards=1, eval_every=2, checkpoint_every=2)
    two = root / f"two-processes-{strategy}"
    cfg = config(nsp_data, tok, two, strategy=strategy, **settings)
    # --standalone: the rendezvous picks a free local port itself (no race for one chosen beforehand).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "bertforge", "pretrain", *cli_args(cfg)]
    done = run_cli(cmd, cwd=root, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 process(es) on cpu; global batch 8" in done.stdout
    one = root / "one-process"
    if not one.exists():
        pretrain(config(nsp_data, tok, one, **settings))

    a, b = losses_by_step(one), losses_by_step(two)
    assert list(a) == list(b) == [1, 2, 3, 4]
    assert list(b.values()) == pytest.approx(list(a.values()), abs=1e-5)
    for x, y in zip(lines(one), lines(two)):
        assert y["mlm_accuracy"] == x["mlm_accuracy"] and y["nsp_accuracy"] == x["nsp_accuracy"]
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-4)
    ea, eb = lines(one, "eval"), lines(two, "eval")
    assert [r["step"] for r in eb] == [2, 4]
    for x, y in zip(ea, eb):
        assert y["loss"] == pytest.approx(x["loss"], abs=1e-5)
        assert y["mlm_accuracy"] == x["mlm_accuracy"]
    wa, wb = load_file(one / "model" / "model.safetensors"), load_file(two / "model" / "model.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-5, rtol=1e-4, msg=k)
    assert [p.name for p in sorted((two / "checkpoints").iterdir())] == ["step-00000002", "step-00000004"]
    names = [json.loads((folder / "config.json").read_text())["architectures"]
             for folder in (two / "model", two / "checkpoints" / "step-00000004")]
    assert names == [["BertForPreTraining"]] * 2


def test_a_run_killed_while_it_checkpoints_resumes_from_what_is_left(root, tok, nsp_data):
    """SIGKILL the moment a checkpoint's temporary folder appears (the save is under way)."""
    out = root / "killed"
    cfg = config(nsp_data, tok, out, max_steps=100_000, checkpoint_every=1, keep_checkpoints=2, schedule="constant",
                 warmup_steps=0)
    proc = _start(cfg, root)
    folder = out / "checkpoints"

    def saving_after_step_3() -> bool:
        return _step(latest_checkpoint(out)) >= 3 and any(p.name.startswith(".step-") for p in folder.iterdir())

    _wait_for(saving_after_step_3, proc, poll=0.001)
    proc.kill()
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    last = latest_checkpoint(out)
    step = _step(last)
    assert step >= 3
    # What is left is complete: the weights and the training state read back.
    assert read_state_dict(last)
    assert torch.load(last / "trainer_state.pt", weights_only=True)["step"] == step

    result = pretrain(config(nsp_data, tok, out, max_steps=step + 2, checkpoint_every=1, keep_checkpoints=2,
                             schedule="constant", warmup_steps=0, resume=True))
    assert result.step == step + 2 and not result.stopped_early
    assert list(losses_by_step(out)) == list(range(1, step + 3))
    assert sorted(p.name for p in folder.iterdir()) == [f"step-{step + 1:08d}", f"step-{step + 2:08d}"]


def test_ctrl_c_saves_a_checkpoint_and_the_run_resumes(root, tok, nsp_data):
    """SIGINT to `bertforge pretrain` (SIGTERM, in this process: tests/test_pretrain.py)."""
    sig = signal.SIGINT
    out = root / "interrupted"
    settings = dict(checkpoint_every=3, schedule="constant", warmup_steps=0)
    proc = _start(config(nsp_data, tok, out, max_steps=100_000, **settings), root)
    _wait_for(lambda: latest_checkpoint(out) is not None, proc)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, stderr  # as a shell reports a command Ctrl-C stopped
    step = _step(latest_checkpoint(out))
    assert step > 3  # a checkpoint of its own, not the periodic one
    assert f"pretrain: stopped at step {step} of 100000" in stdout and "continue with --resume" in stdout
    assert json.loads((out / "model" / STOP_MARKER).read_text())["reason"] == "SIGINT"
    assert max(losses_by_step(out)) == step

    result = pretrain(config(nsp_data, tok, out, max_steps=step + 2, resume=True, **settings))
    assert result.step == step + 2 and not result.stopped_early
    assert list(losses_by_step(out)) == list(range(1, step + 3))


def test_a_process_that_left_a_process_group_exits_with_its_code_output_and_exit_handlers(tmp_path):
    """`bertforge.cli.run` ends a process that joined a process group with ``os._exit``, after its exit
    handlers and with its output flushed: the code is main's, nothing printed or registered is lost, and
    the teardown in which a leftover gloo group can abort the process does not run."""
    marker = tmp_path / "atexit-ran"
    script = (
        "import atexit, os, sys\n"
        "from bertforge import cli\n"
        "cli._close_process_group = lambda: True  # as after a torchrun-launched run\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('yes'))\n"
        "class Teardown:\n"
        "    def __del__(self, write=os.write): write(2, b'torn down')\n"
        "keep = Teardown()  # freed by the interpreter's teardown only\n"
        "print('buffered line', end='')\n"
        "sys.argv = ['bertforge', 'info', 'no-such-checkpoint']\n"
        "cli.run()\n"
        "raise SystemExit('run() returned')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in subprocess_env().items() if k != "PYTHONUNBUFFERED"})
    assert done.returncode == 2, done.stderr
    assert done.stdout == "buffered line"
    assert "bertforge info: error:" in done.stderr and "run() returned" not in done.stderr
    assert "torn down" not in done.stderr  # the process ended without the interpreter's teardown
    assert marker.read_text() == "yes"
