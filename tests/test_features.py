"""Feature extraction (`bertforge features`) on a tiny checkpoint with the test vocab.

Token vectors equal transformers' ``BertModel`` hidden states on the same weights; concat / sum and
the layer indexes; Google's JSONL layout; .npy / .safetensors files equal the in-memory result;
long inputs cut into windows with each token from its max-context window (checked against separate
transformers passes over every window, and against one full pass on a model without context);
CLS / mean pooling; input reading (Google's ``|||`` pairs, blank lines, stdin, invalid UTF-8); the
errors and the CLI.
"""

from __future__ import annotations

import gzip
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from data_fixtures import VOCAB_SIZE, write_tokenizer
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models
from safetensors import safe_open

from bertforge import cli
from bertforge.serving import features
from bertforge.model.config import BertConfig
from bertforge.serving.features import (BertModelWithoutPooler, embed, extract_features, read_inputs, split_pair,
                                        write_features)
from bertforge.model.heads import BertForPreTraining
from bertforge.text.tokenizer import BertTokenizer
from bertforge.serving.predictor import Predictor

H, L = 32, 4
TEXTS = ["the old house by the river", ("a small tree", "the long road to the city"), "",
         "walking and talking , they climbed the green mountain", ("yes", "no")]


def _checkpoint(folder: Path, **overrides) -> Path:
    config = BertConfig(vocab_size=VOCAB_SIZE, hidden_size=H, num_hidden_layers=L, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, initializer_range=0.2, **overrides)
    BertForPreTraining(config).save_pretrained(folder)
    return write_tokenizer(folder)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return _checkpoint(tmp_path_factory.mktemp("features") / "model")


@pytest.fixture(scope="module")
def tok(ckpt) -> BertTokenizer:
    return BertTokenizer.from_pretrained(ckpt)


@pytest.fixture(scope="module")
def hf(ckpt) -> transformers.BertModel:
    return transformers.BertModel.from_pretrained(ckpt).eval()


def hidden(hf, tok, text) -> tuple[list[int], tuple[torch.Tensor, ...]]:
    """transformers' token ids and L + 1 hidden states (T, H) of one input, alone in its batch."""
    a, b = (text, None) if isinstance(text, str) else text
    enc = tok(a, b, return_tensors="pt")
    with torch.no_grad():
        states = hf(**enc, output_hidden_states=True).hidden_states
    return enc["input_ids"][0].tolist(), tuple(h[0] for h in states)


def run_hf(hf, ids: list[int], types: list[int]) -> tuple[torch.Tensor, ...]:
    """Hidden states (T, H) of one window given by its ids and segments."""
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]), output_hidden_states=True)
    return tuple(h[0] for h in out.hidden_states)


def close(a, b, atol=1e-5) -> None:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert np.abs(a - b).max() <= atol, np.abs(a - b).max()


# ---------------------------------------------------------------------------- values
def test_token_vectors_equal_transformers_hidden_states(ckpt, tok, hf):
    got = extract_features(ckpt, TEXTS, batch_size=3)  # padded batches of mixed lengths
    assert got.layers == (-1, -2, -3, -4) and got.values.shape[1] == 4 * H and len(got) == len(TEXTS)
    for i, text in enumerate(TEXTS):
        ids, states = hidden(hf, tok, text)
        assert got.token_ids[got.offsets[i]:got.offsets[i + 1]].tolist() == ids
        close(got[i], torch.cat([states[k] for k in (-1, -2, -3, -4)], -1))

    # Index 0 is the embedding output, positive indexes the layers, in the order given.
    got = extract_features(ckpt, TEXTS[:2], layers=(0, 2, -4))
    for i, text in enumerate(TEXTS[:2]):
        _, states = hidden(hf, tok, text)
        close(got[i], torch.cat([states[0], states[2], states[1]], -1))


