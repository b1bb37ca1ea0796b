"""``bertforge serve``: a checkpoint's head as a small HTTP service (Starlette on uvicorn), JSON in
and out, for programs that want to call a model.

    bertforge serve runs/sst2/best --port 8000
    curl -s localhost:8000/predict -d '{"inputs": ["a gripping film", "a dull one"]}'
    {"head":"classification","predictions":[{"index":0,"text":"a gripping film","label":"1","score":0.97,...},...]}

Routes:

    GET  /health     {"status": "ok", "model", "head", "device", "dtype", "labels", "routes", "limits"}
    POST /predict    {"inputs": [...], "top_k": 5, "pooling": "mean"} -> {"head", "predictions": [...]}
    POST /fill-mask, /classify, /tag, /answer, /choose    the same, on the route of the model's own head
    POST /embed      pooled sentence embeddings of any checkpoint ("pooling": mean, cls or pooler)

Inputs are what `bertforge.serving.predictor.parse_input` reads: strings (``"a ||| b"`` for a pair,
``"question ||| context"`` for QA), lists of strings, or objects (``{"text", "text_pair"}``,
``{"question", "context"}``, ``{"context", "choices"}``); a single input may stand without its list.
The predictions are `bertforge.serving.predictor.Predictor`'s records, one per input, in order.

Errors are JSON ``{"error": message}``: 400 for a body that is not a JSON object with ``inputs``
(or a bad ``top_k`` / ``pooling``, or an unknown key); 413 for a body over ``max_request_bytes`` or
more inputs than ``max_batch``; 422 for inputs the model cannot take (none at all, no [MASK] for
fill-mask, a fill-mask text longer than the model's positions, a QA input without its context, an
input of the wrong type), naming the input; 404 and 405 for unknown routes and methods.

Each request's inputs run as one batched call, in a worker thread so the server keeps accepting
connections; a lock lets one call use the model at a time, so concurrent requests are safe (and
the machine's cores go to one forward pass rather than several fighting over them).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from bertforge.serving.predictor import POOLINGS, InputError, Predictor

__all__ = ["create_app", "serve", "HEAD_ROUTES", "MAX_BATCH", "MAX_REQUEST_BYTES"]

logger = logging.getLogger("bertforge")

MAX_BATCH = 32
"""Inputs per request, by default."""
MAX_REQUEST_BYTES = 1 << 20
"""Bytes of a request body, by default (1 MiB)."""
HEAD_ROUTES = {"fill-mask": "/fill-mask", "classification": "/classify", "tagging": "/tag", "qa": "/answer",
               "multiple-choice": "/choose", "embeddings": "/embed"}
_KEYS = ("inputs", "top_k", "pooling")


def _json_type(x: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(x), "a number")


def create_app(predictor: Predictor, *, max_batch: int = MAX_BATCH, max_request_bytes: int = MAX_REQUEST_BYTES,
               top_k: int = 5, pooling: str = "mean") -> Any:
    """The Starlette application serving ``predictor`` (module docstring); ``top_k`` and ``pooling``
    are the defaults of requests that do not name them."""
    import torch
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    if max_batch < 1 or max_request_bytes < 1:
        raise ValueError(f"max_batch and max_request_bytes must be >= 1, got {max_batch} and {max_request_bytes}")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
    lock = threading.Lock()
    heads = dict.fromkeys([predictor.head, "embeddings"])
    posts = ["/predict", *(HEAD_ROUTES[h] for h in heads)]

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_request_bytes:
            raise HTTPException(413, f"the request body has {int(declared):,} bytes; the limit is "
                                     f"{max_request_bytes:,} (--max-request-bytes)")
        body = bytearray()
        async for chunk in request.stream():  # the declared length may be absent (chunked) or wrong
            body += chunk
            if len(body) > max_request_bytes:
                raise HTTPException(413, f"the request body exceeds the limit of {max_request_bytes:,} bytes "
                                         "(--max-request-bytes)")
        try:
            return json.loads(bytes(body))
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise HTTPException(400, f"the body is not valid JSON ({e}); send {{\"inputs\": [...]}}") from None

    def parse(data: Any) -> tuple[list[Any], dict[str, Any]]:
        if not isinstance(data, dict):
            raise HTTPException(400, "expected a JSON object such as {\"inputs\": [\"text\"]}, got "
                                     + _json_type(data))
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise HTTPException(400, f"unknown keys: {', '.join(unknown)} (known: {', '.join(_KEYS)})")
        if "inputs" not in data:
            raise HTTPException(400, "no \"inputs\": send {\"inputs\": [\"text\", ...]}")
        inputs = data["inputs"]
        if isinstance(inputs, (str, dict)):
            inputs = [inputs]
        if not isinstance(inputs, list):
            raise HTTPException(400, f"\"inputs\" must be a list, got {_json_type(inputs)}")
        if not inputs:
            raise HTTPException(422, "\"inputs\" is empty: nothing to predict")
        if len(inputs) > max_batch:
            raise HTTPException(413, f"{len(inputs):,} inputs; the limit is {max_batch:,} per request (--max-batch)")
        k = data.get("top_k", top_k)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise HTTPException(400, f"\"top_k\" must be an integer >= 1, got {json.dumps(k)}")
        how = data.get("pooling", pooling)
        if how not in POOLINGS:
            raise HTTPException(400, f"\"pooling\" must be one of {', '.join(POOLINGS)}, got {json.dumps(how)}")
        return inputs, {"top_k": k, "pooling": how}

    def endpoint(head: str | None) -> Any:
        async def handle(request: Request) -> JSONResponse:
            inputs, options = parse(await read_json(request))
            name = head or predictor.head

            def call() -> list[dict[str, Any]]:
                with lock:
                    return predictor(inputs, head=name, **options)

            try:
                records = await run_in_threadpool(call)
            except InputError as e:
                raise HTTPException(422, str(e)) from None
            return JSONResponse({"head": name, "predictions": records})

        return handle

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": predictor.name, "head": predictor.head,
                             "device": str(predictor.device),
                             "dtype": str(predictor.autocast or torch.float32).removeprefix("torch."),
                             "labels": predictor.labels, "routes": ["GET /health", *(f"POST {r}" for r in posts)],
                             "limits": {"max_batch": max_batch, "max_request_bytes": max_request_bytes}})

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        message = exc.detail
        if exc.status_code in (404, 405):
            message = (f"no route {request.method} {request.url.path}; this model ({predictor.head}) answers "
                       f"GET /health and POST {', '.join(posts)}")
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("bertforge serve: %s %s failed", request.method, request.url.path)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    routes = [Route("/health", health, methods=["GET"]), Route("/predict", endpoint(None), methods=["POST"])]
    routes += [Route(HEAD_ROUTES[h], endpoint(h), methods=["POST"]) for h in heads]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: server_error})


def serve(predictor: Predictor, *, host: str = "127.0.0.1", port: int = 8000, max_batch: int = MAX_BATCH,
          max_request_bytes: int = MAX_REQUEST_BYTES, top_k: int = 5, pooling: str = "mean",
          log_level: str = "info") -> None:
    """Serve ``predictor`` with uvicorn until interrupted (Ctrl-C / SIGTERM)."""
    import uvicorn

    app = create_app(predictor, max_batch=max_batch, max_request_bytes=max_request_bytes, top_k=top_k,
                     pooling=pooling)
    logger.info(f"bertforge serve: {predictor.name} ({predictor.head}, {predictor.device}) on http://{host}:{port} "
                "(GET /health, POST /predict)")
    uvicorn.run(app, host=host, port=port, log_level=log_level)
