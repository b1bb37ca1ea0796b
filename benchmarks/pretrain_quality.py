"""Pre-training quality in a fixed wall-clock budget: held-out MLM accuracy, bertforge vs transformers.

Both stacks pre-train the same model (default: the ``mini`` preset, uncased vocab) from the same
initial weights on the same batches, in the same process, for the same training time (``--budget-
minutes`` per stack, default 5), with the same hyper-parameters; then both are evaluated on the
same held-out instances. What differs is how many steps each stack gets through in its budget.

* Data: the Wikipedia leads of `bertforge.resources`, prepared with Google's algorithm by
  `pretrain_throughput.prepared_leads` (MiniLM uncased vocab, length 128, ``dupe_factor`` 1,
  10 shards of 500,000 characters). The last shard (1,288 instances from documents no training
  shard holds) is held out; training batches come from
  `bertforge.data.loader.PretrainingLoader` over the other shards, seeded the same for both.
* bertforge: `bertforge.train.loop.Trainer.train_step` with `bertforge.train.pretrain.PretrainingTask` --
  the step ``bertforge pretrain`` takes -- in its faster precision (``--ours-precision auto``).
* transformers: ``BertForPreTraining`` (sdpa) in a plain loop (`pretrain_throughput.HFLoop`):
  ``torch.optim.AdamW`` (foreach), labels (B, T), ``clip_grad_norm_(1.0)``, in its faster
  precision (``--hf-precision auto``).
* Hyper-parameters, both: batch 32, peak lr 5e-4, AdamW (0.9, 0.999, eps 1e-6), weight decay 0.01
  except biases and LayerNorm, clipping 1.0, dropout 0.1. The schedule decays *by time*: the
  learning-rate factor is a function of the stack's own training time t (budget b): linear warmup
  over the first 10 % of b, then linear decay to 0 at t = b, where the stack stops. So each stack's
  schedule is planned over exactly the steps it reaches, whatever the load does meanwhile. (Each
  library's step-based scheduler is replaced by this one; the optimizer step is unchanged.)
* Precision: a calibration phase first times each stack in each precision for a few steps
  (interleaved, on throw-away copies of the initial weights); "auto" takes the faster one.
* Training interleaves the two stacks step by step, always stepping the one that has used less of
  its budget, so load from other jobs on a shared machine hits both alike. A step's time includes
  fetching its batch.
* Evaluation: eval mode, float32, no gradient, on the first ``--eval-instances`` held-out
  instances (default 1,536; at most the held-out shards' whole batches of 64: 1,280 here) in a
  fixed order, with each library's own forward; MLM accuracy =
  argmax correct at the masked positions / masked positions; also MLM loss and NSP accuracy. The
  initial weights are evaluated by both stacks first, and must agree (checks the two evaluations
  are the same measurement).

Run (from the repository root)::

    .venv/bin/python benchmarks/pretrain_quality.py                        # 5 minutes per stack
    .venv/bin/python benchmarks/pretrain_quality.py --budget-minutes 1 --json /tmp/q.json

Total wall time is about 2 x budget + 3 minutes (calibration, evaluation) on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_throughput import HFLoop, hf_labels, ours_batch, ours_trainer, prepared_leads, run_meta  # noqa: E402
from step_time import _loadavg, build_models  # noqa: E402

from bertforge.data.loader import PretrainingDataset, PretrainingLoader  # noqa: E402
from bertforge.data.prepare import load_manifest  # noqa: E402

PRECISIONS = ("fp32", "bf16")


# ---------------------------------------------------------------------------- stacks
class Stack:
    """One library's training run: its model, its step function, its own loader and clock."""

    def __init__(self, name: str, model, precision: str, loader: PretrainingLoader, budget: float, args,
                 out_dir: str):
        self.name, self.model, self.precision = name, model, precision
        self.loader, self.it = loader, iter(loader)
        self.budget, self.warmup = budget, args.warmup_ratio * budget
        self.step, self.elapsed, self.tokens, self._t0 = 0, 0.0, 0.0, None
        self.losses: list[tuple[int, float, float]] = []  # (step, elapsed s, training loss)
        if name == "ours":
            self.trainer = ours_trainer(model, args.batch_size, precision, out_dir, lr=args.lr)
            optimizer = self.trainer.optimizer
        else:
            self.loop = HFLoop(model, precision, lr=args.lr)
            optimizer = self.loop.optimizer
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: self.lr_factor())
        if name == "ours":
            self.trainer.scheduler = scheduler
        else:
            self.loop.scheduler = scheduler
        model.train()

    def lr_factor(self) -> float:
        """Warmup then linear decay by training time (including the step in progress)."""
        t = self.elapsed + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)
        if t < self.warmup:
            return max(t, 0.01 * self.warmup) / self.warmup
        return max(0.0, (self.budget - t) / max(self.budget - self.warmup, 1e-9))

    def _next(self) -> dict[str, torch.Tensor]:
        try:
            return next(self.it)
        except StopIteration:  # next epoch
            self.it = iter(self.loader)
            return next(self.it)

    def train_step(self) -> float:
        t0 = self._t0 = time.perf_counter()
        b = self._next()
        if self.name == "ours":
            loss_sums, _, counts, _ = self.trainer.train_step([ours_batch(b)])
            loss = sum(v / max(counts[k], 1.0) for k, v in loss_sums.items())
        else:
            b["hf_labels"] = hf_labels(b)
            loss = self.loop.train_step(b)
        dt = time.perf_counter() - t0
        self._t0 = None
        self.step += 1
        self.elapsed += dt
        self.tokens += float(b["attention_mask"].sum())
        self.losses.append((self.step, round(self.elapsed, 2), round(loss, 4)))
        return dt


