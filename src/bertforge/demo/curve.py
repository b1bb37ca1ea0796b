"""The label-efficiency curve, the demo's main result: held-out accuracy against the number of labelled
training examples, a line per starting point, each fine-tuned alike on the same subsets.

True few-shot (Perez et al., 2021): a point at ``n`` examples reads only those ``n`` labels; its peak learning
rate comes from a range test on them (`range_test`: a sweep that ends on an edge is run again beyond it), and
the held-out set is scored once, after the last step.
One seed's subsets are nested and shared by every start, so scores are paired by seed (`bertforge.stats`).
Cells (a start, a size, a seed) run side by side in one-thread worker processes, the costliest first; sizes up
to ``required_up_to`` always run, a larger one only if its estimate fits before the deadline.
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
from bertforge.experiments.baselines import CRF, MOST_FREQUENT_TAG, TFIDF
from bertforge.io import atomic_path
from bertforge.stats import Interval, mean_interval, paired_difference

__all__ = ["FinetuneSettings", "Start", "CurveTask", "CurveSpec", "Curve", "Cell", "RangeTest", "RANGE_RULE",
           "parse_sizes", "format_lr", "subset", "finetune_steps", "planned_steps", "estimate_seconds", "choose_lr",
           "range_test", "run_cell", "run_cells", "run_curves", "run_curve", "plot_curve", "plot_minutes",
           "CLASSIC_BASELINES", "baseline_seconds", "run_baseline"]

logger = logging.getLogger("bertforge")

CLASSIC_BASELINES = {"tagging": (CRF, MOST_FREQUENT_TAG), "classification": (TFIDF,)}
"""The lines of the classic models a practitioner would use instead (`bertforge.experiments.baselines`), by
task family."""
BASELINE_SECONDS = {CRF: 0.03, MOST_FREQUENT_TAG: 1e-4, TFIDF: 0.007}
"""A baseline's fitting time per training example in one thread: the plan's estimate of a baseline cell. From
the demo's measured runs on an AMD EPYC Zen 4 (docs/results/demo.json), the CRF's 100 L-BFGS iterations on
Brown sentences (nine cells, 4,200 sentences: 2.2 minutes, the same under AVX2 kernels) and TF-IDF's 35
cross-validation fits and refit on movie reviews (0.6 minutes)."""

EVAL_COST = 0.3
"""Time to score an example, as a share of a training step's time per example (no gradients)."""
RUN_SECONDS = 0.5
"""A fine-tuning's time besides its steps and evaluation (loading, optimizer, saving), twice a cell."""
CURVE_MARGIN = 1.05
"""`estimate_seconds`' margin: in the demo's measured runs the fine-tunings took 2% longer than their steps
timed alone (natively; 8% less under AVX2 kernels), and the worker pool left a worker idle for 1%."""
SMOOTHING = 0.8
"""Weight of the past in the range test's smoothed loss (an exponential moving average, bias-corrected)."""
DIVERGED = 1.25
"""The range test's training has diverged once its smoothed loss exceeds this multiple of its lowest so far."""


@dataclass(frozen=True)
class FinetuneSettings:
    """The fine-tuning settings every start gets; the peak rate is chosen per cell (`choose_lr`)."""

    epochs: float
    min_steps: int
    batch_size: int
    max_seq_length: int
    dropout: float
    precision: str
    range_top: float = 1e-1
    """The range test's highest rate (it rises geometrically from 1/10,000 of it)."""
    range_steps: int = 50
    lr_divisor: float = 30.0
    """The chosen rate is the range test's divergence rate divided by this (a wide margin: Smith (2017) takes
    3 to 10 for a cyclic schedule, and a fine-tuning spends longer at its peak)."""


