"""Prepared shards -> batches for `BertForPreTraining`: seeded order, split by rank, exactly resumable.

Each epoch visits the shards in a permutation drawn from (seed, epoch), a window of ``shuffle_shards`` of
them at a time, and the window's instances in one permutation drawn from (seed, epoch, window): a shard
holds a stretch of the corpus (a few thousand neighbouring documents, each several times over), so reading
shards one by one would train on one topic for a while and end the run on whichever came last. Memory holds
one window. Rank ``r`` takes the r-th slice of each global batch, so N processes see the batches of one
with an N-times larger batch. Masks drawn here are seeded by (seed, epoch, the instance's position).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from bertforge.data.instances import MaskingConfig, SpecialIds, TrainingInstance, mask_instances
from bertforge.data.prepare import load_manifest
from bertforge.data.shards import Shard, ShardError, read_shard, sha256_file
from bertforge.settings import option

__all__ = ["IGNORE_INDEX", "CursorLoader", "EpochCursor", "epoch_permutation", "PretrainingDataset", "PretrainingLoader"]

logger = logging.getLogger("bertforge")

IGNORE_INDEX = -100
"""Label of a position no loss reads: the value transformers and PyTorch's cross-entropy ignore."""


def epoch_permutation(n: int, seed: int, *keys: int) -> np.ndarray:
    """A permutation of ``range(n)`` drawn from ``(seed, *keys)``: the same on every process and run."""
    return np.random.default_rng([seed, *keys]).permutation(n)


