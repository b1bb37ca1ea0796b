"""BertConfig: the paper's presets, JSON round trips, interchange with transformers, clear errors."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from bertforge import BertModel
from bertforge.model.checkpoint import CheckpointError, load_pretrained
from bertforge.model.config import BertConfig

FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
          "type_vocab_size", "initializer_range", "layer_norm_eps", "pad_token_id", "classifier_dropout",
          "num_labels", "problem_type")


# ---------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name, layers, hidden, heads", [
    ("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("small", 4, 512, 8),
    ("medium", 8, 512, 8), ("base", 12, 768, 12), ("large", 24, 1024, 16),
])
def test_preset_sizes(name, layers, hidden, heads):
    c = BertConfig.preset(name)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (layers, hidden, heads)
    assert c.intermediate_size == 4 * hidden
    assert c.head_dim == 64
    # the rest is the paper's recipe, whatever the size
    assert (c.vocab_size, c.max_position_embeddings, c.type_vocab_size) == (30522, 512, 2)
    assert (c.hidden_act, c.layer_norm_eps, c.hidden_dropout_prob) == ("gelu", 1e-12, 0.1)


@pytest.mark.parametrize("name, params", [("base", 109_482_240), ("large", 335_141_888)])
def test_preset_parameter_counts_match_the_paper(name, params):
    # 110M / 340M in the paper; the exact numbers are those of Google's bert-*-uncased BertModel.
    with torch.device("meta"):  # no memory, no init cost
        model = BertModel(BertConfig.preset(name))
    assert model.num_parameters() == params


def test_preset_overrides_and_unknown_name():
    c = BertConfig.preset("mini", vocab_size=1000, hidden_act="gelu_new")
    assert (c.num_hidden_layers, c.hidden_size, c.vocab_size, c.hidden_act) == (4, 256, 1000, "gelu_new")
    with pytest.raises(ValueError, match="huge"):
        BertConfig.preset("huge")


def test_defaults_are_bert_base():
    assert BertConfig() == BertConfig.preset("base")


# ---------------------------------------------------------------------------- JSON
def _custom() -> BertConfig:
    return BertConfig(vocab_size=1234, hidden_size=48, num_hidden_layers=3, num_attention_heads=6,
                      intermediate_size=100, hidden_act="gelu_new", hidden_dropout_prob=0.2,
                      attention_probs_dropout_prob=0.05, max_position_embeddings=77, type_vocab_size=3,
                      initializer_range=0.03, layer_norm_eps=1e-7, pad_token_id=5, classifier_dropout=0.3,
                      problem_type="single_label_classification", id2label={0: "neg", 1: "neu", 2: "pos"})


def test_json_round_trip(tmp_path):
    c = _custom()
    c.save(tmp_path / "config.json")
    back = BertConfig.load(tmp_path)  # the folder works as well as the file
    assert back == c
    assert back.num_labels == 3 and back.label2id == {"neg": 0, "neu": 1, "pos": 2}
    assert BertConfig.from_dict(c.to_dict()) == c
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["model_type"] == "bert" and data["id2label"] == {"0": "neg", "1": "neu", "2": "pos"}


def test_round_trip_without_label_names_keeps_num_labels(tmp_path):
    c = BertConfig(hidden_size=64, num_attention_heads=2, num_labels=5)
    c.save(tmp_path / "config.json")
    assert BertConfig.load(tmp_path / "config.json").num_labels == 5


def test_our_config_loads_in_transformers(tmp_path):
    c = _custom()
    c.save(tmp_path / "config.json")
    theirs = transformers.BertConfig.from_pretrained(tmp_path)
    for name in FIELDS:
        assert getattr(theirs, name) == getattr(c, name), name
    assert theirs.id2label == {0: "neg", 1: "neu", 2: "pos"}
    assert theirs.label2id == {"neg": 0, "neu": 1, "pos": 2}
    assert theirs.model_type == "bert"


def test_our_num_labels_without_names_loads_in_transformers(tmp_path):
    BertConfig(num_labels=4).save(tmp_path / "config.json")
    assert transformers.BertConfig.from_pretrained(tmp_path).num_labels == 4


def test_transformers_config_loads_in_ours_and_resaves_without_losing_keys(tmp_path):
    theirs = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        hidden_act="gelu_new", type_vocab_size=3, id2label={0: "O", 1: "B-PER", 2: "I-PER"},
        label2id={"O": 0, "B-PER": 1, "I-PER": 2}, finetuning_task="ner", my_extra={"a": [1, 2]},
    )
    theirs.save_pretrained(tmp_path / "hf")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())

    ours = BertConfig.load(tmp_path / "hf")
    assert (ours.vocab_size, ours.hidden_size, ours.num_hidden_layers, ours.num_attention_heads,
            ours.intermediate_size, ours.hidden_act, ours.type_vocab_size) == (99, 32, 2, 4, 37, "gelu_new", 3)
    assert ours.num_labels == 3 and ours.id2label == {0: "O", 1: "B-PER", 2: "I-PER"}
    assert ours.extra["finetuning_task"] == "ner" and ours.extra["my_extra"] == {"a": [1, 2]}

    (tmp_path / "again").mkdir()
    ours.save(tmp_path / "again" / "config.json")
    resaved = json.loads((tmp_path / "again" / "config.json").read_text())
    lost = set(written) - set(resaved)
    assert lost <= {"transformers_version"}, f"keys lost on re-save: {lost}"  # provenance that would be stale
    for key, value in written.items():
        assert resaved.get(key, value) == value, key
    loaded = json.loads(json.dumps({**written, "_name_or_path": "/elsewhere/checkpoint"}))
    assert not {"_name_or_path", "transformers_version"} & set(BertConfig.from_dict(loaded).to_dict())
    back = transformers.BertConfig.from_pretrained(tmp_path / "again")
    assert back.id2label == theirs.id2label and back.label2id == theirs.label2id
    assert back.finetuning_task == "ner" and back.my_extra == {"a": [1, 2]}
    assert back.hidden_act == "gelu_new" and back.type_vocab_size == 3


def test_transformers_default_label_names_become_num_labels(tmp_path):
    transformers.BertConfig(num_labels=3).save_pretrained(tmp_path)
    ours = BertConfig.load(tmp_path)
    assert ours.num_labels == 3 and ours.id2label is None


def test_replace_num_labels_drops_stale_label_names():
    c = BertConfig(id2label={0: "neg", 1: "pos"})
    assert c.replace(num_labels=3).num_labels == 3
    assert c.replace(num_labels=3).id2label is None
    assert c.replace(hidden_dropout_prob=0.0).id2label == {0: "neg", 1: "pos"}  # other changes keep them


# ---------------------------------------------------------------------------- errors
def test_hidden_not_divisible_by_heads():
    with pytest.raises(ValueError, match=r"hidden_size \(100\) must be divisible by num_attention_heads \(12\)"):
        BertConfig(hidden_size=100)


def test_unknown_hidden_act():
    with pytest.raises(ValueError, match="'gelu_fast'"):
        BertConfig(hidden_act="gelu_fast")


@pytest.mark.parametrize("bad, message", [
    ({"model_type": "roberta"}, "model_type is 'roberta'"),
    ({"hidden_act": "mish"}, "'mish'"),
    ({"num_attention_heads": 5}, "divisible"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be >= 1"),
    ({"position_embedding_type": "relative_key"}, "absolute"),
    ({"is_decoder": True, "add_cross_attention": True}, "cross-attention"),
    ({"is_decoder": 1}, "is_decoder must be true or false"),
    ({"num_labels": 3, "id2label": {"0": "a", "1": "b"}}, "num_labels 3"),
    ({"problem_type": "ranking"}, "ranking"),
    # wrong types and sizes: not a TypeError from deep inside torch when the model is built
    ({"hidden_size": 64.0}, r"hidden_size must be a whole number, got 64\.0 \(float\)"),
    ({"intermediate_size": -1}, "intermediate_size must be >= 1, got -1"),
    ({"vocab_size": "99"}, "vocab_size must be a whole number"),
    ({"num_attention_heads": True}, "num_attention_heads must be a whole number"),
    ({"pad_token_id": -1}, "pad_token_id must be >= 0"),
    ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob must be between 0 and 1"),
    ({"layer_norm_eps": "1e-12"}, "layer_norm_eps must be a number"),
    ({"id2label": {"zero": "a", "one": "b"}}, "id2label keys must be class indices"),
])
def test_bad_config_json_names_file_and_problem(tmp_path, bad, message):
    data = {**BertConfig(hidden_size=64, num_attention_heads=2).to_dict(), **bad}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as info:
        BertConfig.load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("text", ['{"hidden_size": 64,', "[1, 2]", ""])
def test_invalid_json(tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=str(path)):
        BertConfig.load(path)
    # through the checkpoint loader it is a CheckpointError (still a ValueError) naming the file
    with pytest.raises(CheckpointError, match=str(path)):
        load_pretrained(BertModel, tmp_path)


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        BertConfig.load(tmp_path)

