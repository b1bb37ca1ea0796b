"""ONNX export: every model class, dynamic axes, onnxruntime parity, the CLI; a model prepared by
`bertforge.fast.speed_up` exports the reference graph."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from bertforge.fast import is_sped_up, speed_up  # noqa: E402
from bertforge.convert import onnx as onnx_export  # noqa: E402
from bertforge.cli import main  # noqa: E402
from bertforge.convert.onnx import OnnxCheck, export_onnx  # noqa: E402

EXPECTED = {
    BertModel: ("last_hidden_state", "pooler_output"),
    BertForPreTraining: ("prediction_logits", "seq_relationship_logits"),
    BertForMaskedLM: ("logits",),
    BertForSequenceClassification: ("logits",),
    BertForTokenClassification: ("logits",),
    BertForQuestionAnswering: ("start_logits", "end_logits"),
    BertForMultipleChoice: ("logits",),
}


def _dims(value_info) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.parametrize("cls", list(EXPECTED), ids=[c.__name__ for c in EXPECTED])
def test_export_matches_pytorch(cls, tiny_config, randomize, tmp_path):
    config = tiny_config(num_labels=3, type_vocab_size=3)
    model = randomize(cls(config))  # left in training mode: the export must evaluate in eval mode
    path = tmp_path / "model.onnx"
    result = export_onnx(model, path)
    assert model.training  # restored

    # onnxruntime on full and padded batches of several sizes, lengths up to max_position_embeddings
    assert len(result.checks) == 11 and sum(c.padded for c in result.checks) == 5
    assert {c.shape[-1] for c in result.checks} == {1, 9, 16, 37, 64}  # 128 and 512 capped at 64
    assert result.max_abs_diff <= 1e-4, result.summary()
    assert "max abs diff" in result.summary()

    graph = onnx.load(str(path))
    onnx.checker.check_model(graph)
    assert [(o.domain, o.version) for o in graph.opset_import if o.domain in ("", "ai.onnx")] == [("", 18)]
    axes = (["batch_size", "num_choices", "sequence_length"] if cls is BertForMultipleChoice
            else ["batch_size", "sequence_length"])
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(_dims(i) == axes for i in graph.graph.input)
    assert tuple(o.name for o in graph.graph.output) == EXPECTED[cls]
    first = _dims(graph.graph.output[0])
    assert first[0] == "batch_size"
    if cls in (BertModel, BertForMaskedLM, BertForTokenClassification, BertForQuestionAnswering):
        assert first[1] == "sequence_length"


def test_models_without_pooler_export_hidden_states_only(tiny_config, tmp_path):
    model = BertModel(tiny_config(), add_pooling_layer=False)
    result = export_onnx(model, tmp_path / "m.onnx", shapes=[(2, 5)])
    assert result.outputs == ("last_hidden_state",)
    assert result.max_abs_diff <= 1e-4


def test_prepared_model_exports_the_reference_graph(tiny_config, randomize, make_batch, tmp_path):
    """A sped-up model runs the reference forward while traced: the graph takes every padded shape
    and matches the eager (unpadded) model, zeros at padding included."""
    model = speed_up(randomize(BertForPreTraining(tiny_config())))
    result = export_onnx(model, tmp_path / "m.onnx", shapes=[(3, 11), (2, 37)])
    assert result.max_abs_diff <= 1e-4, result.summary()
    assert is_sped_up(model)


def test_mismatch_raises_and_writes_nothing(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "verify_onnx",
                        lambda model, path, shapes=None: [OnnxCheck(shape=(2, 8), padded=True, max_abs_diff=0.5)])
    path = tmp_path / "m.onnx"
    with pytest.raises(ValueError, match="differs from PyTorch by 5.00e-01"):
        export_onnx(BertModel(tiny_config()), path)
    assert list(tmp_path.iterdir()) == []


def test_rejects_low_opset_and_non_float32(tiny_config, tmp_path):
    with pytest.raises(ValueError, match="opset 14"):
        export_onnx(BertModel(tiny_config()), tmp_path / "m.onnx", opset=14)
    with pytest.raises(ValueError, match="float32"):
        export_onnx(BertModel(tiny_config()).to(torch.bfloat16), tmp_path / "m.onnx")


def test_cli_export_onnx(tiny_config, tmp_path, capsys):
    config = tiny_config(num_labels=2)
    BertForQuestionAnswering(config).save_pretrained(tmp_path / "ckpt")
    assert main(["export-onnx", str(tmp_path / "ckpt"), str(tmp_path / "onnx")]) == 0
    out = capsys.readouterr().out
    assert "BertForQuestionAnswering, opset 18" in out and "start_logits, end_logits" in out
    diff = float(out.split("max abs diff ")[1].split()[0])
    assert diff <= 1e-4
    assert (tmp_path / "onnx" / "model.onnx").is_file()
    saved = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert saved["architectures"] == ["BertForQuestionAnswering"]

    # the file runs on a shape no check used
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = torch.randint(0, config.vocab_size, (7, 23))
    mask = torch.ones_like(ids)
    mask[3:, 20:] = 0
    start, end = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy(),
                                    "token_type_ids": torch.zeros_like(ids).numpy()})
    assert start.shape == end.shape == (7, 23)
