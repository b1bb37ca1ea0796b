"""A study's report in the paper's layout: one row per variant, one column per task, the mean over
seeds (x 100) and its 95% interval; each row's difference from the first row, paired by seed (the same
seed gives both rows the same data order, so the pairing drops what they share); the paper's orderings
tested the same way; the pre-training each row had; the plots (``scores.png``, ``figure.png``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertforge.experiments.study import StudyFolder
from bertforge.io import atomic_path, atomic_write_text
from bertforge.stats import CONFIDENCE, Interval, mean_interval, paired_difference

__all__ = ["write_report", "summarise", "study_cells"]


def summarise(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample standard deviation (0 for one value), min, max and count of a cell's scores."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return {"n": 0}
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "sd": sd, "min": min(values), "max": max(values), "n": len(values)}


def _cell(by_seed: dict[int, float], seeds: Sequence[int], interval: Interval) -> dict[str, Any]:
    """A cell of report.json's table: `summarise`'s figures, the finished seeds and scores (NaN as None)."""
    done = [s for s in seeds if s in by_seed]
    values = [by_seed[s] for s in done]
    return {**summarise(values), "seeds": done, "values": [None if math.isnan(v) else v for v in values],
            "interval": interval.to_json()}


def _difference(row: dict[int, float], baseline: dict[int, float], seeds: Sequence[int]
                ) -> tuple[dict[str, Any], Interval]:
    """``row`` minus ``baseline`` over the seeds both scored: as report.json keeps it, and its interval."""
    both = [s for s in seeds if s in row and s in baseline and not math.isnan(row[s]) and not math.isnan(baseline[s])]
    d = paired_difference([row[s] for s in both], [baseline[s] for s in both])
    return {"seeds": both, "differences": [row[s] - baseline[s] for s in both], "interval": d.to_json(),
            "resolved": d.resolved}, d


def _compare(study: Any, scores: dict[tuple[str, str], dict[int, float]], pairs: Sequence[tuple[str, str]]
             ) -> list[tuple[str, str, str, dict[str, Any], Interval]]:
    """(above, below, task, `_difference`'s entry and interval) for each pair of rows and each task both have."""
    filled = {(v.name, t.name) for v, t in study.cells()}
    return [(a, b, t.name, *_difference(scores[a, t.name], scores[b, t.name], study.seeds))
            for a, b in pairs for t in study.tasks if (a, t.name) in filled and (b, t.name) in filled]


def _verdict(d: Interval) -> str:
    """An ordering's verdict from its paired difference (above minus below)."""
    if not d.resolved:
        return "not resolved"
    return "holds" if d.mean > 0 else "reversed"


def _orderings_table(study: Any, orderings: list[tuple[dict[str, Any], Interval]], seeds: int) -> list[str]:
    """report.md's lines on the paper's orderings: a row per ordering, a column per task (none without any)."""
    if not orderings:
        return []
    found = {(e["above"], e["below"], e["task"]): _fmt(d, seeds, e["verdict"]) for e, d in orderings}
    return ["", "The paper's orderings at this scale: the upper row minus the lower on the same seed, x 100, the "
                f"mean and its {CONFIDENCE:.0%} interval; *holds* where the interval lies above 0, *reversed* where "
                "below:", "",
            *_table(["paper", *(t.name for t in study.tasks)],
                    [[f"{a} > {b}", *(found.get((a, b, t.name), "—") for t in study.tasks)]
                     for a, b in study.orderings])]


def _fmt(i: Interval, seeds: int, verdict: str = "") -> str:
    """``"84.3 [82.1, 86.5]"`` (x 100), with ``(n=2)`` for missing seeds; with a ``verdict``, signed."""
    if not i.n:
        return "—"
    text = i.format(signed=bool(verdict)) + (f" (n={i.n})" if i.n < seeds else "")
    return f"{text} {verdict}" if verdict else text


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(r) + " |" for r in rows)]


