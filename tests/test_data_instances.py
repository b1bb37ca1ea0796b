"""Google's instance algorithm (``bertforge.data.instances``): seeded statistical checks of masking
and NSP against the numbers of SPEC.md, tolerances at 4 binomial standard deviations."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from data_fixtures import (
    CLS,
    MASK,
    SEP,
    SPECIAL,
    VOCAB_SIZE,
    check_layout,
    documents,
    expected_mask_count,
    google_words,
    original_ids,
    tokenize_docs,
)

from bertforge.data.instances import (
    DocumentPool,
    InstanceBatch,
    MaskingConfig,
    apply_masks,
    create_instances,
    create_instances_from_document,
    create_packed_instances,
    mask_batch,
    mask_instances,
    truncate_seq_pair,
)

FIRST_WORD = MASK + 1  # ids below are [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]


def sigma(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def random_sequences(n: int, seed: int, lengths=None, min_len: int = 3, max_len: int = 300) -> list[np.ndarray]:
    """``[CLS] A [SEP] B [SEP]`` (or ``[CLS] A [SEP]`` when short) of random ordinary tokens."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        L = lengths[k] if lengths is not None else rng.randint(min_len, max_len)
        body = [rng.randrange(FIRST_WORD, VOCAB_SIZE) for _ in range(L)]
        body[0] = CLS
        body[-1] = SEP
        if L >= 5:
            body[rng.randint(2, L - 3)] = SEP
        out.append(np.array(body, dtype=np.int64))
    return out


def all_instances(docs, passes: int, seed: int, max_seq_length: int, short_seq_prob: float):
    """Google's main loop over a pool of documents (unmasked), with the document index of each."""
    rng = random.Random(seed)
    out = []
    for _ in range(passes):
        for index in range(len(docs)):
            for inst in create_instances_from_document(docs, index, max_seq_length=max_seq_length,
                                                       short_seq_prob=short_seq_prob, special=SPECIAL, rng=rng):
                out.append((index, inst))
    return out


@pytest.fixture(scope="module")
def long_docs(tokenizer):
    """40 long documents (150-250 sentences of ~13 tokens)."""
    return tokenize_docs(tokenizer, documents(seed=7, n_docs=40, min_sents=150, max_sents=250))


# ------------------------------------------------------------------------------ masking
def test_masked_count_is_the_fixed_rounded_count():
    # Known values, Python's round (half to even) on len * 0.15: 10 -> 1.5 -> 2, 30 -> 4.5 -> 4,
    # 50 -> 7.5 -> 8, 70 -> 10.5 -> 10, 90 -> 13.5 -> 14; at least 1; at most max_predictions.
    known_20 = {3: 1, 4: 1, 6: 1, 7: 1, 10: 2, 17: 3, 30: 4, 50: 8, 70: 10, 90: 14, 110: 16, 130: 20, 200: 20}
    known_80 = {90: 14, 130: 20, 200: 30, 300: 45, 600: 80}
    for max_pred, known in ((20, known_20), (80, known_80)):
        lengths = list(known)
        seqs = random_sequences(len(lengths), seed=1, lengths=lengths)
        out = mask_instances(seqs, SPECIAL, MaskingConfig(max_predictions_per_seq=max_pred), np.random.default_rng(0))
        assert {len(s): len(p) for s, (_, p, _) in zip(seqs, out)} == known
        for L, k in known.items():
            assert expected_mask_count(L, max_pred) == k

    # And for every one of many random lengths, exactly, whatever the draw.
    seqs = random_sequences(3000, seed=2)
    out = mask_instances(seqs, SPECIAL, MaskingConfig(), np.random.default_rng(1))
    for seq, (ids, pos, labels) in zip(seqs, out):
        L = len(seq)
        assert len(ids) == L
        assert len(pos) == expected_mask_count(L, 20)
        assert np.all(np.diff(pos) > 0)  # sorted, distinct
        assert np.array_equal(labels, seq[pos])
        rest = np.ones(L, dtype=bool)
        rest[pos] = False
        assert np.array_equal(ids[rest], seq[rest])  # only chosen positions change


