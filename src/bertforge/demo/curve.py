"""The label-efficiency curve, the demo's main result: accuracy on a held-out set against the number
of labelled training examples, one line per starting point, each fine-tuned with one recipe on the
same subsets, at the learning rate that suits it.

- **A development split.** ``dev_examples`` training examples, drawn once with a seed of their own
  (`dev_split`), are set aside; every choice is made on them, and the subsets are drawn from the
  rest. The held-out set is only ever scored.
- **Nested subsets.** Seed ``s`` permutes the rest of the training set once; the subset of size ``n``
  is the first ``n`` examples of that permutation, so one seed's subsets are nested (its 300 hold its
  100) and every starting point sees exactly the same examples. Each seed also fine-tunes with its own
  data order, dropout and head initialisation, so the seeds' spread is the spread a user would see.
- **A learning rate per starting point.** A randomly initialised model and a pre-trained one do not
  learn best at the same rate, and one rate for all would favour the start it was chosen for. At each
  size, a start fine-tunes the first seed's subset once per rate of the grid ``Recipe.lrs``; the rate
  with the best development accuracy (ties: the smaller) is chosen, that run's held-out score is the
  first seed's, and the other seeds run at the chosen rate only: ``len(lrs) + seeds - 1`` fine-tunings.
  A start can run fewer seeds than the others (``Start.max_seeds``: the published checkpoint, the
  costliest line).
- **A floor on steps.** Each fine-tuning runs ``epochs`` passes over its subset, but at least
  ``min_steps`` optimizer steps: three passes over 100 examples are ten updates, and the curve would
  then measure how little training happened rather than what the starting point knew.
- **No choice on the held-out set.** The model after the last step is scored once; nothing (best
  epoch, learning rate) is picked on the examples the curve reports.
- **A budget.** The sizes up to ``required_up_to`` always run (`estimate_seconds` lets a caller plan
  for them before anything trains). A larger size runs only if it fits: before it, its time is
  estimated from the runs so far, and it and the larger sizes are left out when it would not end
  within the deadline.
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

__all__ = ["Recipe", "Start", "Curve", "parse_sizes", "parse_lrs", "format_lr", "dev_split", "subset",
           "finetune_steps", "planned_runs", "estimate_seconds", "run_curve", "plot_curve", "BAG_OF_WORDS",
           "DEV_SEED"]

logger = logging.getLogger("bertforge")

BAG_OF_WORDS = "bag of words"
"""The curve's line for the bag-of-words logistic regression (`bertforge.demo.baselines`)."""
DEV_SEED = 1000
"""Seed of the development split: one of its own, so that the split does not follow the curve's seeds
(0, 1, 2, ...) that draw the subsets."""
DEV, HELD_OUT = "dev", "heldout"
"""The two evaluation files of a fine-tuning (``dev.jsonl``, ``heldout.jsonl``; the metrics' prefixes)."""

EVAL_COST = 0.3
"""Time to score a sentence, as a share of a training step's time per sentence (a forward pass without
gradients, on the faster inference path)."""
RUN_SECONDS = 1.0
"""A fine-tuning's time beside its steps and its evaluation: reading the checkpoint and the subset,
building the optimizer, saving the final model."""
CURVE_MARGIN = 1.1
"""`estimate_seconds` is this much over the sum of its parts (steps timed in isolation run a little
faster than in a run)."""


@dataclass(frozen=True)
class Recipe:
    """The one fine-tuning recipe every starting point gets; only the peak learning rate is chosen per
    start and size, from ``lrs`` on the development split."""

    epochs: float
    min_steps: int
    lrs: tuple[float, ...]
    """The grid of peak learning rates, ascending."""
    batch_size: int
    max_seq_length: int
    dropout: float
    precision: str


@dataclass(frozen=True)
class Start:
    """A line of the curve: a name and the checkpoint folder fine-tuning starts from for a seed (a
    function of the seed, so a random initialisation can be drawn anew for each)."""

    name: str
    folder: Callable[[int], Path]
    max_seeds: int | None = None
    """Run at most this many of a size's seeds, the first ones (None: all)."""

    def seeds(self, size_seeds: Sequence[int]) -> list[int]:
        """The seeds this start runs of a size's ``size_seeds``."""
        return list(size_seeds[:self.max_seeds])


