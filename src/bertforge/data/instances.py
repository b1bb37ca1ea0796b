"""Documents of tokenized sentences -> pre-training instances, as Google's ``create_pretraining_data.py``.

The algorithm, quirks included (see ``shared/SPEC.md``, "Pre-training data"):

* per document and dupe pass, one target length: ``max_seq_length - 3``, or with probability
  ``short_seq_prob`` a random length in [2, max - 3];
* sentences accumulate into a chunk until the target is reached (or the document ends); segment A
  takes a random number of the chunk's sentences (at least 1), B the rest (IsNext) or, with
  probability 0.5 or whenever the chunk has one sentence, text from another document (NotNext),
  and the chunk's unused sentences are put back to be read again;
* ``truncate_seq_pair`` trims the longer of A and B, from the front or the back at random;
* masking picks ``min(max_predictions, max(1, round(len * masked_lm_prob)))`` positions (Python's
  ``round``: half to even), never [CLS] or [SEP]; 80% [MASK], 10% a random token drawn from the
  *whole* vocabulary (special and [unused] entries included), 10% unchanged; positions sorted;
  whole-word masking takes a piece with all its ``##`` continuations.

Randomness comes from explicit generators: a ``random.Random`` for the instance structure (the
same generator and sequence of calls as the original script) and a numpy ``Generator`` for the
masks, which are drawn for many instances at once. A seed fixes the output exactly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "MaskingConfig",
    "SpecialIds",
    "TrainingInstance",
    "create_instances_from_document",
    "create_packed_instances",
    "apply_masks",
    "mask_instances",
    "truncate_seq_pair",
]

Document = Sequence[Sequence[int]]  # sentences, each a list of token ids


@dataclass(frozen=True)
class SpecialIds:
    """Token ids the pipeline needs, plus the vocabulary facts masking depends on."""

    cls: int
    sep: int
    mask: int
    vocab_size: int
    continuation: np.ndarray | None = None  # (V,) bool: token is a "##" piece (whole-word masking)


@dataclass(frozen=True)
class MaskingConfig:
    """How many tokens to predict and what to put in their place (the paper's defaults)."""

    masked_lm_prob: float = 0.15
    """Share of a sequence's tokens to predict."""
    max_predictions_per_seq: int = 20
    """Cap on predictions per sequence (20 at length 128; about 80 at 512)."""
    mask_token_prob: float = 0.8
    """Of the predicted tokens, the share replaced by [MASK]."""
    random_token_prob: float = 0.1
    """Of the predicted tokens, the share replaced by a random vocabulary token (rest: unchanged)."""
    whole_word_mask: bool = False
    """Choose whole words (a piece and its ## continuations) instead of single pieces."""

    def __post_init__(self) -> None:
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.mask_token_prob < 0 or self.random_token_prob < 0 or self.mask_token_prob + self.random_token_prob > 1:
            raise ValueError("mask_token_prob and random_token_prob must be >= 0 and sum to at most 1")
        if self.max_predictions_per_seq < 1:
            raise ValueError("max_predictions_per_seq must be >= 1")


@dataclass
class TrainingInstance:
    """One sequence ``[CLS] A [SEP] B [SEP]`` (or ``[CLS] A [SEP]`` without NSP), ready to store."""

    input_ids: np.ndarray  # (L,) after masking
    num_a: int  # tokens of [CLS] A [SEP]: token type 0; the rest are type 1
    masked_positions: np.ndarray  # (P,) sorted
    masked_labels: np.ndarray  # (P,) original ids at masked_positions
    is_random_next: bool  # NSP label: False = IsNext (0), True = NotNext (1)


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer of A and B, one token at a time from its front or back at random, in place."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def mask_instances(sequences: Sequence[np.ndarray], special: SpecialIds, cfg: MaskingConfig,
                   rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Google's ``create_masked_lm_predictions`` for many sequences at once.

    Returns, per sequence, (masked ids, sorted positions, original ids there). Vectorised over the
    batch with numpy (the original loops over tokens in Python, which dominates its run time).
    """
    n = len(sequences)
    if n == 0:
        return []
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=n)
    T = int(lengths.max())
    valid = np.arange(T)[None, :] < lengths[:, None]  # (n, T)
    tokens = np.zeros((n, T), dtype=np.int64)
    tokens[valid] = np.concatenate(sequences)
    cand = valid & (tokens != special.cls) & (tokens != special.sep)
    # Python's round (half to even) on the same float product, as the original.
    k = np.minimum(cfg.max_predictions_per_seq, np.maximum(1, np.round(lengths * cfg.masked_lm_prob))).astype(np.int64)
    k = np.minimum(k, cand.sum(1))
    keys = rng.random((n, T))
    keys[~cand] = 2.0  # never chosen
    if not cfg.whole_word_mask:
        order = np.argsort(keys, axis=1, kind="stable")
        take = np.arange(T)[None, :] < k[:, None]  # the first k of each row's random order
        chosen = np.zeros((n, T), dtype=bool)
        rows = np.broadcast_to(np.arange(n)[:, None], (n, T))
        chosen[rows[take], order[take]] = True
    else:
        chosen = _choose_whole_words(tokens, cand, k, keys, special)
    # 80% [MASK], 10% a random token of the whole vocab, 10% unchanged (with the default shares).
    r = rng.random((n, T))
    to_mask = chosen & (r < cfg.mask_token_prob)
    to_random = chosen & (r >= cfg.mask_token_prob) & (r < cfg.mask_token_prob + cfg.random_token_prob)
    masked = np.where(to_mask, special.mask, tokens)
    masked[to_random] = rng.integers(0, special.vocab_size, size=int(to_random.sum()))
    rows, cols = np.nonzero(chosen)  # row-major: positions come out sorted within each row
    splits = np.cumsum(np.bincount(rows, minlength=n))[:-1]
    positions = np.split(cols, splits)
    labels = np.split(tokens[rows, cols], splits)
    return [(masked[i, : lengths[i]], positions[i], labels[i]) for i in range(n)]


def _choose_whole_words(tokens: np.ndarray, cand: np.ndarray, k: np.ndarray, keys: np.ndarray,
                        special: SpecialIds) -> np.ndarray:
    """Whole-word choice: a word is a piece plus the ``##`` pieces after it (Google attaches a
    ``##`` piece to the previous candidate word even across a [SEP]). Words in random order; one
    that would overshoot the count is skipped, as in the original."""
    if special.continuation is None:
        raise ValueError("whole-word masking needs the vocab's continuation ('##') flags")
    cont = special.continuation[tokens] & cand
    seen_before = (np.cumsum(cand, axis=1) - cand) > 0  # a candidate exists earlier in the row
    starts = cand & ~(cont & seen_before)
    group = np.cumsum(starts, axis=1) - 1  # word index of each candidate position
    chosen = np.zeros_like(cand)
    for i in range(len(tokens)):
        pos = np.flatnonzero(cand[i])
        if len(pos) == 0:
            continue
        words = group[i, pos]
        sizes = np.bincount(words)
        word_keys = keys[i, pos[starts[i, pos]]]  # one key per word, at its first piece
        total = 0
        picked = []
        for w in np.argsort(word_keys, kind="stable"):
            if total >= k[i]:
                break
            if total + sizes[w] > k[i]:
                continue
            picked.append(w)
            total += sizes[w]
        chosen[i, pos[np.isin(words, picked)]] = True
    return chosen


def _make_instance(tokens_a: list[int], tokens_b: list[int] | None, is_random_next: bool,
                   special: SpecialIds) -> TrainingInstance:
    tokens = [special.cls, *tokens_a, special.sep]
    num_a = len(tokens)
    if tokens_b is not None:
        tokens += [*tokens_b, special.sep]
    empty = np.zeros(0, dtype=np.int64)
    return TrainingInstance(np.array(tokens, dtype=np.int64), num_a, empty, empty, is_random_next)


def apply_masks(instances: list[TrainingInstance], special: SpecialIds, cfg: MaskingConfig,
                rng: np.random.Generator, batch: int = 4096) -> None:
    """Mask unmasked instances in place (``batch`` at a time, to bound the temporary arrays)."""
    for b in range(0, len(instances), batch):
        part = instances[b:b + batch]
        masked = mask_instances([x.input_ids for x in part], special, cfg, rng)
        for inst, (ids, positions, labels) in zip(part, masked):
            inst.input_ids, inst.masked_positions, inst.masked_labels = ids, positions, labels


def create_instances_from_document(
    documents: Sequence[Document],
    document_index: int,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    special: SpecialIds,
    rng: random.Random,
) -> list[TrainingInstance]:
    """All NSP instances of one document in one dupe pass (Google's function of the same name),
    unmasked (`apply_masks` masks them). ``documents`` is the pool NotNext segments come from."""
    document = documents[document_index]
    max_num_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances: list[TrainingInstance] = []
    chunk: list[Sequence[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        chunk.append(segment)
        chunk_length += len(segment)
        if i == len(document) - 1 or chunk_length >= target_seq_length:
            if chunk:
                a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
                tokens_a = [t for s in chunk[:a_end] for t in s]
                tokens_b: list[int] = []
                if len(chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    # Up to 10 tries to draw another document (Google's loop; a pool of one
                    # document falls back to itself).
                    for _ in range(10):
                        random_index = rng.randint(0, len(documents) - 1)
                        if random_index != document_index:
                            break
                    random_document = documents[random_index]
                    start = rng.randint(0, len(random_document) - 1)
                    for sentence in random_document[start:]:
                        tokens_b.extend(sentence)
                        if len(tokens_b) >= target_b_length:
                            break
                    i -= len(chunk) - a_end  # put the unused sentences back
                else:
                    is_random_next = False
                    tokens_b = [t for s in chunk[a_end:] for t in s]
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                if tokens_a and tokens_b:  # Google asserts this; with empty sentences removed it holds
                    instances.append(_make_instance(tokens_a, tokens_b, is_random_next, special))
            chunk = []
            chunk_length = 0
        i += 1
    return instances


def create_packed_instances(
    document: Document,
    *,
    max_seq_length: int,
    special: SpecialIds,
) -> list[TrainingInstance]:
    """No-NSP mode (RoBERTa's "doc-sentences"): pack whole consecutive sentences of one document
    into ``[CLS] ... [SEP]`` up to ``max_seq_length``; a sentence longer than that is cut into pieces."""
    max_num_tokens = max_seq_length - 2
    instances: list[TrainingInstance] = []
    current: list[int] = []
    for sentence in document:
        pieces = [sentence[k:k + max_num_tokens] for k in range(0, len(sentence), max_num_tokens)]
        for piece in pieces:
            if current and len(current) + len(piece) > max_num_tokens:
                instances.append(_make_instance(current, None, False, special))
                current = []
            current.extend(piece)
    if current:
        instances.append(_make_instance(current, None, False, special))
    return instances
