"""The label-efficiency curve's parts: nested subsets shared by every start, the held-out file, the step
floor, the size list, the range test's rule and its wiring into a cell, paired differences, the budget and
the plot (the fine-tunings themselves are faked here; tests/test_demo.py runs real ones)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from bertforge.demo import curve as curve_module
from bertforge.demo.curve import CLASSIC_BASELINES, Cell, Curve, CurveSpec, CurveTask, FinetuneSettings, Start, choose_lr, \
    baseline_seconds, estimate_seconds, finetune_steps, format_lr, parse_sizes, planned_steps, plot_curve, run_cell, \
    run_cells, run_curve, run_curves, subset
from bertforge.experiments.baselines import CRF, MOST_FREQUENT_TAG, TFIDF
from bertforge.stats import paired_difference
from bertforge.tasks.tagging import read_sentences
from bertforge.train.optim import lr_factor

FINETUNING = FinetuneSettings(epochs=3, min_steps=100, batch_size=32, max_seq_length=64, dropout=0.1, precision="fp32",
                range_top=0.1, range_steps=20, lr_divisor=10.0)
FAR = 10**9  # a deadline no test reaches: the cuts below come from a deadline already passed


def test_one_seeds_subsets_are_nested_and_seeds_differ():
    small, large = subset(1000, 100, seed=0), subset(1000, 300, seed=0)
    assert len(small) == 100 and len(set(small)) == 100 and set(small) <= set(large)
    assert list(small) == sorted(small)
    assert set(subset(1000, 100, seed=1)) != set(small)
    assert np.array_equal(subset(1000, 100, seed=0), small)  # the same for every starting point


def test_fine_tuning_runs_its_epochs_but_at_least_the_floor_and_a_cell_adds_the_range_test():
    assert finetune_steps(100, FINETUNING) == 100  # 3 passes over 100 are 10 steps
    assert finetune_steps(3000, FINETUNING) == 282
    assert finetune_steps(9511, FINETUNING) == 892
    assert planned_steps(100, FINETUNING) == 120 and planned_steps(9511, FINETUNING) == 912
    # a start with epochs and a floor of its own: 1 pass over 9,511 in batches of 32 is 298 steps
    published = Start("published", Path, epochs=1.0, min_steps=50)
    assert finetune_steps(100, FINETUNING, published) == 50 and finetune_steps(9511, FINETUNING, published) == 298
    assert planned_steps(9511, FINETUNING, published) == 318
    assert finetune_steps(9511, FINETUNING, Start("own", Path)) == 892  # none of its own: the settings'


def test_sizes_parse_with_all_and_cap_at_the_training_set():
    assert parse_sizes("1000, 100,all,300", 9511) == [100, 300, 1000, 9511]
    assert parse_sizes("100,20000", 9511) == [100, 9511]
    for bad in ("100,lots", "0", "-5", ""):
        with pytest.raises(ValueError, match="curve sizes"):
            parse_sizes(bad, 9511)


def test_learning_rates_print_as_written_with_two_significant_digits():
    assert [format_lr(lr) for lr in (5e-5, 1e-4, 3e-4, 1e-3, 2.5e-4, 0.00123, 0.1, 7.77e-6)] == \
           ["5e-5", "1e-4", "3e-4", "1e-3", "2.5e-4", "1.2e-3", "1e-1", "7.8e-6"]


# ---------------------------------------------------------------------------- the range test's rule
RATES = [0.001 * (i + 1) for i in range(30)]  # easy to read: the rate at step i is (i + 1) / 1000


def _smoothed(losses: list[float]) -> list[float]:
    """The bias-corrected moving average, written out: each step a weighted mean with weights 0.8 ** age."""
    return [sum(0.8 ** (i - j) * x for j, x in enumerate(losses[:i + 1])) / sum(0.8 ** k for k in range(i + 1))
            for i in range(len(losses))]


def test_choose_lr_takes_the_rate_where_the_smoothed_loss_starts_to_diverge():
    # The loss falls to 1.0, stays, then rises: the smoothed loss (2.0, 1.72, 1.43, 1.28, 1.20, 1.14, 1.11, then
    # 1.32, 1.94) passes 1.25 x its lowest (1.11 -> 1.39) at step 8, not yet at step 7 where the raw loss rises.
    losses = [2.0, 1.5, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 4.0, 8.0, 16.0]
    smooth = _smoothed(losses)
    expected = next(i for i, x in enumerate(smooth) if x > 1.25 * min(smooth[:i + 1]))
    assert expected == 8  # the sequence does what it says: the first rise past 1.25 x
    lr, at = choose_lr(RATES[:len(losses)], losses, divisor=10.0)
    assert at == expected and lr == pytest.approx(RATES[expected] / 10)
    assert choose_lr(RATES[:len(losses)], losses, divisor=4.0)[0] == pytest.approx(RATES[expected] / 4)


def test_a_flat_loss_with_noise_is_read_at_its_divergence_not_at_its_noisy_minimum():
    # A random model on a large subset: the loss stays at ln 2 with noise until it blows up; the lowest smoothed
    # loss is an accident of the first steps, the divergence is not.
    noise = [0.01, -0.012, 0.008, -0.02, 0.015, -0.005, 0.011, -0.009, 0.004, -0.014] * 3
    losses = [0.693 + e for e in noise] + [0.9, 1.4, 2.2, 3.0]
    rates = [0.001 * (i + 1) for i in range(len(losses))]
    lr, at = choose_lr(rates, losses, divisor=30.0)
    assert at >= 30 and lr == pytest.approx(rates[at] / 30)


@pytest.mark.parametrize("bump, stops", [(1.15, False), (1.4, True)])
def test_choose_lr_reads_on_below_the_divergence_line_and_stops_above_it(bump, stops):
    # One step at 1 + 5 (bump - 1): the smoothed loss rises to bump x its lowest, under 1.25 x or over it.
    losses = [1.0] * 6 + [1.0 + 5 * (bump - 1.0)] + [1.0] * 8
    smooth = _smoothed(losses)
    assert (smooth[6] > 1.25 * min(smooth[:7])) == stops  # the sequence does what it says
    lr, at = choose_lr(RATES[:len(losses)], losses, divisor=10.0)
    expected = 6 if stops else len(losses)  # never diverging: the top rate, and a step past the sweep
    assert at == expected and lr == pytest.approx(RATES[min(expected, len(losses) - 1)] / 10)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_choose_lr_stops_at_a_loss_that_is_not_a_number(bad):
    losses = [3.0, 2.0, 1.0, bad, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01]
    assert choose_lr(RATES[:len(losses)], losses, divisor=10.0) == (pytest.approx(RATES[3] / 10), 3)


def test_choose_lr_needs_one_loss_per_rate():
    for lrs, losses in (([], []), (RATES[:3], [1.0, 2.0])):
        with pytest.raises(ValueError, match="one loss per rate"):
            choose_lr(lrs, losses, divisor=10.0)


def test_the_range_schedule_and_choose_lr_agree_on_the_rate_of_each_step():
    # run_cell maps the k-th logged loss to the rate the k-th step trained at: range_top x lr_factor(k, "range")
    n, at = 20, 14
    losses = [5.0 - 0.3 * i for i in range(at)] + [50.0] * (n - at)
    rates = [0.1 * lr_factor(k, total_steps=n, warmup_steps=0, schedule="range") for k in range(n)]
    assert choose_lr(rates, losses, divisor=10.0) == (pytest.approx(rates[at] / 10), at)


# ---------------------------------------------------------------------------- a cell, with the fine-tuning faked
def _example(x) -> tuple:
    """An example as a hashable tuple: (text, label) or (words, tags)."""
    return tuple(tuple(v) if isinstance(v, list) else v for v in x)


def _read_examples(path: Path) -> list[tuple]:
    """A subset or held-out file's examples, as the fine-tuning reads them: (text, label) from JSON Lines,
    (words, tags) from CoNLL."""
    if path.suffix == ".conll":
        return [_example((s.tokens, s.tags)) for s in read_sentences(path)[0]]
    return [_example((r["text"], r["label"])) for r in map(json.loads, path.read_text().splitlines())]


class FakeFinetune:
    """Stands in for `bertforge.demo.curve._finetune`. The range-test run (``schedule="range"``) writes a
    metrics.jsonl of ``losses(cell)`` into the cell's folder, as the training loop logs them (and an eval line
    the rule must skip); the real run returns ``score(cell, lr)`` as its held-out accuracy. Every call is
    recorded with the files' contents at the time (a curve deletes its subset files after each size)."""

    def __init__(self, losses=None, score=None):
        self.losses = losses or (lambda cell: [4.0 - 0.2 * i for i in range(10)]
                                 + [40.0] * (cell.finetuning.range_steps - 10))
        self.score = score or (lambda cell, lr: 0.6)
        self.calls: list[dict] = []

    def __call__(self, cell: Cell, lr: float, steps: int, **settings):
        call = {"cell": cell, "lr": lr, "steps": steps, "settings": settings,
                "train": _read_examples(Path(cell.train_file))}
        self.calls.append(call)
        out = Path(cell.out)
        out.mkdir(parents=True, exist_ok=True)
        if settings.get("schedule") == "range":
            records = [{"split": "train", "step": k + 1, "loss": loss, "lr": 0.0}
                       for k, loss in enumerate(self.losses(cell))]
            records.insert(len(records) // 2, {"split": "eval", "step": 5, "loss": -100.0})
            (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
            return SimpleNamespace(eval_metrics={}, train=SimpleNamespace(interrupted=False))
        call["heldout"] = _read_examples(Path(settings["dev_file"]))
        return SimpleNamespace(eval_metrics={"accuracy": self.score(cell, lr)},
                               train=SimpleNamespace(interrupted=False, step=steps))

    def runs(self) -> list[dict]:
        """The real fine-tunings (not the range tests)."""
        return [c for c in self.calls if c["settings"].get("schedule") != "range"]


def _cell(tmp_path: Path, finetuning: FinetuneSettings = FINETUNING) -> Cell:
    task = CurveTask("toy", "classification", [], [])
    train = task.write(tmp_path / "train.jsonl", [(f"train {i}", i % 2) for i in range(40)])
    heldout = task.write(tmp_path / "heldout.jsonl", [(f"heldout {i}", i % 2) for i in range(10)])
    return Cell("own", 40, 3, str(tmp_path / "model"), str(train), str(heldout), 100, task.settings(), finetuning,
                str(tmp_path / "run-0"))


def test_a_cell_fine_tunes_at_the_rate_its_range_test_picks_and_scores_the_held_out_file(tmp_path, monkeypatch):
    at = 13  # the loss falls to step 12, then blows up at step 13 (past 1.25 x at once)
    fake = FakeFinetune(losses=lambda cell: [5.0 - 0.3 * i for i in range(at)] + [80.0] * (20 - at),
                        score=lambda cell, lr: 0.75)
    monkeypatch.setattr(curve_module, "_finetune", fake)
    cell = _cell(tmp_path)
    got = run_cell(cell)
    range_test, run = fake.calls
    # the range test: range_steps steps on the subset, the rate rising to range_top, no warmup, every loss logged
    assert range_test["settings"]["schedule"] == "range" and range_test["settings"]["warmup_steps"] == 0
    assert (range_test["lr"], range_test["steps"], range_test["settings"]["log_every"]) == (0.1, 20, 1)
    assert "dev_file" not in range_test["settings"]  # it sees no held-out label
    # the real run: the rate where the range test diverged, divided by lr_divisor; the cell's steps; scored on the held-out
    rate_at = 0.1 * lr_factor(at, total_steps=20, warmup_steps=0, schedule="range")
    assert run["lr"] == pytest.approx(rate_at / 10) and run["steps"] == 100
    assert run["settings"]["dev_file"] == cell.heldout_file and run["settings"]["eval_every"] == 100
    assert run["train"] == range_test["train"] == [(f"train {i}", i % 2) for i in range(40)]
    assert run["heldout"] == [(f"heldout {i}", i % 2) for i in range(10)]
    assert got["accuracy"] == 0.75 and got["lr"] == pytest.approx(rate_at / 10)
    assert got["range_test"] == {"lr": pytest.approx(rate_at / 10), "top": 0.1, "diverged_at": pytest.approx(rate_at),
                                 "step": at, "sweeps": 1, "edge": ""}
    assert (got["start"], got["size"], got["seed"]) == ("own", 40, 3)
    assert not Path(cell.out).exists()  # the run folder goes once it is scored


def test_the_divisor_is_the_settings_own(tmp_path, monkeypatch):
    fake = FakeFinetune()
    monkeypatch.setattr(curve_module, "_finetune", fake)
    a = run_cell(_cell(tmp_path / "a"))
    b = run_cell(_cell(tmp_path / "b", replace(FINETUNING, lr_divisor=2.5)))
    assert a["range_test"]["diverged_at"] == b["range_test"]["diverged_at"] and b["lr"] == pytest.approx(4 * a["lr"])


def test_a_cell_with_a_fixed_rate_runs_no_range_test(tmp_path, monkeypatch):
    fake = FakeFinetune(score=lambda cell, lr: lr)
    monkeypatch.setattr(curve_module, "_finetune", fake)
    got = run_cell(replace(_cell(tmp_path), lr=3e-4))
    (run,) = fake.calls
    assert run["lr"] == 3e-4 and run["settings"].get("schedule") is None and run["steps"] == 100
    assert got["lr"] == got["accuracy"] == 3e-4 and got["range_test"] is None


def test_a_sweep_that_never_diverges_is_run_again_higher_and_the_choice_has_no_ceiling(tmp_path, monkeypatch):
    # Stable up to 0.1 x 100 / 10 ** 4 x 10 ** (4 * 15 / 19): the first sweep (to 0.1) never diverges, the second (to 10)
    # does, at step 15; the choice is that rate over the divisor, far above the first sweep's top / divisor.
    def losses(cell, tops=[]):
        tops.append(len(tops))
        return [1.0] * 20 if len(tops) == 1 else [1.0] * 15 + [9.0] * 5

    fake = FakeFinetune(losses=losses)
    monkeypatch.setattr(curve_module, "_finetune", fake)
    got = run_cell(_cell(tmp_path))
    first, second, run = fake.calls
    assert (first["lr"], second["lr"]) == (0.1, pytest.approx(10.0))
    rate_at = 10.0 * lr_factor(15, total_steps=20, warmup_steps=0, schedule="range")
    assert got["range_test"] == {"lr": pytest.approx(rate_at / 10), "top": pytest.approx(10.0),
                                 "diverged_at": pytest.approx(rate_at), "step": 15, "sweeps": 2, "edge": ""}
    assert run["lr"] == pytest.approx(rate_at / 10) and rate_at / 10 > 0.1 / 10


@pytest.mark.parametrize("loss, edge, tops", [(lambda: [1.0] * 20, "top", [0.1, 10.0, 1000.0]),
                                              (lambda: [1.0, 9.0] + [9.0] * 18, "bottom", [0.1, 1e-3, 1e-5])])
def test_a_range_test_still_on_an_edge_after_its_sweeps_is_flagged(tmp_path, monkeypatch, loss, edge, tops):
    fake = FakeFinetune(losses=lambda cell: loss())
    monkeypatch.setattr(curve_module, "_finetune", fake)
    got = run_cell(_cell(tmp_path))
    assert [c["lr"] for c in fake.calls[:-1]] == pytest.approx(tops)  # MAX_SWEEPS sweeps, shifted by SWEEP_SHIFT
    assert got["range_test"]["edge"] == edge and got["range_test"]["sweeps"] == curve_module.MAX_SWEEPS
    assert (got["range_test"]["diverged_at"] is None) == (edge == "top")


def test_cells_run_costliest_first_and_come_back_in_their_order(tmp_path, monkeypatch):
    fake = FakeFinetune(score=lambda cell, lr: cell.seed / 10)
    monkeypatch.setattr(curve_module, "_finetune", fake)
    cells = [replace(_cell(tmp_path), seed=s, out=str(tmp_path / f"run-{s}"), cost=c)
             for s, c in ((2, 1.0), (0, 5.0), (1, 3.0), (3, 3.0))]
    ended = []
    got = run_cells(cells, workers=1, done=lambda i, r: ended.append((i, r["seed"])))
    assert [r["accuracy"] for r in got] == [0.2, 0.0, 0.1, 0.3]  # the cells' order
    assert [c["cell"].seed for c in fake.runs()] == [0, 1, 3, 2]  # the costliest first; equal costs in their order
    assert ended == [(1, 0), (2, 1), (3, 3), (0, 2)]  # each reported as it ends, by its index


def test_curves_run_their_required_cells_in_one_pool_then_the_optional_sizes(tmp_path, monkeypatch):
    monkeypatch.setattr(curve_module, "_finetune", FakeFinetune())
    pools = []
    real = curve_module.run_cells

    def spy(cells, workers=1, done=None):
        pools.append(sorted({(Path(c.out).parent.name, c.size) for c in cells}))
        return real(cells, workers, done)

    monkeypatch.setattr(curve_module, "run_cells", spy)
    starts = [replace(s, step_seconds=t) for s, t in zip(_starts(tmp_path, 1), (0.1, 0.1, 2.0))]
    specs = [CurveSpec(starts, _task(400, 20), [20, 60, 400], tmp_path / "a", baselines=[TFIDF]),
             CurveSpec(starts[1:2], _task(400, 20, "tagging"), [20], tmp_path / "b")]
    a, b = run_curves(specs, lambda n: [0, 1], FINETUNING, FAR, required_up_to=60)
    assert pools == [[("a", 20), ("a", 60), ("b", 20)], [("a", 400)]]  # one pool for the required, then 400
    assert a.sizes == [20, 60, 400] and b.sizes == [20] and a.required == [20, 60] and b.required == [20]
    assert set(a.accuracy) == {"random", "own", "published", TFIDF} and set(b.accuracy) == {"own"}
    assert [len(a.accuracy["own"][n]) for n in a.sizes] == [2, 2, 2] and len(a.accuracy["published"][20]) == 1
    assert a.size_seconds[20] == pytest.approx(sum(a.seconds.values()) - a.size_seconds[60]
                                               - a.size_seconds[400])  # compute seconds, by size
    assert not list((tmp_path / "a").glob("train-*")) and not list((tmp_path / "b").glob("train-*"))


# ---------------------------------------------------------------------------- a curve, with the fine-tuning faked
def _task(n_train: int, n_heldout: int, family: str = "classification") -> CurveTask:
    if family == "tagging":
        return CurveTask("tags", "tagging", [([f"w{i}", "runs"], ["NOUN", "VERB"]) for i in range(n_train)],
                         [([f"h{i}", "runs"], ["NOUN", "VERB"]) for i in range(n_heldout)], "tagged sentences")
    return CurveTask("toy", "classification",
                     [(f"train sentence {i} {'good' if i % 2 else 'bad'}", i % 2) for i in range(n_train)],
                     [(f"heldout sentence {i} {'good' if i % 2 else 'bad'}", i % 2) for i in range(n_heldout)])


def _starts(tmp_path: Path, published_seeds: int | None = None) -> list[Start]:
    return [Start("random", lambda seed: tmp_path / f"random-seed{seed}"), Start("own", lambda seed: tmp_path / "own"),
            Start("published", lambda seed: tmp_path / "published", max_seeds=published_seeds)]


@pytest.mark.parametrize("family", ["classification", "tagging"])
def test_every_start_sees_the_same_subset_files_per_seed_and_every_cell_the_same_held_out_file(tmp_path, monkeypatch,
                                                                                                family):
    fake = FakeFinetune()
    monkeypatch.setattr(curve_module, "_finetune", fake)
    task = _task(600, 50, family)
    c = run_curve(_starts(tmp_path, 1), task, [100, 300, 600], lambda n: [0, 1, 2] if n <= 300 else [0], FINETUNING,
                  tmp_path / "curve", FAR, workers=1)
    assert c.sizes == [100, 300, 600] and c.cut == [] and (c.pool, c.heldout) == (600, 50)
    runs = fake.runs()
    assert len(runs) == len(fake.calls) // 2 == (3 + 3 + 1) * 2 + 3  # a range test before each run
    files, seen = {}, {}
    for call in runs:
        cell = call["cell"]
        files.setdefault((cell.size, cell.seed), set()).add(cell.train_file)
        seen[cell.start, cell.size, cell.seed] = set(call["train"])
        assert cell.folder == str(tmp_path / (f"random-seed{cell.seed}" if cell.start == "random" else cell.start))
        assert cell.steps == call["steps"] == finetune_steps(cell.size, FINETUNING) and cell.task_settings == task.settings()
        assert len(call["train"]) == cell.size
    assert all(len(paths) == 1 for paths in files.values())  # one file per size and seed, whatever the start
    for (start, size, seed), examples in seen.items():
        assert examples == seen["random", size, seed]  # every start: the same examples ...
        assert examples == {_example(task.train[i]) for i in subset(600, size, seed)}  # ... the seed's subset
    assert seen["own", 100, 1] <= seen["own", 300, 1] and seen["own", 100, 0] != seen["own", 100, 1]
    assert len(seen["own", 600, 0]) == 600  # the largest size is the whole training set
    # the range test and the run of a cell read the same subset file
    for range_test, run in zip(fake.calls[::2], fake.calls[1::2]):
        assert range_test["settings"]["schedule"] == "range" and range_test["cell"] == run["cell"]
    # one held-out file for every cell, holding the held-out examples as given; no subset example in it (the
    # inputs do not overlap, and the curve adds none)
    assert len({call["settings"]["dev_file"] for call in runs}) == 1
    expected = [_example(x) for x in task.heldout]
    for call in runs:
        assert call["heldout"] == expected
        assert not set(expected) & set(call["train"])
    assert not list((tmp_path / "curve").glob("train-*"))  # the subset files go once their size is done


def test_the_curve_records_each_cell_s_rate_and_accuracy_by_seed(tmp_path, monkeypatch):
    # each start's range test diverges at a different step; the held-out score tells the seeds apart
    minimum = {"random": 4, "own": 8, "published": 12}
    fake = FakeFinetune(
        losses=lambda cell: [5.0 - 0.3 * i for i in range(minimum[cell.start])]
        + [80.0] * (20 - minimum[cell.start]),
        score=lambda cell, lr: 0.5 + cell.seed / 100 + (cell.start == "own") / 10)
    monkeypatch.setattr(curve_module, "_finetune", fake)
    c = run_curve(_starts(tmp_path, 2), _task(500, 20), [100, 300], lambda n: [0, 1, 2], FINETUNING, tmp_path / "curve",
                  FAR)
    for start, at in minimum.items():
        rate = 0.1 * lr_factor(at, total_steps=20, warmup_steps=0, schedule="range") / 10
        seeds = [0, 1] if start == "published" else [0, 1, 2]
        for size in (100, 300):
            assert c.lr[start][size] == [pytest.approx(rate)] * len(seeds)
            assert c.accuracy[start][size] == [pytest.approx(0.5 + s / 100 + (start == "own") / 10) for s in seeds]
    assert c.seeds == {100: [0, 1, 2], 300: [0, 1, 2]} and c.steps == {100: 100, 300: 100}
    assert set(c.accuracy) == {"random", "own", "published"}  # no baseline asked for
    assert all(c.seconds[s] >= 0 for s in minimum) and set(c.size_seconds) == {100, 300}


def test_required_sizes_always_run_and_larger_ones_only_if_they_fit(tmp_path, monkeypatch):
    fake = FakeFinetune()
    monkeypatch.setattr(curve_module, "_finetune", fake)
    starts = _starts(tmp_path, 1)
    past = time.perf_counter() - 1  # a deadline already gone
    c = run_curve(starts, _task(400, 50), [20, 60, 400], lambda n: [0, 1], FINETUNING, tmp_path / "curve", past,
                  required_up_to=60, baselines=[TFIDF])
    assert c.sizes == [20, 60] and c.cut == [400] and c.required == [20, 60]
    assert {call["cell"].size for call in fake.calls} == {20, 60}
    assert set(c.accuracy) == {"random", "own", "published", TFIDF} and c.baselines == [TFIDF]
    assert [len(c.accuracy[TFIDF][n]) for n in c.sizes] == [2, 2]  # the same subsets, one per seed
    assert all(0 <= a <= 1 for n in c.sizes for a in c.accuracy[TFIDF][n])
    assert all(s["C"] > 0 for n in c.sizes for s in c.baseline_settings[TFIDF][n])
    none = run_curve(starts, _task(400, 50), [20, 60, 200], lambda n: [0], FINETUNING, tmp_path / "curve2", past)
    assert none.sizes == [20] and none.cut == [60, 200] and none.required == [20]  # the smallest still runs
    everything = run_curve(starts, _task(400, 50), [20, 60, 400], lambda n: [0], FINETUNING, tmp_path / "curve3", FAR)
    assert everything.sizes == [20, 60, 400] and everything.cut == []  # optional sizes run when they fit
    with pytest.raises(ValueError, match="more than the 400 training examples"):
        run_curve(starts, _task(400, 50), [401], lambda n: [0], FINETUNING, tmp_path / "curve4", FAR)


# ---------------------------------------------------------------------------- paired differences
def _curve() -> Curve:
    return Curve(task="toy", sizes=[100, 300], cut=[], seeds={100: [0, 1, 2], 300: [0, 1, 2]},
                 accuracy={"own": {100: [0.71, 0.70, 0.72], 300: [0.80, 0.70, 0.76]},
                           "random": {100: [0.63, 0.64, 0.62], 300: [0.78, 0.74, 0.73]},
                           "published": {100: [0.90], 300: [0.91]}})


def test_a_difference_is_paired_seed_by_seed_over_the_seeds_both_ran():
    c = _curve()
    assert c.difference("own", "random", 100) == paired_difference([0.71, 0.70, 0.72], [0.63, 0.64, 0.62])
    d = c.difference("own", "random", 100)
    assert d.resolved and d.mean == pytest.approx(0.08) and d.n == 3
    noisy = c.difference("own", "random", 300)
    assert not noisy.resolved and noisy.mean == pytest.approx(0.01 / 3) and noisy.low < 0 < noisy.high
    one = c.difference("published", "random", 100)  # one seed of the published checkpoint: its pair with seed 0
    assert one == paired_difference([0.90], [0.63]) and one.n == 1 and one.low is None and not one.resolved


def test_to_json_gives_the_paired_intervals_of_the_comparisons_asked_for():
    c = _curve()
    got = c.to_json([("own", "random"), ("published", "random"), (TFIDF, "random")])
    assert set(got["differences"]) == {"own - random", "published - random"}  # a line not on the curve: skipped
    for n in (100, 300):
        d = paired_difference(c.accuracy["own"][n], c.accuracy["random"][n])
        assert got["differences"]["own - random"][str(n)] == {**d.to_json(), "resolved": d.resolved}
    assert got["differences"]["own - random"]["100"]["resolved"] is True
    assert got["differences"]["own - random"]["300"]["resolved"] is False
    assert got["differences"]["published - random"]["100"]["n"] == 1
    assert got["interval"]["own"]["100"]["mean"] == pytest.approx(0.71) and got["interval"]["own"]["100"]["n"] == 3
    assert got["accuracy"]["random"]["300"] == [0.78, 0.74, 0.73] and got["seeds"] == {"100": [0, 1, 2],
                                                                                        "300": [0, 1, 2]}
    assert c.to_json()["differences"] == {}
    json.dumps(got)  # plain JSON


# ---------------------------------------------------------------------------- the budget, the files, the plot
def test_the_estimate_counts_range_test_and_fine_tuning_steps_of_every_cell_and_divides_by_the_speedup():
    def seeds(size: int) -> list[int]:
        return [0, 1, 2]

    starts = [Start("random", Path, step_seconds=0.1), Start("published", Path, max_seeds=1, step_seconds=0.3)]
    m = curve_module

    def cell(size: int, step: float) -> float:
        steps = FINETUNING.range_steps + max(math.ceil(3 * size / 32), 100)  # 20 + 100 at 100 examples, 20 + 282 at 3,000
        return steps * step + 1000 * m.EVAL_COST * step / 32 + 2 * m.RUN_SECONDS

    expected = m.CURVE_MARGIN * sum(3 * cell(n, 0.1) + 1 * cell(n, 0.3) for n in (100, 3000))
    assert estimate_seconds(starts, [100, 3000], seeds, FINETUNING, 1000) == pytest.approx(expected)
    assert estimate_seconds(starts, [100, 3000], seeds, FINETUNING, 1000, speedup=1.6) == \
           pytest.approx(expected / 1.6)
    free = [Start("random", Path), Start("own", Path)]  # no step timed: each cell costs its two runs' overhead
    assert estimate_seconds(free, [100], seeds, FINETUNING, 1000) == pytest.approx(m.CURVE_MARGIN * 6 * 2 * m.RUN_SECONDS)
    longer = replace(FINETUNING, range_steps=120)  # a longer range test costs its steps
    assert estimate_seconds(starts, [100], seeds, longer, 0) - estimate_seconds(starts, [100], seeds, FINETUNING, 0) == \
           pytest.approx(m.CURVE_MARGIN * 100 * (3 * 0.1 + 0.3))


def test_a_tagging_task_writes_conll_the_tagging_family_reads(tmp_path):
    task = CurveTask("pos", "tagging", [(["The", "cat", "sat", "."], ["DET", "NOUN", "VERB", "."]),
                                        (["It", "ran"], ["PRON", "VERB"])], [], "tagged sentences")
    path = task.write(tmp_path / f"train{task.suffix}", task.train)
    assert path.suffix == ".conll" and task.settings() == {"task": "tagging", "tag_piece": "first"}
    assert replace(task, tag_piece="last").settings() == {"task": "tagging", "tag_piece": "last"}
    assert path.read_text() == "The DET\ncat NOUN\nsat VERB\n. .\n\nIt PRON\nran VERB\n\n"
    sentences, report = read_sentences(path)
    assert [(s.tokens, s.tags) for s in sentences] == [(list(w), list(t)) for w, t in task.train]
    assert report.num_skipped == 0
    text = CurveTask("mr", "classification", [("a good film", 1), ("dull", 0)], [])
    file = text.write(tmp_path / f"train{text.suffix}", text.train)
    assert file.suffix == ".jsonl" and [json.loads(line) for line in file.read_text().splitlines()] == \
           [{"text": "a good film", "label": 1}, {"text": "dull", "label": 0}]
    assert text.settings() == {"task": "classification", "text_column": "text", "label_column": "label"}


def test_the_plot_is_a_png_with_a_panel_per_task(tmp_path):
    a = Curve(task="movie reviews", sizes=[100, 1000], cut=[],
              accuracy={"own": {100: [0.6, 0.62, 0.65], 1000: [0.7]}, TFIDF: {100: [0.55], 1000: [0.68]}})
    b = Curve(task="pos", sizes=[100], cut=[], accuracy={"own": {100: [0.8, 0.82]}})
    path = plot_curve([a, b], tmp_path / "curve.png", ["reviews", "tags"], {"own": "tab:blue"})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


# ---------------------------------------------------------------------------- the classic baselines on the curve
def _pos_task(n_train: int, n_heldout: int) -> CurveTask:
    """Determiner, then "walk" (a noun) or a noun; then "walk" (a verb) or a verb: context decides "walk"."""
    rng = np.random.default_rng(0)

    def sentence() -> tuple[list[str], list[str]]:
        noun = "walk" if rng.random() < 0.4 else str(rng.choice(["dog", "cat", "idea"]))
        verb = "walk" if noun != "walk" and rng.random() < 0.4 else str(rng.choice(["runs", "sleeps"]))
        return ["the", noun, verb], ["DET", "NOUN", "VERB"]

    return CurveTask("pos", "tagging", [sentence() for _ in range(n_train)], [sentence() for _ in range(n_heldout)],
                     "tagged sentences")


def test_baselines_fit_the_same_subsets_as_the_starts_and_pair_with_them_by_seed(tmp_path, monkeypatch):
    fake = FakeFinetune()
    monkeypatch.setattr(curve_module, "_finetune", fake)
    task = _pos_task(300, 60)
    seen = []
    real = curve_module.run_baseline

    def spy(cell):
        seen.append((cell.start, cell.size, cell.seed, cell.train_file, Path(cell.train_file).read_text()))
        return real(cell)

    monkeypatch.setattr(curve_module, "run_baseline", spy)
    c = run_curve(_starts(tmp_path)[:1], task, [30, 100], lambda n: [0, 1], FINETUNING, tmp_path / "curve", FAR,
                  baselines=CLASSIC_BASELINES["tagging"])
    assert c.baselines == [CRF, MOST_FREQUENT_TAG] and set(c.accuracy) == {"random", CRF, MOST_FREQUENT_TAG}
    assert len(seen) == 2 * 2 * 2  # two baselines, two sizes, two seeds
    runs = {(call["cell"].size, call["cell"].seed): call["cell"].train_file for call in fake.runs()}
    for name, size, seed, file, text in seen:
        assert runs[size, seed] == file  # the fine-tuning's own subset file ...
        words = {line.split()[0] for line in text.splitlines() if line}
        assert len(text.strip().split("\n\n")) == size and words  # ... holding that size's sentences
    for n in (30, 100):
        assert len(c.accuracy[CRF][n]) == len(c.accuracy[MOST_FREQUENT_TAG][n]) == 2
        assert all(crf > mft for crf, mft in zip(c.accuracy[CRF][n], c.accuracy[MOST_FREQUENT_TAG][n]))
        assert c.accuracy[CRF][n] == [pytest.approx(1.0, abs=0.02)] * 2  # context tells "walk" apart
    assert c.seconds[CRF] > 0 and c.baseline_settings[CRF][30] == [{"c1": 0.1, "c2": 0.1, "max_iterations": 100}] * 2
    d = c.difference(CRF, "random", 30)
    assert d.n == 2


def test_the_estimate_counts_each_baseline_fit_per_seed():
    def seeds(size: int) -> list[int]:
        return [0, 1, 2]

    base = estimate_seconds([], [100, 1000], seeds, FINETUNING, 0)
    got = estimate_seconds([], [100, 1000], seeds, FINETUNING, 0, baselines=[CRF, TFIDF])
    expected = 3 * sum(baseline_seconds(b, n) for b in (CRF, TFIDF) for n in (100, 1000))
    assert base == 0 and got == pytest.approx(curve_module.CURVE_MARGIN * expected)
    assert baseline_seconds(CRF, 1000) > 3 * baseline_seconds(TFIDF, 1000)  # the CRF's iterations cost