@dataclass
class Curve:
    """What `run_curve` measured."""

    sizes: list[int]
    """The sizes that ran, ascending."""
    cut: list[int]
    """The sizes left out to stay within the deadline."""
    accuracy: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    """Held-out accuracy by line, size and seed (in seed order)."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall time of each line's runs."""
    size_seconds: dict[int, float] = field(default_factory=dict)
    """Wall time of each size, every line's runs."""
    steps: dict[int, int] = field(default_factory=dict)
    """Fine-tuning steps at each size."""
    lr: dict[str, dict[int, float]] = field(default_factory=dict)
    """The learning rate chosen on the development split, by start and size."""
    dev_accuracy: dict[str, dict[int, dict[float, float]]] = field(default_factory=dict)
    """Development accuracy of the first seed's run at each rate of the grid, by start and size."""
    runs: dict[str, dict[int, int]] = field(default_factory=dict)
    """Fine-tunings by start and size (bag of words: fits)."""
    dev_examples: int = 0
    """Size of the development split."""
    pool: int = 0
    """Training examples the subsets are drawn from (the training set without the development split)."""
    required: list[int] = field(default_factory=list)
    """The sizes that run whatever the deadline."""

    def mean(self, line: str, size: int) -> float:
        return statistics.mean(self.accuracy[line][size])

    def to_json(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "cut": self.cut, "required": self.required, "dev_examples": self.dev_examples,
                "pool": self.pool, "steps": {str(k): v for k, v in self.steps.items()},
                "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
                "size_seconds": {str(k): round(v, 1) for k, v in self.size_seconds.items()},
                "accuracy": {line: {str(n): accs for n, accs in by_size.items()}
                             for line, by_size in self.accuracy.items()},
                "lr": {line: {str(n): lr for n, lr in by_size.items()} for line, by_size in self.lr.items()},
                "dev_accuracy": {line: {str(n): {format_lr(lr): acc for lr, acc in grid.items()}
                                        for n, grid in by_size.items()}
                                 for line, by_size in self.dev_accuracy.items()},
                "runs": {line: {str(n): k for n, k in by_size.items()} for line, by_size in self.runs.items()}}


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


def parse_lrs(spec: str) -> tuple[float, ...]:
    """``"5e-5,1e-4,3e-4"`` as ascending learning rates."""
    lrs = set()
    for part in spec.replace(" ", "").split(","):
        try:
            lr = float(part)
        except ValueError:
            raise ValueError(f"learning rates: {part!r} is not a number (in {spec!r})") from None
        if not 0 < lr < math.inf:
            raise ValueError(f"learning rates: {part} is not a positive learning rate (in {spec!r})")
        lrs.add(lr)
    return tuple(sorted(lrs))


def format_lr(lr: float) -> str:
    """A learning rate as people write it: 5e-05 -> ``5e-5``, 0.0003 -> ``3e-4``."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def dev_split(total: int, size: int, seed: int = DEV_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the development split (``size`` of ``range(total)``, drawn with ``seed``) and of the
    rest, each ascending."""
    if not 0 < size < total:
        raise ValueError(f"a development split of {size:,} examples needs a training set of more (got {total:,})")
    order = np.random.default_rng(seed).permutation(total)
    return np.sort(order[:size]), np.sort(order[size:])


def subset(total: int, size: int, seed: int) -> np.ndarray:
    """Indices of the first ``size`` examples of seed ``seed``'s permutation of ``range(total)``, in
    ascending order: the subsets of one seed are nested."""
    return np.sort(np.random.default_rng(seed).permutation(total)[:size])


def finetune_steps(size: int, recipe: Recipe) -> int:
    """Optimizer steps of a fine-tuning on ``size`` examples: ``epochs`` passes, at least ``min_steps``."""
    return max(math.ceil(recipe.epochs * size / recipe.batch_size), recipe.min_steps)


def planned_runs(recipe: Recipe, seeds: Sequence[int]) -> int:
    """Fine-tunings of a start at a size it runs ``seeds`` of: one per rate of the grid on the first seed,
    one per other seed at the chosen rate."""
    return len(recipe.lrs) + len(seeds) - 1


def estimate_seconds(step_seconds: Mapping[str, float], starts: Sequence[Start], sizes: Sequence[int],
                     seeds: Callable[[int], list[int]], recipe: Recipe, eval_examples: int) -> float:
    """Wall time the fine-tunings of ``starts`` at ``sizes`` should take, from the seconds of one
    training step of each start (``step_seconds``, by name): each run's steps, its evaluation of
    ``eval_examples`` sentences (`EVAL_COST`) and `RUN_SECONDS`, times `CURVE_MARGIN`."""
    total = 0.0
    for size in sizes:
        steps = finetune_steps(size, recipe)
        for start in starts:
            step = step_seconds[start.name]
            run = steps * step + eval_examples * EVAL_COST * step / recipe.batch_size + RUN_SECONDS
            total += planned_runs(recipe, start.seeds(seeds(size))) * run
    return CURVE_MARGIN * total


