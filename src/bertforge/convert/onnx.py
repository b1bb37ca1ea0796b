"""ONNX export of bertforge models (``torch.onnx.export(..., dynamo=True)``, opset 18 by default, the
lowest it implements), with dynamic batch and sequence axes, checked with onnxruntime against the eager
model on full and padded batches. Inputs, axes and outputs are named as transformers / optimum name
theirs, so tools written for their exports take ours.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from bertforge.model.heads import BertForMultipleChoice, BertForPreTraining, BertForQuestionAnswering
from bertforge.io import atomic_path
from bertforge.model.bert import BertModel, BertPreTrainedModel

__all__ = ["ATOL", "ONNX_OPSET", "INPUT_NAMES", "VERIFY_SHAPES", "OnnxCheck", "OnnxExport", "example_inputs",
           "export_onnx", "output_names", "output_scale", "verify_onnx"]

ONNX_OPSET = 18
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# optimum's validation tolerance for BERT, taken per unit of an output's scale (see `output_scale`)
ATOL = 1e-4
# Outputs whose scale is 1 by construction (LayerNorm, tanh): held to ATOL itself.
UNIT_SCALE_OUTPUTS = ("last_hidden_state", "pooler_output")
# (batch, length) of the inputs the check runs, each full and padded (lengths capped at max_position_embeddings)
VERIFY_SHAPES = ((1, 1), (1, 9), (2, 16), (5, 37), (3, 128), (2, 512))
_INSTALL_HINT = "pip install 'bertforge[onnx]' (onnx, onnxscript, onnxruntime)"


def output_names(model: BertPreTrainedModel) -> tuple[str, ...]:
    """The graph's outputs: the model's own output field names."""
    if isinstance(model, BertModel):
        return ("last_hidden_state", "pooler_output") if model.pooler is not None else ("last_hidden_state",)
    if isinstance(model, BertForPreTraining):
        return "prediction_logits", "seq_relationship_logits"
    if isinstance(model, BertForQuestionAnswering):
        return "start_logits", "end_logits"
    if isinstance(model, BertPreTrainedModel):
        return ("logits",)
    raise TypeError(f"expected a bertforge model, got {type(model).__name__}")


def _axes(model: BertPreTrainedModel) -> tuple[str, ...]:
    if isinstance(model, BertForMultipleChoice):
        return "batch_size", "num_choices", "sequence_length"
    return "batch_size", "sequence_length"


class _Graph(nn.Module):
    """The model called with the three inputs, returning its outputs as a tuple in `output_names` order."""

    def __init__(self, model: BertPreTrainedModel):
        super().__init__()
        self.model = model
        self.outputs = output_names(model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(out[name] for name in self.outputs)


def output_scale(name: str, reference: torch.Tensor) -> float:
    """The scale an output's differences are judged against. float32 rounding in a matrix product grows
    with the size of its result, and logits take their size from the weights (real masked-LM logits
    reach tens), so a logit output's scale is its largest magnitude (at least 1); hidden states come
    out of a LayerNorm (the pooler out of tanh) and keep scale 1, the tight bound they meet."""
    if name in UNIT_SCALE_OUTPUTS:
        return 1.0
    return max(1.0, float(reference.abs().max()))


@dataclass
class OnnxCheck:
    """One onnxruntime run against the eager model: the output furthest from PyTorch relative to what it
    may differ by (``atol`` times its `output_scale`)."""

    shape: tuple[int, ...]  # (batch, length) or (batch, choices, length)
    padded: bool
    max_abs_diff: float
    output: str = ""
    tolerance: float = ATOL

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= self.tolerance  # False for NaN


@dataclass
class OnnxExport:
    """What `export_onnx` wrote and how the check went."""

    path: Path
    model_class: str
    opset: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    axes: tuple[str, ...]
    checks: list[OnnxCheck] = field(default_factory=list)

    @property
    def max_abs_diff(self) -> float | None:
        return max(c.max_abs_diff for c in self.checks) if self.checks else None

    @property
    def worst(self) -> OnnxCheck | None:
        """The check closest to (or furthest past) its tolerance."""
        return max(self.checks, key=_excess) if self.checks else None

    def summary(self) -> str:
        lines = [f"wrote {self.path}: {self.model_class}, opset {self.opset}",
                 f"  inputs  {', '.join(self.inputs)} ({', '.join(self.axes)})",
                 f"  outputs {', '.join(self.outputs)}"]
        if self.checks:
            shapes = ", ".join("x".join(map(str, c.shape)) + (" padded" if c.padded else "") for c in self.checks)
            worst = self.worst
            lines.append(f"  onnxruntime vs PyTorch: max abs diff {self.max_abs_diff:.2e} over {len(self.checks)} "
                         f"inputs ({shapes}); closest to its tolerance: {worst.output} "
                         f"{worst.max_abs_diff:.2e} <= {worst.tolerance:.2e}")
        return "\n".join(lines)


def _excess(check: OnnxCheck) -> float:
    """The difference as a multiple of the tolerance (NaN, and any difference against a 0 tolerance: inf)."""
    if check.max_abs_diff != check.max_abs_diff:
        return float("inf")
    if check.tolerance <= 0:
        return float("inf") if check.max_abs_diff > 0 else 0.0
    return check.max_abs_diff / check.tolerance


def _require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"ONNX export needs {module}: {_INSTALL_HINT}") from e


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Silence the exporter's chatter that says nothing about this model (notes, torch's deprecations)."""
    onnx_logger = logging.getLogger("torch.onnx")
    level = onnx_logger.level
    onnx_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*will not be used, since it shares the same shape")
            warnings.filterwarnings("ignore", category=FutureWarning)
            yield
    finally:
        onnx_logger.setLevel(level)


