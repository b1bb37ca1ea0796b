"""The run folder: what a run writes into ``--out`` (`RUN_FILES`, `RUN_SETUP`), admitting a run into it
(`open_run_dir`), and the marker (`STOP_MARKER`) of a model a run that stopped before ``max_steps`` saved,
which ``bertforge info`` and the predictor report.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from bertforge.io import clear_stale
from bertforge.settings import option
from bertforge.train.distributed import Distributed
from bertforge.train.state import STATE_PT

__all__ = ["CHECKPOINTS_DIR", "METRICS_FILE", "RUN_CONFIG", "RUN_FILES", "RUN_SETUP", "STOP_MARKER", "checkpoint_dir", "stopped_where",
           "checkpoints", "latest_checkpoint", "prune_checkpoints", "run_files", "open_run_dir", "stop_marker",
           "read_stop_marker"]

logger = logging.getLogger("bertforge")

CHECKPOINTS_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
STOP_MARKER = "stopped_early.json"
"""Written into the model folder of a run that stopped before max_steps: that model is not the finished one."""
RUN_FILES = (METRICS_FILE, CHECKPOINTS_DIR, "model", "curves.png")
"""The results a run writes into its folder (a kind of run adds its own, e.g. fine-tuning's best/)."""
RUN_CONFIG = "run_config.json"
"""The run's settings (`bertforge.train.loop.Trainer` ``run_config``) as JSON, written once they are accepted."""
RUN_SETUP = (RUN_CONFIG, "tensorboard")
"""What a run writes before its first result: a folder holding only these is a run that failed at its start."""
_STEP_DIR = re.compile(r"^step-(\d{8})$")


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """The folder of the checkpoint at ``step``."""
    return Path(run_dir) / CHECKPOINTS_DIR / f"step-{step:08d}"


def checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of a run's complete checkpoints, oldest first (temporary, half-written ones are ignored)."""
    folder = Path(run_dir) / CHECKPOINTS_DIR
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in folder.iterdir()
                  if (m := _STEP_DIR.match(p.name)) and (p / STATE_PT).is_file())


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint folder of a run (temporary, half-written ones are ignored)."""
    found = checkpoints(run_dir)
    return found[-1][1] if found else None


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Remove all but the last ``keep`` checkpoints (0: keep all) and what crashed saves left."""
    folder = Path(run_dir) / CHECKPOINTS_DIR
    if keep:
        for old in sorted(p for p in folder.iterdir() if _STEP_DIR.match(p.name))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    for stale in [*folder.glob(".step-*.tmp-*"), *folder.glob(".step-*.old-*")]:  # left by a crashed save
        shutil.rmtree(stale, ignore_errors=True)


def run_files(run_dir: str | Path, outputs: tuple[str, ...] = (), names: tuple[str, ...] = RUN_FILES) -> list[str]:
    """The non-empty files and folders of an earlier run's results in ``run_dir`` (``names`` and
    ``outputs``); folders end in "/"."""
    folder = Path(run_dir)
    found = []
    for name in dict.fromkeys((*names, *outputs)):
        p = folder / name
        if (p.is_file() and p.stat().st_size) or (p.is_dir() and any(p.iterdir())):
            found.append(name + ("/" if p.is_dir() else ""))
    return found


