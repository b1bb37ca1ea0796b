"""The shared training loop's settings (`TrainConfig`), and the rules a resumed run's settings obey.

A setting's range and resume rules are declared on its field (`bertforge.settings.setting`): ``resumable``
settings may change when a run resumes (its length, how often it saves or logs), every other recorded
setting must match the checkpoint's; ``absent`` says what a record that leaves the setting out means.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from bertforge.settings import MAX_MINUTES, check_settings, field_metadata, setting
from bertforge.train.distributed import Strategy
from bertforge.train.optim import OptimizerName, ScheduleName
from bertforge.train.precision import Precision, check_precision

__all__ = ["TrainConfig", "ResumeRules", "BUDGET_WARMUP_SHARE"]

BUDGET_WARMUP_SHARE = 0.01
"""Warmup share of a time budget when none is given: the paper's 10,000 of 1,000,000 steps."""

@dataclass(frozen=True)
class ResumeRules:
    """What a resumed run's settings may differ in from its checkpoint's record, and how an old record reads."""

    resumable: frozenset[str]
    """Recorded settings (and run facts) a resumed run may change; ``"a.b"`` names field b of a nested record a."""
    absent: Mapping[str, Any]
    """What a setting missing from a record means."""
    default_warmup_steps: int
    default_warmup_ratio: float | None
    """The warmup a run takes when neither warmup setting is given (`TrainConfig.warmup`)."""

    @classmethod
    def of(cls, config_class: type[TrainConfig]) -> ResumeRules:
        """The rules the fields of ``config_class`` and of its bases declare (`setting`)."""
        meta = field_metadata(config_class)
        resumable = frozenset(name for name, m in meta.items() if m.get("resumable"))
        absent = {name: m["absent"] for name, m in meta.items() if "absent" in m}
        return cls(resumable, absent, config_class.DEFAULT_WARMUP_STEPS, config_class.DEFAULT_WARMUP_RATIO)

    def with_facts(self, resumable: Iterable[str] = (), absent: Mapping[str, Any] | None = None) -> ResumeRules:
        """These rules plus those of what a run records besides its settings (its run facts)."""
        return dataclasses.replace(self, resumable=self.resumable | set(resumable),
                                   absent={**self.absent, **(absent or {})})


PAPER_STEPS = 1_000_000
"""The paper's pre-training steps, over whose first `TrainConfig.DEFAULT_WARMUP_STEPS` it warms up."""


