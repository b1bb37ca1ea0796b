"""Int8 inference for the encoder's dense layers, applied to a built model from outside:
`quantize_int8(model)`.

A quantized `nn.Linear` computes ``y = (q(x) @ q(W)^T) * s_x * s_w + b`` with

* ``q(W) = round(W / s_w)``, int8, one scale ``s_w = max|W_j| / w_max`` per output channel (row of
  W), made once when the model is quantized;
* ``q(x) = round(x / s_x)``, int8, one scale ``s_x = max|x_i| / 127`` per token (row of x), made at
  run time, so a token with large activations does not cost the others their precision;
* the product accumulated in int32 (`torch._int_mm`, oneDNN's int8 matrix product on CPU).

Everything else (embeddings, LayerNorm, attention's own products, the task heads) stays in floating point.

``w_max`` is 127 where the CPU multiplies int8 without saturating (VNNI, AMX) and 63 elsewhere: AVX2's
``vpmaddubsw`` adds two unsigned x signed byte products into a saturating 16-bit sum, which two products
of full 7-bit weights (2 * 255 * 127) overflow, silently, while 6-bit ones (2 * 255 * 63) do not. It is
probed once per process (`full_range_int8`), so a oneDNN limited by ``ONEDNN_MAX_CPU_ISA`` is caught too.

In train mode, with gradients on, or while exporting or compiling, a quantized layer runs its float
weights, which quantization leaves as they are (the state dict is unchanged).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from types import MethodType

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.fast.tracing import tracing

__all__ = ["full_range_int8", "int8_linear", "int8_weights", "is_quantized", "quantize_int8", "quantized_layers"]

logger = logging.getLogger("bertforge")

# A quantized nn.Linear's int8 weights, in its __dict__ (not a buffer: state dicts do not see it):
# {layer count: _Int8Weight} for the layer alone (1) and for the stacked projections it leads (q, k, v: 3; k, v: 2).
_INT8 = "_int8_weights"


@functools.cache
def full_range_int8() -> bool:
    """Whether this process's int8 matrix product on CPU is exact for full-range (7-bit) weights, that
    is, does not saturate on worst-case operands (see the module docstring)."""
    g = torch.Generator().manual_seed(0)
    a = torch.where(torch.rand(32, 256, generator=g) < 0.5, 127, -127).to(torch.int8)
    b = torch.where(torch.rand(256, 32, generator=g) < 0.5, 127, -127).to(torch.int8)
    exact = a.long() @ b.long()
    got = torch._int_mm(a, b).long()
    full = bool(torch.equal(got, exact))
    logger.debug("int8 matrix product %s full-range weights", "exact with" if full else "saturates with")
    return full


class _Int8Weight:
    """A weight quantized per output channel: ``wt`` (in_features, out_features) int8 for `torch._int_mm`,
    ``scale`` (out_features,) and ``bias`` float32, and the storages and versions it was made from."""

    __slots__ = ("wt", "scale", "bias", "sources", "versions")

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None], w_max: int):
        w = torch.cat([t.detach().float() for t in weights])  # (out, in)
        self.scale = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / w_max
        self.wt = torch.round(w / self.scale[:, None]).clamp_(-w_max, w_max).to(torch.int8).t().contiguous()
        self.bias = (None if any(b is None for b in biases) else torch.cat([b.detach().float() for b in biases]))
        self.sources = [t.detach() for t in weights + [b for b in biases if b is not None]]
        self.versions = [t._version for t in self.sources]

    def current(self, params: list[torch.Tensor]) -> bool:
        return len(params) == len(self.sources) and all(
            s.data_ptr() == t.data_ptr() and v == t._version for s, v, t in zip(self.sources, self.versions, params))


def quantize_int8(model: nn.Module, quantized: bool = True) -> nn.Module:
    """Quantize the dense layers of every encoder in ``model`` (`quantized_layers`) to int8 for
    inference, in place, and return it (``quantized=False``: back to float). Idempotent; the float
    weights stay as they are (see the module docstring)."""
    layers = quantized_layers(model)
    for layer in layers:
        _set_quantized(layer, quantized)
    if quantized:
        logger.debug("int8: %d dense layers quantized (weights to +-%d)", len(layers), _w_max())
    return model


@contextlib.contextmanager
def int8_weights(model: nn.Module, quantized: bool = True) -> Iterator[nn.Module]:
    """``model`` quantized (``quantized=False``: in float) for the length of a ``with`` block, and as
    it was afterwards."""
    before = {layer: is_quantized(layer) for layer in quantized_layers(model)}
    quantize_int8(model, quantized)
    try:
        yield model
    finally:
        for layer, was in before.items():
            _set_quantized(layer, was)


def _w_max() -> int:
    return 127 if full_range_int8() else 63


def _set_quantized(layer: nn.Linear, quantized: bool) -> None:
    if not quantized:
        layer.__dict__.pop(_INT8, None)
        if getattr(layer.__dict__.get("forward"), "__func__", None) is _forward:
            del layer.forward
    elif _INT8 not in layer.__dict__:
        layer.__dict__[_INT8] = {1: _Int8Weight([layer.weight], [layer.bias], _w_max())}
        layer.forward = MethodType(_forward, layer)  # calls outside `bertforge.fast.frozen.linear`


def quantized_layers(model: nn.Module) -> list[nn.Linear]:
    """The layers `quantize_int8` quantizes: every `nn.Linear` of each `BertModel` in ``model`` (query,
    key, value, attention output, intermediate, output, pooler), and none of the heads'."""
    from bertforge.model.bert import BertModel

    found: dict[int, nn.Linear] = {}
    for module in model.modules():
        if isinstance(module, BertModel):
            for m in module.modules():
                if type(m) is nn.Linear:
                    found[id(m)] = m
    return list(found.values())


def is_quantized(layer: nn.Module) -> bool:
    return _INT8 in layer.__dict__


def _runs_int8(layer: nn.Linear) -> bool:
    return not (layer.training or torch.is_grad_enabled() or tracing())


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A quantized layer called as a module."""
    return int8_linear(x, self)


def int8_linear(x: torch.Tensor, *layers: nn.Linear) -> torch.Tensor:
    """The outputs of quantized ``layers`` side by side, (..., sum of their out_features), from one int8
    matrix product with their weights stacked, in the dtype `F.linear` would give. Outside inference:
    the float weights."""
    first = layers[0]
    if not _runs_int8(first):
        if len(layers) == 1:
            return F.linear(x, first.weight, first.bias)
        return F.linear(x, torch.cat([m.weight for m in layers]), torch.cat([m.bias for m in layers]))
    entries = first.__dict__[_INT8]
    params = [m.weight for m in layers] + [m.bias for m in layers if m.bias is not None]
    q = entries.get(len(layers))
    if q is None or not q.current(params):
        q = entries[len(layers)] = _Int8Weight([m.weight for m in layers], [m.bias for m in layers], _w_max())
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).float()
    if x2.shape[0] == 0:
        return F.linear(x, torch.cat([m.weight for m in layers]), q.bias)  # no rows: the float shape and dtype
    s = x2.abs().amax(1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny).div_(127.0)  # (M, 1)
    xq = torch.round(x2 / s).to(torch.int8)  # |x / s| <= 127 by construction
    y = torch._int_mm(xq, q.wt).float().mul_(s).mul_(q.scale)  # (M, N)
    if q.bias is not None:
        y.add_(q.bias)
    dtype = (torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type)
             else x.dtype)  # what F.linear would return here
    return y.to(dtype).reshape(*shape[:-1], -1)
