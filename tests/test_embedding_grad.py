"""The word-embedding gradient kept across CPU steps (`bertforge.fast.embedding.RowGradient`) equals PyTorch's own
dense embedding gradient: for untied models (fine-tuning) and tied ones (MLM), over several steps
with the gradient dropped between them, with accumulation over micro-batches and for padding."""

from __future__ import annotations

import torch
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models

from bertforge.fast import speed_up
from bertforge.fast.embedding import words
from bertforge.model.config import BertConfig
from bertforge.model.heads import BertForMaskedLM, BertForSequenceClassification

CONFIG = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                    max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                    num_labels=3)


def batches(seed: int, n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(1, 50, (3, 7), generator=g)
        ids[0, 5:] = 0  # padding: its row must get no gradient
        out.append(ids)
    return out


def grads(cls, kept: bool, steps: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """The word-embedding gradient after each step (each step: its micro-batches' backward summed);
    ``kept``: a sped-up model, else the reference with PyTorch's own embedding backward."""
    torch.manual_seed(0)
    model = cls(CONFIG)
    if kept:
        speed_up(model)
    weight = model.bert.embeddings.word_embeddings.weight
    out = []
    for micro in steps:
        for ids in micro:
            mask = (ids != 0).long()
            if cls is BertForMaskedLM:
                loss = model(ids, mask, labels=ids.masked_fill(ids == 0, -100)).loss
            else:
                loss = model(ids, mask, labels=torch.tensor([0, 1, 2])).loss
            loss.backward()
        out.append(weight.grad.clone())
        with torch.no_grad():
            for p in model.parameters():  # a step that moves the weights, then the gradient is dropped
                if p.grad is not None:
                    p -= 0.1 * p.grad
        model.zero_grad(set_to_none=True)
    return out


def test_untied_and_tied_models_get_pytorchs_embedding_gradient_over_steps_and_accumulation():
    steps = [batches(1, 1), batches(2, 2), batches(3, 1), batches(4, 3)]
    for cls in (BertForSequenceClassification, BertForMaskedLM):
        want = grads(cls, False, steps)
        got = grads(cls, True, steps)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        if cls is BertForSequenceClassification:  # (tied, the decoder's softmax reaches every row)
            assert all(g[0].abs().sum() == 0 for g in got)  # the padding row
            assert len({int(g.abs().sum(1).gt(0).sum()) for g in got}) > 1  # the steps touch different rows


def test_the_kept_buffer_is_reused_and_only_used_in_training_with_gradients():
    torch.manual_seed(0)
    model = speed_up(BertForSequenceClassification(CONFIG))
    weight = model.bert.embeddings.word_embeddings.weight
    first = None
    for ids in batches(5, 3):
        model(ids, (ids != 0).long(), labels=torch.tensor([0, 1, 2])).loss.backward()
        first = first if first is not None else weight.grad
        assert weight.grad is first  # the same storage every step: no fresh (V, H) buffer
        model.zero_grad(set_to_none=True)
    with torch.no_grad():
        out = words(model.bert.embeddings, batches(6, 1)[0])
    assert out.grad_fn is None
