"""The BERT encoder: embeddings, self-attention, post-LN Transformer blocks, pooler, `BertModel`.

Shape letters used in comments:
    B batch, T sequence length, H hidden size, A attention heads, D head size (H / A),
    I intermediate size, N real (non-padding) tokens in a batch, V vocab size.

Module and parameter names are transformers' (``embeddings.word_embeddings``,
``encoder.layer.N.attention.self.query``, ...) because the state dict *is* the checkpoint format:
keeping the names lets weights move between the two libraries with no conversion table.

Speed, without changing the maths:
  * attention runs through ``scaled_dot_product_attention`` (flash / memory-efficient kernels
    where the device has them);
  * the query, key and value projections run as one matrix product;
  * when a batch has padding, every dense layer runs on the N real tokens only ("unpadding"; in CPU
    training N is rounded up to a multiple of 64 with padding slots, see `_Padding.round_rows`);
    only attention sees the padded (B, T) layout. Outputs at padding positions are then zero,
    where transformers returns values computed from padding; no real position is affected;
  * inference on CPU (eval mode, no gradient) runs attention per group of similar lengths
    (`_LengthGroups`), and in bf16 as written-out matrix products (faster there than the fused kernel).

While ``torch.export`` traces the model (ONNX export), dense layers run on every slot instead
(`_Masked`): unpadding's shapes depend on the mask's values, which one exported graph cannot.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from bertforge.model.config import BertConfig

__all__ = ["BertModel", "BertModelOutput", "BertPreTrainedModel", "Dropout", "activation", "dropout_mask",
           "freeze_weights", "frozen_weights", "gather_positions", "linear"]


def activation(name: str):
    """The feed-forward non-linearity named by ``hidden_act`` (transformers' names)."""
    if name in ("gelu", "gelu_python"):
        return F.gelu  # exact erf form
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")  # the TF release's approximation
    if name == "relu":
        return F.relu
    if name in ("silu", "swish"):
        return F.silu
    raise ValueError(f"unknown hidden_act {name!r}")


@dataclass
class _Padding:
    """Where the real tokens of a padded (B, T) batch are, for unpadding dense layers."""

    indices: torch.Tensor  # (N,) flat positions in B*T of the real tokens, then of `riders`
    key_mask: torch.Tensor  # (B, 1, 1, T) bool, True = attend
    batch: int
    length: int
    groups: _LengthGroups | None = None  # inference on CPU: attention per group of similar lengths
    riders: int = 0  # padding slots that ride along at the end of `indices` (see `round_rows`)

    def pad(self, x: torch.Tensor, real_only: bool = False) -> torch.Tensor:
        """(N, ...) -> (B, T, ...) with zeros at padding (``real_only``: riders dropped, so zeros at
        every padding slot; otherwise riders keep their finite values there, which attention masks)."""
        indices = self.indices
        if real_only and self.riders:
            indices, x = indices[:-self.riders], x[:-self.riders]
        out = x.new_zeros(self.batch * self.length, *x.shape[1:])
        out = out.index_copy(0, indices, x)
        return out.view(self.batch, self.length, *x.shape[1:])

    def round_rows(self, keep: torch.Tensor, multiple: int = 64) -> None:
        """Append padding slots to `indices` until the row count is a multiple of ``multiple`` (or
        every slot). The dense layers' matrix products then take a few dozen row counts over a run
        instead of one per batch. oneDNN JIT-compiles bf16 matrix-product kernels for every new
        shape (code buffers mmap-ed and page-faulted afresh): MiniLM fine-tuning on MR took 0.19 s a
        step with a new row count every batch and 0.154 s with multiples of 64. A rider's rows are
        computed and dropped: as a key it is masked, as a query its output is never read, and its
        gradient is zero."""
        n = self.indices.numel()
        target = min(-(-n // multiple) * multiple, self.batch * self.length)
        if target > n:
            slots = (~keep).reshape(-1).nonzero().squeeze(1)[:target - n]
            self.indices = torch.cat([self.indices, slots])
            self.riders = slots.numel()

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)."""
        return x.reshape(self.batch * self.length, *x.shape[2:]).index_select(0, self.indices)


@dataclass
class _LengthGroups:
    """Inference only (CPU, no gradient): the sequences of a padded batch in a few groups of similar
    length, so that attention, whose cost grows with T^2, runs per group on a layout padded to the
    group's longest sequence instead of the batch's. The dense layers already skip padding; on
    mixed-length batches most of the padded attention work is padding (Wikipedia-leads sentences in
    batches of 32: 76 %; two groups cut the work to 43 % of the padded layout's). Up to four groups
    (31 %) measured no faster (within 1 %, BERT-mini and -base) and cost more small operations.

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
    def build(cls, keep: torch.Tensor, indices: torch.Tensor) -> _LengthGroups:
        """keep: (B, T) bool; indices: (N,) flat positions of its real tokens (row-major)."""
        B, T = keep.shape
        positions = torch.arange(1, T + 1, device=keep.device)
        extent = (keep * positions).amax(1)  # (B,): last real position + 1 (masks need not be contiguous)
        extents, rows = extent.sort()
        rows = rows[extents > 0]  # a sequence without real tokens has nothing to attend
        cuts = _length_cuts(extents[extents > 0].tolist(), cls.MAX_GROUPS)
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


def _length_cuts(extents: list[int], max_groups: int) -> list[int]:
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


@dataclass
class _Masked:
    """`_Padding`'s stand-in while exporting (``torch.export``, ONNX): dense layers run on all B*T
    slots, so no shape depends on the mask's values and one graph serves every batch and length.
    Attention masks padding keys as before, and `pad` zeroes padding, so outputs equal the unpadded
    path's everywhere (padding positions included)."""

    keep: torch.Tensor  # (B, T) bool, True = real token
    key_mask: torch.Tensor  # (B, 1, 1, T)
    batch: int
    length: int
    groups = None  # no length groups (see `_LengthGroups`)

    def pad(self, x: torch.Tensor, real_only: bool = False) -> torch.Tensor:
        """(B*T, F) -> (B, T, F) with zeros at padding (no riders here: ``real_only`` changes nothing)."""
        return x.view(self.batch, self.length, -1).masked_fill(~self.keep.unsqueeze(-1), 0.0)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, F) -> (B*T, F)."""
        return x.reshape(self.batch * self.length, -1)


def _exporting() -> bool:
    """True while ``torch.export`` traces the model (``torch.compiler.is_exporting``, torch >= 2.7)."""
    is_exporting = getattr(torch.compiler, "is_exporting", None)
    return is_exporting is not None and is_exporting()


def dropout_mask(shape: torch.Size, p: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A dropout mask of ``shape``: 0 where dropped, 1 / (1 - p) where kept (same dtype as the values).

    Drawn from 64-bit random words, each giving four 16-bit uniform draws, from the default
    generator (so a saved and restored RNG state reproduces it). About 4x cheaper on CPU than
    ``bernoulli_``, which draws one random number per element; ``p`` is rounded to a multiple of
    1/65536 (0.1 -> 0.100006), and the scale uses the rounded value, so the expectation is exact.
    """
    n = math.prod(shape)
    info = torch.iinfo(torch.int64)
    words = torch.randint(info.min, info.max, ((n + 3) // 4,), dtype=torch.int64, device=device)
    draws = words.view(torch.int16)[:n].view(shape)  # uniform over [-32768, 32767]
    dropped = round(p * 65536)
    keep = draws >= dropped - 32768
    return keep.to(dtype) * (65536 / (65536 - dropped))


class Dropout(nn.Module):
    """``nn.Dropout`` with `dropout_mask`'s cheaper draws on CPU; elsewhere PyTorch's own (fused on GPUs)."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, True)
        return x * dropout_mask(x.shape, self.p, x.device, x.dtype)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def gather_positions(hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """hidden (B, T, H), positions (B, P) -> (B, P, H): the states at the given positions."""
    index = positions.long().unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    return hidden.gather(1, index)


class _RowGradient:
    """The word-embedding gradient of a CPU training step, written row by row into a buffer kept
    across steps.

    PyTorch's embedding backward builds a fresh dense (V, H) gradient each step: zero-filling it
    (47 MB at V=30522, H=384) costs about 5% of a MiniLM fine-tuning step on CPU, for the few
    hundred rows a batch touches. Here the lookup's backward adds its rows straight into a kept
    buffer that becomes ``weight.grad``, and only the rows written since it was last zeroed are
    zeroed again. When the weight also gets a dense gradient from another use (the MLM decoder tied
    to it), any row may be written: the buffer is then zeroed whole, as PyTorch would. Used only
    where nothing else hooks the gradient (one process, eager mode, CPU): `BertEmbeddings` checks.
    """

    def __init__(self, weight: torch.Tensor, padding_idx: int | None):
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


# One per word-embedding weight (the weight holds it through its hook; nothing else keeps either alive).
_ROW_GRADIENTS: WeakIdKeyDictionary = WeakIdKeyDictionary()


class _LookupRowGrad(torch.autograd.Function):
    """``F.embedding`` whose weight gradient goes through `_RowGradient` (returned as None to autograd)."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, ids: torch.Tensor, padding_idx: int | None) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.weight = weight
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        (ids,) = ctx.saved_tensors
        _ROW_GRADIENTS[ctx.weight].add(ctx.weight, ids, grad)
        return None, None, None


_FROZEN: WeakIdKeyDictionary = WeakIdKeyDictionary()  # nn.Linear -> {(layer count, dtype): cache entry}


def freeze_weights(model: nn.Module, frozen: bool = True) -> nn.Module:
    """Promise that ``model``'s weights stay as they are (``frozen=False`` withdraws the promise), so
    that inference through it (eval mode, no gradient) reuses its projection weights stacked and cast
    to autocast's dtype instead of concatenating and casting them on every forward (autocast casts
    weights anew each time its context is entered). Caches are rebuilt when a weight is replaced
    (``.to()``, new tensors) or changed in place (its version counter moves: ``load_state_dict``,
    ``copy_``), and dropped whenever a forward runs in train mode. A fused optimizer's step moves no
    version counter: train in train mode, or unfreeze. The caches cost one copy of the weights (in
    bf16: half) and live as long as the layers. `Predictor` freezes its model; ``bertforge
    features`` uses `frozen_weights`."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            if frozen:
                _FROZEN.setdefault(m, {})
            else:
                _FROZEN.pop(m, None)
    return model


@contextlib.contextmanager
def frozen_weights(model: nn.Module) -> Iterator[nn.Module]:
    """`freeze_weights` for the length of a ``with`` block (layers frozen before it stay frozen)."""
    before = [m for m in model.modules() if isinstance(m, nn.Linear) and m in _FROZEN]
    freeze_weights(model)
    try:
        yield model
    finally:
        freeze_weights(model, False)
        for m in before:
            _FROZEN[m] = {}


def linear(x: torch.Tensor, *layers: nn.Linear) -> torch.Tensor:
    """The outputs of ``layers`` side by side, (..., sum of their out_features), from one matrix product
    with their weights stacked (one layer: ``layers[0](x)``). The stacked (and cast) weights of frozen
    layers are cached in inference (see `freeze_weights`), never while exporting or compiling, where
    the weights stay graph inputs. A layer that is not a plain `nn.Linear` (replaced by an adapter or
    a quantized module) or carries hooks is called as a module instead."""
    if any(type(m) is not nn.Linear or m._forward_hooks or m._forward_pre_hooks for m in layers):
        return layers[0](x) if len(layers) == 1 else torch.cat([m(x) for m in layers], -1)
    n = len(layers)
    params = [m.weight for m in layers] + [m.bias for m in layers]
    entries = _FROZEN.get(layers[0])
    if entries is not None and (layers[0].training or torch.is_grad_enabled() or _exporting()
                                or torch.compiler.is_compiling()):
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


class BertEmbeddings(nn.Module):
    """word + learned position + token type embeddings, summed, LayerNorm, dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def _words(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, H); on one CPU process in eager training, through `_RowGradient`."""
        weight, padding_idx = self.word_embeddings.weight, self.word_embeddings.padding_idx
        if (weight.device.type == "cpu" and weight.requires_grad and torch.is_grad_enabled()
                and not (torch.distributed.is_available() and torch.distributed.is_initialized())
                and not torch.compiler.is_compiling()):
            if weight not in _ROW_GRADIENTS:
                _ROW_GRADIENTS[weight] = _RowGradient(weight, padding_idx)
            return _LookupRowGrad.apply(weight, input_ids, padding_idx)
        return self.word_embeddings(input_ids)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        # input_ids, token_type_ids: (B, T) -> (B, T, H); with rows (N,), flat positions in B*T, -> (N, H)
        length = input_ids.shape[1]
        if rows is None:
            positions = self.position_embeddings.weight[:length]  # (T, H), broadcast over B
            x = self._words(input_ids) + positions + self.token_type_embeddings(token_type_ids)
        else:  # unpadded: look up only the rows the dense layers will use
            x = (self._words(input_ids.reshape(-1).index_select(0, rows)) + self.position_embeddings(rows % length)
                 + self.token_type_embeddings(token_type_ids.reshape(-1).index_select(0, rows)))
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product attention over the whole sequence (no causal mask)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, padding: _Padding | _Masked | None, shape: tuple[int, int],
                queries: torch.Tensor | None = None) -> torch.Tensor:
        # x: (N, H) real tokens, or (B*T, H) when the batch has no padding.
        # queries: (B*K, H) states at K chosen positions per sequence: attend from those only.
        B, T = shape
        A, D = self.num_heads, self.head_dim
        if queries is None:
            qkv = linear(x, self.query, self.key, self.value)  # (N, 3H)
            if padding is not None and padding.groups is not None:
                return self._grouped(qkv, padding.groups)
            qkv = padding.pad(qkv) if padding is not None else qkv.view(B, T, -1)  # (B, T, 3H)
            q, k, v = qkv.view(B, T, 3, A, D).permute(2, 0, 3, 1, 4)  # 3 x (B, A, T, D)
        else:
            kv = linear(x, self.key, self.value)  # (N, 2H)
            kv = padding.pad(kv) if padding is not None else kv.view(B, T, -1)  # (B, T, 2H)
            k, v = kv.view(B, T, 2, A, D).permute(2, 0, 3, 1, 4)  # 2 x (B, A, T, D)
            q = linear(queries, self.query).view(B, -1, A, D).transpose(1, 2)  # (B, A, K, D)
        key_mask = padding.key_mask if padding is not None else None
        p = self.dropout_p if self.training else 0.0
        if p > 0.0 and q.device.type == "cpu":
            # On CPU, SDPA with dropout runs this same unfused path with bernoulli_; written out
            # here it draws the mask with the cheaper `dropout_mask`.
            y = _written_out_attention(q, k, v, key_mask, p)
        else:
            y = _attention(q, k, v, key_mask, p)
        # y: (B, A, T or K, D), softmax(QK^T / sqrt(D)) V
        y = y.transpose(1, 2).reshape(B, q.shape[2], -1)  # (B, T or K, H)
        if queries is not None:
            return y.view(-1, y.shape[-1])  # (B*K, H)
        return padding.unpad(y) if padding is not None else y.view(B * T, -1)

    def _grouped(self, qkv: torch.Tensor, groups: _LengthGroups) -> torch.Tensor:
        """qkv (N, 3H) -> (N, H): attention run per length group (inference; see `_LengthGroups`)."""
        A, D = self.num_heads, self.head_dim
        N = qkv.shape[0]
        each = zip(groups.gathers, groups.key_masks, groups.real, groups.shapes)
        if qkv.dtype == torch.bfloat16:
            # Written-out attention (as `_attention` chooses in bf16), head-major: a group gathered as
            # (3, A, b*t, D) gives q, k, v that enter the batched matrix products without copies.
            heads = qkv.view(N, 3, A, D).permute(1, 2, 0, 3)  # (3, A, N, D), a view
            out = None if groups.targets is None else qkv.new_empty(N, A, D)
            for g, (gather, key_mask, real, (b, t)) in enumerate(each):
                q, k, v = heads.index_select(2, gather).view(3, A, b, t, D)  # 3 x (A, b, t, D)
                y = _written_out_attention(q, k, v, key_mask.transpose(0, 1), 0.0)  # (A, b, t, D)
                y = y.view(A, b * t, D).index_select(1, real)  # (A, N_g, D)
                if out is None:
                    return y.permute(1, 0, 2).reshape(N, A * D)  # (N, H)
                out.index_copy_(0, groups.targets[g], y.transpose(0, 1))  # its rows of (N, A, D)
            return out.view(N, A * D)
        # PyTorch's fused kernel, whose output is laid out (b, t, A, D): rows in token order within a group
        out = None if groups.targets is None else qkv.new_empty(N, A * D)
        for g, (gather, key_mask, real, (b, t)) in enumerate(each):
            q, k, v = qkv.index_select(0, gather).view(b, t, 3, A, D).permute(2, 0, 3, 1, 4)  # 3 x (b, A, t, D)
            y = _attention(q, k, v, key_mask, 0.0)  # (b, A, t, D)
            y = y.transpose(1, 2).reshape(b * t, A * D).index_select(0, real)  # (N_g, H)
            if out is None:
                return y
            out.index_copy_(0, groups.targets[g], y)
        return out


def _written_out_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
                           p: float) -> torch.Tensor:
    """softmax(QK^T / sqrt(D)) V with padding keys masked and (p > 0) `dropout_mask` on the probabilities;
    q (..., T or K, D), k, v (..., T, D), key_mask broadcastable to (..., 1, T) -> (..., T or K, D).

    With a backward to come (training), the probabilities stay in the dtype of the scores, bf16 under
    autocast: PyTorch's CPU softmax (and its backward) computes in float32 inside and rounds once,
    which is what the product with V needs anyway, so no (B, A, T, T) tensor is converted in either
    direction; the padding mask enters as an additive -inf bias inside the scores' product (baddbmm).
    Without one (inference), a float32 softmax, one cast and an in-place mask measured 5-7 % faster
    over a BERT-mini forward.
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
            probs = probs * dropout_mask(probs.shape, p, probs.device, probs.dtype)
        return probs @ v
    q3, k3 = q.reshape(-1, K, D), k.reshape(-1, T, D)  # (b, K, D), (b, T, D)
    bias = None
    if key_mask is not None:
        bias = torch.zeros(key_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~key_mask, float("-inf"))
        bias = bias.expand(*batch, 1, T).reshape(-1, 1, T)  # (b, 1, T), small
    probs = _Scores.apply(q3, k3, bias, scale).softmax(-1)  # (b, K, T)
    if p > 0.0:
        probs = probs * dropout_mask(torch.Size([*batch, K, T]), p, probs.device, probs.dtype).view(-1, K, T)
    return torch.bmm(probs.to(v.dtype), v.reshape(-1, T, v.shape[-1])).view(*batch, K, v.shape[-1])


class _Scores(torch.autograd.Function):
    """bias + scale * q @ k^T for q (b, K, D), k (b, T, D), bias (b, 1, T) or None -> (b, K, T).

    The same as autograd through ``baddbmm(bias, q, k.transpose(1, 2))``, except that the gradient of k
    is computed as (b, T, D) directly instead of as a transposed (b, D, T), so the fused QKV
    projection's backward gathers q, k and v gradients that all have unit inner stride. (The gain of
    this part alone was not measured apart from the rest of this attention's changes.)"""

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


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
               p: float) -> torch.Tensor:
    """PyTorch's fused attention (flash / memory-efficient kernels where the device has them), except
    in bf16 inference on CPU (no gradient), where its flash kernel took 1.5-1.8x the time of the
    written-out matrix products (torch 2.13, BERT-mini / -base head sizes)."""
    if q.dtype == torch.bfloat16 and q.device.type == "cpu" and not torch.is_grad_enabled():
        return _written_out_attention(q, k, v, key_mask, p)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(linear(y, self.dense)))  # post-LN


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, padding: _Padding | _Masked | None, shape: tuple[int, int]) -> torch.Tensor:
        return self.output(self.self(x, padding, shape), x)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(linear(x, self.dense))  # (N, I)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, y: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dropout(linear(y, self.dense)))  # (N, H)


class BertLayer(nn.Module):
    """One post-LN block: h = LN(x + Attn(x)); out = LN(h + FFN(h))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, padding: _Padding | _Masked | None, shape: tuple[int, int],
                select: torch.Tensor | None = None) -> torch.Tensor:
        """x: (N, H) -> (N, H); or, with ``select`` (B, K) positions, (B*K, H) at those positions only.

        Outputs at a position depend on every position's keys and values but only on that position's
        query, residual and feed-forward, so a selected output equals the full layer's there.
        """
        if select is None:
            h = self.attention(x, padding, shape)
        else:
            B, T = shape
            full = padding.pad(x) if padding is not None else x.view(B, T, -1)  # (B, T, H)
            xs = gather_positions(full, select).reshape(-1, x.shape[-1])  # (B*K, H)
            h = self.attention.output(self.attention.self(x, padding, shape, queries=xs), xs)
        return self.output(self.intermediate(h), h)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))


class BertPooler(nn.Module):
    """tanh(Dense(h_[CLS])): the sentence representation fed to NSP and sentence classifiers."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.activation(linear(hidden[:, 0], self.dense))  # (B, T, H) -> (B, H)


class BertPreTrainedModel(nn.Module):
    """Base of every bertforge model: weight initialisation and checkpoint folders."""

    base_model_prefix = "bert"
    # Parameters a checkpoint may lack without error because this class creates them fresh
    # (task heads); prefixes of state-dict keys.
    _fresh_head_prefixes: tuple[str, ...] = ()

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config

    def init_weights(self) -> None:
        """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorm."""
        self.apply(self._init_module)
        self.tie_weights()

    def _init_module(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def tie_weights(self) -> None:
        """Heads with an output embedding share it with the input embedding (MLM)."""

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def num_parameters(self) -> int:
        """Distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    @classmethod
    def from_pretrained(cls, folder, **kwargs):
        """Load a bertforge or transformers BERT checkpoint folder (see `bertforge.model.checkpoint.load`)."""
        from bertforge.model.checkpoint import load_pretrained

        return load_pretrained(cls, folder, **kwargs)

    def save_pretrained(self, folder, tokenizer=None) -> None:
        """Write ``config.json`` + ``model.safetensors`` (+ the tokenizer files) atomically."""
        from bertforge.model.checkpoint import save_pretrained

        save_pretrained(self, folder, tokenizer=tokenizer)


@dataclass
class BertModelOutput:
    """What `BertModel` returns (transformers' field names)."""

    last_hidden_state: torch.Tensor  # (B, T, H)
    pooler_output: torch.Tensor | None = None  # (B, H)
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L + 1 tensors (B, T, H): embeddings, each layer

    def __getitem__(self, key: str):
        return getattr(self, key)


class BertModel(BertPreTrainedModel):
    """The bare encoder: embeddings -> L post-LN blocks -> (optional) pooler."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_positions: torch.Tensor | None = None,
    ) -> BertModelOutput:
        """input_ids, attention_mask (1 = real token, 0 = padding), token_type_ids: (B, T).

        ``output_positions`` (B, K): compute the last layer at these positions only and return
        ``last_hidden_state`` (B, K, H) for them (equal to the full output there); the pooler then
        reads the first of them, so put [CLS] (0) first when the pooled output is wanted.
        Pre-training needs only [CLS] and the masked positions of the last layer.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if T > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {T} exceeds max_position_embeddings "
                             f"({self.config.max_position_embeddings})")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        padding = None
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise ValueError(f"attention_mask shape {tuple(attention_mask.shape)} != "
                                 f"input_ids shape {tuple(input_ids.shape)}")
            keep = attention_mask.bool()
            if _exporting():  # no branch on the mask's values: one graph for every mask
                padding = _Masked(keep=keep, key_mask=keep[:, None, None, :], batch=B, length=T)
            elif not bool(keep.all()):
                padding = _Padding(
                    indices=keep.reshape(-1).nonzero().squeeze(1),
                    key_mask=keep[:, None, None, :],
                    batch=B, length=T,
                )
                if input_ids.device.type == "cpu" and not self.training and not torch.is_grad_enabled():
                    padding.groups = _LengthGroups.build(keep, padding.indices)
                elif input_ids.device.type == "cpu" and torch.is_grad_enabled():
                    padding.round_rows(keep)
        if isinstance(padding, _Padding):
            x = self.embeddings(input_ids, token_type_ids, rows=padding.indices)  # (N, H)
        else:
            x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
            x = padding.unpad(x) if padding is not None else x.reshape(B * T, -1)  # (B*T, H)
        if output_positions is not None and output_hidden_states:
            raise ValueError("output_positions cannot be combined with output_hidden_states")
        layers = [x]
        last_index = len(self.encoder.layer) - 1
        for i, layer in enumerate(self.encoder.layer):
            x = layer(x, padding, (B, T), output_positions if i == last_index else None)
            layers.append(x)

        def full(h: torch.Tensor) -> torch.Tensor:
            return padding.pad(h, real_only=True) if padding is not None else h.view(B, T, -1)

        last = full(x) if output_positions is None else x.view(B, output_positions.shape[1], -1)
        return BertModelOutput(
            last_hidden_state=last,
            pooler_output=self.pooler(last) if self.pooler is not None else None,
            hidden_states=tuple(full(h) for h in layers) if output_hidden_states else None,
        )

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings
