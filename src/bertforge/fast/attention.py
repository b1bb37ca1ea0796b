"""Self-attention of the unpadded encoder: q, k, v from one matrix product over the real tokens,
attention per group of similar lengths in CPU inference, and attention written out as matrix
products where that beats PyTorch's fused kernel on CPU (bf16 inference; training with dropout,
whose mask it draws with `dropout_mask`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from bertforge.fast import dropout
from bertforge.fast.frozen import linear
from bertforge.model.bert import BertSelfAttention

if TYPE_CHECKING:
    from bertforge.fast.unpad import Padding

__all__ = ["LengthGroups", "attention", "length_cuts", "self_attention", "written_out_attention"]


@dataclass
class LengthGroups:
    """Inference only (CPU, no gradient): the sequences of a padded batch in a few groups of similar
    length, so that attention, whose cost grows with T^2, runs per group on a layout padded to the
    group's longest sequence instead of the batch's. The dense layers already skip padding; on
    mixed-length batches most of the padded attention work is padding (Wikipedia-leads sentences in
    batches of 32: 76 %; two groups cut the work to 43 % of the padded layout's). Up to four groups
    (31 %) are no faster (within 1 %, BERT-mini and -base) and cost more small operations.

    Each group's (b, t) layout is read from the unpadded (N, F) rows with one ``index_select``; a
    padding slot reads its sequence's first real token, which is finite and masked as a key, and the
    output it gets as a query is dropped.
    """

    gathers: list[torch.Tensor]  # per group: (b*t,) rows of the (N, F) tensor to lay out as (b, t)
    key_masks: list[torch.Tensor]  # per group: (b, 1, 1, t) bool
    real: list[torch.Tensor]  # per group: positions of its real tokens in the (b*t) layout
    shapes: list[tuple[int, int]]  # per group: (b, t)
    targets: list[torch.Tensor] | None  # per group: the (N,) rows of its real tokens (None: one group, in order)

    MAX_GROUPS = 2

    @classmethod
    def build(cls, keep: torch.Tensor, indices: torch.Tensor) -> LengthGroups:
        """keep: (B, T) bool; indices: (N,) flat positions of its real tokens (row-major)."""
        B, T = keep.shape
        positions = torch.arange(1, T + 1, device=keep.device)
        extent = (keep * positions).amax(1)  # (B,): last real position + 1 (masks need not be contiguous)
        extents, rows = extent.sort()
        rows = rows[extents > 0]  # a sequence without real tokens has nothing to attend
        cuts = length_cuts(extents[extents > 0].tolist(), cls.MAX_GROUPS)
        token = torch.full((B * T,), -1, dtype=torch.long, device=keep.device)
        token[indices] = torch.arange(indices.numel(), device=keep.device)
        token = token.view(B, T)  # the row in (N, F) of each real slot
        first = token.gather(1, keep.to(torch.uint8).argmax(1, keepdim=True))  # (B, 1) first real token
        if len(cuts) == 1:  # one group: the sequences in their own order, no reordering
            rows = rows.sort().values
        groups = cls([], [], [], [], [] if len(cuts) > 1 else None)
        start = 0
        for end in cuts:
            r = rows[start:end]
            t = int(extent[r].max())
            k = keep[r, :t]
            groups.gathers.append(torch.where(k, token[r, :t], first[r]).reshape(-1))
            groups.key_masks.append(k[:, None, None, :])
            groups.real.append(k.reshape(-1).nonzero().squeeze(1))
            groups.shapes.append((r.numel(), t))
            if groups.targets is not None:
                groups.targets.append(token[r, :t][k])  # in the order of `real`
            start = end
        return groups


def length_cuts(extents: list[int], max_groups: int) -> list[int]:
    """Split ascending sequence lengths into at most ``max_groups`` runs of consecutive ones, minimising
    the attention work: the sum over runs of (sequences in the run) x (its longest)^2, plus for each run
    the work of one longest sequence of the batch (a run's fixed cost). Returns each run's end index."""
    n = len(extents)
    if n == 0:
        return []
    L = torch.tensor(extents, dtype=torch.float64)
    i = torch.arange(n + 1).unsqueeze(1)
    j = torch.arange(n + 1).unsqueeze(0)
    # cost[i, j]: sequences i .. j-1 as one run
    cost = torch.where(i < j, (j - i) * L[(j - 1).clamp(min=0)] ** 2, float("inf"))
    fixed = float(L[-1]) ** 2
    best, back = cost[0], []  # best[j]: sequences 0 .. j-1 in g runs
    totals = [float(best[n]) + fixed]
    for _ in range(1, max_groups):
        best, arg = (best.unsqueeze(1) + cost).min(0)
        back.append(arg)
        totals.append(float(best[n]) + fixed * (len(back) + 1))
    runs = min(range(len(totals)), key=totals.__getitem__)  # runs + 1 groups
    cuts, end = [n], n
    for arg in reversed(back[:runs]):
        end = int(arg[end])
        cuts.append(end)
    return sorted(cuts)


def self_attention(module: BertSelfAttention, x: torch.Tensor, padding: Padding | None, shape: tuple[int, int],
                   queries: torch.Tensor | None = None) -> torch.Tensor:
    """`BertSelfAttention` on unpadded rows: x (N, H) real tokens, or (B*T, H) when the batch has no
    padding -> (N, H). With ``queries`` (B*K, H), the states at K chosen positions per sequence,
    attention runs from those only -> (B*K, H)."""
    B, T = shape
    A, D = module.num_heads, module.head_dim
    if queries is None:
        qkv = linear(x, module.query, module.key, module.value)  # (N, 3H)
        if padding is not None and padding.groups is not None:
            return _grouped(qkv, padding.groups, A, D)
        qkv = padding.pad(qkv) if padding is not None else qkv.view(B, T, -1)  # (B, T, 3H)
        q, k, v = qkv.view(B, T, 3, A, D).permute(2, 0, 3, 1, 4)  # 3 x (B, A, T, D)
    else:
        kv = linear(x, module.key, module.value)  # (N, 2H)
        kv = padding.pad(kv) if padding is not None else kv.view(B, T, -1)  # (B, T, 2H)
        k, v = kv.view(B, T, 2, A, D).permute(2, 0, 3, 1, 4)  # 2 x (B, A, T, D)
        q = linear(queries, module.query).view(B, -1, A, D).transpose(1, 2)  # (B, A, K, D)
    key_mask = padding.key_mask if padding is not None else None
    p = module.dropout_p if module.training else 0.0
    if p > 0.0 and q.device.type == "cpu":
        # On CPU, SDPA with dropout runs this same unfused path with bernoulli_; written out
        # here it draws the mask with the cheaper `dropout_mask`.
        y = written_out_attention(q, k, v, key_mask, p)
    else:
        y = attention(q, k, v, key_mask, p)
    # y: (B, A, T or K, D), softmax(QK^T / sqrt(D)) V
    y = y.transpose(1, 2).reshape(B, q.shape[2], -1)  # (B, T or K, H)
    if queries is not None:
        return y.view(-1, y.shape[-1])  # (B*K, H)
    return padding.unpad(y) if padding is not None else y.view(B * T, -1)


def _grouped(qkv: torch.Tensor, groups: LengthGroups, A: int, D: int) -> torch.Tensor:
    """qkv (N, 3H) -> (N, H): attention run per length group (inference; see `LengthGroups`)."""
    N = qkv.shape[0]
    each = zip(groups.gathers, groups.key_masks, groups.real, groups.shapes)
    if qkv.dtype == torch.bfloat16:
        # Written-out attention (as `attention` chooses in bf16), head-major: a group gathered as
        # (3, A, b*t, D) gives q, k, v that enter the batched matrix products without copies.
        heads = qkv.view(N, 3, A, D).permute(1, 2, 0, 3)  # (3, A, N, D), a view
        out = None if groups.targets is None else qkv.new_empty(N, A, D)
        for g, (gather, key_mask, real, (b, t)) in enumerate(each):
            q, k, v = heads.index_select(2, gather).view(3, A, b, t, D)  # 3 x (A, b, t, D)
            y = written_out_attention(q, k, v, key_mask.transpose(0, 1), 0.0)  # (A, b, t, D)
            y = y.view(A, b * t, D).index_select(1, real)  # (A, N_g, D)
            if out is None:
                return y.permute(1, 0, 2).reshape(N, A * D)  # (N, H)
            out.index_copy_(0, groups.targets[g], y.transpose(0, 1))  # its rows of (N, A, D)
        return out.view(N, A * D)
    # PyTorch's fused kernel, whose output is laid out (b, t, A, D): rows in token order within a group
    out = None if groups.targets is None else qkv.new_empty(N, A * D)
    for g, (gather, key_mask, real, (b, t)) in enumerate(each):
        q, k, v = qkv.index_select(0, gather).view(b, t, 3, A, D).permute(2, 0, 3, 1, 4)  # 3 x (b, A, t, D)
        y = attention(q, k, v, key_mask, 0.0)  # (b, A, t, D)
        y = y.transpose(1, 2).reshape(b * t, A * D).index_select(0, real)  # (N_g, H)
        if out is None:
            return y
        out.index_copy_(0, groups.targets[g], y)
    return out


def written_out_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
                          p: float) -> torch.Tensor:
    """softmax(QK^T / sqrt(D)) V with padding keys masked and (p > 0) `dropout_mask` on the probabilities;
    q (..., T or K, D), k, v (..., T, D), key_mask broadcastable to (..., 1, T) -> (..., T or K, D).

    With a backward to come (training), the probabilities stay in the dtype of the scores, bf16 under
    autocast: PyTorch's CPU softmax (and its backward) computes in float32 inside and rounds once,
    which is what the product with V needs anyway, so no (B, A, T, T) tensor is converted in either
    direction; the padding mask enters as an additive -inf bias inside the scores' product (baddbmm).
    Without one (inference), a float32 softmax, one cast and an in-place mask are faster (5-7 % of a
    BERT-mini forward).
    """
    *batch, K, D = q.shape
    T = k.shape[-2]
    scale = 1.0 / math.sqrt(D)
    if not torch.is_grad_enabled():
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
        bias = bias.expand(*batch, 1, T).reshape(-1, 1, T)  # (b, 1, T), small
    probs = _Scores.apply(q3, k3, bias, scale).softmax(-1)  # (b, K, T)
    if p > 0.0:
        probs = probs * dropout.dropout_mask(torch.Size([*batch, K, T]), p, probs.device, probs.dtype).view(-1, K, T)
    return torch.bmm(probs.to(v.dtype), v.reshape(-1, T, v.shape[-1])).view(*batch, K, v.shape[-1])


class _Scores(torch.autograd.Function):
    """bias + scale * q @ k^T for q (b, K, D), k (b, T, D), bias (b, 1, T) or None -> (b, K, T).

    The same as autograd through ``baddbmm(bias, q, k.transpose(1, 2))``, except that the gradient of k
    is computed as (b, T, D) directly instead of as a transposed (b, D, T), so the fused QKV
    projection's backward gathers q, k and v gradients that all have unit inner stride."""

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
              p: float) -> torch.Tensor:
    """PyTorch's fused attention (flash / memory-efficient kernels where the device has them), except
    in bf16 inference on CPU (no gradient), where its flash kernel takes 1.5-1.8x the time of the
    written-out matrix products at BERT-mini and -base head sizes."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and not torch.is_grad_enabled():
        return written_out_attention(q, k, v, key_mask, p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p)
