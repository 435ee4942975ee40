"""Connection limits that uvicorn does not enforce: a deadline for each request's head, and a cap
on open connections that a flood of idle ones cannot use to shut out real requests.

What uvicorn (0.3x-0.5x, h11 protocol) does and does not do, read from its source:
- `timeout_keep_alive` closes a connection idle *after* a response; a fresh connection that sends
  nothing, or half a request head, is never closed (and one byte after a response cancels it).
- `limit_concurrency` answers 503 once a whole request head has arrived, counting open
  connections, half-sent ones included: a flood of half-sent requests turns every real request
  into a 503, and the connections still hold file descriptors until the process runs out.
So each connection here gets a deadline of `timeout_s` for a complete request head (from when it
opened or its last response ended); at the cap, a new connection closes the connection that has
been least recently active among those idle (no request in flight) or waiting for the rest of
a request body (a head, then nothing: the app can do nothing for it until its body comes), and
is itself closed only when every open connection has a whole request in flight. A request head
and a body's bytes count as activity, so a slow upload that moves goes after stalled ones.

    guard = ConnectionGuard(max_connections=256, timeout_s=10.0)
    uvicorn.Config(app, http=guarded_h11(guard))
    guard.figures()   # {"open": 3, "timed_out": 0, "evicted": 0, "stalled": 0, "refused": 0}
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

EVENTS = {
    "timed_out": "closing connections that send no complete request within {timeout:g} s",
    "evicted": "{cap} connections open: closing the longest idle one for each new one",
    "stalled": "{cap} connections open: closing the one that has waited longest for its "
    "request body for each new one",
    "refused": "{cap} connections open, all with a request in flight: closing new ones",
}


class ConnectionGuard:
    """The open connections in order of last activity, and counts of what was closed and why.
    Each kind of event is logged once, on its first occurrence (`say`)."""

    def __init__(
        self, max_connections: int, timeout_s: float, say: Callable[[str], None] | None = None
    ):
        self.cap, self.timeout_s = max_connections, timeout_s
        self.open: dict[Any, None] = {}  # insertion order: least recently active first
        self.counts: Counter[str] = Counter()
        self._say = say or _stderr

    def figures(self) -> dict[str, int]:
        return {"open": len(self.open), **{kind: self.counts[kind] for kind in EVENTS}}

    def note(self, kind: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] == 1:
            line = EVENTS[kind].format(timeout=self.timeout_s, cap=self.cap)
            self._say(f"edgespec serve: {line} (said once; GET /health counts them)")

    def admit(self, conn: Any) -> bool:
        """Register a new connection; False when it must be closed (all others have a whole
        request in flight). At the cap, the least recently active of the connections without
        a whole request (idle, or waiting for the rest of a body) makes room: under a flood
        of stalled bodies a client that just connected is not the first to go."""
        if len(self.open) >= self.cap:
            victim = next((c for c in self.open if not c.busy() or c.waiting()), None)
            if victim is None:
                self.note("refused")
                return False
            self.note("stalled" if victim.busy() else "evicted")
            self.forget(victim)
            victim.drop()
        self.open[conn] = None
        return True

    def touch(self, conn: Any) -> None:
        """`conn` started a request or sent some of its body: it becomes the most recently
        active."""
        if conn in self.open:
            del self.open[conn]
            self.open[conn] = None

    def forget(self, conn: Any) -> None:
        self.open.pop(conn, None)


def guarded_h11(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol class under `guard`'s rules (pass it as uvicorn.Config's http)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11(H11Protocol):  # type: ignore[misc]
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if not guard.admit(self):
                self.drop()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            guard.forget(self)
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            idle = not self.busy()
            super().handle_events()
            if self.busy():  # a request head arrived (the app has it now), or body bytes
                if idle:
                    self._disarm()
                guard.touch(self)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's head has the same deadline
                guard.touch(self)  # a kept-alive client is not the first to make room

        def busy(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def waiting(self) -> bool:
            """Busy with a request whose body has not all arrived."""
            return self.busy() and self.conn.their_state is h11.SEND_BODY

        def drop(self) -> None:
            self._disarm()
            self.transport.close()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(guard.timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.busy() and not self.transport.is_closing():
                guard.note("timed_out")
                self.transport.close()

    return GuardedH11


class OncePerKind(logging.Filter):
    """Passes the first record of each kind (its message's first line) without its traceback,
    then drops the others of that kind: a flood of failed accepts or bad requests logs a line
    each, not a line (and a traceback) per failure."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.getMessage().splitlines() or [""])[0]
        if kind in self.seen:
            return False
        self.seen.add(kind)
        record.msg, record.args = f"{kind} (said once)", None
        record.exc_info = record.exc_text = None
        return True


def quiet_repeats(names: tuple[str, ...] = ("asyncio", "uvicorn.error")) -> OncePerKind:
    """Install one OncePerKind filter on these loggers; returns it."""
    once = OncePerKind()
    for name in names:
        logging.getLogger(name).addFilter(once)
    return once


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
