"""The CPU inference loops PyTorch runs as several passes over memory, each fused into one, compiled for
this CPU on first use: `cpu_kernels`.

* ``quantize_rows``: a token's activations to int8 bytes and one scale (its largest magnitude, then each
  value times ``127 / max``, rounded half to even as `torch.round` rounds): the very bytes and scales of
  `bertforge.fast.int8`'s PyTorch ops, which take a float32 copy, ``abs``, ``amax``, a scaling, a rounding
  and a cast.
* ``dequantize_rows``: an int8 product's int32 (or float32) results through their scales and bias to the
  output's dtype, to one rounding (the compiler may fuse a multiply and an add).
* ``epilogue_rows``: the same, then what follows the dense layer in BERT's block, in float32, in one pass
  of a row: the residual and LayerNorm (two passes over the row in cache, as exact), or GELU, then the row
  written and / or quantized for the next int8 product as ``quantize_rows`` would. In PyTorch ops these
  are six passes, with a bfloat16 round trip between them under autocast.
* ``masked_softmax``: attention's masked fill, scaling, softmax in float32 and cast back, in place.
* ``gather_heads`` / ``scatter_heads``: attention's per-head layout of a length group read from the
  unpadded rows, and its outputs written back, as row copies (``index_select`` / ``index_copy_`` on a
  permuted view walk them element by element).

Built with PyTorch's C++ extension loader (a C++ compiler and ninja), ``-O3 -march=native``, under a name
keyed by the CPU's flags, so that a build kept in a home folder shared by several machines is never run on
a CPU without the instructions it was compiled for. Where it cannot be built, `cpu_kernels` says why once
and every caller runs PyTorch ops instead. On all-MiniLM-L6-v2 in one thread (AMD EPYC Zen 4) the int8
encoder runs about 1.17x as fast with ``epilogue_rows``, ``masked_softmax`` and the head layout as without
(`benchmarks/cpu_runtimes.py`).
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

__all__ = ["cpu_kernels"]

logger = logging.getLogger("bertforge")

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <algorithm>
#include <cstring>
#include <vector>

// One row of k values to bytes (plus `offset`) and its scale: what quantize_rows and epilogue_rows both write.
template <typename T, typename Q>
static inline void quantize_row(const T* row, int64_t k, Q* out, float* scale, float offset) {
  float amax = 0.f;
  for (int64_t j = 0; j < k; ++j) {
    float v = std::fabs(static_cast<float>(row[j]));
    amax = v > amax ? v : amax;
  }
  amax = amax > 0x1p-100f ? amax : 0x1p-100f;  // 127 / amax stays finite (int8._AMAX_FLOOR)
  const float inv = (1.f / amax) * 127.f;  // as PyTorch's 127 / amax: the reciprocal, then the product
  *scale = amax / 127.f;
  for (int64_t j = 0; j < k; ++j) out[j] = static_cast<Q>(std::nearbyint(static_cast<float>(row[j]) * inv) + offset);
}

template <typename T, typename Q>
static void quantize(const T* x, int64_t m, int64_t k, Q* q, float* scale, float offset) {
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) quantize_row(x + i * k, k, q + i * k, scale + i, offset);
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

// exp(x) for x <= 0 without branches (Cephes' expf: 2^n times a polynomial of the remainder), so that a loop
// calling it vectorizes (the softmax tests hold it to PyTorch's within 1e-6); below -87 it gives exp(-87), 1.6e-38.
static inline float exp_nonpositive(float x) {
  x = x < -87.f ? -87.f : x;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

// GELU's exact form over a row, x * (1 + erf(x / sqrt 2)) / 2, with erf(z) = z P(z^2) / Q(z^2) on |z| <= 3.925
// (a rational fit of degree 5 / 5, absolute error below 4e-7 in float32; beyond, erf is +-1 to float32),
// branch-free: a dozen multiply-adds and one division, a little over half the time of an
// exponential-based erf; the result, within 2e-6 of GELU, is read only by the next quantize.
static void gelu_row(float* __restrict v, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float x = v[j];
    float z = x * 0.70710678118654752f;
    z = z > 3.925f ? 3.925f : (z < -3.925f ? -3.925f : z);
    const float u = z * z;
    const float p = ((((2.0635172784062493e-06f * u + 2.836085163476713e-04f) * u + 3.701455676612681e-03f) * u +
                      5.254907080421819e-02f) * u + 1.8888752927575467e-01f) * u + 1.1283791610075624f;
    const float q = ((((3.816528444616387e-05f * u + 1.1473438360479992e-03f) * u + 1.4839779670667269e-02f) * u +
                      1.1348252537162297e-01f) * u + 5.007302131678479e-01f) * u + 1.f;
    v[j] = 0.5f * x * (1.f + z * p / q);
  }
}

// A row's sum (of squares) in 16 running partial sums, which the compiler keeps in one vector register: a
// single running sum would be added lane by lane, in order, the loop's whole cost.
static inline float tree_sum(float* part) {  // in halves: 4 dependent adds, not 16
  for (int w = 8; w >= 1; w /= 2)
    for (int u = 0; u < w; ++u) part[u] += part[u + w];
  return part[0];
}

static inline float row_sum(const float* v, int64_t n) {
  float part[16] = {0.f};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int u = 0; u < 16; ++u) part[u] += v[j + u];
  for (; j < n; ++j) part[j % 16] += v[j];
  return tree_sum(part);
}

static inline float row_sum_squares(const float* v, int64_t n) {
  float part[16] = {0.f};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int u = 0; u < 16; ++u) part[u] += v[j + u] * v[j + u];
  for (; j < n; ++j) part[j % 16] += v[j] * v[j];
  return tree_sum(part);
}

// One row of a dense layer's int32 (or scaled float32) products through what follows the layer in BERT's
// block, in float32 and in one pass of memory: scales and bias; then the residual and LayerNorm, or GELU;
// then the row written in float32 and / or quantized for the next int8 product (as quantize_rows).
template <typename A, typename Q>
static void epilogue(const A* acc, const float* ws, const float* s, const float* bias, const float* residual,
                     const float* gamma, const float* beta, float eps, bool gelu, float* out, Q* q, float* qs,
                     float offset, int64_t m, int64_t n) {
  at::parallel_for(0, m, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(n);
    float* v = buffer.data();
    for (int64_t i = begin; i < end; ++i) {
      const A* row = acc + i * n;
      const float si = s[i];
      for (int64_t j = 0; j < n; ++j) v[j] = static_cast<float>(row[j]) * (ws ? ws[j] : 1.f) * si;
      if (bias) for (int64_t j = 0; j < n; ++j) v[j] += bias[j];
      if (residual) {
        const float* r = residual + i * n;
        for (int64_t j = 0; j < n; ++j) v[j] += r[j];
      }
      if (gamma) {  // LayerNorm over the row: mean, then the mean squared deviation (two passes, as exact)
        const float mean = row_sum(v, n) / static_cast<float>(n);
        for (int64_t j = 0; j < n; ++j) v[j] -= mean;
        const float rstd = 1.f / std::sqrt(row_sum_squares(v, n) / static_cast<float>(n) + eps);
        for (int64_t j = 0; j < n; ++j) v[j] = v[j] * rstd * gamma[j] + beta[j];
      }
      if (gelu) gelu_row(v, n);
      if (out) std::memcpy(out + i * n, v, n * sizeof(float));
      if (q) quantize_row(v, n, q + i * n, qs + i, offset);
    }
  });
}

// The products `acc` (M, N) of a dense layer with row scales `scale` (M, 1) and optional channel scales,
// bias, float32 residual (M, N) and LayerNorm (gamma, beta, eps), or GELU -> [out float32 (M, N) or an
// empty tensor, q (M, N) int8 / uint8 (q + 128) or empty, its row scales (M, 1) or empty].
std::vector<torch::Tensor> epilogue_rows(torch::Tensor acc, c10::optional<torch::Tensor> channel_scale,
                                         torch::Tensor scale, c10::optional<torch::Tensor> bias,
                                         c10::optional<torch::Tensor> residual, c10::optional<torch::Tensor> gamma,
                                         c10::optional<torch::Tensor> beta, double eps, bool gelu, bool write_out,
                                         int64_t quantize) {
  TORCH_CHECK(acc.dim() == 2 && acc.is_contiguous(), "epilogue_rows: a contiguous 2-D tensor");
  TORCH_CHECK(quantize >= 0 && quantize <= 2, "epilogue_rows: quantize is 0 (no), 1 (int8) or 2 (uint8)");
  const int64_t m = acc.size(0), n = acc.size(1);
  auto f32 = acc.options().dtype(torch::kFloat);
  auto out = write_out ? torch::empty({m, n}, f32) : torch::empty({0}, f32);
  auto q = torch::empty(quantize ? std::vector<int64_t>{m, n} : std::vector<int64_t>{0},
                        acc.options().dtype(quantize == 2 ? torch::kUInt8 : torch::kInt8));
  auto qs = torch::empty(quantize ? std::vector<int64_t>{m, 1} : std::vector<int64_t>{0}, f32);
  auto ptr = [](const c10::optional<torch::Tensor>& t) { return t.has_value() ? t->data_ptr<float>() : nullptr; };
  if (residual.has_value())
    TORCH_CHECK(residual->is_contiguous() && residual->scalar_type() == torch::kFloat && residual->numel() == m * n,
                "epilogue_rows: a contiguous float32 residual of the products' shape");
  TORCH_CHECK(gamma.has_value() == beta.has_value(), "epilogue_rows: LayerNorm takes gamma and beta");
  float* o = write_out ? out.data_ptr<float>() : nullptr;
  float* qsp = quantize ? qs.data_ptr<float>() : nullptr;
  auto run = [&](auto* a) {
    if (quantize == 2)
      epilogue(a, ptr(channel_scale), scale.data_ptr<float>(), ptr(bias), ptr(residual), ptr(gamma), ptr(beta),
               static_cast<float>(eps), gelu, o, q.data_ptr<uint8_t>(), qsp, 128.f, m, n);
    else
      epilogue(a, ptr(channel_scale), scale.data_ptr<float>(), ptr(bias), ptr(residual), ptr(gamma), ptr(beta),
               static_cast<float>(eps), gelu, o, quantize ? q.data_ptr<int8_t>() : nullptr, qsp, 0.f, m, n);
  };
  if (acc.scalar_type() == torch::kInt) run(acc.data_ptr<int32_t>());
  else {
    TORCH_CHECK(acc.scalar_type() == torch::kFloat, "epilogue_rows: int32 or float32 products");
    run(acc.data_ptr<float>());
  }
  return {out, q, qs};
}

// bfloat16 read and written by bits (the latter rounding to nearest even, its input finite), so that loops
// over a row vectorize.
static inline float to_float(float x) { return x; }
static inline float to_float(at::BFloat16 x) {
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
static inline void store(float* o, float x) { *o = x; }
static inline void store(at::BFloat16* o, float x) {  // round to nearest even (x is finite)
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  o->x = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

template <typename T>
static void softmax_rows(T* x, const bool* mask, int64_t d0, int64_t d1, int64_t k, int64_t t,
                         const int64_t* mask_strides, float scale) {
  const int64_t width = (t + 15) / 16 * 16;  // a row padded with masked keys: loops without remainders
  at::parallel_for(0, d0 * d1, std::max<int64_t>(1, 4096 / (k * t)), [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(2 * width, 0.f);
    float* __restrict v = buffer.data();
    float* __restrict keep = v + width;
    std::fill(keep, keep + t, 1.f);
    const uint8_t* last = nullptr;
    for (int64_t plane = begin; plane < end; ++plane) {
      const uint8_t* plane_mask = mask ? reinterpret_cast<const uint8_t*>(mask) + plane / d1 * mask_strides[0] +
                                             plane % d1 * mask_strides[1]
                                       : nullptr;
      for (int64_t i = 0; i < k; ++i) {
        T* __restrict row = x + (plane * k + i) * t;
        const uint8_t* m = plane_mask ? plane_mask + i * mask_strides[2] : nullptr;
        if (m != last) {  // rows mostly share their sequence's mask: it is read once for them
          for (int64_t j = 0; j < t; ++j) keep[j] = static_cast<float>(m[j]);
          last = m;
        }
        for (int64_t j = 0; j < t; ++j) v[j] = to_float(row[j]) * scale;
        float mx = -3.0e38f;
        for (int64_t j = 0; j < width; ++j) {
          v[j] = keep[j] > 0.f ? v[j] : -3.0e38f;
          mx = v[j] > mx ? v[j] : mx;
        }
        for (int64_t j = 0; j < width; ++j) v[j] = exp_nonpositive(v[j] - mx) * keep[j];
        const float inv = 1.f / row_sum(v, width);
        for (int64_t j = 0; j < t; ++j) store(row + j, v[j] * inv);
      }
    }
  });
}

// softmax(scale * scores) over the last axis, in float32, written over the scores (float32 or bfloat16,
// contiguous (D0, D1, K, T)); key_mask: bool, True = attend, of the scores' shape with any strides (an
// expanded mask) but the last, which is 1; a row's masked keys get probability 0, a row with none
// unmasked gets meaningless values (PyTorch's: NaN).
torch::Tensor masked_softmax(torch::Tensor scores, c10::optional<torch::Tensor> key_mask, double scale) {
  TORCH_CHECK(scores.dim() == 4 && scores.is_contiguous(), "masked_softmax: contiguous 4-D scores");
  const int64_t d0 = scores.size(0), d1 = scores.size(1), k = scores.size(2), t = scores.size(3);
  const bool* mask = nullptr;
  int64_t strides[3] = {0, 0, 0};
  if (key_mask.has_value()) {
    TORCH_CHECK(key_mask->sizes() == scores.sizes() && key_mask->scalar_type() == torch::kBool &&
                key_mask->stride(3) == 1, "masked_softmax: a bool key mask of the scores' shape, last stride 1");
    mask = key_mask->data_ptr<bool>();
    for (int d = 0; d < 3; ++d) strides[d] = key_mask->stride(d);
  }
  if (scores.scalar_type() == torch::kBFloat16)
    softmax_rows(scores.data_ptr<at::BFloat16>(), mask, d0, d1, k, t, strides, static_cast<float>(scale));
  else {
    TORCH_CHECK(scores.scalar_type() == torch::kFloat, "masked_softmax: float32 or bfloat16 scores");
    softmax_rows(scores.data_ptr<float>(), mask, d0, d1, k, t, strides, static_cast<float>(scale));
  }
  return scores;
}

// Attention's per-head layout from the unpadded rows and back, as row copies (bytes: any dtype):
// gather_heads: qkv (N, parts * heads * D), rows (M,) -> (parts, heads, M, D), out[c, a, m] = qkv[rows[m], c, a];
// scatter_heads: y (heads, M, D), real (R,), targets (R,) or none -> out (N, heads * D) rows targets[i] (or i)
// = y[:, real[i]], written in place.
static inline void copy_head(char* to, const char* from, int64_t bytes) {
  switch (bytes) {  // the common sizes (a head of 32 or 64 in bfloat16, 32 in float32) as moves, not calls
    case 64: std::memcpy(to, from, 64); break;
    case 128: std::memcpy(to, from, 128); break;
    default: std::memcpy(to, from, bytes);
  }
}

torch::Tensor gather_heads(torch::Tensor qkv, torch::Tensor rows, int64_t parts, int64_t heads) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.is_contiguous() && qkv.size(1) % (parts * heads) == 0,
              "gather_heads: contiguous (N, parts * heads * D) rows");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == torch::kLong && rows.is_contiguous(),
              "gather_heads: (M,) int64");
  const int64_t n = qkv.size(0), m = rows.size(0), d = qkv.size(1) / (parts * heads);
  const int64_t bytes = d * qkv.element_size();
  auto out = torch::empty({parts, heads, m, d}, qkv.options());
  const char* src = static_cast<const char*>(qkv.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const int64_t* index = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < m; ++i) TORCH_CHECK(index[i] >= 0 && index[i] < n, "gather_heads: a row out of range");
  at::parallel_for(0, m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const char* row = src + index[i] * parts * heads * bytes;
      for (int64_t c = 0; c < parts * heads; ++c) copy_head(dst + (c * m + i) * bytes, row + c * bytes, bytes);
    }
  });
  return out;
}

torch::Tensor scatter_heads(torch::Tensor y, torch::Tensor real, c10::optional<torch::Tensor> targets,
                            torch::Tensor out) {
  TORCH_CHECK(y.dim() == 3 && y.is_contiguous(), "scatter_heads: contiguous (heads, M, D)");
  const int64_t heads = y.size(0), m = y.size(1), d = y.size(2), r = real.size(0);
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.size(1) == heads * d && out.scalar_type() == y.scalar_type(),
              "scatter_heads: contiguous (N, heads * D) output of y's dtype");
  TORCH_CHECK(real.scalar_type() == torch::kLong && real.is_contiguous(), "scatter_heads: (R,) int64 positions");
  const int64_t* from = real.data_ptr<int64_t>();
  const int64_t* to = targets.has_value() ? targets->data_ptr<int64_t>() : nullptr;
  if (to) TORCH_CHECK(targets->scalar_type() == torch::kLong && targets->is_contiguous() && targets->numel() == r,
                      "scatter_heads: (R,) int64 targets");
  for (int64_t i = 0; i < r; ++i)
    TORCH_CHECK(from[i] >= 0 && from[i] < m && (to ? to[i] : i) >= 0 && (to ? to[i] : i) < out.size(0),
                "scatter_heads: a position out of range");
  const int64_t bytes = d * y.element_size();
  const char* src = static_cast<const char*>(y.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  at::parallel_for(0, r, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      char* row = dst + (to ? to[i] : i) * heads * bytes;
      for (int64_t a = 0; a < heads; ++a) copy_head(row + a * bytes, src + (a * m + from[i]) * bytes, bytes);
    }
  });
  return out;
}
"""


