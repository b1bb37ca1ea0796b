"""The standard metrics of BERT's task families, computed as their official definitions compute them.

GLUE's leaderboard metrics (`GLUE_METRICS`) and tagging's entity-level scores (`conlleval`'s chunk
rules, BIOES too) are fractions (0-1); SQuAD v1.1 / v2.0's exact match and F1 (with v2.0's HasAns /
NoAns breakdown and best no-answer threshold) are percent, as the official scripts report them.
numpy only; each function names the definition it follows.
"""

from __future__ import annotations

import json
import os
import re
import string
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["accuracy", "f1_binary", "matthews_corrcoef", "pearson", "spearman", "GLUE_METRICS", "glue_metrics",
           "glue_metric_names", "SCHEMES", "entity_spans", "ner_metrics", "normalize_answer", "squad_exact",
           "squad_f1", "squad_metrics"]


# ------------------------------------------------------------------------------ classification and regression (GLUE)
def _as_pair(a: Any, b: Any, names: tuple[str, str] = ("predictions", "labels")) -> tuple[np.ndarray, np.ndarray]:
    """Two 1-D arrays of the same, non-zero length (lists, numpy arrays and CPU tensors are accepted)."""
    x, y = np.asarray(a), np.asarray(b)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(f"expected 1-D {names[0]} and {names[1]}, got shapes {x.shape} and {y.shape}")
    if len(x) != len(y):
        raise ValueError(f"{len(x)} {names[0]} but {len(y)} {names[1]}: they must pair up one to one")
    if len(x) == 0:
        raise ValueError(f"no {names[0]} to score (empty input)")
    return x, y


def accuracy(preds: Any, labels: Any) -> float:
    """Share of predictions equal to their label."""
    p, y = _as_pair(preds, labels)
    return float(np.mean(p == y))


def f1_binary(preds: Any, labels: Any, positive: Any = 1) -> float:
    """F1 of the `positive` class (2TP / (2TP + FP + FN), 0.0 without TP), as scikit-learn's `f1_score`."""
    p, y = _as_pair(preds, labels)
    tp = int(np.sum((p == positive) & (y == positive)))
    wrong = int(np.sum((p == positive) != (y == positive)))  # FP + FN
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + wrong)


def matthews_corrcoef(preds: Any, labels: Any) -> float:
    """Matthews correlation in its multi-class form (Gorodkin's R_K), as scikit-learn computes it:
    (c*s - t.p) / sqrt((s^2 - p.p) * (s^2 - t.t)) of the confusion matrix's trace c, total s, row sums
    t and column sums p; 0.0 when undefined (all labels or all predictions one class)."""
    p, y = _as_pair(preds, labels)
    _, ids = np.unique(np.concatenate([y, p]), return_inverse=True)
    k, n = int(ids.max()) + 1, len(y)
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (ids[:n], ids[n:]), 1.0)
    t, q = confusion.sum(axis=1), confusion.sum(axis=0)
    c, s = float(np.trace(confusion)), float(n)
    cov_tp = c * s - float(t @ q)
    cov_pp = s * s - float(q @ q)
    cov_tt = s * s - float(t @ t)
    if cov_pp * cov_tt == 0:
        return 0.0
    return cov_tp / float(np.sqrt(cov_tt * cov_pp))


def pearson(x: Any, y: Any) -> float:
    """Pearson's r (as scipy.stats.pearsonr). NaN when either input is constant, as scipy returns."""
    a, b = _as_pair(x, y, ("x values", "y values"))
    if len(a) < 2:
        raise ValueError("a correlation needs at least 2 pairs")
    da, db = a.astype(np.float64) - a.mean(), b.astype(np.float64) - b.mean()
    denom = float(np.sqrt((da @ da) * (db @ db)))
    if denom == 0.0:
        return float("nan")
    return float(np.clip((da @ db) / denom, -1.0, 1.0))


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span (scipy's rankdata "average")."""
    order = np.argsort(a, kind="stable")
    ordered = a[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]  # each run of equal values starts here
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(a)]  # exclusive
    ranks = np.empty(len(a), dtype=np.float64)
    ranks[order] = ((starts + ends + 1) / 2.0)[np.cumsum(first) - 1]  # mean of starts+1 .. ends
    return ranks


