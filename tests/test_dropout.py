"""The fast layer's CPU dropout (masks from 64-bit random words, `bertforge.fast.dropout`) and the
hand-written CPU attention path that uses it in training (`bertforge.fast.attention`)."""

from __future__ import annotations

import pytest
import torch

from torch import nn

from bertforge.fast import attention as fast_attention
from bertforge.fast import dropout as fast_dropout
from bertforge.fast import speed_up
from bertforge.fast.dropout import dropout_mask
from bertforge.model.heads import BertForPreTraining


@pytest.mark.parametrize("p", [0.1, 0.5, 0.03])
def test_mask_rate_and_scale(p):
    torch.manual_seed(0)
    mask = dropout_mask(torch.Size([1000, 1001]), p, torch.device("cpu"), torch.float32)  # odd size: a partial word
    kept = mask != 0
    dropped = round(p * 65536)
    values = torch.unique(mask).tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(65536 / (65536 - dropped))
    # 1,001,000 draws: the binomial standard deviation of the kept share is below 0.0005
    assert abs(float(kept.float().mean()) - (1 - p)) < 0.003
    assert abs(float(mask.mean()) - 1.0) < 0.005  # the scale keeps the expectation
    # no pattern across the four 16-bit draws of a word: each lane keeps at the same rate
    lanes = kept.reshape(-1)[: 4 * (kept.numel() // 4)].view(-1, 4).float().mean(0)
    assert float(lanes.max() - lanes.min()) < 0.01


def test_mask_follows_the_default_generator():
    shape, cpu = torch.Size([64, 33]), torch.device("cpu")
    torch.manual_seed(7)
    a = dropout_mask(shape, 0.1, cpu, torch.float32)
    state = torch.get_rng_state()
    b = dropout_mask(shape, 0.1, cpu, torch.float32)
    torch.set_rng_state(state)
    assert torch.equal(dropout_mask(shape, 0.1, cpu, torch.float32), b)  # restored state, same mask
    assert not torch.equal(a, b)
    assert dropout_mask(shape, 0.1, cpu, torch.bfloat16).dtype == torch.bfloat16


def test_prepared_dropout_module():
    """An nn.Dropout of a sped-up model draws `dropout_mask` on CPU; it stays an nn.Dropout."""
    drop = speed_up(nn.Dropout(0.2))
    assert type(drop) is nn.Dropout and "forward" in drop.__dict__
    x = torch.randn(50, 40, requires_grad=True)
    assert drop.eval()(x) is x
    assert speed_up(nn.Dropout(0.0)).train()(x) is x
    drop.train()
    torch.manual_seed(3)
    y = drop(x)
    torch.manual_seed(3)
    mask = dropout_mask(x.shape, 0.2, x.device, x.dtype)
    assert torch.equal(y, x * mask)
    y.sum().backward()
    assert torch.equal(x.grad, mask)  # d(x * mask)/dx
    assert torch.equal(speed_up(nn.Dropout(1.0)).train()(x), torch.zeros_like(x))  # PyTorch's own at p = 1


def test_cpu_training_attention_equals_sdpa(monkeypatch, tiny_config, make_batch, randomize):
    """With every mask forced to 'keep all', training mode (the hand-written attention) must give
    eval mode's outputs (SDPA), padding and the sparse last layer included."""
    config = tiny_config(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    model = speed_up(randomize(BertForPreTraining(config)))
    batch = make_batch(config, (11, 7, 4))
    positions = torch.tensor([[1, 2, 3], [2, 3, 1], [1, 2, 0]])
    calls = []

    def keep_all(shape, p, device, dtype):
        calls.append(tuple(shape))
        return torch.ones(shape, dtype=dtype, device=device)

    with torch.no_grad():
        expected = model.eval()(**batch, masked_positions=positions)
        monkeypatch.setattr(fast_dropout, "dropout_mask", keep_all)
        got = model.train()(**batch, masked_positions=positions)
    assert any(len(s) == 4 for s in calls), "the attention-probability dropout was not drawn"
    assert any(len(s) == 2 for s in calls), "the hidden-state dropout was not drawn"
    for key in ("prediction_logits", "seq_relationship_logits"):
        assert float((got[key] - expected[key]).abs().max()) < 1e-5, key


@pytest.mark.parametrize("masked", [False, True])
def test_written_out_attention_and_its_gradients_equal_sdpa(masked):
    """The hand-written path (additive mask in the scores' product, a custom backward for q @ k^T):
    outputs and q, k, v gradients equal PyTorch's SDPA in float64, with q, k, v strided views of one
    fused projection as the model makes them; and so does its no-gradient form."""
    torch.manual_seed(0)
    B, T, A, D = 3, 7, 2, 4
    qkv = torch.randn(B, T, 3 * A * D, dtype=torch.float64)
    key_mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3, [True] * 2 + [False] * 5])[:, None, None, :]
    key_mask = key_mask if masked else None
    grad = torch.randn(B, A, T, D, dtype=torch.float64)
    results = []
    for attend in (lambda q, k, v: fast_attention.written_out_attention(q, k, v, key_mask, 0.0),
                   lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)):
        x = qkv.clone().requires_grad_()
        q, k, v = x.view(B, T, 3, A, D).permute(2, 0, 3, 1, 4)
        y = attend(q, k, v)
        y.backward(grad)
        results.append((y.detach(), x.grad))
    (y0, g0), (y1, g1) = results
    torch.testing.assert_close(y0, y1, rtol=0, atol=1e-12)
    with torch.no_grad():  # inference takes its own (measured faster) formulation
        q, k, v = qkv.view(B, T, 3, A, D).permute(2, 0, 3, 1, 4)
        torch.testing.assert_close(fast_attention.written_out_attention(q, k, v, key_mask, 0.0), y1, rtol=0, atol=1e-12)
    torch.testing.assert_close(g0, g1, rtol=0, atol=1e-12)
    assert float(g0.abs().max()) > 0.1  # the gradients are not trivially zero
