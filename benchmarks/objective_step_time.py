"""Pre-training step time by objective: the left-to-right model (``--objective ltr``, a causal encoder)
against the bidirectional masked LM (``--objective mlm``) of the same size, and against itself on the
reference forward.

What one step is: `bertforge.train.loop.Trainer.train_step`, as ``bertforge pretrain`` runs it
(`pretrain_throughput.ours_trainer`: forward with the objective's task under the precision's autocast,
the loss normalised over the step's predictions, backward, ``clip_grad_norm_(1.0)``, fused AdamW, the
schedule). Training mode, CPU. The runs, each with its own model (`build_pretraining_model`, as
``bertforge pretrain`` builds it for the objective) and optimizer, on the same batches:

* ``mlm``: `BertForMaskedLM`, `PretrainingObjective` without NSP: MLM logits at the masked positions only;
* ``ltr``: the causal `BertForMaskedLM` (config ``is_decoder``), `LeftToRightObjective`: at every real
  position but the last, the next token predicted; prepared by `bertforge.fast.speed_up` (unpadded);
* ``ltr-reference``: the same causal model with the encoder's forwards the reference's (embeddings,
  layers, the whole `BertModel`), its dropout modules still prepared: what `speed_up` did with a
  causal encoder before it unpadded one ("before");
* ``ltr-task-bidirectional`` (``--with-bidirectional-ltr``): the mlm model trained on the ltr task,
  bidirectional: the same vocabulary projection as ltr (every position), so ltr over it is the cost of
  causal attention alone.

The objectives differ in more than attention: ltr's (H -> V) vocabulary projection runs at every
real position, mlm's at about 15 % of them (the masked ones), and at small sizes that projection is a
large part of a step. The table shows both ratios, ltr / mlm and ltr / ltr-task-bidirectional.

Batches, two cases (``--cases``), a fresh batch per step, the same for every run:

* ``leads128``: real ones, as `pretrain_throughput` takes them: the Wikipedia leads prepared at length
  128 with the uncased vocab of 30,522 pieces (`pretrain_throughput.prepared_leads`, cached) through
  `PretrainingLoader` (`pretrain_throughput.real_batches`): padded to the batch's longest instance,
  about 70 % real tokens, 20 prediction slots;
* ``demo64``: the demo's and Table 5's shape, length 64 with the demo's 8,192-piece vocab, 10 prediction
  slots: `step_time.make_batch` (Google's layout, 85 % of the sequences full length, random ids).

ltr undoes the masks (`original_tokens`).

Timing: one thread (``--threads``), every run's step interleaved in one process, the order rotated
each step (A B C, B C A, ...), so load from other jobs hits all runs alike; each run reports its
fastest step (contention only ever adds time) and its median; "paired" is the median over steps of the
ratio of back-to-back steps. Target: ltr within 10 % of mlm's step time (ltr / mlm <= 1.10, fastest
steps).

Run (from the repository root; pinned to one core)::

    taskset -c 0 env OMP_NUM_THREADS=1 .venv/bin/python benchmarks/objective_step_time.py \\
        --json docs/results/objective_step_time.json
    .venv/bin/python benchmarks/objective_step_time.py --presets tiny --cases demo64 --steps 5

On a CPU without native bf16 (`step_time.skipped_precisions`) the bf16 runs are skipped, and the output
and the JSON (``"skipped"``) say why: emulated bf16 is not what bertforge runs there.

Defaults: tiny and mini, batch 32, both cases, fp32 and bf16, dropout 0 (the budget recipe's, Table 5's
and the demo's; ``--dropout 0.1`` for the paper's, whose attention is written out around the cheaper
dropout mask on CPU), 3 warm-up and 12 timed steps per run. The default run took 9 minutes on one
core shared with two other jobs (docs/results/objective_step_time.json).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_throughput import ours_batch, ours_trainer, prepared_leads, real_batches, run_meta  # noqa: E402
from step_time import _loadavg, interleaved, make_batch, skipped_precisions, write_report  # noqa: E402

from bertforge.data.prepare import load_manifest  # noqa: E402

from bertforge.model.bert import BertEmbeddings, BertLayer, BertModel, BertPooler  # noqa: E402
from bertforge.train.pretrain import (LeftToRightObjective, PretrainConfig, PretrainingObjective,  # noqa: E402
                                      build_pretraining_model)

PRECISIONS = ("fp32", "bf16")
CASES = ("leads128", "demo64")
DEMO_VOCAB, DEMO_LENGTH, DEMO_PREDICTIONS = 8192, 64, 10
TARGET = 1.10  # ltr / mlm step time at most


def reference_encoder(model: torch.nn.Module) -> torch.nn.Module:
    """``model``'s encoder back on the reference forward (instance forwards of `BertModel`, its
    embeddings, layers and pooler removed), its dropout modules left prepared: a causal encoder as
    `speed_up` left it before causal attention was unpadded."""
    for module in model.modules():
        if isinstance(module, (BertModel, BertEmbeddings, BertLayer, BertPooler)):
            module.__dict__.pop("forward", None)
    return model


@dataclass
class Run:
    name: str  # mlm, ltr, ltr-reference, ltr-task-bidirectional
    precision: str
    step_ms: list[float] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.name}-{self.precision}"


@dataclass
class Row:
    preset: str
    case: str
    precision: str
    batch: int
    seq_len: int  # the data's length (a batch is padded to its longest instance)
    vocab_size: int
    max_predictions: int
    dropout: float
    real_token_fraction: float
    predictions_per_step: dict[str, float]  # rows of the vocabulary projection, mean over timed steps
    steps: int
    warmup: int
    min_ms: dict[str, float]
    median_ms: dict[str, float]
    ltr_over_mlm: float  # fastest steps
    ltr_over_mlm_median: float
    ltr_over_mlm_paired: float
    reference_over_mlm: float  # before: ltr on the reference forward, fastest steps
    reference_over_ltr: float  # the speed-up of the unpadded causal encoder, fastest steps
    ltr_over_bidirectional_task: float | None  # causal attention's own cost, fastest steps
    target: float
    met: bool
    step_ms: dict[str, list[float]]


def build(preset: str, objective: str, vocab: int, nsp: bool, seq_len: int, dropout: float,
          seed: int) -> torch.nn.Module:
    """The model ``bertforge pretrain`` builds for ``objective`` (fresh, seeded), in train mode."""
    torch.manual_seed(seed)
    cfg = PretrainConfig(model=preset, dropout=dropout, objective=objective)
    return build_pretraining_model(cfg, vocab, nsp, seq_len, objective).train()


def case_batches(case: str, count: int, args) -> tuple[list[dict[str, torch.Tensor]], int, bool, int, int]:
    """``count`` batches of ``case``, with its vocab size, whether the data holds sentence pairs, its
    length and its prediction slots."""
    B = args.batch_size
    if case == "leads128":
        data = prepared_leads()
        manifest = load_manifest(data)
        batches = [ours_batch(b) for b in real_batches(data, B, count, seed=args.seed)]
        return (batches, int(manifest["vocab_size"]), bool(manifest["config"]["nsp"]),
                int(manifest["config"]["max_seq_length"]), int(manifest["config"]["max_predictions_per_seq"]))
    batches = []
    for i in range(count):
        b = make_batch(B, DEMO_LENGTH, DEMO_VOCAB, padded=True, seed=args.seed + 1 + i,
                       max_predictions=DEMO_PREDICTIONS)
        batches.append({"input_ids": b.input_ids, "attention_mask": b.attention_mask,
                        "token_type_ids": b.token_type_ids, "masked_positions": b.masked_positions,
                        "labels": b.masked_labels})
    return batches, DEMO_VOCAB, True, DEMO_LENGTH, DEMO_PREDICTIONS


def run_case(preset: str, case: str, args, tmp: str) -> list[Row]:
    B = args.batch_size
    batches, V, nsp, T, P = case_batches(case, args.warmup + args.steps, args)
    models = {"mlm": build(preset, "mlm", V, nsp, T, args.dropout, args.seed),
              "ltr": build(preset, "ltr", V, nsp, T, args.dropout, args.seed),
              "ltr-reference": build(preset, "ltr", V, nsp, T, args.dropout, args.seed)}
    tasks = {"mlm": PretrainingObjective(nsp=False), "ltr": LeftToRightObjective(), "ltr-reference": LeftToRightObjective()}
    if args.with_bidirectional_ltr:
        models["ltr-task-bidirectional"] = models["mlm"]  # the same weights and head, another task
        tasks["ltr-task-bidirectional"] = LeftToRightObjective()
    runs, steppers = [], {}
    for name in models:
        for precision in args.precisions:
            trainer = ours_trainer(models[name], B, precision, tmp, objective=tasks[name])  # sped up, as in a run
            if name == "ltr-reference":
                reference_encoder(trainer.model)
            run = Run(name, precision)
            runs.append(run)
            steppers[run.key] = (lambda b, t=trainer: t.train_step([b]))
    timed = batches[args.warmup:]
    real = sum(float(b["attention_mask"].sum()) for b in timed) / sum(b["attention_mask"].numel() for b in timed)
    config = models["ltr"].config
    print(f"# {preset}, {case}: L={config.num_hidden_layers} H={config.hidden_size} V={V}, batch {B}, "
          f"{100 * real:.1f}% real tokens, dropout {args.dropout}; runs {', '.join(r.key for r in runs)}; "
          f"{args.warmup} warm-up + {args.steps} timed steps each", flush=True)
    by_key = {run.key: run for run in runs}
    for key, _, ms in interleaved(batches, steppers, args.warmup):
        by_key[key].step_ms.append(ms)
    predictions = {"mlm": sum(float((b["labels"] != -100).sum()) for b in timed) / len(timed),
                   "ltr": sum(float(b["attention_mask"][:, 1:].sum()) for b in timed) / len(timed)}
    rows = []
    for precision in {r.precision: None for r in runs}:
        by = {r.name: r for r in runs if r.precision == precision}
        best = {k: min(r.step_ms) for k, r in by.items()}
        med = {k: statistics.median(r.step_ms) for k, r in by.items()}
        paired = statistics.median(a / b for a, b in zip(by["ltr"].step_ms, by["mlm"].step_ms))
        ratio = best["ltr"] / best["mlm"]
        rows.append(Row(
            preset=preset, case=case, precision=precision, batch=B, seq_len=T, vocab_size=V, max_predictions=P,
            dropout=args.dropout, real_token_fraction=round(real, 4), predictions_per_step=predictions,
            steps=args.steps, warmup=args.warmup, min_ms={k: round(v, 2) for k, v in best.items()},
            median_ms={k: round(v, 2) for k, v in med.items()}, ltr_over_mlm=round(ratio, 3),
            ltr_over_mlm_median=round(med["ltr"] / med["mlm"], 3), ltr_over_mlm_paired=round(paired, 3),
            reference_over_mlm=round(best["ltr-reference"] / best["mlm"], 3),
            reference_over_ltr=round(best["ltr-reference"] / best["ltr"], 3),
            ltr_over_bidirectional_task=(round(best["ltr"] / best["ltr-task-bidirectional"], 3)
                                         if "ltr-task-bidirectional" in best else None),
            target=TARGET, met=ratio <= TARGET,
            step_ms={k: [round(t, 2) for t in r.step_ms] for k, r in by.items()}))
        r = rows[-1]
        print(f"#   {precision}: fastest ms " + ", ".join(f"{k} {v:.1f}" for k, v in r.min_ms.items())
              + f"; ltr / mlm {r.ltr_over_mlm:.2f} (median {r.ltr_over_mlm_median:.2f}, paired "
              f"{r.ltr_over_mlm_paired:.2f}); before / after {r.reference_over_ltr:.2f}x", flush=True)
    del models, steppers, runs
    gc.collect()
    return rows


def format_table(rows: list[Row]) -> str:
    extra = any(r.ltr_over_bidirectional_task is not None for r in rows)
    head = ["preset", "case", "V", "precision", "real tok", "mlm ms", "ltr before ms", "ltr ms", "ltr / mlm",
            "before / mlm", "before / after"]
    if extra:
        head.insert(8, "ltr-task bidir. ms")
        head.append("ltr / ltr-task bidir.")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [r.preset, r.case, f"{r.vocab_size:,}", r.precision, f"{100 * r.real_token_fraction:.0f}%",
                 f"{r.min_ms['mlm']:.1f}", f"{r.min_ms['ltr-reference']:.1f}", f"{r.min_ms['ltr']:.1f}",
                 f"{r.ltr_over_mlm:.2f} ({'met' if r.met else 'not met'})", f"{r.reference_over_mlm:.2f}",
                 f"{r.reference_over_ltr:.2f}x"]
        if extra:
            cells.insert(8, f"{r.min_ms.get('ltr-task-bidirectional', float('nan')):.1f}")
            cells.append(f"{r.ltr_over_bidirectional_task:.2f}" if r.ltr_over_bidirectional_task else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Pre-training step time of the ltr objective (causal encoder) against "
                                            "mlm of the same size, and ltr on the reference forward. See the "
                                            "module docstring.")
    p.add_argument("--presets", default="tiny,mini", help="comma-separated presets; default %(default)s")
    p.add_argument("--cases", default=",".join(CASES),
                   help="comma-separated: leads128 (real batches, length 128, vocab 30,522), demo64 (length 64, "
                        "the demo's vocab of 8,192); default %(default)s")
    p.add_argument("--precisions", default=None,
                   help="comma-separated: fp32, bf16 (default: both; fp32 alone on a CPU without native bf16)")
    p.add_argument("--batch-size", type=int, default=32, help="default %(default)s")
    p.add_argument("--steps", type=int, default=12, help="timed steps per run; default %(default)s")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps per run; default %(default)s")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="hidden and attention dropout; default %(default)s (the budget recipe's)")
    p.add_argument("--with-bidirectional-ltr", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the bidirectional model on the ltr task (default: on)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads; default %(default)s")
    p.add_argument("--seed", type=int, default=0, help="weights and batches; default %(default)s")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    args = p.parse_args(argv)
    args.presets = [s.strip() for s in args.presets.split(",") if s.strip()]
    args.cases = [s.strip() for s in args.cases.split(",") if s.strip()]
    if args.precisions is not None:
        args.precisions = [s.strip() for s in args.precisions.split(",") if s.strip()]
        if not set(args.precisions) <= set(PRECISIONS):
            p.error(f"--precisions: choose from {', '.join(PRECISIONS)}")
    for c in args.cases:
        if c not in CASES:
            p.error(f"unknown case {c!r}; choose from {', '.join(CASES)}")
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    meta = run_meta()
    meta.update(batch_size=args.batch_size, dropout=args.dropout, target_ltr_over_mlm=TARGET)
    skipped = {} if args.precisions is not None else skipped_precisions()
    if args.precisions is None:
        args.precisions = [p for p in PRECISIONS if p not in skipped]
    print(f"# torch {meta['torch']} ({meta['cpu_capability']}), bertforge {meta['bertforge']}; {meta['threads']} "
          f"thread(s); {meta['nproc']} CPUs: {meta['cpu']}; load average {meta['loadavg_before']}", flush=True)
    for p, why in skipped.items():
        print(f"# {p} skipped: {why}", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="objective-step-") as tmp:
        for case in args.cases:
            for preset in args.presets:
                rows.extend(run_case(preset, case, args, tmp))
    meta.update(wall_s=round(time.perf_counter() - started, 1), loadavg_after=_loadavg())
    print()
    print(format_table(rows))
    print()
    print(f"Fastest step of each run in ms (one optimizer step: forward, backward, clipping, AdamW); before = ltr "
          f"with the encoder on the reference forward; target ltr / mlm <= {TARGET:.2f}; load average before "
          f"{meta['loadavg_before']}, after {meta['loadavg_after']}; wall {meta['wall_s']:.0f} s")
    if args.json:
        write_report(args.json, meta, skipped, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
