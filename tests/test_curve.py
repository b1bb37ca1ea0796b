"""The label-efficiency curve's parts: the development split, nested subsets, the step floor, the size and
rate lists, the learning-rate choice, the budget and the plot (the fine-tunings themselves are faked
here; tests/test_demo.py runs real ones)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from bertforge.demo import curve as curve_module
from bertforge.demo.curve import BAG_OF_WORDS, Curve, Recipe, Start, dev_split, estimate_seconds, finetune_steps, \
    format_lr, parse_lrs, parse_sizes, planned_runs, plot_curve, run_curve, subset

RECIPE = Recipe(epochs=3, min_steps=100, lrs=(1e-4, 3e-4, 1e-3), batch_size=32, max_seq_length=64, dropout=0.1,
                precision="fp32")
FAR = 10**9  # a deadline no test reaches: the cuts below come from a deadline already passed


def test_one_seeds_subsets_are_nested_and_seeds_differ():
    small, large = subset(1000, 100, seed=0), subset(1000, 300, seed=0)
    assert len(small) == 100 and len(set(small)) == 100 and set(small) <= set(large)
    assert list(small) == sorted(small)
    assert set(subset(1000, 100, seed=1)) != set(small)
    assert np.array_equal(subset(1000, 100, seed=0), small)  # the same for every starting point


def test_the_development_split_is_fixed_and_the_rest_is_everything_else():
    dev, rest = dev_split(1000, 100)
    assert len(dev) == 100 and len(rest) == 900
    assert not set(dev) & set(rest) and set(dev) | set(rest) == set(range(1000))
    assert np.array_equal(dev_split(1000, 100)[0], dev)  # drawn once: the same every time
    assert set(dev) != set(subset(1000, 100, seed=0))  # a seed of its own, not the curve's first
    for bad in (0, 1000):
        with pytest.raises(ValueError, match="development split"):
            dev_split(1000, bad)


def test_fine_tuning_runs_its_epochs_but_at_least_the_floor():
    assert finetune_steps(100, RECIPE) == 100  # 3 passes over 100 are 10 steps
    assert finetune_steps(3000, RECIPE) == 282
    assert finetune_steps(9511, RECIPE) == 892


def test_sizes_parse_with_all_and_cap_at_the_training_set():
    assert parse_sizes("1000, 100,all,300", 9511) == [100, 300, 1000, 9511]
    assert parse_sizes("100,20000", 9511) == [100, 9511]
    for bad in ("100,lots", "0", "-5", ""):
        with pytest.raises(ValueError, match="curve sizes"):
            parse_sizes(bad, 9511)


def test_learning_rates_parse_ascending_and_print_as_written():
    assert parse_lrs("3e-4, 5e-5,1e-4,3e-4") == (5e-5, 1e-4, 3e-4)
    for bad in ("1e-4,fast", "0", "-1e-4", "", "inf"):
        with pytest.raises(ValueError, match="learning rates"):
            parse_lrs(bad)
    assert [format_lr(lr) for lr in (5e-5, 1e-4, 3e-4, 1e-3, 2.5e-4)] == ["5e-5", "1e-4", "3e-4", "1e-3", "2.5e-4"]


def _texts(n: int, tag: str) -> tuple[list[str], list[int]]:
    return [f"{tag} sentence {i} {'good' if i % 2 else 'bad'}" for i in range(n)], [i % 2 for i in range(n)]


def _lines(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


class _Recorder:
    """A fake `_finetune` that records each call and returns the accuracies ``score(start, size, seed, lr)``
    gives for the development and the held-out file."""

    def __init__(self, score):
        self.score = score
        self.calls: list[dict] = []

    def __call__(self, folder, train_file, eval_files, out, steps, seed, lr, recipe):
        dev, held_out = eval_files
        train = _lines(train_file)
        self.calls.append({"start": folder.name, "size": len(train), "seed": seed, "lr": lr, "steps": steps,
                           "train": train, "dev": _lines(dev), "heldout": _lines(held_out)})
        return dict(zip(("dev", "heldout"), self.score(folder.name, len(train), seed, lr)))


def _starts(tmp_path: Path, published_seeds: int | None = None) -> list[Start]:
    return [Start("random", lambda seed: tmp_path / "random"), Start("own", lambda seed: tmp_path / "own"),
            Start("published", lambda seed: tmp_path / "published", max_seeds=published_seeds)]


def test_the_development_split_stays_apart_from_every_subset_and_the_held_out_set(tmp_path, monkeypatch):
    fake = _Recorder(lambda start, size, seed, lr: (0.6, 0.6))
    monkeypatch.setattr(curve_module, "_finetune", fake)
    train, held_out = _texts(2000, "train"), _texts(300, "heldout")
    c = run_curve(_starts(tmp_path, 1), train, held_out, [100, 300, 1800], lambda n: [0, 1, 2] if n <= 300 else [0],
                  RECIPE, tmp_path / "curve", FAR, dev_examples=200)
    assert c.sizes == [100, 300, 1800] and c.cut == [] and (c.dev_examples, c.pool) == (200, 1800)
    dev = set(fake.calls[0]["dev"])
    assert len(dev) == 200 and dev <= set(train[0])
    for call in fake.calls:
        assert set(call["dev"]) == dev and call["heldout"] == held_out[0]  # every run scores the same two files
        assert not dev & set(call["train"]) and not dev & set(held_out[0])
    assert max(len(call["train"]) for call in fake.calls) == 1800  # "all": the whole training set but the split
    seen = {(call["start"], call["seed"], call["size"]): set(call["train"]) for call in fake.calls}
    assert seen["random", 0, 100] <= seen["random", 0, 300] and seen["random", 0, 100] != seen["random", 1, 100]
    assert seen["random", 1, 300] == seen["own", 1, 300]  # the same subsets for every start


def test_each_start_takes_the_rate_best_on_the_development_split_and_the_other_seeds_run_only_at_it(tmp_path,
                                                                                                     monkeypatch):
    best = {"random": 1e-3, "own": 1e-4, "published": 3e-4}

    def score(start, size, seed, lr):
        dev = 0.9 if lr == best[start] else 0.7
        return dev, 0.5 + seed / 100 + lr  # held-out accuracy: higher at other rates, and never chosen on
    fake = _Recorder(score)
    monkeypatch.setattr(curve_module, "_finetune", fake)
    c = run_curve(_starts(tmp_path, 2), _texts(2000, "train"), _texts(100, "heldout"), [100, 300, 1000],
                  lambda n: [0, 1, 2] if n <= 300 else [0], RECIPE, tmp_path / "curve", FAR, dev_examples=200,
                  bag_of_words=False)
    seeds = {"random": [0, 1, 2], "own": [0, 1, 2], "published": [0, 1]}
    for start in best:
        for size in (100, 300, 1000):
            calls = [call for call in fake.calls if (call["start"], call["size"]) == (start, size)]
            size_seeds = seeds[start] if size <= 300 else [0]
            assert len(calls) == len(RECIPE.lrs) + len(size_seeds) - 1 == c.runs[start][size]
            assert len(calls) == planned_runs(RECIPE, _starts(tmp_path, 2)[list(best).index(start)].seeds(size_seeds))
            grid = [call for call in calls if call["seed"] == size_seeds[0]]
            assert sorted(call["lr"] for call in grid) == list(RECIPE.lrs)  # the grid on the first seed only
            assert [(call["seed"], call["lr"]) for call in calls if call not in grid] == \
                   [(seed, best[start]) for seed in size_seeds[1:]]  # the others at the chosen rate only
            assert c.lr[start][size] == best[start]
            assert c.dev_accuracy[start][size] == {lr: 0.9 if lr == best[start] else 0.7 for lr in RECIPE.lrs}
            # the first seed's held-out score is the chosen run's, then the others' in seed order
            assert c.accuracy[start][size] == [pytest.approx(0.5 + s / 100 + best[start]) for s in size_seeds]
    assert all(call["steps"] == finetune_steps(call["size"], RECIPE) for call in fake.calls)
    assert c.to_json()["lr"]["own"] == {"100": 1e-4, "300": 1e-4, "1000": 1e-4}
    assert c.to_json()["dev_accuracy"]["random"]["100"] == {"1e-4": 0.7, "3e-4": 0.7, "1e-3": 0.9}


def test_a_tie_on_the_development_split_goes_to_the_smaller_rate(tmp_path, monkeypatch):
    monkeypatch.setattr(curve_module, "_finetune", _Recorder(lambda start, size, seed, lr: (0.8 if lr > 1e-4 else 0.7,
                                                                                           0.6)))
    c = run_curve(_starts(tmp_path), _texts(500, "train"), _texts(50, "heldout"), [100], lambda n: [0], RECIPE,
                  tmp_path / "curve", FAR, dev_examples=100, bag_of_words=False)
    assert c.lr == {"random": {100: 3e-4}, "own": {100: 3e-4}, "published": {100: 3e-4}}


def test_required_sizes_always_run_and_larger_ones_only_if_they_fit(tmp_path, monkeypatch):
    fake = _Recorder(lambda start, size, seed, lr: (0.7, 0.6))
    monkeypatch.setattr(curve_module, "_finetune", fake)
    starts = _starts(tmp_path, 1)
    past = time.perf_counter() - 1  # a deadline already gone
    c = run_curve(starts, _texts(2000, "train"), _texts(50, "heldout"), [100, 300, 1000, 1800],
                  lambda n: [0, 1], RECIPE, tmp_path / "curve", past, dev_examples=200, required_up_to=1000)
    assert c.sizes == [100, 300, 1000] and c.cut == [1800] and c.required == [100, 300, 1000]
    assert {call["size"] for call in fake.calls} == {100, 300, 1000}
    assert set(c.accuracy) == {"random", "own", "published", BAG_OF_WORDS}
    assert [len(c.accuracy[BAG_OF_WORDS][n]) for n in c.sizes] == [2, 2, 2]
    none = run_curve(starts, _texts(2000, "train"), _texts(50, "heldout"), [100, 300, 1000], lambda n: [0], RECIPE,
                     tmp_path / "curve2", past, dev_examples=200, bag_of_words=False)
    assert none.sizes == [100] and none.cut == [300, 1000]  # nothing required: the smallest size still runs
    everything = run_curve(starts, _texts(2000, "train"), _texts(50, "heldout"), [100, 300, 1800], lambda n: [0],
                           RECIPE, tmp_path / "curve3", FAR, dev_examples=200, bag_of_words=False)
    assert everything.sizes == [100, 300, 1800] and everything.cut == []  # optional sizes run when they fit
    with pytest.raises(ValueError, match="outside the development split"):
        run_curve(starts, _texts(2000, "train"), _texts(50, "heldout"), [1900], lambda n: [0], RECIPE,
                  tmp_path / "curve4", FAR, dev_examples=200)


def test_the_estimate_counts_every_planned_run_at_each_start_s_speed():
    starts = [Start("random", Path), Start("published", Path, max_seeds=1)]
    seeds = lambda n: [0, 1, 2]  # noqa: E731
    one = {"random": 0.1, "published": 0.0}
    # random: 3 rates + 2 more seeds = 5 runs of 100 steps at each of two sizes; published, at no cost, its runs' rest
    run = 100 * 0.1 + 1000 * curve_module.EVAL_COST * 0.1 / 32 + curve_module.RUN_SECONDS
    expected = curve_module.CURVE_MARGIN * (2 * 5 * run + 2 * 3 * curve_module.RUN_SECONDS)
    assert estimate_seconds(one, starts, [100, 300], seeds, RECIPE, 1000) == pytest.approx(expected)
    slower = estimate_seconds({"random": 0.1, "published": 0.3}, starts, [100, 300], seeds, RECIPE, 1000)
    assert slower > estimate_seconds(one, starts, [100, 300], seeds, RECIPE, 1000)


def test_the_plot_is_a_png(tmp_path):
    c = Curve(sizes=[100, 1000], cut=[], accuracy={"own": {100: [0.6, 0.62], 1000: [0.7]},
                                                   BAG_OF_WORDS: {100: [0.55], 1000: [0.68]}})
    path = plot_curve(c, tmp_path / "curve.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
