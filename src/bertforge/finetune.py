"""``bertforge finetune / evaluate / predict``: sequence classification and regression (GLUE and
your own files) on the shared training loop.

The recipe: a pre-trained checkpoint folder (bertforge's or transformers'), its tokenizer, the
task's files read by `bertforge.tasks.classification` (GLUE's TSV layouts by task name, or generic
CSV / TSV / JSONL with named columns), `BertForSequenceClassification` with a fresh classifier, and
`bertforge.trainer.Trainer`. The paper's fine-tuning defaults: batch 32, lr 2e-5 (it searched
{5e-5, 3e-5, 2e-5}), 3 epochs, warmup over 10% of the steps then linear decay, weight decay 0.01,
max_seq_length 128; the dev set is evaluated at the end of each epoch (or every ``eval_every``
steps) and the best model by the task's main metric is kept in ``OUT/best/``.

    bertforge finetune --task sst2 --model bert-base --train-file glue/SST-2 --dev-file glue/SST-2 --out runs/sst2
    bertforge evaluate runs/sst2/best --file glue/SST-2/dev.tsv
    bertforge predict runs/sst2/best glue/SST-2/test.tsv --out sst2.tsv

The run folder: ``metrics.jsonl`` (train and eval lines), ``checkpoints/`` (resumable: ``--resume``),
``model/`` (the final weights) and ``best/`` (the best on dev, with ``eval_metrics.json``); both are
checkpoint folders transformers' ``BertForSequenceClassification`` loads, with ``id2label`` /
``label2id`` and the fine-tuning settings (``bertforge_finetune`` in config.json).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.tasks.classification import (
    GLUE_TASKS,
    ClassificationTask,
    FeatureBatches,
    Features,
    ReadReport,
    compute_metrics,
    encode_examples,
    glue_files,
    label_list,
    main_metric,
    predict_logits,
    read_examples,
    targets,
)
from bertforge.trainer import TrainConfig, TrainResult, Trainer, resume_point

__all__ = ["FinetuneConfig", "FinetuneResult", "finetune", "evaluate", "predict", "GENERIC_TASKS"]

logger = logging.getLogger("bertforge")

GENERIC_TASKS = ("classification", "regression")
SETTINGS_KEY = "bertforge_finetune"  # config.json entry holding the settings predictions need
BEST_DIR = "best"
BEST_METRICS = "eval_metrics.json"


@dataclass
class FinetuneConfig(TrainConfig):
    """A fine-tuning run: the loop's settings with the paper's fine-tuning defaults, plus task and data."""

    batch_size: int = 32
    """Global batch: sequences (windows) per optimizer step over all processes and accumulation steps."""
    max_steps: int = 0
    """Optimizer steps of the run (0: --epochs passes over the training data)."""
    lr: float = 2e-5
    """Peak learning rate (the paper searched 5e-5, 3e-5, 2e-5)."""
    warmup_ratio: float = 0.1
    """Warmup over this share of the steps (the paper: a tenth), then linear decay."""
    checkpoint_every: int = 500
    """Save a resumable checkpoint every this many steps (and at the end, and on SIGINT / SIGTERM)."""
    keep_checkpoints: int = 1
    """Keep the last this many checkpoints (0: keep all)."""
    eval_every: int = 0
    """Evaluate on --dev-file every this many steps (0: at the end of every epoch)."""
    task: str = ""
    """A GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli: its file layout, labels and metrics), or
    classification / regression for generic files (with --text-column)."""
    model: str = ""
    """Pre-trained checkpoint folder (bertforge or transformers) holding the tokenizer too."""
    train_file: str = ""
    """Training file (.tsv, .csv, .jsonl; optionally compressed), a GLUE task folder (train.tsv), or files
    separated by commas."""
    dev_file: str = ""
    """Evaluation file(s), or a GLUE task folder (dev.tsv; MNLI: dev_matched.tsv and dev_mismatched.tsv)."""
    out: str = "runs/finetune"
    """Run folder: metrics.jsonl, checkpoints/, model/ (final) and best/ (best on dev)."""
    text_column: str = ""
    """Column (JSONL: key) of the text (default: the GLUE task's)."""
    text_pair_column: str = ""
    """Column of the second text of a pair (default: the GLUE task's; none for single sentences)."""
    label_column: str = ""
    """Column of the label (default: the GLUE task's, else "label")."""
    epochs: float = 3.0
    """Passes over the training data when --max-steps is 0 (the paper searched 2, 3, 4)."""
    max_seq_length: int = 128
    """Tokens per sequence, [CLS] and [SEP] included; longer texts are cut into overlapping windows."""
    stride: int = 0
    """Tokens between the starts of consecutive windows of a long text (0: half a window)."""
    eval_batch_size: int = 64
    """Sequences per forward pass at evaluation, per process."""
    keep_best: bool = True
    """Keep the model that scores best on the dev set in OUT/best/."""
    metric_for_best: str = ""
    """Metric that decides the best model (default: the task's main one: MCC for CoLA, Pearson for STS-B, F1
    for MRPC / QQP, accuracy otherwise; with several dev files, the first file's)."""
    skip_bad_rows: bool = False
    """Skip (and count) malformed rows instead of stopping at the first."""
    resume: bool = False
    """Continue the run in --out from its latest checkpoint."""

    def __post_init__(self) -> None:
        auto_steps = self.max_steps == 0
        if auto_steps:
            self.max_steps = 1  # set from --epochs once the data is read (`finetune`)
        super().__post_init__()
        if auto_steps:
            self.max_steps = 0
        if self.task and self.task not in GLUE_TASKS and self.task not in GENERIC_TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose a GLUE task ({', '.join(GLUE_TASKS)}) or "
                             f"{' / '.join(GENERIC_TASKS)}")
        if self.epochs <= 0 or self.max_seq_length < 4 or self.stride < 0 or self.eval_batch_size < 1:
            raise ValueError("epochs must be > 0, max_seq_length >= 4, stride >= 0 and eval_batch_size >= 1")

    @property
    def regression(self) -> bool:
        glue = GLUE_TASKS.get(self.task)
        return glue.regression if glue else self.task == "regression"


