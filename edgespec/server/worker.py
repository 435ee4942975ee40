"""The server's side of the thread that owns the models (edgespec/worker.py, shared with the chat
app): it loads the engine, then serves jobs first in, first out, up to `max_batch` of them at
once, round by round, their forwards packed (edgespec/server/batching.py).

Loading and every generation run on that thread; the HTTP side only submits jobs, sets their
cancel events and reads what they emit.

    worker = Worker(loader, budget_bytes=1 << 30, max_slots=4, max_batch=4)
    engine = worker.start()                  # blocks until loaded; raises the load error
    worker.submit(Job(ids, config, stops, emit))   # emit(Piece | Done | Failed), on this thread
    job.cancel.set()                         # any thread: stops at the next round boundary
    worker.shutdown()                        # running and queued jobs end with Failed(503)

A job emits Piece* then exactly one Done or Failed. A Piece is what one round released (after
stop-string holdback, stops.StopScanner); a stop string sets the job's cancel event, so the
engine stops after the round it is in, and the loops leave both caches holding committed tokens
only (tokens past the stop string included: the next request's prefix match rewinds past them).
Jobs start in the order they came: the first waiting one joins the running ones between two
turns when there is a place (`max_batch`) and its cache fits the budget beside theirs
(Batch.fits); the ones behind it wait for it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from edgespec.errors import EdgeSpecError
from edgespec.server.batching import Batch
from edgespec.server.jobs import SHUTTING_DOWN, Done, Failed, Job, Piece, WorkerEvent
from edgespec.server.packing import Packer
from edgespec.server.prefix import ConversationPool
from edgespec.trees.forward import PLAIN
from edgespec.worker import EngineWorker, ServedEngine

__all__ = [
    "Done",
    "Failed",
    "Job",
    "Piece",
    "QueueFullError",
    "ShuttingDownError",
    "Worker",
    "WorkerEvent",
]

# A burst's companions: a job that finds the worker idle waits for requests still being read and
# tokenized (Worker.arriving: the HTTP side's), in slices of BURST_S and at most BURST_MOST after
# it, so that requests sent together (clients released at once, an agent's parallel calls) read
# their prompts in one packed forward and start streaming together. Without it the first started
# alone and the rest, arriving 1-4 ms later, waited for its prompt's forward before reading
# theirs (docs/measurements/2026-12-07-policy-and-checks.md, section 16). A request alone waits
# for nothing. Only where several run at once.
BURST_S, BURST_MOST = 0.002, 0.05


class Worker:
    """Owns the engine and its conversation pool; a bounded FIFO queue of jobs, up to
    `max_batch` of them running at once (1: one after another)."""

    def __init__(
        self,
        loader: Callable[[], ServedEngine],
        *,
        budget_bytes: int,
        max_slots: int = 4,
        max_queue: int = 64,
        max_batch: int = 1,
    ):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self._loader = loader
        self._budget, self._slots, self.max_batch = budget_bytes, max_slots, max_batch
        self.mlx: EngineWorker[Job] = EngineWorker(self._load, self._serve, name="edgespec-mlx")
        # Jobs submitted and not yet ended (the running ones included): the queue's own size would
        # count a job the thread has not taken yet as waiting, so a burst got one place fewer.
        self._max_queue, self._admitted, self._admit = max_queue, 0, threading.Lock()
        self._arriving = 0  # requests being read and tokenized (`arriving`), under _admit
        self._closing = threading.Event()
        self._batch: Batch | None = None
        self._next: Job | None = None  # the first waiting job, taken off the queue, not started
        self._stopped = False  # the thread took the shutdown sentinel
        self.cache_info: dict[str, int] = {"conversations": 0, "bytes": 0}
        # Requests served so far, by outcome (GET /health shows them): a request refused for what
        # it asked (a 4xx, e.g. a method the pair cannot run) is a bad request, not a failure.
        self.counts = {"completed": 0, "cancelled": 0, "failed": 0, "bad_request": 0}

    def start(self) -> ServedEngine:
        """Start the thread, wait until the engine is loaded and return it (or raise why not)."""
        self.mlx.start()
        return self.mlx.wait()

    @property
    def engine(self) -> ServedEngine | None:
        """The loaded engine (None until then, or when loading failed)."""
        return self.mlx.engine

    @contextmanager
    def arriving(self) -> Iterator[Callable[[Job], None]]:
        """While a request is read and tokenized: a burst started from idle waits for it
        (BURST_S). Yields its `submit`, which ends the arrival before the job is queued (so a
        request alone never waits for itself); leaving without it (a bad request) ends it too.

            with worker.arriving() as submit:
                ...                          # read, parse, tokenize
                submit(job)"""
        with self._admit:
            self._arriving += 1
        arrived = False

        def submit(job: Job) -> None:
            nonlocal arrived
            with self._admit:
                self._arriving -= 1
                arrived = True
            self.submit(job)

        try:
            yield submit
        finally:
            if not arrived:
                with self._admit:
                    self._arriving -= 1

    def submit(self, job: Job) -> None:
        """Queue a job behind the others. Raises QueueFullError when `max_queue` jobs wait
        besides the `max_batch` running ones (however fast they came) and ShuttingDownError once
        the server is stopping (the job is then not queued)."""
        if self._closing.is_set():
            raise ShuttingDownError("the server is shutting down")
        with self._admit:
            if self._admitted >= self._max_queue + self.max_batch:
                raise QueueFullError(
                    f"the server is busy ({self._max_queue} requests waiting); retry later"
                )
            self._admitted += 1
        self.mlx.put(job)

    def _end(self, job: Job, outcome: WorkerEvent | None) -> None:
        """Free the job's place, then emit its last event: a client that sends its next request
        as soon as it has the answer finds the place free."""
        with self._admit:
            self._admitted -= 1
        if outcome is not None:
            job.emit(outcome)

    @property
    def queued(self) -> int:
        return self.mlx.pending + (self._next is not None)

    @property
    def running(self) -> int:
        """Jobs being answered now."""
        return len(self._batch) if self._batch is not None else 0

    @property
    def busy(self) -> bool:
        return self.running > 0

    def close(self) -> None:
        """Refuse new jobs, end the running ones at their next round and fail the queued ones
        (503). Does not wait: safe in a signal handler."""
        self._closing.set()
        for job in self._batch.jobs() if self._batch is not None else []:
            job.cancel.set()
        self._drain()
        self.mlx.close()  # wakes the thread, which then ends

    def shutdown(self, timeout: float = 5.0) -> None:
        """close(), then wait up to `timeout` seconds for the thread to end."""
        self.close()
        self.mlx.join(timeout)

    def _load(self) -> ServedEngine:
        """On the thread: the engine, its conversation pool and the batch of running jobs. With
        more than one place, the pool's sets are built with a packer as their forward, which
        packs the running requests' forwards (a fake engine, in tests, has no kernels)."""
        engine = self._loader()
        kernels = getattr(engine, "kernels", PLAIN)
        packer = Packer(kernels) if self.max_batch > 1 else None
        pool = ConversationPool(engine, self._budget, self._slots, run=packer)
        self._batch = Batch(engine, pool, self.max_batch, self._closing, packer)
        return engine

    def _serve(self, engine: ServedEngine) -> None:
        """On the thread, once loaded: take jobs and run turns until closed."""
        batch = self._batch
        assert batch is not None  # made by _load
        pool = batch.pool
        while True:
            self._admit_jobs(batch)
            if not batch:
                break  # only after the shutdown sentinel: an empty batch waits for a job
            try:
                ended = batch.turn()
            except Exception as exc:  # noqa: BLE001 - the batch's own code, not a request's
                ended = batch.fail_all(exc)  # their caches emptied; the server goes on
            for job, outcome in ended:
                self._count(outcome)
                self._end(job, outcome)
            self.cache_info = {"conversations": len(pool.slots), "bytes": pool.nbytes()}
        if self._next is not None:
            self._end(self._next, SHUTTING_DOWN)
            self._next = None
        self._drain()

    def _admit_jobs(self, batch: Batch) -> None:
        """Start waiting jobs, first in first out, while they fit beside the running ones;
        waits for one when none runs (returns with none only once stopping). The first waiting
        job stays in `_next` until it leaves the queue, so `queued` always counts it."""
        burst: float | None = None  # when a burst's first job left the queue (BURST_S)
        idle = not batch
        while not self._stopped:
            if self._next is None:
                wait = self._wait(burst) if batch else None  # none running: wait for one
                try:
                    self._next = self.mlx.take(block=not batch or wait is not None, timeout=wait)
                except queue.Empty:
                    if wait is not None:
                        continue  # a slice of a burst's wait (`_wait` says when it ends)
                    return
                if self._next is None:
                    self._stopped = True
                    return
            job = self._next
            live = not (self._closing.is_set() or job.cancel.is_set())
            if live and not batch.fits(job):
                return
            self._dispatch(batch, job)
            self._next = None
            if idle and burst is None and self.max_batch > 1:
                burst = time.perf_counter()

    def _wait(self, burst: float | None) -> float | None:
        """How long a take waits for the next job beside running ones: BURST_S while requests
        are arriving and a burst started from idle is within BURST_MOST of its first job, else
        not at all (None)."""
        if burst is None or not self._arriving:
            return None
        left = burst + BURST_MOST - time.perf_counter()
        return min(BURST_S, left) if left > 0 else None

    def _dispatch(self, batch: Batch, job: Job) -> None:
        """A job leaving the queue: failed (closing), skipped (its client left) or started."""
        if self._closing.is_set():
            self._end(job, SHUTTING_DOWN)
        elif job.cancel.is_set():  # a client gone while queued needs nothing
            self.counts["cancelled"] += 1
            self._end(job, None)
        elif (failed := batch.start(job)) is not None:
            self._count(failed)
            self._end(job, failed)

    def _drain(self) -> None:
        """Fail every job still queued (one that slipped in while closing): none is lost."""
        for job in self.mlx.drain():
            self._end(job, SHUTTING_DOWN)

    def _count(self, outcome: WorkerEvent) -> None:
        if isinstance(outcome, Failed):
            self.counts["failed" if outcome.status >= 500 else "bad_request"] += 1
        elif isinstance(outcome, Done) and outcome.finish_reason == "cancelled":
            self.counts["cancelled"] += 1
        else:
            self.counts["completed"] += 1


class QueueFullError(EdgeSpecError):
    """Too many requests waiting."""


class ShuttingDownError(EdgeSpecError):
    """A request arrived while the server stops."""
