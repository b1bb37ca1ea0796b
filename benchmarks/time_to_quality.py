"""Time to quality against transformers at its best: minutes of pre-training until held-out MLM accuracy 0.1,
0.2, 0.3, at the tiny and mini presets, with each side's sources of speed separated.

The question a user with a CPU and a deadline asks: how long until a model is as good as X, with bertforge,
and with transformers as its users would run it, given every option its documentation offers a CPU user.
Arms, per preset (``--models``; at mini each name gets `` (mini)``), on the same corpus, vocab and
held-out instances, ``--seeds`` (0, 1, 2) each, 10 minutes of training clock:

* ``bertforge (recipe)``: ``bertforge pretrain --recipe budget`` at the preset (MLM only, 15 % fresh masks
  every pass, dropout 0, lr 2e-3, AdamW (0.9, 0.98), 6 % warmup then linear decay laid over the training
  clock, batch 32; `bertforge.train.pretrain.RECIPES`), ``--precision auto``; driven step by step through
  bertforge's own `bertforge.train.loop.Trainer` (``train_step`` and ``advance_clock``).
* ``bertforge (recipe, dense head)``: the same with the vocabulary projection at every position, as
  transformers' ``BertForMaskedLM`` computes it (`DenseHead`): what the sparse head gives bertforge.
* ``transformers Trainer (best of grid)``: transformers' ``Trainer`` + ``BertForMaskedLM`` +
  ``DataCollatorForLanguageModeling(mlm_probability=0.15)`` as its ``run_mlm.py`` runs them (the Trainer's
  fused AdamW, weight decay 0.01 with its exclusions, linear schedule with warmup over ``max_steps``, clip
  1.0, dropout 0.1, sdpa attention), at the setting chosen below, with the fastest of its speed options.
  ``max_steps`` is what a user sets from a calibrated step time, here 3 % above the budget's steps so that
  the clock ends the run (a run that still ends early reports its lost seconds).
* ``transformers (same recipe)``: the same Trainer, collator and model class at bertforge's recipe exactly
  (dropout 0, batch 32, lr 2e-3, AdamW (0.9, 0.98) and eps 1e-6, bertforge's schedule over the training
  clock as a ``LambdaLR``), with the fastest speed options: this arm and bertforge's differ in the library.
* ``transformers (same recipe, masked positions only)``: that arm with the MLM head run at the masked
  positions only (`masked_only_model`): what the sparse head alone would give transformers.

How transformers' setting is chosen, on the selection half only (every stage a set of jobs, below):

1. **speed options**: for each preset at batch 32, each combination of fp32 / bf16 (where the CPU has
   native bf16), ``torch_compile`` off / on and the collator's ``pad_to_multiple_of`` none / 8 / 64 is
   timed (``--calibration-steps`` steps after 2 of warm-up, 6 with compile); the fastest is kept for every
   transformers run of that preset (an option that fails to run is reported, not chosen);
2. **grid**: batch 8 / 16 / 32 / 64 x learning rate 5e-4 / 1e-3 / 2e-3 / 3e-3 / 5e-3, warmup 6 %, 3
   minutes each, seed 0;
3. **top points**: the grid's 3 best by final selection-half accuracy, and the best with warmup 0 and 15 %,
   each for the full 10 minutes with seeds 0 and 1; the best mean final selection accuracy is the arm's.

Every process applies the same allocator setting to both libraries (glibc keeps freed memory,
`bertforge.fast.allocator.keep_freed_memory`), which bertforge's trainer would otherwise apply to itself.

Corpus (``bertforge demo``'s): 95 % of the 10,033 Wikipedia lead sections plus the movie-review training
sentences without labels (8 to a document), an 8,192-piece WordPiece vocab learned from them, instances of
64 tokens prepared with Google's algorithm (sentence pairs, static masks that both libraries undo and mask
afresh, dupe_factor 5). The other 5 % of the leads are held out, split by document: the even-numbered
documents are the **selection** half (choosing transformers' setting), the odd ones the **report** half
(every reported number), each prepared on its own with Google's static masks (about 580 instances and
5,500 masked positions each). Built once, cached under ``$TMPDIR/bertforge-bench``.

Evaluation: each library's own model, eval mode, float32, no gradient: MLM accuracy (argmax at the static
masked positions) and perplexity, at clock 0, every 5 s in the first minute, every 30 s after, and at the end.
The clock counts training only (steps, batch loading and masking; a compiled model's first steps, which
compile, included); evaluations pause it. The minutes to a level are where a seed's curve first reaches it,
linear between evaluations; an arm's figure is the mean over its seeds with their range and a 95 % interval.
The bertforge (recipe) and Trainer arms keep their seed-0 models at 1, 2, 5 and 10 minutes (``checkpoints/``
in the folder) for fine-tuning.

Resumable, in a folder (``--work``): each job leaves ``jobs/ID.json`` when done, so rerunning the command
continues where a stopped run left off (a half-done job starts afresh); several workers share the folder, each
taking the next job whose inputs are measured. As the committed figures are made: one single-threaded worker
pinned to each core, nothing else running on the machine, then the report::

    .venv/bin/python -m pip install -e '.[bench]'                     # transformers' Trainer needs accelerate
    .venv/bin/python benchmarks/time_to_quality.py --corpus-only
    for c in 0 1; do taskset -c $c .venv/bin/python benchmarks/time_to_quality.py --threads 1 \\
        --work runs/time-to-quality & done; wait                      # about 6.5 hours on 2 cores
    .venv/bin/python benchmarks/time_to_quality.py --report --work runs/time-to-quality \\
        --json docs/results/time_to_quality.json --plot docs/images/time_to_quality.png

``--scale 0.02 --eval-instances 64`` runs the whole plan in minutes, as a smoke test.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_quality import (HELDOUT_EVERY, _complete, add_shared_flags, corpus as quality_corpus,  # noqa: E402
                             minutes_to_reach, prepare_config, write_documents)
from pretrain_throughput import bench_cache, run_meta  # noqa: E402
from step_time import _loadavg  # noqa: E402

from bertforge.data.instances import InstanceBatch  # noqa: E402
from bertforge.data.loader import IGNORE_INDEX, PretrainingDataset, PretrainingLoader  # noqa: E402
from bertforge.data.prepare import load_manifest, special_ids  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.stats import mean_interval  # noqa: E402
from bertforge.text.tokenizer import BertTokenizer  # noqa: E402
from bertforge.train.optim import lr_factor  # noqa: E402
from bertforge.train.precision import native_bf16  # noqa: E402
from bertforge.train.pretrain import PretrainConfig, PretrainingObjective, build_pretraining_model  # noqa: E402
from bertforge.train.run import build_trainer  # noqa: E402

OURS, TRAINER, SAME = "bertforge (recipe)", "transformers Trainer (best of grid)", "transformers (same recipe)"
LEVELS = (0.1, 0.2, 0.3)
FIRST_MINUTE_EVERY, LATER_EVERY = 5, 30
"""Seconds of training clock between evaluations: in the first minute, and after it."""
MAX_SEQ_LENGTH, MAX_PREDICTIONS = 64, 10
EVAL_BATCH = 128
CLOCK_UNITS = 1_000_000  # the clock-laid schedule's resolution, as bertforge's
DEVICE = torch.device("cpu")


# ---------------------------------------------------------------------------- data
def corpus(cache: Path, vocab_size: int, dupe_factor: int, heldout_dupe_factor: int = 1) -> tuple[Path, Path, Path]:
    """(vocab folder, prepared training folder, prepared held-out folder): the demo's corpus at 64 tokens,
    built once (`pretrain_quality.corpus`)."""
    return quality_corpus(cache, vocab_size, dupe_factor, MAX_SEQ_LENGTH, MAX_PREDICTIONS, heldout_dupe_factor,
                          name="ttq")


@dataclass
class EvalSet:
    """Held-out batches with their static masks: one half of the held-out instances."""

    name: str
    batches: list[dict[str, torch.Tensor]]
    instances: int
    positions: int

    def describe(self) -> dict[str, int]:
        return {"instances": self.instances, "masked_positions": self.positions}


    @classmethod
    def of(cls, folder: Path, name: str, limit: int = 0) -> EvalSet:
        """A prepared held-out folder's instances in prepared order (its first ``limit`` if given), in batches
        of `EVAL_BATCH`."""
        dataset = PretrainingDataset(folder)
        collate = PretrainingLoader(dataset, 1).collate
        part = [dataset.shard(s).instance(i) for s in range(len(dataset.shards)) for i in range(len(dataset.shard(s)))]
        part = part[:limit] if limit else part
        batches = [collate(part[i:i + EVAL_BATCH]) for i in range(0, len(part), EVAL_BATCH)]
        positions = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
        return cls(name, batches, len(part), positions)


def heldout_corpus(args: argparse.Namespace) -> tuple[Path, Path, tuple[Path, Path]]:
    """(vocab, prepared training folder, (selection, report)): the cached corpus (`corpus`), and its held-out
    documents (every 20th lead section, none in the training text) split by document, the even-numbered ones
    for choosing settings and the odd ones for every reported number, each prepared on its own (dupe_factor 1,
    Google's static masks; a NotNext pair draws its second segment from its own half)."""
    from bertforge import resources
    from bertforge.data.prepare import prepare

    vocab, data, _ = corpus(bench_cache(), args.vocab_size, args.dupe_factor)
    root = vocab.parent
    folders = (root / "heldout-selection", root / "heldout-report")
    if not all(_complete(f) for f in folders):
        held = list(resources.iter_wikipedia_leads())[::HELDOUT_EVERY]  # `pretrain_quality.corpus`'s held-out text
        for folder, docs in zip(folders, (held[0::2], held[1::2])):
            text = write_documents(folder.with_suffix(".txt"), docs)
            prepare([text], folder, vocab, prepare_config(MAX_SEQ_LENGTH, MAX_PREDICTIONS, 1), workers=1,
                    progress=False)
    return vocab, data, folders


def unmasked_ids(batch: InstanceBatch) -> np.ndarray:
    """The instances' token ids with their static masks undone: each label written back at its position."""
    ids = batch.input_ids.astype(np.int64)
    owner = np.repeat(np.arange(len(batch)), np.diff(batch.mask_offsets))  # the instance of each prediction
    ids[batch.offsets[:-1][owner] + batch.masked_positions.astype(np.int64)] = batch.masked_labels
    return ids


class UnmaskedInstances(torch.utils.data.Dataset):
    """The prepared training instances, unmasked, as a transformers user's tokenized examples: ``input_ids``
    ([CLS] A [SEP] B [SEP]), ``token_type_ids`` and ``attention_mask``, which the collator pads and masks."""

    def __init__(self, folder: Path):
        dataset = PretrainingDataset(folder)
        ids, lengths, num_a = [], [], []
        for s in range(len(dataset.shards)):
            shard = dataset.shard(s)
            ids.append(unmasked_ids(shard))
            lengths.append(shard.lengths())
            num_a.append(shard.num_a.astype(np.int64))
        self.ids = np.concatenate(ids)
        self.offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths))])
        self.num_a = np.concatenate(num_a)

    def __len__(self) -> int:
        return len(self.num_a)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        ids = self.ids[self.offsets[i]:self.offsets[i + 1]].tolist()
        a = int(self.num_a[i])
        return {"input_ids": ids, "token_type_ids": [0] * a + [1] * (len(ids) - a), "attention_mask": [1] * len(ids)}


