"""Speed paths applied to a built model from outside: `speed_up(model)`.

The model code (`bertforge.model`) is the plain reference and knows nothing of this package.
`speed_up` replaces forward methods of one model instance's submodules, never a class or a module-level
name, and adds no parameter or buffer: the state dict, hence every checkpoint, stays the same.

What a sped-up model does, without changing the maths (tests/test_fast.py pins it to the reference),
for bidirectional and causal (config ``is_decoder``) encoders alike:

* unpadding (`bertforge.fast.unpad`): every dense layer runs on the real tokens only, q, k and v from
  one matrix product; ``output_positions`` computes the last layer at those positions only;
* on CPU, in training: row counts rounded to multiples of 64 (`Padding.round_rows`), cheaper dropout
  masks (`bertforge.fast.dropout`) inside written-out attention, and the word-embedding gradient added
  row by row into a kept buffer (`bertforge.fast.embedding`; one process, eager mode only);
* on CPU, in inference: attention per group of similar lengths, written out in bf16;
* ``freeze=True``: projection weights stacked and cast once (`bertforge.fast.frozen`), inference only;
* ``int8=True``: the encoders' dense layers quantized (`bertforge.fast.int8`), CPU inference only.

On other devices a sped-up model unpads and runs PyTorch's own fused attention and dropout. While
``torch.export`` traces it (ONNX export) it runs the reference forward. Wrappers (DDP, FSDP's
``fully_shard``, ``torch.compile``) go around a sped-up model: speed up first, then wrap.
"""

from __future__ import annotations

import logging
from types import MethodType
from typing import Callable, TypeVar

from torch import nn

from bertforge.fast.dropout import dropout_forward, dropout_mask
from bertforge.fast.embedding import embeddings_forward
from bertforge.fast.frozen import freeze_weights, frozen_weights
from bertforge.fast.int8 import quantize_int8
from bertforge.fast.unpad import layer_forward, model_forward, pooler_forward
from bertforge.model.bert import BertModel

__all__ = ["speed_up", "is_sped_up", "freeze_weights", "frozen_weights", "dropout_mask", "quantize_int8"]

logger = logging.getLogger("bertforge")

M = TypeVar("M", bound=nn.Module)


def speed_up(model: M, *, freeze: bool = False, int8: bool = False) -> M:
    """``model`` (any bertforge model) prepared for fast execution, in place, and returned. Idempotent.
    ``freeze``: also `freeze_weights`; ``int8``: also `quantize_int8` (both inference only). The path is
    chosen per call, from the device, train / eval mode and whether gradients are on, so a sped-up
    model can move and switch modes freely."""
    for module in model.modules():
        if isinstance(module, BertModel):
            if type(module).forward is not BertModel.forward:
                logger.debug("%s overrides forward: its encoder is left as it is", type(module).__name__)
                continue
            _replace_forward(module, model_forward)
            _replace_forward(module.embeddings, embeddings_forward)
            for layer in module.encoder.layer:
                _replace_forward(layer, layer_forward)
            if module.pooler is not None:
                _replace_forward(module.pooler, pooler_forward)
        elif isinstance(module, nn.Dropout) and type(module).forward is nn.Dropout.forward:
            _replace_forward(module, dropout_forward)
    if freeze:
        freeze_weights(model)
    if int8:
        quantize_int8(model)
    return model


def is_sped_up(model: nn.Module) -> bool:
    """Whether `speed_up` has been applied to ``model``'s encoder."""
    return any(_replaced(m, model_forward) for m in model.modules() if isinstance(m, BertModel))


def _replaced(module: nn.Module, forward: Callable) -> bool:
    return getattr(module.__dict__.get("forward"), "__func__", None) is forward


def _replace_forward(module: nn.Module, forward: Callable) -> None:
    """Give this one instance ``forward`` (an instance attribute shadows the class's method; the
    class and its other instances are untouched)."""
    if not _replaced(module, forward):
        module.forward = MethodType(forward, module)
