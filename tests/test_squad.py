"""Extractive QA (SQuAD v1.1 / v2.0) end to end on generated data, and the TF release's rules on
hand-made inputs.

SQuAD JSON is read with errors naming file, place in the JSON and question id, and skips counted;
windows are laid out as ``[CLS] question [SEP] context [SEP]`` with doc_stride, answers cut by a
window boundary train towards [CLS], and each token has one max-context window; post-processing on
hand-set logits gives the answer's characters as written in the context ("Steve Smith" out of
"Steve Smith's", accents kept), n-best probabilities, the SQuAD 2.0 null score (minimum over
windows) and threshold. A tiny model learns a generated SQuAD 1.1 and 2.0 (near-perfect EM on
train); prediction files are well-formed; the reported best threshold reproduces the best F1;
finetune / evaluate / predict run from Python and the CLI; the fine-tuned folder is transformers'
BertForQuestionAnswering with equal logits.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from data_fixtures import PLAIN_WORDS, TOKENS
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models
from finetune_fixtures import base, root  # noqa: F401 - fixtures: a tiny "pre-trained" checkpoint, a folder

from bertforge import cli
from bertforge.model import losses
from bertforge.model.config import BertConfig
from bertforge.tasks.finetune import FinetuneConfig, evaluate, finetune, predict
from bertforge.model.heads import BertForQuestionAnswering
from bertforge.tasks import family_for
from bertforge.tasks.squad import (
    NO_SPAN_ODDS,
    Question,
    SpanObjective,
    SquadData,
    encode_squad,
    postprocess,
    read_squad,
    squad_files,
    top_k_scores,
)
from bertforge.text.tokenizer import BertTokenizer

COLOURS = ["grey", "blue", "green"]
NOUNS = ["house", "river", "tree", "stone", "cloud", "city", "road", "field", "book", "door", "window", "table",
         "garden", "mountain"]
FILLER = [w for w in PLAIN_WORDS if w not in COLOURS + NOUNS]
WORDS14 = ["the", "old", "house", "by", "a", "river", "with", "one", "tree", "and", "blue", "stone", "road", "door"]


@pytest.fixture(scope="module")
def tok() -> BertTokenizer:
    """The test vocab plus the words of the answer-text cases."""
    return BertTokenizer(TOKENS + ["steve", "smith", "'", "s", "(", ")", "-", "1895", "1943", "cafe", "naive"])


def squad_json(paragraphs: list[tuple[str, list[dict]]], version: str = "1.1") -> dict:
    return {"version": version, "data": [{"title": "t", "paragraphs": [{"context": c, "qas": q}
                                                                        for c, q in paragraphs]}]}


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj, indent=1), encoding="utf-8")
    return path


def qa(qid: str, question: str, answers: list[tuple[str, int]] = (), **extra) -> dict:
    return {"id": qid, "question": question, "answers": [{"text": t, "answer_start": s} for t, s in answers], **extra}


def generated(rng: random.Random, n: int, v2: bool) -> dict:
    """Contexts of 18-40 filler words; answerable ones hold one "<colour> <noun>" (the answer, sometimes
    capitalised and followed by a comma); in v2 about half hold none (unanswerable)."""
    paragraphs = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(18, 40))]
        question = rng.choice(["what is it ?", "what is it", "which one ?"])
        if v2 and rng.random() < 0.5:
            paragraphs.append((" ".join(words), [qa(f"q{i}", question, is_impossible=True,
                                                    plausible_answers=[{"text": words[0], "answer_start": 0}])]))
            continue
        answer = f"{rng.choice(COLOURS)} {rng.choice(NOUNS)}"
        answer = answer.capitalize() if rng.random() < 0.3 else answer
        k = rng.randint(0, len(words))
        before = "".join(w + " " for w in words[:k])
        context = before + answer + ("," if rng.random() < 0.3 else "") + "".join(" " + w for w in words[k:])
        extra = {"is_impossible": False} if v2 else {}
        paragraphs.append((context, [qa(f"q{i}", question, [(answer, len(before))], **extra)]))
    return squad_json(paragraphs, "v2.0" if v2 else "1.1")


def config(base: Path, out: Path, **overrides) -> FinetuneConfig:
    settings = dict(model=str(base), out=str(out), lr=2e-3, batch_size=16, weight_decay=0.0, log_every=1,
                    progress=False, seed=7, max_seq_length=32, stride=8, max_query_length=8, checkpoint_every=1000)
    return FinetuneConfig(**{**settings, **overrides})


def scores(features, picks: list[tuple[dict[int, float], dict[int, float]]], k: int = 20, fill: float = -10.0):
    """`top_k_scores` of hand-set logits: per window, {position: logit} for starts and ends (others
    ``fill``). Windows are padded to the longest with logits of 100, which must be ignored."""
    T = max(len(x) for x in features.input_ids)
    start = torch.full((len(picks), T), 100.0)
    end = torch.full((len(picks), T), 100.0)
    mask = torch.zeros((len(picks), T), dtype=torch.long)
    for w, (s, e) in enumerate(picks):
        n = len(features.input_ids[w])
        start[w, :n], end[w, :n], mask[w, :n] = fill, fill, 1
        for pos, v in s.items():
            start[w, pos] = v
        for pos, v in e.items():
            end[w, pos] = v
    return top_k_scores(start, end, mask, k)


def position(features, window: int, token: int) -> int:
    """Position in window ``window`` of the context's token ``token``."""
    return int(features.num_a[window] + token - features.doc_start[window])


