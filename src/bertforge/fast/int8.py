"""Int8 inference for the encoder's dense layers, applied to a built model from outside:
`quantize_int8(model)`.

A quantized `nn.Linear` computes ``y = (q(x) @ q(W)^T) * s_x * s_w + b`` with

* ``q(W) = round(W / s_w)``, int8, one scale ``s_w = max|W_j| / w_max`` per output channel (row of
  W), made once when the model is quantized;
* ``q(x) = round(x * 127 / max|x_i|)``, one scale ``s_x = max|x_i| / 127`` per token (row of x), made at run
  time, so a token with large activations does not cost the others their precision;
* the product accumulated in int32 by the machine's fastest exact int8 kernel (`int8_kernel`).

Everything else (embeddings, LayerNorm, attention's own products, the task heads) stays in floating point.

Two kernels, both oneDNN's:

* ``int_mm``: `torch._int_mm`, signed x signed bytes. PyTorch runs it through oneDNN only on CPUs with
  AVX-512 VNNI; elsewhere it is a scalar loop, tens of times slower than fp32.
* ``onednn``: oneDNN's quantized linear (``torch.ops.onednn.qlinear_pointwise``) on unsigned bytes,
  ``q(x) + 128`` with the zero point 128, oneDNN folding the zero point into a per-column term. This is
  the form AVX2's int8 instruction (``vpmaddubsw``: unsigned x signed bytes) multiplies, and oneDNN
  picks its kernel by the instructions it finds (``ONEDNN_MAX_CPU_ISA`` caps them).

``vpmaddubsw`` adds two products into a saturating 16-bit sum, which two products of full 7-bit weights
(2 * 255 * 127) overflow, silently, while 6-bit ones (2 * 255 * 63) do not: ``w_max`` is 127 where a
kernel multiplies without saturating (VNNI, AMX) and 63 elsewhere, probed per kernel on worst-case
operands. `int8_kernel` measures each exact kernel against fp32 once per machine (the answer kept in
bertforge's cache folder) and takes the fastest, or none where none beats fp32: then ``--precision
int8`` runs fp32 and says so (`bertforge.train.precision.resolve_precision`).

In train mode, with gradients on, or while exporting or compiling, a quantized layer runs its float
weights, which quantization leaves as they are (the state dict is unchanged).
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
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.fast.kernels import cpu_kernels
from bertforge.fast.tracing import tracing

__all__ = ["KERNELS", "Int8Choice", "full_range_int8", "int8_kernel", "int8_choice", "int8_linear", "int8_weights",
           "is_quantized", "kernel_candidates", "probe_file", "quantize_int8", "quantized_layers"]

logger = logging.getLogger("bertforge")

# A quantized nn.Linear's int8 weights, in its __dict__ (not a buffer: state dicts do not see it):
# {layer count: _Int8Weight} for the layer alone (1) and for the stacked projections it leads (q, k, v: 3; k, v: 2).
_INT8 = "_int8_weights"


KERNELS = ("int_mm", "onednn")
"""The int8 products `int8_kernel` chooses among (see the module docstring)."""
_PROBE_VERSION = 2
_KEY_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")
"""The CPU flags that decide which int8 products run and how fast: part of the probe cache's key."""
_PROBE_SHAPES = ((256, 384, 1536), (256, 1536, 384))
"""(rows, in, out) of the probe's two layers: a batch of tokens through a BERT-small FFN's two dense layers."""


def kernel_candidates() -> list[str]:
    """The `KERNELS` that run a real int8 product here: ``int_mm`` only where PyTorch sends it to oneDNN
    (AVX-512 VNNI, and no ``ONEDNN_MAX_CPU_ISA`` capping oneDNN below VNNI, which stands for a CPU without
    it: there PyTorch's loop would run); ``onednn`` where this PyTorch has oneDNN's quantized linear."""
    out = []
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    capped = bool(isa) and isa != "ALL" and "VNNI" not in isa and "AMX" not in isa
    if getattr(torch.cpu, "_is_vnni_supported", lambda: False)() and not capped:
        out.append("int_mm")
    if hasattr(torch.ops.onednn, "qlinear_pointwise") and torch.backends.mkldnn.is_available():
        out.append("onednn")
    return out


@functools.cache
def full_range_int8(kernel: str = "int_mm") -> bool:
    """Whether ``kernel``'s int8 matrix product on CPU is exact for full-range (7-bit) weights, that is,
    does not saturate on worst-case operands (see the module docstring)."""
    return _exact(kernel, 127)