@dataclass
class FinetuneResult:
    train: TrainResult
    model_dir: Path
    """The final weights."""
    best_dir: Path | None
    best: dict[str, Any] | None
    """{"step", "metric", "value", "metrics"} of the best evaluation."""
    eval_metrics: dict[str, float]
    """The last evaluation's."""
    reports: list[ReadReport] = field(default_factory=list)
    """What reading each file kept and skipped."""


# ---------------------------------------------------------------------------- data
def _files(spec: str, task: str, split: str) -> list[Path]:
    return [f for part in spec.split(",") if part.strip() for f in glue_files(task, part.strip(), split)]


@dataclass
class _Split:
    path: Path
    features: Features
    labels: np.ndarray
    report: ReadReport


def _read_split(path: Path, task: str, columns: dict[str, str | None], label2id: dict[str, int] | None,
                tokenizer: Any, max_seq_length: int, stride: int, skip_bad_rows: bool) -> _Split:
    examples, report = read_examples(path, task, require_labels=True, skip_bad_rows=skip_bad_rows, **columns)
    if not examples:
        raise ValueError(f"{report.summary()}: no labelled examples")
    y = targets(examples, path, label2id)
    features = encode_examples(examples, tokenizer, max_seq_length, stride).with_labels(y)
    return _Split(path, features, y, report)


def _columns(text_column: str | None, text_pair_column: str | None, label_column: str | None) -> dict[str, str | None]:
    return {"text_column": text_column or None, "text_pair_column": text_pair_column or None,
            "label_column": label_column or None}


