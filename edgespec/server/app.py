"""The HTTP side: Starlette routes for the OpenAI-compatible API, on top of the MLX worker.

    POST /v1/chat/completions   POST /v1/completions   (JSON, or server-sent events with stream)
    GET  /v1/models             GET  /health           (answers while a generation runs)

Requests are validated (protocol.py) and tokenized here, off the event loop; only then is a job
queued, so every bad request gets its 4xx before any stream starts. The worker's events reach
the client through streams.py (a server-sent event stream, or one whole answer); a client that
goes away stops its job at the next round.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edgespec.config import GenerationConfig
from edgespec.errors import ContextLengthError, PromptError, check_context, one_line
from edgespec.server import responses as R
from edgespec.server.auth import ApiKeyMiddleware, authorized
from edgespec.server.limits import (
    INCOMPLETE_BODY,
    Limits,
    TextBound,
    read_body,
    refuse_certain_overflow,
)
from edgespec.server.local import HostRule, LocalOnly, is_json
from edgespec.server.protocol import (
    Defaults,
    ParsedRequest,
    RequestError,
    parse_body,
    parse_chat,
    parse_completion,
)
from edgespec.server.streams import Channel, JobStream, collect, error_response, sse_events
from edgespec.server.worker import (
    Job,
    QueueFullError,
    ShuttingDownError,
    Worker,
)

# On shutdown a running job ends at its next round and its stream sends "the server is shutting
# down"; a stream gets this long to do so before it is cut (under uvicorn's graceful timeout).
SHUTDOWN_GRACE_S = 4.0
GRACEFUL_SHUTDOWN_S = 5


@dataclass(frozen=True)
class ServerState:
    worker: Worker
    defaults: Defaults
    description: str
    created: int
    budget_bytes: int
    limits: Limits = Limits()
    bound: TextBound | None = None  # a floor on a text's token count (limits.py)
    connections: Callable[[], dict[str, int]] | None = None  # the guard's figures (guard.py)
    # Requests refused before they reached the worker (4xx), by status: GET /health's
    # "bad_request" adds them to the worker's own refusals.
    refused: Counter[int] = field(default_factory=Counter)
    # The longest prompt accepted (--max-prompt-tokens); None: what the context window holds.
    max_prompt_tokens: int | None = None
    # Tokenization runs in a thread pool; a Hugging Face fast tokenizer may refuse concurrent
    # calls ("Already borrowed"), so requests take turns (each takes a millisecond or so).
    tokenizing: threading.Lock = field(default_factory=threading.Lock)


def create_app(
    worker: Worker,
    defaults: Defaults,
    *,
    api_key: str | None = None,
    description: str = "",
    budget_bytes: int = 0,
    allow_origins: tuple[str, ...] = (),
    limits: Limits | None = None,
    connections: Callable[[], dict[str, int]] | None = None,
    hosts: HostRule | None = None,
    max_prompt_tokens: int | None = None,
) -> Starlette:
    """The ASGI app. `worker` must be started (its engine loaded). `allow_origins`: web pages
    (origins) whose scripts may call the API (CORS); none by default: a request carrying any
    other Origin is refused (local.py). `hosts`: the Host names it answers to (default: loopback
    names only). `connections`: figures that GET /health shows (the connection guard's).
    `max_prompt_tokens`: longer prompts are refused (400) before any work."""
    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={
            RequestError: _request_error,
            QueueFullError: _unavailable,
            ShuttingDownError: _unavailable,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
    )
    bound = TextBound.of(getattr(worker.engine, "tokenizer", None))  # none: no bound
    app.state.edgespec = ServerState(
        worker,
        defaults,
        description,
        R.now(),
        budget_bytes,
        limits or Limits(),
        bound,
        connections,
        max_prompt_tokens=max_prompt_tokens,
    )
    if api_key:
        app.add_middleware(ApiKeyMiddleware, key=api_key)
    if allow_origins:  # added last, so outermost: a preflight is answered before the key check
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(allow_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    # Added last, so outermost: a request for another Host or from a page not allowed is
    # refused before CORS, the key or any route sees it.
    app.add_middleware(LocalOnly, hosts=hosts or HostRule.of("127.0.0.1"), origins=allow_origins)
    return app


def _state(request: Request) -> ServerState:
    return request.app.state.edgespec  # type: ignore[no-any-return]


async def health(request: Request) -> JSONResponse:
    """Liveness, and with the key (or without one set) the server's figures."""
    s = _state(request)
    if not authorized(request.scope):
        return JSONResponse({"status": "ok"})
    cache = dict(s.worker.cache_info, budget_bytes=s.budget_bytes)
    return JSONResponse(
        {
            "status": "ok",
            "model": s.defaults.model_id,
            "busy": s.worker.busy,
            "running": s.worker.running,
            "queued": s.worker.queued,
            "requests": _counts(s),
            "cache": cache,
            "connections": s.connections() if s.connections else {},
        }
    )


def _counts(s: ServerState) -> dict[str, int]:
    """Requests by outcome: the worker's, and the bad requests refused before they reached it."""
    counts = dict(s.worker.counts)
    counts["bad_request"] = counts.get("bad_request", 0) + sum(s.refused.values())
    return counts


async def models(request: Request) -> JSONResponse:
    s = _state(request)
    return JSONResponse(R.models_json(s.defaults.model_id, s.created, s.description))


async def chat_completions(request: Request) -> Response:
    return await _complete(request, "chat")


async def completions(request: Request) -> Response:
    return await _complete(request, "completion")


async def _complete(request: Request, kind: str) -> Response:
    s = _state(request)
    if not is_json(request.headers.get("content-type")):
        raise RequestError(
            "send the request as JSON, with 'Content-Type: application/json'",
            status=415,
            code="unsupported_media_type",
        )
    with s.worker.arriving() as submit:  # a burst's first job waits (server/worker.py)
        body = parse_body(await read_body(request, s.limits))
        parsed = (parse_chat if kind == "chat" else parse_completion)(body, s.defaults)
        ids = await anyio.to_thread.run_sync(_tokenize_locked, s, parsed)
        channel = Channel(asyncio.get_running_loop())
        engine = s.worker.engine
        assert engine is not None  # create_app takes a started worker
        config = clamp_max_tokens(parsed.config, len(ids), engine.context_window)
        job = Job(ids, config, parsed.stop, channel.emit)
        submit(job)
    rid, created = R.new_id(kind), R.now()
    if parsed.stream:
        events = sse_events(parsed, job, channel, rid, created)
        return JobStream(job, events, sep="\n", ping=15, shutdown_grace_period=SHUTDOWN_GRACE_S)
    return await collect(request, parsed, job, channel, rid, created)


def clamp_max_tokens(config: GenerationConfig, prompt_tokens: int, window: int) -> GenerationConfig:
    """`config` with max_tokens at most what the context window leaves after the prompt, as
    OpenAI does (the answer then ends with finish_reason "length" when the window fills; the
    engine stops there anyway, so the text is the same). The batch sizes a request's cache from
    max_tokens: unclamped, max_tokens 1e12 made one request too large to run beside any other.

    clamp_max_tokens(GenerationConfig(max_tokens=10**12), 100, 8192).max_tokens -> 8092
    """
    room = max(1, window - prompt_tokens)
    return config if config.max_tokens <= room else replace(config, max_tokens=room)


def _tokenize_locked(s: ServerState, parsed: ParsedRequest) -> list[int]:
    with s.tokenizing:
        return tokenize(s.worker.engine, parsed, s.bound, s.max_prompt_tokens)


def tokenize(
    engine: Any,
    parsed: ParsedRequest,
    bound: TextBound | None = None,
    max_prompt: int | None = None,
) -> list[int]:
    """The request's prompt as token ids, checked against the model (no MLX is touched). With
    `bound`, a text certain to overflow the context window (or to pass `max_prompt` tokens) is
    refused before tokenizing."""
    param = "messages" if parsed.kind == "chat" else "prompt"
    try:
        if bound is not None:
            refuse_certain_overflow(engine, parsed, bound, param, max_prompt)
        if parsed.messages is not None:
            ids = engine.encode_chat(list(parsed.messages), think=parsed.think)
        elif isinstance(parsed.prompt, str):
            ids = engine.encode_raw(parsed.prompt, parse_special=parsed.parse_special)
        else:
            ids = list(parsed.prompt or ())
        check_context(len(ids), engine.context_window)  # before the token ids' range
        if max_prompt is not None and len(ids) > max_prompt:
            raise RequestError(
                f"the prompt is {len(ids)} tokens; this server takes at most {max_prompt} "
                "(edgespec serve --max-prompt-tokens)",
                param=param,
                code="context_length_exceeded",
            )
        return engine.check_prompt(ids)  # type: ignore[no-any-return]
    except ContextLengthError as exc:
        raise RequestError(str(exc), param=param, code="context_length_exceeded") from None
    except PromptError as exc:
        raise RequestError(str(exc), param=param) from None
    except (RequestError, MemoryError):
        raise
    except Exception as exc:  # a chat template that refuses these messages (jinja raises)
        raise RequestError(
            f"the chat template cannot format these messages: {one_line(exc)}"
        ) from None


async def _request_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestError)
    _state(request).refused[exc.status] += 1
    body = R.error_json(exc.message, exc.kind, exc.param, exc.code)
    # The body never came, was cut off, or is too large to read: the connection cannot carry
    # another request (a 413's upload would otherwise be read and discarded until the timeout).
    body_lost = exc.status in (408, 413) or exc.code == INCOMPLETE_BODY
    closing = {"Connection": "close"} if body_lost else None
    return JSONResponse(body, status_code=exc.status, headers=closing)


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    return error_response(R.error_json(str(exc), "server_error"), 503)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    message = {404: f"no such endpoint: {request.url.path}", 405: "method not allowed"}.get(
        exc.status_code, str(exc.detail)
    )
    return JSONResponse(R.error_json(message), status_code=exc.status_code)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    message = f"internal error: {one_line(exc, typed=True)}"
    return JSONResponse(R.error_json(message, "server_error"), status_code=500)
