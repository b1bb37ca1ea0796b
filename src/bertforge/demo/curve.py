"""The label-efficiency curve, the demo's main result: held-out accuracy against the number of
labelled training examples, one line per starting point, each fine-tuned with the same settings on the same
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
  model does not use two cores well in one process. `run_curves` puts the required cells of several
  curves into one pool, the costliest first (longest-processing-time order), so that no worker idles
  while another finishes a long cell.
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
from bertforge.io import atomic_path
from bertforge.stats import Interval, mean_interval, paired_difference

__all__ = ["FinetuneSettings", "Start", "CurveTask", "CurveSpec", "Curve", "Cell", "parse_sizes", "format_lr", "subset",
           "finetune_steps", "planned_steps", "estimate_seconds", "choose_lr", "run_cell", "run_cells", "run_curves",
           "run_curve", "plot_curve", "plot_minutes", "BAG_OF_WORDS"]

logger = logging.getLogger("bertforge")

BAG_OF_WORDS = "bag of words"
"""The curve's line for the bag-of-words logistic regression (`bertforge.demo.baselines`)."""
HELD_OUT = "heldout"
"""The held-out file of a task (``heldout.jsonl`` / ``heldout.conll``)."""

EVAL_COST = 0.3
"""Time to score an example, as a share of a training step's time per example (a forward pass without
gradients, on the faster inference path)."""
RUN_SECONDS = 0.5
"""A fine-tuning's time beside its steps and its evaluation: reading the checkpoint and the subset,
building the optimizer, saving the final model (twice a cell: the range test and the run; measured in a
worker that has run a cell before, as the pool's workers have)."""
CURVE_MARGIN = 1.1
"""`estimate_seconds` is this much over the sum of its parts (steps timed in isolation run a little
faster than in a run)."""
SMOOTHING = 0.8
"""Weight of the past in the range test's smoothed loss (an exponential moving average, bias-corrected)."""
DIVERGED = 1.25
"""The range test's training has diverged once its smoothed loss exceeds this multiple of its lowest so far."""


@dataclass(frozen=True)
class FinetuneSettings:
    """The one set of fine-tuning settings every starting point gets; its peak learning rate is chosen per start,
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
    """This start's floor on fine-tuning steps, where it learns in fewer than the settings' (None: the
    settings'): a costly published checkpoint that converges early."""
    epochs: float | None = None
    """This start's passes over a subset (None: the settings'): a published checkpoint gets the paper's
    fine-tuning length of a few epochs."""

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
        from bertforge.experiments.datasets import write_conll, write_jsonl

        (write_conll if self.family == "tagging" else write_jsonl)(path, examples)
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
    task_settings: dict[str, str]
    """The task's fine-tuning settings (`CurveTask.settings`: its name, columns)."""
    finetuning: FinetuneSettings
    out: str
    cost: float = 0.0
    """Its expected seconds (planned steps x the start's timed step): `run_cells` starts the costliest
    first."""


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


def finetune_steps(size: int, finetuning: FinetuneSettings, start: Start | None = None) -> int:
    """Optimizer steps of a fine-tuning on ``size`` examples: the settings' ``epochs`` passes, at least its
    ``min_steps`` (or the ``start``'s own, where it has them)."""
    floor = finetuning.min_steps if start is None or start.min_steps is None else start.min_steps
    epochs = finetuning.epochs if start is None or start.epochs is None else start.epochs
    return max(math.ceil(epochs * size / finetuning.batch_size), floor)


def planned_steps(size: int, finetuning: FinetuneSettings, start: Start | None = None) -> int:
    """Training steps of a cell at ``size``: the range test's and the fine-tuning's."""
    return finetuning.range_steps + finetune_steps(size, finetuning, start)


def estimate_seconds(starts: Sequence[Start], sizes: Sequence[int], seeds: Callable[[int], list[int]],
                     finetuning: FinetuneSettings, eval_examples: int, speedup: float = 1.0) -> float:
    """Wall time the cells of ``starts`` at ``sizes`` should take, from each start's timed step
    (`Start.step_seconds`): each cell's steps, its evaluation of ``eval_examples`` examples (`EVAL_COST`)
    and 2 x `RUN_SECONDS`, divided by ``speedup`` (what the worker processes gain over one), times
    `CURVE_MARGIN`."""
    total = 0.0
    for size in sizes:
        for start in starts:
            step = start.step_seconds
            cell = (planned_steps(size, finetuning, start) * step
                    + eval_examples * EVAL_COST * step / finetuning.batch_size + 2 * RUN_SECONDS)
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
            **cell.task_settings, model=cell.folder, train_file=cell.train_file, out=cell.out, overwrite=True, max_steps=steps,
            lr=lr, batch_size=cell.finetuning.batch_size, max_seq_length=cell.finetuning.max_seq_length,
            dropout=cell.finetuning.dropout, precision=cell.finetuning.precision, seed=cell.seed, keep_best=False,
            checkpoint_every=10**9, progress=False, **settings))
    if res.train.interrupted:
        raise KeyboardInterrupt(f"fine-tuning stopped at step {res.train.step} ({cell.out})")
    return res


