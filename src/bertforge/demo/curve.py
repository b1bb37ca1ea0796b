"""The label-efficiency curve, the demo's main result: held-out accuracy against the number of
labelled training examples, one line per starting point, each fine-tuned with one recipe on the same
subsets, under the true few-shot protocol.

- **True few-shot (Perez et al., 2021).** A point at ``n`` examples uses those ``n`` labels and no
  other: there is no development split. The one choice a fine-tuning needs, its peak learning rate, is
  made by a rule fixed in advance that reads only the ``n`` examples: a learning-rate range test
  (Smith, 2017) on them, the rate a factor below the one where training diverges (`run_cell`,
  `choose_lr`). Nothing is chosen on the held-out set, which is
  only ever scored, once, after the last step.
- **Nested subsets, paired seeds.** Seed ``s`` permutes the training set once; the subset of size ``n``
  is the first ``n`` examples of that permutation, so one seed's subsets are nested (its 300 hold its
  100), and every starting point sees exactly the same examples in the same order with the same head
  initialisation (where the starts share a shape). The starts' scores on a seed are therefore *paired*,
  and the report compares two lines by their difference seed by seed (`bertforge.stats`).
- **A floor on steps.** Each fine-tuning runs ``epochs`` passes over its subset, but at least
  ``min_steps`` optimizer steps: a hundred examples are three batches, and the curve would otherwise
  measure how little training happened rather than what the starting point knew.
- **Cells run side by side.** A cell (a start, a size, a seed: the range test, then the fine-tuning) is
  a function of files only, so ``workers`` processes of one thread each run cells at once: a tiny
  model does not use two cores well in one process.
- **A budget.** The sizes up to ``required_up_to`` always run (`estimate_seconds` lets a caller plan for
  them before anything trains). A larger size runs only if it fits: before it, its time is estimated
  from the runs so far, and it and the larger sizes are left out when it would not end within the
  deadline.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.console import errors_only
from bertforge.io import atomic_path, atomic_write_text
from bertforge.stats import Interval, mean_interval, paired_difference

__all__ = ["Recipe", "Start", "CurveTask", "Curve", "Cell", "parse_sizes", "format_lr", "subset", "finetune_steps",
           "planned_steps", "estimate_seconds", "choose_lr", "run_cell", "run_cells", "run_curve", "plot_curve",
           "plot_minutes", "BAG_OF_WORDS"]

logger = logging.getLogger("bertforge")

BAG_OF_WORDS = "bag of words"
"""The curve's line for the bag-of-words logistic regression (`bertforge.demo.baselines`)."""
HELD_OUT = "heldout"
"""The held-out file of a task (``heldout.jsonl`` / ``heldout.conll``)."""

EVAL_COST = 0.3
"""Time to score an example, as a share of a training step's time per example (a forward pass without
gradients, on the faster inference path)."""
RUN_SECONDS = 1.5
"""A fine-tuning's time beside its steps and its evaluation: reading the checkpoint and the subset,
building the optimizer, saving the final model (twice a cell: the range test and the run)."""
CURVE_MARGIN = 1.1
"""`estimate_seconds` is this much over the sum of its parts (steps timed in isolation run a little
faster than in a run)."""
SMOOTHING = 0.8
"""Weight of the past in the range test's smoothed loss (an exponential moving average, bias-corrected)."""
DIVERGED = 1.25
"""The range test's training has diverged once its smoothed loss exceeds this multiple of its lowest so far."""


@dataclass(frozen=True)
class Recipe:
    """The one fine-tuning recipe every starting point gets; its peak learning rate is chosen per start,
    size and seed by the range test (`choose_lr`)."""

    epochs: float
    min_steps: int
    batch_size: int
    max_seq_length: int
    dropout: float
    precision: str
    range_top: float = 1e-1
    """The range test's highest rate: it rises geometrically to it from 1/10,000 of it
    (`bertforge.train.optim.RANGE_DECADES`)."""
    range_steps: int = 50
    """Steps of the range test."""
    lr_divisor: float = 30.0
    """The chosen rate is the rate at which the range test diverges divided by this (Smith (2017) takes the
    peak a factor of 3 to 10 below the divergence for a cyclic schedule; a fine-tuning of hundreds of steps
    at its peak for longer wants a wider margin)."""


