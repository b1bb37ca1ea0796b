"""Documents of tokenized sentences -> pre-training instances, as Google's ``create_pretraining_data.py``.

The algorithm, quirks included: per document and dupe pass one target length (short with probability
``short_seq_prob``); sentences accumulate into a chunk up to it; A takes a random number of them, B the
rest (IsNext) or text from another document (NotNext, the unused sentences put back); the longer
segment is trimmed at random ends; masking picks ``round(len * masked_lm_prob)`` positions (half to
even; at least 1, at most ``max_predictions``), never [CLS] or [SEP]: 80% [MASK], 10% a random token
of the whole vocabulary, 10% unchanged.

The structure draws from a ``random.Random`` with the same calls as the original script
(``randint(a, b)`` as its ``a + _randbelow(b - a + 1)``), the masks from a numpy ``Generator``, many
instances at once. A seed fixes the output exactly.

Columnar, for speed: a `DocumentPool` holds the documents as one flat token array plus sentence
boundaries; the structure pass records each instance as token *ranges*, assembled into one
`InstanceBatch` (the shard layout) and masked with whole-array numpy operations. The per-instance API
(`create_instances_from_document`, `create_packed_instances`, `mask_instances`, ...) runs the same code.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

__all__ = ["MaskingConfig", "SpecialIds", "TrainingInstance", "InstanceBatch", "DocumentPool", "create_instances",
           "create_instances_from_document", "create_packed_instances", "mask_batch", "apply_masks", "mask_instances",
           "truncate_seq_pair"]

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


@dataclass
class InstanceBatch:
    """Many instances in columnar form: the arrays of a shard (``bertforge.data.shards``)."""

    input_ids: np.ndarray
    offsets: np.ndarray
    num_a: np.ndarray
    next_sentence: np.ndarray
    mask_offsets: np.ndarray
    masked_positions: np.ndarray
    masked_labels: np.ndarray

    def __len__(self) -> int:
        return len(self.num_a)

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def instance(self, i: int) -> TrainingInstance:
        m0, m1 = self.mask_offsets[i], self.mask_offsets[i + 1]
        return TrainingInstance(self.input_ids[self.offsets[i]:self.offsets[i + 1]].astype(np.int64),
                                int(self.num_a[i]), self.masked_positions[m0:m1].astype(np.int64),
                                self.masked_labels[m0:m1].astype(np.int64), bool(self.next_sentence[i]))

    def instances(self) -> list[TrainingInstance]:
        return [self.instance(i) for i in range(len(self))]

    @classmethod
    def unmasked(cls, input_ids: np.ndarray, offsets: np.ndarray, num_a: np.ndarray,
                 next_sentence: np.ndarray) -> InstanceBatch:
        empty = np.zeros(0, dtype=np.int64)
        return cls(input_ids, offsets, num_a, next_sentence, np.zeros(len(num_a) + 1, dtype=np.int64), empty, empty)

    @classmethod
    def from_instances(cls, instances: Sequence[TrainingInstance]) -> InstanceBatch:
        def cat(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

        def offsets(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate([[0], np.cumsum([len(p) for p in parts], dtype=np.int64)]).astype(np.int64)

        ids = [np.asarray(x.input_ids) for x in instances]
        pos = [np.asarray(x.masked_positions) for x in instances]
        return cls(cat(ids), offsets(ids), np.array([x.num_a for x in instances], dtype=np.int64),
                   np.array([x.is_random_next for x in instances], dtype=np.uint8), offsets(pos), cat(pos),
                   cat([np.asarray(x.masked_labels) for x in instances]))


@dataclass
class DocumentPool:
    """Tokenized documents, flat: document d is ``tokens[starts[d]:]``, its sentences cut at
    ``bounds[d]`` (cumulative sentence lengths from 0: ``[0, len(s0), len(s0) + len(s1), ...]``)."""

    tokens: np.ndarray  # (N,) int32
    starts: np.ndarray  # (D,) int64
    bounds: list[list[int]]

    def __len__(self) -> int:
        return len(self.bounds)

    def sentence_counts(self) -> np.ndarray:
        return np.array([len(b) - 1 for b in self.bounds], dtype=np.int64)

    @classmethod
    def from_sentences(cls, sentences: Sequence[Sequence[int]], sentences_per_doc: Sequence[int]) -> DocumentPool:
        """Sentences' ids, ``sentences_per_doc[d]`` for document d; empty sentences and documents dropped."""
        lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
        tokens = np.fromiter((t for s in sentences for t in s), dtype=np.int32, count=int(lengths.sum()))
        doc_of = np.repeat(np.arange(len(sentences_per_doc)), np.asarray(sentences_per_doc, dtype=np.int64))
        keep = lengths > 0
        counts = np.bincount(doc_of[keep], minlength=len(sentences_per_doc))
        counts = counts[counts > 0]
        cum = np.concatenate([[0], np.cumsum(lengths[keep])]).tolist()  # token offset of each kept sentence
        first = np.concatenate([[0], np.cumsum(counts)]).tolist()  # first kept sentence of each document
        starts = [cum[f] for f in first[:-1]]
        bounds = [[x - base for x in cum[f:last + 1]] for f, last, base in zip(first[:-1], first[1:], starts)]
        return cls(tokens, np.array(starts, dtype=np.int64), bounds)

    @classmethod
    def from_documents(cls, documents: Sequence[Document]) -> DocumentPool:
        return cls.from_sentences([s for d in documents for s in d], [len(d) for d in documents])


