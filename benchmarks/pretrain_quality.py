"""Time to quality: held-out MLM accuracy and perplexity against minutes of pre-training.

The figure a user pre-training on a budget needs: how many minutes to reach a given masked-LM
accuracy, for

* ``paper``: bertforge at the paper's settings (MLM + NSP, static 15 % masks, batch 256, lr 1e-4,
  AdamW (0.9, 0.999), dropout 0.1), its schedule (1 % warmup, linear decay to 0: the paper's 10,000
  of 1,000,000 steps) laid over the time budget;
* ``budget``: bertforge with ``--recipe budget`` (`bertforge.train.pretrain.RECIPES`), the same
  budget; also at shorter budgets (``--short-budgets``), each a run of its own, since a schedule
  fitted to 10 minutes is not at its best after 3;
* ``transformers``: transformers' ``BertForPreTraining`` (sdpa) in a plain loop at the paper's
  settings, from the same initial weights as ``paper`` on the same batches: ``torch.optim.AdamW``
  (foreach) with transformers' decay exclusions, labels (B, T), ``clip_grad_norm_(1.0)``, the same
  time-laid schedule;
* ``--run NAME:key=value,...``: more bertforge runs, the budget recipe with settings changed (the
  recipe's search): e.g. ``--run mask15:masked_lm_prob=0.15`` or ``--run nsp:objective=mlm+nsp``.

Same corpus, vocab and held-out text as ``bertforge demo``: 95 % of the 10,033 Wikipedia leads plus
the movie-review training sentences (no labels), an 8,192-piece WordPiece vocab learned from them,
instances of 128 tokens prepared with Google's algorithm (NSP pairs, static 15 % masks, dupe_factor
5); the other 5 % of the leads prepared the same way (dupe_factor 1) are the held-out set. A run with
``masked_lm_prob`` re-masks the same instances afresh at every pass (dynamic masking); ``objective
mlm`` ignores the NSP labels. Everything is cached under ``$TMPDIR/bertforge-bench``.

Measurement. Every run trains in one process, interleaved step by step: the run that has used the
smallest share of its budget steps next, so load from other jobs hits all alike. A run's clock counts
its training steps only (batch loading included, evaluation excluded), and its learning rate
follows that clock (`bertforge.train.loop.TrainConfig.budget_minutes`; transformers' run gets the
same function). Every ``--eval-every`` seconds of its clock, and at its end, a run is evaluated on
the same held-out instances (eval mode, float32, no gradient, each library's own forward): MLM
accuracy (argmax at the masked positions) and perplexity (exp of the mean MLM cross-entropy there).
Both libraries evaluate the shared initial weights first and must agree. bertforge trains in the
precision ``--precision auto`` gives (bf16 where the CPU has it natively); transformers in the faster
of fp32 and bf16 at a short calibration (``--hf-precision``).

Run (from the repository root). One process on 2 threads::

    .venv/bin/python benchmarks/pretrain_quality.py --json /tmp/q.json --plot /tmp/q.png   # about 40 minutes

or, as the committed figures were made, one single-threaded process per core (a job on one core then
does not slow the other), merged into one table, JSON and plot::

    taskset -c 0 .venv/bin/python benchmarks/pretrain_quality.py --threads 1 --no-budget --short-budgets '' \
        --json /tmp/paper.json
    taskset -c 1 .venv/bin/python benchmarks/pretrain_quality.py --threads 1 --no-paper --no-transformers \
        --no-budget --short-budgets 3.33,2 --json /tmp/recipe.json
    .venv/bin/python benchmarks/pretrain_quality.py --merge /tmp/paper.json /tmp/recipe.json \
        --json docs/results/pretrain_quality.json --plot docs/images/pretrain_quality.png

Writes the curves (``--plot``), every figure (``--json``), and a table: each run's final accuracy and
perplexity, and the minutes each run needs to reach the paper run's and transformers' final accuracy.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_throughput import WEIGHT_DECAY, HFLoop, bench_cache, hf_labels, run_meta  # noqa: E402
from step_time import _loadavg  # noqa: E402

from bertforge.data.loader import PretrainingDataset, PretrainingLoader  # noqa: E402
from bertforge.data.prepare import PrepareConfig, load_manifest, prepare, special_ids  # noqa: E402
from bertforge.text.tokenizer import BertTokenizer  # noqa: E402
from bertforge.train.run import build_trainer  # noqa: E402
from bertforge.train.precision import native_bf16  # noqa: E402
from bertforge.train.pretrain import PretrainConfig, PretrainingObjective, build_pretraining_model  # noqa: E402

PRECISIONS = ("fp32", "bf16")
DEVICE = torch.device("cpu")


# ---------------------------------------------------------------------------- data
def corpus(cache: Path, vocab_size: int, dupe_factor: int, max_seq_length: int = 128, max_predictions: int = 20,
           heldout_dupe_factor: int = 1, name: str = "quality") -> tuple[Path, Path, Path]:
    """(vocab folder, prepared training folder, prepared held-out folder): the demo's corpus as instances of
    ``max_seq_length`` tokens, built once under ``cache/name-...`` (a held-out set of another dupe_factor is
    added beside the first)."""
    from bertforge import resources
    from bertforge.text.vocab import learn_vocab

    root = cache / (f"{name}-v{vocab_size}-d{dupe_factor}" + (f"-t{max_seq_length}" if max_seq_length != 128 else ""))
    vocab, train = root / "vocab", root / "train"
    held = root / ("heldout" if heldout_dupe_factor == 1 else f"heldout-d{heldout_dupe_factor}")
    if _complete(train) and not _complete(held):  # another held-out dupe_factor than the one built
        prepare([root / "heldout.txt"], held, vocab,
                prepare_config(max_seq_length, max_predictions, heldout_dupe_factor), workers=2, progress=False)
    if all(_complete(p) for p in (train, held)):
        return vocab, train, held
    print(f"# building the corpus, vocab and instances in {root} ...", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    articles = list(resources.iter_wikipedia_leads())
    (mr_train, _), _ = resources.movie_review_split(2005)
    documents = [a for i, a in enumerate(articles) if i % HELDOUT_EVERY]
    documents += [" ".join(mr_train[i:i + 8]) for i in range(0, len(mr_train), 8)]
    write_documents(root / "train.txt", documents)
    write_documents(root / "heldout.txt", articles[::HELDOUT_EVERY])
    learn_vocab([root / "train.txt"], vocab, vocab_size=vocab_size, show_progress=False)
    prepare([root / "train.txt"], train, vocab, prepare_config(max_seq_length, max_predictions, dupe_factor),
            workers=2, progress=False)
    prepare([root / "heldout.txt"], held, vocab, prepare_config(max_seq_length, max_predictions, heldout_dupe_factor),
            workers=2, progress=False)
    return vocab, train, held


HELDOUT_EVERY = 20
"""Every this-many-th lead section is held-out text (`corpus`); the others are training text."""


def write_documents(path: Path, documents: list[str]) -> Path:
    """``documents`` as a text file for `prepare`: one line each, a blank line between them."""
    path.write_text("".join(d.replace("\n", " ") + "\n\n" for d in documents), encoding="utf-8")
    return path


def prepare_config(max_seq_length: int, max_predictions: int, dupe_factor: int) -> PrepareConfig:
    """How `corpus` prepares its text into instances (Google's algorithm, seed 0)."""
    return PrepareConfig(format="text", max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions,
                         seed=0, shard_chars=1_000_000, dupe_factor=dupe_factor)


def _complete(folder: Path) -> bool:
    try:
        return bool(load_manifest(folder).get("complete"))
    except Exception:  # noqa: BLE001 - absent or half-written
        return False


# ---------------------------------------------------------------------------- runs
@dataclass
class Point:
    seconds: float
    step: int
    mlm_accuracy: float
    perplexity: float
    train_loss: float | None = None
    """Mean training loss (MLM, + NSP where trained) of the steps since the previous point."""


@dataclass
class Run:
    """One training run: a stack, its settings, its model and step function, its clock and curve."""

    name: str
    stack: str  # bertforge or transformers
    budget: float  # seconds
    settings: dict[str, Any]
    precision: str = ""
    step: int = 0
    elapsed: float = 0.0
    tokens: float = 0.0
    curve: list[Point] = field(default_factory=list)
    next_eval: float = 0.0
    losses: list[float] = field(default_factory=list)

    def share(self) -> float:
        return self.elapsed / self.budget

    def next_batch(self) -> dict[str, torch.Tensor]:
        """The loader's next batch, into the next epoch when one ends."""
        try:
            return next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            return next(self.it)


class OursRun(Run):
    def __init__(self, name: str, cfg: PretrainConfig, tok: BertTokenizer, data: Path, out: str):
        super().__init__(name, "bertforge", cfg.budget_minutes * 60, settings=_settings(cfg))
        manifest = load_manifest(data)["config"]
        nsp, T = bool(manifest["nsp"]), int(manifest["max_seq_length"])
        self.objective = cfg.resolve_objective(nsp)
        torch.manual_seed(cfg.seed)
        self.model = build_pretraining_model(cfg, tok.vocab_size, nsp, T, self.objective)
        self.task = PretrainingObjective(nsp=self.objective == "mlm+nsp")
        masking = cfg.masking(manifest)
        self.loader = PretrainingLoader(PretrainingDataset(data), cfg.batch_size, seed=cfg.seed,
                                        special=special_ids(tok) if masking else None, masking=masking)
        self.trainer = build_trainer(self.model, self.task, self.loader, cfg, out, tokenizer=tok)
        self.model = self.trainer.model
        self.precision = self.trainer.precision
        self.it = iter(self.loader)

    def train_step(self) -> None:
        t0 = time.perf_counter()
        b = self.next_batch()
        loss_sums, _, counts, _ = self.trainer.train_step([b])
        dt = time.perf_counter() - t0
        self.losses.append(sum(v / max(counts[k], 1.0) for k, v in loss_sums.items()))
        self.trainer.advance_clock(dt)  # the schedule follows it
        self.trainer.step += 1
        self.elapsed, self.step = self.trainer.elapsed, self.trainer.step
        self.tokens += float(b["attention_mask"].sum())

    def forward(self, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.model(b["input_ids"], b["attention_mask"], b["token_type_ids"],
                         masked_positions=b["masked_positions"])
        if hasattr(out, "prediction_logits"):
            return out.prediction_logits, out.seq_relationship_logits
        return out.logits, None


class HFRun(Run):
    """transformers' BertForPreTraining in `pretrain_throughput.HFLoop` (a plain loop), the same settings,
    its schedule replaced by the clock-laid one."""

    def __init__(self, name: str, cfg: PretrainConfig, model: Any, data: Path, precision: str):
        super().__init__(name, "transformers", cfg.budget_minutes * 60, settings=_settings(cfg), precision=precision)
        from bertforge.train.config import BUDGET_WARMUP_SHARE
        from bertforge.train.optim import lr_factor

        if cfg.weight_decay != WEIGHT_DECAY:
            raise SystemExit(f"transformers' loop decays weights by {WEIGHT_DECAY}, the run asks {cfg.weight_decay}")
        self.model = model
        self.loop = HFLoop(model, precision, lr=cfg.lr, eps=cfg.adam_eps, betas=(cfg.adam_beta1, cfg.adam_beta2),
                           max_grad_norm=cfg.max_grad_norm)
        warm = cfg.warmup_ratio if cfg.warmup_ratio is not None else BUDGET_WARMUP_SHARE
        units = 1_000_000  # bertforge's clock resolution
        self.loop.scheduler = torch.optim.lr_scheduler.LambdaLR(self.loop.optimizer, lambda _: lr_factor(
            min(units, int(self.elapsed / self.budget * units)), total_steps=units, warmup_steps=int(warm * units)))
        self.loader = PretrainingLoader(PretrainingDataset(data), cfg.batch_size, seed=cfg.seed)
        self.it = iter(self.loader)
        model.train()

    def train_step(self) -> None:
        t0 = time.perf_counter()
        b = self.next_batch()
        b["hf_labels"] = hf_labels(b)
        self.losses.append(self.loop.train_step(b))
        self.elapsed += time.perf_counter() - t0
        self.step += 1
        self.tokens += float(b["attention_mask"].sum())

    def forward(self, b: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                         token_type_ids=b["token_type_ids"])
        full, positions = out.prediction_logits, b["masked_positions"]
        return full.gather(1, positions.unsqueeze(-1).expand(-1, -1, full.shape[-1])), out.seq_relationship_logits


def _settings(cfg: PretrainConfig) -> dict[str, Any]:
    keys = ("recipe", "model", "objective", "masked_lm_prob", "batch_size", "lr", "adam_beta2", "warmup_ratio",
            "dropout", "budget_minutes", "seed")
    return {k: getattr(cfg, k) for k in keys}


@torch.no_grad()
def evaluate(run: Run, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Held-out MLM accuracy and perplexity at the prepared masks; eval mode, float32."""
    model = run.model
    was = model.training
    model.eval()
    correct = total = 0
    loss = 0.0
    for b in batches:
        logits, _ = run.forward(b)
        valid = b["labels"] != -100
        logits, labels = logits[valid].float(), b["labels"][valid]
        correct += int((logits.argmax(-1) == labels).sum())
        total += int(valid.sum())
        loss += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
    model.train(was)
    return {"mlm_accuracy": correct / total, "perplexity": math.exp(loss / total), "masked_positions": total}


def record(run: Run, batches: list) -> None:
    ev = evaluate(run, batches)
    loss = round(statistics.mean(run.losses), 4) if run.losses else None
    run.losses.clear()
    run.curve.append(Point(round(run.elapsed, 1), run.step, round(ev["mlm_accuracy"], 5), round(ev["perplexity"], 3),
                           loss))


def minutes_to_reach(curve: list[dict[str, Any]], accuracy: float) -> float | None:
    """Training minutes at which a curve first reaches ``accuracy`` (linear between evaluations)."""
    prev = None
    for p in curve:
        if p["mlm_accuracy"] >= accuracy:
            if prev is None or p["mlm_accuracy"] == prev["mlm_accuracy"]:
                return round(p["seconds"] / 60, 3)
            f = (accuracy - prev["mlm_accuracy"]) / (p["mlm_accuracy"] - prev["mlm_accuracy"])
            return round((prev["seconds"] + f * (p["seconds"] - prev["seconds"])) / 60, 3)
        prev = p
    return None


def hf_model_from(ours: torch.nn.Module) -> Any:
    """transformers' BertForPreTraining with ``ours``' config and weights."""
    from transformers import BertConfig as HFBertConfig, BertForPreTraining as HFBertForPreTraining

    config = {k: v for k, v in ours.config.to_dict().items() if k != "bertforge_version"}
    theirs = HFBertForPreTraining(HFBertConfig(**config))
    result = theirs.load_state_dict(ours.state_dict(), strict=False)
    if result.unexpected_keys or set(result.missing_keys) - {"cls.predictions.decoder.weight",
                                                             "cls.predictions.decoder.bias"}:
        raise SystemExit(f"state dict mismatch copying bertforge -> transformers: {result}")
    return theirs


def calibrate_hf(cfg: PretrainConfig, ours: torch.nn.Module, data: Path, steps: int = 2) -> dict[str, float]:
    """Median step seconds of transformers' run in fp32 and (where native) bf16, on a throw-away copy."""
    times = {}
    for p in PRECISIONS if native_bf16(DEVICE) else ("fp32",):
        run = HFRun("calibration", cfg, hf_model_from(ours), data, p)
        took = []
        for _ in range(1 + steps):
            t0 = time.perf_counter()
            run.train_step()
            took.append(time.perf_counter() - t0)
        times[p] = statistics.median(took[1:])
    return times


def parse_overrides(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME:key=value,key=value`` -> (NAME, settings); values read as JSON where they parse."""
    name, _, rest = spec.partition(":")
    out: dict[str, Any] = {}
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return name, out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Held-out MLM accuracy against pre-training minutes: bertforge at the "
                                            "paper's settings and with --recipe budget, and transformers. See the "
                                            "module docstring.")
    p.add_argument("--budget-minutes", type=float, default=10.0, help="each main run's time; default %(default)s")
    p.add_argument("--short-budgets", default="3.33,2",
                   help="budget-recipe runs with these shorter budgets (minutes, comma-separated; '' for none)")
    p.add_argument("--paper-model", default="mini", help="model of the paper-setting runs; default %(default)s")
    p.add_argument("--run", action="append", default=[], metavar="NAME:key=value,...",
                   help="a further bertforge run: the budget recipe with these settings (repeatable)")
    p.add_argument("--no-paper", action="store_true", help="leave out bertforge at the paper's settings")
    p.add_argument("--no-transformers", action="store_true", help="leave out transformers")
    p.add_argument("--no-budget", action="store_true", help="leave out the budget recipe's main run")
    p.add_argument("--hf-precision", choices=("auto", *PRECISIONS), default="auto",
                   help="transformers' precision (auto: the faster at a short calibration)")
    p.add_argument("--precision", default="auto", help="bertforge's precision; default %(default)s")
    p.add_argument("--eval-every", type=float, default=30.0, help="seconds of a run's clock between evaluations")
    p.add_argument("--eval-instances", type=int, default=1024, help="held-out instances evaluated")
    p.add_argument("--seed", type=int, default=0)
    add_shared_flags(p, "runs")
    return p.parse_args(argv)


def add_shared_flags(p: argparse.ArgumentParser, measured: str) -> None:
    """The flags this script and time_to_quality.py share: the corpus (`corpus`), threads and outputs, and
    ``--merge`` of the ``measured`` runs or arms of earlier invocations."""
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--dupe-factor", type=int, default=5, help="static-mask passes prepared (the paper: 10)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--json", metavar="PATH", help="write every figure as JSON")
    p.add_argument("--plot", metavar="PATH", help="draw the curves into this PNG")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help=f"instead of running: one table, JSON and plot of {measured} measured by earlier invocations")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, args)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    meta = {**run_meta(), "settings": vars(args).copy(), "native_bf16": native_bf16(DEVICE)}
    vocab, data, held = corpus(bench_cache(), args.vocab_size, args.dupe_factor)
    tok = BertTokenizer.from_pretrained(vocab)
    eval_batches = []
    for b in PretrainingLoader(PretrainingDataset(held), 64, seed=args.seed):
        eval_batches.append(b)
        if len(eval_batches) * 64 >= args.eval_instances:
            break
    print(f"# torch {meta['torch']}, transformers {meta['transformers']}; {meta['threads']} threads; "
          f"{meta['nproc']} CPUs: {meta['cpu']} (native bf16: {meta['native_bf16']}); load {meta['loadavg_before']}",
          flush=True)
    print(f"# data {data}: {len(PretrainingDataset(data)):,} instances; {sum(len(b['input_ids']) for b in eval_batches)} "
          f"held-out instances evaluated", flush=True)

    tmp = tempfile.mkdtemp(prefix="pq-")
    common = dict(data=str(data), tokenizer=str(vocab), seed=args.seed, progress=False, device="cpu",
                  precision=args.precision)
    runs: list[Run] = []
    paper = PretrainConfig(model=args.paper_model, budget_minutes=args.budget_minutes, **common)
    paper_run = hf_run = None
    if not args.no_paper or not args.no_transformers:
        paper_run = OursRun("bertforge, paper's settings", paper, tok, data, f"{tmp}/paper")
        if not args.no_paper:
            runs.append(paper_run)
    if not args.no_transformers:
        assert paper_run is not None
        theirs = hf_model_from(paper_run.model)  # the same initial weights
        hf_precision = args.hf_precision
        if hf_precision == "auto":
            calib = calibrate_hf(paper, paper_run.model, data)
            meta["hf_calibration_s_per_step"] = calib
            hf_precision = min(calib, key=calib.get)
            print("# transformers calibration, s/step: " + ", ".join(f"{k} {v:.2f}" for k, v in calib.items()),
                  flush=True)
        hf_run = HFRun("transformers, paper's settings", paper, theirs, data, hf_precision)
        runs.append(hf_run)
    budgets = [] if args.no_budget else [args.budget_minutes]
    budgets += [float(x) for x in args.short_budgets.split(",") if x.strip()]
    for minutes in budgets:
        cfg = PretrainConfig.from_recipe("budget", budget_minutes=minutes, **common)
        runs.append(OursRun(f"bertforge, budget recipe, {minutes:g} min", cfg, tok, data, f"{tmp}/budget-{minutes:g}"))
    for spec in args.run:
        name, overrides = parse_overrides(spec)
        overrides.setdefault("budget_minutes", args.budget_minutes)
        cfg = PretrainConfig.from_recipe("budget", **{**common, **overrides})
        runs.append(OursRun(f"bertforge, budget recipe, {name}", cfg, tok, data, f"{tmp}/{name}"))
    if not runs:
        raise SystemExit("no runs left")

    if paper_run is not None and hf_run is not None:
        a, b = evaluate(paper_run, eval_batches), evaluate(hf_run, eval_batches)
        if abs(a["perplexity"] - b["perplexity"]) > 1e-3 * a["perplexity"]:
            raise SystemExit(f"the two libraries' evaluations disagree on the same initial weights: {a} vs {b}")
        meta["initial_eval"] = a
    for r in runs:
        print(f"# {r.name}: precision {r.precision}; {json.dumps(r.settings)}", flush=True)
        record(r, eval_batches)

    next_report = 60.0
    while active := [r for r in runs if r.elapsed < r.budget]:
        r = min(active, key=Run.share)
        r.train_step()
        r.next_eval = r.next_eval or args.eval_every
        if r.elapsed >= r.budget or r.elapsed >= r.next_eval:
            record(r, eval_batches)
            r.next_eval += args.eval_every
        longest = max(runs, key=lambda x: x.budget)
        if longest.elapsed >= next_report:
            print(f"#   {longest.elapsed / 60:.0f} min: " + "; ".join(
                f"{x.name.split(', ', 1)[-1]} step {x.step} acc {x.curve[-1].mlm_accuracy:.3f}" for x in runs)
                  + f"; load {_loadavg()}", flush=True)
            next_report += 60.0

    meta.update(wall_s=round(time.perf_counter() - started, 1), loadavg_after=_loadavg())
    rows = [{"name": r.name, "stack": r.stack, "precision": r.precision, "budget_minutes": r.budget / 60,
             "steps": r.step, "train_seconds": round(r.elapsed, 1),
             "tokens_per_s": round(r.tokens / max(r.elapsed, 1e-9), 1), "settings": r.settings,
             "final": r.curve[-1].__dict__, "curve": [p.__dict__ for p in r.curve]} for r in runs]
    report({"meta": meta, "runs": rows}, args)
    return 0


def report(result: dict[str, Any], args: argparse.Namespace) -> None:
    """Add each run's minutes to reach the paper-setting runs' final accuracies; print the table; write
    the JSON and the plot."""
    rows = result["runs"]
    targets = {r["name"]: r["final"]["mlm_accuracy"] for r in rows if "paper's settings" in r["name"]}
    for row in rows:
        row["minutes_to_reach"] = {t: minutes_to_reach(row["curve"], acc) for t, acc in targets.items()}
    result["targets"] = targets
    head = (["run", "precision", "steps", "tok/s", "held-out MLM acc", "perplexity"]
            + [f"min to {t.split(',')[0]}'s {a:.3f}" for t, a in targets.items()])
    print("\n| " + " | ".join(head) + " |\n|" + "|".join("---" for _ in head) + "|")
    for row in rows:
        reach = [f"{m:.2f}" if m is not None else "not reached" for m in row["minutes_to_reach"].values()]
        print(f"| {row['name']} | {row['precision']} | {row['steps']} | {row['tokens_per_s']:,.0f} | "
              f"{row['final']['mlm_accuracy']:.4f} | {row['final']['perplexity']:.1f} | " + " | ".join(reach) + " |")
    metas = result.get("sources", [result.get("meta", {})])
    for meta in metas:
        print(f"\n{meta.get('command')}: wall {meta.get('wall_s', 0) / 60:.1f} min; load average before "
              f"{meta.get('loadavg_before')}, after {meta.get('loadavg_after')}; {meta.get('threads')} thread(s); CPU "
              f"{meta.get('cpu')}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot:
        plot(rows, Path(args.plot), metas[0])
        print(f"wrote {args.plot}")


def merge(files: list[str], args: argparse.Namespace) -> int:
    """Runs measured side by side in separate processes (e.g. one pinned to each core): one table,
    JSON and plot."""
    parts = [json.loads(Path(f).read_text()) for f in files]
    report({"sources": [p["meta"] for p in parts], "runs": [r for p in parts for r in p["runs"]]}, args)
    return 0


def plot(rows: list[dict], path: Path, meta: dict) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)
    acc_ax, ppl_ax = fig.subplots(1, 2)
    for row in rows:
        xs = [p["seconds"] / 60 for p in row["curve"]]
        style = "--" if row["stack"] == "transformers" else "-"
        acc_ax.plot(xs, [p["mlm_accuracy"] for p in row["curve"]], style, marker=".", label=row["name"])
        ppl_ax.plot(xs, [p["perplexity"] for p in row["curve"]], style, marker=".", label=row["name"])
    acc_ax.set_xlabel("training minutes")
    acc_ax.set_ylabel("held-out MLM accuracy")
    ppl_ax.set_xlabel("training minutes")
    ppl_ax.set_ylabel("held-out MLM perplexity (log)")
    ppl_ax.set_yscale("log")
    for ax in (acc_ax, ppl_ax):
        ax.grid(alpha=0.3)
    acc_ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Pre-training time to quality: {meta['cpu']}, {meta['threads']} thread(s) per run", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