def spearman(x: Any, y: Any) -> float:
    """Spearman's rho: Pearson's r of the average ranks (as scipy.stats.spearmanr, ties included)."""
    a, b = _as_pair(x, y, ("x values", "y values"))
    return pearson(_average_ranks(a), _average_ranks(b))


#: GLUE task -> the metrics its leaderboard reports (as transformers' `glue_compute_metrics`); "mnli-m" /
#: "mnli-mm": MNLI's matched and mismatched sets; "ax": the diagnostic set.
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews",), "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1", "acc_and_f1"), "qqp": ("accuracy", "f1", "acc_and_f1"),
    "stsb": ("pearson", "spearman", "corr"),
    "mnli": ("accuracy",), "mnli-m": ("accuracy",), "mnli-mm": ("accuracy",),
    "qnli": ("accuracy",), "rte": ("accuracy",), "wnli": ("accuracy",), "ax": ("matthews",),
}

# Spellings met in the wild, keyed with "-" and "_" removed: "SST-2", "sts_b", "mnli_matched", ...
_GLUE_ALIASES = {name.replace("-", ""): name for name in GLUE_METRICS} | {
    "mnlimatched": "mnli-m", "mnlimismatched": "mnli-mm"}
_GLUE_PREFIX = re.compile(r"^glue[/:_-]")
_METRIC_FNS = {"accuracy": accuracy, "f1": f1_binary, "matthews": matthews_corrcoef,
               "pearson": pearson, "spearman": spearman}


def _task_metrics(task: str) -> tuple[str, tuple[str, ...]]:
    """(canonical task name, metric names); a name outside GLUE is a plain classification task."""
    name = task.strip().lower()
    claims_glue = bool(_GLUE_PREFIX.match(name))
    name = _GLUE_PREFIX.sub("", name)
    canonical = _GLUE_ALIASES.get(name.replace("-", "").replace("_", ""))
    if canonical is not None:
        return canonical, GLUE_METRICS[canonical]
    if claims_glue:
        raise ValueError(f"unknown GLUE task {task!r}; GLUE tasks are {', '.join(GLUE_METRICS)}")
    return name, ("accuracy",)


def glue_metric_names(task: str) -> tuple[str, ...]:
    """The metrics `glue_metrics` reports for ``task``."""
    return _task_metrics(task)[1]


def glue_metrics(task: str, preds: Any, labels: Any) -> dict[str, float]:
    """The metrics GLUE reports for `task` (see `GLUE_METRICS`), as fractions ("acc_and_f1", "corr":
    means of the two). Case, "-" and "_" do not matter; any other task is scored with accuracy only."""
    name, names = _task_metrics(task)
    p, y = _as_pair(preds, labels)
    if name != "stsb" and p.dtype.kind == "f" and not np.all(np.mod(p, 1) == 0):
        raise ValueError(f"task {task!r} is classification: predictions must be class ids, got non-integer "
                         f"values such as {p[np.mod(p, 1) != 0][0]!r} (take the argmax of the logits)")
    scores = {metric: _METRIC_FNS[metric](p, y) for metric in names if metric in _METRIC_FNS}
    if "acc_and_f1" in names:
        scores["acc_and_f1"] = (scores["accuracy"] + scores["f1"]) / 2
    if "corr" in names:
        scores["corr"] = (scores["pearson"] + scores["spearman"]) / 2
    return scores


# ------------------------------------------------------------------------------ tagging (conlleval)
#: Tagging scheme -> the tag prefixes it allows besides "O" (conlleval reads all with the same rules).
SCHEMES: dict[str, str] = {"BIO": "BI", "IOB2": "BI", "IOB1": "BI", "BIOES": "BIES", "IOBES": "BIES"}