# ---------------------------------------------------------------------------- clock and evaluation
def next_eval_time(seconds: float) -> float:
    """The first scheduled evaluation after ``seconds`` of clock: every `FIRST_MINUTE_EVERY` s up to a minute,
    then every `LATER_EVERY` s."""
    if seconds < 60:
        return float((math.floor(seconds / FIRST_MINUTE_EVERY) + 1) * FIRST_MINUTE_EVERY)
    return float(60 + (math.floor((seconds - 60) / LATER_EVERY) + 1) * LATER_EVERY)


def eval_times(budget: float) -> list[float]:
    """The nominal evaluation times of a run of ``budget`` seconds: 0, the schedule, and the end."""
    times = [0.0]
    while (t := next_eval_time(times[-1])) < budget:
        times.append(t)
    return times + [float(budget)]


class Clock:
    """Training seconds: counts between `resume` and `pause`."""

    def __init__(self) -> None:
        self.elapsed = 0.0
        self._since: float | None = None

    def resume(self) -> None:
        self._since = time.perf_counter()

    def pause(self) -> None:
        if self._since is not None:
            self.elapsed += time.perf_counter() - self._since
            self._since = None

    def now(self) -> float:
        return self.elapsed + (time.perf_counter() - self._since if self._since is not None else 0.0)


Logits = Callable[[torch.nn.Module, dict[str, torch.Tensor], torch.Tensor], torch.Tensor]


