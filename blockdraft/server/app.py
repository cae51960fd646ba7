"""The HTTP layer: OpenAI-compatible routes over the batching worker, with limits, errors and metrics.

Routes: POST /v1/chat/completions and POST /v1/completions (whole JSON, or server-sent events ending with
`data: [DONE]` when `stream` is true), GET /v1/models, GET /health, GET /metrics (Prometheus text).
With an API key, the /v1 routes need `Authorization: Bearer <key>`; /health and /metrics stay open for probes.
/health answers 200 `{"status": "ok"}` once requests are served, and 503 with "warming" (step costs being measured
at a first start, warmup.py), "draining" (shutting down, shutdown.py) or "worker stopped".

Every response carries an `x-request-id` header. Errors are OpenAI-shaped JSON,
`{"error": {"message", "type", "param", "code", "request_id"}}`: 400 for a request we refuse (naming the field),
401 for a wrong key, 404 for an unknown route or model, 413 for a body over the limit, 429 (with Retry-After) when
`max_queue` requests are waiting already, 500 when decoding failed (the worker survives; the id finds the
traceback in the log), 503 while shutting down, 504 for a request not finished within `request_timeout` seconds.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from jinja2.exceptions import TemplateError
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from ..api import encode
from ..errors import ConfigError, InputError
from ..decode.decoder import Decoder
from ..decode.options import DecodeOptions
from ..io.prompts import encode_prompt
from .prometheus import ServerMetrics
from .responses import Answer
from .schema import ApiError, ChatCompletionRequest, CompletionFields, CompletionRequest, Reply, Usage
from .worker import Closed, QueueFull, Worker

PYTHON_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "function-after"}  # pydantic union branches
RETRY_AFTER_SECONDS = 2  # what a 429 asks a client to wait: about one short batch on a small CPU
READY_WAIT_SECONDS = 2.0  # how long startup waits for cached step costs, so a warm machine never shows "warming"


def create_app(target, draft, *, model_id: str | None = None, api_key: str | None = None, max_batch: int = 8,
               max_tokens_limit: int = 4096, max_body_bytes: int = 1 << 20, max_queue: int = 64,
               request_timeout: float | None = None, options: DecodeOptions | None = None,
               measure_costs: bool = False) -> FastAPI:
    """The server app for one target (and draft, or None for the target alone); the worker runs in its lifespan.

    `options` is how every request decodes (decode/options.py; None: the defaults, adaptive token trees with
    lookups grafted on); each request brings its own sampling parameters. At most `max_queue` requests wait for
    a row; `request_timeout` (seconds, None: no limit) ends a request not finished by then, and frees its row.
    The step costs are measured in the worker thread after startup (warmup.py), so the app is built at once;
    `measure_costs` measures them again instead of reading the cached ones.
    """
    service = Service(Decoder(target, draft, options, measure_costs=measure_costs), model_id=model_id, api_key=api_key, max_batch=max_batch,
                      max_tokens_limit=max_tokens_limit, max_body_bytes=max_body_bytes, max_queue=max_queue,
                      request_timeout=request_timeout)

    @asynccontextmanager
    async def lifespan(_app):
        service.worker.start()
        # Costs read from the disk cache take a moment: wait for them so that a warm restart is "ok" when it
        # listens; a first measurement (minutes) goes on in the background while /health says "warming".
        await asyncio.to_thread(service.worker.warmed_once.wait, READY_WAIT_SECONDS)
        yield
        await asyncio.to_thread(service.worker.stop)

    app = FastAPI(title="blockdraft", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(Observe, metrics=service.worker.metrics)
    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
    keyed = [Depends(service.authorize)]
    app.add_api_route("/v1/chat/completions", service.chat_completions, methods=["POST"], dependencies=keyed)
    app.add_api_route("/v1/completions", service.completions, methods=["POST"], dependencies=keyed)
    app.add_api_route("/v1/models", service.models, methods=["GET"], dependencies=keyed)
    app.add_api_route("/health", service.health, methods=["GET"])
    app.add_api_route("/metrics", service.prometheus, methods=["GET"])
    app.state.worker = service.worker
    return app


class Service:
    """The route handlers, over one target, its worker and the server's limits."""

    def __init__(self, decoder: Decoder, *, model_id, api_key, max_batch, max_tokens_limit, max_body_bytes,
                 max_queue, request_timeout) -> None:
        target = decoder.target
        if target.tokenizer is None:
            raise ConfigError("the server needs the target's tokenizer to read prompts and write text, and the "
                              "target has none; load it with blockdraft.load_target, which loads both")
        if min(max_batch, max_tokens_limit, max_body_bytes) < 1:
            raise ConfigError(f"--max-batch ({max_batch}), --max-tokens-limit ({max_tokens_limit}) and the body "
                              f"limit ({max_body_bytes}) must be positive; pass values of at least 1")
        if max_queue < 1:
            raise ConfigError(f"--max-queue must be at least 1 (requests that may wait), got {max_queue}; pass 1 or "
                              "more (default 64)")
        if request_timeout is not None and not request_timeout > 0:
            raise ConfigError(f"--request-timeout must be a positive number of seconds, got {request_timeout}; "
                              "pass e.g. 300, or leave it out for no limit")
        self.target = target
        self.model_id = model_id or target.name or "blockdraft"
        self.api_key = api_key
        self.max_tokens_limit = max_tokens_limit
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout
        self.worker = Worker(decoder, max_batch=max_batch, max_queue=max_queue)
        self.started = int(time.time())

    async def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        # compare_digest: the time taken must not reveal how many leading characters of a guess were right.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key; send `Authorization: Bearer <key>` with the key the "
                           "server was started with (--api-key)", code="invalid_api_key")

    async def chat_completions(self, request: Request):
        body = await self._parse(request, ChatCompletionRequest)
        tokenizer = self.target.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "this model's tokenizer has no chat template, so chat messages cannot be encoded; "
                           "use /v1/completions with plain text", param="messages")
        try:
            prompt = encode_prompt(tokenizer, [m.as_dict() for m in body.messages])
        except TemplateError as error:
            raise ApiError(400, f"the chat template refused the messages: {error}; fix the message order or "
                           "roles", param="messages") from error
        return await self._complete(request, body, prompt, "messages", chat=True)

    async def completions(self, request: Request):
        body = await self._parse(request, CompletionRequest)
        if isinstance(body.prompt, str):
            try:
                prompt = encode(self.target, body.prompt, chat=False)
            except InputError as error:
                raise ApiError(400, str(error), param="prompt") from error
        else:
            prompt, vocab = body.prompt, self.target.config.vocab_size
            # An id outside the embedding would fail the whole batch, other requests included.
            if not all(0 <= i < vocab for i in prompt):
                raise ApiError(400, f"`prompt` token ids must lie in [0, {vocab}), the model's vocabulary, got "
                               f"min {min(prompt)}, max {max(prompt)}; send ids from its tokenizer", param="prompt")
        return await self._complete(request, body, prompt, "prompt", chat=False)

    async def models(self):
        card = {"id": self.model_id, "object": "model", "created": self.started, "owned_by": "blockdraft"}
        return {"object": "list", "data": [card]}

    async def health(self):
        worker, warmup = self.worker, self.worker.warmup
        if not worker.alive:
            status = "worker stopped"
        elif worker.closed:
            status = "draining"
        else:
            status = "ok" if warmup.rows else "warming"
        state = {"status": status, "model": self.model_id, "speculative": worker.decoder.speculative,
                 "block_size": worker.block_size, "queue_depth": worker.queue_depth,
                 "batch_rows_ready": warmup.rows, "max_batch": worker.max_batch}
        if warmup.error:
            state["error"] = warmup.error
        return JSONResponse(state, status_code=200 if status == "ok" else 503)

    async def prometheus(self):
        text = self.worker.metrics.render(self.worker.queue_depth, self.worker.active_rows)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def _parse(self, request: Request, model):
        body = parse(model, await read_json(request, self.max_body_bytes), self.max_tokens_limit)
        if body.model != self.model_id:
            raise ApiError(404, f"model `{body.model}` is not served here; this server serves `{self.model_id}` "
                           "(GET /v1/models)", param="model", code="model_not_found")
        return body

    async def _complete(self, request: Request, body: CompletionFields, prompt: list[int], field: str, chat: bool):
        max_tokens = check_context(prompt, body.max_tokens, self.target.max_positions, self.max_tokens_limit, field)
        request_id = request.state.request_id
        try:
            job = self.worker.submit(request_id, prompt, max_tokens, body.sampling(body.seed))
        except QueueFull as error:
            raise ApiError(429, f"the server is at capacity: {error}; retry after {RETRY_AFTER_SECONDS} s, or start "
                           "it with a larger --max-queue or --max-batch", code="queue_full",
                           headers={"retry-after": str(RETRY_AFTER_SECONDS)}) from error
        except Closed as error:
            raise ApiError(503, f"{error}; retry against a running server", code="unavailable") from error
        answer = Answer(job, Reply(request_id, self.model_id, chat), self.target.tokenizer, body.stop_strings(),
                        Usage(len(prompt)), self.worker.metrics, timeout=self.request_timeout)
        await answer.start()
        if body.stream:
            return answer.stream(body.stream_options is not None and body.stream_options.include_usage)
        return await answer.whole(request)


