"""Causal (left-to-right, config ``is_decoder``) checkpoints, as ``bertforge pretrain --objective ltr``
makes them, through inference: fill-mask refused by the predictor, the command line and the HTTP
service; features refusing [CLS] pooling; the pooler reading the last real token as the sentence heads
do; ONNX graphs that apply the causal mask. And the HTTP service's token count of multiple-choice
requests: the context once per choice, as the model runs it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from finetune_fixtures import root, saved  # noqa: F401 - root: a folder for the module
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models
from starlette.testclient import TestClient

from bertforge import cli
from bertforge.model.heads import (BertForMaskedLM, BertForMultipleChoice, BertForSequenceClassification,
                                   _pooled)
from bertforge.serving import features
from bertforge.serving.http import create_app
from bertforge.serving.predictor import InputError, Predictor
from bertforge.text.tokenizer import BertTokenizer

TEXTS = ["the old house by the river .", "a good book", "the river was long , and the road was short !", "yes"]
LEFT_TO_RIGHT = "a left-to-right model trained to predict the next token"


@pytest.fixture(scope="module")
def ltr(root) -> Path:
    """What ``pretrain --objective ltr`` saves: a causal BertForMaskedLM."""
    folder = saved(root / "ltr", BertForMaskedLM, 1, is_decoder=True)
    assert json.loads((folder / "config.json").read_text())["is_decoder"] is True
    return folder


@pytest.fixture(scope="module")
def ltr_classifier(root) -> Path:
    """A classifier fine-tuned from a causal checkpoint: its pooler trained on the last real token."""
    return saved(root / "ltr-classifier", BertForSequenceClassification, 2, is_decoder=True,
                 id2label={0: "neg", 1: "pos"})


def _fp32(reference) -> float:
    """Two float32 evaluations of one model by different kernels (the fast unpadded encoder and the reference,
    a batch and an input alone, onnxruntime and PyTorch) agree within 1e-4 of the outputs' scale (their largest
    magnitude, at least 1), as `bertforge.convert.onnx` checks an export: rounding that differs between CPUs'
    kernels stays far inside it, and a wrong token, mask or weight far outside."""
    return 1e-4 * max(1.0, float(np.abs(np.asarray(reference)).max()))


def _ids(tok: BertTokenizer, text: str) -> list[int]:
    """``[CLS] text [SEP]``."""
    return tok([text])["input_ids"][0]


def _batch(tok: BertTokenizer, texts: list[str], left: bool) -> dict[str, torch.Tensor]:
    """``texts`` encoded and padded on the right (or the left)."""
    rows = [_ids(tok, t) for t in texts]
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        where = slice(T - len(r), T) if left else slice(0, len(r))
        ids[i, where], mask[i, where] = torch.tensor(r), 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


# ---------------------------------------------------------------------------- fill-mask
def test_the_predictor_refuses_fill_mask_on_a_left_to_right_checkpoint(ltr):
    with pytest.raises(ValueError, match=f"^{ltr}: {LEFT_TO_RIGHT}") as e:
        Predictor.from_pretrained(ltr, device="cpu")
    message = str(e.value)
    assert "\n" not in message and "[MASK]" in message and "embeddings" in message
    model = BertForMaskedLM.from_pretrained(ltr)
    with pytest.raises(ValueError, match=LEFT_TO_RIGHT):  # built by hand too
        Predictor(model, BertTokenizer.from_pretrained(ltr), "fill-mask", device="cpu", name="mine")
    p = Predictor.from_pretrained(ltr, device="cpu", head="embeddings")  # what it can do
    assert p(["the old house"])[0]["embedding"]


def test_cli_predict_refuses_fill_mask_on_a_left_to_right_checkpoint(ltr, capsys):
    assert cli.main(["predict", str(ltr), "the old [MASK] by the river", "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"bertforge predict: error: {ltr}: {LEFT_TO_RIGHT}")
    assert cli.main(["predict", str(ltr), "the old house", "--embeddings", "--device", "cpu"]) == 0


def test_serve_refuses_to_start_fill_mask_on_a_left_to_right_checkpoint(ltr, monkeypatch, capsys):
    import uvicorn

    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app))
    assert cli.main(["serve", str(ltr), "--device", "cpu"]) == 2
    assert not started
    assert f"bertforge serve: error: {ltr}: {LEFT_TO_RIGHT}" in capsys.readouterr().err
    assert cli.main(["serve", str(ltr), "--embeddings", "--device", "cpu"]) == 0  # its embeddings are served
    client = TestClient(started["app"])
    assert client.get("/health").json()["routes"] == ["GET /health", "POST /predict", "POST /embed"]
    assert client.post("/embed", json={"inputs": ["the old house"]}).status_code == 200
    got = client.post("/fill-mask", json={"inputs": ["the old [MASK]"]})
    assert got.status_code == 404
    got = client.post("/embed", json={"inputs": ["the old house"], "pooling": "cls"})
    assert got.status_code == 422 and "left-to-right" in got.json()["error"]


# ---------------------------------------------------------------------------- features and the pooler
def test_features_refuse_cls_pooling_of_a_left_to_right_checkpoint(ltr, tmp_path, capsys):
    with pytest.raises(ValueError, match=f"^{ltr}: a left-to-right model.*\\[CLS\\].*mean"):
        features.extract_features(ltr, TEXTS, pooling="cls", device="cpu")
    model = features.BertModelWithoutPooler.from_pretrained(ltr).eval()
    tok = BertTokenizer.from_pretrained(ltr)
    with pytest.raises(ValueError, match="left-to-right"):
        features.embed(model, tok, TEXTS, pooling="cls")
    p = Predictor.from_pretrained(ltr, device="cpu", head="embeddings")
    with pytest.raises(InputError, match=f"^{ltr}: a left-to-right model.*mean"):
        p.embed(TEXTS, pooling="cls")
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert cli.main(["features", str(ltr), str(source), "--out", str(tmp_path / "f.npy"), "--pooling", "cls",
                     "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "left-to-right" in err and not (tmp_path / "f.npy").exists()


def test_features_of_a_left_to_right_checkpoint_are_its_causal_states(ltr):
    """Per token and mean-pooled, each input's vectors equal the causal encoder run on it alone."""
    tok = BertTokenizer.from_pretrained(ltr)
    model = features.BertModelWithoutPooler.from_pretrained(ltr).eval()
    tokens = features.extract_features(ltr, TEXTS, layers=[-1], device="cpu", batch_size=4)
    mean = features.extract_features(ltr, TEXTS, pooling="mean", device="cpu", batch_size=4)
    for i, text in enumerate(TEXTS):
        with torch.no_grad():
            alone = model(torch.tensor([_ids(tok, text)])).last_hidden_state[0].numpy()
        np.testing.assert_allclose(tokens[i], alone, atol=_fp32(alone))
        np.testing.assert_allclose(mean[i], alone.mean(0), atol=_fp32(alone))


