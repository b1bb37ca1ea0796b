"""Fine-tuning on real data: movie-review sentence polarity (MR) from all-MiniLM-L6-v2, bertforge vs
transformers. Reports dev accuracy, wall time, and the classic TF-IDF baseline.

Data. These are the Rotten Tomatoes snippets of Pang & Lee (2005) with human valence scores (see
``../shared/DATA.md``), split by `bertforge.resources.movie_review_split` (the demo's split too).
The label is the sign of the score, and the 37 sentences that score exactly 0 are dropped, which
leaves 10,568 sentences. A permutation seeded with ``--split-seed`` (default 2005) splits them
90/10 into 9,511 training and 1,057 dev sentences. Every run uses the same split. The dev split is
the only held-out set, so no choice is made on it: each stack's *final* model (after the last
epoch) is the one scored.

Weights: the real all-MiniLM-L6-v2 checkpoint folder (`bertforge.resources.minilm_folder`). It
has 6 layers, hidden size 384 and the uncased vocab. Both libraries load it with a fresh 2-way
classifier.

Hyper-parameters are the same for both stacks: 3 epochs, batch 32 (the last incomplete batch of
an epoch is dropped, as bertforge's loader does: 297 steps per epoch, 891 in all), peak lr 5e-5
with linear warmup over 10 % of the steps (89) then linear decay to 0, AdamW with betas
(0.9, 0.999), eps 1e-6 (bertforge's default, the TF release's) and weight decay 0.01 except on
biases and LayerNorm, clipping at global norm 1.0, dropout 0.1 (the checkpoint's), max length 64,
batches shuffled every epoch (seeded) and padded to the batch's longest sequence. Both evaluate
on dev at the end of every epoch (3 evaluations), in their training precision.

* **bertforge**: the public API ``bertforge.tasks.finetune.finetune(FinetuneConfig(task="classification",
  ...))`` on the split written as TSV files. It runs with its defaults otherwise: a resumable
  checkpoint every 500 steps and at the end, the final model written to ``model/``. The exception
  is ``keep_best=False``, since choosing the best epoch on dev would select on the test data. A
  sentence longer than 62 WordPieces is truncated, as transformers truncates it (bertforge's
  default, ``long_inputs="truncate"``). There are very few such sentences; the script counts them.
* **transformers**: ``BertForSequenceClassification.from_pretrained`` (its default attention,
  sdpa) and the fast tokenizer of the same folder, truncating at 64. A plain PyTorch loop runs
  ``torch.optim.AdamW(fused=True)`` with the two weight-decay groups,
  ``transformers.get_linear_schedule_with_warmup``, ``clip_grad_norm_(1.0)`` and the same seeded
  per-epoch shuffle (its own permutation, from a ``torch.Generator``). The final model is written
  with ``save_pretrained``, as a Trainer run would.

Precision. bertforge runs the ``--precision`` list (default ``bf16``; give ``fp32,bf16`` for both).
transformers runs ``--hf-precision``. The default, ``auto``, first times a few training steps of
each precision on a throw-away copy of the model, interleaved, and then fine-tunes in the faster
one.

Figures:

* "accuracy" is each final model's dev accuracy, re-evaluated in float32 by its own library. The
  bertforge model is re-read from ``model/`` with ``bertforge.tasks.finetune.evaluate``. This
  re-evaluation is not timed.
* "wall s" is the whole fine-tuning as a user runs it: reading and tokenizing the data, loading
  the weights, training, the per-epoch evaluations and writing the results. It is
  ``finetune()``'s wall time for bertforge. For transformers it is the same work in the loop above.
* "train s" is the optimizer steps alone (batch fetch + step). For bertforge it is the Trainer's
  own clock, the ``time`` of ``metrics.jsonl``.
* The ratio is bertforge's time over transformers' (the target is <= 0.5).

Both stacks run one after the other in one process, with ``torch.set_num_threads(--threads)``.
On a shared machine, load from other jobs can hit one stack more than the other, so the script
records the load average around each run.

Baseline: `bertforge.experiments.baselines.tfidf_logistic_regression` (``pip install
'bertforge[baselines]'``): word unigram and bigram TF-IDF and L2 logistic regression (scikit-learn),
its strength chosen by 5-fold cross-validation inside the *training* split, then refit on all of it.

Run (from the repository root)::

    .venv/bin/python benchmarks/finetune_mr.py --json /tmp/mr/results.json          # full: ~10-30 min on 2 cores
    .venv/bin/python benchmarks/finetune_mr.py --quick                              # smoke run on a subset
    .venv/bin/python benchmarks/finetune_mr.py --precision fp32,bf16 --hf-precision fp32,bf16
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
try:
    import bertforge  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT / "src"))
    import bertforge  # noqa: F401

from bertforge import resources  # noqa: E402
from bertforge.experiments.baselines import tfidf_logistic_regression  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_time import _loadavg, cpu_model  # noqa: E402

NUM_SENTENCES = 10_568  # non-zero scores in the file (DATA.md)
TARGET_ACCURACY = 0.85
TARGET_GAP = 0.005
TARGET_TIME_RATIO = 0.5


# ---------------------------------------------------------------------------- data
def write_tsv(path: Path, texts: list[str], labels: np.ndarray) -> None:
    for t in texts:
        if "\t" in t or "\n" in t or "\r" in t:
            raise ValueError(f"a sentence holds a tab or line break: {t[:60]!r}")
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("text\tlabel\n")
        for t, y in zip(texts, labels):
            f.write(f"{t}\t{int(y)}\n")


# ---------------------------------------------------------------------------- helpers
def autocast(precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loadavg() -> float | None:
    """The 1-minute load average (`step_time._loadavg`'s first figure), or None where there is none."""
    averages = _loadavg()
    return averages[0] if averages else None


def minor_faults() -> int:
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, OSError):
        return 0


