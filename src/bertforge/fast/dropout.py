"""Dropout with cheaper masks on CPU: `dropout_mask`, and the forward `speed_up` gives ``nn.Dropout``
modules."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["dropout_mask", "dropout_forward"]


def dropout_mask(shape: torch.Size, p: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A dropout mask of ``shape``: 0 where dropped, 1 / (1 - p) where kept (same dtype as the values).

    Four 16-bit uniform draws from each 64-bit random word of the default generator: about 4x cheaper
    on CPU than ``bernoulli_``. ``p`` is rounded to a multiple of 1/65536 (0.1 -> 0.100006), and the
    scale uses the rounded value, so the expectation is exact.
    """
    n = math.prod(shape)
    info = torch.iinfo(torch.int64)
    words = torch.randint(info.min, info.max, ((n + 3) // 4,), dtype=torch.int64, device=device)
    draws = words.view(torch.int16)[:n].view(shape)  # uniform over [-32768, 32767]
    dropped = round(p * 65536)
    keep = draws >= dropped - 32768
    return keep.to(dtype) * (65536 / (65536 - dropped))


def dropout_forward(self: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """``nn.Dropout.forward`` with `dropout_mask`'s draws on CPU; elsewhere (and in place, or p = 1)
    PyTorch's own, fused on GPUs."""
    if not self.training or self.p == 0.0:
        return x
    if x.device.type != "cpu" or self.inplace or self.p >= 1.0:
        return F.dropout(x, self.p, True, self.inplace)
    return x * dropout_mask(x.shape, self.p, x.device, x.dtype)
