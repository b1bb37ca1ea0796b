"""Numeric precision: one place that turns ``--precision {auto,fp32,bf16,fp16}`` into autocast.

The weights stay float32; bf16 and fp16 are autocast's mixed precision. "auto" is the faster of fp32 and
bf16 on the device (docs/performance.md): a CPU without AMX but with native bf16 asks a probe (`bf16_faster`).
Inference on CPU also takes "int8": the encoder's dense layers in int8 (`bertforge.fast.int8`).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import math
import os
import time
import typing
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from bertforge.io import atomic_write_text
from bertforge.machine import KERNEL_LIMITS, cpu_flags, cpu_name, kernel_limits, machine_key
from bertforge.resources import cache_dir
from bertforge.settings import option

__all__ = ["Precision", "InferencePrecision", "PRECISIONS", "INFERENCE_PRECISIONS", "KERNEL_LIMITS", "autocast",
           "bf16_faster", "check_precision", "cpu_flags", "cpu_name", "dtype_of", "has_amx", "kernel_limits",
           "native_bf16", "needs_grad_scaler", "probe_file", "probe_timings", "resolve_precision"]

logger = logging.getLogger("bertforge")

Precision = Literal["auto", "fp32", "bf16", "fp16"]
InferencePrecision = Literal["auto", "fp32", "bf16", "fp16", "int8"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
INFERENCE_PRECISIONS: tuple[str, ...] = typing.get_args(InferencePrecision)
_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@functools.cache
def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively (asked once per device: inference asks per batch)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return True
    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() in ("default", "avx2"):
        return False  # PyTorch's own kernels limited below AVX-512: its bf16 ops are emulated
    try:  # oneDNN's answer honours ONEDNN_MAX_CPU_ISA
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a build without oneDNN's check: assume it, as autocast does
        return True


def has_amx() -> bool:
    """Whether the CPU has AMX for bf16 (Linux lists ``amx_bf16`` only where processes may use the tiles)."""
    return "amx_bf16" in cpu_flags()


def check_precision(precision: str, *, inference: bool = False) -> str:
    """``precision`` if it is one of `PRECISIONS` (``inference``: `INFERENCE_PRECISIONS`), else a ValueError."""
    if precision == "int8" and not inference:
        raise ValueError("precision int8 is for inference (predict, evaluate, features, serve); training runs in "
                         "fp32, bf16 or fp16")
    choices = INFERENCE_PRECISIONS if inference else PRECISIONS
    if precision not in choices:
        raise ValueError(f"precision must be one of {', '.join(choices)}, got {precision!r}")
    return precision


def resolve_precision(precision: str, device: torch.device | str, *, inference: bool = False) -> str:
    """fp32, bf16, fp16 (``inference``: or int8) for ``device``, "auto" resolved; emulated bf16 warns; int8
    where no int8 kernel beats fp32 on this CPU is fp32, said once (`bertforge.fast.int8.int8_choice`)."""
    device = torch.device(device)
    check_precision(precision, inference=inference)
    if precision == "auto":
        return _auto(device)
    if precision == "fp16" and device.type != "cuda":
        raise ValueError("precision fp16 needs a CUDA device (its gradient scaler); on CPU use bf16")
    if precision == "int8" and device.type != "cpu":
        raise ValueError(f"precision int8 runs on CPU; on {device.type} use bf16 or fp16")
    if precision == "int8" and not _int8_pays():
        return "fp32"
    if precision == "bf16" and not native_bf16(device):
        logger.warning("precision bf16 on a %s without native bf16 (a CPU without AVX-512 BF16 or AMX, a GPU "
                       "before Ampere) is emulated, far slower than fp32; use %s or auto here",
                       device.type, option("precision", "fp32"))
    return precision


@functools.cache
def _int8_pays() -> bool:
    """Whether an int8 kernel beats fp32 on this CPU (`bertforge.fast.int8.int8_choice`); where none does,
    int8 runs fp32, and this says so once per process."""
    from bertforge.fast.int8 import int8_choice

    choice = int8_choice()
    if choice.kernel is None:
        logger.warning("precision int8: %s", int8_note())
    else:  # said when measured; read back from the cache, only with -v
        logger.log(logging.INFO if choice.source.startswith("measured now") else logging.DEBUG,
                   "precision int8: kernel %s on this CPU (%s; %s; %s)", choice.kernel, cpu_name(), choice.summary(),
                   choice.source)
    return choice.kernel is not None


def int8_note() -> str:
    """Why int8 runs fp32 here: the CPU and the probe's times (`bertforge.fast.int8.int8_choice`)."""
    from bertforge.fast.int8 import int8_choice

    choice = int8_choice()
    return (f"no int8 kernel beats fp32 on this CPU ({cpu_name()}; {choice.summary()}; {choice.source}): "
            "running fp32")


def _auto(device: torch.device) -> str:
    """fp32 or bf16: what "auto" stands for on ``device``."""
    if device.type != "cpu":
        return "bf16" if native_bf16(device) else "fp32"
    if not native_bf16(device):
        _note("precision auto: fp32 (this CPU has no native bf16, it would emulate it, tens of times slower)")
        return "fp32"
    if has_amx():
        _note(f"precision auto: bf16 (this CPU has AMX: {cpu_name()})")
        return "bf16"
    return "bf16" if bf16_faster() else "fp32"


@functools.cache
def _note(message: str) -> None:
    """Log ``message`` (DEBUG) once per process: inference resolves "auto" for every batch."""
    logger.debug(message)


