"""Checkpoint folders: ``config.json`` + ``model.safetensors`` (+ tokenizer files), transformers' layout.

Reading accepts what the ecosystem writes: safetensors single files or shards, ``pytorch_model.bin``
(single or sharded, read with ``weights_only=True``: nothing unpickled beyond plain tensors), bare
`BertModel` checkpoints without the ``bert.`` prefix, and the old ``LayerNorm.gamma / beta`` names.
Writing is atomic per file. Problems with a checkpoint are errors that name the offending keys.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn
from safetensors.torch import load_file, save_file

from bertforge.io import atomic_path
from bertforge.model.config import BertConfig

__all__ = ["CheckpointError", "LoadReport", "read_state_dict", "load_pretrained", "save_pretrained", "load_config",
           "short_list", "model_class_name"]

logger = logging.getLogger("bertforge")

SAFETENSORS_NAME = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_NAME = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"

# Keys of the bare encoder inside a head model (a missing pooler is created fresh)
_ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")
_HEAD_PREFIXES = ("cls.", "classifier.", "qa_outputs.")

M = TypeVar("M", bound=nn.Module)  # a bertforge model class: it has .config and base_model_prefix


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded as asked: the message names the file and keys."""


@dataclass
class LoadReport:
    """What loading did beyond a one-to-one copy (also logged as warnings)."""

    newly_initialized: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    reinitialized_mismatched: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- reading
def _weights_files(folder: Path) -> list[Path]:
    for index_name in (SAFETENSORS_INDEX, BIN_INDEX):
        index = folder / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as e:
                raise CheckpointError(f"{index}: not a valid shard index ({e})") from e
            files = [folder / name for name in sorted(set(weight_map.values()))]
            absent = [str(f) for f in files if not f.is_file()]
            if absent:
                raise CheckpointError(f"{index} lists shards that are missing: {', '.join(absent)}")
            return files
    for name in (SAFETENSORS_NAME, BIN_NAME):
        if (folder / name).is_file():
            return [folder / name]
    present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    raise CheckpointError(f"{folder}: no weights found (expected {SAFETENSORS_NAME}, {SAFETENSORS_INDEX}, {BIN_NAME} "
                          f"or {BIN_INDEX}); the folder holds: {', '.join(present) or 'nothing'}")


def read_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder, on the CPU, with their stored names."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a checkpoint folder (it does not exist or is not a directory)")
    state: dict[str, torch.Tensor] = {}
    for path in _weights_files(folder):
        try:
            if path.name.endswith(".safetensors"):
                part = load_file(path)
            else:
                part = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - safetensors, zip and unpickler errors all mean "unreadable"
            raise CheckpointError(f"{path}: cannot read weights (truncated or not a checkpoint?): {e}") from e
        if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
            raise CheckpointError(f"{path}: expected a mapping of names to tensors")
        state.update(part)
    return state


def _normalize_keys(state: dict[str, torch.Tensor], model: nn.Module, source: str) -> dict[str, torch.Tensor]:
    """Bring ecosystem variants of BERT's names to this model's names."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith("LayerNorm.gamma"):
            key = key[: -len("gamma")] + "weight"
        elif key.endswith("LayerNorm.beta"):
            key = key[: -len("beta")] + "bias"
        if key.endswith("embeddings.position_ids"):  # a buffer older transformers saved
            continue
        out[key] = value

    # The MLM decoder is tied to the word embeddings: an explicit copy must be that same matrix.
    decoder = out.pop("cls.predictions.decoder.weight", None)
    embeddings = out.get("bert.embeddings.word_embeddings.weight")
    if decoder is not None and embeddings is not None and not torch.equal(decoder, embeddings):
        raise CheckpointError(f"{source}: cls.predictions.decoder.weight differs from the word embeddings; "
                              "bertforge's MLM decoder is always tied to them")
    decoder_bias = out.pop("cls.predictions.decoder.bias", None)
    if decoder_bias is not None:
        out.setdefault("cls.predictions.bias", decoder_bias)

    prefix = model.base_model_prefix + "."
    has_prefix = any(k.startswith(prefix) for k in out)
    if not hasattr(model, model.base_model_prefix):  # the bare encoder
        if has_prefix:  # a head model's checkpoint loaded as the bare encoder: keep its encoder
            out = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in out.items()}
    elif not has_prefix:  # a bare encoder's checkpoint loaded under a head
        out = {prefix + k if k.startswith(_ENCODER_PREFIXES) else k: v for k, v in out.items()}
    return out


# ---------------------------------------------------------------------------- loading
def load_config(folder: str | Path) -> BertConfig:
    """A checkpoint folder's config.json, or a `CheckpointError` saying why not."""
    folder = Path(folder)
    try:
        return BertConfig.load(folder)
    except FileNotFoundError as e:
        raise CheckpointError(f"{folder}: not a checkpoint folder ({e})") from e
    except ValueError as e:
        raise CheckpointError(str(e)) from e