def ours_logits(model: torch.nn.Module, b: dict[str, torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    """bertforge's MLM logits (M, V) at the batch's filled prediction slots."""
    return model(b["input_ids"], b["attention_mask"], b["token_type_ids"], masked_positions=b["masked_positions"],
                 prediction_mask=valid).logits


def hf_logits(model: torch.nn.Module, b: dict[str, torch.Tensor], valid: torch.Tensor) -> torch.Tensor:
    """transformers' MLM logits (M, V) at the filled prediction slots: its encoder, then its MLM head there."""
    hidden = model.bert(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                        token_type_ids=b["token_type_ids"]).last_hidden_state
    at = hidden.gather(1, b["masked_positions"].unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
    return model.cls(at[valid])


def check_hf_logits(model: torch.nn.Module, b: dict[str, torch.Tensor]) -> float:
    """The largest difference between `hf_logits` and the full forward's logits at the same positions."""
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        valid = b["labels"] != IGNORE_INDEX
        full = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                     token_type_ids=b["token_type_ids"]).logits
        ref = full.gather(1, b["masked_positions"].unsqueeze(-1).expand(-1, -1, full.shape[-1]))[valid]
        diff = float((hf_logits(model, b, valid) - ref).abs().max())
    model.train()
    if diff > 1e-4:
        raise SystemExit(f"transformers' encoder + MLM head at the masked positions differ from its forward by {diff}")
    return diff


@torch.no_grad()
def evaluate(model: torch.nn.Module, logits: Logits, evalset: EvalSet) -> dict[str, float]:
    """MLM accuracy and perplexity at the static masks; eval mode, float32."""
    was = model.training
    model.eval()
    correct = total = 0
    loss = 0.0
    with torch.autocast("cpu", enabled=False):
        for b in evalset.batches:
            valid = b["labels"] != IGNORE_INDEX
            out, labels = logits(model, b, valid).float(), b["labels"][valid]
            correct += int((out.argmax(-1) == labels).sum())
            total += int(valid.sum())
            loss += float(torch.nn.functional.cross_entropy(out, labels, reduction="sum"))
    model.train(was)
    if total != evalset.positions:
        raise SystemExit(f"{evalset.name} half: evaluated {total} masked positions, it has {evalset.positions}")
    return {"mlm_accuracy": correct / total, "perplexity": math.exp(loss / total)}


class Recorder:
    """A run's curve: evaluations on the schedule of `next_eval_time`, each a point."""

    def __init__(self, name: str, model: torch.nn.Module, logits: Logits, report: EvalSet,
                 selection: EvalSet | None, budget: float, checkpoints: Path | None = None,
                 save: Callable[[Path], None] | None = None):
        self.name, self.model, self.logits = name, model, logits
        self.report, self.selection, self.budget = report, selection, budget
        self.checkpoints, self.save = checkpoints, save
        self.keep = [m * 60 * budget / 600 for m in CHECKPOINT_MINUTES] if checkpoints is not None else []
        self.saved: list[dict[str, Any]] = []
        self.points: list[dict[str, Any]] = []
        self.due = 0.0
        self.eval_seconds = 0.0

    def record(self, seconds: float, step: int, lr: float) -> None:
        t0 = time.perf_counter()
        ev = evaluate(self.model, self.logits, self.report)
        point = {"seconds": round(seconds, 2), "step": step, "lr": float(f"{lr:.4g}"),
                 "mlm_accuracy": round(ev["mlm_accuracy"], 5), "perplexity": round(ev["perplexity"], 3)}
        if self.selection is not None:
            point["selection_accuracy"] = round(evaluate(self.model, self.logits, self.selection)["mlm_accuracy"], 5)
        self.points.append(point)
        self.due = next_eval_time(seconds)
        while self.keep and self.save is not None and (seconds >= self.keep[0] - 0.5 or seconds >= self.budget):
            minutes = CHECKPOINT_MINUTES[len(self.saved)]  # nominal: the first evaluation at or after it
            folder = self.checkpoints / f"{minutes:g}min"
            self.save(folder)
            self.saved.append({"minutes": minutes, "seconds": point["seconds"], "step": step, "folder": str(folder),
                               "mlm_accuracy": point["mlm_accuracy"]})
            self.keep.pop(0)
        self.eval_seconds += time.perf_counter() - t0


# ---------------------------------------------------------------------------- bertforge
def ours_run(args: argparse.Namespace, seed: int, tok: BertTokenizer, vocab: Path, data: Path, report: EvalSet,
             out: str, model: str = "tiny", minutes: float = 10.0, dense: bool = False,
             checkpoints: Path | None = None) -> dict[str, Any]:
    """bertforge's budget recipe at the ``model`` preset for ``minutes``, step by step through its Trainer;
    ``dense``: its vocabulary projection at every position (`DenseHead`), an ablation."""
    budget = minutes * 60
    cfg = PretrainConfig.from_recipe("budget", budget_minutes=minutes, data=str(data), tokenizer=str(vocab),
                                     model=model, seed=seed, progress=False, device="cpu", precision=args.precision,
                                     out=out)
    manifest = load_manifest(data)["config"]
    objective = cfg.resolve_objective(bool(manifest["nsp"]))
    torch.manual_seed(cfg.seed)  # as the recipe builds it (`bertforge.train.run.TrainingRun.run`)
    net = build_pretraining_model(cfg, tok.vocab_size, bool(manifest["nsp"]), int(manifest["max_seq_length"]),
                                  objective)
    loader = PretrainingLoader(PretrainingDataset(data), cfg.batch_size, seed=cfg.seed, special=special_ids(tok),
                               masking=cfg.masking(manifest))
    head = (DenseHead if dense else PretrainingObjective)(nsp=objective == "mlm+nsp")
    trainer = build_trainer(net, head, loader, cfg, out, tokenizer=tok)

    def save(folder: Path) -> None:
        from bertforge.model.checkpoint import save_pretrained

        save_pretrained(trainer.model, folder, tokenizer=tok)

    rec = Recorder(DENSE if dense else OURS, trainer.model, ours_logits, report, None, budget, checkpoints, save)
    lr = lambda: trainer.optimizer.param_groups[0]["lr"]  # noqa: E731 - the next step's rate
    rec.record(0.0, 0, lr())
    it = iter(loader)
    started = time.perf_counter()
    while not trainer.budget_spent():
        t0 = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:  # the next epoch
            it = iter(loader)
            b = next(it)
        trainer.train_step([b])
        trainer.advance_clock(time.perf_counter() - t0)  # the schedule follows it
        trainer.step += 1
        if trainer.elapsed >= rec.due and not trainer.budget_spent():
            rec.record(trainer.elapsed, trainer.step, lr())
    rec.record(trainer.elapsed, trainer.step, lr())
    settings = {k: getattr(cfg, k) for k in ("recipe", "model", "objective", "masked_lm_prob", "batch_size", "lr",
                                              "adam_beta1", "adam_beta2", "adam_eps", "weight_decay", "warmup_ratio",
                                              "dropout", "max_grad_norm", "budget_minutes")}
    return {"settings": {**settings, "objective": objective, "schedule": "linear over the training clock",
                         "mlm_head": "every position" if dense else "the masked positions only"},
            "precision": trainer.precision, "points": rec.points, "steps": trainer.step,
            "train_seconds": round(trainer.elapsed, 2), "eval_seconds": round(rec.eval_seconds, 1),
            "wall_seconds": round(time.perf_counter() - started, 1), "stopped_by": "budget", "checkpoints": rec.saved}


class DenseHead(PretrainingObjective):
    """bertforge's objective with the vocabulary projection at every position, as transformers' BertForMaskedLM
    computes it (the encoder's last layer at every position too), the loss at the masked ones: what the sparse
    head alone gives bertforge's step."""

    def forward(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        from bertforge.model import losses

        filled = batch["labels"] != IGNORE_INDEX
        out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        every = out.prediction_logits if self.nsp else out.logits  # (B, T, V)
        at = every.gather(1, batch["masked_positions"].long().unsqueeze(-1).expand(-1, -1, every.shape[-1]))
        logits, labels = at[filled].float(), batch["labels"][filled]
        terms = {"mlm": losses.masked_lm_loss(logits, labels, reduction="sum")}
        stats = {"mlm_correct": (logits.argmax(-1) == labels).sum()}
        if self.nsp:
            raise SystemExit("the dense-head ablation runs the MLM-only recipe")
        return terms, stats


# ---------------------------------------------------------------------------- transformers
@dataclass(frozen=True)
class HFSetting:
    """A transformers run's settings: the model preset, batch and learning rate, and what the recipe changes."""

    model: str
    batch_size: int
    lr: float
    dropout: float = 0.1  # transformers' default
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    clock_schedule: bool = False
    """bertforge's schedule laid over the training clock (else the Trainer's linear one over max_steps)."""
    precision: str = "fp32"  # fp32, or bf16 (``bf16=True``) where the CPU computes it natively
    torch_compile: bool = False  # TrainingArguments(torch_compile=True)
    pad_to_multiple_of: int = 0  # the collator's (0: pad to each batch's longest)
    masked_only: bool = False  # the MLM head at the masked positions only (`masked_only_model`), an ablation

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "optimizer": "Trainer's AdamW (adamw_torch_fused), transformers' decay exclusions",
                "schedule": "linear over the training clock (bertforge's lr_factor)" if self.clock_schedule
                else "Trainer's linear with warmup over max_steps"}


def same_recipe_setting() -> HFSetting:
    """bertforge's budget recipe in transformers' terms."""
    cfg = PretrainConfig.from_recipe("budget")
    return HFSetting(model=cfg.model, batch_size=cfg.batch_size, lr=cfg.lr, dropout=cfg.dropout,
                     adam_beta2=cfg.adam_beta2, adam_eps=cfg.adam_eps, warmup_ratio=cfg.warmup_ratio,
                     weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm, clock_schedule=True)


def hf_model(setting: HFSetting, vocab_size: int, seed: int) -> Any:
    """transformers' BertForMaskedLM of bertforge's preset size, initialised under ``seed`` (as run_mlm.py: set_seed,
    then the model)."""
    import transformers

    config = BertConfig.preset(setting.model, vocab_size=vocab_size, hidden_dropout_prob=setting.dropout,
                               attention_probs_dropout_prob=setting.dropout).to_dict()
    config.pop("bertforge_version")
    transformers.set_seed(seed)
    cls = masked_only_model() if setting.masked_only else transformers.BertForMaskedLM
    return cls(transformers.BertConfig(**config))


@functools.cache
def masked_only_model() -> type:
    """transformers' BertForMaskedLM with its MLM head (the vocabulary projection) run at the masked positions
    only, as bertforge's: what that alone gives transformers' step."""
    import transformers
    from transformers.modeling_outputs import MaskedLMOutput

    class BertForMaskedLMAtMasks(transformers.BertForMaskedLM):
        def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs):
            if labels is None:  # no masks to read: every position, as its parent
                return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                                       token_type_ids=token_type_ids, **kwargs)
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            at = labels != IGNORE_INDEX
            logits = self.cls(hidden[at])  # (M, V)
            loss = torch.nn.functional.cross_entropy(logits.float(), labels[at])
            return MaskedLMOutput(loss=loss, logits=logits)

    return BertForMaskedLMAtMasks


