"""Sequence classification and regression, one sentence or a pair: files -> examples -> encoded inputs ->
batches -> losses, predictions and metrics (docs/finetuning.md is the guide).

GLUE's own TSV layouts by task name (`GLUE_TASKS`, read with no quoting as the TF release reads them), and
generic CSV / TSV / JSON records with named columns. A GLUE task's label set is fixed in the TF release's
order; otherwise it is the sorted set of the training labels (numerically when all are integers), or the
order --label-names gives. An evaluation label outside the set is scored as wrong (`UNSEEN`), with a warning.
Long inputs are truncated the TF release's way or cut into windows whose logits prediction averages.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from bertforge.model import losses
from bertforge.settings import option
from bertforge.tasks.base import (PREDICTION_TABLE, AccuracyObjective, EvalData, EvalResult, ReadReport, TaskFamily,
                                  TaskSettings, TrainData, csv_rows, file_format, model_logits, numpy_logits,
                                  prediction_table, read_records, split_files, unseen_labels)
from bertforge.tasks.encoding import Windows, longest_first, predict_items, window_starts

__all__ = ["Example", "GlueDataset", "GLUE_TASKS", "ReadReport", "read_examples", "glue_files", "label_list",
           "ids_as_names", "targets", "encode_examples", "ClassificationObjective", "predict_logits",
           "compute_metrics", "main_metric", "label_fields", "prediction_records", "ClassificationFamily"]

logger = logging.getLogger("bertforge")

UNSEEN = -1
"""The class id of an evaluation file's label the model was not trained on: a class no prediction is."""


class Example(NamedTuple):
    text_a: str
    text_b: str | None
    label: str | None
    """The label as written in the file (a score's text for regression); None in unlabelled files."""
    line: int
    """Line of the file the example starts on (1-based), for error messages."""


@dataclass(frozen=True)
class GlueDataset:
    """Where a GLUE task's files keep their texts and label, and its label set."""

    name: str
    text_a: str
    text_b: str | None
    label: str
    labels: tuple[str, ...] | None
    """Class names in id order (the TF release's); None: regression."""
    positional: tuple[tuple[str, int], ...] = ()
    """Column positions in files without a header (CoLA's train.tsv / dev.tsv), and ..."""
    width: int = 0
    """... their number of fields."""
    no_label: tuple[str, ...] = ()
    """Label values meaning "no gold label": those rows are skipped (and counted)."""

    @property
    def regression(self) -> bool:
        return self.labels is None


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
GLUE_TASKS: dict[str, GlueDataset] = {t.name: t for t in (
    # CoLA train/dev: no header; source, label, original annotation, sentence. Its test file has a header.
    GlueDataset("cola", "sentence", None, "label", _BINARY, positional=(("sentence", 3), ("label", 1)), width=4),
    GlueDataset("sst2", "sentence", None, "label", _BINARY),
    GlueDataset("mrpc", "#1 String", "#2 String", "Quality", _BINARY),
    GlueDataset("qqp", "question1", "question2", "is_duplicate", _BINARY),
    GlueDataset("stsb", "sentence1", "sentence2", "score", None),
    GlueDataset("mnli", "sentence1", "sentence2", "gold_label", ("contradiction", "entailment", "neutral"),
             no_label=("-",)),
    GlueDataset("qnli", "question", "sentence", "label", _NLI2),
    GlueDataset("rte", "sentence1", "sentence2", "label", _NLI2),
    GlueDataset("wnli", "sentence1", "sentence2", "label", _BINARY),
)}

# Files of each split in a GLUE task folder; MNLI evaluates on two (matched, then mismatched).
_GLUE_SPLITS = {"train": ("train.tsv",), "dev": ("dev.tsv",), "test": ("test.tsv",)}
_MNLI_SPLITS = {"train": ("train.tsv",), "dev": ("dev_matched.tsv", "dev_mismatched.tsv"),
                "test": ("test_matched.tsv", "test_mismatched.tsv")}


