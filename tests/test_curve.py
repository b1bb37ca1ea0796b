"""The label-efficiency curve's parts: nested subsets, the step floor, the size list, the budget and the
plot (the fine-tunings themselves are faked here; tests/test_demo.py runs real ones)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bertforge.demo import curve as curve_module
from bertforge.demo.curve import BAG_OF_WORDS, Curve, Recipe, Start, finetune_steps, parse_sizes, plot_curve, \
    run_curve, subset

RECIPE = Recipe(epochs=3, min_steps=100, lr=3e-4, batch_size=32, max_seq_length=64, dropout=0.1, precision="fp32")


def test_one_seeds_subsets_are_nested_and_seeds_differ():
    small, large = subset(1000, 100, seed=0), subset(1000, 300, seed=0)
    assert len(small) == 100 and len(set(small)) == 100 and set(small) <= set(large)
    assert list(small) == sorted(small)
    assert set(subset(1000, 100, seed=1)) != set(small)
    assert np.array_equal(subset(1000, 100, seed=0), small)  # the same for every starting point


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


def _fake_finetune(seconds_per_step: float):
    def run(start, train_file, dev_file, out, steps, seed, recipe):
        time.sleep(seconds_per_step * steps)
        labels = [line for line in train_file.read_text().splitlines()]
        return 0.5 + len(labels) / 10_000 + (0.1 if "own" in str(start) else 0.0)
    return run


def test_the_curve_runs_every_start_on_the_same_subsets_and_cuts_sizes_over_the_deadline(tmp_path, monkeypatch):
    seen: list[tuple[str, str]] = []
    fake = _fake_finetune(0.0002)

    def recording(folder, train_file, *args):
        seen.append(("own" if folder.name == "own" else "random", train_file.read_text()))
        return fake(folder, train_file, *args)

    monkeypatch.setattr(curve_module, "_finetune", recording)
    texts = [f"sentence {i} good" if i % 2 else f"sentence {i} bad" for i in range(2000)]
    labels = [i % 2 for i in range(2000)]
    starts = [Start("random", lambda seed: tmp_path / f"random{seed}"), Start("own", lambda seed: tmp_path / "own")]
    c = run_curve(starts, (texts, labels), (texts[:50], labels[:50]), [100, 300, 2000],
                  lambda n: [0, 1, 2] if n <= 300 else [0], RECIPE, tmp_path / "curve", time.perf_counter() + 60)
    assert c.sizes == [100, 300, 2000] and c.cut == []
    assert [len(c.accuracy["own"][n]) for n in c.sizes] == [3, 3, 1]
    assert set(c.accuracy) == {"random", "own", BAG_OF_WORDS}
    by_start = {name: [t for s, t in seen if s == name] for name in ("random", "own")}
    assert by_start["random"] == by_start["own"]  # the same subsets, in the same order
    assert c.mean("own", 100) == pytest.approx(c.mean("random", 100) + 0.1)

    tight = run_curve(starts, (texts, labels), (texts[:50], labels[:50]), [100, 300, 2000],
                      lambda n: [0], RECIPE, tmp_path / "curve2", time.perf_counter() + 0.001, bag_of_words=False)
    assert tight.sizes == [100] and tight.cut == [300, 2000]  # the smallest size always runs
    assert set(tight.accuracy) == {"random", "own"}


def test_the_plot_is_a_png(tmp_path):
    c = Curve(sizes=[100, 1000], cut=[], accuracy={"own": {100: [0.6, 0.62], 1000: [0.7]},
                                                   BAG_OF_WORDS: {100: [0.55], 1000: [0.68]}})
    path = plot_curve(c, tmp_path / "curve.png", "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
