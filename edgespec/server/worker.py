"""The one thread that owns the models: it loads the engine, then serves jobs first in, first out.

MLX streams belong to the thread that made them (docs/library.md), so loading and every generation run
on this thread; the HTTP side only submits jobs, sets their cancel events and reads what they emit.

    worker = Worker(loader, budget_bytes=1 << 30, max_slots=4)
    engine = worker.start()                  # blocks until loaded; raises the load error
    worker.submit(Job(ids, config, stops, emit))   # emit(Piece | Done | Failed), on this thread
    job.cancel.set()                         # any thread: stops at the next round boundary
    worker.shutdown()                        # running and queued jobs end with Failed(503)

A job emits Piece* then exactly one Done or Failed. A Piece is what one round released (after
stop-string holdback, stops.StopScanner); a stop string sets the job's cancel event, so the
engine stops after the round it is in, and the loops leave both caches holding committed tokens
only (tokens past the stop string included: the next request's prefix match rewinds past them).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgespec.config import GenerationConfig
from edgespec.errors import EdgeSpecError
from edgespec.events import Finished, Round, Token
from edgespec.server.prefix import ConversationPool
from edgespec.server.responses import Usage
from edgespec.server.stops import Segment, StopScanner


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


class Worker:
    """Owns the engine and its conversation pool; a bounded FIFO queue of jobs."""

    def __init__(
        self,
        loader: Callable[[], Any],
        *,
        budget_bytes: int,
        max_slots: int = 4,
        max_queue: int = 64,
    ):
        self._loader = loader
        self._budget, self._slots = budget_bytes, max_slots
        self._queue: queue.Queue[Job | None] = queue.Queue()
        # Jobs submitted and not yet ended (the running one included): the queue's own size would
        # count a job the thread has not taken yet as waiting, so a burst got one place fewer.
        self._max_queue, self._admitted, self._admit = max_queue, 0, threading.Lock()
        self._thread = threading.Thread(target=self._run, name="edgespec-mlx", daemon=True)
        self._ready = threading.Event()
        self._closing = threading.Event()
        self._load_error: BaseException | None = None
        self._running: Job | None = None
        self.engine: Any = None
        self.cache_info: dict[str, int] = {"conversations": 0, "bytes": 0}
        # Requests served so far, by outcome (GET /health shows them).
        self.counts = {"completed": 0, "cancelled": 0, "failed": 0}

    def start(self) -> Any:
        """Start the thread, wait until the engine is loaded and return it (or raise why not)."""
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise self._load_error
        return self.engine

    def submit(self, job: Job) -> None:
        """Queue a job behind the others. Raises QueueFullError when `max_queue` jobs wait
        besides the running one (however fast they came) and ShuttingDownError once the server
        is stopping (the job is then not queued)."""
        if self._closing.is_set():
            raise ShuttingDownError("the server is shutting down")
        with self._admit:
            if self._admitted > self._max_queue:
                raise QueueFullError(
                    f"the server is busy ({self._max_queue} requests waiting); retry later"
                )
            self._admitted += 1
        self._queue.put_nowait(job)

    def _end(self, job: Job, outcome: WorkerEvent | None) -> None:
        """Free the job's place, then emit its last event: a client that sends its next request
        as soon as it has the answer finds the place free."""
        with self._admit:
            self._admitted -= 1
        if outcome is not None:
            job.emit(outcome)

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    @property
    def busy(self) -> bool:
        return self._running is not None

    def close(self) -> None:
        """Refuse new jobs, end the running one at its next round and fail the queued ones (503).
        Does not wait: safe in a signal handler."""
        self._closing.set()
        running = self._running
        if running is not None:
            running.cancel.set()
        self._drain()
        self._queue.put_nowait(None)  # wakes the thread, which then ends

    def shutdown(self, timeout: float = 5.0) -> None:
        """close(), then wait up to `timeout` seconds for the thread to end."""
        self.close()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            engine = self._loader()
            pool = ConversationPool(engine, self._budget, self._slots)
        except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
            self._load_error = exc
            self._ready.set()
            return
        self.engine = engine
        self._ready.set()
        while (job := self._queue.get()) is not None:
            self._running = job
            try:
                if self._closing.is_set():
                    self._end(
                        job, Failed(503, "the server is shutting down", "server_shutting_down")
                    )
                elif job.cancel.is_set():  # a client gone while queued needs nothing
                    self.counts["cancelled"] += 1
                    self._end(job, None)
                else:
                    self._serve(engine, pool, job)
            finally:
                self._running = None
                self.cache_info = {"conversations": len(pool.slots), "bytes": pool.nbytes()}
        self._drain()

    def _drain(self) -> None:
        """Fail every job still queued (one that slipped in while closing): none is lost."""
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self._end(job, Failed(503, "the server is shutting down", "server_shutting_down"))

    def _serve(self, engine: Any, pool: ConversationPool, job: Job) -> None:
        outcome: WorkerEvent
        try:
            pool.acquire(job.prompt)
            outcome = self._generate(engine, job)
        except EdgeSpecError as exc:
            outcome = Failed(400, _line(exc))
        except Exception as exc:  # noqa: BLE001 - the backend failed; the server goes on
            outcome = Failed(500, f"generation failed: {type(exc).__name__}: {_line(exc)}")
        finally:
            pool.release()
        self._count(outcome)
        self._end(job, outcome)

    def _count(self, outcome: WorkerEvent) -> None:
        if isinstance(outcome, Failed):
            self.counts["failed"] += 1
        elif isinstance(outcome, Done) and outcome.finish_reason == "cancelled":
            self.counts["cancelled"] += 1
        else:
            self.counts["completed"] += 1

    def _generate(self, engine: Any, job: Job) -> WorkerEvent:
        """Run the job, emitting a Piece per round; returns its Done (or Failed on shutdown)."""
        scanner = StopScanner(job.stop)
        plain = not job.config.spec.enabled
        released: list[Segment] = []
        shown, kind = 0, "target"
        for event in engine.generate(job.prompt, job.config, job.cancel):
            if isinstance(event, Token):
                shown, kind = shown + len(event.text), event.kind
                released += scanner.feed(event.text, event.kind)
                if scanner.stopped:
                    job.cancel.set()  # stop after this round; the rest of it is dropped
            if released and (plain or isinstance(event, Round)):
                job.emit(Piece(tuple(released)))
                released = []
            if isinstance(event, Finished):
                released += scanner.feed(event.text[shown:], kind, count=0)  # held-back bytes
                released += scanner.flush()
                if released:
                    job.emit(Piece(tuple(released)))
                return self._finish(event, scanner, job)
        raise RuntimeError("the engine ended without a Finished event")  # pragma: no cover

    def _finish(self, event: Finished, scanner: StopScanner, job: Job) -> WorkerEvent:
        reason: str = event.reason
        if scanner.stopped:
            reason = "stop"
        elif reason == "cancelled" and self._closing.is_set():
            return Failed(503, "the server is shutting down", "server_shutting_down")
        return Done(reason, Usage.of(event.stats, scanner.tokens, job.config.spec.method))


class QueueFullError(EdgeSpecError):
    """Too many requests waiting."""


class ShuttingDownError(EdgeSpecError):
    """A request arrived while the server stops."""


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