def test_cls_and_sep_never_masked_even_when_asked_for_everything():
    seqs = random_sequences(2000, seed=3, min_len=3, max_len=40)
    for wwm in (False, True):
        cfg = MaskingConfig(masked_lm_prob=0.95, max_predictions_per_seq=80, whole_word_mask=wwm)
        out = mask_instances(seqs, SPECIAL, cfg, np.random.default_rng(2))
        for seq, (ids, pos, labels) in zip(seqs, out):
            special = np.isin(seq, [CLS, SEP])
            assert not np.isin(labels, [CLS, SEP]).any()
            assert not special[pos].any()
            assert np.array_equal(ids[special], seq[special])
            if not wwm:  # the count is capped by the candidates: every ordinary token is taken
                k = min(expected_mask_count(len(seq), 80, 0.95), int((~special).sum()))
                assert len(pos) == k


@pytest.mark.parametrize("mask_p,random_p", [(0.8, 0.1), (0.5, 0.3)])
def test_replacement_split(mask_p, random_p):
    seqs = random_sequences(4000, seed=4, lengths=[128] * 4000)
    cfg = MaskingConfig(mask_token_prob=mask_p, random_token_prob=random_p)
    out = mask_instances(seqs, SPECIAL, cfg, np.random.default_rng(3))
    at = np.concatenate([ids[pos] for ids, pos, _ in out])
    labels = np.concatenate([lab for _, _, lab in out])
    n = len(at)
    assert n == 4000 * 19  # round(128 * 0.15) = 19
    V = VOCAB_SIZE
    keep_p = 1 - mask_p - random_p
    # A random draw can hit [MASK] or the original token (1/V each): it then looks like those.
    expected = {"mask": mask_p + random_p / V, "keep": keep_p + random_p / V, "random": random_p * (1 - 2 / V)}
    observed = {"mask": np.mean(at == MASK), "keep": np.mean(at == labels),
                "random": np.mean((at != MASK) & (at != labels))}
    for kind, p in expected.items():
        assert abs(observed[kind] - p) < 4 * sigma(p, n), (kind, observed[kind], p)


def test_random_replacements_come_from_the_whole_vocabulary():
    seqs = random_sequences(4000, seed=5, lengths=[128] * 4000)
    out = mask_instances(seqs, SPECIAL, MaskingConfig(), np.random.default_rng(4))
    drawn = np.concatenate([ids[pos][(ids[pos] != MASK) & (ids[pos] != lab)] for ids, pos, lab in out])
    assert 6000 < len(drawn) < 9000
    # Every id but [MASK] (whose draws look like a mask) shows up: special and [unused] entries too.
    assert set(drawn.tolist()) == set(range(VOCAB_SIZE)) - {MASK}
    for special_id in (0, 1, 99, 100, CLS, SEP):
        assert special_id in drawn
    # Uniform: the share of ids below [MASK] is 103 of the V - 2 ids a visible draw can be.
    p = MASK / (VOCAB_SIZE - 2)
    assert abs(np.mean(drawn < MASK) - p) < 4 * sigma(p, len(drawn))


def test_masking_is_seeded():
    seqs = random_sequences(200, seed=6)
    a = mask_instances(seqs, SPECIAL, MaskingConfig(), np.random.default_rng(7))
    b = mask_instances(seqs, SPECIAL, MaskingConfig(), np.random.default_rng(7))
    c = mask_instances(seqs, SPECIAL, MaskingConfig(), np.random.default_rng(8))
    same = all(np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b))
    assert same
    differ = sum(not np.array_equal(x[1], y[1]) for x, y in zip(a, c))
    assert differ > 190