def example_inputs(model: BertPreTrainedModel, shape: Sequence[int], *, padded: bool,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random int64 inputs of ``shape``, two segments, and (``padded``) random lengths, the first full."""
    config = model.config
    *lead, length = shape
    rows = int(torch.tensor(lead).prod()) if lead else 1
    input_ids = torch.randint(0, config.vocab_size, (rows, length), generator=generator)
    lengths = torch.randint(1, length + 1, (rows,), generator=generator) if padded else torch.full((rows,), length)
    lengths[0] = length
    positions = torch.arange(length)
    attention_mask = (positions < lengths[:, None]).long()
    split = torch.randint(0, length + 1, (rows,), generator=generator)  # segment B from here on
    token_type_ids = ((positions >= split[:, None]) & attention_mask.bool()).long()
    if config.type_vocab_size < 2:
        token_type_ids.zero_()
    return {k: v.view(*lead, length) for k, v in
            (("input_ids", input_ids), ("attention_mask", attention_mask), ("token_type_ids", token_type_ids))}


def _shapes(model: BertPreTrainedModel, shapes: Sequence[tuple[int, int]] | None) -> list[tuple[int, ...]]:
    longest = model.config.max_position_embeddings
    out = []
    for batch, length in shapes or VERIFY_SHAPES:
        length = min(length, longest)
        out.append((batch, 2, length) if isinstance(model, BertForMultipleChoice) else (batch, length))
    return list(dict.fromkeys(out))


def verify_onnx(model: BertPreTrainedModel, path: str | Path, *, atol: float = ATOL,
                shapes: Sequence[tuple[int, int]] | None = None, seed: int = 0) -> list[OnnxCheck]:
    """Run the ONNX file with onnxruntime (CPU) and the model in eval mode on one full and one padded
    batch per (batch, length) of ``shapes`` (default `VERIFY_SHAPES`): per run, the output furthest from
    PyTorch relative to its tolerance, ``atol`` times the output's `output_scale`."""
    ort = _require("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = output_names(model)
    if [o.name for o in session.get_outputs()] != list(names):
        raise ValueError(f"{path}: outputs {[o.name for o in session.get_outputs()]}, expected {list(names)}")
    generator = torch.Generator().manual_seed(seed)
    checks = []
    was_training = model.training
    model.eval()
    try:
        for shape in _shapes(model, shapes):
            for padded in (False, True):
                if padded and shape[-1] == 1:
                    continue  # a length-1 sequence cannot hold padding
                inputs = example_inputs(model, shape, padded=padded, generator=generator)
                with torch.no_grad():
                    out = model(**inputs)
                got = session.run(list(names), {k: v.numpy() for k, v in inputs.items()})
                runs = [OnnxCheck(shape=shape, padded=padded, output=n, tolerance=atol * output_scale(n, out[n]),
                                  max_abs_diff=float((torch.from_numpy(g) - out[n]).abs().max()))
                        for n, g in zip(names, got)]
                checks.append(max(runs, key=_excess))
    finally:
        model.train(was_training)
    return checks


def export_onnx(model: BertPreTrainedModel, path: str | Path, *, opset: int = ONNX_OPSET, verify: bool = True,
                atol: float = ATOL, shapes: Sequence[tuple[int, int]] | None = None) -> OnnxExport:
    """Export the float32 ``model`` (in eval mode) to the ONNX file ``path``, weights inside; with ``verify``
    the file is checked by `verify_onnx` first: an output differing by more than ``atol`` times its
    `output_scale` is a ValueError, and no file."""
    _require("onnx")
    _require("onnxscript")  # the dynamo exporter builds the graph with it
    if not hasattr(torch.compiler, "is_exporting"):
        raise RuntimeError(f"ONNX export needs torch >= 2.7 (found {torch.__version__})")
    if opset < ONNX_OPSET:
        raise ValueError(f"opset {opset} < {ONNX_OPSET}, the lowest PyTorch's exporter implements")
    if model.dtype != torch.float32:
        raise ValueError(f"export a float32 model (got {model.dtype}); cast it with .float()")
    names, axes = output_names(model), _axes(model)
    dims = {name: torch.export.Dim(name) for name in axes[:-1]}
    dims[axes[-1]] = torch.export.Dim(axes[-1], max=model.config.max_position_embeddings)
    dynamic_shapes = {name: {i: dims[a] for i, a in enumerate(axes)} for name in INPUT_NAMES}
    # Sizes of 0 and 1 would be specialised by torch.export: the example has at least 2 everywhere.
    example_shape = (2, 3, 8) if len(axes) == 3 else (2, 8)
    example = example_inputs(model, example_shape, padded=True, generator=torch.Generator().manual_seed(0))

    was_training = model.training
    graph = _Graph(model).eval()
    try:
        with _quiet_exporter(), torch.no_grad():
            program = torch.onnx.export(graph, tuple(example[n] for n in INPUT_NAMES), dynamo=True,
                                        dynamic_shapes=dynamic_shapes, input_names=list(INPUT_NAMES),
                                        output_names=list(names), opset_version=opset, verbose=False)
    finally:
        model.train(was_training)
    result = OnnxExport(path=Path(path), model_class=type(model).__name__, opset=opset, inputs=INPUT_NAMES,
                        outputs=names, axes=axes)
    with atomic_path(path) as tmp:
        program.save(str(tmp), external_data=False)
        if verify:
            result.checks = verify_onnx(model, tmp, atol=atol, shapes=shapes)
            worst = result.worst
            if not worst.passed:
                raise ValueError(f"ONNX export of {result.model_class} differs from PyTorch by "
                                 f"{worst.max_abs_diff:.2e} in {worst.output} > {worst.tolerance:.2e} ({atol} times "
                                 f"the output's scale; input {'x'.join(map(str, worst.shape))}"
                                 f"{' padded' if worst.padded else ''}); nothing written to {path}")
    return result