# ------------------------------------------------------------------------------ structure (random.Random)
_HALF = 0.5


def _cuts(len_a: int, len_b: int, excess: int, draw: Callable[[], float]) -> tuple[int, int, int, int]:
    """``truncate_seq_pair``'s cuts as counts (front A, back A, front B, back B), drawing the same
    numbers: the longer segment loses tokens until the two are equal, then B, A, B, A, ..."""
    draws = [draw() for _ in range(excess)]
    lead = min(excess, abs(len_a - len_b))
    to_b, to_a = draws[lead::2], draws[lead + 1::2]
    if len_a > len_b:
        to_a = draws[:lead] + to_a
    else:
        to_b = draws[:lead] + to_b
    front_a = sum(map(_HALF.__gt__, to_a))  # a draw < 0.5 cuts the front
    front_b = sum(map(_HALF.__gt__, to_b))
    return front_a, len(to_a) - front_a, front_b, len(to_b) - front_b


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer of A and B, one token at a time from its front or back at random, in place."""
    excess = len(tokens_a) + len(tokens_b) - max_num_tokens
    if excess <= 0:
        return
    front_a, back_a, front_b, back_b = _cuts(len(tokens_a), len(tokens_b), excess, rng.random)
    del tokens_a[len(tokens_a) - back_a:], tokens_a[:front_a]
    del tokens_b[len(tokens_b) - back_b:], tokens_b[:front_b]


def _nsp_pass(bounds: Sequence[list[int]], d: int, max_num_tokens: int, short_seq_prob: float,
              rng: random.Random, out: list[int]) -> None:
    """Google's ``create_instances_from_document`` for document ``d`` of the pool ``bounds``, on token
    ranges: appends ``(d, a0, a1, doc_b, b0, b1, is_random_next)`` per instance to ``out``."""
    draw, below = rng.random, rng._randbelow  # randint(a, b) is a + _randbelow(b - a + 1)
    doc = bounds[d]
    n_sent = len(doc) - 1
    n_docs = len(bounds)
    target = max_num_tokens
    if draw() < short_seq_prob:
        target = 2 + below(max_num_tokens - 1)  # randint(2, max_num_tokens)
    i = 0
    while i < n_sent:
        # The chunk: sentences i.. until their length reaches the target, or the document ends.
        end = bisect_left(doc, doc[i] + target, i + 1, n_sent)
        size = end - i
        a_end = i + 1 + below(size - 1) if size >= 2 else i + 1  # randint(1, size - 1) sentences
        a0, a1 = doc[i], doc[a_end]
        if size == 1 or draw() < 0.5:
            is_random_next = 1
            for _ in range(10):  # Google's 10 tries at another document (a pool of one: itself)
                other = below(n_docs)
                if other != d:
                    break
            ob = bounds[other]
            start = below(len(ob) - 1)
            b0 = ob[start]
            # sentences from `start` until B reaches target - len(A), or the document ends
            b1 = ob[bisect_left(ob, b0 + target - (a1 - a0), start + 1, len(ob) - 1)]
            i = a_end  # the chunk's unused sentences are put back
        else:
            is_random_next = 0
            other, b0, b1 = d, a1, doc[end]
            i = end
        excess = (a1 - a0) + (b1 - b0) - max_num_tokens
        if excess > 0:
            front_a, back_a, front_b, back_b = _cuts(a1 - a0, b1 - b0, excess, draw)
            a0, a1, b0, b1 = a0 + front_a, a1 - back_a, b0 + front_b, b1 - back_b
        if a1 > a0 and b1 > b0:  # Google asserts this; with empty sentences removed it holds
            out += (d, a0, a1, other, b0, b1, is_random_next)


def _pack(bounds: list[int], d: int, max_num_tokens: int, out: list[int]) -> None:
    """No-NSP packing of one document: appends ``(d, p0, p1)`` per instance (whole consecutive
    sentences up to ``max_num_tokens``; a longer sentence is cut into pieces of that size)."""
    cur0 = cur1 = 0
    for k in range(len(bounds) - 1):
        t1 = bounds[k + 1]
        for p0 in range(bounds[k], t1, max_num_tokens):
            p1 = min(p0 + max_num_tokens, t1)
            if cur1 > cur0 and (cur1 - cur0) + (p1 - p0) > max_num_tokens:
                out += (d, cur0, cur1)
                cur0 = p0
            elif cur1 == cur0:
                cur0 = p0
            cur1 = p1
    if cur1 > cur0:
        out += (d, cur0, cur1)


def _assemble(tokens: np.ndarray, a_start: np.ndarray, len_a: np.ndarray, b_start: np.ndarray | None,
              len_b: np.ndarray | None, next_sentence: np.ndarray, special: SpecialIds) -> InstanceBatch:
    """``[CLS] A [SEP] B [SEP]`` (``[CLS] A [SEP]`` without B) for every instance at once: one gather."""
    n = len(len_a)
    cls_at, sep_at = len(tokens), len(tokens) + 1
    ones = np.ones(n, dtype=np.int64)
    if b_start is None:
        seg_start = np.stack([cls_at * ones, a_start, sep_at * ones], axis=1).ravel()
        seg_len = np.stack([ones, len_a, ones], axis=1).ravel()
    else:
        seg_start = np.stack([cls_at * ones, a_start, sep_at * ones, b_start, sep_at * ones], axis=1).ravel()
        seg_len = np.stack([ones, len_a, ones, len_b, ones], axis=1).ravel()
    lengths = seg_len.reshape(n, len(seg_len) // max(n, 1)).sum(1)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    index = np.int32 if offsets[-1] + len(tokens) < 2**31 else np.int64  # half the memory traffic
    source = np.repeat((seg_start - (np.cumsum(seg_len) - seg_len)).astype(index), seg_len)
    source += np.arange(offsets[-1], dtype=index)
    ext = np.concatenate([tokens, np.array([special.cls, special.sep], dtype=tokens.dtype)])
    return InstanceBatch.unmasked(ext[source], offsets, len_a + 2, next_sentence.astype(np.uint8))


def create_instances(pool: DocumentPool, *, max_seq_length: int, short_seq_prob: float, dupe_factor: int,
                     nsp: bool, special: SpecialIds, rng: random.Random) -> InstanceBatch:
    """Google's main loop over one pool: shuffle the documents, ``dupe_factor`` passes, shuffle the
    instances; unmasked. Without ``nsp``, each document is packed (the passes are copies)."""
    order = list(range(len(pool)))
    rng.shuffle(order)
    bounds = [pool.bounds[k] for k in order]
    starts = pool.starts[np.array(order, dtype=np.int64)] if order else np.zeros(0, dtype=np.int64)
    out: list[int] = []
    if nsp:
        for _ in range(dupe_factor):
            for d in range(len(bounds)):
                _nsp_pass(bounds, d, max_seq_length - 3, short_seq_prob, rng, out)
    else:
        for d in range(len(bounds)):
            _pack(bounds[d], d, max_seq_length - 2, out)
        out *= dupe_factor
    ranges = np.array(out, dtype=np.int64).reshape(-1, 7 if nsp else 3)
    perm = list(range(len(ranges)))
    rng.shuffle(perm)
    ranges = ranges[np.array(perm, dtype=np.int64)] if perm else ranges
    a_start = starts[ranges[:, 0]] + ranges[:, 1]
    len_a = ranges[:, 2] - ranges[:, 1]
    if not nsp:
        return _assemble(pool.tokens, a_start, len_a, None, None, np.zeros(len(ranges), dtype=np.uint8), special)
    b_start = starts[ranges[:, 3]] + ranges[:, 4]
    return _assemble(pool.tokens, a_start, len_a, b_start, ranges[:, 5] - ranges[:, 4], ranges[:, 6], special)


class _LazyBounds(Sequence):
    """``DocumentPool.bounds`` of a list of documents, computed for the documents actually visited."""

    def __init__(self, documents: Sequence[Document]) -> None:
        self.documents = documents
        self.cache: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, d):  # type: ignore[override]
        if d not in self.cache:
            self.cache[d] = [0, *accumulate(map(len, self.documents[d]))]
        return self.cache[d]


def _make_instance(tokens_a: list[int], tokens_b: list[int] | None, is_random_next: bool,
                   special: SpecialIds) -> TrainingInstance:
    tokens = [special.cls, *tokens_a, special.sep]
    num_a = len(tokens)
    if tokens_b is not None:
        tokens += [*tokens_b, special.sep]
    empty = np.zeros(0, dtype=np.int64)
    return TrainingInstance(np.array(tokens, dtype=np.int64), num_a, empty, empty, is_random_next)


def create_instances_from_document(documents: Sequence[Document], document_index: int, *, max_seq_length: int,
                                   short_seq_prob: float, special: SpecialIds,
                                   rng: random.Random) -> list[TrainingInstance]:
    """All NSP instances of one document in one dupe pass (Google's function of the same name), unmasked."""
    out: list[int] = []
    _nsp_pass(_LazyBounds(documents), document_index, max_seq_length - 3, short_seq_prob, rng, out)
    flat = lambda d: [t for s in documents[d] for t in s]  # noqa: E731
    return [_make_instance(flat(d)[a0:a1], flat(db)[b0:b1], bool(nr), special)
            for d, a0, a1, db, b0, b1, nr in zip(*[iter(out)] * 7)]


def create_packed_instances(document: Document, *, max_seq_length: int,
                            special: SpecialIds) -> list[TrainingInstance]:
    """No-NSP mode (RoBERTa's "doc-sentences"): pack whole consecutive sentences of one document
    into ``[CLS] ... [SEP]`` up to ``max_seq_length``; a sentence longer than that is cut into pieces."""
    out: list[int] = []
    _pack(_LazyBounds([document])[0], 0, max_seq_length - 2, out)
    flat = [t for s in document for t in s]
    return [_make_instance(flat[p0:p1], None, False, special) for _, p0, p1 in zip(*[iter(out)] * 3)]


# ------------------------------------------------------------------------------ masking (numpy Generator)
def _mask_flat(ids: np.ndarray, offsets: np.ndarray, special: SpecialIds, cfg: MaskingConfig,
               rng: np.random.Generator, rows: int = 8192) -> tuple[np.ndarray, ...]:
    """Google's ``create_masked_lm_predictions`` for the sequences ``ids[offsets[i]:offsets[i+1]]``, in
    padded blocks of ``rows``: (masked ids, mask offsets, sorted positions, original ids there)."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    counts, positions = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        L = lengths[r0:r1]
        T = int(L.max())
        col = np.arange(T)
        valid = col < L[:, None]
        idx = offsets[r0:r1, None] + col
        tokens = ids[np.minimum(idx, len(ids) - 1)] if T else np.zeros((r1 - r0, 0), dtype=ids.dtype)
        cand = valid & (tokens != special.cls) & (tokens != special.sep)
        # Python's round (half to even) on the same float product, as the original.
        k = np.minimum(cfg.max_predictions_per_seq, np.maximum(1, np.round(L * cfg.masked_lm_prob))).astype(np.int64)
        k = np.minimum(k, cand.sum(1))
        keys = rng.random((r1 - r0, T))
        keys[~cand] = 2.0  # never chosen
        if cfg.whole_word_mask:
            r, c = np.nonzero(_choose_whole_words(tokens, cand, k, keys, special))  # row-major: sorted in a row
            counts.append(np.bincount(r, minlength=r1 - r0))
            positions.append(c)
        else:
            chosen = _choose_pieces(k, keys)
            counts.append(k)
            positions.append(chosen[np.arange(chosen.shape[1]) < k[:, None]])
    count = np.concatenate(counts).astype(np.int64)
    position = np.concatenate(positions).astype(np.int64)
    at = np.repeat(offsets[:-1], count) + position
    labels = ids[at]
    # 80% [MASK], 10% a random token of the whole vocab, 10% unchanged (with the default shares).
    draw = rng.random(len(at))
    to_mask = draw < cfg.mask_token_prob
    to_random = ~to_mask & (draw < cfg.mask_token_prob + cfg.random_token_prob)
    masked = ids.copy()
    masked[at[to_mask]] = special.mask
    masked[at[to_random]] = rng.integers(0, special.vocab_size, size=int(to_random.sum()))
    mask_offsets = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
    return masked, mask_offsets, position, labels


def _choose_pieces(k: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The ``k`` positions of smallest key in each row (a random subset of the candidates), sorted, in
    the first ``k`` columns of a ``(n, max k)`` array."""
    kmax = int(k.max()) if len(k) else 0
    # Ties between float64 keys have probability ~0: the unstable sort picks the same set everywhere.
    first = np.argsort(keys, axis=1)[:, :kmax]
    first[np.arange(kmax) >= k[:, None]] = keys.shape[1]  # past the row's count: sorts last
    first.sort(axis=1)
    return first


def _choose_whole_words(tokens: np.ndarray, cand: np.ndarray, k: np.ndarray, keys: np.ndarray,
                        special: SpecialIds) -> np.ndarray:
    """Whole-word choice: a word is a piece plus the ``##`` pieces after it (even across a [SEP], as
    Google's), in random order; one that would overshoot the count is skipped, as in the original."""
    if special.continuation is None:
        raise ValueError("whole-word masking needs the vocab's continuation ('##') flags")
    n = len(k)
    cont = special.continuation[tokens] & cand
    seen_before = (np.cumsum(cand, axis=1) - cand) > 0  # a candidate exists earlier in the row
    starts = cand & ~(cont & seen_before)
    group = np.cumsum(starts, axis=1) - 1  # word index of each candidate position
    chosen = np.zeros_like(cand)
    W = int(starts.sum(1).max()) if n else 0
    if W == 0:
        return chosen
    rc, cc = np.nonzero(cand)
    word = group[rc, cc]
    sizes = np.bincount(rc * W + word, minlength=n * W).reshape(n, W)
    word_keys = np.full((n, W), np.inf)
    rs, cs = np.nonzero(starts)
    word_keys[rs, group[rs, cs]] = keys[rs, cs]
    order = np.argsort(word_keys, axis=1)
    sorted_sizes = np.take_along_axis(sizes, order, axis=1)
    total = np.zeros(n, dtype=np.int64)
    picked_sorted = np.zeros((n, W), dtype=bool)
    for s in range(W):
        size = sorted_sizes[:, s]
        ok = (total < k) & (size > 0) & (total + size <= k)
        picked_sorted[:, s] = ok
        total += np.where(ok, size, 0)
        if not (total < k).any():
            break
    picked = np.zeros((n, W), dtype=bool)
    np.put_along_axis(picked, order, picked_sorted, axis=1)
    chosen[rc, cc] = picked[rc, word]
    return chosen


def mask_batch(batch: InstanceBatch, special: SpecialIds, cfg: MaskingConfig,
               rng: np.random.Generator) -> InstanceBatch:
    """Static masks for an unmasked batch: each instance (each dupe pass's copy) drawn independently."""
    masked, mask_offsets, positions, labels = _mask_flat(batch.input_ids, batch.offsets, special, cfg, rng)
    return InstanceBatch(masked, batch.offsets, batch.num_a, batch.next_sentence, mask_offsets, positions, labels)


def mask_instances(sequences: Sequence[np.ndarray], special: SpecialIds, cfg: MaskingConfig,
                   rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Google's ``create_masked_lm_predictions`` for many sequences: (masked ids, positions, labels) each."""
    n = len(sequences)
    if n == 0:
        return []
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sequences])]).astype(np.int64)
    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences])
    masked, mo, positions, labels = _mask_flat(ids, offsets, special, cfg, rng)
    return [(masked[offsets[i]:offsets[i + 1]], positions[mo[i]:mo[i + 1]], labels[mo[i]:mo[i + 1]])
            for i in range(n)]


def apply_masks(instances: list[TrainingInstance], special: SpecialIds, cfg: MaskingConfig,
                rng: np.random.Generator, batch: int = 4096) -> None:
    """Mask unmasked instances in place (``batch`` at a time, to bound the temporary arrays)."""
    for b in range(0, len(instances), batch):
        part = instances[b:b + batch]
        masked = mask_instances([x.input_ids for x in part], special, cfg, rng)
        for inst, (ids, positions, labels) in zip(part, masked):
            inst.input_ids, inst.masked_positions, inst.masked_labels = ids, positions, labels