def _evaluate_splits(model: nn.Module, splits: list[_Split], task: str, batch_size: int, device: torch.device,
                     dist: Any = None) -> tuple[dict[str, float], str]:
    """Metrics of every split (prefixed by its file's name when there are several) and the main one's name."""
    num_labels = model.config.num_labels
    out: dict[str, float] = {}
    main = ""
    for k, s in enumerate(splits):
        logits = predict_logits(model, s.features, batch_size, device, dist)
        preds = logits[:, 0] if num_labels == 1 else logits.argmax(-1)
        got = compute_metrics(task if task in GLUE_TASKS else None, preds, s.labels, num_labels)
        prefix = f"{s.path.name.split('.')[0]}_" if len(splits) > 1 else ""
        if k == 0:
            main = prefix + main_metric(task, got, num_labels == 1)
        out.update({prefix + name: float(v) for name, v in got.items()})
    return out, main


def _better(value: float, best: float | None) -> bool:
    return math.isfinite(value) and (best is None or value > best)


# ---------------------------------------------------------------------------- the recipe
def finetune(cfg: FinetuneConfig) -> FinetuneResult:
    """Run (or resume) a fine-tuning run; keep the best model on dev; return the outcome."""
    from bertforge.distributed import setup
    from bertforge.heads import BertForSequenceClassification
    from bertforge.tokenization import BertTokenizer

    for name in ("task", "model", "train_file"):
        if not getattr(cfg, name):
            raise ValueError(f"finetune needs --{name.replace('_', '-')}")
    if cfg.keep_best and not cfg.dev_file:
        raise ValueError("--keep-best needs --dev-file (or pass --no-keep-best)")
    tok = BertTokenizer.from_pretrained(cfg.model)
    dist = setup(cfg.device)
    out = Path(cfg.out)
    columns = _columns(cfg.text_column, cfg.text_pair_column, cfg.label_column)

    # Training data: the label set is the GLUE task's, else the training files'.
    examples, reports = [], []
    for path in _files(cfg.train_file, cfg.task, "train"):
        got, report = read_examples(path, cfg.task, require_labels=True, skip_bad_rows=cfg.skip_bad_rows, **columns)
        examples.append((path, got))
        reports.append(report)
    labels = None if cfg.regression else label_list([e for _, got in examples for e in got], cfg.task)
    label2id = None if labels is None else {name: i for i, name in enumerate(labels)}
    y = np.concatenate([targets(got, path, label2id) for path, got in examples])
    train_examples = [e for _, got in examples for e in got]
    if not train_examples:
        raise ValueError(f"{cfg.train_file}: no labelled training examples")
    if labels is not None and len(labels) < 2:
        raise ValueError(f"{cfg.train_file}: one label only ({labels[0]!r}): nothing to classify")
    train = encode_examples(train_examples, tok, cfg.max_seq_length, cfg.stride).with_labels(y)
    steps_per_epoch = len(train) // cfg.batch_size
    if steps_per_epoch < 1:
        raise ValueError(f"{cfg.train_file}: {len(train)} training sequences, fewer than one batch ({cfg.batch_size})")
    max_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * steps_per_epoch))
    cfg = dataclasses.replace(cfg, max_steps=max_steps, eval_every=cfg.eval_every or steps_per_epoch)

    dev = [_read_split(p, cfg.task, columns, label2id, tok, cfg.max_seq_length, cfg.stride, cfg.skip_bad_rows)
           for p in (_files(cfg.dev_file, cfg.task, "dev") if cfg.dev_file else [])]
    reports += [s.report for s in dev]

    settings = {"task": cfg.task, "max_seq_length": cfg.max_seq_length, "stride": cfg.stride,
                **{k: v for k, v in columns.items() if v}}
    torch.manual_seed(cfg.seed)  # the same fresh classifier on every process
    head: dict[str, Any] = ({"num_labels": 1, "id2label": None, "problem_type": "regression"} if labels is None else
                            {"id2label": dict(enumerate(labels)), "problem_type": "single_label_classification"})
    model = BertForSequenceClassification.from_pretrained(cfg.model, ignore_mismatched_sizes=True, **head)
    model.config.extra.update({SETTINGS_KEY: settings, "finetuning_task": cfg.task})
    if cfg.max_seq_length > model.config.max_position_embeddings:
        raise ValueError(f"max_seq_length {cfg.max_seq_length} exceeds the model's "
                         f"{model.config.max_position_embeddings} positions")
    torch.manual_seed(cfg.seed + dist.rank)  # dropout: a stream of its own per process

    batches = FeatureBatches(train, cfg.micro_batch(dist.world_size), seed=cfg.seed, rank=dist.rank,
                             world_size=dist.world_size, name=cfg.train_file)
    run_config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "resume"}
    run_config["labels"] = labels
    best_dir = out / BEST_DIR
    best: dict[str, Any] | None = None
    if cfg.resume and (best_dir / BEST_METRICS).is_file():
        best = json.loads((best_dir / BEST_METRICS).read_text(encoding="utf-8"))
    holder: dict[str, Trainer] = {}

    def evaluate(m: nn.Module) -> dict[str, float]:
        nonlocal best
        metrics, main = _evaluate_splits(m, dev, cfg.task, cfg.eval_batch_size, dist.device, dist)
        main = cfg.metric_for_best or main
        if main not in metrics:
            raise ValueError(f"--metric-for-best {main!r} is not among the metrics ({', '.join(metrics)})")
        trainer = holder["trainer"]
        if cfg.keep_best and _better(metrics[main], best["value"] if best else None):
            best = {"step": trainer.step, "metric": main, "value": metrics[main], "metrics": metrics}
            trainer.save_model(best_dir, extra_files={BEST_METRICS: json.dumps(best, indent=1) + "\n"})
        return metrics

    trainer = Trainer(model, ClassificationTask(regression=labels is None), batches, cfg, out, dist=dist,
                      evaluate=evaluate if dev else None, tokenizer=tok, run_config=run_config,
                      resumable_changes=("max_steps", "checkpoint_every", "keep_checkpoints", "log_every",
                                         "eval_every", "eval_batch_size", "max_time_minutes", "progress",
                                         "compile", "out", "device", "epochs"))
    holder["trainer"] = trainer
    resume_from = resume_point(out, cfg.resume)
    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "run_config.json").write_text(json.dumps(run_config, indent=1, default=str) + "\n", encoding="utf-8")
        kind = "regression" if labels is None else f"{len(labels)} labels ({', '.join(labels[:10])})"
        print(f"finetune: {cfg.task}, {kind}; train {train.summary()}; "
              + "; ".join(f"dev {s.path.name} {s.features.summary()}" for s in dev)
              + f"; {cfg.max_steps} steps of {cfg.batch_size} ({steps_per_epoch} per epoch) on {dist.device}")
        for r in reports:
            if r.num_skipped:
                print(f"finetune: {r.summary()}")
    result = trainer.fit(resume_from=resume_from)
    trainer.save_model(out / "model")
    if dist.is_main and best is not None:
        print(f"finetune: best {best['metric']} {best['value']:.4f} at step {best['step']} -> {best_dir}")
    dist.barrier()  # no process leaves (and tears down the process group) while another still works
    return FinetuneResult(train=result, model_dir=out / "model", best_dir=best_dir if best else None, best=best,
                          eval_metrics=result.eval_metrics, reports=reports)