def load_pretrained(cls: type[M], folder: str | Path, *, config: BertConfig | None = None,
                    dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                    ignore_mismatched_sizes: bool = False, **config_overrides: Any) -> M:
    """Build ``cls`` from a checkpoint folder.

    The class's own fresh head (``classifier.*`` from a pre-trained encoder) and a missing pooler are
    initialised and reported; other BERT heads' keys are ignored and reported. Anything else (missing
    encoder weights, unknown keys, wrong shapes) raises `CheckpointError` naming the keys;
    ``ignore_mismatched_sizes`` re-initialises a head of another size (3 labels instead of 2).
    ``config_overrides`` change config fields first (``num_labels=3``, ``hidden_dropout_prob=0``).
    """
    folder = Path(folder)
    if config is None:
        config = load_config(folder)
    if config_overrides:
        config = config.replace(**config_overrides)
    model = cls(config)
    source = str(folder)
    given = _normalize_keys(read_state_dict(folder), model, source)
    expected = model.state_dict()
    state, report = _match_state(cls, model, given, expected, source, ignore_mismatched_sizes)
    if getattr(cls, "_carries_pooler", False):  # a pooler the class does not use is saved again: fine-tuning
        # after masked-LM pre-training from a full checkpoint starts from its pooler, not a random one
        model.kept_weights = {k: given[k] for k in report.ignored if ".pooler." in f".{k}"}  # type: ignore[attr-defined]
    _check_floating_point(state, expected, source)
    model.load_state_dict(state, strict=False)
    _log_load(cls, source, report)
    model.load_report = report  # type: ignore[attr-defined]
    if dtype is not None or device is not None:
        model.to(device=device, dtype=dtype)
    return model


def _match_state(cls: type, model: nn.Module, state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                 source: str, ignore_mismatched_sizes: bool) -> tuple[dict[str, torch.Tensor], LoadReport]:
    """The weights of ``state`` the model takes, and what loading them leaves out (`LoadReport`).
    Missing weights other than the class's fresh head and the pooler, weights of no BERT head, and
    shapes that differ (outside a fresh head, with ``ignore_mismatched_sizes``) are errors."""
    prefix = model.base_model_prefix + "." if hasattr(model, model.base_model_prefix) else ""
    freshable = tuple(cls._fresh_head_prefixes) + (prefix + "pooler.",)
    other_heads = _HEAD_PREFIXES + (prefix + "pooler.",)
    missing = [k for k in expected if k not in state]
    hard_missing = [k for k in missing if not k.startswith(freshable)]
    if hard_missing:
        raise CheckpointError(f"{source}: weights missing from the checkpoint for {cls.__name__}: "
                              f"{short_list(hard_missing)}")
    unexpected = [k for k in state if k not in expected]
    hard_unexpected = [k for k in unexpected if not k.startswith(other_heads)]
    if hard_unexpected:
        raise CheckpointError(f"{source}: the checkpoint has weights {cls.__name__} does not know (does config.json "
                              f"match the weights?): {short_list(hard_unexpected)}")
    mismatched = [(k, tuple(state[k].shape), tuple(expected[k].shape))
                  for k in expected if k in state and state[k].shape != expected[k].shape]
    heads_only = all(k.startswith(freshable) for k, _, _ in mismatched)
    if mismatched and not (ignore_mismatched_sizes and heads_only):
        details = short_list([f"{k}: checkpoint {a}, model {b}" for k, a, b in mismatched], 10, "; ")
        hint = " (pass ignore_mismatched_sizes=True to re-initialise a task head of another size)" if heads_only else ""
        raise CheckpointError(f"{source}: shapes differ between checkpoint and config: {details}{hint}")
    reinitialized = [k for k, _, _ in mismatched]
    kept = {k: v for k, v in state.items() if k in expected and k not in reinitialized}
    return kept, LoadReport(missing, unexpected, reinitialized)


