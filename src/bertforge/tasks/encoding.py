"""What the task families share once their files are read: encoded windows, the rules that cut long
inputs into windows or truncate them, training batches and prediction over encoded inputs in memory.

`Windows` is the encoded record every family builds on (classification uses it as is, tagging and
multiple choice wrap it, SQuAD extends it). A family's encoded inputs are an `EncodedSet`:
`EncodedBatches` turns them into the training loop's resumable, rank-sliced, shuffled batches, and
`predict_items` runs a model over them in length-sorted batches (split across processes when distributed).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from bertforge.data.loader import CursorLoader, EpochCursor, epoch_permutation

__all__ = ["Windows", "window_starts", "max_context_window", "longest_first", "offsets_through_marks",
           "EncodedSet", "EncodedBatches", "predict_items"]


# ---------------------------------------------------------------------------- windows
@dataclass
class Windows:
    """Token ids of every window, and the example each window comes from."""

    input_ids: list[np.ndarray]
    num_a: np.ndarray
    """Tokens of type 0 in each window: [CLS] A [SEP]."""
    example: np.ndarray
    num_examples: int
    labels: np.ndarray | None = None
    """One per window (its example's): class ids or scores."""
    windowed: int = 0
    """Examples longer than max_seq_length cut into several windows ..."""
    truncated: int = 0
    """... or truncated to one."""
    cut_pairs: int = 0
    """Pairs whose shorter segment exceeded half the room and was cut (in windows)."""
    max_seq_length: int = 0
    """The length examples were measured against (0: not known; the summary then says "one window")."""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.input_ids], dtype=np.int64)

    def with_labels(self, per_example: np.ndarray) -> "Windows":
        self.labels = per_example[self.example]
        return self

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Windows -> tensors padded to the longest of the batch."""
        rows = [self.input_ids[i] for i in indices]
        B, T = len(rows), max(len(r) for r in rows)
        input_ids = np.zeros((B, T), dtype=np.int64)
        attention_mask = np.zeros((B, T), dtype=np.int64)
        token_type_ids = np.zeros((B, T), dtype=np.int64)
        for i, (k, r) in enumerate(zip(indices, rows)):
            input_ids[i, :len(r)] = r
            attention_mask[i, :len(r)] = 1
            token_type_ids[i, self.num_a[k]:len(r)] = 1
        batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask),
                 "token_type_ids": torch.from_numpy(token_type_ids)}
        if self.labels is not None:
            batch["labels"] = torch.from_numpy(self.labels[np.asarray(indices)])
        return batch

    def summary(self) -> str:
        """E.g. "1,781 examples; 312 of 1,781 longer than 128 tokens were truncated" or "1,781 examples ->
        12,671 windows; 1,650 of 1,781 longer than 128 tokens were cut into windows"."""
        text = f"{self.num_examples:,} examples"
        if len(self) != self.num_examples:
            text += f" -> {len(self):,} windows"
        longer = f"longer than {self.max_seq_length} tokens" if self.max_seq_length else "longer than one window"
        if self.truncated:
            text += f"; {self.truncated:,} of {self.num_examples:,} {longer} were truncated"
        if self.windowed:
            text += f"; {self.windowed:,} of {self.num_examples:,} {longer} were cut into windows"
        if self.cut_pairs:
            text += f"; {self.cut_pairs:,} pairs had their shorter segment cut to half the room"
        return text


def window_starts(n: int, size: int, stride: int) -> list[int]:
    """Starts of the windows of ``size`` over ``n`` tokens: every ``stride`` tokens until one reaches the end."""
    starts = [0]
    while starts[-1] + size < n:
        starts.append(starts[-1] + stride)
    return starts


