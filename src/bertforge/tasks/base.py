"""The contract between the fine-tuning run and a task family (`TaskFamily`), the settings a family reads
(`TaskSettings`), and reading task files: CSV / TSV rows and records (JSON lines, a JSON array, Parquet),
with `ReadReport` counting what a reader kept and skipped (with line numbers): nothing is dropped silently.
`bertforge.tasks.finetune` drives every family the same way: ``configure``, ``train_data``, ``eval_data``,
``objective``, ``evaluate``, ``predict`` / ``predict_texts`` and ``format_predictions``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from torch import nn

from bertforge.io import COMPRESSED_SUFFIXES, open_binary
from bertforge.settings import check_settings, option, setting
from bertforge.tasks.encoding import EncodedSet

__all__ = ["TaskSettings", "LONG_INPUTS", "ReadReport", "text_lines", "csv_rows", "read_records", "not_utf8",
           "file_format", "split_files", "unseen_labels", "PREDICTION_TABLE", "prediction_table", "TrainData",
           "EvalData", "EvalResult", "TaskFamily", "AccuracyObjective", "model_logits",
           "numpy_logits"]

logger = logging.getLogger("bertforge")


# ---------------------------------------------------------------------------- settings
LONG_INPUTS = ("auto", "truncate", "windows")
"""The values of `TaskSettings.long_inputs`."""


@dataclass
class TaskSettings:
    """What a task family reads: the task, its files and columns, how long inputs are handled, and
    what evaluation and prediction need (SQuAD's limits, the tag scheme, the batch size)."""

    task: str = ""
    """A GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli: its file layout, labels and metrics);
    classification / regression (generic CSV / TSV / JSONL / JSON array / Parquet, with --text-column); ner
    (CoNLL-2003) / tagging (token<TAB>tag); squad (v1.1) / squad2 (v2.0); swag / multiple_choice."""
    train_file: str = ""
    """Training file(s), separated by commas, or the task's folder (GLUE, SQuAD's official names, SWAG)."""
    dev_file: str = ""
    """Evaluation file(s), or the task's folder (GLUE: dev.tsv, MNLI: dev_matched.tsv and dev_mismatched.tsv)."""
    text_column: str = ""
    """Column (JSONL: key) of the text (default: the GLUE task's; multiple choice: of the context)."""
    text_pair_column: str = ""
    """Column of the second text of a pair (default: the GLUE task's; none for single sentences; multiple
    choice: of the choices)."""
    label_column: str = ""
    """Column of the label (default: the GLUE task's, else "label")."""
    label_names: str = ""
    """Classification: names of the integer labels 0, 1, ... in order, comma-separated (e.g. negative,positive;
    in Python also a list): the model's id2label, and what predictions and the service say (default: the
    labels as written). Tagging: the tag set in id order (a `datasets` ClassLabel's; every training tag one of
    them)."""
    max_seq_length: int = setting(0, at_least=0, at_most=65535)
    """Tokens per sequence, [CLS] and [SEP] included; longer inputs are truncated or cut into overlapping
    windows (--long-inputs) (0: the task's default, 384 for SQuAD and 128 otherwise, or the model's positions
    if fewer)."""
    long_inputs: Literal["auto", "truncate", "windows"] = "auto"
    """Inputs longer than --max-seq-length: truncate (keep the start of a text; a pair loses tokens from the
    end of its longer segment first, as the paper's code does), or windows (overlapping windows every
    --stride tokens: training uses every window with the example's label, prediction averages their logits;
    costs a pass per window). auto: truncate for classification / regression and multiple choice; tagging
    and SQuAD always use windows (every word needs a tag; the answer may lie anywhere)."""
    stride: int = setting(0, at_least=0)
    """Tokens between the starts of consecutive windows of a long text (0: the task's default: SQuAD's
    doc_stride 128, half a window otherwise)."""
    max_query_length: int = setting(64, at_least=1)
    """SQuAD: question tokens kept (longer questions are cut)."""
    max_answer_length: int = setting(30, at_least=1)
    """SQuAD: longest answer span predicted, in WordPiece tokens."""
    n_best_size: int = setting(20, at_least=1)
    """SQuAD: start and end candidates per window, and answers kept per question in nbest_predictions.json."""
    null_score_diff_threshold: float = 0.0
    """SQuAD 2.0: predict no answer when the null score exceeds the best span's by more than this."""
    tag_column: int = -1
    """Tagging: the column of the tag in CoNLL files (-1: the last; the token is the first)."""
    tag_scheme: str = "auto"
    """Tagging: BIO, IOB1 or BIOES for entity-level scores (auto: detected from the training tags)."""
    tag_piece: Literal["first", "last"] = "first"
    """Tagging: the sub-token whose vector tags a word: first (the paper's), or last (where an English word
    carries its inflection: -s, -ed, -ing, -ly). A fine-tuned model keeps the one it was trained with."""
    eval_batch_size: int = setting(64, resumable=True, at_least=1)
    """Sequences per forward pass at evaluation, per process."""
    skip_bad_rows: bool = False
    """Skip (and count) malformed rows instead of stopping at the first."""

    def __post_init__(self) -> None:
        self.join_label_names()
        check_settings(self)  # the ranges and choices declared on the fields
        if 0 < self.max_seq_length < 4:
            raise ValueError(f"max_seq_length must be 0 (the task's default) or >= 4, got {self.max_seq_length}")
        names = self.named_labels()
        if any(not n for n in names) or len(set(names)) != len(names):
            raise ValueError(f"label_names must be distinct, non-empty names separated by commas, got "
                             f"{self.label_names!r}")

    def join_label_names(self) -> None:
        """A Python caller's list of ``label_names`` held as the flag writes them (comma-separated)."""
        if isinstance(self.label_names, (list, tuple)):
            if not all(isinstance(n, str) and "," not in n for n in self.label_names):
                raise ValueError(f"label_names must be names without commas, got {self.label_names!r}")
            self.label_names = ",".join(self.label_names)

    def named_labels(self) -> list[str]:
        """``label_names`` as a list, in id order (empty: the labels as the files write them)."""
        return [n.strip() for n in self.label_names.split(",")] if self.label_names else []


# ---------------------------------------------------------------------------- reading
@dataclass
class ReadReport:
    """What reading one file kept and skipped."""

    path: str
    examples: int = 0
    blank_lines: int = 0
    skipped: dict[str, list[int]] = field(default_factory=dict)
    """Reason -> line numbers of the rows skipped for it."""
    skip_bad_rows: bool = field(default=False, repr=False, compare=False)

    def skip(self, reason: str, line: int) -> None:
        self.skipped.setdefault(reason, []).append(line)

    def bad(self, line: int, message: str, reason: str = "malformed") -> None:
        """A malformed row: an error naming the file and line, or with ``skip_bad_rows`` a skip."""
        if not self.skip_bad_rows:
            raise ValueError(f"{self.path}:{line}: {message}")
        self.skip(reason, line)

    def finish(self, examples: int) -> None:
        """Records the examples kept, and logs the summary when rows were skipped."""
        self.examples = examples
        if self.num_skipped:
            logger.warning("%s", self.summary())

    @property
    def num_skipped(self) -> int:
        return sum(len(v) for v in self.skipped.values())

    def summary(self, unit: str = "examples", skipped: dict[str, list[Any]] | None = None, by: str = "lines") -> str:
        """``path: N examples; skipped n rows (reason; lines 3, 7, ...)``: ``skipped`` (default: the rows)
        by ``by``, counted in ``unit``."""
        text = f"{self.path}: {self.examples:,} {unit}"
        for reason, items in (self.skipped if skipped is None else skipped).items():
            shown = ", ".join(map(str, items[:5])) + (", ..." if len(items) > 5 else "")
            text += f"; skipped {len(items):,} {'rows' if skipped is None else unit} ({reason}; {by} {shown})"
        return text


def text_lines(path: Path) -> io.TextIOWrapper:
    """A (possibly compressed) UTF-8 file as text; a byte-order mark is dropped (MRPC's files and
    Excel's CSVs start with one). Undecodable bytes raise UnicodeDecodeError: callers name the line."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")


def csv_rows(path: Path, fmt: str, report: ReadReport) -> Iterator[tuple[int, list[str]]]:
    """(first line of the record, fields) of a CSV (``fmt="csv"``: standard quoting) or TSV file
    (``"tsv"``: no quoting, as the TF release reads GLUE); blank lines are counted in ``report``."""
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
                if row and row != [""]:
                    yield start, row
                else:
                    report.blank_lines += 1
                start = reader.line_num + 1
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    finally:
        csv.field_size_limit(old_limit)


def read_records(path: Path, report: ReadReport) -> Iterator[tuple[int, dict]]:
    """(position, object) of every record of a file of records: JSON lines (the line), one JSON array of
    objects (the item, from 1; what ``json.dump`` of a list writes) or Parquet (the row, from 1; what
    `datasets` and pandas write). Blank lines are counted in ``report``; a record that is no JSON object
    goes to ``report.bad`` (which raises or counts a skip)."""
    bad = report.bad
    if path.suffix.lower() == ".parquet":
        yield from enumerate(_parquet_rows(path), 1)
        return
    with text_lines(path) as f:
        try:
            start = f.read(4096).lstrip()
        except UnicodeDecodeError:
            raise not_utf8(path) from None
    if start.startswith("["):
        yield from _json_array(path, bad)
        return
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
                except RecursionError:
                    bad(n, "JSON nested too deep to be a record")
                    continue
                if not isinstance(record, dict):
                    bad(n, f"expected a JSON object, got {type(record).__name__}")
                    continue
                yield n, record
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def _json_array(path: Path, bad: Callable[[int, str], None]) -> Iterator[tuple[int, dict]]:
    try:
        with text_lines(path) as f:
            items = json.load(f)
    except UnicodeDecodeError:
        raise not_utf8(path) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not a JSON array of records ({e.msg}, column {e.colno})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deep to be an array of records") from None
    for n, record in enumerate(items, 1):
        if isinstance(record, dict):
            yield n, record
        else:
            bad(n, f"item {n} of the array: expected a JSON object, got {type(record).__name__}")


def _parquet_rows(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install 'bertforge[parquet]')") from None
    try:
        return pq.read_table(path).to_pylist()
    except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{path}: not a readable Parquet file ({e})") from None


def not_utf8(path: Path, chunk_size: int = 1 << 20) -> ValueError:
    """The error for a file that is not UTF-8, naming the line and byte offset of its first invalid
    byte. The text reader decodes ahead of the line it returns, so its own error position is only
    approximate: the file is read again as bytes, ``chunk_size`` at a time, to find the exact place."""
    decoder_input = b""
    offset = 0  # bytes of the (decompressed) file before ``decoder_input``
    line, line_start = 1, 0  # the line at ``offset`` and the offset where it starts
    with open_binary(path) as f:
        while True:
            chunk = f.read(chunk_size)
            data = decoder_input + chunk
            try:
                data.decode("utf-8")
                good = len(data)
            except UnicodeDecodeError as e:
                if chunk and e.reason == "unexpected end of data" and e.end == len(data):
                    good = e.start  # a character split by the chunk boundary: decode it with the next chunk
                else:
                    at = offset + e.start
                    line += data.count(b"\n", 0, e.start)
                    newline = data.rfind(b"\n", 0, e.start)
                    column = at - (offset + newline + 1 if newline >= 0 else line_start)
                    bad = data[e.start:e.end]
                    of = "the decompressed text" if Path(path).suffix.lower() in COMPRESSED_SUFFIXES else "the file"
                    return ValueError(f"{path}:{line}: not UTF-8 text: {bad!r} at byte offset {at} of {of} "
                                      f"({column} bytes into the line; {e.reason}); save the file as UTF-8")
            if not chunk:
                return ValueError(f"{path}: not UTF-8 text")  # the text reader failed; the bytes decode
            line += data.count(b"\n", 0, good)
            newline = data.rfind(b"\n", 0, good)
            if newline >= 0:
                line_start = offset + newline + 1
            offset += good
            decoder_input = data[good:]


def file_format(path: Path) -> str:
    """"tsv" (.tsv, .txt), "csv", or "records" (`read_records`: .jsonl, .json, .ndjson, .parquet), compressed or
    not (Parquet compresses itself)."""
    suffixes = [s.lower() for s in path.suffixes if s.lower() not in COMPRESSED_SUFFIXES]
    kind = suffixes[-1] if suffixes else ""
    if kind in (".tsv", ".txt"):
        return "tsv"
    if kind == ".csv":
        return "csv"
    if kind in (".jsonl", ".json", ".ndjson") or (kind == ".parquet" and path.suffix.lower() == ".parquet"):
        return "records"
    raise ValueError(f"{path}: unknown file type {kind or '(none)'!r}; expected .tsv, .csv, .jsonl / .json (JSON "
                     "lines or one JSON array) or .parquet (text files optionally .gz / .bz2 / .xz)")


def split_files(spec: str | Path) -> list[Path]:
    """``a.tsv,b.tsv`` -> the files (a single path as is)."""
    return [Path(part.strip()) for part in str(spec).split(",") if part.strip()]


def unseen_labels(path: Path, labels: Iterable[str | None], known: Collection[str], *, kind: str = "label",
                  unit: str = "example", effect: str = "they count as wrong predictions") -> Counter[str]:
    """The labels of an evaluation file outside the model's label set ``known``, each with the number
    of items (``unit``: example, word) carrying it, in order of first appearance. The model cannot
    predict such a label, so the file is still scored (``effect`` says how) rather than refused; a
    warning names the file, the labels and the counts, once per file."""
    unseen = Counter(label for label in labels if label is not None and label not in known)
    if unseen:
        total = unseen.total()
        carry = f"{unit} carries" if total == 1 else f"{unit}s carry"
        what = f"{kind}s" if len(unseen) > 1 else f"a {kind}"
        shown = ", ".join(f"{name!r}: {n:,}" for name, n in list(unseen.items())[:10])
        more = f", and {len(unseen) - 10:,} more" if len(unseen) > 10 else ""
        logger.warning("%s: %s %s %s the model was not trained on (%s%s): it cannot predict them, so %s",
                       path, f"{total:,}", carry, what, shown, more, effect)
    return unseen


# ---------------------------------------------------------------------------- prediction files
PREDICTION_TABLE = "predictions.tsv"
"""The per-example predictions of an evaluated file as a `prediction_table` (classification, regression,
multiple choice), kept beside the best model."""


def prediction_table(records: Sequence[dict[str, Any]], sep: str = "\t") -> str:
    """``index``, ``prediction`` (the record's label, choice or score) and, when the records have it (an
    evaluated file), ``gold`` of each record, one line each under a header: GLUE's submission layout."""
    gold = ["gold"] if records and "gold" in records[0] else []
    rows = [[r["index"], next(r[k] for k in ("label", "choice", "score") if k in r),
             *(r[c] for c in gold)] for r in records]
    return "".join(sep.join(map(str, row)) + "\n" for row in [["index", "prediction", *gold], *rows])


# ---------------------------------------------------------------------------- the contract
@dataclass
class TrainData:
    """What a family reads from the training files."""

    encoded: EncodedSet
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
    """One evaluation file, read and encoded; ``data`` is the family's own (encoded inputs + what scoring needs)."""

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
    """The per-example prediction files (name -> text), with the gold beside each prediction where the
    layout has room: `PREDICTION_TABLE`, tagging's predictions.conll, SQuAD's predictions.json,
    nbest_predictions.json and null_odds.json. Kept in ``best/`` with the best model; ``evaluate --out``
    writes them."""


def _positions(model: str) -> int | None:
    """The positions of checkpoint folder ``model`` (None: none named, or no config to read: loading it says why)."""
    from bertforge.model.checkpoint import CheckpointError, load_config

    if not model:
        return None
    try:
        return load_config(model).max_position_embeddings
    except (CheckpointError, OSError):
        return None


class TaskFamily(Protocol):
    """One of the paper's fine-tuning setups, as `bertforge.tasks.finetune` drives it, with what most
    families share: ``max_seq_length`` 0 -> ``default_max_seq_length`` (the model's positions if fewer; more
    is an error before any data is read); ``long_inputs`` auto -> the first
    of ``long_inputs_supported`` (another one is an error saying ``long_inputs_why``); --label-names only
    where ``settings`` holds it; files named by a comma-separated list."""

    name: str
    tasks: tuple[str, ...]
    """The ``--task`` names it handles."""
    head: str
    """The name of its ``BertFor...`` head class in bertforge.model.heads (`model_class`)."""
    settings: tuple[str, ...] = ()
    """TaskSettings fields that evaluation and prediction must reuse (stored in the checkpoint's config.json)."""
    default_max_seq_length = 128
    long_inputs_supported: tuple[str, ...] = ("truncate", "windows")
    long_inputs_why = ""

    @property
    def model_class(self) -> type:
        from bertforge.model import heads

        return getattr(heads, self.head)

    def configure(self, cfg: TaskSettings) -> TaskSettings:
        """``cfg`` with the family's defaults filled in; a setting the family cannot take is an error. A
        configured ``cfg`` comes back unchanged."""
        if cfg.label_names and "label_names" not in self.settings:
            raise ValueError(f"{option('label_names')} names the labels of classification and the tags of tagging; "
                             f"{self.name} ({cfg.task}) takes its labels as its files write them")
        long_inputs = self.long_inputs_supported[0] if cfg.long_inputs == "auto" else cfg.long_inputs
        if long_inputs not in self.long_inputs_supported:
            raise ValueError(f"{option('long_inputs', long_inputs)} does not apply to {self.name} ({cfg.task}): "
                             f"{self.long_inputs_why}")
        model = getattr(cfg, "model", "")
        positions = _positions(model)
        max_seq_length = cfg.max_seq_length or min(self.default_max_seq_length, positions or 1 << 31)
        if positions and max_seq_length > positions:
            raise ValueError(f"{option('max_seq_length', max_seq_length)} exceeds the {positions} positions of {model}")
        return dataclasses.replace(cfg, max_seq_length=max_seq_length, long_inputs=long_inputs)

    def metric_names(self, task: str) -> tuple[str, ...]:
        """The metrics an evaluation of ``task`` reports (``*``: any text; with several dev files each is
        prefixed by its file's name): what ``metric_for_best`` and early stopping may name."""
        return ("accuracy",)

    def files(self, cfg: TaskSettings, spec: str, split: str) -> list[Path]:
        """The files of ``split`` (train, dev, test) named by ``spec`` (comma-separated)."""
        return split_files(spec)

    def train_data(self, cfg: TaskSettings, tokenizer: Any) -> TrainData: ...

    def eval_data(self, cfg: TaskSettings, tokenizer: Any, path: Path,
                  label2id: dict[str, int] | None) -> EvalData:
        """A labelled file. A label outside ``label2id`` is scored as a prediction the model could not
        make, with a warning (`unseen_labels`); training files refuse it."""

    def objective(self, config: Any) -> Any:
        """The `bertforge.train.loop.Objective` for a model with ``config``."""

    def evaluate(self, model: nn.Module, data: EvalData, cfg: TaskSettings, device: torch.device,
                 dist: Any = None) -> EvalResult: ...

    def predict(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, path: Path,
                device: torch.device) -> list[dict[str, Any]]:
        """One JSON-able record per example of ``path`` (labels not needed)."""

    def format_predictions(self, records: list[dict[str, Any]], out: Path) -> str:
        """The text of the family's native prediction file (GLUE TSV, CoNLL columns, SQuAD JSON)."""

    def predict_texts(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, texts: Sequence[Sequence[str]],
                      device: torch.device | str) -> list[dict[str, Any]]:
        """One JSON-able record per input of raw text, in input order (`bertforge.serving.predictor.Predictor`'s
        records). Each input is its texts: a text or a pair (classification), a text (tagging), a question and
        a context (SQuAD), a context and its choices (multiple choice: every input with as many)."""


def model_logits(model: Any, batch: Mapping[str, torch.Tensor]) -> Any:
    """The model's output for a batch of `bertforge.tasks.encoding.Windows`."""
    return model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])


def numpy_logits(model: Any, batch: Mapping[str, torch.Tensor], indices: Sequence[int]) -> Any:
    """(B, ...) float logits as numpy: a `bertforge.tasks.encoding.predict_items` run."""
    return model_logits(model, batch).logits.float().cpu().numpy()


class AccuracyObjective:
    """A `bertforge.train.loop.Objective` of one summed loss ``term`` over the batch's items (rows of
    ``labels``) and the statistic ``correct``, reported as ``metric``: correct / items."""

    term = ""
    metric = "accuracy"

    def counts(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        return {self.term: float(batch["labels"].shape[0])}

    def metrics(self, loss_sums: dict[str, float], counts: dict[str, float],
                stats: dict[str, float]) -> dict[str, float]:
        return {self.metric: stats.get("correct", 0.0) / max(counts.get(self.term, 0.0), 1.0)}
