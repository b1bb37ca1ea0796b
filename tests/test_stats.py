"""`bertforge.stats`: the t interval of a mean against scipy's own test and a hand-checked value,
paired differences (seed by seed, pairs with a missing side left out), the edge cases (one value,
no spread) and the seeds a half-width needs."""

from __future__ import annotations

import math
import statistics

import pytest
from scipy import stats as scipy_stats

from bertforge.stats import CONFIDENCE, Interval, mean_interval, paired_difference, seeds_for_half_width


def test_mean_interval_is_students_t():
    values = [0.62, 0.655, 0.641, 0.60, 0.633]
    got = mean_interval(values)
    low, high = scipy_stats.ttest_1samp(values, 0.0).confidence_interval(CONFIDENCE)
    assert got.n == 5 and got.confidence == 0.95
    assert got.mean == pytest.approx(sum(values) / 5)
    assert (got.low, got.high) == (pytest.approx(low, rel=1e-12), pytest.approx(high, rel=1e-12))
    # by hand: mean 0.7, sd 0.1, sem 0.1 / sqrt(3); t(0.975, 2) = 4.302653
    hand = mean_interval([0.6, 0.7, 0.8])
    assert hand.half_width == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-6)
    assert (hand.low, hand.high) == (pytest.approx(0.451586, abs=1e-6), pytest.approx(0.948414, abs=1e-6))
    assert hand.format() == "70.0 [45.2, 94.8]" and hand.resolved
    # another confidence widens or narrows it as t says: t(0.995, 2) = 9.924843
    assert mean_interval([0.6, 0.7, 0.8], confidence=0.99).half_width == pytest.approx(
        9.924843 * 0.1 / math.sqrt(3), rel=1e-6)
    with pytest.raises(ValueError, match="confidence"):
        mean_interval([0.6, 0.7], confidence=95)


def test_pairing_resolves_what_the_rows_own_intervals_do_not():
    """Seeds that are hard for one row are hard for the other: the rows' intervals overlap, their
    seed-by-seed difference excludes 0. The same numbers paired with the wrong seeds do not resolve."""
    a = [0.71, 0.63, 0.80, 0.66]
    b = [0.69, 0.60, 0.79, 0.63]
    ia, ib = mean_interval(a), mean_interval(b)
    assert ia.low < ib.high and ib.low < ia.high  # the two lines' intervals overlap
    d = paired_difference(a, b)
    low, high = scipy_stats.ttest_rel(a, b).confidence_interval(CONFIDENCE)
    assert d.mean == pytest.approx(0.0225) and d.n == 4
    assert (d.low, d.high) == (pytest.approx(low, rel=1e-12), pytest.approx(high, rel=1e-12))
    assert d.resolved and d.low > 0
    shuffled = paired_difference(a, b[::-1])  # the same values, paired with other seeds
    assert shuffled.mean == pytest.approx(d.mean) and not shuffled.resolved
    assert paired_difference(b, a).high < 0 and paired_difference(b, a).resolved  # resolved either sign


def test_missing_pairs_are_left_out_and_unequal_lengths_refused():
    a = [0.70, None, 0.72, float("nan"), 0.71]
    b = [0.63, 0.64, float("nan"), 0.62, 0.66]
    assert paired_difference(a, b) == paired_difference([0.70, 0.71], [0.63, 0.66])
    assert paired_difference(a, b).n == 2
    assert mean_interval([0.5, None, float("nan"), 0.7]) == mean_interval([0.5, 0.7])
    with pytest.raises(ValueError, match="one value per seed on both sides, got 3 and 2"):
        paired_difference([0.1, 0.2, 0.3], [0.1, 0.2])


def test_one_value_gives_no_interval_and_is_never_resolved():
    one = mean_interval([0.8])
    assert (one.mean, one.low, one.high, one.n) == (0.8, None, None, 1)
    assert one.half_width is None and not one.resolved
    assert one.format() == "80.0"
    assert one.to_json() == {"mean": 0.8, "low": None, "high": None, "n": 1, "confidence": 0.95}
    single = paired_difference([0.9, None], [0.1, 0.2])  # a large difference, but on one seed
    assert single.n == 1 and single.mean == pytest.approx(0.8) and not single.resolved
    none = mean_interval([float("nan"), None])
    assert none.n == 0 and math.isnan(none.mean) and not none.resolved
    assert none.format() == "—" and none.to_json()["mean"] is None


def test_zero_spread_is_a_zero_width_interval():
    same = mean_interval([0.1, 0.1, 0.1])  # np.mean of these is 0.10000000000000002
    assert (same.mean, same.low, same.high, same.half_width) == (0.1, 0.1, 0.1, 0.0)
    assert same.resolved  # every value above 0
    tie = paired_difference([0.7, 0.6, 0.8], [0.7, 0.6, 0.8])
    assert (tie.mean, tie.low, tie.high) == (0.0, 0.0, 0.0) and not tie.resolved


def test_format_and_json():
    d = Interval(0.074, 0.051, 0.0972, 3)
    assert d.format(signed=True) == "+7.4 [+5.1, +9.7]"
    assert Interval(-0.02, -0.05, 0.01, 3).format(signed=True) == "-2.0 [-5.0, +1.0]"
    assert not Interval(-0.02, -0.05, 0.01, 3).resolved and Interval(-0.02, -0.05, -0.01, 3).resolved
    assert d.format(scale=1, digits=3) == "0.074 [0.051, 0.097]"
    assert d.to_json(digits=3) == {"mean": 0.074, "low": 0.051, "high": 0.097, "n": 3, "confidence": 0.95}


def _with_sd(n: int, sd: float) -> list[float]:
    """``n`` values whose sample standard deviation is ``sd``."""
    xs = [float(i) for i in range(n)]
    scale = sd / statistics.stdev(xs)
    return [scale * x for x in xs]


def test_seeds_for_half_width():
    # by hand, sd = half-width: t(0.975, n-1) / sqrt(n) <= 1 first at n = 7 (2.447 / 2.646 = 0.925;
    # n = 6: 2.571 / 2.449 = 1.050)
    assert seeds_for_half_width(1.0, 1.0) == 7
    for sd, half in ((1.0, 1.0), (0.01, 0.005), (0.02, 0.01), (0.7, 0.3)):
        n = seeds_for_half_width(sd, half)
        # n seeds with that spread give an interval that narrow; one seed fewer does not
        assert mean_interval(_with_sd(n, sd)).half_width <= half * (1 + 1e-9)
        assert mean_interval(_with_sd(n - 1, sd)).half_width > half
    assert seeds_for_half_width(0.0, 0.01) == 2
    assert seeds_for_half_width(1.0, 1e-6, at_most=50) == 50
    with pytest.raises(ValueError):
        seeds_for_half_width(1.0, 0.0)
    with pytest.raises(ValueError):
        seeds_for_half_width(-1.0, 0.1)