@dataclass(frozen=True)
class Start:
    """A line of the curve: a name and the checkpoint folder to fine-tune from for a seed (a function of
    the seed, so that a random initialisation can be drawn anew for each)."""

    name: str
    folder: Callable[[int], Path]
    max_seeds: int | None = None
    """Run at most this many of a size's seeds, the first ones (None: all)."""
    step_seconds: float = 0.0
    """A timed training step (the plan's estimate; 0: unknown)."""
    min_steps: int | None = None
    """This start's own floor on fine-tuning steps (None: the settings')."""
    epochs: float | None = None
    """This start's own passes over a subset (None: the settings')."""
    sizes: frozenset[int] | None = None
    """Run at these sizes only (None: every size of the curve): an optional line a plan cut down."""

    def seeds(self, size_seeds: Sequence[int], size: int | None = None) -> list[int]:
        """The seeds this start runs of a size's ``size_seeds`` (none at a ``size`` it does not run)."""
        if size is not None and self.sizes is not None and size not in self.sizes:
            return []
        return list(size_seeds[:self.max_seeds])


@dataclass(frozen=True)
class CurveTask:
    """A labelled task on the curve: training examples (the subsets' pool) and held-out examples, as
    ``(text, label)`` for classification and ``(words, tags)`` for tagging."""

    name: str
    family: str
    train: Sequence[tuple[Any, Any]]
    heldout: Sequence[tuple[Any, Any]]
    unit: str = "examples"
    """What an example is, for the report (sentences, tagged sentences)."""
    tag_piece: str = "first"
    """Tagging: the sub-token a word is tagged at (the fine-tuning setting ``tag_piece``)."""

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
            return {"task": "tagging", "tag_piece": self.tag_piece}
        return {"task": self.family, "text_column": "text", "label_column": "label"}


@dataclass(frozen=True)
class Cell:
    """One start at one size and seed, fine-tuned on a subset file: a function of files only, so that it
    runs in any process. ``cost`` is its expected seconds (`run_cells` starts the costliest first)."""

    start: str
    size: int
    seed: int
    folder: str
    train_file: str
    heldout_file: str
    steps: int
    task_settings: dict[str, str]
    finetuning: FinetuneSettings
    out: str
    cost: float = 0.0
    baseline: str = ""
    """A classic baseline's name (`CLASSIC_BASELINES`) fitted on the subset instead of a fine-tuning."""
    lr: float = 0.0
    """A fixed peak learning rate instead of the range test's choice (0: the range test), for measuring a
    start at given rates."""


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
    """Sorted indices of the first ``size`` of seed ``seed``'s permutation: one seed's subsets are nested."""
    return np.sort(np.random.default_rng(seed).permutation(total)[:size])


def finetune_steps(size: int, finetuning: FinetuneSettings, start: Start | None = None) -> int:
    """Optimizer steps of a fine-tuning on ``size`` examples: ``epochs`` passes, at least ``min_steps`` (the
    ``start``'s own where it has them): a small subset must train long enough to learn. Every step is a full
    batch (the runs drop an epoch's incomplete last one): at 100 examples in batches of 32, every fourth step
    would otherwise be 4 examples, a step of noise."""
    floor = finetuning.min_steps if start is None or start.min_steps is None else start.min_steps
    epochs = finetuning.epochs if start is None or start.epochs is None else start.epochs
    return max(math.ceil(epochs * size / finetuning.batch_size), floor)


def baseline_seconds(name: str, size: int) -> float:
    """The expected seconds of fitting baseline ``name`` on ``size`` examples and scoring it (`BASELINE_SECONDS`)."""
    return 1.0 + BASELINE_SECONDS[name] * size


def planned_steps(size: int, finetuning: FinetuneSettings, start: Start | None = None) -> int:
    """Training steps of a cell at ``size``: the range test's and the fine-tuning's."""
    return finetuning.range_steps + finetune_steps(size, finetuning, start)


def estimate_seconds(starts: Sequence[Start], sizes: Sequence[int], seeds: Callable[[int], list[int]],
                     finetuning: FinetuneSettings, eval_examples: int, speedup: float = 1.0,
                     baselines: Sequence[str] = ()) -> float:
    """Wall time of the cells of ``starts`` and ``baselines`` at ``sizes`` from each start's timed step: each
    cell's steps, its evaluation (`EVAL_COST`) and 2 x `RUN_SECONDS`, and each baseline's fit
    (`baseline_seconds`), over ``speedup`` (workers), times `CURVE_MARGIN`."""
    total = 0.0
    for size in sizes:
        total += len(seeds(size)) * sum(baseline_seconds(b, size) for b in baselines)
        for start in starts:
            step = start.step_seconds
            cell = (planned_steps(size, finetuning, start) * step
                    + eval_examples * EVAL_COST * step / finetuning.batch_size + 2 * RUN_SECONDS)
            total += len(start.seeds(seeds(size), size)) * cell
    return CURVE_MARGIN * total / max(speedup, 1e-9)


