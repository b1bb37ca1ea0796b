"""Extractive question answering, SQuAD v1.1 (``--task squad``) and v2.0 (``--task squad2``): SQuAD's
JSON -> questions -> windows ``[CLS] question [SEP] context part [SEP]`` (run_squad.py's) -> span
losses, n-best answers, the official EM / F1 and the TF release's prediction files. Answers are the
context's own characters (the tokenizer's offsets, not ``get_final_text``'s heuristic), and padding
is left out of the loss's softmax. The user guide: docs/finetuning.md, "Extractive QA (SQuAD)".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch import nn

from bertforge.model import losses
from bertforge.settings import option
from bertforge.tasks.base import (AccuracyObjective, EvalData, EvalResult, ReadReport, TaskFamily, TaskSettings,
                                  TrainData, model_logits, split_files, text_lines)
from bertforge.tasks.encoding import Windows, max_context_window, offsets_through_marks, predict_items, window_starts

__all__ = ["VERSIONS", "Question", "SquadData", "SquadReadReport", "read_squad", "squad_files", "SquadWindows",
           "encode_squad", "SpanObjective", "WindowScores", "top_k_scores", "predict_scores", "Prediction",
           "postprocess", "prediction_files", "SquadFamily"]

VERSIONS = {"squad": "1.1", "squad2": "2.0"}
"""Task name -> SQuAD version."""

NO_SPAN_ODDS = 1e6
"""Null odds of a SQuAD 2.0 question without any valid span (it is answered "")."""


# ---------------------------------------------------------------------------- reading
class Question(NamedTuple):
    id: str
    text: str
    paragraph: int
    """Index of its context in `SquadData.contexts`."""
    answers: tuple[str, ...]
    """Gold answer texts (empty: unanswerable, or unlabelled)."""
    answer_start: int
    """Character where the first answer starts in the context (-1: none)."""
    is_impossible: bool
    where: str
    """File and place in the JSON (``train.json: data[0].paragraphs[1].qas[2]``), for messages."""


@dataclass
class SquadReadReport(ReadReport):
    """What reading a SQuAD file kept, and the ids of the questions it skipped."""

    skipped_questions: dict[str, list[str]] = field(default_factory=dict)  # reason -> ids

    def skip_question(self, reason: str, qid: str) -> None:
        self.skipped_questions.setdefault(reason, []).append(qid)

    @property
    def num_skipped(self) -> int:
        return super().num_skipped + sum(len(v) for v in self.skipped_questions.values())

    def summary(self) -> str:
        return super().summary("questions", self.skipped_questions, "ids")


@dataclass
class SquadData:
    """Questions of one or more SQuAD files, and the contexts they share."""

    contexts: list[str]
    questions: list[Question]
    version: str
    reports: list[SquadReadReport]

    @classmethod
    def join(cls, parts: Sequence["SquadData"]) -> "SquadData":
        contexts: list[str] = []
        questions: list[Question] = []
        for part in parts:
            questions += [q._replace(paragraph=q.paragraph + len(contexts)) for q in part.questions]
            contexts += part.contexts
        return cls(contexts, questions, parts[0].version, [r for p in parts for r in p.reports])

    def golds(self) -> list[dict[str, Any]]:
        """``{"id", "answers"}`` per question, as `bertforge.metrics.squad_metrics` reads them."""
        return [{"id": q.id, "answers": list(q.answers)} for q in self.questions]


def _typed(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]``, checked to be of ``kind``; else ValueError naming ``where``."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise ValueError(f"{where}: no {key!r} (keys: {', '.join(map(str, obj)) or 'none'})")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:  # JSON true is no number
        names = " or ".join(k.__name__ for k in kinds)
        raise ValueError(f"{where}.{key}: expected {names}, got {type(value).__name__} {value!r:.60}")
    return value


def read_squad(path: str | Path, version: str = "1.1", *, mode: Literal["train", "eval", "predict"] = "eval",
               skip_bad_rows: bool = False) -> SquadData:
    """The questions of a SQuAD JSON file; ``mode`` says which answers they need ("predict": none)."""
    path = Path(path)
    if version not in ("1.1", "2.0"):
        raise ValueError(f"unknown SQuAD version {version!r}; expected '1.1' or '2.0'")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        with text_lines(path) as f:
            root = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    report = SquadReadReport(str(path))
    contexts: list[str] = []
    questions: list[Question] = []
    seen: dict[str, str] = {}
    for i, article in enumerate(_typed(root, "data", list, f"{path}: the top level")):
        for j, paragraph in enumerate(_typed(article, "paragraphs", list, f"{path}: data[{i}]")):
            where_p = f"{path}: data[{i}].paragraphs[{j}]"
            context = _typed(paragraph, "context", str, where_p)
            for k, qa in enumerate(_typed(paragraph, "qas", list, where_p)):
                where = f"{where_p}.qas[{k}]"
                qid = str(qa.get("id", "")) if isinstance(qa, dict) else ""
                try:
                    question = _read_question(qa, where, context, len(contexts), version, mode)
                except ValueError as e:
                    if not skip_bad_rows:
                        named = f"question id {qid!r}; " if qid else ""
                        raise ValueError(f"{e} ({named}{option('skip_bad_rows', True)} skips and counts such "
                                         "questions)") from None
                    report.skip_question(e.reason if isinstance(e, _BadAnswer) else "malformed", qid or where)
                    continue
                if question.id in seen:
                    if not skip_bad_rows:
                        raise ValueError(f"{where}: duplicate question id {question.id!r} "
                                         f"(first at {seen[question.id]})")
                    report.skip_question("duplicate id", question.id)
                    continue
                seen[question.id] = where
                questions.append(question)
            contexts.append(context)
    report.finish(len(questions))
    return SquadData(contexts, questions, version, [report])


class _BadAnswer(ValueError):
    """A well-formed question whose answers do not fit the task."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def _read_question(qa: Any, where: str, context: str, paragraph: int, version: str, mode: str) -> Question:
    qid = _typed(qa, "id", (str, int), where)
    text = _typed(qa, "question", str, where)
    impossible = "is_impossible" in qa and _typed(qa, "is_impossible", bool, where)
    if mode == "predict":
        return Question(str(qid), text, paragraph, (), -1, False, where)
    answers = _typed(qa, "answers", list, where)
    texts = tuple(_typed(a, "text", str, f"{where}.answers[{n}]") for n, a in enumerate(answers))
    if version == "1.1" and (impossible or not answers):
        raise _BadAnswer(f"{where}: {'marked is_impossible' if impossible else 'no answers'}: an unanswerable "
                         f"question, which SQuAD 1.1 has not (SQuAD 2.0 data: use {option('task', 'squad2')})",
                         "unanswerable")
    impossible = impossible or "is_impossible" not in qa and not answers
    start = -1
    if mode == "train" and not impossible:
        if not answers:
            raise _BadAnswer(f"{where}: no answers and not is_impossible: no answer to train on", "no answers")
        start = _typed(answers[0], "answer_start", int, f"{where}.answers[0]")
        if start < 0 or context[start:start + len(texts[0])] != texts[0]:
            found = context[max(start, 0):max(start, 0) + len(texts[0])]
            raise _BadAnswer(f"{where}: the answer {texts[0]!r} is not the context's text at its answer_start "
                             f"{start} ({found!r} is)", "answer not in context")
    return Question(str(qid), text, paragraph, texts, start, impossible, where)