# ------------------------------------------------------------------------------ whole-word masking
def test_google_word_grouping_reference():
    w = 108  # an ordinary id; 200 is flagged as a ## piece below
    cont = np.zeros(VOCAB_SIZE, dtype=bool)
    cont[200] = True
    assert google_words([CLS, w, 200, SEP, 200, w, SEP], is_cont=cont) == [[1, 2, 4], [5]]
    assert google_words([CLS, 200, w, 200, SEP, w, SEP], is_cont=cont) == [[1], [2, 3], [5]]


def test_whole_word_masking_keeps_words_together(long_docs):
    insts = [inst for _, inst in all_instances(long_docs[:20], passes=1, seed=11, max_seq_length=64, short_seq_prob=0.1)]
    originals = [x.input_ids.copy() for x in insts]
    apply_masks(insts, SPECIAL, MaskingConfig(whole_word_mask=True), np.random.default_rng(5))
    multi_piece_masked = 0
    total_masked = total_k = 0
    for orig, inst in zip(originals, insts):
        masked = set(inst.masked_positions.tolist())
        k = expected_mask_count(len(orig), 20)
        assert 1 <= len(masked) <= k
        total_masked += len(masked)
        total_k += k
        for word in google_words(orig):
            hit = [p in masked for p in word]
            assert all(hit) or not any(hit), (orig.tolist(), word, sorted(masked))
            multi_piece_masked += all(hit) and len(word) > 1
        assert np.array_equal(original_ids(inst), orig)
    assert multi_piece_masked > 200  # the check is not vacuous
    assert total_masked > 0.95 * total_k  # skipping words that overshoot loses little

    # The same check fails for per-piece masking: it does split words.
    insts2 = [inst for _, inst in all_instances(long_docs[:20], passes=1, seed=11, max_seq_length=64, short_seq_prob=0.1)]
    apply_masks(insts2, SPECIAL, MaskingConfig(whole_word_mask=False), np.random.default_rng(5))
    split = 0
    for inst in insts2:
        masked = set(inst.masked_positions.tolist())
        split += sum(0 < sum(p in masked for p in w) < len(w) for w in google_words(original_ids(inst)))
    assert split > 100


def test_whole_word_masking_quirks_across_sep_and_after_cls(tokenizer):
    walk, ing, good = tokenizer.convert_tokens_to_ids(["walk", "##ing", "good"])
    # Google attaches a ## piece after [SEP] to the word before the [SEP]: {1, 2, 4} is one word.
    seq = np.array([CLS, walk, ing, SEP, ing, good, SEP])
    cfg = MaskingConfig(masked_lm_prob=0.43, whole_word_mask=True)  # round(7 * 0.43) = 3
    outcomes = set()
    for seed in range(200):
        (_, pos, _), = mask_instances([seq], SPECIAL, cfg, np.random.default_rng(seed))
        outcomes.add(tuple(pos.tolist()))
    # Either the 3-piece word (exactly the count) or, when "good" comes first, only "good"
    # (the 3-piece word would overshoot and is skipped, as in Google's loop).
    assert outcomes == {(1, 2, 4), (5,)}

    # A ## piece right after [CLS] has no word before it: it is a word of its own.
    seq = np.array([CLS, ing, walk, ing, SEP, good, SEP])
    cfg = MaskingConfig(masked_lm_prob=0.3, whole_word_mask=True)  # round(2.1) = 2
    outcomes = set()
    for seed in range(200):
        (_, pos, _), = mask_instances([seq], SPECIAL, cfg, np.random.default_rng(seed))
        outcomes.add(tuple(pos.tolist()))
    assert outcomes == {(1, 5), (2, 3)}


def test_whole_word_masking_needs_continuation_flags():
    from dataclasses import replace

    with pytest.raises(ValueError, match="continuation"):
        mask_instances(random_sequences(2, seed=0), replace(SPECIAL, continuation=None),
                       MaskingConfig(whole_word_mask=True), np.random.default_rng(0))