def test_the_pooler_of_a_left_to_right_checkpoint_reads_the_last_real_token(ltr_classifier):
    """Predictor.embed(pooling="pooler") (batched by length, unpadded by the fast encoder) pools where the
    classification head pools (`heads._pooled`): each input's last real token, as the input alone gives it."""
    p = Predictor.from_pretrained(ltr_classifier, device="cpu", batch_size=2)
    got = p.embed(TEXTS, pooling="pooler")
    reference = BertForSequenceClassification.from_pretrained(ltr_classifier).eval()
    with torch.no_grad():
        alone = torch.cat([_pooled(reference.bert, **_batch(p.tokenizer, [t], False), output_hidden_states=False)
                           .pooler_output for t in TEXTS])
        padded = _pooled(reference.bert, **_batch(p.tokenizer, TEXTS, False), output_hidden_states=False)
        np.testing.assert_allclose(got, alone.numpy(), atol=_fp32(alone))
        np.testing.assert_allclose(got, padded.pooler_output.numpy(), atol=_fp32(alone))
        probabilities = reference.classifier(torch.from_numpy(got)).softmax(-1).numpy()
    np.testing.assert_allclose([[r["probabilities"][k] for k in ("neg", "pos")] for r in p.classify(TEXTS)],
                               probabilities, atol=1e-5)
    long = " ".join(["the river"] * 40)  # 80 words: windows of 62 of them, 31 apart; the final [SEP] in the second
    full = _ids(p.tokenizer, long)
    assert len(full) == 82
    second = torch.tensor([[full[0], *full[1 + 31:]]])  # [CLS] words 31..79 [SEP]
    with torch.no_grad():
        last_window = reference.bert(second, output_positions=torch.tensor([[second.shape[1] - 1]])).pooler_output
    np.testing.assert_allclose(p.embed([long], pooling="pooler"), last_window.numpy(), atol=_fp32(last_window))
    with pytest.raises(InputError, match="left-to-right"):
        p.embed(TEXTS, pooling="cls")