def test_sum_adds_the_layers_concat_puts_them_side_by_side(ckpt):
    cat = extract_features(ckpt, TEXTS)
    total = extract_features(ckpt, TEXTS, combine="sum")
    assert cat.values.shape == (cat.num_tokens, 4 * H) and total.values.shape == (cat.num_tokens, H)
    blocks = cat.values.reshape(-1, 4, H)
    close(total.values, blocks.sum(1))
    assert np.abs(total.values - blocks[:, 0]).max() > 0.1  # not just the last layer

    bf16 = extract_features(ckpt, TEXTS, combine="sum", precision="bf16")
    diff = np.abs(bf16.values - total.values).max()
    assert 0 < diff < 0.3, diff  # autocast ran, and bf16 rounding stays small


# ---------------------------------------------------------------------------- files
def test_jsonl_is_the_layout_of_googles_extract_features(ckpt, tok, tmp_path):
    got = extract_features(ckpt, TEXTS, layers=(-1, -2))
    write_features(ckpt, TEXTS, tmp_path / "f.jsonl", layers=(-1, -2))
    lines = (tmp_path / "f.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(TEXTS)
    for i, line in enumerate(lines):
        record = json.loads(line)
        assert list(record) == ["linex_index", "features"] and record["linex_index"] == i
        ids = got.token_ids[got.offsets[i]:got.offsets[i + 1]].tolist()
        assert [f["token"] for f in record["features"]] == tok.convert_ids_to_tokens(ids)
        assert record["features"][0]["token"] == "[CLS]" and record["features"][-1]["token"] == "[SEP]"
        for feature, row in zip(record["features"], got[i]):
            assert list(feature) == ["token", "layers"]
            assert [list(e) for e in feature["layers"]] == [["index", "values"]] * 2
            assert [e["index"] for e in feature["layers"]] == [-1, -2]
            assert feature["layers"][0]["values"] == [round(float(x), 6) for x in row[:H]]
            assert feature["layers"][1]["values"] == [round(float(x), 6) for x in row[H:]]

    write_features(ckpt, TEXTS[:1], tmp_path / "sum.jsonl", layers=(-1, -2), combine="sum")
    entry = json.loads((tmp_path / "sum.jsonl").read_text())["features"][1]["layers"]
    assert len(entry) == 1 and entry[0]["index"] == [-1, -2] and len(entry[0]["values"]) == H

    write_features(ckpt, TEXTS, tmp_path / "mean.jsonl", pooling="mean")
    pooled = extract_features(ckpt, TEXTS, pooling="mean")
    records = [json.loads(x) for x in (tmp_path / "mean.jsonl").read_text().splitlines()]
    assert [list(r) for r in records] == [["linex_index", "pooling", "layers", "values"]] * len(TEXTS)
    assert records[3]["layers"] == [-1] and records[3]["values"] == [round(float(x), 6) for x in pooled[3]]


@pytest.mark.parametrize("pooling", [None, "cls"])
def test_npy_and_safetensors_hold_the_in_memory_result(ckpt, tmp_path, pooling):
    got = extract_features(ckpt, TEXTS, pooling=pooling, layers=(-1, -3))
    write_features(ckpt, TEXTS, tmp_path / "f.npy", pooling=pooling, layers=(-1, -3))
    write_features(ckpt, TEXTS, tmp_path / "f.safetensors", pooling=pooling, layers=(-1, -3))
    npy = np.load(tmp_path / "f.npy", mmap_mode="r")
    assert npy.dtype == np.float32 and np.array_equal(npy, got.values)
    with safe_open(tmp_path / "f.safetensors", "np") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    assert np.array_equal(tensors["features"], got.values)
    assert meta["layers"] == "-1,-3" and meta["combine"] == "concat" and meta["pooling"] == (pooling or "none")
    if pooling:
        assert got.values.shape == (len(TEXTS), 2 * H) and set(tensors) == {"features"}
        assert not (tmp_path / "f.offsets.npy").exists()
        return
    offsets, token_ids = np.load(tmp_path / "f.offsets.npy"), np.load(tmp_path / "f.token_ids.npy")
    assert np.array_equal(offsets, got.offsets) and np.array_equal(token_ids, got.token_ids)
    assert np.array_equal(tensors["offsets"], got.offsets) and np.array_equal(tensors["token_ids"], got.token_ids)
    assert offsets[-1] == len(npy) == got.num_tokens and token_ids.dtype == np.int32


def test_memory_is_bounded_by_chunks_of_inputs(ckpt, monkeypatch):
    whole = extract_features(ckpt, TEXTS * 3, max_seq_length=12)
    monkeypatch.setattr(features, "_CHUNK_BYTES", 1)  # every input a chunk of its own
    alone = extract_features(ckpt, TEXTS * 3, max_seq_length=12)
    assert np.array_equal(alone.offsets, whole.offsets) and np.array_equal(alone.token_ids, whole.token_ids)
    close(alone.values, whole.values)


# ---------------------------------------------------------------------------- long inputs
LONG = " ".join(["the old house by the river"] * 4 + ["walking"])  # 26 tokens (walk ##ing) + [CLS] / [SEP]


def test_long_text_takes_each_token_from_its_max_context_window(ckpt, tok, hf):
    full, _ = hidden(hf, tok, LONG)
    content = full[1:-1]
    got = extract_features(ckpt, [LONG], max_seq_length=12, layers=(-1,))
    assert got.token_ids.tolist() == full  # nothing cut off
    room, stride = 10, 5
    starts = list(range(0, len(content) - room + stride, stride))
    assert starts[-1] + room >= len(content) > starts[-2] + room
    windows = [run_hf(hf, [full[0], *content[s:s + room], full[-1]], [0] * (min(room, len(content) - s) + 2))[-1]
               for s in starts]
    close(got.values[0], windows[0][0])  # [CLS] from the first window
    close(got.values[-1], windows[-1][-1])  # the final [SEP] from the last
    owners = []
    for j in range(len(content)):
        scores = []
        for s in starts:
            n = min(room, len(content) - s)
            scores.append(min(j - s, s + n - 1 - j) + 0.01 * n if s <= j < s + n else -1.0)
        k = int(np.argmax(scores))  # the first of the best
        owners.append(k)
        close(got.values[1 + j], windows[k][1 + j - starts[k]])
    assert len(set(owners)) == len(starts)  # every window supplies some tokens

    # A shorter stride: more windows, the same tokens.
    again = extract_features(ckpt, [LONG], max_seq_length=12, stride=2, layers=(-1,))
    assert again.token_ids.tolist() == full and np.abs(again.values - got.values).max() > 0


def test_long_pair_keeps_its_shorter_segment_in_every_window(ckpt, tok, hf):
    pair = ("a small tree", LONG)
    full, _ = hidden(hf, tok, pair)
    got = extract_features(ckpt, [pair], max_seq_length=16, layers=(-1,))
    assert got.token_ids.tolist() == full
    n_a = len(tok.tokenize(pair[0])) + 2  # [CLS] a [SEP]
    room = 16 - n_a - 1
    first = full[:n_a + room] + full[-1:]
    states = run_hf(hf, first, [0] * n_a + [1] * (room + 1))[-1]
    close(got.values[:n_a + 1], states[:n_a + 1])  # [CLS] a [SEP] and b's first token from the first window

    with pytest.raises(ValueError, match="shorter segment is longer than half a window"):
        extract_features(ckpt, [(LONG, LONG)], max_seq_length=16)


def test_windows_equal_one_pass_on_a_model_without_context(tmp_path):
    """With value weights and position embeddings zero, a token's vector depends on its id and segment
    alone; then every windowed token must equal the one-pass vector at the same place."""
    torch.manual_seed(1)
    folder = _checkpoint(tmp_path / "no_context")
    model = BertForPreTraining.from_pretrained(folder)
    with torch.no_grad():
        model.bert.embeddings.position_embeddings.weight.zero_()
        for layer in model.bert.encoder.layer:
            layer.attention.self.value.weight.zero_()
    model.save_pretrained(folder)
    texts = [LONG, ("a small tree", LONG), (LONG, "no"), "the river"]
    one = extract_features(folder, texts, max_seq_length=64)
    windowed = extract_features(folder, texts, max_seq_length=12, batch_size=4)
    assert windowed.windowed == 3 and one.windowed == 0
    assert np.array_equal(windowed.offsets, one.offsets) and np.array_equal(windowed.token_ids, one.token_ids)
    close(windowed.values, one.values)


# ---------------------------------------------------------------------------- pooling
def test_pooling_cls_and_mean(ckpt, tok, hf):
    cls = extract_features(ckpt, TEXTS, pooling="cls", batch_size=2)
    mean = extract_features(ckpt, TEXTS, pooling="mean", batch_size=2)
    assert cls.values.shape == mean.values.shape == (len(TEXTS), H) and cls.offsets is None
    for i, text in enumerate(TEXTS):
        _, states = hidden(hf, tok, text)
        close(cls[i], states[-1][0])
        close(mean[i], states[-1].mean(0))
    two = extract_features(ckpt, TEXTS, pooling="mean", layers=(-1, -2))
    per_token = extract_features(ckpt, TEXTS, layers=(-1, -2))
    assert two.values.shape == (len(TEXTS), 2 * H)
    close(two.values, np.stack([per_token[i].mean(0) for i in range(len(TEXTS))]))
    # A windowed input: the mean over its stitched tokens, [CLS] from the first window.
    long_mean = extract_features(ckpt, [LONG], pooling="mean", max_seq_length=12)
    long_tokens = extract_features(ckpt, [LONG], layers=(-1,), max_seq_length=12)
    close(long_mean[0], long_tokens[0].mean(0))



def test_pooling_pooler_is_transformers_pooler_output_and_needs_a_trained_pooler(ckpt, tok, hf, tmp_path):
    """pooler: the trained pooler's output, transformers' pooler_output (its [CLS]); the names features,
    predict and serve take are one set; a checkpoint without a trained pooler, or other layers, are refused."""
    pooled = extract_features(ckpt, TEXTS, pooling="pooler", batch_size=2)
    assert pooled.values.shape == (len(TEXTS), H) and pooled.pooling == "pooler"
    for i, text in enumerate(TEXTS):
        a, b = (text, None) if isinstance(text, str) else text
        with torch.no_grad():
            close(pooled[i], hf(**tok(a, b, return_tensors="pt")).pooler_output[0])
    served = Predictor.from_pretrained(ckpt, head="embeddings").embed(TEXTS, pooling="pooler")
    np.testing.assert_allclose(served, pooled.values, atol=1e-5)
    with pytest.raises(ValueError, match="pooling pooler reads the last layer, not layers -1,-2"):
        extract_features(ckpt, TEXTS, pooling="pooler", layers=(-1, -2))
    bare = tmp_path / "no-pooler"
    BertModelWithoutPooler.from_pretrained(ckpt).save_pretrained(bare)
    write_tokenizer(bare)
    with pytest.raises(ValueError, match="no-pooler has no trained pooler; use pooling mean or cls"):
        extract_features(bare, TEXTS, pooling="pooler")


# ---------------------------------------------------------------------------- input and errors
def test_embed_pools_a_loaded_model_as_extract_features_does(ckpt, tok):
    model = BertModelWithoutPooler.from_pretrained(ckpt).eval()
    for pooling, layers, combine in (("mean", (-1,), "concat"), ("cls", (-1, -2), "concat"), ("mean", (0, 2), "sum")):
        want = extract_features(ckpt, TEXTS, pooling=pooling, layers=layers, combine=combine, max_seq_length=10,
                                stride=3)  # long texts in windows
        got = embed(model, tok, TEXTS, pooling=pooling, layers=layers, combine=combine, max_seq_length=10, stride=3,
                    batch_size=2)
        assert got.shape == want.values.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want.values, atol=1e-5)
    with pytest.raises(ValueError, match="pooling must be one of"):
        embed(model, tok, TEXTS, pooling="max")
    with pytest.raises(ValueError, match="precision must be one of"):
        embed(model, tok, TEXTS, precision="fp8")


