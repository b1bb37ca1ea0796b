"""Optimizers and schedules against their formulas written out by hand: AdamW and LAMB steps (with
and without bias correction, weight decay, zero-norm tensors, a tensor that joins late), the
weight-decay exclusions, every schedule's factor at chosen steps, and errors for unknown names."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from bertforge.model.config import BertConfig
from bertforge.model.heads import BertForPreTraining
from bertforge.train.optim import Lamb, build_optimizer, build_schedule, lr_factor, param_groups
from bertforge.train.config import TrainConfig

LR, BETAS, EPS, WD = 0.01, (0.9, 0.99), 1e-6, 0.1
STEPS = 5


class Toy(nn.Module):
    """A weight matrix, its bias, a LayerNorm (Google's name) and a weight that starts at zero."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = nn.Parameter(torch.randn(3, 4, generator=g, dtype=torch.float64))
        self.bias = nn.Parameter(torch.randn(3, generator=g, dtype=torch.float64))
        self.LayerNorm = nn.LayerNorm(3, dtype=torch.float64)
        self.zero = nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))  # ||w|| = 0 at the first step


def _grads(model: nn.Module, step: int) -> dict[str, torch.Tensor]:
    """Fixed pseudo-random gradients per step; `zero` gets an all-zero gradient on step 2."""
    g = torch.Generator().manual_seed(100 + step)
    out = {n: torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in model.named_parameters()}
    if step == 2:
        out["zero"] = torch.zeros_like(out["zero"])
    return out


def _reference(model: nn.Module, *, lamb: bool, bias_correction: bool, late: str | None = None
               ) -> dict[str, torch.Tensor]:
    """The module doc's update, one tensor at a time, ``STEPS`` steps. ``late``: a tensor with no
    gradient on steps 1 and 2 (it is skipped, and its own step count starts at its first gradient)."""
    w = {n: p.detach().clone() for n, p in model.named_parameters()}
    m = {n: torch.zeros_like(t) for n, t in w.items()}
    v = {n: torch.zeros_like(t) for n, t in w.items()}
    t_of = {n: 0 for n in w}
    b1, b2 = BETAS
    for step in range(1, STEPS + 1):
        grads = _grads(model, step)
        for n in w:
            if n == late and step <= 2:
                continue
            t_of[n] += 1
            t = t_of[n]
            g = grads[n]
            m[n] = b1 * m[n] + (1 - b1) * g
            v[n] = b2 * v[n] + (1 - b2) * g * g
            m_hat = m[n] / (1 - b1 ** t) if bias_correction else m[n]
            v_hat = v[n] / (1 - b2 ** t) if bias_correction else v[n]
            wd = 0.0 if n.endswith("bias") or "LayerNorm" in n else WD
            u = m_hat / (v_hat.sqrt() + EPS) + wd * w[n]
            ratio = 1.0
            if lamb:
                w_norm, u_norm = w[n].norm().item(), u.norm().item()
                ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            w[n] = w[n] - LR * ratio * u
    return w


def _run(model: nn.Module, opt: torch.optim.Optimizer, late: str | None = None) -> dict[str, torch.Tensor]:
    for step in range(1, STEPS + 1):
        grads = _grads(model, step)
        for n, p in model.named_parameters():
            p.grad = None if n == late and step <= 2 else grads[n].clone()
        opt.step()
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["adamw", "lamb"])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_step_matches_the_formula(name, bias_correction):
    model = Toy()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    expected = _reference(model, lamb=name == "lamb", bias_correction=bias_correction)
    opt = build_optimizer(model, name, lr=LR, weight_decay=WD, betas=BETAS, eps=EPS, bias_correction=bias_correction)
    got = _run(model, opt)
    for n in expected:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-10, atol=1e-12, msg=n)
        assert not torch.equal(got[n], start[n]), n  # every tensor moved, the zero one included
    # The formula's parts matter: without weight decay, or without the trust ratio, the result differs.
    assert not torch.allclose(got["weight"], _reference(Toy(), lamb=name != "lamb",
                                                        bias_correction=bias_correction)["weight"])
    assert not torch.allclose(got["weight"], _reference(Toy(), lamb=name == "lamb",
                                                        bias_correction=not bias_correction)["weight"])


