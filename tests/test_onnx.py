"""ONNX export: every model class, dynamic axes, onnxruntime parity, the CLI; and `BertModel`'s paths
that only export and inference take (dense layers on every slot; attention per length group)."""

from __future__ import annotations

import contextlib
import itertools
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

from bertforge.model import bert as modeling  # noqa: E402
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


@pytest.mark.parametrize("cls", [BertModel, BertForPreTraining], ids=lambda c: c.__name__)
def test_export_path_equals_unpadded_path(cls, tiny_config, randomize, make_batch, monkeypatch):
    """The path `BertModel` takes under torch.export (dense layers on every slot) gives the unpadded
    path's outputs everywhere, padding positions (zeros) and every hidden state included."""
    model = randomize(cls(tiny_config())).eval()
    batch = make_batch(model.config, lengths=(11, 7, 1))
    with torch.no_grad():
        ref = model(**batch, output_hidden_states=True)
        monkeypatch.setattr(modeling, "_exporting", lambda: True)
        got = model(**batch, output_hidden_states=True)
    names = ("last_hidden_state", "pooler_output") if cls is BertModel else ("prediction_logits",
                                                                            "seq_relationship_logits")
    for name in names + ("hidden_states",):
        a, b = ref[name], got[name]
        for x, y in zip(a, b) if isinstance(a, tuple) else [(a, b)]:
            assert (x - y).abs().max() <= 1e-5, name
    if cls is BertModel:
        pad = ~batch["attention_mask"].bool()
        assert torch.all(got.last_hidden_state[pad] == 0)


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


# ---------------------------------------------------------------------------- inference-only paths
def _masks(T: int = 40) -> dict[str, torch.Tensor]:
    def right(lengths):
        return (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()

    holes = right([40, 31, 9, 22])
    holes[:, 2::5] = 0
    return {"mixed": right([3, 40, 17, 39, 1, 8, 25, 40, 2, 33]), "left": right([40, 6, 19, 2]).flip(1),
            "holes": holes, "empty-row": right([0, 12, 40, 5]), "one": right([9])}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mask", list(_masks()), ids=list(_masks()))
def test_inference_path_equals_training_layout(mask, precision, tiny_config, randomize):
    """Eval without gradients on CPU runs attention per length group (and bf16 attention written out);
    real positions must match the path taken with gradients on, padding stays zero."""
    model = randomize(BertModel(tiny_config())).eval()
    attention_mask = _masks()[mask]
    input_ids = torch.randint(1, model.config.vocab_size, attention_mask.shape) * attention_mask
    token_type_ids = torch.randint(0, 2, attention_mask.shape)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    with amp:
        ref = model(input_ids, attention_mask, token_type_ids, output_hidden_states=True)
        with torch.no_grad():
            got = model(input_ids, attention_mask, token_type_ids, output_hidden_states=True)
    real = attention_mask.bool()
    atol = 1e-5 if precision == "fp32" else 3e-2
    for a, b in zip(ref.hidden_states, got.hidden_states):
        assert (a[real].float() - b[real].float()).abs().max() <= atol
    rows = real.any(1)
    assert (ref.pooler_output[rows].float() - got.pooler_output[rows].float()).abs().max() <= atol
    assert torch.all(got.last_hidden_state[~real] == 0)


def test_length_groups_layout():
    keep = _masks()["mixed"].bool()
    indices = keep.reshape(-1).nonzero().squeeze(1)
    groups = modeling._LengthGroups.build(keep, indices)
    assert 1 < len(groups.shapes) <= modeling._LengthGroups.MAX_GROUPS
    assert sum(b for b, _ in groups.shapes) == keep.shape[0]
    assert sum(b * t * t for b, t in groups.shapes) < keep.numel() * keep.shape[1]  # less attention work
    # every real token once: each group's real slots read the unpadded rows its targets name
    for gather, real, targets in zip(groups.gathers, groups.real, groups.targets):
        assert torch.equal(gather.index_select(0, real), targets)
    assert torch.equal(torch.cat(groups.targets).sort().values, torch.arange(indices.numel()))


@pytest.mark.parametrize("seed", range(5))
def test_length_cuts_are_optimal(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = sorted(torch.randint(1, 60, (7,), generator=g).tolist())
    fixed = lengths[-1] ** 2

    def work(cuts):
        bounds = [0, *cuts]
        return sum((e - s) * lengths[e - 1] ** 2 + fixed for s, e in zip(bounds, bounds[1:]))

    best = min(work([*c, 7]) for k in range(4) for c in itertools.combinations(range(1, 7), k))
    assert work(modeling._length_cuts(lengths, 4)) == best
