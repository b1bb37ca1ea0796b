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


def test_the_plan_grows_stage_by_stage_from_what_is_measured(monkeypatch):
    monkeypatch.setattr(ttq, "native_bf16", lambda device: True)
    ids = lambda jobs, kind: [j["id"] for j in jobs if j["id"].startswith(kind)]  # noqa: E731
    jobs = ttq.plan({}, ["tiny"], [0, 1], 1.0)
    assert len(ids(jobs, "speed/tiny/")) == 2 * 2 * len(ttq.PADS) and not ids(jobs, "grid/")
    assert not ids(jobs, "arm/") and len(ids(jobs, "finetune/classic/")) == 2 * ttq.FINETUNE_SEEDS

    # every option timed, one failed: the grid runs with the fastest of the rest
    done = {j["id"]: {"options": j["options"], "s_per_step": 0.3} for j in jobs if j["kind"] == "speed"}
    fast = {"precision": "bf16", "torch_compile": False, "pad_to_multiple_of": 64}
    done[f"speed/tiny/{ttq._option_id(fast)}"]["s_per_step"] = 0.1
    done["speed/tiny/fp32-compile1-pad0"] = {"options": {}, "failed": "RuntimeError: no compiler"}
    grid = [j for j in ttq.plan(done, ["tiny"], [0, 1], 1.0) if j["id"].startswith("grid/")]
    assert len(grid) == len(ttq.GRID_BATCHES) * len(ttq.GRID_LRS)
    assert all(j["setting"]["pad_to_multiple_of"] == 64 and j["minutes"] == 3 for j in grid)

    # the grid measured: its best points run the full budget with two seeds, and the arms but the Trainer's start
    for i, j in enumerate(grid):
        done[j["id"]] = {"points": [{"selection_accuracy": i / 100}]}
    jobs = ttq.plan(done, ["tiny"], [0, 1], 1.0)
    tops = [j for j in jobs if j["id"].startswith("top/")]
    assert len(tops) == (ttq.TOP + len(ttq.WARMUPS)) * len(ttq.TOP_SEEDS)
    assert {j["setting"]["lr"] for j in tops} == {grid[-1]["setting"]["lr"], grid[-2]["setting"]["lr"],
                                                  grid[-3]["setting"]["lr"]}
    assert f"arm/tiny/{ttq._slug(ttq.OURS)}/s1" in ids(jobs, "arm/")
    assert not ids(jobs, f"arm/tiny/{ttq._slug(ttq.TRAINER)}")

    # the top points measured: the Trainer arm takes the best mean, and its seed-0 run keeps checkpoints
    for j in tops:
        done[j["id"]] = {"points": [{"selection_accuracy": 0.5 if j["setting"] is tops[2]["setting"] else 0.1}]}
    trainer = [j for j in ttq.plan(done, ["tiny"], [0, 1], 1.0) if j.get("arm") == ttq.TRAINER]
    assert [j["checkpoints"] for j in trainer] == [True, False]
    assert all(j["setting"] == tops[2]["setting"] for j in trainer)


def test_a_claim_is_held_by_a_live_process_and_taken_over_from_a_dead_one(tmp_path):
    import os

    work = ttq.Work(tmp_path)
    assert work.claim("grid/tiny/b8-lr0.001") and not work.claim("grid/tiny/b8-lr0.001")  # this process has it
    (tmp_path / "claims" / "grid/tiny/b8-lr0.001").write_text("999999999")  # a process id no process has
    assert work.claim("grid/tiny/b8-lr0.001")
    assert (tmp_path / "claims" / "grid/tiny/b8-lr0.001").read_text() == str(os.getpid())
    work.finish("grid/tiny/b8-lr0.001", {"steps": 3})
    assert work.done() == {"grid/tiny/b8-lr0.001": {"steps": 3}}
    assert not (tmp_path / "claims" / "grid/tiny/b8-lr0.001").exists()
