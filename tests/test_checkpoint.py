"""Checkpoint folders: both directions with transformers, partial loads, legacy names, shards,
`convert`, errors that name what is wrong, atomic writes and safe unpickling."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

import bertforge
from bertforge.model import checkpoint
from bertforge.convert.folders import convert
from bertforge.model.checkpoint import CheckpointError, read_state_dict

CLASSES = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
           "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice"]
OUTPUTS = {
    "BertModel": ("last_hidden_state", "pooler_output"),
    "BertForPreTraining": ("prediction_logits", "seq_relationship_logits"),
    "BertForQuestionAnswering": ("start_logits", "end_logits"),
}


def _outputs(model, batch) -> dict[str, torch.Tensor]:
    """The class's main outputs on an unpadded batch (multiple choice: pairs of choices)."""
    if type(model).__name__ == "BertForMultipleChoice":
        batch = {k: v.view(-1, 2, v.shape[-1]) for k, v in batch.items()}
    model.eval()
    with torch.no_grad():
        out = model(**batch)
    return {k: out[k] for k in OUTPUTS.get(type(model).__name__, ("logits",))}


def _assert_same_outputs(a, b, batch, atol=1e-5):
    oa, ob = _outputs(a, batch), _outputs(b, batch)
    for key in oa:
        diff = (oa[key] - ob[key]).abs().max().item()
        assert diff <= atol, f"{key}: max abs diff {diff:.3g}"


def _hf_model(name: str, config, randomize):
    return randomize(getattr(transformers, name)(transformers.BertConfig(**config.to_dict())))


def _for(name: str, config):
    # transformers sizes qa_outputs by num_labels (which must then be 2); ours is always Linear(H, 2)
    return config.replace(num_labels=2) if name == "BertForQuestionAnswering" else config


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


@pytest.fixture
def config(tiny_config):
    return tiny_config(num_labels=3)


@pytest.fixture
def batch(config, make_batch):
    return make_batch(config, (10, 10, 10, 10))


# ---------------------------------------------------------------------------- to and from transformers
@pytest.mark.parametrize("name", CLASSES)
def test_our_folder_loads_in_transformers(name, tmp_path, config, batch, randomize):
    ours = randomize(getattr(bertforge, name)(_for(name, config)))
    ours.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [name]
    theirs, info = getattr(transformers, name).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert not info["error_msgs"], info
    _assert_same_outputs(ours, theirs, batch)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("name", CLASSES)
def test_transformers_folder_loads_in_ours(name, fmt, tmp_path, config, batch, randomize):
    theirs = _hf_model(name, _for(name, config), randomize)
    theirs.save_pretrained(tmp_path)
    if fmt == "bin":  # transformers 5 writes safetensors only: write the legacy file as 4.x did
        torch.save(theirs.state_dict(), tmp_path / "pytorch_model.bin")
        (tmp_path / "model.safetensors").unlink()
    ours = getattr(bertforge, name).from_pretrained(tmp_path)
    assert type(ours).__name__ == name
    report = ours.load_report
    assert report.newly_initialized == [] and report.ignored == [] and report.reinitialized_mismatched == []
    _assert_same_outputs(ours, theirs, batch)


def test_from_pretrained_dtype_and_overrides(tmp_path, config, randomize):
    randomize(bertforge.BertModel(config)).save_pretrained(tmp_path)
    model = bertforge.BertModel.from_pretrained(tmp_path, dtype=torch.float64, hidden_dropout_prob=0.3)
    assert model.dtype == torch.float64 and model.config.hidden_dropout_prob == 0.3
    assert torch.equal(model.embeddings.word_embeddings.weight.float(),
                       _tensors(tmp_path)["embeddings.word_embeddings.weight"])


# ---------------------------------------------------------------------------- partial loads
POOLER = ["bert.pooler.dense.weight", "bert.pooler.dense.bias"]
CLS_KEYS = ["cls.predictions.bias", "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
            "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias"]
NSP_KEYS = ["cls.seq_relationship.weight", "cls.seq_relationship.bias"]