def git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# ---------------------------------------------------------------------------- bertforge
def run_bertforge(work: Path, train_tsv: Path, dev_tsv: Path, model_dir: Path, precision: str,
                  args: argparse.Namespace) -> dict[str, Any]:
    from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune

    out = work / f"bertforge-{precision}"
    cfg = FinetuneConfig(task="classification", model=str(model_dir), train_file=str(train_tsv),
                         dev_file=str(dev_tsv), out=str(out), text_column="text", label_column="label",
                         max_seq_length=args.max_length, lr=args.lr, batch_size=args.batch_size,
                         epochs=args.epochs, precision=precision, seed=args.seed, device="cpu",
                         keep_best=False, progress=False)
    load0 = loadavg()
    t0 = time.perf_counter()
    result = finetune(cfg)
    wall = time.perf_counter() - t0
    load1 = loadavg()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    train_lines = [x for x in lines if x["split"] == "train"]
    eval_lines = [x for x in lines if x["split"] == "eval"]
    train_seconds = max(x["time"] for x in train_lines)
    steps = result.train.step
    t0 = time.perf_counter()
    final = evaluate(result.model_dir, file=str(dev_tsv), settings={"device": "cpu"})  # float32, re-read from disk
    eval_seconds = time.perf_counter() - t0
    return {
        "stack": "bertforge", "precision": precision, "accuracy": final["accuracy"],
        "accuracy_in_run": [x.get("accuracy") for x in eval_lines],
        "wall_seconds": wall, "train_seconds": train_seconds, "steps": steps,
        "s_per_step": train_seconds / steps, "final_train_loss": train_lines[-1].get("loss"),
        "fp32_eval_seconds": eval_seconds, "loadavg_before": load0, "loadavg_after": load1,
        "stopped_early": result.train.stopped_early,
    }


# ---------------------------------------------------------------------------- transformers
class HFData:
    """The split tokenized by transformers' fast tokenizer (truncation at max length)."""

    def __init__(self, tok, texts: list[str], labels: np.ndarray, max_length: int):
        enc = tok(texts, truncation=True, max_length=max_length)
        self.ids = [np.asarray(x, dtype=np.int64) for x in enc["input_ids"]]
        self.labels = labels

    def __len__(self) -> int:
        return len(self.ids)

    def collate(self, idx) -> dict[str, torch.Tensor]:
        rows = [self.ids[i] for i in idx]
        T = max(len(r) for r in rows)
        ids = np.zeros((len(rows), T), dtype=np.int64)
        mask = np.zeros((len(rows), T), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
            mask[i, :len(r)] = 1
        return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
                "token_type_ids": torch.zeros_like(torch.from_numpy(ids)),
                "labels": torch.from_numpy(self.labels[np.asarray(idx)])}


