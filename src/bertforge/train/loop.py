"""The one training loop, shared by pre-training and every fine-tuning task.

A training run hands the `Trainer` a model ready to train, an `Objective` (how a batch becomes loss terms and
statistics), a resumable batch source and an evaluation; the loop owns the rest: accumulation, precision,
clipping, the optimizer and schedule, checkpoints, resume, signals, logging and the progress bar.

Loss normalisation. A task returns each loss term as a *sum* and says beforehand how many items it averages
over (`Objective.counts`). The loop divides each sum by its count over the whole optimizer step (every
micro-batch on every process), so the gradient is that of one big batch whatever the number of processes or
accumulation steps. (A mean per micro-batch, averaged again by DDP, would weight short micro-batches more.)

Checkpoints (`bertforge.train.state`) are written whole or not at all, so a crash leaves every earlier one
intact; SIGINT / SIGTERM finish the current step, save and stop. Metrics: `bertforge.train.history`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from bertforge.console import progress_bar
from bertforge.fast.allocator import keep_freed_memory
from bertforge.io import atomic_write_text
from bertforge.train import state as checkpoints
from bertforge.train.config import ResumeRules, TrainConfig
from bertforge.train.distributed import Distributed, unwrap_model
from bertforge.train.history import LogWindow, MetricsLog, objective_metrics, rounded
from bertforge.train.optim import CLOCK_UNITS, build_optimizer, build_schedule
from bertforge.train.precision import autocast, needs_grad_scaler, resolve_precision
from bertforge.train.rundir import RUN_CONFIG, checkpoint_dir, prune_checkpoints
from bertforge.train.signals import StopSignals

__all__ = ["Objective", "BatchSource", "Evaluation", "Trainer", "TrainResult"]

logger = logging.getLogger("bertforge")


class Objective(Protocol):
    """How a run's batches become losses and statistics."""

    def counts(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Items each loss term averages over in ``batch`` (e.g. masked tokens), known before the forward."""

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(summed loss per term, summed statistics such as correct predictions)."""

    def metrics(self, loss_sums: dict[str, float], counts: dict[str, float], stats: dict[str, float]
                ) -> dict[str, float]:
        """Readable metrics (accuracies, ...) from totals over a logging window."""


class BatchSource(Protocol):
    """A resumable, endless-by-epochs batch iterable (`bertforge.data.loader.PretrainingLoader`)."""

    drop_last: bool
    """Whether an epoch's last incomplete batch is left out; otherwise it makes a smaller last step."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Evaluation:
    """An evaluation's metrics, and the model saved into ``save_to`` (a new best, say) with ``files`` beside it."""

    metrics: dict[str, float]
    save_to: Path | None = None
    files: dict[str, str] = field(default_factory=dict)
    stop: str = ""
    """Why training should end here (early stopping; "": go on). The run ends as a finished one."""


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
    budget_minutes: float = 0.0
    """The run's time budget (0: none; its length is then max_steps)."""
    elapsed_seconds: float = 0.0
    """Training time, over every resume."""
    early_stop: str = ""
    """Why an evaluation ended training before max_steps (early stopping; "": it did not)."""

    @property
    def exit_code(self) -> int:
        """What a command ends with: 128 + the signal for a run a signal stopped early (130 for SIGINT,
        143 for SIGTERM, as a shell reports a killed command), else 0."""
        return 128 + self.stop_signal if self.stopped_early and self.stop_signal else 0


FRESH_HEAD_SHARE = 0.1
"""The head warm-up's share of the run where a pre-trained checkpoint lacked the head (`head_warmup`)."""


def head_warmup(model: nn.Module, config: TrainConfig) -> tuple[list[str], float]:
    """The parameters of ``model``'s head and the share of the run they train alone: ``head_warmup_ratio``, or
    `FRESH_HEAD_SHARE` where the model marks a head its checkpoint lacked (``fresh_head``: names), else none.
    The head is ``fresh_head``, else what the class starts afresh for a task (``_fresh_head_prefixes``)."""
    fresh = list(getattr(model, "fresh_head", ()))
    share = config.head_warmup_ratio if config.head_warmup_ratio is not None else FRESH_HEAD_SHARE * bool(fresh)
    if not share:
        return [], 0.0
    prefixes = tuple(getattr(model, "_fresh_head_prefixes", ()))
    head = fresh or [name for name, _ in model.named_parameters() if prefixes and name.startswith(prefixes)]
    if not head:
        raise ValueError(f"head_warmup_ratio {share}: {type(model).__name__} names no head to train alone")
    return head, share


class Trainer:
    """Trains ``model`` on ``batches`` with ``objective``; writes metrics and checkpoints into ``out_dir``.

    ``model`` comes ready to train (`bertforge.train.run.build_trainer`); the trainer saves and evaluates the
    bare model inside it. ``run_config`` (JSON-able) is stored with every checkpoint; resuming with one that
    differs outside what ``resume_rules`` allow is an error naming the fields. ``write_run_config``: `fit`
    writes ``run_config`` into ``out_dir`` (`RUN_CONFIG`) once a resumed checkpoint's settings match, so a
    refused resume changes nothing. ``evaluate(model, step)`` runs every ``eval_every`` steps and at the end.
    """

    def __init__(self, model: nn.Module, objective: Objective, batches: BatchSource, config: TrainConfig,
                 out_dir: str | Path, *, dist: Distributed | None = None,
                 evaluate: Callable[[nn.Module, int], dict[str, float] | Evaluation] | None = None,
                 tokenizer: Any = None, run_config: dict[str, Any] | None = None,
                 resume_rules: ResumeRules | None = None, write_run_config: bool = False):
        self.cfg = config
        self.dist = dist or Distributed()
        self.objective = objective
        self.batches = batches
        self.evaluate_fn = evaluate
        self.tokenizer = tokenizer
        self.out = Path(out_dir)
        self.run_config = run_config if run_config is not None else dataclasses.asdict(config)
        self.resume_rules = resume_rules or ResumeRules.of(type(config))
        self.write_run_config = write_run_config
        self.micro_batch = config.micro_batch(self.dist.world_size)
        self.device = self.dist.device
        if self.device.type == "cpu":
            keep_freed_memory()
        self.model = unwrap_model(model)  # the bare model (saving, evaluation)
        self.wrapped = model  # what trains: DDP's wrapper, or the model (sharded in place under FSDP)
        self.fsdp = self.dist.enabled and config.strategy == "fsdp"
        head, self.head_share = head_warmup(self.model, config)
        self.optimizer = build_optimizer(model, config.optimizer, lr=config.lr, weight_decay=config.weight_decay,
                                         betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
                                         bias_correction=config.bias_correction, head=head)
        # a time budget's schedule follows the training clock: the decay ends when the time does
        total, warmup = ((CLOCK_UNITS, int(config.budget_warmup_share * CLOCK_UNITS)) if config.budget_minutes
                         else (config.max_steps, config.warmup))
        self.scheduler = build_schedule(self.optimizer, budget_seconds=config.budget_minutes * 60, total_steps=total,
                                        warmup_steps=warmup, schedule=config.schedule, power=config.power,
                                        end_factor=config.end_lr_ratio, head_share=self.head_share)
        self.train_model = torch.compile(model) if config.compile else model
        self.ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        self.precision = resolve_precision(config.precision, self.device)  # fp32, bf16 or fp16 from here on
        if config.precision == "auto" and self.dist.enabled:  # each process timed its own CPU: bf16 only if all did
            votes = self.dist.all_reduce_sum(torch.tensor([float(self.precision == "bf16")], device=self.device))
            self.precision = "bf16" if int(votes.item()) == self.dist.world_size else "fp32"
        self.scaler = torch.amp.GradScaler("cuda") if needs_grad_scaler(self.precision) else None
        self.step = 0
        self.early_stop = ""
        self.elapsed = 0.0  # training seconds, carried across resumes
        self._window = LogWindow()
        self._logged_eval: dict[str, Any] | None = None  # the eval line already logged at the step resumed from
        self.metrics_log = MetricsLog(self.out, self.dist.is_main)

    def advance_clock(self, seconds: float) -> None:
        """Count ``seconds`` more training time; a time-budget schedule sets the next step's rate from it."""
        self.elapsed += seconds
        self.scheduler.set_elapsed(self.elapsed)

    def budget_spent(self) -> bool:
        """Whether a time-budget run has used its budget."""
        return bool(self.cfg.budget_minutes) and self.elapsed >= self.cfg.budget_minutes * 60

    # ------------------------------------------------------------------ checkpoints
    def save_model(self, folder: str | Path, extra_files: dict[str, str] | None = None) -> None:
        """`bertforge.train.state.save_model` of the bare model and tokenizer; every process must call this."""
        checkpoints.save_model(folder, self.model, self.tokenizer, self.dist, self.fsdp, extra_files)

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step (every process must call this)."""
        rngs = self.dist.gather_objects(checkpoints.rng_state())
        window = self._window.reduced(self.dist, self.device).state_dict()
        weights, optimizer_state = checkpoints.full_state_dicts(self.model, self.optimizer, self.fsdp)
        folder = checkpoint_dir(self.out, self.step)
        if self.dist.is_main:
            state = {"step": self.step, "elapsed": self.elapsed, "optimizer": optimizer_state,
                     "scheduler": self.scheduler.state_dict(),
                     "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                     "rng": rngs, "batches": self.batches.state_dict(), "world_size": self.dist.world_size,
                     "log_window": window}
            info = {"step": self.step, "elapsed_seconds": round(self.elapsed, 3), "world_size": self.dist.world_size,
                    "batches": self.batches.state_dict(), "run_config": self.run_config}
            checkpoints.write_checkpoint(folder, self.model, weights, self.tokenizer, state, info)
            prune_checkpoints(self.out, self.cfg.keep_checkpoints)
        self.dist.barrier()
        return folder

    def load_checkpoint(self, folder: str | Path) -> None:
        """Continue from a checkpoint folder written by `save_checkpoint`; refused (nothing loaded) if its
        recorded settings differ from this run's outside what a resumed run may change."""
        folder = Path(folder)
        checkpoints.check_compatible(checkpoints.read_info(folder).get("run_config", {}), self.run_config,
                                     self.resume_rules, folder)
        state = checkpoints.read_state(folder)
        if state["world_size"] != self.dist.world_size:
            logger.warning("%s was written by %d processes, resuming with %d: the data order is the same "
                           "(global batches), dropout draws differ", folder, state["world_size"], self.dist.world_size)
        checkpoints.load_weights(folder, self.model, self.optimizer, state["optimizer"], self.fsdp)
        # the next step's rate is this run's schedule's (max_steps may have grown), not the saved optimizer's
        self.elapsed = float(state.get("elapsed", 0.0))
        self.scheduler.set_elapsed(self.elapsed)
        self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.batches.load_state_dict(state["batches"])
        rngs = state["rng"]
        checkpoints.set_rng_state(rngs[self.dist.rank] if self.dist.rank < len(rngs) else rngs[0])
        self.step = int(state["step"])
        self._window = LogWindow.from_state(state.get("log_window"), self.dist.is_main)
        if self.dist.is_main:
            logger.info("resumed from %s at step %d", folder, self.step)

    # ------------------------------------------------------------------ evaluation
    def _final_evaluation(self, trained: bool) -> dict[str, float]:
        """The evaluation at the end of training, run once per step: a run that took no step here
        (resumed at its last step) reuses the eval line it already logged there."""
        if not trained:  # every process must agree (the evaluation is a collective call)
            flag = torch.tensor([float(self._logged_eval is not None)], device=self.device)
            if self.dist.all_reduce_sum(flag).item() > 0:
                return dict(self._logged_eval or {})
        return self.run_evaluation()

    def run_evaluation(self) -> dict[str, float]:
        """Evaluate (on every process), log the metrics, and save the model where the evaluation asks."""
        if self.evaluate_fn is None:
            return {}
        self.model.eval()
        try:
            with torch.no_grad(), self._autocast():
                got = self.evaluate_fn(self.model, self.step)  # under FSDP, the sharded model itself
        finally:
            self.model.train()
        evaluation = got if isinstance(got, Evaluation) else Evaluation(got)
        if evaluation.save_to is not None:
            self.save_model(evaluation.save_to, extra_files=evaluation.files)
        metrics = rounded(evaluation.metrics)
        self.metrics_log.write({"split": "eval", "step": self.step, "time": round(self.elapsed, 3), **metrics})
        stop = torch.tensor([float(bool(evaluation.stop) and self.dist.is_main)], device=self.device)
        if self.dist.enabled:  # every process ends at the same step: the main process's decision
            stop = self.dist.all_reduce_sum(stop)
        self.early_stop = (evaluation.stop or "an evaluation asked to stop") if stop.item() > 0 else ""
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
                it = iter(self.batches)
                if out and not self.batches.drop_last:  # the epoch's last, smaller step
                    break
                if new_epoch:
                    raise ValueError(f"an epoch of the training data holds fewer than grad_accum "
                                     f"({self.cfg.grad_accum}) micro-batches") from None
                # An epoch's last micro-batches that do not fill a step are dropped, as a source
                # batching the whole step at once drops them: accumulation leaves the data order as is.
                out, new_epoch = [], True
        return out, it

    def train_step(self, micro: list[dict[str, torch.Tensor]]
                   ) -> tuple[dict[str, float], dict[str, float], dict[str, float], float]:
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
        sums_acc: list[torch.Tensor] = []
        for i, b in enumerate(micro):
            b = {k: v.to(self.device, non_blocking=True) for k, v in b.items()}
            # DDP averages gradients only on the last micro-batch of the step.
            sync = self.wrapped.no_sync() if self.ddp and i < len(micro) - 1 else contextlib.nullcontext()
            with sync:
                with self._autocast():
                    terms, st = self.objective.forward(self.train_model, b)
                    loss = sum(terms[k] / max(counts[k], 1.0) for k in terms) * self.dist.world_size
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            # Totals stay on the device until the step's end: one transfer, no sync per micro-batch.
            if i == 0:
                loss_names, stat_names = list(terms), list(st)
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
        stats = dict(zip(stat_names, totals[len(loss_names):]))
        return dict(zip(loss_names, totals)), stats, counts, float(grad_norm)

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
        # a partial window that training continues: its line is written again when the window is full
        reopened = self._window.steps > 0 and self.step < cfg.max_steps and not self.budget_spent()
        self._logged_eval = self.metrics_log.open(self.step, reopened)
        self.model.train()
        bar = self._progress_bar()
        last_ckpt: Path | None = None
        eval_metrics: dict[str, float] = {}
        final: dict[str, float] = {}
        stopped_early = False
        it = iter(self.batches)
        with StopSignals() as stop:
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
                self.scheduler.set_elapsed(self.elapsed)  # after the processes agree on the clock: one rate on all
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
                    done = bool(self.early_stop)
                if self.step % cfg.checkpoint_every == 0 or done:
                    last_ckpt = self.save_checkpoint()
                if stop_now:
                    stopped_early = not finished
                    break
                if self.early_stop:
                    if self.dist.is_main:
                        logger.info("early stop at step %d of %d: %s", self.step, cfg.max_steps, self.early_stop)
                    break
        if bar is not None:
            bar.close()
        early_stop = self.early_stop  # a callback's answer to the final evaluation ends nothing
        if not (stop.requested or early_stop):
            eval_metrics = self._final_evaluation(trained=self.step > start) or eval_metrics
        self.metrics_log.close()
        return TrainResult(step=self.step, stopped_early=stopped_early, final_metrics=final,
                           eval_metrics=eval_metrics, checkpoint=last_ckpt, interrupted=stop.requested,
                           stop_signal=stop.signum, max_steps=cfg.max_steps, budget_minutes=cfg.budget_minutes,
                           early_stop=early_stop,
                           elapsed_seconds=self.elapsed)

    def _progress_bar(self) -> Any:
        """The main process's progress bar: over the steps, or the seconds of a time budget (None: none)."""
        cfg = self.cfg
        if not (cfg.progress and self.dist.is_main):
            return None
        if cfg.budget_minutes:
            return progress_bar(total=round(cfg.budget_minutes * 60), initial=round(self.elapsed), desc="train",
                                unit="s", bar_format="{l_bar}{bar}| {n:.0f}/{total} s [{elapsed}<{remaining}{postfix}]")
        return progress_bar(total=cfg.max_steps, initial=self.step, desc="train", unit="step")

    def _log_train(self, grad_norm: float, bar: Any) -> dict[str, float]:
        """Log the open window's metrics line (a collective call) and show them on the progress bar."""
        window = self._window.reduced(self.dist, self.device)
        metrics = rounded({
            **objective_metrics(self.objective, window.loss, window.count, window.stat, per_term=len(window.loss) > 1),
            "lr": self.scheduler.get_last_lr()[0], "grad_norm": grad_norm,
            "tokens_per_s": window.tokens / max(window.seconds, 1e-9)})
        self.metrics_log.write({"split": "train", "step": self.step, "time": round(self.elapsed, 3), **metrics})
        if bar is not None:
            shown = {k: metrics[k] for k in ("loss", "mlm_accuracy", "nsp_accuracy", "accuracy") if k in metrics}
            bar.set_postfix({**{k: f"{v:.4f}" for k, v in shown.items()}, "lr": f"{metrics['lr']:.2e}",
                             "tok/s": f"{metrics['tokens_per_s']:,.0f}"}, refresh=False)
        return metrics