class HFData:
    """What every transformers run shares: the tokenizer the collator needs and the training examples."""

    def __init__(self, vocab: Path, data: Path):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(vocab))
        self.train = UnmaskedInstances(data)


def training_arguments(setting: HFSetting, seed: int, max_steps: int, out: str) -> Any:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=out, per_device_train_batch_size=setting.batch_size, max_steps=max_steps,
        learning_rate=setting.lr, warmup_steps=setting.warmup_ratio,  # transformers 5: a float below 1 is a ratio
        lr_scheduler_type="linear", weight_decay=setting.weight_decay, adam_beta1=0.9, adam_beta2=setting.adam_beta2,
        adam_epsilon=setting.adam_eps, max_grad_norm=setting.max_grad_norm, bf16=setting.precision == "bf16",
        use_cpu=True, torch_compile=setting.torch_compile, dataloader_num_workers=0, seed=seed, save_strategy="no",
        report_to="none", disable_tqdm=True)


def hf_trainer(setting: HFSetting, seed: int, max_steps: int, hf: HFData, model: Any, out: str, callback: Any,
               clock: Clock | None = None, budget: float = 0.0) -> Any:
    """transformers' Trainer for ``setting``; with ``setting.clock_schedule`` its scheduler is a LambdaLR of
    bertforge's schedule at ``clock`` over ``budget`` seconds."""
    from transformers import DataCollatorForLanguageModeling, PrinterCallback
    from transformers import Trainer as HFTrainer

    collator = DataCollatorForLanguageModeling(hf.tokenizer, mlm=True, mlm_probability=0.15,
                                               pad_to_multiple_of=setting.pad_to_multiple_of or None)
    trainer = HFTrainer(model=model, args=training_arguments(setting, seed, max_steps, out),
                        train_dataset=hf.train, data_collator=collator, callbacks=[callback])
    trainer.remove_callback(PrinterCallback)  # the log lines, printed with disable_tqdm
    if setting.clock_schedule:
        assert clock is not None and budget > 0
        warm = int(setting.warmup_ratio * CLOCK_UNITS)
        optimizer = trainer.create_optimizer()  # the Trainer's AdamW from the arguments, its exclusions
        trainer.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: lr_factor(
            min(CLOCK_UNITS, int(clock.now() / budget * CLOCK_UNITS)), total_steps=CLOCK_UNITS, warmup_steps=warm))
    return trainer


def _callback_class() -> type:
    from transformers import TrainerCallback

    class BudgetCallback(TrainerCallback):
        """The run's training clock (paused while it evaluates), its evaluations, and the stop at the budget."""

        def __init__(self, rec: Recorder | None, clock: Clock, budget: float, threads: int):
            self.rec, self.clock, self.budget, self.threads = rec, clock, budget, threads
            self.stopped_by = "max_steps"
            self.step_ends: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            if torch.get_num_threads() != self.threads:
                print(f"# transformers changed the thread count to {torch.get_num_threads()}; back to {self.threads}",
                      flush=True)
                torch.set_num_threads(self.threads)
            if self.rec is not None:
                self.rec.record(0.0, 0, kwargs["optimizer"].param_groups[0]["lr"])
            self.clock.resume()

        def on_step_end(self, args, state, control, **kwargs):
            self.clock.pause()
            self.step_ends.append(self.clock.elapsed)
            end = self.clock.elapsed >= self.budget > 0 or state.global_step >= state.max_steps
            if end and self.clock.elapsed >= self.budget > 0:
                self.stopped_by = "budget"
                control.should_training_stop = True
            if self.rec is not None and (end or self.clock.elapsed >= self.rec.due):
                self.rec.record(self.clock.elapsed, state.global_step, kwargs["optimizer"].param_groups[0]["lr"])
            if not end:  # the clock stops with the last step: what the Trainer does after it is not training
                self.clock.resume()

        def on_train_end(self, args, state, control, **kwargs):
            self.clock.pause()

    return BudgetCallback


def calibrate(setting: HFSetting, hf: HFData, threads: int, steps: int, warmup: int = 2) -> float:
    """Seconds per training step of ``setting`` (batch loading included): ``steps`` steps after ``warmup``, on a
    throw-away model, as a user would time them before choosing max_steps."""
    clock = Clock()
    callback = _callback_class()(None, clock, 0.0, threads)
    model = hf_model(setting, len(hf.tokenizer), 0)
    with tempfile.TemporaryDirectory(prefix="ttq-cal-") as out:
        trainer = hf_trainer(setting, 0, warmup + steps, hf, model, out, callback)
        trainer.train()
    ends = callback.step_ends
    return (ends[-1] - ends[warmup - 1]) / (len(ends) - warmup)