# ------------------------------------------------------------------------------ reading files
def test_squad_files_v11_and_v20_are_read(tmp_path):
    v1 = squad_json([("The old house.", [qa("a", "What?", [("old house", 4), ("house", 8)]),
                                         qa("b", "Which?", [("The", 0)])])])
    path = tmp_path / "v1.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(v1, f)
    data = read_squad(path, "1.1", mode="train")
    assert data.contexts == ["The old house."] and [q.id for q in data.questions] == ["a", "b"]
    a = data.questions[0]
    assert a.answers == ("old house", "house") and a.answer_start == 4 and not a.is_impossible and a.paragraph == 0
    assert a.where == f"{path}: data[0].paragraphs[0].qas[0]"

    v2 = squad_json([("A blue door.", [qa("x", "What?", [("blue door", 2)], is_impossible=False),
                                       qa("y", "Why?", is_impossible=True,
                                          plausible_answers=[{"text": "door", "answer_start": 7}]),
                                       qa("z", "Who?")])], "v2.0")
    data = read_squad(write_json(tmp_path / "v2.json", v2), "2.0", mode="train")
    assert [(q.id, q.answers, q.is_impossible) for q in data.questions] == [
        ("x", ("blue door",), False), ("y", (), True), ("z", (), True)]  # no answers, no is_impossible: unanswerable
    assert data.golds() == [{"id": "x", "answers": ["blue door"]}, {"id": "y", "answers": []},
                            {"id": "z", "answers": []}]
    joined = SquadData.join([read_squad(path, "1.1"), data])
    assert joined.contexts == ["The old house.", "A blue door."] and joined.questions[2].paragraph == 1
    folder = tmp_path / "official"
    folder.mkdir()
    write_json(folder / "dev-v1.1.json", v1)
    assert squad_files(str(folder), "squad", "dev") == [folder / "dev-v1.1.json"]
    with pytest.raises(FileNotFoundError, match="no train-v2.0.json"):
        squad_files(str(folder), "squad2", "train")


