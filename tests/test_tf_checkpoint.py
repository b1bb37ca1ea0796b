"""Google's TF checkpoints without TensorFlow: the reader against what TensorFlow read (the fixtures of
tests/fixtures/tf_bert_tiny, written by TensorFlow: see make_fixture.py there), the conversion
against a NumPy BERT computed from the TF variables with TF's conventions, transformers loading the
result, reported leftovers, and errors that name the file and the variable."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

import bertforge
from bertforge.convert import tf as tfc
from bertforge.convert.folders import convert
from bertforge.model.checkpoint import CheckpointError
from bertforge.cli import main
from bertforge.convert.tf import TFCheckpointReader, convert_tf_checkpoint, find_tf_checkpoint

FIXTURES = Path(__file__).parent / "fixtures" / "tf_bert_tiny"
PREFIXES = {"pretraining": "bert_model.ckpt", "classifier": "model.ckpt-3", "squad": "model.ckpt-2"}


def _expected(kind: str) -> dict[str, np.ndarray]:
    return load_file(FIXTURES / kind / "expected.safetensors")


def _copy(kind: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / kind, tmp_path / kind))


def _tf_config(kind: str) -> dict:
    return json.loads((FIXTURES / kind / "bert_config.json").read_text())


# ---------------------------------------------------------------------------- CRC-32C
def test_crc32c_known_values():
    # RFC 3720 (iSCSI) B.4 test vectors and the usual check value
    assert tfc.crc32c(b"123456789") == 0xE3069283
    assert tfc.crc32c(bytes(32)) == 0x8A9136AA
    assert tfc.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert tfc.crc32c(bytes(range(32))) == 0x46DD794E
    assert tfc.crc32c(b"") == 0
    assert tfc.masked_crc32c(b"") == 0xA282EAD8  # TF's mask of 0


def _bitwise_crc32c(data: bytes) -> int:
    """The definition, a bit at a time (reflected Castagnoli polynomial 0x82F63B78)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("size", [1, 7, 4096, 12_345])
def test_crc32c_of_every_buffer_kind_equals_the_definition(size, monkeypatch):
    monkeypatch.setattr(tfc, "_CRC_CHUNK", 1000)  # large buffers are hashed in pieces
    data = np.random.default_rng(size).integers(0, 256, size + 8, dtype=np.uint8)
    expected = _bitwise_crc32c(data[3:3 + size].tobytes())
    raw = data.tobytes()
    for buf in (raw[3:3 + size], bytearray(raw[3:3 + size]), memoryview(raw)[3:3 + size],
                memoryview(bytearray(raw))[3:3 + size], data[3:3 + size]):
        assert tfc.crc32c(buf) == expected, type(buf).__name__
    # a multi-byte array is hashed as its bytes in memory order, a strided one as its elements' bytes
    floats = np.random.default_rng(size).standard_normal(size, dtype=np.float32)
    assert tfc.crc32c(floats) == _bitwise_crc32c(floats.tobytes())
    assert tfc.crc32c(floats[::2]) == _bitwise_crc32c(floats[::2].tobytes())
    masked = tfc.masked_crc32c(raw[3:3 + size])
    assert ((masked - 0xA282EAD8) & 0xFFFFFFFF) == ((expected >> 15) | (expected << 17)) & 0xFFFFFFFF


# ---------------------------------------------------------------------------- the reader
@pytest.mark.parametrize("kind", PREFIXES)
def test_every_tensor_equals_what_tensorflow_read(kind):
    reader = TFCheckpointReader(FIXTURES / kind / PREFIXES[kind])
    expected = _expected(kind)
    assert list(reader.shapes) == sorted(expected)
    for name, value in expected.items():
        got = reader.read(name)
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert np.array_equal(got, value), name
    assert reader.num_shards == (2 if kind == "pretraining" else 1)
    assert reader.read("global_step").dtype == np.int64


def test_find_tf_checkpoint(tmp_path):
    pre = FIXTURES / "pretraining"
    assert find_tf_checkpoint(pre) == pre / "bert_model.ckpt"
    assert find_tf_checkpoint(pre / "bert_model.ckpt") == pre / "bert_model.ckpt"
    assert find_tf_checkpoint(pre / "bert_model.ckpt.index") == pre / "bert_model.ckpt"
    assert find_tf_checkpoint(pre / "bert_model.ckpt.data-00001-of-00002") == pre / "bert_model.ckpt"
    assert find_tf_checkpoint(pre / "vocab.txt") is None
    assert find_tf_checkpoint(tmp_path) is None

    folder = _copy("classifier", tmp_path)  # run_classifier's output: several checkpoints + "checkpoint"
    for suffix in (".index", ".data-00000-of-00001"):
        shutil.copy(folder / f"model.ckpt-3{suffix}", folder / f"model.ckpt-1{suffix}")
    assert find_tf_checkpoint(folder) == folder / "model.ckpt-3"
    (folder / "checkpoint").write_text('model_checkpoint_path: "/elsewhere/model.ckpt-1"\n')  # a moved run
    assert find_tf_checkpoint(folder) == folder / "model.ckpt-1"
    (folder / "checkpoint").unlink()
    with pytest.raises(CheckpointError, match=r"several TensorFlow checkpoints \(model.ckpt-1, model.ckpt-3\)"):
        find_tf_checkpoint(folder)

    bertforge.BertModel(bertforge.BertConfig.preset("tiny", vocab_size=20)).save_pretrained(folder)
    assert find_tf_checkpoint(folder) is None  # a folder of bertforge weights is read as such


def test_names_both_ways():
    config = bertforge.BertConfig(**{**_tf_config("pretraining"), "hidden_act": "gelu_new"})
    tf_names = {n for n in _expected("pretraining") if not tfc._is_training_state(n)}
    ours = bertforge.BertForPreTraining(config).state_dict()
    assert {tfc.google_name(k) for k in ours} == tf_names
    for key, value in ours.items():
        tf_name = tfc.google_name(key)
        assert tfc.bertforge_name(tf_name) == (key, tf_name.endswith("/kernel"))
    for key in ("classifier.weight", "qa_outputs.bias"):
        assert tfc.bertforge_name(tfc.google_name(key)) == (key, False)
    assert tfc.google_name("classifier.weight") == "output_weights"
    assert tfc.google_name("qa_outputs.bias") == "cls/squad/output_bias"
    assert tfc.bertforge_name("bert/encoder/layer_0/attention/self/query/kernel/adam_m") is None
    assert tfc.bertforge_name("bert/encoder/layer_0/attention/self/query/weights") is None


