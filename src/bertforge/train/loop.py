"""The one training loop, shared by pre-training and every fine-tuning task.

A recipe (``bertforge.train.pretrain``, fine-tuning) plugs in a model, a `Task` (how a batch becomes
loss terms and statistics), a resumable batch source and, optionally, an evaluation; the loop owns
everything around them: gradient accumulation, mixed precision, clipping, the optimizer and
schedule, distributed wrapping, checkpoints, resume, signals, logging and the progress bar.

Loss normalisation. A task returns each loss term as a *sum* (e.g. summed MLM cross-entropy) and
says beforehand how many items each term averages over (`Task.counts`). The loop divides each sum
by its count over the whole optimizer step (every micro-batch on every process), so the gradient is
the one of a single big batch whatever the number of processes or accumulation steps, even though
micro-batches hold different numbers of masked tokens. (A mean per micro-batch, averaged again by
DDP, would weight the tokens of short micro-batches more.)

Checkpoints. ``OUT/checkpoints/step-NNNNNNNN/`` is a normal checkpoint folder (config.json,
model.safetensors, tokenizer files) plus ``trainer_state.pt`` (optimizer, schedule, step, every
process's random-generator states, the batch source's position; read back with
``torch.load(weights_only=True)``) and ``trainer_state.json`` (the same facts, readable). A folder
is written under a temporary name and renamed when complete (`bertforge.io.atomic_dir`), so a crash
or ``kill -9`` at any moment leaves every earlier checkpoint intact; only then are checkpoints
beyond the last ``keep_checkpoints`` removed. SIGINT / SIGTERM finish the current step, save and stop.

Metrics. ``OUT/metrics.jsonl`` holds one history, whatever the interruptions: a train line at every
multiple of ``log_every`` over the steps since the previous multiple (plus one at the step a run stops
at), and one eval line per evaluation. The sums of the open logging window are part of the checkpoint,
so a resumed run logs the same windows as an uninterrupted one; the line a stopped run wrote for its
partial window is replaced by the full window's line. A run resumed at its last step (finished, or
killed while saving its final model) does not evaluate again when its final evaluation is logged.

The run folder. `open_run_dir` admits a run: a folder holding an earlier run's files is refused
unless the run resumes it (``--resume``) or replaces it (``--overwrite``), and temporary folders
a killed run left there are tidied. A recipe holds the folder's lock (`bertforge.train.lock.run_lock`)
around all it does with the folder, admission first: another run into that folder is refused at
once, naming the process that holds it. The run's settings (`RUN_CONFIG`) are written once the run
is admitted and, resuming, once its checkpoint's settings are found to match (`Trainer.fit`): a
refused resume leaves the folder as it was. A run that stops before ``max_steps`` marks the model
it saves with `STOP_MARKER` (`stop_marker`), which `bertforge info` and the predictor report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import random
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import nn

from bertforge.fast import prepare
from bertforge.train.distributed import Distributed, unwrap_model, wrap_model
from bertforge.io import append_text, atomic_dir, atomic_write_text, clear_stale
from bertforge.train.precision import PRECISIONS, autocast, check_precision, needs_grad_scaler, resolve_precision
from bertforge.train.optim import build_optimizer, build_schedule

__all__ = ["TrainConfig", "Task", "Trainer", "TrainResult", "checkpoints", "latest_checkpoint", "resume_point", "open_run_dir",
           "run_files", "stop_marker", "read_stop_marker", "keep_freed_memory", "task_metrics", "PRECISIONS",
           "CHECKPOINTS_DIR", "RUN_CONFIG", "STOP_MARKER"]

logger = logging.getLogger("bertforge")

CHECKPOINTS_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
STATE_PT = "trainer_state.pt"
STATE_JSON = "trainer_state.json"
STOP_MARKER = "stopped_early.json"
"""Written into the model folder of a run that stopped before max_steps: that model is not the finished one."""
RUN_FILES = (METRICS_FILE, CHECKPOINTS_DIR, "model", "curves.png")
"""The results a run writes into its folder (a recipe adds its own, e.g. fine-tuning's best/)."""
RUN_CONFIG = "run_config.json"
"""The run's settings (`Trainer` ``run_config``) as JSON: `Trainer.fit` writes them once the run is admitted and
its settings are accepted (``write_run_config``)."""
RUN_SETUP = (RUN_CONFIG, "tensorboard")
"""What a run writes before its first result: a folder holding only these is a run that failed at its start."""
_STEP_DIR = re.compile(r"^step-(\d{8})$")
SETTINGS_ABSENT_MEAN: dict[str, Any] = {"budget_minutes": 0.0, "recipe": "paper", "masked_lm_prob": None}
"""What a setting missing from a checkpoint's recorded settings means (it predates the setting), so that such a
checkpoint still resumes."""
BUDGET_WARMUP_SHARE = 0.01
"""Warmup share of a time budget when none is given: the paper's 10,000 of 1,000,000 steps."""
_CLOCK_UNITS = 1_000_000
"""A time-budget schedule's resolution: the budget in this many equal units of training time."""


@dataclass
class TrainConfig:
    """Settings of the shared training loop (defaults: the paper's pre-training).

    A warmup setting left unset (None) means "not given": `warmup` resolves it to the recipe's default,
    so a value the user gives always wins over a default, and giving both is an error."""

    DEFAULT_WARMUP_STEPS: ClassVar[int] = 10_000
    """Warmup steps when neither warmup setting is given (the paper's pre-training)."""
    DEFAULT_WARMUP_RATIO: ClassVar[float | None] = None
    """If set: warmup over this share of max_steps when neither warmup setting is given (wins over the above)."""

    batch_size: int = 256
    """Global batch: sequences per optimizer step over all processes and accumulation steps."""
    grad_accum: int = 1
    """Micro-batches per optimizer step on each process (batch_size / (processes * grad_accum) each)."""
    max_steps: int = 1_000_000
    """Optimizer steps of the run (the schedule decays to its end over them)."""
    lr: float = 1e-4
    """Peak learning rate."""
    warmup_steps: int | None = None
    """Steps of linear warmup from 0 to the peak (not given, and no --warmup-ratio: 10,000, the paper's
    pre-training; give one, not both)."""
    warmup_ratio: float | None = None
    """Warmup over this share of max_steps, instead of --warmup-steps (give one, not both)."""
    schedule: str = "linear"
    """Decay after warmup: linear (the paper), polynomial, cosine or constant."""
    power: float = 1.0
    """Exponent of the polynomial decay."""
    end_lr_ratio: float = 0.0
    """Learning rate at max_steps, as a share of the peak."""
    optimizer: str = "adamw"
    """adamw (the paper) or lamb (large batches)."""
    weight_decay: float = 0.01
    """Decoupled weight decay, not applied to LayerNorm weights and biases."""
    adam_beta1: float = 0.9
    """Adam's beta1."""
    adam_beta2: float = 0.999
    """Adam's beta2."""
    adam_eps: float = 1e-6
    """Adam's epsilon (the TF release: 1e-6)."""
    bias_correction: bool = True
    """Adam bias correction (the TF release's optimizer has none: --no-bias-correction)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0: no clipping)."""
    precision: str = "fp32"
    """fp32, bf16 (autocast; CPU and CUDA), fp16 (autocast with a gradient scaler; CUDA), or auto (bf16 where
    the device computes it natively, else fp32)."""
    compile: bool = False
    """Run the model through torch.compile."""
    device: str = "auto"
    """auto (CUDA if present), cpu, cuda or cuda:K."""
    strategy: str = "ddp"
    """With several processes: ddp, or fsdp to shard parameters and optimizer state."""
    seed: int = 12345
    """Seed of initialisation, dropout and data order."""
    checkpoint_every: int = 1000
    """Save a checkpoint every this many steps (and at the end, and on SIGINT / SIGTERM)."""
    keep_checkpoints: int = 3
    """Keep the last this many checkpoints (0: keep all)."""
    log_every: int = 10
    """Write a metrics line every this many steps."""
    eval_every: int = 1000
    """Evaluate on held-out data every this many steps (0: only at the end)."""
    max_time_minutes: float = 0.0
    """Stop (with a checkpoint) after this much training time (0: no limit)."""
    budget_minutes: float = 0.0
    """Train for this much training time, with the schedule laid over time instead of steps: warmup over
    --warmup-ratio of it, then the decay, ending when the time does (0: the schedule spans max_steps).
    max_steps still caps the steps. The learning rate then follows the clock, so a resumed run is not
    bit-identical to an uninterrupted one."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        check_precision(self.precision)
        for name in ("batch_size", "grad_accum", "max_steps", "checkpoint_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) and warmup_ratio ({self.warmup_ratio}) are both "
                             "set; set one of them")
        if self.warmup_ratio is not None and not 0.0 <= self.warmup_ratio < 1.0:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if (self.warmup_steps or 0) < 0 or self.keep_checkpoints < 0 or self.eval_every < 0:
            raise ValueError("warmup_steps, keep_checkpoints and eval_every must be >= 0")
        if not self.budget_minutes >= 0 or not math.isfinite(self.budget_minutes):
            raise ValueError(f"budget_minutes must be a finite number >= 0, got {self.budget_minutes}")
        if self.budget_minutes and self.warmup_steps is not None:
            raise ValueError(f"budget_minutes lays the schedule over time: give its warmup as warmup_ratio (a share "
                             f"of the budget), not warmup_steps ({self.warmup_steps})")

    @property
    def budget_warmup_share(self) -> float:
        """With ``budget_minutes``: the share of the budget spent on warmup."""
        if self.warmup_ratio is not None:
            return self.warmup_ratio
        return self.DEFAULT_WARMUP_RATIO if self.DEFAULT_WARMUP_RATIO is not None else BUDGET_WARMUP_SHARE

    @property
    def warmup(self) -> int:
        """The warmup steps the run takes: warmup_steps or warmup_ratio, whichever is given, else the
        recipe's default (`DEFAULT_WARMUP_STEPS` or `DEFAULT_WARMUP_RATIO`, exactly one of them set)."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        if self.warmup_ratio is not None:
            return int(self.warmup_ratio * self.max_steps)
        if self.DEFAULT_WARMUP_RATIO is not None:
            return int(self.DEFAULT_WARMUP_RATIO * self.max_steps)
        return self.DEFAULT_WARMUP_STEPS

    def micro_batch(self, world_size: int) -> int:
        """Sequences per forward pass on each process."""
        per = self.batch_size // (world_size * self.grad_accum)
        if per * world_size * self.grad_accum != self.batch_size:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by processes ({world_size}) "
                             f"x grad_accum ({self.grad_accum})")
        return per