# The probe: one BERT-mini encoder layer on a few sequences; its version is part of the cache's key.
_PROBE = dict(hidden=256, heads=4, intermediate=1024, sequences=4, length=128, version=1)
_KEY_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx_ne_convert", "amx_tile", "amx_bf16")
"""The CPU flags that decide how fast fp32 and bf16 matrix products run: part of the cache's key."""


def probe_file() -> Path:
    """Where `bf16_faster` keeps its answers, one per machine, in bertforge's cache folder."""
    return cache_dir() / "precision_probe.json"


def _machine_key() -> str:
    """What a probe's answer holds for: the machine (`bertforge.machine.machine_key` of `_KEY_FLAGS`) and the
    probe's version."""
    return f"{machine_key(_KEY_FLAGS)}; probe {_PROBE['version']}"


@functools.cache
def bf16_faster() -> bool:
    """Whether bf16 autocast runs a BERT layer faster than fp32 on this CPU, by `probe_timings`, whose
    times are kept per machine (`_machine_key`) in `probe_file`, so a machine pays for the probe once."""
    path, key = probe_file(), _machine_key()
    entries = _read_probe_file(path)
    times = _probe_times(entries.get(key))
    if times is None:
        measured = probe_timings()
        times = (measured["fp32"] * 1e3, measured["bf16"] * 1e3)
        entries[key] = {"fp32_ms": round(times[0], 3), "bf16_ms": round(times[1], 3),
                        "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        try:
            atomic_write_text(path, json.dumps({"version": 1, "entries": entries}, indent=1) + "\n")
            kept = f"kept in {path}"
        except OSError as e:
            kept = f"not kept: {e}"
        level, source = logging.INFO, f"measured now, {kept}"
    else:
        level, source = logging.DEBUG, f"measured before, read from {path}"
    fp32_ms, bf16_ms = times
    faster = bf16_ms < fp32_ms
    logger.log(level, "precision auto: %s on this CPU (%s): a BERT-mini layer's forward and backward took %.1f ms "
               "in bf16 against %.1f ms in fp32 (%.2fx; %s)", "bf16" if faster else "fp32", cpu_name(), bf16_ms,
               fp32_ms, bf16_ms / fp32_ms, source)
    return faster


def _read_probe_file(path: Path) -> dict[str, dict]:
    """The entries of `probe_file` that hold two usable times; none where it is absent or not what it should be."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested past the parser's depth
        logger.debug("precision auto: ignoring %s (%s)", path, e)
        return {}
    entries = data.get("entries") if isinstance(data, dict) and data.get("version") == 1 else None
    if not isinstance(entries, dict):
        logger.debug("precision auto: ignoring %s (not a probe cache of version 1)", path)
        return {}
    return {k: v for k, v in entries.items() if _probe_times(v) is not None}


def _probe_times(entry: object) -> tuple[float, float] | None:
    """(fp32 ms, bf16 ms) of a cache entry, or None unless both are positive, finite numbers."""
    times = (entry.get("fp32_ms"), entry.get("bf16_ms")) if isinstance(entry, dict) else (None, None)
    ok = all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < math.inf for t in times)
    return times if ok else None  # type: ignore[return-value]


def probe_timings(repeats: int = 3) -> dict[str, float]:
    """Seconds of one forward and backward of a BERT-mini encoder layer (`_PROBE`) in fp32 and under bf16
    autocast: the fastest of ``repeats`` after a warm-up, alternating so that other load hits both alike,
    on one thread; it stops early once bf16 takes over 4x fp32's time. Torch's global state is kept."""
    threads = torch.get_num_threads()
    times = {"fp32": math.inf, "bf16": math.inf}
    with torch.random.fork_rng(devices=[]), torch.inference_mode(False), torch.enable_grad():
        torch.set_num_threads(1)
        try:
            torch.manual_seed(0)
            layer = nn.TransformerEncoderLayer(_PROBE["hidden"], _PROBE["heads"], _PROBE["intermediate"], dropout=0.0,
                                               activation="gelu", batch_first=True)
            x = torch.randn(_PROBE["sequences"], _PROBE["length"], _PROBE["hidden"], requires_grad=True)

            def run(precision: str) -> float:
                layer.zero_grad(set_to_none=True)
                x.grad = None
                start = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    y = layer(x)
                y.float().sum().backward()
                return time.perf_counter() - start

            for precision in times:  # oneDNN compiles its kernels for each shape and dtype on first use
                run(precision)
            for i in range(repeats):
                for precision in (("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32")):
                    times[precision] = min(times[precision], run(precision))
                if times["bf16"] > 4 * times["fp32"]:
                    break
        finally:
            torch.set_num_threads(threads)
    return times


def dtype_of(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision (None: fp32; int8: that of its floating-point layers)."""
    if precision == "int8":
        return _DTYPES[resolve_precision("auto", "cpu")]
    if precision not in _DTYPES:
        raise ValueError(f"expected a resolved precision (fp32, bf16, fp16, int8), got {precision!r}")
    return _DTYPES[precision]


def needs_grad_scaler(precision: str) -> bool:
    """fp16 training scales the loss so that small gradients do not underflow."""
    return precision == "fp16"


def autocast(precision: str, device: torch.device | str) -> contextlib.AbstractContextManager:
    """The context to run the model in: autocast to ``precision``'s dtype on ``device`` (fp32: none)."""
    device = torch.device(device)
    dtype = dtype_of(resolve_precision(precision, device) if precision == "auto" else precision)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