class Observe:
    """ASGI middleware: gives each request an id (state and `x-request-id` header) and records its metrics.

    Plain ASGI rather than BaseHTTPMiddleware, so that a stream is timed to its last byte and is not buffered.
    """

    def __init__(self, app, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = uuid.uuid4().hex[:24]
        scope.setdefault("state", {})["request_id"] = request_id
        start, status = time.perf_counter(), 500

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.metrics.observe_request(scope["path"], status, time.perf_counter() - start)


async def api_error(request: Request, error: ApiError):
    return JSONResponse(error.body(request.state.request_id), status_code=error.status, headers=error.headers)


async def http_error(request: Request, error: HTTPException):
    fix = "see GET /v1/models and the routes in the README" if error.status_code == 404 else "check the method"
    message = f"{error.detail}: {request.method} {request.url.path}; {fix}"
    return await api_error(request, ApiError(error.status_code, message))


async def unexpected_error(request: Request, error: Exception):
    # Starlette logs the traceback after this answer; the id in both ties the report to the log line.
    request_id = getattr(request.state, "request_id", "unknown")
    message = f"internal error ({type(error).__name__}); report request id {request_id}"
    # This handler runs outside the middleware that stamps every answer: stamp this one here.
    return JSONResponse(ApiError(500, message, code="internal_error").body(request_id), status_code=500,
                        headers={"x-request-id": request_id})


async def read_json(request: Request, limit: int) -> dict:
    """The body as a JSON object, read at most `limit` bytes far (413 beyond, whatever Content-Length says)."""
    declared = request.headers.get("content-length", "")
    too_big = ApiError(413, f"the request body is over this server's limit of {limit} bytes; send a shorter "
                       "prompt", code="request_too_large")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise too_big

    def refuse_constant(name):  # NaN and Infinity are not JSON; Python's parser accepts them by default
        raise ValueError(f"{name} is not valid JSON")

    try:
        data = json.loads(raw, parse_constant=refuse_constant)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, f"the request body is not valid JSON ({error}); send one JSON object",
                       code="invalid_json") from error
    except RecursionError as error:
        raise ApiError(400, "the request body nests its JSON too deeply to read; send a flat request object",
                       code="invalid_json") from error
    try:  # JSON may escape half a UTF-16 pair (\ud800); no tokenizer or UTF-8 answer can carry it
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise ApiError(400, "the request body holds a lone surrogate escape (\\ud800-\\udfff), which is not a "
                       "character; send valid Unicode text", code="invalid_json") from error
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(data).__name__}; send {{...}}",
                       code="invalid_json")
    return data


