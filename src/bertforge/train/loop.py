"""The one training loop, shared by pre-training and every fine-tuning task.

A recipe (`bertforge.train.recipe.Recipe`: pre-training, fine-tuning) hands the `Trainer` a model ready
to train (the speed layer and distributed wrapping applied), a `Objective` (how a batch becomes loss terms and
statistics), a resumable batch source and, optionally, an evaluation; the loop owns everything around
them: gradient accumulation, mixed precision, clipping, the optimizer and schedule, checkpoints, resume,
signals, logging and the progress bar.

Loss normalisation. A task returns each loss term as a *sum* (e.g. summed MLM cross-entropy) and
says beforehand how many items each term averages over (`Objective.counts`). The loop divides each sum
by its count over the whole optimizer step (every micro-batch on every process), so the gradient is
the one of a single big batch whatever the number of processes or accumulation steps, even though
micro-batches hold different numbers of masked tokens. (A mean per micro-batch, averaged again by
DDP, would weight the tokens of short micro-batches more.)

Checkpoints. ``OUT/checkpoints/step-NNNNNNNN/`` is a normal checkpoint folder plus the trainer's state
(`bertforge.train.state`). A folder is written under a temporary name and renamed when complete
(`bertforge.io.atomic_dir`), so a crash or ``kill -9`` at any moment leaves every earlier checkpoint
intact; only then are checkpoints beyond the last ``keep_checkpoints`` removed. SIGINT / SIGTERM finish
the current step, save and stop.

Metrics. ``OUT/metrics.jsonl`` holds one history, whatever the interruptions: a train line at every
multiple of ``log_every`` over the steps since the previous multiple (plus one at the step a run stops
at), and one eval line per evaluation. The sums of the open logging window (`LogWindow`) are part of the
checkpoint, so a resumed run logs the same windows as an uninterrupted one; the line a stopped run wrote
for its partial window is replaced by the full window's line. A run resumed at its last step (finished,
or killed while saving its final model) does not evaluate again when its final evaluation is logged.

The run folder (`bertforge.train.rundir`) is admitted by the recipe. The run's settings (`RUN_CONFIG`)
are written once its checkpoint's settings are found to match (`Trainer.fit`, at once on a fresh start):
a refused resume leaves the folder as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from bertforge.io import append_text, atomic_dir, atomic_write_text
from bertforge.train.distributed import Distributed, unwrap_model
from bertforge.train.optim import build_optimizer, build_schedule
from bertforge.train.precision import PRECISIONS, autocast, check_precision, needs_grad_scaler, resolve_precision
from bertforge.train.rundir import METRICS_FILE, RUN_CONFIG, checkpoint_dir, prune_checkpoints
from bertforge.train.state import (SETTINGS_ABSENT_MEAN, check_compatible, read_info, read_state, rng_state,
                                   set_rng_state, write_state)

__all__ = ["TrainConfig", "Objective", "Trainer", "TrainResult", "LogWindow", "keep_freed_memory", "objective_metrics",
           "PRECISIONS"]

logger = logging.getLogger("bertforge")

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
    STEPS_FROM_DATA: ClassVar[bool] = False
    """Whether max_steps 0 means "set from the data" (fine-tuning's epochs) rather than an error."""
    RESUMABLE: ClassVar[tuple[str, ...]] = ("max_steps", "checkpoint_every", "keep_checkpoints", "log_every",
                                            "eval_every", "max_time_minutes", "progress", "compile",
                                            "warmup_steps_used")
    """Recorded settings a resumed run may change (the rest must match its checkpoint's); a recipe's config
    class extends them with its own."""

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
    """Decay after warmup: linear (the paper), polynomial, cosine or constant; or range, a learning-rate range
    test: the rate rises geometrically from 1/10,000 of --lr to --lr over the run (no warmup)."""
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
            value = getattr(self, name)
            if value < 1 and not (name == "max_steps" and value == 0 and self.STEPS_FROM_DATA):
                raise ValueError(f"{name} must be >= 1, got {value}")
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


class Objective(Protocol):
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


def objective_metrics(objective: Objective, loss_sums: dict[str, float], counts: dict[str, float], stats: dict[str, float],
                 per_term: bool = True) -> dict[str, float]:
    """Totals over a window (or an evaluation) -> ``loss`` (the sum of each term's mean), each term's
    mean as ``<term>_loss`` (with ``per_term``), and the task's own metrics."""
    means = {k: v / max(counts.get(k, 0.0), 1.0) for k, v in loss_sums.items()}
    out = {"loss": sum(means.values())}
    if per_term:
        out.update({f"{k}_loss": v for k, v in means.items()})
    return {**out, **objective.metrics(loss_sums, counts, stats)}


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    # Significant digits, not decimals: a learning rate of 1e-4 during warmup is far below 1e-6.
    return {k: (float(f"{v:.8g}") if isinstance(v, float) and math.isfinite(v) else v) for k, v in metrics.items()}


@dataclass
class LogWindow:
    """The steps since the last metrics line: this process's loss and statistic sums and tokens, the
    global counts, and the window's seconds and steps."""

    loss: dict[str, float] = field(default_factory=dict)
    count: dict[str, float] = field(default_factory=dict)
    stat: dict[str, float] = field(default_factory=dict)
    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def add(self, loss_sums: Mapping[str, float], counts: Mapping[str, float], stats: Mapping[str, float],
            tokens: float, seconds: float) -> None:
        """Count one optimizer step."""
        self.seconds += seconds
        self.tokens += tokens
        self.steps += 1
        for sums, step in ((self.loss, loss_sums), (self.count, counts), (self.stat, stats)):
            for k, v in step.items():
                sums[k] = sums.get(k, 0.0) + v

    def reduced(self, dist: Distributed, device: torch.device) -> LogWindow:
        """The window with every process's loss sums, statistic sums and tokens added up (a collective
        call; counts are global already)."""
        loss, stat = sorted(self.loss), sorted(self.stat)
        local = torch.tensor([self.loss[k] for k in loss] + [self.stat[k] for k in stat] + [self.tokens],
                             dtype=torch.float64, device=device)
        values = dist.all_reduce_sum(local).tolist()
        total = dict(zip(loss + stat, values))
        return LogWindow({k: total[k] for k in self.loss}, dict(self.count), {k: total[k] for k in self.stat},
                         values[-1], self.seconds, self.steps)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's record of a reduced window."""
        return {"loss": {k: self.loss[k] for k in sorted(self.loss)},
                "stat": {k: self.stat[k] for k in sorted(self.stat)},
                "count": dict(self.count), "tokens": self.tokens, "seconds": self.seconds, "steps": self.steps}

    @classmethod
    def from_state(cls, saved: Mapping[str, Any] | None, main: bool) -> LogWindow:
        """Reopen a checkpoint's window: the main process holds its summed totals, the others zeros (the
        next line adds every process's sums); counts are global already. None: a window starting afresh."""
        if not saved:
            return cls()
        return cls(loss={k: float(v) if main else 0.0 for k, v in saved["loss"].items()},
                   count={k: float(v) for k, v in saved["count"].items()},
                   stat={k: float(v) if main else 0.0 for k, v in saved["stat"].items()},
                   tokens=float(saved["tokens"]) if main else 0.0,
                   seconds=float(saved["seconds"]), steps=int(saved["steps"]))


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


class Trainer:
    """Trains ``model`` on ``batches`` with ``objective``; writes metrics and checkpoints into ``out_dir``.

    ``model`` comes ready to train: on its device, with the speed layer of `bertforge.fast` and, with several
    processes, wrapped for DDP or FSDP (`bertforge.train.recipe.ready_model`); the trainer saves and
    evaluates the bare model inside it.
    ``run_config`` (any JSON-able dict, e.g. the recipe's config) is stored with every checkpoint;
    resuming with a config that differs outside ``config.RESUMABLE`` is an error naming the fields.
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
        objective: Objective,
        batches: BatchSource,
        config: TrainConfig,
        out_dir: str | Path,
        *,
        dist: Distributed | None = None,
        evaluate: Callable[[nn.Module, int], dict[str, float]] | None = None,
        tokenizer: Any = None,
        run_config: dict[str, Any] | None = None,
        settings_absent_mean: Mapping[str, Any] | None = None,
        write_run_config: bool = False,
    ):
        self.cfg = config
        self.dist = dist or Distributed()
        self.objective = objective
        self.batches = batches
        self.evaluate_fn = evaluate
        self.tokenizer = tokenizer
        self.out = Path(out_dir)
        self.run_config = run_config if run_config is not None else dataclasses.asdict(config)
        self.settings_absent_mean = {**SETTINGS_ABSENT_MEAN, **(settings_absent_mean or {})}
        self.write_run_config = write_run_config
        self.micro_batch = config.micro_batch(self.dist.world_size)
        self.device = self.dist.device
        if self.device.type == "cpu":
            keep_freed_memory()

        self.model = unwrap_model(model)  # the bare model (saving, evaluation)
        self.wrapped = model  # what trains: DDP's wrapper, or the model (sharded in place under FSDP)
        self.fsdp = self.dist.enabled and config.strategy == "fsdp"
        self.optimizer = build_optimizer(
            model, config.optimizer, lr=config.lr, weight_decay=config.weight_decay,
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
        self.train_model = torch.compile(model) if config.compile else model
        self.ddp = isinstance(model, nn.parallel.DistributedDataParallel)

        self.precision = resolve_precision(config.precision, self.device)  # fp32, bf16 or fp16 from here on
        if config.precision == "auto" and self.dist.enabled:  # each process timed its own CPU: bf16 only if all did
            votes = self.dist.all_reduce_sum(torch.tensor([float(self.precision == "bf16")], device=self.device))
            self.precision = "bf16" if int(votes.item()) == self.dist.world_size else "fp32"
        self.scaler = torch.amp.GradScaler("cuda") if needs_grad_scaler(self.precision) else None
        self.step = 0
        self._window = LogWindow()
        self._logged_eval: dict[str, Any] | None = None  # the eval line already logged at the step resumed from
        self._tb: Any = None  # TensorBoard's writer: `fit` opens it once the run's settings are accepted

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
        rngs = self.dist.gather_objects(rng_state())
        window = self._window.reduced(self.dist, self.device).state_dict()
        model_state, optim_state = self._state_dicts()
        final = checkpoint_dir(self.out, self.step)
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
                info = {"step": self.step, "elapsed_seconds": round(self.elapsed, 3),
                        "world_size": self.dist.world_size, "batches": self.batches.state_dict(),
                        "run_config": self.run_config}
                write_state(tmp, state, info)
            prune_checkpoints(self.out, self.cfg.keep_checkpoints)
        self.dist.barrier()
        return final

    def load_checkpoint(self, folder: str | Path) -> None:
        """Continue from a checkpoint folder written by `save_checkpoint`."""
        folder = Path(folder)
        self._check_compatible(read_info(folder).get("run_config", {}), folder)
        state = read_state(folder)
        if state["world_size"] != self.dist.world_size:
            logger.warning("%s was written by %d processes, resuming with %d: the data order is the same "
                           "(global batches), dropout draws differ", folder, state["world_size"], self.dist.world_size)
        self._load_weights(folder, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.elapsed = float(state.get("elapsed", 0.0))  # a time-budget schedule reads it
        # The saved optimizer holds the lr of the saved run's schedule; max_steps may have changed
        # since (a run extended), so the next step's lr comes from this run's schedule.
        self._apply_schedule()
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.batches.load_state_dict(state["batches"])
        rngs = state["rng"]
        set_rng_state(rngs[self.dist.rank] if self.dist.rank < len(rngs) else rngs[0])
        self.step = int(state["step"])
        self._window = LogWindow.from_state(state.get("log_window"), self.dist.is_main)
        if self.dist.is_main:
            logger.info("resumed from %s at step %d", folder, self.step)

    def _load_weights(self, folder: Path, optimizer_state: dict[str, Any]) -> None:
        """The model's weights from a checkpoint folder and the optimizer's state; an error naming the
        weights that do not fit this model."""
        from bertforge.model.checkpoint import CheckpointError, read_state_dict

        weights = read_state_dict(folder)
        expected = self.model.state_dict()
        bad = sorted(k for k in expected if k not in weights or weights[k].shape != expected[k].shape)
        if bad:
            raise CheckpointError(f"{folder}: its weights do not fit this model ({', '.join(bad[:8])}"
                                  f"{' ...' if len(bad) > 8 else ''})")
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            set_state_dict(self.model, self.optimizer, model_state_dict=weights,
                           optim_state_dict=optimizer_state, options=StateDictOptions(full_state_dict=True))
        else:
            self.model.load_state_dict({k: weights[k] for k in expected})
            self.optimizer.load_state_dict(optimizer_state)

    def _check_compatible(self, saved: dict[str, Any], folder: Path) -> None:
        """Refuse to resume from ``folder`` if its recorded settings ``saved`` differ from this run's
        outside what a resumed run may change (`bertforge.train.state.check_compatible`)."""
        check_compatible(saved, self.run_config, self.cfg, folder, self.settings_absent_mean)

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
        reopened = self._window.steps > 0 and self.step < self.cfg.max_steps and not self.budget_spent()
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
            for k, v in self.objective.counts(b).items():
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
                    terms, st = self.objective.forward(self.train_model, b)
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
        bar = self._progress_bar()
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
                self._window.add(loss_sums, counts, stats, tokens, dt)
                stop_now = stop.requested or (cfg.max_time_minutes > 0 and self.elapsed >= cfg.max_time_minutes * 60)
                if self.dist.enabled:  # every process stops at the same step, on the same clock
                    flag = self.dist.all_reduce_sum(torch.tensor([float(stop_now), self.elapsed], device=self.device,
                                                                 dtype=torch.float64))
                    stop_now, self.elapsed = bool(flag[0].item() > 0), flag[1].item() / self.dist.world_size
                self._follow_clock()  # after the processes agree on the clock: the same rate on every one
                finished = self.step >= cfg.max_steps or self.budget_spent()
                done = finished or stop_now
                if self.step % cfg.log_every == 0 or done:  # a stopped run logs its last steps too
                    final = self._log_train(grad_norm, bar)
                if self.step % cfg.log_every == 0:  # a partial window stays open: a resumed run continues it
                    self._window = LogWindow()
                if bar is not None:
                    bar.update(min(dt, max(0.0, bar.total - bar.n)) if cfg.budget_minutes else 1)  # never past 100%
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

    def _progress_bar(self) -> Any:
        """The main process's progress bar: over the steps, or the seconds of a time budget (None: none)."""
        cfg = self.cfg
        if not (cfg.progress and self.dist.is_main):
            return None
        from tqdm.auto import tqdm

        if cfg.budget_minutes:
            return tqdm(total=round(cfg.budget_minutes * 60), initial=round(self.elapsed), desc="train", unit="s",
                        bar_format="{l_bar}{bar}| {n:.0f}/{total} s [{elapsed}<{remaining}{postfix}]",
                        dynamic_ncols=True)
        return tqdm(total=cfg.max_steps, initial=self.step, desc="train", unit="step", dynamic_ncols=True)

    def _log_train(self, grad_norm: float, bar: Any) -> dict[str, float]:
        """Log the open window's metrics line (a collective call) and show them on the progress bar."""
        window = self._window.reduced(self.dist, self.device)
        metrics: dict[str, float] = {
            **objective_metrics(self.objective, window.loss, window.count, window.stat, per_term=len(window.loss) > 1),
            "lr": self.scheduler.get_last_lr()[0],
            "grad_norm": grad_norm,
            "tokens_per_s": window.tokens / max(window.seconds, 1e-9),
        }
        metrics = _rounded(metrics)
        self._log({"split": "train", "step": self.step, "time": round(self.elapsed, 3), **metrics})
        if bar is not None:
            shown = {k: metrics[k] for k in ("loss", "mlm_accuracy", "nsp_accuracy", "accuracy") if k in metrics}
            bar.set_postfix({**{k: f"{v:.4f}" for k, v in shown.items()}, "lr": f"{metrics['lr']:.2e}",
                             "tok/s": f"{metrics['tokens_per_s']:,.0f}"}, refresh=False)
        return metrics