def _machine() -> dict[str, Any]:
    import torch

    from bertforge.train.precision import cpu_name
    from bertforge.version import __version__

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__, "bertforge": __version__,
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def study_cells(study: Any, cells: Sequence[Any], figure: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Of ``cells`` and ``figure`` cells, those of ``study``'s rows, columns and seeds as it stands (a
    folder keeps the cells of ones since removed)."""
    table = {(v.name, t.name) for v, t in study.cells()}
    seeds = set(study.seeds)
    drawn = {(name, study.figure.task) for name in study.figure.variants} if study.figure else set()
    return ([c for c in cells if (c.variant, c.task) in table and c.seed in seeds],
            [c for c in figure if (c.variant, c.task) in drawn and c.seed in seeds])


def write_report(study: Any, out: Path, cells: Sequence[Any], figure_cells: Sequence[Any],
                 pretraining: dict[str, dict[str, Any]]) -> Path:
    """``report.md``, ``report.json`` and the plots of a study folder, from its finished cells and
    pre-trainings (variant name -> its ``done.json``); return the report's path."""
    folder = StudyFolder(out)
    cells, figure_cells = study_cells(study, cells, figure_cells)
    seeds = len(study.seeds)
    scores: dict[tuple[str, str], dict[int, float]] = {(v.name, t.name): {} for v in study.variants
                                                       for t in study.tasks}  # seed -> score
    for c in cells:
        scores[c.variant, c.task][c.seed] = c.value
    intervals = {key: mean_interval(list(by_seed.values())) for key, by_seed in scores.items()}
    table = {v.name: {t.name: _cell(scores[v.name, t.name], study.seeds, intervals[v.name, t.name])
                      for t in study.tasks} for v in study.variants}
    baseline = study.variants[0].name
    paired: dict[tuple[str, str], Interval] = {}
    differences: dict[str, dict[str, dict[str, Any]]] = {}
    for row, _, task, entry, d in _compare(study, scores, [(v.name, baseline) for v in study.variants[1:]]):
        paired[row, task] = d
        differences.setdefault(row, {})[task] = entry
    orderings = [({"above": a, "below": b, "task": task, **entry, "verdict": _verdict(d)}, d)
                 for a, b, task, entry, d in _compare(study, scores, study.orderings)]
    metric = {t.name: t.metric or next((c.metric for c in cells if c.task == t.name and c.metric), "score")
              for t in study.tasks}
    machine = _machine()
    pre_minutes = sum(r.get("minutes", 0.0) for r in {r.get("model"): r for r in pretraining.values()}.values())
    ft_minutes = sum(c.seconds for c in [*cells, *figure_cells]) / 60

    lines = [f"# {study.title or study.name}", ""]
    if study.description:
        lines += [study.description, ""]
    lines += [f"Measured with `bertforge ablate {_command_name(study)}` on {machine['cpu']} ({machine['cores']} cores"
              f"{', ' + machine['gpu'] if machine['gpu'] else ''}), torch {machine['torch']}, bertforge "
              f"{machine['bertforge']}. Fine-tuning seeds {', '.join(map(str, study.seeds))}; compute "
              f"{pre_minutes + ft_minutes:.0f} minutes (pre-training {pre_minutes:.0f}, fine-tuning {ft_minutes:.0f}).",
              "", f"Dev-set scores x 100: the mean over the seeds and its {CONFIDENCE:.0%} interval (Student's t):", ""]
    header = ["", *(f"{t.name} ({metric[t.name]})" for t in study.tasks)]
    lines += _table(header, [[v.name, *(_fmt(intervals[v.name, t.name], seeds) for t in study.tasks)]
                             for v in study.variants])
    if len(study.variants) > 1:
        lines += ["", f"Difference from {baseline}, paired by seed: each row's score minus {baseline}'s on the "
                      f"same seed (the seeds both rows finished), x 100, the mean and its {CONFIDENCE:.0%} interval; "
                      "resolved where the interval excludes 0:", ""]
        lines += _table(header, [[v.name, *(_fmt(d, seeds, "resolved" if d.resolved else "not resolved")
                                            if (d := paired.get((v.name, t.name))) else "—" for t in study.tasks)]
                                 for v in study.variants[1:]])
    lines += _orderings_table(study, orderings, seeds)
    classic = {task: fitted["models"] for task, fitted in json.loads(folder.classic_baselines.read_text(
        encoding="utf-8")).items()} if folder.classic_baselines.is_file() else {}
    lines += _classic_table(study, classic, metric, header)
    if study.paper:
        lines += ["", "The paper's figures for the same rows and columns:", ""]
        lines += _table(header, [[v.name, *(f"{study.paper.get(v.name, {}).get(t.name, '—')}" for t in study.tasks)]
                                 for v in study.variants])
    lines += ["", "![scores](scores.png)", ""]
    if study.figure and figure_cells:
        lines += [f"Fine-tuning score on {study.figure.task} against pre-training steps (the paper's Figure 5):", "",
                  "![figure](figure.png)", ""]
    lines += ["## Pre-training", "", *_pretraining_table(study, pretraining), "", "## Tasks", "",
              *_table(["", "data", "recipe"], [[t.name, _task_data(t), _recipe(t)] for t in study.tasks])]
    changed = [v for v in study.variants if v.finetune or v.tasks]
    if changed:
        lines += ["", "Rows that change the fine-tuning or leave out tasks: " + "; ".join(
            f"{v.name}: {_settings(v.finetune)}{' (only ' + ', '.join(v.tasks) + ')' if v.tasks else ''}"
            for v in changed) + "."]
    lines.append("")

    figure = _figure_points(figure_cells)
    _plot_scores(study, scores, metric, folder.scores_plot)
    if figure:
        _plot_figure(study, figure, metric[study.figure.task], folder.figure_plot)
    data = {"study": study.name, "file": str(study.path), "machine": machine, "seeds": list(study.seeds),
            "minutes": {"pretraining": pre_minutes, "finetuning": ft_minutes}, "metric": metric, "table": table,
            "differences": {"baseline": baseline, "paired_by": "seed", "table": differences},
            "orderings": [e for e, _ in orderings],
            "classic_baselines": classic, "pretraining": pretraining, "cells": [dataclasses.asdict(c) for c in cells],
            "figure": [dataclasses.asdict(c) for c in figure_cells], "paper": study.paper}
    atomic_write_text(folder.report_data, json.dumps(data, indent=1, default=str) + "\n")
    atomic_write_text(folder.report, "\n".join(lines))
    return folder.report


