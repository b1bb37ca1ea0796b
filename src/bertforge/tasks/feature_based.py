"""The paper's feature-based approach on the shared loop: the frozen encoder's features computed once.

A frozen encoder (`bertforge.model.heads.BertFeatureBiLSTMForTokenClassification` and its sequence
twin with ``freeze``) gives the same hidden states in every epoch, so `cache_features` computes them
once before training and keeps the chosen layers of each item's real tokens in memory as float16.
`CachedObjective` hands them to the model, so training steps run the BiLSTM and the output layer alone.
Evaluation runs the whole model, so a saved model needs no cache.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.tasks.encoding import EncodedSet, predict_items

__all__ = ["CachedFeatures", "cache_features", "CachedObjective"]

logger = logging.getLogger("bertforge")


class CachedFeatures:
    """An `EncodedSet` whose batches also hold ``features`` (B, n, T, H) float32: the chosen layers of
    each item, computed beforehand, padded with zeros to the batch's length."""

    def __init__(self, encoded: EncodedSet, cache: Sequence[torch.Tensor]):
        """``cache``: per item, (n, t, H) with t its tokens."""
        if len(cache) != len(encoded):
            raise ValueError(f"{len(cache)} cached items for {len(encoded)} encoded items")
        self.encoded = encoded
        self.cache = cache

    def __len__(self) -> int:
        return len(self.encoded)

    @property
    def lengths(self) -> np.ndarray:
        return self.encoded.lengths

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        batch = self.encoded.collate(indices)
        T = batch["input_ids"].shape[-1]
        n, _, H = self.cache[indices[0]].shape
        out = torch.zeros(len(indices), n, T, H)
        for i, k in enumerate(indices):
            got = self.cache[k]
            out[i, :, :got.shape[1]] = got
        batch["features"] = out
        return batch


@torch.no_grad()
def cache_features(model: nn.Module, encoded: EncodedSet, batch_size: int, device: torch.device | str,
                   dist: Any = None) -> CachedFeatures:
    """One pass of ``model``'s frozen encoder over every item of ``encoded`` (`predict_items`: each
    process a part, all get the whole) -> `CachedFeatures`."""
    if not getattr(model, "frozen", False):
        raise ValueError("only a frozen encoder's features can be cached (they change as it trains)")
    was_training = model.training
    model.eval()

    def run(m: nn.Module, batch: dict[str, torch.Tensor], idx: Sequence[int]) -> list[torch.Tensor]:
        states = m.encode_features(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        lengths = batch["attention_mask"].sum(-1).tolist()
        return [states[i, :, :t].to("cpu", torch.float16) for i, t in enumerate(lengths)]

    cache = predict_items(model, encoded, batch_size, device, run, dist)
    model.train(was_training)
    n, _, H = cache[0].shape
    logger.info("features: cached %d layer%s x %d values for %s items (%.1f MB, float16)", n, "s" * (n > 1), H,
                f"{len(cache):,}", sum(c.numel() for c in cache) * 2 / 2**20)
    return CachedFeatures(encoded, cache)


class CachedObjective:
    """A family's `bertforge.train.loop.Objective` over `CachedFeatures` batches: the model gets each
    batch's ``features``, so its encoder does not run."""

    def __init__(self, objective: Any):
        self.objective = objective

    def counts(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        return self.objective.counts(batch)

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return self.objective.forward(functools.partial(model, features=batch["features"]), batch)

    def metrics(self, loss_sums: dict[str, float], counts: dict[str, float],
                stats: dict[str, float]) -> dict[str, float]:
        return self.objective.metrics(loss_sums, counts, stats)
