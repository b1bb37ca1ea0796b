"""Pre-training throughput: training tokens/s of full optimizer steps, bertforge vs transformers.

What one "step" is, for both stacks: ``zero_grad``, forward with MLM + NSP labels, ``backward``,
gradient clipping to norm 1.0, an AdamW step and a learning-rate schedule step. Training mode,
dropout 0.1, CPU. tokens/s counts real (non-padding) tokens: the sum of ``attention_mask`` over
the timed steps divided by their summed time.

How each stack is driven:

* bertforge: `bertforge.train.loop.Trainer.train_step` with `bertforge.train.pretrain.PretrainingObjective`,
  i.e. exactly what ``bertforge pretrain`` runs per step (loss normalised over the step's masked
  tokens, MLM logits only at the masked positions, the model prepared by `bertforge.fast.speed_up`
  as the loop prepares it (unpadded dense layers, CPU dropout masks, ...), bertforge's AdamW
  (``torch.optim.AdamW(fused=True)``) with the paper's weight-decay groups, ``clip_grad_norm_``).
  Precision ``fp32`` and ``bf16`` (``TrainConfig.precision``: autocast).
* transformers: a plain loop on ``transformers.BertForPreTraining`` (its default attention, sdpa):
  ``torch.optim.AdamW(foreach=True)`` (on CPU torch's default is the single-tensor loop; foreach
  is the default only on CUDA; the two run alike on CPU), labels (B, T) that are -100
  except at the masked positions (so it builds the full (B, T, V) logits), ``next_sentence_label``,
  ``loss.backward()``, ``clip_grad_norm_(1.0)``, ``optimizer.step()``, a linear warmup/decay
  schedule. In fp32 and under ``torch.autocast("cpu", torch.bfloat16)``.

Fairness: same config (a bertforge preset with the uncased vocab, 30522), same initial weights
(bertforge's state dict copied into transformers' model, `step_time.build_models`), same batches,
one process, ``torch.set_num_threads`` as torch's default. Before timing, both models in eval mode
must give the same loss (``--loss-atol``) and logits (``--logits-atol``) on the first batch
(`step_time.check_same_loss`); the script stops otherwise. Timed steps interleave the four runs
(ours fp32, ours bf16, HF fp32, HF bf16), rotating which goes first, so load from other jobs on a
shared machine hits all of them alike. The fp32 and bf16 runs of a stack share one model (each
with its own optimizer); speed does not depend on the weights' values.

On a CPU without native bf16 (`step_time.skipped_precisions`: AVX2 only) the bf16 runs and the bf16
matmul peak are skipped, and the output and the JSON (``"skipped"``) say why: emulated bf16 is tens
of times slower than fp32 and not what bertforge runs there.

Batches are real: the Wikipedia leads of `bertforge.resources` are prepared with
`bertforge.data.prepare.prepare` (Google's algorithm, the all-MiniLM-L6-v2 uncased vocab,
``dupe_factor`` 1, ``max_seq_length`` 128, shards of 500,000 characters; cached under
``$TMPDIR/bertforge-bench``), and the batches come from `bertforge.data.loader.PretrainingLoader`
(padded to the longest instance, rounded up to a multiple of 8). The leads are short documents, so
only about a quarter of the instances are full length and 68-72 % of a batch's slots are real
tokens: the padding a real corpus of short documents gives.

Model FLOP/s, as each stack actually computes it (fwd + bwd = 3 x the forward's 2 FLOPs per
multiply-add; ``Ht`` = tokens the dense layers run on: the N real tokens for bertforge, all B*T
slots for transformers; ``R`` = rows of the vocabulary projection: B*P for bertforge (P = 20
prediction slots, used or not), B*T for transformers)::

    6 * W_enc * Ht                     encoder weight matrices, W_enc = L (4 H^2 + 2 H I)
  + 12 * L * B * T^2 * H               attention scores and weighted sum, on the padded (B, T)
                                       layout for both stacks (SDPA with a key mask)
  + 6 * R * (H^2 + H V)                MLM head: transform dense + tied decoder
  + 6 * B * (H^2 + 2 H)                pooler + NSP

"useful" FLOP/s is the same formula with N real tokens, sum of squared real lengths for attention
and the real masked positions for the MLM head -- identical work for both stacks, so its ratio is
the tokens/s ratio. Both are shown as a fraction of the machine's bf16 matmul peak, measured in
the same run (best of a few 2048 x 2048 ``torch.matmul`` on all threads, at the start and the end);
the fp32 peak is printed too, and is the reference where bf16 is skipped.

Run (from the repository root)::

    .venv/bin/python benchmarks/pretrain_throughput.py                       # tiny, mini, base
    .venv/bin/python benchmarks/pretrain_throughput.py --presets mini --steps 20 --profile --json /tmp/pt.json

Defaults: batch 32 (tiny, mini) / 8 (base); 10 timed + 2 warm-up steps (base: 6 + 1) per run.
``--profile`` adds a torch.profiler breakdown of one step of each stack's faster precision.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_time import (Batch, _loadavg, build_models, check_same_loss, cpu_model, interleaved, skipped_precisions,  # noqa: E402
                       write_report)

import bertforge  # noqa: E402  (step_time puts src/ on the path when bertforge is not installed)
import transformers  # noqa: E402
from bertforge.data.loader import PretrainingDataset, PretrainingLoader  # noqa: E402
from bertforge.train.config import TrainConfig  # noqa: E402
from bertforge.train.loop import Trainer  # noqa: E402
from bertforge.train.run import build_trainer  # noqa: E402
from bertforge.train.pretrain import PretrainingObjective  # noqa: E402

PRECISIONS = ("fp32", "bf16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Per-preset defaults: (batch size, timed steps, warm-up steps). The three presets with targets share
# batch 32 (base: fewer steps, about 4.5 minutes for its four runs on 2 cores).
DEFAULTS = {"tiny": (32, 10, 2), "mini": (32, 10, 2), "small": (16, 8, 2), "medium": (16, 6, 1),
            "base": (32, 6, 1), "large": (4, 4, 1)}
TARGETS = {"tiny": 4.0, "mini": 3.0, "base": 2.0}
LR, WARMUP, SCHEDULE_STEPS, WEIGHT_DECAY = 1e-4, 100, 10_000, 0.01


# ---------------------------------------------------------------------------- real data
def bench_cache() -> Path:
    return Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / "bertforge-bench"


def prepared_leads(folder: str | Path | None = None, *, dupe_factor: int = 1, shard_chars: int = 500_000) -> Path:
    """The Wikipedia leads prepared for pre-training (MiniLM uncased vocab, length 128); built once."""
    from bertforge.data.prepare import PrepareConfig, load_manifest, prepare
    from bertforge.resources import minilm_folder, wikipedia_leads_file

    out = Path(folder) if folder else bench_cache() / f"leads-minilm-dupe{dupe_factor}-s{shard_chars}"
    try:
        if load_manifest(out).get("complete"):
            return out
    except Exception:  # noqa: BLE001 - absent or half-written: (re)build; prepare skips finished shards
        pass
    print(f"# preparing the Wikipedia leads into {out} ...", flush=True)
    cfg = PrepareConfig(dupe_factor=dupe_factor, format="wiki-json", shard_chars=shard_chars)
    prepare([wikipedia_leads_file()], out, minilm_folder(), cfg, workers=2, progress=False)
    return out


def hf_labels(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, T) labels for transformers: -100 except at the masked positions."""
    B, T = batch["input_ids"].shape
    full = torch.full((B, T), -100, dtype=torch.long)
    labels, positions = batch["labels"], batch["masked_positions"]
    valid = labels != -100
    rows = torch.arange(B).unsqueeze(1).expand_as(positions)
    full[rows[valid], positions[valid]] = labels[valid]
    return full


