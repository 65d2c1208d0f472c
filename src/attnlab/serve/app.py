"""The HTTP routes of `attnlab serve` (FastAPI): OpenAI's /v1 API, /health, /metrics and the chat page.

    POST /v1/chat/completions   messages -> the model's chat template; stream (SSE) or not
    POST /v1/completions        a prompt string (or token ids); stream or not
    POST /v1/embeddings         the encoder's normalised mean-pooled vectors (attnlab.embed)
    GET  /v1/models[/{id}]      the served models, by the names they were given
    GET  /health, GET /metrics  liveness (503 while draining); Prometheus text
    GET  /                      the chat page (chat.html, self-contained)

Every failure answers an OpenAI error object (errors.py) with its status: 400 for a bad field,
401 without the API key, 404 for an unknown model or route, 413 for a body over the limit, 429
with Retry-After on a full queue, 503 while shutting down; nothing answers a traceback.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass, field
from importlib.resources import files

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from attnlab.embed import embed
from attnlab.serve import responses
from attnlab.serve.errors import APIError, error_body, status_phrase
from attnlab.serve.generation import LanguageModel, TextRun
from attnlab.serve.metrics import ServerMetrics
from attnlab.serve.schemas import ChatRequest, CompletionRequest, EmbeddingRequest, parse

log = logging.getLogger("attnlab.serve")
CHAT_PAGE = files("attnlab.serve").joinpath("chat.html").read_text(encoding="utf-8")
ROUTES = ("/", "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class ServerState:
    """What the routes serve.

    lm: the causal LM (or None: embeddings only). embedder: load.Loaded of an encoder, or None.
    embed_name: the id of the embedder. api_key: required as `Authorization: Bearer KEY` on /v1
    routes, or None. max_body: the largest request body in bytes (413 beyond).
    """

    lm: LanguageModel | None
    embedder: object | None = None
    embed_name: str | None = None
    api_key: str | None = None
    max_body: int = 4 << 20
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    draining: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    embed_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="attnlab", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
    app.add_middleware(CountRequests, metrics=state.metrics)

    @app.get("/", include_in_schema=False)
    async def chat_page():
        return HTMLResponse(CHAT_PAGE, headers={"Content-Security-Policy": "default-src 'self'; "
                                                "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"})

    @app.get("/health")
    async def health():
        waiting, running = state.lm.scheduler.load() if state.lm else (0, 0)
        body = {"status": "draining" if state.draining else "ok", "waiting": waiting, "running": running,
                "engine": state.lm.scheduler.engine.name if state.lm else None}
        return JSONResponse(body, status_code=503 if state.draining else 200)

    @app.get("/metrics")
    async def metrics():
        text, kind = state.metrics.render()
        return Response(text, media_type=kind)

    app.include_router(_v1(state), prefix="/v1", dependencies=[Depends(_key_check(state))])
    return app


def _v1(state: ServerState) -> APIRouter:
    router = APIRouter()

    @router.get("/models")
    async def models():
        return {"object": "list", "data": _cards(state)}

    @router.get("/models/{model_id:path}")
    async def model(model_id: str):
        for card in _cards(state):
            if card["id"] == model_id:
                return card
        raise _unknown_model(model_id, state)

    @router.post("/chat/completions")
    async def chat_completions(request: Request):
        req = parse(ChatRequest, await _body(request, state))
        lm = _lm_for(req.model, state)
        return await _answer(request, lm.start(lm.chat(req)), responses.Shapes("chat", req.model), req)

    @router.post("/completions")
    async def completions(request: Request):
        req = parse(CompletionRequest, await _body(request, state))
        lm = _lm_for(req.model, state)
        return await _answer(request, lm.start(lm.completion(req)), responses.Shapes("text", req.model), req)

    @router.post("/embeddings")
    async def embeddings(request: Request):
        req = parse(EmbeddingRequest, await _body(request, state))
        if state.draining:
            raise APIError(503, "the server is shutting down", code="shutting_down")
        if state.embedder is None or req.model != state.embed_name:
            if state.lm is not None and req.model == state.lm.name:
                raise APIError(400, f"{req.model!r} is a language model; embeddings need the encoder "
                               + (f"{state.embed_name!r}" if state.embedder else "given with --embed-model"),
                               param="model", code="model_not_embedding")
            raise _unknown_model(req.model, state)
        tokenizer = state.embedder.tokenizer
        limit = state.embedder.max_seq_len or 512
        encoded = tokenizer.encode_batch(req.input)
        too_long = next((i for i, e in enumerate(encoded) if len(e.ids) > limit), None)
        if too_long is not None:  # OpenAI's answer (attnlab embed truncates, with a warning)
            raise APIError(400, f"'input[{too_long}]' has {len(encoded[too_long].ids)} tokens; this model's context "
                           f"is {limit} tokens", param="input", code="context_length_exceeded")
        width = state.embedder.model.cfg.d_model
        if req.dimensions is not None and req.dimensions != width:
            raise APIError(400, f"'dimensions' must be {width} for {req.model!r} (its vectors are not made to be "
                           f"cut), got {req.dimensions}", param="dimensions", code="invalid_value")
        tokens = sum(len(e.ids) for e in encoded)
        async with state.embed_lock:  # one encoder call at a time, off the event loop
            vectors = await run_in_threadpool(embed, state.embedder, req.input)
        return responses.embeddings(vectors.numpy().astype(np.float32), req.model, tokens, req.encoding_format)

    return router


def _cards(state: ServerState) -> list[dict]:
    cards = [responses.model_card(state.lm.name, state.created, "text-generation")] if state.lm else []
    if state.embedder is not None:
        cards.append(responses.model_card(state.embed_name, state.created, "embedding"))
    return cards


def _unknown_model(name: str, state: ServerState) -> APIError:
    served = ", ".join(repr(c["id"]) for c in _cards(state))
    return APIError(404, f"the model {name!r} does not exist here; this server serves {served}", param="model",
                    code="model_not_found")


def _lm_for(name: str, state: ServerState) -> LanguageModel:
    if state.draining:
        raise APIError(503, "the server is shutting down", code="shutting_down")
    if state.lm is None or name != state.lm.name:
        if state.embedder is not None and name == state.embed_name:
            raise APIError(400, f"{name!r} is an embedding model; it does not generate text", param="model",
                           code="model_not_chat")
        raise _unknown_model(name, state)
    return state.lm


async def _body(request: Request, state: ServerState) -> bytes:
    """The request body, refused with 413 once it passes state.max_body (by Content-Length or as read)."""
    too_big = APIError(413, f"the request body is over the limit of {state.max_body} bytes", code="body_too_large")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > state.max_body:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > state.max_body:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _key_check(state: ServerState):
    expected = state.api_key.encode() if state.api_key else None

    async def check(request: Request) -> None:
        if expected is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        # constant time: the comparison does not stop at the first differing byte
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise APIError(401, "a valid API key is required: send `Authorization: Bearer KEY`",
                           code="invalid_api_key")
    return check


async def _answer(request: Request, run: TextRun, shapes: responses.Shapes, req):
    if req.stream:
        return EventStream(run, _events(run, shapes, req.include_usage()))
    pieces: list[str] = []
    collect = asyncio.ensure_future(_collect(run, pieces))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({collect, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not collect.done():  # the client went away: free its slot at the next step
            collect.cancel()
            run.cancel()
    if not collect.done() or collect.cancelled():
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    collect.result()  # an engine failure raises here
    return shapes.complete("".join(pieces), run.finish_reason, run.prompt_tokens, run.completion_tokens)


async def _collect(run: TextRun, pieces: list[str]) -> None:
    async for piece in run.pieces():
        pieces.append(piece)


async def _disconnected(request: Request) -> None:
    """Return once the client has closed the connection (the body was read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _events(run: TextRun, shapes: responses.Shapes, with_usage: bool):
    """The server-sent events of a streamed completion: (chat) the role, the pieces, the closing
    chunk with finish_reason, (with_usage) the usage, then [DONE]. An engine failure is an error event."""
    try:
        if shapes.kind == "chat":
            yield responses.sse(shapes.chunk("", first=True, with_usage=with_usage))
        async for piece in run.pieces():
            yield responses.sse(shapes.chunk(piece, with_usage=with_usage))
        yield responses.sse(shapes.chunk(None, run.finish_reason, with_usage=with_usage))
        if with_usage:
            yield responses.sse(shapes.usage_chunk(run.prompt_tokens, run.completion_tokens))
    except APIError as e:
        yield responses.sse(e.body())
    finally:
        run.cancel()  # the client went away mid-stream: its slot is freed at the next step
    yield responses.DONE


class EventStream(StreamingResponse):
    """A text/event-stream response that cancels its run however the response ends (also when the
    client left before the first event, so the body was never iterated)."""

    def __init__(self, run: TextRun, events):
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self.run = run

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.run.cancel()


class CountRequests:
    """ASGI middleware: counts every answered request by route and status (ServerMetrics.request)."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500}

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            path = scope["path"]
            route = "/v1/models/{model}" if path.startswith("/v1/models/") else path if path in ROUTES else "other"
            self.metrics.request(route, status["code"])


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    message = f"{request.method} {request.url.path}: {status_phrase(exc.status_code)}"
    code = {404: "unknown_route", 405: "method_not_allowed"}.get(exc.status_code)
    return JSONResponse(error_body(exc.status_code, message, None, code), status_code=exc.status_code,
                        headers=getattr(exc, "headers", None))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return JSONResponse(error_body(500, "internal server error (the server's log has the cause)", None,
                                   "internal_error"), status_code=500)
