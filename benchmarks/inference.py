"""Inference throughput: sentences/s of bertforge `BertModel` vs transformers `BertModel`.

What is timed, for both: one forward of the bare encoder (embeddings, L layers, pooler) on a batch
of 32 sentences, in eval mode under ``torch.no_grad()``, on the CPU. Four runs:

* ``ours-fp32``, ``ours-bf16``: bertforge's `BertModel`, float32, and under
  ``torch.autocast("cpu", torch.bfloat16)`` (what ``bertforge features --bf16`` does). With padding in
  the batch its dense layers run on the real tokens only.
  It is prepared as `Predictor` and ``bertforge features`` prepare it
  (`bertforge.fast.speed_up(model, freeze=True)`): unpadded, attention per length group, and the
  stacked q/k/v weight, and under autocast every projection's bf16 copy, made once instead of on
  every forward.
* ``HF-fp32``, ``HF-bf16``: ``transformers.BertModel`` with ``attn_implementation="sdpa"`` (its
  default; the script reports what it uses), float32 and under the same autocast.

Data: the sentences of the Wikipedia leads (`bertforge.resources`), split as ``bertforge prepare``
splits them (``RawDocument.sentences()``), in corpus order, so a batch mixes short and long
sentences as they come (sorting by length would be the caller's choice; neither stack does it).
Encoded with the all-MiniLM-L6-v2 uncased vocab, [CLS] sentence [SEP], cut at 128 tokens, each
batch padded to its longest sentence. On these batches about 46 % of the slots are real tokens.

``--bf16-weights`` adds ``ours-bf16w`` and ``HF-bf16w``: each model cast to bfloat16, no autocast.

On a CPU without native bf16 (`step_time.skipped_precisions`: AVX2 only) every bf16 run is skipped,
and the output and the JSON (``"skipped"``) say why: emulated bf16 is tens of times slower than fp32
and not what bertforge runs there.

Fairness: same config (a bertforge preset, vocab 30522), same random weights (the encoder of
`step_time.build_models`: bertforge's state dict copied into transformers'), same batches, one
process, torch's default threads (``--threads``). Before timing, the fp32 outputs must agree on the
first batch (``last_hidden_state`` at real positions and ``pooler_output`` within ``--atol``).

Timing: every batch is run ``--repeats`` times per run (default 3), one forward at a time, all runs
interleaved with the order rotating from forward to forward, so load from other jobs hits all alike.
A run's time on a batch is the fastest of its repeats: on a shared machine contention only adds
time, and it adds a lot to two-thread runs (a preempted thread stalls every parallel op). Reported:
sentences/s and real tokens/s (all timed batches / the sum of their best times), the ratio of
bertforge's best run to transformers' best run, the median over batches of the paired ratio (same
batch), and the same ratio from the mean times of all repeats ("contended"). ``--threads 1 --clock cpu``
times the work itself: the CPU time of the one computing thread, which other jobs do not inflate.

Run (from the repository root)::

    .venv/bin/python benchmarks/inference.py                              # mini and base
    .venv/bin/python benchmarks/inference.py --presets mini --batches 20 --profile --json /tmp/inf.json
    .venv/bin/python benchmarks/inference.py --threads 1 --clock cpu        # the work, on a busy machine

``--profile`` adds a torch.profiler breakdown of a few batches of each stack's faster run: self
CPU time per op category, per op, and per source function (the innermost frame in bertforge's or
transformers' BERT code).
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bertforge.fast import freeze_weights, speed_up

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_throughput import autocast, categorize, run_meta  # noqa: E402

from step_time import _loadavg, attn_implementation, build_models, skipped_precisions, write_report  # noqa: E402

RUNS = ("ours-fp32", "ours-bf16", "HF-fp32", "HF-bf16")
WEIGHT_RUNS = ("ours-bf16w", "HF-bf16w")
DEFAULTS = {"tiny": 40, "mini": 40, "small": 20, "medium": 16, "base": 12, "large": 6}  # timed batches
TARGET = 2.0
MAX_LENGTH = 128


# ---------------------------------------------------------------------------- data
def leads_sentences() -> list[str]:
    """The leads' sentences, in corpus order, split as ``speed_up`` splits them."""
    from bertforge.data.corpus import iter_documents
    from bertforge.resources import wikipedia_leads_file

    return [s for d in iter_documents([wikipedia_leads_file()], fmt="wiki-json") for s in d.sentences()]


