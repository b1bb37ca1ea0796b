"""A bag-of-words baseline for text classification: unigram + bigram counts, L2-regularised
logistic regression (L-BFGS), the strength chosen on a held-out tenth of the training data.

The demo and the movie-review benchmark report it beside BERT's accuracy for orientation: it is the
classic strong baseline on short sentiment sentences.

    acc = bow_logistic_regression(train_texts, train_labels, dev_texts, dev_labels)["accuracy"]
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["bow_features", "bow_logistic_regression", "L2_GRID"]

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*|[^\sa-z0-9]")
L2_GRID = (1e-7, 3e-7, 1e-6, 3e-6, 1e-5, 3e-5, 1e-4)


def bow_features(texts: Sequence[str]) -> list[list[str]]:
    """Lower-cased words and punctuation, and their bigrams, of each text."""
    out = []
    for t in texts:
        w = _WORD.findall(t.lower())
        out.append(w + [f"{a} {b}" for a, b in zip(w, w[1:])])
    return out


def _vocab(feats: Sequence[Sequence[str]]) -> dict[str, int]:
    v: dict[str, int] = {}
    for f in feats:
        for g in f:
            v.setdefault(g, len(v))
    return v


def _bags(feats: Sequence[Sequence[str]], vocab: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EmbeddingBag inputs (ids, offsets, counts) of the known n-grams of each text."""
    ids: list[int] = []
    offsets: list[int] = []
    counts: list[float] = []
    for f in feats:
        offsets.append(len(ids))
        c: dict[int, int] = {}
        for g in f:
            if g in vocab:
                c[vocab[g]] = c.get(vocab[g], 0) + 1
        ids.extend(c)
        counts.extend(c.values())
    return (torch.tensor(ids, dtype=torch.long), torch.tensor(offsets, dtype=torch.long),
            torch.tensor(counts, dtype=torch.float32))


class _LogReg:
    def __init__(self, x: tuple[torch.Tensor, ...], y: np.ndarray, vocab_size: int, l2: float, iters: int = 100):
        self.bag = torch.nn.EmbeddingBag(vocab_size, 1, mode="sum")
        torch.nn.init.zeros_(self.bag.weight)
        self.bias = torch.nn.Parameter(torch.zeros(1))
        target = torch.from_numpy(np.asarray(y, dtype=np.float32))
        opt = torch.optim.LBFGS([self.bag.weight, self.bias], lr=1.0, max_iter=iters, history_size=20,
                                line_search_fn="strong_wolfe", tolerance_grad=1e-7, tolerance_change=1e-10)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(self.logits(x), target)
            loss = loss + l2 * self.bag.weight.pow(2).sum()
            loss.backward()
            return loss

        opt.step(closure)

    def logits(self, x: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return self.bag(x[0], x[1], per_sample_weights=x[2]).squeeze(1) + self.bias

    def predict(self, x: tuple[torch.Tensor, ...]) -> np.ndarray:
        with torch.no_grad():
            return (self.logits(x) > 0).long().numpy()


def bow_logistic_regression(train_texts: Sequence[str], train_labels: Sequence[int], dev_texts: Sequence[str],
                            dev_labels: Sequence[int], *, seed: int = 0) -> dict[str, Any]:
    """Fit on the training texts (binary labels 0 / 1), score on dev: ``{"accuracy", "l2", "features",
    "inner_val_accuracy", "seconds"}``. The dev set is never used to choose anything."""
    start = time.perf_counter()
    y = np.asarray(train_labels)
    if set(np.unique(y).tolist()) - {0, 1}:
        raise ValueError("bow_logistic_regression takes binary labels 0 / 1")
    feats, dev_feats = bow_features(train_texts), bow_features(dev_texts)
    order = np.random.default_rng(seed).permutation(len(feats))
    inner_val, inner_tr = order[:len(order) // 10], order[len(order) // 10:]
    v_inner = _vocab([feats[i] for i in inner_tr])
    x_tr, x_val = _bags([feats[i] for i in inner_tr], v_inner), _bags([feats[i] for i in inner_val], v_inner)
    torch.manual_seed(seed)
    scores = {l2: float((_LogReg(x_tr, y[inner_tr], len(v_inner), l2).predict(x_val) == y[inner_val]).mean())
              for l2 in L2_GRID}
    best = max(L2_GRID, key=lambda k: (scores[k], k))
    vocab = _vocab(feats)
    model = _LogReg(_bags(feats, vocab), y, len(vocab), best)
    accuracy = float((model.predict(_bags(dev_feats, vocab)) == np.asarray(dev_labels)).mean())
    return {"accuracy": accuracy, "l2": best, "features": len(vocab),
            "inner_val_accuracy": {str(k): v for k, v in scores.items()}, "seconds": time.perf_counter() - start}
