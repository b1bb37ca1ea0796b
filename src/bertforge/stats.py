"""Statistics over repeated runs, computed one way for every report (the demo, ``bertforge ablate``
and the benchmarks that repeat runs).

A line measured over seeds is reported as its mean with a 95% interval (`mean_interval`); two lines
measured on the same seeds (the same subsets, data order and head initialisation) are compared by
their *paired* difference, seed by seed (`paired_difference`). A difference is **resolved** only when
its interval excludes 0, whatever the sign of its mean.

The intervals are Student's t intervals: with the 3 to 20 seeds a run can afford, a bootstrap's
percentile interval is too narrow (it treats the seeds' sample spread as the truth), while the t
interval widens with few seeds as it should. Pairing removes what the seeds share (a hard subset is
hard for both lines), so a paired interval is usually much narrower than the lines' own intervals.

    >>> d = paired_difference([0.71, 0.70, 0.72], [0.63, 0.64, 0.62])
    >>> d.resolved, round(d.mean, 3)
    (True, 0.08)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CONFIDENCE", "Interval", "mean_interval", "paired_difference", "seeds_for_half_width"]

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values and its two-sided interval (``low``, ``high``: None with fewer than two
    values, where no interval exists)."""

    mean: float
    low: float | None
    high: float | None
    n: int
    confidence: float = CONFIDENCE

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    @property
    def resolved(self) -> bool:
        """True when the interval excludes 0: the sign of the mean is resolved at this confidence."""
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    def format(self, scale: float = 100.0, digits: int = 1, signed: bool = False) -> str:
        """``"+7.4 [+5.1, +9.7]"`` (values x ``scale``; ``signed`` puts a sign on every figure), or the
        mean alone when there is no interval."""
        if math.isnan(self.mean):
            return "—"
        f = f"{{:{'+' if signed else ''}.{digits}f}}"
        text = f.format(scale * self.mean)
        if self.low is None or self.high is None:
            return text
        return f"{text} [{f.format(scale * self.low)}, {f.format(scale * self.high)}]"

    def to_json(self, digits: int = 5) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None or math.isnan(x) else round(x, digits)

        return {"mean": r(self.mean), "low": r(self.low), "high": r(self.high), "n": self.n,
                "confidence": self.confidence}


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(float(value))


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of ``values`` (NaN and None left out: unfinished runs) and its Student t interval; no
    interval for fewer than two values, a zero-width one when every value is the same."""
    import numpy as np
    from scipy import stats

    xs = [float(v) for v in values if not _missing(v)]
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if not xs:
        return Interval(math.nan, None, None, 0, confidence)
    if len(xs) < 2:
        return Interval(xs[0], None, None, 1, confidence)
    if min(xs) == max(xs):  # np.mean of equal values can miss them by a rounding (0.1 x 3), and so np.std too
        return Interval(xs[0], xs[0], xs[0], len(xs), confidence)
    mean = float(np.mean(xs))
    sem = float(np.std(xs, ddof=1)) / math.sqrt(len(xs))
    low, high = stats.t.interval(confidence, len(xs) - 1, loc=mean, scale=sem)
    return Interval(mean, float(low), float(high), len(xs), confidence)


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """``a - b`` seed by seed (``a[i]`` and ``b[i]`` measured on the same seed) and the t interval of its
    mean. Pairs where either value is missing (NaN, None) are left out; the lists must be as long as
    each other, since an index is a seed."""
    if len(a) != len(b):
        raise ValueError(f"paired values need one value per seed on both sides, got {len(a)} and {len(b)}")
    return mean_interval([float(x) - float(y) for x, y in zip(a, b) if not (_missing(x) or _missing(y))], confidence)


def seeds_for_half_width(sd: float, half_width: float, confidence: float = CONFIDENCE, at_most: int = 1000) -> int:
    """The fewest seeds whose t interval of a mean has at most ``half_width`` when the per-seed values
    have standard deviation ``sd``: what a run needs to resolve a difference of that size (at least 2)."""
    from scipy import stats

    if not (sd >= 0 and half_width > 0):
        raise ValueError(f"sd must be >= 0 and half_width > 0, got {sd} and {half_width}")
    for n in range(2, at_most + 1):
        if stats.t.ppf(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n) <= half_width:
            return n
    return at_most