# ------------------------------------------------------------------------------ NSP pairs
def _as_bytes(tokens) -> bytes:
    return np.asarray(tokens, dtype=np.int32).tobytes()


def _occurrences(hay: bytes, needle: bytes) -> list[int]:
    """Token offsets where ``needle`` occurs in ``hay`` (int32 streams)."""
    out, start = [], 0
    while True:
        at = hay.find(needle, start)
        if at < 0:
            return out
        if at % 4 == 0:
            out.append(at // 4)
        start = at + 1


def test_nsp_share_and_pair_structure_on_long_documents(long_docs):
    streams = [_as_bytes([t for s in d for t in s]) for d in long_docs]
    pairs = all_instances(long_docs, passes=2, seed=12, max_seq_length=64, short_seq_prob=0.0)
    n = len(pairs)
    assert n > 4000
    not_next = sum(inst.is_random_next for _, inst in pairs)
    share = not_next / n
    # 0.5, plus at most half a single-sentence chunk (always NotNext) per document pass (its end).
    calls = 2 * len(long_docs)
    assert 0.5 - 4 * sigma(0.5, n) < share < 0.5 + 4 * sigma(0.5, n) + 0.5 * calls / n, share

    checked_random = 0
    for index, inst in pairs:
        check_layout(inst, 64)
        ids = inst.input_ids
        a, b = ids[1:inst.num_a - 1], ids[inst.num_a:-1]
        a_at = _occurrences(streams[index], _as_bytes(a))
        assert a_at, "segment A is a contiguous run of its own document"
        b_here = _occurrences(streams[index], _as_bytes(b))
        if not inst.is_random_next:
            # IsNext: B is the text right after A (up to the tokens truncation cut at the seam).
            assert any(bo >= ao + len(a) and bo - (ao + len(a)) < 64 for ao in a_at for bo in b_here)
        else:
            others = [j for j, s in enumerate(streams) if j != index and _occurrences(s, _as_bytes(b))]
            assert others, "NotNext: B is a contiguous run of another document"
            if len(b) >= 8:
                checked_random += 1
                assert not b_here
    assert checked_random > 1000


def test_is_next_coin_is_fair():
    """Two-sentence documents: the first chunk is both sentences; IsNext with probability exactly 1/2."""
    rng = random.Random(5)
    docs = [[[rng.randrange(FIRST_WORD, VOCAB_SIZE)] * 5, [rng.randrange(FIRST_WORD, VOCAB_SIZE)] * 6]
            for _ in range(20000)]
    pairs = all_instances(docs, passes=1, seed=3, max_seq_length=64, short_seq_prob=0.0)
    is_next = [inst for _, inst in pairs if not inst.is_random_next]
    assert abs(len(is_next) / len(docs) - 0.5) < 4 * sigma(0.5, len(docs))
    assert all(inst.num_a == 7 and len(inst.input_ids) == 14 for inst in is_next)  # A = s0, B = s1


def test_nsp_share_on_short_documents_is_above_half(tokenizer):
    # One-sentence documents: every chunk has one sentence, so every pair is NotNext.
    one = tokenize_docs(tokenizer, documents(seed=21, n_docs=300, min_sents=1, max_sents=1))
    pairs = all_instances(one, passes=2, seed=1, max_seq_length=64, short_seq_prob=0.0)
    assert len(pairs) == 600  # one instance per document per pass
    assert all(inst.is_random_next for _, inst in pairs)

    # Two-sentence documents: IsNext (1 instance) or NotNext + the put-back sentence, again
    # NotNext (2 instances), half and half: NotNext share 2/3, not 1/2.
    two = tokenize_docs(tokenizer, documents(seed=22, n_docs=2000, min_sents=2, max_sents=2))
    pairs = all_instances(two, passes=1, seed=2, max_seq_length=64, short_seq_prob=0.0)
    share = np.mean([inst.is_random_next for _, inst in pairs])
    # delta-method std of the ratio: sqrt(Var(X - 2/3 Y) / (n E[Y]^2)) = 0.444 / sqrt(n)
    assert abs(share - 2 / 3) < 4 * 0.444 / math.sqrt(len(two)), share
    assert abs(len(pairs) / len(two) - 1.5) < 4 * 0.5 / math.sqrt(len(two))


# ------------------------------------------------------------------------------ lengths, layout, truncation
@pytest.mark.parametrize("max_seq_length", [16, 64, 128])
def test_lengths_and_segment_layout(long_docs, max_seq_length):
    pairs = all_instances(long_docs[:10], passes=1, seed=13, max_seq_length=max_seq_length, short_seq_prob=0.1)
    insts = [inst for _, inst in pairs]
    apply_masks(insts, SPECIAL, MaskingConfig(), np.random.default_rng(0))
    lengths = np.array([len(x.input_ids) for x in insts])
    assert lengths.max() == max_seq_length
    assert np.mean(lengths == max_seq_length) > 0.6  # most instances fill the target
    for inst in insts:
        check_layout(inst, max_seq_length)
        assert len(inst.masked_positions) == expected_mask_count(len(inst.input_ids), 20)


def test_truncate_seq_pair_trims_the_longer_one():
    rng = random.Random(0)
    a, b = list(range(1000, 1050)), list(range(2000, 2010))
    truncate_seq_pair(a, b, 30, rng)
    assert (len(a), len(b)) == (20, 10)  # only the longer, A, was trimmed
    assert b == list(range(2000, 2010))
    assert a == list(range(a[0], a[0] + 20))  # still contiguous
    assert a[0] > 1000 and a[-1] < 1049  # trimmed from both ends

    a, b = list(range(20)), list(range(100, 125))
    truncate_seq_pair(a, b, 31, rng)
    assert (len(a), len(b)) == (16, 15)  # B down to A's length, then alternately; a tie trims B

    a, b = [1, 2, 3], [4, 5]
    state = rng.getstate()
    truncate_seq_pair(a, b, 5, rng)
    assert (a, b) == ([1, 2, 3], [4, 5]) and rng.getstate() == state  # fits: untouched, no draw


def test_truncate_seq_pair_front_and_back_equally():
    rng = random.Random(1)
    front = 0
    trials, cut = 300, 40
    for _ in range(trials):
        a, b = list(range(60)), [7] * 5
        truncate_seq_pair(a, b, 25, rng)
        assert len(a) + len(b) == 25 and b == [7] * 5
        assert a == list(range(a[0], a[0] + 20))
        front += a[0]
    share = front / (trials * cut)
    assert abs(share - 0.5) < 4 * sigma(0.5, trials * cut)


def test_short_seq_prob_rate_is_per_document_pass():
    """The target length is drawn once per document and pass. With one-token sentences every
    instance of a pass has length <= target + 3 and some reach it, so each call reveals its target."""
    rng = random.Random(3)
    docs = [[[rng.randrange(FIRST_WORD, VOCAB_SIZE)] for _ in range(150)] for _ in range(40)]
    max_seq = 64
    for p in (0.0, 0.25):
        calls = 0
        observed = []
        r = random.Random(4)
        for _ in range(50):
            for index in range(len(docs)):
                insts = create_instances_from_document(docs, index, max_seq_length=max_seq, short_seq_prob=p,
                                                       special=SPECIAL, rng=r)
                calls += 1
                observed.append(max(len(x.input_ids) for x in insts) - 3)
        observed = np.array(observed)
        assert observed.max() == max_seq - 3 and observed.min() >= 2
        short = observed < max_seq - 3
        if p == 0.0:
            assert short.mean() < 0.01
        else:
            expected = p * 59 / 60  # a short draw of exactly max - 3 looks like a full one
            assert abs(short.mean() - expected) < 4 * sigma(expected, calls) + 0.01, short.mean()
            # short targets are uniform on [2, max - 4] here: mean 31, std 17
            t = observed[short]
            assert abs(t.mean() - 31) < 4 * 17 / math.sqrt(len(t))


def test_instances_are_seeded(long_docs):
    a = all_instances(long_docs[:5], passes=1, seed=5, max_seq_length=64, short_seq_prob=0.1)
    b = all_instances(long_docs[:5], passes=1, seed=5, max_seq_length=64, short_seq_prob=0.1)
    c = all_instances(long_docs[:5], passes=1, seed=6, max_seq_length=64, short_seq_prob=0.1)
    key = lambda pairs: [(i, x.input_ids.tolist(), x.num_a, x.is_random_next) for i, x in pairs]
    assert key(a) == key(b)
    assert key(a) != key(c)


# ------------------------------------------------------------------------------ no NSP: packed sentences
def test_packed_instances_hand_example():
    sizes = [5, 7, 20, 3, 70, 4, 4]  # max 64 -> 62 tokens between [CLS] and [SEP]
    doc, t = [], 1000
    for n in sizes:
        doc.append(list(range(t, t + n)))
        t += n
    insts = create_packed_instances(doc, max_seq_length=64, special=SPECIAL)
    bodies = [x.input_ids[1:-1].tolist() for x in insts]
    assert bodies == [doc[0] + doc[1] + doc[2] + doc[3], doc[4][:62], doc[4][62:] + doc[5] + doc[6]]
    for x in insts:
        assert x.input_ids[0] == CLS and x.input_ids[-1] == SEP and x.num_a == len(x.input_ids)
        assert not x.is_random_next and len(x.masked_positions) == 0


def test_packed_instances_are_whole_sentences_filled_up(long_docs):
    for doc in long_docs[:10]:
        insts = create_packed_instances(doc, max_seq_length=64, special=SPECIAL)
        bodies = [x.input_ids[1:-1].tolist() for x in insts]
        assert [t for body in bodies for t in body] == [t for s in doc for t in s]  # all, in order, once
        k = 0
        for j, body in enumerate(bodies):
            check_layout(insts[j], 64, nsp=False)
            taken = 0
            while taken < len(body):  # the body is whole consecutive sentences
                taken += len(doc[k])
                k += 1
            assert taken == len(body)
            if k < len(doc):
                assert len(body) + len(doc[k]) > 62  # the next sentence would not have fit


# ------------------------------------------------------------------------------ the columnar path is Google's loop
def google_reference(documents, index, max_seq_length, short_seq_prob, rng):
    """Google's ``create_instances_from_document`` transcribed literally (token lists, ``randint``,
    one ``rng.random()`` per truncated token): (A, B, is_random_next) per instance."""
    document = documents[index]
    max_num_tokens = max_seq_length - 3
    target = max_num_tokens
    if rng.random() < short_seq_prob:
        target = rng.randint(2, max_num_tokens)
    out, chunk, length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for s in chunk[:a_end] for t in s]
            b = []
            if len(chunk) == 1 or rng.random() < 0.5:
                random_next = True
                for _ in range(10):
                    other = rng.randint(0, len(documents) - 1)
                    if other != index:
                        break
                for s in documents[other][rng.randint(0, len(documents[other]) - 1):]:
                    b.extend(s)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end
            else:
                random_next = False
                b = [t for s in chunk[a_end:] for t in s]
            while len(a) + len(b) > max_num_tokens:
                trunc = a if len(a) > len(b) else b
                if rng.random() < 0.5:
                    del trunc[0]
                else:
                    trunc.pop()
            out.append(([CLS, *a, SEP, *b, SEP], len(a) + 2, random_next))
            chunk, length = [], 0
        i += 1
    return out


