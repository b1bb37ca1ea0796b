"""What runs after each evaluation of a run: a callback sees the step and the metrics, and a true return
(or a text saying why) ends training there, as a finished run. `EarlyStopping` is the usual one."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bertforge.settings import check_settings

__all__ = ["EvalCallback", "EarlyStopping"]

EvalCallback = Callable[[int, dict[str, float]], "bool | str | None"]
"""``callback(step, metrics)``: called on the main process after every evaluation; true (or a reason) stops."""


@dataclass
class EarlyStopping:
    """Stop when ``metric`` has not improved by more than ``min_delta`` for ``patience`` evaluations in a row.
    ``metric`` "" is filled in by the run (its --metric-for-best, or the task's main metric). A resumed run
    replays the evaluations it logged before (`replay`), so it stops where an unbroken run would."""

    metric: str = ""
    patience: int = 1
    min_delta: float = 0.0
    higher_is_better: bool = True
    best: float | None = field(default=None, init=False)
    best_step: int = field(default=0, init=False)
    waited: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        try:
            check_settings(self)  # the types: no text for a count, no NaN for a number
        except ValueError as e:
            raise ValueError(f"EarlyStopping {e}") from None
        if self.patience < 1:
            raise ValueError(f"EarlyStopping patience must be at least 1, got {self.patience}")
        if not (math.isfinite(self.min_delta) and self.min_delta >= 0):
            raise ValueError(f"EarlyStopping min_delta must be a finite number >= 0, got {self.min_delta}")

    def __call__(self, step: int, metrics: dict[str, float]) -> str:
        if self.metric not in metrics:
            raise ValueError(f"early stopping on {self.metric!r}, which is not among the metrics "
                             f"({', '.join(metrics)})")
        value = metrics[self.metric] if self.higher_is_better else -metrics[self.metric]
        if math.isfinite(value) and (self.best is None or value > self.best + self.min_delta):
            self.best, self.best_step, self.waited = value, step, 0
            return ""
        self.waited += 1
        if self.waited < self.patience:
            return ""
        if self.best is None:
            return f"{self.metric} has no finite value in {self.waited} evaluations"
        best = self.best if self.higher_is_better else -self.best
        return (f"{self.metric} has not improved for {self.waited} evaluation{'s' * (self.waited > 1)} "
                f"(best {best:.4g} at step {self.best_step})")

    def replay(self, history: Iterable[tuple[int, dict[str, float]]]) -> None:
        """The evaluations of the run before a resume, in order."""
        for step, metrics in history:
            if self.metric in metrics:
                self(step, metrics)