def _classic_table(study: Any, classic: dict[str, dict[str, dict[str, float]]], metric: dict[str, str],
                   header: list[str]) -> list[str]:
    """report.md's lines on the classic baselines: a row per model, each task's metric where it was fitted."""
    names = list(dict.fromkeys(name for by in classic.values() for name in by))
    if not names:
        return []

    def value(task: str, name: str) -> str:
        got = classic.get(task, {}).get(name, {}).get(metric[task])
        return "—" if got is None else f"{100 * got:.1f}"

    return ["", "What a practitioner would use without pre-training: the classic models fitted once on each "
                "task's training data and scored on its dev set with the same metric, x 100 "
                "(`bertforge.experiments.baselines`):", "",
            *_table(header, [[name, *(value(t.name, name) for t in study.tasks)] for name in names])]


def _pretraining_table(study: Any, pretraining: dict[str, dict[str, Any]]) -> list[str]:
    """The pre-training each row had: objective, model, steps, held-out accuracy, minutes."""
    rows = []
    for v in study.variants:
        r = pretraining.get(v.name)
        if v.checkpoint or r is None:
            rows.append([v.name, f"checkpoint `{v.checkpoint}`" if v.checkpoint else "not run yet", "", "", "", ""])
        else:
            rows.append([v.name, r["objective"], r.get("model_description", ""), f"{r['steps']:,} × {r['batch_size']}",
                         _held_out(r.get("eval_metrics", {})), f"{r['minutes']:.1f}"])
    return _table(["", "objective", "model", "steps × batch", "held-out accuracy x 100 (perplexity)", "minutes"], rows)


def _held_out(ev: dict[str, float]) -> str:
    """"mlm 61.2 (ppl 7.3), nsp 88.0": each objective's held-out accuracy, and the LM's perplexity."""
    parts = []
    for name in ("mlm", "ltr", "nsp"):
        if f"{name}_accuracy" not in ev:
            continue
        text = f"{name} {100 * ev[f'{name}_accuracy']:.1f}"
        ppl = ev.get(f"{name}_perplexity") or (math.exp(min(ev[f"{name}_loss"], 50.0))
                                               if name != "nsp" and f"{name}_loss" in ev else None)
        parts.append(text + (f" (ppl {ppl:.1f})" if ppl else ""))
    return ", ".join(parts) or "—"


