"""The on-disk format of prepared pre-training data: a folder of shards and a manifest.

A shard is one safetensors file of flat integer arrays (no pickle; the header is checked, so a
truncated file is detected on open), plus a sidecar ``.json`` with its counts, statistics, size in bytes and
SHA-256. ``manifest.json`` gathers the settings, the vocab hash and every shard's entry.

Arrays of a shard of n instances (token ids as uint16 when the vocab fits, else uint32):
    input_ids        (sum L,)   instances concatenated, masked (static) or not (dynamic masking)
    offsets          (n + 1,)   int64: instance i is input_ids[offsets[i]:offsets[i+1]]
    num_a            (n,)       uint16: tokens of [CLS] A [SEP] (token type 0); the rest are type 1
    next_sentence    (n,)       uint8: 0 IsNext, 1 NotNext
    mask_offsets     (n + 1,)   int64: instance i's predictions are [mask_offsets[i]:mask_offsets[i+1]]
    masked_positions (sum P,)   uint16, sorted within an instance
    masked_labels    (sum P,)   original token ids at those positions
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from bertforge.data.instances import InstanceBatch, TrainingInstance
from bertforge.io import atomic_path, atomic_write_text

__all__ = ["FORMAT", "Shard", "ShardError", "write_shard", "read_shard", "shard_name", "sha256_file"]

FORMAT = "bertforge-pretraining-v1"
_META_KEY = "bertforge"
_ARRAYS = ("input_ids", "offsets", "num_a", "next_sentence", "mask_offsets", "masked_positions", "masked_labels")


class ShardError(ValueError):
    """A shard or manifest that is missing, truncated, corrupt or from another vocab."""


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Shard(InstanceBatch):
    """A shard's arrays in memory, with instance-level access (``instance(i)``, ``lengths()``)."""


def write_shard(path: Path, instances: InstanceBatch | Sequence[TrainingInstance], *, vocab_size: int,
                vocab_hash: str, info: dict[str, Any]) -> dict[str, Any]:
    """Write ``instances`` to ``path`` (atomically) and its sidecar; return the sidecar entry."""
    batch = instances if isinstance(instances, InstanceBatch) else InstanceBatch.from_instances(instances)
    id_dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
    dtypes = {"input_ids": id_dtype, "offsets": np.int64, "num_a": np.uint16, "next_sentence": np.uint8,
              "mask_offsets": np.int64, "masked_positions": np.uint16, "masked_labels": id_dtype}
    arrays = {k: getattr(batch, k).astype(dtype) for k, dtype in dtypes.items()}
    # A single metadata entry: safetensors keeps the metadata in a hash map whose iteration order
    # changes from run to run, so two entries would make the header (and the file's sha256) differ
    # between identical runs.
    meta = {_META_KEY: json.dumps({"format": FORMAT, "vocab_hash": vocab_hash}, sort_keys=True)}
    with atomic_path(path) as tmp:
        save_file(arrays, str(tmp), metadata=meta)
    entry = {"file": path.name, "instances": len(batch), "tokens": int(batch.offsets[-1]),
             "bytes": path.stat().st_size, "sha256": sha256_file(path), **info}
    atomic_write_text(path.with_suffix(".json"), json.dumps(entry, indent=1) + "\n")
    return entry


def read_shard(path: Path, *, vocab_hash: str | None = None, sha256: str | None = None) -> Shard:
    """Load and check a shard: readable, complete, consistent, from the expected vocab."""
    if not path.is_file():
        raise ShardError(f"{path}: shard file missing")
    if sha256 is not None and sha256_file(path) != sha256:
        raise ShardError(f"{path}: contents differ from the manifest's checksum (corrupt or replaced)")
    try:
        with safe_open(str(path), framework="np") as f:  # one open: arrays and metadata together
            meta = f.metadata() or {}
            arrays = {k: f.get_tensor(k) for k in f.keys()}
        if _META_KEY in meta:
            meta = json.loads(meta[_META_KEY])
    except Exception as e:  # noqa: BLE001 - any failure here means an unreadable shard
        raise ShardError(f"{path}: unreadable shard (truncated or not a bertforge shard?): {e}") from e
    if meta.get("format") != FORMAT:
        raise ShardError(f"{path}: not a {FORMAT} shard (format {meta.get('format')!r})")
    if vocab_hash is not None and meta.get("vocab_hash") != vocab_hash:
        raise ShardError(f"{path}: prepared with another vocab (hash {meta.get('vocab_hash', '?')[:12]}, "
                         f"expected {vocab_hash[:12]})")
    missing = [k for k in _ARRAYS if k not in arrays]
    if missing:
        raise ShardError(f"{path}: arrays missing: {', '.join(missing)}")
    shard = Shard(**{k: arrays[k] for k in _ARRAYS})
    n = len(shard.num_a)
    ok = (len(shard.offsets) == n + 1 and len(shard.mask_offsets) == n + 1 and len(shard.next_sentence) == n
          and shard.offsets[-1] == len(shard.input_ids) and shard.mask_offsets[-1] == len(shard.masked_positions)
          and len(shard.masked_labels) == len(shard.masked_positions))
    if not ok:
        raise ShardError(f"{path}: inconsistent array sizes (corrupt shard)")
    return shard
