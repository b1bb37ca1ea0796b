"""``bertforge serve`` (`bertforge.serving.http.create_app`): the HTTP service answering through Starlette's
TestClient (no real port): health, predictions equal to the `Predictor`'s, per-head routes, clear
4xx errors on bad requests (invalid Unicode, deep nesting, too many tokens), one forward pass at a time
under concurrent requests, taken in turns batch by batch."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from data_fixtures import VOCAB_SIZE, write_tokenizer
from finetune_fixtures import root  # noqa: F401 - fixture: a folder for the module
from pretrain_fixtures import one_thread  # noqa: F401 - autouse fixture: one thread for tiny models
from starlette.testclient import TestClient

from bertforge import cli
from bertforge.console import show_logs
from bertforge.model.config import BertConfig
from bertforge.model.heads import BertForMaskedLM, BertForSequenceClassification
from bertforge.serving.predictor import InputError, Predictor
from bertforge.serving.http import MAX_REQUEST_TOKENS, create_app


def _save(folder, model):
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    write_tokenizer(folder)
    return folder


def _config(**extra) -> BertConfig:
    return BertConfig(vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64, **extra)


@pytest.fixture(scope="module")
def clf(root):
    torch.manual_seed(0)
    folder = _save(root / "classifier", BertForSequenceClassification(_config(id2label={0: "neg", 1: "pos"})))
    return Predictor.from_pretrained(folder, device="cpu")


@pytest.fixture(scope="module")
def mlm(root):
    torch.manual_seed(1)
    return Predictor.from_pretrained(_save(root / "mlm", BertForMaskedLM(_config())), device="cpu")


@pytest.fixture(scope="module")
def client(clf):
    return TestClient(create_app(clf, max_batch=3, max_request_bytes=2000))


def test_health_names_model_head_device_and_limits(client, clf):
    got = client.get("/health")
    assert got.status_code == 200
    body = got.json()
    assert body["status"] == "ok" and body["head"] == "classification" and body["model"] == clf.name
    assert body["device"] == "cpu" and body["dtype"] == "float32" and body["labels"] == ["neg", "pos"]
    assert body["limits"] == {"max_batch": 3, "max_request_bytes": 2000, "max_request_tokens": MAX_REQUEST_TOKENS}
    assert body["routes"] == ["GET /health", "POST /predict", "POST /classify", "POST /embed"]


def test_predictions_are_the_predictors(client, clf):
    inputs = ["a good book", "the old road ||| yes", {"text": "the river", "text_pair": "a house"}]
    got = client.post("/predict", json={"inputs": inputs})
    assert got.status_code == 200
    body = got.json()
    expected = clf(inputs)
    assert body["head"] == "classification" and [r["label"] for r in body["predictions"]] == \
        [r["label"] for r in expected]
    for a, b in zip(body["predictions"], expected):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=1e-6)
    same = client.post("/classify", json={"inputs": "a good book"}).json()  # one input without its list
    assert same["predictions"][0]["label"] == expected[0]["label"]
    embedded = client.post("/embed", json={"inputs": ["a good book"], "pooling": "cls"}).json()
    assert embedded["head"] == "embeddings"
    assert embedded["predictions"][0]["embedding"] == pytest.approx(clf.embed(["a good book"], "cls")[0].tolist(),
                                                                    abs=1e-5)


def test_fill_mask_route_top_k_and_its_input_errors(mlm):
    client = TestClient(create_app(mlm, top_k=3))
    body = client.post("/fill-mask", json={"inputs": ["the old [MASK] ."], "top_k": 2}).json()
    assert body["head"] == "fill-mask" and len(body["predictions"][0]["masks"][0]["predictions"]) == 2
    default = client.post("/predict", json={"inputs": ["the old [MASK] ."]}).json()
    assert len(default["predictions"][0]["masks"][0]["predictions"]) == 3
    got = client.post("/predict", json={"inputs": ["a [MASK]", "no mask here"]})
    assert got.status_code == 422 and "input 1: no [MASK]" in got.json()["error"]
    got = client.post("/predict", json={"inputs": [" ".join(["the"] * 70) + " [MASK]"]})
    assert got.status_code == 422 and "73 tokens, more than the model's 64" in got.json()["error"]
    got = client.post("/embed", json={"inputs": ["a"], "pooling": "pooler"})  # an MLM checkpoint has no pooler
    assert got.status_code == 422 and "no trained pooler" in got.json()["error"]


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    (b"", 400, "not valid JSON"),
    (b'["a good book"]', 400, "expected a JSON object"),
    (b'{"texts": ["a"]}', 400, "unknown keys: texts"),
    (b'{"top_k": 2}', 400, 'no "inputs"'),
    (b'{"inputs": 3}', 400, '"inputs" must be a list, got a number'),
    (b'{"inputs": []}', 422, '"inputs" is empty'),
    (b'{"inputs": ["a", "b", "c", "d"]}', 413, "4 inputs; the limit is 3 per request"),
    (b'{"inputs": ["' + b"a " * 1500 + b'"]}', 413, "the limit is 2,000 (--max-request-bytes)"),
    (b'{"inputs": ["a"], "top_k": 0}', 400, "top_k"),
    (b'{"inputs": ["a"], "pooling": "max"}', 400, "pooling"),
    (b'{"inputs": ["a", 7]}', 422, "input 1: expected a string"),
    (b'{"inputs": ["a ||| b ||| c"]}', 422, "input 0: expected a text or a pair"),
    (b'{"inputs": ["a \\ud800 b"]}', 400, 'the body["inputs"][0] has a lone surrogate (\'a \\ud800 b\')'),
    (b'{"inputs": [{"text": "a", "\\udfff": "b"}]}', 400, "a key of the body[\"inputs\"][0] has a lone surrogate"),
    (b'{"inputs": ["a \\ud83d\\ude00 b"], "top_k": 1}', 200, ""),  # a surrogate pair is one character
    (b'{"inputs": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "nests JSON deeper than 32 levels"),
])
def test_bad_requests_get_4xx_with_a_message(client, body, status, message):
    got = client.post("/predict", content=body)
    assert got.status_code == status
    assert message in got.json().get("error", "")
    assert client.post("/predict", json={"inputs": ["a good book"]}).status_code == 200  # still serving


def test_json_nested_10000_deep_gets_400_and_the_server_goes_on(clf):
    client = TestClient(create_app(clf))  # 20 kB: under the default byte limit
    for body in (b"[" * 10000 + b"]" * 10000, b'{"inputs": ' + b"[" * 10000 + b"]" * 10000 + b"}"):
        got = client.post("/predict", content=body)
        assert got.status_code == 400 and "nests JSON deeper than 32 levels" in got.json()["error"]
    assert client.post("/predict", json={"inputs": ["a good book"]}).status_code == 200


def test_a_body_without_a_declared_length_is_limited_too(client):
    chunks = iter([b'{"inputs": ["', b"a " * 1500, b'"]}'])  # sent chunked: no Content-Length
    got = client.post("/predict", content=chunks)
    assert got.status_code == 413 and "exceeds the limit" in got.json()["error"]


def test_unknown_routes_and_methods_say_what_exists(client):
    got = client.post("/fill-mask", json={"inputs": ["a [MASK]"]})
    assert got.status_code == 404 and "POST /predict, /classify, /embed" in got.json()["error"]
    got = client.get("/predict")
    assert got.status_code == 405 and "GET /health" in got.json()["error"]


def _watch(predictor, seen, pause=None):
    """Record each forward pass of ``predictor``'s model as its tokens (padding left out), counting the passes
    running at once in ``seen["most"]``; ``pause(length)``: seconds to hold a pass."""
    guard = threading.Lock()
    seen.update(running=0, most=0, lengths=[])

    def enter(module, args):
        with guard:
            seen["running"] += 1
            seen["most"] = max(seen["most"], seen["running"])
            seen["lengths"].append(int(args[1].sum()))  # the attention mask
        time.sleep(pause(int(args[1].sum())) if pause else 0.02)  # long enough for the other requests to arrive

    def leave(module, args, output):
        with guard:
            seen["running"] -= 1

    predictor.model.register_forward_pre_hook(enter)  # after the app's own hooks: inside its lock
    predictor.model.register_forward_hook(leave, prepend=True, always_call=True)


def test_concurrent_requests_use_the_model_one_forward_pass_at_a_time(clf):
    predictor = Predictor.from_pretrained(clf.name, device="cpu", batch_size=2)
    client = TestClient(create_app(predictor))
    seen = {}
    _watch(predictor, seen)
    texts = [[f"{'the old ' * k}road"] * 3 for k in range(6)]  # 3 inputs: 2 batches per request
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda t: client.post("/predict", json={"inputs": t}), texts))
    assert [a.status_code for a in answers] == [200] * 6
    assert seen["most"] == 1 and len(seen["lengths"]) == 12
    for t, a in zip(texts, answers):
        assert [r["label"] for r in a.json()["predictions"]] == [r["label"] for r in clf(t)]


def test_a_short_request_is_answered_between_the_batches_of_a_long_one(clf):
    predictor = Predictor.from_pretrained(clf.name, device="cpu", batch_size=1)
    client = TestClient(create_app(predictor))
    long_started = threading.Event()
    seen = {}

    def pause(length):  # the long request's first batch waits until the short one has arrived
        if length > 3 and not long_started.is_set():
            long_started.set()
            return 0.5
        return 0.0

    _watch(predictor, seen, pause)
    long_inputs = ["the old road by the river"] * 6  # 6 batches of one input
    with ThreadPoolExecutor(2) as pool:
        long = pool.submit(client.post, "/predict", json={"inputs": long_inputs})
        assert long_started.wait(10)
        short = client.post("/predict", json={"inputs": ["a"]})  # [CLS] a [SEP]: 3 tokens
        assert short.status_code == 200 and long.result().status_code == 200
    assert seen["lengths"] == [8, 3, 8, 8, 8, 8, 8]  # its one batch right after the long one's first
    assert seen["most"] == 1


def test_requests_over_the_token_limit_get_413(clf):
    client = TestClient(create_app(clf, max_request_tokens=12))
    assert client.get("/health").json()["limits"]["max_request_tokens"] == 12
    ok = client.post("/predict", json={"inputs": ["the old road by the river", "a b"]})  # 8 + 4 tokens
    assert ok.status_code == 200
    got = client.post("/predict", json={"inputs": ["the old road by the river", "a ||| b"]})  # 8 + 5
    assert got.status_code == 413 and "13 tokens; the limit is 12 per request (--max-request-tokens)" in \
        got.json()["error"]
    got = client.post("/predict", json={"inputs": ["a", 7]})  # counted after parsing: the same 422
    assert got.status_code == 422 and "input 1: expected a string" in got.json()["error"]
    with pytest.raises(ValueError, match="max_request_tokens"):
        create_app(clf, max_request_tokens=0)


def test_cli_serve_builds_the_app_from_its_flags(clf, monkeypatch, capsys):
    import uvicorn

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app, **kw))
    show_logs()  # as the command line does: the library logs the address, the console shows it
    assert cli.main(["serve", clf.name, "--port", "8123", "--max-batch", "2", "--max-request-tokens", "40",
                     "--device", "cpu"]) == 0
    assert seen["host"] == "127.0.0.1" and seen["port"] == 8123
    assert "on http://127.0.0.1:8123" in capsys.readouterr().out
    client = TestClient(seen["app"])
    limits = client.get("/health").json()["limits"]
    assert limits["max_batch"] == 2 and limits["max_request_tokens"] == 40
    assert client.post("/predict", json={"inputs": ["a", "b", "c"]}).status_code == 413


def test_top_k_and_pooling_are_honoured_or_refused_never_ignored(client, clf, mlm):
    one = client.post("/classify", json={"inputs": ["a good book"], "top_k": 1}).json()
    assert len(one["predictions"][0]["probabilities"]) == 1
    assert len(clf(["a good book"], top_k=1)[0]["probabilities"]) == 1
    assert len(clf(["a good book"])[0]["probabilities"]) == 2  # no top_k: every label, whatever the server's
    got = client.post("/classify", json={"inputs": ["a good book"], "pooling": "cls"})
    assert got.status_code == 422 and "pooling applies to embeddings, not to the classification head" in \
        got.json()["error"]
    with pytest.raises(InputError, match="pooling applies to embeddings"):
        mlm(["a [MASK] ."], pooling="cls")
    with pytest.raises(InputError, match="top_k must be an integer >= 1, got 2.5"):
        mlm.fill_mask(["a [MASK] ."], top_k=2.5)
    with pytest.raises(InputError, match="normalize must be true or false, got 'no'"):
        clf.embed(["a good book"], normalize="no")


@pytest.mark.parametrize("inputs, message", [
    (None, "expected a text, a pair .* or a list of them, got NoneType None"),
    (7, "got int 7"),
    ([], "no inputs: nothing to predict"),
])
def test_inputs_that_are_no_text_get_one_line(clf, inputs, message):
    with pytest.raises(InputError, match=message):
        clf.classify(inputs)
    with pytest.raises(InputError, match=message):
        clf.embed(inputs)