def run_cell(cell: Cell) -> dict[str, Any]:
    """A cell: the range test on the subset (its losses from the run's metrics), the rate `choose_lr`
    picks, then the fine-tuning at that rate, scored once on the held-out file after its last step.
    The run folders are removed (a curve is hundreds of runs); the figures are returned."""
    from bertforge.train.optim import lr_factor

    finetuning = cell.finetuning
    t0 = time.perf_counter()
    _finetune(cell, finetuning.range_top, finetuning.range_steps, schedule="range", warmup_steps=0, log_every=1,
              eval_every=0)
    records = [json.loads(line) for line in (Path(cell.out) / "metrics.jsonl").read_text().splitlines()]
    losses = [float(r["loss"]) for r in records if r.get("split") == "train"]
    rates = [finetuning.range_top * lr_factor(i, total_steps=finetuning.range_steps, warmup_steps=0, schedule="range")
             for i in range(len(losses))]  # the rate each logged step trained at
    lr, at = choose_lr(rates, losses, finetuning.lr_divisor)
    res = _finetune(cell, lr, cell.steps, dev_file=cell.heldout_file, eval_every=cell.steps,
                    log_every=max(1, cell.steps // 5))
    shutil.rmtree(cell.out, ignore_errors=True)
    return {"start": cell.start, "size": cell.size, "seed": cell.seed, "accuracy": float(res.eval_metrics["accuracy"]),
            "lr": lr, "diverged_at": rates[at], "seconds": time.perf_counter() - t0}


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def run_cells(cells: Sequence[Cell], workers: int = 1,
              done: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """``cells`` in this process (``workers`` 1) or in ``workers`` processes of one thread each, the
    costliest first (`Cell.cost`: the longest cells start early, the short ones fill the gaps at the end);
    ``done(index, result)`` is called as each ends. The results in the cells' order."""
    order = sorted(range(len(cells)), key=lambda i: -cells[i].cost)  # stable: equal costs keep their order
    results: dict[int, dict[str, Any]] = {}
    if workers <= 1 or len(cells) <= 1:
        for i in order:
            results[i] = run_cell(cells[i])
            if done:
                done(i, results[i])
        return [results[i] for i in range(len(cells))]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_one_thread) as pool:
        futures = {pool.submit(run_cell, cells[i]): i for i in order}  # the pool takes them in this order
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            if done:
                done(i, results[i])
    return [results[i] for i in range(len(cells))]


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
    """Compute seconds of each size, every line's cells (summed over the processes that ran them)."""
    steps: dict[int, int] = field(default_factory=dict)
    """Fine-tuning steps at each size (the settings'; a start with its own floor: `start_steps`)."""
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


@dataclass(frozen=True)
class CurveSpec:
    """A curve to run: its starts, its task and sizes, its folder, and whether the bag-of-words baseline
    (classification) goes on it."""

    starts: Sequence[Start]
    task: CurveTask
    sizes: Sequence[int]
    out: Path
    bag_of_words: bool = False


def _cells_at(spec: CurveSpec, size: int, seeds: Sequence[int], files: Mapping[int, Path], heldout: Path,
              finetuning: FinetuneSettings) -> list[Cell]:
    return [Cell(start.name, size, seed, str(start.folder(seed)), str(files[seed]), str(heldout),
                 finetune_steps(size, finetuning, start), spec.task.settings(), finetuning,
                 str(spec.out / f"run-{size}-{k}"), cost=planned_steps(size, finetuning, start) * start.step_seconds)
            for k, (start, seed) in enumerate((s, seed) for s in spec.starts for seed in s.seeds(seeds))]


class _Runner:
    """`run_curves`' state: the specs, their curves and held-out files, and each start's compute seconds
    per planned step so far (what an optional size's estimate reads)."""

    def __init__(self, specs: Sequence[CurveSpec], seeds: Callable[[int], list[int]], finetuning: FinetuneSettings,
                 required_up_to: int, workers: int) -> None:
        self.specs, self.seeds, self.finetuning, self.workers = specs, seeds, finetuning, workers
        self.curves, self.heldout = [], []
        self.per_step: dict[tuple[int, str], float] = {}
        for spec in specs:
            task = spec.task
            if spec.sizes and spec.sizes[-1] > len(task.train):
                raise ValueError(f"curve size {spec.sizes[-1]:,} is more than the {len(task.train):,} training "
                                 "examples")
            spec.out.mkdir(parents=True, exist_ok=True)
            self.heldout.append(task.write(spec.out / f"{HELD_OUT}{task.suffix}", task.heldout))
            lines = [s.name for s in spec.starts] + ([BAG_OF_WORDS] if spec.bag_of_words else [])
            self.curves.append(Curve(
                task=task.name, sizes=[], cut=[], accuracy={name: {} for name in lines},
                lr={s.name: {} for s in spec.starts}, seconds={name: 0.0 for name in lines}, pool=len(task.train),
                heldout=len(task.heldout),
                required=[n for n in spec.sizes if n <= required_up_to] or list(spec.sizes[:1])))

    def estimate(self, k: int, size: int) -> float:
        """Wall seconds spec ``k``'s cells at ``size`` should take, from its starts' compute so far."""
        spec = self.specs[k]
        return sum(self.per_step.get((k, s.name), 0.0) * planned_steps(size, self.finetuning, s)
                   * len(s.seeds(self.seeds(size))) for s in spec.starts) / max(1, self.workers)

    def run(self, items: Sequence[tuple[int, int]]) -> None:
        """The cells of (spec, size) ``items``, in one pool; each curve filled in as its size ends. The
        bag-of-words baselines are fitted first, in this process, so that they do not take a core from the
        pool's workers."""
        started = time.perf_counter()
        cells: list[Cell] = []
        owner: list[int] = []  # the item of each cell
        files: dict[int, dict[int, Path]] = {}
        for j, (k, size) in enumerate(items):
            spec, curve = self.specs[k], self.curves[k]
            size_seeds = self.seeds(size)
            curve.sizes.append(size)
            curve.steps[size] = finetune_steps(size, self.finetuning)
            for start in spec.starts:
                if start.min_steps is not None or start.epochs is not None:
                    curve.start_steps.setdefault(start.name, {})[size] = finetune_steps(size, self.finetuning, start)
            curve.seeds[size] = list(size_seeds)
            subsets = {seed: [spec.task.train[i] for i in subset(len(spec.task.train), size, seed)]
                       for seed in size_seeds}
            files[j] = {seed: spec.task.write(spec.out / f"train-{size}-seed{seed}{spec.task.suffix}", examples)
                        for seed, examples in subsets.items()}
            if spec.bag_of_words:
                self._bag_of_words(k, size, subsets)
            new = _cells_at(spec, size, size_seeds, files[j], self.heldout[k], self.finetuning)
            cells += new
            owner += [j] * len(new)
        left = {j: owner.count(j) for j in range(len(items))}
        got: dict[int, list[tuple[int, dict[str, Any]]]] = {j: [] for j in range(len(items))}

        def done(i: int, result: dict[str, Any]) -> None:
            j = owner[i]
            got[j].append((i, result))
            left[j] -= 1
            if not left[j]:
                self._fill(*items[j], [r for _, r in sorted(got[j], key=lambda ir: ir[0])], files[j])

        run_cells(cells, self.workers, done)
        for j, item in enumerate(items):
            if not left[j] and not got[j]:  # a size without cells (no start): only its baseline
                self._fill(*item, [], files[j])
        logger.debug(f"    {len(cells)} fine-tunings in {time.perf_counter() - started:.0f} s")

    def _bag_of_words(self, k: int, size: int, subsets: Mapping[int, list[Any]]) -> None:
        """The bag-of-words baseline of spec ``k`` at ``size``, one fit per seed's subset."""
        from bertforge.demo.baselines import bow_logistic_regression

        task, curve = self.specs[k].task, self.curves[k]
        t0 = time.perf_counter()
        texts, labels = [t for t, _ in task.heldout], [y for _, y in task.heldout]
        curve.accuracy[BAG_OF_WORDS][size] = [
            bow_logistic_regression([t for t, _ in subsets[s]], [y for _, y in subsets[s]], texts, labels,
                                    seed=s)["accuracy"] for s in curve.seeds[size]]
        curve.seconds[BAG_OF_WORDS] += time.perf_counter() - t0

    def _fill(self, k: int, size: int, results: list[dict[str, Any]], files: Mapping[int, Path]) -> None:
        spec, curve = self.specs[k], self.curves[k]
        task = spec.task
        for start in spec.starts:
            mine = [r for r in results if r["start"] == start.name]
            curve.accuracy[start.name][size] = [r["accuracy"] for r in mine]
            curve.lr[start.name][size] = [r["lr"] for r in mine]
            seconds = sum(r["seconds"] for r in mine)
            curve.seconds[start.name] += seconds
            self.per_step[k, start.name] = seconds / max(1, len(mine) * planned_steps(size, self.finetuning, start))
        curve.size_seconds[size] = sum(r["seconds"] for r in results)
        for file in files.values():
            file.unlink()
        logger.info(f"    {task.name}, {size:,} {task.unit} ({curve.steps[size]} steps, {len(curve.seeds[size])} "
                    "seeds): " + ", ".join(f"{name} {curve.mean(name, size):.3f}" for name in curve.accuracy
                                           if curve.accuracy[name].get(size)))


def run_curves(specs: Sequence[CurveSpec], seeds: Callable[[int], list[int]], finetuning: FinetuneSettings,
               deadline: float, *, required_up_to: int = 0, workers: int = 1) -> list[Curve]:
    """Fine-tune every start of each spec on each size's subsets of its task's training set (one per seed
    of ``seeds(size)``, or the first ``Start.max_seeds``), at the rate its range test on the subset picks;
    score each on the held-out set; with ``bag_of_words``, fit the bag-of-words baseline on the same
    subsets. The sizes up to ``required_up_to`` (and each spec's smallest) of every spec run first, in one
    pool; then each larger size, smallest first, unless it would end after ``deadline`` (a
    `time.perf_counter` value): it is left out then, with every size above it on its curve."""
    runner = _Runner(specs, seeds, finetuning, required_up_to, workers)
    runner.run([(k, n) for k, curve in enumerate(runner.curves) for n in curve.required])
    optional = sorted((n, k) for k, spec in enumerate(specs) for n in spec.sizes if n not in runner.curves[k].required)
    for size, k in optional:
        curve = runner.curves[k]
        if curve.cut:
            curve.cut.append(size)
            continue
        estimate = runner.estimate(k, size)
        if time.perf_counter() + estimate > deadline:
            curve.cut = [size]
            logger.info(f"    {curve.task}: {size:,} {specs[k].task.unit} and larger left out: about "
                        f"{estimate / 60:.1f} minutes, {max(0.0, deadline - time.perf_counter()) / 60:.1f} are left")
            continue
        runner.run([(k, size)])
    return runner.curves


def run_curve(starts: Sequence[Start], task: CurveTask, sizes: Sequence[int], seeds: Callable[[int], list[int]],
              finetuning: FinetuneSettings, out: Path, deadline: float, *, required_up_to: int = 0, workers: int = 1,
              bag_of_words: bool = False) -> Curve:
    """One curve (`run_curves` of one `CurveSpec`)."""
    return run_curves([CurveSpec(starts, task, sizes, out, bag_of_words)], seeds, finetuning, deadline,
                      required_up_to=required_up_to, workers=workers)[0]


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