@dataclass(frozen=True)
class Start:
    """A line of the curve: a name and the checkpoint folder fine-tuning starts from for a seed (a
    function of the seed, so a random initialisation can be drawn anew for each)."""

    name: str
    folder: Callable[[int], Path]
    max_seeds: int | None = None
    """Run at most this many of a size's seeds, the first ones (None: all)."""
    step_seconds: float = 0.0
    """A timed training step (the plan's estimate; 0: unknown)."""
    min_steps: int | None = None
    """This start's floor on fine-tuning steps, where it learns in fewer than the recipe's (None: the
    recipe's): a costly published checkpoint that converges early."""

    def seeds(self, size_seeds: Sequence[int]) -> list[int]:
        """The seeds this start runs of a size's ``size_seeds``."""
        return list(size_seeds[:self.max_seeds])


@dataclass(frozen=True)
class CurveTask:
    """A labelled task on the curve: its training examples (the subsets' pool) and held-out examples, as
    the fine-tuning family reads them. ``examples`` are ``(text, label)`` for classification and
    ``(words, tags)`` for tagging."""

    name: str
    family: str
    train: Sequence[tuple[Any, Any]]
    heldout: Sequence[tuple[Any, Any]]
    unit: str = "examples"
    """What an example is, for the report (sentences, tagged sentences)."""

    @property
    def suffix(self) -> str:
        return ".conll" if self.family == "tagging" else ".jsonl"

    def write(self, path: Path, examples: Sequence[tuple[Any, Any]]) -> Path:
        """``examples`` as the family's file format: JSON Lines ``{"text", "label"}`` or CoNLL columns."""
        if self.family == "tagging":
            text = "".join("".join(f"{w} {t}\n" for w, t in zip(words, tags)) + "\n" for words, tags in examples)
        else:
            text = "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in examples)
        atomic_write_text(path, text)
        return path

    def settings(self) -> dict[str, str]:
        """The fine-tuning settings that read this task's files."""
        if self.family == "tagging":
            return {"task": "tagging"}
        return {"task": self.family, "text_column": "text", "label_column": "label"}


@dataclass(frozen=True)
class Cell:
    """One point of one seed: a start at a size, fine-tuned on a subset file; a function of files only
    (so that it runs in any process)."""

    start: str
    size: int
    seed: int
    folder: str
    train_file: str
    heldout_file: str
    steps: int
    task: dict[str, str]
    recipe: Recipe
    out: str


def parse_sizes(spec: str, total: int) -> list[int]:
    """``"100,300,1000,all"`` as ascending sizes; ``all`` (and any size over it) is ``total``."""
    sizes = set()
    for part in spec.replace(" ", "").split(","):
        if part == "all":
            sizes.add(total)
            continue
        try:
            n = int(part)
        except ValueError:
            raise ValueError(f"curve sizes: {part!r} is neither a whole number nor 'all' (in {spec!r})") from None
        if n < 1:
            raise ValueError(f"curve sizes: {n} is not a positive number of examples (in {spec!r})")
        sizes.add(min(n, total))
    if not sizes:
        raise ValueError("curve sizes: give at least one size")
    return sorted(sizes)


def format_lr(lr: float) -> str:
    """A learning rate as people write it: 5e-05 -> ``5e-5``, 0.0003 -> ``3e-4``, 0.00123 -> ``1.2e-3``."""
    mantissa, exponent = f"{lr:.1e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def subset(total: int, size: int, seed: int) -> np.ndarray:
    """Indices of the first ``size`` examples of seed ``seed``'s permutation of ``range(total)``, in
    ascending order: the subsets of one seed are nested."""
    return np.sort(np.random.default_rng(seed).permutation(total)[:size])


