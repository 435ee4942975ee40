"""What the worker takes and what it hands back: a Job, and its events (Piece* then one Done or
Failed). Kept apart from the worker so that the batching module (edgespec/server/batching.py)
and the worker (edgespec/server/worker.py) can share them."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from edgespec.config import GenerationConfig
from edgespec.server.responses import Usage
from edgespec.server.stops import Segment


@dataclass(frozen=True)
class Piece:
    """Answer text released by one round: one segment per token, with its kind."""

    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class Done:
    """The job ended: finish_reason 'stop' (EOS or a stop string), 'length', or 'cancelled'."""

    finish_reason: str
    usage: Usage


@dataclass(frozen=True)
class Failed:
    """The job could not run or broke off: an HTTP status and a one-line message."""

    status: int
    message: str
    code: str | None = None


WorkerEvent = Piece | Done | Failed


@dataclass
class Job:
    """One generation request. `emit` is called on the worker thread and must not block."""

    prompt: list[int]
    config: GenerationConfig
    stop: tuple[str, ...]
    emit: Callable[[WorkerEvent], None]
    cancel: threading.Event = field(default_factory=threading.Event)
    tokens: int = 0  # tokens generated so far (the worker thread counts them)


SHUTTING_DOWN = Failed(503, "the server is shutting down", "server_shutting_down")