def calibrate(args, data: Path, train_shards: list[int]) -> dict[str, float]:
    """Median step time (s) of each stack in each precision, interleaved, on throw-away models."""
    _, ours, theirs = build_models(args.preset, 128, args.seed)
    tmp = tempfile.mkdtemp(prefix="pq-calib-")
    stacks = []
    for name, model in (("ours", ours), ("hf", theirs)):
        for p in PRECISIONS:
            loader = PretrainingLoader(PretrainingDataset(data, shards=train_shards), args.batch_size, seed=args.seed)
            stacks.append(Stack(name, model, p, loader, 3600.0, args, tmp))
    times: dict[str, list[float]] = {f"{s.name}-{s.precision}": [] for s in stacks}
    for i in range(1 + args.calib_steps):
        for s in stacks[i % len(stacks):] + stacks[:i % len(stacks)]:
            dt = s.train_step()
            if i >= 1:
                times[f"{s.name}-{s.precision}"].append(dt)
    return {k: statistics.median(v) for k, v in times.items()}


# ---------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(stack: str, model, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Held-out MLM accuracy / loss and NSP accuracy, eval mode, float32."""
    was_training = model.training
    model.eval()
    correct = total = nsp_correct = nsp_total = 0
    loss_sum = 0.0
    for b in batches:
        labels, positions = b["labels"], b["masked_positions"]
        if stack == "ours":
            out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], masked_positions=positions)
            logits = out.prediction_logits  # (B, P, V)
        else:
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                        token_type_ids=b["token_type_ids"])
            full = out.prediction_logits  # (B, T, V)
            logits = full.gather(1, positions.unsqueeze(-1).expand(-1, -1, full.shape[-1]))
        valid = labels != -100
        correct += int(((logits.argmax(-1) == labels) & valid).sum())
        total += int(valid.sum())
        loss_sum += float(torch.nn.functional.cross_entropy(logits[valid].float(), labels[valid], reduction="sum"))
        nsp = b["next_sentence_label"]
        nsp_correct += int((out.seq_relationship_logits.argmax(-1) == nsp).sum())
        nsp_total += nsp.numel()
    model.train(was_training)
    return {"mlm_accuracy": correct / total, "mlm_loss": loss_sum / total, "nsp_accuracy": nsp_correct / nsp_total,
            "masked_positions": total, "instances": nsp_total}