class Task(Protocol):
    """How a recipe's batches become losses and statistics."""

    def counts(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Items each loss term averages over in ``batch`` (e.g. masked tokens), known before the forward."""

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(summed loss per term, summed statistics such as correct predictions)."""

    def metrics(self, loss_sums: dict[str, float], counts: dict[str, float], stats: dict[str, float]) -> dict[str, float]:
        """Readable metrics (accuracies, ...) from totals over a logging window."""


class BatchSource(Protocol):
    """A resumable, endless-by-epochs batch iterable (`bertforge.data.loader.PretrainingLoader`)."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainResult:
    step: int
    stopped_early: bool
    final_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    checkpoint: Path | None
    interrupted: bool = False
    """Stopped by SIGINT / SIGTERM (not by the time limit)."""
    stop_signal: int = 0
    """The signal that stopped the run (0: none)."""
    max_steps: int = 0
    """The steps the run was set to train."""

    @property
    def exit_code(self) -> int:
        """What a command ends with: 128 + the signal for a run a signal stopped early (130 for SIGINT,
        143 for SIGTERM, as a shell reports a killed command), else 0."""
        return 128 + self.stop_signal if self.stopped_early and self.stop_signal else 0


def stop_marker(result: TrainResult) -> dict[str, str]:
    """The extra file (name -> text) for the model a run saves: `STOP_MARKER` if it stopped before
    max_steps (that model is partial), else none."""
    if not result.stopped_early:
        return {}
    reason = signal.Signals(result.stop_signal).name if result.stop_signal else "time limit (max_time_minutes)"
    record = {"step": result.step, "max_steps": result.max_steps, "reason": reason,
              "note": "training stopped early: a partial model; continue the run with --resume"}
    return {STOP_MARKER: json.dumps(record, indent=1) + "\n"}


def read_stop_marker(folder: str | Path) -> dict[str, Any] | None:
    """The `STOP_MARKER` record of a model folder (None: no marker, a finished model)."""
    path = Path(folder) / STOP_MARKER
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    return record if isinstance(record, dict) else {"note": f"{path} is unreadable"}


def checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of a run's complete checkpoints, oldest first (temporary, half-written ones are ignored)."""
    folder = Path(run_dir) / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in folder.iterdir()
                  if (m := _STEP_DIR.match(p.name)) and (p / STATE_PT).is_file())


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder of a run (temporary, half-written ones are ignored)."""
    found = checkpoints(run_dir)
    return found[-1][1] if found else None


def run_files(run_dir: str | Path, outputs: tuple[str, ...] = (), names: tuple[str, ...] = RUN_FILES) -> list[str]:
    """The non-empty files and folders of an earlier run's results in ``run_dir`` (``names`` and
    ``outputs``); folders end in "/"."""
    folder = Path(run_dir)
    found = []
    for name in dict.fromkeys((*names, *outputs)):
        p = folder / name
        if (p.is_file() and p.stat().st_size) or (p.is_dir() and any(p.iterdir())):
            found.append(name + ("/" if p.is_dir() else ""))
    return found


def open_run_dir(run_dir: str | Path, resume: bool, overwrite: bool = False, *, outputs: tuple[str, ...] = (),
                 dist: Distributed | None = None) -> Path | None:
    """Admit a run into ``run_dir`` and return the checkpoint it continues from (None: a fresh start).

    A folder holding an earlier run's files (`run_files`) is refused, with what it holds and the two
    ways on: ``resume`` continues from its newest checkpoint, ``overwrite`` deletes those files first.
    Its files are untouched when refused: starting afresh over them would mix two runs' metrics and
    replace a finished model. Then temporary folders that killed writes left (`bertforge.io.clear_stale`)
    are tidied. Every process calls this; only the main one changes the folder.

    The caller holds the folder's lock (`bertforge.train.lock.run_lock`) from before this call until the
    run's end: the lock keeps other runs out, and this call takes none.
    """
    dist = dist or Distributed()
    folder = Path(run_dir)
    if resume and overwrite:
        raise ValueError("--resume continues the run in --out and --overwrite deletes it: pass one of them")
    held = run_files(folder, outputs)
    latest = latest_checkpoint(folder)
    if resume and latest is None:
        hint = f" (it holds {', '.join(held)}; pass --overwrite to start afresh there)" if held else ""
        raise ValueError(f"--resume: {folder} has no complete checkpoint to resume from{hint}")
    if not resume and not overwrite and held:
        how = (f"pass --resume to continue it from {latest.relative_to(folder)}" if latest is not None
               else "it has no checkpoint to resume from")
        raise ValueError(f"{folder} already holds a previous run's files ({', '.join(held)}); {how}, "
                         "--overwrite to delete them and start afresh, or use a new --out")
    dist.barrier()  # every process has looked before the main one changes anything
    if dist.is_main:
        if overwrite and held:
            logger.warning("--overwrite: deleting the previous run's %s in %s", ", ".join(held), folder)
        # a fresh start also drops what a run that failed before its first result left (settings, events)
        for name in (held + run_files(folder, names=RUN_SETUP)) if not resume else []:
            p = folder / name.rstrip("/")
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
        names = set(RUN_FILES) | set(RUN_SETUP) | set(outputs)
        for p in clear_stale(folder, lambda name: name in names) + clear_stale(folder / CHECKPOINTS_DIR,
                                                                             _STEP_DIR.match):
            logger.info("removed %s, left by a run that was killed", p)
    dist.barrier()
    return latest_checkpoint(folder) if resume else None


def resume_point(run_dir: str | Path, resume: bool) -> Path | None:
    """`open_run_dir` without ``overwrite``, in one process."""
    return open_run_dir(run_dir, resume)


def _rng_state() -> dict[str, Any]:
    # numpy's key array goes in as a tensor: torch.load(weights_only=True) refuses numpy arrays.
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of returning large blocks to the OS.

    A training step allocates the same large buffers every time (the word-embedding gradient alone
    is V x H floats, 94 MB at BERT-base); by default glibc maps each afresh and unmaps it when
    freed, so every step pays page faults on all of them again. Measured on a 2-core VM: about 10% of
    a BERT-base CPU step. Process-wide; a no-op (False) where the C library is not glibc.
    """
    import ctypes
    import ctypes.util
    import platform

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


