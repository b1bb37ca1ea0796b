"""Training objectives as plain functions of logits and labels. Label value -100 (`IGNORE_INDEX`, from
the loader that pads labels) means "ignore this position", as in transformers and PyTorch's cross-entropy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertforge.data.loader import IGNORE_INDEX

__all__ = ["IGNORE_INDEX", "masked_lm_loss", "next_sentence_loss", "pretraining_loss", "sequence_classification_loss",
           "token_classification_loss", "span_loss", "multiple_choice_loss"]


def masked_lm_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over the predicted positions (mean, or "sum"). logits (..., V), labels (...)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction=reduction)


def next_sentence_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """logits (B, 2), labels (B,) with 0 = IsNext, 1 = NotNext."""
    return F.cross_entropy(logits.float(), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction)


def pretraining_loss(prediction_logits: torch.Tensor, seq_relationship_logits: torch.Tensor | None,
                     mlm_labels: torch.Tensor, nsp_labels: torch.Tensor | None) -> torch.Tensor:
    """The paper's objective: mean MLM cross-entropy + mean NSP cross-entropy (NSP when given)."""
    loss = masked_lm_loss(prediction_logits, mlm_labels)
    if nsp_labels is not None and seq_relationship_logits is not None:
        loss = loss + next_sentence_loss(seq_relationship_logits, nsp_labels)
    return loss


def infer_problem_type(num_labels: int, labels: torch.Tensor) -> str:
    """transformers' rule: 1 output = regression; integer labels = single-label; else multi-label."""
    if num_labels == 1:
        return "regression"
    if labels.dtype in (torch.long, torch.int, torch.int16, torch.int8, torch.uint8):
        return "single_label_classification"
    return "multi_label_classification"


def sequence_classification_loss(logits: torch.Tensor, labels: torch.Tensor,
                                 problem_type: str | None = None, reduction: str = "mean") -> torch.Tensor:
    """MSE (regression), cross-entropy (single label) or BCE-with-logits (multi-label), mean or
    "sum". logits (B, C)."""
    num_labels = logits.shape[-1]
    problem_type = problem_type or infer_problem_type(num_labels, labels)
    if problem_type == "regression":
        if num_labels == 1:
            return F.mse_loss(logits.squeeze(-1).float(), labels.squeeze(-1).float(), reduction=reduction)
        return F.mse_loss(logits.float(), labels.float(), reduction=reduction)
    if problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, num_labels).float(), labels.view(-1), ignore_index=IGNORE_INDEX,
                               reduction=reduction)
    if problem_type == "multi_label_classification":
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction=reduction)
    raise ValueError(f"unknown problem_type {problem_type!r}")


def token_classification_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over tagged positions (sub-word continuations and padding carry -100), mean or
    "sum". logits (B, T, C)."""
    return masked_lm_loss(logits, labels, reduction)


def span_loss(start_logits: torch.Tensor, end_logits: torch.Tensor,
              start_positions: torch.Tensor, end_positions: torch.Tensor, reduction: str = "mean",
              attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(CE(start) + CE(end)) / 2 over the sequence, mean over the batch or "sum". logits (B, T), positions (B,).

    With ``attention_mask`` (B, T), padding is left out of both softmaxes, so it changes neither the
    loss nor its gradient (transformers' loss differs on padded batches). Targets outside the sequence
    or on padding are ignored; impossible answers point at [CLS], position 0, like any other span.
    """
    T = start_logits.shape[1]
    start = start_positions.reshape(-1).clamp(0, T)
    end = end_positions.reshape(-1).clamp(0, T)
    start_logits, end_logits = start_logits.float(), end_logits.float()
    if attention_mask is not None:
        pad = attention_mask.reshape(start_logits.shape) == 0
        start_logits = start_logits.masked_fill(pad, float("-inf"))
        end_logits = end_logits.masked_fill(pad, float("-inf"))
        # a target on padding has no probability left: ignored like one outside the sequence
        padded = torch.cat([pad, pad.new_ones(pad.shape[0], 1)], dim=1)
        start = start.masked_fill(padded.gather(1, start[:, None])[:, 0], T)
        end = end.masked_fill(padded.gather(1, end[:, None])[:, 0], T)
    return (F.cross_entropy(start_logits, start, ignore_index=T, reduction=reduction)
            + F.cross_entropy(end_logits, end, ignore_index=T, reduction=reduction)) / 2


def multiple_choice_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of the softmax over choices, mean or "sum". logits (B, C), labels (B,) = index of
    the right choice."""
    return F.cross_entropy(logits.float(), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction=reduction)