def test_precision_auto_resolves_for_the_device(ckpt, monkeypatch):
    monkeypatch.setattr("bertforge.train.precision.native_bf16", lambda device: False)
    assert np.array_equal(extract_features(ckpt, TEXTS, precision="auto").values, extract_features(ckpt, TEXTS).values)
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        extract_features(ckpt, TEXTS, device="cpu", precision="fp16")


def test_read_inputs_as_google_reads_them(tmp_path, monkeypatch):
    assert split_pair("  Who is it ? ||| It is me .\n") == ("Who is it ?", "It is me .")
    assert split_pair("a ||| b ||| c") == ("a ||| b", "c")  # the TF regex is greedy: the last separator
    assert split_pair("a|||b") == ("a|||b", None) and split_pair("ends with |||\n") == ("ends with |||", None)
    path = tmp_path / "in.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\ufefffirst line\n\nsecond ||| pair\n")
    assert read_inputs(path) == [("first line", None), ("", None), ("second", "pair")]

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("x ||| y\nnaïve\n".encode())))
    assert read_inputs("-") == [("x", "y"), ("naïve", None)]

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nbroken \xff here\n")
    with pytest.raises(ValueError, match=r"bad\.txt, line 2: invalid UTF-8"):
        read_inputs(bad)
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ValueError, match="empty"):
        read_inputs(tmp_path / "empty.txt")