def _exact(kernel: str, w_max: int) -> bool:
    """Whether ``kernel`` computes worst-case operands (activations and weights all at +-their largest)
    exactly with weights of at most ``w_max`` (False where it does not run at all)."""
    g = torch.Generator().manual_seed(0)
    x = torch.where(torch.rand(32, 256, generator=g) < 0.5, 127, -127).to(torch.int8)
    w = torch.where(torch.rand(32, 256, generator=g) < 0.5, w_max, -w_max).to(torch.int8)  # (out, in)
    exact = x.double() @ w.double().t()
    try:
        got = _product(kernel, _pack(kernel, w), x, torch.ones(32)).double()
    except (RuntimeError, NotImplementedError) as e:  # a build or CPU this kernel does not run on
        logger.debug("int8 %s product does not run here: %s", kernel, e)
        return False
    same = bool(torch.equal(got, exact))
    logger.debug("int8 %s product %s weights of +-%d", kernel, "exact with" if same else "saturates with", w_max)
    return same


def _pack(kernel: str, wq: torch.Tensor) -> torch.Tensor:
    """The int8 weights ``wq`` (out, in) in ``kernel``'s form."""
    if kernel == "int_mm":
        return wq.t().contiguous()
    return torch.ops.onednn.qlinear_prepack(wq.contiguous(), None)