def squad_files(spec: str, task: str, split: str) -> list[Path]:
    """Files named by ``spec`` (comma-separated); a folder gives its official file (dev-v2.0.json, ...)."""
    files = []
    for part in split_files(spec):
        if part.is_dir():
            name = f"{split}-v{VERSIONS[task]}.json"
            if not (part / name).is_file():
                raise FileNotFoundError(f"{part}: no {name} (a SQuAD folder holds the official file names)")
            part = part / name
        files.append(part)
    return files


# ---------------------------------------------------------------------------- encoding
@dataclass
class SquadWindows(Windows):
    """Windows ``[CLS] question [SEP] context part [SEP]``; ``example``: the question (consecutive)."""

    doc_start: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """First context token of each window (an index into its paragraph's tokens)."""
    doc_len: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Context tokens in each window."""
    max_context: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    """Per context token of every window (window after window): is this its max-context window."""
    max_context_at: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """Where each window's flags start in ``max_context``."""
    offsets: list[np.ndarray] = field(default_factory=list)
    """Per paragraph: (tokens, 2) character start and end of each context token."""
    start_positions: np.ndarray | None = None
    end_positions: np.ndarray | None = None
    cut_questions: int = 0
    """Questions longer than max_query_length (cut)."""
    without_answer: int = 0
    """Training windows of answerable questions that do not hold the answer (their targets are [CLS])."""

    def collate(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        batch = super().collate(indices)
        if self.start_positions is not None and self.end_positions is not None:
            idx = np.asarray(indices)
            batch["start_positions"] = torch.from_numpy(self.start_positions[idx])
            batch["end_positions"] = torch.from_numpy(self.end_positions[idx])
        return batch

    def window_range(self, question: int) -> tuple[int, int]:
        """The windows of question ``question``: [first, end)."""
        a, b = np.searchsorted(self.example, [question, question + 1])
        return int(a), int(b)

    def summary(self) -> str:
        text = f"{self.num_examples:,} questions -> {len(self):,} windows"
        notes = []
        if self.windowed:
            notes.append(f"{self.windowed:,} questions over several windows")
        if self.without_answer:
            notes.append(f"{self.without_answer:,} windows without their answer (targets [CLS])")
        if self.cut_questions:
            notes.append(f"{self.cut_questions:,} questions cut to max_query_length")
        return text + (f" ({'; '.join(notes)})" if notes else "")


def encode_squad(data: SquadData, tokenizer: Any, max_seq_length: int, doc_stride: int, max_query_length: int, *,
                 targets: bool = False, skip_bad_rows: bool = False) -> SquadWindows:
    """Tokenize and cut into windows; ``targets``: with training start / end positions."""
    _check_window_settings(max_seq_length, doc_stride, max_query_length)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids, offsets = _tokenize_contexts(data, tokenizer)
    query_ids = tokenizer.encode_batch_ids([q.text for q in data.questions])
    out_ids: list[np.ndarray] = []
    num_a: list[int] = []
    example: list[int] = []
    doc_start: list[np.ndarray] = []
    doc_len: list[np.ndarray] = []
    max_context: list[np.ndarray] = []
    start_pos: list[int] = []
    end_pos: list[int] = []
    windowed = cut = without = 0
    for i, (q, query) in enumerate(zip(data.questions, query_ids)):
        doc, offs = ids[q.paragraph], offsets[q.paragraph]
        cut += len(query) > max_query_length
        query = query[:max_query_length]
        room = max_seq_length - len(query) - 3
        n = len(doc)
        starts = np.array(window_starts(n, room, min(room, doc_stride)), dtype=np.int64)
        lengths = np.minimum(n - starts, room)
        if targets:
            span = _answer_tokens(data, q, offs, skip_bad_rows)
            if span is None:
                continue
            first, last = span
            inside = (first >= starts) & (last < starts + lengths)
            if not q.is_impossible:
                without += int((~inside).sum())
            for s, ok in zip(starts, inside):
                start_pos.append(int(first - s + len(query) + 2) if ok else 0)
                end_pos.append(int(last - s + len(query) + 2) if ok else 0)
        windowed += len(starts) > 1
        best = max_context_window(starts, lengths, np.arange(n))[None, :] == np.arange(len(starts))[:, None]  # (W, n)
        head = np.array([cls, *query, sep], dtype=np.int64)
        for w, (s, length) in enumerate(zip(starts, lengths)):
            out_ids.append(np.concatenate([head, doc[s:s + length], [sep]]))
            max_context.append(best[w, s:s + length])
        num_a += [len(head)] * len(starts)
        example += [i] * len(starts)
        doc_start.append(starts)
        doc_len.append(lengths)

    def cat(parts: list[np.ndarray], dtype: type = np.int64) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype)

    lengths_all = cat(doc_len)
    return SquadWindows(
        out_ids, np.array(num_a, dtype=np.int64), np.array(example, dtype=np.int64), len(data.questions),
        windowed=windowed, doc_start=cat(doc_start), doc_len=lengths_all, max_context=cat(max_context, bool),
        max_context_at=np.cumsum(lengths_all) - lengths_all, offsets=offsets,
        start_positions=np.array(start_pos, dtype=np.int64) if targets else None,
        end_positions=np.array(end_pos, dtype=np.int64) if targets else None, cut_questions=cut, without_answer=without)


