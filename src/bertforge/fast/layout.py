"""Where the real tokens of a padded (B, T) batch are: the unpadded rows the dense layers run on
(`Padding`), in CPU inference the groups of similar lengths attention runs on (`LengthGroups`), and
what a causal model's attention may see (`causal_mask`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LengthGroups", "Padding", "causal_mask", "length_cuts", "right_padded"]


@dataclass
class Padding:
    """Where the real tokens of a padded (B, T) batch are, for unpadding dense layers."""

    indices: torch.Tensor  # (N,) flat positions in B*T of the real tokens, then of `riders`
    key_mask: torch.Tensor  # (B, 1, 1, T) bool, True = attend
    batch: int
    length: int
    groups: LengthGroups | None = None  # inference on CPU: attention per group of similar lengths
    riders: int = 0  # padding slots that ride along at the end of `indices` (see `round_rows`)
    # A causal model's (B, 1, T, T) `causal_mask` where some padding precedes a real token (left
    # padding, holes); None where the padding is at the end, for which PyTorch's is_causal is exact
    causal_mask: torch.Tensor | None = None

    def pad(self, x: torch.Tensor, real_only: bool = False) -> torch.Tensor:
        """(N, ...) -> (B, T, ...) with zeros at padding; riders keep their (finite, masked) values there
        unless ``real_only``."""
        indices = self.indices
        if real_only and self.riders:
            indices, x = indices[:-self.riders], x[:-self.riders]
        out = x.new_zeros(self.batch * self.length, *x.shape[1:])
        out = out.index_copy(0, indices, x)
        return out.view(self.batch, self.length, *x.shape[1:])

    def round_rows(self, keep: torch.Tensor, multiple: int = 64) -> None:
        """Append padding slots to `indices` until the row count is a multiple of ``multiple`` (or
        every slot), so that the matrix products see a few dozen row counts over a run, not one per batch:
        oneDNN JIT-compiles kernels for every new shape (a fifth of a MiniLM fine-tuning step otherwise).
        A rider is masked as a key, its output as a query never read, its gradient zero."""
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
class LengthGroups:
    """Inference only (CPU, no gradient): the sequences of a padded batch in a few groups of similar
    length, so that attention (cost ~ T^2) runs per group on a layout padded to the group's longest
    sequence. On the Wikipedia-leads sentences in batches of 32, 75 % of the padded layout's attention
    work is padding; up to four groups cut the work to 32 % (two: 45 %), and run all-MiniLM-L6-v2 3-4 %
    faster than two in fp32, bf16 and int8 (one thread, AMD EPYC Zen 4); more are no faster.

    Each group's (b, t) layout is read from the unpadded (N, F) rows with one gather; a
    padding slot reads its sequence's first real token (finite, masked as a key, its output dropped).
    """

    gathers: list[torch.Tensor]  # per group: (b*t,) rows of the (N, F) tensor to lay out as (b, t)
    # per group: (b, 1, 1, t) bool; a causal model's (b, 1, t, t) `causal_mask`, or None with `causal`
    key_masks: list[torch.Tensor | None]
    real: list[torch.Tensor]  # per group: positions of its real tokens in the (b*t) layout
    shapes: list[tuple[int, int]]  # per group: (b, t)
    targets: list[torch.Tensor] | None  # per group: the (N,) rows of its real tokens (None: one group, in order)
    causal: bool = False  # a query sees the keys at or before its position only (PyTorch's is_causal)

    MAX_GROUPS = 4

    @classmethod
    def build(cls, keep: torch.Tensor, indices: torch.Tensor, causal: bool = False) -> LengthGroups:
        """keep: (B, T) bool; indices: (N,) flat positions of its real tokens (row-major); ``causal``: a
        left-to-right model's groups. A group's slot t is position t of its sequences, so the causal
        mask carries over as it is."""
        B, T = keep.shape
        at_end = causal and right_padded(keep)
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
        groups = cls([], [], [], [], [] if len(cuts) > 1 else None, causal=at_end)
        start = 0
        for end in cuts:
            r = rows[start:end]
            t = int(extent[r].max())
            k = keep[r, :t]
            groups.gathers.append(torch.where(k, token[r, :t], first[r]).reshape(-1))
            groups.key_masks.append(None if at_end else causal_mask(k) if causal else k[:, None, None, :])
            groups.real.append(k.reshape(-1).nonzero().squeeze(1))
            groups.shapes.append((r.numel(), t))
            if groups.targets is not None:
                groups.targets.append(token[r, :t][k])  # in the order of `real`
            start = end
        return groups


def right_padded(keep: torch.Tensor) -> bool:
    """Whether every sequence of keep (B, T) bool holds its real tokens first and its padding after them
    (as the loaders pad): a causal model's attention then needs the causal mask alone (PyTorch's is_causal)."""
    return not bool((keep[:, 1:] & ~keep[:, :-1]).any())


def causal_mask(keep: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """A causal model's mask over the padded layout of keep (B, T) bool, for queries at every position or
    at ``positions`` (B, K): (B, 1, T or K, T) bool, True = attend. A query at position p sees the real keys
    at positions <= p, as the reference's `make_attention_mask`, and itself: a padding slot with no real
    key before it (left padding) would otherwise see no key and give NaN, which a rider row
    (`Padding.round_rows`) would carry into the next layer (0 x NaN = NaN)."""
    T = keep.shape[1]
    t = torch.arange(T, device=keep.device)
    p = t[:, None] if positions is None else positions.long().unsqueeze(-1)  # (T, 1) or (B, K, 1)
    return ((keep[:, None, :] & (t <= p)) | (t == p)).unsqueeze(1)  # (B, 1, T or K, T)


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