@pytest.mark.parametrize("source, target, newly, ignored", [
    ("BertModel", "BertForSequenceClassification", ["classifier.weight", "classifier.bias"], []),
    ("BertForPreTraining", "BertModel", [], CLS_KEYS + NSP_KEYS),
    ("BertForPreTraining", "BertForTokenClassification", ["classifier.weight", "classifier.bias"],
     POOLER + CLS_KEYS + NSP_KEYS),
    ("BertForMaskedLM", "BertModel", ["pooler.dense.weight", "pooler.dense.bias"], CLS_KEYS),
    ("BertForMaskedLM", "BertForPreTraining", POOLER + NSP_KEYS, []),
    ("BertForSequenceClassification", "BertForQuestionAnswering", ["qa_outputs.weight", "qa_outputs.bias"],
     POOLER + ["classifier.weight", "classifier.bias"]),
])
@pytest.mark.parametrize("writer", ["bertforge", "transformers"])
def test_load_into_another_class(writer, source, target, newly, ignored, tmp_path, config, randomize):
    if writer == "bertforge":
        src = randomize(getattr(bertforge, source)(config))
    else:
        src = _hf_model(source, config, randomize)
    src.save_pretrained(tmp_path)
    model = getattr(bertforge, target).from_pretrained(tmp_path)
    assert sorted(model.load_report.newly_initialized) == sorted(newly)
    assert sorted(model.load_report.ignored) == sorted(ignored)
    # every encoder weight came from the checkpoint
    src_state = {k.removeprefix("bert."): v for k, v in src.state_dict().items()}
    encoder = model if target == "BertModel" else model.bert
    for key, value in encoder.state_dict().items():
        if (key if target == "BertModel" else "bert." + key) not in newly:
            assert torch.equal(value, src_state[key]), key
    # and the fresh head follows BERT's initialisation (zero bias, small weights)
    for key in newly:
        if key.endswith("bias"):
            assert torch.all(model.state_dict()[key] == 0), key


def test_fresh_head_is_logged(tmp_path, config, caplog):
    bertforge.BertModel(config).save_pretrained(tmp_path)
    with caplog.at_level("WARNING", logger="bertforge"):
        bertforge.BertForSequenceClassification.from_pretrained(tmp_path)
    assert "classifier.weight" in caplog.text