def _check_floating_point(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], source: str) -> None:
    """load_state_dict would cast integer or boolean tensors to float without a word: such weights
    are not a trained model's, so they are refused by name."""
    not_float = [f"{k} ({str(v.dtype).replace('torch.', '')})" for k, v in state.items()
                 if expected[k].is_floating_point() and not v.is_floating_point()]
    if not_float:
        raise CheckpointError(f"{source}: weights must be floating point (float32, float16 or bfloat16); "
                              f"these are not: {short_list(not_float)}")


def _log_load(cls: type, source: str, report: LoadReport) -> None:
    """Fresh weights as a warning (they need training), other heads' weights left out as a debug note."""
    if report.newly_initialized or report.reinitialized_mismatched:
        logger.warning("%s: newly initialised from %s (train before use): %s", cls.__name__, source,
                       short_list(report.newly_initialized + report.reinitialized_mismatched))
    if report.ignored:
        logger.debug("%s: ignored checkpoint weights of other heads in %s: %s", cls.__name__, source,
                    short_list(report.ignored))


def short_list(keys: list[str], limit: int = 12, sep: str = ", ") -> str:
    """The first ``limit`` keys, ``sep``-separated, and how many more (for error messages)."""
    shown = sep.join(keys[:limit])
    return shown + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


# ---------------------------------------------------------------------------- saving
def save_pretrained(model: nn.Module, folder: str | Path, tokenizer: Any = None,
                    state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """Write ``config.json``, ``model.safetensors`` and, if given, the tokenizer's files. ``state_dict``
    replaces the model's own (e.g. the full weights gathered from an FSDP-sharded model).

    Each file is replaced atomically, weights first, so a crash leaves either the old checkpoint or
    the new weights beside the old config of the same model.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in (state_dict or model.state_dict()).items()}
    state = {**getattr(model, "kept_weights", {}), **state}
    with atomic_path(folder / SAFETENSORS_NAME) as tmp:
        save_file(state, tmp, metadata={"format": "pt"})
    model.config.replace(architectures=[model_class_name(model)]).save(folder / "config.json")
    _remove_stale_shards(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def _remove_stale_shards(folder: Path) -> None:
    """Delete shard indexes (and the shards they list) left by an earlier save into ``folder``: readers
    (ours and transformers') take an index before ``model.safetensors``, so a stale one would load the
    old weights. Removed last, so a crash before this point still leaves the old checkpoint complete."""
    for index_name in (SAFETENSORS_INDEX, BIN_INDEX):
        index = folder / index_name
        if not index.is_file():
            continue
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            shards = set()
        index.unlink()
        for name in shards:
            if isinstance(name, str) and name == Path(name).name and name != SAFETENSORS_NAME:
                (folder / name).unlink(missing_ok=True)


def model_class_name(model: nn.Module) -> str:
    """The bertforge class ``model`` was built from, not a wrapper that subclasses it (FSDP's
    fully_shard makes "FSDP<name>"): the first class in its MRO defined by bertforge."""
    return next(c.__name__ for c in type(model).__mro__ if c.__module__.startswith("bertforge."))
