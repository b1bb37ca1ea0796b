"""A run's metrics history: the open logging window, ``OUT/metrics.jsonl`` and TensorBoard's events.
The window (`LogWindow`) is part of the checkpoint, so a resumed run logs the same lines as an
uninterrupted one; a stopped run's line for its partial window is replaced (`MetricsLog.open`).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from bertforge.io import append_text, atomic_write_text
from bertforge.train.distributed import Distributed
from bertforge.train.rundir import METRICS_FILE

__all__ = ["LogWindow", "MetricsLog", "objective_metrics", "rounded"]


class _ReadsTotals(Protocol):
    """What `objective_metrics` asks of an objective (`bertforge.train.loop.Objective`)."""

    def metrics(self, loss_sums: dict[str, float], counts: dict[str, float], stats: dict[str, float]
                ) -> dict[str, float]: ...


def objective_metrics(objective: _ReadsTotals, loss_sums: dict[str, float], counts: dict[str, float],
                      stats: dict[str, float], per_term: bool = True) -> dict[str, float]:
    """Totals -> ``loss`` (the sum of term means), ``<term>_loss`` (``per_term``) and the task's metrics."""
    means = {k: v / max(counts.get(k, 0.0), 1.0) for k, v in loss_sums.items()}
    out = {"loss": sum(means.values())}
    if per_term:
        out.update({f"{k}_loss": v for k, v in means.items()})
    return {**out, **objective.metrics(loss_sums, counts, stats)}


def rounded(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics to 8 significant digits (not decimals: a learning rate of 1e-4 during warmup is far below 1e-6)."""
    return {k: (float(f"{v:.8g}") if isinstance(v, float) and math.isfinite(v) else v) for k, v in metrics.items()}


@dataclass
class LogWindow:
    """The steps since the last metrics line: this process's sums and tokens, and the global counts."""

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
        """The window with every process's sums and tokens added up (a collective call)."""
        loss, stat = sorted(self.loss), sorted(self.stat)
        local = torch.tensor([self.loss[k] for k in loss] + [self.stat[k] for k in stat] + [self.tokens],
                             dtype=torch.float64, device=device)
        values = dist.all_reduce_sum(local).tolist()
        total = dict(zip(loss + stat, values))
        return LogWindow({k: total[k] for k in self.loss}, dict(self.count), {k: total[k] for k in self.stat},
                         values[-1], self.seconds, self.steps)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's record of a reduced window."""
        return {"loss": dict(sorted(self.loss.items())), "stat": dict(sorted(self.stat.items())),
                "count": dict(self.count), "tokens": self.tokens, "seconds": self.seconds, "steps": self.steps}

    @classmethod
    def from_state(cls, saved: Mapping[str, Any] | None, main: bool) -> LogWindow:
        """Reopen a checkpoint's window (None: a fresh one); only the main process holds its summed totals."""
        if not saved:
            return cls()
        return cls(loss={k: float(v) if main else 0.0 for k, v in saved["loss"].items()},
                   count={k: float(v) for k, v in saved["count"].items()},
                   stat={k: float(v) if main else 0.0 for k, v in saved["stat"].items()},
                   tokens=float(saved["tokens"]) if main else 0.0,
                   seconds=float(saved["seconds"]), steps=int(saved["steps"]))


class MetricsLog:
    """The main process's metrics lines, into ``out/metrics.jsonl`` and (if installed) TensorBoard."""

    def __init__(self, out: Path, main: bool):
        self.path = out / METRICS_FILE
        self.tensorboard_dir = out / "tensorboard"
        self.main = main
        self._tb: Any = None

    def open(self, step: int, reopened: bool) -> dict[str, Any] | None:
        """Start logging at ``step``: drop lines logged after it and, ``reopened`` (a partial window goes on),
        the train line at it; open TensorBoard. Returns the metrics of an eval line logged at ``step``."""
        if not self.main:
            return None
        logged_eval: dict[str, Any] | None = None
        if self.path.is_file():
            kept = []
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                    at, split = record["step"], record["split"]
                except (json.JSONDecodeError, KeyError, TypeError):  # a line cut by a crash
                    continue
                if at > step or (reopened and at == step and split == "train"):
                    continue
                if at == step and split == "eval":
                    logged_eval = record
                kept.append(line)
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        with contextlib.suppress(ImportError):  # tensorboard is optional
            from torch.utils.tensorboard import SummaryWriter

            # an earlier writer's events from purge_step on are dropped (an eval line kept is written again)
            purge = None if step == 0 else step if reopened else step + 1
            self._tb = SummaryWriter(str(self.tensorboard_dir), purge_step=purge)
            if reopened and logged_eval is not None:
                self._scalars(logged_eval)
        if logged_eval is None:
            return None
        return {k: v for k, v in logged_eval.items() if k not in ("split", "step", "time")}

    def write(self, record: dict[str, Any]) -> None:
        """One line: ``split`` (train / eval), ``step``, ``time`` and the metrics."""
        if not self.main:
            return
        append_text(self.path, json.dumps(record) + "\n")
        self._scalars(record)

    def _scalars(self, record: dict[str, Any]) -> None:
        if self._tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k not in ("step", "split"):
                    self._tb.add_scalar(f"{record['split']}/{k}", v, record["step"])

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
