"""CPU inference against the runtimes CPU users pick: sentences/s and agreement with fp32.

What is timed, for every run: one forward of the bare encoder (embeddings, 6 layers, pooler) of the
real all-MiniLM-L6-v2 (`bertforge.resources.minilm_folder`) on a batch of 32 sentences, on the CPU,
from token ids already in the runtime's input form (torch tensors or numpy arrays) to its outputs
(last hidden state and pooled output). The runs:

* ``bertforge-fp32``, ``bertforge-bf16``, ``bertforge-int8``: `bertforge.model.bert.BertModel`
  prepared as `Predictor` and ``bertforge features`` prepare it
  (``bertforge.fast.speed_up(model.eval(), freeze=True, int8=...)``), run under
  ``bertforge.train.precision.autocast(precision, "cpu")``: ``--precision fp32 | bf16 | int8``. int8
  is the encoder's dense layers as int8 products (`bertforge.fast.int8`: weights per output channel,
  activations per token), the rest in the float precision "auto" picks on this CPU (reported).
* ``transformers-fp32``, ``transformers-bf16``: ``transformers.BertModel`` (its default attention,
  sdpa), float32 and under ``torch.autocast("cpu", torch.bfloat16)``.
  ``transformers-int8``: the same model through PyTorch's dynamic quantization
  (``torch.ao.quantization.quantize_dynamic`` of every ``nn.Linear`` to qint8).
* ``onnxruntime-fp32``, ``onnxruntime-int8``: the path optimum takes: transformers' `BertModel`
  exported with the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``, dynamic batch
  and sequence axes, eager attention, whose pattern the fusions recognise: with sdpa's none of the
  six attention blocks fuses), then ``onnxruntime.transformers.optimizer.optimize_model(...,
  model_type="bert")`` (fused embedding LayerNorm, attention, bias-GELU, skip-LayerNorm; the script
  reports what fused), then for int8 onnxruntime's pre-processing (``quant_pre_process``: shape
  inference, which its quantizer needs for the fused ops) and ``quantize_dynamic`` with its defaults
  (int8 weights per tensor, uint8 activations quantized at run time, every op type it supports).
* ``openvino-fp32``, ``openvino-bf16``, ``openvino-int8``: ``openvino.convert_model`` of
  transformers' `BertModel`, compiled for the CPU with ``INFERENCE_PRECISION_HINT`` f32 and bf16
  (OpenVINO's own default is bf16 where the CPU has it, so "fp32" is asked for explicitly); int8 is
  NNCF's post-training quantization (``nncf.quantize``, ``ModelType.TRANSFORMER``) calibrated on
  ``--calibration`` (10) batches of the sentences that follow the timed ones, compiled with OpenVINO's
  default precision for what stays in floating point (reported).

bf16 runs are skipped where the CPU has no native bf16 (`bertforge.train.precision.native_bf16`):
emulated, bf16 is tens of times slower than fp32. A run whose package is not installed is skipped
with a one-line reason (``pip install -e '.[runtimes]'`` brings onnxruntime, OpenVINO and NNCF);
transformers, the reference, is needed.

Data: the sentences of the Wikipedia leads (`inference.leads_sentences`), in corpus order, batches of
32, each padded to its longest sentence, cut at 128 tokens (about 46 % of the slots are real
tokens), encoded with the model's vocab: the batches of ``inference.py``.

Outputs are checked before anything is timed: every run's last hidden state on every timed batch,
mean-pooled over the real tokens (the sentence vector all-MiniLM-L6-v2 is used for), against
transformers fp32's: the cosine, min and mean over all timed sentences, reported beside the speed.
bertforge fp32 must also match transformers fp32 at every real position within ``--atol``.

Fairness: the same weights, batches and thread count for all (``--threads``, default 1:
``torch.set_num_threads``, onnxruntime's ``intra_op_num_threads``, OpenVINO's
``INFERENCE_NUM_THREADS`` with one stream), one process. Timing as in ``inference.py``: every batch
runs ``--repeats`` times per run (default 3), one forward at a time, all runs interleaved with the
order rotating from forward to forward, so load from other jobs hits all alike; a run's time on a
batch is the fastest of its repeats (contention only adds time). Before timing, each run has seen
every timed batch's shape once (the output check) and ``--warmup`` batches more. Reported:
sentences/s (all timed batches / the sum of their best times), each run against bertforge fp32,
bertforge int8 against each run, and the cosines. ``--clock cpu`` ranks by the CPU time of the whole
process (every runtime's threads) instead of the wall clock: on a core shared with other jobs it
counts the work itself, where the wall clock counts the time slices the others took too (with more
than one thread, threads that spin while waiting count as well). The table gives the other clock's
sentences/s in its last column; the JSON both, and every forward's time.

Run (from the repository root), on one idle core::

    taskset -c 0 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cpu_runtimes.py --json /tmp/cpu_runtimes.json
    .venv/bin/python benchmarks/cpu_runtimes.py --runs bertforge-int8,onnxruntime-int8,openvino-int8 --batches 4
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as _dt
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from inference import MAX_LENGTH, leads_sentences, make_batches  # noqa: E402

from step_time import _loadavg  # noqa: E402

LABELS = {
    "bertforge-fp32": "bertforge fp32",
    "bertforge-bf16": "bertforge bf16 (autocast)",
    "bertforge-int8": "bertforge int8 (--precision int8)",
    "transformers-fp32": "transformers fp32",
    "transformers-bf16": "transformers bf16 (autocast)",
    "transformers-int8": "transformers + torch dynamic int8 (quantize_dynamic)",
    "onnxruntime-fp32": "onnxruntime, optimum path (TorchScript export + BERT fusions), fp32",
    "onnxruntime-int8": "onnxruntime, optimum path (TorchScript export + BERT fusions), int8 dynamic",
    "openvino-fp32": "OpenVINO fp32",
    "openvino-bf16": "OpenVINO bf16",
    "openvino-int8": "OpenVINO int8 (NNCF post-training, {calibration} calibration batches)",
}
RUNS = tuple(LABELS)
REFERENCE = "transformers-fp32"
BASELINE = "bertforge-fp32"
OURS_INT8 = "bertforge-int8"
TARGETS = {  # bertforge int8's targets by the int8 product the CPU has: over the fastest other runtime, over its fp32
    "vnni": {"over_best_other": 2.0},  # an int8 product that does not saturate (AVX-512 VNNI, AMX): `int_mm`
    "avx2": {"over_best_other": 1.0, "over_own_fp32": 1.5},  # AVX2's saturating one (or the kernels so limited)
}
NEEDS = {  # importable modules each kind of run needs beyond the test dependencies
    "onnxruntime": ("onnx", "onnxruntime"),
    "openvino": ("openvino",),
    "openvino-int8": ("openvino", "nncf"),
}
CPU_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "avx512_bf16", "amx_bf16")
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
Batch = dict[str, torch.Tensor]


# ---------------------------------------------------------------------------- the machine
def cpu_flags() -> dict[str, bool]:
    from bertforge.train import precision

    flags = precision.cpu_flags()
    return {f: f in flags for f in CPU_FLAGS}


def version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    from bertforge.fast.int8 import int8_choice
    from bertforge.train.precision import cpu_name, native_bf16

    choice = int8_choice()
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu": cpu_name(), "flags": cpu_flags(),
        "int8": {"kernel": choice.kernel, "w_max": choice.w_max, "probe_ms": choice.times, "source": choice.source},
        "native_bf16": native_bf16(torch.device("cpu")), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "nproc": os.cpu_count(), "affinity": affinity, "python": platform.python_version(),
        "versions": {p: version(p) for p in ("bertforge", "torch", "transformers", "numpy", "onnx", "onnxruntime",
                                             "openvino", "nncf")},
    }


# ---------------------------------------------------------------------------- the runs
@dataclass
class Runner:
    """A built run: ``feed`` turns a batch into the runtime's inputs (not timed), ``forward`` runs them
    and returns the last hidden state (timed; anything array-like)."""

    feed: Callable[[Batch], Any]
    forward: Callable[[Any], Any]
    details: dict[str, Any] = field(default_factory=dict)


class Context:
    """What the runs share: the checkpoint, the reference model and artefacts made once (the ONNX
    export, OpenVINO's converted model), the batches for calibration, a work folder."""

    def __init__(self, folder: Path, batches: list[Batch], calibration: list[Batch], threads: int, work: Path):
        self.folder, self.batches, self.calibration, self.threads, self.work = folder, batches, calibration, threads, work
        self._made: dict[str, Any] = {}

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def transformers_model(self, attention: str = "sdpa"):
        import transformers

        def make():
            with _quiet():
                return transformers.BertModel.from_pretrained(self.folder, attn_implementation=attention).eval()
        return self.once(f"transformers-{attention}", make)


@contextlib.contextmanager
def _quiet():
    """The libraries' warnings and progress bars while a run is built."""
    import logging

    levels = {n: logging.getLogger(n).level for n in ("transformers", "nncf", "onnxruntime")}
    for n in levels:
        logging.getLogger(n).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            for n, level in levels.items():
                logging.getLogger(n).setLevel(level)


def _torch_runner(model, precision_context: Callable[[], contextlib.AbstractContextManager], details=None) -> Runner:
    def forward(batch: Batch):
        with torch.no_grad(), precision_context():
            return model(**batch).last_hidden_state
    return Runner(feed=lambda b: b, forward=forward, details=details or {})


def build_bertforge(ctx: Context, precision: str) -> Runner:
    from bertforge.fast import speed_up
    from bertforge.fast import int8 as int8_module
    from bertforge.model.bert import BertModel
    from bertforge.train.precision import autocast, dtype_of

    model = speed_up(BertModel.from_pretrained(ctx.folder).eval(), freeze=True, int8=precision == "int8")
    details = {"prepare": f"freeze=True, int8={precision == 'int8'}", "autocast": precision}
    if precision == "int8":
        dtype = dtype_of("int8")
        kernel, w_max = int8_module._kernel()
        details.update(kernel=kernel, weights=f"+-{w_max}",
                       float_layers=str(dtype).replace("torch.", "") if dtype else "float32")
    return _torch_runner(model, lambda: autocast(precision, "cpu"), details)


def build_transformers(ctx: Context, precision: str) -> Runner:
    model = ctx.transformers_model()
    details = {"attention": getattr(model.config, "_attn_implementation", None)}
    if precision == "int8":
        from torch.ao.quantization import quantize_dynamic

        with _quiet():
            model = quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
        details["quantized_engine"] = torch.backends.quantized.engine
    if precision == "bf16":
        return _torch_runner(model, lambda: torch.autocast("cpu", dtype=torch.bfloat16), details)
    return _torch_runner(model, contextlib.nullcontext, details)


class _Outputs(torch.nn.Module):
    """transformers' `BertModel` with positional inputs and a tuple out, for the TorchScript exporter."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return out.last_hidden_state, out.pooler_output


def _onnx_fused(ctx: Context) -> tuple[Path, dict]:
    """The optimum path's fp32 model: TorchScript export, then onnxruntime's BERT fusions."""
    from onnxruntime.transformers.optimizer import optimize_model

    model = ctx.transformers_model("eager")
    exported, fused = ctx.work / "model.onnx", ctx.work / "model-fused.onnx"
    example = tuple(ctx.batches[0][k] for k in INPUTS)
    axes = {k: {0: "batch", 1: "sequence"} for k in (*INPUTS, "last_hidden_state")} | {"pooler_output": {0: "batch"}}
    with _quiet():
        torch.onnx.export(_Outputs(model), example, str(exported), dynamo=False, input_names=list(INPUTS),
                          output_names=["last_hidden_state", "pooler_output"], dynamic_axes=axes, opset_version=17,
                          do_constant_folding=True)
        optimized = optimize_model(str(exported), model_type="bert", num_heads=model.config.num_attention_heads,
                                   hidden_size=model.config.hidden_size)
        stats = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
        optimized.save_model_to_file(str(fused))
    return fused, {"export": "torch.onnx.export(dynamo=False), opset 17, eager attention", "fused": stats}


def build_onnxruntime(ctx: Context, precision: str) -> Runner:
    import onnxruntime as ort

    path, details = ctx.once("onnx-fused", lambda: _onnx_fused(ctx))
    details = dict(details)
    if precision == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic
        from onnxruntime.quantization.shape_inference import quant_pre_process

        typed, quantized = ctx.work / "model-fused-typed.onnx", ctx.work / "model-fused-int8.onnx"
        with _quiet():
            # the quantizer needs the types of the fused (com.microsoft) ops' outputs: shape inference first
            quant_pre_process(str(path), str(typed), skip_optimization=True)
            quantize_dynamic(str(typed), str(quantized), weight_type=QuantType.QInt8)
        path = quantized
        details["quantize_dynamic"] = ("after quant_pre_process (shape inference); weight_type QInt8, per_channel "
                                       "False, every op type it supports")
    options = ort.SessionOptions()
    options.intra_op_num_threads = ctx.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    details["providers"] = session.get_providers()
    return Runner(feed=lambda b: {k: b[k].numpy() for k in INPUTS},
                  forward=lambda feed: session.run(None, feed)[0], details=details)


def _openvino_model(ctx: Context):
    import openvino as ov

    with _quiet():
        return ov.convert_model(ctx.transformers_model(), example_input={k: ctx.batches[0][k] for k in INPUTS})


def build_openvino(ctx: Context, precision: str) -> Runner:
    import openvino as ov

    model = ctx.once("openvino", lambda: _openvino_model(ctx))
    config = {"INFERENCE_NUM_THREADS": ctx.threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    details: dict[str, Any] = {"convert": "openvino.convert_model(transformers BertModel)"}
    if precision == "int8":
        import nncf

        def transform(batch: Batch) -> dict:
            return {k: batch[k].numpy() for k in INPUTS}

        with _quiet():
            model = nncf.quantize(model, nncf.Dataset(ctx.calibration, transform), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(ctx.calibration))
        details["nncf"] = f"quantize(ModelType.TRANSFORMER), {len(ctx.calibration)} calibration batches"
    else:
        config["INFERENCE_PRECISION_HINT"] = {"fp32": "f32", "bf16": "bf16"}[precision]
    compiled = ov.Core().compile_model(model, "CPU", config)
    details["inference_precision"] = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    details["threads"] = int(compiled.get_property("INFERENCE_NUM_THREADS"))
    request = compiled.create_infer_request()
    output = compiled.outputs[0]
    return Runner(feed=lambda b: {k: b[k].numpy() for k in INPUTS},
                  forward=lambda feed: request.infer(feed)[output], details=details)


BUILDERS = {"bertforge": build_bertforge, "transformers": build_transformers, "onnxruntime": build_onnxruntime,
            "openvino": build_openvino}


def skip_reason(name: str) -> str | None:
    """Why ``name`` cannot run here, or None."""
    from bertforge.train.precision import native_bf16

    kind, precision = name.split("-")
    for module in NEEDS.get(name, NEEDS.get(kind, ())):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install -e '.[runtimes]')"
    if precision == "bf16" and not native_bf16(torch.device("cpu")):
        return "no native bf16 on this CPU (AVX-512 BF16 or AMX): emulated bf16 is tens of times slower than fp32"
    return None


# ---------------------------------------------------------------------------- checks
def mean_pooled(hidden: Any, mask: torch.Tensor) -> np.ndarray:
    h = torch.as_tensor(np.asarray(hidden.float() if isinstance(hidden, torch.Tensor) else hidden), dtype=torch.float64)
    m = mask.to(torch.float64)[..., None]
    return ((h * m).sum(1) / m.sum(1)).numpy()


def cosines(vectors: np.ndarray, reference: np.ndarray) -> np.ndarray:
    return (vectors * reference).sum(1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1))


def max_real_diff(hidden: Any, reference: Any, mask: torch.Tensor) -> float:
    real = mask.bool()
    a = torch.as_tensor(np.asarray(hidden.float() if isinstance(hidden, torch.Tensor) else hidden))
    b = torch.as_tensor(np.asarray(reference.float() if isinstance(reference, torch.Tensor) else reference))
    return float((a[real] - b[real]).abs().max())


# ---------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Sentences/s of bertforge's CPU inference (fp32, bf16, int8) against "
                                            "transformers, onnxruntime and OpenVINO on all-MiniLM-L6-v2 and the "
                                            "Wikipedia-leads sentences. See the module docstring.")
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated subset of: " + ", ".join(RUNS))
    p.add_argument("--threads", type=int, default=1, help="threads of every runtime; default %(default)s")
    p.add_argument("--batches", type=int, default=12, help="timed batches; default %(default)s")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches per run first; default %(default)s")
    p.add_argument("--repeats", type=int, default=3, help="forwards per batch and run (the fastest counts); "
                                                          "default %(default)s")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch; default %(default)s")
    p.add_argument("--calibration", type=int, default=10, help="batches NNCF calibrates OpenVINO int8 on (the "
                                                               "sentences after the timed ones); default %(default)s")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="what the table ranks by: wall time, or the CPU time of the whole process; default %(default)s")
    p.add_argument("--atol", type=float, default=1e-4, help="bertforge fp32 against transformers fp32; "
                                                            "default %(default)s")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="print every batch")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    args = p.parse_args(argv)
    args.runs = [s.strip() for s in args.runs.split(",") if s.strip()]
    for name in args.runs:
        if name not in RUNS:
            p.error(f"unknown run {name!r}; choose from {', '.join(RUNS)}")
    if min(args.threads, args.batches, args.repeats, args.batch_size, args.calibration) < 1 or args.warmup < 0:
        p.error("--threads, --batches, --repeats, --batch-size and --calibration must be positive")
    return args


def label(name: str, args) -> str:
    return LABELS[name].format(calibration=args.calibration)


def main(argv=None) -> int:
    from bertforge.resources import minilm_folder

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    info = machine()
    meta = {"date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "loadavg_before": _loadavg()}
    flags = ", ".join(f for f, on in info["flags"].items() if on) or "none of " + ", ".join(CPU_FLAGS)
    int8 = info["int8"]
    print(f"# {info['cpu']}; int8/bf16 flags: {flags}; int8 kernel {int8['kernel']} (probe, ms: {int8['probe_ms']}; "
          f"weights {int8['w_max']}); native bf16: {info['native_bf16']}", flush=True)
    print("# " + ", ".join(f"{p} {v}" for p, v in info["versions"].items() if v) + f"; {args.threads} thread(s); "
          f"affinity {info['affinity']}; load average {meta['loadavg_before']}", flush=True)

    folder = minilm_folder()
    sentences = leads_sentences()
    all_batches = make_batches(sentences, args.batch_size, args.warmup + args.batches + args.calibration)
    warmup = all_batches[:args.warmup]
    timed = all_batches[args.warmup:args.warmup + args.batches]
    calibration = all_batches[args.warmup + args.batches:]
    n_sent = sum(int(b["input_ids"].shape[0]) for b in timed)
    n_tok = sum(int(b["attention_mask"].sum()) for b in timed)
    slots = sum(b["attention_mask"].numel() for b in timed)

    skipped = {n: r for n in args.runs if (r := skip_reason(n))}
    for name, reason in skipped.items():
        print(f"# skipped {name}: {reason}", flush=True)
    wanted = [n for n in args.runs if n not in skipped]

    runners: dict[str, Runner] = {}
    build_s: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bertforge-runtimes-") as work:
        ctx = Context(folder, timed, calibration, args.threads, Path(work))
        for name in dict.fromkeys([REFERENCE, *wanted]):  # the reference first: every check needs it
            kind, precision = name.split("-")
            t0 = time.perf_counter()
            try:
                runners[name] = BUILDERS[kind](ctx, precision)
            except Exception as e:  # a runtime's version that cannot do this: say so, time the others
                if name == REFERENCE:
                    raise
                skipped[name] = f"could not be built: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
                print(f"# skipped {name}: {skipped[name]}", flush=True)
                continue
            build_s[name] = round(time.perf_counter() - t0, 1)
            print(f"#   built {name} in {build_s[name]:.1f} s {runners[name].details}", flush=True)
        gc.collect()

        # outputs first: every run on every timed batch against transformers fp32 (also each shape's first call)
        fed = {n: [r.feed(b) for b in timed] for n, r in runners.items()}
        reference_hidden = [runners[REFERENCE].forward(f) for f in fed[REFERENCE]]
        reference = np.concatenate([mean_pooled(h, b["attention_mask"]) for h, b in zip(reference_hidden, timed)])
        agreement: dict[str, dict[str, float]] = {}
        runs = [n for n in wanted if n in runners]
        for name in runs:
            hidden = [runners[name].forward(f) for f in fed[name]]
            cos = cosines(np.concatenate([mean_pooled(h, b["attention_mask"]) for h, b in zip(hidden, timed)]), reference)
            agreement[name] = {"cos_min": round(float(cos.min()), 5), "cos_mean": round(float(cos.mean()), 5)}
            if name == BASELINE:
                diff = max(max_real_diff(h, r, b["attention_mask"]) for h, r, b in zip(hidden, reference_hidden, timed))
                agreement[name]["max_abs_diff"] = diff
                if not diff <= args.atol:
                    raise SystemExit(f"bertforge fp32 differs from transformers fp32: max |diff| {diff:.2e} > {args.atol}")
            print(f"#   {name}: cosine of mean-pooled vectors with transformers fp32 min {cos.min():.4f}, "
                  f"mean {cos.mean():.4f}", flush=True)
        del reference_hidden
        if REFERENCE not in runs:
            del runners[REFERENCE], fed[REFERENCE]

        for batch in warmup:
            for name in runs:
                runners[name].forward(runners[name].feed(batch))

        wall: dict[str, list[list[float]]] = {n: [[] for _ in timed] for n in runs}
        cpu: dict[str, list[list[float]]] = {n: [[] for _ in timed] for n in runs}
        turn = 0
        for r in range(args.repeats):
            for i in range(len(timed)):
                order = runs[turn % len(runs):] + runs[:turn % len(runs)]
                turn += 1
                for name in order:
                    runner, inputs = runners[name], fed[name][i]
                    c0, t0 = time.process_time(), time.perf_counter()
                    runner.forward(inputs)
                    t1, c1 = time.perf_counter(), time.process_time()
                    wall[name][i].append(t1 - t0)
                    cpu[name][i].append(c1 - c0)
                if args.progress:
                    print(f"#   repeat {r + 1}/{args.repeats} batch {i + 1}/{len(timed)}: "
                          + ", ".join(f"{n} {wall[n][i][-1] * 1e3:.0f} ms" for n in runs), flush=True)

    def rate(times: dict[str, list[list[float]]]) -> dict[str, float]:
        return {n: n_sent / sum(min(t) for t in ts) for n, ts in times.items()}

    sps_wall, sps_cpu = rate(wall), rate(cpu)
    sps = sps_wall if args.clock == "wall" else sps_cpu
    results = {}
    for name in sorted(runs, key=lambda n: -sps[n]):
        results[name] = {
            "label": label(name, args),
            "sentences_per_s": round(sps[name], 2),
            "sentences_per_s_wall": round(sps_wall[name], 2),
            "sentences_per_s_cpu": round(sps_cpu[name], 2),
            "tokens_per_s": round(sps[name] * n_tok / n_sent, 1),
            "vs_bertforge_fp32": round(sps[name] / sps[BASELINE], 3) if BASELINE in sps else None,
            "bertforge_int8_over": round(sps[OURS_INT8] / sps[name], 3) if OURS_INT8 in sps else None,
            "paired_bertforge_int8_over": (round(statistics.median(
                min(a) / min(b) for a, b in zip((wall if args.clock == "wall" else cpu)[name],
                                               (wall if args.clock == "wall" else cpu)[OURS_INT8])), 3)
                if OURS_INT8 in sps else None),
            **agreement[name],
            "build_s": build_s[name],
            "details": runners[name].details,
            "batch_ms_wall": [[round(x * 1e3, 2) for x in t] for t in wall[name]],
            "batch_ms_cpu": [[round(x * 1e3, 2) for x in t] for t in cpu[name]],
        }
    others = [n for n in results if not n.startswith("bertforge")]
    best_other = max(others, key=lambda n: sps[n]) if others else None
    summary = None
    if OURS_INT8 in sps and best_other:
        from bertforge.fast.int8 import kernel_candidates

        cpu_class = "vnni" if "int_mm" in kernel_candidates() else "avx2"
        ratios = {"over_best_other": sps[OURS_INT8] / sps[best_other]}
        if BASELINE in sps:
            ratios["over_own_fp32"] = sps[OURS_INT8] / sps[BASELINE]
        target = TARGETS[cpu_class]
        summary = {"best_other": best_other, "bertforge_int8_over_best_other": round(ratios["over_best_other"], 3),
                   "cpu_class": cpu_class, "targets": target,
                   "met": all(k in ratios and ratios[k] >= t for k, t in target.items())}
        if "over_own_fp32" in ratios:
            summary["bertforge_int8_over_bertforge_fp32"] = round(ratios["over_own_fp32"], 3)

    print()
    other_clock = "cpu" if args.clock == "wall" else "wall"
    print(f"| runtime | sentences/s | x vs bertforge fp32 | bertforge int8 / it | min cos | mean cos | "
          f"sentences/s, {other_clock} clock |")
    print("|---|---|---|---|---|---|---|")
    for name, row in results.items():
        vs = f"{row['vs_bertforge_fp32']:.2f}x" if row["vs_bertforge_fp32"] is not None else "-"
        over = f"{row['bertforge_int8_over']:.2f}x" if row["bertforge_int8_over"] is not None else "-"
        print(f"| {row['label']} | {row['sentences_per_s']:.1f} | {vs} | {over} | {row['cos_min']:.4f} | "
              f"{row['cos_mean']:.4f} | {row['sentences_per_s_' + other_clock]:.1f} |")
    for name, reason in skipped.items():
        print(f"| {label(name, args)} | skipped: {reason} | | | | | |")
    meta.update(wall_s=round(time.perf_counter() - started, 1), loadavg_after=_loadavg())
    print()
    print(f"{len(timed)} batches of {args.batch_size} Wikipedia-lead sentences in corpus order ({n_sent} sentences, "
          f"{100 * n_tok / slots:.0f} % real tokens, at most {MAX_LENGTH}), all-MiniLM-L6-v2; sentences/s = all timed "
          f"batches / the sum of each batch's fastest of {args.repeats} repeats ({args.clock} clock), runs interleaved; "
          f"cosines of mean-pooled last-layer vectors with transformers fp32 over the {n_sent} sentences; "
          f"{args.threads} thread(s); {info['cpu']}; load average before {meta['loadavg_before']}, after "
          f"{meta['loadavg_after']}; wall {meta['wall_s']:.0f} s")
    if summary:
        wanted = ", ".join(f"{'the fastest other' if k == 'over_best_other' else 'bertforge fp32'} >= {t:g}x"
                           for k, t in summary["targets"].items())
        fp32 = summary.get("bertforge_int8_over_bertforge_fp32")
        print(f"bertforge int8 / the fastest other runtime ({best_other}): {summary['bertforge_int8_over_best_other']:.2f}x"
              + (f", / bertforge fp32: {fp32:.2f}x" if fp32 is not None else "")
              + f" (targets for a CPU of the {summary['cpu_class']} class: {wanted}: "
              f"{'met' if summary['met'] else 'not met'})")
    if args.json:
        settings = {"runs": args.runs, "threads": args.threads, "batches": len(timed), "warmup": args.warmup,
                    "repeats": args.repeats, "batch_size": args.batch_size, "max_length": MAX_LENGTH,
                    "calibration_batches": len(calibration), "clock": args.clock, "model": "all-MiniLM-L6-v2",
                    "sentences": n_sent, "real_tokens": n_tok, "real_fraction": round(n_tok / slots, 4)}
        out = {"meta": meta, "machine": info, "settings": settings, "runs": results, "skipped": skipped,
               "summary": summary}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