def _parse_tags(tags: Sequence[str], scheme: str) -> list[tuple[str, str]]:
    """(prefix, type) per tag, "O" as ("O", ""); a tag the scheme does not allow is an error."""
    allowed = SCHEMES.get(scheme.upper())
    if allowed is None:
        raise ValueError(f"unknown tagging scheme {scheme!r}; known schemes: {', '.join(SCHEMES)}")
    if isinstance(tags, str):
        raise ValueError("expected a sequence of tags, got one string")
    parsed = []
    for tag in tags:
        prefix, _, kind = tag.partition("-")
        if tag == "O":
            parsed.append(("O", ""))
        elif len(prefix) == 1 and prefix in allowed and kind:
            parsed.append((prefix, kind))
        else:
            raise ValueError(f"tag {tag!r} is not valid in scheme {scheme!r}: expected 'O' or "
                             f"'{{{','.join(allowed)}}}-TYPE'")
    return parsed


def _chunk_boundary(prev: tuple[str, str], cur: tuple[str, str]) -> tuple[bool, bool]:
    """conlleval's endOfChunk and startOfChunk between two tokens: (does the entity holding `prev`
    close before `cur`, does one open at `cur`). A type switch does both; so does I- after O."""
    (prev_tag, prev_type), (tag, kind) = prev, cur
    switch = prev_type != kind
    ends = prev_tag in "ES" or (prev_tag in "BI" and (tag in "BSO" or switch))
    starts = tag in "BS" or (tag in "IE" and (prev_tag in "OES" or switch))
    return ends, starts


def entity_spans(tags: Sequence[str], scheme: str = "BIO") -> list[tuple[str, int, int]]:
    """Entities as (type, start, end-exclusive), found with conlleval's lenient chunk rules:
    ["I-PER", "I-LOC", "O", "B-ORG", "I-ORG"] -> [("PER", 0, 1), ("LOC", 1, 2), ("ORG", 3, 5)]."""
    parsed = _parse_tags(tags, scheme)
    spans: list[tuple[str, int, int]] = []
    prev, start = ("O", ""), -1
    for i, cur in enumerate([*parsed, ("O", "")]):  # the closing O ends the last entity
        ends, starts = _chunk_boundary(prev, cur)
        if ends and start >= 0:
            spans.append((prev[1], start, i))
            start = -1
        if starts:
            start = i
        prev = cur
    return spans


def _prf(correct: int, predicted: int, true: int) -> tuple[float, float, float]:
    """conlleval's precision, recall and FB1 (each 0 when its denominator is)."""
    precision = correct / predicted if predicted else 0.0
    recall = correct / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def ner_metrics(true_seqs: Sequence[Sequence[str]], pred_seqs: Sequence[Sequence[str]],
                scheme: str = "BIO") -> dict[str, Any]:
    """Entity-level scores as conlleval computes them, as fractions (micro-averaged; "accuracy": of
    tokens), overall and ``per_type``; "support" counts the true entities."""
    if len(true_seqs) != len(pred_seqs):
        raise ValueError(f"{len(true_seqs)} true sequences but {len(pred_seqs)} predicted")
    true_spans: set[tuple[str, int, int, int]] = set()
    pred_spans: set[tuple[str, int, int, int]] = set()
    tokens = right_tags = 0
    for i, (true, pred) in enumerate(zip(true_seqs, pred_seqs)):
        if len(true) != len(pred):
            raise ValueError(f"sequence {i}: {len(true)} true tags but {len(pred)} predicted")
        true_spans.update((kind, i, start, end) for kind, start, end in entity_spans(true, scheme))
        pred_spans.update((kind, i, start, end) for kind, start, end in entity_spans(pred, scheme))
        tokens += len(true)
        right_tags += sum(t == p for t, p in zip(true, pred))
    if tokens == 0:
        raise ValueError("no tags to score (empty input)")
    correct = true_spans & pred_spans
    n_true, n_pred, n_correct = (Counter(span[0] for span in spans)
                                 for spans in (true_spans, pred_spans, correct))
    per_type = {}
    for kind in sorted(n_true.keys() | n_pred.keys()):
        p, r, f = _prf(n_correct[kind], n_pred[kind], n_true[kind])
        per_type[kind] = {"precision": p, "recall": r, "f1": f, "support": n_true[kind]}
    p, r, f = _prf(len(correct), len(pred_spans), len(true_spans))
    return {"precision": p, "recall": r, "f1": f, "accuracy": right_tags / tokens,
            "support": len(true_spans), "per_type": per_type}


