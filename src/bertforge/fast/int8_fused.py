"""The passes around an int8 product fused into one each, compiled for this CPU on first use.

In PyTorch ops, quantizing a token's activations (a float32 copy, ``abs``, ``amax``, the scaling, the
rounding, the cast) and scaling the int32 results back (the conversion, two scalings, the bias, the cast to
the output's dtype) are a dozen passes over memory: about as much time as the int8 product itself. Here
each is one loop over a row: ``quantize_rows`` reads the row twice (its largest magnitude, then each value
times ``127 / max``, rounded half to even as `torch.round` rounds) and writes bytes, the very bytes and
scales of `bertforge.fast.int8`'s PyTorch ops; ``dequantize_rows`` reads int32 (or float32) and writes the
output's dtype, their values to one rounding (the compiler may fuse a multiply and an add).

Built with PyTorch's C++ extension loader (a C++ compiler and ninja), ``-O3 -march=native``, under a name
keyed by the CPU's flags, so that a build kept in a home folder shared by several machines is never run on
a CPU without the instructions it was compiled for. Where it cannot be built, `fused_ops` says why once
and the int8 path runs as PyTorch ops.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = ["fused_ops"]

logger = logging.getLogger("bertforge")

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

template <typename T, typename Q>
static void quantize(const T* x, int64_t m, int64_t k, Q* q, float* scale, float offset) {
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const T* row = x + i * k;
      float amax = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        float v = std::fabs(static_cast<float>(row[j]));
        amax = v > amax ? v : amax;
      }
      amax = amax > 0x1p-100f ? amax : 0x1p-100f;  // 127 / amax stays finite (int8._AMAX_FLOOR)
      const float inv = (1.f / amax) * 127.f;  // as PyTorch's 127 / amax: the reciprocal, then the product
      scale[i] = amax / 127.f;
      Q* out = q + i * k;
      for (int64_t j = 0; j < k; ++j)
        out[j] = static_cast<Q>(std::nearbyint(static_cast<float>(row[j]) * inv) + offset);
    }
  });
}

std::vector<torch::Tensor> quantize_rows(torch::Tensor x, bool offset_128) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "quantize_rows: a contiguous 2-D tensor");
  const int64_t m = x.size(0), k = x.size(1);
  auto q = torch::empty({m, k}, x.options().dtype(offset_128 ? torch::kUInt8 : torch::kInt8));
  auto s = torch::empty({m, 1}, x.options().dtype(torch::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND(at::ScalarType::BFloat16, x.scalar_type(), "quantize_rows", [&] {
    if (offset_128) quantize(x.data_ptr<scalar_t>(), m, k, q.data_ptr<uint8_t>(), s.data_ptr<float>(), 128.f);
    else quantize(x.data_ptr<scalar_t>(), m, k, q.data_ptr<int8_t>(), s.data_ptr<float>(), 0.f);
  });
  return {q, s};
}

template <typename A, typename O>
static void dequantize(const A* acc, const float* ws, const float* s, const float* bias, O* out, int64_t m,
                       int64_t n) {
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const A* row = acc + i * n;
      O* o = out + i * n;
      const float si = s[i];
      for (int64_t j = 0; j < n; ++j) {
        float v = static_cast<float>(row[j]);
        if (ws) v *= ws[j];
        v *= si;
        if (bias) v += bias[j];
        o[j] = static_cast<O>(v);
      }
    }
  });
}

torch::Tensor dequantize_rows(torch::Tensor acc, c10::optional<torch::Tensor> channel_scale, torch::Tensor scale,
                              c10::optional<torch::Tensor> bias, bool bf16) {
  TORCH_CHECK(acc.dim() == 2 && acc.is_contiguous(), "dequantize_rows: a contiguous 2-D tensor");
  const int64_t m = acc.size(0), n = acc.size(1);
  auto out = torch::empty({m, n}, acc.options().dtype(bf16 ? torch::kBFloat16 : torch::kFloat));
  const float* ws = channel_scale.has_value() ? channel_scale->data_ptr<float>() : nullptr;
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const float* s = scale.data_ptr<float>();
  if (acc.scalar_type() == torch::kInt) {
    if (bf16) dequantize(acc.data_ptr<int32_t>(), ws, s, b, out.data_ptr<at::BFloat16>(), m, n);
    else dequantize(acc.data_ptr<int32_t>(), ws, s, b, out.data_ptr<float>(), m, n);
  } else {
    TORCH_CHECK(acc.scalar_type() == torch::kFloat, "dequantize_rows: int32 or float32 products");
    if (bf16) dequantize(acc.data_ptr<float>(), ws, s, b, out.data_ptr<at::BFloat16>(), m, n);
    else dequantize(acc.data_ptr<float>(), ws, s, b, out.data_ptr<float>(), m, n);
  }
  return out;
}
"""


_MAX_FLAGS = ("-fno-math-errno", "-ffinite-math-only", "-fno-signed-zeros", "-fno-trapping-math")
"""What lets the compiler vectorize a row's largest magnitude (its loop reorders comparisons, no arithmetic:
the values computed are those of strict IEEE float32)."""


@functools.cache
def fused_ops() -> Any:
    """The compiled ``quantize_rows`` / ``dequantize_rows`` (built once per machine and PyTorch, then loaded
    from PyTorch's extension cache), or None where they cannot be built here (said once, at INFO)."""
    from torch.utils import cpp_extension

    from bertforge.machine import cpu_flags

    key = hashlib.sha256(f"{torch.__version__} {' '.join(sorted(cpu_flags()))} {_SOURCE}".encode()).hexdigest()[:16]
    name = f"bertforge_int8_{key}"
    root = os.environ.get("TORCH_EXTENSIONS_DIR")  # PyTorch's own choice of folder, then its default
    built = Path(root).glob(f"{name}/{name}*.so") if root else Path(cpp_extension.get_default_build_root()).glob(
        f"*/{name}/{name}*.so")
    if not any(built):
        logger.info("int8: compiling the fused quantize kernels for this CPU (once; about half a minute)")
    try:
        with _ninja_on_path():
            return cpp_extension.load_inline(name, cpp_sources=_SOURCE,
                                             functions=["quantize_rows", "dequantize_rows"],
                                             extra_cflags=["-O3", "-march=native", *_MAX_FLAGS], verbose=False)
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a read-only cache: PyTorch ops instead
        logger.info("int8: the fused quantize kernels could not be built here (%s: %s); the passes run as "
                    "PyTorch ops", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return None


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """The ninja that bertforge installs (the ``ninja`` package's binary) on PATH while an extension builds:
    PyTorch's loader runs ``ninja`` from PATH, which lacks a virtual environment's own bin folder when its
    Python is run without activating it."""
    try:
        import ninja
    except ImportError:
        yield
        return
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, path]) if path else ninja.BIN_DIR
    try:
        yield
    finally:
        os.environ["PATH"] = path