def open_run_dir(run_dir: str | Path, resume: bool, overwrite: bool = False, *, outputs: tuple[str, ...] = (),
                 dist: Distributed | None = None, change: bool = True) -> Path | None:
    """Admit a run into ``run_dir`` and return the checkpoint it continues from (None: a fresh start).

    A folder holding an earlier run's files (`run_files`) is refused, untouched, unless ``resume`` continues
    from its newest checkpoint or ``overwrite`` deletes them. Every process calls this (holding the folder's
    lock); only the main one changes the folder. ``change=False`` checks only: a run calls it so before it
    reads its data and builds its model, and again once they are accepted, so that nothing is deleted for a
    run that is then refused.
    """
    dist = dist or Distributed()
    folder = Path(run_dir)
    if resume and overwrite:
        raise ValueError(f"{option('resume', True)} continues the run in {option('out')} and "
                         f"{option('overwrite', True)} deletes it: give one of them")
    held = run_files(folder, outputs)
    latest = latest_checkpoint(folder)
    if resume and latest is None:
        hint = f" (it holds {', '.join(held)}; {option('overwrite', True)} starts afresh there)" if held else ""
        raise ValueError(f"{option('resume', True)}: {folder} has no complete checkpoint to resume from{hint}")
    if not resume and not overwrite and held:
        how = (f"{option('resume', True)} continues it from {latest.relative_to(folder)}" if latest is not None
               else "it has no checkpoint to resume from")
        raise ValueError(f"{folder} already holds a previous run's files ({', '.join(held)}); {how}, "
                         f"{option('overwrite', True)} deletes them and starts afresh, or give {option('out')} a new "
                         "folder")
    if not change:
        return latest if resume else None
    dist.barrier()  # every process has looked before the main one changes anything
    if dist.is_main:
        _clear(folder, held if not resume else None, overwrite, outputs)
    dist.barrier()
    return latest_checkpoint(folder) if resume else None


def _clear(folder: Path, held: list[str] | None, overwrite: bool, outputs: tuple[str, ...]) -> None:
    """Delete the earlier run's files ``held`` (None: a resumed run keeps them), then what killed writes left."""
    if overwrite and held:
        logger.warning("%s: deleting the previous run's %s in %s", option("overwrite", True), ", ".join(held), folder)
    # a fresh start also drops what a run that failed before its first result left (settings, events)
    for name in (held + run_files(folder, names=RUN_SETUP)) if held is not None else []:
        p = folder / name.rstrip("/")
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
    names = set(RUN_FILES) | set(RUN_SETUP) | set(outputs)
    for p in clear_stale(folder, lambda name: name in names) + clear_stale(folder / CHECKPOINTS_DIR,
                                                                         _STEP_DIR.match):
        logger.info("removed %s, left by a run that was killed", p)


class _Ended(Protocol):
    """How a run ended, as `bertforge.train.loop.TrainResult` says it."""

    step: int
    max_steps: int
    stopped_early: bool
    stop_signal: int
    budget_minutes: float
    elapsed_seconds: float


def stop_marker(result: _Ended) -> dict[str, str]:
    """The extra file (name -> text) for the model a run saves: `STOP_MARKER` if it stopped early, else none."""
    if not result.stopped_early:
        return {}
    reason = signal.Signals(result.stop_signal).name if result.stop_signal else "time limit (max_time_minutes)"
    record = {"step": result.step, "max_steps": result.max_steps, "reason": reason,
              "note": "training stopped early: a partial model; continue the run with --resume"}
    if result.budget_minutes:
        record.update(budget_minutes=result.budget_minutes, minutes=round(result.elapsed_seconds / 60, 3))
    return {STOP_MARKER: json.dumps(record, indent=1) + "\n"}


def stopped_where(record: Mapping[str, Any]) -> str:
    """Where a stopped run stopped (a `STOP_MARKER` record or the same fields): "step 473 of 1000", or for a
    time-budget run "1.3 of its 5 budget minutes (step 473)"."""
    if record.get("budget_minutes"):
        return f"{record.get('minutes', 0):.1f} of its {record['budget_minutes']:g} budget minutes (step " \
               f"{record.get('step', '?')})"
    return f"step {record.get('step', '?')} of {record.get('max_steps', '?')}"


def read_stop_marker(folder: str | Path) -> dict[str, Any] | None:
    """The `STOP_MARKER` record of a model folder (None: no marker, a finished model)."""
    path = Path(folder) / STOP_MARKER
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        record = None
    return record if isinstance(record, dict) else {"note": f"{path} is unreadable"}
