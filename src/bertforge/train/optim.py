"""Optimizers and learning-rate schedules of the paper (and of large-batch BERT training).

* AdamW with decoupled weight decay, not applied to LayerNorm weights and biases (the paper). With
  ``bias_correction=False`` it reproduces the TF release's optimizer, which has none (``Lamb`` then does it).
* LAMB (You et al., 2019): Adam's update plus decoupled weight decay, rescaled per parameter tensor by the
  trust ratio ||w|| / ||update||.
* Schedules: linear warmup from 0, then linear (the paper), polynomial, cosine or constant decay.

The update formulas, for one tensor ``w`` with gradient ``g`` at step ``t`` (1-based):

    m = b1 m + (1 - b1) g             v = b2 v + (1 - b2) g^2
    m_hat = m / (1 - b1^t)            v_hat = v / (1 - b2^t)        (bias correction; else m, v)
    u = m_hat / (sqrt(v_hat) + eps) + wd * w
    AdamW: w -= lr * u                LAMB: w -= lr * (||w|| / ||u||) * u   (ratio 1 if a norm is 0)
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Collection, Iterable
from typing import Any, Literal

import torch
from torch import nn

__all__ = ["Lamb", "param_groups", "build_optimizer", "lr_factor", "build_schedule", "Schedule", "CLOCK_UNITS",
           "OPTIMIZERS", "SCHEDULES", "OptimizerName", "ScheduleName"]

OptimizerName = Literal["adamw", "lamb"]
ScheduleName = Literal["linear", "polynomial", "cosine", "constant", "range"]
OPTIMIZERS: tuple[str, ...] = typing.get_args(OptimizerName)
SCHEDULES: tuple[str, ...] = typing.get_args(ScheduleName)
RANGE_DECADES = 4
"""The ``range`` schedule's span: the rate rises from the peak / 10 ** RANGE_DECADES to the peak."""


def param_groups(model: nn.Module, weight_decay: float, head: Collection[str] = ()) -> list[dict]:
    """Weight decay for weight matrices and embeddings; none for biases and LayerNorm parameters (the
    paper's exclusion, by Google's names ``bias`` / ``LayerNorm``). The parameters named in ``head`` (as the
    bare model names them) get groups of their own, marked ``"head": True`` (`Schedule`'s head warm-up)."""
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:  # tied parameters once
            continue
        seen.add(id(p))
        bare = name.replace("_fsdp_wrapped_module.", "").replace("_orig_mod.", "").removeprefix("module.")
        groups.setdefault((bare in head, not (name.endswith("bias") or "LayerNorm" in name)), []).append(p)
    order = [(False, True), (False, False), (True, True), (True, False)]
    return [{"params": groups.get(key, []), "weight_decay": weight_decay if key[1] else 0.0,
             **({"head": True} if key[0] else {})} for key in order if key in groups or not key[0]]