def test_the_torch_adamw_path_and_the_own_adamw_path_agree():
    """bias_correction=True is torch's AdamW; Lamb(trust_ratio=False) must give the same steps."""
    a, b = Toy(), Toy()
    torch_adamw = build_optimizer(a, "adamw", lr=LR, weight_decay=WD, betas=BETAS, eps=EPS)
    assert isinstance(torch_adamw, torch.optim.AdamW)
    own = Lamb(param_groups(b, WD), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, trust_ratio=False)
    got_a, got_b = _run(a, torch_adamw), _run(b, own)
    for n in got_a:
        torch.testing.assert_close(got_b[n], got_a[n], rtol=1e-10, atol=1e-12, msg=n)


@pytest.mark.parametrize("late", ["weight", "bias"])
def test_lamb_bias_correction_counts_steps_per_tensor(late):
    """A tensor without a gradient on the first steps (a head unused so far) starts its own step
    count when it first gets one, as torch's AdamW does; the others keep theirs."""
    model = Toy()
    expected = _reference(model, lamb=True, bias_correction=True, late=late)
    opt = build_optimizer(model, "lamb", lr=LR, weight_decay=WD, betas=BETAS, eps=EPS)
    got = _run(model, opt, late=late)
    for n in expected:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-10, atol=1e-12, msg=n)


def test_lamb_zero_weight_and_zero_update_stay_finite():
    """||w|| = 0 and ||u|| = 0 (no decay, zero gradient): trust ratio 1, the tensor does not move."""
    p = nn.Parameter(torch.zeros(4))
    opt = Lamb([{"params": [p], "weight_decay": 0.0}], lr=0.1)
    p.grad = torch.zeros(4)
    opt.step()
    assert torch.equal(p.detach(), torch.zeros(4))


def test_param_groups_exclude_layernorm_and_bias_and_count_tied_parameters_once():
    config = BertConfig.preset("tiny", vocab_size=50)
    model = BertForPreTraining(config)
    decay, no_decay = param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decay_names = {names[id(p)] for p in decay["params"]}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert "bert.embeddings.LayerNorm.weight" in no_decay_names
    assert "bert.encoder.layer.0.attention.output.LayerNorm.bias" in no_decay_names
    assert "cls.predictions.bias" in no_decay_names  # the MLM output bias
    assert "cls.predictions.transform.LayerNorm.weight" in no_decay_names
    assert "bert.embeddings.word_embeddings.weight" in decay_names
    assert "cls.seq_relationship.weight" in decay_names
    assert all(not (n.endswith("bias") or "LayerNorm" in n) for n in decay_names)
    assert all(n.endswith("bias") or "LayerNorm" in n for n in no_decay_names)
    # Every parameter exactly once: the decoder is the word-embedding matrix, not a second copy.
    all_ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert len(all_ids) == len(set(all_ids)) == len({id(p) for p in model.parameters()})
    total = sum(p.numel() for g in (decay, no_decay) for p in g["params"])
    assert total == sum(p.numel() for p in model.parameters())
    # A module holding the same parameter under two names still gives it once.
    shared = nn.Module()
    shared.a = nn.Linear(2, 2)
    shared.b = shared.a
    groups = param_groups(shared, 0.1)
    assert [len(g["params"]) for g in groups] == [1, 1]


# Warmup over 10 steps of 100: the factor at step k (0-based) is (k + 1) / 10 during warmup, then
# decays with progress (k - 10) / 90.
@pytest.mark.parametrize("schedule, step, kwargs, expected", [
    ("linear", 0, {}, 0.1),
    ("linear", 4, {}, 0.5),
    ("linear", 9, {}, 1.0),
    ("linear", 10, {}, 1.0),
    ("linear", 55, {}, 0.5),
    ("linear", 99, {}, 1 / 90),
    ("linear", 100, {}, 0.0),
    ("linear", 140, {}, 0.0),  # past the end: stays at the end value
    ("linear", 55, {"end_factor": 0.1}, 0.55),
    ("linear", 100, {"end_factor": 0.1}, 0.1),
    ("polynomial", 55, {"power": 2.0}, 0.25),
    ("polynomial", 55, {"power": 0.5}, math.sqrt(0.5)),
    ("polynomial", 40, {"power": 3.0, "end_factor": 0.2}, 0.2 + 0.8 * (2 / 3) ** 3),
    ("polynomial", 55, {"power": 1.0}, 0.5),  # power 1 is linear
    ("cosine", 3, {}, 0.4),
    ("cosine", 40, {}, 0.75),  # progress 1/3: (1 + cos(pi/3)) / 2
    ("cosine", 55, {}, 0.5),
    ("cosine", 100, {"end_factor": 0.1}, 0.1),
    ("constant", 5, {}, 0.6),
    ("constant", 10, {}, 1.0),
    ("constant", 100, {}, 1.0),
])
def test_lr_factor(schedule, step, kwargs, expected):
    got = lr_factor(step, total_steps=100, warmup_steps=10, schedule=schedule, **kwargs)
    assert got == pytest.approx(expected, abs=1e-12)