def choose_lr(lrs: Sequence[float], losses: Sequence[float], divisor: float) -> tuple[float, int]:
    """The range test's rule: the rate, over ``divisor``, at the first step where the smoothed loss exceeds
    `DIVERGED` x its lowest so far or is not finite (the top rate if none); returns the rate and the step
    (``len(losses)`` where none diverged). Divergence, not the lowest loss, is read: where no rate lowers the
    loss, the lowest is noise."""
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
    return lrs[-1] / divisor, len(losses)


EDGE_STEPS = 3
"""A range test whose loss diverges within its first this many steps read its sweep's bottom edge."""
SWEEP_SHIFT = 100.0
"""A sweep that hit an edge is run again this factor higher (no divergence) or lower (at once)."""
MAX_SWEEPS = 3
"""Sweeps a range test runs at most; one that still ends on an edge is flagged (``edge``)."""


RANGE_RULE = {"smoothing": SMOOTHING, "diverged": DIVERGED, "edge_steps": EDGE_STEPS, "sweep_shift": SWEEP_SHIFT,
              "max_sweeps": MAX_SWEEPS}
"""The range test's rule as a record, for results stored beside the settings they ran with."""


@dataclass(frozen=True)
class RangeTest:
    """What a cell's range test found: the chosen peak rate, the sweep that chose it and where its loss
    diverged. ``edge`` is "" where the divergence lay inside the last sweep, else the edge it hit after
    `MAX_SWEEPS` sweeps ("top": no divergence; "bottom": divergence at once): a flagged choice."""

    lr: float
    top: float
    """The highest rate of the sweep that chose (it rises from 10 ** -RANGE_DECADES of it)."""
    diverged_at: float | None
    """The rate at which the smoothed loss diverged (None: it never did)."""
    step: int | None
    """The sweep's step at which it diverged (None: it never did)."""
    sweeps: int
    edge: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"lr": self.lr, "top": self.top, "diverged_at": self.diverged_at, "step": self.step,
                "sweeps": self.sweeps, "edge": self.edge}


def range_test(losses_at: Callable[[float], Sequence[float]], top: float, steps: int, divisor: float) -> RangeTest:
    """The learning-rate range test without a ceiling: ``losses_at(top)`` runs a sweep of ``steps`` rates
    rising geometrically to ``top`` and returns its training losses; a sweep that ends without divergence
    is run again `SWEEP_SHIFT` higher, one that diverges within `EDGE_STEPS` steps that much lower, up to
    `MAX_SWEEPS` sweeps; the last sweep's divergence rate over ``divisor`` is the choice (`choose_lr`)."""
    from bertforge.train.optim import lr_factor

    edge, sweeps = "", 0
    while True:
        sweeps += 1
        losses = list(losses_at(top))
        rates = [top * lr_factor(i, total_steps=steps, warmup_steps=0, schedule="range") for i in range(len(losses))]
        lr, at = choose_lr(rates, losses, divisor)
        edge = "top" if at == len(losses) else "bottom" if at < EDGE_STEPS else ""
        if not edge or sweeps == MAX_SWEEPS:
            break
        top = top * SWEEP_SHIFT if edge == "top" else top / SWEEP_SHIFT
    diverged = at < len(losses)
    return RangeTest(lr=lr, top=top, diverged_at=rates[at] if diverged else None, step=at if diverged else None,
                     sweeps=sweeps, edge=edge)