# ------------------------------------------------------------------------------ question answering (SQuAD)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)  # ASCII only: the official scripts keep "’", "“", "—"


def normalize_answer(s: str) -> str:
    """The official SQuAD normalisation, in its order: lower-case, drop ASCII punctuation, replace
    the words a / an / the by a space, collapse whitespace ("An-the" -> "anthe")."""
    s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _check_version(version: str) -> str:
    v = str(version).lower().lstrip("v")
    if v not in ("1.1", "2.0"):
        raise ValueError(f"unknown SQuAD version {version!r}; expected '1.1' or '2.0'")
    return v


def _gold_texts(golds: str | Iterable[str], version: str) -> list[str]:
    """v2.0 drops golds that normalise to nothing ("" for unanswerable); v1.1 takes them as they are."""
    golds = [golds] if isinstance(golds, str) else list(golds)
    if _check_version(version) == "1.1":
        if not golds:
            raise ValueError("SQuAD v1.1 scoring needs at least one gold answer")
        return golds
    return [g for g in golds if normalize_answer(g)] or [""]


def _token_f1(pred: str, gold: str, version: str) -> float:
    """Bag-of-tokens F1 of the normalised texts; v2.0 scores empty against empty as 1."""
    pred_tokens, gold_tokens = normalize_answer(pred).split(), normalize_answer(gold).split()
    if version == "2.0" and not (pred_tokens and gold_tokens):
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    return _prf(same, len(pred_tokens), len(gold_tokens))[2]


def squad_exact(pred: str, golds: str | Iterable[str], version: str = "2.0") -> float:
    """1.0 when the normalised prediction equals some normalised gold answer (v2.0, none: ""), else 0.0."""
    target = normalize_answer(pred)
    return float(any(normalize_answer(g) == target for g in _gold_texts(golds, version)))


def squad_f1(pred: str, golds: str | Iterable[str], version: str = "2.0") -> float:
    """Best token F1 over the gold answers (official scripts); v2.0 gives empty vs empty 1.0."""
    v = _check_version(version)
    return max(_token_f1(pred, g, v) for g in _gold_texts(golds, v))


def _answer_texts(answers: Any) -> list[str]:
    """Gold texts from SQuAD JSON, plain strings, or the datasets library's columnar {"text": [...]}."""
    if isinstance(answers, Mapping):
        return list(answers["text"])
    return [a if isinstance(a, str) else a["text"] for a in answers]


def _squad_questions(data: Any) -> tuple[dict[str, list[str]], bool]:
    """({question id: gold texts}, whether the data is SQuAD 2.0), from a SQuAD JSON file or
    object, its "data" list, or a flat list of question dicts with "id" and "answers"."""
    if isinstance(data, (str, os.PathLike)):
        with open(data, encoding="utf-8") as f:
            data = json.load(f)
    if isinstance(data, Mapping):
        if "data" not in data:
            raise ValueError("a SQuAD JSON object needs a 'data' list of articles")
        data = data["data"]
    questions: dict[str, list[str]] = {}
    v2 = False
    for item in data:
        qas = [qa for p in item["paragraphs"] for qa in p["qas"]] if "paragraphs" in item else [item]
        for qa in qas:
            if "id" not in qa or "answers" not in qa:
                raise ValueError("each question needs an 'id' and 'answers' (SQuAD JSON structure)")
            if qa["id"] in questions:
                raise ValueError(f"duplicate question id {qa['id']!r}")
            questions[qa["id"]] = _answer_texts(qa["answers"])
            v2 = v2 or "is_impossible" in qa or not questions[qa["id"]]
    if not questions:
        raise ValueError("no questions to score (empty dataset)")
    return questions, v2