def _write_jsonl(path: Path, texts: Sequence[str], labels: Sequence[int]) -> None:
    atomic_write_text(path, "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(texts, labels)))


def _finetune(start: Path, train_file: Path, eval_files: Sequence[Path], out: Path, steps: int, seed: int,
              lr: float, recipe: Recipe) -> dict[str, float]:
    """One fine-tuning at peak learning rate ``lr``; the accuracy of its last model on each of
    ``eval_files``, by the file's name without its suffix. Only those figures are kept: the run's folder
    is removed (a curve is dozens of runs)."""
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    with errors_only():
        res = finetune(FinetuneConfig(
            task="classification", model=str(start), train_file=str(train_file),
            dev_file=",".join(str(f) for f in eval_files), text_column="text", label_column="label", out=str(out),
            overwrite=True, max_steps=steps, lr=lr, batch_size=recipe.batch_size,
            max_seq_length=recipe.max_seq_length, dropout=recipe.dropout, precision=recipe.precision, seed=seed,
            eval_every=steps, keep_best=False, checkpoint_every=10**9, log_every=max(1, steps // 5),
            progress=False))
    if res.train.interrupted:
        raise KeyboardInterrupt(f"fine-tuning stopped at step {res.train.step} ({out})")
    shutil.rmtree(out, ignore_errors=True)
    metrics = res.eval_metrics
    names = [f.name.split(".")[0] for f in eval_files]
    if len(names) == 1:  # one file's metrics have no prefix
        return {names[0]: float(metrics["accuracy"])}
    return {name: float(metrics[f"{name}_accuracy"]) for name in names}


def _start_at_size(start: Start, size: int, steps: int, seeds: list[int], train_files: Mapping[int, Path],
                   eval_files: Sequence[Path], recipe: Recipe, out: Path, curve: Curve) -> None:
    """A start at a size: the grid on the first seed, the chosen rate on the others; into ``curve``."""
    first = seeds[0]
    grid = {lr: _finetune(start.folder(first), train_files[first], eval_files, out / "run", steps, first, lr, recipe)
            for lr in recipe.lrs}
    chosen = max(recipe.lrs, key=lambda lr: (grid[lr][DEV], -lr))  # ties: the smaller rate
    held_out = [grid[chosen][HELD_OUT]]
    for seed in seeds[1:]:
        held_out.append(_finetune(start.folder(seed), train_files[seed], eval_files, out / "run", steps, seed,
                                  chosen, recipe)[HELD_OUT])
    curve.accuracy[start.name][size] = held_out
    curve.lr[start.name][size] = chosen
    curve.dev_accuracy[start.name][size] = {lr: got[DEV] for lr, got in grid.items()}
    curve.runs[start.name][size] = len(grid) + len(seeds) - 1


def run_curve(starts: Sequence[Start], train: tuple[Sequence[str], Sequence[int]],
              heldout: tuple[Sequence[str], Sequence[int]], sizes: Sequence[int],
              seeds: Callable[[int], list[int]], recipe: Recipe, out: Path, deadline: float, *,
              dev_examples: int, required_up_to: int = 0, bag_of_words: bool = True) -> Curve:
    """Set ``dev_examples`` of ``train`` aside as the development split; fine-tune every start on each
    size's subsets of the rest (one per seed of ``seeds(size)``, or the first ``Start.max_seeds``), at the
    rate of ``recipe.lrs`` chosen on the development split; score each on ``heldout``; fit the
    bag-of-words baseline on the same subsets. The sizes up to ``required_up_to`` (and the smallest)
    always run; a larger one is left out, with every size above it, when it would end after
    ``deadline`` (a `time.perf_counter` value)."""
    from bertforge.demo.baselines import bow_logistic_regression

    texts, labels = train
    dev_idx, pool = dev_split(len(texts), dev_examples)
    if sizes and sizes[-1] > len(pool):
        raise ValueError(f"curve size {sizes[-1]:,} is more than the {len(pool):,} training examples outside the "
                         f"development split")
    out.mkdir(parents=True, exist_ok=True)
    eval_files = [out / f"{DEV}.jsonl", out / f"{HELD_OUT}.jsonl"]
    _write_jsonl(eval_files[0], [texts[i] for i in dev_idx], [labels[i] for i in dev_idx])
    _write_jsonl(eval_files[1], *heldout)
    lines = [s.name for s in starts] + ([BAG_OF_WORDS] if bag_of_words else [])
    curve = Curve(sizes=[], cut=[], accuracy={name: {} for name in lines}, seconds={name: 0.0 for name in lines},
                  lr={s.name: {} for s in starts}, dev_accuracy={s.name: {} for s in starts},
                  runs={name: {} for name in lines}, dev_examples=len(dev_idx), pool=len(pool),
                  required=[n for n in sizes if n <= required_up_to] or list(sizes[:1]))
    per_step: dict[str, float] = {}  # seconds a run took per step, everything included, at the last size
    for size in sizes:
        steps, size_seeds = finetune_steps(size, recipe), seeds(size)
        if curve.sizes and size > required_up_to:
            estimate = steps * sum(per_step[s.name] * planned_runs(recipe, s.seeds(size_seeds)) for s in starts)
            if time.perf_counter() + estimate > deadline:
                curve.cut = [n for n in sizes if n >= size]
                logger.info(f"    sizes {', '.join(f'{n:,}' for n in curve.cut)} left out: {size:,} would take about "
                            f"{estimate / 60:.1f} minutes, {max(0.0, deadline - time.perf_counter()) / 60:.1f} are "
                            f"left")
                break
        started = time.perf_counter()
        curve.sizes.append(size)
        curve.steps[size] = steps
        train_files, subsets = {}, {}
        for seed in size_seeds:
            idx = pool[subset(len(pool), size, seed)]
            subsets[seed] = ([texts[i] for i in idx], [labels[i] for i in idx])
            train_files[seed] = out / f"train-{size}-seed{seed}.jsonl"
            _write_jsonl(train_files[seed], *subsets[seed])
        for start in starts:
            t0 = time.perf_counter()
            _start_at_size(start, size, steps, start.seeds(size_seeds), train_files, eval_files, recipe, out, curve)
            took = time.perf_counter() - t0
            curve.seconds[start.name] += took
            per_step[start.name] = took / (curve.runs[start.name][size] * steps)
        if bag_of_words:
            t0 = time.perf_counter()
            curve.accuracy[BAG_OF_WORDS][size] = [
                bow_logistic_regression(*subsets[seed], *heldout, seed=seed)["accuracy"] for seed in size_seeds]
            curve.runs[BAG_OF_WORDS][size] = len(size_seeds)
            curve.seconds[BAG_OF_WORDS] += time.perf_counter() - t0
        for file in train_files.values():
            file.unlink()
        curve.size_seconds[size] = time.perf_counter() - started
        seeds_text = f"{len(size_seeds)} seed{'s' * (len(size_seeds) > 1)}"
        logger.info(f"    {size:,} examples ({steps} steps, {seeds_text}): "
                    + ", ".join(f"{name} {curve.mean(name, size):.3f}"
                                + (f" (lr {format_lr(curve.lr[name][size])})" if name in curve.lr else "")
                                for name in lines))
    return curve


def plot_curve(curve: Curve, path: Path, title: str, colours: dict[str, str] | None = None) -> Path:
    """Accuracy against labelled examples (log scale): a line per start through the seeds' means, a band
    over their range, each seed's score as a dot; the bag-of-words baseline dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, by_size in curve.accuracy.items():
        sizes = [n for n in curve.sizes if n in by_size]
        if not sizes:
            continue
        style = {"linestyle": "--", "color": "grey"} if name == BAG_OF_WORDS else {}
        if colours and name in colours:
            style["color"] = colours[name]
        means = [statistics.mean(by_size[n]) for n in sizes]
        (line,) = ax.plot(sizes, means, marker="o", label=name, **style)
        ax.fill_between(sizes, [min(by_size[n]) for n in sizes], [max(by_size[n]) for n in sizes],
                        color=line.get_color(), alpha=0.15, linewidth=0)
        for n in sizes:
            ax.scatter([n] * len(by_size[n]), by_size[n], color=line.get_color(), s=8, alpha=0.5)
    ax.set_xscale("log")
    ax.set_xticks(curve.sizes, [f"{n:,}" for n in curve.sizes])
    ax.minorticks_off()
    ax.axhline(0.5, color="black", linewidth=0.5, alpha=0.4)
    ax.set_xlabel("labelled training examples (log scale)")
    ax.set_ylabel("held-out accuracy")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    return path

