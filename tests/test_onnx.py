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
from bertforge.convert.onnx import OnnxCheck, example_inputs, export_onnx, verify_onnx  # noqa: E402

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
    assert all(c.passed for c in result.checks), result.summary()
    if cls is BertModel:  # hidden states and the pooler: held to 1e-4 itself
        assert all(c.tolerance == 1e-4 for c in result.checks) and result.max_abs_diff <= 1e-4
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
    assert all(c.passed for c in result.checks), result.summary()
    assert is_sped_up(model)


def _loud_masked_lm(config) -> BertForMaskedLM:
    """A masked LM whose logits reach about 1e4: float32 rounds them to steps of about 1e-3, so any two
    correct kernels (PyTorch's, onnxruntime's) differ by far more than 1e-4 in absolute terms."""
    model = BertForMaskedLM(config).eval()
    with torch.no_grad():
        model.cls.predictions.transform.LayerNorm.weight.mul_(1e4)
    return model


def test_logits_are_judged_at_their_own_scale(tiny_config, tmp_path):
    model = _loud_masked_lm(tiny_config())
    result = export_onnx(model, tmp_path / "m.onnx", shapes=[(2, 16), (3, 37)])
    with torch.no_grad():
        largest = model(**example_inputs(model, (2, 16), padded=False, generator=torch.Generator().manual_seed(0))
                        ).logits.abs().max().item()
    assert largest > 1e3
    assert result.max_abs_diff > 1e-4  # a fixed absolute 1e-4 would refuse this correct export
    assert all(c.output == "logits" and c.tolerance > 0.1 and c.passed for c in result.checks), result.summary()


@pytest.mark.parametrize("loud", [False, True], ids=["unit-logits", "loud-logits"])
def test_an_export_with_wrong_weights_fails_the_check(tiny_config, randomize, tmp_path, loud):
    model = _loud_masked_lm(tiny_config()) if loud else randomize(BertForMaskedLM(tiny_config())).eval()
    path = tmp_path / "m.onnx"
    export_onnx(model, path, verify=False)
    with torch.no_grad():
        bias = model.bert.encoder.layer[0].attention.output.dense.bias
        bias.add_(0.01 * torch.randn(bias.shape, generator=torch.Generator().manual_seed(0)))  # not the file's
    checks = verify_onnx(model, path, shapes=[(2, 16)])
    assert not all(c.passed for c in checks)
    assert all(c.output == "logits" for c in checks)


def test_an_export_without_the_causal_mask_fails_the_check(tiny_config, tmp_path):
    config = tiny_config(is_decoder=True)
    model = _loud_masked_lm(config)
    model.bert.config = config.replace(is_decoder=False)  # traced without the mask ...
    export_onnx(model, tmp_path / "m.onnx", verify=False)
    model.bert.config = config  # ... and checked against the left-to-right model
    checks = verify_onnx(model, tmp_path / "m.onnx", shapes=[(2, 16)])
    assert not any(c.passed for c in checks)
    worst = max(c.max_abs_diff / c.tolerance for c in checks)
    assert worst > 10  # not near the line: a wrong graph misses by far


def test_mismatch_raises_and_writes_nothing(tiny_config, tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_export, "verify_onnx", lambda model, path, atol, shapes=None: [
        OnnxCheck(shape=(2, 8), padded=True, max_abs_diff=0.5, output="last_hidden_state", tolerance=atol)])
    path = tmp_path / "m.onnx"
    with pytest.raises(ValueError, match=r"differs from PyTorch by 5.00e-01 in last_hidden_state > 1.00e-04 "
                                         r"\(0.0001 times the output's scale; input 2x8 padded\)"):
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
    output, diff, _, tolerance = out.split("closest to its tolerance: ")[1].split()[:4]
    assert output in ("start_logits", "end_logits") and float(diff) <= float(tolerance)
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