class Lamb(torch.optim.Optimizer):
    """LAMB, or (``trust_ratio=False``) AdamW with optional bias correction. See the module doc."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, *, bias_correction: bool = True,
                 trust_ratio: bool = True):
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid Lamb settings: lr {lr}, betas {betas}, eps {eps}, weight_decay {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, trust_ratio=trust_ratio)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            b1, b2 = group["betas"]
            grads, ms, vs = [], [], []
            for p in params:
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                grads.append(p.grad)
                ms.append(state["exp_avg"])
                vs.append(state["exp_avg_sq"])
            # Each tensor's own step: one that got no gradient on earlier steps (grad None) started later.
            steps = [float(self.state[p]["step"]) for p in params]
            torch._foreach_lerp_(ms, grads, 1 - b1)  # m = b1 m + (1 - b1) g
            torch._foreach_mul_(vs, b2)
            torch._foreach_addcmul_(vs, grads, grads, value=1 - b2)
            c1 = [1 - b1 ** t if group["bias_correction"] else 1.0 for t in steps]
            c2 = [1 - b2 ** t if group["bias_correction"] else 1.0 for t in steps]
            denom = torch._foreach_sqrt(vs)
            torch._foreach_div_(denom, [math.sqrt(c) for c in c2])
            torch._foreach_add_(denom, group["eps"])
            updates = torch._foreach_div(ms, denom)
            torch._foreach_div_(updates, c1)
            if group["weight_decay"]:
                torch._foreach_add_(updates, params, alpha=group["weight_decay"])
            if group["trust_ratio"]:
                w_norms = torch._foreach_norm(params)
                u_norms = torch._foreach_norm(updates)
                ratios = [torch.where((w > 0) & (u > 0), w / u, torch.ones_like(w)) for w, u in zip(w_norms, u_norms)]
                torch._foreach_mul_(updates, ratios)
            torch._foreach_add_(params, updates, alpha=-group["lr"])
        return loss


def build_optimizer(model: nn.Module, name: str = "adamw", *, lr: float, weight_decay: float,
                    betas: tuple[float, float], eps: float, bias_correction: bool = True,
                    head: Collection[str] = ()) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``model``'s parameters, with the paper's weight-decay exclusions and the
    ``head`` parameters in groups of their own (`param_groups`)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
    groups = param_groups(model, weight_decay, head)
    if name == "adamw" and bias_correction:
        # The fused kernel (one pass over all tensors) exists on CPU and CUDA in recent PyTorch.
        fused = all(p.device.type in ("cpu", "cuda") for g in groups for p in g["params"])
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
    return Lamb(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
                trust_ratio=name == "lamb")


def lr_factor(step: int, *, total_steps: int, warmup_steps: int, schedule: str = "linear",
              power: float = 1.0, end_factor: float = 0.0) -> float:
    """Multiplier of the peak learning rate at ``step`` (0-based, the step about to be taken).

    Warmup rises linearly from 1/warmup to 1 over ``warmup_steps``; then the factor decays from 1 to
    ``end_factor`` at ``total_steps``: linearly, as ``(1 - progress) ** power``, along a half cosine, or
    not at all (constant). ``range`` is a learning-rate range test (Smith, 2017): the factor rises
    geometrically from 10 ** -`RANGE_DECADES` to 1 over the run.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    if schedule == "range":  # no warmup: the rise is its own
        return 10.0 ** (-RANGE_DECADES * (1.0 - min(1.0, step / max(1, total_steps - 1))))
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        decay = 1.0 - progress
    elif schedule == "polynomial":
        decay = (1.0 - progress) ** power
    else:
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    return end_factor + (1.0 - end_factor) * decay


CLOCK_UNITS = 1_000_000
"""A time-budget schedule's resolution: the budget in this many equal units of training time."""


class Schedule(torch.optim.lr_scheduler.LRScheduler):
    """The peak rate times `lr_factor` at the schedule's position: the optimizer steps taken or, with
    ``budget_seconds``, the training time spent (`set_elapsed`) in `CLOCK_UNITS` of the budget.

    Head warm-up (``head_share`` > 0): over that share of the run only the groups marked ``"head"`` train (the
    others' rate is 0); then the others join with the schedule laid over the rest of the run, warmup included,
    so a fresh head learns before its gradients reach the encoder.

    Its state is the step count alone: a resumed run follows its own settings (max_steps may have grown)."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, budget_seconds: float = 0.0, head_share: float = 0.0,
                 **factor: Any):
        lr_factor(0, **factor)  # validate now, not at the first step
        self.factor = factor
        self.head_until = int(head_share * factor["total_steps"])
        self.budget_seconds = budget_seconds
        self.elapsed = 0.0
        super().__init__(optimizer)

    def position(self) -> int:
        """Where the schedule is: the step count, or the clock in `CLOCK_UNITS` of the budget."""
        if not self.budget_seconds:
            return self.last_epoch
        return min(CLOCK_UNITS, int(self.elapsed / self.budget_seconds * CLOCK_UNITS))

    def get_lr(self) -> list[float]:
        at = self.position()
        factor = lr_factor(at, **self.factor)
        if not self.head_until:
            return [base * factor for base in self.base_lrs]
        rest = 0.0 if at < self.head_until else lr_factor(
            at - self.head_until, **{**self.factor, "total_steps": self.factor["total_steps"] - self.head_until})
        return [base * (factor if group.get("head") else rest)
                for base, group in zip(self.base_lrs, self.optimizer.param_groups)]

    def get_last_lr(self) -> list[float]:
        """The rates the next optimizer step takes."""
        return [group["lr"] for group in self.optimizer.param_groups]

    def apply(self) -> None:
        """Set the optimizer's rates to the schedule's at its position now."""
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr

    def set_elapsed(self, seconds: float) -> None:
        """The training time spent; a time-budget schedule sets the next step's rates from it."""
        self.elapsed = seconds
        if self.budget_seconds:
            self.apply()

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """The step count of a saved schedule (also of a ``LambdaLR``'s state), and this schedule's rates at it."""
        self.last_epoch = int(state_dict["last_epoch"])
        self.apply()


def build_schedule(optimizer: torch.optim.Optimizer, *, budget_seconds: float = 0.0, **kwargs: Any) -> Schedule:
    """The `Schedule` of `lr_factor`'s keyword arguments, over steps or ``budget_seconds`` of training time."""
    return Schedule(optimizer, budget_seconds=budget_seconds, **kwargs)