def make_batches(sentences: list[str], batch_size: int, count: int, start: int = 0) -> list[dict[str, torch.Tensor]]:
    """``count`` consecutive batches from sentence ``start``, each padded to its longest sentence."""
    from bertforge import BertTokenizer
    from bertforge.resources import minilm_folder

    tok = BertTokenizer.from_pretrained(minilm_folder())
    out = []
    for i in range(count):
        chunk = sentences[start + i * batch_size:start + (i + 1) * batch_size]
        enc = tok(chunk, truncation=True, max_length=MAX_LENGTH, padding=True, return_tensors="pt")
        out.append({k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")})
    return out


# ---------------------------------------------------------------------------- the runs
def forward(model, batch: dict[str, torch.Tensor], precision: str) -> None:
    with torch.no_grad(), autocast(precision):  # "bf16w": the model itself is bfloat16
        model(**batch)


def check_same_outputs(ours, theirs, batch: dict[str, torch.Tensor], atol: float) -> float:
    """fp32 outputs must agree: last_hidden_state at real positions, pooler_output everywhere."""
    with torch.no_grad():
        a, b = ours(**batch), theirs(**batch)
    real = batch["attention_mask"].bool()
    diff = max(float((a.last_hidden_state[real] - b.last_hidden_state[real]).abs().max()),
               float((a.pooler_output - b.pooler_output).abs().max()))
    if not diff <= atol:
        raise SystemExit(f"outputs differ: max |diff| {diff:.2e} > {atol}")
    return diff


@dataclass
class Row:
    preset: str
    batch_size: int
    batches: int
    repeats: int
    sentences: int
    real_tokens: int
    real_fraction: float  # real tokens / padded slots
    hf_attention: str
    max_abs_diff: float
    sentences_per_s: dict[str, float]  # from each batch's best repeat
    tokens_per_s: dict[str, float]
    contended_sentences_per_s: dict[str, float]  # from the mean of all repeats
    ours_best: str
    theirs_best: str
    ratio: float  # ours best / HF best sentences/s
    paired_ratio: float  # median over batches of HF-best time / ours-best time
    contended_ratio: float  # the same ratio as `ratio` from the mean times
    batch_ms: dict[str, list[list[float]]] = field(default_factory=dict)  # run -> batch -> repeats
    profiles: list[dict] = field(default_factory=list)


def run_preset(preset: str, sentences: list[str], args, skipped: dict[str, str] | None = None) -> Row:
    """Time ``preset``'s runs (module docstring), all but those whose precision (bf16 for bf16 and bf16w)
    is in ``skipped``."""
    count = args.batches or DEFAULTS[preset]
    batches = make_batches(sentences, args.batch_size, args.warmup + count)
    _, ours_pt, theirs_pt = build_models(preset, MAX_LENGTH, args.seed)
    # ours as `Predictor` and `bertforge features` run it: prepared, weights frozen (stacked and cast once)
    models = {"ours": speed_up(ours_pt.bert.eval(), freeze=True), "HF": theirs_pt.bert.eval()}
    del ours_pt.cls, theirs_pt.cls  # the MLM / NSP heads are not used
    diff = check_same_outputs(models["ours"], models["HF"], batches[0], args.atol)
    runs = tuple(n for n in RUNS + (WEIGHT_RUNS if args.bf16_weights else ())
                 if n.split("-")[1].removesuffix("w") not in (skipped or {}))
    if set(WEIGHT_RUNS) & set(runs):
        for stack in ("ours", "HF"):
            models[stack + "-w"] = copy.deepcopy(models[stack]).to(torch.bfloat16)
        freeze_weights(models["ours-w"])
    gc.collect()

    clock = time.thread_time if args.clock == "cpu" else time.perf_counter

    def run(name: str, batch: dict[str, torch.Tensor]) -> float:
        stack, precision = name.split("-")
        model = models[stack + "-w"] if precision == "bf16w" else models[stack]
        t0 = clock()
        forward(model, batch, precision)
        return clock() - t0

    for batch in batches[:args.warmup]:
        for name in runs:
            run(name, batch)
    timed = batches[args.warmup:]
    times: dict[str, list[list[float]]] = {name: [[] for _ in timed] for name in runs}
    turn = 0
    for r in range(args.repeats):
        for i, batch in enumerate(timed):
            order = runs[turn % len(runs):] + runs[:turn % len(runs)]
            turn += 1
            for name in order:
                times[name][i].append(run(name, batch))
            if args.progress:
                print(f"#   {preset} repeat {r + 1}/{args.repeats} batch {i + 1}/{len(timed)}: "
                      + ", ".join(f"{n} {times[n][i][-1] * 1e3:.0f} ms" for n in runs), flush=True)

    n_sent = sum(int(b["input_ids"].shape[0]) for b in timed)
    n_tok = sum(int(b["attention_mask"].sum()) for b in timed)
    slots = sum(b["attention_mask"].numel() for b in timed)
    best = {n: [min(t) for t in ts] for n, ts in times.items()}  # per batch
    mean = {n: [statistics.fmean(t) for t in ts] for n, ts in times.items()}
    sps = {n: n_sent / sum(t) for n, t in best.items()}
    contended = {n: n_sent / sum(t) for n, t in mean.items()}
    ours_best = max((n for n in runs if n.startswith("ours")), key=sps.get)
    theirs_best = max((n for n in runs if n.startswith("HF")), key=sps.get)
    row = Row(
        preset=preset, batch_size=args.batch_size, batches=len(timed), repeats=args.repeats, sentences=n_sent,
        real_tokens=n_tok, real_fraction=round(n_tok / slots, 4), hf_attention=attn_implementation(models["HF"]),
        max_abs_diff=diff,
        sentences_per_s={n: round(v, 2) for n, v in sps.items()},
        tokens_per_s={n: round(n_tok / sum(t), 1) for n, t in best.items()},
        contended_sentences_per_s={n: round(v, 2) for n, v in contended.items()},
        ours_best=ours_best, theirs_best=theirs_best, ratio=round(sps[ours_best] / sps[theirs_best], 3),
        paired_ratio=round(statistics.median(h / o for h, o in zip(best[theirs_best], best[ours_best])), 3),
        contended_ratio=round(max(v for n, v in contended.items() if n.startswith("ours"))
                              / max(v for n, v in contended.items() if n.startswith("HF")), 3),
        batch_ms={n: [[round(x * 1e3, 2) for x in t] for t in ts] for n, ts in times.items()},
    )
    if args.profile:
        for name in (ours_best, theirs_best):
            stack, precision = name.split("-")
            model = models[stack + "-w"] if precision == "bf16w" else models[stack]
            row.profiles.append(profile_forward(model, timed[:args.profile_batches], precision,
                                                f"{preset} {name}", args.top))
    return row


# ---------------------------------------------------------------------------- profile
def _source(event) -> str:
    """Where in the model code an op was called: the innermost bertforge / transformers frame among
    the op's callers, as 'file:function (module)', the module being the nn.Module whose forward
    holds that frame."""
    frame, parent = None, event.cpu_parent
    while parent is not None:
        name = parent.name
        if frame is None and "(" in name and ("bertforge/" in name or "transformers/" in name):
            path, _, func = name.partition(": ")
            path = path.split("(")[0]
            path = path[path.index("bertforge/" if "bertforge/" in path else "transformers/"):]
            frame = f"{path}:{func}"
        elif frame is not None and name.startswith("nn.Module: "):
            return f"{frame} ({name[len('nn.Module: '):].rsplit('_', 1)[0]})"
        parent = parent.cpu_parent
    return frame or "other"


def profile_forward(model, batches: list[dict[str, torch.Tensor]], precision: str, label: str, top: int) -> dict:
    """torch.profiler over ``batches`` forwards: self CPU time per op category, op and source function."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        t0 = time.perf_counter()
        for batch in batches:
            forward(model, batch, precision)
        wall = time.perf_counter() - t0
    events = [e for e in prof.events() if e.self_cpu_time_total > 0 and "::" in e.name]  # ops, not Python frames
    total = sum(e.self_cpu_time_total for e in events) / 1e3
    by: dict[str, dict[str, float]] = {"category": defaultdict(float), "op": defaultdict(float),
                                       "source": defaultdict(float)}
    for e in events:
        ms = e.self_cpu_time_total / 1e3
        by["category"][categorize(e.name)] += ms
        by["op"][e.name] += ms
        by["source"][_source(e)] += ms
    print(f"\n### profile: {label} ({len(batches)} batches, wall {wall * 1e3:.0f} ms under the profiler, "
          f"self CPU total {total:.0f} ms)")
    for kind in ("category", "source", "op"):
        print(f"\n| {kind} | self CPU ms | share |\n|---|---|---|")
        for key, ms in sorted(by[kind].items(), key=lambda kv: -kv[1])[:top]:
            print(f"| `{key}` | {ms:.1f} | {100 * ms / total:.1f}% |")
    return {"label": label, "wall_ms": round(wall * 1e3, 1), "self_cpu_total_ms": round(total, 1),
            **{kind: {k: round(v, 2) for k, v in sorted(d.items(), key=lambda kv: -kv[1])} for kind, d in by.items()}}


# ---------------------------------------------------------------------------- report
def format_table(rows: list[Row]) -> str:
    lines = ["| preset | run | sentences/s | real tok/s | vs HF best | contended sentences/s |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        best = r.sentences_per_s[r.theirs_best]
        for n in r.sentences_per_s:
            mark = " **best**" if n in (r.ours_best, r.theirs_best) else ""
            lines.append(f"| {r.preset} | {n}{mark} | {r.sentences_per_s[n]:,.1f} | {r.tokens_per_s[n]:,.0f} | "
                         f"{r.sentences_per_s[n] / best:.2f}x | {r.contended_sentences_per_s[n]:,.1f} |")
    lines += ["", "| preset | real tokens | ours best / HF best | paired | contended | target |",
              "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.preset} | {100 * r.real_fraction:.0f} % | **{r.ratio:.2f}x** ({r.ours_best} / "
                     f"{r.theirs_best}) | {r.paired_ratio:.2f}x | {r.contended_ratio:.2f}x | >= {TARGET:g}x: "
                     f"{'met' if r.ratio >= TARGET else 'not met'} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Inference sentences/s: bertforge vs transformers BertModel on the "
                                            "Wikipedia-leads sentences. See the module docstring.")
    p.add_argument("--presets", default="mini,base", help="comma-separated presets; default %(default)s")
    p.add_argument("--batches", type=int, default=None,
                   help=f"timed batches per preset (default: {', '.join(f'{k} {v}' for k, v in DEFAULTS.items())})")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches per run first; default %(default)s")
    p.add_argument("--repeats", type=int, default=3, help="forwards per batch and run (the fastest counts); "
                                                          "default %(default)s")
    p.add_argument("--bf16-weights", action="store_true", help="also time both models cast to bfloat16")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch; default %(default)s")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: elapsed time; cpu: the CPU time of the (single) computing thread, which other jobs "
                        "on the machine do not inflate (needs --threads 1); default %(default)s")
    p.add_argument("--seed", type=int, default=0, help="weights; default %(default)s")
    p.add_argument("--atol", type=float, default=1e-4, help="fp32 output check; default %(default)s")
    p.add_argument("--profile", action="store_true", help="profile each stack's faster run")
    p.add_argument("--profile-batches", type=int, default=4, help="batches per profile; default %(default)s")
    p.add_argument("--top", type=int, default=15, help="rows per profile table; default %(default)s")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True, help="print every batch")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    args = p.parse_args(argv)
    args.presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    for name in args.presets:
        if name not in DEFAULTS:
            p.error(f"unknown preset {name!r}")
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu measures one thread: pass --threads 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads or torch.get_num_threads())
    started = time.perf_counter()
    meta = run_meta()
    skipped = skipped_precisions()
    sentences = leads_sentences()
    print(f"# torch {meta['torch']} ({meta['cpu_capability']}), transformers {meta['transformers']}, bertforge "
          f"{meta['bertforge']}; {meta['threads']} threads; {meta['nproc']} CPUs: {meta['cpu']}; "
          f"{len(sentences):,} leads sentences; load average {meta['loadavg_before']}", flush=True)
    for p, why in skipped.items():
        print(f"# {p} runs skipped: {why}", flush=True)
    rows = []
    for preset in args.presets:
        rows.append(run_preset(preset, sentences, args, skipped))
        print(f"#   load average {_loadavg()}", flush=True)
    meta.update(wall_s=round(time.perf_counter() - started, 1), loadavg_after=_loadavg(), clock=args.clock,
                repeats=args.repeats, batch_size=args.batch_size)
    print()
    print(format_table(rows))
    print()
    print(f"batch {args.batch_size} sentences in corpus order, padded to the longest; sentences/s and tok/s = all "
          f"timed batches / the sum of each batch's fastest of {args.repeats} repeats; paired = median over batches "
          f"of HF-best / ours-best time; contended = the same from the mean of the repeats; {args.clock} clock; "
          f"transformers attention: {', '.join(sorted({r.hf_attention for r in rows}))}; fp32 outputs agree to "
          f"{max(r.max_abs_diff for r in rows):.1e}; "
          + "".join(f"{p} runs skipped: {why}; " for p, why in skipped.items())
          + f"load average before {meta['loadavg_before']}, after {meta['loadavg_after']}; wall {meta['wall_s']:.0f} s")
    if args.json:
        write_report(args.json, meta, skipped, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
