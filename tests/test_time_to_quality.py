"""benchmarks/time_to_quality.py's pure parts: the evaluation schedule, the static masks undone for
transformers' collator, and an arm's summary over seeds (minutes to a level, null unless every seed
reaches it)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import time_to_quality as ttq  # noqa: E402

from bertforge.data.instances import InstanceBatch  # noqa: E402
from bertforge.train.pretrain import original_tokens  # noqa: E402


def test_eval_schedule_every_5_s_in_the_first_minute_then_every_30_s():
    assert ttq.eval_times(150) == [0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 90, 120, 150]
    assert ttq.eval_times(12) == [0, 5, 10, 12]
    assert ttq.eval_times(60) == [0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60]
    # a point taken late (a slow step) moves on to the next scheduled time, not to a missed one
    assert ttq.next_eval_time(0) == 5 and ttq.next_eval_time(5.02) == 10 and ttq.next_eval_time(59.9) == 60
    assert ttq.next_eval_time(60.3) == 90 and ttq.next_eval_time(121.0) == 150


def test_unmasked_ids_write_the_labels_back_as_the_loader_does():
    rng = np.random.default_rng(0)
    lengths, ids, positions, labels, mask_offsets = [7, 5, 9], [], [], [], [0]
    for n in lengths:
        seq = rng.integers(5, 50, n)
        pos = np.sort(rng.choice(np.arange(1, n - 1), 2, replace=False))
        labels.append(seq[pos].copy())
        seq[pos] = 4  # [MASK]
        ids.append(seq)
        positions.append(pos)
        mask_offsets.append(mask_offsets[-1] + len(pos))
    batch = InstanceBatch(np.concatenate(ids).astype(np.uint16), np.concatenate([[0], np.cumsum(lengths)]),
                          np.array([3, 2, 4]), np.zeros(3, dtype=np.uint8), np.array(mask_offsets),
                          np.concatenate(positions).astype(np.uint16), np.concatenate(labels).astype(np.uint16))
    got = ttq.unmasked_ids(batch)
    assert 4 not in got
    for i, n in enumerate(lengths):  # bertforge's own undoing, instance by instance
        inst = batch.instance(i)
        padded = {"input_ids": torch.tensor(inst.input_ids)[None],
                  "masked_positions": torch.tensor(inst.masked_positions)[None],
                  "labels": torch.tensor(inst.masked_labels)[None]}
        assert got[batch.offsets[i]:batch.offsets[i + 1]].tolist() == original_tokens(padded)[0].tolist()


def _curve(*points: tuple[float, float]) -> list[dict]:
    return [{"seconds": s, "step": i, "mlm_accuracy": a, "perplexity": 100.0} for i, (s, a) in enumerate(points)]


def test_summary_of_an_arm_over_seeds():
    arm = {"seeds": {"0": _curve((0, 0.0), (60, 0.2), (120, 0.4)),
                     "1": _curve((0, 0.0), (60, 0.1), (120, 0.3)),
                     "2": _curve((0, 0.0), (60, 0.15), (120, 0.25))}}
    got = ttq.summarize(arm)
    # seed 0 reaches 0.1 at 0.5 min, seed 1 at 1.0, seed 2 at 0.667 (linear between evaluations)
    assert got["minutes_to"]["0.1"] == pytest.approx((0.5 + 1.0 + 0.667) / 3, abs=1e-3)
    assert got["minutes_to_range"]["0.1"] == [0.5, 1.0] and got["reached_by"]["0.1"] == 3
    assert got["minutes_to_interval"]["0.1"]["n"] == 3
    # seed 2 never reaches 0.3: no mean, but the seeds that did are counted and ranged
    assert got["minutes_to"]["0.3"] is None and got["reached_by"]["0.3"] == 2
    assert got["minutes_to_range"]["0.3"] == [1.5, 2.0] and got["minutes_to_interval"]["0.3"] is None
    assert got["best"] == pytest.approx(0.95 / 3, abs=1e-5) and got["best_range"] == [0.25, 0.4]


def test_ratios_are_the_other_arms_minutes_over_bertforge_s_at_the_same_preset():
    ours = {"minutes_to": {"0.1": 0.5, "0.2": 1.0, "0.3": None}}
    theirs = {"minutes_to": {"0.1": 2.0, "0.2": None, "0.3": None}}
    got = ttq.ratios({ttq.OURS: ours, ttq.TRAINER: theirs})
    assert got == {f"{ttq.TRAINER} / {ttq.OURS}": {"0.1": 4.0, "0.2": "bertforge only", "0.3": None}}
    mini = ttq.ratios({f"{ttq.OURS} (mini)": ours, f"{ttq.SAME} (mini)": theirs, ttq.TRAINER: ours}, "mini")
    assert list(mini) == [f"{ttq.SAME} (mini) / {ttq.OURS} (mini)"]


def test_step_rates_separate_the_sources_of_speed():
    def arm(steps):
        return {"runs": {"0": {"steps": steps, "train_seconds": 100.0}, "1": {"steps": steps, "train_seconds": 50.0}}}

    got = ttq.step_rates({ttq.OURS: arm(1200), ttq.DENSE: arm(600), ttq.SAME: arm(200), ttq.MASKED_ONLY: arm(400)},
                         "tiny")
    assert got["steps_per_second"][ttq.OURS] == 18.0  # the mean of 12 and 24 steps a second
    assert got["sources"] == {"bertforge's sparse head (recipe / dense head)": 2.0,
                              "the sparse head in transformers (masked positions only / same recipe)": 2.0,
                              "the rest of bertforge (recipe / transformers masked positions only)": 3.0,
                              "all of it (bertforge recipe / transformers same recipe)": 6.0}