_FUNCTIONS = ["quantize_rows", "dequantize_rows", "epilogue_rows", "masked_softmax", "gather_heads", "scatter_heads"]
_MAX_FLAGS = ("-fno-math-errno", "-ffinite-math-only", "-fno-signed-zeros", "-fno-trapping-math")
"""What lets the compiler vectorize a row's largest magnitude (its loop reorders comparisons, no arithmetic:
the values computed are those of strict IEEE float32)."""


@functools.cache
def cpu_kernels() -> Any:
    """The compiled kernels (built once per machine and PyTorch, then loaded from PyTorch's extension cache),
    or None where they cannot be built here (said once, at INFO)."""
    from torch.utils import cpp_extension

    from bertforge.machine import cpu_flags

    key = hashlib.sha256(f"{torch.__version__} {' '.join(sorted(cpu_flags()))} {_SOURCE}".encode()).hexdigest()[:16]
    name = f"bertforge_kernels_{key}"
    root = os.environ.get("TORCH_EXTENSIONS_DIR")  # PyTorch's own choice of folder, then its default
    built = Path(root).glob(f"{name}/{name}*.so") if root else Path(cpp_extension.get_default_build_root()).glob(
        f"*/{name}/{name}*.so")
    if not any(built):
        logger.info("compiling bertforge's CPU kernels for this CPU (once; about half a minute)")
    try:
        with _ninja_on_path():
            return cpp_extension.load_inline(name, cpp_sources=_SOURCE,
                                             functions=_FUNCTIONS,
                                             extra_cflags=["-O3", "-march=native", *_MAX_FLAGS], verbose=False)
    except Exception as e:  # noqa: BLE001 - no compiler, no ninja, a read-only cache: PyTorch ops instead
        logger.info("bertforge's CPU kernels could not be built here (%s: %s); PyTorch ops run instead",
                    type(e).__name__, str(e).splitlines()[0] if str(e) else "")
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