def glue_files(task: str, path: str | Path, split: str) -> list[Path]:
    """The file(s) of ``split`` (train, dev or test) in a GLUE task folder; a file is returned as is."""
    path = Path(path)
    if not path.is_dir():
        return [path]
    names = (_MNLI_SPLITS if task == "mnli" else _GLUE_SPLITS)[split]
    files = [path / n for n in names]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(f"{path}: no {', '.join(missing)} (a GLUE {task or 'task'} folder holds "
                                f"{', '.join(names)} for {split})")
    return files


def read_examples(path: str | Path, task: str | None = None, *, text_column: str | None = None,
                  text_pair_column: str | None = None, label_column: str | None = None, require_labels: bool = True,
                  skip_bad_rows: bool = False) -> tuple[list[Example], ReadReport]:
    """Examples of one file, and what was skipped. ``task``: a GLUE task name (its columns and layout) or
    None for generic files (the text in a column ``text``, the label in ``label``, unless named); the
    column arguments override the task's. ``require_labels=False`` reads files without a label column."""
    path = Path(path)
    glue = GLUE_TASKS.get(task or "")
    col_a = text_column or (glue.text_a if glue else "text")
    hints = {} if glue else {"text": f"; name the text column with {option('text_column')}",
                             "label": f"; name the label column with {option('label_column')}"}
    col_b = text_pair_column or (glue.text_b if glue and not text_column else None)
    col_label = label_column or (glue.label if glue else "label")
    no_label = set(glue.no_label) if glue else set()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    report = ReadReport(str(path), skip_bad_rows=skip_bad_rows)
    bad = report.bad
    examples: list[Example] = []

    def add(line: int, a: Any, b: Any, label: Any, has_label: bool) -> None:
        label, problem = label_text(label) if has_label else ("", "")
        if problem:
            bad(line, problem)
            return
        if label == "" or label in no_label:
            if require_labels:
                report.skip("no label" if label == "" else f"no gold label {label!r}", line)
                return
            label = ""
        examples.append(Example(a, b, label or None, line))

    if file_format(path) == "records":
        for n, record in read_records(path, report):
            for col in (col_a, col_b, col_label if require_labels else None):
                if col is not None and col not in record:
                    raise ValueError(f"{path}:{n}: no key {col!r} (keys: {', '.join(map(str, record))})"
                                     f"{hints.get(col, '')}")
            a, b = record[col_a], record.get(col_b) if col_b else None
            if not isinstance(a, str) or (col_b is not None and not isinstance(b, str)):
                bad(n, f"texts must be strings, got {col_a}={a!r}" + (f", {col_b}={b!r}" if col_b else ""))
                continue
            add(n, a, b, record.get(col_label), col_label in record)
    else:
        header: list[str] | None = None
        positions: dict[str, int] = {}
        width = 0
        for line, row in csv_rows(path, file_format(path), report):
            if header is None and not positions:
                if glue and glue.positional and col_a not in row:  # CoLA train / dev: no header
                    positions, width = dict(glue.positional), glue.width
                else:
                    header, width = [h.strip() for h in row], len(row)
                    positions = {name: i for i, name in enumerate(header)}
                    for col in (col_a, col_b, col_label if require_labels else None):
                        if col is not None and col not in positions:
                            raise ValueError(f"{path}:{line}: no column {col!r} (columns: {', '.join(header)})"
                                             f"{hints.get(col, '')}")
                    continue
            if len(row) != width:
                bad(line, f"{len(row)} fields where the {'header has' if header else 'layout has'} {width}"
                          " (a tab or delimiter inside a text?)")
                continue
            has_label = col_label in positions
            add(line, row[positions[col_a]], row[positions[col_b]] if col_b else None,
                row[positions[col_label]] if has_label else None, has_label)
    report.finish(len(examples))
    return examples, report


