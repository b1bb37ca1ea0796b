"""Token classification (NER and other tagging): column files -> sentences -> first-WordPiece labels
(the paper's: a word's first sub-token carries its tag; ``tag_piece`` last: its last) in windows ->
losses, one prediction per word (in its max-context window), conlleval's entity scores and CoNLL
prediction files. Tags that are not entity tags get token accuracy only (task ``tagging``). The user
guide: docs/finetuning.md.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from bertforge.model import losses
from bertforge.settings import option
from bertforge.model.heads import tagged_positions
from bertforge.io import open_binary
from bertforge.metrics import SCHEMES, entity_spans, ner_metrics
from bertforge.tasks.base import (AccuracyObjective, EvalData, EvalResult, ReadReport, TaskFamily, TaskSettings,
                                  TrainData, model_logits, unseen_labels)
from bertforge.tasks.encoding import Windows, max_context_window, offsets_through_marks, predict_items, window_starts
from bertforge.train.distributed import unwrap_model

__all__ = ["Sentence", "read_sentences", "tag_list", "tag_ids", "detect_scheme", "resolve_scheme", "TagWindows",
           "encode_sentences", "reads_positions", "TaggingObjective", "predict_tags", "tagging_metrics", "conll_text",
           "TaggingFamily"]

OUTSIDE = "O"
DOCSTART = "-DOCSTART-"


class Sentence(NamedTuple):
    tokens: list[str]
    tags: list[str] | None
    """One per token; None when read without tags (prediction)."""
    lines: list[int]
    """The line of each token (1-based), for error messages."""

    @property
    def line(self) -> int:
        return self.lines[0]


# ---------------------------------------------------------------------------- reading
def read_sentences(path: str | Path, *, tag_column: int = -1, require_tags: bool = True,
                   skip_bad_rows: bool = False) -> tuple[list[Sentence], ReadReport]:
    """Sentences of a CoNLL-style column file, and what was skipped; ``tag_column`` may count from the end."""
    path = Path(path)
    if tag_column == 0:
        raise ValueError("tag_column 0 is the token's column; name the tag's (-1: the last)")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    need = tag_column + 1 if tag_column > 0 else 1 - tag_column  # columns a tagged row must have
    report = ReadReport(str(path), skip_bad_rows=skip_bad_rows)
    bad = report.bad
    sentences: list[Sentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    lines: list[int] = []

    def end_sentence() -> bool:
        nonlocal tokens, tags, lines
        if not tokens:
            return False
        sentences.append(Sentence(tokens, tags if require_tags else None, lines))
        tokens, tags, lines = [], [], []
        return True

    with open_binary(path) as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8").rstrip()
            except UnicodeDecodeError as e:
                bad(n, f"not UTF-8 text ({e.reason} at byte {e.start} of the line)", "not UTF-8")
                continue
            if n == 1:
                text = text.lstrip("\ufeff")
            if not text.strip():
                if not end_sentence():
                    report.blank_lines += 1  # a blank line that ends no sentence
                continue
            cols = [c.strip() for c in text.split("\t")] if "\t" in text else text.split()
            if cols[0] == DOCSTART:
                end_sentence()
                continue
            if not cols[0]:
                bad(n, "empty token (the line starts with a tab)", "empty token")
                continue
            if require_tags:
                if len(cols) < need:
                    bad(n, f"{len(cols)} column{'s' * (len(cols) != 1)} where the token and the tag (column "
                        f"{tag_column}) need {need}", "too few columns")
                    continue
                if not cols[tag_column]:
                    bad(n, f"empty tag in column {tag_column}", "empty tag")
                    continue
                tags.append(cols[tag_column])
            tokens.append(cols[0])
            lines.append(n)
    end_sentence()
    report.finish(len(sentences))
    return sentences, report


def tag_list(sentences: Iterable[Sentence]) -> list[str]:
    """The tag names in id order: "O", then the other tags of ``sentences`` sorted."""
    found = {t for s in sentences for t in s.tags or ()}
    return [OUTSIDE, *sorted(found - {OUTSIDE})]


def tag_ids(sentences: Sequence[Sentence], path: str | Path, label2id: Mapping[str, int],
            unseen: int | None = None) -> np.ndarray:
    """(words,) tag id of every word; a tag outside ``label2id`` gets ``unseen``, or is an error."""
    out = np.zeros(sum(len(s.tokens) for s in sentences), dtype=np.int64)
    k = 0
    for s in sentences:
        for tag, line in zip(s.tags or (), s.lines):
            got = label2id.get(tag, unseen)
            if got is None:
                raise ValueError(f"{path}:{line}: unknown tag {tag!r} (the model's tags: "
                                 f"{', '.join(label2id)})")
            out[k] = got
            k += 1
    return out


# ---------------------------------------------------------------------------- schemes
def _is_entity_tag(tag: str) -> bool:
    return tag == OUTSIDE or (len(tag) > 2 and tag[0] in "BIES" and tag[1] == "-")


def detect_scheme(labels: Iterable[str], sequences: Iterable[Sequence[str]] = ()) -> str | None:
    """The tagging scheme of a tag set: "BIOES" with any S- or E- tag, else "IOB1" when more entities
    of ``sequences`` open with I- than with B-, else "BIO"; None when the tags are not entity tags."""
    labels = set(labels)
    if not all(_is_entity_tag(t) for t in labels):
        return None
    if any(t[0] in "ES" for t in labels):
        return "BIOES"
    opened_by = {"B": 0, "I": 0}
    for seq in sequences:
        prev = OUTSIDE
        for tag in seq:
            if tag[0] == "B" or (tag[0] == "I" and (prev == OUTSIDE or prev[2:] != tag[2:])):
                opened_by[tag[0]] += 1
            prev = tag
    return "IOB1" if opened_by["I"] > opened_by["B"] else "BIO"


def _problem(tag: str, task: str, scheme: str | None) -> str | None:
    """Why ``tag`` cannot be scored under ``scheme`` (None: it can)."""
    if scheme is not None:
        try:
            entity_spans([tag], scheme)
        except ValueError as e:
            return str(e)
    elif task == "ner" and not _is_entity_tag(tag):
        return (f"task ner needs entity tags (O, B-TYPE, I-TYPE, ...), got {tag!r} (a wrong {option('tag_column')}? "
                f"{option('task', 'tagging')} takes any tag set)")
    return None


def resolve_scheme(setting: str, task: str, labels: Sequence[str],
                   sequences: Iterable[Sequence[str]] = ()) -> str | None:
    """The scheme ``setting`` names, or for "auto" detects, every label valid in it (None: no entities)."""
    scheme = detect_scheme(labels, sequences) if setting.lower() == "auto" else setting.upper()
    if scheme is not None and scheme not in SCHEMES:
        raise ValueError(f"unknown tag_scheme {setting!r}; choose auto or one of: {', '.join(SCHEMES)}")
    for tag in labels:
        if problem := _problem(tag, task, scheme):
            raise ValueError(problem)
    return scheme


def _training_scheme(read: Sequence[tuple[Path, list[Sentence], ReadReport]], setting: str, task: str,
                     labels: Sequence[str]) -> str | None:
    """`resolve_scheme` for the training files; a tag that does not fit names its first file and line."""
    if setting.lower() == "auto":
        scheme = detect_scheme(labels, (s.tags for _, got, _ in read for s in got if s.tags))
    else:
        scheme = resolve_scheme(setting, task, [OUTSIDE])  # a known name
    for path, sentences, _ in read:
        _check_tags(path, sentences, task, scheme)
    return scheme


def _check_tags(path: Path, sentences: Sequence[Sentence], task: str, scheme: str | None,
                only: Container[str] | None = None) -> None:
    """An error naming file and line for the first tag (of ``only``) that ``scheme`` cannot score."""
    checked: set[str] = set()
    for s in sentences:
        for tag, line in zip(s.tags or (), s.lines):
            if tag not in checked and (only is None or tag in only):
                if problem := _problem(tag, task, scheme):
                    raise ValueError(f"{path}:{line}: {problem}")
                checked.add(tag)


# ---------------------------------------------------------------------------- encoding
@dataclass
class TagWindows:
    """The windows of some sentences and, per window position, the word whose tag it carries."""

    windows: Windows
    """Token ids of every window ([CLS] sub-tokens [SEP], one segment) and the sentence it comes from."""
    words: list[np.ndarray]
    """Per window position: the index of the word labelled and predicted there (-1: none)."""
    word_offsets: np.ndarray
    """(sentences + 1,): the words of sentence s are word_offsets[s]:word_offsets[s + 1]."""
    tags: np.ndarray | None = None
    """(words,) tag ids, when training or evaluating."""
    empty_words: int = 0
    """Words that tokenize to nothing (predicted "O")."""

    def __len__(self) -> int:
        return len(self.windows)

    @property
    def input_ids(self) -> list[np.ndarray]:
        return self.windows.input_ids

    @property
    def lengths(self) -> np.ndarray:
        return self.windows.lengths

    @property
    def num_words(self) -> int:
        return int(self.word_offsets[-1])

    def with_tags(self, tags: np.ndarray) -> "TagWindows":
        if len(tags) != self.num_words:
            raise ValueError(f"{len(tags)} tags for {self.num_words} words")
        self.tags = tags
        return self

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Windows -> tensors padded to the longest of the batch; ``labels`` (B, T) with the tags."""
        batch = self.windows.collate(indices)
        if self.tags is not None:
            labels = torch.full(batch["input_ids"].shape, losses.IGNORE_INDEX, dtype=torch.long)
            for i, k in enumerate(indices):
                at = np.flatnonzero(self.words[k] >= 0)
                labels[i, at] = torch.from_numpy(self.tags[self.words[k][at]])
            batch["labels"] = labels
        return batch

    def summary(self) -> str:
        text = f"{len(self.word_offsets) - 1:,} sentences ({self.num_words:,} words) -> {len(self):,} windows"
        if self.windows.windowed:
            text += f" ({self.windows.windowed:,} sentences longer than one window)"
        if self.empty_words:
            text += f"; {self.empty_words:,} words with no WordPiece token (not trained on, predicted O)"
        return text


