"""``bertforge serve``: a checkpoint's head as a small HTTP service (Starlette on uvicorn), JSON in and
out (routes, limits, errors: docs/interop.md). Each request runs in a worker thread, the requests taking
turns batch by batch in arrival order (`take_turns`), so a short one waits for one batch of a long one.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from bertforge.serving.predictor import POOLINGS, InputError, Predictor, parse_input, take_turns

__all__ = ["create_app", "serve", "HEAD_ROUTES", "MAX_BATCH", "MAX_REQUEST_BYTES", "MAX_REQUEST_TOKENS",
           "MAX_DEPTH"]

logger = logging.getLogger("bertforge")

MAX_BATCH = 32  # inputs per request, by default
MAX_REQUEST_BYTES = 1 << 20  # bytes of a request body, by default (1 MiB)
MAX_REQUEST_TOKENS = 16384  # tokens of a request, by default (32 inputs of 512), as the model runs them
MAX_DEPTH = 32  # JSON nesting a request body may have (a request needs 4: body, inputs, input, choices)
HEAD_ROUTES = {"fill-mask": "/fill-mask", "classification": "/classify", "tagging": "/tag", "qa": "/answer",
               "multiple-choice": "/choose", "embeddings": "/embed"}
_KEYS = ("inputs", "top_k", "pooling")


def _unservable(data: Any) -> str:
    """Why a parsed body cannot be served ("" if it can): nesting deeper than `MAX_DEPTH`, or a lone
    surrogate (JSON's ``"\\ud800"``), which no UTF-8 text holds. Walked without recursion, for any depth."""
    if isinstance(data, str) and not _is_utf8(data):
        return f"the body has a lone surrogate ({ascii(data)[:80]}): not valid Unicode text"
    stack = [(data, 1, "the body")]  # the objects and lists still to look into
    while stack:
        x, depth, where = stack.pop()
        if not isinstance(x, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            return f"the body nests JSON deeper than {MAX_DEPTH} levels"
        for k, v in x.items() if isinstance(x, dict) else enumerate(x):
            if isinstance(k, str) and not _is_utf8(k):
                return f"a key of {where} has a lone surrogate ({ascii(k)[:80]}): not valid Unicode text"
            if isinstance(v, str) and not _is_utf8(v):
                return f"{where}[{json.dumps(k)}] has a lone surrogate ({ascii(v)[:80]}): not valid Unicode text"
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1, f"{where}[{json.dumps(k)}]"))
    return ""


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_type(x: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(x), "a number")


