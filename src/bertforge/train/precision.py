"""Numeric precision: one place that turns ``--precision {auto,fp32,bf16,fp16}`` into autocast.

Training, inference and feature extraction all run the model through `autocast`. The weights stay
float32; bf16 and fp16 are autocast's mixed precision (matrix products in the low dtype, reductions
and LayerNorm in float32). fp16 also needs a gradient scaler in training (`needs_grad_scaler`).

"auto" means bf16 where the device computes it natively (a CPU with AVX-512 BF16 or AMX, a CUDA GPU
from Ampere on) and fp32 elsewhere: a CPU without native bf16 only emulates it, tens of times slower
than fp32.

Inference on CPU also takes "int8" (`INFERENCE_PRECISIONS`): the encoder's dense layers in int8
(`bertforge.fast.int8`, applied to the model by whoever runs it), everything else in the float
precision "auto" picks. Training refuses it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path

import torch

__all__ = ["PRECISIONS", "INFERENCE_PRECISIONS", "autocast", "check_precision", "cpu_name", "dtype_of", "native_bf16", "needs_grad_scaler",
           "resolve_precision"]

logger = logging.getLogger("bertforge")

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
INFERENCE_PRECISIONS = PRECISIONS + ("int8",)
_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@functools.cache
def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively (asked once per device: inference asks per batch)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN's check: assume it, as autocast does
        return True


def cpu_name() -> str:
    """The CPU's model name and its widest matrix / bf16 unit: what a measured time depends on, and
    whether bf16 is native or emulated on it."""
    name, flags = "unknown CPU", set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    units = ("AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else
             "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "")
    return f"{name}, {units}" if units else name


def check_precision(precision: str, *, inference: bool = False) -> str:
    """``precision`` if it is one of `PRECISIONS` (``inference``: `INFERENCE_PRECISIONS`), else a
    ValueError naming the choices."""
    if precision == "int8" and not inference:
        raise ValueError("precision int8 is for inference (predict, evaluate, features, serve); training runs in "
                         "fp32, bf16 or fp16")
    choices = INFERENCE_PRECISIONS if inference else PRECISIONS
    if precision not in choices:
        raise ValueError(f"precision must be one of {', '.join(choices)}, got {precision!r}")
    return precision


def resolve_precision(precision: str, device: torch.device | str, *, inference: bool = False) -> str:
    """fp32, bf16, fp16 (or, ``inference``, int8) for ``device``: "auto" chosen by `native_bf16`; fp16
    refused off CUDA, int8 off CPU; a warning for bf16 where it is emulated."""
    device = torch.device(device)
    check_precision(precision, inference=inference)
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("precision fp16 needs a CUDA device (its gradient scaler); on CPU use bf16")
    if precision == "int8" and device.type != "cpu":
        raise ValueError(f"precision int8 runs on CPU; on {device.type} use bf16 or fp16")
    if precision == "bf16" and not native_bf16(device):
        logger.warning("precision bf16 on a %s without native bf16 (a CPU without AVX-512 BF16 or AMX, a GPU "
                       "before Ampere) is emulated, far slower than fp32; use --precision fp32 or auto here",
                       device.type)
    return precision


def dtype_of(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision (None for fp32; for int8, that of the layers it leaves
    in floating point)."""
    if precision == "int8":
        return _DTYPES[resolve_precision("auto", "cpu")]
    if precision not in _DTYPES:
        raise ValueError(f"expected a resolved precision (fp32, bf16, fp16, int8), got {precision!r}")
    return _DTYPES[precision]


def needs_grad_scaler(precision: str) -> bool:
    """fp16 training scales the loss so that small gradients do not underflow."""
    return precision == "fp16"


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context to run the model in: autocast to the resolved ``precision``'s dtype on ``device``,
    or nothing for fp32."""
    device = torch.device(device)
    dtype = dtype_of(resolve_precision(precision, device) if precision == "auto" else precision)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