# ---------------------------------------------------------------------------- using a fine-tuned model
def _load_finetuned(checkpoint: str | Path, device: str) -> tuple[nn.Module, Any, dict[str, Any], torch.device]:
    from bertforge.distributed import setup
    from bertforge.heads import BertForSequenceClassification
    from bertforge.tokenization import BertTokenizer

    model = BertForSequenceClassification.from_pretrained(checkpoint)
    if model.load_report.newly_initialized:
        raise ValueError(f"{checkpoint}: not a fine-tuned classifier (no weights for "
                         f"{', '.join(model.load_report.newly_initialized)})")
    dev = setup(device).device
    model.to(dev).eval()
    settings = dict(model.config.extra.get(SETTINGS_KEY) or {})
    return model, BertTokenizer.from_pretrained(checkpoint), settings, dev


def _label2id(model: nn.Module) -> dict[str, int] | None:
    config = model.config
    if config.num_labels == 1 or config.problem_type == "regression":
        return None
    return config.label2id or {str(i): i for i in range(config.num_labels)}


def evaluate(checkpoint: str | Path, task: str | None = None, file: str | Path = "", *,
             text_column: str | None = None, text_pair_column: str | None = None, label_column: str | None = None,
             max_seq_length: int | None = None, stride: int | None = None, batch_size: int = 64,
             skip_bad_rows: bool = False, device: str = "auto") -> dict[str, float]:
    """Metrics of a fine-tuned checkpoint on labelled file(s) (a GLUE folder: its dev split).

    Task, columns, max_seq_length and stride default to the ones the checkpoint was fine-tuned with."""
    model, tok, settings, dev = _load_finetuned(checkpoint, device)
    task = task or settings.get("task") or ("regression" if model.config.num_labels == 1 else "classification")
    columns = _columns(text_column or settings.get("text_column"), text_pair_column or settings.get("text_pair_column"),
                       label_column or settings.get("label_column"))
    length = max_seq_length or settings.get("max_seq_length", 128)
    stride = settings.get("stride", 0) if stride is None else stride
    splits = [_read_split(p, task, columns, _label2id(model), tok, length, stride, skip_bad_rows)
              for p in _files(str(file), task, "dev")]
    with torch.no_grad():
        metrics, _ = _evaluate_splits(model, splits, task, batch_size, dev)
    return metrics