def test_old_layernorm_gamma_beta_names(tmp_path, config, batch, randomize):
    ours = randomize(bertforge.BertForPreTraining(config))
    ours.save_pretrained(tmp_path)
    state = _tensors(tmp_path)
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in state.items()}
    assert sum(k.endswith("LayerNorm.gamma") for k in old) == 2 * config.num_hidden_layers + 2
    old["bert.embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None]  # old buffer
    save_file(old, tmp_path / "model.safetensors")
    loaded = bertforge.BertForPreTraining.from_pretrained(tmp_path)
    assert loaded.load_report.ignored == [] and loaded.load_report.newly_initialized == []
    _assert_same_outputs(ours, loaded, batch, atol=0)


def test_sharded_safetensors_from_transformers(tmp_path, config, batch, randomize):
    theirs = _hf_model("BertForPreTraining", config, randomize)
    theirs.save_pretrained(tmp_path, max_shard_size="40KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2 and not (tmp_path / "model.safetensors").exists()
    ours = bertforge.BertForPreTraining.from_pretrained(tmp_path)
    _assert_same_outputs(ours, theirs, batch)


def test_save_over_a_sharded_folder_replaces_its_weights(tmp_path, config, batch, randomize):
    _hf_model("BertModel", config, randomize).save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = randomize(bertforge.BertModel(config))
    ours.save_pretrained(tmp_path)
    # a stale index would win over the new model.safetensors in every reader
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    _assert_same_outputs(ours, bertforge.BertModel.from_pretrained(tmp_path), batch, atol=0)
    _assert_same_outputs(ours, transformers.BertModel.from_pretrained(tmp_path), batch)


def test_sharded_bin_with_index(tmp_path, config, batch, randomize):
    ours = randomize(bertforge.BertForSequenceClassification(config))
    ours.config.save(tmp_path / "config.json")
    state = ours.state_dict()
    keys = list(state)
    half = len(keys) // 2
    weight_map = {}
    for i, part in enumerate((keys[:half], keys[half:])):
        name = f"pytorch_model-0000{i + 1}-of-00002.bin"
        torch.save({k: state[k] for k in part}, tmp_path / name)
        weight_map.update({k: name for k in part})
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = bertforge.BertForSequenceClassification.from_pretrained(tmp_path)
    _assert_same_outputs(ours, loaded, batch, atol=0)
    # a shard the index names but the folder lacks is an error naming it
    (tmp_path / "pytorch_model-00002-of-00002.bin").unlink()
    with pytest.raises(CheckpointError, match="pytorch_model-00002-of-00002.bin"):
        bertforge.BertForSequenceClassification.from_pretrained(tmp_path)


@pytest.mark.parametrize("model_class", [None, "BertForMaskedLM"])
def test_convert_round_trip(model_class, tmp_path, config, batch, randomize):
    theirs = _hf_model("BertForMaskedLM", config, randomize)
    src, dst, back = tmp_path / "src", tmp_path / "dst", tmp_path / "back"
    src.mkdir()
    transformers.BertConfig(**config.to_dict()).save_pretrained(src)  # config without architectures
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma"): v for k, v in theirs.state_dict().items()}
    torch.save(old, src / "pytorch_model.bin")  # legacy names, legacy format, explicit tied decoder
    cls = convert(src, dst, model_class=model_class)
    assert cls is bertforge.BertForMaskedLM
    assert sorted(os.listdir(dst)) == ["config.json", "model.safetensors"]
    assert "cls.predictions.decoder.weight" not in _tensors(dst)
    assert not any(k.endswith("gamma") for k in _tensors(dst))
    ours = bertforge.BertForMaskedLM.from_pretrained(dst)
    _assert_same_outputs(ours, theirs, batch)
    assert convert(dst, back) is bertforge.BertForMaskedLM
    assert _tensors(back).keys() == _tensors(dst).keys()
    assert all(torch.equal(_tensors(back)[k], v) for k, v in _tensors(dst).items())
    reloaded, info = transformers.BertForMaskedLM.from_pretrained(back, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    _assert_same_outputs(reloaded, theirs, batch)


def _transformers5_folder(folder: Path, config, **tokenizer_settings) -> Path:
    """A checkpoint folder as transformers 5 saves it: tokenizer.json and tokenizer_config.json, no vocab.txt."""
    bertforge.BertForMaskedLM(config).save_pretrained(folder)
    vocab = folder / "words.txt"
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "caf", "##é", "cafe", "Caf", "the", "The", ".", "蛋"]
    vocab.write_text("".join(w + "\n" for w in words), encoding="utf-8")
    transformers.BertTokenizer(vocab=str(vocab), **tokenizer_settings).save_pretrained(str(folder))
    vocab.unlink()
    assert (folder / "tokenizer.json").is_file() and not (folder / "vocab.txt").exists()
    return folder


@pytest.mark.parametrize("settings", [dict(do_lower_case=False), dict(do_lower_case=True),
                                      dict(do_lower_case=True, strip_accents=False)])
def test_convert_carries_a_tokenizer_json_without_vocab_txt(settings, tmp_path, config):
    src = _transformers5_folder(tmp_path / "src", config, **settings)
    hf = transformers.AutoTokenizer.from_pretrained(str(src))
    (src / "tokenizer_config.json").unlink()  # the settings are read from tokenizer.json's normalizer
    convert(src, tmp_path / "dst")
    assert (tmp_path / "dst" / "vocab.txt").is_file()
    ours = bertforge.BertTokenizer.from_pretrained(tmp_path / "dst")
    text = "The Café. the cafe 蛋"
    assert ours(text)["input_ids"] == hf(text)["input_ids"]
    assert ours.do_lower_case == settings["do_lower_case"]


@pytest.mark.parametrize("change, message", [
    (lambda d: d["model"].update(type="BPE"), "model.type is 'BPE'"),
    (lambda d: d.update(normalizer=None), "normalizer is None"),
    (lambda d: d["model"].update(continuing_subword_prefix="__"), "model.continuing_subword_prefix is '__'"),
])
def test_convert_refuses_a_tokenizer_json_it_cannot_read(change, message, tmp_path, config):
    src = _transformers5_folder(tmp_path / "src", config)
    (src / "tokenizer_config.json").unlink()
    data = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    change(data)
    (src / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"tokenizer\.json: {message}"):
        convert(src, tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


# ---------------------------------------------------------------------------- errors
def _saved(tmp_path, config, cls=bertforge.BertForPreTraining):
    cls(config).save_pretrained(tmp_path)
    return tmp_path


def test_error_folder_missing(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(CheckpointError, match="nope"):
        bertforge.BertModel.from_pretrained(missing)
    with pytest.raises(CheckpointError, match="nope"):
        read_state_dict(missing)


@pytest.mark.parametrize("model_class", [None, "BertModel"])
def test_convert_errors_are_checkpoint_errors(model_class, tmp_path, config):
    with pytest.raises(CheckpointError, match="nope"):
        convert(tmp_path / "nope", tmp_path / "out", model_class=model_class)
    folder = _saved(tmp_path / "src", config)
    (folder / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        convert(folder, tmp_path / "out", model_class=model_class)
    assert not (tmp_path / "out").exists()


def test_error_no_config(tmp_path, config):
    folder = _saved(tmp_path, config)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        bertforge.BertForPreTraining.from_pretrained(folder)


def test_error_no_weights(tmp_path, config):
    folder = _saved(tmp_path, config)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no weights found.*model\.safetensors.*holds: config\.json"):
        bertforge.BertForPreTraining.from_pretrained(folder)


def test_error_truncated_safetensors(tmp_path, config):
    folder = _saved(tmp_path, config)
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        bertforge.BertForPreTraining.from_pretrained(folder)


def test_error_missing_encoder_keys(tmp_path, config):
    folder = _saved(tmp_path, config)
    state = _tensors(folder)
    del state["bert.encoder.layer.1.output.dense.weight"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing.*bert\.encoder\.layer\.1\.output\.dense\.weight"):
        bertforge.BertForPreTraining.from_pretrained(folder)


def test_error_unknown_keys(tmp_path, config):
    folder = _saved(tmp_path, config)
    state = _tensors(folder)
    state["bert.encoder.layer.2.attention.self.query.weight"] = torch.zeros(32, 32)  # a 3rd layer
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"bert\.encoder\.layer\.2\.attention\.self\.query\.weight"):
        bertforge.BertForPreTraining.from_pretrained(folder)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_or_boolean_weights_are_refused_by_name(dtype, tmp_path, config):
    # load_state_dict would cast them to float silently
    folder = _saved(tmp_path, config)
    state = _tensors(folder)
    key = "bert.encoder.layer.0.output.dense.bias"
    state[key] = torch.ones_like(state[key], dtype=dtype)
    save_file(state, folder / "model.safetensors")
    name = str(dtype).replace("torch.", "")
    with pytest.raises(CheckpointError, match=rf"floating point.*{key.replace('.', '[.]')} \({name}\)"):
        bertforge.BertForPreTraining.from_pretrained(folder)


def test_error_misshaped_tensor(tmp_path, config):
    folder = _saved(tmp_path, config)  # vocab 99
    data = json.loads((folder / "config.json").read_text())
    data["vocab_size"] = 100
    (folder / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as info:
        bertforge.BertForPreTraining.from_pretrained(folder)
    message = str(info.value)
    assert "bert.embeddings.word_embeddings.weight: checkpoint (99, 32), model (100, 32)" in message
    assert "cls.predictions.bias" in message
    # not a head: ignore_mismatched_sizes does not apply to the encoder
    with pytest.raises(CheckpointError, match="word_embeddings"):
        bertforge.BertForPreTraining.from_pretrained(folder, ignore_mismatched_sizes=True)


def test_mismatched_classifier_size(tmp_path, tiny_config, randomize):
    config = tiny_config(id2label={0: "neg", 1: "pos"})
    src = randomize(bertforge.BertForSequenceClassification(config))
    src.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"classifier\.weight.*ignore_mismatched_sizes"):
        bertforge.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=3)
    model = bertforge.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=3,
                                                                   ignore_mismatched_sizes=True)
    assert model.classifier.out_features == 3 and model.config.num_labels == 3
    assert model.load_report.reinitialized_mismatched == ["classifier.weight", "classifier.bias"]
    assert torch.equal(model.bert.pooler.dense.weight, src.bert.pooler.dense.weight)


def test_config_flagged_untied_but_equal_weights_is_saved_tied(tmp_path, config, batch, randomize):
    """A config that says tie_word_embeddings=false must not be carried over: we save the matrix once."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    theirs = _hf_model("BertForMaskedLM", config, randomize)
    theirs.save_pretrained(src)
    data = json.loads((src / "config.json").read_text())
    data["tie_word_embeddings"] = False
    (src / "config.json").write_text(json.dumps(data))
    ours = bertforge.BertForMaskedLM.from_pretrained(src)
    ours.save_pretrained(dst)
    assert json.loads((dst / "config.json").read_text())["tie_word_embeddings"] is True
    reloaded, info = transformers.BertForMaskedLM.from_pretrained(dst, output_loading_info=True)
    assert not info["missing_keys"], info
    _assert_same_outputs(reloaded, theirs, batch)


def test_error_untied_decoder(tmp_path, config, randomize):
    theirs = _hf_model("BertForMaskedLM", config, randomize)
    theirs.save_pretrained(tmp_path)
    state = dict(theirs.state_dict())
    state["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"] + 1.0
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="cls.predictions.decoder.weight"):
        bertforge.BertForMaskedLM.from_pretrained(tmp_path)


# ---------------------------------------------------------------------------- atomic writes
def test_failed_save_leaves_previous_checkpoint(tmp_path, config, batch, randomize, monkeypatch):
    first = randomize(bertforge.BertForSequenceClassification(config))
    first.save_pretrained(tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}

    def torn_write(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"\x00" * 100)  # a torn, partial write ...
        raise OSError("disk full")  # ... then the crash

    monkeypatch.setattr(checkpoint, "save_file", torn_write)
    second = randomize(bertforge.BertForSequenceClassification(config.replace(num_labels=2)))
    with pytest.raises(OSError, match="disk full"):
        second.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]  # no temp file left
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    loaded = bertforge.BertForSequenceClassification.from_pretrained(tmp_path)
    _assert_same_outputs(first, loaded, batch, atol=0)


def test_saved_files_get_ordinary_permissions(tmp_path, config):
    bertforge.BertModel(config).save_pretrained(tmp_path)
    umask = os.umask(0o022)
    os.umask(umask)
    for name in ("config.json", "model.safetensors"):  # not mkstemp's private 0600
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name


# ---------------------------------------------------------------------------- safe unpickling
_side_effects: list[str] = []


def _record(what: str) -> None:
    _side_effects.append(what)


class _Payload:
    """Unpickling this runs code: exactly what weights_only=True must refuse."""

    def __reduce__(self):
        return (_record, ("code ran",))


def test_torch_load_always_weights_only(tmp_path, config, monkeypatch):
    model = bertforge.BertModel(config)
    model.config.save(tmp_path / "config.json")
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    bertforge.BertModel.from_pretrained(tmp_path)
    assert calls == [True]


def test_pickled_object_is_refused(tmp_path, config):
    model = bertforge.BertModel(config)
    model.config.save(tmp_path / "config.json")
    state = dict(model.state_dict())
    state["evil"] = _Payload()
    torch.save(state, tmp_path / "pytorch_model.bin")
    _side_effects.clear()
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        bertforge.BertModel.from_pretrained(tmp_path)
    assert _side_effects == []
    # the payload really does run code when unpickled without the guard
    pickle.loads(pickle.dumps(_Payload()))
    assert _side_effects == ["code ran"]


def test_bin_that_is_not_a_state_dict(tmp_path, config):
    bertforge.BertModel(config).config.save(tmp_path / "config.json")
    torch.save([torch.zeros(2)], tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="expected a mapping of names to tensors"):
        bertforge.BertModel.from_pretrained(tmp_path)
