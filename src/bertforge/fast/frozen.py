"""Inference caches of projection weights: stacked (q, k, v as one matrix) and cast to autocast's
dtype once, instead of on every forward, for layers whose owner promises not to change them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.fast.int8 import int8_linear, is_quantized
from bertforge.fast.tracing import tracing

__all__ = ["freeze_weights", "frozen_weights", "linear"]

# An nn.Linear's cache, {(layer count, dtype): entry}, in its __dict__ (not a buffer: state dicts do not see it)
_CACHE = "_frozen_weights"


def freeze_weights(model: nn.Module, frozen: bool = True) -> nn.Module:
    """Promise that ``model``'s weights stay as they are (``frozen=False`` withdraws the promise), so
    that inference through it (eval mode, no gradient) reuses its projection weights stacked and cast
    to autocast's dtype instead of doing so on every forward. Caches are rebuilt when a weight is
    replaced (``.to()``) or changed in place (its version counter moves: ``load_state_dict``, ``copy_``),
    and dropped whenever a forward runs in train mode (a fused optimizer's step moves no version
    counter). They cost one copy of the weights and serve the projections routed through `linear`."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            if frozen:
                m.__dict__.setdefault(_CACHE, {})
            else:
                m.__dict__.pop(_CACHE, None)
    return model


def is_frozen(layer: nn.Module) -> bool:
    return _CACHE in layer.__dict__


@contextlib.contextmanager
def frozen_weights(model: nn.Module) -> Iterator[nn.Module]:
    """`freeze_weights` for the length of a ``with`` block (layers frozen before it stay frozen)."""
    before = [m for m in model.modules() if isinstance(m, nn.Linear) and is_frozen(m)]
    freeze_weights(model)
    try:
        yield model
    finally:
        freeze_weights(model, False)
        for m in before:
            m.__dict__[_CACHE] = {}


def linear(x: torch.Tensor, *layers: nn.Linear) -> torch.Tensor:
    """The outputs of ``layers`` side by side, (..., sum of their out_features), from one matrix product
    with their weights stacked, cached for frozen layers in inference (`freeze_weights`; never while
    tracing). Int8-quantized layers run their int8 product; a layer that is not a plain `nn.Linear` or
    carries hooks is called as a module."""
    if all(is_quantized(m) for m in layers) and not any(m._forward_hooks or m._forward_pre_hooks for m in layers):
        return int8_linear(x, *layers)
    if any(type(m) is not nn.Linear or m._forward_hooks or m._forward_pre_hooks for m in layers):
        return layers[0](x) if len(layers) == 1 else torch.cat([m(x) for m in layers], -1)
    n = len(layers)
    params = [m.weight for m in layers] + [m.bias for m in layers]
    entries = layers[0].__dict__.get(_CACHE)
    if entries is not None and (layers[0].training or torch.is_grad_enabled() or tracing()):
        if layers[0].training:
            entries.clear()  # training: the weights are about to change, or have
        entries = None
    if entries is None:
        if n == 1:
            return F.linear(x, params[0], params[1])
        return F.linear(x, torch.cat(params[:n]), torch.cat(params[n:]))
    dtype = (torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type)
             else params[0].dtype)
    cached = entries.get((n, dtype))
    if cached is None or any(s.data_ptr() != t.data_ptr() or v != t._version
                             for s, v, t in zip(cached[0], cached[1], params)):
        sources = [t.detach() for t in params]  # keep the storage alive: no new parameter takes its address
        cached = (sources, [t._version for t in params], torch.cat(sources[:n]).to(dtype),
                  torch.cat(sources[n:]).to(dtype))
        entries[(n, dtype)] = cached
    return F.linear(x, cached[2], cached[3])