def _product(kernel: str, packed: torch.Tensor, xq: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """(M, N) float32 ``(xq @ wq^T) * w_scale`` of int8 activations ``xq`` (M, K); ``onednn`` takes them as
    the unsigned bytes ``xq + 128`` (uint8) too."""
    if kernel == "int_mm":
        return torch._int_mm(xq, packed).float().mul_(w_scale)
    if xq.dtype == torch.int8:
        xq = (xq.to(torch.int16) + 128).to(torch.uint8)
    zero = torch.zeros(len(w_scale), dtype=torch.int32)
    return torch.ops.onednn.qlinear_pointwise(xq, 1.0, 128, packed, w_scale, zero, None, 1.0, 0, torch.float32,
                                              "none", [], "")


class Int8Choice:
    """`int8_kernel`'s answer: the ``kernel`` (None: none beats fp32), each candidate's ``w_max`` and the
    probe's times (ms: ``fp32`` and each exact kernel's)."""

    def __init__(self, kernel: str | None, w_max: dict[str, int], times: dict[str, float], source: str):
        self.kernel, self.w_max, self.times, self.source = kernel, w_max, times, source

    def summary(self) -> str:
        fp32 = self.times.get("fp32", math.nan)
        parts = [f"{k} {t:.2f} ms ({fp32 / t:.2f}x)" for k, t in self.times.items() if k != "fp32"]
        return f"two dense layers: fp32 {fp32:.2f} ms, " + (", ".join(parts) or "no exact int8 kernel")


def probe_file() -> Path:
    """Where `int8_choice` keeps its answers, one per machine, in bertforge's cache folder."""
    from bertforge.resources import cache_dir

    return cache_dir() / "int8_probe.json"


@functools.cache
def int8_choice() -> Int8Choice:
    """The int8 kernel this machine runs fastest among the exact `kernel_candidates`, if it beats fp32 on the
    probe's layers (`_PROBE_SHAPES`, one thread), measured once per machine and kept in `probe_file`."""
    from bertforge.io import atomic_write_text
    from bertforge.machine import machine_key

    path, key = probe_file(), f"{machine_key(_KEY_FLAGS)}; int8 probe {_PROBE_VERSION}"
    entries = _read_probe(path)
    entry = entries.get(key)
    if entry is None:
        w_max = {k: 127 if full_range_int8(k) else 63 for k in kernel_candidates()}
        w_max = {k: m for k, m in w_max.items() if m == 127 or _exact(k, m)}
        times = probe_times(w_max)
        entry = {"w_max": w_max, "times_ms": {k: round(t, 4) for k, t in times.items()},
                 "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        entries[key] = entry
        try:
            atomic_write_text(path, json.dumps({"version": 1, "entries": entries}, indent=1) + "\n")
            source = f"measured now, kept in {path}"
        except OSError as e:
            source = f"measured now, not kept: {e}"
    else:
        source = f"measured before, read from {path}"
    times = dict(entry["times_ms"])
    fastest = min((k for k in times if k != "fp32"), key=times.__getitem__, default=None)
    kernel = fastest if fastest is not None and times[fastest] < times["fp32"] else None
    return Int8Choice(kernel, dict(entry["w_max"]), times, source)


def int8_kernel() -> str | None:
    """The kernel int8 products run with here (`int8_choice`); None: no int8 kernel beats fp32 here."""
    return int8_choice().kernel


def _read_probe(path: Path) -> dict[str, dict[str, Any]]:
    """The usable entries of `probe_file`; none where it is absent or not what it should be."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, RecursionError) as e:
        logger.debug("int8: ignoring %s (%s)", path, e)
        return {}
    entries = data.get("entries") if isinstance(data, dict) and data.get("version") == 1 else None
    return {k: v for k, v in entries.items() if _usable(v)} if isinstance(entries, dict) else {}


def _usable(entry: Any) -> bool:
    def positive(t: Any) -> bool:
        return isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < math.inf

    if not isinstance(entry, dict) or not isinstance(entry.get("times_ms"), dict) or not isinstance(
            entry.get("w_max"), dict):
        return False
    times, w_max = entry["times_ms"], entry["w_max"]
    return (positive(times.get("fp32")) and all(k in KERNELS and positive(t) for k, t in times.items() if k != "fp32")
            and all(k in KERNELS and m in (63, 127) for k, m in w_max.items()) and set(times) - {"fp32"} <= set(w_max))


def probe_times(w_max: dict[str, int], repeats: int = 5) -> dict[str, float]:
    """Milliseconds of the probe's two dense layers (`_PROBE_SHAPES`) in fp32 and through each kernel of
    ``w_max`` (quantizing the activations, the product, the scales and bias): the fastest of ``repeats``
    after a warm-up, alternating so that other load hits all alike, on one thread."""
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.set_num_threads(1)
        try:
            torch.manual_seed(0)
            layers = [nn.Linear(k, n) for _, k, n in _PROBE_SHAPES]
            inputs = [torch.randn(m, k) for m, k, _ in _PROBE_SHAPES]
            runs: dict[str, Callable[[], Any]] = {"fp32": lambda: [F.linear(x, m.weight, m.bias)
                                                                   for x, m in zip(inputs, layers)]}
            for kernel, limit in w_max.items():
                weights = [_Int8Weight([m.weight], [m.bias], limit, kernel) for m in layers]
                runs[kernel] = functools.partial(lambda ws: [_linear(x, w) for x, w in zip(inputs, ws)], weights)
            times = {name: math.inf for name in runs}
            for run in runs.values():
                run()  # oneDNN compiles its kernels for each shape on first use
            for i in range(repeats):
                for name in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
                    start = time.perf_counter()
                    runs[name]()
                    times[name] = min(times[name], (time.perf_counter() - start) * 1e3)
        finally:
            torch.set_num_threads(threads)
    return times


class _Int8Weight:
    """A weight quantized per output channel for ``kernel``: ``packed`` (its form of the int8 weights),
    ``scale`` (out_features,) and ``bias`` float32, and the storages and versions it was made from."""

    __slots__ = ("kernel", "packed", "scale", "bias", "sources", "versions")

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None], w_max: int, kernel: str):
        w = torch.cat([t.detach().float() for t in weights])  # (out, in)
        self.kernel = kernel
        self.scale = w.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / w_max
        self.packed = _pack(kernel, torch.round(w / self.scale[:, None]).clamp_(-w_max, w_max).to(torch.int8))
        self.bias = (None if any(b is None for b in biases) else torch.cat([b.detach().float() for b in biases]))
        self.sources = [t.detach() for t in weights + [b for b in biases if b is not None]]
        self.versions = [t._version for t in self.sources]

    def __deepcopy__(self, memo: dict) -> _Int8Weight:
        # oneDNN's packed weights are opaque tensors, which cannot be copied; a copied layer's own weights live
        # at other addresses, so `current` fails for them and they are quantized afresh on first use
        return self

    def current(self, params: list[torch.Tensor]) -> bool:
        return len(params) == len(self.sources) and all(
            s.data_ptr() == t.data_ptr() and v == t._version for s, v, t in zip(self.sources, self.versions, params))


def quantize_int8(model: nn.Module, quantized: bool = True) -> nn.Module:
    """Quantize the dense layers of every encoder in ``model`` (`quantized_layers`) to int8 for
    inference, in place, and return it (``quantized=False``: back to float). Idempotent; the float
    weights stay as they are (see the module docstring)."""
    layers = quantized_layers(model)
    for layer in layers:
        _set_quantized(layer, quantized)
    if quantized:
        kernel, w_max = _kernel()
        logger.debug("int8: %d dense layers quantized (weights to +-%d, kernel %s)", len(layers), w_max, kernel)
    return model


@contextlib.contextmanager
def int8_weights(model: nn.Module, quantized: bool = True) -> Iterator[nn.Module]:
    """``model`` quantized (``quantized=False``: in float) for the length of a ``with`` block, and as
    it was afterwards."""
    before = {layer: is_quantized(layer) for layer in quantized_layers(model)}
    quantize_int8(model, quantized)
    try:
        yield model
    finally:
        for layer, was in before.items():
            _set_quantized(layer, was)


def _kernel() -> tuple[str, int]:
    """The kernel quantized layers run with and its ``w_max``: `int8_kernel`, or where none beats fp32 (and
    quantization was asked for all the same) the fastest exact one, or PyTorch's `torch._int_mm` loop."""
    choice = int8_choice()
    exact = {k: t for k, t in choice.times.items() if k != "fp32"}
    kernel = choice.kernel or min(exact, key=exact.__getitem__, default="int_mm")
    return kernel, choice.w_max.get(kernel) or (127 if full_range_int8(kernel) else 63)


def _set_quantized(layer: nn.Linear, quantized: bool) -> None:
    if not quantized:
        layer.__dict__.pop(_INT8, None)
        if getattr(layer.__dict__.get("forward"), "__func__", None) is _forward:
            del layer.forward
    elif _INT8 not in layer.__dict__:
        layer.__dict__[_INT8] = {1: _Int8Weight([layer.weight], [layer.bias], *_kernel()[::-1])}
        layer.forward = MethodType(_forward, layer)  # calls outside `bertforge.fast.frozen.linear`


def quantized_layers(model: nn.Module) -> list[nn.Linear]:
    """The layers `quantize_int8` quantizes: every `nn.Linear` of each `BertModel` in ``model`` (query,
    key, value, attention output, intermediate, output, pooler), and none of the heads'."""
    from bertforge.model.bert import BertModel

    found: dict[int, nn.Linear] = {}
    for module in model.modules():
        if isinstance(module, BertModel):
            for m in module.modules():
                if type(m) is nn.Linear:
                    found[id(m)] = m
    return list(found.values())


def is_quantized(layer: nn.Module) -> bool:
    return _INT8 in layer.__dict__


def _runs_int8(layer: nn.Linear) -> bool:
    return not (layer.training or torch.is_grad_enabled() or tracing())


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A quantized layer called as a module."""
    return int8_linear(x, self)


def int8_linear(x: torch.Tensor, *layers: nn.Linear) -> torch.Tensor:
    """The outputs of quantized ``layers`` side by side, (..., sum of their out_features), from one int8
    matrix product with their weights stacked, in the dtype `F.linear` would give. Outside inference:
    the float weights."""
    first = layers[0]
    if not _runs_int8(first):
        if len(layers) == 1:
            return F.linear(x, first.weight, first.bias)
        return F.linear(x, torch.cat([m.weight for m in layers]), torch.cat([m.bias for m in layers]))
    q = _weight(layers)
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.shape[0] == 0:
        return F.linear(x, torch.cat([m.weight for m in layers]), q.bias)  # no rows: the float shape and dtype
    dtype = (torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type)
             else x.dtype)  # what F.linear would return here
    return _linear(x2, q, dtype).reshape(*shape[:-1], -1)


def _weight(layers: tuple[nn.Linear, ...]) -> _Int8Weight:
    """The quantized weights of ``layers`` stacked, made again where a weight changed since."""
    first = layers[0]
    entries = first.__dict__[_INT8]
    params = [m.weight for m in layers] + [m.bias for m in layers if m.bias is not None]
    q = entries.get(len(layers))
    if q is None or not q.current(params):
        kernel, w_max = _kernel()
        q = entries[len(layers)] = _Int8Weight([m.weight for m in layers], [m.bias for m in layers], w_max, kernel)
    return q


def int8_feed_forward(layer: nn.Module, residual: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
    """What follows attention in a quantized `BertLayer`, ``h = LN(residual + attention output(y))`` and
    ``LN(h + output(GELU(intermediate(h))))``, for (N, H) rows, as three int8 products and three compiled
    passes between them (`bertforge.fast.kernels` ``epilogue_rows``): each takes a product's int32 results
    through its scales, bias, residual and LayerNorm or GELU, in float32, to the float32 rows and the int8
    bytes of the next product, with no pass of its own for the bias, the residual, LayerNorm, GELU or
    quantizing. None where this layer is not one it can run exactly so: its dense layers not all quantized
    or not in inference, another activation than GELU's exact form, a module hooked or replaced, dropout
    on, a residual that is not float32, or no compiled kernels here."""
    attention, intermediate, output = layer.attention.output, layer.intermediate, layer.output
    denses = (attention.dense, intermediate.dense, output.dense)
    kernels = cpu_kernels() if residual.dtype == torch.float32 and y.dtype in _FUSED_DTYPES else None
    modules = (*denses, attention.LayerNorm, output.LayerNorm, attention.dropout, output.dropout)
    if (kernels is None or intermediate.act is not F.gelu or residual.shape[0] == 0
            or not all(type(m) is nn.Linear and is_quantized(m) and _runs_int8(m) for m in denses)
            or any(m._forward_hooks or m._forward_pre_hooks for m in modules)
            or not all(type(m) is nn.LayerNorm and m.weight is not None and m.bias is not None
                       and m.weight.dtype == torch.float32 for m in (attention.LayerNorm, output.LayerNorm))
            or any(m.training and m.p > 0 for m in (attention.dropout, output.dropout))):
        return None
    a, i, o = (_weight((m,)) for m in denses)
    xq, s = kernels.quantize_rows(y.contiguous(), a.kernel != "int_mm")  # onednn: q(x) + 128, unsigned
    h, hq, hs = _epilogue(kernels, a, xq, s, residual.contiguous(), attention.LayerNorm, then=i)
    _, fq, fs = _epilogue(kernels, i, hq, hs, None, None, then=o, gelu=True)
    return _epilogue(kernels, o, fq, fs, h, output.LayerNorm)[0]


def _epilogue(kernels: Any, q: _Int8Weight, xq: torch.Tensor, s: torch.Tensor, residual: torch.Tensor | None,
              norm: nn.LayerNorm | None, then: _Int8Weight | None = None, gelu: bool = False) -> list[torch.Tensor]:
    """``epilogue_rows`` of the int8 rows ``xq`` (scales ``s``) through ``q``: [float32 rows (unless GELU's,
    which only the next product reads), the bytes and scales of the next product ``then`` reads]."""
    acc, channel = _products(q, xq)
    byte_form = 0 if then is None else 1 if then.kernel == "int_mm" else 2  # int8, or onednn's q(x) + 128
    return kernels.epilogue_rows(acc, channel, s, q.bias, residual, norm.weight if norm is not None else None,
                                 norm.bias if norm is not None else None, norm.eps if norm is not None else 0.0,
                                 gelu, not gelu, byte_form)


def _linear(x: torch.Tensor, q: _Int8Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(M, N) outputs in ``dtype`` of the quantized layer ``q`` for the (M, K) rows ``x``: through the fused
    passes (`bertforge.fast.kernels`) where they are built, else as PyTorch ops."""
    ops = cpu_kernels() if x.dtype in _FUSED_DTYPES and dtype in _FUSED_DTYPES else None
    if ops is None:
        return _linear_ops(x, q).to(dtype)
    xq, s = ops.quantize_rows(x.contiguous(), q.kernel != "int_mm")  # onednn: q(x) + 128, unsigned
    return ops.dequantize_rows(*_products(q, xq), s, q.bias, dtype == torch.bfloat16)


def _products(q: _Int8Weight, xq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(the int8 rows ``xq`` times ``q``'s weights, the channel scales still to apply): int32 and ``q.scale``
    from ``int_mm``, float32 already scaled (None) from ``onednn``."""
    if q.kernel == "int_mm":
        return torch._int_mm(xq, q.packed), q.scale
    return _product(q.kernel, q.packed, xq, q.scale), None


_FUSED_DTYPES = (torch.float32, torch.bfloat16)
_AMAX_FLOOR = 2.0 ** -100
"""A row's largest magnitude is at least this, so that 127 / it stays finite (an all-zero row gives zeros)."""


def _linear_ops(x: torch.Tensor, q: _Int8Weight) -> torch.Tensor:
    """`_linear` as PyTorch ops: (M, N) float32."""
    x = x.float()
    amax = x.abs().amax(1, keepdim=True).clamp_min_(_AMAX_FLOOR)  # (M, 1)
    xq = torch.round(x * (127.0 / amax))  # |x * 127 / amax| <= 127 by construction
    xq = xq.to(torch.int8) if q.kernel == "int_mm" else xq.add_(128.0).to(torch.uint8)  # onednn's q(x) + 128
    y = _product(q.kernel, q.packed, xq, q.scale).mul_(amax.div_(127.0))  # (M, N)
    return y.add_(q.bias) if q.bias is not None else y