def hf_run(name: str, setting: HFSetting, seed: int, minutes: float, hf: HFData, report: EvalSet,
           selection: EvalSet | None, args: argparse.Namespace, checkpoints: Path | None = None,
           tokenizer_folder: Path | None = None) -> dict[str, Any]:
    """One transformers run of ``minutes`` of training clock. With the Trainer's own schedule, ``max_steps`` is
    what a user sets: the budget over a calibrated step time, here 3 % more so that the clock, not max_steps,
    ends the run (the schedule then ends at about 3 % of its rate); a run that still ends early reports the
    seconds it lost."""
    budget = minutes * 60
    threads = args.threads or torch.get_num_threads()
    step_seconds = None
    if setting.clock_schedule:
        max_steps = 10 ** 9  # the clock ends it; max_steps only caps
    else:
        step_seconds = calibrate(setting, hf, threads, args.calibration_steps, 6 if setting.torch_compile else 2)
        max_steps = max(1, math.ceil(1.03 * budget / step_seconds))
    clock = Clock()
    model = hf_model(setting, len(hf.tokenizer), seed)
    check_hf_logits(model, report.batches[0])
    def save(folder: Path) -> None:  # a transformers folder, which bertforge reads as it is
        model.save_pretrained(folder)
        hf.tokenizer.save_pretrained(folder)

    rec = Recorder(name, model, hf_logits, report, selection, budget, checkpoints, save)
    callback = _callback_class()(rec, clock, budget, threads)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ttq-hf-") as out:
        trainer = hf_trainer(setting, seed, max_steps, hf, model, out, callback, clock, budget)
        trainer.train()
    steps = rec.points[-1]["step"]
    return {"settings": setting.describe(), "precision": setting.precision, "points": rec.points, "steps": steps,
            "max_steps": max_steps if not setting.clock_schedule else None,
            "calibration_s_per_step": round(step_seconds, 5) if step_seconds else None,
            "train_seconds": round(clock.elapsed, 2), "eval_seconds": round(rec.eval_seconds, 1),
            "lost_seconds": round(max(0.0, budget - clock.elapsed), 2) if callback.stopped_by != "budget" else 0.0,
            "wall_seconds": round(time.perf_counter() - started, 1), "stopped_by": callback.stopped_by,
            "first_step_seconds": round(callback.step_ends[0], 2) if callback.step_ends else None,
            "checkpoints": rec.saved}


# ---------------------------------------------------------------------------- summary
def summarize(arm: dict[str, Any], levels: tuple[float, ...] = LEVELS) -> dict[str, Any]:
    """Add an arm's minutes to each level (mean over seeds, null unless every seed reaches it), their range and
    95 % interval, how many seeds reached it, and its best and final accuracy."""
    curves = [arm["seeds"][s] for s in sorted(arm["seeds"], key=int)]
    arm["minutes_to"], arm["minutes_to_range"], arm["minutes_to_interval"], arm["reached_by"] = {}, {}, {}, {}
    for level in levels:
        key = f"{level:g}"
        reached = [m for m in (minutes_to_reach(c, level) for c in curves) if m is not None]
        arm["reached_by"][key] = len(reached)
        every = len(reached) == len(curves) and bool(curves)
        arm["minutes_to"][key] = round(statistics.mean(reached), 3) if every else None
        arm["minutes_to_range"][key] = [min(reached), max(reached)] if reached else None
        arm["minutes_to_interval"][key] = mean_interval(reached).to_json(3) if every else None
    best = [max(p["mlm_accuracy"] for p in c) for c in curves]
    final = [c[-1]["mlm_accuracy"] for c in curves]
    arm["best"], arm["best_range"] = round(statistics.mean(best), 5), [min(best), max(best)]
    arm["final"], arm["final_range"] = round(statistics.mean(final), 5), [min(final), max(final)]
    arm["final_perplexity"] = round(statistics.mean(c[-1]["perplexity"] for c in curves), 3)
    return arm


def ratios(arms: dict[str, dict[str, Any]], model: str = "tiny",
           levels: tuple[float, ...] = LEVELS) -> dict[str, dict[str, float | str | None]]:
    """Each other arm's mean minutes to a level over bertforge's recipe at the same preset: a number where both
    reach it, "bertforge only" where only bertforge does (the target counts it as met), else null."""
    ours = arms.get(arm_label(OURS, model))
    out: dict[str, dict[str, float | str | None]] = {}
    if ours is None:
        return out
    for name in ARM_NAMES:
        theirs = arms.get(arm_label(name, model))
        if name == OURS or theirs is None:
            continue
        by_level: dict[str, float | str | None] = {}
        for lv in levels:
            a, b = theirs["minutes_to"][f"{lv:g}"], ours["minutes_to"][f"{lv:g}"]
            by_level[f"{lv:g}"] = round(a / b, 2) if a and b else "bertforge only" if b else None
        out[f"{arm_label(name, model)} / {arm_label(OURS, model)}"] = by_level
    return out


def step_rates(arms: dict[str, dict[str, Any]], model: str) -> dict[str, Any]:
    """Steps per second of training clock of each arm (mean over seeds), and what each source of bertforge's
    speed gives, as ratios of step rates at the same recipe: its sparse MLM head (recipe over dense head), the
    same head in transformers (masked positions only over same recipe), and the rest of the library
    (bertforge's recipe over transformers' masked positions only: unpadding, fused kernels, its loop)."""
    rate = {}
    for name in ARM_NAMES:
        arm = arms.get(arm_label(name, model))
        if arm is not None:
            rate[name] = statistics.mean(r["steps"] / r["train_seconds"] for r in arm["runs"].values())
    out: dict[str, Any] = {"steps_per_second": {arm_label(k, model): round(v, 3) for k, v in rate.items()}}
    pairs = {"bertforge's sparse head (recipe / dense head)": (OURS, DENSE),
             "the sparse head in transformers (masked positions only / same recipe)": (MASKED_ONLY, SAME),
             "the rest of bertforge (recipe / transformers masked positions only)": (OURS, MASKED_ONLY),
             "all of it (bertforge recipe / transformers same recipe)": (OURS, SAME)}
    out["sources"] = {k: round(rate[a] / rate[b], 2) for k, (a, b) in pairs.items() if a in rate and b in rate}
    return out


def _reach(arm: dict[str, Any], key: str) -> str:
    n = len(arm["seeds"])
    m, rng = arm["minutes_to"][key], arm["minutes_to_range"][key]
    if m is not None:
        return f"{m:.2f} [{rng[0]:.2f}-{rng[1]:.2f}]" if n > 1 else f"{m:.2f}"
    return f"not reached ({arm['reached_by'][key]}/{n})"


def _short(settings: dict[str, Any]) -> str:
    options = f", {settings['precision']}" if "precision" in settings else ""
    if settings.get("torch_compile"):
        options += ", compiled"
    if settings.get("pad_to_multiple_of"):
        options += f", padded to {settings['pad_to_multiple_of']}"
    return f"{settings['model']}, batch {settings['batch_size']}, lr {settings['lr']:g}{options}"


def plot(result: dict[str, Any], path: Path) -> None:
    """Each preset's arms: mean held-out accuracy over seeds against training minutes, band = the seeds' range."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = list(result["models"])
    fig = Figure(figsize=(8, 4.5 * len(models)))
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(models), 1, squeeze=False)[:, 0]
    colours = {OURS: "tab:blue", DENSE: "tab:cyan", TRAINER: "tab:red", SAME: "tab:orange", MASKED_ONLY: "tab:brown"}
    for ax, model in zip(axes, models):
        for name in ARM_NAMES:
            arm = result["models"][model]["arms"].get(arm_label(name, model))
            if arm is None:
                continue
            curves = [arm["seeds"][s] for s in sorted(arm["seeds"], key=int)]
            end = max(c[-1]["seconds"] for c in curves)
            xs = np.linspace(0.0, end, 400)
            ys = np.array([np.interp(xs, [p["seconds"] for p in c], [p["mlm_accuracy"] for p in c]) for c in curves])
            ax.plot(xs / 60, ys.mean(0), color=colours[name],
                    label=f"{name}: {_short(arm['settings'])}, {len(curves)} seed(s)")
            if len(curves) > 1:
                ax.fill_between(xs / 60, ys.min(0), ys.max(0), color=colours[name], alpha=0.2, linewidth=0)
        for level in LEVELS:
            ax.axhline(level, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("training minutes (evaluations excluded)")
        ax.set_ylabel("held-out MLM accuracy (report half)")
        ax.set_title(f"{model}: {result['cpu']}, one thread per run", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------- the plan, run by workers
SPEED_BATCH = 32
GRID_BATCHES, GRID_LRS = (8, 16, 32, 64), (5e-4, 1e-3, 2e-3, 3e-3, 5e-3)
TOP, TOP_SEEDS, WARMUPS = 3, (0, 1), (0.0, 0.15)
PADS = (0, 8, 64)
CHECKPOINT_MINUTES = (1.0, 2.0, 5.0, 10.0)
DENSE, MASKED_ONLY = "bertforge (recipe, dense head)", "transformers (same recipe, masked positions only)"
FINETUNE_SIZE, FINETUNE_SEEDS = 1000, 5
"""Item of the demo's protocol the checkpoints are fine-tuned at: part-of-speech tagging (Brown), 1,000 tagged
sentences, the demo's subsets and seeds 0-4."""
ARM_NAMES = (OURS, DENSE, TRAINER, SAME, MASKED_ONLY)