@pytest.mark.parametrize("max_seq_length,short_seq_prob", [(16, 0.5), (64, 0.1), (128, 0.0)])
def test_columnar_instances_are_googles_loop(long_docs, tokenizer, max_seq_length, short_seq_prob):
    """The same instances, in the same order, and the generator left in the same state, as
    Google's main loop (shuffle documents, passes, shuffle instances) on the literal transcription."""
    short = tokenize_docs(tokenizer, documents(seed=41, n_docs=30, min_sents=1, max_sents=4))
    docs = long_docs[:6] + short
    for seed in (0, 1):
        ref_rng = random.Random(seed)
        shuffled = list(docs)
        ref_rng.shuffle(shuffled)
        expected = [x for _ in range(3) for i in range(len(shuffled))
                    for x in google_reference(shuffled, i, max_seq_length, short_seq_prob, ref_rng)]
        ref_rng.shuffle(expected)
        rng = random.Random(seed)
        batch = create_instances(DocumentPool.from_documents(docs), max_seq_length=max_seq_length,
                                 short_seq_prob=short_seq_prob, dupe_factor=3, nsp=True, special=SPECIAL, rng=rng)
        got = [(x.input_ids.tolist(), x.num_a, x.is_random_next) for x in batch.instances()]
        assert got == expected
        assert rng.getstate() == ref_rng.getstate()
        assert len(batch.masked_positions) == 0 and np.all(batch.mask_offsets == 0)

    # No NSP: each pass packs every document the same way; the instances are shuffled.
    rng = random.Random(2)
    batch = create_instances(DocumentPool.from_documents(docs), max_seq_length=max_seq_length, short_seq_prob=0.0,
                             dupe_factor=2, nsp=False, special=SPECIAL, rng=rng)
    packed = [x.input_ids.tolist() for d in docs for x in create_packed_instances(d, max_seq_length=max_seq_length,
                                                                                 special=SPECIAL)]
    assert sorted(x.input_ids.tolist() for x in batch.instances()) == sorted(packed * 2)