def _command_name(study: Any) -> str:
    """How the study is named on the command line: a bundled study by its name, else its file."""
    from bertforge.experiments.study import bundled_studies

    return study.path.stem if bundled_studies().get(study.path.stem) == study.path else str(study.path)


def _settings(settings: dict[str, Any]) -> str:
    """"lr 0.001, bilstm true", or "the study's settings" for none."""
    return (", ".join(f"{k} {str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items())
            or "the study's settings")


def _task_data(t: Any) -> str:
    if t.source:
        limits = [f"{n:,} {what}" for n, what in ((t.max_train, "training"), (t.max_dev, "dev")) if n]
        return f"{t.source}{' (' + ', '.join(limits) + ' examples)' if limits else ''}"
    return f"{t.settings.get('task')}: {Path(str(t.settings.get('train_file'))).name} / " \
           f"{Path(str(t.settings.get('dev_file'))).name}"


def _recipe(t: Any) -> str:
    from bertforge.tasks.finetune import FinetuneConfig

    keys = ["epochs", "lr", "batch_size", "max_seq_length", "features", "bilstm"]
    if t.settings.get("features") or t.settings.get("bilstm"):
        keys.append("bilstm_size")
    shown = {k: t.settings.get(k, getattr(FinetuneConfig, k)) for k in keys}
    return _settings({k: v for k, v in shown.items() if v not in ("", False, 0) or k in keys[:4]})


def _figure_points(cells: Sequence[Any]) -> dict[str, dict[int, list[float]]]:
    points: dict[str, dict[int, list[float]]] = {}
    for c in cells:
        if c.pretrain_step is not None:
            points.setdefault(c.variant, {}).setdefault(c.pretrain_step, []).append(c.value)
    return points


def _new_figure(size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


def _plot_scores(study: Any, scores: dict[tuple[str, str], dict[int, float]], metric: dict[str, str],
                 path: Path) -> None:
    """One panel per task: each variant's seeds as dots, their mean as a tick, its 95% interval as a line."""
    n = len(study.tasks)
    fig = _new_figure((max(4.0, 3.2 * n), 3.2 + 0.15 * len(study.variants)))
    names = [v.name for v in study.variants]
    for k, t in enumerate(study.tasks):
        ax = fig.add_subplot(1, n, k + 1)
        shown = []  # every seed's score and interval end, for the panel's limits
        for i, name in enumerate(names):
            values = [100 * v for v in scores[name, t.name].values() if not math.isnan(v)]
            if values:
                interval = mean_interval(values)
                ax.plot([interval.mean, interval.mean], [i - 0.3, i + 0.3], color="tab:blue", linewidth=2.5)
                if interval.low is not None and interval.high is not None:
                    ax.plot([interval.low, interval.high], [i, i], color="tab:blue", linewidth=1.0)
                    shown += [interval.low, interval.high]
                ax.scatter(values, [i] * len(values), color="tab:blue", s=14, alpha=0.6, zorder=3)
                shown += values
        ax.set_yticks(range(len(names)), names if k == 0 else [""] * len(names))
        ax.invert_yaxis()
        if shown:
            lo, hi = min(shown), max(shown)
            pad = max(1.0, 0.15 * (hi - lo))
            ax.set_xlim(lo - pad, hi + pad)
        ax.set_title(f"{t.name} ({metric[t.name]} x 100)", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(study.title or study.name, fontsize=10)
    _save(fig, path)


def _plot_figure(study: Any, points: dict[str, dict[int, list[float]]], metric: str, path: Path) -> None:
    """Score against pre-training steps: a line through the seeds' means per variant, a band over their range."""
    ax = _new_figure((6.5, 4.2)).add_subplot()
    for name, by_step in points.items():
        steps = sorted(by_step)
        (line,) = ax.plot(steps, [100 * statistics.fmean(by_step[s]) for s in steps], marker="o", label=name)
        ax.fill_between(steps, [100 * min(by_step[s]) for s in steps], [100 * max(by_step[s]) for s in steps],
                        color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel("pre-training steps")
    ax.set_ylabel(f"dev {metric} x 100 (seeds' mean and range)")
    ax.set_title(f"{study.name}: {study.figure.task} after fine-tuning, against pre-training steps", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    _save(ax.figure, path)