def finetune_steps(size: int, recipe: Recipe, min_steps: int | None = None) -> int:
    """Optimizer steps of a fine-tuning on ``size`` examples: ``epochs`` passes, at least ``min_steps``
    (None: the recipe's)."""
    floor = recipe.min_steps if min_steps is None else min_steps
    return max(math.ceil(recipe.epochs * size / recipe.batch_size), floor)


def planned_steps(size: int, recipe: Recipe, min_steps: int | None = None) -> int:
    """Training steps of a cell at ``size``: the range test's and the fine-tuning's."""
    return recipe.range_steps + finetune_steps(size, recipe, min_steps)


def estimate_seconds(starts: Sequence[Start], sizes: Sequence[int], seeds: Callable[[int], list[int]],
                     recipe: Recipe, eval_examples: int, speedup: float = 1.0) -> float:
    """Wall time the cells of ``starts`` at ``sizes`` should take, from each start's timed step
    (`Start.step_seconds`): each cell's steps, its evaluation of ``eval_examples`` examples (`EVAL_COST`)
    and 2 x `RUN_SECONDS`, divided by ``speedup`` (what the worker processes gain over one), times
    `CURVE_MARGIN`."""
    total = 0.0
    for size in sizes:
        for start in starts:
            step = start.step_seconds
            cell = (planned_steps(size, recipe, start.min_steps) * step
                    + eval_examples * EVAL_COST * step / recipe.batch_size + 2 * RUN_SECONDS)
            total += len(start.seeds(seeds(size))) * cell
    return CURVE_MARGIN * total / max(speedup, 1e-9)


def choose_lr(lrs: Sequence[float], losses: Sequence[float], divisor: float) -> tuple[float, int]:
    """The range test's rule: smooth the losses (a bias-corrected moving average, `SMOOTHING`), find the
    first step where the smoothed loss has risen past `DIVERGED` x its lowest value so far (or is not
    finite): training at that rate has started to diverge; take that step's rate divided by ``divisor``.
    A test that never diverges gives its top rate divided by ``divisor``. Returns the rate and the step.

    Divergence, not the lowest loss, is what the rule reads: on a subset where no rate lowers the loss
    within the test (a randomly initialised model on a thousand sentences stays at ln 2 until it
    diverges), the lowest loss is noise at the test's first steps, while the rise is unmistakable."""
    if not losses or len(lrs) != len(losses):
        raise ValueError(f"a range test needs one loss per rate, got {len(losses)} losses and {len(lrs)} rates")
    avg, best = 0.0, math.inf
    for i, loss in enumerate(losses):
        if not math.isfinite(loss):
            return lrs[i] / divisor, i
        avg = SMOOTHING * avg + (1 - SMOOTHING) * loss
        smooth = avg / (1 - SMOOTHING ** (i + 1))
        best = min(best, smooth)
        if smooth > DIVERGED * best:
            return lrs[i] / divisor, i
    return lrs[-1] / divisor, len(losses) - 1


def _finetune(cell: Cell, lr: float, steps: int, **settings: Any) -> Any:
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    with errors_only():
        res = finetune(FinetuneConfig(
            **cell.task, model=cell.folder, train_file=cell.train_file, out=cell.out, overwrite=True, max_steps=steps,
            lr=lr, batch_size=cell.recipe.batch_size, max_seq_length=cell.recipe.max_seq_length,
            dropout=cell.recipe.dropout, precision=cell.recipe.precision, seed=cell.seed, keep_best=False,
            checkpoint_every=10**9, progress=False, **settings))
    if res.train.interrupted:
        raise KeyboardInterrupt(f"fine-tuning stopped at step {res.train.step} ({cell.out})")
    return res


