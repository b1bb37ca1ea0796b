"""A training run's curves as one PNG, drawn from the run folder's ``metrics.jsonl``.

The training loop appends one JSON object per line: ``split`` ("train", "eval", "dev", ...), ``step``,
``time`` and numeric metrics. The file is read defensively, since its writer may be killed or resumed
(`read_metrics`); values that are not finite numbers are ignored, and a curve is drawn for every numeric
key in a panel's family. matplotlib is imported inside `plot_run` only, so importing this module stays cheap.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bertforge.io import atomic_path

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["read_metrics", "plot_run", "ema", "METRICS_FILE", "CURVES_FILE"]

METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"

# Fine-tuning scores that share the [0, 1]-ish panel with every "*accuracy" key.
SCORE_NAMES = frozenset({"accuracy", "f1", "matthews", "pearson", "spearman", "exact_match"})

Records = dict[str, list[dict[str, float]]]


def read_metrics(path: str | Path) -> Records:
    """Records of a ``metrics.jsonl`` (or of a run folder holding one), by split, sorted by step.

    Each record holds ``step`` (an int) and the line's finite numeric values. A step repeated within a split
    keeps its later line (a resumed run's). An unreadable line is a ``ValueError`` naming the file and line,
    unless it is the last one, which is skipped with a warning: what a writer killed mid-line leaves.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    numbered = [(i, line) for i, line in enumerate(path.read_bytes().split(b"\n"), start=1) if line.strip()]
    by_split: dict[str, dict[int, dict[str, float]]] = {}
    for lineno, raw in numbered:
        try:
            obj = json.loads(raw.decode("utf-8"))  # decode per line: a cut can split a UTF-8 char
            if not isinstance(obj, dict):
                raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
        except ValueError as e:
            if lineno == numbered[-1][0]:
                warnings.warn(f"{path}:{lineno}: skipping a truncated last line ({e})", RuntimeWarning,
                              stacklevel=2)
                continue
            raise ValueError(f"{path}:{lineno}: unreadable line: {e}") from None
        split, step = obj.get("split"), obj.get("step")
        if not isinstance(split, str) or not split:
            raise ValueError(f"{path}:{lineno}: 'split' must be a non-empty string, got {split!r}")
        if not _is_number(step) or step != int(step):
            raise ValueError(f"{path}:{lineno}: 'step' must be an integer, got {step!r}")
        step = int(step)
        # a later line for the same step replaces it
        by_split.setdefault(split, {})[step] = {**{k: float(v) for k, v in obj.items() if _is_number(v)}, "step": step}
    return {split: [steps[s] for s in sorted(steps)] for split, steps in by_split.items()}


def _is_number(value: object) -> bool:
    # bool is an int subclass, but True is not a metric value.
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def ema(values: Sequence[float], span: int) -> list[float]:
    """Bias-corrected exponential moving average over ``span`` points (weight ``1 - 1/span``).

    ``s_i = w * s_(i-1) + (1 - w) * x_i`` from ``s_(-1) = 0``, divided by ``1 - w**(i+1)``: the
    correction (as in Adam) makes the first points plain averages of what came so far instead of
    pulling them toward 0 or toward the first value. ``span=1`` returns the values unchanged.
    """
    w = 1.0 - 1.0 / max(span, 1)
    out, s = [], 0.0
    for i, x in enumerate(values):
        s = w * s + (1.0 - w) * x
        out.append(s / (1.0 - w ** (i + 1)))
    return out


# The panels, in drawing order: title, which keys belong, whether train series are smoothed.
PANELS: list[tuple[str, Callable[[str], bool], bool]] = [
    ("loss", lambda k: k.endswith("loss"), True),
    ("accuracy / score", lambda k: k.endswith("accuracy") or k in SCORE_NAMES, True),
    ("learning rate", lambda k: k == "lr", False),  # a schedule, not noise: drawn as it is
    ("tokens / s", lambda k: k == "tokens_per_s", True),
]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw ``run_dir/metrics.jsonl`` to ``out`` (default ``run_dir/curves.png``), atomically; return its path.

    One panel per metric family that has data (`PANELS`), against the step, titled with the run folder's
    name. The figure renders with Agg; pyplot's global backend is left alone.
    """
    run_dir = Path(run_dir)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{run_dir}: no {METRICS_FILE} (is this a training run folder?)")
    records = read_metrics(metrics_path)
    splits = sorted(records, key=lambda s: (s != "train", s))  # train first, so it is drawn below
    panels = _panels(records)
    if not panels:
        raise ValueError(f"{metrics_path}: no metrics to plot")

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ncols = 1 if len(panels) == 1 else 2
    nrows = -(-len(panels) // ncols)
    fig = Figure(figsize=(6.5 * ncols, 4.0 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(run_dir.resolve().name)
    for i, (title, keys, smooth) in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        _draw_panel(ax, records, splits, keys, smooth)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 5))  # lr as 1e-4, not 0.00010
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    target = run_dir / CURVES_FILE if out is None else Path(out)
    with atomic_path(target) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    return target


def _panels(records: Records) -> list[tuple[str, list[str], bool]]:
    """The panels with data: (title, sorted metric keys, whether train series are smoothed)."""
    keys = {k for split in records.values() for r in split for k in r if k != "step"}
    panels = [(title, sorted(filter(belongs, keys)), smooth) for title, belongs, smooth in PANELS]
    return [p for p in panels if p[1]]


def _draw_panel(ax: Axes, records: Records, splits: list[str], keys: list[str], smooth: bool) -> None:
    """One colour per key; train as a faint raw line under its EMA, other splits as markers + lines."""
    markers = "osD^v<>"
    others = [s for s in splits if s != "train"]
    for k_i, key in enumerate(keys):
        color = f"C{k_i % 10}"
        for split in splits:
            points = [(r["step"], r[key]) for r in records[split] if key in r]
            if not points:
                continue
            steps, values = [p[0] for p in points], [p[1] for p in points]
            label = f"{split} {key}"
            if split != "train":
                marker = markers[others.index(split) % len(markers)]
                ax.plot(steps, values, color=color, marker=marker, markersize=4, linewidth=1.2, label=label)
                continue
            # a 20th of the series (equally smooth whatever the logging interval): under 40 points, drawn raw
            span = max(1, min(200, len(values) // 20)) if smooth else 1
            if span == 1:
                ax.plot(steps, values, color=color, linewidth=1.0, label=label)
            else:
                ax.plot(steps, values, color=color, linewidth=0.6, alpha=0.25)
                ax.plot(steps, ema(values, span), color=color, linewidth=1.2, label=f"{label} (EMA, span {span})")