def predict(checkpoint: str | Path, file: str | Path, out: str | Path | None = None, *, task: str | None = None,
            text_column: str | None = None, text_pair_column: str | None = None, max_seq_length: int | None = None,
            stride: int | None = None, batch_size: int = 64, skip_bad_rows: bool = False,
            device: str = "auto") -> list[dict[str, Any]]:
    """Predictions of a fine-tuned checkpoint for every example of ``file`` (labels not needed).

    Each is ``{"index", "line", "prediction", "scores"}``: the example's position in the file (from 0),
    its line, the label name (regression: the score) and the logits, averaged over its windows.
    ``out``: ``.jsonl`` writes these records, anything else a TSV of ``index <TAB> prediction``
    (GLUE's submission format)."""
    model, tok, settings, dev = _load_finetuned(checkpoint, device)
    task = task or settings.get("task")
    columns = _columns(text_column or settings.get("text_column"), text_pair_column or settings.get("text_pair_column"),
                       None)
    files = glue_files(task or "", file, "test")
    if len(files) != 1:
        raise ValueError(f"{file}: holds {len(files)} test files; name one")
    examples, _ = read_examples(files[0], task, require_labels=False, skip_bad_rows=skip_bad_rows, **columns)
    length = max_seq_length or settings.get("max_seq_length", 128)
    stride = settings.get("stride", 0) if stride is None else stride
    features = encode_examples(examples, tok, length, stride)
    logits = predict_logits(model, features, batch_size, dev)
    id2label = model.config.id2label or {}
    records = []
    for i, (e, row) in enumerate(zip(examples, logits)):
        pred: Any = float(row[0]) if len(row) == 1 else id2label.get(int(row.argmax()), str(int(row.argmax())))
        records.append({"index": i, "line": e.line, "prediction": pred, "scores": [round(float(x), 6) for x in row]})
    if out is not None:
        from bertforge.io import atomic_write_text

        if str(out).endswith(".jsonl"):
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        else:
            text = "index\tprediction\n" + "".join(f"{r['index']}\t{r['prediction']}\n" for r in records)
        atomic_write_text(out, text)
    return records