def arm_label(arm: str, model: str) -> str:
    """An arm's name in the report: today's names at the tiny preset, `` (mini)`` appended at mini."""
    return arm if model == "tiny" else f"{arm} ({model})"


@dataclass
class Work:
    """A measurement's folder: ``jobs/ID.json`` per finished job, ``claims/ID`` per running one (its process id),
    ``checkpoints/`` the models kept for fine-tuning."""

    root: Path

    def done(self) -> dict[str, dict[str, Any]]:
        out = {}
        for f in sorted((self.root / "jobs").glob("**/*.json")):
            out[str(f.relative_to(self.root / "jobs"))[:-5]] = json.loads(f.read_text())
        return out

    def claim(self, job_id: str) -> bool:
        """Take ``job_id`` for this process unless a live process has it (a dead one's claim is taken over)."""
        path = self.root / "claims" / job_id
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                os.kill(int(path.read_text() or 0), 0)
                return False  # running
            except (ProcessLookupError, ValueError):
                path.unlink(missing_ok=True)  # its process is gone: what it left half-done starts afresh
                return self.claim(job_id)
            except PermissionError:
                return False
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True

    def finish(self, job_id: str, result: dict[str, Any]) -> None:
        from bertforge.io import atomic_write_text

        path = self.root / "jobs" / f"{job_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(result, indent=1) + "\n")
        (self.root / "claims" / job_id).unlink(missing_ok=True)


def speed_options(model: str) -> list[dict[str, Any]]:
    """transformers' speed options a CPU user can turn on, each combination timed (`calibrate`)."""
    precisions = ("fp32", "bf16") if native_bf16(DEVICE) else ("fp32",)
    return [{"precision": p, "torch_compile": c, "pad_to_multiple_of": pad}
            for p in precisions for c in (False, True) for pad in PADS]


def _option_id(o: dict[str, Any]) -> str:
    return f"{o['precision']}-compile{int(o['torch_compile'])}-pad{o['pad_to_multiple_of']}"


def fastest_options(done: dict[str, dict[str, Any]], model: str) -> dict[str, Any] | None:
    """The fastest of ``model``'s timed options (None until every one is timed)."""
    runs = [done.get(f"speed/{model}/{_option_id(o)}") for o in speed_options(model)]
    if any(r is None for r in runs):
        return None
    ok = [r for r in runs if r.get("s_per_step")]
    if not ok:
        raise SystemExit(f"no speed option of transformers ran for {model}: "
                         + "; ".join(f"{_option_id(r['options'])}: {r['failed']}" for r in runs))
    return min(ok, key=lambda r: r["s_per_step"])["options"]


def plan(done: dict[str, dict[str, Any]], models: list[str], seeds: list[int], scale: float) -> list[dict[str, Any]]:
    """Every job whose inputs are measured, in the order to run them: transformers' speed options, its grid with
    the fastest, the grid's top points for the full budget with two seeds, then the arms."""
    jobs: list[dict[str, Any]] = []
    for model in models:
        for o in speed_options(model):
            jobs.append({"id": f"speed/{model}/{_option_id(o)}", "kind": "speed", "model": model, "options": o})
    for model in models:
        options = fastest_options(done, model)
        if options is None:
            continue
        grid = [{"id": f"grid/{model}/b{b}-lr{lr:g}", "kind": "hf", "model": model, "minutes": 3 * scale, "seed": 0,
                 "selection": True, "setting": {"model": model, "batch_size": b, "lr": lr, **options}}
                for b in GRID_BATCHES for lr in GRID_LRS]
        jobs += grid
        if any(j["id"] not in done for j in grid):
            continue
        ranked = sorted(grid, key=lambda j: -done[j["id"]]["points"][-1]["selection_accuracy"])[:TOP]
        top = [dict(j["setting"]) for j in ranked]
        top += [{**top[0], "warmup_ratio": w} for w in WARMUPS]
        tops = [{"id": f"top/{model}/b{t['batch_size']}-lr{t['lr']:g}-w{t.get('warmup_ratio', 0.06):g}-s{s}",
                 "kind": "hf", "model": model, "minutes": 10 * scale, "seed": s, "selection": True, "setting": t}
                for t in top for s in TOP_SEEDS]
        jobs += tops
        same = {**asdict(same_recipe_setting()), "model": model, **options}
        arms = {OURS: {"kind": "ours"}, DENSE: {"kind": "ours", "dense": True},
                SAME: {"kind": "hf", "setting": same},
                MASKED_ONLY: {"kind": "hf", "setting": {**same, "masked_only": True}}}
        if all(j["id"] in done for j in tops):
            def mean_selection(t: dict[str, Any]) -> float:
                return statistics.mean(done[j["id"]]["points"][-1]["selection_accuracy"]
                                       for j in tops if j["setting"] == t)
            arms[TRAINER] = {"kind": "hf", "setting": max(top, key=mean_selection)}
        for arm in ARM_NAMES:
            if arm in arms:
                for seed in seeds:
                    jobs.append({"id": f"arm/{model}/{_slug(arm)}/s{seed}", "kind": arms[arm]["kind"], "arm": arm,
                                 "model": model, "minutes": 10 * scale, "seed": seed, "selection": False,
                                 "dense": arms[arm].get("dense", False), "setting": arms[arm].get("setting"),
                                 "checkpoints": seed == seeds[0] and arm in (OURS, TRAINER)})
        jobs += finetune_jobs(done, model, seeds[0])
    from bertforge.experiments.baselines import CRF, MOST_FREQUENT_TAG

    jobs += [{"id": f"finetune/classic/{_slug(b)}/s{s}", "kind": "finetune", "model": "", "baseline": b, "seed": s}
             for b in (CRF, MOST_FREQUENT_TAG) for s in range(FINETUNE_SEEDS)]
    return jobs


def finetune_jobs(done: dict[str, dict[str, Any]], model: str, seed: int) -> list[dict[str, Any]]:
    """The fine-tunings of item "time to a useful model": ``model``'s random initialisation, and each checkpoint
    the bertforge-recipe and Trainer arms kept (their ``seed`` run), at `FINETUNE_SIZE` tagged sentences."""
    jobs = [{"id": f"finetune/{model}/random/s{s}", "kind": "finetune", "model": model, "random": True, "seed": s}
            for s in range(FINETUNE_SEEDS)]
    for arm in (OURS, TRAINER):
        run = done.get(f"arm/{model}/{_slug(arm)}/s{seed}")
        for c in (run or {}).get("checkpoints", []):
            jobs += [{"id": f"finetune/{model}/{_slug(arm)}/{c['minutes']:g}min/s{s}", "kind": "finetune",
                      "model": model, "arm": arm, "minutes": c["minutes"], "folder": c["folder"], "seed": s}
                     for s in range(FINETUNE_SEEDS)]
    return jobs


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").lower()


