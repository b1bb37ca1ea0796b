"""The classic models a practitioner would ship instead of a pre-trained BERT, from kept libraries, for
comparison beside the BERT lines of the demo, the studies and the benchmarks.

- Tagging: a linear-chain CRF over the textbook lexical features (the word, its prefix and suffixes, its
  shape, its neighbours; sklearn-crfsuite, L-BFGS with ``c1 = c2 = 0.1`` fixed in advance), and the
  most-frequent-tag floor (counting; an unseen word gets its lower-cased form's tag, else the commonest).
- Text classification: word and bigram TF-IDF with L2 logistic regression (scikit-learn), its strength
  chosen by stratified cross-validation inside the training examples.

Each reads only its training examples, as the BERT lines' range tests do (true few-shot), and is scored
as they are: token accuracy over every held-out word, accuracy over the held-out texts.

    got = crf_tagger(train_sentences, heldout_sentences)      # Baseline(accuracy=..., seconds=..., ...)

Needs the optional extra: ``pip install 'bertforge[baselines]'``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

__all__ = ["CRF", "MOST_FREQUENT_TAG", "TFIDF", "Baseline", "crf_tagger", "most_frequent_tag",
           "task_baselines", "tfidf_logistic_regression", "word_features", "C_GRID", "require_baselines"]

CRF = "CRF"
MOST_FREQUENT_TAG = "most frequent tag"
TFIDF = "TF-IDF + logistic regression"
"""The baselines' names, as reports and plots call their lines."""

C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
"""The logistic regression's inverse L2 strengths tried by cross-validation (scikit-learn's ``C``)."""

_INSTALL_HINT = "pip install 'bertforge[baselines]' (scikit-learn, sklearn-crfsuite)"

Sentence = tuple[Sequence[str], Sequence[str]]


@dataclass(frozen=True)
class Baseline:
    """A fitted baseline's held-out accuracy, fitting time, the settings it used (chosen by its own
    cross-validation, where it has one) and its held-out predictions (tags per sentence, or labels), from
    which a task's other metrics (entity F1, MCC) are computed."""

    name: str
    accuracy: float
    seconds: float
    settings: dict[str, Any] = field(default_factory=dict)
    predictions: list[Any] = field(default_factory=list, repr=False)


def require_baselines() -> None:
    """Raise an ImportError naming the extra when scikit-learn or sklearn-crfsuite is missing."""
    for module in ("sklearn", "sklearn_crfsuite"):
        try:
            __import__(module)
        except ImportError as e:
            raise ImportError(f"the classic baselines need {module}: {_INSTALL_HINT}") from e


def _token_accuracy(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    """Accuracy over every held-out word, as the tagging family scores a fine-tuned tagger."""
    from bertforge.tasks.tagging import tagging_metrics

    return tagging_metrics(gold, predicted, None)["accuracy"]


def most_frequent_tag(train: Sequence[Sentence], heldout: Sequence[Sentence]) -> Baseline:
    """Each word's commonest training tag (ties: the tag seen first); a word never seen takes its lower-cased
    form's, else the commonest tag overall: the floor any tagger must clear."""
    start = time.perf_counter()
    by_word: dict[str, Counter] = {}
    overall: Counter = Counter()
    for words, tags in train:
        for w, t in zip(words, tags):
            by_word.setdefault(w, Counter())[t] += 1
            overall[t] += 1
    if not overall:
        raise ValueError("most_frequent_tag: no tagged words to count")
    best = {w: c.most_common(1)[0][0] for w, c in by_word.items()}
    lower: dict[str, Counter] = {}
    for w, c in by_word.items():
        lower.setdefault(w.lower(), Counter()).update(c)
    best_lower = {w: c.most_common(1)[0][0] for w, c in lower.items()}
    default = overall.most_common(1)[0][0]
    predicted = [[best.get(w) or best_lower.get(w.lower(), default) for w in words] for words, _ in heldout]
    return Baseline(MOST_FREQUENT_TAG, _token_accuracy([t for _, t in heldout], predicted),
                    time.perf_counter() - start, {"unknown_word_tag": default}, predicted)


def word_features(words: Sequence[str], i: int) -> dict[str, Any]:
    """The textbook CRF features of ``words[i]``: the word (lower-cased), its 1-3 letter prefixes and
    suffixes, capitalisation, digits and hyphen, and the neighbouring words (two each side)."""
    w = words[i]
    f: dict[str, Any] = {"bias": 1.0, "word": w.lower(), "upper": w.isupper(), "title": w.istitle(),
                         "digit": w.isdigit(), "has_digit": any(c.isdigit() for c in w), "hyphen": "-" in w,
                         "alpha": w.isalpha(), "short": len(w) <= 3}
    for k in (1, 2, 3):
        f[f"prefix{k}"] = w[:k].lower()
        f[f"suffix{k}"] = w[-k:].lower()
    for offset in (-2, -1, 1, 2):
        j = i + offset
        if 0 <= j < len(words):
            n = words[j]
            f[f"{offset:+d}:word"] = n.lower()
            f[f"{offset:+d}:title"] = n.istitle()
            if abs(offset) == 1:
                f[f"{offset:+d}:suffix3"] = n[-3:].lower()
        elif abs(offset) == 1:
            f["BOS" if offset < 0 else "EOS"] = True
    return f


def crf_tagger(train: Sequence[Sentence], heldout: Sequence[Sentence], *, c1: float = 0.1, c2: float = 0.1,
               max_iterations: int = 100) -> Baseline:
    """A linear-chain CRF (sklearn-crfsuite, L-BFGS) over `word_features`, its settings fixed in advance (the
    library's tutorial values): nothing is chosen on the held-out sentences."""
    require_baselines()
    import sklearn_crfsuite

    start = time.perf_counter()
    crf = sklearn_crfsuite.CRF(algorithm="lbfgs", c1=c1, c2=c2, max_iterations=max_iterations,
                               all_possible_transitions=True)
    crf.fit([[word_features(list(w), i) for i in range(len(w))] for w, _ in train], [list(t) for _, t in train])
    predicted = [list(p) for p in crf.predict([[word_features(list(w), i) for i in range(len(w))]
                                               for w, _ in heldout])]
    return Baseline(CRF, _token_accuracy([t for _, t in heldout], predicted), time.perf_counter() - start,
                    {"c1": c1, "c2": c2, "max_iterations": max_iterations}, predicted)


def tfidf_logistic_regression(train_texts: Sequence[str], train_labels: Sequence[Hashable],
                              heldout_texts: Sequence[str], heldout_labels: Sequence[Hashable], *,
                              seed: int = 0, folds: int = 5) -> Baseline:
    """Word unigram and bigram TF-IDF (sublinear term frequency) and L2 logistic regression; its ``C`` from
    `C_GRID` by stratified ``folds``-fold cross-validation on the training texts alone (the vectoriser
    refitted inside every fold), then refitted on all of them and scored once on the held-out texts."""
    require_baselines()
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.pipeline import Pipeline

    start = time.perf_counter()
    y = np.asarray(train_labels)
    classes, counts = np.unique(y, return_counts=True)
    if len(classes) < 2:
        raise ValueError(f"tfidf_logistic_regression: one class only ({classes[0]!r}): nothing to learn")
    pipeline = Pipeline([("tfidf", TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)),
                         ("lr", LogisticRegression(max_iter=1000))])
    k = int(min(folds, counts.min()))
    if k >= 2:
        search = GridSearchCV(pipeline, {"lr__C": list(C_GRID)}, scoring="accuracy", refit=True,
                              cv=StratifiedKFold(k, shuffle=True, random_state=seed))
        model = search.fit(list(train_texts), y).best_estimator_
        chosen = float(search.best_params_["lr__C"])
        cv = {f"{c:g}": round(float(s), 4) for c, s in zip(C_GRID, search.cv_results_["mean_test_score"])}
    else:  # a class with one example cannot be split: scikit-learn's default strength
        chosen, cv = 1.0, {}
        model = pipeline.set_params(lr__C=chosen).fit(list(train_texts), y)
    predicted = model.predict(list(heldout_texts))
    accuracy = float(np.mean(predicted == np.asarray(heldout_labels)))
    return Baseline(TFIDF, accuracy, time.perf_counter() - start,
                    {"C": chosen, "folds": k if k >= 2 else 0, "cv_accuracy": cv}, predicted.tolist())


