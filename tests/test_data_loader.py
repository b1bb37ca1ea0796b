"""The loader of prepared shards: batches for `BertForPreTraining`, seeded order, every instance
once per epoch, ranks, exact resume, dynamic masking, and the checks on damaged data."""

from __future__ import annotations

import collections
import json
import shutil

import numpy as np
import pytest
import torch
from data_fixtures import (
    CLS,
    MASK,
    SEP,
    SPECIAL,
    VOCAB_SIZE,
    documents,
    expected_mask_count,
    read_instances,
    write_google,
)

from bertforge import BertConfig, BertForPreTraining
from bertforge.data.loader import EpochCursor, PretrainingDataset, PretrainingLoader, epoch_permutation
from bertforge.data.prepare import PrepareConfig, prepare
from bertforge.data.shards import ShardError, read_shard

MAX_SEQ = 32
KEYS = {"input_ids", "token_type_ids", "attention_mask", "masked_positions", "labels", "next_sentence_label"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    return write_google(path, documents(seed=41, n_docs=80, min_sents=2, max_sents=20))


def _prepare(tmp_path_factory, corpus, tok_dir, name, **cfg):
    out = tmp_path_factory.mktemp(name) / "data"
    config = PrepareConfig(**{"max_seq_length": MAX_SEQ, "dupe_factor": 1, "shard_chars": 8000, **cfg})
    manifest = prepare([corpus], out, tok_dir, config, progress=False)
    assert manifest["complete"] and len(manifest["shards"]) >= 5
    return out


@pytest.fixture(scope="module")
def static_dir(tmp_path_factory, corpus, tok_dir):
    return _prepare(tmp_path_factory, corpus, tok_dir, "static")


@pytest.fixture(scope="module")
def dynamic_dir(tmp_path_factory, corpus, tok_dir):
    return _prepare(tmp_path_factory, corpus, tok_dir, "dynamic", dynamic_masking=True)


@pytest.fixture(scope="module")
def packed_dir(tmp_path_factory, corpus, tok_dir):
    return _prepare(tmp_path_factory, corpus, tok_dir, "packed", nsp=False)


def loader(folder, batch_size, **kw):
    return PretrainingLoader(PretrainingDataset(folder), batch_size, **kw)


def rows(batch) -> list[tuple]:
    """Each row of a batch as (ids, num_a, positions, labels, next) without padding."""
    out = []
    for i in range(len(batch["input_ids"])):
        L = int(batch["attention_mask"][i].sum())
        num_a = L - int(batch["token_type_ids"][i].sum())
        p = int((batch["labels"][i] != -100).sum())
        nsl = int(batch["next_sentence_label"][i]) if "next_sentence_label" in batch else None
        out.append((tuple(batch["input_ids"][i, :L].tolist()), num_a, tuple(batch["masked_positions"][i, :p].tolist()),
                    tuple(batch["labels"][i, :p].tolist()), nsl))
    return out


def instance_key(inst, nsp=True) -> tuple:
    return (tuple(inst.input_ids.tolist()), inst.num_a, tuple(inst.masked_positions.tolist()),
            tuple(inst.masked_labels.tolist()), int(inst.is_random_next) if nsp else None)


def epoch_rows(ldr) -> list[list[tuple]]:
    return [rows(b) for b in ldr]


# ------------------------------------------------------------------------------ batches
def test_batches_have_the_model_layout_and_give_a_finite_loss(static_dir):
    ldr = loader(static_dir, 8, seed=0)
    n = len(ldr.dataset)
    assert len(ldr) == n // 8
    batch = next(iter(ldr))
    assert set(batch) == KEYS
    assert all(t.dtype == torch.int64 for t in batch.values())
    B, T = batch["input_ids"].shape
    assert B == 8 and T % 8 == 0 and T <= MAX_SEQ
    assert batch["masked_positions"].shape == batch["labels"].shape == (8, 20)
    assert batch["next_sentence_label"].shape == (8,)
    am = batch["attention_mask"]
    assert int(am.sum(1).max()) > T - 8  # padded to the next multiple of 8 only
    for i, (ids, num_a, pos, labels, nsl) in enumerate(rows(batch)):
        L = len(ids)
        assert am[i, :L].all() and not am[i, L:].any()
        assert not batch["input_ids"][i, L:].any()  # [PAD] = 0
        assert ids[0] == CLS and ids[num_a - 1] == SEP and ids[-1] == SEP  # never masked
        tt = batch["token_type_ids"][i]
        assert not tt[:num_a].any() and tt[num_a:L].all() and not tt[L:].any()
        assert 3 <= num_a <= L - 2
        assert len(pos) == expected_mask_count(L, 20)
        assert max(pos) < L and 0 not in pos and num_a - 1 not in pos and L - 1 not in pos
        assert (batch["masked_positions"][i, len(pos):] == 0).all()
        assert nsl in (0, 1)
    # At least one of the batch's NSP labels of each kind over a few batches, and real masks.
    first = [b for _, b in zip(range(10), iter(loader(static_dir, 8, seed=0)))]
    labels = torch.cat([b["next_sentence_label"] for b in first])
    assert 0 < labels.float().mean() < 1
    at = torch.cat([b["input_ids"].gather(1, b["masked_positions"])[b["labels"] != -100] for b in first])
    assert 0.6 < (at == MASK).float().mean() < 0.95

    config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(config)
    out = model(**batch)
    assert torch.isfinite(out.loss)
    # an untrained model: MLM about ln(V), NSP about ln(2)
    assert abs(out.loss.item() - (np.log(VOCAB_SIZE) + np.log(2))) < 1.5
    out.loss.backward()
    assert torch.isfinite(model.bert.embeddings.word_embeddings.weight.grad).all()
    assert out.prediction_logits.shape[:2] == (8, 20)


def test_every_instance_once_per_epoch(static_dir):
    everything = collections.Counter(instance_key(x) for x in read_instances(static_dir))
    n = sum(everything.values())
    # batch size 1: the epoch is exactly the dataset
    got = collections.Counter(r for b in loader(static_dir, 1, seed=2) for r in rows(b))
    assert got == everything
    # batch size 16: all but the remainder (the last incomplete batch is dropped)
    ldr = loader(static_dir, 16, seed=2)
    dropped = []
    for _ in range(2):
        got = collections.Counter(r for b in ldr for r in rows(b))
        assert sum(got.values()) == 16 * (n // 16) == 16 * len(ldr)
        assert not got - everything  # nothing seen twice or invented
        dropped.append(everything - got)
        assert sum(dropped[-1].values()) == n % 16
    assert n % 16 and dropped[0] != dropped[1]  # a different remainder each epoch


def test_order_follows_the_seed(static_dir):
    a, b, c = loader(static_dir, 8, seed=3), loader(static_dir, 8, seed=3), loader(static_dir, 8, seed=4)
    a0, a1 = epoch_rows(a), epoch_rows(a)
    assert epoch_rows(b) == a0 and epoch_rows(b) == a1  # same seed: same batches, epoch after epoch
    c0 = epoch_rows(c)
    assert sum(x != y for x, y in zip(a0, c0)) > 0.9 * len(a0)  # another seed, another order
    assert sum(x != y for x, y in zip(a0, a1)) > 0.9 * len(a0)  # a new order every epoch



@pytest.mark.parametrize("window", [1, 2, 8])
def test_shards_are_read_a_window_at_a_time_and_mixed_within_it(static_dir, window):
    """A window of shards is read once per epoch, its instances interleaved; windows change every epoch."""
    a, c = loader(static_dir, 8, seed=3, shuffle_shards=window), loader(static_dir, 8, seed=4, shuffle_shards=window)
    a0, a1, c0 = epoch_rows(a), epoch_rows(a), epoch_rows(c)
    ds = a.dataset
    where = {}
    for k in range(len(ds.sizes)):
        shard = ds.shard(k)
        for i in range(len(shard)):
            assert instance_key(shard.instance(i)) not in where
            where[instance_key(shard.instance(i))] = k
    n = len(ds.sizes)
    assert n >= 4

    def windows(epoch):
        """The shard sets read one after the other, and how often consecutive rows change shard."""
        seq = [where[r] for b in epoch for r in b]
        groups, changes = [], 0
        for j, k in enumerate(seq):
            if j and seq[j - 1] != k:
                changes += 1
            if not groups or (k not in groups[-1] and len(groups[-1]) == min(window, n)):
                groups.append({k})
            else:
                groups[-1].add(k)
        return groups, changes / len(seq)

    (g0, mix), (g1, _), (h0, _) = windows(a0), windows(a1), windows(c0)
    assert all(len(g) <= window for g in g0)
    assert sum(len(g) for g in g0) >= n - 1  # each shard in one window (the dropped remainder may hold one)
    assert len(set().union(*g0)) == sum(len(g) for g in g0)
    if window == 1:
        assert mix < 0.01 and g0 != g1 and g0 != h0  # shard by shard, in an order that changes every epoch
    else:
        assert mix > 0.3  # neighbouring rows come from different shards of the window


def test_a_resume_refuses_another_shard_window(static_dir):
    a = loader(static_dir, 8, seed=3, shuffle_shards=2)
    next(iter(a))
    state = a.state_dict()
    b = loader(static_dir, 8, seed=3, shuffle_shards=4)
    with pytest.raises(ValueError, match="2 shard"):
        b.load_state_dict(state)
    c = loader(static_dir, 8, seed=3, shuffle_shards=2)
    c.load_state_dict(state)
    assert epoch_rows(c) == epoch_rows(a)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_ranks_split_the_global_batch(kind, static_dir, dynamic_dir):
    folder = static_dir if kind == "static" else dynamic_dir
    special = SPECIAL if kind == "dynamic" else None
    single = loader(folder, 8, seed=5, special=special)
    ranks = [loader(folder, 4, seed=5, rank=r, world_size=2, special=special) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(single)
    for _ in range(2):  # two epochs
        s, r0, r1 = epoch_rows(single), epoch_rows(ranks[0]), epoch_rows(ranks[1])
        assert len(s) == len(r0) == len(r1) > 10
        for k in range(len(s)):
            assert r0[k] == s[k][:4] and r1[k] == s[k][4:]
    with pytest.raises(ValueError):
        loader(folder, 4, rank=2, world_size=2)


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_resume_gives_exactly_the_remaining_batches(kind, static_dir, dynamic_dir):
    folder = static_dir if kind == "static" else dynamic_dir
    special = SPECIAL if kind == "dynamic" else None
    make = lambda: loader(folder, 16, seed=6, special=special)
    ref = make()
    epochs = [epoch_rows(ref) for _ in range(3)]
    assert len(epochs[0]) > 8

    # mid-epoch
    a = make()
    it = iter(a)
    head = [rows(next(it)) for _ in range(5)]
    assert head == epochs[0][:5]
    state = a.state_dict()
    assert state["epoch"] == 0 and state["position"] == 5 * 16
    b = make()
    b.load_state_dict(json.loads(json.dumps(state)))  # survives a JSON round trip
    assert epoch_rows(b) == epochs[0][5:]
    assert epoch_rows(b) == epochs[1]

    # across an epoch boundary: a whole epoch, then 3 batches of the next
    a = make()
    assert epoch_rows(a) == epochs[0]
    it = iter(a)
    assert [rows(next(it)) for _ in range(3)] == epochs[1][:3]
    state = a.state_dict()
    assert state["epoch"] == 1 and state["position"] == 3 * 16
    b = make()
    b.load_state_dict(state)
    assert epoch_rows(b) == epochs[1][3:]
    assert epoch_rows(b) == epochs[2]

    # saved right after the last batch of an epoch: the rest of the stream is the next epoch
    a = make()
    it = iter(a)
    assert [rows(next(it)) for _ in range(len(a))] == epochs[0]
    assert a.state_dict()["epoch"] == 1 and a.state_dict()["position"] == 0  # counted as finished
    b = make()
    b.load_state_dict(a.state_dict())
    assert epoch_rows(b) == epochs[1]
    assert epoch_rows(b) == epochs[2]

    with pytest.raises(ValueError, match="seed"):
        loader(folder, 16, seed=7, special=special).load_state_dict(state)
    with pytest.raises(ValueError, match="global batch"):
        loader(folder, 8, seed=6, special=special).load_state_dict(state)


# ------------------------------------------------------------------------------ dynamic masking, no NSP
def test_epoch_cursor_walks_global_batches_split_by_rank_and_resumes():
    """10 items in global batches of 4 (2 ranks x 2): two steps an epoch, the last 2 items dropped;
    rank r starts at r * 2 in each global batch; each walk is one epoch, the next walk the next."""
    ranks = [EpochCursor(10, 2, seed=3, rank=r, world_size=2) for r in (0, 1)]
    assert [len(c) for c in ranks] == [2, 2]
    assert [list(c.batches("x")) for c in ranks] == [[(0, 0, 2), (0, 4, 6)], [(0, 2, 4), (0, 6, 8)]]
    assert ranks[0].state_dict() == {"epoch": 1, "position": 0, "seed": 3, "global_batch": 4}
    assert list(ranks[0].batches("x")) == [(1, 0, 2), (1, 4, 6)]
    one = EpochCursor(10, 4, seed=3)
    next(one.batches("x"))
    state = one.state_dict()  # taken after a batch: resumes at the next one
    again = EpochCursor(10, 4, seed=3)
    again.load_state_dict(state)
    assert list(again.batches("x")) == [(0, 4, 8)] and again.epoch == 1
    with pytest.raises(ValueError, match="seed 3 and global batch 4"):
        EpochCursor(10, 2, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="tiny: 3 instances, fewer than one global batch"):
        next(EpochCursor(3, 4).batches("tiny"))
    with pytest.raises(ValueError, match="rank"):
        EpochCursor(10, 2, rank=2, world_size=2)


def test_epoch_cursor_keeping_the_last_batch_shares_it_out_in_equal_padded_slices():
    """Without drop_last, 10 items in global batches of 4 (2 ranks x 2) make three batches an epoch, the
    last 2 items one each; 3 ranks x 2 leave 4 items: slices of 2, the third rank's wrapping to item 0."""
    ranks = [EpochCursor(10, 2, seed=3, rank=r, world_size=2, drop_last=False) for r in (0, 1)]
    assert [len(c) for c in ranks] == [3, 3]
    assert [list(c.batches("x")) for c in ranks] == [[(0, 0, 2), (0, 4, 6), (0, 8, 9)],
                                                     [(0, 2, 4), (0, 6, 8), (0, 9, 10)]]
    three = [EpochCursor(10, 2, rank=r, world_size=3, drop_last=False) for r in range(3)]
    assert [list(c.batches("x"))[-1] for c in three] == [(0, 6, 8), (0, 8, 10), (0, 10, 12)]
    assert [list(c.batches("x"))[0] for c in three] == [(1, 0, 2), (1, 2, 4), (1, 4, 6)]
    assert list(EpochCursor(1, 4, drop_last=False).batches("one")) == [(0, 0, 1)]
    with pytest.raises(ValueError, match="empty: 0 instances"):
        next(EpochCursor(0, 4, drop_last=False).batches("empty"))


def test_epoch_permutation_depends_on_the_seed_and_keys_only():
    a = epoch_permutation(50, 7, 1, 3)
    assert sorted(a) == list(range(50)) and np.array_equal(a, epoch_permutation(50, 7, 1, 3))
    assert not np.array_equal(a, epoch_permutation(50, 7, 2, 3))
    assert not np.array_equal(a, epoch_permutation(50, 8, 1, 3))


def test_ignore_index_is_the_losses():
    from bertforge.data.loader import IGNORE_INDEX
    from bertforge.model import losses

    assert IGNORE_INDEX == losses.IGNORE_INDEX == -100


def test_dynamic_masking_masks_afresh_each_epoch_and_deterministically(dynamic_dir):
    ds = PretrainingDataset(dynamic_dir)
    assert all(len(ds.shard(k).masked_positions) == 0 for k in range(len(ds.sizes)))  # nothing stored
    with pytest.raises(ValueError, match="special"):
        PretrainingLoader(ds, 8)
    a = loader(dynamic_dir, 1, seed=8, special=SPECIAL)
    masks = []
    for _ in range(2):
        per_instance = {}
        for b in a:
            (ids, num_a, pos, labels, nsl), = rows(b)
            orig = np.array(ids)
            orig[list(pos)] = labels
            key = (tuple(orig.tolist()), num_a, nsl)
            assert len(pos) == expected_mask_count(len(ids), 20)
            assert not np.isin(labels, [CLS, SEP]).any()
            per_instance.setdefault(key, []).append(pos)
        masks.append(per_instance)
    assert masks[0].keys() == masks[1].keys()
    unique = [k for k, v in masks[0].items() if len(v) == 1 and len(masks[1][k]) == 1]
    assert len(unique) > 300
    changed = sum(masks[0][k] != masks[1][k] for k in unique)
    assert changed > 0.8 * len(unique)  # fresh masks every epoch
    b = loader(dynamic_dir, 8, seed=8, special=SPECIAL)
    c = loader(dynamic_dir, 8, seed=8, special=SPECIAL)
    for _ in range(2):
        assert epoch_rows(b) == epoch_rows(c)  # but the same ones for the same seed and epoch


def test_no_nsp_batches_are_single_segments(packed_dir):
    ldr = loader(packed_dir, 8, seed=9)
    batches = list(ldr)
    assert len(batches) == len(ldr) > 5
    config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64)
    model = BertForPreTraining(config)
    for batch in batches:
        assert set(batch) == KEYS - {"next_sentence_label"}
        assert not batch["token_type_ids"].any()
        for ids, num_a, pos, labels, _ in rows(batch):
            assert num_a == len(ids) and SEP not in [l for l in labels]
            assert len(pos) == expected_mask_count(len(ids), 20)
    lengths = torch.cat([b["attention_mask"].sum(1) for b in batches])
    assert (lengths > MAX_SEQ - 12).float().mean() > 0.5  # packed up to the length
    loss = model(**batches[0]).loss
    assert torch.isfinite(loss) and abs(loss.item() - np.log(VOCAB_SIZE)) < 1.5  # MLM only


# ------------------------------------------------------------------------------ damaged or foreign data
def test_vocab_mismatch_is_refused(static_dir, tokenizer):
    PretrainingDataset(static_dir, vocab_hash=tokenizer.vocab_hash)  # the right one is fine
    with pytest.raises(ShardError, match="another vocab"):
        PretrainingDataset(static_dir, vocab_hash="0" * 64)
    manifest = json.loads((static_dir / "manifest.json").read_text())
    with pytest.raises(ShardError, match="another vocab"):
        read_shard(static_dir / manifest["shards"][0]["file"], vocab_hash="f" * 64)


@pytest.fixture
def copy(tmp_path, static_dir):
    target = tmp_path / "copy"
    shutil.copytree(static_dir, target)
    return target


def test_truncated_shard_is_an_error_on_access(copy):
    path = copy / "shard-00001.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    ds = PretrainingDataset(copy)  # the manifest is fine; the shard is read when needed
    ds.shard(0)
    with pytest.raises(ShardError, match="checksum"):
        ds.shard(1)
    with pytest.raises(ShardError, match="unreadable shard"):
        PretrainingDataset(copy, verify_checksums=False).shard(1)
    with pytest.raises(ShardError):
        for _ in loader(copy, 8, seed=0):
            pass
    path.write_bytes(data[:5])  # not even a header
    with pytest.raises(ShardError, match="unreadable shard"):
        PretrainingDataset(copy, verify_checksums=False).shard(1)


def test_corrupted_byte_fails_the_checksum(copy):
    path = copy / "shard-00002.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) - 7] ^= 0x01  # in the arrays, not the header: safetensors cannot notice
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="checksum"):
        PretrainingDataset(copy).shard(2)
    PretrainingDataset(copy, verify_checksums=False).shard(2)  # unverified, it would load


def test_incomplete_or_broken_manifest_is_an_error(tmp_path, corpus, tok_dir, copy):
    cfg = PrepareConfig(max_seq_length=MAX_SEQ, dupe_factor=1, shard_chars=8000)
    m = prepare([corpus], tmp_path / "half", tok_dir, cfg, num_shards=2, shard_index=1, progress=False)
    assert not m["complete"] and m["missing_shards"][:2] == [0, 2]
    with pytest.raises(ShardError, match=r"incomplete: shards \[0, 2"):
        PretrainingDataset(tmp_path / "half")
    with pytest.raises(ShardError, match="no manifest.json"):
        PretrainingDataset(tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][1]["instances"] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="manifest says"):
        PretrainingDataset(copy, verify_checksums=False).shard(1)
    (copy / "shard-00003.safetensors").unlink()
    with pytest.raises(ShardError, match="missing"):
        PretrainingDataset(copy).shard(3)
    (copy / "manifest.json").write_text(json.dumps(manifest)[:-20])
    with pytest.raises(ShardError, match="corrupt manifest"):
        PretrainingDataset(copy)