def run_cell(cell: Cell) -> dict[str, Any]:
    """A cell: the range test on the subset (its losses from the run's metrics), the rate `choose_lr`
    picks, then the fine-tuning at that rate, scored once on the held-out file after its last step.
    The run folders are removed (a curve is hundreds of runs); the figures are returned."""
    from bertforge.train.optim import lr_factor

    recipe = cell.recipe
    t0 = time.perf_counter()
    _finetune(cell, recipe.range_top, recipe.range_steps, schedule="range", warmup_steps=0, log_every=1,
              eval_every=0)
    records = [json.loads(line) for line in (Path(cell.out) / "metrics.jsonl").read_text().splitlines()]
    losses = [float(r["loss"]) for r in records if r.get("split") == "train"]
    rates = [recipe.range_top * lr_factor(i, total_steps=recipe.range_steps, warmup_steps=0, schedule="range")
             for i in range(len(losses))]  # the rate each logged step trained at
    lr, at = choose_lr(rates, losses, recipe.lr_divisor)
    res = _finetune(cell, lr, cell.steps, dev_file=cell.heldout_file, eval_every=cell.steps,
                    log_every=max(1, cell.steps // 5))
    shutil.rmtree(cell.out, ignore_errors=True)
    return {"start": cell.start, "size": cell.size, "seed": cell.seed, "accuracy": float(res.eval_metrics["accuracy"]),
            "lr": lr, "diverged_at": rates[at], "seconds": time.perf_counter() - t0}


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def run_cells(cells: Sequence[Cell], workers: int = 1) -> list[dict[str, Any]]:
    """``cells`` in this process (``workers`` 1) or in ``workers`` processes of one thread each; the
    results in the cells' order."""
    if workers <= 1 or len(cells) <= 1:
        return [run_cell(c) for c in cells]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_one_thread) as pool:
        return list(pool.map(run_cell, cells))


@dataclass
class Curve:
    """What `run_curve` measured on one task."""

    task: str
    sizes: list[int]
    """The sizes that ran, ascending."""
    cut: list[int]
    """The sizes left out to stay within the deadline."""
    accuracy: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    """Held-out accuracy by line, size and seed (seeds in order, paired by index across lines)."""
    lr: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    """The learning rate the range test chose, by start, size and seed."""
    seeds: dict[int, list[int]] = field(default_factory=dict)
    """The seeds of each size."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Compute seconds of each line's cells (summed over the processes that ran them)."""
    size_seconds: dict[int, float] = field(default_factory=dict)
    """Wall time of each size, every line's cells."""
    steps: dict[int, int] = field(default_factory=dict)
    """Fine-tuning steps at each size (the recipe's; a start with its own floor: `start_steps`)."""
    start_steps: dict[str, dict[int, int]] = field(default_factory=dict)
    """Fine-tuning steps of the starts with a floor of their own, by size."""
    pool: int = 0
    """Training examples the subsets are drawn from."""
    heldout: int = 0
    """Held-out examples every fine-tuning is scored on."""
    required: list[int] = field(default_factory=list)
    """The sizes that run whatever the deadline."""

    def mean(self, line: str, size: int) -> float:
        return statistics.mean(self.accuracy[line][size])

    def interval(self, line: str, size: int) -> Interval:
        return mean_interval(self.accuracy[line][size])

    def difference(self, a: str, b: str, size: int) -> Interval:
        """``a`` minus ``b`` at ``size``, seed by seed, over the seeds both ran."""
        x, y = self.accuracy[a][size], self.accuracy[b][size]
        n = min(len(x), len(y))
        return paired_difference(x[:n], y[:n])

    def to_json(self, comparisons: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sizes": self.sizes, "cut": self.cut, "required": self.required, "pool": self.pool,
            "heldout": self.heldout, "steps": {str(k): v for k, v in self.steps.items()},
            "start_steps": {s: {str(k): v for k, v in by.items()} for s, by in self.start_steps.items()},
            "seeds": {str(k): v for k, v in self.seeds.items()},
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
            "size_seconds": {str(k): round(v, 1) for k, v in self.size_seconds.items()},
            "accuracy": {line: {str(n): accs for n, accs in by_size.items()}
                         for line, by_size in self.accuracy.items()},
            "interval": {line: {str(n): mean_interval(accs).to_json() for n, accs in by_size.items()}
                         for line, by_size in self.accuracy.items()},
            "lr": {line: {str(n): lrs for n, lrs in by_size.items()} for line, by_size in self.lr.items()}}
        out["differences"] = {}
        for a, b in comparisons:
            if a in self.accuracy and b in self.accuracy:
                out["differences"][f"{a} - {b}"] = {
                    str(n): {**(d := self.difference(a, b, n)).to_json(), "resolved": d.resolved}
                    for n in self.sizes if n in self.accuracy[a] and n in self.accuracy[b]}
        return out


def _cells_at(starts: Sequence[Start], task: CurveTask, size: int, seeds: Sequence[int], files: Mapping[int, Path],
              heldout: Path, recipe: Recipe, out: Path) -> list[Cell]:
    return [Cell(start.name, size, seed, str(start.folder(seed)), str(files[seed]), str(heldout),
                 finetune_steps(size, recipe, start.min_steps),
                 task.settings(), recipe, str(out / f"run-{k}"))
            for k, (start, seed) in enumerate((s, seed) for s in starts for seed in s.seeds(seeds))]


def run_curve(starts: Sequence[Start], task: CurveTask, sizes: Sequence[int], seeds: Callable[[int], list[int]],
              recipe: Recipe, out: Path, deadline: float, *, required_up_to: int = 0, workers: int = 1,
              bag_of_words: bool = False) -> Curve:
    """Fine-tune every start on each size's subsets of ``task``'s training set (one per seed of
    ``seeds(size)``, or the first ``Start.max_seeds``), at the rate its range test on the subset picks;
    score each on the held-out set; with ``bag_of_words``, fit the bag-of-words baseline on the same
    subsets (classification). The sizes up to ``required_up_to`` (and the smallest) always run; a larger
    one is left out, with every size above it, when it would end after ``deadline`` (a
    `time.perf_counter` value)."""
    from bertforge.demo.baselines import bow_logistic_regression

    if sizes and sizes[-1] > len(task.train):
        raise ValueError(f"curve size {sizes[-1]:,} is more than the {len(task.train):,} training examples")
    out.mkdir(parents=True, exist_ok=True)
    heldout = task.write(out / f"{HELD_OUT}{task.suffix}", task.heldout)
    lines = [s.name for s in starts] + ([BAG_OF_WORDS] if bag_of_words else [])
    curve = Curve(task=task.name, sizes=[], cut=[], accuracy={name: {} for name in lines},
                  lr={s.name: {} for s in starts}, seconds={name: 0.0 for name in lines}, pool=len(task.train),
                  heldout=len(task.heldout), required=[n for n in sizes if n <= required_up_to] or list(sizes[:1]))
    per_step: dict[str, float] = {}  # wall seconds per planned step at the last size, by start
    for size in sizes:
        size_seeds = seeds(size)
        if curve.sizes and size > required_up_to:
            estimate = sum(per_step[s.name] * planned_steps(size, recipe, s.min_steps) * len(s.seeds(size_seeds))
                           for s in starts)
            if time.perf_counter() + estimate > deadline:
                curve.cut = [n for n in sizes if n >= size]
                logger.info(f"    {task.name}: sizes {', '.join(f'{n:,}' for n in curve.cut)} left out: {size:,} "
                            f"would take about {estimate / 60:.1f} minutes, "
                            f"{max(0.0, deadline - time.perf_counter()) / 60:.1f} are left")
                break
        started = time.perf_counter()
        curve.sizes.append(size)
        curve.steps[size] = finetune_steps(size, recipe)
        for start in starts:
            if start.min_steps is not None:
                curve.start_steps.setdefault(start.name, {})[size] = finetune_steps(size, recipe, start.min_steps)
        curve.seeds[size] = list(size_seeds)
        files, subsets = {}, {}
        for seed in size_seeds:
            subsets[seed] = [task.train[i] for i in subset(len(task.train), size, seed)]
            files[seed] = task.write(out / f"train-{size}-seed{seed}{task.suffix}", subsets[seed])
        cells = _cells_at(starts, task, size, size_seeds, files, heldout, recipe, out)
        results = run_cells(cells, workers)
        took = time.perf_counter() - started
        for start in starts:
            got = [r for r in results if r["start"] == start.name]
            curve.accuracy[start.name][size] = [r["accuracy"] for r in got]
            curve.lr[start.name][size] = [r["lr"] for r in got]
            curve.seconds[start.name] += sum(r["seconds"] for r in got)
            share = sum(r["seconds"] for r in got) / max(1e-9, sum(r["seconds"] for r in results))
            per_step[start.name] = took * share / max(1, len(got) * planned_steps(size, recipe, start.min_steps))
        if bag_of_words:
            t0 = time.perf_counter()
            texts, labels = [t for t, _ in task.heldout], [y for _, y in task.heldout]
            curve.accuracy[BAG_OF_WORDS][size] = [
                bow_logistic_regression([t for t, _ in subsets[s]], [y for _, y in subsets[s]], texts, labels,
                                        seed=s)["accuracy"] for s in size_seeds]
            curve.seconds[BAG_OF_WORDS] += time.perf_counter() - t0
        for file in files.values():
            file.unlink()
        curve.size_seconds[size] = time.perf_counter() - started
        logger.info(f"    {task.name}, {size:,} {task.unit} ({curve.steps[size]} steps, {len(size_seeds)} seeds): "
                    + ", ".join(f"{name} {curve.mean(name, size):.3f}" for name in lines))
    return curve


def plot_curve(curves: Sequence[Curve], path: Path, titles: Sequence[str],
               colours: dict[str, str] | None = None) -> Path:
    """One panel per task: held-out accuracy against labelled examples (log scale), a line per start
    through the seeds' means, a band over the mean's 95% interval, each seed's score as a dot; the
    bag-of-words baseline dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0 * len(curves), 4.8))
    FigureCanvasAgg(fig)
    for k, (curve, title) in enumerate(zip(curves, titles)):
        ax = fig.add_subplot(1, len(curves), k + 1)
        for name, by_size in curve.accuracy.items():
            sizes = [n for n in curve.sizes if n in by_size]
            if not sizes:
                continue
            style = {"linestyle": "--", "color": "grey"} if name == BAG_OF_WORDS else {}
            if colours and name in colours:
                style["color"] = colours[name]
            ivs = [mean_interval(by_size[n]) for n in sizes]
            (line,) = ax.plot(sizes, [iv.mean for iv in ivs], marker="o", label=name, **style)
            if all(iv.low is not None for iv in ivs):
                ax.fill_between(sizes, [iv.low for iv in ivs], [iv.high for iv in ivs], color=line.get_color(),
                                alpha=0.15, linewidth=0)
            for n in sizes:
                ax.scatter([n] * len(by_size[n]), by_size[n], color=line.get_color(), s=8, alpha=0.5)
        ax.set_xscale("log")
        ax.set_xticks(curve.sizes, [f"{n:,}" for n in curve.sizes])
        ax.minorticks_off()
        ax.set_xlabel("labelled training examples (log scale)")
        ax.set_ylabel("held-out accuracy")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return path


def plot_minutes(points: Mapping[str, Mapping[float, list[float]]], path: Path, title: str) -> Path:
    """The paper's Figure 5 at the demo's scale: fine-tuning accuracy against minutes of pre-training,
    one line per task, the mean and its 95% interval over seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for task, by_minutes in points.items():
        minutes = sorted(by_minutes)
        ivs = [mean_interval(by_minutes[m]) for m in minutes]
        (line,) = ax.plot(minutes, [iv.mean for iv in ivs], marker="o", label=task)
        if all(iv.low is not None for iv in ivs):
            ax.fill_between(minutes, [iv.low for iv in ivs], [iv.high for iv in ivs], color=line.get_color(),
                            alpha=0.15, linewidth=0)
    ax.set_xlabel("minutes of pre-training (0: random initialisation)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return path