def test_errors_name_file_place_and_question_and_skips_are_counted(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"data": [\n  {"paragraphs": [}\n]}')
    with pytest.raises(ValueError, match=r"bad\.json:2:19: not valid JSON \(Expecting value\)"):
        read_squad(bad)
    with pytest.raises(FileNotFoundError, match="nope.json: no such file"):
        read_squad(tmp_path / "nope.json")
    with pytest.raises(ValueError, match=r"top level: no 'data'"):
        read_squad(write_json(tmp_path / "e.json", {"version": "1.1"}))

    paragraphs = [("The old house by the river.", [qa("q1", "What?", [("old house", 4)]),
                                                   {"id": "q2", "answers": []},
                                                   qa("q3", "Where?", [("the river", 3)]),
                                                   qa("q4", "Which?", [("house", "8")])])]
    f = write_json(tmp_path / "f.json", squad_json(paragraphs))
    with pytest.raises(ValueError, match=r"f\.json: data\[0\]\.paragraphs\[0\]\.qas\[1\]: no 'question' .*"
                                         r"question id 'q2'"):
        read_squad(f)
    data = read_squad(f, mode="train", skip_bad_rows=True)
    assert [q.id for q in data.questions] == ["q1"]
    report = data.reports[0]
    assert report.skipped_questions == {"malformed": ["q2", "q4"], "answer not in context": ["q3"]}
    assert report.num_skipped == 3 and report.examples == 1
    assert "skipped 2 questions (malformed; ids q2, q4)" in report.summary()
    del paragraphs[0][1][1]
    f = write_json(tmp_path / "g.json", squad_json(paragraphs))
    with pytest.raises(ValueError, match=r"qas\[1\]: the answer 'the river' is not the context's text at its "
                                         r"answer_start 3 \(' old hous' is\) \(question id 'q3'"):
        read_squad(f, mode="train")
    with pytest.raises(ValueError, match=r"qas\[0\]\.answers\[0\]\.answer_start: expected int, got str"):
        read_squad(write_json(tmp_path / "h.json", squad_json([(paragraphs[0][0], [paragraphs[0][1][2]])])),
                   mode="train")
    assert [q.id for q in read_squad(f, mode="eval").questions[:2]] == ["q1", "q3"]  # answer_start unused there
    unlabelled = write_json(tmp_path / "test.json", squad_json([("x y", [{"id": "t1", "question": "?"}])]))
    assert read_squad(unlabelled, mode="predict").questions[0].answers == ()
    with pytest.raises(ValueError, match="qas\\[0\\]: no 'answers'"):
        read_squad(unlabelled, mode="eval")

    v2 = write_json(tmp_path / "v2.json", squad_json([("x y", [qa("n", "?", is_impossible=True)])], "v2.0"))
    with pytest.raises(ValueError, match="marked is_impossible: an unanswerable question.*task='squad2'"):
        read_squad(v2, "1.1")
    assert read_squad(v2, "1.1", skip_bad_rows=True).reports[0].skipped_questions == {"unanswerable": ["n"]}
    dup = write_json(tmp_path / "dup.json", squad_json([("x y", [qa("d", "?", [("x", 0)])]),
                                                        ("y z", [qa("d", "?", [("z", 2)])])]))
    with pytest.raises(ValueError, match=r"paragraphs\[1\]\.qas\[0\]: duplicate question id 'd' \(first at "
                                         r".*paragraphs\[0\]\.qas\[0\]\)"):
        read_squad(dup)


# ------------------------------------------------------------------------------ windows
@pytest.fixture(scope="module")
def windowed(tok, root):
    """14 one-token words; question "what is it" (3 tokens): windows of 8 context tokens every 4 ->
    starts 0, 4, 8 with 8, 8 and 6 tokens."""
    context = " ".join(WORDS14)
    at = lambda k: len(" ".join(WORDS14[:k])) + (k > 0)  # noqa: E731 - character where word k starts
    questions = [qa("late", "what is it", [(" ".join(WORDS14[10:13]), at(10))]),  # tokens 10-12: window 2 only
                 qa("both", "what is it", [(" ".join(WORDS14[8:10]), at(8))]),  # tokens 8-9: windows 1 and 2
                 qa("none", "what is it", is_impossible=True)]
    data = read_squad(write_json(root / "windows.json", squad_json([(context, questions)], "v2.0")), "2.0",
                      mode="train")
    return data, encode_squad(data, tok, max_seq_length=14, doc_stride=4, max_query_length=8, targets=True)


def test_windows_hold_question_and_context_parts_and_targets_point_at_the_answer_or_cls(windowed, tok):
    data, f = windowed
    doc = tok.encode_batch_ids([" ".join(WORDS14)])[0]
    query = tok.encode_batch_ids(["what is it"])[0]
    assert len(doc) == 14 and len(query) == 3 and len(f) == 9 and f.example.tolist() == [0] * 3 + [1] * 3 + [2] * 3
    assert f.doc_start.tolist() == [0, 4, 8] * 3 and f.doc_len.tolist() == [8, 8, 6] * 3
    for w, (s, n) in enumerate(zip(f.doc_start[:3], f.doc_len[:3])):
        assert f.input_ids[w].tolist() == [tok.cls_token_id, *query, tok.sep_token_id, *doc[s:s + n], tok.sep_token_id]
    # "late": tokens 10-12 lie in window 2 only (at 5 + 10 - 8 = 7 .. 9); window 1 (tokens 4-11) cuts them: [CLS].
    assert list(zip(f.start_positions[:3], f.end_positions[:3])) == [(0, 0), (0, 0), (7, 9)]
    assert list(zip(f.start_positions[3:6], f.end_positions[3:6])) == [(0, 0), (9, 10), (5, 6)]
    assert f.start_positions[6:].tolist() == f.end_positions[6:].tolist() == [0, 0, 0]  # unanswerable
    assert f.windowed == 3 and f.without_answer == 3
    batch = f.collate([2, 0])
    assert batch["start_positions"].tolist() == [7, 0] and batch["end_positions"].tolist() == [9, 0]
    assert batch["token_type_ids"][0].tolist() == [0] * 5 + [1] * 7 + [0] * 2  # the shorter one padded
    assert batch["attention_mask"][0].sum() == 12 and batch["input_ids"].shape == (2, 14)


def test_training_answers_map_to_the_tokens_their_characters_overlap(tok, root):
    context = "The house (1895-1943), walking stone."
    cases = {"1895": ["1895"], "(1895-1943)": ["(", "1895", "-", "1943", ")"], "walk": ["walk"],
             "walki": ["walk", "##ing"], "ing stone": ["##ing", "stone"], "house (18": ["house", "(", "1895"]}
    questions = [qa(f"q{i}", "what", [(text, context.index(text))]) for i, text in enumerate(cases)]
    data = read_squad(write_json(root / "map.json", squad_json([(context, questions)])), mode="train")
    f = encode_squad(data, tok, 32, 8, 8, targets=True)
    assert len(f) == len(cases)  # one window each
    for w, want in enumerate(cases.values()):
        tokens = tok.convert_ids_to_tokens(f.input_ids[w].tolist())
        assert tokens[f.start_positions[w]:f.end_positions[w] + 1] == want


def test_each_token_has_one_max_context_window(windowed):
    _, f = windowed
    flags = [f.max_context[f.max_context_at[w]:f.max_context_at[w] + f.doc_len[w]] for w in range(3)]
    # min(left, right) + 0.01 * length: tokens 0-5 -> window 0, 6-9 -> window 1, 10-13 -> window 2
    assert [np.flatnonzero(x) + f.doc_start[w] for w, x in enumerate(flags)][0].tolist() == [0, 1, 2, 3, 4, 5]
    assert (np.flatnonzero(flags[1]) + 4).tolist() == [6, 7, 8, 9]
    assert (np.flatnonzero(flags[2]) + 8).tolist() == [10, 11, 12, 13]


def test_max_context_equals_the_tf_rule_written_out(tok):
    rng = random.Random(0)
    for _ in range(20):
        n_words = rng.randint(1, 40)
        context = " ".join(rng.choice(FILLER) for _ in range(n_words))
        max_len, stride = rng.randint(8, 20), rng.randint(1, 9)
        data = SquadData([context], [Question("q", "what", 0, (), -1, False, "")], "1.1", [])
        f = encode_squad(data, tok, max_len, stride, 2)
        spans = list(zip(f.doc_start.tolist(), f.doc_len.tolist()))
        for w, (s, n) in enumerate(spans):
            for p in range(s, s + n):
                best, best_score = None, None
                for k, (s2, n2) in enumerate(spans):  # the TF release's _check_is_max_context
                    if s2 <= p <= s2 + n2 - 1:
                        score = min(p - s2, s2 + n2 - 1 - p) + 0.01 * n2
                        if best_score is None or score > best_score:
                            best, best_score = k, score
                assert f.max_context[f.max_context_at[w] + p - s] == (best == w)
        assert spans[-1][0] + spans[-1][1] == len(tok.encode_batch_ids([context])[0])  # the last reaches the end


# ------------------------------------------------------------------------------ answers
@pytest.fixture(scope="module")
def smith(tok):
    context = "Steve Smith's  café (1895-1943), was\nnaïve."
    data = SquadData([context], [Question("s", "who was it ?", 0, (), -1, False, "")], "1.1", [])
    return data, encode_squad(data, tok, 64, 128, 8)


@pytest.mark.parametrize("first, last, text", [
    ("steve", "smith", "Steve Smith"), ("steve", "s", "Steve Smith's"), ("cafe", "cafe", "café"),
    ("1895", "1895", "1895"), ("(", ")", "(1895-1943)"), ("was", "naive", "was\nnaïve"), ("naive", ".", "naïve."),
])
def test_answer_text_is_the_contexts_characters(smith, tok, first, last, text):
    data, f = smith
    tokens = tok.convert_ids_to_tokens(f.input_ids[0].tolist())
    s, e = tokens.index(first, int(f.num_a[0])), tokens.index(last, int(f.num_a[0]))
    [p] = postprocess(data, f, scores(f, [({s: 5.0}, {e: 4.0})]), n_best_size=20, max_answer_length=30)
    assert p.text == p.best_text == text and p.null_odds is None
    assert data.contexts[0][p.start:p.end] == text


def test_a_decomposed_accent_the_tokenizer_strips_stays_in_the_answer(tok):
    context = "He went to the Cafe\u0301 yesterday, to Cafe\u0301\u200b."
    data = SquadData([context], [Question("c", "where ?", 0, (), -1, False, "")], "1.1", [])
    f = encode_squad(data, tok, 64, 128, 8)
    tokens = tok.convert_ids_to_tokens(f.input_ids[0].tolist())
    for nth, want in ((0, "Cafe\u0301"), (1, "Cafe\u0301")):  # not the zero-width space after it
        at = [i for i, t in enumerate(tokens) if t == "cafe"][nth]
        [p] = postprocess(data, f, scores(f, [({at: 5.0}, {at: 4.0})]), n_best_size=20, max_answer_length=30)
        assert p.text == want and exact_match_ok(p.text, "Cafe\u0301")


def exact_match_ok(pred: str, gold: str) -> bool:
    from bertforge.metrics import squad_exact

    return squad_exact(pred, gold, "1.1") == 1.0


def test_top_k_is_over_real_tokens_best_first():
    start = torch.tensor([[1.0, 3.0, 2.0, 3.0, 100.0], [5.0, 4.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    a, b = top_k_scores(start, -start, mask, 3)
    assert a.start_index.tolist() == [1, 3, 2] and a.start_logit.tolist() == [3.0, 3.0, 2.0]  # ties: position order
    assert a.end_index.tolist() == [0, 2, 1] and (a.null_start, a.null_end) == (1.0, -1.0)
    assert b.start_index.tolist() == [2, 3, 4]
    [c] = top_k_scores(start[:1], start[:1], mask[:1], 6)  # k beyond the row: padding, then position T; -inf
    assert c.start_index.tolist() == [1, 3, 2, 0, 4, 5] and c.start_logit[-2:].tolist() == [-np.inf, -np.inf]


def test_nbest_ranks_distinct_valid_spans_with_softmax_probabilities(smith, tok):
    data, f = smith
    tokens = tok.convert_ids_to_tokens(f.input_ids[0].tolist())
    at = {t: tokens.index(t, int(f.num_a[0])) for t in ("steve", "smith", "cafe", "1895", "naive")}
    q = tokens.index("who")  # a question token: never an answer
    start = {at["steve"]: 3.0, at["cafe"]: 2.0, at["naive"]: 2.5, q: 9.0}
    end = {at["smith"]: 2.0, at["1895"]: 1.0, at["steve"]: 0.5, at["cafe"]: 1.5, q: 9.0}
    [p] = postprocess(data, f, scores(f, [(start, end)], k=6), n_best_size=4, max_answer_length=4)
    texts = [e["text"] for e in p.nbest]
    # Top 6 starts: who (a question token: out), steve, naive, cafe, two more in the question; top 6 ends:
    # who, smith, cafe, 1895, steve, [CLS]. Valid, in the order generated (start rank, end rank): steve..smith
    # 5.0, steve..steve 3.5, cafe..cafe 3.5, cafe..1895 3.0; steve..cafe is 5 tokens (> 4) and naive has no
    # end after it. Ties keep that order.
    assert texts == ["Steve Smith", "Steve", "café", "café (1895"]
    totals = np.array([e["start_logit"] + e["end_logit"] for e in p.nbest])
    assert totals.tolist() == [5.0, 3.5, 3.5, 3.0]
    probs = np.exp(totals - totals.max()) / np.exp(totals - totals.max()).sum()
    assert [e["probability"] for e in p.nbest] == pytest.approx(probs.tolist())
    assert p.text == "Steve Smith" and p.probability == pytest.approx(probs[0])


def test_an_answer_starts_only_in_its_max_context_window(windowed):
    data, f = windowed
    data = SquadData(data.contexts, data.questions[:1], "1.1", data.reports)
    # Token 7 ("one") lies in windows 0 and 1; its max-context window is 1. Window 0 scores it higher.
    picks = [({position(f, 0, 7): 8.0}, {position(f, 0, 7): 1.0}), ({position(f, 1, 7): 2.0}, {position(f, 1, 7): 1.0}),
             ({}, {})]
    [p] = postprocess(data, f, scores(f, picks), n_best_size=20, max_answer_length=30)
    assert p.text == "one" and p.nbest[0]["start_logit"] == 2.0


def test_squad2_null_score_is_the_minimum_over_windows_and_the_threshold_decides(windowed):
    data, f = windowed
    v2 = SquadData(data.contexts, data.questions[:1], "2.0", data.reports)
    old, house = position(f, 0, 1), position(f, 0, 2)
    picks = [({0: 1.0, old: 1.5}, {0: 1.0, house: 1.0}), ({0: 0.5}, {0: 0.5}), ({0: 3.0}, {0: 3.0})]
    sc = scores(f, picks)
    [p] = postprocess(v2, f, sc, n_best_size=3, max_answer_length=30)
    # null = 0.5 + 0.5 (window 1, the smallest), best span "old house" = 2.5: odds -1.5 <= 0 -> answered
    assert p.null_odds == pytest.approx(1.0 - 2.5) and p.text == p.best_text == "old house"
    assert [e["text"] for e in p.nbest] == ["old house", "", "old"]  # the null ranks with the spans
    assert (p.nbest[1]["start_logit"], p.nbest[1]["end_logit"]) == (0.5, 0.5)
    picks[1] = ({0: 2.0}, {0: 2.0})  # window 1's null 4; window 0's 2 + 1 = 3 is now the smallest
    picks[0] = ({0: 2.0, old: 1.5}, {0: 1.0, house: 1.0})
    [p] = postprocess(v2, f, scores(f, picks), n_best_size=3, max_answer_length=30)
    assert p.null_odds == pytest.approx(0.5) and p.text == "" and p.best_text == "old house"
    assert p.nbest[0]["text"] == "" and p.probability == p.nbest[0]["probability"]
    [p] = postprocess(v2, f, scores(f, picks), n_best_size=3, max_answer_length=30, null_score_diff_threshold=0.5)
    assert p.text == "old house"  # odds 0.5 do not exceed 0.5
    [p] = postprocess(SquadData(data.contexts, data.questions[:1], "1.1", []), f, scores(f, picks), n_best_size=3,
                      max_answer_length=30)
    assert p.text == "old house" and p.null_odds is None and "" not in [e["text"] for e in p.nbest]  # v1: no null
    # No valid span (the best starts are [CLS] and question tokens): "" ; v2 odds NO_SPAN_ODDS.
    q_only = [({0: 9.0, 1: 9.0}, {}), ({0: 9.0, 1: 9.0}, {}), ({0: 9.0, 1: 9.0}, {})]
    for version, odds in (("1.1", None), ("2.0", NO_SPAN_ODDS)):
        [p] = postprocess(SquadData(data.contexts, data.questions[:1], version, []), f, scores(f, q_only, k=2),
                          n_best_size=2, max_answer_length=30)
        assert p.text == p.best_text == "" and p.null_odds == odds and len(p.nbest) == 1


def test_span_loss_sums_and_leaves_padding_out(windowed):
    _, f = windowed
    torch.manual_seed(0)
    model = BertForQuestionAnswering(BertConfig(vocab_size=len(TOKENS) + 11, hidden_size=16, num_hidden_layers=1,
                                                num_attention_heads=2, intermediate_size=32,
                                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()
    task = SpanObjective()
    alone, _ = task.forward(model, f.collate([2]))  # 12 tokens, no padding
    longest, _ = task.forward(model, f.collate([0]))  # 14 tokens
    both, stats = task.forward(model, f.collate([2, 0]))  # window 2 padded to 14
    assert both["span"].item() == pytest.approx(alone["span"].item() + longest["span"].item(), rel=1e-5)
    assert task.counts(f.collate([2, 0])) == {"span": 2.0}
    s, e = torch.randn(3, 7), torch.randn(3, 7)
    sp, ep = torch.tensor([0, 3, 6]), torch.tensor([0, 4, 6])
    assert losses.span_loss(s, e, sp, ep, reduction="sum").item() == pytest.approx(
        3 * losses.span_loss(s, e, sp, ep).item(), rel=1e-6)


# ------------------------------------------------------------------------------ learning
def learn(root: Path, base: Path, task: str, seed: int, epochs: float) -> tuple[Path, Path]:
    """The tiny model fine-tuned on 64 generated questions (dev = train); (run folder, training file)."""
    train = write_json(root / f"train-{task}.json", generated(random.Random(seed), 64, v2=task == "squad2"))
    out = root / task
    finetune(config(base, out, task=task, train_file=str(train), dev_file=str(train), epochs=epochs))
    return out, train


@pytest.fixture(scope="module")
def learned(root, base) -> tuple[Path, Path]:
    """SQuAD 1.1: the tiny model learns to answer "<colour> <noun>" in contexts over 1-3 windows."""
    return learn(root, base, "squad", seed=1, epochs=8)


@pytest.fixture(scope="module")
def learned2(root, base) -> tuple[Path, Path]:
    """SQuAD 2.0: half the contexts hold no "<colour> <noun>"."""
    return learn(root, base, "squad2", seed=2, epochs=12)


def lines(out: Path, split: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["split"] == split]


def test_a_tiny_model_learns_squad11_and_writes_the_prediction_files(learned):
    out, train = learned
    train_lines = lines(out, "train")
    assert np.mean([r["loss"] for r in train_lines[-5:]]) < 0.3 * train_lines[0]["loss"]
    assert train_lines[0]["span_accuracy"] < 0.2 and np.mean([r["span_accuracy"] for r in train_lines[-5:]]) > 0.6
    best = json.loads((out / "best" / "eval_metrics.json").read_text())
    assert best["metric"] == "f1" and set(best["metrics"]) == {"exact_match", "f1", "total"}
    assert best["metrics"]["exact_match"] >= 95 and best["metrics"]["total"] == 64
    ids = [q["id"] for p in json.loads(train.read_text())["data"][0]["paragraphs"] for q in p["qas"]]
    predictions = json.loads((out / "best" / "predictions.json").read_text())
    nbest = json.loads((out / "best" / "nbest_predictions.json").read_text())
    assert list(predictions) == list(nbest) == ids and not (out / "best" / "null_odds.json").exists()
    for qid, entries in nbest.items():
        assert entries[0]["text"] == predictions[qid] and 1 <= len(entries) <= 20
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0)
        totals = [e["start_logit"] + e["end_logit"] for e in entries]
        assert totals == sorted(totals, reverse=True) and len({e["text"] for e in entries}) == len(entries)
    assert evaluate(out / "best", file=train) == pytest.approx(best["metrics"])


def test_a_tiny_model_learns_squad20_and_the_best_threshold_reproduces_the_best_f1(learned2, tmp_path):
    out, train = learned2
    m = evaluate(out / "best", file=train, out=tmp_path)
    assert set(m) == {"exact_match", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact",
                      "NoAns_f1", "NoAns_total", "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"}
    assert m["exact_match"] >= 90 and m["best_f1"] >= m["f1"] and m["HasAns_total"] + m["NoAns_total"] == 64
    at_threshold = evaluate(out / "best", file=train, settings={"null_score_diff_threshold": m["best_f1_thresh"]})
    assert at_threshold["f1"] == pytest.approx(m["best_f1"])
    predictions = json.loads((tmp_path / "predictions.json").read_text())
    odds = json.loads((tmp_path / "null_odds.json").read_text())
    assert list(odds) == list(predictions) and all((odds[q] > 0) == (predictions[q] == "") for q in odds)
    golds = {q["id"]: q["is_impossible"] for p in json.loads(train.read_text())["data"][0]["paragraphs"]
             for q in p["qas"]}
    assert np.mean([(predictions[q] == "") == golds[q] for q in golds]) >= 0.9
    nbest = json.loads((tmp_path / "nbest_predictions.json").read_text())
    assert all("" in [e["text"] for e in entries] for entries in nbest.values())  # the null is always listed


def test_the_fine_tuned_folder_is_transformers_bert_for_question_answering(learned, tmp_path):
    out, train = learned
    folder = out / "best"
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["BertForQuestionAnswering"] and cfg["finetuning_task"] == "squad"
    assert cfg["bertforge_finetune"]["max_seq_length"] == 32 and cfg["bertforge_finetune"]["stride"] == 8
    theirs = transformers.BertForQuestionAnswering.from_pretrained(folder).eval()
    ours = BertForQuestionAnswering.from_pretrained(folder).eval()
    enc = BertTokenizer.from_pretrained(folder)(["what is it ?", "which one"], ["the blue house by a road",
                                                                                "a tree"], padding=True,
                                                return_tensors="pt")
    with torch.no_grad():
        a, b = ours(**enc), theirs(**enc)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(a.start_logits[real], b.start_logits[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(a.end_logits[real], b.end_logits[real], atol=1e-5, rtol=0)
    # Saved by transformers (no bertforge settings): evaluate needs the SQuAD version, takes the settings given.
    theirs.save_pretrained(tmp_path / "hf")
    BertTokenizer.from_pretrained(folder).save_pretrained(tmp_path / "hf")
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved.pop("bertforge_finetune") and saved.pop("finetuning_task") == "squad"
    (tmp_path / "hf" / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="task='squad' for SQuAD v1.1, squad2 for v2.0"):
        evaluate(tmp_path / "hf", file=train)
    m = evaluate(tmp_path / "hf", file=train, settings={"task": "squad", "max_seq_length": 32, "stride": 8,
                                                         "max_query_length": 8})
    assert m == pytest.approx(evaluate(folder, file=train)) and "NoAns_total" not in m


def test_predict_gives_one_record_per_question(learned, tmp_path):
    out, train = learned
    test = json.loads(train.read_text())
    for p in test["data"][0]["paragraphs"]:
        for q in p["qas"]:
            del q["answers"]
    path = write_json(tmp_path / "test.json", test)
    records = predict(out / "best", path, tmp_path / "predictions.json")
    contexts = [p["context"] for p in test["data"][0]["paragraphs"]]
    assert len(records) == 64 and set(records[0]) == {"id", "answer", "start", "end", "score", "no_answer"}
    for r, context in zip(records, contexts):
        assert not r["no_answer"] and context[r["start"]:r["end"]] == r["answer"] and 0 < r["score"] <= 1
    assert json.loads((tmp_path / "predictions.json").read_text()) == {r["id"]: r["answer"] for r in records}
    predict(out / "best", path, tmp_path / "p.jsonl")
    assert json.loads((tmp_path / "p.jsonl").read_text().splitlines()[5]) == records[5]


def test_cli_finetune_evaluate_predict_squad2(root, base, capsys, tmp_path):
    train = write_json(root / "cli-train.json", generated(random.Random(3), 32, v2=True))
    out = root / "cli"
    assert cli.main(["finetune", "--task", "squad2", "--model", str(base), "--train-file", str(train), "--dev-file",
                     str(train), "--out", str(out), "--max-steps", "3", "--batch-size", "8", "--max-seq-length", "32",
                     "--stride", "8", "--max-query-length", "8", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "finetune: squad2; train 32 questions ->" in printed and "unanswerable" in printed
    assert {"f1", "best_f1_thresh", "NoAns_total"} <= set(json.loads(printed.strip().splitlines()[-1]))
    assert {p.name for p in (out / "best").iterdir()} >= {"predictions.json", "nbest_predictions.json",
                                                          "null_odds.json", "eval_metrics.json"}
    assert cli.main(["evaluate", str(out / "model"), "--file", str(train), "--out", str(tmp_path / "ev")]) == 0
    assert json.loads(capsys.readouterr().out)["total"] == 32
    assert sorted(p.name for p in (tmp_path / "ev").iterdir()) == ["nbest_predictions.json", "null_odds.json",
                                                                    "predictions.json"]
    assert cli.main(["predict", str(out / "model"), str(train), "--out", str(tmp_path / "p.json")]) == 0
    assert len(json.loads((tmp_path / "p.json").read_text())) == 32
    assert cli.main(["finetune", "--task", "squad", "--model", str(base), "--train-file", str(train),
                     "--out", str(root / "cli-bad"), "--no-keep-best", "--max-seq-length", "32"]) == 2
    assert "max_seq_length (32) must be greater than max_query_length (64) + 3" in capsys.readouterr().err
    assert family_for("squad2").configure(FinetuneConfig(task="squad2")).max_seq_length == 384