def task_baselines(settings: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The classic baselines of a fine-tuning task given as its settings (``task``, ``train_file``,
    ``dev_file``, the columns: a `bertforge.tasks.TaskSettings`' fields), fitted on the training file(s) and
    scored on the dev file(s) with the task's own metrics: ``{name: metrics, with "seconds"}``. Tagging gets
    the CRF and the most-frequent-tag floor, a single-text classification TF-IDF logistic regression; a task
    with none (sentence pairs, regression, SQuAD, multiple choice) gets ``{}``."""
    from bertforge.tasks import TaskSettings, family_for
    from bertforge.tasks.classification import compute_metrics, name_labels, read_examples
    from bertforge.tasks.tagging import read_sentences, resolve_scheme, tagging_metrics

    cfg = TaskSettings(**{f.name: settings[f.name] for f in fields(TaskSettings) if f.name in settings})
    family = family_for(cfg.task)
    out: dict[str, dict[str, float]] = {}
    if family.name == "tagging":
        def sentences(spec: str, split: str) -> list[Sentence]:
            return [(s.tokens, s.tags) for path in family.files(cfg, spec, split)
                    for s in read_sentences(path, tag_column=cfg.tag_column)[0]]

        train, dev = sentences(cfg.train_file, "train"), sentences(cfg.dev_file, "dev")
        gold = [tags for _, tags in dev]
        scheme = resolve_scheme(cfg.tag_scheme, cfg.task, sorted({t for _, tags in train for t in tags}), gold)
        for got in (crf_tagger(train, dev), most_frequent_tag(train, dev)):
            out[got.name] = {**tagging_metrics(gold, got.predictions, scheme), "seconds": got.seconds}
        return out
    if family.name != "classification" or family.regression(cfg.task):
        return {}

    def examples(spec: str, split: str) -> list[Any]:
        got = []
        for path in family.files(cfg, spec, split):
            read = read_examples(path, cfg.task, text_column=cfg.text_column or None,
                                 text_pair_column=cfg.text_pair_column or None,
                                 label_column=cfg.label_column or None)[0]
            got += name_labels(read, cfg.named_labels(), path) if cfg.label_names else read
        return got

    train, dev = examples(cfg.train_file, "train"), examples(cfg.dev_file, "dev")
    if any(e.text_b is not None for e in train):
        return {}  # sentence pairs: no bag of words reads the relation between two texts
    got = tfidf_logistic_regression([e.text_a for e in train], [e.label for e in train], [e.text_a for e in dev],
                                    [e.label for e in dev])
    labels = sorted({e.label for e in train} | {e.label for e in dev})
    ids = {label: i for i, label in enumerate(labels)}
    metrics = compute_metrics(cfg.task, np.array([ids[p] for p in got.predictions]),
                              np.array([ids[e.label] for e in dev]), len(labels))
    out[got.name] = {**metrics, "seconds": got.seconds}
    return out
