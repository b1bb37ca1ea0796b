"""A training checkpoint: a checkpoint folder plus the trainer's state (`STATE_PT`, read back with
``torch.load(weights_only=True)``) and its readable record with the run's settings (`STATE_JSON`); and
the check that a run may continue from it (`check_compatible`). Both formats are fixed: old runs must resume.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bertforge.io import atomic_dir, atomic_write_text
from bertforge.model.checkpoint import CheckpointError, read_state_dict, save_pretrained
from bertforge.settings import follow_folder, option

if TYPE_CHECKING:
    from torch import nn

    from bertforge.train.config import ResumeRules
    from bertforge.train.distributed import Distributed

__all__ = ["STATE_PT", "STATE_JSON", "rng_state", "set_rng_state", "read_info", "read_state", "check_compatible",

           "setting_changes", "changes_text", "full_state_dicts", "save_model", "write_checkpoint", "load_weights"]

STATE_PT = "trainer_state.pt"
STATE_JSON = "trainer_state.json"


def rng_state() -> dict[str, Any]:
    """This process's random-generator states; numpy's keys as a tensor, for ``weights_only`` loading."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` recorded."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_info(folder: Path) -> dict[str, Any]:
    """The readable record (`STATE_JSON`) of a training checkpoint folder."""
    info_path, state_path = folder / STATE_JSON, folder / STATE_PT
    if not state_path.is_file() or not info_path.is_file():
        raise CheckpointError(f"{folder}: not a training checkpoint (no {STATE_PT} / {STATE_JSON})")
    return json.loads(info_path.read_text(encoding="utf-8"))


def read_state(folder: Path) -> dict[str, Any]:
    """The trainer's state (`STATE_PT`) of a checkpoint folder."""
    path = folder / STATE_PT
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any failure means an unreadable file
        raise CheckpointError(f"{path}: unreadable training state: {e}") from e


def full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer, fsdp: bool
                     ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The full (unsharded) model and optimizer state; a collective call under FSDP."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return model.state_dict(), optimizer.state_dict()


def save_model(folder: str | Path, model: nn.Module, tokenizer: Any, dist: Distributed, fsdp: bool,
               extra_files: dict[str, str] | None = None) -> None:
    """Write ``model``, ``tokenizer`` and ``extra_files`` as ``folder``; every process calls this."""
    weights = None
    if fsdp:  # each process holds a shard: gathering the full weights is a collective call
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_main:
        with atomic_dir(folder) as tmp:
            save_pretrained(model, tmp, tokenizer=tokenizer, state_dict=weights)
            for name, text in (extra_files or {}).items():
                atomic_write_text(tmp / name, text)
    dist.barrier()


def write_checkpoint(folder: Path, model: nn.Module, weights: dict[str, torch.Tensor], tokenizer: Any,
                     state: dict[str, Any], info: dict[str, Any]) -> None:
    """Write a training checkpoint (the main process): ``model``'s folder with ``weights`` and ``tokenizer``,
    ``state`` as `STATE_PT` and ``info`` as `STATE_JSON`, swapped in whole."""
    with atomic_dir(folder) as tmp:
        save_pretrained(model, tmp, tokenizer=tokenizer, state_dict=weights)
        torch.save(state, tmp / STATE_PT)
        atomic_write_text(tmp / STATE_JSON, json.dumps(info, indent=1, default=str) + "\n")