def label_text(value: Any) -> tuple[str, str]:
    """A label as a record holds it -> (its text, "": no label), or ("", the problem) for a value no label can
    be: NaN is a missing value (pandas' and Arrow's), as an empty field is; an integral float is the integer
    a column with a missing value was widened from (1.0: "1"); an infinity or a list is refused."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "", ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "", f"label {value!r} is not a finite number"
        return (str(int(value)) if value.is_integer() else repr(value)), ""
    if not isinstance(value, (str, int)):
        return "", (f"a label is one value (a class name or a score), got {type(value).__name__} {value!r:.60}")
    return str(value).strip(), ""


def label_list(examples: Sequence[Example], task: str | None = None) -> list[str]:
    """The class names, in id order: a GLUE task's own, else the sorted labels of ``examples``."""
    glue = GLUE_TASKS.get(task or "")
    if glue is not None and glue.labels is not None:
        return list(glue.labels)
    found = {e.label for e in examples if e.label is not None}
    if all(x.lstrip("-").isdigit() for x in found):
        return sorted(found, key=int)
    return sorted(found)


def name_labels(examples: Sequence[Example], names: Sequence[str], path: str | Path) -> list[Example]:
    """``examples`` with their integer labels 0, 1, ... replaced by ``names`` (``--label-names``), a label that
    is one of the names kept (a file written with them), an error naming the file and line for any other."""
    out = []
    for e in examples:
        if e.label is not None and e.label not in names:
            if not (e.label.isdigit() and int(e.label) < len(names)):
                raise ValueError(f"{path}:{e.line}: label {e.label!r} is not one of 0..{len(names) - 1}, the "
                                 f"indexes of {option('label_names')} ({', '.join(names)})")
            e = e._replace(label=names[int(e.label)])
        out.append(e)
    return out


def ids_as_names(examples: Sequence[Example], label2id: Mapping[str, int]) -> list[Example]:
    """Integer labels read as the model's label ids where its labels are names that are not integers: a file
    written with a dataset's ids (0, 1) scores against a model trained on its names (negative, positive)."""
    names = {i: name for name, i in label2id.items()}
    if any(name.lstrip("-").isdigit() for name in label2id):
        return list(examples)
    return [e._replace(label=names[int(e.label)]) if e.label is not None and e.label.isdigit()
            and int(e.label) in names else e for e in examples]


def targets(examples: Sequence[Example], path: str | Path, label2id: Mapping[str, int] | None,
            unseen: int | None = None) -> np.ndarray:
    """Class ids (int64), or scores (float32) when ``label2id`` is None (regression). A label outside
    ``label2id`` is an error naming file and line, or, given ``unseen``, gets that id (an evaluation
    file's label the model was not trained on)."""
    if label2id is None:
        out = np.zeros(len(examples), dtype=np.float32)
        for i, e in enumerate(examples):
            try:
                score = float(e.label)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{e.line}: the score {e.label!r} is not a number") from None
            if not abs(score) <= float(np.finfo(np.float32).max):  # "nan", "inf", or beyond float32
                raise ValueError(f"{path}:{e.line}: the score {e.label!r} is not a finite number")
            out[i] = score
        return out
    ids = np.zeros(len(examples), dtype=np.int64)
    for i, e in enumerate(examples):
        got = label2id.get(e.label, unseen)  # type: ignore[arg-type]
        if got is None:
            raise ValueError(f"{path}:{e.line}: unknown label {e.label!r} (the model's labels: "
                             f"{', '.join(label2id)})")
        ids[i] = got
    return ids


