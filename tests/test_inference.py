"""Raw-text inference (`bertforge.serving.predictor.Predictor`) and ``bertforge predict``: every head on a
tiny checkpoint with random weights and the test vocab, checked against transformers on the same
folder, the features module and the texts' own characters; inputs from arguments, files and
stdin; readable and JSONL output."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from finetune_fixtures import root, saved, write  # noqa: F401 - root: a folder for the module
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models

from bertforge import cli
from bertforge.serving.features import extract_features
from bertforge.model.heads import (BertForMaskedLM, BertForMultipleChoice, BertForPreTraining, BertForQuestionAnswering,
                             BertForSequenceClassification, BertForTokenClassification)
from bertforge.serving.predictor import InputError, Predictor, format_records, parse_input
from bertforge.model.bert import BertModel
from bertforge.text.tokenizer import BertTokenizer

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


@pytest.fixture(scope="module")
def mlm(root):
    return saved(root / "pretraining", BertForPreTraining, 1)


@pytest.fixture(scope="module")
def clf(root):
    return saved(root / "classifier", BertForSequenceClassification, 2, id2label={0: "neg", 1: "pos", 2: "mixed"})


@pytest.fixture(scope="module")
def tagger(root):
    return saved(root / "tagger", BertForTokenClassification, 3, id2label=dict(enumerate(TAGS)))


@pytest.fixture(scope="module")
def qa(root):
    return saved(root / "qa", BertForQuestionAnswering, 4, positions=128)  # windows: 64 question tokens + context


@pytest.fixture(scope="module")
def encoder(root):
    return saved(root / "encoder", BertModel, 5)


TEXTS = ["the old house by the river .", "a good book", "the river was long , and the road was short !",
         "they read many books"]


# ---------------------------------------------------------------------------- inputs
def test_inputs_are_strings_pairs_lists_or_objects():
    assert parse_input("a ||| b") == ("a", "b")
    assert parse_input("  spaced  ") == ("  spaced  ",)  # as given: offsets point into it
    assert parse_input(["q", "c"]) == ("q", "c")
    assert parse_input({"text": "a", "text_pair": "b"}) == ("a", "b")
    assert parse_input({"question": "q", "context": "c"}) == ("q", "c")
    assert parse_input({"context": "c", "choices": ["x", "y"]}) == ("c", "x", "y")
    for bad in (3, None, [], [1, 2], {"text": 1}, {"txt": "a"}, {"text": "a", "context": "b"}):
        with pytest.raises(InputError, match="expected a string"):
            parse_input(bad, 7)


def test_the_head_comes_from_the_architecture(mlm, clf, tagger, qa, encoder, root):
    mlm_only = saved(root / "mlm", BertForMaskedLM, 6)
    heads = {mlm: "fill-mask", mlm_only: "fill-mask", clf: "classification", tagger: "tagging", qa: "qa",
             encoder: "embeddings"}
    for folder, head in heads.items():
        assert Predictor.from_pretrained(folder, device="cpu").head == head
    assert Predictor.from_pretrained(clf, device="cpu", head="embeddings").head == "embeddings"
    with pytest.raises(ValueError, match="has no fill-mask head"):
        Predictor.from_pretrained(clf, device="cpu", head="fill-mask")
    with pytest.raises(ValueError, match="^unknown key 'max_len'; expected device, eval_batch_size, "):
        Predictor.from_pretrained(clf, device="cpu", settings={"max_len": 3})
    with pytest.raises(ValueError, match="^max_seq_length: expected an integer, got 'long'$"):
        Predictor.from_pretrained(clf, device="cpu", settings={"max_seq_length": "long"})
    with pytest.raises(ValueError, match=r"^stride: must be >= 0, got -1$"):
        Predictor.from_pretrained(clf, device="cpu", settings={"stride": -1})


# ---------------------------------------------------------------------------- fill-mask
def test_fill_mask_is_transformers_top_k_at_every_mask(mlm):
    p = Predictor.from_pretrained(mlm, device="cpu")
    texts = ["the old [MASK] by the river .", "a [MASK] book ||| the [MASK] [MASK] was long"]
    records = p(texts, top_k=4)
    tok = BertTokenizer.from_pretrained(mlm)
    theirs = transformers.BertForPreTraining.from_pretrained(mlm).eval()
    for text, record in zip(texts, records):
        a, _, b = text.partition(" ||| ")
        enc = tok(a, b or None, return_tensors="pt")
        with torch.no_grad():
            probs = theirs(**enc).prediction_logits.softmax(-1)[0]  # (T, V)
        where = torch.nonzero(enc["input_ids"][0] == tok.mask_token_id).flatten()
        assert len(record["masks"]) == len(where) == text.count("[MASK]")
        for m, position in zip(record["masks"], where):
            own = b if m.get("segment") == 1 else a
            assert own[m["start"]:m["end"]] == "[MASK]"
            scores = [x["score"] for x in m["predictions"]]
            assert len(scores) == 4 and scores == sorted(scores, reverse=True) and sum(scores) <= 1 + 1e-6
            top = probs[position].topk(4)
            assert [x["id"] for x in m["predictions"]] == top.indices.tolist()
            np.testing.assert_allclose(scores, top.values.numpy(), atol=1e-5)
            first = m["predictions"][0]
            assert first["token"] == tok.convert_ids_to_tokens(first["id"])
            assert first["sequence"] == own[:m["start"]] + first["token"].removeprefix("##") + own[m["end"]:]
    assert records[1]["text_pair"] == "the [MASK] [MASK] was long" and records[1]["masks"][2]["segment"] == 1


def test_fill_mask_refuses_texts_without_a_mask_or_too_long(mlm):
    p = Predictor.from_pretrained(mlm, device="cpu")
    with pytest.raises(InputError, match=r"input 1: no \[MASK\]"):
        p.fill_mask(["a [MASK]", "no mask here"])
    with pytest.raises(InputError, match="input 0: 82 tokens, more than the model's 64"):
        p.fill_mask([" ".join(["the"] * 79) + " [MASK]"])
    with pytest.raises(InputError, match="top_k"):
        p.fill_mask(["a [MASK]"], top_k=0)
    with pytest.raises(ValueError, match="fill-mask head, not classification"):
        p.classify(["a"])


# ---------------------------------------------------------------------------- classification
def test_probabilities_are_the_softmax_of_transformers_logits(clf):
    p = Predictor.from_pretrained(clf, device="cpu")
    inputs = [*TEXTS, "a good book ||| the old road"]
    records = p.classify(inputs)
    tok = BertTokenizer.from_pretrained(clf)
    theirs = transformers.BertForSequenceClassification.from_pretrained(clf).eval()
    for text, record in zip(inputs, records):
        a, _, b = text.partition(" ||| ")
        with torch.no_grad():
            expected = theirs(**tok(a, b or None, return_tensors="pt")).logits.softmax(-1)[0].numpy()
        probs = record["probabilities"]
        assert list(probs) == ["neg", "pos", "mixed"]
        np.testing.assert_allclose(list(probs.values()), expected, atol=1e-5)
        assert sum(probs.values()) == pytest.approx(1.0, abs=1e-6)
        assert record["label"] == ["neg", "pos", "mixed"][int(expected.argmax())]
        assert record["score"] == pytest.approx(float(expected.max()), abs=1e-5)
    assert records[-1]["text"] == "a good book" and records[-1]["text_pair"] == "the old road"


def test_one_input_gives_one_result_top_k_and_normalized_embeddings(clf):
    """As transformers' pipelines: a single string is one record (an embedding, one vector)."""
    p = Predictor.from_pretrained(clf, device="cpu")
    many = p.classify(TEXTS)
    for one in (p.classify(TEXTS[0]), p(TEXTS[0]), p.classify({"text": TEXTS[0]})):  # a record, not a list
        assert one["label"] == many[0]["label"] and one["text"] == TEXTS[0]
        assert one["probabilities"] == pytest.approx(many[0]["probabilities"], abs=1e-6)  # a batch of one
    top = p.classify(TEXTS, top_k=2)
    for full, best in zip(many, top):
        assert list(best["probabilities"]) == sorted(full["probabilities"], key=full["probabilities"].get)[::-1][:2]
        assert best["label"] == full["label"]
    with pytest.raises(ValueError, match="top_k must be an integer >= 1, got 0"):
        p.classify(TEXTS, top_k=0)
    vectors = p.embed(TEXTS)
    np.testing.assert_allclose(p.embed(TEXTS[0]), vectors[0], rtol=0, atol=1e-6)
    unit = p.embed(TEXTS, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(unit, vectors / np.linalg.norm(vectors, axis=1, keepdims=True), atol=1e-6)


def test_regression_gives_the_score(root):
    folder = saved(root / "regression", BertForSequenceClassification, 7, num_labels=1, problem_type="regression")
    record = Predictor.from_pretrained(folder, device="cpu").classify(["a good book"])[0]
    theirs = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = theirs(**BertTokenizer.from_pretrained(folder)("a good book", return_tensors="pt")).logits
    assert set(record) == {"index", "text", "score"} and record["score"] == pytest.approx(expected.item(), abs=1e-5)


def test_batch_size_and_order_do_not_change_results(clf, mlm):
    inputs = [TEXTS[k % 4] + " the" * k for k in range(9)]  # mixed lengths: sorted into batches, put back in order
    one = Predictor.from_pretrained(clf, device="cpu", batch_size=1).classify(inputs)
    many = Predictor.from_pretrained(clf, device="cpu", batch_size=4).classify(inputs)
    for a, b in zip(one, many):
        np.testing.assert_allclose(list(a["probabilities"].values()), list(b["probabilities"].values()), atol=1e-5)
    masked = [t.replace("the", "[MASK]", 1) + " [MASK]" * (k % 3) for k, t in enumerate(inputs)]
    one = Predictor.from_pretrained(mlm, device="cpu", batch_size=1).fill_mask(masked, top_k=3)
    many = Predictor.from_pretrained(mlm, device="cpu", batch_size=5).fill_mask(masked, top_k=3)
    for a, b in zip(one, many):
        assert [[x["id"] for x in m["predictions"]] for m in a["masks"]] == \
               [[x["id"] for x in m["predictions"]] for m in b["masks"]]


def test_bf16_runs_under_autocast(clf, monkeypatch):
    fp32 = Predictor.from_pretrained(clf, device="cpu").classify(TEXTS)
    bf16 = Predictor.from_pretrained(clf, device="cpu", dtype="bf16").classify(TEXTS)
    diff = max(abs(x - y) for a, b in zip(fp32, bf16) for x, y in zip(a["probabilities"].values(),
                                                                       b["probabilities"].values()))
    assert 0 < diff < 0.05  # bf16 changes the numbers a little, not the meaning
    assert all(sum(r["probabilities"].values()) == pytest.approx(1.0, abs=1e-6) for r in bf16)
    assert Predictor.from_pretrained(clf, device="cpu", precision="bf16").classify(TEXTS) == bf16
    for fp16 in (dict(dtype=torch.float16), dict(precision="fp16")):
        with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
            Predictor.from_pretrained(clf, device="cpu", **fp16)
    with pytest.raises(ValueError, match="disagree"):
        Predictor.from_pretrained(clf, device="cpu", precision="bf16", dtype=torch.float16)
    with pytest.raises(ValueError, match="unknown dtype"):
        Predictor.from_pretrained(clf, device="cpu", dtype=torch.int8)


def test_precision_auto_is_bf16_where_the_device_runs_it_natively(clf, monkeypatch, caplog):
    monkeypatch.setattr("bertforge.train.precision.native_bf16", lambda device: False)  # an AVX2-only CPU
    auto = Predictor.from_pretrained(clf, device="cpu", precision="auto")
    assert auto.precision == "fp32" and auto.autocast is None
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        emulated = Predictor.from_pretrained(clf, device="cpu", dtype="bf16")
    assert emulated.precision == "bf16" and emulated.autocast == torch.bfloat16 and "emulated" in caplog.text
    monkeypatch.setattr("bertforge.train.precision.native_bf16", lambda device: True)
    assert Predictor.from_pretrained(clf, device="cpu", precision="auto").precision == "bf16"


def test_a_predictor_built_from_its_parts_runs_the_family_of_its_settings(clf, tagger):
    """The seam: a fine-tuned checkpoint read by `load_finetuned`, its family's ``predict_texts``."""
    from bertforge.tasks.finetune import load_finetuned

    for folder, texts in ((clf, TEXTS), (tagger, TEXTS[:2])):
        ft = load_finetuned(folder, {"device": "cpu", "eval_batch_size": 3, "max_seq_length": 64})  # the positions
        loaded = Predictor.from_pretrained(folder, device="cpu", batch_size=3)
        p = Predictor(ft.model, ft.tokenizer, loaded.head, device="cpu", settings=ft.settings, batch_size=3)
        assert p.family is ft.family is loaded.family and p.settings == loaded.settings
        assert p(texts) == loaded(texts)
        assert p(texts) == ft.family.predict_texts(ft.model, ft.tokenizer, ft.settings, [(t,) for t in texts], "cpu")


def test_no_module_imports_another_modules_private_names():
    import ast

    import bertforge

    for path in sorted(Path(bertforge.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bertforge"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, f"{path}:{node.lineno}: {node.module} {private}"


# ---------------------------------------------------------------------------- tagging
def test_tagging_gives_entities_whose_character_offsets_are_the_text(tagger):
    texts = ["The old house by the  river, and the road.", "they walked   to the city !", ""]
    records = Predictor.from_pretrained(tagger, device="cpu").tag(texts)
    tok = BertTokenizer.from_pretrained(tagger)
    theirs = transformers.BertForTokenClassification.from_pretrained(tagger).eval()
    found = 0
    for text, record in zip(texts, records):
        words = record["words"]
        assert "".join(w["text"] for w in words) == "".join(text.split())  # every character, in order
        assert all(text[w["start"]:w["end"]] == w["text"] for w in words)
        # One tag per word, read at its first WordPiece: transformers' argmax there, its probability the score.
        enc = tok(text, return_tensors="pt", return_word_ids=True)
        with torch.no_grad():
            prob, best = theirs(input_ids=enc["input_ids"]).logits.softmax(-1).max(-1)
        first: dict[int, int] = {}
        for position, w in enumerate(enc["word_ids"][0].tolist()):
            if w >= 0:
                first.setdefault(w, position)
        assert [w["tag"] for w in words] == [TAGS[best[0, first[k]]] for k in range(len(words))]
        np.testing.assert_allclose([w["score"] for w in words], [prob[0, first[k]] for k in range(len(words))],
                                   atol=1e-5)
        for e in record["entities"]:
            assert text[e["start"]:e["end"]] == e["text"]
            inside = [w for w in words if e["start"] <= w["start"] and w["end"] <= e["end"]]
            assert e["score"] == pytest.approx(np.mean([w["score"] for w in inside]))
            assert inside[0]["start"] == e["start"] and inside[-1]["end"] == e["end"]  # whole words
            assert all(w["tag"][2:] == e["type"] for w in inside) and inside[0]["tag"][0] in "BI"
            found += 1
    assert found > 0
    assert records[2] == {"index": 2, "text": "", "entities": [], "words": []}


def test_tagging_long_texts_get_one_tag_per_word(tagger):
    text = " ".join(["the old house by the river"] * 12)  # 72 words > a 16-token window
    record = Predictor.from_pretrained(tagger, device="cpu", settings={"max_seq_length": 16}).tag([text])[0]
    assert len(record["words"]) == 72 and all(w["tag"] in TAGS for w in record["words"])
    with pytest.raises(InputError, match="tagging takes one text"):
        Predictor.from_pretrained(tagger, device="cpu").tag(["a ||| b"])


# ---------------------------------------------------------------------------- QA
def test_the_answer_is_the_best_span_of_transformers_logits_at_its_offsets(qa):
    question, context = "who walked ?", "The old house  by the river ."
    record = Predictor.from_pretrained(qa, device="cpu").answer([f"{question} ||| {context}"])[0]
    # The window (13 tokens) is shorter than n_best_size (20): every span is a candidate.
    tok = BertTokenizer.from_pretrained(qa)
    enc = tok(question, context, return_tensors="pt", return_offsets_mapping=True)
    theirs = transformers.BertForQuestionAnswering.from_pretrained(qa).eval()
    with torch.no_grad():
        out = theirs(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"])
    start, end = out.start_logits[0], out.end_logits[0]
    in_context = enc["token_type_ids"][0].bool() & (enc["input_ids"][0] != tok.sep_token_id)
    positions = torch.nonzero(in_context).flatten().tolist()
    best = max(((i, j) for i in positions for j in positions if i <= j), key=lambda s: float(start[s[0]] + end[s[1]]))
    offsets = enc["offset_mapping"][0]
    assert (record["start"], record["end"]) == (int(offsets[best[0], 0]), int(offsets[best[1], 1]))
    assert record["answer"] and context[record["start"]:record["end"]] == record["answer"]
    assert record["context"] == context and record["question"] == question and not record["no_answer"]
    assert 0 < record["score"] <= 1


def test_squad2_settings_allow_no_answer_and_inputs_need_a_context(qa):
    p = Predictor.from_pretrained(qa, device="cpu", settings={"task": "squad2", "null_score_diff_threshold": -1e9})
    record = p.answer([{"question": "who ?", "context": "the old house"}])[0]
    assert record["no_answer"] and record["answer"] == "" and record["start"] is None and "null_odds" in record
    with pytest.raises(InputError, match="input 1: expected a question and a context"):
        p.answer(["who ? ||| the house", "who ?"])


# ---------------------------------------------------------------------------- multiple choice
def test_multiple_choice_picks_transformers_best_choice(root):
    folder = saved(root / "choices", BertForMultipleChoice, 8)
    p = Predictor.from_pretrained(folder, device="cpu")
    assert p.head == "multiple-choice"
    record = p(["the old house ||| by the river ||| on the road ||| in the city"])[0]
    tok = BertTokenizer.from_pretrained(folder)
    enc = tok(["the old house"] * 3, ["by the river", "on the road", "in the city"], padding=True, return_tensors="pt")
    theirs = transformers.BertForMultipleChoice.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = theirs(**{k: v[None] for k, v in enc.items()}).logits.softmax(-1)[0].numpy()
    np.testing.assert_allclose(record["probabilities"], expected, atol=1e-5)
    assert record["choice"] == int(expected.argmax()) and record["text"] == record["choices"][record["choice"]]
    with pytest.raises(InputError, match="input 1: 1 choices where input 0 has 2"):
        p.choose(["a ||| b ||| c", "a ||| b"])


# ---------------------------------------------------------------------------- embeddings
def test_embeddings_equal_features_pooling_and_bert_model_pooler(encoder):
    texts = [*TEXTS, "a good book ||| the old road", " ".join(["the river"] * 40)]  # the last: 2 windows of 64
    p = Predictor.from_pretrained(encoder, device="cpu")
    pairs = [tuple(t.split(" ||| ")) if " ||| " in t else t for t in texts]
    for pooling in ("mean", "cls"):
        expected = extract_features(encoder, pairs, pooling=pooling, max_seq_length=64).values
        np.testing.assert_allclose(p.embed(texts, pooling=pooling), expected, atol=1e-5)
    tok = BertTokenizer.from_pretrained(encoder)
    theirs = transformers.BertModel.from_pretrained(encoder).eval()
    with torch.no_grad():
        expected = np.stack([theirs(**tok(*(t if isinstance(t, tuple) else (t,)), return_tensors="pt")).pooler_output[0]
                             .numpy() for t in pairs[:5]])
    np.testing.assert_allclose(p.embed(texts[:5], pooling="pooler"), expected, atol=1e-5)
    records = p(texts[:2])
    assert records[0]["text"] == texts[0] and len(records[0]["embedding"]) == 32


def test_any_checkpoint_gives_embeddings_but_a_pooler_only_when_trained(root, tagger):
    p = Predictor.from_pretrained(tagger, device="cpu", head="embeddings")
    assert p.embed(["the river"]).shape == (1, 32)
    with pytest.raises(InputError, match="no trained pooler"):
        p.embed(["the river"], pooling="pooler")


# ---------------------------------------------------------------------------- the command
def _jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_cli_texts_from_arguments_file_and_stdin(clf, root, capsys, monkeypatch):
    assert cli.main(["predict", str(clf), "a good book", "the old road ||| yes", "--format", "jsonl"]) == 0
    args = _jsonl(capsys.readouterr().out)
    assert [r["index"] for r in args] == [0, 1] and args[1]["text_pair"] == "yes"
    assert args == Predictor.from_pretrained(clf, device="cpu").classify(["a good book", "the old road ||| yes"])

    lines = write(root / "texts.txt", "a good book\n  the old road ||| yes  \n\n")
    assert cli.main(["predict", str(clf), "--file", str(lines)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[0].split("\t")[0] == args[0]["label"] and out[1].endswith("\tthe old road ||| yes")

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a good book\nthe old road ||| yes\n")))
    assert cli.main(["predict", str(clf), "--format", "jsonl", "-"]) == 0
    assert _jsonl(capsys.readouterr().out) == args

    out_file = root / "predictions.jsonl"
    assert cli.main(["predict", str(clf), "a good book", "--out", str(out_file)]) == 0
    assert "wrote 1 predictions" in capsys.readouterr().out
    written = _jsonl(out_file.read_text())[0]  # a batch of one: the same up to rounding
    assert written["label"] == args[0]["label"]
    assert written["probabilities"] == pytest.approx(args[0]["probabilities"], abs=1e-6)


def test_cli_options_between_checkpoint_and_texts_and_readable_output(mlm, qa, tagger, capsys):
    assert cli.main(["predict", str(mlm), "--top-k", "2", "the old [MASK] .", "a [MASK] ||| b [MASK]"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "the old [MASK] ." and out[1].startswith("  [8:14] ") and out[1].count(",") == 1
    assert out[2] == "a [MASK] ||| b [MASK]" and len(out) == 5
    assert cli.main(["predict", str(qa), "who ? ||| the old house", "--format", "jsonl"]) == 0
    record = _jsonl(capsys.readouterr().out)[0]
    assert "the old house"[record["start"]:record["end"]] == record["answer"]
    assert cli.main(["predict", str(tagger), "--embeddings", "--pooling", "cls", "the river", "a book"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows] == ["the river", "a book"] and len(rows[0][1].split()) == 32


def test_cli_errors_are_one_line(mlm, capsys):
    assert cli.main(["predict", str(mlm), "a [MASK]", "no mask"]) == 2
    err = capsys.readouterr().err
    assert "input 1: no [MASK]" in err and "Traceback" not in err
    assert cli.main(["predict", str(mlm)]) == 2
    assert "no inputs" in capsys.readouterr().err


def test_cli_a_task_file_without_out_prints_the_family_records(clf, root, capsys):
    tsv = write(root / "test.tsv", "sentence\na good book\nthe old road\n")
    assert cli.main(["predict", str(clf), str(tsv), "--text-column", "sentence"]) == 0
    records = _jsonl(capsys.readouterr().out)
    assert [r["line"] for r in records] == [2, 3] and {r["label"] for r in records} <= {"neg", "pos", "mixed"}


def test_format_records_text_and_jsonl(clf):
    records = Predictor.from_pretrained(clf, device="cpu").classify(["a good book"])
    assert _jsonl(format_records(records, "classification", "jsonl")) == records
    assert format_records(records, "classification").count("\n") == 1
    with pytest.raises(ValueError, match="unknown format"):
        format_records(records, "classification", "csv")