def _percent(scores: Mapping[str, float], qids: Sequence[str]) -> float:
    """Mean score of `qids` in percent; a question without a score counts 0."""
    return 100.0 * sum(scores.get(q, 0.0) for q in qids) / len(qids)


def _best_threshold(raw: Mapping[str, float], predictions: Mapping[str, str], null_odds: Mapping[str, float],
                    has_answer: Mapping[str, bool], total: int) -> tuple[float, float]:
    """The official v2.0 `find_best_thresh`, quirks kept: from every question answered null, let each
    keep its answer in increasing order of null odds; the best total (percent) and its first odds."""
    score = best = sum(1 for q in raw if not has_answer[q])
    best_threshold = 0.0
    for q in sorted(null_odds, key=lambda k: null_odds[k]):
        if q not in raw:
            continue
        if has_answer[q]:
            score += raw[q]
        elif predictions[q]:
            score -= 1
        if score > best:
            best, best_threshold = score, float(null_odds[q])
    return 100.0 * best / total, best_threshold


def squad_metrics(dataset_json_or_examples: Any, predictions: Mapping[str, str],
                  null_odds: Mapping[str, float] | None = None, threshold: float = 0.0,
                  version: str | None = None) -> dict[str, float]:
    """Exact match and F1 in percent, as the official SQuAD evaluation scripts compute them (v2.0 when
    any question has "is_impossible" or no answers, unless given; then also the HasAns / NoAns subsets).

    With `null_odds` (question id -> odds of no answer) an answer whose odds exceed `threshold` counts as
    "" and "best_exact" / "best_f1" (and their thresholds) are the v2.0 script's threshold search. A
    question without a prediction scores 0 (the v1.1 script's rule), with a warning.
    """
    questions, is_v2 = _squad_questions(dataset_json_or_examples)
    v = _check_version(version) if version is not None else ("2.0" if is_v2 else "1.1")
    has_answer = {q: bool(golds) for q, golds in questions.items()}
    answered = [q for q in questions if q in predictions]
    if len(answered) < len(questions):
        warnings.warn(f"{len(questions) - len(answered)} of {len(questions)} questions have no "
                      f"prediction; they score 0", stacklevel=2)
    exact_raw = {q: squad_exact(predictions[q], questions[q], v) for q in answered}
    f1_raw = {q: squad_f1(predictions[q], questions[q], v) for q in answered}
    exact, f1 = exact_raw, f1_raw
    if null_odds is not None:
        lacking = [q for q in answered if q not in null_odds]
        if lacking:
            raise ValueError(f"null_odds lacks {len(lacking)} answered questions, e.g. {lacking[0]!r}")
        is_null = {q: null_odds[q] > threshold for q in answered}
        exact = {q: float(not has_answer[q]) if is_null[q] else s for q, s in exact_raw.items()}
        f1 = {q: float(not has_answer[q]) if is_null[q] else s for q, s in f1_raw.items()}
    qids = list(questions)
    out: dict[str, float] = {"exact_match": _percent(exact, qids), "f1": _percent(f1, qids),
                             "total": len(qids)}
    if v == "2.0":
        for prefix, subset in (("HasAns", [q for q in qids if has_answer[q]]),
                               ("NoAns", [q for q in qids if not has_answer[q]])):
            if subset:
                out |= {f"{prefix}_exact": _percent(exact, subset), f"{prefix}_f1": _percent(f1, subset),
                        f"{prefix}_total": len(subset)}
    if null_odds is not None:
        for name, raw in (("exact", exact_raw), ("f1", f1_raw)):
            out[f"best_{name}"], out[f"best_{name}_thresh"] = _best_threshold(raw, predictions, null_odds,
                                                                              has_answer, len(qids))
    return out