def test_document_pool_drops_empty_sentences_and_documents():
    pool = DocumentPool.from_sentences([[5, 6], [], [7], [], [], [8, 9, 10]], [3, 2, 1])
    assert pool.tokens.tolist() == [5, 6, 7, 8, 9, 10]
    assert pool.bounds == [[0, 2, 3], [0, 3]]
    assert pool.starts.tolist() == [0, 3]
    assert pool.sentence_counts().tolist() == [2, 1]
    # A window whose text tokenizes to nothing: no documents, no instances, nothing breaks.
    empty = DocumentPool.from_sentences([[], []], [1, 1])
    for nsp in (True, False):
        batch = create_instances(empty, max_seq_length=16, short_seq_prob=0.1, dupe_factor=2, nsp=nsp,
                                 special=SPECIAL, rng=random.Random(0))
        batch = mask_batch(batch, SPECIAL, MaskingConfig(), np.random.default_rng(0))
        assert len(empty) == len(batch) == 0 and batch.offsets.tolist() == [0]


def test_mask_batch_is_mask_instances_on_the_flat_layout(long_docs):
    pairs = all_instances(long_docs[:5], passes=1, seed=3, max_seq_length=64, short_seq_prob=0.1)
    insts = [inst for _, inst in pairs]
    batch = InstanceBatch.from_instances(insts)
    for wwm in (False, True):
        cfg = MaskingConfig(whole_word_mask=wwm)
        masked = mask_batch(batch, SPECIAL, cfg, np.random.default_rng(9))
        listed = mask_instances([x.input_ids for x in insts], SPECIAL, cfg, np.random.default_rng(9))
        for i, (ids, pos, labels) in enumerate(listed):
            x = masked.instance(i)
            assert np.array_equal(x.input_ids, ids) and np.array_equal(x.masked_positions, pos)
            assert np.array_equal(x.masked_labels, labels) and x.num_a == insts[i].num_a
        assert np.array_equal(batch.input_ids, InstanceBatch.from_instances(insts).input_ids)  # not in place
