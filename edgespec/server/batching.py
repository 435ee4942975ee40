"""Continuous batching at round granularity: the running requests take turns, one round each.

The worker thread keeps up to `max_batch` requests running. Each holds its own cache set from
the conversation pool (edgespec/server/prefix.py) and its own generation (Engine.generate, with
its own random stream from its seed); a turn installs the request's set and runs its next round
(a plain step for method "none"), so every stream gets text every few rounds instead of waiting
for the requests before it to finish. A request joins between two turns (its first turn runs its
prefill, reusing its cached prefix), and one that ends, is cancelled or fails leaves without
touching the others' caches.

Exactness: a request runs exactly the computation it would run alone (its caches, its keys, its
K policy), only interleaved with others', so its T = 0 text, and its seeded T > 0 text, are the
ones it gets alone.

    batch = Batch(engine, pool, max_batch=4, closing)
    batch.start(job)                    # when batch.fits(job): holds a set, generation not run yet
    for job, outcome in batch.turn():  # one round of every running request
        ...                             # the ended ones: Done or Failed
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from dataclasses import dataclass

from edgespec.errors import EdgeSpecError, one_line
from edgespec.events import Finished, Round, Token
from edgespec.server.jobs import SHUTTING_DOWN, Done, Failed, Job, Piece, WorkerEvent
from edgespec.server.prefix import ConversationPool, Slot
from edgespec.server.responses import Usage
from edgespec.server.stops import Segment, StopScanner
from edgespec.worker import ServedEngine

Rounds = Generator[None, None, WorkerEvent]


@dataclass
class Running:
    """A request being answered: its job, its cache set, its rounds and the bytes it may use."""

    job: Job
    slot: Slot
    rounds: Rounds
    need: float


class Batch:
    """The running requests, on the MLX thread. Not thread-safe; `jobs()` may be read anywhere."""

    def __init__(
        self,
        engine: ServedEngine,
        pool: ConversationPool,
        max_batch: int,
        closing: threading.Event,
    ):
        self.engine, self.pool, self.max_batch, self.closing = engine, pool, max_batch, closing
        self.running: list[Running] = []

    def __len__(self) -> int:
        return len(self.running)

    def jobs(self) -> list[Job]:
        return [r.job for r in list(self.running)]

    def need(self, job: Job) -> float:
        """Cache bytes the job may grow to: its prompt and answer at the measured cost a token."""
        return (len(job.prompt) + job.config.max_tokens) * self.pool.bytes_per_token()

    def fits(self, job: Job) -> bool:
        """Whether the job may start now: a place in the batch, and its cache bytes within the
        budget beside the running ones' (alone, a request always runs, as before batching).
        Example: budget 1 GiB, 45 KiB a token, two running with 1,000-token needs (88 MiB):
        a third of 20,000 tokens (879 MiB) waits, one of 10,000 (440 MiB) starts."""
        if not self.running:
            return True
        if len(self.running) >= self.max_batch or not self.pool.bytes_per_token():
            return False  # full, or no cache has grown yet: what a token costs is unknown
        return sum(r.need for r in self.running) + self.need(job) <= self.pool.budget

    def start(self, job: Job) -> Failed | None:
        """Hold a cache set for the job and add it; its prefill runs on its first turn."""
        try:
            slot = self.pool.acquire(job.prompt)
        except Exception as exc:  # noqa: BLE001 - the backend failed; the server goes on
            return failure(exc)
        rounds = job_rounds(self.engine, job, self.closing)
        self.running.append(Running(job, slot, rounds, self.need(job)))
        return None

    def turn(self) -> list[tuple[Job, WorkerEvent]]:
        """One round of every running request, in the order they joined; returns the ended
        requests with their outcome (their sets are released)."""
        ended = []
        for run in list(self.running):
            if self.closing.is_set():
                run.job.cancel.set()  # one that started as the server began to close
            self.pool.activate(run.slot)
            outcome = advance(run.rounds)
            if outcome is not None:
                self.running.remove(run)
                self.pool.release(run.slot)
                ended.append((run.job, outcome))
        return ended


def advance(rounds: Rounds) -> WorkerEvent | None:
    """Run one round; the outcome when the request ended (Done, or Failed when it raised)."""
    try:
        next(rounds)
    except StopIteration as stop:
        return stop.value
    except Exception as exc:  # noqa: BLE001 - one request failed; the others go on
        rounds.close()
        return failure(exc)
    return None


def failure(exc: Exception) -> Failed:
    """A 400 for what the request asked (an EdgeSpecError), a 500 for a backend failure."""
    if isinstance(exc, EdgeSpecError):
        return Failed(400, one_line(exc))
    return Failed(500, f"generation failed: {one_line(exc, typed=True)}")


def job_rounds(engine: ServedEngine, job: Job, closing: threading.Event) -> Rounds:
    """The job's generation, emitting a Piece per round (per token for plain decoding) and
    pausing after each; returns its Done (or Failed on shutdown)."""
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
        if isinstance(event, Finished):
            released += scanner.feed(event.text[shown:], kind, count=0)  # held-back bytes
            released += scanner.flush()
            if released:
                job.emit(Piece(tuple(released)))
            return finish(event, scanner, job, closing)
        if plain or isinstance(event, Round):
            if released:
                job.emit(Piece(tuple(released)))
                released = []
            yield None
    raise RuntimeError("the engine ended without a Finished event")  # pragma: no cover


def finish(
    event: Finished, scanner: StopScanner, job: Job, closing: threading.Event
) -> WorkerEvent:
    reason: str = event.reason
    if scanner.stopped:
        reason = "stop"
    elif reason == "cancelled" and closing.is_set():
        return SHUTTING_DOWN
    return Done(reason, Usage.of(event.stats, scanner.tokens, job.config.spec.method))