def _finetune(cell: Cell, lr: float, steps: int, **settings: Any) -> Any:
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    ft = cell.finetuning
    with errors_only():
        res = finetune(FinetuneConfig(
            **cell.task_settings, model=cell.folder, train_file=cell.train_file, out=cell.out, overwrite=True,
            max_steps=steps, lr=lr, batch_size=ft.batch_size, max_seq_length=ft.max_seq_length,
            dropout=ft.dropout, precision=ft.precision, seed=cell.seed, keep_best=False,
            checkpoint_every=10**9, progress=False, drop_last=True, **settings))
    if res.train.interrupted:
        raise KeyboardInterrupt(f"fine-tuning stopped at step {res.train.step} ({cell.out})")
    return res


def _read_examples(path: str, tagging: bool) -> list[tuple[Any, Any]]:
    """A subset or held-out file as `CurveTask.write` wrote it, read as fine-tuning reads it: ``(words, tags)``
    or ``(text, label)``."""
    if tagging:
        from bertforge.tasks.tagging import read_sentences

        return [(s.tokens, s.tags) for s in read_sentences(path)[0]]
    from bertforge.tasks.classification import read_examples

    return [(e.text_a, e.label) for e in read_examples(path)[0]]


def run_baseline(cell: Cell) -> dict[str, Any]:
    """A baseline cell: the classic model ``cell.baseline`` fitted on the subset file alone (its settings fixed
    in advance or cross-validated inside it) and scored once on the held-out file."""
    from bertforge.experiments import baselines

    t0 = time.perf_counter()
    tagging = cell.task_settings.get("task") == "tagging"
    train, heldout = _read_examples(cell.train_file, tagging), _read_examples(cell.heldout_file, tagging)
    if cell.baseline == CRF:
        got = baselines.crf_tagger(train, heldout)
    elif cell.baseline == MOST_FREQUENT_TAG:
        got = baselines.most_frequent_tag(train, heldout)
    elif cell.baseline == TFIDF:
        got = baselines.tfidf_logistic_regression([t for t, _ in train], [y for _, y in train],
                                                  [t for t, _ in heldout], [y for _, y in heldout], seed=cell.seed)
    else:
        raise ValueError(f"unknown baseline {cell.baseline!r}: expected one of {CRF}, {MOST_FREQUENT_TAG}, {TFIDF}")
    return {"start": cell.start, "size": cell.size, "seed": cell.seed, "accuracy": got.accuracy,
            "settings": got.settings, "seconds": time.perf_counter() - t0}


