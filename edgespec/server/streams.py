"""How a job's events reach its client: a server-sent event stream, or one whole answer.

The worker's events cross threads through `Channel` (call_soon_threadsafe into an asyncio queue).
A client that goes away (a closed stream, or a dropped connection while waiting for a whole
answer) sets its job's cancel event: the engine stops at the next round, with both caches
consistent.

    channel = Channel(asyncio.get_running_loop())      # its emit goes in the Job
    JobStream(job, sse_events(parsed, job, channel, rid, created), sep="\n", ping=15)
    await collect(request, parsed, job, channel, rid, created)   # a whole answer (JSON)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from edgespec.server import responses as R
from edgespec.server.protocol import ParsedRequest
from edgespec.server.worker import Done, Failed, Job, Piece, WorkerEvent

# A non-streaming request learns at once that its client left (uvicorn says so); a server that
# answers "still here" at once is asked again after this long.
DISCONNECT_POLL_S = 0.5
RETRY_AFTER_S = 2  # a 503's Retry-After: the queue moves every few seconds


class Channel:
    """The worker's events for one job, handed to the event loop that serves its request."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue[WorkerEvent] = asyncio.Queue()

    def emit(self, event: WorkerEvent) -> None:
        """Called on the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class JobStream(EventSourceResponse):
    """The event stream of one job; however the response ends (done, the client gone before or
    after the first event, shutdown), the job is told to stop."""

    def __init__(self, job: Job, content: AsyncIterator[str], **kw: Any):
        super().__init__(content, **kw)
        self.job = job

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel.set()


def _dumps(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


async def sse_events(
    parsed: ParsedRequest, job: Job, channel: Channel, rid: str, created: int
) -> AsyncIterator[str]:
    """The SSE data lines: (chat) a role chunk, a chunk per round, the finish chunk, the usage
    chunk when asked, [DONE]. An error after the stream started is sent as an error object."""
    kind, model, with_usage = parsed.kind, parsed.model, parsed.include_usage
    try:
        if kind == "chat":
            yield _dumps(R.chunk(kind, rid, created, model, role=True, with_usage=with_usage))
        while True:
            event = await channel.queue.get()
            if isinstance(event, Piece):
                segs = list(event.segments)
                yield _dumps(
                    R.chunk(kind, rid, created, model, segments=segs, with_usage=with_usage)
                )
                continue
            if isinstance(event, Failed):
                yield _dumps(
                    R.error_json(event.message, error_type(event.status), None, event.code)
                )
                return
            finish = event.finish_reason
            yield _dumps(R.chunk(kind, rid, created, model, finish=finish, with_usage=with_usage))
            if with_usage:
                yield _dumps(R.chunk(kind, rid, created, model, usage=event.usage))
            break
        yield "[DONE]"
    finally:
        job.cancel.set()  # the client went away (or all is done: then it changes nothing)


async def collect(
    request: Request, parsed: ParsedRequest, job: Job, channel: Channel, rid: str, created: int
) -> Response:
    """Wait for the whole answer; a client that closes its connection meanwhile cancels the job
    at once (its events may keep coming without a pause, so waiting for a quiet moment to look
    would let an abandoned job run to its end)."""
    texts: list[str] = []
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        while True:
            event = await _next_event(channel, gone)
            if event is None:
                return Response(status_code=499)  # nobody will read it
            if isinstance(event, Piece):
                texts.extend(s.text for s in event.segments)
            elif isinstance(event, Failed):
                body = R.error_json(event.message, error_type(event.status), None, event.code)
                return error_response(body, event.status)
            else:
                return JSONResponse(_final(parsed, "".join(texts), event, rid, created))
    finally:
        gone.cancel()
        job.cancel.set()


async def _next_event(channel: Channel, gone: asyncio.Future[None]) -> WorkerEvent | None:
    """The job's next event, or None once `gone` (the client left) is done first."""
    if gone.done():
        return None
    if not channel.queue.empty():
        return channel.queue.get_nowait()
    getting = asyncio.ensure_future(channel.queue.get())
    await asyncio.wait((getting, gone), return_when=asyncio.FIRST_COMPLETED)
    if getting.done():
        return getting.result()
    getting.cancel()
    return None


async def _client_gone(request: Request) -> None:
    """Returns when the client has closed its connection. The body was read before, so the
    server's next message is the disconnect (uvicorn waits for it without polling); any other
    message is looked at again after a pause (a server that answers at once)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(DISCONNECT_POLL_S)


def _final(parsed: ParsedRequest, text: str, done: Done, rid: str, created: int) -> dict[str, Any]:
    build = R.chat_response if parsed.kind == "chat" else R.completion_response
    return build(rid, created, parsed.model, text, done.finish_reason, done.usage)


def error_type(status: int) -> str:
    return "invalid_request_error" if status < 500 else "server_error"


def error_response(body: dict[str, Any], status: int) -> JSONResponse:
    """An error body; a 503 says when to try again (Retry-After, as RFC 9110 suggests)."""
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return JSONResponse(body, status_code=status, headers=headers)