# ---------------------------------------------------------------------------- ONNX
def test_export_onnx_of_a_left_to_right_checkpoint_applies_the_causal_mask(ltr, tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    out = tmp_path / "onnx"
    assert cli.main(["export-onnx", str(ltr), str(out)]) == 0
    assert "onnxruntime vs PyTorch" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["is_decoder"] is True
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    model = BertForMaskedLM.from_pretrained(ltr).eval()
    tok = BertTokenizer.from_pretrained(ltr)

    def both(batch):
        with torch.no_grad():
            eager = model(**batch).logits.numpy()
        onnx, = session.run(["logits"], {k: v.numpy() for k, v in batch.items()})
        real = batch["attention_mask"].numpy()[..., None].astype(bool)
        return np.where(real, onnx, 0), np.where(real, eager, 0)

    for texts in (TEXTS, TEXTS[1:3], TEXTS[:1]):  # batches of different lengths
        for left in (False, True):
            onnx, eager = both(_batch(tok, texts, left))
            np.testing.assert_allclose(onnx, eager, atol=_fp32(eager))
    batch = _batch(tok, ["the old house by the river ."] * 2, left=False)
    later = {k: v.clone() for k, v in batch.items()}
    later["input_ids"][:, 4:] = torch.tensor(_ids(tok, "a good book by the road"))[:5]
    a, _ = both(batch)
    b, _ = both(later)
    np.testing.assert_allclose(a[:, :4], b[:, :4], atol=1e-5)  # a position never sees those after it
    assert np.abs(a[:, 4] - b[:, 4]).max() > 1e-3


def test_export_onnx_of_a_left_to_right_classifier_pools_the_last_real_token(ltr_classifier, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from bertforge.convert.onnx import export_onnx

    model = BertForSequenceClassification.from_pretrained(ltr_classifier).eval()
    export_onnx(model, tmp_path / "model.onnx", shapes=((2, 9), (3, 16)))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    tok = BertTokenizer.from_pretrained(ltr_classifier)
    for left in (False, True):
        batch = _batch(tok, TEXTS, left)
        with torch.no_grad():
            eager = model(**batch).logits.numpy()
        onnx, = session.run(["logits"], {k: v.numpy() for k, v in batch.items()})
        np.testing.assert_allclose(onnx, eager, atol=1e-4)


# ---------------------------------------------------------------------------- the HTTP token count
def test_a_multiple_choice_request_counts_its_context_once_per_choice(root):
    p = Predictor.from_pretrained(saved(root / "choices", BertForMultipleChoice, 3), device="cpu")
    context, choices = "the old road by the river", ["a", "b"]  # 6 tokens; 1 each
    assert [len(p.tokenizer.encode_batch_ids([t])[0]) for t in (context, *choices)] == [6, 1, 1]
    body = {"inputs": [{"context": context, "choices": choices}]}
    # Run as [CLS] context [SEP] choice [SEP] per choice: 2 x (6 + 1 + 3) = 20 tokens.
    got = TestClient(create_app(p, max_request_tokens=19)).post("/predict", json=body)
    assert got.status_code == 413 and "20 tokens; the limit is 19 per request (--max-request-tokens)" in \
        got.json()["error"]
    assert TestClient(create_app(p, max_request_tokens=20)).post("/predict", json=body).status_code == 200
    three = {"inputs": ["the old road by the river ||| a ||| b ||| a b"]}  # 10 + 10 + 11
    got = TestClient(create_app(p, max_request_tokens=30)).post("/choose", json=three)
    assert got.status_code == 413 and "31 tokens" in got.json()["error"]
    embedded = TestClient(create_app(p, max_request_tokens=9)).post("/embed", json={"inputs": ["a ||| b"]})
    assert embedded.status_code == 200  # embeddings run [CLS] a [SEP] b [SEP]: 5 tokens


def test_serve_refuses_to_start_with_a_default_pooling_the_model_cannot_take(ltr_classifier):
    """Every request without its own pooling would be refused: the service is refused instead, at start."""
    p = Predictor.from_pretrained(ltr_classifier, device="cpu")
    with pytest.raises(InputError, match=r"left-to-right .*use pooling mean"):
        create_app(p, pooling="cls")
    health = TestClient(create_app(p)).get("/health").json()
    assert (health["precision"], health["dtype"]) == ("fp32", "float32")