def _check_window_settings(max_seq_length: int, doc_stride: int, max_query_length: int) -> None:
    """A window must hold [CLS], the question, two [SEP] and some context, and windows must move on."""
    if max_seq_length <= max_query_length + 3:
        raise ValueError(f"max_seq_length ({max_seq_length}) must be greater than max_query_length "
                         f"({max_query_length}) + 3: a window holds [CLS], the question, two [SEP] and context")
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be >= 1, got {doc_stride}")


def _tokenize_contexts(data: SquadData, tokenizer: Any) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
    """Token ids and (tokens, 2) character offsets of each context a question asks about."""
    used = sorted({q.paragraph for q in data.questions})
    ids: dict[int, np.ndarray] = {}
    offsets: list[np.ndarray] = [np.zeros((0, 2), np.int64)] * len(data.contexts)
    if used:
        enc = tokenizer([data.contexts[p] for p in used], add_special_tokens=False, return_offsets_mapping=True)
        for p, row, offs in zip(used, enc["input_ids"], enc["offset_mapping"]):
            ids[p] = np.array(row, dtype=np.int64)
            offsets[p] = offsets_through_marks(data.contexts[p], np.array(offs, dtype=np.int64).reshape(-1, 2))
    return ids, offsets


def _answer_tokens(data: SquadData, q: Question, offs: np.ndarray, skip_bad_rows: bool) -> tuple[int, int] | None:
    """The first and last context token a training answer overlaps ((-1, -1): unanswerable; None: skipped)."""
    if q.is_impossible:
        return -1, -1
    a, b = q.answer_start, q.answer_start + len(q.answers[0])
    first = int(np.searchsorted(offs[:, 1], a, side="right"))
    last = int(np.searchsorted(offs[:, 0], b, side="left")) - 1
    if first <= last:
        return first, last
    if not skip_bad_rows:
        raise ValueError(f"{q.where}: the answer {q.answers[0]!r} holds no token (only characters "
                         f"the tokenizer drops) (question id {q.id!r}; {option('skip_bad_rows', True)} skips and "
                         "counts such questions)")
    for report in data.reports:  # the question's file's (``where`` starts with its path)
        if q.where.startswith(report.path + ":"):
            report.skip_question("answer without tokens", q.id)
            report.examples -= 1
    return None


