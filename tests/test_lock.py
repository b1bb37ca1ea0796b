"""One run at a time in a folder (`bertforge.train.lock`): a second process is refused with one line
naming the folder and the holder, a holder killed with SIGKILL leaves the folder free (its forked
children too), the lock file is no earlier run's file, a run holds its folder from before it looks at
it to its very end and lets go of it however it ends; and, end to end, two `bertforge pretrain` /
`bertforge ablate` started at once into one --out: one runs, the other exits 2 at once, and the run
resumes after a kill -9."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from data_fixtures import VOCAB_SIZE, documents, sentence, write_text, write_tokenizer
from pretrain_fixtures import bertforge_command, cli_args, config, lines, subprocess_env
from pretrain_fixtures import no_plots, nsp_data, one_thread, root, tok  # noqa: F401 - fixtures

from bertforge.experiments.runner import AblateConfig, run_study
from bertforge.model.config import BertConfig
from bertforge.model.heads import BertForPreTraining
from bertforge.tasks import finetune as finetune_module
from bertforge.tasks.finetune import FinetuneConfig, finetune, finetune_grid
from bertforge.train import loop as trainer
from bertforge.train import pretrain as pretrain_module
from bertforge.train.lock import LOCK_FILE, FolderInUse, FolderLock, folder_user, run_lock
from bertforge.train.rundir import latest_checkpoint, open_run_dir, run_files
from bertforge.train.pretrain import pretrain

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL and fork are POSIX")

_HOLDER = """
import os, sys, time
from bertforge.train import lock
held = lock.FolderLock(sys.argv[1]).acquire()
child = 0
if {fork}:
    child = os.fork()
    if child == 0:  # a data-loader worker, say: it outlives its parent here
        time.sleep(120)
        os._exit(0)
print(child, flush=True)
sys.stdin.read()
held.release()
"""


def _hold(folder: Path, *, fork: bool = False) -> tuple[subprocess.Popen, int]:
    """Another process holding ``folder``'s lock (until its stdin closes); and its forked child's pid (0: none)."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER.format(fork=fork), str(folder)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=subprocess_env())
    line = proc.stdout.readline()
    if not line:
        pytest.fail(f"the holder did not start: {proc.communicate()[1]}")
    return proc, int(line)


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()  # SIGKILL: no handler, no cleanup
    proc.wait()


def _lock_elsewhere(folder: Path) -> tuple[int, str]:
    """Whether another process can take ``folder``'s lock: (0, "") if it can, (2, the message) if refused."""
    script = textwrap.dedent(f"""
        import sys
        from bertforge.train import lock
        try:
            lock.FolderLock(sys.argv[1]).acquire().release()
        except lock.FolderInUse as e:
            print(e)
            sys.exit(2)
    """)
    done = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True,
                          env=subprocess_env(), timeout=60)
    assert done.returncode in (0, 2), done.stderr
    return done.returncode, done.stdout.strip()


def _in_use_by(folder: Path, pid: int, before: str = "") -> str:
    """The refusal's one line, as a pattern."""
    return (rf"^{re.escape(before + str(folder))} is in use by process {pid} \(started [0-9: -]+\): "
            r"wait for it, or stop it$")


# ------------------------------------------------------------------------------ the lock


def test_a_second_process_is_refused_until_the_holder_is_killed(tmp_path):
    """Refused with one line naming the folder, the holder's pid and start time, and the lock file as
    it was; after a SIGKILL of the holder the next process takes the lock (the kernel let go of it), and
    letting go removes the file."""
    folder = tmp_path / "run"
    holder, _ = _hold(folder)
    try:
        before = (folder / LOCK_FILE).read_bytes()
        assert json.loads(before)["pid"] == holder.pid
        with pytest.raises(FolderInUse, match=_in_use_by(folder, holder.pid)) as refused:
            FolderLock(folder).acquire()
        assert "\n" not in str(refused.value) and refused.value.owner["pid"] == holder.pid
        assert isinstance(refused.value, ValueError)  # the command line's exit 2
        assert folder_user(folder).startswith(f"process {holder.pid} (started ")
        assert (folder / LOCK_FILE).read_bytes() == before
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]
    finally:
        _kill(holder)
    assert (folder / LOCK_FILE).is_file()  # what a killed process leaves
    assert folder_user(folder) is None
    with FolderLock(folder) as taken:
        assert json.loads(taken.path.read_text())["pid"] == os.getpid()
        assert _lock_elsewhere(folder)[0] == 2
    assert not (folder / LOCK_FILE).exists() and folder.is_dir()
    assert _lock_elsewhere(folder) == (0, "")


