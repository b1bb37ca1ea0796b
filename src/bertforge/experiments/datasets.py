"""The built-in real data of the ablation studies, written as the files ``bertforge finetune`` and
``bertforge prepare`` read.

Fine-tuning (`task_files`): the `bertforge.tasks.finetune.FinetuneConfig` settings (task, files,
columns) for one of `SOURCES`:

    movie-reviews       classification: MR sentence polarity (labels 0 / 1), JSONL ``{"text", "label"}``
    sentiment-tweets    regression: mean human valence (-4..+4) of tweets, JSONL ``{"text", "label"}``
    sentiment-nyt       the same for NYT editorial sentences
    sentiment-amazon    the same for Amazon review sentences
    brown-pos           tagging: Brown corpus part-of-speech tags, ``word tag`` lines, blank line between
                        sentences (the tags are not entity tags, so the score is token accuracy)

The dev set is a seeded ``dev_share`` of the examples (movie reviews: `movie_review_split`'s 90/10
split, the demo's and the benchmarks'); for Brown a share of the 500 texts, whole, so no text gives
sentences to both sides. ``max_train`` / ``max_dev`` keep the first n examples (Brown: sentences)
after a seeded shuffle, so a larger n keeps the smaller one's examples.

Pre-training (`pretraining_text`): the Wikipedia leads, one document per paragraph, every
``held_out_every``-th article held out; or a user's own text file.

Files are named after their arguments and written whole; one already there is used as it is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertforge import resources
from bertforge.io import atomic_path

__all__ = ["SOURCES", "PRETRAINING_SOURCES", "task_files", "pretraining_text", "brown_split", "brown_pilot_split",
           "split_order", "seeded_first", "write_jsonl", "write_conll"]

logger = logging.getLogger("bertforge")

SOURCES = ("movie-reviews", "sentiment-tweets", "sentiment-nyt", "sentiment-amazon", "brown-pos")
PRETRAINING_SOURCES = ("wikipedia-leads",)

Sentence = tuple[list[str], list[str]]


# ---------------------------------------------------------------------------- fine-tuning
def task_files(source: str, folder: Path, *, seed: int = 0, dev_share: float = 0.1,
               max_train: int = 0, max_dev: int = 0) -> dict[str, str]:
    """Write the train and dev files of ``source`` (one of `SOURCES`) under ``folder`` unless they are
    there already, and return the fine-tuning settings that read them (module docstring)."""
    if source not in SOURCES:
        raise ValueError(f"unknown data source {source!r}; choose one of: {', '.join(SOURCES)}")
    if not 0 < dev_share < 1 or max_train < 0 or max_dev < 0:
        raise ValueError(f"dev_share must lie in (0, 1) and max_train, max_dev be >= 0; got dev_share {dev_share}, "
                         f"max_train {max_train}, max_dev {max_dev}")
    folder = Path(folder)
    kind = ".conll" if source == "brown-pos" else ".jsonl"
    stem = f"{source}-seed{seed}-dev{dev_share:g}-train{max_train or 'all'}-dev{max_dev or 'all'}"
    train_file, dev_file = folder / f"{stem}.train{kind}", folder / f"{stem}.dev{kind}"
    brown = source == "brown-pos"
    if train_file.is_file() and dev_file.is_file():
        logger.info("%s: using the files already written (%s, %s)", source, train_file.name, dev_file.name)
    else:
        train, dev = brown_split(seed, dev_share) if brown else _labelled_split(source, seed, dev_share)
        for path, items, n in ((train_file, train, max_train), (dev_file, dev, max_dev)):
            items = seeded_first(items, seed, n)
            (write_conll if brown else write_jsonl)(path, items)
            logger.info("wrote %s (%d %s)", path, len(items), "sentences" if brown else "examples")
    files = {"train_file": str(train_file), "dev_file": str(dev_file)}
    if brown:
        return {"task": "tagging", **files}
    task = "classification" if source == "movie-reviews" else "regression"
    return {"task": task, **files, "text_column": "text", "label_column": "label"}


def _labelled_split(source: str, seed: int, dev_share: float) -> list[list[tuple[str, Any]]]:
    """[train, dev] ``(text, label)`` examples of a sentence-level source, split as
    `bertforge.resources.movie_review_split` splits the movie reviews."""
    if source == "movie-reviews":
        return [list(zip(texts, labels)) for texts, labels in resources.movie_review_split(seed, dev_share)]
    texts, scores = resources.sentiment_intensity(source.removeprefix("sentiment-"))
    dev, train = split_order(len(texts), seed, dev_share)
    return [[(texts[i], scores[i]) for i in part] for part in (train, dev)]


def split_order(n: int, seed: int, dev_share: float) -> tuple[np.ndarray, np.ndarray]:
    """(dev indexes, train indexes) of ``n`` items: a seeded permutation, its first ``dev_share`` the dev set."""
    order = np.random.default_rng(seed).permutation(n)
    n_dev = round(n * dev_share)
    return order[:n_dev], order[n_dev:]


def brown_split(seed: int, dev_share: float) -> tuple[list[Sentence], list[Sentence]]:
    """(train sentences, dev sentences) of the Brown corpus, the dev set a seeded share of its texts, whole:
    no text gives sentences to both sides."""
    texts = resources.brown_tagged()
    dev, train = split_order(len(texts), seed, dev_share)
    dev_ids = sorted(texts[i][0] for i in dev)
    logger.info("brown-pos: %d dev texts (%s ...), %d training texts", len(dev), ", ".join(dev_ids[:5]), len(train))
    return ([s for i in sorted(train) for s in texts[i][1]], [s for i in sorted(dev) for s in texts[i][1]])


def brown_pilot_split(seed: int, dev_share: float, pilot_share: float) -> tuple[list[Sentence], list[Sentence]]:
    """(pilot training sentences, pilot dev sentences) inside the training texts of ``brown_split(seed,
    dev_share)``: a seeded ``pilot_share`` of those texts, whole, stands in for the dev set, so that a choice
    made on it never sees the dev texts."""
    texts = resources.brown_tagged()
    _, train = split_order(len(texts), seed, dev_share)
    train = np.sort(train)
    dev, rest = split_order(len(train), seed + 1, pilot_share)
    return ([s for i in sorted(train[rest]) for s in texts[i][1]], [s for i in sorted(train[dev]) for s in texts[i][1]])


def seeded_first(items: Sequence[Any], seed: int, n: int) -> list[Any]:
    """The first ``n`` of ``items`` (0: all) after a shuffle seeded by ``seed``."""
    order = np.random.default_rng(seed).permutation(len(items))
    return [items[i] for i in order[:n or len(items)]]


def write_jsonl(path: Path, examples: Sequence[tuple[str, Any]]) -> None:
    """``(text, label)`` examples as JSON Lines ``{"text", "label"}``, as classification and regression read them."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for text, label in examples:
            f.write(json.dumps({"text": text, "label": label}, ensure_ascii=False) + "\n")