def run_cell(cell: Cell) -> dict[str, Any]:
    """A cell: the range test on the subset (`range_test`, on the losses each sweep logs), then the
    fine-tuning at its rate, scored once on the held-out file. The run folder is removed. A baseline's cell
    is `run_baseline`'s; a cell with a fixed ``lr`` skips the range test (``range_test`` None)."""
    if cell.baseline:
        return run_baseline(cell)
    finetuning = cell.finetuning
    t0 = time.perf_counter()
    found = None
    if not cell.lr:
        def losses_at(top: float) -> list[float]:
            _finetune(cell, top, finetuning.range_steps, schedule="range", warmup_steps=0, log_every=1, eval_every=0)
            records = [json.loads(line) for line in (Path(cell.out) / "metrics.jsonl").read_text().splitlines()]
            return [float(r["loss"]) for r in records if r.get("split") == "train"]

        found = range_test(losses_at, finetuning.range_top, finetuning.range_steps, finetuning.lr_divisor)
    lr = found.lr if found else cell.lr
    res = _finetune(cell, lr, cell.steps, dev_file=cell.heldout_file, eval_every=cell.steps,
                    log_every=max(1, cell.steps // 5))
    shutil.rmtree(cell.out, ignore_errors=True)
    return {"start": cell.start, "size": cell.size, "seed": cell.seed, "accuracy": float(res.eval_metrics["accuracy"]),
            "lr": lr, "range_test": found.to_json() if found else None, "seconds": time.perf_counter() - t0}


def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def run_cells(cells: Sequence[Cell], workers: int = 1,
              done: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """``cells`` here (``workers`` 1) or in one-thread processes, the costliest first (the short ones fill the
    gaps at the end), calling ``done(index, result)`` as each ends; the results in the cells' order."""
    order = sorted(range(len(cells)), key=lambda i: -cells[i].cost)  # stable: equal costs keep their order
    results: dict[int, dict[str, Any]] = {}

    def finish(i: int, result: dict[str, Any]) -> None:
        results[i] = result
        if done:
            done(i, result)

    if workers <= 1 or len(cells) <= 1:
        for i in order:
            finish(i, run_cell(cells[i]))
        return [results[i] for i in range(len(cells))]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_one_thread) as pool:
        futures = {pool.submit(run_cell, cells[i]): i for i in order}  # the pool takes them in this order
        for future in as_completed(futures):
            finish(futures[future], future.result())
    return [results[i] for i in range(len(cells))]


@dataclass
class Curve:
    """What `run_curves` measured on one task. Accuracy, learning rates and seeds are by line (start), size
    and seed, the seeds in order so that lines pair by index; seconds are compute, summed over workers."""

    task: str
    sizes: list[int]
    """The sizes that ran, ascending."""
    cut: list[int]
    """The sizes left out to stay within the deadline."""
    accuracy: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    lr: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    range_tests: dict[str, dict[int, list[dict[str, Any] | None]]] = field(default_factory=dict)
    """Each cell's `RangeTest` (as JSON) by line, size and seed: the sweep, the divergence and any edge."""
    baseline_settings: dict[str, dict[int, list[dict[str, Any]]]] = field(default_factory=dict)
    """Each baseline's settings by size and seed (the strength its cross-validation chose, where it has one)."""
    seeds: dict[int, list[int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    size_seconds: dict[int, float] = field(default_factory=dict)
    steps: dict[int, int] = field(default_factory=dict)
    """Fine-tuning steps at each size (the settings'; a start with its own floor: `start_steps`)."""
    start_steps: dict[str, dict[int, int]] = field(default_factory=dict)
    pool: int = 0
    """Training examples the subsets are drawn from."""
    heldout: int = 0
    required: list[int] = field(default_factory=list)
    """The sizes that run whatever the deadline."""
    baselines: list[str] = field(default_factory=list)
    """The lines that are classic baselines (`CLASSIC_BASELINES`), not fine-tuned starts."""

    def mean(self, line: str, size: int) -> float:
        return statistics.mean(self.accuracy[line][size])

    def difference(self, a: str, b: str, size: int) -> Interval:
        """``a`` minus ``b`` at ``size``, seed by seed, over the seeds both ran."""
        x, y = self.accuracy[a][size], self.accuracy[b][size]
        n = min(len(x), len(y))
        return paired_difference(x[:n], y[:n])

    def to_json(self, comparisons: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        def by_line(values: dict[str, dict[int, Any]], f: Callable[[Any], Any] = lambda v: v) -> dict:
            return {line: {str(n): f(v) for n, v in by_size.items()} for line, by_size in values.items()}

        out: dict[str, Any] = {
            "sizes": self.sizes, "cut": self.cut, "required": self.required, "baselines": self.baselines,
            "pool": self.pool, "heldout": self.heldout, "steps": {str(k): v for k, v in self.steps.items()},
            "start_steps": by_line(self.start_steps), "seeds": {str(k): v for k, v in self.seeds.items()},
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
            "size_seconds": {str(k): round(v, 1) for k, v in self.size_seconds.items()},
            "accuracy": by_line(self.accuracy),
            "interval": by_line(self.accuracy, lambda accs: mean_interval(accs).to_json()),
            "lr": by_line(self.lr), "range_tests": by_line(self.range_tests),
            "baseline_settings": by_line(self.baseline_settings), "differences": {}}
        for a, b in comparisons:
            if a in self.accuracy and b in self.accuracy:
                out["differences"][f"{a} - {b}"] = {
                    str(n): {**(d := self.difference(a, b, n)).to_json(), "resolved": d.resolved}
                    for n in self.sizes if n in self.accuracy[a] and n in self.accuracy[b]}
        return out


@dataclass(frozen=True)
class CurveSpec:
    """A curve to run: its starts, task, sizes and folder, and the classic baselines fitted beside them
    (`CLASSIC_BASELINES`), on the same subsets."""

    starts: Sequence[Start]
    task: CurveTask
    sizes: Sequence[int]
    out: Path
    baselines: Sequence[str] = ()
    seeds: Callable[[int], list[int]] | None = None
    """This curve's seeds at each size (None: `run_curves`' ``seeds``)."""


def _cells_at(spec: CurveSpec, size: int, seeds: Sequence[int], files: Mapping[int, Path], heldout: Path,
              finetuning: FinetuneSettings) -> list[Cell]:
    cells = [Cell(start.name, size, seed, str(start.folder(seed)), str(files[seed]), str(heldout),
                  finetune_steps(size, finetuning, start), spec.task.settings(), finetuning,
                  str(spec.out / f"run-{size}-{k}"), cost=planned_steps(size, finetuning, start) * start.step_seconds)
             for k, (start, seed) in enumerate((s, seed) for s in spec.starts for seed in s.seeds(seeds, size))]
    return cells + [Cell(name, size, seed, "", str(files[seed]), str(heldout), 0, spec.task.settings(), finetuning,
                         str(spec.out / f"baseline-{size}-{k}"), cost=baseline_seconds(name, size), baseline=name)
                    for k, (name, seed) in enumerate((b, seed) for b in spec.baselines for seed in seeds)]


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
            self.heldout.append(task.write(spec.out / f"heldout{task.suffix}", task.heldout))
            lines = [s.name for s in spec.starts] + list(spec.baselines)
            self.curves.append(Curve(
                task=task.name, sizes=[], cut=[], accuracy={name: {} for name in lines},
                lr={s.name: {} for s in spec.starts}, seconds={name: 0.0 for name in lines}, pool=len(task.train),
                heldout=len(task.heldout), baselines=list(spec.baselines),
                required=[n for n in spec.sizes if n <= required_up_to] or list(spec.sizes[:1])))

    def estimate(self, k: int, size: int) -> float:
        """Wall seconds spec ``k``'s cells at ``size`` should take, from its starts' compute so far and its
        baselines' `baseline_seconds`."""
        spec, seeds = self.specs[k], self.seeds_of(k)(size)
        return (sum(self.per_step.get((k, s.name), 0.0) * planned_steps(size, self.finetuning, s)
                    * len(s.seeds(seeds, size)) for s in spec.starts)
                + len(seeds) * sum(baseline_seconds(b, size) for b in spec.baselines)) / max(1, self.workers)

    def seeds_of(self, k: int) -> Callable[[int], list[int]]:
        """Spec ``k``'s seeds at each size."""
        return self.specs[k].seeds or self.seeds

    def run(self, items: Sequence[tuple[int, int]]) -> None:
        """The cells of (spec, size) ``items``, baselines' included, in one pool, each curve filled in as its
        size ends."""
        started = time.perf_counter()
        cells: list[Cell] = []
        owner: list[int] = []  # the item of each cell
        files: dict[int, dict[int, Path]] = {}
        for j, (k, size) in enumerate(items):
            spec, curve = self.specs[k], self.curves[k]
            size_seeds = self.seeds_of(k)(size)
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

    def _fill(self, k: int, size: int, results: list[dict[str, Any]], files: Mapping[int, Path]) -> None:
        spec, curve = self.specs[k], self.curves[k]
        for start in spec.starts:
            mine = [r for r in results if r["start"] == start.name]
            if not mine:  # a line the plan left out at this size
                continue
            curve.accuracy[start.name][size] = [r["accuracy"] for r in mine]
            curve.lr[start.name][size] = [r["lr"] for r in mine]
            curve.range_tests.setdefault(start.name, {})[size] = [r["range_test"] for r in mine]
            seconds = sum(r["seconds"] for r in mine)
            curve.seconds[start.name] += seconds
            self.per_step[k, start.name] = seconds / max(1, len(mine) * planned_steps(size, self.finetuning, start))
        for name in spec.baselines:
            mine = [r for r in results if r["start"] == name]
            curve.accuracy[name][size] = [r["accuracy"] for r in mine]
            curve.baseline_settings.setdefault(name, {})[size] = [r["settings"] for r in mine]
            curve.seconds[name] += sum(r["seconds"] for r in mine)
        curve.size_seconds[size] = sum(r["seconds"] for r in results)
        for file in files.values():
            file.unlink()
        logger.info(f"    {spec.task.name}, {size:,} {spec.task.unit} ({curve.steps[size]} steps, "
                    f"{len(curve.seeds[size])} seeds): " + ", ".join(f"{name} {curve.mean(name, size):.3f}"
                                                                    for name in curve.accuracy
                                                                    if curve.accuracy[name].get(size)))


def run_curves(specs: Sequence[CurveSpec], seeds: Callable[[int], list[int]], finetuning: FinetuneSettings,
               deadline: float, *, required_up_to: int = 0, workers: int = 1) -> list[Curve]:
    """Each spec's curve: every start fine-tuned on each size's subsets (one per seed of ``seeds(size)``, at
    most ``Start.max_seeds``), each scored on the held-out set. The required sizes (up to ``required_up_to``,
    the smallest at least) of every spec run first, in one pool; then each larger one, smallest first, unless
    it would end after ``deadline`` (`time.perf_counter`): then it and the larger ones of its curve are
    cut."""
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
              baselines: Sequence[str] = ()) -> Curve:
    """One curve (`run_curves` of one `CurveSpec`)."""
    return run_curves([CurveSpec(starts, task, sizes, out, baselines)], seeds, finetuning, deadline,
                      required_up_to=required_up_to, workers=workers)[0]


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _mean_line(ax: Any, xs: Sequence[float], samples: Sequence[list[float]], **style: Any) -> Any:
    """A line through the means of ``samples`` at ``xs``, with a band over each mean's 95% interval."""
    ivs = [mean_interval(s) for s in samples]
    (line,) = ax.plot(xs, [iv.mean for iv in ivs], marker="o", **style)
    if all(iv.low is not None for iv in ivs):
        ax.fill_between(xs, [iv.low for iv in ivs], [iv.high for iv in ivs], color=line.get_color(),
                        alpha=0.15, linewidth=0)
    return line


def _label(ax: Any, xlabel: str, title: str, **legend: Any) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(**legend)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return path


def plot_curve(curves: Sequence[Curve], path: Path, titles: Sequence[str],
               colours: dict[str, str] | None = None) -> Path:
    """A panel per task: accuracy against labelled examples, a line per start with its band and seed dots."""
    fig = _figure(6.0 * len(curves), 4.8)
    for k, (curve, title) in enumerate(zip(curves, titles)):
        ax = fig.add_subplot(1, len(curves), k + 1)
        for name, by_size in curve.accuracy.items():
            sizes = [n for n in curve.sizes if n in by_size]
            if not sizes:
                continue
            style = {"linestyle": "--"} if name in curve.baselines else {}
            if colours and name in colours:
                style["color"] = colours[name]
            line = _mean_line(ax, sizes, [by_size[n] for n in sizes], label=name, **style)
            for n in sizes:
                ax.scatter([n] * len(by_size[n]), by_size[n], color=line.get_color(), s=8, alpha=0.5)
        ax.set_xscale("log")
        ax.set_xticks(curve.sizes, [f"{n:,}" for n in curve.sizes])
        ax.minorticks_off()
        _label(ax, "labelled training examples (log scale)", title, loc="lower right", fontsize=8)
    return _save(fig, path)


def plot_minutes(points: Mapping[str, Mapping[float, list[float]]], path: Path, title: str) -> Path:
    """The paper's Figure 5 at the demo's scale: accuracy against minutes of pre-training, a line per task."""
    fig = _figure(6.5, 4.4)
    ax = fig.add_subplot()
    for task, by_minutes in points.items():
        minutes = sorted(by_minutes)
        _mean_line(ax, minutes, [by_minutes[m] for m in minutes], label=task)
    _label(ax, "minutes of pre-training (0: random initialisation)", title, fontsize=9)
    return _save(fig, path)
