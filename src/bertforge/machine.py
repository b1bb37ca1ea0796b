"""The machine a measured time depends on: the CPU's name, family and model, its flags, and any limit set on
the kernels' instruction sets (`KERNEL_LIMITS`). The probes that choose a precision or an int8 kernel once per
machine keep their answers under `machine_key`."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = ["KERNEL_LIMITS", "cpu_flags", "cpu_info", "cpu_name", "kernel_limits", "machine_key"]

KERNEL_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_INSTRUCTIONS")
"""Environment settings that cap PyTorch's, oneDNN's, MKL's and FBGEMM's (PyTorch's dynamic int8) CPU kernels
below what the CPU has (an AVX2-only CPU's kernels, measured on a newer one)."""


@functools.cache
def cpu_info() -> tuple[str, frozenset[str]]:
    """The CPU's model name (with its family and model numbers where listed) and flags from /proc/cpuinfo
    ("unknown CPU" and no flags where it is absent)."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if not key.strip():
                break  # the first processor's block is enough
            fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name", "unknown CPU")
    if fields.get("cpu family") and fields.get("model"):
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name, frozenset(fields.get("flags", "").split())


def kernel_limits() -> dict[str, str]:
    """The `KERNEL_LIMITS` set in this process's environment."""
    return {k: os.environ[k] for k in KERNEL_LIMITS if os.environ.get(k)}


def cpu_name() -> str:
    """The CPU's model name, family and model, its widest matrix / bf16 unit and any kernel limit
    (`kernel_limits`): what a measured time depends on."""
    name, flags = cpu_info()
    units = ("AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else
             "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "")
    limits = kernel_limits()
    return (f"{name}, {units}" if units else name) + (
        "; kernels limited by " + " ".join(f"{k}={v}" for k, v in limits.items()) if limits else "")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (none where it is absent)."""
    return cpu_info()[1]


def machine_key(flags: Sequence[str]) -> str:
    """What a probe's answer holds for: the CPU model, those of ``flags`` it has (the ones that decide what the
    probe measures), any kernel limit and the torch."""
    name, has = cpu_info()
    limits = "".join(f"; {k}={v}" for k, v in kernel_limits().items())
    return f"{name}; {' '.join(f for f in flags if f in has) or 'no vector flags'}{limits}; torch {torch.__version__}"