class _Service:
    """One application's predictor, limits, defaults and handlers (importing Starlette only when used)."""

    def __init__(self, predictor: Predictor, *, max_batch: int, max_request_bytes: int, max_request_tokens: int,
                 top_k: int, pooling: str):
        if min(max_batch, max_request_bytes, max_request_tokens) < 1:
            raise ValueError(f"max_batch, max_request_bytes and max_request_tokens must be >= 1, got {max_batch}, "
                             f"{max_request_bytes} and {max_request_tokens}")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.predictor = predictor
        self.max_batch = max_batch
        self.max_request_bytes = max_request_bytes
        self.max_request_tokens = max_request_tokens
        self.top_k, self.pooling = top_k, pooling
        self.heads = list(dict.fromkeys([predictor.head, "embeddings"]))  # the model's, and any checkpoint's
        self.posts = ["/predict", *(HEAD_ROUTES[h] for h in self.heads)]

    # -------------------------------------------------------------------- a request
    async def read_json(self, request: Any) -> Any:
        """The request's body parsed, within ``max_request_bytes`` and servable (`_unservable`)."""
        from starlette.exceptions import HTTPException

        limit = self.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise HTTPException(413, f"the request body has {int(declared):,} bytes; the limit is "
                                     f"{limit:,} (--max-request-bytes)")
        body = bytearray()
        async for chunk in request.stream():  # the declared length may be absent (chunked) or wrong
            body += chunk
            if len(body) > limit:
                raise HTTPException(413, f"the request body exceeds the limit of {limit:,} bytes "
                                         "(--max-request-bytes)")
        try:
            data = json.loads(bytes(body))
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise HTTPException(400, f"the body is not valid JSON ({e}); send {{\"inputs\": [...]}}") from None
        except RecursionError:
            raise HTTPException(400, f"the body nests JSON deeper than {MAX_DEPTH} levels") from None
        if problem := _unservable(data):
            raise HTTPException(400, problem)
        return data

    def parse(self, data: Any, head: str) -> tuple[list[Any], dict[str, Any]]:
        """A parsed body -> (its inputs, the options of the predictor's call for ``head``): ``top_k`` (fill-mask,
        the server's default unless given; classification, where given) and ``pooling`` (embeddings); an
        option given to a head that reads none is refused by the predictor (422)."""
        from starlette.exceptions import HTTPException

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
        if len(inputs) > self.max_batch:
            raise HTTPException(413, f"{len(inputs):,} inputs; the limit is {self.max_batch:,} per request "
                                     "(--max-batch)")
        options: dict[str, Any] = {}
        if "top_k" in data or head == "fill-mask":
            k = options["top_k"] = data.get("top_k", self.top_k)
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise HTTPException(400, f"\"top_k\" must be an integer >= 1, got {json.dumps(k)}")
        if "pooling" in data or head == "embeddings":
            how = options["pooling"] = data.get("pooling", self.pooling)
            if how not in POOLINGS:
                raise HTTPException(400, f"\"pooling\" must be one of {', '.join(POOLINGS)}, got {json.dumps(how)}")
        return inputs, options

    def predict(self, inputs: list[Any], head: str, options: dict[str, Any]) -> list[dict[str, Any]]:
        """The predictor's records for ``inputs`` once their tokens are within the limit (in a thread)."""
        from starlette.exceptions import HTTPException

        texts = [parse_input(x, i) for i, x in enumerate(inputs)]  # InputError: 422, as the predictor's
        pieces = iter(map(len, self.predictor.tokenizer.encode_batch_ids([t for group in texts for t in group])))
        tokens = 0
        for group in texts:
            lengths = [next(pieces) for _ in group]
            if head == "multiple-choice":  # [CLS] context [SEP] choice [SEP], once per choice
                tokens += sum(lengths[0] + n + 3 for n in lengths[1:])
            else:
                tokens += sum(lengths) + len(group) + 1
        if tokens > self.max_request_tokens:
            raise HTTPException(413, f"{tokens:,} tokens; the limit is {self.max_request_tokens:,} per request "
                                     "(--max-request-tokens): send fewer or shorter inputs")
        return self.predictor(inputs, head=head, **options)

    # -------------------------------------------------------------------- the handlers
    def endpoint(self, head: str | None) -> Any:
        """The handler of a POST route: ``head``'s records (None: the model's own head)."""
        from starlette.concurrency import run_in_threadpool
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse

        name = head or self.predictor.head

        async def handle(request: Any) -> Any:
            inputs, options = self.parse(await self.read_json(request), name)
            try:
                records = await run_in_threadpool(self.predict, inputs, name, options)
            except InputError as e:
                raise HTTPException(422, str(e)) from None
            return JSONResponse({"head": name, "predictions": records})

        return handle

    async def health(self, request: Any) -> Any:
        import torch
        from starlette.responses import JSONResponse

        from bertforge.fast.int8 import int8_kernel

        p = self.predictor
        runs = {"int8_kernel": int8_kernel()} if p.precision == "int8" else {}
        return JSONResponse({"status": "ok", "model": p.name, "head": p.head, "device": str(p.device),
                             "precision": p.precision,  # int8: the dense layers; dtype: the rest's
                             **runs, **({"precision_note": p.precision_note} if p.precision_note else {}),
                             "dtype": str(p.autocast or torch.float32).removeprefix("torch."),
                             "labels": p.labels, "routes": ["GET /health", *(f"POST {r}" for r in self.posts)],
                             "limits": {"max_batch": self.max_batch, "max_request_bytes": self.max_request_bytes,
                                        "max_request_tokens": self.max_request_tokens}})

    async def http_error(self, request: Any, exc: Exception) -> Any:
        from starlette.exceptions import HTTPException
        from starlette.responses import JSONResponse

        assert isinstance(exc, HTTPException)
        message = exc.detail
        if exc.status_code in (404, 405):
            message = (f"no route {request.method} {request.url.path}; this model ({self.predictor.head}) answers "
                       f"GET /health and POST {', '.join(self.posts)}")
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @staticmethod
    async def server_error(request: Any, exc: Exception) -> Any:
        from starlette.responses import JSONResponse

        logger.exception("bertforge serve: %s %s failed", request.method, request.url.path)
        return JSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)


def create_app(predictor: Predictor, *, max_batch: int = MAX_BATCH, max_request_bytes: int = MAX_REQUEST_BYTES,
               max_request_tokens: int = MAX_REQUEST_TOKENS, top_k: int = 5, pooling: str = "mean") -> Any:
    """The Starlette application serving ``predictor``; ``top_k`` and ``pooling``: requests' defaults."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    predictor.check_pooling(pooling)  # the default every request without its own pooling gets: refused now
    service = _Service(predictor, max_batch=max_batch, max_request_bytes=max_request_bytes,
                       max_request_tokens=max_request_tokens, top_k=top_k, pooling=pooling)
    take_turns(predictor)
    routes = [Route("/health", service.health, methods=["GET"]),
              Route("/predict", service.endpoint(None), methods=["POST"])]
    routes += [Route(HEAD_ROUTES[h], service.endpoint(h), methods=["POST"]) for h in service.heads]
    return Starlette(routes=routes,
                     exception_handlers={HTTPException: service.http_error, Exception: service.server_error})


def serve(predictor: Predictor, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          **options: Any) -> None:
    """Serve ``predictor`` with uvicorn until interrupted (Ctrl-C / SIGTERM); ``options``: `create_app`'s."""
    import uvicorn

    app = create_app(predictor, **options)
    logger.info(f"bertforge serve: {predictor.name} ({predictor.head}, {predictor.device}) on http://{host}:{port} "
                "(GET /health, POST /predict)")
    uvicorn.run(app, host=host, port=port, log_level=log_level)