class EpochCursor:
    """Where an epoch-by-epoch walk over ``size`` items in rank-sliced global batches stands, resumably.

    ``drop_last``: an epoch's last global batch, when incomplete, is left out (pre-training, as Google's
    release does); otherwise it is cut into equal rank slices (``ceil(left / world_size)`` items each, the
    last slices padded from the epoch's first items when ``left`` does not divide, as PyTorch's
    ``DistributedSampler`` pads) and every process takes the same number of batches."""

    def __init__(self, size: int, batch_size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                 drop_last: bool = True):
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"bad batch_size / rank / world_size: {batch_size}, {rank}, {world_size}")
        self.size = size
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0  # items of this epoch consumed (all ranks together)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def __len__(self) -> int:
        """Batches per epoch (per rank)."""
        return self.size // self.global_batch if self.drop_last else -(-self.size // self.global_batch)

    def state_dict(self) -> dict[str, int]:
        kept = {} if self.drop_last else {"drop_last": False}  # a state without it predates keeping the last
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "global_batch": self.global_batch, **kept}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("seed", self.seed) != self.seed or state.get("global_batch", self.global_batch) != self.global_batch:
            raise ValueError(f"loader state is for seed {state.get('seed')} and global batch "
                             f"{state.get('global_batch')}; this loader has {self.seed} and {self.global_batch}")
        if bool(state.get("drop_last", True)) != self.drop_last:
            raise ValueError(f"loader state is for drop_last {bool(state.get('drop_last', True))}; this loader "
                             f"has {self.drop_last}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def batches(self, name: str) -> Iterator[tuple[int, int, int]]:
        """(epoch, first, stop) of this rank's batches in the rest of one epoch: the epoch's items
        ``first .. stop - 1`` (modulo ``size``: a padded last slice wraps to the epoch's first items). The
        cursor moves past a batch before it is handed out, so a ``state_dict()`` taken after it resumes at
        the next one."""
        if self.size < (self.global_batch if self.drop_last else 1):
            raise ValueError(f"{name}: {self.size} instances, fewer than one global batch ({self.global_batch})")
        if self._epoch_done():  # resumed right after an epoch's last batch
            self._next_epoch()
        epoch = self.epoch
        while self.epoch == epoch:
            left = self.size - self.position
            per = self.batch_size if left >= self.global_batch else -(-left // self.world_size)
            first = self.position + self.rank * per
            self.position += min(left, self.global_batch)
            if self._epoch_done():
                self._next_epoch()
            yield epoch, first, first + per

    def _epoch_done(self) -> bool:
        left = self.size - self.position
        return left <= 0 or (self.drop_last and left < self.global_batch)

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.position = 0


class CursorLoader:
    """A batch loader's position, length and resume state, read from its `EpochCursor` (``self.cursor``)."""

    cursor: EpochCursor

    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    @property
    def position(self) -> int:
        """Items of this epoch consumed (all ranks together)."""
        return self.cursor.position

    @property
    def global_batch(self) -> int:
        return self.cursor.global_batch

    @property
    def drop_last(self) -> bool:
        """Whether an epoch's last incomplete batch (and optimizer step) is left out."""
        return self.cursor.drop_last

    def __len__(self) -> int:
        """Batches per epoch (per rank)."""
        return len(self.cursor)

    def state_dict(self) -> dict[str, int]:
        return self.cursor.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.cursor.load_state_dict(state)


class PretrainingDataset:
    """A prepared folder: its manifest, checked, and its shards, read on demand."""

    def __init__(self, folder: str | Path, *, vocab_hash: str | None = None,
                 normalization: dict[str, bool] | None = None, verify_checksums: bool = True,
                 shards: list[int] | None = None):
        """``vocab_hash`` / ``normalization``: the tokenizer's, to match; ``shards``: these shards only."""
        self.folder = Path(folder)
        self.manifest = load_manifest(self.folder)
        m = self.manifest
        if m.get("format") != "bertforge-pretraining-v1":
            raise ShardError(f"{self.folder}: unknown dataset format {m.get('format')!r}")
        if not m.get("complete"):
            raise ShardError(f"{self.folder}: incomplete: shards {m.get('missing_shards')} are missing "
                             f"(re-run prepare; with {option('num_shards')}, every shard index must have run)")
        if vocab_hash is not None and m["vocab_hash"] != vocab_hash:
            raise ShardError(f"{self.folder}: prepared with another vocab (hash {m['vocab_hash'][:12]}) than the "
                             f"model's tokenizer (hash {vocab_hash[:12]}); prepare the data with this tokenizer")
        if normalization is not None:
            _check_normalization(self.folder, m, normalization)
        self.config: dict[str, Any] = m["config"]
        self.shards: list[dict[str, Any]] = m["shards"]
        if shards is not None:
            bad = [i for i in shards if not 0 <= i < len(self.shards)]
            if bad or not shards:
                raise ValueError(f"{self.folder}: shard selection {list(shards)} is empty or outside "
                                 f"0..{len(self.shards) - 1}")
            self.shards = [self.shards[i] for i in shards]
        self.sizes = np.array([s["instances"] for s in self.shards], dtype=np.int64)
        self.verify_checksums = verify_checksums

    def __len__(self) -> int:
        return int(self.sizes.sum())

    @property
    def vocab_hash(self) -> str:
        return self.manifest["vocab_hash"]

    def check_files(self) -> None:
        """Check every shard's presence, size and (``verify_checksums``) SHA-256 before a run starts."""
        for entry in self.shards:
            path = self.folder / entry["file"]
            if not path.is_file():
                raise ShardError(f"{path}: shard file missing (listed in {self.folder / 'manifest.json'})")
            size = path.stat().st_size
            if "bytes" in entry and size != entry["bytes"]:
                raise ShardError(f"{path}: {size:,} bytes, the manifest says {entry['bytes']:,} "
                                 "(truncated or replaced); prepare the data again")
        if not self.verify_checksums:
            return
        for entry in self.shards:
            path = self.folder / entry["file"]
            if sha256_file(path) != entry["sha256"]:
                raise ShardError(f"{path}: contents differ from the manifest's SHA-256 (corrupt or replaced); "
                                 "prepare the data again")
        logger.debug("%s: %d shards match the manifest's sizes and checksums", self.folder, len(self.shards))

    def shard(self, index: int) -> Shard:
        """Shard ``index``, read and checked against the manifest (not kept: the loader holds its window)."""
        entry = self.shards[index]
        shard = read_shard(self.folder / entry["file"], vocab_hash=self.vocab_hash,
                           sha256=entry["sha256"] if self.verify_checksums else None)
        if len(shard) != entry["instances"]:
            raise ShardError(f"{self.folder / entry['file']}: {len(shard)} instances, manifest says "
                             f"{entry['instances']}")
        return shard


def _describe(normalization: dict[str, Any]) -> str:
    return ", ".join(f"{k}={normalization.get(k)}" for k in ("do_lower_case", "strip_accents", "tokenize_chinese_chars"))


def _check_normalization(folder: Path, manifest: dict[str, Any], normalization: dict[str, bool]) -> None:
    """Refuse a tokenizer whose normalisation differs from the data's: it never produces those ids itself."""
    data = manifest.get("normalization")
    if data is None:
        logger.warning("%s: the manifest does not record the tokenizer's normalisation (prepared by an older "
                       "version); it cannot be checked against the tokenizer's (%s)", folder, _describe(normalization))
        return
    if {k: data.get(k) for k in normalization} != normalization:
        raise ShardError(f"{folder}: prepared with a tokenizer whose normalization is {_describe(data)}, but the "
                         f"given tokenizer has {_describe(normalization)}; use the tokenizer the data was "
                         "prepared with, or prepare the data again with this one")


def _check_special(special: SpecialIds, dataset: PretrainingDataset) -> None:
    """The ids dynamic masking writes must belong to the vocab the dataset was prepared with."""
    V = dataset.manifest.get("vocab_size")
    where = f"{dataset.folder} (vocab hash {dataset.vocab_hash[:12]})"
    if special.vocab_size != V:
        raise ValueError(f"special ids are for a vocab of {special.vocab_size} tokens, but {where} was prepared "
                         f"with {V}: pass the special ids of the dataset's tokenizer")
    bad = {name: i for name, i in (("cls", special.cls), ("sep", special.sep), ("mask", special.mask))
           if not 0 <= i < V}
    if bad:
        raise ValueError(f"special ids {bad} are outside the vocab of {where} ({V} tokens)")
    if special.continuation is not None and len(special.continuation) != V:
        raise ValueError(f"special.continuation has {len(special.continuation)} entries; the vocab of {where} "
                         f"has {V} tokens")


class _Window(NamedTuple):
    """Shards read together: their instances' order, and where each shard's instances start in it."""

    key: tuple[int, ...]
    shards: list[Shard]
    starts: np.ndarray
    order: np.ndarray


class PretrainingLoader(CursorLoader):
    """Iterates batches of one epoch per ``iter()``; the next ``iter()`` continues with the next epoch."""

    def __init__(self, dataset: PretrainingDataset, batch_size: int, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1, special: SpecialIds | None = None, pad_to_multiple_of: int = 8,
                 masking: MaskingConfig | None = None, shuffle_shards: int = 8):
        """``shuffle_shards``: shards whose instances are shuffled together (and held in memory at once)."""
        if shuffle_shards < 1:
            raise ValueError(f"shuffle_shards must be at least 1, not {shuffle_shards}")
        self.cursor = EpochCursor(len(dataset), batch_size, seed=seed, rank=rank, world_size=world_size)
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle_shards = shuffle_shards
        self.pad_to_multiple_of = pad_to_multiple_of
        cfg = dataset.config
        self.max_predictions = cfg["max_predictions_per_seq"]
        self.nsp = cfg["nsp"]
        self.masking: MaskingConfig | None = masking
        self.unmask = masking is not None and not cfg["dynamic_masking"]  # static masks to undo first
        if masking is None and cfg["dynamic_masking"]:
            self.masking = MaskingConfig(cfg["masked_lm_prob"], cfg["max_predictions_per_seq"],
                                         cfg["mask_token_prob"], cfg["random_token_prob"], cfg["whole_word_mask"])
        if self.masking is not None:
            if special is None:
                raise ValueError("dynamic masking needs the tokenizer's special ids (special=...)")
            _check_special(special, dataset)
            self.max_predictions = self.masking.max_predictions_per_seq
        self.special = special
        self._window: _Window | None = None

    def state_dict(self) -> dict[str, int]:
        return {**self.cursor.state_dict(), "shuffle_shards": self.shuffle_shards}

    def load_state_dict(self, state: dict[str, int]) -> None:
        saved = state.get("shuffle_shards", 1)
        if saved != self.shuffle_shards:
            raise ValueError(f"loader state is for {saved} shard(s) shuffled together; this loader shuffles "
                             f"{self.shuffle_shards} (resume with shuffle_shards {saved}, or start afresh)")
        self.cursor.load_state_dict(state)

    def _windows(self, epoch: int) -> list[np.ndarray]:
        """The epoch's windows: its shard permutation cut into runs of ``shuffle_shards``."""
        order = epoch_permutation(len(self.dataset.sizes), self.seed, epoch)
        return [order[i:i + self.shuffle_shards] for i in range(0, len(order), self.shuffle_shards)]

    def _read(self, epoch: int, shards: np.ndarray) -> _Window:
        """The window of ``shards`` in ``epoch``, read once and kept while batches read it."""
        key = (epoch, *map(int, shards))
        if self._window is None or self._window.key != key:
            self._window = None  # the last window's memory goes before the next one's is read
            starts = np.concatenate([[0], np.cumsum(self.dataset.sizes[shards])])
            # keyed by the shards (one shard: the key of a shard read alone)
            self._window = _Window(key, [self.dataset.shard(int(k)) for k in shards], starts,
                                   epoch_permutation(int(starts[-1]), self.seed, *key))
        return self._window

    def _instances(self, epoch: int, begin: int, end: int) -> list[TrainingInstance]:
        """The epoch's instances begin..end-1."""
        windows = self._windows(epoch)
        starts = np.concatenate([[0], np.cumsum([self.dataset.sizes[w].sum() for w in windows])])
        out = []
        j = int(np.searchsorted(starts, begin, side="right")) - 1
        g = begin
        while g < end:
            window = self._read(epoch, windows[j])
            stop = min(end, int(starts[j + 1]))
            picked = window.order[g - starts[j]:stop - starts[j]]
            within = np.searchsorted(window.starts, picked, side="right") - 1
            out.extend(window.shards[k].instance(int(i - window.starts[k])) for k, i in zip(within, picked))
            g = stop
            j += 1
        return out

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for epoch, first, stop in self.cursor.batches(str(self.dataset.folder)):
            instances = self._instances(epoch, first, stop)
            if self.masking is not None:
                self._mask(instances, epoch, first)
            yield self.collate(instances)

    def _mask(self, instances: list, epoch: int, first: int) -> None:
        # seeded by (seed, epoch, the index in the epoch): independent of ranks and resumes
        assert self.special is not None and self.masking is not None
        for k, inst in enumerate(instances):
            rng = np.random.default_rng([self.seed, epoch, first + k, 0x6D61736B])
            ids = inst.input_ids
            if self.unmask:
                ids = ids.copy()
                ids[inst.masked_positions] = inst.masked_labels
            (ids, positions, labels), = mask_instances([ids], self.special, self.masking, rng)
            inst.input_ids, inst.masked_positions, inst.masked_labels = ids, positions, labels

    def collate(self, instances: list) -> dict[str, torch.Tensor]:
        """Instances -> padded tensors named as `BertForPreTraining.forward` takes them."""
        B = len(instances)
        longest = max(len(x.input_ids) for x in instances)
        m = self.pad_to_multiple_of
        T = -(-longest // m) * m if m > 1 else longest
        P = self.max_predictions
        input_ids = np.zeros((B, T), dtype=np.int64)
        token_type_ids = np.zeros((B, T), dtype=np.int64)
        attention_mask = np.zeros((B, T), dtype=np.int64)
        positions = np.zeros((B, P), dtype=np.int64)
        labels = np.full((B, P), IGNORE_INDEX, dtype=np.int64)
        for i, x in enumerate(instances):
            L = len(x.input_ids)
            input_ids[i, :L] = x.input_ids
            token_type_ids[i, x.num_a:L] = 1
            attention_mask[i, :L] = 1
            p = len(x.masked_positions)
            positions[i, :p] = x.masked_positions
            labels[i, :p] = x.masked_labels
        batch = {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "masked_positions": torch.from_numpy(positions),
            "labels": torch.from_numpy(labels),
        }
        if self.nsp:
            batch["next_sentence_label"] = torch.tensor([int(x.is_random_next) for x in instances])
        return batch