def test_data_of_another_normalisation_is_refused(static_dir, tokenizer):
    # The same vocab.txt read cased gives other ids for the same text: the data and the tokenizer must agree.
    assert json.loads((static_dir / "manifest.json").read_text())["normalization"] == tokenizer.normalization
    PretrainingDataset(static_dir, vocab_hash=tokenizer.vocab_hash, normalization=tokenizer.normalization)
    cased = {**tokenizer.normalization, "do_lower_case": False, "strip_accents": False}
    with pytest.raises(ShardError, match=r"normalization is do_lower_case=True, strip_accents=True.*"
                                         r"tokenizer has do_lower_case=False, strip_accents=False"):
        PretrainingDataset(static_dir, vocab_hash=tokenizer.vocab_hash, normalization=cased)


def test_check_files_finds_a_damaged_shard_before_reading_any(copy):
    ds = PretrainingDataset(copy)
    ds.check_files()  # intact
    manifest = json.loads((copy / "manifest.json").read_text())
    assert all(e["bytes"] == (copy / e["file"]).stat().st_size for e in manifest["shards"])
    last = copy / manifest["shards"][-1]["file"]
    data = bytearray(last.read_bytes())
    data[len(data) - 7] ^= 0x01  # same size, other contents
    last.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{last.name}: contents differ from the manifest's SHA-256"):
        PretrainingDataset(copy).check_files()
    PretrainingDataset(copy, verify_checksums=False).check_files()  # sizes only
    last.write_bytes(bytes(data[:-100]))
    with pytest.raises(ShardError, match=rf"{last.name}: {len(data) - 100:,} bytes, the manifest says {len(data):,}"):
        PretrainingDataset(copy, verify_checksums=False).check_files()
    last.unlink()
    with pytest.raises(ShardError, match=rf"{last.name}: shard file missing"):
        PretrainingDataset(copy).check_files()


