"""Running on one device or many, through PyTorch's own distributed engine.

``torchrun --nproc_per_node=N -m bertforge pretrain ...`` sets the variables `setup` reads to join the
process group; `wrap_model` applies DDP or FSDP from outside: the model code knows nothing of it.
"""

from __future__ import annotations

import datetime
import os
import typing
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Distributed", "resolve_device", "setup", "wrap_model", "unwrap_model", "STRATEGIES", "Strategy"]

Strategy = Literal["ddp", "fsdp"]
STRATEGIES: tuple[str, ...] = typing.get_args(Strategy)


@dataclass(frozen=True)
class Distributed:
    """Where this process stands: its rank among ``world_size`` and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Only the main process writes logs, metrics and checkpoints."""
        return self.rank == 0

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum ``values`` over all processes (in place; returned for chaining)."""
        if self.enabled:
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def gather_objects(self, obj: object) -> list[object]:
        """Every process's ``obj``, in rank order, on every process."""
        if not self.enabled:
            return [obj]
        out: list[object] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``device`` as a torch.device ("auto": CUDA if present, else CPU), or a ValueError."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device: expected auto, cpu, cuda, cuda:K or another device PyTorch knows, got "
                         f"{str(device)!r}") from None


def setup(device: str = "auto") -> Distributed:
    """Join torchrun's process group, if any; this process's place and ``device`` (cuda: its local GPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device cuda was asked for, but PyTorch sees no CUDA device")
        if dev.index is None:
            dev = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=30))
    return Distributed(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def wrap_model(model: nn.Module, d: Distributed, strategy: str = "ddp") -> nn.Module:
    """DDP, or FSDP (each Transformer block sharded, then the rest); one process: the model itself."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if not d.enabled:
        return model
    if strategy == "ddp":
        ids = [d.device.index] if d.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    for layer in model.bert.encoder.layer:  # type: ignore[union-attr]
        fully_shard(layer)
    fully_shard(model)  # embeddings, heads (the tied decoder stays with the embeddings), pooler
    return model


def unwrap_model(model: nn.Module) -> nn.Module:
    """The bertforge model inside a DDP or ``torch.compile`` wrapper."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model