def max_context_window(starts: np.ndarray, lengths: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """For each token position, the window (index into ``starts`` / ``lengths``) where it has the most
    context: the TF release's SQuAD rule, score = min(tokens left of it, tokens right of it in the
    window) + 0.01 * window length, the first window on a tie. (positions,) int64."""
    starts = np.asarray(starts, dtype=np.int64)[:, None]
    lengths = np.asarray(lengths, dtype=np.int64)[:, None]
    p = np.asarray(positions, dtype=np.int64)[None, :]
    left, right = p - starts, starts + lengths - 1 - p  # (windows, positions)
    score = np.where((left >= 0) & (right >= 0), np.minimum(left, right) + 0.01 * lengths, -np.inf)
    return score.argmax(0)


def longest_first(n_a: int, n_b: int, room: int) -> tuple[int, int]:
    """Lengths of a pair cut to ``room`` tokens the TF release's way (``_truncate_seq_pair``): a token
    at a time from the end of the longer segment, of the second on a tie (closed form of that loop)."""
    excess = n_a + n_b - room
    if excess <= 0:
        return n_a, n_b
    if n_a - n_b >= excess:
        return n_a - excess, n_b
    if n_b - n_a >= excess:
        return n_a, n_b - excess
    return (room + 1) // 2, room // 2  # both cut down to an even share; the first keeps the odd token


def offsets_through_marks(text: str, offsets: np.ndarray) -> np.ndarray:
    """(tokens, 2) character ranges of tokens in ``text``, each extended (in place) over the combining
    marks that follow it (up to the next token): accent stripping drops a decomposed accent
    ("Cafe\u0301") from the token's range, but it is part of the word an answer or a tag must return."""
    if len(offsets) == 0:
        return offsets
    next_start = np.append(offsets[1:, 0], len(text))
    for t in np.flatnonzero(offsets[:, 1] < next_start):  # tokens followed by characters of no token
        end = offsets[t, 1]
        while end < next_start[t] and unicodedata.category(text[end]) in ("Mn", "Me"):
            end += 1
        offsets[t, 1] = end
    return offsets


# ---------------------------------------------------------------------------- batches
class EncodedSet(Protocol):
    """Model inputs of a task: items (windows, sequences or sets of choices) ready to batch."""

    lengths: np.ndarray
    """Tokens per item (the longest sequence of an item with several), to batch similar lengths together."""

    def __len__(self) -> int: ...

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Items -> tensors padded to the batch's longest (with the training targets, if any)."""
        ...


class EncodedBatches(CursorLoader):
    """Training batches over encoded inputs in memory, for `bertforge.train.loop.Trainer`.

    Epoch ``e`` visits the items in the permutation drawn from ``(seed, e, 0)``
    (`bertforge.data.loader.epoch_permutation` over one "shard"). Each ``iter()`` yields the rest of one
    epoch. Every global batch of ``batch_size * world_size`` items is cut into rank slices; the last
    incomplete one is trained (smaller), or with ``drop_last`` left out (`bertforge.data.loader.EpochCursor`);
    ``state_dict`` / ``load_state_dict`` resume with the very same batches."""

    def __init__(self, encoded: EncodedSet, batch_size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                 name: str = "training data", drop_last: bool = False):
        self.encoded = encoded
        self.cursor = EpochCursor(len(encoded), batch_size, seed=seed, rank=rank, world_size=world_size,
                                  drop_last=drop_last)
        self.name = name
        self._order: tuple[int, np.ndarray] | None = None

    def order(self, epoch: int) -> np.ndarray:
        """The items in the order ``epoch`` visits them."""
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_permutation(len(self.encoded), self.cursor.seed, epoch, 0))
        return self._order[1]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for epoch, first, stop in self.cursor.batches(self.name):
            items = self.order(epoch)[np.arange(first, stop) % len(self.encoded)]
            yield self.encoded.collate([int(i) for i in items])


@torch.no_grad()
def predict_items(model: nn.Module, encoded: EncodedSet, batch_size: int, device: torch.device | str,
                  run: Callable[[nn.Module, dict[str, torch.Tensor], Sequence[int]], Sequence[Any]],
                  dist: Any = None) -> list[Any]:
    """``run(model, batch, indices)`` -> one output per item, over every item of ``encoded`` in
    batches of similar length; the outputs in item order. With ``dist``, each process runs a part and
    all get the whole (every process runs the same number of forward passes: a sharded model's
    forward is collective)."""
    rank, world = (dist.rank, dist.world_size) if dist is not None and dist.enabled else (0, 1)
    order = np.argsort(encoded.lengths, kind="stable")
    parts = np.array_split(order, world)
    mine = parts[rank]
    outputs: list[Any] = []
    for k in range(-(-len(parts[0]) // batch_size)):
        idx = mine[k * batch_size:(k + 1) * batch_size]
        real = len(idx) > 0
        idx = idx if real else order[:1]
        batch = {name: t.to(device) for name, t in encoded.collate(idx).items()}
        got = run(model, batch, idx)
        if real:
            outputs.extend(got)
    pairs = [(mine.tolist(), outputs)]
    if world > 1:
        pairs = dist.gather_objects(pairs[0])
    result: list[Any] = [None] * len(encoded)
    for idx, outs in pairs:
        for i, o in zip(idx, outs):
            result[i] = o
    return result