def write_conll(path: Path, sentences: Sequence[Sentence]) -> None:
    """``(words, tags)`` sentences as CoNLL columns, a blank line after each, as tagging reads them."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for words, tags in sentences:
            f.write("".join(f"{word} {tag}\n" for word, tag in zip(words, tags)) + "\n")


# ---------------------------------------------------------------------------- pre-training
def pretraining_text(source: str, folder: Path, *, held_out_every: int = 20,
                     max_documents: int = 0) -> tuple[Path, Path | None]:
    """(training text, held-out text) for ``bertforge prepare``. ``wikipedia-leads``: the first
    ``max_documents`` articles (0: all) written under ``folder`` one document per paragraph, every
    ``held_out_every``-th one (the first, the 21st, ... as the demo does) in the held-out file. Any
    other source is the path of the user's own text file: (that path, None)."""
    if source not in PRETRAINING_SOURCES:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"unknown pre-training text {source!r}: neither a file nor one of "
                             f"{', '.join(PRETRAINING_SOURCES)}")
        return path, None
    if held_out_every < 2 or max_documents < 0:
        raise ValueError(f"held_out_every must be >= 2 and max_documents >= 0; got {held_out_every}, {max_documents}")
    stem = f"{source}-every{held_out_every}-docs{max_documents or 'all'}"
    train_file, held_out_file = Path(folder) / f"{stem}.train.txt", Path(folder) / f"{stem}.heldout.txt"
    if train_file.is_file() and held_out_file.is_file():
        logger.info("%s: using the files already written (%s, %s)", source, train_file.name, held_out_file.name)
        return train_file, held_out_file
    articles = list(resources.iter_wikipedia_leads())
    articles = articles[:max_documents or len(articles)]
    _write_documents(train_file, [a for i, a in enumerate(articles) if i % held_out_every])
    _write_documents(held_out_file, articles[::held_out_every])
    return train_file, held_out_file


def _write_documents(path: Path, documents: Sequence[str]) -> None:
    """Plain text, one document per paragraph (a blank line between them, none inside one)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for text in documents:
            f.write(text.replace("\n", " ") + "\n\n")
    logger.info("wrote %s (%d documents)", path, len(documents))