# ---------------------------------------------------------------------------- a NumPy BERT on the TF variables
def _tf_bert(w: dict[str, np.ndarray], cfg: dict, ids: np.ndarray, types: np.ndarray, mask: np.ndarray):
    """google-research/bert's forward pass in float64, straight from the TF variables: x @ kernel,
    heads' output_weights transposed, gelu's tanh form, attention bias -10000 on padding keys."""
    w = {k: v.astype(np.float64) for k, v in w.items()}

    def dense(x, scope):
        return x @ w[f"{scope}/kernel"] + w[f"{scope}/bias"]

    def layer_norm(x, scope):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * w[f"{scope}/gamma"] + w[f"{scope}/beta"]

    def gelu(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

    B, T = ids.shape
    H, A = cfg["hidden_size"], cfg["num_attention_heads"]
    x = (w["bert/embeddings/word_embeddings"][ids] + w["bert/embeddings/token_type_embeddings"][types]
         + w["bert/embeddings/position_embeddings"][:T])
    x = layer_norm(x, "bert/embeddings/LayerNorm")
    for i in range(cfg["num_hidden_layers"]):
        s = f"bert/encoder/layer_{i}"
        q, k, v = (dense(x, f"{s}/attention/self/{n}").reshape(B, T, A, H // A).transpose(0, 2, 1, 3)
                   for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(H // A) + (1.0 - mask[:, None, None, :]) * -10000.0
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
        x = layer_norm(dense(context, f"{s}/attention/output/dense") + x, f"{s}/attention/output/LayerNorm")
        x = layer_norm(dense(gelu(dense(x, f"{s}/intermediate/dense")), f"{s}/output/dense") + x,
                       f"{s}/output/LayerNorm")
    pooled = np.tanh(dense(x[:, 0], "bert/pooler/dense"))
    out = {"sequence": x, "pooled": pooled}
    if "cls/predictions/output_bias" in w:
        h = layer_norm(gelu(dense(x, "cls/predictions/transform/dense")), "cls/predictions/transform/LayerNorm")
        out["mlm"] = h @ w["bert/embeddings/word_embeddings"].T + w["cls/predictions/output_bias"]
        out["nsp"] = pooled @ w["cls/seq_relationship/output_weights"].T + w["cls/seq_relationship/output_bias"]
    if "output_weights" in w:
        out["classifier"] = pooled @ w["output_weights"].T + w["output_bias"]
    if "cls/squad/output_weights" in w:
        out["squad"] = x @ w["cls/squad/output_weights"].T + w["cls/squad/output_bias"]
    return out


def _batch(cfg: dict, lengths=(9, 6)) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    T = max(lengths)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(1, cfg["vocab_size"], (len(lengths), T), generator=g) * mask
    types = torch.randint(0, 2, (len(lengths), T), generator=g) * mask
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types)


def _reference(kind: str, batch) -> dict[str, torch.Tensor]:
    out = _tf_bert(_expected(kind), _tf_config(kind), *(batch[k].numpy() for k in
                                                        ("input_ids", "token_type_ids", "attention_mask")))
    return {k: torch.from_numpy(v).float() for k, v in out.items()}


def _check(got: torch.Tensor, want: torch.Tensor, mask: torch.Tensor | None = None, what: str = "") -> None:
    """Within 1e-5 of the float64 reference, relative to the logits' scale (up to about 18 here, where
    float32 alone differs by 1e-5; the erf form of gelu instead of TF's tanh form differs by 6e-3)."""
    if mask is not None:
        got, want = got[mask.bool()], want[mask.bool()]
    diff = (got - want).abs().max().item()
    assert diff <= 1e-5 * max(1.0, want.abs().max().item()), f"{what}: max abs diff {diff:.3g}"


def _run(model, batch):
    model.eval()
    with torch.no_grad():
        return model(**batch)


def test_converted_pretraining_checkpoint_computes_what_tf_variables_say(tmp_path):
    out = tmp_path / "converted"
    assert convert(FIXTURES / "pretraining", out) is bertforge.BertForPreTraining  # the public route
    batch = _batch(_tf_config("pretraining"))
    want = _reference("pretraining", batch)
    mask = batch["attention_mask"]

    ours = bertforge.BertForPreTraining.from_pretrained(out)
    assert ours.config.hidden_act == "gelu_new" and not ours.load_report.newly_initialized
    theirs = transformers.BertForPreTraining.from_pretrained(out)
    outputs = [_run(model, batch) for model in (ours, theirs)]
    for got, who in zip(outputs, ("bertforge", "transformers")):
        _check(got.prediction_logits, want["mlm"], mask, f"{who} MLM")
        _check(got.seq_relationship_logits, want["nsp"], what=f"{who} NSP")
    _check(outputs[0].prediction_logits, outputs[1].prediction_logits, mask, "bertforge vs transformers")

    tok = bertforge.BertTokenizer.from_pretrained(out)
    assert tok.do_lower_case and tok.vocab_size == 100
    assert json.loads((out / "tokenizer_config.json").read_text())["max_input_chars_per_word"] == 200


def test_training_state_and_unused_variables_are_reported(tmp_path, caplog):
    expected = _expected("pretraining")
    with caplog.at_level(logging.INFO, logger="bertforge"):
        report = convert_tf_checkpoint(FIXTURES / "pretraining", tmp_path / "a")
    slots = sorted(n for n in expected if n.endswith(("/adam_m", "/adam_v")))
    assert len(slots) > 0 and report.training_state == sorted(slots + ["global_step"])
    assert report.unused == [] and report.newly_initialized == []
    assert len(report.converted) == len(expected) - len(report.training_state)
    assert report.converted["bert/encoder/layer_1/output/LayerNorm/gamma"] == "bert.encoder.layer.1.output.LayerNorm.weight"
    assert f"global_step and {len(slots)} optimizer slots" in caplog.text

    # as the bare encoder: the pre-training heads are left out, and named
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        report = convert_tf_checkpoint(FIXTURES / "pretraining", tmp_path / "b", model_class="BertModel")
    heads = sorted(n for n in expected if n.startswith("cls/") and not tfc._is_training_state(n))
    assert report.unused == heads and report.model_class == "BertModel"
    assert "cls/predictions/output_bias" in caplog.text
    model = bertforge.BertModel.from_pretrained(tmp_path / "b")
    batch = _batch(_tf_config("pretraining"))
    want = _reference("pretraining", batch)
    _check(_run(model, batch).pooler_output, want["pooled"], what="pooled")

    # as a classifier: a fresh head, reported
    report = convert_tf_checkpoint(FIXTURES / "pretraining", tmp_path / "c", model_class="BertForSequenceClassification")
    assert report.newly_initialized == ["classifier.weight", "classifier.bias"]


def test_run_classifier_checkpoint(tmp_path):
    report = convert_tf_checkpoint(FIXTURES / "classifier", tmp_path / "out")  # the folder: "checkpoint" names ckpt-3
    assert report.checkpoint == FIXTURES / "classifier" / "model.ckpt-3"
    assert report.model_class == "BertForSequenceClassification" and report.unused == []
    assert report.do_lower_case is False  # the vocab is cased
    batch = _batch(_tf_config("classifier"), lengths=(7, 4, 7))
    want = _reference("classifier", batch)
    ours = bertforge.BertForSequenceClassification.from_pretrained(tmp_path / "out")
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "out")
    assert ours.config.num_labels == theirs.config.num_labels == 3
    for model in (ours, theirs):
        _check(_run(model, batch).logits, want["classifier"], what=type(model).__module__)
    assert not bertforge.BertTokenizer.from_pretrained(tmp_path / "out").do_lower_case


def test_run_squad_checkpoint(tmp_path):
    report = convert_tf_checkpoint(FIXTURES / "squad", tmp_path / "out")
    assert report.model_class == "BertForQuestionAnswering"
    assert report.unused == ["bert/pooler/dense/bias", "bert/pooler/dense/kernel"]  # the QA head has no pooler
    batch = _batch(_tf_config("squad"), lengths=(7, 5))
    want = _reference("squad", batch)
    mask = batch["attention_mask"]
    ours = bertforge.BertForQuestionAnswering.from_pretrained(tmp_path / "out")
    theirs = transformers.BertForQuestionAnswering.from_pretrained(tmp_path / "out")
    for model in (ours, theirs):
        out = _run(model, batch)
        _check(out.start_logits, want["squad"][..., 0], mask, f"{type(model).__module__} start")
        _check(out.end_logits, want["squad"][..., 1], mask, f"{type(model).__module__} end")


def test_cli_converts_a_tf_folder(tmp_path, capsys):
    assert main(["convert", str(FIXTURES / "pretraining"), str(tmp_path / "out")]) == 0
    assert "as BertForPreTraining" in capsys.readouterr().out
    model = bertforge.BertForPreTraining.from_pretrained(tmp_path / "out")
    assert torch.equal(model.bert.pooler.dense.weight,
                       torch.from_numpy(_expected("pretraining")["bert/pooler/dense/kernel"]).T)

    folder = _copy("pretraining", tmp_path)
    (folder / "bert_model.ckpt.data-00001-of-00002").unlink()
    assert main(["convert", str(folder), str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert "bert_model.ckpt.data-00001-of-00002" in err and "missing" in err


# ---------------------------------------------------------------------------- errors name file and variable
def test_truncated_data_file(tmp_path):
    folder = _copy("pretraining", tmp_path)
    data = folder / "bert_model.ckpt.data-00000-of-00002"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(CheckpointError) as e:
        convert(folder, tmp_path / "out")
    message = str(e.value)
    assert str(data) in message and "truncated" in message
    assert re.search(r"truncated: (bert|cls)/\S+ is bytes", message), message
    assert not (tmp_path / "out").exists()


def test_corrupted_byte_fails_the_checksum(tmp_path):
    folder = _copy("pretraining", tmp_path)
    entry = TFCheckpointReader(folder / "bert_model.ckpt").entries["bert/pooler/dense/kernel"]
    data = folder / f"bert_model.ckpt.data-{entry.shard:05d}-of-00002"
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 17] ^= 0x01  # one bit of one float
    data.write_bytes(raw)
    reader = TFCheckpointReader(folder / "bert_model.ckpt")
    reader.read("bert/pooler/dense/bias")  # its neighbours still read
    with pytest.raises(CheckpointError, match=f"{re.escape(str(data))}: checksum mismatch for bert/pooler/dense/kernel"):
        reader.read("bert/pooler/dense/kernel")
    with pytest.raises(CheckpointError, match="checksum mismatch for bert/pooler/dense/kernel"):
        convert(folder, tmp_path / "out")


def test_missing_shard(tmp_path):
    folder = _copy("pretraining", tmp_path)
    (folder / "bert_model.ckpt.data-00001-of-00002").unlink()
    with pytest.raises(CheckpointError, match=r"shard files missing \(the index lists 2\): .*data-00001-of-00002"):
        convert(folder, tmp_path / "out")


@pytest.mark.parametrize("change, message", [
    ({"intermediate_size": 36}, r"bert/encoder/layer_0/intermediate/dense/bias is \[37\], the config gives \[36\]"),
    ({"hidden_size": 48, "num_attention_heads": 2}, r"bert/embeddings/LayerNorm/beta is \[32\], the config gives \[48\]"),
    ({"vocab_size": 120}, r"bert/embeddings/word_embeddings is \[100, 32\], the config gives \[120, 32\]"),
    ({"num_hidden_layers": 1}, r"encoder variables .*bert_config.json does not describe .*bert/encoder/layer_1/"),
    ({"num_hidden_layers": 3}, r"not in the checkpoint: bert/encoder/layer_2/attention/self/query/kernel"),
    ({"hidden_act": "tanh"}, r"bert_config.json: hidden_act 'tanh'"),
])
def test_config_that_does_not_fit_the_weights(change, message, tmp_path):
    folder = _copy("pretraining", tmp_path)
    (folder / "bert_config.json").write_text(json.dumps({**_tf_config("pretraining"), **change}))
    with pytest.raises(CheckpointError, match=message) as e:
        convert(folder, tmp_path / "out")
    assert "bert_config.json" in str(e.value) or "bert_model.ckpt.index" in str(e.value)


def test_no_config(tmp_path):
    folder = _copy("squad", tmp_path)
    (folder / "bert_config.json").unlink()
    with pytest.raises(CheckpointError, match="no bert_config.json beside the checkpoint"):
        convert(folder, tmp_path / "out")


def _first_data_block(index: bytes) -> tuple[int, int]:
    footer = index[-48:]
    _, pos = tfc._varint(footer, 0, "")
    _, pos = tfc._varint(footer, pos, "")
    index_block = tfc._block(index, footer[pos:], Path("x"))
    handle = next(tfc._block_entries(index_block, Path("x")))[1]
    offset, pos = tfc._varint(handle, 0, "")
    return offset, tfc._varint(handle, pos, "")[0]


def test_corrupt_truncated_or_compressed_index(tmp_path):
    folder = _copy("squad", tmp_path)
    index = folder / "model.ckpt-2.index"
    good = index.read_bytes()

    raw = bytearray(good)
    raw[30] ^= 0x20  # a character of a variable name
    index.write_bytes(raw)
    with pytest.raises(CheckpointError, match=f"{re.escape(str(index))}: checksum mismatch in the block at byte 0"):
        TFCheckpointReader(folder / "model.ckpt-2")

    index.write_bytes(good[:-10])
    with pytest.raises(CheckpointError, match="not a TensorFlow checkpoint index"):
        TFCheckpointReader(folder / "model.ckpt-2")

    offset, size = _first_data_block(good)
    raw = bytearray(good)
    raw[offset + size] = 1  # the block's type: snappy, with a checksum that agrees
    raw[offset + size + 1:offset + size + 5] = tfc.masked_crc32c(bytes(raw[offset:offset + size + 1])).to_bytes(4, "little")
    index.write_bytes(raw)
    with pytest.raises(CheckpointError, match="block at byte 0 is snappy-compressed"):
        TFCheckpointReader(folder / "model.ckpt-2")


def test_not_a_bert_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a TensorFlow checkpoint"):
        convert_tf_checkpoint(tmp_path, tmp_path / "out")


# ---------------------------------------------------------------------------- against TensorFlow itself
def test_reader_against_tensorflow(tmp_path):
    """Where TensorFlow is installed: the fixtures as TF reads them now, and a fresh checkpoint of
    every dtype the reader knows, a large tensor and an empty one."""
    tf = pytest.importorskip("tensorflow")
    v1 = tf.compat.v1
    for kind, prefix in PREFIXES.items():
        tf_reader = tf.train.load_checkpoint(str(FIXTURES / kind / prefix))
        ours = TFCheckpointReader(FIXTURES / kind / prefix)
        assert ours.shapes == {k: tuple(v) for k, v in sorted(tf_reader.get_variable_to_shape_map().items())}
        for name in ours.shapes:
            assert np.array_equal(ours.read(name), tf_reader.get_tensor(name)), name

    rng = np.random.default_rng(0)
    values = {
        "big": rng.standard_normal((1003, 301)).astype(np.float32),
        "f16": rng.standard_normal((7, 5)).astype(np.float16),
        "f64": rng.standard_normal((3,)),
        "i32": rng.integers(-9, 9, (4, 4)).astype(np.int32),
        "i64": np.array(123456789012, np.int64),
        "u8": rng.integers(0, 255, (17,)).astype(np.uint8),
        "flags": np.array([True, False, True]),
        "empty": np.zeros((0, 4), np.float32),
    }
    graph = tf.Graph()
    with graph.as_default():
        for name, value in values.items():
            v1.Variable(value, name=f"scope/{name}")
        v1.Variable(tf.cast(tf.constant(values["big"][:5]), tf.bfloat16), name="scope/bf16")
        saver = v1.train.Saver()
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            saver.save(session, str(tmp_path / "model.ckpt"), write_meta_graph=False)
    tf_reader = tf.train.load_checkpoint(str(tmp_path / "model.ckpt"))
    ours = TFCheckpointReader(tmp_path / "model.ckpt")
    for name in tf_reader.get_variable_to_shape_map():
        want = tf_reader.get_tensor(name)
        got = ours.read(name)
        if name == "scope/bf16":
            want = want.astype(np.float32)
        assert got.shape == want.shape and np.array_equal(got, want), name