def load_weights(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any],
                 fsdp: bool) -> None:
    """Load ``model``'s weights from a checkpoint folder, and the optimizer's state."""
    weights = read_state_dict(folder)
    expected = model.state_dict()
    bad = sorted(k for k in expected if k not in weights or weights[k].shape != expected[k].shape)
    if bad:
        raise CheckpointError(f"{folder}: its weights do not fit this model ({', '.join(bad[:8])}"
                              f"{' ...' if len(bad) > 8 else ''})")
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=optimizer_state,
                       options=StateDictOptions(full_state_dict=True))
    else:
        model.load_state_dict({k: weights[k] for k in expected})
        optimizer.load_state_dict(optimizer_state)


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any], rules: ResumeRules, folder: Path) -> None:
    """Refuse to resume from ``folder`` if ``current`` differs from ``saved`` beyond what ``rules`` allow (files
    the record names inside its own run folder are compared where that folder is now: `follow_folder`)."""
    if "out" in current:
        saved = follow_folder(saved, current["out"])
    steps, ratio = saved.get("warmup_steps"), saved.get("warmup_ratio")
    if steps is not None and ratio is not None:
        # an old record holds both, the ratio winning when above 0: the same warmup as this run's is no change
        given = (current.get("warmup_steps"), current.get("warmup_ratio"))
        recorded = (None, ratio) if ratio > 0 else (steps, None)
        if _warmup_rule(*recorded, rules) == _warmup_rule(*given, rules):
            recorded = given
        saved = {**saved, "warmup_steps": recorded[0], "warmup_ratio": recorded[1]}
    changed = setting_changes(saved, current, rules.absent, rules.resumable)
    if not changed:
        return
    details = changes_text(changed)
    end = "use the original settings or a new output folder"
    warmup = ("warmup_steps", "warmup_ratio")
    if any(k in warmup for k, _, _ in changed):
        hint = _warmup_hint(*(saved.get(k) for k in warmup), *(current.get(k) for k in warmup))
        rest = "" if all(k in warmup for k, _, _ in changed) else " and the other settings as they were"
        end = f"{hint}{rest} to resume this run, or use a new output folder"
    raise ValueError(f"cannot resume from {folder}: the run's settings differ ({details}); {end}")


def _warmup_rule(steps: int | None, ratio: float | None, rules: ResumeRules) -> tuple[str, float]:
    """The warmup settings ``steps`` / ``ratio`` (None: not given) resolved: ("steps", n) or ("ratio", share)."""
    if steps is not None:
        return "steps", steps
    if ratio is not None:
        return "ratio", ratio
    if rules.default_warmup_ratio is not None:
        return "ratio", rules.default_warmup_ratio
    return "steps", rules.default_warmup_steps


def setting_changes(saved: Mapping[str, Any], current: Mapping[str, Any], absent: Mapping[str, Any] | None = None,
                    skip: frozenset[str] = frozenset(), prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(name, recorded, now) of every setting outside ``skip`` that differs between two records (missing:
    ``absent[name]``), nested records field by field ("model_config.hidden_size"), top-level ones first."""
    out = []
    for k in sorted(set(saved) | set(current)):
        name = prefix + k
        if name in skip:
            continue
        was, now = saved.get(k, (absent or {}).get(name)), current.get(k, (absent or {}).get(name))
        if isinstance(was, Mapping) and isinstance(now, Mapping):
            out += setting_changes(was, now, absent, skip, name + ".")
        elif was != now:
            out.append((name, was, now))
    return sorted(out, key=lambda d: "." in d[0]) if not prefix else out


def _warmup_hint(steps: int | None, ratio: float | None, given_steps: int | None, given_ratio: float | None) -> str:
    """What to pass to resume a run recorded with warmup ``steps`` / ``ratio``, given ``given_*``."""
    if steps is not None:
        return (f"pass {option('warmup_steps', steps)}"
                + (f" instead of {option('warmup_ratio')}" if given_ratio is not None else ""))
    if ratio is not None:
        return (f"pass {option('warmup_ratio', ratio)}"
                + (f" instead of {option('warmup_steps')}" if given_steps is not None else ""))
    return f"give neither {option('warmup_steps')} nor {option('warmup_ratio')}"


def changes_text(changed: list[tuple[str, Any, Any]], most: int = 8) -> str:
    """``setting_changes`` on one line: "lr: 0.002 -> 0.5; model_config.hidden_size: 128 -> 256"."""
    return "; ".join(f"{k}: {_short(was)} -> {_short(now)}" for k, was, now in changed[:most])


def _short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
