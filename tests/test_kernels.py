"""The compiled CPU kernels (`bertforge.fast.kernels`) against the PyTorch ops they replace: the passes after
an int8 product (scales, bias, residual, LayerNorm, GELU, quantizing), attention's masked softmax, and its
per-head layout gathered and scattered; and int8 inference's fused block against the unfused one."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from bertforge import BertModel
from bertforge.fast import int8 as int8_module
from bertforge.fast import speed_up
from bertforge.fast import unpad
from bertforge.fast.kernels import cpu_kernels


@pytest.fixture(scope="module")
def kernels():
    ops = cpu_kernels()
    if ops is None:
        pytest.skip("no C++ compiler here: the kernels are not built")
    return ops


# ------------------------------------------------------------------ after an int8 product
@torch.no_grad()
def test_the_epilogue_is_scales_bias_residual_and_layernorm_then_the_next_quantize(kernels):
    g = torch.Generator().manual_seed(0)
    acc = torch.randint(-2 ** 20, 2 ** 20, (70, 48), generator=g, dtype=torch.int32)
    channel, rows = torch.rand(48, generator=g) * 1e-4, torch.rand(70, 1, generator=g)
    bias, residual = torch.randn(48, generator=g), torch.randn(70, 48, generator=g)
    gamma, beta = torch.rand(48, generator=g) + 0.5, torch.randn(48, generator=g)
    rows[3] = 0  # a row of zeros but for the bias and residual
    exact = F.layer_norm(acc.double() * channel.double() * rows.double() + bias.double() + residual.double(), (48,),
                         gamma.double(), beta.double(), 1e-12)
    for form, dtype in ((1, torch.int8), (2, torch.uint8)):
        out, q, scales = kernels.epilogue_rows(acc, channel, rows, bias, residual, gamma, beta, 1e-12, False, True,
                                               form)
        assert out.dtype == torch.float32 and (out.double() - exact).abs().max() < 1e-5
        assert q.dtype == dtype
        want_q, want_scales = kernels.quantize_rows(out, form == 2)  # the very bytes quantize_rows gives
        assert torch.equal(q, want_q) and torch.equal(scales, want_scales)
    out, q, scales = kernels.epilogue_rows(acc.float(), None, rows, None, None, None, None, 0.0, False, True, 0)
    torch.testing.assert_close(out, acc.float() * rows, rtol=1e-6, atol=0)
    assert q.numel() == 0 and scales.numel() == 0


@torch.no_grad()
def test_the_epilogue_s_gelu_is_the_exact_erf_form(kernels):
    x = torch.cat([torch.linspace(-12, 12, 24001), torch.tensor([0.0, -0.0, 1e-30, 40.0, -40.0])])[None, :]
    got = kernels.epilogue_rows(x, None, torch.ones(1, 1), None, None, None, None, 0.0, True, True, 0)[0]
    assert (got.double() - F.gelu(x.double())).abs().max() < 2e-6
    _, q, scales = kernels.epilogue_rows(x, None, torch.ones(1, 1), None, None, None, None, 0.0, True, False, 1)
    want_q, want_scales = kernels.quantize_rows(got, False)
    assert torch.equal(q, want_q) and torch.equal(scales, want_scales)


def test_the_epilogue_refuses_what_it_cannot_read(kernels):
    acc = torch.zeros(4, 8, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="float32 residual"):
        kernels.epilogue_rows(acc, None, torch.ones(4, 1), None, torch.zeros(4, 8, dtype=torch.bfloat16), None, None,
                              0.0, False, True, 0)
    with pytest.raises(RuntimeError, match="quantize is 0"):
        kernels.epilogue_rows(acc, None, torch.ones(4, 1), None, None, None, None, 0.0, False, True, 3)


# ------------------------------------------------------------------ attention
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask", ["none", "keys", "causal"])
@torch.no_grad()
def test_masked_softmax_is_pytorch_s(kernels, dtype, mask):
    g = torch.Generator().manual_seed(1)
    scores = (torch.randn(3, 5, 7, 37, generator=g) * 8).to(dtype)  # (A, b, K, T): a row is not a multiple of 16
    keep = torch.rand(5, 37, generator=g) < 0.7
    keep[:, 0] = True
    if mask == "none":
        key_mask = None
    elif mask == "keys":
        key_mask = keep[None, :, None, :]  # (1, b, 1, T), broadcast over heads and queries
    else:
        key_mask = (keep[:, None, :] & torch.ones(7, 37, dtype=torch.bool).tril())[None]  # (1, b, K, T)
    scale = 1 / math.sqrt(32)
    want = scores.float() * scale
    if key_mask is not None:
        want = want.masked_fill(~key_mask, float("-inf"))
    want = want.softmax(-1).to(dtype)
    got = kernels.masked_softmax(scores.clone(), key_mask.expand(scores.shape) if key_mask is not None else None,
                                 scale)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), atol=1e-6 if dtype == torch.float32 else 4e-3, rtol=0)
    if key_mask is not None:
        assert torch.all(got[~key_mask.expand(scores.shape)] == 0)


def test_masked_softmax_refuses_a_mask_of_another_shape(kernels):
    with pytest.raises(RuntimeError, match="scores' shape"):
        kernels.masked_softmax(torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 1, 4, dtype=torch.bool), 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_the_per_head_layout_is_gathered_and_scattered_as_index_select_and_index_copy(kernels, dtype):
    N, A, D = 23, 4, 8
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(N, 3 * A * D, generator=g).to(dtype)
    rows = torch.randint(0, N, (30,), generator=g)
    got = kernels.gather_heads(qkv, rows, 3, A)
    assert torch.equal(got, qkv.view(N, 3, A, D).permute(1, 2, 0, 3).index_select(2, rows))
    y = torch.randn(A, 30, D, generator=g).to(dtype)
    real, targets = torch.tensor([0, 4, 9, 29]), torch.tensor([7, 0, 22, 3])
    want = torch.zeros(N, A * D, dtype=dtype)
    want.index_copy_(0, targets, y.index_select(1, real).transpose(0, 1).reshape(4, A * D))
    assert torch.equal(kernels.scatter_heads(y, real, targets, torch.zeros(N, A * D, dtype=dtype)), want)
    in_order = kernels.scatter_heads(y, real, None, torch.zeros(4, A * D, dtype=dtype))
    assert torch.equal(in_order, y.index_select(1, real).transpose(0, 1).reshape(4, A * D))
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.gather_heads(qkv, torch.tensor([N]), 3, A)
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.scatter_heads(y, torch.tensor([30]), None, torch.zeros(4, A * D, dtype=dtype))


# ------------------------------------------------------------------ int8's fused block
def _sped_up(tiny_config, randomize, make_batch, int8: bool, lengths: tuple[int, ...]):
    """(config, a sped-up tiny encoder for inference, a batch of ``lengths``, its real positions)."""
    config = tiny_config()
    model = speed_up(randomize(BertModel(config), std=0.05).eval(), freeze=True, int8=int8)
    batch = make_batch(config, lengths=lengths)
    return config, model, batch, batch["attention_mask"].bool()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@torch.no_grad()
def test_an_int8_layer_runs_its_block_fused_and_close_to_the_unfused_one(kernels, autocast, tiny_config, randomize,
                                                                         make_batch, monkeypatch):
    config, model, batch, real = _sped_up(tiny_config, randomize, make_batch, True, (11, 7, 4))
    calls = []
    fused = unpad.int8_feed_forward

    def counted(*args):
        out = fused(*args)
        calls.append(out is not None)
        return out

    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    monkeypatch.setattr(unpad, "int8_feed_forward", counted)
    with amp:
        got = model(**batch).last_hidden_state
    assert calls == [True] * config.num_hidden_layers
    monkeypatch.setattr(unpad, "int8_feed_forward", lambda *args: None)
    with amp:
        unfused = model(**batch).last_hidden_state
    assert got.dtype == unfused.dtype == torch.float32
    assert 0 < float((got[real] - unfused[real]).norm() / unfused[real].norm()) < 0.02


@torch.no_grad()
def test_the_fused_block_steps_aside_for_a_hook_another_activation_or_float_weights(kernels, tiny_config,
                                                                                    randomize, make_batch):
    config, model, _, _ = _sped_up(tiny_config, randomize, make_batch, True, (3,))
    layer = model.encoder.layer[0]
    x, y = torch.randn(9, config.hidden_size), torch.randn(9, config.hidden_size)
    assert int8_module.int8_feed_forward(layer, x, y) is not None
    handle = layer.output.LayerNorm.register_forward_hook(lambda *args: None)
    assert int8_module.int8_feed_forward(layer, x, y) is None  # the hook must see its LayerNorm run
    handle.remove()
    tanh = copy.deepcopy(layer)
    tanh.intermediate.act = lambda h: F.gelu(h, approximate="tanh")
    assert int8_module.int8_feed_forward(tanh, x, y) is None
    assert int8_module.int8_feed_forward(layer, x.bfloat16(), y) is None  # a residual not in float32
    with torch.enable_grad():
        assert int8_module.int8_feed_forward(layer, x, y) is None  # gradients on: the float weights
    int8_module.quantize_int8(model, False)
    assert int8_module.int8_feed_forward(layer, x, y) is None


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@torch.no_grad()
def test_without_the_kernels_inference_runs_pytorch_ops_to_the_same_outputs(kernels, int8, tiny_config, randomize,
                                                                            make_batch, monkeypatch):
    from bertforge.fast import attention

    _, model, batch, real = _sped_up(tiny_config, randomize, make_batch, int8, (11, 7, 4, 9, 2))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(**batch).last_hidden_state
        for module in (attention, int8_module):
            monkeypatch.setattr(module, "cpu_kernels", lambda: None)
        plain = model(**batch).last_hidden_state
    assert float((got[real].float() - plain[real].float()).norm() / plain[real].float().norm()) < 0.02
    assert torch.all(got[~real] == 0) and torch.all(plain[~real] == 0)
