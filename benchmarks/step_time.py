"""Pre-training step time: bertforge `BertForPreTraining` vs transformers `BertForPreTraining`.

What one "step" is, for both models: ``zero_grad(set_to_none=True)``, forward with MLM + NSP
labels, ``loss.backward()``. No optimizer step. Both models are in training mode with the
configured dropout (0.1 by default), in float32 on the CPU.

How each library is driven -- the way each one is meant to be used for pre-training:

* bertforge gets ``masked_positions`` (B, P) and ``labels`` (B, P), P = 20 = Google's
  ``max_predictions_per_seq`` at sequence length 128, so only the masked positions go through
  the (H -> V) vocabulary projection; with padding in the batch its dense layers run on the
  real tokens only ("unpadding"; the model is prepared by `bertforge.fast.speed_up`, as the training
  loop prepares it).
* transformers gets ``labels`` (B, T), -100 everywhere except at the masked positions: it
  computes the full (B, T, V) logits and ignores most of them in the loss. Its attention
  implementation is left at its default (``sdpa``; the script reports what it actually uses).

Fairness:

* same config (a bertforge preset, vocab 30522, converted to transformers' config), same weights
  (bertforge's state dict copied into the transformers model; the tied decoder follows the word
  embeddings), same batch, same process, same ``torch.set_num_threads``;
* before timing, both models are put in eval mode and must give the same loss on the batch
  (``--loss-atol``, default 1e-4) and the same MLM logits at the masked positions and NSP
  logits (``--logits-atol``, default 1e-5) -- the script stops if they do not;
* the timed steps interleave the two models, alternating which goes first (A B, B A, A B, ...),
  so noise on a shared machine hits both; each model reports the median of its timed steps,
  and "paired speedup" is the median over steps of HF/ours for back-to-back steps (the more
  robust number when other jobs share the CPUs), and "min/min" compares the fastest steps
  (contention only ever adds time); the load average is recorded in the JSON.

Batches imitate Google's ``create_pretraining_data.py`` at ``max_seq_length`` 128: [CLS] A [SEP]
B [SEP], segment ids 0/1, ``round(0.15 * length)`` masked positions (at most 20) chosen among
the non-special tokens and replaced 80/10/10 by [MASK] / a random id / the original id, unused
prediction slots pointing at position 0 with label -100, random NSP labels. Token ids are random
(speed does not depend on them). Two cases per preset:

* ``padded``: lengths from a fixed, seeded distribution: 85 % full length; 10 % shorter because of
  ``short_seq_prob=0.1`` (length uniform in [8, T]); 5 % cut by a document end (uniform in
  [T/2, T-1]). The real-token fraction of the drawn batch is printed.
* ``nopad``: every sequence is full length (the attention mask is still passed, all ones).

tokens/s counts real (non-padding) tokens.

Run (from the repository root)::

    .venv/bin/python benchmarks/step_time.py                 # tiny, mini, base; both cases
    .venv/bin/python benchmarks/step_time.py --presets tiny --steps 50 --json /tmp/st.json
    .venv/bin/python benchmarks/step_time.py --dense-mlm      # adds bertforge with full logits

``--dense-mlm`` also times bertforge called like transformers (labels (B, T), full (B, T, V)
logits), which separates the gain of the sparse MLM projection from the rest.
Defaults (steps, warm-up, batch) are per preset (see ``--help``); the default run took 9.7-11
minutes on 2 cores shared with other jobs (load average 2-5), about 5 minutes when idle.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

try:
    import bertforge
    from bertforge import BertConfig, BertForPreTraining
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import bertforge
    from bertforge import BertConfig, BertForPreTraining

import transformers  # noqa: E402
from bertforge.fast import speed_up  # noqa: E402
from transformers import BertConfig as HFBertConfig
from transformers import BertForPreTraining as HFBertForPreTraining

CLS, SEP, MASK = 101, 102, 103  # ids in Google's English uncased vocab
FIRST_WORD_ID = 999  # ids below are [PAD], [unused*], [UNK], [CLS], [SEP], [MASK]

# Per-preset defaults: (batch size, timed steps, warm-up steps).
DEFAULTS = {
    "tiny": (32, 10, 2),
    "mini": (32, 10, 2),
    "small": (16, 10, 2),
    "medium": (16, 8, 2),
    "base": (8, 6, 1),
    "large": (4, 5, 1),
}


# ---------------------------------------------------------------------------- data
@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    token_type_ids: torch.Tensor  # (B, T)
    masked_positions: torch.Tensor  # (B, P), 0 on unused slots
    masked_labels: torch.Tensor  # (B, P), -100 on unused slots
    full_labels: torch.Tensor  # (B, T), -100 except at masked positions
    next_sentence_label: torch.Tensor  # (B,)

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def ours(self) -> dict:
        return dict(input_ids=self.input_ids, attention_mask=self.attention_mask,
                    token_type_ids=self.token_type_ids, masked_positions=self.masked_positions,
                    labels=self.masked_labels, next_sentence_label=self.next_sentence_label)

    def ours_dense(self) -> dict:
        return dict(input_ids=self.input_ids, attention_mask=self.attention_mask,
                    token_type_ids=self.token_type_ids, labels=self.full_labels,
                    next_sentence_label=self.next_sentence_label)

    def theirs(self) -> dict:
        return self.ours_dense()


def draw_lengths(batch: int, seq_len: int, g: torch.Generator) -> list[int]:
    """85 % full; 10 % short_seq_prob targets (uniform [8, T]); 5 % document ends (uniform [T/2, T-1])."""
    out = []
    for _ in range(batch):
        u = float(torch.rand((), generator=g))
        if u < 0.10:
            n = int(torch.randint(8, seq_len + 1, (), generator=g))
        elif u < 0.15:
            n = int(torch.randint(seq_len // 2, seq_len, (), generator=g))
        else:
            n = seq_len
        out.append(n)
    return out


def make_batch(batch: int, seq_len: int, vocab: int, *, padded: bool, seed: int,
               max_predictions: int = 20, masked_lm_prob: float = 0.15) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lengths = draw_lengths(batch, seq_len, g) if padded else [seq_len] * batch
    input_ids = torch.zeros(batch, seq_len, dtype=torch.long)
    token_type_ids = torch.zeros(batch, seq_len, dtype=torch.long)
    attention_mask = torch.zeros(batch, seq_len, dtype=torch.long)
    positions = torch.zeros(batch, max_predictions, dtype=torch.long)
    labels = torch.full((batch, max_predictions), -100, dtype=torch.long)
    full_labels = torch.full((batch, seq_len), -100, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids = torch.randint(FIRST_WORD_ID, vocab, (n,), generator=g)
        # [CLS] A [SEP] B [SEP]: segment A takes 1..n-3 tokens, B the rest.
        len_a = int(torch.randint(1, max(2, n - 3), (), generator=g))
        sep_a = 1 + len_a
        ids[0], ids[sep_a], ids[n - 1] = CLS, SEP, SEP
        input_ids[i, :n] = ids
        token_type_ids[i, sep_a + 1:n] = 1
        attention_mask[i, :n] = 1
        candidates = torch.tensor([p for p in range(1, n - 1) if p != sep_a], dtype=torch.long)
        k = min(max_predictions, max(1, round(n * masked_lm_prob)), len(candidates))
        chosen = candidates[torch.randperm(len(candidates), generator=g)[:k]].sort().values
        originals = input_ids[i, chosen].clone()
        positions[i, :k] = chosen
        labels[i, :k] = originals
        full_labels[i, chosen] = originals
        # 80 % [MASK], 10 % random id, 10 % unchanged.
        r = torch.rand(k, generator=g)
        replaced = torch.where(r < 0.8, torch.full_like(originals, MASK),
                               torch.where(r < 0.9, torch.randint(FIRST_WORD_ID, vocab, (k,), generator=g),
                                           originals))
        input_ids[i, chosen] = replaced
    nsp = torch.randint(0, 2, (batch,), generator=g)
    return Batch(input_ids, attention_mask, token_type_ids, positions, labels, full_labels, nsp)


# ---------------------------------------------------------------------------- models
def build_models(preset: str, seq_len: int, seed: int):
    config = BertConfig.preset(preset)
    if seq_len > config.max_position_embeddings:
        raise SystemExit(f"--seq-len {seq_len} > max_position_embeddings {config.max_position_embeddings}")
    torch.manual_seed(seed)
    ours = speed_up(BertForPreTraining(config))  # as the training loop runs it (the state dict unchanged)
    hf_dict = {k: v for k, v in config.to_dict().items() if k != "bertforge_version"}
    theirs = HFBertForPreTraining(HFBertConfig(**hf_dict))  # default attention implementation
    result = theirs.load_state_dict(ours.state_dict(), strict=False)
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise SystemExit(f"state dict mismatch copying bertforge -> transformers: {result}")
    # The decoder keys are missing because transformers ties them to the copied tensors.
    assert theirs.cls.predictions.decoder.weight.data_ptr() == theirs.bert.embeddings.word_embeddings.weight.data_ptr()
    assert theirs.cls.predictions.decoder.bias.data_ptr() == theirs.cls.predictions.bias.data_ptr()
    return config, ours, theirs


def attn_implementation(model) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "unknown")


def check_same_loss(ours, theirs, batch: Batch, atol: float, logits_atol: float,
                    dense_mlm: bool = False) -> tuple[float, float, float]:
    """Eval mode (no dropout): same loss within ``atol``; same MLM logits at the masked positions
    and same NSP logits within ``logits_atol`` (more sensitive than the loss at random init)."""
    ours.eval()
    theirs.eval()
    with torch.no_grad():
        out_a = ours(**batch.ours())
        out_b = theirs(**batch.theirs())
        a, b = float(out_a.loss), float(out_b.loss)
        V = out_b.prediction_logits.shape[-1]
        index = batch.masked_positions.unsqueeze(-1).expand(-1, -1, V)
        used = (batch.masked_labels != -100).unsqueeze(-1)
        mlm_diff = ((out_a.prediction_logits - out_b.prediction_logits.gather(1, index)).abs() * used).max()
        nsp_diff = (out_a.seq_relationship_logits - out_b.seq_relationship_logits).abs().max()
        logits_diff = float(torch.maximum(mlm_diff, nsp_diff))
        del out_a, out_b
        if dense_mlm:  # bertforge with full logits must agree with itself
            c = float(ours(**batch.ours_dense()).loss)
            if not abs(a - c) <= atol:
                raise SystemExit(f"bertforge sparse vs dense MLM loss mismatch: {a:.7f} vs {c:.7f}")
    ours.train()
    theirs.train()
    if not abs(a - b) <= atol:
        raise SystemExit(f"loss mismatch in eval mode: bertforge {a:.7f} vs transformers {b:.7f} "
                         f"(|diff| {abs(a - b):.2e} > {atol})")
    if not logits_diff <= logits_atol:
        raise SystemExit(f"logits mismatch in eval mode: max |diff| {logits_diff:.2e} > {logits_atol}")
    return a, b, logits_diff


def step(model, inputs: dict) -> None:
    model.zero_grad(set_to_none=True)
    loss = model(**inputs).loss
    loss.backward()


# ---------------------------------------------------------------------------- timing
@dataclass
class Row:
    preset: str
    case: str
    batch: int
    seq_len: int
    real_token_fraction: float
    steps: int
    warmup: int
    ours_ms: float
    theirs_ms: float
    speedup: float  # theirs / ours (ratio of medians)
    paired_speedup: float  # median over steps of theirs_i / ours_i
    ours_tokens_per_s: float
    theirs_tokens_per_s: float
    eval_loss_ours: float
    eval_loss_theirs: float
    eval_logits_max_abs_diff: float
    ours_min_ms: float
    theirs_min_ms: float
    ours_dense_ms: float | None = None
    ours_step_ms: list[float] = field(default_factory=list)
    theirs_step_ms: list[float] = field(default_factory=list)
    ours_dense_step_ms: list[float] = field(default_factory=list)


def time_case(preset: str, case: str, ours, theirs, batch: Batch, *, steps: int, warmup: int,
              atol: float, logits_atol: float, dense_mlm: bool) -> Row:
    loss_a, loss_b, logits_diff = check_same_loss(ours, theirs, batch, atol, logits_atol, dense_mlm)
    runs = [("ours", ours, batch.ours()), ("theirs", theirs, batch.theirs())]
    if dense_mlm:
        runs.append(("ours_dense", ours, batch.ours_dense()))
    times: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    gc.collect()
    for i in range(warmup + steps):
        order = runs[i % len(runs):] + runs[:i % len(runs)]  # rotate who goes first
        for name, model, inputs in order:
            t0 = time.perf_counter()
            step(model, inputs)
            dt = time.perf_counter() - t0
            if i >= warmup:
                times[name].append(dt * 1e3)
    for _, model, _ in runs:
        model.zero_grad(set_to_none=True)
    B, T = batch.input_ids.shape
    real = batch.real_tokens
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = statistics.median(b / a for a, b in zip(times["ours"], times["theirs"]))
    return Row(
        preset=preset, case=case, batch=B, seq_len=T, real_token_fraction=real / (B * T),
        steps=steps, warmup=warmup, ours_ms=med["ours"], theirs_ms=med["theirs"],
        speedup=med["theirs"] / med["ours"], paired_speedup=paired,
        ours_tokens_per_s=real / med["ours"] * 1e3, theirs_tokens_per_s=real / med["theirs"] * 1e3,
        eval_loss_ours=loss_a, eval_loss_theirs=loss_b, eval_logits_max_abs_diff=logits_diff,
        ours_min_ms=min(times["ours"]), theirs_min_ms=min(times["theirs"]),
        ours_dense_ms=med.get("ours_dense"),
        ours_step_ms=[round(t, 2) for t in times["ours"]],
        theirs_step_ms=[round(t, 2) for t in times["theirs"]],
        ours_dense_step_ms=[round(t, 2) for t in times.get("ours_dense", [])],
    )


# ---------------------------------------------------------------------------- report
def interleaved(batches: list, steppers: dict, warmup: int):
    """Run every stepper (name -> step function, in its order) on every batch, the order rotated by one
    from batch to batch so that no run always goes first (on a cold cache) or last; yield (name, batch,
    step milliseconds) of the batches after the first ``warmup``. The machine's noise then falls on all
    runs alike, and their ratios hold on a shared machine."""
    gc.collect()
    names = list(steppers)
    for i, b in enumerate(batches):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            steppers[name](b)
            ms = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                yield name, b, ms


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_report(path: str, meta: dict, skipped: dict[str, str], rows: list) -> None:
    """A benchmark's JSON at ``path``: its run's ``meta``, the runs ``skipped`` (with why) and one record
    per row (dataclasses)."""
    Path(path).write_text(json.dumps({"meta": meta, "skipped": skipped, "rows": [asdict(r) for r in rows]},
                                     indent=1) + "\n")
    print(f"wrote {path}")


def skipped_precisions() -> dict[str, str]:
    """{"bf16": why} where this CPU has no native bf16 (`bertforge.train.precision.native_bf16`, as
    ``--precision auto`` asks), else {}. The benchmarks that time bf16 skip it there: emulated, it runs
    tens of times slower than fp32 (a tiny pre-training benchmark would take 21 minutes instead of about
    two), and bertforge never runs it on such a CPU unless told to."""
    from bertforge.train import precision

    if precision.native_bf16(torch.device("cpu")):
        return {}
    return {"bf16": f"no native bf16 on this CPU ({precision.cpu_name()}): emulated, it runs tens of times slower "
                    "than fp32, and --precision auto picks fp32 here"}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def format_table(rows: list[Row], dense: bool) -> str:
    head = ["preset", "case", "batch", "real tok", "ours ms/step", "HF ms/step", "speedup (HF/ours)",
            "paired speedup", "min/min speedup", "ours tok/s", "HF tok/s"]
    if dense:
        head.insert(6, "ours dense-MLM ms")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [r.preset, r.case, str(r.batch), f"{100 * r.real_token_fraction:.1f}%",
                 f"{r.ours_ms:.1f}", f"{r.theirs_ms:.1f}", f"{r.speedup:.2f}x", f"{r.paired_speedup:.2f}x",
                 f"{r.theirs_min_ms / r.ours_min_ms:.2f}x",
                 f"{r.ours_tokens_per_s:,.0f}", f"{r.theirs_tokens_per_s:,.0f}"]
        if dense:
            cells.insert(6, f"{r.ours_dense_ms:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Forward+backward step time of bertforge BertForPreTraining (sparse MLM logits, "
                    "unpadding) vs transformers BertForPreTraining (full logits), same weights and batch. "
                    "See the module docstring for what is measured.")
    p.add_argument("--presets", default="tiny,mini,base",
                   help=f"comma-separated bertforge presets ({', '.join(DEFAULTS)}); default %(default)s")
    p.add_argument("--cases", default="padded,nopad", help="comma-separated: padded, nopad; default %(default)s")
    p.add_argument("--batch-size", type=int, default=None,
                   help="batch size for every preset (default: per preset, 32 tiny/mini, 8 base)")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per model (default: per preset, 10 tiny/mini, 6 base)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed warm-up steps per model (default: per preset, 2 tiny/mini, 1 base)")
    p.add_argument("--seq-len", type=int, default=128, help="sequence length T; default %(default)s")
    p.add_argument("--max-predictions", type=int, default=20, help="P: masked positions per sequence; default %(default)s")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads value (default: torch's default for this machine)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and batches; default %(default)s")
    p.add_argument("--loss-atol", type=float, default=1e-4,
                   help="max |loss difference| allowed in the eval-mode check; default %(default)s")
    p.add_argument("--logits-atol", type=float, default=1e-5,
                   help="max |difference| of MLM (at masked positions) and NSP logits in the eval-mode check; "
                        "default %(default)s")
    p.add_argument("--dense-mlm", action="store_true",
                   help="also time bertforge with full (B, T, V) logits, called like transformers")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    args = p.parse_args(argv)
    args.presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    args.cases = [s.strip() for s in args.cases.split(",") if s.strip()]
    for name in args.presets:
        if name not in DEFAULTS:
            p.error(f"unknown preset {name!r}")
    for c in args.cases:
        if c not in ("padded", "nopad"):
            p.error(f"unknown case {c!r}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    else:
        torch.set_num_threads(torch.get_num_threads())  # pin torch's default explicitly
    threads = torch.get_num_threads()
    started = time.perf_counter()
    meta = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "bertforge": bertforge.__version__,
        "python": platform.python_version(),
        "threads": threads,
        "seq_len": args.seq_len,
        "max_predictions": args.max_predictions,
        "loadavg_before": _loadavg(),
    }
    print(f"# torch {meta['torch']}, transformers {meta['transformers']}, bertforge {meta['bertforge']}; "
          f"{threads} threads; {meta['nproc']} CPUs: {meta['cpu']}", flush=True)
    rows: list[Row] = []
    attn_impls = {}
    for preset in args.presets:
        d_batch, d_steps, d_warmup = DEFAULTS[preset]
        batch_size = args.batch_size or d_batch
        steps = args.steps if args.steps is not None else d_steps
        warmup = args.warmup if args.warmup is not None else d_warmup
        config, ours, theirs = build_models(preset, args.seq_len, args.seed)
        attn_impls[preset] = attn_implementation(theirs)
        print(f"# {preset}: L={config.num_hidden_layers} H={config.hidden_size} A={config.num_attention_heads} "
              f"V={config.vocab_size}; transformers attention: {attn_impls[preset]}; "
              f"batch {batch_size}, {warmup} warm-up + {steps} timed steps per model", flush=True)
        for case in args.cases:
            batch = make_batch(batch_size, args.seq_len, config.vocab_size, padded=(case == "padded"),
                               seed=args.seed + 1, max_predictions=args.max_predictions)
            t0 = time.perf_counter()
            row = time_case(preset, case, ours, theirs, batch, steps=steps, warmup=warmup,
                            atol=args.loss_atol, logits_atol=args.logits_atol, dense_mlm=args.dense_mlm)
            rows.append(row)
            print(f"#   {case}: eval loss {row.eval_loss_ours:.6f} (ours) vs {row.eval_loss_theirs:.6f} (HF), "
                  f"max |logit diff| {row.eval_logits_max_abs_diff:.1e}; "
                  f"ours {row.ours_ms:.1f} ms, HF {row.theirs_ms:.1f} ms, speedup {row.speedup:.2f}x "
                  f"(paired median {row.paired_speedup:.2f}x, min/min {row.theirs_min_ms / row.ours_min_ms:.2f}x); "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
        del ours, theirs
        gc.collect()
    meta["attn_implementation"] = attn_impls
    meta["wall_s"] = round(time.perf_counter() - started, 1)
    meta["loadavg_after"] = _loadavg()
    print()
    print(format_table(rows, args.dense_mlm))
    print()
    print(f"transformers attention implementation: {', '.join(f'{k}={v}' for k, v in attn_impls.items())}; "
          f"threads {threads}; medians of timed steps; speedup = HF ms / ours ms; "
          f"tok/s = real (non-padding) tokens per second; paired speedup = median over steps of HF/ours "
          f"for back-to-back steps; min/min = fastest HF step / fastest ours step; load average before {meta['loadavg_before']}, after {meta['loadavg_after']}; "
          f"total wall time {meta['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