@pytest.mark.parametrize("kwargs, message", [
    (dict(layers=(-1, 5)), "layer 5 does not exist: the model has 4 layers"),
    (dict(layers=(-6,)), "layer -6 does not exist: the model has 4 layers"),
    (dict(layers=(-1, 4)), "chosen twice"),
    (dict(layers=()), "no layers"),
    (dict(combine="mean"), "combine must be one of concat, sum"),
    (dict(pooling="max"), "pooling must be one of mean, cls, pooler, got .max."),
    (dict(max_seq_length=100), "exceeds the model's 64 positions"),
    (dict(max_seq_length=12, stride=11), "stride 11 is longer than a window"),
    (dict(precision="fp8"), "precision must be one of"),
])
def test_clear_errors(ckpt, kwargs, message):
    with pytest.raises(ValueError, match=message):
        extract_features(ckpt, [LONG], **kwargs)


def test_empty_input_and_unknown_suffix_are_errors(ckpt, tmp_path):
    with pytest.raises(ValueError, match="no texts"):
        extract_features(ckpt, [])
    with pytest.raises(ValueError, match=r"unknown output format '\.csv'.*\.jsonl.*\.npy.*\.safetensors"):
        write_features(ckpt, TEXTS, tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists()


# ---------------------------------------------------------------------------- CLI
def test_cli_features(ckpt, tok, tmp_path, capsys):
    assert "features" in cli.COMMANDS
    src = tmp_path / "in.txt"
    src.write_text("the old house\na small tree ||| the long road\n\n" + LONG + "\n", encoding="utf-8")
    out = tmp_path / "f.jsonl"
    args = ["features", str(ckpt), str(src), "--out", str(out), "--max-seq-length", "12", "--no-progress"]
    assert cli.main(args + ["--layers", "-1,-2", "--combine", "sum"]) == 0
    assert "wrote 4 inputs" in capsys.readouterr().out
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["linex_index"] for r in records] == [0, 1, 2, 3]
    assert [f["token"] for f in records[2]["features"]] == ["[CLS]", "[SEP]"]  # the blank line
    assert records[0]["features"][0]["layers"][0]["index"] == [-1, -2]
    assert len(records[3]["features"]) == len(tok.tokenize(LONG)) + 2 > 12  # windows, not truncation

    emb = tmp_path / "emb.npy"
    assert cli.main(["features", str(ckpt), str(src), "--out", str(emb), "--pooling", "mean", "--precision", "bf16"]) == 0
    assert np.load(emb).shape == (4, H)
    assert "features" in capsys.readouterr().err  # the progress bar

    assert cli.main(args + ["--layers", "-9"]) == 2
    assert "the model has 4 layers" in capsys.readouterr().err
    assert cli.main(["features", str(ckpt), str(src), "--out", str(tmp_path / "f.txt")]) == 2
    assert "unknown output format" in capsys.readouterr().err