def test_a_lock_file_that_is_a_symbolic_link_is_refused_and_its_target_kept(tmp_path):
    """A run.lock planted as a link to another file is neither followed nor removed: the run is refused
    with one line, the target's content and the link stay as they were."""
    folder, target = tmp_path / "run", tmp_path / "precious.txt"
    folder.mkdir()
    target.write_text("keep me\n")
    (folder / LOCK_FILE).symlink_to(target)
    with pytest.raises(ValueError, match=r"run\.lock is a symbolic link; a run's lock file must be a plain file"):
        with run_lock(folder):
            pass
    assert target.read_text() == "keep me\n" and (folder / LOCK_FILE).is_symlink()
    assert folder_user(folder) is None


def test_a_forked_child_does_not_keep_its_killed_parents_lock(tmp_path):
    """A child forked while the lock is held (a data-loader worker) closes its copy of the lock file: the
    parent killed, the folder is free although the child still runs."""
    folder = tmp_path / "run"
    holder, child = _hold(folder, fork=True)
    try:
        assert child > 0
        assert _lock_elsewhere(folder)[0] == 2
        _kill(holder)
        with FolderLock(folder):
            pass
    finally:
        _kill(holder)
        os.kill(child, signal.SIGKILL)


def test_run_lock_lets_go_however_the_block_ends_and_removes_an_empty_folder_it_made(tmp_path):
    """Held for the ``with`` block only: let go of when the block ends, raises or is interrupted, taking
    with it the folders it made if they stayed empty; a folder with files in it stays."""
    folder = tmp_path / "a" / "run"
    with run_lock(folder):
        assert _lock_elsewhere(folder)[0] == 2
        assert folder_user(folder) is None  # this process holds it
    assert not (tmp_path / "a").exists()
    for error in (ValueError("refused"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with run_lock(folder):
                (folder / "metrics.jsonl").write_text("{}\n")
                raise error
        assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl"]
        assert _lock_elsewhere(folder) == (0, "")


class _Rank:
    """A process of a torchrun job as `run_lock` sees it: its rank, and the main process's refusal
    (``main_sends``) as every process receives it from `Distributed.gather_objects`."""

    def __init__(self, rank: int, main_sends: object = None):
        self.rank, self.main_sends, self.sent = rank, main_sends, []

    is_main = property(lambda self: self.rank == 0)
    enabled = True

    def gather_objects(self, obj: object) -> list[object]:
        self.sent.append(obj)
        return [pickle.loads(pickle.dumps(obj if self.is_main else self.main_sends)), None]


def test_run_lock_shares_the_main_processs_refusal_with_every_process(tmp_path):
    """Only the main process takes the lock; each process sends what it found, so that all raise the
    main one's refusal (the same line, the same holder) and none waits for it at a barrier."""
    folder = tmp_path / "run"
    holder, _ = _hold(folder)
    try:
        main = _Rank(0)
        with pytest.raises(FolderInUse, match=_in_use_by(folder, holder.pid)) as refused:
            with run_lock(folder, main):
                pytest.fail("admitted into a folder another process holds")
        other = _Rank(1, main_sends=main.sent[0])
        with pytest.raises(FolderInUse, match=_in_use_by(folder, holder.pid)) as also:
            with run_lock(folder, other):
                pytest.fail("admitted into a folder another process holds")
        assert also.value.owner == refused.value.owner and also.value.owner["pid"] == holder.pid
        assert other.sent == [None]  # it took no lock: it had nothing to find
    finally:
        _kill(holder)
    entered = []
    with run_lock(folder, _Rank(1)):  # the main one admitted: so is every other, without the lock
        entered.append(1)
        assert _lock_elsewhere(folder) == (0, "")
    assert entered == [1]


def test_the_lock_file_is_no_earlier_run_file_and_overwrite_keeps_it(tmp_path):
    """A lock file a killed run left does not make the folder "an earlier run's": a fresh run is admitted
    and holds the lock. --overwrite of a folder another live run holds is refused with its files as they
    were; once free, --overwrite deletes the earlier run's files and keeps the lock."""
    folder = tmp_path / "run"
    holder, _ = _hold(folder)
    _kill(holder)
    assert run_files(folder) == []
    with run_lock(folder):
        assert open_run_dir(folder, resume=False) is None
        assert _lock_elsewhere(folder)[0] == 2  # held by this process now
    assert not (folder / LOCK_FILE).exists()

    (folder / "metrics.jsonl").write_text('{"split": "train", "step": 1}\n')
    holder, _ = _hold(folder)
    try:
        with pytest.raises(FolderInUse, match=_in_use_by(folder, holder.pid)):
            with run_lock(folder):
                open_run_dir(folder, resume=False, overwrite=True)
        assert (folder / "metrics.jsonl").is_file()
    finally:
        _kill(holder)
    with run_lock(folder):
        assert open_run_dir(folder, resume=False, overwrite=True) is None
        assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]
        code, message = _lock_elsewhere(folder)
        assert code == 2 and f"process {os.getpid()} " in message


def test_a_refused_admission_lets_go_of_the_lock_and_of_a_folder_it_made(tmp_path):
    """The lock comes first: a folder another run holds is refused as in use, whatever it holds. A run
    refused when admitted (nothing to resume, an earlier run's files) leaves the folder free for the
    next run, whichever process it is in, and leaves no folder it made."""
    missing = tmp_path / "a" / "new"
    with pytest.raises(ValueError, match="no complete checkpoint"):
        with run_lock(missing):
            open_run_dir(missing, resume=True)
    assert not (tmp_path / "a").exists()
    used = tmp_path / "used"
    used.mkdir()
    (used / "metrics.jsonl").write_text('{"split": "train", "step": 1}\n')
    holder, _ = _hold(used)
    try:
        with pytest.raises(FolderInUse, match=_in_use_by(used, holder.pid)):
            with run_lock(used):
                open_run_dir(used, resume=True)
    finally:
        _kill(holder)
    with pytest.raises(ValueError, match="already holds a previous run's files"):
        with run_lock(used):
            open_run_dir(used, resume=False)
    assert sorted(p.name for p in used.iterdir()) == ["metrics.jsonl"]
    assert _lock_elsewhere(used) == (0, "")


def test_a_run_that_fails_or_is_interrupted_lets_go_of_its_folder(root, tok, nsp_data, monkeypatch, tmp_path):
    """A run that fails after its admission, before training (here: a model without the second token
    type NSP needs), and training that raises (here Ctrl-C twice: KeyboardInterrupt) free the folder as
    the error leaves the run; a finished run frees it when it returns."""
    model = tmp_path / "one-type.json"
    BertConfig.preset("tiny", type_vocab_size=1).save(model)
    out = root / "failed"
    out.mkdir()
    with pytest.raises(ValueError, match="type_vocab_size is 1"):
        pretrain(config(nsp_data, tok, out, model=str(model)))
    assert _lock_elsewhere(out) == (0, "")
    assert list(out.iterdir()) == []

    out = root / "interrupted"
    real_step = trainer.Trainer.train_step

    def interrupted(self, micro):
        if self.step == 1:
            assert _lock_elsewhere(out)[0] == 2  # held while the run trains
            raise KeyboardInterrupt
        return real_step(self, micro)

    monkeypatch.setattr(trainer.Trainer, "train_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pretrain(config(nsp_data, tok, out, max_steps=3))
    assert not (out / LOCK_FILE).exists()
    assert _lock_elsewhere(out) == (0, "")
    monkeypatch.setattr(trainer.Trainer, "train_step", real_step)
    assert pretrain(config(nsp_data, tok, out, max_steps=3, overwrite=True)).step == 3
    assert not (out / LOCK_FILE).exists()
    assert _lock_elsewhere(out) == (0, "")


def test_a_run_holds_its_folder_to_its_very_end(root, tok, nsp_data, monkeypatch):
    """Still held once the final model is saved, while curves.png is drawn: a second run cannot start
    between the final model and the plot."""
    out = root / "to-the-end"
    held_at: list[str] = []
    real_save = trainer.Trainer.save_model

    def save_model(self, folder, extra_files=None):
        real_save(self, folder, extra_files)
        if _lock_elsewhere(out)[0] == 2:
            held_at.append(Path(folder).name)

    monkeypatch.setattr(trainer.Trainer, "save_model", save_model)
    monkeypatch.setattr(pretrain_module, "_plot", lambda o: held_at.append("plot") if _lock_elsewhere(out)[0] == 2
                        else None)
    assert pretrain(config(nsp_data, tok, out, max_steps=2)).step == 2
    assert held_at == ["model", "plot"]
    assert not (out / LOCK_FILE).exists() and _lock_elsewhere(out) == (0, "")


def _finetune_config(tmp_path: Path, out: Path, **settings) -> FinetuneConfig:
    """Two steps of a tiny classification fine-tuning into ``out``."""
    import random

    base = tmp_path / "base"
    if not base.is_dir():
        BertForPreTraining(BertConfig(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=64,
                                      max_position_embeddings=64)).save_pretrained(base)
        write_tokenizer(base)
    rng = random.Random(0)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": f"{['bad', 'good'][i % 2]} {sentence(rng, 3, 6)}", "label": i % 2})
                             + "\n" for i in range(32)), encoding="utf-8")
    return FinetuneConfig(**{**dict(task="classification", model=str(base), train_file=str(train), text_column="text",
                                    label_column="label", out=str(out), max_steps=2, batch_size=16, max_seq_length=32,
                                    keep_best=False, log_every=1, progress=False, device="cpu"), **settings})