@dataclass
class TrainConfig:
    """Settings of the shared training loop (defaults: the paper's pre-training).

    A warmup setting left unset (None) means "not given": `warmup` resolves it to the config class's default,
    so a value the user gives always wins over a default, and giving both is an error."""

    DEFAULT_WARMUP_STEPS: ClassVar[int] = 10_000
    """Warmup steps when neither warmup setting is given (the paper's pre-training)."""
    DEFAULT_WARMUP_RATIO: ClassVar[float | None] = None
    """If set: warmup over this share of max_steps when neither warmup setting is given (wins over the above)."""
    STEPS_FROM_DATA: ClassVar[bool] = False
    """Whether max_steps 0 means "set from the data" (fine-tuning's epochs) rather than an error."""

    batch_size: int = setting(256, at_least=1)
    """Global batch: sequences per optimizer step over all processes and accumulation steps."""
    grad_accum: int = setting(1, at_least=1)
    """Micro-batches per optimizer step on each process (batch_size / (processes * grad_accum) each)."""
    max_steps: int = setting(1_000_000, resumable=True, at_least=0)  # 0: fine-tuning's "from the data" only
    """Optimizer steps of the run (the schedule decays to its end over them)."""
    lr: float = setting(1e-4, above=0)
    """Peak learning rate."""
    warmup_steps: int | None = setting(None, at_least=0)
    """Steps of linear warmup from 0 to the peak, at most --max-steps (not given, and no --warmup-ratio: the
    paper's pre-training's 10,000, or in a shorter run its share, 1%; give one, not both)."""
    warmup_ratio: float | None = setting(None, at_least=0, below=1)
    """Warmup over this share of max_steps, instead of --warmup-steps (give one, not both)."""
    schedule: ScheduleName = "linear"
    """Decay after warmup: linear (the paper), polynomial, cosine or constant; or range, a learning-rate range
    test: the rate rises geometrically from 1/10,000 of --lr to --lr over the run (no warmup)."""
    power: float = setting(1.0, above=0)
    """Exponent of the polynomial decay."""
    end_lr_ratio: float = setting(0.0, at_least=0, at_most=1)
    """Learning rate at max_steps, as a share of the peak."""
    optimizer: OptimizerName = "adamw"
    """adamw (the paper) or lamb (large batches)."""
    weight_decay: float = setting(0.01, at_least=0)
    """Decoupled weight decay, not applied to LayerNorm weights and biases."""
    adam_beta1: float = setting(0.9, at_least=0, below=1)
    """Adam's beta1."""
    adam_beta2: float = setting(0.999, at_least=0, below=1)
    """Adam's beta2."""
    adam_eps: float = setting(1e-6, at_least=0)
    """Adam's epsilon (the TF release: 1e-6)."""
    bias_correction: bool = True
    """Adam bias correction (the TF release's optimizer has none: --no-bias-correction)."""
    max_grad_norm: float = setting(1.0, at_least=0)
    """Clip the global gradient norm to this (0: no clipping)."""
    precision: Precision = "fp32"
    """fp32, bf16 (autocast; CPU and CUDA), fp16 (autocast with a gradient scaler; CUDA), or auto (bf16 where
    the device computes it natively, else fp32)."""
    compile: bool = setting(False, resumable=True)
    """Run the model through torch.compile."""
    device: str = setting("auto", resumable=True)
    """auto (CUDA if present), cpu, cuda or cuda:K."""
    strategy: Strategy = "ddp"
    """With several processes: ddp, or fsdp to shard parameters and optimizer state."""
    seed: int = setting(12345, at_least=0)
    """Seed of initialisation, dropout and data order."""
    checkpoint_every: int = setting(1000, resumable=True, at_least=1)
    """Save a checkpoint every this many steps (and at the end, and on SIGINT / SIGTERM)."""
    keep_checkpoints: int = setting(3, resumable=True, at_least=0)
    """Keep the last this many checkpoints (0: keep all)."""
    log_every: int = setting(10, resumable=True, at_least=1)
    """Write a metrics line every this many steps."""
    eval_every: int = setting(1000, resumable=True, at_least=0)
    """Evaluate on held-out data every this many steps (0: only at the end)."""
    max_time_minutes: float = setting(0.0, resumable=True, at_least=0, at_most=MAX_MINUTES)
    """Stop (with a checkpoint) after this much training time (0: no limit)."""
    head_warmup_ratio: float | None = setting(None, absent=None, at_least=0, below=1)
    """Train only the model's fresh head over this share of the run (the rest held still), then everything, the
    rest with the schedule's warmup of its own (None: 0.1 where pre-training starts from a checkpoint without
    the objective's head, such as an encoder-only one; else 0)."""
    budget_minutes: float = setting(0.0, absent=0.0, at_least=0, at_most=MAX_MINUTES)
    """Train for this much training time, with the schedule laid over time instead of steps: warmup over
    --warmup-ratio of it, then the decay, ending when the time does (0: the schedule spans max_steps).
    max_steps still caps the steps. The learning rate then follows the clock, so a resumed run is not
    bit-identical to an uninterrupted one."""
    progress: bool = setting(True, resumable=True)
    """Show a progress bar."""

    def __post_init__(self) -> None:
        check_precision(self.precision)
        check_settings(self)
        if self.max_steps < 1 and not (self.max_steps == 0 and self.STEPS_FROM_DATA):
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.warmup_steps is not None and self.warmup_ratio is not None:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) and warmup_ratio ({self.warmup_ratio}) are both "
                             "set; set one of them")
        if self.warmup_steps is not None and self.max_steps and self.warmup_steps > self.max_steps:
            raise ValueError(f"warmup_steps {self.warmup_steps} is longer than the run (max_steps {self.max_steps}): "
                             "the learning rate would never reach lr; give fewer warmup steps or a warmup_ratio")
        if self.budget_minutes and self.warmup_steps is not None:
            raise ValueError(f"budget_minutes lays the schedule over time: give its warmup as warmup_ratio (a share "
                             f"of the budget), not warmup_steps ({self.warmup_steps})")

    @property
    def budget_warmup_share(self) -> float:
        """With ``budget_minutes``: the share of the budget spent on warmup."""
        if self.warmup_ratio is not None:
            return self.warmup_ratio
        return self.DEFAULT_WARMUP_RATIO if self.DEFAULT_WARMUP_RATIO is not None else BUDGET_WARMUP_SHARE

    @property
    def warmup(self) -> int:
        """The warmup steps the run takes: warmup_steps or warmup_ratio, whichever is given, else the
        config class's default (`DEFAULT_WARMUP_STEPS` or `DEFAULT_WARMUP_RATIO`, exactly one of them set)."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        ratio = self.warmup_ratio if self.warmup_ratio is not None else self.DEFAULT_WARMUP_RATIO
        if ratio is not None:
            return int(ratio * self.max_steps)
        if self.warmup_scaled:
            return int(self.DEFAULT_WARMUP_STEPS / PAPER_STEPS * self.max_steps)
        return self.DEFAULT_WARMUP_STEPS

    @property
    def warmup_scaled(self) -> bool:
        """Whether the default warmup steps, longer than this run, give way to the paper's share of it (1%)."""
        return (self.warmup_steps is None and self.warmup_ratio is None and self.DEFAULT_WARMUP_RATIO is None
                and 0 < self.max_steps < self.DEFAULT_WARMUP_STEPS)

    def micro_batch(self, world_size: int) -> int:
        """Sequences per forward pass on each process."""
        per = self.batch_size // (world_size * self.grad_accum)
        if per * world_size * self.grad_accum != self.batch_size:
            raise ValueError(f"batch_size {self.batch_size} is not divisible by processes ({world_size}) "
                             f"x grad_accum ({self.grad_accum})")
        return per
