"""The classic baselines: each learns what its features can see, reads only its training examples, and is
scored as the BERT lines are."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("sklearn")
pytest.importorskip("sklearn_crfsuite")

from bertforge.experiments.baselines import (  # noqa: E402
    C_GRID,
    CRF,
    MOST_FREQUENT_TAG,
    TFIDF,
    crf_tagger,
    most_frequent_tag,
    task_baselines,
    tfidf_logistic_regression,
    word_features,
)

NOUNS, VERBS, DETS = ["dog", "cat", "house", "river", "book"], ["runs", "sleeps", "reads", "sees"], ["the", "a"]


def _sentences(n: int, seed: int, ambiguous: bool = False) -> list[tuple[list[str], list[str]]]:
    """DET NOUN VERB (DET NOUN); with ``ambiguous`` "walk" is a noun after a determiner and a verb after a
    noun: only context tells, which the CRF sees and the count does not."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        noun = "walk" if ambiguous and rng.random() < 0.5 else rng.choice(NOUNS)
        verb = "walk" if ambiguous and noun != "walk" and rng.random() < 0.5 else rng.choice(VERBS)
        words, tags = [rng.choice(DETS), noun, verb], ["DET", "NOUN", "VERB"]
        if rng.random() < 0.5:
            words += [rng.choice(DETS), rng.choice(NOUNS)]
            tags += ["DET", "NOUN"]
        out.append((words, tags))
    return out


def test_most_frequent_tag_counts_and_falls_back_to_the_commonest_tag():
    train = [(["the", "dog", "runs"], ["DET", "NOUN", "VERB"]), (["the", "runs"], ["DET", "NOUN"]),
             (["a", "runs"], ["DET", "NOUN"])]
    got = most_frequent_tag(train, [(["the", "runs", "zebra", "Dog"], ["DET", "NOUN", "DET", "NOUN"])])
    assert got.accuracy == 1.0  # runs: NOUN twice, VERB once; zebra (unseen): the commonest tag; Dog: dog's
    assert got.settings == {"unknown_word_tag": "DET"}
    with pytest.raises(ValueError, match="no tagged words"):
        most_frequent_tag([], train)


def test_the_crf_uses_context_where_counting_cannot():
    train, heldout = _sentences(200, 0, ambiguous=True), _sentences(100, 1, ambiguous=True)
    crf, count = crf_tagger(train, heldout), most_frequent_tag(train, heldout)
    assert crf.name == CRF and crf.settings == {"c1": 0.1, "c2": 0.1, "max_iterations": 100}
    assert crf.accuracy > 0.99
    assert count.accuracy < 0.95  # "walk" half the time wrong
    assert crf.seconds > 0


def test_word_features_are_lexical_and_contextual():
    f = word_features(["The", "X-ray", "of", "1990"], 1)
    assert f["word"] == "x-ray" and f["hyphen"] and not f["upper"] and f["suffix3"] == "ray" and f["prefix1"] == "x"
    assert f["-1:word"] == "the" and f["-1:title"] and f["+1:word"] == "of" and f["+2:word"] == "1990" and "-2:word" not in f
    assert word_features(["1990"], 0)["digit"] and word_features(["1990"], 0)["BOS"]