def test_finetune_into_a_folder_another_run_holds_is_refused_even_with_overwrite(tmp_path):
    """The earlier run's files stay as they were; once the holder is gone, --overwrite runs."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"split": "train", "step": 1}\n')
    cfg = _finetune_config(tmp_path, out, overwrite=True)
    holder, _ = _hold(out)
    try:
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        with pytest.raises(FolderInUse, match=_in_use_by(out, holder.pid)):
            finetune(cfg)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    finally:
        _kill(holder)
    assert finetune(cfg).train.step == 2
    assert not (out / LOCK_FILE).exists() and [r["step"] for r in lines(out)] == [1, 2]


def test_finetune_and_a_grid_into_a_held_folder_are_refused_before_reading_their_files(tmp_path, monkeypatch):
    """The lock is the first thing a run does with its folder: into a folder another process holds, a run
    whose training file does not exist, and a grid, are refused as in use before any file is read."""
    out = tmp_path / "held"
    cfg = _finetune_config(tmp_path, out, train_file=str(tmp_path / "missing.jsonl"))
    grid = _finetune_config(tmp_path, out, grid="lr=1e-3,2e-3", dev_file=str(tmp_path / "train.jsonl"))
    holder, _ = _hold(out)
    try:
        with monkeypatch.context() as m:
            m.setattr(finetune_module, "prepare_data", lambda cfg: pytest.fail("the files were read"))
            with pytest.raises(FolderInUse, match=_in_use_by(out, holder.pid)):
                finetune_grid(grid)
        with pytest.raises(FolderInUse, match=_in_use_by(out, holder.pid)):
            finetune(cfg)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]
    finally:
        _kill(holder)
    with pytest.raises(OSError, match="missing.jsonl"):  # once free: the run's own error
        finetune(cfg)
    assert _lock_elsewhere(out) == (0, "")


def test_a_grid_holds_its_own_folder_from_before_its_files_are_read_to_its_end(tmp_path, monkeypatch):
    """While the files are read and every run runs, the grid's --out is held (and each run holds its own
    folder); a finished grid lets go of it."""
    out = tmp_path / "grid-out"
    cfg = _finetune_config(tmp_path, out, grid="lr=1e-3,2e-3", dev_file=str(tmp_path / "train.jsonl"))
    seen: list[str] = []
    real_prepare, real_finetune = finetune_module.prepare_data, finetune_module.finetune

    def prepare_data(run):
        seen.append(f"read: {_lock_elsewhere(out)[0]}")
        return real_prepare(run)

    def finetune_run(run, data=None):
        real_run = real_finetune(run, data)
        seen.append(f"run: {_lock_elsewhere(out)[0]}")
        return real_run

    monkeypatch.setattr(finetune_module, "prepare_data", prepare_data)
    monkeypatch.setattr(finetune_module, "finetune", finetune_run)
    result = finetune_grid(cfg)
    assert len(result.runs) == 2 and seen == ["read: 2", "run: 2", "run: 2"]
    assert not (out / LOCK_FILE).exists() and _lock_elsewhere(out) == (0, "")
    assert not list(out.rglob(LOCK_FILE))


def test_under_torchrun_every_process_refuses_a_folder_another_run_holds(root, tok, nsp_data):
    """Only the main process takes the lock; refused, it tells the others, and every process exits with
    the same line instead of waiting for the main one at a barrier."""
    out = root / "held-under-torchrun"
    holder, _ = _hold(out)
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "bertforge", "pretrain", *cli_args(config(nsp_data, tok, out))]
        done = subprocess.run(cmd, cwd=root, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    finally:
        _kill(holder)
    refusals = [line for line in done.stderr.splitlines() if line.startswith("bertforge pretrain: error:")]
    assert done.returncode != 0 and len(refusals) == 2, done.stdout + done.stderr
    assert all(re.match(_in_use_by(out, holder.pid, "bertforge pretrain: error: "), line) for line in refusals)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]


# ------------------------------------------------------------------------------ two commands at once


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(bertforge_command(*args), cwd=cwd, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _first_to_end(procs: list[subprocess.Popen], timeout: float = 180.0) -> subprocess.Popen:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for p in procs:
            if p.poll() is not None:
                return p
        time.sleep(0.05)
    pytest.fail("both runs are still running: neither was refused")


def _refused_at_once(procs: list[subprocess.Popen], command: str, folder: Path) -> subprocess.Popen:
    """Of two commands started at once into ``folder``: the one refused (exit 2, one line naming the
    other's pid) ends first; return the other, still running."""
    refused = _first_to_end(procs)
    running = procs[1] if refused is procs[0] else procs[0]
    out, err = refused.communicate()
    assert refused.returncode == 2, f"{refused.returncode}\n{out}\n{err}"
    assert running.poll() is None, running.communicate()
    assert len(err.splitlines()) == 1, err
    assert re.match(_in_use_by(folder, running.pid, f"bertforge {command}: error: "), err.strip()), err
    return running


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run ended early ({proc.returncode}): {proc.communicate()}")
        if time.monotonic() > end:
            pytest.fail("timed out")
        time.sleep(0.05)


def test_two_pretrain_runs_into_one_folder_one_is_refused_and_the_other_resumes_after_kill_9(root, tok, nsp_data):
    """Started at once, one run trains and the other exits 2 at once with one line; the first one's
    metrics.jsonl holds each step once. Killed with SIGKILL, its lock stays in the folder but does not
    block: --resume continues it, and the finished run leaves no lock file."""
    out = root / "together"
    args = ["pretrain", *cli_args(config(nsp_data, tok, out, max_steps=100_000, checkpoint_every=5))]
    procs = [_start(args, root), _start(args, root)]
    try:
        running = _refused_at_once(procs, "pretrain", out)
        _wait_for(lambda: latest_checkpoint(out) is not None, running)
        _kill(running)
    finally:
        for p in procs:
            _kill(p)
    steps = [r["step"] for r in lines(out)]
    assert steps == list(range(1, len(steps) + 1))  # one run's lines, each once
    assert (out / LOCK_FILE).is_file()
    resumed_at = int(latest_checkpoint(out).name.split("-")[1])
    result = pretrain(config(nsp_data, tok, out, max_steps=resumed_at + 2, checkpoint_every=5, resume=True))
    assert result.step == resumed_at + 2
    assert [r["step"] for r in lines(out)] == list(range(1, resumed_at + 3))
    assert not (out / LOCK_FILE).exists()


def _tiny_study(folder: Path) -> Path:
    """One variant, one task, one seed; a pre-training long enough to be still running when looked at."""
    import random

    rng = random.Random(0)
    vocab = write_tokenizer(folder / "vocab")
    corpus = write_text(folder / "corpus.txt", documents(1, 30, 3, 8))
    for split in ("train", "dev"):
        rows = [json.dumps({"text": f"{['bad', 'good'][i % 2]} {sentence(rng, 3, 6)}", "label": i % 2})
                for i in range(32)]
        (folder / f"cls.{split}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    study = {
        "name": "busy", "title": "A study that takes a while", "seeds": [0],
        "pretraining": {"corpus": str(corpus), "vocab": str(vocab),
                        "prepare": {"max_seq_length": 32, "max_predictions_per_seq": 5, "dupe_factor": 1,
                                    "shard_chars": 100_000},
                        "pretrain": {"model": {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
                                               "intermediate_size": 64, "max_position_embeddings": 64},
                                     "max_steps": 100_000, "batch_size": 8, "lr": 1e-3, "warmup_steps": 1}},
        "finetune": {"epochs": 1, "lr": 1e-3, "batch_size": 16, "max_seq_length": 32},
        "tasks": [{"name": "CLS", "task": "classification", "train_file": str(folder / "cls.train.jsonl"),
                   "dev_file": str(folder / "cls.dev.jsonl"), "text_column": "text", "label_column": "label"}],
        "variants": [{"name": "BERT", "pretrain": {"objective": "mlm+nsp"}}],
    }
    path = folder / "busy.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False), encoding="utf-8")
    return path


def test_two_ablate_runs_into_one_folder_one_is_refused_and_report_only_still_reads(tmp_path, caplog):
    """Two `bertforge ablate S --out O` at once: one runs, the other exits 2 at once naming it. While the
    study runs, --report-only writes the report (it takes no lock) and says who runs the study; a kill -9
    leaves the folder free."""
    study = _tiny_study(tmp_path)
    out = tmp_path / "out"
    args = ["ablate", str(study), "--out", str(out), "--precision", "fp32", "--device", "cpu", "--workers", "1"]
    procs = [_start(args, tmp_path), _start(args, tmp_path)]
    try:
        running = _refused_at_once(procs, "ablate", out)
        _wait_for(lambda: (out / "pretrain" / "bert" / "run" / "metrics.jsonl").is_file(), running)
        caplog.set_level("INFO", logger="bertforge")
        report = run_study(study, AblateConfig(out=str(out), report_only=True))
        assert report.is_file()
        assert any(f"{out} is in use by process {running.pid} " in m for m in caplog.messages)
        assert running.poll() is None
        _kill(running)
    finally:
        for p in procs:
            _kill(p)
    assert folder_user(out) is None
    with FolderLock(out):
        pass