def worker(args: argparse.Namespace) -> int:
    """Run the plan's jobs one after another until none is left (waiting while another worker measures what the
    next ones need); several workers, each pinned to its own core, share one folder."""
    from bertforge.fast.allocator import keep_freed_memory

    import transformers

    transformers.logging.set_verbosity_warning()
    work = Work(args.work)
    allocator = keep_freed_memory()  # both libraries' runs, every arm: the same allocator
    models, seeds = _split(args.models), [int(s) for s in _split(args.seeds)]
    vocab, data, (selection_folder, report_folder) = heldout_corpus(args)
    tok = BertTokenizer.from_pretrained(vocab)
    selection, report_half = EvalSet.of(selection_folder, "selection", args.eval_instances), \
        EvalSet.of(report_folder, "report", args.eval_instances)
    hf = HFData(vocab, data)
    while True:
        done = work.done()
        jobs = [j for j in plan(done, models, seeds, args.scale) if j["id"] not in done]
        job = next((j for j in jobs if work.claim(j["id"])), None)
        if job is None:
            if not jobs:  # the plan grows as stages finish: nothing left to plan is the end
                print("# every job is done", flush=True)
                return 0
            time.sleep(20)  # what is left waits for jobs another worker runs
            continue
        meta = {**run_meta(), **machine_details(), "allocator_keeps_freed_memory": allocator}
        print(f"# {job['id']} ... (load {_loadavg()})", flush=True)
        started = time.perf_counter()
        result = run_job(job, args, tok, vocab, data, hf, selection, report_half, work)
        meta.update(wall_s=round(time.perf_counter() - started, 1), loadavg_after=_loadavg())
        work.finish(job["id"], {"job": job, **result, "meta": meta})
        last = result.get("points", [{}])[-1]
        print(f"#   done in {meta['wall_s']:.0f} s: " + (f"{result['s_per_step'] * 1e3:.1f} ms/step"
              if result.get("s_per_step") else result.get("failed") or
              f"accuracy {last.get('mlm_accuracy')}, {result.get('steps')} steps, {result.get('stopped_by')}"),
              flush=True)


def finetune(job: dict[str, Any], args: argparse.Namespace, work: Work) -> dict[str, Any]:
    """One cell of the demo's protocol (`bertforge.demo.curve.run_cell`: a learning-rate range test on the
    subset, then the fine-tuning, scored once on the demo's held-out sentences), or a classic baseline fitted on
    the same subset."""
    from bertforge.demo.curve import Cell, finetune_steps, run_cell

    files, finetuning, task = pos_files(work.root / "finetune-data", args.scale)
    seed = job["seed"]
    if job.get("baseline"):
        folder, steps = "", 0
    elif job.get("random"):
        vocab = corpus(bench_cache(), args.vocab_size, args.dupe_factor)[0]
        folder = str(random_init(work.root / "random" / job["model"], job["model"], seed, vocab))
        steps = finetune_steps(FINETUNE_SIZE, finetuning)
    else:
        folder, steps = job["folder"], finetune_steps(FINETUNE_SIZE, finetuning)
    cell = Cell(job.get("baseline") or job["id"], FINETUNE_SIZE, seed, folder, str(files[seed]), str(files["heldout"]),
                steps, task.settings(), finetuning, str(work.root / "finetune-runs" / _slug(job["id"])),
                baseline=job.get("baseline", ""))
    return run_cell(cell)


@functools.cache
def pos_files(root: Path, scale: float) -> tuple[dict[Any, Path], Any, Any]:
    """The demo's part-of-speech subsets of `FINETUNE_SIZE` tagged sentences (one per seed) and its held-out
    sentences as files under ``root``, its fine-tuning settings (a smoke run's, ``scale`` < 1: 10 steps), and
    the task."""
    import dataclasses

    from bertforge.demo.curve import CurveTask, subset
    from bertforge.demo.run import POS, _finetuning
    from pretraining_crossing import demo_data

    cfg, data = demo_data(root, pilot=False)
    finetuning = _finetuning(cfg, "bf16" if native_bf16(DEVICE) else "fp32")
    if scale < 1:
        finetuning = dataclasses.replace(finetuning, epochs=0.01, min_steps=10, range_steps=8)
    task = CurveTask(POS, "tagging", data.pos_train, data.pos_heldout, "tagged sentences", cfg.tag_piece)
    files: dict[Any, Path] = {"heldout": root / "heldout-pos.conll"}
    if not files["heldout"].is_file():
        task.write(files["heldout"], task.heldout)
    for seed in range(FINETUNE_SEEDS):
        files[seed] = root / f"train-pos-{FINETUNE_SIZE}-seed{seed}.conll"
        if not files[seed].is_file():
            task.write(files[seed], [task.train[i] for i in subset(len(task.train), FINETUNE_SIZE, seed)])
    return files, finetuning, task


def random_init(root: Path, model: str, seed: int, vocab: Path) -> Path:
    """The ``model`` preset from random initialisation under ``seed``, with the corpus's ``vocab``, as a folder."""
    from bertforge.model.checkpoint import save_pretrained

    folder = root / f"seed{seed}"
    if not (folder / "config.json").is_file():
        tok = BertTokenizer.from_pretrained(vocab)
        cfg = PretrainConfig.from_recipe("budget", model=model)
        torch.manual_seed(seed)
        net = build_pretraining_model(cfg, tok.vocab_size, False, MAX_SEQ_LENGTH, "mlm")
        save_pretrained(net, folder, tokenizer=tok)
    return folder


def machine_details() -> dict[str, Any]:
    """CPU family, model and flags, the cores this process may run on and its threads."""
    from bertforge.machine import cpu_flags, cpu_info, kernel_limits

    flags = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx", "fma")))
    return {"cpu_name": cpu_info()[0], "cpu_flags": flags, "kernel_limits": kernel_limits(),
            "pinned_cores": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}


