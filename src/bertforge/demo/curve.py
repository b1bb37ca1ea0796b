"""The label-efficiency curve, the demo's main result: accuracy on a held-out set against the number
of labelled training examples, one line per starting point, each fine-tuned with one recipe on the
same subsets.

- **Nested subsets.** Seed ``s`` permutes the training set once; the subset of size ``n`` is the first
  ``n`` examples of that permutation, so one seed's subsets are nested (its 300 hold its 100) and
  every starting point sees exactly the same examples. Each seed also fine-tunes with its own data
  order, dropout and head initialisation, so the seeds' spread is the spread a user would see.
- **A floor on steps.** Each fine-tuning runs ``epochs`` passes over its subset, but at least
  ``min_steps`` optimizer steps: three passes over 100 examples are ten updates, and the curve would
  then measure how little training happened rather than what the starting point knew.
- **No choice on the held-out set.** The model after the last step is scored once; nothing (best
  epoch, learning rate) is picked on the examples the curve reports.
- **A budget.** Sizes run from the smallest up; before each, its time is estimated from the runs so
  far, and it and the larger sizes are left out when it would not end within the deadline (the
  smallest size always runs).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.console import errors_only
from bertforge.io import atomic_path, atomic_write_text

__all__ = ["Recipe", "Start", "Curve", "parse_sizes", "subset", "finetune_steps", "run_curve", "plot_curve",
           "BAG_OF_WORDS"]

logger = logging.getLogger("bertforge")

BAG_OF_WORDS = "bag of words"
"""The curve's line for the bag-of-words logistic regression (`bertforge.demo.baselines`)."""


@dataclass(frozen=True)
class Recipe:
    """The one fine-tuning recipe every starting point gets."""

    epochs: float
    min_steps: int
    lr: float
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
    steps: dict[int, int] = field(default_factory=dict)
    """Fine-tuning steps at each size."""

    def mean(self, line: str, size: int) -> float:
        return statistics.mean(self.accuracy[line][size])

    def to_json(self) -> dict[str, Any]:
        return {"sizes": self.sizes, "cut": self.cut, "steps": {str(k): v for k, v in self.steps.items()},
                "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
                "accuracy": {line: {str(n): accs for n, accs in by_size.items()}
                             for line, by_size in self.accuracy.items()}}


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


def subset(total: int, size: int, seed: int) -> np.ndarray:
    """Indices of the first ``size`` examples of seed ``seed``'s permutation of ``range(total)``, in
    ascending order: the subsets of one seed are nested."""
    return np.sort(np.random.default_rng(seed).permutation(total)[:size])


def finetune_steps(size: int, recipe: Recipe) -> int:
    """Optimizer steps of a fine-tuning on ``size`` examples: ``epochs`` passes, at least ``min_steps``."""
    return max(math.ceil(recipe.epochs * size / recipe.batch_size), recipe.min_steps)


def _write_jsonl(path: Path, texts: Sequence[str], labels: Sequence[int]) -> None:
    atomic_write_text(path, "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(texts, labels)))


def _finetune(start: Path, train_file: Path, dev_file: Path, out: Path, steps: int, seed: int,
              recipe: Recipe) -> float:
    """One fine-tuning; the held-out accuracy of its last model. Only that figure is kept: the run's
    folder is removed (a curve is dozens of runs)."""
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    with errors_only():
        res = finetune(FinetuneConfig(
            task="classification", model=str(start), train_file=str(train_file), dev_file=str(dev_file),
            text_column="text", label_column="label", out=str(out), overwrite=True, max_steps=steps, lr=recipe.lr,
            batch_size=recipe.batch_size, max_seq_length=recipe.max_seq_length, dropout=recipe.dropout,
            precision=recipe.precision, seed=seed, eval_every=steps, keep_best=False, checkpoint_every=10**9,
            log_every=max(1, steps // 5), progress=False))
    if res.train.interrupted:
        raise KeyboardInterrupt(f"fine-tuning stopped at step {res.train.step} ({out})")
    shutil.rmtree(out, ignore_errors=True)
    return float(res.eval_metrics["accuracy"])


def run_curve(starts: Sequence[Start], train: tuple[Sequence[str], Sequence[int]],
              dev: tuple[Sequence[str], Sequence[int]], sizes: Sequence[int], seeds: Callable[[int], list[int]],
              recipe: Recipe, out: Path, deadline: float, bag_of_words: bool = True) -> Curve:
    """Fine-tune every start on each size's subsets (one per seed of ``seeds(size)``), score each on
    ``dev``; fit the bag-of-words baseline on the same subsets. Stops adding sizes when the next would
    end after ``deadline`` (a `time.perf_counter` value)."""
    from bertforge.demo.baselines import bow_logistic_regression

    texts, labels = train
    out.mkdir(parents=True, exist_ok=True)
    dev_file = out / "dev.jsonl"
    _write_jsonl(dev_file, *dev)
    lines = [s.name for s in starts] + ([BAG_OF_WORDS] if bag_of_words else [])
    curve = Curve(sizes=[], cut=[], accuracy={name: {} for name in lines}, seconds={name: 0.0 for name in lines})
    per_step: dict[str, float] = {}  # seconds a run took per step, everything included, at the last size
    for size in sizes:
        steps, size_seeds = finetune_steps(size, recipe), seeds(size)
        if curve.sizes:
            estimate = len(size_seeds) * steps * sum(per_step.values())
            if time.perf_counter() + estimate > deadline:
                curve.cut = [n for n in sizes if n >= size]
                logger.info(f"    sizes {', '.join(f'{n:,}' for n in curve.cut)} left out: {size:,} would take about "
                            f"{estimate / 60:.1f} minutes, {max(0.0, deadline - time.perf_counter()) / 60:.1f} are "
                            f"left")
                break
        curve.sizes.append(size)
        curve.steps[size] = steps
        for seed in size_seeds:
            idx = subset(len(texts), size, seed)
            sub_texts, sub_labels = [texts[i] for i in idx], [labels[i] for i in idx]
            train_file = out / f"train-{size}-seed{seed}.jsonl"
            _write_jsonl(train_file, sub_texts, sub_labels)
            for start in starts:
                t0 = time.perf_counter()
                acc = _finetune(start.folder(seed), train_file, dev_file, out / "run", steps, seed, recipe)
                took = time.perf_counter() - t0
                curve.seconds[start.name] += took
                per_step[start.name] = took / steps
                curve.accuracy[start.name].setdefault(size, []).append(acc)
            if bag_of_words:
                t0 = time.perf_counter()
                acc = bow_logistic_regression(sub_texts, sub_labels, *dev, seed=seed)["accuracy"]
                curve.seconds[BAG_OF_WORDS] += time.perf_counter() - t0
                curve.accuracy[BAG_OF_WORDS].setdefault(size, []).append(acc)
            train_file.unlink()
        logger.info(f"    {size:,} examples ({steps} steps, {len(size_seeds)} seed{'s' * (len(size_seeds) > 1)}): "
                    + ", ".join(f"{name} {curve.mean(name, size):.3f}" for name in lines))
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