def as_step_batch(batch: dict[str, torch.Tensor]) -> Batch:
    """A loader batch in `step_time.Batch` form (for its eval-mode parity check)."""
    return Batch(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["masked_positions"],
                 batch["labels"], hf_labels(batch), batch["next_sentence_label"])


def real_batches(data: Path, batch_size: int, count: int, seed: int, shards: list[int] | None = None) -> list[dict]:
    """The first ``count`` batches of the loader (seeded order), each with ``hf_labels`` added."""
    loader = PretrainingLoader(PretrainingDataset(data, shards=shards), batch_size, seed=seed)
    out = []
    while len(out) < count:
        for b in loader:
            b["hf_labels"] = hf_labels(b)
            out.append(b)
            if len(out) == count:
                break
    return out


# ---------------------------------------------------------------------------- the two stacks
def autocast(precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def ours_trainer(model, batch_size: int, precision: str, out_dir: str, *, lr: float = LR, max_steps: int = SCHEDULE_STEPS,
                 warmup_steps: int = WARMUP, objective=None) -> Trainer:
    """bertforge's training loop as ``bertforge pretrain`` builds it (one process, CPU; the model through the
    speed layer, as the recipe hands it to the trainer); ``objective``: MLM + NSP unless given."""
    cfg = TrainConfig(batch_size=batch_size, max_steps=max_steps, lr=lr, warmup_steps=warmup_steps,
                      weight_decay=WEIGHT_DECAY, max_grad_norm=1.0, precision=precision, device="cpu",
                      progress=False)
    return build_trainer(model, objective or PretrainingObjective(nsp=True), None, cfg, out_dir)


class HFLoop:
    """transformers' model with a plain PyTorch loop: AdamW (foreach), clip 1.0, linear schedule."""

    def __init__(self, model, precision: str, *, lr: float = LR, max_steps: int = SCHEDULE_STEPS,
                 warmup_steps: int = WARMUP, eps: float = 1e-6, betas: tuple[float, float] = (0.9, 0.999),
                 max_grad_norm: float = 1.0):
        self.model = model
        self.precision = precision
        no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
        decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                            {"params": no_decay, "weight_decay": 0.0}], lr=lr, eps=eps,
                                           betas=betas, foreach=True)
        self.max_grad_norm = max_grad_norm

        def factor(step: int) -> float:  # the paper's schedule, as bertforge's (warmup from 1/warmup)
            if step < warmup_steps:
                return (step + 1) / warmup_steps
            return max(0.0, (max_steps - step) / max(1, max_steps - warmup_steps))

        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)

    def forward(self, b: dict[str, torch.Tensor]):
        return self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                          token_type_ids=b["token_type_ids"], labels=b["hf_labels"],
                          next_sentence_label=b["next_sentence_label"])

    def train_step(self, b: dict[str, torch.Tensor]) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.precision):
            loss = self.forward(b).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        return float(loss.detach())