@pytest.mark.parametrize("damage, message", [
    (lambda m: m.pop("vocab_hash"), r"vocab_hash is missing"),
    (lambda m: m["config"].pop("nsp"), r"config\.nsp is missing"),
    (lambda m: m["shards"][2].pop("sha256"), r"shards\[2\]\.sha256 is missing"),
    (lambda m: m["config"].update(max_seq_length=32.0), r"config\.max_seq_length must be a whole number, got 32\.0"),
    (lambda m: m["totals"].pop("instances"), r"totals\.instances is missing"),
])
def test_a_manifest_missing_keys_is_one_error_naming_file_and_key(damage, message, copy, capsys):
    from bertforge.cli import main

    manifest = json.loads((copy / "manifest.json").read_text())
    damage(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match=rf"manifest\.json: {message}"):
        PretrainingDataset(copy)
    assert main(["prepare", "--stats", str(copy)]) == 2  # not a KeyError traceback
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json" in err and "Traceback" not in err


def test_a_masking_setting_remasks_static_data_afresh_each_epoch_at_its_rate(static_dir):
    """Statically masked instances get their original tokens back, then fresh masks at the given rate
    every epoch; the same seed gives the same masks."""
    from bertforge.data.instances import MaskingConfig

    ds = PretrainingDataset(static_dir)
    originals = {}
    for k in range(len(ds.sizes)):
        for inst in ds.shard(k).instances():
            ids = inst.input_ids.copy()
            ids[inst.masked_positions] = inst.masked_labels
            originals[(tuple(ids.tolist()), inst.num_a, int(inst.is_random_next))] = 0
    masking = MaskingConfig(0.4, 60)
    with pytest.raises(ValueError, match="special"):
        PretrainingLoader(ds, 8, masking=masking)
    a = loader(static_dir, 1, seed=3, special=SPECIAL, masking=masking)
    masks = []
    for _ in range(2):
        per_instance = {}
        for b in a:
            assert b["masked_positions"].shape[1] == 60  # the setting's slots, not the data's 20
            (ids, num_a, pos, labels, nsl), = rows(b)
            orig = np.array(ids)
            orig[list(pos)] = labels
            key = (tuple(orig.tolist()), num_a, nsl)
            assert key in originals  # the static masks were undone before masking again
            assert len(pos) == expected_mask_count(len(ids), 60, prob=0.4)
            per_instance.setdefault(key, []).append(pos)
        masks.append(per_instance)
    assert masks[0].keys() == masks[1].keys() == originals.keys()
    unique = [k for k, v in masks[0].items() if len(v) == 1 and len(masks[1][k]) == 1]
    assert sum(masks[0][k] != masks[1][k] for k in unique) > 0.8 * len(unique)  # fresh masks every epoch
    b = loader(static_dir, 8, seed=3, special=SPECIAL, masking=masking)
    c = loader(static_dir, 8, seed=3, special=SPECIAL, masking=masking)
    assert epoch_rows(b) == epoch_rows(c)
