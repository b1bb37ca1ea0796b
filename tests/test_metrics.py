"""Metrics against values counted by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bertforge.metrics import (
    GLUE_METRICS,
    accuracy,
    entity_spans,
    f1_binary,
    glue_metrics,
    matthews_corrcoef,
    ner_metrics,
    normalize_answer,
    pearson,
    spearman,
    squad_exact,
    squad_f1,
    squad_metrics,
)

# A binary table used below: TP = 3 (first three), FN = 2, FP = 1, TN = 2.
LABELS = [1, 1, 1, 1, 1, 0, 0, 0]
PREDS = [1, 1, 1, 0, 0, 1, 0, 0]


# ---------------------------------------------------------------------------- classification


def test_accuracy_and_binary_f1():
    assert accuracy(PREDS, LABELS) == pytest.approx(5 / 8)  # 3 TP + 2 TN right of 8
    # P = 3/4, R = 3/5, F1 = 2PR / (P + R) = 0.9 / 1.35 = 2/3
    assert f1_binary(PREDS, LABELS) == pytest.approx(2 / 3)
    # class 0 as positive: TP = 2, FP = 2 (true 1 predicted 0), FN = 1 -> 2*2 / (4 + 2 + 1) = 4/7
    assert f1_binary(PREDS, LABELS, positive=0) == pytest.approx(4 / 7)
    assert f1_binary([0, 0], [0, 0]) == 0.0  # no positive anywhere: scikit-learn's zero_division


def test_matthews_binary_table():
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (3*2 - 1*2) / sqrt(4*5*3*4) = 4 / sqrt(240)
    assert matthews_corrcoef(PREDS, LABELS) == pytest.approx(4 / math.sqrt(240))
    assert matthews_corrcoef(LABELS, LABELS) == pytest.approx(1.0)
    assert matthews_corrcoef([1 - y for y in LABELS], LABELS) == pytest.approx(-1.0)


def test_matthews_multiclass_and_undefined():
    labels = [0, 0, 1, 1, 2, 2]
    preds = [0, 1, 1, 1, 2, 0]
    # c = 4 right, s = 6; true counts t = (2, 2, 2), predicted p = (2, 3, 1)
    # t.p = 4 + 6 + 2 = 12; cov(t,p) = 4*6 - 12 = 12; s^2 - p.p = 36 - 14 = 22; s^2 - t.t = 36 - 12 = 24
    assert matthews_corrcoef(preds, labels) == pytest.approx(12 / math.sqrt(24 * 22))
    assert matthews_corrcoef(["b", "a", "a"], ["a", "a", "b"]) == pytest.approx(-0.5)  # any labels
    # one predicted class: s^2 - p.p = 0 -> undefined -> 0.0 like scikit-learn
    assert matthews_corrcoef([1, 1, 1, 1], [0, 1, 0, 1]) == 0.0


def test_pearson_and_spearman_with_ties():
    # dx = (-1.5, -.5, .5, 1.5), dy = (-3, -1, 0, 4): sum dx*dy = 11, sum dx^2 = 5, sum dy^2 = 26
    assert pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(130))
    assert spearman([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(1.0)  # monotone
    # average ranks: x -> (1, 2.5, 2.5, 4), y -> (1, 4, 2.5, 2.5); centred (-1.5, 0, 0, 1.5) and
    # (-1.5, 1.5, 0, 0): 2.25 / sqrt(4.5 * 4.5) = 0.5 (the no-ties shortcut 1 - 6*4.5/60 would give 0.55)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 2]) == pytest.approx(0.5)
    assert spearman([10.0, 20.0, 20.0, 30.0], [3, 1, 2, 0]) == pytest.approx(-0.9486832980505138)
    # ^ ranks x (1, 2.5, 2.5, 4), y (4, 2, 3, 1): centred (-1.5,0,0,1.5)·(1.5,-.5,.5,-1.5) = -4.5 over
    #   sqrt(4.5 * 5) -> -4.5 / sqrt(22.5) = -0.9487
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))  # constant input: undefined, as scipy


@pytest.mark.parametrize("fn", [accuracy, f1_binary, matthews_corrcoef, pearson, spearman])
def test_bad_pairs(fn):
    with pytest.raises(ValueError, match="3 predictions but 2 labels|3 x values but 2 y values"):
        fn([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="empty"):
        fn([], [])
    with pytest.raises(ValueError, match="1-D"):
        fn([[1, 0]], [[1, 0]])


# ---------------------------------------------------------------------------- GLUE

EXPECTED_GLUE = {
    "cola": {"matthews"}, "sst2": {"accuracy"}, "mrpc": {"accuracy", "f1", "acc_and_f1"},
    "qqp": {"accuracy", "f1", "acc_and_f1"}, "stsb": {"pearson", "spearman", "corr"},
    "mnli": {"accuracy"}, "mnli-m": {"accuracy"}, "mnli-mm": {"accuracy"}, "qnli": {"accuracy"},
    "rte": {"accuracy"}, "wnli": {"accuracy"}, "ax": {"matthews"},
}


def test_glue_metric_table():
    assert {task: set(names) for task, names in GLUE_METRICS.items()} == EXPECTED_GLUE


@pytest.mark.parametrize("task", sorted(EXPECTED_GLUE))
def test_glue_metrics_every_task(task):
    preds = [1.0, 2.5, 2.0, 4.0] if task == "stsb" else PREDS
    labels = [1.0, 2.0, 3.0, 4.0] if task == "stsb" else LABELS
    assert set(glue_metrics(task, preds, labels)) == EXPECTED_GLUE[task]


def test_glue_metric_values():
    mrpc = glue_metrics("mrpc", PREDS, LABELS)
    # accuracy 5/8, F1 2/3 (above), acc_and_f1 = (0.625 + 0.6667) / 2
    assert mrpc == pytest.approx({"accuracy": 5 / 8, "f1": 2 / 3, "acc_and_f1": (5 / 8 + 2 / 3) / 2})
    assert glue_metrics("cola", PREDS, LABELS) == pytest.approx({"matthews": 4 / math.sqrt(240)})
    r = 11 / math.sqrt(130)  # Pearson above; Spearman 1 (monotone); corr = mean of the two
    assert glue_metrics("stsb", [2.0, 4.0, 5.0, 9.0], [1, 2, 3, 4]) == pytest.approx(
        {"pearson": r, "spearman": 1.0, "corr": (r + 1) / 2})
    assert glue_metrics("MNLI-mm", [0, 1, 2, 2], [0, 1, 2, 0]) == {"accuracy": 0.75}  # 3 of 4


@pytest.mark.parametrize("alias,task", [("SST-2", "sst2"), ("STS-B", "stsb"), ("sts_b", "stsb"),
                                        ("MNLI_M", "mnli-m"), ("mnli_mismatched", "mnli-mm"),
                                        ("glue/CoLA", "cola"), ("QQP", "qqp")])
def test_glue_aliases(alias, task):
    preds = [1.0, 2.5, 2.0, 4.0] if task == "stsb" else PREDS
    labels = [1.0, 2.0, 3.0, 4.0] if task == "stsb" else LABELS
    assert glue_metrics(alias, preds, labels) == glue_metrics(task, preds, labels)


def test_glue_other_tasks_and_errors():
    assert glue_metrics("imdb", [0, 2, 1, 1], [0, 1, 1, 1]) == {"accuracy": 0.75}
    with pytest.raises(ValueError, match="unknown GLUE task 'glue/mrcp'.*mrpc"):
        glue_metrics("glue/mrcp", PREDS, LABELS)
    with pytest.raises(ValueError, match="class ids"):
        glue_metrics("sst2", [0.2, 0.9], [0, 1])  # probabilities, not classes
    assert glue_metrics("sst2", np.array([0.0, 1.0]), [0, 1]) == {"accuracy": 1.0}  # float ids are fine
    with pytest.raises(ValueError, match="3 predictions but 2 labels"):
        glue_metrics("rte", [0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="empty"):
        glue_metrics("stsb", [], [])


# ---------------------------------------------------------------------------- tagging


def test_spans_bio_lenient_like_conlleval():
    tags = ["I-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-ORG", "B-ORG", "I-MISC", "O", "I-PER"]
    # I- at the start opens PER; type switch LOC -> ORG opens ORG; B-ORG after I-ORG is a new one;
    # I-MISC after B-ORG (another type) opens MISC; I-PER after O opens PER and the end closes it.
    assert entity_spans(tags) == [("PER", 0, 2), ("LOC", 3, 5), ("ORG", 5, 6), ("ORG", 6, 7),
                                  ("MISC", 7, 8), ("PER", 9, 10)]
    assert entity_spans(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 1), ("LOC", 1, 3)]
    assert entity_spans(["B-PER", "B-PER", "I-PER"]) == [("PER", 0, 1), ("PER", 1, 3)]
    assert entity_spans(["O", "O"]) == [] and entity_spans([]) == []
    assert entity_spans(["B-WORK-OF-ART", "I-WORK-OF-ART"]) == [("WORK-OF-ART", 0, 2)]  # hyphens in types


def test_spans_iob1():
    # IOB1: I- opens an entity; B- only separates two touching entities of one type
    tags = ["I-PER", "I-PER", "B-PER", "I-PER", "O", "I-LOC", "I-ORG"]
    assert entity_spans(tags, scheme="IOB1") == [("PER", 0, 2), ("PER", 2, 4), ("LOC", 5, 6), ("ORG", 6, 7)]


def test_spans_bioes():
    tags = ["S-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "E-LOC", "I-ORG", "E-ORG", "O", "E-MISC",
            "B-PER", "S-PER", "B-ORG"]
    # S- is a single; E- after E- opens a new entity; I-ORG after E-LOC opens ORG, which E-ORG closes;
    # E-MISC after O is a one-token entity; B-PER followed by S-PER closes at the S-; a trailing B- counts.
    assert entity_spans(tags, scheme="BIOES") == [
        ("PER", 0, 1), ("PER", 1, 2), ("LOC", 2, 5), ("LOC", 5, 6), ("ORG", 6, 8), ("MISC", 9, 10),
        ("PER", 10, 11), ("PER", 11, 12), ("ORG", 12, 13)]
    assert entity_spans(["B-LOC", "E-LOC", "I-LOC", "E-LOC"], scheme="IOBES") == [("LOC", 0, 2),
                                                                               ("LOC", 2, 4)]


def test_spans_errors():
    with pytest.raises(ValueError, match="unknown tagging scheme 'BILOU'"):
        entity_spans(["B-PER"], scheme="BILOU")
    with pytest.raises(ValueError, match="'S-PER' is not valid in scheme 'BIO'"):
        entity_spans(["S-PER"], scheme="BIO")
    with pytest.raises(ValueError, match="not valid"):
        entity_spans(["PER"])
    with pytest.raises(ValueError, match="sequence of tags"):
        entity_spans("B-PER")


def test_ner_metrics_by_hand():
    true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O", "B-PER"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG", "O", "B-MISC", "I-PER"]]
    # true entities (4): PER[0:2], LOC[3:4] | ORG[0:3], PER[4:5]
    # predicted (5):     PER[0:2], ORG[3:4] | ORG[0:2], MISC[3:4], PER[4:5] (I- after another type)
    # right (2): PER[0:2] and PER[4:5] -> P = 2/5, R = 2/4, F1 = 2*.4*.5/.9 = 4/9
    # tokens: 3 of 4 right, then 2 of 5 (B-ORG, I-ORG) -> accuracy 5/9
    m = ner_metrics(true, pred)
    assert (m["precision"], m["recall"], m["f1"], m["accuracy"]) == pytest.approx((0.4, 0.5, 4 / 9, 5 / 9))
    assert m["support"] == 4
    assert m["per_type"] == {
        "LOC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},   # 0 predicted
        "MISC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0},  # 1 predicted, 0 true
        "ORG": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},   # 2 predicted, boundaries off
        "PER": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2},
    }


def test_ner_metrics_errors_and_empty_predictions():
    m = ner_metrics([["B-PER", "O"]], [["O", "O"]])  # nothing predicted: P, R, F1 all 0 (conlleval)
    assert (m["precision"], m["recall"], m["f1"], m["accuracy"]) == (0.0, 0.0, 0.0, 0.5)
    with pytest.raises(ValueError, match="sequence 0: 2 true tags but 1 predicted"):
        ner_metrics([["B-PER", "O"]], [["O"]])
    with pytest.raises(ValueError, match="2 true sequences but 1 predicted"):
        ner_metrics([["O"], ["O"]], [["O"]])
    with pytest.raises(ValueError, match="empty"):
        ner_metrics([], [])
    with pytest.raises(ValueError, match="unknown tagging scheme"):
        ner_metrics([["O"]], [["O"]], scheme="XYZ")


# ---------------------------------------------------------------------------- SQuAD


@pytest.mark.parametrize("text,expected", [
    ("The Cat!", "cat"),
    ("  a  man,   an apple; the end. ", "man apple end"),
    ("theater Anna", "theater anna"),     # articles only as whole words
    ("An-the", "anthe"),                  # punctuation goes before articles: the hyphen joins them
    ("l'amour (1990)", "lamour 1990"),
    ("A  B\tC\n", "b c"),
    # only ASCII string.punctuation is removed, as the official script does
    ("“Hello” — world’s «end»", "“hello” — world’s «end»"),
    ("the", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_and_f1_multiple_golds():
    assert squad_exact("the Denver Broncos", ["Denver Broncos", "Broncos"]) == 1.0
    assert squad_exact("Denver Broncos team", ["Broncos", "the Denver Broncos"]) == 0.0
    # vs "broncos": 1 shared of 3 predicted / 1 gold -> 2*(1/3)*1/(4/3) = 0.5;
    # vs "denver broncos": 2 shared, P = 2/3, R = 1 -> 2*(2/3)/(5/3) = 0.8; the max is 0.8
    assert squad_f1("Denver Broncos team", ["Broncos", "the Denver Broncos"]) == pytest.approx(0.8)
    # tokens counted as a multiset: {new:2, york:2} & {new, york, city} = 2; P = 2/4, R = 2/3 -> 4/7
    assert squad_f1("new york new york", "new york city") == pytest.approx(4 / 7)


def test_empty_answers_v2_vs_v1():
    assert squad_f1("", []) == 1.0 and squad_exact("", []) == 1.0      # unanswerable, abstained
    assert squad_f1("the", [""]) == 1.0                                 # normalises to empty
    assert squad_f1("", ["Paris"]) == 0.0 and squad_f1("Paris", []) == 0.0
    # v1.1 keeps golds that normalise to nothing and has no empty-vs-empty rule
    assert squad_f1("a", ["the"], version="1.1") == 0.0
    assert squad_exact("a", ["the", "cat"], version="1.1") == 1.0
    assert squad_exact("a", ["the", "cat"]) == 0.0  # v2.0 drops "the": only "cat" is left
    with pytest.raises(ValueError, match="unknown SQuAD version"):
        squad_f1("x", ["x"], version="3")


def _squad_json(questions: list[dict]) -> dict:
    return {"version": "x", "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": questions}]}]}


def _qa(qid: str, *golds: str, impossible: bool | None = None) -> dict:
    qa = {"id": qid, "question": "?", "answers": [{"text": g, "answer_start": 0} for g in golds]}
    if impossible is not None:
        qa["is_impossible"] = impossible
    return qa


V1 = _squad_json([_qa("q1", "Denver Broncos", "Broncos"), _qa("q2", "Broncos", "the Denver Broncos"),
                  _qa("q3", "new york city")])
V1_PREDS = {"q1": "the Denver Broncos", "q2": "Denver Broncos team", "q3": "new york new york"}


def test_squad_v1(tmp_path):
    # EM: 1, 0, 0 -> 100/3; F1: 1, 0.8, 4/7 -> 100 * 2.371428... / 3
    expected = {"exact_match": 100 / 3, "f1": 100 * (1 + 0.8 + 4 / 7) / 3, "total": 3}
    assert squad_metrics(V1, V1_PREDS) == pytest.approx(expected)
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(V1))
    assert squad_metrics(str(path), V1_PREDS) == pytest.approx(expected)
    flat = [{"id": "q1", "answers": ["Denver Broncos", "Broncos"]},
            {"id": "q2", "answers": {"text": ["Broncos", "the Denver Broncos"], "answer_start": [0, 0]}},
            {"id": "q3", "answers": [{"text": "new york city"}]}]
    assert squad_metrics(flat, V1_PREDS) == pytest.approx(expected)


def test_squad_missing_prediction_scores_zero():
    preds = {k: v for k, v in V1_PREDS.items() if k != "q3"}
    with pytest.warns(UserWarning, match="1 of 3 questions have no prediction"):
        out = squad_metrics(V1, preds)
    assert out == pytest.approx({"exact_match": 100 / 3, "f1": 100 * 1.8 / 3, "total": 3})  # q3 scores 0


V2 = _squad_json([_qa("h1", "Paris", impossible=False), _qa("h2", "big red dog", impossible=False),
                  _qa("n1", impossible=True), _qa("n2", impossible=True),
                  _qa("h3", "1990", impossible=False)])
V2_PREDS = {"h1": "Paris", "h2": "red dog", "n1": "London", "n2": "", "h3": "1989"}
# raw EM / F1: h1 1 / 1; h2 0 / 0.8 (P = 1, R = 2/3); n1 0 / 0; n2 1 / 1 (empty vs empty); h3 0 / 0
ODDS = {"h1": -2.0, "h2": 0.5, "n1": 1.0, "n2": -1.0, "h3": 3.0}


def test_squad_v2_without_odds():
    # EM 2 of 5 = 40; F1 2.8 / 5 = 56; HasAns (h1, h2, h3) EM 1/3, F1 1.8/3; NoAns (n1, n2) 1/2
    assert squad_metrics(V2, V2_PREDS) == pytest.approx({
        "exact_match": 40.0, "f1": 56.0, "total": 5,
        "HasAns_exact": 100 / 3, "HasAns_f1": 60.0, "HasAns_total": 3,
        "NoAns_exact": 50.0, "NoAns_f1": 50.0, "NoAns_total": 2})


def test_squad_v2_threshold_and_best_threshold_sweep():
    out = squad_metrics(V2, V2_PREDS, null_odds=ODDS, threshold=0.0)
    # odds > 0 -> null: h2 (answerable: 0), n1 (unanswerable: 1), h3 (0); h1 1, n2 1 -> EM = F1 = 3/5
    assert out["exact_match"] == pytest.approx(60.0) and out["f1"] == pytest.approx(60.0)
    assert out["HasAns_exact"] == pytest.approx(100 / 3) and out["NoAns_exact"] == pytest.approx(100.0)
    # Sweep in increasing odds h1(-2) n2(-1) h2(.5) n1(1) h3(3), starting from all-null = 2 (n1, n2):
    #   EM: +1 -> 3 (best, at -2), +0 (n2 answered ""), +0, -1 (n1 answers "London"), +0 -> best 3/5 at -2.0
    #   F1: +1 -> 3 (at -2), +0, +0.8 -> 3.8 (best, at 0.5), -1, +0 -> best 3.8/5 = 76 at 0.5
    assert (out["best_exact"], out["best_exact_thresh"]) == pytest.approx((60.0, -2.0))
    assert (out["best_f1"], out["best_f1_thresh"]) == pytest.approx((76.0, 0.5))
    # applying the best F1 threshold gives the best F1: null only n1 (1) and h3 (0) -> 1 + .8 + 1 + 1 + 0
    assert squad_metrics(V2, V2_PREDS, null_odds=ODDS, threshold=0.5)["f1"] == pytest.approx(76.0)
    # threshold 1.0: only h3 is null -> the raw numbers (h3 scored 0 either way)
    high = squad_metrics(V2, V2_PREDS, null_odds=ODDS, threshold=1.0)
    assert (high["exact_match"], high["f1"]) == pytest.approx((40.0, 56.0))


def test_squad_errors():
    with pytest.raises(ValueError, match="null_odds lacks 1 answered questions, e.g. 'h3'"):
        squad_metrics(V2, V2_PREDS, null_odds={k: v for k, v in ODDS.items() if k != "h3"})
    with pytest.raises(ValueError, match="empty dataset"):
        squad_metrics({"data": []}, {})
    with pytest.raises(ValueError, match="'data' list"):
        squad_metrics({"paragraphs": []}, {})
    with pytest.raises(ValueError, match="duplicate question id 'q1'"):
        squad_metrics(_squad_json([_qa("q1", "a"), _qa("q1", "b")]), {"q1": "a"})
    with pytest.raises(ValueError, match="unknown SQuAD version"):
        squad_metrics(V1, V1_PREDS, version="1.0")