def parse(model, data: dict, max_tokens_limit: int):
    """Validate a request body; the first problem becomes a 400 naming the field."""
    try:
        return model.model_validate(data, context={"max_tokens_limit": max_tokens_limit})
    except ValidationError as error:
        problems = error.errors(include_url=False)
        kind, path = problems[0]["type"], _field_path(problems[0]["loc"])
        if kind == "extra_forbidden":
            raise ApiError(400, f"unknown field `{path}`; remove it (blockdraft serve refuses fields it does not "
                           "implement rather than ignoring them)", param=path, code="unknown_parameter") from None
        if kind in ("value_error", "unsupported_parameter"):
            message = problems[0]["msg"].removeprefix("Value error, ")
        else:  # a wrong type; a union field lists one complaint per accepted type
            same = [p["msg"] for p in problems if _field_path(p["loc"]) == path]
            got = repr(problems[0].get("input"))[:80]
            message = f"`{path}`: {' or '.join(dict.fromkeys(same))}, got {got}; see the OpenAI API reference"
        code = "unsupported_parameter" if kind == "unsupported_parameter" else "invalid_value"
        raise ApiError(400, message, param=path or None, code=code) from None


def _field_path(loc) -> str:
    """('messages', 0, 'content', 'str') -> 'messages[0].content': the union branch tag is dropped."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part not in PYTHON_TYPE_TAGS and "[" not in part:
            path += f".{part}" if path else part
    return path


def check_context(prompt: list[int], max_tokens: int | None, context: int, limit: int, field: str) -> int:
    """The request's token budget; a 400 with both lengths when prompt and budget do not fit the context.

    Without max_tokens (chat's default) the budget is the rest of the context, capped by the server's limit.
    """
    budget = max_tokens if max_tokens is not None else min(limit, context - len(prompt))
    needed = len(prompt) + max(budget, 1)
    if needed > context:
        asked = f"`max_tokens` is {max_tokens}" if max_tokens is not None else "at least 1 new token is needed"
        raise ApiError(400, f"the prompt has {len(prompt)} tokens and {asked}: {needed} positions, over the "
                       f"model's context of {context}; shorten the prompt or lower max_tokens",
                       param=field, code="context_length_exceeded")
    return budget