def encode_sentences(sentences: Sequence[Sentence], tokenizer: Any, max_seq_length: int,
                     stride: int = 0, piece: str = "first") -> TagWindows:
    """Tokenize word by word and cut into windows ``stride`` sub-tokens apart (0: half a window); each word
    is read (labelled and predicted) at its ``piece`` sub-token, first or last."""
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3, got {max_seq_length}")
    room = max_seq_length - 2
    step = stride or max(1, room // 2)
    if step > room:
        raise ValueError(f"stride {stride} is longer than a window ({room} tokens): words between windows "
                         "would be skipped")
    if piece not in ("first", "last"):
        raise ValueError(f"piece must be first or last, got {piece!r}")
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    pieces = tokenizer.encode_batch_ids([w for s in sentences for w in s.tokens])
    offsets = np.cumsum([0, *(len(s.tokens) for s in sentences)], dtype=np.int64)
    input_ids: list[np.ndarray] = []
    sentence: list[int] = []
    words: list[np.ndarray] = []
    windowed = empty = 0
    for s in range(len(sentences)):
        ids: list[int] = []
        at: list[int] = []  # position in ids of the sub-token each tokenized word is read at
        kept: list[int] = []  # ... and the word's index
        for w in range(offsets[s], offsets[s + 1]):
            if not pieces[w]:
                empty += 1
                continue
            at.append(len(ids) + (len(pieces[w]) - 1 if piece == "last" else 0))
            kept.append(w)
            ids.extend(pieces[w])
        if not ids:
            continue
        starts = np.array(window_starts(len(ids), room, step))
        ends = np.minimum(starts + room, len(ids))
        best = max_context_window(starts, ends - starts, np.array(at))  # (words,) each word's window
        windowed += len(starts) > 1
        seq = np.array(ids, dtype=np.int64)
        for k, (a, b) in enumerate(zip(starts, ends)):
            input_ids.append(np.concatenate([[cls], seq[a:b], [sep]]).astype(np.int64))
            sentence.append(s)
            where = np.full(b - a + 2, -1, dtype=np.int64)
            mine = best == k
            where[np.array(at)[mine] - a + 1] = np.array(kept)[mine]
            words.append(where)
    windows = Windows(input_ids, np.array([len(x) for x in input_ids], dtype=np.int64),  # all of type 0
                      np.array(sentence, dtype=np.int64), len(sentences), windowed=windowed)
    return TagWindows(windows, words, offsets, empty_words=empty)


# ---------------------------------------------------------------------------- the task
def reads_positions(model: Any) -> bool:
    """Whether ``model`` (inside a ``functools.partial`` and any `unwrap_model` wrapper) answers at given
    ``positions`` only: a fine-tuned tagger does; a feature-based one, whose BiLSTM runs over every token,
    does not."""
    while isinstance(model, functools.partial):  # a cached-features run binds its features
        model = model.func
    forward = unwrap_model(model).forward
    return _takes_positions(getattr(forward, "__func__", forward))


@functools.lru_cache(maxsize=None)
def _takes_positions(forward: Any) -> bool:
    """Whether a ``forward`` function has a ``positions`` parameter (read once per function: it is asked every
    training step)."""
    return "positions" in inspect.signature(forward).parameters


class TaggingObjective(AccuracyObjective):
    """Summed cross-entropy over the labelled positions (one per word) of a batch; token accuracy.

    ``tagged_only``: a model that reads positions (`reads_positions`) is asked for
    its logits at the labelled positions alone (`bertforge.model.heads.tagged_positions`): the same loss,
    without a head (and, with a faster encoder, a last layer) over the sub-word continuations, specials and
    padding. A feature-based tagger reads every token (its BiLSTM runs over them) whatever the setting."""

    term = "tagging"

    def __init__(self, tagged_only: bool = True) -> None:
        self.tagged_only = tagged_only

    def counts(self, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        return {self.term: float((batch["labels"] != losses.IGNORE_INDEX).sum())}

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        labels = batch["labels"]
        if self.tagged_only and reads_positions(model):
            positions, labels = tagged_positions(labels)
            logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                           positions=positions).logits  # (B, K, C)
        else:
            logits = model_logits(model, batch).logits  # (B, T, C)
        loss = losses.token_classification_loss(logits, labels, reduction="sum")
        return {self.term: loss}, {"correct": (logits.argmax(-1) == labels).sum()}  # -100 never equals an argmax


def predict_tags(model: nn.Module, encoded: TagWindows, batch_size: int, device: torch.device | str = "cpu",
                 dist: Any = None) -> np.ndarray:
    """(words,) the predicted tag id of every word (-1: no tokens), from its max-context window. A
    fine-tuned tagger's logits are asked for at the tagged tokens only (`TaggingObjective`)."""
    return predict_tags_and_scores(model, encoded, batch_size, device, dist)[0]


def predict_tags_and_scores(model: nn.Module, encoded: TagWindows, batch_size: int,
                            device: torch.device | str = "cpu", dist: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """`predict_tags`, and (words,) the probability the model gives each predicted tag (0: no tokens)."""
    tagged_only = reads_positions(model)

    def run(m: nn.Module, batch: dict[str, torch.Tensor], idx: Sequence[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        at = [np.flatnonzero(encoded.words[k] >= 0) for k in idx]  # each window's tagged tokens
        if tagged_only:
            positions = torch.zeros(len(at), max(1, max(map(len, at))), dtype=torch.long)
            for i, a in enumerate(at):
                positions[i, :len(a)] = torch.from_numpy(a)
            logits = m(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
                       positions=positions.to(batch["input_ids"].device)).logits  # (B, K, C): its tagged tokens
            at = [np.arange(len(a)) for a in at]
        else:
            logits = model_logits(m, batch).logits  # (B, T, C)
        prob, best = (t.cpu().numpy() for t in logits.float().softmax(-1).max(-1))
        return [(best[i, a], prob[i, a]) for i, a in enumerate(at)]

    per_window = predict_items(model, encoded, batch_size, device, run, dist)
    out = np.full(encoded.num_words, -1, dtype=np.int64)
    scores = np.zeros(encoded.num_words, dtype=np.float32)
    for w, (got, prob) in zip(encoded.words, per_window):
        out[w[w >= 0]] = got
        scores[w[w >= 0]] = prob
    return out, scores


def _predicted_tags(model: nn.Module, encoded: TagWindows, cfg: TaskSettings, device: torch.device | str,
                    dist: Any = None) -> tuple[list[list[str]], list[str], list[list[float]]]:
    """Each sentence's predicted tag per word ("O" for words without tokens), the model's tags, and each
    sentence's probability of its predicted tag per word (0 for words without tokens)."""
    id2label = model.config.id2label or {}
    labels = [id2label.get(i, str(i)) for i in range(model.config.num_labels)]
    ids, scores = predict_tags_and_scores(model, encoded, cfg.eval_batch_size, device, dist)
    flat = [OUTSIDE if i < 0 else labels[i] for i in ids]
    offsets = encoded.word_offsets
    return ([flat[a:b] for a, b in zip(offsets[:-1], offsets[1:])], labels,
            [scores[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])])


# ---------------------------------------------------------------------------- metrics and files
def tagging_metrics(true_seqs: Sequence[Sequence[str]], pred_seqs: Sequence[Sequence[str]],
                    scheme: str | None) -> dict[str, float]:
    """conlleval's precision / recall / F1, accuracy and ``f1_TYPE``; accuracy only without a scheme."""
    if scheme is None:
        tokens = sum(len(t) for t in true_seqs)
        right = sum(a == b for t, p in zip(true_seqs, pred_seqs) for a, b in zip(t, p))
        return {"accuracy": right / max(tokens, 1)}
    got = ner_metrics(true_seqs, pred_seqs, scheme)
    out = {name: float(got[name]) for name in ("precision", "recall", "f1", "accuracy")}
    out.update({f"f1_{kind}": float(v["f1"]) for kind, v in got["per_type"].items()})
    return out


def conll_text(sentences: Iterable[Sequence[Sequence[str]]]) -> str:
    """CoNLL columns, a blank line after each sentence; tab-separated when some column holds whitespace."""
    sentences = [list(s) for s in sentences]
    sep = "\t" if any(any(c.split() != [c] for c in row) for s in sentences for row in s) else " "
    return "".join("".join(sep.join(row) + "\n" for row in s) + "\n" for s in sentences)


# ---------------------------------------------------------------------------- the family
@dataclass
class _Tagged:
    """Each sentence's predicted tag per word, its probability, and the entities the tags make (type, first
    word, end word)."""

    tags: list[list[str]]
    scores: list[list[float]]
    entities: list[list[tuple[str, int, int]]]

    def entity_score(self, sentence: int, a: int, b: int) -> float:
        """An entity's score: the mean of its words' (transformers' "simple" aggregation)."""
        return float(np.mean(self.scores[sentence][a:b]))


def _tag_sentences(model: nn.Module, tokenizer: Any, cfg: TaskSettings, sentences: list[Sentence],
                   device: torch.device | str) -> _Tagged:
    encoded = encode_sentences(sentences, tokenizer, cfg.max_seq_length, cfg.stride, cfg.tag_piece)
    tags, labels, scores = _predicted_tags(model, encoded, cfg, device)
    scheme = resolve_scheme(cfg.tag_scheme, "tagging", labels, tags)
    return _Tagged(tags, scores, [entity_spans(seq, scheme) if scheme else [] for seq in tags])


class TaggingFamily(TaskFamily):
    """Token classification: ``ner`` (entity tags required) and ``tagging`` (any tag set)."""

    name = "tagging"
    head = "BertForTokenClassification"
    tasks = ("ner", "tagging")
    settings = ("task", "max_seq_length", "stride", "tag_column", "tag_scheme", "tag_piece", "label_names")
    long_inputs_supported = ("windows",)
    long_inputs_why = "every word gets a tag, so a long sentence is cut into windows"

    def metric_names(self, task: str) -> tuple[str, ...]:
        return ("accuracy", "precision", "recall", "f1", "f1_*")  # f1_TYPE: each entity type's

    @staticmethod
    def _read(cfg: TaskSettings, path: Path, require_tags: bool) -> tuple[list[Sentence], ReadReport]:
        return read_sentences(path, tag_column=cfg.tag_column, require_tags=require_tags,
                              skip_bad_rows=cfg.skip_bad_rows)

    def train_data(self, cfg: TaskSettings, tokenizer: Any) -> TrainData:
        read = [(path, *self._read(cfg, path, True)) for path in self.files(cfg, cfg.train_file, "train")]
        sentences = [s for _, got, _ in read for s in got]
        if not sentences:
            raise ValueError(f"{cfg.train_file}: no tagged sentences")
        labels = cfg.named_labels() or tag_list(sentences)  # named: a ClassLabel's order, kept as the ids
        if len({t for s in sentences for t in s.tags or ()}) < 2:
            raise ValueError(f"{cfg.train_file}: one tag only ({sentences[0].tags[0]!r}): nothing to learn")
        scheme = _training_scheme(read, cfg.tag_scheme, cfg.task, labels)
        label2id = {name: i for i, name in enumerate(labels)}
        tags = np.concatenate([tag_ids(got, path, label2id) for path, got, _ in read])
        encoded = encode_sentences(sentences, tokenizer, cfg.max_seq_length, cfg.stride, cfg.tag_piece).with_tags(tags)
        summary = f"{encoded.summary()}; scheme {scheme or 'none (not entity tags: token accuracy only)'}"
        return TrainData(encoded, {"id2label": dict(enumerate(labels))}, labels, [r for _, _, r in read], summary)

    def eval_data(self, cfg: TaskSettings, tokenizer: Any, path: Path, label2id: dict[str, int] | None) -> EvalData:
        sentences, report = self._read(cfg, path, True)
        if not sentences:
            raise ValueError(f"{report.summary()}: no tagged sentences")
        label2id = label2id or {}
        unseen = unseen_labels(path, (t for s in sentences for t in s.tags or ()), label2id, kind="tag",
                               unit="word", effect="those words count as wrong and their entities as missed")
        if unseen:  # scored as the model's own tags are, so they must be valid in its scheme
            _check_tags(path, sentences, cfg.task,
                        resolve_scheme(cfg.tag_scheme, cfg.task, list(label2id), (s.tags for s in sentences)), unseen)
        encoded = encode_sentences(sentences, tokenizer, cfg.max_seq_length, cfg.stride, cfg.tag_piece)
        encoded.with_tags(tag_ids(sentences, path, label2id, unseen=losses.IGNORE_INDEX))
        return EvalData(path, (encoded, sentences), report, encoded.summary())

    def objective(self, config: Any) -> TaggingObjective:
        return TaggingObjective()

    def evaluate(self, model: nn.Module, data: EvalData, cfg: TaskSettings, device: torch.device,
                 dist: Any = None) -> EvalResult:
        encoded, sentences = data.data
        pred, labels, _ = _predicted_tags(model, encoded, cfg, device, dist)
        gold = [s.tags for s in sentences]
        scheme = resolve_scheme(cfg.tag_scheme, cfg.task, labels, gold)
        metrics = tagging_metrics(gold, pred, scheme)
        text = conll_text([list(zip(s.tokens, s.tags, p)) for s, p in zip(sentences, pred)])
        return EvalResult(metrics, "f1" if scheme else "accuracy", {"predictions.conll": text})

    def predict(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, path: Path,
                device: torch.device) -> list[dict[str, Any]]:
        """``{"index", "line", "tokens", "tags", "scores", "entities"}`` per sentence: each word's tag and its
        probability; entities with their words ``word_start`` .. ``word_end`` - 1 (a file's words have no
        characters: the keys are not `predict_texts`' character ``start`` / ``end``) and their mean score."""
        sentences, _ = self._read(cfg, path, False)
        got = _tag_sentences(model, tokenizer, cfg, sentences, device)
        return [{"index": i, "line": s.line, "tokens": s.tokens, "tags": tags, "scores": got.scores[i],
                 "entities": [{"type": kind, "word_start": a, "word_end": b, "text": " ".join(s.tokens[a:b]),
                               "score": got.entity_score(i, a, b)} for kind, a, b in spans]}
                for i, (s, tags, spans) in enumerate(zip(sentences, got.tags, got.entities))]

    def format_predictions(self, records: list[dict[str, Any]], out: Path) -> str:
        """CoNLL columns ``token pred``, a blank line between sentences."""
        return conll_text([list(zip(r["tokens"], r["tags"])) for r in records])

    def predict_texts(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, texts: Sequence[Sequence[str]],
                      device: torch.device | str) -> list[dict[str, Any]]:
        """``{"index", "text", "words", "entities"}`` per text (the tokenizer's words), in characters, each
        word with its tag's probability and each entity with its words' mean (``score``)."""
        texts = [t[0] for t in texts]
        enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, return_word_ids=True)
        spans: list[list[tuple[int, int]]] = []  # per text: each word's characters
        for text, offs, words in zip(texts, enc["offset_mapping"], enc["word_ids"]):
            offs = offsets_through_marks(text, np.array(offs, dtype=np.int64).reshape(-1, 2))
            found: dict[int, list[int]] = {}
            for (s, e), w in zip(offs.tolist(), words):
                found.setdefault(w, [s, e])[1] = e
            spans.append([(s, e) for s, e in found.values()])
        sentences = [Sentence([text[s:e] for s, e in words], None, [i + 1] * len(words))
                     for i, (text, words) in enumerate(zip(texts, spans))]
        got = _tag_sentences(model, tokenizer, cfg, sentences, device)
        return [{"index": i, "text": text,
                 "entities": [{"type": kind, "start": words[a][0], "end": words[b - 1][1],
                               "text": text[words[a][0]:words[b - 1][1]], "score": got.entity_score(i, a, b)}
                              for kind, a, b in ents],
                 "words": [{"text": text[s:e], "start": s, "end": e, "tag": t, "score": p}
                           for (s, e), t, p in zip(words, seq, got.scores[i])]}
                for i, (text, words, seq, ents) in enumerate(zip(texts, spans, got.tags, got.entities))]
