"""Multiple choice (SWAG): a context and C choices -> the index of the right choice. As in the paper,
each choice is a sequence ``[CLS] context [SEP] choice [SEP]`` scored from the pooled output, with a
softmax over the C; accuracy. A pair is cut to ``max_seq_length``, never windowed, since the C scores
are compared. Files (SWAG's CSVs, generic CSV / TSV / JSONL): docs/finetuning.md.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from bertforge.model import losses
from bertforge.tasks.base import (PREDICTION_TABLE, AccuracyObjective, EvalData, EvalResult, ReadReport, TaskFamily,
                                  TaskSettings, TrainData, csv_rows, file_format, model_logits, numpy_logits,
                                  prediction_table, read_records, split_files)
from bertforge.tasks.encoding import Windows, longest_first, predict_items

__all__ = ["ChoiceExample", "Columns", "SWAG_COLUMNS", "columns_for", "read_choices", "ChoiceInputs",
           "encode_choices", "longest_first", "MultipleChoiceObjective", "choice_scores", "prediction_records",
           "MultipleChoiceFamily"]

logger = logging.getLogger("bertforge")


class ChoiceExample(NamedTuple):
    context: str
    choices: tuple[str, ...]
    label: int | None
    """Index of the right choice; None in unlabelled files."""
    line: int
    """Line of the file the example starts on (1-based), for error messages."""


@dataclass(frozen=True)
class Columns:
    """Where a file keeps the parts of an example."""

    context: str
    choices: str
    """A key holding a list of choices (JSONL), or the stem of numbered columns: stem0, stem1, ... (or from 1)."""
    label: str
    start: str | None = None
    """A column every choice starts with (SWAG's ``sent2``): choice k is ``start + " " + choice k``."""


SWAG_COLUMNS = Columns("sent1", "ending", "label", start="sent2")
_GENERIC_COLUMNS = Columns("context", "choices", "label")
_SWAG_SPLITS = {"train": "train.csv", "dev": "val.csv", "test": "test.csv"}  # rowanz/swagaf's data/


def columns_for(task: str | None, context_column: str | None = None, choices_column: str | None = None,
                label_column: str | None = None) -> Columns:
    """The task's columns (SWAG's, or the generic defaults), with the given names instead."""
    base = SWAG_COLUMNS if task == "swag" else _GENERIC_COLUMNS
    return dataclasses.replace(base, context=context_column or base.context, choices=choices_column or base.choices,
                               label=label_column or base.label)


def _numbered(stem: str, keys: Collection[str]) -> list[str]:
    """stem0, stem1, ... (or stem1, stem2, ...) as far as they run in ``keys``."""
    for first in (0, 1):
        names = []
        while f"{stem}{first + len(names)}" in keys:
            names.append(f"{stem}{first + len(names)}")
        if names:
            return names
    return []


def _locate(cols: Columns, keys: Collection[str], need_label: bool, where: str, kind: str,
            record: Mapping[str, Any] | None = None) -> list[str] | None:
    """The keys of the choices among ``keys`` (None: a list in ``record``); a missing part is an error."""
    listed = record is not None and isinstance(record.get(cols.choices), list)
    choice_keys = None if listed else _numbered(cols.choices, keys)
    missing = [repr(c) for c in (cols.context, cols.start, cols.label if need_label else None) if c and c not in keys]
    if choice_keys == []:
        missing.append(f"{cols.choices}0, {cols.choices}1, ..." + (f" or a list {cols.choices!r}" if record else ""))
    if missing:
        raise ValueError(f"{where}: no {kind} {'; '.join(missing)} ({kind}s: {', '.join(map(str, keys))})")
    return choice_keys


def _choice_index(raw: Any, num_choices: int) -> int | None:
    """``raw`` (an int, or its text) as a choice index; None when it is not one of 0..C-1."""
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw < num_choices:
        return None
    return raw


def read_choices(path: str | Path, task: str | None = "multiple_choice", *, context_column: str | None = None,
                 choices_column: str | None = None, label_column: str | None = None, require_labels: bool = True,
                 skip_bad_rows: bool = False, num_choices: int = 0) -> tuple[list[ChoiceExample], ReadReport]:
    """Examples of one file, and what was skipped; ``num_choices``: every example's (0: the first's)."""
    path = Path(path)
    cols = columns_for(task, context_column, choices_column, label_column)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    report = ReadReport(str(path), skip_bad_rows=skip_bad_rows)
    bad = report.bad
    examples: list[ChoiceExample] = []
    first = "the first file" if num_choices else ""

    def add(line: int, record: Mapping[str, Any], choice_keys: list[str] | None) -> None:
        nonlocal num_choices, first
        choices = list(record[cols.choices]) if choice_keys is None else [record[k] for k in choice_keys]
        start = record[cols.start] if cols.start else ""
        if not all(isinstance(t, str) for t in (record[cols.context], start, *choices)):
            bad(line, "the context and choices must be strings")
            return
        if num_choices and len(choices) != num_choices:
            bad(line, f"{len(choices)} choices where {first} has {num_choices}")
            return
        if len(choices) < 2:
            raise ValueError(f"{path}:{line}: {len(choices)} choice: multiple choice needs 2 or more")
        num_choices, first = len(choices), first or f"line {line}"
        label = None
        if require_labels:
            raw = record.get(cols.label)
            if raw is None or (isinstance(raw, str) and not raw.strip()):
                report.skip("no label", line)
                return
            label = _choice_index(raw, num_choices)
            if label is None:
                bad(line, f"the label {raw!r} is not a choice index (0..{num_choices - 1})")
                return
        if start:
            choices = [f"{start} {c}" if c else start for c in choices]
        examples.append(ChoiceExample(record[cols.context], tuple(choices), label, line))

    fmt = file_format(path)
    if fmt == "records":
        for n, record in read_records(path, report):
            add(n, record, _locate(cols, record, require_labels, f"{path}:{n}", "key", record))
    else:
        header: list[str] | None = None
        choice_keys: list[str] | None = None
        for line, row in csv_rows(path, fmt, report):
            if header is None:
                header = [h.strip() for h in row]
                choice_keys = _locate(cols, header, require_labels, f"{path}:{line}", "column")
            elif len(row) != len(header):
                bad(line, f"{len(row)} fields where the header has {len(header)}"
                          + (" (a tab inside a text?)" if fmt == "tsv" else ""))
            else:
                add(line, dict(zip(header, row)), choice_keys)
    report.finish(len(examples))
    return examples, report


# ---------------------------------------------------------------------------- encoding
@dataclass
class ChoiceInputs:
    """The C sequences of every example; its items are examples."""

    sequences: Windows
    """The ``[CLS] context [SEP] choice [SEP]`` sequences: example i's choice k is number ``i * C + k``."""
    num_choices: int
    max_seq_length: int
    labels: np.ndarray | None = None
    """Index of the right choice per example (int64)."""
    cut_pairs: int = 0
    """Sequences longer than max_seq_length, cut longest-first ..."""
    cut_examples: int = 0
    """... and the examples they belong to."""

    def __len__(self) -> int:
        return self.sequences.num_examples

    @property
    def lengths(self) -> np.ndarray:
        """Tokens of each example's longest sequence."""
        return self.sequences.lengths.reshape(len(self), self.num_choices).max(axis=1, initial=0)

    def with_labels(self, labels: np.ndarray) -> "ChoiceInputs":
        self.labels = labels
        return self

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Examples -> (B, C, T) tensors padded to the longest sequence of the batch (+ ``labels`` (B,))."""
        idx = np.asarray(indices, dtype=np.int64)
        C = self.num_choices
        flat = self.sequences.collate((idx[:, None] * C + np.arange(C)).reshape(-1))  # (B * C, T)
        batch = {name: t.view(len(idx), C, -1) for name, t in flat.items()}
        if self.labels is not None:
            batch["labels"] = torch.from_numpy(self.labels[idx])
        return batch

    def summary(self) -> str:
        text = f"{len(self):,} examples x {self.num_choices} choices"
        if self.cut_pairs:
            text += (f"; {self.cut_pairs:,} (context, choice) pairs of {self.cut_examples:,} examples were longer than "
                     f"{self.max_seq_length} tokens and cut, longest segment first")
        return text


def encode_choices(examples: Sequence[ChoiceExample], tokenizer: Any, max_seq_length: int) -> ChoiceInputs:
    """Tokenize every (context, choice) pair, cut longest-first to ``max_seq_length`` (TF's way)."""
    if max_seq_length < 4:
        raise ValueError(f"max_seq_length must be >= 4, got {max_seq_length}")
    C = len(examples[0].choices) if examples else 0
    for e in examples:
        if len(e.choices) != C:
            raise ValueError(f"line {e.line}: {len(e.choices)} choices where the first example has {C}")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    contexts = tokenizer.encode_batch_ids([e.context for e in examples])
    choices = tokenizer.encode_batch_ids([c for e in examples for c in e.choices])
    room = max_seq_length - 3
    ids: list[np.ndarray] = []
    num_a = np.zeros(len(choices), dtype=np.int64)
    cut = np.zeros(len(choices), dtype=bool)
    for j, b in enumerate(choices):
        a = contexts[j // C]
        n_a, n_b = longest_first(len(a), len(b), room)
        ids.append(np.array([cls, *a[:n_a], sep, *b[:n_b], sep], dtype=np.int64))
        num_a[j], cut[j] = n_a + 2, n_a + n_b < len(a) + len(b)
    example = np.repeat(np.arange(len(examples), dtype=np.int64), C)
    return ChoiceInputs(Windows(ids, num_a, example, len(examples)), C, max_seq_length,
                          cut_pairs=int(cut.sum()), cut_examples=int(cut.reshape(-1, C).any(axis=1).sum()) if C else 0)


# ---------------------------------------------------------------------------- the task
class MultipleChoiceObjective(AccuracyObjective):
    """Summed cross-entropy of the softmax over each example's choices; accuracy over examples."""

    term = "multiple_choice"

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        logits = model_logits(model, batch).logits  # (B, C)
        labels = batch["labels"]
        loss = losses.multiple_choice_loss(logits, labels, reduction="sum")
        return {self.term: loss}, {"correct": (logits.argmax(-1) == labels).sum()}


def choice_scores(model: nn.Module, encoded: ChoiceInputs, batch_size: int, device: torch.device | str = "cpu",
                  dist: Any = None) -> np.ndarray:
    """(examples, C) logits; ``batch_size``: sequences per forward pass (batch_size // C examples)."""
    rows = predict_items(model, encoded, max(1, batch_size // max(encoded.num_choices, 1)), device, numpy_logits, dist)
    return np.array(rows, dtype=np.float64).reshape(len(rows), encoded.num_choices)


# ---------------------------------------------------------------------------- predictions
def prediction_records(examples: Sequence[ChoiceExample], scores: np.ndarray, gold: bool = False,
                       lines: bool = True) -> list[dict[str, Any]]:
    """``{"index", "context", "choices", "choice", "text", "probabilities"}`` per example: the most likely choice,
    its text and every choice's probability (softmax over the choices' scores); with ``lines`` the example's
    ``line`` in its file, with ``gold`` the right choice."""
    probs = np.exp(scores - scores.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    return [{"index": i, **({"line": e.line} if lines else {}), "context": e.context, "choices": list(e.choices),
             "choice": int(p.argmax()), "text": e.choices[int(p.argmax())], "probabilities": p.tolist(),
             **({"gold": e.label} if gold else {})} for i, (e, p) in enumerate(zip(examples, probs))]


# ---------------------------------------------------------------------------- the family
class MultipleChoiceFamily(TaskFamily):
    """Multiple choice: ``swag`` (SWAG's CSVs) and ``multiple_choice`` (CSV / TSV / JSONL)."""

    name = "multiple_choice"
    head = "BertForMultipleChoice"
    tasks = ("swag", "multiple_choice")
    settings = ("task", "max_seq_length", "text_column", "text_pair_column", "label_column")
    long_inputs_supported = ("truncate",)
    long_inputs_why = "the choices' scores are compared, so each (context, choice) pair is one sequence, truncated"

    def files(self, cfg: TaskSettings, spec: str, split: str) -> list[Path]:
        """The files named (comma-separated); a SWAG folder gives its train.csv, val.csv or test.csv."""
        files = []
        for path in split_files(spec):
            if path.is_dir() and cfg.task == "swag":
                path = path / _SWAG_SPLITS[split]
                if not path.is_file():
                    raise FileNotFoundError(f"{path}: no such file (a SWAG folder holds train.csv, val.csv, test.csv)")
            files.append(path)
        return files

    @staticmethod
    def _read(cfg: TaskSettings, path: Path, require_labels: bool, num_choices: int = 0
              ) -> tuple[list[ChoiceExample], ReadReport]:
        return read_choices(path, cfg.task, context_column=cfg.text_column or None,
                            choices_column=cfg.text_pair_column or None, label_column=cfg.label_column or None,
                            require_labels=require_labels, skip_bad_rows=cfg.skip_bad_rows, num_choices=num_choices)

    @staticmethod
    def _encode(cfg: TaskSettings, tokenizer: Any, examples: list[ChoiceExample], what: str) -> ChoiceInputs:
        encoded = encode_choices(examples, tokenizer, cfg.max_seq_length)
        if examples and examples[0].label is not None:
            encoded.with_labels(np.array([e.label for e in examples], dtype=np.int64))
        if encoded.cut_pairs:
            logger.warning("%s: %s", what, encoded.summary())
        return encoded

    def train_data(self, cfg: TaskSettings, tokenizer: Any) -> TrainData:
        examples: list[ChoiceExample] = []
        reports = []
        for path in self.files(cfg, cfg.train_file, "train"):
            got, report = self._read(cfg, path, True, len(examples[0].choices) if examples else 0)
            examples += got
            reports.append(report)
        if not examples:
            raise ValueError(f"{cfg.train_file}: no labelled training examples")
        encoded = self._encode(cfg, tokenizer, examples, cfg.train_file)
        return TrainData(encoded, {}, None, reports, encoded.summary())

    def eval_data(self, cfg: TaskSettings, tokenizer: Any, path: Path, label2id: dict[str, int] | None) -> EvalData:
        """A labelled file (``label2id`` is not used: labels are choice indexes)."""
        examples, report = self._read(cfg, path, True)
        if not examples:
            raise ValueError(f"{report.summary()}: no labelled examples")
        encoded = self._encode(cfg, tokenizer, examples, str(path))
        return EvalData(path, (encoded, examples), report, encoded.summary())

    def objective(self, config: Any) -> MultipleChoiceObjective:
        return MultipleChoiceObjective()

    def evaluate(self, model: nn.Module, data: EvalData, cfg: TaskSettings, device: torch.device,
                 dist: Any = None) -> EvalResult:
        """Accuracy, and ``predictions.tsv``: `format_predictions` of the file's records with the gold choice."""
        from bertforge import metrics

        encoded, examples = data.data
        scores = choice_scores(model, encoded, cfg.eval_batch_size, device, dist)
        records = prediction_records(examples, scores, gold=True)
        return EvalResult({"accuracy": metrics.accuracy(scores.argmax(-1), encoded.labels)}, "accuracy",
                          {PREDICTION_TABLE: self.format_predictions(records, Path(PREDICTION_TABLE))})

    def predict(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, path: Path,
                device: torch.device) -> list[dict[str, Any]]:
        """`prediction_records` of every example of ``path``."""
        examples, _ = self._read(cfg, path, False)
        encoded = self._encode(cfg, tokenizer, examples, str(path))
        return prediction_records(examples, choice_scores(model, encoded, cfg.eval_batch_size, device))

    def format_predictions(self, records: list[dict[str, Any]], out: Path) -> str:
        """``index,prediction`` (and ``gold``) lines, comma-separated for a .csv file, else tab-separated."""
        return prediction_table(records, "," if ".csv" in [s.lower() for s in out.suffixes] else "\t")

    def predict_texts(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, texts: Sequence[Sequence[str]],
                      device: torch.device | str) -> list[dict[str, Any]]:
        """`prediction_records` (without ``line``) per (context, *choices)."""
        examples = [ChoiceExample(t[0], tuple(t[1:]), None, i + 1) for i, t in enumerate(texts)]
        encoded = encode_choices(examples, tokenizer, cfg.max_seq_length)
        return prediction_records(examples, choice_scores(model, encoded, cfg.eval_batch_size, device), lines=False)