def ours_batch(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in b.items() if k != "hf_labels"}


# ---------------------------------------------------------------------------- FLOPs and peak
def step_flops(config, B: int, T: int, tokens: float, attn_len2: float, mlm_rows: float) -> float:
    """fwd+bwd FLOPs of one step (module docstring): dense layers on ``tokens`` rows, attention over
    ``attn_len2`` = sum over sequences of (length)^2, vocabulary projection on ``mlm_rows`` rows."""
    H, I, L, V = config.hidden_size, config.intermediate_size, config.num_hidden_layers, config.vocab_size
    w_enc = L * (4 * H * H + 2 * H * I)
    return 6 * w_enc * tokens + 12 * L * attn_len2 * H + 6 * mlm_rows * (H * H + H * V) + 6 * B * (H * H + 2 * H)


def flops_for(stack: str, config, b: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(FLOPs as ``stack`` computes them, useful FLOPs) for one batch."""
    B, T = b["input_ids"].shape
    lengths = b["attention_mask"].sum(1).double()
    N = float(lengths.sum())
    P = b["masked_positions"].shape[1]
    masked = float((b["labels"] != -100).sum())
    useful = step_flops(config, B, T, N, float((lengths ** 2).sum()), masked)
    if stack == "ours":
        return step_flops(config, B, T, N, B * T * T, B * P), useful
    return step_flops(config, B, T, B * T, B * T * T, B * T), useful


def matmul_peak(dtype: torch.dtype, n: int = 2048, reps: int = 8) -> float:
    """Best FLOP/s of an n x n x n matmul in ``dtype`` on all threads."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    for _ in range(2):
        torch.matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def format_peaks(peaks: dict[str, float]) -> str:
    """``{"fp32": FLOP/s, ...}`` as "fp32 0.200 TFLOP/s, bf16 0.850 TFLOP/s"."""
    return ", ".join(f"{p} {v / 1e12:.3f} TFLOP/s" for p, v in peaks.items())


# ---------------------------------------------------------------------------- profile
CATEGORIES = [  # (category, substrings of aten op names), first match wins
    ("grad clipping (norms)", ("_foreach_norm", "linalg_vector_norm", "aten::norm", "clamp")),
    ("optimizer (AdamW)", ("adam", "_foreach_", "lerp")),
    ("cross-entropy / log-softmax", ("log_softmax", "logsoftmax", "nll_loss", "cross_entropy")),
    ("argmax (accuracy stat)", ("argmax",)),
    ("layernorm", ("layer_norm",)),
    ("attention (SDPA)", ("scaled_dot_product", "flash_attention", "_efficient_attention", "softmax_backward",
                          "_softmax", "baddbmm", "bmm")),
    ("matmul (linear/addmm/mm)", ("addmm", "aten::mm", "linear", "matmul")),
    ("gelu / tanh", ("gelu", "tanh")),
    ("dropout / RNG", ("dropout", "bernoulli", "native_dropout", "rand")),
    ("embedding fwd/bwd", ("embedding",)),
    ("gather / index / (un)padding", ("index", "gather", "scatter", "nonzero", "masked", "where")),
    ("dtype casts / copies", ("to_copy", "copy_", "_to_copy", "clone", "contiguous", "cat")),
    ("zero / fill / alloc", ("zero", "fill", "empty", "full")),
]


def categorize(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other (elementwise, views, autograd)"


def profile_step(fn, label: str, top: int) -> dict:
    """torch.profiler of one call of ``fn``: per-op self CPU time, and per category."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    ops = [(e.key, e.self_cpu_time_total / 1e3, e.count) for e in prof.key_averages()]
    ops = [o for o in ops if o[1] > 0]
    ops.sort(key=lambda o: -o[1])
    total = sum(o[1] for o in ops)
    cats: dict[str, float] = defaultdict(float)
    for name, ms, _ in ops:
        cats[categorize(name)] += ms
    print(f"\n### profile: {label} (one step, wall {wall * 1e3:.0f} ms under the profiler, "
          f"self CPU total {total:.0f} ms)")
    print("| category | self CPU ms | share |\n|---|---|---|")
    for cat, ms in sorted(cats.items(), key=lambda kv: -kv[1]):
        print(f"| {cat} | {ms:.1f} | {100 * ms / total:.1f}% |")
    print("\n| top op | self CPU ms | calls | share |\n|---|---|---|---|")
    for name, ms, count in ops[:top]:
        print(f"| `{name}` | {ms:.1f} | {count} | {100 * ms / total:.1f}% |")
    return {"label": label, "wall_ms": round(wall * 1e3, 1), "self_cpu_total_ms": round(total, 1),
            "categories": {k: round(v, 2) for k, v in cats.items()},
            "ops": [{"op": n, "self_cpu_ms": round(ms, 2), "calls": c} for n, ms, c in ops]}


# ---------------------------------------------------------------------------- timing
@dataclass
class Run:
    stack: str  # ours | hf
    precision: str
    step_ms: list[float] = field(default_factory=list)
    tokens: float = 0.0
    flops: float = 0.0
    useful_flops: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.stack}-{self.precision}"

    @property
    def seconds(self) -> float:
        return sum(self.step_ms) / 1e3

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


@dataclass
class Row:
    preset: str
    batch: int
    seq_len: int
    real_token_fraction: float
    steps: int
    warmup: int
    eval_loss_ours: float
    eval_loss_hf: float
    eval_logits_max_abs_diff: float
    tok_s: dict[str, float]
    median_ms: dict[str, float]
    min_ms: dict[str, float]
    tflops: dict[str, float]
    useful_tflops: dict[str, float]
    ours_best: str
    hf_best: str
    ratio: float  # ours best tok/s / HF best tok/s (over the precisions run)
    paired_ratio: float  # median over steps of HF-best time / ours-best time
    min_ratio: float
    target: float | None
    step_ms: dict[str, list[float]]
    profiles: list[dict] = field(default_factory=list)


def run_preset(preset: str, data: Path, args, precisions: tuple[str, ...] = PRECISIONS) -> Row:
    d_batch, d_steps, d_warmup = DEFAULTS[preset]
    B = args.batch_size or d_batch
    steps = args.steps if args.steps is not None else d_steps
    warmup = args.warmup if args.warmup is not None else d_warmup
    config, ours, theirs = build_models(preset, 128, args.seed)
    batches = real_batches(data, B, warmup + steps, seed=args.seed)
    T = batches[0]["input_ids"].shape[1]
    loss_a, loss_b, diff = check_same_loss(ours, theirs, as_step_batch(batches[0]), args.loss_atol, args.logits_atol)
    real = sum(float(b["attention_mask"].sum()) for b in batches[warmup:])
    slots = sum(b["attention_mask"].numel() for b in batches[warmup:])
    print(f"# {preset}: L={config.num_hidden_layers} H={config.hidden_size} batch {B}, T<={T}, "
          f"{100 * real / slots:.1f}% real tokens; eval loss {loss_a:.6f} (ours) vs {loss_b:.6f} (HF), "
          f"max |logit diff| {diff:.1e}; {warmup} warm-up + {steps} timed steps per run", flush=True)
    tmp = tempfile.mkdtemp(prefix="pt-bench-")
    ours.train()
    theirs.train()
    runs = [Run("ours", p) for p in precisions] + [Run("hf", p) for p in precisions]
    steppers = {}
    for r in runs:
        if r.stack == "ours":
            trainer = ours_trainer(ours, B, r.precision, tmp)
            steppers[r.name] = (lambda b, t=trainer: t.train_step([ours_batch(b)]))
        else:
            loop = HFLoop(theirs, r.precision)
            steppers[r.name] = loop.train_step
    by_name = {r.name: r for r in runs}
    for name, b, ms in interleaved(batches, steppers, warmup):
        r = by_name[name]
        r.step_ms.append(ms)
        r.tokens += float(b["attention_mask"].sum())
        f, u = flops_for(r.stack, config, b)
        r.flops += f
        r.useful_flops += u
    by = {r.name: r for r in runs}
    ours_best = max((by[f"ours-{p}"] for p in precisions), key=lambda r: r.tok_s)
    hf_best = max((by[f"hf-{p}"] for p in precisions), key=lambda r: r.tok_s)
    row = Row(
        preset=preset, batch=B, seq_len=128, real_token_fraction=real / slots, steps=steps, warmup=warmup,
        eval_loss_ours=loss_a, eval_loss_hf=loss_b, eval_logits_max_abs_diff=diff,
        tok_s={r.name: r.tok_s for r in runs},
        median_ms={r.name: statistics.median(r.step_ms) for r in runs},
        min_ms={r.name: min(r.step_ms) for r in runs},
        tflops={r.name: r.flops / r.seconds / 1e12 for r in runs},
        useful_tflops={r.name: r.useful_flops / r.seconds / 1e12 for r in runs},
        ours_best=ours_best.name, hf_best=hf_best.name, ratio=ours_best.tok_s / hf_best.tok_s,
        paired_ratio=statistics.median(h / o for o, h in zip(ours_best.step_ms, hf_best.step_ms)),
        min_ratio=min(hf_best.step_ms) / min(ours_best.step_ms),
        target=TARGETS.get(preset),
        step_ms={r.name: [round(t, 1) for t in r.step_ms] for r in runs},
    )
    print("#   tok/s: " + ", ".join(f"{k} {v:,.0f}" for k, v in row.tok_s.items())
          + f"; ours best ({row.ours_best}) / HF best ({row.hf_best}) = {row.ratio:.2f}x "
          f"(paired {row.paired_ratio:.2f}x, min/min {row.min_ratio:.2f}x)", flush=True)
    if args.profile:
        b = batches[-1]
        for r in (ours_best, hf_best):
            fn = steppers[r.name]
            row.profiles.append(profile_step(lambda: fn(b), f"{preset} {r.name}, batch {B}", args.top))
    del ours, theirs, steppers, runs
    gc.collect()
    return row


# ---------------------------------------------------------------------------- report
def format_tables(rows: list[Row], peak: float, peak_precision: str = "bf16") -> str:
    """The throughput table (a skipped run shows as "skipped") and the per-run table, whose FLOP/s are
    given as a share of the ``peak_precision`` matmul peak ``peak``."""
    head = ["preset", "batch", "real tok", "ours fp32 tok/s", "ours bf16 tok/s", "HF fp32 tok/s", "HF bf16 tok/s",
            "ours best / HF best", "paired", "min/min", "target", "met"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        met = "-" if r.target is None else ("yes" if r.ratio >= r.target else "no")
        lines.append("| " + " | ".join([
            r.preset, str(r.batch), f"{100 * r.real_token_fraction:.1f}%",
            *(f"{r.tok_s[k]:,.0f}" if k in r.tok_s else "skipped" for k in ("ours-fp32", "ours-bf16", "hf-fp32",
                                                                              "hf-bf16")),
            f"{r.ratio:.2f}x ({r.ours_best} / {r.hf_best})", f"{r.paired_ratio:.2f}x", f"{r.min_ratio:.2f}x",
            "-" if r.target is None else f">= {r.target:.0f}x", met]) + " |")
    lines += ["", f"| preset | run | median ms/step | min ms/step | computed TFLOP/s | of {peak_precision} peak | useful "
                  f"TFLOP/s | of {peak_precision} peak |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for k in r.tok_s:
            lines.append(f"| {r.preset} | {k} | {r.median_ms[k]:.0f} | {r.min_ms[k]:.0f} | {r.tflops[k]:.3f} | "
                         f"{100 * r.tflops[k] * 1e12 / peak:.1f}% | {r.useful_tflops[k]:.3f} | "
                         f"{100 * r.useful_tflops[k] * 1e12 / peak:.1f}% |")
    return "\n".join(lines)


def run_meta() -> dict:
    """Date, command, machine, versions and load average, for a run's JSON."""
    return {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "nproc": os.cpu_count(), "cpu": cpu_model(), "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "transformers": transformers.__version__, "bertforge": bertforge.__version__,
        "python": platform.python_version(), "threads": torch.get_num_threads(), "loadavg_before": _loadavg(),
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Training tokens/s of full optimizer steps: bertforge's Trainer vs a "
                                            "plain transformers loop, fp32 and bf16, on real batches. "
                                            "See the module docstring.")
    p.add_argument("--presets", default="tiny,mini,base", help="comma-separated presets; default %(default)s")
    p.add_argument("--steps", type=int, default=None, help="timed steps per run (default: 10; base 6)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up steps per run (default: 2; base 1)")
    p.add_argument("--batch-size", type=int, default=None, help="for every preset (default: 32 tiny/mini/base, 16 small/medium, 4 large)")
    p.add_argument("--data", default=None, help="a prepared folder (default: the leads, prepared and cached)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--seed", type=int, default=0, help="weights and data order; default %(default)s")
    p.add_argument("--loss-atol", type=float, default=1e-4, help="eval-mode loss check; default %(default)s")
    p.add_argument("--logits-atol", type=float, default=1e-5, help="eval-mode logits check; default %(default)s")
    p.add_argument("--profile", action="store_true", help="profile one step of each stack's faster precision")
    p.add_argument("--top", type=int, default=15, help="ops listed per profile; default %(default)s")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    args = p.parse_args(argv)
    args.presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    for name in args.presets:
        if name not in DEFAULTS:
            p.error(f"unknown preset {name!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads or torch.get_num_threads())
    started = time.perf_counter()
    meta = run_meta()
    skipped = skipped_precisions()
    precisions = tuple(p for p in PRECISIONS if p not in skipped)
    reference = "bf16" if "bf16" in precisions else "fp32"  # the peak that FLOP/s are a share of
    data = Path(args.data) if args.data else prepared_leads()
    peaks = {p: matmul_peak(DTYPES[p]) for p in precisions}
    print(f"# torch {meta['torch']} ({meta['cpu_capability']}), transformers {meta['transformers']}, bertforge "
          f"{meta['bertforge']}; {meta['threads']} threads; {meta['nproc']} CPUs: {meta['cpu']}; data {data}; "
          f"matmul 2048^3 peak: {format_peaks(peaks)}; load average {meta['loadavg_before']}", flush=True)
    for p, why in skipped.items():
        print(f"# {p} skipped (its runs and matmul peak): {why}", flush=True)
    rows = []
    for preset in args.presets:
        rows.append(run_preset(preset, data, args, precisions))
        print(f"#   load average {_loadavg()}", flush=True)
    end_peaks = {p: matmul_peak(DTYPES[p]) for p in precisions}
    peaks = {k: max(peaks[k], end_peaks[k]) for k in peaks}
    meta.update(wall_s=round(time.perf_counter() - started, 1), loadavg_after=_loadavg(),
                matmul_peak_tflops={k: round(v / 1e12, 4) for k, v in peaks.items()})
    print()
    print(format_tables(rows, peaks[reference], reference))
    print()
    print(f"tok/s = real (non-padding) tokens / summed step time of the timed steps; ours best / HF best = ratio "
          f"of each stack's faster precision; paired = median over steps of HF-best / ours-best step time; "
          f"min/min = fastest steps; matmul peak {format_peaks(peaks)} (best of start and end); "
          + "".join(f"{p} skipped: {why}; " for p, why in skipped.items())
          + f"load average before {meta['loadavg_before']}, after {meta['loadavg_after']}; wall {meta['wall_s']:.0f} s")
    if args.json:
        write_report(args.json, meta, skipped, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