# ---------------------------------------------------------------------------- the task
class SpanObjective(AccuracyObjective):
    """Summed span cross-entropy, padding left out of the softmax; accuracy: start and end both right."""

    term = "span"
    metric = "span_accuracy"

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        return {self.term: float(batch["start_positions"].shape[0])}

    def forward(self, model: nn.Module, batch: dict[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        out = model_logits(model, batch)
        pad = batch["attention_mask"] == 0
        start = out.start_logits.float().masked_fill(pad, float("-inf"))  # (B, T)
        end = out.end_logits.float().masked_fill(pad, float("-inf"))
        sp, ep = batch["start_positions"], batch["end_positions"]
        loss = losses.span_loss(start, end, sp, ep, reduction="sum")
        correct = ((start.argmax(-1) == sp) & (end.argmax(-1) == ep)).sum()
        return {self.term: loss}, {"correct": correct}


# ---------------------------------------------------------------------------- answers
class WindowScores(NamedTuple):
    """A window's k best start and end positions and logits (best first), and its [CLS] logits."""

    start_index: np.ndarray
    start_logit: np.ndarray
    end_index: np.ndarray
    end_logit: np.ndarray
    null_start: float
    null_end: float


def top_k_scores(start_logits: torch.Tensor, end_logits: torch.Tensor, attention_mask: torch.Tensor,
                 k: int) -> list[WindowScores]:
    """(B, T) logits -> one `WindowScores` per row, over its real tokens (filled with T and -inf)."""
    pad = attention_mask == 0
    T = start_logits.shape[1]
    picked = []
    for logits in (start_logits, end_logits):
        x = logits.float().masked_fill(pad, float("-inf"))
        if T < k:
            x = torch.nn.functional.pad(x, (0, k - T), value=float("-inf"))
        values, index = torch.sort(x, dim=1, descending=True, stable=True)
        index = index[:, :k].clamp_(max=T)
        picked.append((index.cpu().numpy(), values[:, :k].cpu().numpy()))
    (si, sv), (ei, ev) = picked
    null_s = start_logits[:, 0].float().cpu().numpy()
    null_e = end_logits[:, 0].float().cpu().numpy()
    return [WindowScores(si[b], sv[b], ei[b], ev[b], float(null_s[b]), float(null_e[b])) for b in range(len(si))]


def predict_scores(model: nn.Module, encoded: SquadWindows, k: int, batch_size: int,
                   device: torch.device | str = "cpu", dist: Any = None) -> list[WindowScores]:
    """`WindowScores` of every window (with ``dist``: every process runs a part, all get the whole)."""

    def run(m: nn.Module, batch: dict[str, torch.Tensor], idx: Sequence[int]) -> list[WindowScores]:
        out = model_logits(m, batch)
        return top_k_scores(out.start_logits, out.end_logits, batch["attention_mask"], k)

    return predict_items(model, encoded, batch_size, device, run, dist)


@dataclass
class Prediction:
    """One question's outcome."""

    id: str
    text: str
    """The answer predicted ("" for no answer)."""
    best_text: str
    """The best span's text, whatever the null score ("" when no span is valid)."""
    start: int
    end: int
    """Characters of the best span in the context, [start, end) (-1 when no span is valid)."""
    probability: float
    """The n-best probability of the predicted answer."""
    null_odds: float | None
    """SQuAD 2.0: null score - best span score."""
    nbest: list[dict[str, Any]]
    """``{"text", "probability", "start_logit", "end_logit"}``, best first (nbest_predictions.json)."""


def postprocess(data: SquadData, encoded: SquadWindows, scores: Sequence[WindowScores], *, n_best_size: int,
                max_answer_length: int, null_score_diff_threshold: float = 0.0) -> list[Prediction]:
    """The answers of every question from its windows' scores (SQuAD 2.0: may be null)."""
    v2 = data.version == "2.0"
    if scores:
        si, sv = np.stack([s.start_index for s in scores]), np.stack([s.start_logit for s in scores]).astype(np.float64)
        ei, ev = np.stack([s.end_index for s in scores]), np.stack([s.end_logit for s in scores]).astype(np.float64)
        null = np.array([(s.null_start, s.null_end) for s in scores], dtype=np.float64).reshape(-1, 2)
    flags = encoded.max_context
    out = []
    for qi, q in enumerate(data.questions):
        a, b = encoded.window_range(qi)
        context, offs = data.contexts[q.paragraph], encoded.offsets[q.paragraph]
        spans = np.zeros(0, dtype=np.float64)
        tok_s = tok_e = span_s = span_e = np.zeros(0, np.int64)
        if b > a:
            base = encoded.num_a[a:b, None]
            length = encoded.doc_len[a:b, None]
            s_rel, e_rel = si[a:b] - base, ei[a:b] - base  # (W, k) positions in the context part
            ok_s = (s_rel >= 0) & (s_rel < length)
            if flags.size:
                ok_s &= flags[np.where(ok_s, encoded.max_context_at[a:b, None] + s_rel, 0)]
            ok_e = (e_rel >= 0) & (e_rel < length)
            n_tok = e_rel[:, None, :] - s_rel[:, :, None] + 1  # (W, k starts, k ends)
            valid = ok_s[:, :, None] & ok_e[:, None, :] & (n_tok >= 1) & (n_tok <= max_answer_length)
            w, i, j = np.nonzero(valid)  # window, start rank, end rank: the TF release's order
            span_s, span_e = sv[a + w, i], ev[a + w, j]
            spans = span_s + span_e
            tok_s = encoded.doc_start[a + w] + s_rel[w, i]
            tok_e = encoded.doc_start[a + w] + e_rel[w, j]
        null_score, null_logits = None, (0.0, 0.0)
        ranked = spans
        if v2 and b > a:
            m = a + int(np.argmin(null[a:b].sum(1)))  # the first window with the smallest null score
            null_logits = (float(null[m, 0]), float(null[m, 1]))
            null_score = null_logits[0] + null_logits[1]
            ranked = np.append(spans, null_score)  # after the spans: a tie goes to the span
        nbest: list[dict[str, Any]] = []
        chars: list[tuple[int, int]] = []
        seen: set[str] = set()

        def add(text: str, logits: tuple[float, float], where: tuple[int, int] = (-1, -1)) -> None:
            seen.add(text)
            nbest.append({"text": text, "probability": 0.0, "start_logit": logits[0], "end_logit": logits[1]})
            chars.append(where)

        for c in np.argsort(-ranked, kind="stable"):
            if len(nbest) >= n_best_size:
                break
            if c == len(spans):
                text, logits, where = "", null_logits, (-1, -1)
            else:
                where = (int(offs[tok_s[c], 0]), int(offs[tok_e[c], 1]))
                text, logits = context[where[0]:where[1]], (float(span_s[c]), float(span_e[c]))
            if text not in seen:
                add(text, logits, where)
        if v2 and "" not in seen and null_score is not None:
            add("", null_logits)
        if not nbest:
            add("", (0.0, 0.0))
        totals = np.array([e["start_logit"] + e["end_logit"] for e in nbest])
        probs = np.exp(totals - totals.max())
        for e, p in zip(nbest, probs / probs.sum()):
            e["probability"] = float(p)
        best = next((k for k, e in enumerate(nbest) if e["text"]), None)
        best_text, (start, end) = (nbest[best]["text"], chars[best]) if best is not None else ("", (-1, -1))
        odds: float | None = None
        chosen = 0
        if v2:
            if best is None or null_score is None:
                odds = NO_SPAN_ODDS
            else:
                odds = null_score - (nbest[best]["start_logit"] + nbest[best]["end_logit"])
            null_at = next(k for k, e in enumerate(nbest) if not e["text"])
            chosen = best if best is not None and odds <= null_score_diff_threshold else null_at
        out.append(Prediction(q.id, nbest[chosen]["text"], best_text, start, end, nbest[chosen]["probability"],
                              odds, nbest))
    return out


def prediction_files(predictions: Sequence[Prediction], version: str) -> dict[str, str]:
    """predictions.json, nbest_predictions.json and (2.0) null_odds.json, as the TF release writes them."""
    files = {"predictions.json": _json_file({p.id: p.text for p in predictions}),
             "nbest_predictions.json": _json_file({p.id: p.nbest for p in predictions})}
    if version == "2.0":
        files["null_odds.json"] = _json_file({p.id: p.null_odds for p in predictions})
    return files


def _json_file(obj: Any) -> str:
    return json.dumps(obj, indent=4, ensure_ascii=False) + "\n"


def _score(data: SquadData, predictions: Sequence[Prediction], threshold: float) -> dict[str, float]:
    """The official EM / F1; SQuAD 2.0 scores the best spans, so the threshold search sees every one."""
    from bertforge.metrics import squad_metrics

    if data.version == "2.0":
        return squad_metrics(data.golds(), {p.id: p.best_text for p in predictions},
                             {p.id: float(p.null_odds) for p in predictions if p.null_odds is not None},
                             threshold=threshold, version="2.0")
    return squad_metrics(data.golds(), {p.id: p.text for p in predictions}, version="1.1")


# ---------------------------------------------------------------------------- the family
class SquadFamily(TaskFamily):
    """Extractive QA (`bertforge.tasks.base.TaskFamily`): ``squad`` (v1.1) and ``squad2`` (v2.0)."""

    name = "squad"
    head = "BertForQuestionAnswering"
    tasks = tuple(VERSIONS)
    settings = ("task", "max_seq_length", "stride", "max_query_length", "max_answer_length", "n_best_size",
                "null_score_diff_threshold")
    default_max_seq_length = 384
    default_stride = 128
    long_inputs_supported = ("windows",)
    long_inputs_why = "a long context is cut into windows every --stride tokens (doc_stride)"

    def metric_names(self, task: str) -> tuple[str, ...]:
        return ("exact_match", "f1", "total", "HasAns_*", "NoAns_*", "best_*")  # v2.0's breakdown

    def configure(self, cfg: TaskSettings) -> TaskSettings:
        cfg = dataclasses.replace(super().configure(cfg), stride=cfg.stride or self.default_stride)
        _check_window_settings(cfg.max_seq_length, cfg.stride, cfg.max_query_length)
        return cfg

    def files(self, cfg: TaskSettings, spec: str, split: str) -> list[Path]:
        return squad_files(spec, cfg.task, split)

    def _encode(self, cfg: TaskSettings, tokenizer: Any, paths: Sequence[Path],
                mode: Literal["train", "eval", "predict"]) -> tuple[SquadData, SquadWindows]:
        parts = [read_squad(p, VERSIONS[cfg.task], mode=mode, skip_bad_rows=cfg.skip_bad_rows) for p in paths]
        data = SquadData.join(parts)
        if not data.questions:
            raise ValueError(f"{', '.join(map(str, paths))}: no questions")
        encoded = encode_squad(data, tokenizer, cfg.max_seq_length, cfg.stride, cfg.max_query_length,
                                targets=mode == "train", skip_bad_rows=cfg.skip_bad_rows)
        return data, encoded

    def train_data(self, cfg: TaskSettings, tokenizer: Any) -> TrainData:
        data, encoded = self._encode(cfg, tokenizer, self.files(cfg, cfg.train_file, "train"), "train")
        impossible = sum(q.is_impossible for q in data.questions)
        summary = encoded.summary() + (f"; {impossible:,} questions unanswerable" if impossible else "")
        return TrainData(encoded, {}, None, list(data.reports), summary)

    def eval_data(self, cfg: TaskSettings, tokenizer: Any, path: Path, label2id: dict[str, int] | None) -> EvalData:
        data, encoded = self._encode(cfg, tokenizer, [path], "eval")
        return EvalData(path, (data, encoded), data.reports[0], encoded.summary())

    def objective(self, config: Any) -> SpanObjective:
        return SpanObjective()

    def _predictions(self, model: nn.Module, data: SquadData, encoded: SquadWindows, cfg: TaskSettings,
                     device: torch.device | str, dist: Any = None) -> list[Prediction]:
        scores = predict_scores(model, encoded, cfg.n_best_size, cfg.eval_batch_size, device, dist)
        return postprocess(data, encoded, scores, n_best_size=cfg.n_best_size,
                           max_answer_length=cfg.max_answer_length,
                           null_score_diff_threshold=cfg.null_score_diff_threshold)

    def evaluate(self, model: nn.Module, data: EvalData, cfg: TaskSettings, device: torch.device,
                 dist: Any = None) -> EvalResult:
        """EM / F1 (main metric F1) and the prediction files."""
        squad, encoded = data.data
        predictions = self._predictions(model, squad, encoded, cfg, device, dist)
        metrics = _score(squad, predictions, cfg.null_score_diff_threshold)
        return EvalResult(metrics, "f1", prediction_files(predictions, squad.version))

    def predict(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, path: Path,
                device: torch.device) -> list[dict[str, Any]]:
        """An answer record per question (`_answer`), numbers rounded to 6 decimals."""
        data, encoded = self._encode(cfg, tokenizer, [path], "predict")
        return [{"id": p.id, **_answer(p, round)} for p in self._predictions(model, data, encoded, cfg, device)]

    def format_predictions(self, records: list[dict[str, Any]], out: Path) -> str:
        """SQuAD's predictions.json: ``{question id: answer}``."""
        return _json_file({r["id"]: r["answer"] for r in records})

    def predict_texts(self, model: nn.Module, tokenizer: Any, cfg: TaskSettings, texts: Sequence[Sequence[str]],
                      device: torch.device | str) -> list[dict[str, Any]]:
        """An answer record (`_answer`) per (question, context), with both."""
        items = [(t[0], t[1]) for t in texts]
        data = SquadData([c for _, c in items],
                         [Question(str(i), q, i, (), -1, False, f"input {i}") for i, (q, _) in enumerate(items)],
                         VERSIONS[cfg.task], [])
        encoded = encode_squad(data, tokenizer, cfg.max_seq_length, cfg.stride, cfg.max_query_length)
        return [{"index": i, "question": q, "context": c, **_answer(p, lambda x, _: x)}
                for i, ((q, c), p) in enumerate(zip(items, self._predictions(model, data, encoded, cfg, device)))]


def _answer(p: Prediction, rounded: Callable[[float, int], float]) -> dict[str, Any]:
    """``answer``, ``start`` / ``end`` (None: no answer), ``score``, ``no_answer`` (and ``null_odds``)."""
    answered = p.text != ""
    record = {"answer": p.text, "start": p.start if answered else None, "end": p.end if answered else None,
              "score": rounded(p.probability, 6), "no_answer": not answered}
    if p.null_odds is not None:
        record["null_odds"] = rounded(p.null_odds, 6)
    return record