# ---------------------------------------------------------------------------- encoding
def encode_examples(examples: Sequence[Example], tokenizer: Any, max_seq_length: int,
                    stride: int = 0, long_inputs: str = "truncate") -> Windows:
    """Tokenize; truncate long examples, or cut them into windows (``long_inputs``: module docstring).
    ``stride``: tokens between window starts (0: half a window); larger than a window would skip text,
    which is an error."""
    if max_seq_length < 4:
        raise ValueError(f"max_seq_length must be >= 4, got {max_seq_length}")
    if long_inputs not in ("truncate", "windows"):
        raise ValueError(f"long_inputs must be truncate or windows, got {long_inputs!r}")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids_a = tokenizer.encode_batch_ids([e.text_a for e in examples])
    pair_at = [i for i, e in enumerate(examples) if e.text_b is not None]
    ids_b: list[list[int] | None] = [None] * len(examples)
    for i, ids in zip(pair_at, tokenizer.encode_batch_ids([examples[i].text_b for i in pair_at])):
        ids_b[i] = ids
    out_ids: list[np.ndarray] = []
    num_a: list[int] = []
    example: list[int] = []

    def emit(i: int, seq: list[int], n_a: int) -> None:
        out_ids.append(np.array(seq, dtype=np.int64))
        num_a.append(n_a)
        example.append(i)

    windowed = truncated = cut_pairs = 0
    for i, (a, b) in enumerate(zip(ids_a, ids_b)):
        if long_inputs == "truncate":
            if b is None:
                n_a = min(len(a), max_seq_length - 2)
                emit(i, [cls, *a[:n_a], sep], n_a + 2)
                truncated += n_a < len(a)
            else:
                n_a, n_b = longest_first(len(a), len(b), max_seq_length - 3)
                emit(i, [cls, *a[:n_a], sep, *b[:n_b], sep], n_a + 2)
                truncated += n_a + n_b < len(a) + len(b)
            continue
        if b is None:
            room, fixed, long, fixed_first = max_seq_length - 2, [], a, True
        else:
            room = max_seq_length - 3
            if len(a) + len(b) <= room:
                emit(i, [cls, *a, sep, *b, sep], len(a) + 2)
                continue
            fixed_first = len(a) <= len(b)  # the shorter segment stays whole in every window
            fixed, long = (a, b) if fixed_first else (b, a)
            if len(fixed) > room // 2:
                fixed, cut_pairs = fixed[:room // 2], cut_pairs + 1
            room -= len(fixed)
        step = stride or max(1, room // 2)
        if step > room:
            raise ValueError(f"stride {stride} is longer than a window ({room} tokens): text between windows "
                             "would be skipped")
        starts = window_starts(len(long), room, step)
        windowed += len(starts) > 1
        for s in starts:
            piece = long[s:s + room]
            if b is None:
                emit(i, [cls, *piece, sep], len(piece) + 2)
            elif fixed_first:
                emit(i, [cls, *fixed, sep, *piece, sep], len(fixed) + 2)
            else:
                emit(i, [cls, *piece, sep, *fixed, sep], len(piece) + 2)
    return Windows(out_ids, np.array(num_a, dtype=np.int64), np.array(example, dtype=np.int64), len(examples),
                    windowed=windowed, truncated=truncated, cut_pairs=cut_pairs, max_seq_length=max_seq_length)


# ---------------------------------------------------------------------------- the task
class ClassificationObjective(AccuracyObjective):
    """Summed cross-entropy (or squared error, regression) over the windows of a batch; accuracy."""

    def __init__(self, regression: bool = False):
        self.regression = regression
        self.term = "regression" if regression else "classification"

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        logits = model_logits(model, batch).logits  # (B, C)
        labels = batch["labels"]
        problem = "regression" if self.regression else "single_label_classification"
        loss = losses.sequence_classification_loss(logits, labels, problem, reduction="sum")
        if self.regression:
            return {self.term: loss}, {}
        return {self.term: loss}, {"correct": (logits.argmax(-1) == labels).sum()}

    def metrics(self, loss_sums: dict[str, float], counts: dict[str, float],
                stats: dict[str, float]) -> dict[str, float]:
        return {} if self.regression else super().metrics(loss_sums, counts, stats)


def predict_logits(model: nn.Module, encoded: Windows, batch_size: int, device: torch.device | str = "cpu",
                   dist: Any = None) -> np.ndarray:
    """(examples, labels) logits, each the mean over its example's windows. With ``dist``, every
    process predicts a part and all get the whole."""
    rows = predict_items(model, encoded, batch_size, device, numpy_logits, dist)
    C = getattr(getattr(model, "config", None), "num_labels", None) or (len(rows[0]) if rows else 1)
    per_window = np.array(rows, dtype=np.float64).reshape(len(rows), C)
    sums = np.zeros((encoded.num_examples, C), dtype=np.float64)
    np.add.at(sums, encoded.example, per_window)
    counts = np.bincount(encoded.example, minlength=encoded.num_examples)
    return sums / np.maximum(counts, 1)[:, None]


# ---------------------------------------------------------------------------- metrics
def compute_metrics(task: str | None, preds: np.ndarray, labels: np.ndarray, num_labels: int) -> dict[str, float]:
    """A GLUE task's metrics (`bertforge.metrics.glue_metrics`); otherwise accuracy (+ F1 of class 1
    with two classes), or Pearson / Spearman for regression."""
    from bertforge import metrics  # imported here: it is written alongside this module

    if task in GLUE_TASKS:
        return dict(metrics.glue_metrics(task, preds, labels))
    if num_labels == 1:
        return {"pearson": float(metrics.pearson(preds, labels)), "spearman": float(metrics.spearman(preds, labels))}
    out = {"accuracy": float(metrics.accuracy(preds, labels))}
    if num_labels == 2:
        out["f1"] = float(metrics.f1_binary(preds, labels))
    return out


# The metric the best checkpoint is chosen by: the first of these names the metrics hold.
_MAIN = {"cola": ("matthews", "matthews_corrcoef", "mcc"), "stsb": ("pearson", "spearman"),
         "mrpc": ("f1", "accuracy", "acc"), "qqp": ("f1", "accuracy", "acc")}


def main_metric(task: str | None, metrics: Mapping[str, float], regression: bool = False) -> str:
    """Name of the task's main metric among ``metrics`` (the paper's: MCC for CoLA, Pearson for
    STS-B, F1 for MRPC / QQP, accuracy otherwise)."""
    names = _MAIN.get(task or "", ("pearson", "spearman") if regression else ("accuracy", "acc"))
    for name in names:
        if name in metrics:
            return name
    for name in metrics:  # any metric whose name ends with a preferred one (e.g. "mnli/acc")
        if name.endswith(names):
            return name
    if not metrics:
        raise ValueError("no metrics to choose the best checkpoint by")
    return next(iter(metrics))


# ---------------------------------------------------------------------------- predictions
def label_fields(config: Any, logits: np.ndarray) -> list[dict[str, Any]]:
    """``{"label", "score", "probabilities"}`` per row of ``logits``: the best label, its probability and every
    label's (softmax; a multi-label head: sigmoids, and ``labels``, those above 0.5); regression: ``{"score"}``."""
    problem = getattr(config, "problem_type", None)
    if config.num_labels == 1 or problem == "regression":
        return [{"score": float(row[0])} for row in logits]
    id2label = config.id2label or {}
    names = [id2label.get(i, str(i)) for i in range(config.num_labels)]
    multi = problem == "multi_label_classification"
    probs = 1 / (1 + np.exp(-logits)) if multi else np.exp(logits - logits.max(1, keepdims=True))
    if not multi:
        probs /= probs.sum(1, keepdims=True)
    fields = []
    for p in probs:
        best = int(p.argmax())
        row: dict[str, Any] = {"label": names[best], "score": float(p[best])}
        if multi:
            row["labels"] = [names[c] for c in np.flatnonzero(p > 0.5)]
        fields.append({**row, "probabilities": dict(zip(names, p.tolist()))})
    return fields


def prediction_records(examples: Sequence[Example], logits: np.ndarray, config: Any,
                       gold: bool = False) -> list[dict[str, Any]]:
    """The Predictor's record of each example (``index``, ``text``, ``text_pair`` for pairs, `label_fields`)
    with its ``line`` in the file; with ``gold``, also its label as the file writes it. With windows, the
    logits are averaged over the example's windows."""
    return [{"index": i, "line": e.line, "text": e.text_a, **({"text_pair": e.text_b} if e.text_b is not None else {}),
             **fields, **({"gold": e.label} if gold else {})}
            for i, (e, fields) in enumerate(zip(examples, label_fields(config, logits)))]


# ---------------------------------------------------------------------------- the family
class ClassificationFamily(TaskFamily):
    """Sequence classification and regression (`bertforge.tasks.base.TaskFamily`): GLUE by task name,
    ``classification`` / ``regression`` for generic files."""

    name = "classification"
    head = "BertForSequenceClassification"
    tasks = (*GLUE_TASKS, "classification", "regression")
    settings = ("task", "max_seq_length", "long_inputs", "stride", "text_column", "text_pair_column",
                "label_column", "label_names")

    def configure(self, cfg: TaskSettings) -> TaskSettings:
        """The defaults; a --stride is refused unless long inputs get windows (truncation would ignore it)."""
        cfg = super().configure(cfg)
        glue = GLUE_TASKS.get(cfg.task)
        if cfg.label_names and (self.regression(cfg.task) or (glue is not None and glue.labels is not None)):
            raise ValueError(f"{option('label_names')} names integer class labels; {cfg.task} has "
                             f"{'scores' if self.regression(cfg.task) else 'labels of its own'}")
        if cfg.stride and cfg.long_inputs != "windows":
            raise ValueError(f"{option('stride', cfg.stride)} places windows, but long inputs are truncated "
                             f"({option('long_inputs', 'truncate')}); give {option('long_inputs', 'windows')}, or no "
                             f"{option('stride')}")
        return cfg

    def metric_names(self, task: str) -> tuple[str, ...]:
        from bertforge.metrics import glue_metric_names

        if task in GLUE_TASKS:
            return glue_metric_names(task)
        return ("pearson", "spearman") if self.regression(task) else ("accuracy", "f1")

    @staticmethod
    def regression(task: str) -> bool:
        glue = GLUE_TASKS.get(task)
        return glue.regression if glue else task == "regression"

    def files(self, cfg: TaskSettings, spec: str, split: str) -> list[Path]:
        return [f for part in split_files(spec) for f in glue_files(cfg.task, part, split)]

    @staticmethod
    def _read(cfg: TaskSettings, path: Path, require_labels: bool) -> tuple[list[Example], ReadReport]:
        examples, report = read_examples(path, cfg.task, text_column=cfg.text_column or None,
                                         text_pair_column=cfg.text_pair_column or None,
                                         label_column=cfg.label_column or None, require_labels=require_labels,
                                         skip_bad_rows=cfg.skip_bad_rows)
        return (name_labels(examples, cfg.named_labels(), path) if cfg.label_names else examples), report

    @staticmethod
    def _encode(cfg: TaskSettings, tokenizer: Any, examples: Sequence[Example], what: str = "") -> Windows:
        """The examples encoded; what was truncated or windowed is logged, naming ``what`` (the file)."""
        encoded = encode_examples(examples, tokenizer, cfg.max_seq_length, cfg.stride, cfg.long_inputs)
        if what and (encoded.truncated or encoded.windowed):
            logger.info("%s: %s", what, encoded.summary())
        return encoded

    def train_data(self, cfg: TaskSettings, tokenizer: Any) -> TrainData:
        read = [(path, *self._read(cfg, path, True)) for path in self.files(cfg, cfg.train_file, "train")]
        examples = [e for _, got, _ in read for e in got]
        if not examples:
            raise ValueError(f"{cfg.train_file}: no labelled training examples")
        labels = None if self.regression(cfg.task) else cfg.named_labels() or label_list(examples, cfg.task)
        if labels is not None and len(labels) < 2:
            raise ValueError(f"{cfg.train_file}: one label only ({labels[0]!r}): nothing to classify")
        label2id = None if labels is None else {name: i for i, name in enumerate(labels)}
        y = np.concatenate([targets(got, path, label2id) for path, got, _ in read])
        encoded = self._encode(cfg, tokenizer, examples, cfg.train_file).with_labels(y)
        head: dict[str, Any] = ({"num_labels": 1, "id2label": None, "problem_type": "regression"} if labels is None
                                else {"id2label": dict(enumerate(labels)),
                                      "problem_type": "single_label_classification"})
        return TrainData(encoded, head, labels, [r for _, _, r in read], encoded.summary())

    def eval_data(self, cfg: TaskSettings, tokenizer: Any, path: Path, label2id: dict[str, int] | None) -> EvalData:
        examples, report = self._read(cfg, path, True)
        if not examples:
            raise ValueError(f"{report.summary()}: no labelled examples")
        if label2id is not None:
            examples = ids_as_names(examples, label2id)
            unseen_labels(path, (e.label for e in examples), label2id)
        y = targets(examples, path, label2id, unseen=UNSEEN)
        encoded = self._encode(cfg, tokenizer, examples, str(path)).with_labels(y)
        return EvalData(path, (encoded, y, examples), report, encoded.summary())

    def objective(self, config: Any) -> ClassificationObjective:
        return ClassificationObjective(regression=config.problem_type == "regression" or config.num_labels == 1)

    def evaluate(self, model: nn.Module, data: EvalData, cfg: TaskSettings, device: torch.device,
                 dist: Any = None) -> EvalResult:
        """The task's metrics, and ``predictions.tsv``: `format_predictions` of the file's records with
        the gold label."""
        encoded, y, examples = data.data
        logits = predict_logits(model, encoded, cfg.eval_batch_size, device, dist)
        C = logits.shape[1]
        preds = logits[:, 0] if C == 1 else logits.argmax(-1)
        metrics = compute_metrics(cfg.task if cfg.task in GLUE_TASKS else None, preds, y, C)
        records = prediction_records(examples, logits, model.config, gold=True)
        return EvalResult(metrics, main_metric(cfg.task, metrics, C == 1),
                          {PREDICTION_TABLE: self.format_predictions(records, Path(PREDICTION_TABLE))})

    def predict(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, path: Path,
                device: torch.device) -> list[dict[str, Any]]:
        """`prediction_records` of every example of ``path``."""
        examples, _ = self._read(cfg, path, False)
        encoded = self._encode(cfg, tokenizer, examples, str(path))
        return prediction_records(examples, predict_logits(model, encoded, cfg.eval_batch_size, device), model.config)

    def format_predictions(self, records: list[dict[str, Any]], out: Path) -> str:
        """GLUE's submission format: ``index <TAB> prediction``, and ``gold`` when the records have it."""
        return prediction_table(records)

    def predict_texts(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, texts: Sequence[Sequence[str]],
                      device: torch.device | str) -> list[dict[str, Any]]:
        """``{"index", "text", "text_pair" (pairs only), "label", "score", "probabilities"}`` per text or
        pair: the best label, its probability and every label's (softmax over the logits; with windows,
        averaged over the input's windows). A multi-label head gives sigmoids and ``labels``, those above
        0.5; a regression head ``{"index", "text", ("text_pair"), "score"}``."""
        pairs = [(t[0], t[1] if len(t) > 1 else None) for t in texts]
        encoded = self._encode(cfg, tokenizer, [Example(a, b, None, i + 1) for i, (a, b) in enumerate(pairs)])
        logits = predict_logits(model, encoded, cfg.eval_batch_size, device)  # (N, C)
        return [{"index": i, "text": a, **({"text_pair": b} if b is not None else {}), **fields}
                for i, ((a, b), fields) in enumerate(zip(pairs, label_fields(model.config, logits)))]