def test_lr_factor_without_warmup_starts_at_the_peak():
    assert lr_factor(0, total_steps=10, warmup_steps=0) == 1.0
    assert lr_factor(5, total_steps=10, warmup_steps=0) == pytest.approx(0.5)


def test_the_range_schedule_rises_geometrically_from_1e_4_to_the_peak_and_ignores_warmup():
    # a learning-rate range test of 9 steps: four decades in 8 rises, half a decade a step
    got = [lr_factor(k, total_steps=9, warmup_steps=0, schedule="range") for k in range(9)]
    assert got == pytest.approx([10 ** (-4 + k / 2) for k in range(9)], rel=1e-12)
    assert got[0] == pytest.approx(1e-4) and got[-1] == 1.0
    ratios = [b / a for a, b in itertools.pairwise(got)]
    assert ratios == pytest.approx([10 ** 0.5] * 8)  # the same factor every step: geometric
    assert [lr_factor(k, total_steps=9, warmup_steps=5, schedule="range") for k in range(9)] == got  # no warmup
    assert lr_factor(20, total_steps=9, warmup_steps=0, schedule="range") == 1.0  # past the end: the peak
    assert lr_factor(0, total_steps=1, warmup_steps=0, schedule="range") == pytest.approx(1e-4)  # one step


def test_warmup_ratio_is_a_share_of_max_steps_and_a_given_warmup_wins_over_the_default():
    assert TrainConfig(max_steps=200, warmup_ratio=0.1).warmup == 20
    assert TrainConfig(max_steps=200, warmup_steps=7).warmup == 7
    assert TrainConfig(max_steps=200, warmup_ratio=0.0).warmup == 0
    assert TrainConfig(max_steps=20_000).warmup == 10_000  # neither given: the paper's pre-training ...
    assert TrainConfig(max_steps=200).warmup == 2  # ... or its share (1%) of a run shorter than its warmup
    with pytest.raises(ValueError, match="both set"):
        TrainConfig(max_steps=200, warmup_ratio=0.1, warmup_steps=7)


def test_build_schedule_sets_the_optimizer_lr_of_each_step():
    """LambdaLR wiring: the k-th optimizer step (0-based) runs at peak * lr_factor(k)."""
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = build_schedule(opt, total_steps=20, warmup_steps=4, schedule="linear", end_factor=0.25)
    seen = []
    for _ in range(22):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [2.0 * lr_factor(k, total_steps=20, warmup_steps=4, end_factor=0.25) for k in range(22)]
    assert seen == pytest.approx(expected, abs=1e-12)
    assert seen[:5] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.0])
    assert seen[20:] == pytest.approx([0.5, 0.5])


def test_unknown_names_are_errors():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        build_optimizer(model, "sgd", lr=1e-3, weight_decay=0.0, betas=BETAS, eps=EPS)
    with pytest.raises(ValueError, match="unknown schedule 'cosin'"):
        lr_factor(0, total_steps=10, warmup_steps=1, schedule="cosin")
    with pytest.raises(ValueError, match="unknown schedule 'step'"):  # at construction, not at the first step
        build_schedule(torch.optim.SGD(model.parameters(), lr=0.1), total_steps=10, warmup_steps=1, schedule="step")
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="invalid Lamb settings"):
        Lamb(model.parameters(), lr=-1.0)
