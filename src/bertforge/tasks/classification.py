"""Sequence classification and regression, one sentence or a pair: files -> examples -> features ->
batches -> losses, predictions and metrics.

Files. `read_examples` reads GLUE's own TSV layouts, selected by task name (`GLUE_TASKS`: CoLA's
header-less train/dev, MRPC's ``Quality`` / ``#1 String`` columns, MNLI's ``gold_label``, ...; test
files without labels too), and generic CSV / TSV / JSONL with named columns. GLUE's TSVs are read
with no quoting (quotes are part of the text), as the TF release reads them; generic ``.tsv`` too,
``.csv`` with standard CSV quoting. A missing column, a malformed row or JSON record is an error
naming the file and line (``skip_bad_rows`` skips malformed rows instead); rows that carry no label
(an empty label, MNLI's ``-``) are skipped, unless labels are not needed (prediction). Whatever is skipped is counted in the `ReadReport`,
with its line numbers, and logged: nothing is dropped silently.

Labels. The label set of a GLUE task is fixed (its list below, in the TF release's order); for
other files it is the sorted set of the training file's labels (numerically sorted when all are
integers). A label outside the set in an evaluation file is an error naming file and line. STS-B
(and ``regression=True``) reads the label as a float score.

Long inputs: windows, never silent truncation. ``[CLS] A [SEP]`` (or ``[CLS] A [SEP] B [SEP]``)
longer than ``max_seq_length`` is cut into overlapping windows: window k holds the tokens from
``k * stride`` on (``stride`` defaults to half a window), and windows follow each other until one
reaches the end of the text. For a pair, the shorter segment is kept whole in every window (up to
half the room; beyond that it is cut, and such pairs are counted and logged) and the longer one is
windowed. Training uses every window, each with its example's label; prediction averages the
windows' logits per example (regression: their scores), so one prediction comes out per example.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from bertforge.data.loader import PretrainingLoader
from bertforge import losses
from bertforge.io import COMPRESSED_SUFFIXES, open_binary

__all__ = ["Example", "GlueTask", "GLUE_TASKS", "ReadReport", "read_examples", "glue_files", "label_list",
           "targets", "Features", "encode_examples", "FeatureBatches", "ClassificationTask", "predict_logits",
           "compute_metrics", "main_metric"]

logger = logging.getLogger("bertforge")


class Example(NamedTuple):
    text_a: str
    text_b: str | None
    label: str | None
    """The label as written in the file (a score's text for regression); None in unlabelled files."""
    line: int
    """Line of the file the example starts on (1-based), for error messages."""


@dataclass(frozen=True)
class GlueTask:
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
GLUE_TASKS: dict[str, GlueTask] = {t.name: t for t in (
    # CoLA train/dev: no header; source, label, original annotation, sentence. Its test file has a header.
    GlueTask("cola", "sentence", None, "label", _BINARY, positional=(("sentence", 3), ("label", 1)), width=4),
    GlueTask("sst2", "sentence", None, "label", _BINARY),
    GlueTask("mrpc", "#1 String", "#2 String", "Quality", _BINARY),
    GlueTask("qqp", "question1", "question2", "is_duplicate", _BINARY),
    GlueTask("stsb", "sentence1", "sentence2", "score", None),
    GlueTask("mnli", "sentence1", "sentence2", "gold_label", ("contradiction", "entailment", "neutral"),
             no_label=("-",)),
    GlueTask("qnli", "question", "sentence", "label", _NLI2),
    GlueTask("rte", "sentence1", "sentence2", "label", _NLI2),
    GlueTask("wnli", "sentence1", "sentence2", "label", _BINARY),
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


@dataclass
class ReadReport:
    """What reading one file kept and skipped."""

    path: str
    examples: int = 0
    blank_lines: int = 0
    skipped: dict[str, list[int]] = field(default_factory=dict)
    """Reason -> line numbers of the rows skipped for it."""

    def skip(self, reason: str, line: int) -> None:
        self.skipped.setdefault(reason, []).append(line)

    @property
    def num_skipped(self) -> int:
        return sum(len(v) for v in self.skipped.values())

    def summary(self) -> str:
        text = f"{self.path}: {self.examples:,} examples"
        for reason, lines in self.skipped.items():
            shown = ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")
            text += f"; skipped {len(lines):,} rows ({reason}; lines {shown})"
        return text


def _format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes if s.lower() not in COMPRESSED_SUFFIXES]
    kind = suffixes[-1] if suffixes else ""
    if kind in (".tsv", ".txt"):
        return "tsv"
    if kind == ".csv":
        return "csv"
    if kind in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    raise ValueError(f"{path}: unknown file type {kind or '(none)'!r}; expected .tsv, .csv or .jsonl "
                     "(optionally .gz / .bz2 / .xz)")


def _text_lines(path: Path) -> io.TextIOWrapper:
    # utf-8-sig: MRPC's files (and Excel's CSVs) start with a byte-order mark.
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")


def _csv_rows(path: Path, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(first line of the record, fields) of a CSV / TSV file; blank lines give []."""
    old_limit = csv.field_size_limit()
    csv.field_size_limit(1 << 30)  # a long document is a normal input here (it gets windows)
    try:
        with _text_lines(path) as f:
            if fmt == "tsv":
                reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            else:
                reader = csv.reader(f)
            start = 1
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as e:
                    raise ValueError(f"{path}:{reader.line_num}: malformed {fmt.upper()} ({e})") from None
                yield start, row
                start = reader.line_num + 1
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    finally:
        csv.field_size_limit(old_limit)


def read_examples(
    path: str | Path,
    task: str | None = None,
    *,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str | None = None,
    require_labels: bool = True,
    skip_bad_rows: bool = False,
) -> tuple[list[Example], ReadReport]:
    """Examples of one file, and what was skipped.

    ``task``: a GLUE task name (its columns and layout) or None for generic files; the column
    arguments override the task's. ``require_labels=False`` reads files without a label column
    (GLUE's test files, files to predict on).
    """
    path = Path(path)
    glue = GLUE_TASKS.get(task or "")
    col_a = text_column or (glue.text_a if glue else None)
    if not col_a:
        raise ValueError(f"{path}: name the text column (--text-column) for a file of no GLUE task")
    col_b = text_pair_column or (glue.text_b if glue and not text_column else None)
    col_label = label_column or (glue.label if glue else "label")
    no_label = set(glue.no_label) if glue else set()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    report = ReadReport(str(path))
    examples: list[Example] = []

    def add(line: int, a: Any, b: Any, label: Any, has_label: bool) -> None:
        label = "" if label is None or not has_label else str(label).strip()
        if label == "" or label in no_label:
            if require_labels:
                report.skip("no label" if label == "" else f"no gold label {label!r}", line)
                return
            label = ""
        examples.append(Example(a, b, label or None, line))

    def bad(line: int, message: str) -> None:
        if not skip_bad_rows:
            raise ValueError(f"{path}:{line}: {message}")
        report.skip("malformed", line)

    if _format(path) == "jsonl":
        try:
            with _text_lines(path) as f:
                for n, text in enumerate(f, 1):
                    if not text.strip():
                        report.blank_lines += 1
                        continue
                    try:
                        record = json.loads(text)
                    except json.JSONDecodeError as e:
                        bad(n, f"not a JSON record ({e})")
                        continue
                    if not isinstance(record, dict):
                        bad(n, f"expected a JSON object, got {type(record).__name__}")
                        continue
                    for col in (col_a, col_b, col_label if require_labels else None):
                        if col is not None and col not in record:
                            raise ValueError(f"{path}:{n}: no key {col!r} (keys: {', '.join(map(str, record))})")
                    a, b = record[col_a], record.get(col_b) if col_b else None
                    if not isinstance(a, str) or (col_b is not None and not isinstance(b, str)):
                        bad(n, f"texts must be strings, got {col_a}={a!r}" + (f", {col_b}={b!r}" if col_b else ""))
                        continue
                    add(n, a, b, record.get(col_label), col_label in record)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    else:
        rows = _csv_rows(path, _format(path))
        header: list[str] | None = None
        positions: dict[str, int] = {}
        width = 0
        for line, row in rows:
            if not row or row == [""]:
                report.blank_lines += 1
                continue
            if header is None and not positions:
                if glue and glue.positional and col_a not in row:  # CoLA train / dev: no header
                    positions, width = dict(glue.positional), glue.width
                else:
                    header, width = [h.strip() for h in row], len(row)
                    positions = {name: i for i, name in enumerate(header)}
                    for col in (col_a, col_b, col_label if require_labels else None):
                        if col is not None and col not in positions:
                            raise ValueError(f"{path}:{line}: no column {col!r} (columns: {', '.join(header)})")
                    continue
            if len(row) != width:
                bad(line, f"{len(row)} fields where the {'header has' if header else 'layout has'} {width}"
                          " (a tab or delimiter inside a text?)")
                continue
            has_label = col_label in positions
            add(line, row[positions[col_a]], row[positions[col_b]] if col_b else None,
                row[positions[col_label]] if has_label else None, has_label)
    report.examples = len(examples)
    if report.num_skipped:
        logger.warning("%s", report.summary())
    return examples, report


def label_list(examples: Sequence[Example], task: str | None = None) -> list[str]:
    """The class names, in id order: a GLUE task's own, else the sorted labels of ``examples``."""
    glue = GLUE_TASKS.get(task or "")
    if glue is not None and glue.labels is not None:
        return list(glue.labels)
    found = {e.label for e in examples if e.label is not None}
    if all(x.lstrip("-").isdigit() for x in found):
        return sorted(found, key=int)
    return sorted(found)


def targets(examples: Sequence[Example], path: str | Path, label2id: Mapping[str, int] | None) -> np.ndarray:
    """Class ids (int64), or scores (float32) when ``label2id`` is None (regression)."""
    if label2id is None:
        out = np.zeros(len(examples), dtype=np.float32)
        for i, e in enumerate(examples):
            try:
                out[i] = float(e.label)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{e.line}: the score {e.label!r} is not a number") from None
        return out
    ids = np.zeros(len(examples), dtype=np.int64)
    for i, e in enumerate(examples):
        try:
            ids[i] = label2id[e.label]  # type: ignore[index]
        except KeyError:
            raise ValueError(f"{path}:{e.line}: unknown label {e.label!r} (the model's labels: "
                             f"{', '.join(label2id)})") from None
    return ids


# ---------------------------------------------------------------------------- features
@dataclass
class Features:
    """Token ids of every window, and the example each window comes from."""

    input_ids: list[np.ndarray]
    num_a: np.ndarray
    """Tokens of type 0 in each window: [CLS] A [SEP]."""
    example: np.ndarray
    num_examples: int
    labels: np.ndarray | None = None
    """One per window (its example's): class ids or scores."""
    windowed: int = 0
    """Examples longer than max_seq_length (cut into several windows)."""
    cut_pairs: int = 0
    """Pairs whose shorter segment exceeded half the room and was cut."""

    def __len__(self) -> int:
        return len(self.input_ids)

    def with_labels(self, per_example: np.ndarray) -> "Features":
        self.labels = per_example[self.example]
        return self

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Windows -> tensors padded to the longest of the batch."""
        rows = [self.input_ids[i] for i in indices]
        B, T = len(rows), max(len(r) for r in rows)
        input_ids = np.zeros((B, T), dtype=np.int64)
        attention_mask = np.zeros((B, T), dtype=np.int64)
        token_type_ids = np.zeros((B, T), dtype=np.int64)
        for i, (k, r) in enumerate(zip(indices, rows)):
            input_ids[i, :len(r)] = r
            attention_mask[i, :len(r)] = 1
            token_type_ids[i, self.num_a[k]:len(r)] = 1
        batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(attention_mask),
                 "token_type_ids": torch.from_numpy(token_type_ids)}
        if self.labels is not None:
            batch["labels"] = torch.from_numpy(self.labels[np.asarray(indices)])
        return batch

    def summary(self) -> str:
        text = f"{self.num_examples:,} examples -> {len(self):,} windows"
        if self.windowed:
            text += f" ({self.windowed:,} examples longer than one window)"
        if self.cut_pairs:
            text += f"; {self.cut_pairs:,} pairs had their shorter segment cut to half the room"
        return text


def _starts(n: int, size: int, stride: int) -> list[int]:
    """Window starts over ``n`` tokens: every ``stride`` tokens until a window reaches the end."""
    starts = [0]
    while starts[-1] + size < n:
        starts.append(starts[-1] + stride)
    return starts


def encode_examples(examples: Sequence[Example], tokenizer: Any, max_seq_length: int,
                    stride: int = 0) -> Features:
    """Tokenize and cut into windows (module docstring). ``stride``: tokens between window starts
    (0: half a window); larger than a window would skip text, which is an error."""
    if max_seq_length < 4:
        raise ValueError(f"max_seq_length must be >= 4, got {max_seq_length}")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids_a = tokenizer.encode_batch_ids([e.text_a for e in examples])
    pair_at = [i for i, e in enumerate(examples) if e.text_b is not None]
    ids_b: list[list[int] | None] = [None] * len(examples)
    for i, ids in zip(pair_at, tokenizer.encode_batch_ids([examples[i].text_b for i in pair_at])):
        ids_b[i] = ids
    out_ids: list[np.ndarray] = []
    num_a: list[int] = []
    example: list[int] = []
    windowed = cut_pairs = 0
    for i, (a, b) in enumerate(zip(ids_a, ids_b)):
        if b is None:
            room, fixed, long, fixed_first = max_seq_length - 2, [], a, True
        else:
            room = max_seq_length - 3
            if len(a) + len(b) <= room:
                out_ids.append(np.array([cls, *a, sep, *b, sep], dtype=np.int64))
                num_a.append(len(a) + 2)
                example.append(i)
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
        starts = _starts(len(long), room, step)
        windowed += len(starts) > 1
        for s in starts:
            piece = long[s:s + room]
            if b is None:
                seq, n_a = [cls, *piece, sep], len(piece) + 2
            elif fixed_first:
                seq, n_a = [cls, *fixed, sep, *piece, sep], len(fixed) + 2
            else:
                seq, n_a = [cls, *piece, sep, *fixed, sep], len(piece) + 2
            out_ids.append(np.array(seq, dtype=np.int64))
            num_a.append(n_a)
            example.append(i)
    return Features(out_ids, np.array(num_a, dtype=np.int64), np.array(example, dtype=np.int64), len(examples),
                    windowed=windowed, cut_pairs=cut_pairs)


# ---------------------------------------------------------------------------- batches
class _InMemory:
    """Features seen as the one-shard dataset `PretrainingLoader` reads (an instance is its index)."""

    config = {"dynamic_masking": False, "nsp": False, "max_predictions_per_seq": 0}

    def __init__(self, features: Features, name: str):
        self.features = features
        self.folder = name
        self.sizes = np.array([len(features)], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.features)

    def shard(self, index: int) -> "_InMemory":
        return self

    def instance(self, index: int) -> int:
        return index


class FeatureBatches(PretrainingLoader):
    """Training batches over features in memory, with `PretrainingLoader`'s order (seeded shuffle per
    epoch), rank slices of every global batch (the last incomplete one is dropped) and exact resume
    (``state_dict`` / ``load_state_dict``: epoch and position). Padded to the batch's longest."""

    def __init__(self, features: Features, batch_size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                 name: str = "training data"):
        if features.labels is None:
            raise ValueError(f"{name}: training features need labels")
        dataset: Any = _InMemory(features, name)
        super().__init__(dataset, batch_size, seed=seed, rank=rank, world_size=world_size, pad_to_multiple_of=1)
        self.features = features

    def collate(self, instances: list) -> dict[str, torch.Tensor]:
        return self.features.collate(instances)


# ---------------------------------------------------------------------------- the task
class ClassificationTask:
    """Summed cross-entropy (or squared error, regression) over the windows of a batch; accuracy."""

    def __init__(self, regression: bool = False):
        self.regression = regression
        self.term = "regression" if regression else "classification"

    def counts(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        return {self.term: float(batch["labels"].shape[0])}

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits  # (B, C)
        labels = batch["labels"]
        problem = "regression" if self.regression else "single_label_classification"
        loss = losses.sequence_classification_loss(logits, labels, problem, reduction="sum")
        if self.regression:
            return {self.term: loss}, {}
        return {self.term: loss}, {"correct": (logits.argmax(-1) == labels).sum()}

    def metrics(self, loss_sums: dict[str, float], counts: dict[str, float],
                stats: dict[str, float]) -> dict[str, float]:
        if self.regression:
            return {}
        return {"accuracy": stats.get("correct", 0.0) / max(counts.get(self.term, 0.0), 1.0)}


@torch.no_grad()
def predict_logits(model: nn.Module, features: Features, batch_size: int, device: torch.device | str = "cpu",
                   dist: Any = None) -> np.ndarray:
    """(examples, labels) logits, each the mean over its example's windows. With ``dist``, every
    process predicts a part and all get the whole."""
    rank, world = (dist.rank, dist.world_size) if dist is not None and dist.enabled else (0, 1)
    order = np.argsort([len(x) for x in features.input_ids], kind="stable")  # similar lengths batch together
    parts = np.array_split(order, world)
    mine = parts[rank]
    rows: list[np.ndarray] = []
    # Every process runs the same number of forward passes (a sharded model's forward is collective).
    for k in range(-(-len(parts[0]) // batch_size)):
        idx = mine[k * batch_size:(k + 1) * batch_size]
        batch = features.collate(idx if len(idx) else order[:1])
        logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device),
                       batch["token_type_ids"].to(device)).logits.float().cpu().numpy()
        if len(idx):
            rows.append(logits)
    C = getattr(getattr(model, "config", None), "num_labels", None) or (rows[0].shape[1] if rows else 1)
    got = [(mine, np.concatenate(rows) if rows else np.zeros((0, C), np.float32))]
    if world > 1:
        got = dist.gather_objects(got[0])
    per_window = np.zeros((len(features), C), dtype=np.float64)
    for idx, logits in got:
        per_window[idx] = logits
    sums = np.zeros((features.num_examples, C), dtype=np.float64)
    np.add.at(sums, features.example, per_window)
    counts = np.bincount(features.example, minlength=features.num_examples)
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
