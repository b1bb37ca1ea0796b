"""What every fine-tuning task family shares, and the contract a family fulfils for the recipe.

A *family* (`TaskFamily`) is one of the paper's fine-tuning setups: sequence classification /
regression, token tagging, extractive QA, multiple choice. `bertforge.tasks.finetune` drives any of them
through the shared loop the same way:

    family = family_for(cfg.task)                        # the registry in bertforge.tasks
    cfg = family.configure(cfg)                          # the family's defaults (max_seq_length 0 -> 384 for SQuAD)
    train = family.train_data(cfg, tokenizer)            # TrainData: features with targets, head kwargs, label set
    dev = [family.eval_data(cfg, tokenizer, p, train.label2id) for p in family.files(cfg, cfg.dev_file, "dev")]
    model = family.model_class.from_pretrained(cfg.model, ignore_mismatched_sizes=True, **train.head)
    Trainer(model, family.train_task(model.config), FeatureBatches(train.features, ...), ...)
    result = family.evaluate(model, dev[k], cfg, device, dist)   # EvalResult: metrics, main metric, files
    records = family.predict(model, tokenizer, cfg, path, device)   # one JSON-able dict per example
    text = family.format_predictions(records, out_path)            # the family's native prediction file

Features. A family's features are any object with ``len()``, ``lengths`` (tokens per item, to
batch similar lengths together at prediction) and ``collate(indices) -> dict of tensors`` (with
the training targets when the features have them). `FeatureBatches` turns them into the loop's
resumable, rank-sliced, shuffled training batches; `predict_items` runs a model over them in
length-sorted batches (split across processes when distributed).

Reading. `ReadReport` counts what a reader kept and skipped (with line numbers): nothing is dropped
silently. `csv_rows` and `text_lines` read (possibly compressed) UTF-8 text with errors naming the
file and line.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from torch import nn

from bertforge.data.loader import PretrainingLoader
from bertforge.io import COMPRESSED_SUFFIXES, open_binary

if TYPE_CHECKING:
    from bertforge.tasks.finetune import FinetuneConfig

__all__ = ["ReadReport", "text_lines", "csv_rows", "jsonl_records", "file_format", "split_files", "window_starts",
           "max_context_window", "FeatureSet", "TrainData", "EvalData", "EvalResult", "TaskFamily", "FamilyDefaults",
           "FeatureBatches", "predict_items"]


# ---------------------------------------------------------------------------- reading
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


def text_lines(path: Path) -> io.TextIOWrapper:
    """A (possibly compressed) UTF-8 file as text; a byte-order mark is dropped (MRPC's files and
    Excel's CSVs start with one). Undecodable bytes raise UnicodeDecodeError: callers name the line."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")


def csv_rows(path: Path, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(first line of the record, fields) of a CSV (``fmt="csv"``: standard quoting) or TSV file
    (``"tsv"``: no quoting, as the TF release reads GLUE); blank lines give []."""
    old_limit = csv.field_size_limit()
    csv.field_size_limit(1 << 30)  # a long document is a normal input here (it gets windows)
    start = 1
    try:
        with text_lines(path) as f:
            if fmt == "tsv":
                reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            else:
                reader = csv.reader(f)
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
        raise ValueError(f"{path}: not UTF-8 text at or after line {start} ({e})") from None
    finally:
        csv.field_size_limit(old_limit)


def jsonl_records(path: Path, report: ReadReport, bad: Callable[[int, str], None]) -> Iterator[tuple[int, dict]]:
    """(line, object) of every JSON object of a JSON-lines file; blank lines are counted in ``report``,
    a line that is no JSON object goes to ``bad(line, message)`` (which raises or counts a skip)."""
    n = 0
    try:
        with text_lines(path) as f:
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
                yield n, record
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{n + 1}: not UTF-8 text ({e})") from None


def file_format(path: Path) -> str:
    """"tsv" (.tsv, .txt), "csv" or "jsonl" (.jsonl, .json, .ndjson), compressed or not."""
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


def split_files(spec: str | Path) -> list[Path]:
    """``a.tsv,b.tsv`` -> the files (a single path as is)."""
    return [Path(part.strip()) for part in str(spec).split(",") if part.strip()]


# ---------------------------------------------------------------------------- windows
def window_starts(n: int, size: int, stride: int) -> list[int]:
    """Starts of the windows of ``size`` over ``n`` tokens: every ``stride`` tokens until one reaches the end."""
    starts = [0]
    while starts[-1] + size < n:
        starts.append(starts[-1] + stride)
    return starts


def max_context_window(starts: np.ndarray, lengths: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """For each token position, the window (index into ``starts`` / ``lengths``) where it has the most
    context: the TF release's SQuAD rule, score = min(tokens left of it, tokens right of it in the
    window) + 0.01 * window length, the first window on a tie. (positions,) int64."""
    starts = np.asarray(starts, dtype=np.int64)[:, None]
    lengths = np.asarray(lengths, dtype=np.int64)[:, None]
    p = np.asarray(positions, dtype=np.int64)[None, :]
    left, right = p - starts, starts + lengths - 1 - p  # (windows, positions)
    score = np.where((left >= 0) & (right >= 0), np.minimum(left, right) + 0.01 * lengths, -np.inf)
    return score.argmax(0)


# ---------------------------------------------------------------------------- the contract
class FeatureSet(Protocol):
    """Model inputs of a task: items (windows, sequences or sets of choices) ready to batch."""

    lengths: np.ndarray
    """Tokens per item (the longest sequence of an item with several)."""

    def __len__(self) -> int: ...

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Items -> tensors padded to the batch's longest (with the training targets, if any)."""
        ...


@dataclass
class TrainData:
    """What a family reads from the training files."""

    features: FeatureSet
    """With the training targets."""
    head: dict[str, Any]
    """Keyword arguments of ``model_class.from_pretrained`` for the task's head (num_labels, id2label, ...)."""
    labels: list[str] | None
    """Label (tag) names in id order; None for tasks without a label set (regression, QA, multiple choice)."""
    reports: list[ReadReport]
    summary: str
    """One line: examples -> items (what was windowed, cut or skipped)."""

    @property
    def label2id(self) -> dict[str, int] | None:
        return None if self.labels is None else {name: i for i, name in enumerate(self.labels)}


@dataclass
class EvalData:
    """One evaluation file, read and encoded; ``data`` is the family's own (features + what scoring needs)."""

    path: Path
    data: Any
    report: ReadReport
    summary: str


@dataclass
class EvalResult:
    metrics: dict[str, float]
    main: str
    """The metric the best checkpoint is chosen by (a key of ``metrics``)."""
    files: dict[str, str] = field(default_factory=dict)
    """Prediction files of this evaluation (name -> text), kept beside the best model (e.g. SQuAD's
    predictions.json, nbest_predictions.json, null_odds.json)."""


class TaskFamily(Protocol):
    """One of the paper's fine-tuning setups, as `bertforge.tasks.finetune` drives it."""

    name: str
    """The family's name (classification, tagging, squad, multiple_choice)."""
    tasks: tuple[str, ...]
    """The ``--task`` names it handles."""
    model_class: type
    """The ``BertFor...`` head class (bertforge.model.heads)."""
    settings: tuple[str, ...]
    """FinetuneConfig fields that evaluation and prediction must reuse (stored in the checkpoint's config.json)."""

    def configure(self, cfg: FinetuneConfig) -> FinetuneConfig:
        """``cfg`` with the family's defaults filled in (e.g. max_seq_length 0 -> its default)."""
        ...

    def files(self, cfg: FinetuneConfig, spec: str, split: str) -> list[Path]:
        """The files of ``split`` (train, dev, test) named by ``spec`` (comma-separated; a folder for GLUE)."""
        ...

    def train_data(self, cfg: FinetuneConfig, tokenizer: Any) -> TrainData: ...

    def eval_data(self, cfg: FinetuneConfig, tokenizer: Any, path: Path,
                  label2id: dict[str, int] | None) -> EvalData:
        """A labelled file; a label outside ``label2id`` is an error naming file and line."""
        ...

    def train_task(self, config: Any) -> Any:
        """The `bertforge.train.loop.Task` (summed loss terms and statistics) for a model with ``config``."""
        ...

    def evaluate(self, model: nn.Module, data: EvalData, cfg: FinetuneConfig, device: torch.device,
                 dist: Any = None) -> EvalResult: ...

    def predict(self, model: nn.Module, tokenizer: Any, cfg: FinetuneConfig, path: Path,
                device: torch.device) -> list[dict[str, Any]]:
        """One JSON-able record per example of ``path`` (labels not needed)."""
        ...

    def format_predictions(self, records: list[dict[str, Any]], out: Path) -> str:
        """The text of the family's native prediction file (GLUE TSV, CoNLL columns, SQuAD JSON)."""
        ...


class FamilyDefaults:
    """What most families share: ``max_seq_length`` 0 -> ``default_max_seq_length``; files named by a
    comma-separated list."""

    default_max_seq_length = 128

    def configure(self, cfg: FinetuneConfig) -> FinetuneConfig:
        return dataclasses.replace(cfg, max_seq_length=cfg.max_seq_length or self.default_max_seq_length)

    def files(self, cfg: FinetuneConfig, spec: str, split: str) -> list[Path]:
        return split_files(spec)


# ---------------------------------------------------------------------------- batches
class _InMemory:
    """Features seen as the one-shard dataset `PretrainingLoader` reads (an instance is its index)."""

    config = {"dynamic_masking": False, "nsp": False, "max_predictions_per_seq": 0}

    def __init__(self, features: FeatureSet, name: str):
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
    (``state_dict`` / ``load_state_dict``: epoch and position)."""

    def __init__(self, features: FeatureSet, batch_size: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                 name: str = "training data"):
        dataset: Any = _InMemory(features, name)
        super().__init__(dataset, batch_size, seed=seed, rank=rank, world_size=world_size, pad_to_multiple_of=1)
        self.features = features

    def collate(self, instances: list) -> dict[str, torch.Tensor]:
        return self.features.collate(instances)


@torch.no_grad()
def predict_items(model: nn.Module, features: FeatureSet, batch_size: int, device: torch.device | str,
                  run: Callable[[nn.Module, dict[str, torch.Tensor], Sequence[int]], Sequence[Any]],
                  dist: Any = None) -> list[Any]:
    """``run(model, batch, indices)`` -> one output per item, over every item of ``features`` in
    batches of similar length; the outputs in item order. With ``dist``, each process runs a part and
    all get the whole (every process runs the same number of forward passes: a sharded model's
    forward is collective)."""
    rank, world = (dist.rank, dist.world_size) if dist is not None and dist.enabled else (0, 1)
    order = np.argsort(features.lengths, kind="stable")
    parts = np.array_split(order, world)
    mine = parts[rank]
    outputs: list[Any] = []
    for k in range(-(-len(parts[0]) // batch_size)):
        idx = mine[k * batch_size:(k + 1) * batch_size]
        real = len(idx) > 0
        idx = idx if real else order[:1]
        batch = {name: t.to(device) for name, t in features.collate(idx).items()}
        got = run(model, batch, idx)
        if real:
            outputs.extend(got)
    pairs = [(mine.tolist(), outputs)]
    if world > 1:
        pairs = dist.gather_objects(pairs[0])
    result: list[Any] = [None] * len(features)
    for idx, outs in pairs:
        for i, o in zip(idx, outs):
            result[i] = o
    return result
