"""Self-attention of the unpadded encoder: q, k, v from one matrix product over the real tokens,
attention per group of similar lengths in CPU inference, and attention written out as matrix
products where that beats PyTorch's fused kernel on CPU (bf16 inference; training with dropout).

Masks as the reference's `make_attention_mask`: padding keys; in a causal model also the keys after
the query, as PyTorch's ``is_causal`` where every sequence is `right_padded`, else as `causal_mask`."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from bertforge.fast import dropout
from bertforge.fast.frozen import linear
from bertforge.fast.kernels import cpu_kernels
from bertforge.fast.layout import LengthGroups, Padding, causal_mask
from bertforge.model.bert import BertSelfAttention

__all__ = ["attention", "self_attention", "written_out_attention"]

_KERNEL_DTYPES = (torch.float32, torch.bfloat16)


def self_attention(module: BertSelfAttention, x: torch.Tensor, padding: Padding | None, shape: tuple[int, int],
                   queries: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                   causal: bool = False) -> torch.Tensor:
    """`BertSelfAttention` on unpadded rows: x (N, H) real tokens, or (B*T, H) when the batch has no
    padding -> (N, H). With ``queries`` (B*K, H), the states at the K ``positions`` (B, K) chosen per
    sequence, attention runs from those only -> (B*K, H). ``causal``: a left-to-right model's attention
    (a query sees the keys at or before its position)."""
    B, T = shape
    A, D = module.num_heads, module.head_dim
    mask = padding.key_mask if padding is not None else None  # (B, 1, 1, T)
    is_causal = False
    if queries is None:
        qkv = linear(x, module.query, module.key, module.value)  # (N, 3H)
        if padding is not None and padding.groups is not None:
            return _grouped(qkv, padding.groups, A, D)
        qkv = padding.pad(qkv) if padding is not None else qkv.view(B, T, -1)  # (B, T, 3H)
        q, k, v = qkv.view(B, T, 3, A, D).permute(2, 0, 3, 1, 4)  # 3 x (B, A, T, D)
        if causal:
            mask = padding.causal_mask if padding is not None else None  # (B, 1, T, T) or None
            is_causal = mask is None
    else:
        kv = linear(x, module.key, module.value)  # (N, 2H)
        kv = padding.pad(kv) if padding is not None else kv.view(B, T, -1)  # (B, T, 2H)
        k, v = kv.view(B, T, 2, A, D).permute(2, 0, 3, 1, 4)  # 2 x (B, A, T, D)
        q = linear(queries, module.query).view(B, -1, A, D).transpose(1, 2)  # (B, A, K, D)
        if causal:
            keep = mask[:, 0, 0] if mask is not None else torch.ones(B, T, dtype=torch.bool, device=q.device)
            mask = causal_mask(keep, positions)  # (B, 1, K, T)
    p = module.dropout_p if module.training else 0.0
    if p > 0.0 and q.device.type == "cpu":
        # On CPU, SDPA with dropout runs this same unfused path with bernoulli_; written out
        # here it draws the mask with the cheaper `dropout_mask`.
        y = written_out_attention(q, k, v, mask, p, is_causal)
    else:
        y = attention(q, k, v, mask, p, is_causal)
    # y: (B, A, T or K, D), softmax(QK^T / sqrt(D)) V
    y = y.transpose(1, 2).reshape(B, q.shape[2], -1)  # (B, T or K, H)
    if queries is not None:
        return y.view(-1, y.shape[-1])  # (B*K, H)
    return padding.unpad(y) if padding is not None else y.view(B * T, -1)


def _grouped(qkv: torch.Tensor, groups: LengthGroups, A: int, D: int) -> torch.Tensor:
    """qkv (N, 3H) -> (N, H): attention run per length group (inference; see `LengthGroups`)."""
    N = qkv.shape[0]
    each = zip(groups.gathers, groups.key_masks, groups.real, groups.shapes)
    kernels = cpu_kernels() if qkv.dtype == torch.bfloat16 and qkv.is_contiguous() else None
    if kernels is not None:  # as below, with the per-head layout gathered and scattered by row copies
        out = qkv.new_empty(N, A * D)
        for g, (gather, key_mask, real, (b, t)) in enumerate(each):
            q, k, v = kernels.gather_heads(qkv, gather, 3, A).view(3, A, b, t, D)
            mask = key_mask.transpose(0, 1) if key_mask is not None else None  # (1, b, 1 or t, t)
            y = written_out_attention(q, k, v, mask, 0.0, groups.causal)  # (A, b, t, D)
            kernels.scatter_heads(y.reshape(A, b * t, D), real,
                                  groups.targets[g] if groups.targets is not None else None, out)
        return out
    if qkv.dtype == torch.bfloat16:
        # Written-out attention (as `attention` chooses in bf16), head-major: a group gathered as
        # (3, A, b*t, D) gives q, k, v that enter the batched matrix products without copies.
        heads = qkv.view(N, 3, A, D).permute(1, 2, 0, 3)  # (3, A, N, D), a view
        out = None if groups.targets is None else qkv.new_empty(N, A, D)
        for g, (gather, key_mask, real, (b, t)) in enumerate(each):
            q, k, v = heads.index_select(2, gather).view(3, A, b, t, D)  # 3 x (A, b, t, D)
            mask = key_mask.transpose(0, 1) if key_mask is not None else None  # (1, b, 1 or t, t)
            y = written_out_attention(q, k, v, mask, 0.0, groups.causal)  # (A, b, t, D)
            y = y.view(A, b * t, D).index_select(1, real)  # (A, N_g, D)
            if out is None:
                return y.permute(1, 0, 2).reshape(N, A * D)  # (N, H)
            out.index_copy_(0, groups.targets[g], y.transpose(0, 1))  # its rows of (N, A, D)
        return out.view(N, A * D)
    # PyTorch's fused kernel, whose output is laid out (b, t, A, D): rows in token order within a group
    out = None if groups.targets is None else qkv.new_empty(N, A * D)
    for g, (gather, key_mask, real, (b, t)) in enumerate(each):
        q, k, v = qkv.index_select(0, gather).view(b, t, 3, A, D).permute(2, 0, 3, 1, 4)  # 3 x (b, A, t, D)
        y = attention(q, k, v, key_mask, 0.0, groups.causal)  # (b, A, t, D)
        y = y.transpose(1, 2).reshape(b * t, A * D).index_select(0, real)  # (N_g, H)
        if out is None:
            return y
        out.index_copy_(0, groups.targets[g], y)
    return out


def written_out_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
                          p: float, causal: bool = False) -> torch.Tensor:
    """softmax(QK^T / sqrt(D)) V with masked keys left out and (p > 0) `dropout_mask` on the probabilities;
    q (..., T or K, D), k, v (..., T, D), key_mask (True = attend) broadcastable to (..., 1 or K, T) ->
    (..., T or K, D). ``causal``: query i sees keys <= i only, as PyTorch's ``is_causal``.

    In training the probabilities stay in the scores' dtype (PyTorch's CPU softmax computes in float32
    inside and rounds once), so no (B, A, T, T) tensor is converted, and the mask is an additive -inf
    bias inside the scores' product (baddbmm), shared where it is the same for every sequence and head.
    In inference a float32 softmax, one cast and an in-place mask are faster (5-7 % of a BERT-mini forward).
    """
    *batch, K, D = q.shape
    T = k.shape[-2]
    scale = 1.0 / math.sqrt(D)
    if causal:
        below = torch.ones(K, T, dtype=torch.bool, device=q.device).tril()  # (K, T)
        key_mask = below if key_mask is None else key_mask & below
    if not torch.is_grad_enabled():
        kernels = cpu_kernels() if q.device.type == "cpu" and q.dim() == 4 and q.dtype in _KERNEL_DTYPES else None
        if kernels is not None:  # the mask, the scale, the softmax and the cast in one pass (`kernels`)
            scores = q @ k.transpose(-2, -1)  # (B, A, K, T)
            mask = key_mask.expand(scores.shape) if key_mask is not None else None
            probs = kernels.masked_softmax(scores, mask, scale)
            if p > 0.0:
                probs = probs * dropout.dropout_mask(probs.shape, p, probs.device, probs.dtype)
            return probs @ v
        scores = (q * scale) @ k.transpose(-2, -1)  # (..., K, T)
        if key_mask is not None:
            scores.masked_fill_(~key_mask, float("-inf"))
        low = scores.dtype in (torch.bfloat16, torch.float16)
        probs = scores.softmax(-1, dtype=torch.float32 if low else scores.dtype).to(v.dtype)
        if p > 0.0:
            probs = probs * dropout.dropout_mask(probs.shape, p, probs.device, probs.dtype)
        return probs @ v
    q3, k3 = q.reshape(-1, K, D), k.reshape(-1, T, D)  # (b, K, D), (b, T, D)
    bias = None
    if key_mask is not None:
        bias = torch.zeros(key_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~key_mask, float("-inf"))
        rows = bias.shape[-2]  # 1 (padding keys) or K (a causal mask)
        if bias.numel() == rows * T:  # the same for every sequence and head: broadcast by baddbmm
            bias = bias.reshape(1, rows, T)
        else:
            bias = bias.expand(*batch, rows, T).reshape(-1, rows, T)  # (b, 1 or K, T)
    probs = _Scores.apply(q3, k3, bias, scale).softmax(-1)  # (b, K, T)
    if p > 0.0:
        probs = probs * dropout.dropout_mask(torch.Size([*batch, K, T]), p, probs.device, probs.dtype).view(-1, K, T)
    return torch.bmm(probs.to(v.dtype), v.reshape(-1, T, v.shape[-1])).view(*batch, K, v.shape[-1])


class _Scores(torch.autograd.Function):
    """bias + scale * q @ k^T for q (b, K, D), k (b, T, D), bias broadcastable to (b, K, T) or None -> (b, K, T),
    as ``baddbmm``, but with k's gradient computed as (b, T, D), not a transposed (b, D, T): the fused QKV
    projection's backward then gathers q, k and v gradients that all have unit inner stride."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
        ctx.save_for_backward(q, k)
        ctx.scale = scale
        if bias is None:
            return torch.baddbmm(q.new_empty(()), q, k.transpose(1, 2), beta=0.0, alpha=scale)
        return torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k = ctx.saved_tensors
        grad = grad.to(q.dtype)
        empty = q.new_empty(())
        grad_q = torch.baddbmm(empty, grad, k, beta=0.0, alpha=ctx.scale)  # (b, K, D)
        grad_k = torch.baddbmm(empty, grad.transpose(1, 2), q, beta=0.0, alpha=ctx.scale)  # (b, T, D)
        return grad_q, grad_k, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
              p: float, causal: bool = False) -> torch.Tensor:
    """PyTorch's fused attention, except in bf16 inference on CPU, where its flash kernel takes 1.5-1.8x
    the time of the written-out matrix products (BERT-mini and -base head sizes). ``causal``: PyTorch's
    ``is_causal`` (with ``key_mask`` None)."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and not torch.is_grad_enabled():
        return written_out_attention(q, k, v, key_mask, p, causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p, is_causal=causal)