class HFLoop:
    """transformers' model, a plain PyTorch fine-tuning loop (module docstring)."""

    def __init__(self, model, precision: str, total_steps: int, args: argparse.Namespace):
        from transformers import get_linear_schedule_with_warmup

        self.model = model
        self.precision = precision
        named = list(model.named_parameters())
        no_decay = [p for n, p in named if n.endswith("bias") or "LayerNorm" in n]
        decay = [p for n, p in named if not (n.endswith("bias") or "LayerNorm" in n)]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                            {"params": no_decay, "weight_decay": 0.0}],
                                           lr=args.lr, betas=(0.9, 0.999), eps=1e-6, fused=True)
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, int(0.1 * total_steps), total_steps)

    def step(self, batch: dict[str, torch.Tensor]) -> float:
        with autocast(self.precision):
            loss = self.model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())


@torch.no_grad()
def hf_accuracy(model, data: HFData, precision: str, batch_size: int = 64) -> float:
    """Dev accuracy, batches of similar lengths (as bertforge's evaluation)."""
    was_training = model.training
    model.eval()
    order = np.argsort([len(x) for x in data.ids], kind="stable")
    correct = 0
    for k in range(0, len(order), batch_size):
        b = data.collate(order[k:k + batch_size])
        labels = b.pop("labels")
        with autocast(precision):
            logits = model(**b).logits
        correct += int((logits.float().argmax(-1) == labels).sum())
    model.train(was_training)
    return correct / len(data)


def hf_epoch_batches(n: int, batch_size: int, gen: torch.Generator) -> list[np.ndarray]:
    perm = torch.randperm(n, generator=gen).numpy()
    return [perm[k:k + batch_size] for k in range(0, n - batch_size + 1, batch_size)]  # drop the last partial


def calibrate_hf(model_dir: Path, train: tuple[list[str], np.ndarray], args: argparse.Namespace,
                 steps: int = 6, warmup: int = 2) -> dict[str, Any]:
    """Median s/step of transformers' loop in fp32 and bf16, interleaved, on a throw-away model."""
    from transformers import BertForSequenceClassification, BertTokenizerFast

    tok = BertTokenizerFast.from_pretrained(str(model_dir))
    data = HFData(tok, train[0][: args.batch_size * (steps + warmup)], train[1], args.max_length)
    torch.manual_seed(args.seed)
    base = BertForSequenceClassification.from_pretrained(str(model_dir), num_labels=2)
    base.train()
    loops = {p: HFLoop(copy.deepcopy(base), p, 1000, args) for p in ("fp32", "bf16")}
    batches = [data.collate(np.arange(k * args.batch_size, (k + 1) * args.batch_size)) for k in range(steps + warmup)]
    times: dict[str, list[float]] = {p: [] for p in loops}
    for k, b in enumerate(batches):
        order = ("fp32", "bf16") if k % 2 == 0 else ("bf16", "fp32")
        for p in order:
            t0 = time.perf_counter()
            loops[p].step(b)
            if k >= warmup:
                times[p].append(time.perf_counter() - t0)
    med = {p: statistics.median(v) for p, v in times.items()}
    return {"median_s_per_step": med, "chosen": min(med, key=med.get), "steps": steps}