def task_metrics(task: Task, loss_sums: dict[str, float], counts: dict[str, float], stats: dict[str, float],
                 per_term: bool = True) -> dict[str, float]:
    """Totals over a window (or an evaluation) -> ``loss`` (the sum of each term's mean), each term's
    mean as ``<term>_loss`` (with ``per_term``), and the task's own metrics."""
    means = {k: v / max(counts.get(k, 0.0), 1.0) for k, v in loss_sums.items()}
    out = {"loss": sum(means.values())}
    if per_term:
        out.update({f"{k}_loss": v for k, v in means.items()})
    return {**out, **task.metrics(loss_sums, counts, stats)}


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    # Significant digits, not decimals: a learning rate of 1e-4 during warmup is far below 1e-6.
    return {k: (float(f"{v:.8g}") if isinstance(v, float) and math.isfinite(v) else v) for k, v in metrics.items()}


def _empty_window() -> dict[str, Any]:
    """A logging window: this process's loss and statistic sums, the global counts, tokens, seconds, steps."""
    return {"loss": {}, "count": {}, "stat": {}, "tokens": 0.0, "seconds": 0.0, "steps": 0}


def _to_device(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


class _Stop:
    """SIGINT / SIGTERM set a flag the loop checks between steps (a second SIGINT interrupts at once)."""

    def __init__(self) -> None:
        self.requested = False
        self.signum = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_Stop":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handlers, the run stops only at its end
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signum = self.signum or signum
        logger.warning("signal %d: saving a checkpoint after this step, then stopping", signum)

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _warmup_rule(steps: int | None, ratio: float | None, cfg: TrainConfig) -> tuple[str, float]:
    """The warmup settings ``steps`` / ``ratio`` (None: not given) resolved as ``cfg``'s recipe resolves
    them: ("steps", n) or ("ratio", share of max_steps)."""
    if steps is not None:
        return "steps", steps
    if ratio is not None:
        return "ratio", ratio
    if cfg.DEFAULT_WARMUP_RATIO is not None:
        return "ratio", cfg.DEFAULT_WARMUP_RATIO
    return "steps", cfg.DEFAULT_WARMUP_STEPS


def _differences(saved: Mapping[str, Any], current: Mapping[str, Any], absent: Mapping[str, Any],
                 skip: tuple[str, ...], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(name, recorded, now) of every setting outside ``skip`` that differs between two records, a
    setting missing from one meaning ``absent[name]``. A nested record (a model's config) is compared
    field by field, so a difference names the fields ("model_config.hidden_size"), not the whole
    record. Top-level settings come first."""
    out = []
    for k in sorted(set(saved) | set(current)):
        name = prefix + k
        if name in skip:
            continue
        was, now = saved.get(k, absent.get(name)), current.get(k, absent.get(name))
        if isinstance(was, Mapping) and isinstance(now, Mapping):
            out += _differences(was, now, absent, skip, name + ".")
        elif was != now:
            out.append((name, was, now))
    return sorted(out, key=lambda d: "." in d[0]) if not prefix else out


def _warmup_hint(steps: int | None, ratio: float | None, given_steps: int | None, given_ratio: float | None) -> str:
    """What to pass to resume a run recorded with warmup settings ``steps`` / ``ratio`` (None: not given)
    when this one was given ``given_steps`` / ``given_ratio``."""
    if steps is not None:
        return f"pass --warmup-steps {steps}" + (" instead of --warmup-ratio" if given_ratio is not None else "")
    if ratio is not None:
        return f"pass --warmup-ratio {ratio}" + (" instead of --warmup-steps" if given_steps is not None else "")
    return "give neither --warmup-steps nor --warmup-ratio"


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Trainer:
    """Trains ``model`` on ``batches`` with ``task``; writes metrics and checkpoints into ``out_dir``.

    ``run_config`` (any JSON-able dict, e.g. the recipe's config) is stored with every checkpoint;
    resuming with a config that differs outside ``resumable_changes`` is an error naming the fields.
    ``settings_absent_mean``: what a setting missing from a record means for this recipe, on top of
    `SETTINGS_ABSENT_MEAN` (``"a.b"`` names field ``b`` of a nested record ``a``).
    ``write_run_config``: `fit` writes ``run_config`` into ``out_dir`` (`RUN_CONFIG`) once a resumed
    checkpoint's settings are found to match (at once on a fresh start), so that a refused resume leaves
    the run's record as it was.
    ``evaluate(model, step) -> metrics`` runs every ``eval_every`` steps and at the end, on every process.
    """

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        batches: BatchSource,
        config: TrainConfig,
        out_dir: str | Path,
        *,
        dist: Distributed | None = None,
        evaluate: Callable[[nn.Module, int], dict[str, float]] | None = None,
        tokenizer: Any = None,
        run_config: dict[str, Any] | None = None,
        resumable_changes: tuple[str, ...] = ("max_steps", "checkpoint_every", "keep_checkpoints", "log_every",
                                              "eval_every", "max_time_minutes", "progress", "compile",
                                              "warmup_steps_used"),
        settings_absent_mean: Mapping[str, Any] | None = None,
        write_run_config: bool = False,
    ):
        self.cfg = config
        self.dist = dist or Distributed()
        self.task = task
        self.batches = batches
        self.evaluate_fn = evaluate
        self.tokenizer = tokenizer
        self.out = Path(out_dir)
        self.run_config = run_config if run_config is not None else dataclasses.asdict(config)
        self.resumable_changes = resumable_changes
        self.settings_absent_mean = {**SETTINGS_ABSENT_MEAN, **(settings_absent_mean or {})}
        self.write_run_config = write_run_config
        self.micro_batch = config.micro_batch(self.dist.world_size)
        self.device = self.dist.device
        if self.device.type == "cpu":
            keep_freed_memory()

        # the bare model (saving, evaluation), with the speed paths of `bertforge.fast` (the state dict unchanged)
        self.model = prepare(unwrap_model(model).to(self.device))
        wrapped = wrap_model(self.model, self.dist, config.strategy)
        self.fsdp = self.dist.enabled and config.strategy == "fsdp"
        self.optimizer = build_optimizer(
            wrapped, config.optimizer, lr=config.lr, weight_decay=config.weight_decay,
            betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
            bias_correction=config.bias_correction)
        self.elapsed = 0.0  # training seconds, carried across resumes
        if config.budget_minutes:  # the schedule follows the training clock: the decay ends when the time does
            self.scheduler = build_schedule(
                self.optimizer, clock=self._clock, total_steps=_CLOCK_UNITS,
                warmup_steps=int(config.budget_warmup_share * _CLOCK_UNITS), schedule=config.schedule,
                power=config.power, end_factor=config.end_lr_ratio)
        else:
            self.scheduler = build_schedule(self.optimizer, total_steps=config.max_steps, warmup_steps=config.warmup,
                                            schedule=config.schedule, power=config.power,
                                            end_factor=config.end_lr_ratio)
        self.wrapped = wrapped
        self.train_model = torch.compile(wrapped) if config.compile else wrapped
        self.ddp = isinstance(wrapped, nn.parallel.DistributedDataParallel)

        self.precision = resolve_precision(config.precision, self.device)  # fp32, bf16 or fp16 from here on
        if config.precision == "auto" and self.dist.enabled:  # each process timed its own CPU: bf16 only if all did
            votes = self.dist.all_reduce_sum(torch.tensor([float(self.precision == "bf16")], device=self.device))
            self.precision = "bf16" if int(votes.item()) == self.dist.world_size else "fp32"
        self.scaler = torch.amp.GradScaler("cuda") if needs_grad_scaler(self.precision) else None
        self.step = 0
        self._window = _empty_window()
        self._logged_eval: dict[str, Any] | None = None  # the eval line already logged at the step resumed from

    def _clock(self, step: int) -> int:
        """The time-budget schedule's position: the training time spent, in `_CLOCK_UNITS` of the budget."""
        return min(_CLOCK_UNITS, int(self.elapsed / (self.cfg.budget_minutes * 60) * _CLOCK_UNITS))

    def advance_clock(self, seconds: float) -> None:
        """Count ``seconds`` more training time; a time-budget schedule sets the next step's rate from it."""
        self.elapsed += seconds
        self._follow_clock()

    def _follow_clock(self) -> None:
        """A time-budget schedule: the next step's learning rate from the training time spent."""
        if self.cfg.budget_minutes:
            self._apply_schedule()

    def _apply_schedule(self) -> None:
        """Set the optimizer's learning rates to what the schedule gives now (its position and, under a
        time budget, the clock), and the rate the loop logs with them."""
        self.scheduler._last_lr = []  # type: ignore[attr-defined]
        for group, base, factor in zip(self.optimizer.param_groups, self.scheduler.base_lrs,
                                       self.scheduler.lr_lambdas):
            group["lr"] = base * factor(self.scheduler.last_epoch)
            self.scheduler._last_lr.append(group["lr"])  # type: ignore[attr-defined]

    def budget_spent(self) -> bool:
        """Whether a time-budget run has used its budget."""
        return bool(self.cfg.budget_minutes) and self.elapsed >= self.cfg.budget_minutes * 60

    # ------------------------------------------------------------------ checkpoints
    def _state_dicts(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Full (unsharded) model and optimizer state; a collective call under FSDP."""
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

            return get_state_dict(self.model, self.optimizer,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.model.state_dict(), self.optimizer.state_dict()

    def save_model(self, folder: str | Path, extra_files: dict[str, str] | None = None) -> None:
        """Write the model (and tokenizer, and ``extra_files``: name -> text) as a checkpoint folder,
        replacing ``folder`` whole and atomically; every process must call this."""
        from bertforge.model.checkpoint import save_pretrained

        weights = None
        if self.fsdp:  # each process holds a shard: gathering the full weights is a collective call
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.dist.is_main:
            with atomic_dir(folder) as tmp:
                save_pretrained(self.model, tmp, tokenizer=self.tokenizer, state_dict=weights)
                for name, text in (extra_files or {}).items():
                    atomic_write_text(tmp / name, text)
        self.dist.barrier()

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step (every process must call this)."""
        rngs = self.dist.gather_objects(_rng_state())
        window = self._window_state()
        model_state, optim_state = self._state_dicts()
        final = self.out / CHECKPOINTS_DIR / f"step-{self.step:08d}"
        if self.dist.is_main:
            from bertforge.model.checkpoint import save_pretrained

            with atomic_dir(final) as tmp:  # the same step saved again (a resumed run) is swapped in
                save_pretrained(self.model, tmp, tokenizer=self.tokenizer, state_dict=model_state)
                state = {
                    "step": self.step,
                    "elapsed": self.elapsed,
                    "optimizer": optim_state,
                    "scheduler": self.scheduler.state_dict(),
                    "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                    "rng": rngs,
                    "batches": self.batches.state_dict(),
                    "world_size": self.dist.world_size,
                    "log_window": window,
                }
                torch.save(state, tmp / STATE_PT)
                info = {"step": self.step, "elapsed_seconds": round(self.elapsed, 3),
                        "world_size": self.dist.world_size, "batches": self.batches.state_dict(),
                        "run_config": self.run_config}
                atomic_write_text(tmp / STATE_JSON, json.dumps(info, indent=1, default=str) + "\n")
            self._prune()
        self.dist.barrier()
        return final

    def _prune(self) -> None:
        folder = self.out / CHECKPOINTS_DIR
        if self.cfg.keep_checkpoints:
            done = sorted(p for p in folder.iterdir() if _STEP_DIR.match(p.name))
            for old in done[: -self.cfg.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
        for stale in [*folder.glob(".step-*.tmp-*"), *folder.glob(".step-*.old-*")]:  # left by a crashed save
            shutil.rmtree(stale, ignore_errors=True)

    def load_checkpoint(self, folder: str | Path) -> None:
        """Continue from a checkpoint folder written by `save_checkpoint`."""
        from bertforge.model.checkpoint import CheckpointError, read_state_dict

        folder = Path(folder)
        info_path, state_path = folder / STATE_JSON, folder / STATE_PT
        if not state_path.is_file() or not info_path.is_file():
            raise CheckpointError(f"{folder}: not a training checkpoint (no {STATE_PT} / {STATE_JSON})")
        info = json.loads(info_path.read_text(encoding="utf-8"))
        self._check_compatible(info.get("run_config", {}), folder)
        try:
            state = torch.load(state_path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any failure means an unreadable file
            raise CheckpointError(f"{state_path}: unreadable training state: {e}") from e
        if state["world_size"] != self.dist.world_size:
            logger.warning("%s was written by %d processes, resuming with %d: the data order is the same "
                           "(global batches), dropout draws differ", folder, state["world_size"], self.dist.world_size)
        weights = read_state_dict(folder)
        expected = self.model.state_dict()
        bad = sorted(k for k in expected if k not in weights or weights[k].shape != expected[k].shape)
        if bad:
            raise CheckpointError(f"{folder}: its weights do not fit this model ({', '.join(bad[:8])}"
                                  f"{' ...' if len(bad) > 8 else ''})")
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(self.model, self.optimizer, model_state_dict=weights,
                           optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True))
        else:
            self.model.load_state_dict({k: weights[k] for k in expected})
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.elapsed = float(state.get("elapsed", 0.0))  # a time-budget schedule reads it
        # The saved optimizer holds the lr of the saved run's schedule; max_steps may have changed
        # since (a run extended), so the next step's lr comes from this run's schedule.
        self._apply_schedule()
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.batches.load_state_dict(state["batches"])
        rngs = state["rng"]
        _set_rng_state(rngs[self.dist.rank] if self.dist.rank < len(rngs) else rngs[0])
        self.step = int(state["step"])
        self._load_window(state.get("log_window"))
        if self.dist.is_main:
            logger.info("resumed from %s at step %d", folder, self.step)

    def _window_state(self) -> dict[str, Any]:
        """The open logging window with every process's loss and statistic sums added up (a collective
        call): a run resumed on any number of processes continues the same totals."""
        w = self._window
        names = sorted(w["loss"]), sorted(w["stat"])
        local = torch.tensor([w["loss"][k] for k in names[0]] + [w["stat"][k] for k in names[1]] + [w["tokens"]],
                             dtype=torch.float64, device=self.device)
        total = self.dist.all_reduce_sum(local).tolist()
        return {"loss": dict(zip(names[0], total)), "stat": dict(zip(names[1], total[len(names[0]):])),
                "count": dict(w["count"]), "tokens": total[-1], "seconds": w["seconds"], "steps": w["steps"]}

    def _load_window(self, saved: dict[str, Any] | None) -> None:
        """Reopen the logging window of a checkpoint: the main process holds its summed totals, the
        others zeros (the next line adds every process's sums); counts are global already."""
        self._window = _empty_window()
        if not saved:  # a checkpoint without one: the window starts afresh
            return
        main = self.dist.is_main
        self._window.update({
            "loss": {k: float(v) if main else 0.0 for k, v in saved["loss"].items()},
            "stat": {k: float(v) if main else 0.0 for k, v in saved["stat"].items()},
            "count": {k: float(v) for k, v in saved["count"].items()},
            "tokens": float(saved["tokens"]) if main else 0.0,
            "seconds": float(saved["seconds"]), "steps": int(saved["steps"])})

    def _check_compatible(self, saved: dict[str, Any], folder: Path) -> None:
        steps, ratio = saved.get("warmup_steps"), saved.get("warmup_ratio")
        if steps is not None and ratio is not None:
            # Recorded before a warmup setting could be left unset: both were always recorded, and the ratio
            # won when above 0. The same warmup as this run's (the earlier default 10,000 steps against
            # today's unset default, say) is no change; another one is recorded as given.
            given = (self.run_config.get("warmup_steps"), self.run_config.get("warmup_ratio"))
            recorded = (None, ratio) if ratio > 0 else (steps, None)
            if _warmup_rule(*recorded, self.cfg) == _warmup_rule(*given, self.cfg):
                recorded = given
            saved = {**saved, "warmup_steps": recorded[0], "warmup_ratio": recorded[1]}
        changed = _differences(saved, self.run_config, self.settings_absent_mean, self.resumable_changes)
        if not changed:
            return
        details = "; ".join(f"{k}: {_short(was)} -> {_short(now)}" for k, was, now in changed[:8])
        end = "use the original settings or a new output folder"
        warmup = ("warmup_steps", "warmup_ratio")
        if any(k in warmup for k, _, _ in changed):
            hint = _warmup_hint(*(saved.get(k) for k in warmup), *(self.run_config.get(k) for k in warmup))
            rest = "" if all(k in warmup for k, _, _ in changed) else " and the other settings as they were"
            end = f"{hint}{rest} to resume this run, or use a new output folder"
        raise ValueError(f"cannot resume from {folder}: the run's settings differ ({details}); {end}")

    # ------------------------------------------------------------------ metrics
    def _log(self, record: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        append_text(self.out / METRICS_FILE, json.dumps(record) + "\n")
        if self._tb is not None:
            split = record["split"]
            for k, v in record.items():
                if isinstance(v, (int, float)) and k not in ("step", "split"):
                    self._tb.add_scalar(f"{split}/{k}", v, record["step"])

    def _open_tensorboard(self) -> Any:
        if not self.dist.is_main:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional
            return None
        return SummaryWriter(str(self.out / "tensorboard"))

    def _truncate_metrics(self) -> None:
        """Drop metrics logged after the step training starts from (a run that went on past its last
        checkpoint before it was killed), and the line of a partial window that training continues,
        so the file holds one history; note the eval line at that step, if any."""
        path = self.out / METRICS_FILE
        if not path.is_file():
            return
        reopened = self._window["steps"] > 0 and self.step < self.cfg.max_steps and not self.budget_spent()
        kept = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                step, split = record["step"], record["split"]
            except (json.JSONDecodeError, KeyError, TypeError):  # a line cut by a crash
                continue
            if step > self.step or (reopened and step == self.step and split == "train"):
                continue
            if step == self.step and split == "eval":
                self._logged_eval = {k: v for k, v in record.items() if k not in ("split", "step", "time")}
            kept.append(line)
        atomic_write_text(path, "".join(line + "\n" for line in kept))

    def _final_evaluation(self, trained: bool) -> dict[str, float]:
        """The evaluation at the end of training, run once per step: a run that took no step here
        (resumed at its last step) reuses the eval line it already logged there."""
        logged = None if trained else self._logged_eval
        if not trained:  # every process must agree (the evaluation is a collective call)
            flag = torch.tensor([float(logged is not None)], device=self.device)
            if self.dist.all_reduce_sum(flag).item() > 0:
                return dict(logged or {})
        return self.run_evaluation()

    def run_evaluation(self) -> dict[str, float]:
        if self.evaluate_fn is None:
            return {}
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast():
                metrics = self.evaluate_fn(self.model, self.step)  # under FSDP, the sharded model itself
        finally:
            self.model.train()
        metrics = _rounded(metrics)
        self._log({"split": "eval", "step": self.step, "time": round(self.elapsed, 3), **metrics})
        return metrics

    def _autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.precision, self.device)

    # ------------------------------------------------------------------ the loop
    def _micro_batches(self, it: Iterator) -> tuple[list[dict[str, torch.Tensor]], Iterator]:
        out: list[dict[str, torch.Tensor]] = []
        new_epoch = False
        while len(out) < self.cfg.grad_accum:
            try:
                out.append(next(it))
            except StopIteration:  # end of an epoch: the source continues with the next one
                if new_epoch:
                    raise ValueError(f"an epoch of the training data holds fewer than grad_accum "
                                     f"({self.cfg.grad_accum}) micro-batches") from None
                # An epoch's last micro-batches that do not fill a step are dropped, as a source
                # batching the whole step at once drops them: accumulation leaves the data order as is.
                out, it, new_epoch = [], iter(self.batches), True
        return out, it

    def train_step(self, micro: list[dict[str, torch.Tensor]]) -> tuple[dict[str, float], dict[str, float], dict[str, float], float]:
        """One optimizer step over ``micro`` (this process's micro-batches).

        Returns this process's loss sums and stats, the step's global counts, and the gradient norm."""
        counts_local: dict[str, float] = {}
        for b in micro:
            for k, v in self.task.counts(b).items():
                counts_local[k] = counts_local.get(k, 0.0) + float(v)
        names = sorted(counts_local)
        counts_t = self.dist.all_reduce_sum(torch.tensor([counts_local[k] for k in names], dtype=torch.float64,
                                                         device=self.device))
        counts = dict(zip(names, counts_t.tolist()))
        loss_sums: dict[str, float] = {}
        stats: dict[str, float] = {}
        sums_acc: list[torch.Tensor] = []
        keys: list[str] | None = None
        for i, b in enumerate(micro):
            b = _to_device(b, self.device)
            # DDP averages gradients only on the last micro-batch of the step.
            sync = self.wrapped.no_sync() if self.ddp and i < len(micro) - 1 else contextlib.nullcontext()
            with sync:
                with self._autocast():
                    terms, st = self.task.forward(self.train_model, b)
                    loss = sum(terms[k] / max(counts[k], 1.0) for k in terms) * self.dist.world_size
                if self.scaler is not None:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
            # Totals stay on the device until the step's end: one transfer, no sync per micro-batch.
            if keys is None:
                keys = [f"loss:{k}" for k in terms] + [f"stat:{k}" for k in st]
            sums_acc.append(torch.stack([t.detach().float() for t in terms.values()]
                                        + [s.detach().float() for s in st.values()]))
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.cfg.max_grad_norm > 0:
            # foreach: PyTorch picks it on GPUs by itself; on CPU it saves a call per parameter
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm,
                                                       foreach=True if self.device.type == "cpu" else None)
        else:
            grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        totals = torch.stack(sums_acc).sum(0).tolist()
        for key, value in zip(keys or [], totals):
            kind, name = key.split(":", 1)
            (loss_sums if kind == "loss" else stats)[name] = value
        return loss_sums, stats, counts, float(grad_norm)

    def fit(self, resume_from: str | Path | None = None) -> TrainResult:
        """Train until ``max_steps`` (or the time limit, or a signal); return the final state."""
        cfg = self.cfg
        if resume_from is not None:
            self.load_checkpoint(resume_from)  # refused if the settings differ: nothing written yet
        start = self.step
        if self.dist.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            if self.write_run_config:
                atomic_write_text(self.out / RUN_CONFIG, json.dumps(self.run_config, indent=1, default=str) + "\n")
            self._truncate_metrics()
        self._tb = self._open_tensorboard()
        self.model.train()
        bar = None
        if cfg.progress and self.dist.is_main:
            from tqdm.auto import tqdm

            bar = (tqdm(total=round(cfg.budget_minutes * 60), initial=round(self.elapsed), desc="train", unit="s",
                        bar_format="{l_bar}{bar}| {n:.0f}/{total} s [{elapsed}<{remaining}{postfix}]",
                        dynamic_ncols=True) if cfg.budget_minutes else
                   tqdm(total=cfg.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True))
        window = self._window
        last_ckpt: Path | None = None
        eval_metrics: dict[str, float] = {}
        final: dict[str, float] = {}
        stopped_early = False
        it = iter(self.batches)
        with _Stop() as stop:
            while self.step < cfg.max_steps and not self.budget_spent():
                t0 = time.perf_counter()
                micro, it = self._micro_batches(it)
                tokens = sum(float(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()
                             for b in micro)
                loss_sums, stats, counts, grad_norm = self.train_step(micro)
                self.step += 1
                dt = time.perf_counter() - t0
                self.elapsed += dt
                window["seconds"] += dt
                window["tokens"] += tokens
                window["steps"] += 1
                for k, v in loss_sums.items():
                    window["loss"][k] = window["loss"].get(k, 0.0) + v
                for k, v in counts.items():
                    window["count"][k] = window["count"].get(k, 0.0) + v
                for k, v in stats.items():
                    window["stat"][k] = window["stat"].get(k, 0.0) + v
                stop_now = stop.requested or (cfg.max_time_minutes > 0 and self.elapsed >= cfg.max_time_minutes * 60)
                if self.dist.enabled:  # every process stops at the same step, on the same clock
                    flag = self.dist.all_reduce_sum(torch.tensor([float(stop_now), self.elapsed], device=self.device,
                                                                 dtype=torch.float64))
                    stop_now, self.elapsed = bool(flag[0].item() > 0), flag[1].item() / self.dist.world_size
                self._follow_clock()  # after the processes agree on the clock: the same rate on every one
                finished = self.step >= cfg.max_steps or self.budget_spent()
                done = finished or stop_now
                if self.step % cfg.log_every == 0 or done:  # a stopped run logs its last steps too
                    final = self._log_train(window, grad_norm, bar)
                if self.step % cfg.log_every == 0:  # a partial window stays open: a resumed run continues it
                    window = self._window = _empty_window()
                if bar is not None:
                    bar.update(dt if cfg.budget_minutes else 1)
                if cfg.eval_every and self.step % cfg.eval_every == 0 and not done:
                    eval_metrics = self.run_evaluation()
                if self.step % cfg.checkpoint_every == 0 or done:
                    last_ckpt = self.save_checkpoint()
                if stop_now:
                    stopped_early = not finished
                    break
        if bar is not None:
            bar.close()
        if not stop.requested:
            eval_metrics = self._final_evaluation(trained=self.step > start) or eval_metrics
        if self._tb is not None:
            self._tb.close()
        return TrainResult(step=self.step, stopped_early=stopped_early, final_metrics=final,
                           eval_metrics=eval_metrics, checkpoint=last_ckpt, interrupted=stop.requested,
                           stop_signal=stop.signum, max_steps=cfg.max_steps)

    def _log_train(self, window: dict[str, Any], grad_norm: float, bar: Any) -> dict[str, float]:
        tokens, seconds = window["tokens"], window["seconds"]
        names = sorted(window["loss"]) + sorted(window["stat"])
        local = torch.tensor([window["loss"][k] for k in sorted(window["loss"])]
                             + [window["stat"][k] for k in sorted(window["stat"])] + [tokens], dtype=torch.float64,
                             device=self.device)
        total = self.dist.all_reduce_sum(local).tolist()
        values = dict(zip(names, total))
        loss_sums = {k: values[k] for k in window["loss"]}
        stats = {k: values[k] for k in window["stat"]}
        metrics: dict[str, float] = {
            **task_metrics(self.task, loss_sums, window["count"], stats, per_term=len(loss_sums) > 1),
            "lr": self.scheduler.get_last_lr()[0],
            "grad_norm": grad_norm,
            "tokens_per_s": total[-1] / max(seconds, 1e-9),
        }
        metrics = _rounded(metrics)
        self._log({"split": "train", "step": self.step, "time": round(self.elapsed, 3), **metrics})
        if bar is not None:
            shown = {k: metrics[k] for k in ("loss", "mlm_accuracy", "nsp_accuracy", "accuracy") if k in metrics}
            bar.set_postfix({**{k: f"{v:.4f}" for k, v in shown.items()}, "lr": f"{metrics['lr']:.2e}",
                             "tok/s": f"{metrics['tokens_per_s']:,.0f}"}, refresh=False)
        return metrics