def _reviews(n: int, seed: int) -> tuple[list[str], list[int]]:
    """Polarity carried by the bigram "not good" / "not bad" as much as by single words."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        label = rng.randrange(2)
        cue = rng.choice([["great"], ["not", "bad"]] if label else [["awful"], ["not", "good"]])
        filler = rng.sample(["the", "film", "plot", "was", "actors", "quite", "and", "story"], 4)
        texts.append(" ".join(filler[:2] + cue + filler[2:]))
        labels.append(label)
    return texts, labels


def test_tfidf_logistic_regression_learns_words_and_bigrams_choosing_c_by_cross_validation():
    (x, y), (hx, hy) = _reviews(100, 0), _reviews(200, 1)
    got = tfidf_logistic_regression(x, y, hx, hy, seed=0)
    assert got.name == TFIDF and got.accuracy > 0.95
    assert got.settings["C"] in C_GRID and got.settings["folds"] == 5
    assert set(got.settings["cv_accuracy"]) == {f"{c:g}" for c in C_GRID}


def test_tfidf_never_reads_the_heldout_labels():
    """Flipping every held-out label flips the accuracy exactly: nothing was chosen on them."""
    (x, y), (hx, hy) = _reviews(60, 0), _reviews(50, 1)
    a = tfidf_logistic_regression(x, y, hx, hy, seed=3)
    b = tfidf_logistic_regression(x, y, hx, [1 - v for v in hy], seed=3)
    assert a.accuracy + b.accuracy == pytest.approx(1.0) and a.settings == b.settings


def test_tfidf_takes_names_as_labels_and_tiny_classes():
    x, y = ["good film", "great film", "bad film", "awful", "fine"], ["pos", "pos", "neg", "neg", "pos"]
    got = tfidf_logistic_regression(x, y, ["good", "awful"], ["pos", "neg"])
    assert got.settings["folds"] == 2  # the smaller class has two examples
    got = tfidf_logistic_regression(x[:4] + ["meh"], y[:4] + ["mixed"], ["good"], ["pos"])
    assert got.settings == {"C": 1.0, "folds": 0, "cv_accuracy": {}}  # a class of one: no split
    with pytest.raises(ValueError, match="one class only"):
        tfidf_logistic_regression(x[:2], y[:2], x, y)


def _entities(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """Sentences with a person (a capitalised name after "mr") and a place (after "in")."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        person, place = rng.choice(["Smith", "Jones", "Brown"]), rng.choice(["Paris", "Rome", "Oslo"])
        out.append((["mr", person, "lives", "in", place], ["O", "B-PER", "O", "O", "B-LOC"]))
    return out


def test_a_study_task_gets_its_own_metrics_from_its_files(tmp_path):
    """NER: entity F1 from the CRF's tags (the task's metric); single-text classification: the GLUE task's
    metrics (MCC for CoLA); sentence pairs and regression: none."""
    def conll(path, sentences):
        path.write_text("".join("".join(f"{w} {t}\n" for w, t in zip(*s)) + "\n" for s in sentences))
        return str(path)

    ner = task_baselines({"task": "ner", "train_file": conll(tmp_path / "train.txt", _entities(60, 0)),
                          "dev_file": conll(tmp_path / "dev.txt", _entities(20, 1)), "epochs": 3})
    assert set(ner) == {CRF, MOST_FREQUENT_TAG}
    assert {"f1", "precision", "recall", "accuracy", "seconds"} <= set(ner[CRF]) and ner[CRF]["f1"] > 0.9
    (x, y), (hx, hy) = _reviews(60, 0), _reviews(30, 1)
    for name, rows in (("train.tsv", zip(x, y)), ("dev.tsv", zip(hx, hy))):
        (tmp_path / name).write_text("".join(f"src\t{label}\t\t{t}\n" for t, label in rows))  # CoLA's columns
    cola = task_baselines({"task": "cola", "train_file": str(tmp_path / "train.tsv"),
                           "dev_file": str(tmp_path / "dev.tsv")})
    assert set(cola) == {TFIDF} and {"matthews", "seconds"} <= set(cola[TFIDF]) and cola[TFIDF]["matthews"] > 0.5
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps({"a": t, "b": t, "label": label}) + "\n"
                                                  for t, label in zip(x, y)))
    pairs = {"task": "classification", "train_file": str(tmp_path / "pairs.jsonl"),
             "dev_file": str(tmp_path / "pairs.jsonl"), "text_column": "a", "text_pair_column": "b"}
    assert task_baselines(pairs) == {}
    assert task_baselines({"task": "squad", "train_file": "x", "dev_file": "y"}) == {}