# ---------------------------------------------------------------------------- main
@dataclass
class Result:
    stack: str
    precision: str
    steps: int
    train_seconds: float
    tokens_per_s: float
    calib_step_s: float
    final_train_loss: float
    eval: dict[str, float]
    losses: list = field(default_factory=list)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Held-out MLM accuracy after the same pre-training time: bertforge's "
                                            "Trainer vs a plain transformers loop. See the module docstring.")
    p.add_argument("--budget-minutes", type=float, default=5.0, help="training time per stack; default %(default)s")
    p.add_argument("--preset", default="mini", help="model size; default %(default)s")
    p.add_argument("--batch-size", type=int, default=32, help="default %(default)s")
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate; default %(default)s")
    p.add_argument("--warmup-ratio", type=float, default=0.1, help="warmup share of the time budget; default %(default)s")
    p.add_argument("--ours-precision", choices=("auto", *PRECISIONS), default="auto",
                   help="bertforge's precision (auto: the faster at calibration); default %(default)s")
    p.add_argument("--hf-precision", choices=("auto", *PRECISIONS), default="auto",
                   help="transformers' precision (auto: the faster at calibration); default %(default)s")
    p.add_argument("--calib-steps", type=int, default=3, help="timed calibration steps per run (after 1 warm-up)")
    p.add_argument("--held-out-shards", type=int, default=1, help="last shards held out; default %(default)s")
    p.add_argument("--eval-instances", type=int, default=1536, help="held-out instances evaluated; default %(default)s")
    p.add_argument("--data", default=None, help="a prepared folder (default: the leads, prepared and cached)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--seed", type=int, default=0, help="weights and data order; default %(default)s")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads or torch.get_num_threads())
    started = time.perf_counter()
    meta = {**run_meta(), "settings": vars(args).copy()}
    data = Path(args.data) if args.data else prepared_leads()
    n_shards = len(load_manifest(data)["shards"])
    held_out = list(range(n_shards - args.held_out_shards, n_shards))
    train_shards = [i for i in range(n_shards) if i not in held_out]
    train_set = PretrainingDataset(data, shards=train_shards)
    eval_loader = PretrainingLoader(PretrainingDataset(data, shards=held_out), 64, seed=args.seed)
    eval_batches = []
    for b in eval_loader:
        eval_batches.append(b)
        if len(eval_batches) * 64 >= args.eval_instances:
            break
    print(f"# torch {meta['torch']}, transformers {meta['transformers']}, bertforge {meta['bertforge']}; "
          f"{meta['threads']} threads; {meta['nproc']} CPUs: {meta['cpu']}; load average {meta['loadavg_before']}",
          flush=True)
    print(f"# data {data}: {len(train_set):,} training instances (shards {train_shards[0]}-{train_shards[-1]}), "
          f"{sum(len(b['input_ids']) for b in eval_batches):,} held-out instances evaluated (shards {held_out})",
          flush=True)

    calib = calibrate(args, data, train_shards)
    print("# calibration, median s/step: " + ", ".join(f"{k} {v:.2f}" for k, v in calib.items())
          + f"; load average {_loadavg()}", flush=True)
    budget = args.budget_minutes * 60
    config, ours, theirs = build_models(args.preset, 128, args.seed)
    initial = {"ours": evaluate("ours", ours, eval_batches), "hf": evaluate("hf", theirs, eval_batches)}
    if abs(initial["ours"]["mlm_loss"] - initial["hf"]["mlm_loss"]) > 1e-4 or \
            abs(initial["ours"]["mlm_accuracy"] - initial["hf"]["mlm_accuracy"]) > 1e-3:
        raise SystemExit(f"the two evaluations disagree on the initial weights: {initial}")
    print(f"# initial weights: held-out MLM accuracy {initial['ours']['mlm_accuracy']:.4f} (ours) / "
          f"{initial['hf']['mlm_accuracy']:.4f} (HF), MLM loss {initial['ours']['mlm_loss']:.4f} / "
          f"{initial['hf']['mlm_loss']:.4f}", flush=True)

    tmp = tempfile.mkdtemp(prefix="pq-run-")
    stacks = []
    for name, model, choice in (("ours", ours, args.ours_precision), ("hf", theirs, args.hf_precision)):
        precision = min(PRECISIONS, key=lambda p: calib[f"{name}-{p}"]) if choice == "auto" else choice
        loader = PretrainingLoader(train_set, args.batch_size, seed=args.seed)
        stacks.append(Stack(name, model, precision, loader, budget, args, tmp))
        print(f"# {name}: precision {precision} ({calib[f'{name}-{precision}']:.2f} s/step at calibration)",
              flush=True)
    next_report = 60.0
    while True:
        active = [s for s in stacks if s.elapsed < budget]
        if not active:
            break
        s = min(active, key=lambda s: s.elapsed)
        s.train_step()
        if min(x.elapsed for x in stacks) >= next_report:
            print("#   " + "; ".join(f"{x.name} step {x.step} at {x.elapsed:.0f} s, loss "
                                      f"{x.losses[-1][2]:.3f}" for x in stacks) + f"; load average {_loadavg()}",
                  flush=True)
            next_report += 60.0

    results = []
    for s in stacks:
        ev = evaluate(s.name, s.model, eval_batches)
        tail = [x[2] for x in s.losses[-20:]]
        results.append(Result(
            stack=s.name, precision=s.precision, steps=s.step,
            train_seconds=round(s.elapsed, 1), tokens_per_s=round(s.tokens / s.elapsed, 1), calib_step_s=calib[f"{s.name}-{s.precision}"],
            final_train_loss=round(statistics.mean(tail), 4), eval=ev, losses=s.losses))
    by = {r.stack: r for r in results}
    meta.update(wall_s=round(time.perf_counter() - started, 1), loadavg_after=_loadavg(), calibration=calib,
                initial_eval=initial)
    print()
    head = ["stack", "precision", "steps", "train s", "s/step", "tok/s", "train loss (last 20)",
            "held-out MLM acc", "held-out MLM loss", "held-out NSP acc"]
    print("| " + " | ".join(head) + " |\n|" + "|".join("---" for _ in head) + "|")
    print(f"| initial weights | - | 0 | 0 | - | - | - | {initial['ours']['mlm_accuracy']:.4f} | "
          f"{initial['ours']['mlm_loss']:.3f} | {initial['ours']['nsp_accuracy']:.4f} |")
    for r in results:
        print(f"| {'bertforge' if r.stack == 'ours' else 'transformers'} | {r.precision} | {r.steps} | "
              f" {r.train_seconds:.0f} | {r.train_seconds / r.steps:.2f} | {r.tokens_per_s:,.0f} | {r.final_train_loss:.3f} | "
              f"{r.eval['mlm_accuracy']:.4f} | {r.eval['mlm_loss']:.3f} | {r.eval['nsp_accuracy']:.4f} |")
    higher = by["ours"].eval["mlm_accuracy"] > by["hf"].eval["mlm_accuracy"]
    print(f"\nheld-out MLM accuracy: bertforge {by['ours'].eval['mlm_accuracy']:.4f} vs transformers "
          f"{by['hf'].eval['mlm_accuracy']:.4f} on {by['ours'].eval['masked_positions']:,} masked positions of "
          f"{by['ours'].eval['instances']:,} held-out instances: {'ours is higher' if higher else 'ours is NOT higher'}; "
          f"budget {args.budget_minutes:g} min per stack; load average before {meta['loadavg_before']}, after "
          f"{meta['loadavg_after']}; wall {meta['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