def run_transformers(work: Path, train: tuple[list[str], np.ndarray], dev: tuple[list[str], np.ndarray],
                     model_dir: Path, precision: str, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import BertForSequenceClassification, BertTokenizerFast

    load0 = loadavg()
    t_start = time.perf_counter()
    tok = BertTokenizerFast.from_pretrained(str(model_dir))
    train_data = HFData(tok, train[0], train[1], args.max_length)
    dev_data = HFData(tok, dev[0], dev[1], args.max_length)
    steps_per_epoch = len(train_data) // args.batch_size
    total = max(1, math.ceil(args.epochs * steps_per_epoch))
    torch.manual_seed(args.seed)
    model = BertForSequenceClassification.from_pretrained(str(model_dir), num_labels=2)
    model.train()
    loop = HFLoop(model, precision, total, args)
    gen = torch.Generator().manual_seed(args.seed)
    step, train_seconds, in_run, losses = 0, 0.0, [], []
    while step < total:
        for idx in hf_epoch_batches(len(train_data), args.batch_size, gen):
            t0 = time.perf_counter()
            losses.append(loop.step(train_data.collate(idx)))
            train_seconds += time.perf_counter() - t0
            step += 1
            if step % steps_per_epoch == 0 or step == total:
                in_run.append(hf_accuracy(model, dev_data, precision))
            if step == total:
                break
    model.save_pretrained(str(work / f"transformers-{precision}"))
    tok.save_pretrained(str(work / f"transformers-{precision}"))
    wall = time.perf_counter() - t_start
    load1 = loadavg()
    t0 = time.perf_counter()
    acc = hf_accuracy(model, dev_data, "fp32")
    eval_seconds = time.perf_counter() - t0
    return {
        "stack": "transformers", "precision": precision, "accuracy": acc, "accuracy_in_run": in_run,
        "wall_seconds": wall, "train_seconds": train_seconds, "steps": step, "s_per_step": train_seconds / step,
        "final_train_loss": float(np.mean(losses[-20:])), "fp32_eval_seconds": eval_seconds,
        "loadavg_before": load0, "loadavg_after": load1,
    }


def paired_steps(model_dir: Path, train: tuple[list[str], np.ndarray], ours_precision: str, hf_precision: str,
                 args: argparse.Namespace, steps: int, warmup: int = 3, profile: int = 0) -> dict[str, Any]:
    """Per-step time of both stacks on the same batches, interleaved step by step (load hits both alike).

    bertforge: `Trainer.train_step` with `ClassificationObjective` on `EncodedBatches`, the step ``finetune``
    runs; transformers: `HFLoop.step`. Batches come from bertforge's loader (seeded shuffle of the
    training split) and feed both stacks; the first ``warmup`` steps are not timed."""
    from transformers import BertForSequenceClassification

    from bertforge.tasks.finetune import FinetuneConfig
    from bertforge.model.heads import BertForSequenceClassification as OurModel
    from bertforge.tasks.classification import ClassificationObjective, Example, encode_examples
    from bertforge.tasks.encoding import EncodedBatches
    from bertforge.text.tokenizer import BertTokenizer
    from bertforge.train.run import build_trainer

    tok = BertTokenizer.from_pretrained(str(model_dir))
    examples = [Example(t, None, str(int(y)), i + 2) for i, (t, y) in enumerate(zip(*train))]
    encoded = encode_examples(examples, tok, args.max_length).with_labels(train[1])
    batches: list[dict[str, torch.Tensor]] = []
    for b in EncodedBatches(encoded, args.batch_size, seed=args.seed):
        batches.append(b)
        if len(batches) == max(steps, profile) + warmup:
            break
    total = max(1, math.ceil(args.epochs * (len(encoded) // args.batch_size)))
    torch.manual_seed(args.seed)
    ours = OurModel.from_pretrained(str(model_dir), num_labels=2)
    cfg = FinetuneConfig(task="classification", model=str(model_dir), max_steps=total, lr=args.lr,
                         batch_size=args.batch_size, precision=ours_precision, device="cpu", progress=False)
    with tempfile.TemporaryDirectory(prefix="finetune-mr-steps-") as tmp:
        trainer = build_trainer(ours, ClassificationObjective(), None, cfg, tmp)
        torch.manual_seed(args.seed)
        hf = BertForSequenceClassification.from_pretrained(str(model_dir), num_labels=2)
        hf.train()
        loop = HFLoop(hf, hf_precision, total, args)
        runs = {"bertforge": lambda b: trainer.train_step([b]), "transformers": lambda b: loop.step(b)}
        times: dict[str, list[float]] = {k: [] for k in runs}
        faults: dict[str, int] = {k: 0 for k in runs}
        for k, b in enumerate(batches[:steps + warmup]):
            for name in (("bertforge", "transformers") if k % 2 == 0 else ("transformers", "bertforge")):
                f0 = minor_faults()
                t0 = time.perf_counter()
                runs[name](b)
                if k >= warmup:
                    times[name].append(time.perf_counter() - t0)
                    faults[name] += minor_faults() - f0
        profiles = {name: profile_steps(fn, batches[warmup:warmup + profile]) for name, fn in runs.items()} if profile else {}
    ratios = [a / b for a, b in zip(times["bertforge"], times["transformers"])]
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"steps": steps, "bertforge_precision": ours_precision, "transformers_precision": hf_precision,
            "median_s_per_step": med, "min_s_per_step": {k: min(v) for k, v in times.items()},
            "ratio_of_medians": med["bertforge"] / med["transformers"], "median_paired_ratio": statistics.median(ratios),
            "real_tokens_per_step": float(np.mean([float(b["attention_mask"].sum()) for b in batches[warmup:]])),
            "minor_page_faults_per_step": {k: v / max(steps, 1) for k, v in faults.items()},
            "loadavg": loadavg(), "profiles": profiles}


def profile_steps(step, batches: list[dict[str, torch.Tensor]], top: int = 15) -> dict[str, Any]:
    """torch.profiler over ``step`` on ``batches``: the top operators by self CPU time (ms per step, share)
    and the operators on the (vocab, hidden) word-embedding matrix or its gradient."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for b in batches:
            step(b)
    n = len(batches)
    by_op = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in by_op)
    ops = sorted(by_op, key=lambda e: -e.self_cpu_time_total)[:top]
    vocab = [e for e in prof.key_averages(group_by_input_shape=True)
             if e.input_shapes and e.input_shapes[0] and len(e.input_shapes[0]) == 2 and e.input_shapes[0][0] > 20000
             and e.self_cpu_time_total > 0.001 * total]
    return {"steps": n, "self_ms_per_step": total / n / 1e3,
            "top": [{"op": e.key, "ms_per_step": e.self_cpu_time_total / n / 1e3, "share": e.self_cpu_time_total / total,
                     "calls_per_step": e.count / n} for e in ops],
            "vocab_sized": [{"op": e.key, "shapes": str(e.input_shapes)[:80], "ms_per_step": e.self_cpu_time_total / n / 1e3,
                             "share": e.self_cpu_time_total / total} for e in vocab]}


# ---------------------------------------------------------------------------- report
def fmt_table(runs: list[dict[str, Any]], hf_wall: float | None, hf_train: float | None) -> str:
    head = ["stack", "precision", "dev accuracy (fp32 eval)", "accuracy after each epoch (in run)", "steps",
            "train s", "s/step", "wall s", "wall / HF wall", "train / HF train"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in runs:
        in_run = ", ".join(f"{a:.4f}" for a in r.get("accuracy_in_run", []) if a is not None) or "-"
        steps = r.get("steps")
        train = r.get("train_seconds")
        ratio = f"{r['wall_seconds'] / hf_wall:.2f}x" if hf_wall and r["stack"] == "bertforge" else "-"
        tratio = f"{train / hf_train:.2f}x" if hf_train and train and r["stack"] == "bertforge" else "-"
        lines.append("| " + " | ".join([
            r["stack"], r["precision"], f"{r['accuracy']:.4f}", in_run, str(steps) if steps else "-",
            f"{train:.0f}" if train else "-", f"{r['s_per_step']:.3f}" if "s_per_step" in r else "-",
            f"{r['wall_seconds']:.0f}", ratio, tratio]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 960 training and 320 dev sentences")
    ap.add_argument("--precision", default="bf16", help="bertforge precision(s), comma-separated: fp32, bf16")
    ap.add_argument("--hf-precision", default="auto",
                    help="transformers precision(s): auto (time both briefly, run the faster), fp32, bf16, fp32,bf16")
    ap.add_argument("--skip-hf", action="store_true", help="do not run transformers")
    ap.add_argument("--skip-ours", action="store_true", help="do not run bertforge")
    ap.add_argument("--skip-baseline", action="store_true", help="do not run the TF-IDF baseline")
    ap.add_argument("--hf-first", action="store_true", help="run transformers before bertforge")
    ap.add_argument("--seed", type=int, default=42, help="training seed (classifier init, dropout, data order)")
    ap.add_argument("--split-seed", type=int, default=2005, help="seed of the 90/10 split")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads for both stacks")
    ap.add_argument("--epochs", type=float, default=3.0)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--work-dir", default="", help="folder for the TSVs and run folders (default: a temporary one)")
    ap.add_argument("--paired-steps", type=int, default=30,
                    help="after the runs, time this many training steps of both stacks interleaved (0: skip)")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="then profile this many steps of each stack with torch.profiler (top operators)")
    ap.add_argument("--json", default="", help="write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    import transformers

    ours_prec = [p.strip() for p in args.precision.split(",") if p.strip()]
    hf_prec = [p.strip() for p in args.hf_precision.split(",") if p.strip()]
    for p in ours_prec + hf_prec:
        if p not in ("fp32", "bf16", "auto"):
            raise SystemExit(f"unknown precision {p!r}")

    texts, _ = resources.movie_reviews()
    if len(texts) != NUM_SENTENCES:
        print(f"# warning: {len(texts)} non-zero sentences, DATA.md says {NUM_SENTENCES}", flush=True)
    (tr_x, tr_y), (dev_x, dev_y) = resources.movie_review_split(args.split_seed)
    train, dev = (tr_x, np.array(tr_y, dtype=np.int64)), (dev_x, np.array(dev_y, dtype=np.int64))
    if args.quick:
        train, dev = (train[0][:960], train[1][:960]), (dev[0][:320], dev[1][:320])
    model_dir = resources.minilm_folder()

    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "git_head": git_head(),
        "cpu": cpu_model(), "nproc": os.cpu_count(), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "transformers": transformers.__version__, "bertforge": bertforge.__version__,
        "python": platform.python_version(), "loadavg_start": loadavg(),
        "train": len(train[0]), "dev": len(dev[0]), "train_positive": int(train[1].sum()),
        "dev_positive": int(dev[1].sum()), "quick": args.quick,
        "hyper": {"epochs": args.epochs, "lr": args.lr, "batch_size": args.batch_size, "max_length": args.max_length,
                  "seed": args.seed, "split_seed": args.split_seed},
    }
    from bertforge.text.tokenizer import BertTokenizer

    lengths = [len(x) + 2 for x in BertTokenizer.from_pretrained(str(model_dir)).encode_batch_ids(train[0] + dev[0])]
    info["longer_than_max_length"] = int(sum(n > args.max_length for n in lengths))
    info["mean_tokens"] = float(np.mean(lengths))
    print(f"# MR: {info['train']:,} train ({info['train_positive']:,} positive) / {info['dev']:,} dev "
          f"({info['dev_positive']:,} positive); mean {info['mean_tokens']:.1f} tokens, "
          f"{info['longer_than_max_length']} sentences longer than {args.max_length}", flush=True)
    print(f"# {info['cpu']}, {info['nproc']} cores, {info['threads']} threads; torch {info['torch']}, transformers "
          f"{info['transformers']}; {info['date']}; load {info['loadavg_start']}", flush=True)

    runs: list[dict[str, Any]] = []
    results: dict[str, Any] = {"info": info, "runs": runs}

    def save() -> None:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")

    with contextlib.ExitStack() as stack:
        if args.work_dir:
            work = Path(args.work_dir)
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="finetune-mr-")))
        train_tsv, dev_tsv = work / "train.tsv", work / "dev.tsv"
        write_tsv(train_tsv, *train)
        write_tsv(dev_tsv, *dev)

        if not args.skip_baseline:
            got = tfidf_logistic_regression(*train, *dev, seed=args.seed)
            r = {"stack": got.name, "precision": "fp32", "accuracy": got.accuracy, "C": got.settings["C"],
                 "cv_accuracy": got.settings["cv_accuracy"], "wall_seconds": got.seconds}
            print(f"# {got.name}: accuracy {got.accuracy:.4f} (C {got.settings['C']:g} by cross-validation, "
                  f"{got.seconds:.1f} s)", flush=True)
            runs.append(r)
            save()

        def do_hf() -> None:
            precs = hf_prec
            if "auto" in precs:
                cal = calibrate_hf(model_dir, train, args)
                results["hf_calibration"] = cal
                print(f"# transformers calibration (median s/step): "
                      + ", ".join(f"{p} {s:.3f}" for p, s in cal["median_s_per_step"].items())
                      + f" -> {cal['chosen']}", flush=True)
                precs = [cal["chosen"] if p == "auto" else p for p in precs]
            for p in dict.fromkeys(precs):
                r = run_transformers(work, train, dev, model_dir, p, args)
                print(f"# transformers {p}: accuracy {r['accuracy']:.4f}, wall {r['wall_seconds']:.0f} s, "
                      f"train {r['train_seconds']:.0f} s ({r['s_per_step']:.3f} s/step)", flush=True)
                runs.append(r)
                save()

        def do_ours() -> None:
            for p in dict.fromkeys(ours_prec):
                if p == "auto":
                    raise SystemExit("--precision takes fp32 and/or bf16")
                r = run_bertforge(work, train_tsv, dev_tsv, model_dir, p, args)
                if r["stopped_early"]:
                    print(f"# WARNING: bertforge {p} was stopped by a signal at step {r['steps']}: its figures are "
                          "of a partial run", flush=True)
                print(f"# bertforge {p}: accuracy {r['accuracy']:.4f}, wall {r['wall_seconds']:.0f} s, "
                      f"train {r['train_seconds']:.0f} s ({r['s_per_step']:.3f} s/step)", flush=True)
                runs.append(r)
                save()

        order = [do_hf, do_ours] if args.hf_first else [do_ours, do_hf]
        for fn in order:
            if (fn is do_hf and args.skip_hf) or (fn is do_ours and args.skip_ours):
                continue
            fn()

    ours_runs = [r for r in runs if r["stack"] == "bertforge"]
    hf_runs = [r for r in runs if r["stack"] == "transformers"]
    if args.paired_steps and ours_runs and hf_runs:
        fastest_ours = min(ours_runs, key=lambda r: r["s_per_step"])["precision"]
        fastest_hf_p = min(hf_runs, key=lambda r: r["s_per_step"])["precision"]
        ps = paired_steps(model_dir, train, fastest_ours, fastest_hf_p, args, args.paired_steps,
                          profile=args.profile_steps)
        results["paired_steps"] = ps
        save()
    info["loadavg_end"] = loadavg()
    hf_runs = [r for r in runs if r["stack"] == "transformers"]
    fastest_hf = min(hf_runs, key=lambda r: r["wall_seconds"]) if hf_runs else None
    hf_wall = fastest_hf["wall_seconds"] if fastest_hf else None
    hf_train = fastest_hf["train_seconds"] if fastest_hf else None
    print()
    print(fmt_table(runs, hf_wall, hf_train))
    if fastest_hf:
        print(f"\nratios against transformers {fastest_hf['precision']} (its faster run)")
    checks = []
    for r in runs:
        if r["stack"] != "bertforge":
            continue
        ok_acc = r["accuracy"] >= TARGET_ACCURACY
        line = f"bertforge {r['precision']}: accuracy {r['accuracy']:.4f} >= {TARGET_ACCURACY}: {'yes' if ok_acc else 'NO'}"
        if fastest_hf:
            best_hf = max(h["accuracy"] for h in hf_runs)
            gap = best_hf - r["accuracy"]
            ratio = r["wall_seconds"] / hf_wall
            line += (f"; {(r['accuracy'] - best_hf) * 100:+.2f} points against transformers' best ({best_hf:.4f}), "
                     f"target >= -0.5: "
                     f"{'yes' if gap <= TARGET_GAP + 1e-12 else 'NO'}; wall {ratio:.2f}x of transformers', target <= "
                     f"{TARGET_TIME_RATIO}: {'yes' if ratio <= TARGET_TIME_RATIO else 'NO'}")
            r["targets"] = {"accuracy": ok_acc, "gap": gap <= TARGET_GAP + 1e-12, "time": ratio <= TARGET_TIME_RATIO,
                            "time_ratio": ratio, "train_time_ratio": r["train_seconds"] / hf_train}
        checks.append(line)
    print("\n".join(checks))
    if "paired_steps" in results:
        ps = results["paired_steps"]
        med = ps["median_s_per_step"]
        print(f"\ninterleaved steps ({ps['steps']}, bertforge {ps['bertforge_precision']} vs transformers "
              f"{ps['transformers_precision']}, {ps['real_tokens_per_step']:.0f} real tokens/step): median s/step "
              f"bertforge {med['bertforge']:.3f}, transformers {med['transformers']:.3f}; ratio of medians "
              f"{ps['ratio_of_medians']:.2f}x, median paired ratio {ps['median_paired_ratio']:.2f}x; minor page faults "
              f"per step " + ", ".join(f"{k} {v:,.0f}" for k, v in ps["minor_page_faults_per_step"].items()))
        for name, prof in ps.get("profiles", {}).items():
            print(f"\nprofile of {name} ({prof['steps']} steps, {prof['self_ms_per_step']:.1f} ms/step of operator time):")
            for row in prof["top"]:
                print(f"  {row['op']:<40} {row['ms_per_step']:7.2f} ms/step {row['share'] * 100:5.1f}%  "
                      f"({row['calls_per_step']:.0f} calls)")
            for row in prof["vocab_sized"]:
                print(f"  vocab-sized: {row['op']:<28} {row['ms_per_step']:7.2f} ms/step {row['share'] * 100:5.1f}%  "
                      f"{row['shapes']}")
    print(f"\nload average: start {info['loadavg_start']}, end {info['loadavg_end']}")
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