def run_job(job: dict[str, Any], args: argparse.Namespace, tok: BertTokenizer, vocab: Path, data: Path, hf: HFData,
            selection: EvalSet, report_half: EvalSet, work: Work) -> dict[str, Any]:
    checkpoints = work.root / "checkpoints" / job["model"] / _slug(job.get("arm", "")) if job.get("checkpoints") \
        else None
    if job["kind"] == "speed":
        o = job["options"]
        setting = HFSetting(model=job["model"], batch_size=SPEED_BATCH, lr=5e-4, **o)
        try:
            s = calibrate(setting, hf, torch.get_num_threads(), args.calibration_steps, 6 if o["torch_compile"] else 2)
        except Exception as e:  # noqa: BLE001 - an option that does not run here is reported, not chosen
            return {"options": o, "failed": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
        return {"options": o, "s_per_step": s}
    if job["kind"] == "finetune":
        return finetune(job, args, work)
    if job["kind"] == "ours":
        with tempfile.TemporaryDirectory(prefix="ttq-ours-") as out:  # the trainer writes nothing there
            return ours_run(args, job["seed"], tok, vocab, data, report_half, out, model=job["model"],
                            minutes=job["minutes"], dense=job["dense"], checkpoints=checkpoints)
    setting = HFSetting(**job["setting"])
    return hf_run(job.get("arm", TRAINER), setting, job["seed"], job["minutes"], hf, report_half,
                  selection if job["selection"] else None, args, checkpoints=checkpoints, tokenizer_folder=vocab)


# ---------------------------------------------------------------------------- main
def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Minutes of pre-training until held-out MLM accuracy 0.1 / 0.2 / 0.3: "
                                            "bertforge's budget recipe against transformers at its best, with "
                                            "ablations. See the module docstring.")
    p.add_argument("--work", type=Path, default=Path("runs/time-to-quality"),
                   help="the measurement's folder: finished jobs, claims, checkpoints; default %(default)s")
    p.add_argument("--models", default="tiny,mini", help="presets compared; default %(default)s")
    p.add_argument("--seeds", default="0,1,2", help="the arms' seeds (comma-separated); default %(default)s")
    p.add_argument("--scale", type=float, default=1.0,
                   help="every run's minutes times this (a smoke run of the whole plan: 0.02); default 1")
    p.add_argument("--calibration-steps", type=int, default=20, help="timed steps of a speed option or max_steps")
    p.add_argument("--precision", default="auto", help="bertforge's precision; default %(default)s")
    p.add_argument("--eval-instances", type=int, default=0,
                   help="evaluate the first this many instances of each held-out half (0: all)")
    p.add_argument("--corpus-only", action="store_true", help="build the cached corpus and held-out halves and stop")
    p.add_argument("--report", action="store_true", help="instead of running: the table, --json and --plot of "
                                                         "what the folder holds")
    add_shared_flags(p, "arms")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.corpus_only:
        heldout_corpus(args)
        return 0
    if args.report:
        return report_folder(args)
    return worker(args)


def report_folder(args: argparse.Namespace) -> int:
    """What the folder holds as the report's structure: per model, transformers' speed options, its grid and top
    points and the choice, each arm's curves per seed (`summarize`) and the ratios to bertforge's recipe."""
    done = Work(args.work).done()
    result: dict[str, Any] = {"levels": list(LEVELS), "models": {}, "sources": sorted({d["meta"]["command"]
                                                                                      for d in done.values()})}
    for model in _split(args.models):
        entry: dict[str, Any] = {"speed": [d for k, d in done.items() if k.startswith(f"speed/{model}/")],
                                 "grid": [_brief(d) for k, d in done.items() if k.startswith(f"grid/{model}/")],
                                 "top": [_brief(d) for k, d in done.items() if k.startswith(f"top/{model}/")],
                                 "arms": {}}
        entry["fastest_options"] = fastest_options(done, model)
        for arm in ARM_NAMES:
            runs = {k.rsplit("/s", 1)[1]: d for k, d in done.items() if k.startswith(f"arm/{model}/{_slug(arm)}/s")}
            if runs:
                first = next(iter(runs.values()))
                entry["arms"][arm_label(arm, model)] = summarize({
                    "settings": first["settings"], "precision": first["precision"],
                    "seeds": {s: d["points"] for s, d in runs.items()},
                    "steps": {s: d["steps"] for s, d in runs.items()},
                    "runs": {s: {k: v for k, v in d.items() if k not in ("points", "settings", "job")}
                             for s, d in runs.items()}})
        entry["useful_model"] = useful_model(done, model)
        entry["ratios"] = ratios(entry["arms"], model)
        entry["step_rates"] = step_rates(entry["arms"], model)
        result["models"][model] = entry
        for name, arm in entry["arms"].items():
            print(f"{name} ({_short(arm['settings'])}): " + ", ".join(f"to {lv}: {_reach(arm, lv)}"
                                                                      for lv in arm["minutes_to"])
                  + f"; best {arm['best']:.4f}")
        for pair, by_level in entry["ratios"].items():
            print(f"  {pair}, minutes: " + ", ".join(f"to {lv}: {r if r is None or isinstance(r, str) else f'{r:.2f}x'}"
                                                     for lv, r in by_level.items()))
        print(f"  step rates: {entry['step_rates']}")
    metas = [d["meta"] for d in done.values()]
    result["cpu"] = sorted({f"{m['cpu_name']} ({' '.join(m['cpu_flags'])})" for m in metas}) if metas else []
    result["cpu"] = result["cpu"][0] if len(result["cpu"]) == 1 else result["cpu"]
    result["pinned_cores"] = sorted({tuple(m["pinned_cores"]) for m in metas})
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.plot and any(e["arms"] for e in result["models"].values()):
        plot(result, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


def useful_model(done: dict[str, dict[str, Any]], model: str) -> dict[str, Any]:
    """Part-of-speech accuracy at `FINETUNE_SIZE` tagged sentences of each kept checkpoint, random initialisation
    and the classic baselines, seed by seed; per arm the first checkpoint whose paired difference from random
    initialisation, and from the CRF, has a 95 % interval above 0 ("not within N minutes" otherwise)."""
    from bertforge.experiments.baselines import CRF, MOST_FREQUENT_TAG
    from bertforge.stats import paired_difference

    def accuracies(prefix: str) -> list[float] | None:
        got = [done.get(f"{prefix}/s{s}") for s in range(FINETUNE_SEEDS)]
        return [g["accuracy"] for g in got] if all(got) else None

    lines = {"random initialisation": accuracies(f"finetune/{model}/random"),
             CRF: accuracies(f"finetune/classic/{_slug(CRF)}"),
             MOST_FREQUENT_TAG: accuracies(f"finetune/classic/{_slug(MOST_FREQUENT_TAG)}")}
    out: dict[str, Any] = {"task": f"part-of-speech tagging, {FINETUNE_SIZE} tagged sentences, the demo's protocol",
                           "seeds": list(range(FINETUNE_SEEDS)), "lines": lines, "arms": {}}
    for arm in (OURS, TRAINER):
        checkpoints = []
        for minutes in CHECKPOINT_MINUTES:
            acc = accuracies(f"finetune/{model}/{_slug(arm)}/{minutes:g}min")
            if acc is None:
                continue
            point: dict[str, Any] = {"minutes": minutes, "accuracy": acc}
            for name, ref in (("random initialisation", lines["random initialisation"]), ("CRF", lines[CRF])):
                if ref is not None:
                    point[f"minus {name}"] = paired_difference(acc, ref).to_json(5)
            checkpoints.append(point)
        beats = {}
        for name in ("random initialisation", "CRF"):
            first = next((c["minutes"] for c in checkpoints
                          if (c.get(f"minus {name}", {}).get("low") or 0) > 0), None)
            beats[name] = first if first is not None else (
                f"not within {checkpoints[-1]['minutes']:g} minutes" if checkpoints else None)
        out["arms"][arm_label(arm, model)] = {"checkpoints": checkpoints, "minutes_to_beat": beats}
    return out


def _brief(d: dict[str, Any]) -> dict[str, Any]:
    """A grid or top run without its curve's detail: its setting, seed and final accuracies."""
    last = d["points"][-1]
    return {"setting": d["job"]["setting"], "seed": d["job"]["seed"], "steps": d["steps"],
            "selection_accuracy": last.get("selection_accuracy"), "report_accuracy": last["mlm_accuracy"],
            "stopped_by": d["stopped_by"], "lost_seconds": d.get("lost_seconds"), "curve": d["points"]}


if __name__ == "__main__":
    raise SystemExit(main())
