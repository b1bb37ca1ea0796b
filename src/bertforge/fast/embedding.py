"""The embeddings of the unpadded encoder, and the word-embedding gradient written row by row."""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F

from bertforge.model.bert import BertEmbeddings

__all__ = ["RowGradient", "embeddings_forward", "words"]


class RowGradient:
    """The word-embedding gradient of a CPU training step, written row by row into a buffer kept
    across steps that becomes ``weight.grad``.

    PyTorch builds a fresh dense (V, H) gradient each step, and zero-filling it costs about 5% of a
    MiniLM fine-tuning step on CPU, for the few hundred rows a batch touches. Here only the rows
    written since the last zeroing are zeroed again; the whole buffer when the weight also got a dense
    gradient (the tied MLM decoder). Used only where nothing else hooks the gradient (`words` checks).
    """

    def __init__(self, weight: torch.Tensor, padding_idx: int | None):
        self.weight = weakref.ref(weight)
        self.padding_idx = padding_idx
        self.buffer: torch.Tensor | None = None
        self.written: list[torch.Tensor] = []  # flat row ids added into the buffer since it was zeroed
        self.whole = False  # a dense gradient was added too: zero all of it next time
        self.version = -1  # the buffer's version after our last write
        weight.register_post_accumulate_grad_hook(self._after_accumulation)

    def _after_accumulation(self, weight: torch.Tensor) -> None:
        # Autograd's own accumulation runs (after the lookup's backward) whatever the lookup returned;
        # it changed the buffer only if another use of the weight sent a dense gradient.
        if self.buffer is not None and weight.grad is self.buffer and self.buffer._version != self.version:
            self.whole = True

    def add(self, weight: torch.Tensor, ids: torch.Tensor, grad: torch.Tensor) -> None:
        rows = grad.reshape(-1, grad.shape[-1]).to(weight.dtype)
        ids = ids.reshape(-1)
        if self.padding_idx is not None:  # as nn.Embedding: the padding row gets no gradient
            rows = rows.masked_fill((ids == self.padding_idx).unsqueeze(-1), 0.0)
        if weight.grad is None:  # the step's first contribution: reuse the buffer
            buf = self.buffer
            if buf is None or buf.shape != weight.shape or buf.dtype != weight.dtype or buf.device != weight.device:
                buf = self.buffer = torch.zeros_like(weight)
            elif self.whole:
                buf.zero_()
            elif self.written:
                buf.index_fill_(0, torch.cat(self.written), 0.0)
            self.written, self.whole = [], False
            weight.grad = buf
        if weight.grad is self.buffer:
            self.written.append(ids)
        weight.grad.index_add_(0, ids, rows)
        self.version = weight.grad._version


class _LookupRowGrad(torch.autograd.Function):
    """``F.embedding`` whose weight gradient goes through a `RowGradient` (returned as None to autograd)."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, ids: torch.Tensor, padding_idx: int | None,
                rows: RowGradient) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight = weight
        ctx.rows = rows
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None, None]:
        (ids,) = ctx.saved_tensors
        ctx.rows.add(ctx.weight, ids, grad)
        return None, None, None, None


def words(embeddings: BertEmbeddings, input_ids: torch.Tensor) -> torch.Tensor:
    """The word embeddings of ``input_ids`` (..., H); on one CPU process in eager training, with the
    weight's gradient through a `RowGradient` (kept in the module's ``__dict__``, no state-dict entry)."""
    module = embeddings.word_embeddings
    weight = module.weight
    if (weight.device.type == "cpu" and weight.requires_grad and torch.is_grad_enabled()
            and type(module) is torch.nn.Embedding and not module._forward_hooks and not module._forward_pre_hooks
            and not (torch.distributed.is_available() and torch.distributed.is_initialized())
            and not torch.compiler.is_compiling()):
        rows = module.__dict__.get("_row_gradient")
        if rows is None or rows.weight() is not weight:
            rows = module.__dict__["_row_gradient"] = RowGradient(weight, module.padding_idx)
        return _LookupRowGrad.apply(weight, input_ids, module.padding_idx, rows)
    return module(input_ids)


def embeddings_forward(self: BertEmbeddings, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       rows: torch.Tensor | None = None) -> torch.Tensor:
    """`BertEmbeddings.forward`, and with ``rows`` (N,), flat positions in B*T of the real tokens,
    the embeddings of those slots only: (B, T) ids -> (N, H), what the unpadded dense layers use."""
    length = input_ids.shape[1]
    if rows is None:
        positions = self.position_embeddings.weight[:length]  # (T, H), broadcast over B
        x = words(self, input_ids) + positions + self.token_type_embeddings(token_type_ids)  # (B, T, H)
    else:
        x = (words(self, input_ids.reshape(-1).index_select(0, rows)) + self.position_embeddings(rows % length)
             + self.token_type_embeddings(token_type_ids.reshape(-1).index_select(0, rows)))  # (N, H)
    return self.dropout(self.LayerNorm(x))
