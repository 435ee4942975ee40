"""Continuous batching at round granularity: every running request runs one round per turn, and
their forwards run together.

The worker thread keeps up to `max_batch` requests running. Each holds its own cache set from
the conversation pool (edgespec/server/prefix.py) and its own generation (Engine.generate, with
its own random stream from its seed), run as a task (edgespec/server/packing.py). A turn runs
every request's next round (a plain step for method "none"): each drafts on its own, and where it
needs a target forward it parks; the parked forwards run as one packed forward (the weights read
once for all of them), and each request goes on with its own logits. So every stream gets text
every turn, and a turn costs about one request's round, not one per request. A request joins
between two turns (its first turn runs its prefill, reusing its cached prefix), and one that
ends, is cancelled or fails leaves without touching the others' caches.

A long prompt does not hold the others up (chunked prefill, edgespec/server/pieces.py): a
forward longer than pieces.LONG_ROWS (a prompt's chunk) is parked aside and read in pieces, one
piece per turn after the turn's other rounds, each about as long as those rounds took (alone,
about pieces.JOIN_S); its request resumes, with the whole forward's logits, the turn after its
last piece. What costs less than pieces.WHOLE_S at the measured cost a row (a chat question of
a hundred tokens; the rest of a prompt once a piece has priced its rows) is read whole. Only
where the cache is plain KV layers (a recurrent or window layer reads a forward as a whole) and
several may run (a packer).

Peak memory: after each turn the batch reads MLX's peak and measures anew, and a request's
usage reports the highest of its turns' (from the end of the turn before it joined, or its
start where none ran). MLX's peak is the process's, so with requests batched it is theirs
together (the weights, every running request's caches and forwards), not one request's share.

Exactness: a request runs the computation it would run alone (its caches, its keys, its K
policy); its target rows are computed beside others' (server/packed.py: the same bits with a
row-exact BLAS), so its T = 0 text, and its seeded T > 0 text, are the ones it gets alone.

    packer = Packer(engine.kernels)     # None with one place: nothing to pack
    pool = ConversationPool(engine, budget, slots, run=packer)  # its sets' forwards: the packer's
    batch = Batch(engine, pool, max_batch=4, closing, packer)
    batch.start(job)                    # when batch.fits(job): holds a set, generation not run yet
    for job, outcome in batch.turn():  # one round of every running request, forwards packed
        ...                             # the ended ones: Done or Failed
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from contextlib import suppress
from dataclasses import dataclass, field, replace

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from edgespec.errors import EdgeSpecError, one_line
from edgespec.events import Finished, Round, Token
from edgespec.server.bank import in_bank
from edgespec.server.jobs import SHUTTING_DOWN, Done, Failed, Job, Piece, WorkerEvent
from edgespec.server.mode import BatchMode, Gate
from edgespec.server.packing import ROUND, Packer, Park, Task
from edgespec.server.pieces import LONG_ROWS, PieceSize
from edgespec.server.prefix import ConversationPool, Slot
from edgespec.server.responses import Usage
from edgespec.server.stops import Segment, StopScanner
from edgespec.worker import ServedEngine, peak_memory, reset_peak_memory

Rounds = Generator[None, None, WorkerEvent]


@dataclass
class Running:
    """A request being answered: its job, its cache set, its rounds, the bytes it may use and
    the process's peak memory in its turns so far (bytes). `carry`: what is left of a long
    forward it parked (read a piece a turn), `parts`: the logits of its pieces so far, `held`:
    how long others' rounds have held its prompt up, `reads`: how many of its rows are read in
    pieces (pieces.PieceSize.waits)."""

    job: Job
    slot: Slot
    task: Task
    need: float
    peak: int = 0
    carry: Park | None = None
    parts: list[mx.array] = field(default_factory=list)
    held: float = 0.0  # seconds others' rounds ran while its prompt was read in pieces
    reads: int = 0  # rows of its prompt read in pieces (from its first long forward on)


class Batch:
    """The running requests, on the MLX thread. Not thread-safe; `jobs()` may be read anywhere.
    `packer`: the Forward the pool's sets were built with (None: each runs its own forwards)."""

    def __init__(
        self,
        engine: ServedEngine,
        pool: ConversationPool,
        max_batch: int,
        closing: threading.Event,
        packer: Packer | None = None,
    ):
        self.engine, self.pool, self.max_batch, self.closing = engine, pool, max_batch, closing
        self.running: list[Running] = []
        self.packer = packer
        # Whether the batch drafts, measured (server/mode.py), for each generation's adaptive K
        # (Engine.generate's gate) where several may run. Plain first where the backend says
        # (the CPU: several requests' plain steps fill a forward's cheap rows).
        plain_first = getattr(getattr(engine, "backend", None), "batches_plain_first", False)
        self.mode = BatchMode(prefer_plain=plain_first)
        self.gate = self.mode.gate if max_batch > 1 else None
        self.pieces: dict[int, PieceSize] = {}  # a model's piece sizes (chunked prefill)

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
        if not self.running:
            reset_peak_memory()  # alone: its peak from here, not the server's since it loaded
        try:
            slot = self.pool.acquire(job.prompt)
        except Exception as exc:  # noqa: BLE001 - the backend failed; the server goes on
            return failure(exc)
        rounds = job_rounds(self.engine, job, self.closing, self.gate)
        self.running.append(Running(job, slot, Task(lambda: advance(rounds)), self.need(job)))
        return None

    def turn(self) -> list[tuple[Job, WorkerEvent]]:
        """One round of every running request, in the order they joined, their forwards
        packed; returns the ended requests with their outcome (their sets are released, their
        usage carries their peak memory).

        Draft steps run first: while any request still drafts, only the parked draft forwards
        run, and the target forwards wait, so that requests drafting different K still verify
        in one packed forward. Then a piece of each long forward parked aside (`_pieces`)."""
        ended = []
        t0, tokens0 = time.perf_counter(), self._tokens()
        # The requests whose rounds share this turn's forwards: one reading a prompt in pieces
        # runs no round, so a request beside it alone is left to its own policy
        resume: list[Running] = [run for run in self.running if run.carry is None]
        running = len(resume)
        self.mode.begin(running)
        ran = list(self.running)
        held: list[tuple[Running, Park]] = []
        while resume or held:
            for run in resume:
                if self.closing.is_set():
                    run.job.cancel.set()  # one that started as the server began to close
                self.pool.activate(run.slot)
                try:
                    msg = run.task.resume()
                except Exception as exc:  # noqa: BLE001 - outside its rounds; the others go on
                    msg = failure(exc)
                if isinstance(msg, Park) and self._long(msg):
                    run.carry = msg  # read in pieces, from the end of this turn on
                    if not run.reads:  # its first: the prompt's rows from here on
                        run.reads = len(run.job.prompt) - msg.state.cache[0].offset
                elif isinstance(msg, Park):
                    held.append((run, msg))
                elif msg is not ROUND:  # the request ended
                    self._end(run)
                    ended.append((run, msg))
            drafts = [pair for pair in held if pair[1].state is not pair[0].slot.target]
            targets = [pair for pair in held if pair[1].state is pair[0].slot.target]
            now, held = (drafts, targets) if drafts else (targets, [])
            self._forward(now, targets=not drafts)
            resume = [run for run, _ in now]
        tokens = self._tokens() + sum(run.job.tokens for run, _ in ended) - tokens0
        # Requests that ran a round (not only parked a long forward): the time a piece matches
        rounds_ran = any(run.carry is None for run in ran)
        others_s = time.perf_counter() - t0 if rounds_ran else 0.0
        if rounds_ran:  # the rounds' time, not the pieces'
            self.mode.observe(running, tokens, others_s)
        self._pieces(others_s)
        peak = peak_memory()  # since the last turn, every request's (MLX's is process-wide)
        reset_peak_memory()
        for run in ran:
            run.peak = max(run.peak, peak)
        return [(run.job, with_peak(msg, run.peak)) for run, msg in ended]

    def fail_all(self, exc: Exception) -> list[tuple[Job, WorkerEvent]]:
        """End every running request with a 500 for `exc`, raised by the batch itself (not by a
        request's round: those fail their own request); before, the MLX thread ended and the
        server hung. The packer's banks are dropped first (what they hold may be half written),
        then each request's rounds are closed and its cache set emptied (a forward may have
        stopped half way) before it ends as any request does (`_end`)."""
        if self.packer is not None:
            self.packer.drop_banks()
        ended: list[tuple[Job, WorkerEvent]] = []
        for run in list(self.running):
            with suppress(Exception):  # cleaning up after a failure already raised
                run.task.close()
            with suppress(Exception):
                self.pool.empty(run.slot)
            self._end(run)
            ended.append((run.job, failure(exc)))
        return ended

    def _long(self, park: Park) -> bool:
        """Whether a parked forward is read in pieces: longer than LONG_ROWS, and dearer than
        WHOLE_S at its model's measured cost a row (PieceSize.reads_whole), on plain KV layers
        (no recurrent or window layer, no bank)."""
        state = park.state
        rows = int(park.inputs.shape[0])
        if rows <= LONG_ROWS or state.layers.recurrent:
            return False
        size = self.pieces.get(id(state.model))
        if size is not None and size.reads_whole(rows):
            return False
        return in_bank(state) is None and all(type(c) is KVCache for c in state.cache)

    def _pieces(self, others_s: float) -> None:
        """A piece of each long forward parked aside, run now (evaluated into their caches):
        per model (a target's rows cost more than a draft's), `rows(others_s)` rows of its
        PieceSize shared among its requests, none while every one of them is within its
        allowance (PieceSize.waits; others ran this turn). A request whose forward is all read
        resumes next turn with its logits (the pieces' rows in order, lazy: a prefill never
        reads them)."""
        by_model: dict[int, list[Running]] = {}
        for run in self.running:
            if run.carry is not None:
                by_model.setdefault(id(run.carry.state.model), []).append(run)
        for key, runs in by_model.items():
            size = self.pieces.setdefault(key, PieceSize())
            for run in runs:
                run.held += others_s
            waits = others_s > 0 and not self.closing.is_set()
            if waits and all(size.waits(run.held, run.reads) for run in runs):
                continue  # within their allowance: the others run at their full pace
            # what is left of a prompt that reads whole (its rows' cost measured only once a
            # piece was read): all of it now, not a few rows a turn
            whole = [run for run in runs if size.reads_whole(left_of_prompt(run))]
            if whole:
                cut = [(run, self._cut(run, left_of_prompt(run))) for run in whole]  # all of it
                self._run_pieces(cut, size, beside=others_s > 0)
                runs = [run for run in runs if run.carry is not None]
                if not runs:
                    continue
            rows = size.rows(others_s / len(by_model))
            if rows == 0 and not self.closing.is_set():
                continue  # beside others, the pieces' time share is spent for now
            share = max(1, rows // len(runs))
            parked = [(run, self._cut(run, share)) for run in runs]
            self._run_pieces(parked, size, beside=others_s > 0)

    def _run_pieces(
        self, parked: list[tuple[Running, Park]], size: PieceSize, beside: bool
    ) -> None:
        """Run one model's pieces together, timed for `size`; a failure is raised in each
        request where it parked its forward."""
        t0 = time.perf_counter()
        try:
            assert self.packer is not None  # only a packer parks
            results = self.packer.run([piece for _, piece in parked])
            mx.eval([c.state for _, piece in parked for c in piece.state.cache])
        except Exception as exc:  # noqa: BLE001 - raised where each request asked for it
            for run, _ in parked:
                run.carry, run.parts, run.task.error = None, [], exc
            return
        rows = sum(int(p.inputs.shape[0]) for _, p in parked)
        size.observe(rows, time.perf_counter() - t0, beside)
        for (run, _), logits in zip(parked, results, strict=True):
            run.parts.append(logits)
            if run.carry is None:
                whole = run.parts[0] if len(run.parts) == 1 else mx.concatenate(run.parts)
                run.task.value, run.parts = whole, []

    def _cut(self, run: Running, rows: int) -> Park:
        """The next piece of the run's carried forward, `rows` rows (all that is left when
        little more remains, or when the server is closing: every request then ends at its next
        round, nobody waits behind it); the rest stays carried."""
        carry = run.carry
        assert carry is not None
        left = int(carry.inputs.shape[0])
        if self.closing.is_set():
            run.job.cancel.set()
            rows = left
        if left - rows < LONG_ROWS // 8:
            rows = left
        rest = carry.inputs[rows:]
        run.carry = None if rows >= left else Park(carry.state, rest, carry.head_only)
        return Park(carry.state, carry.inputs[:rows], carry.head_only)

    def _tokens(self) -> int:
        return sum(run.job.tokens for run in self.running)

    def _forward(self, parked: list[tuple[Running, Park]], targets: bool) -> None:
        """Run the parked forwards (`targets`: the requests' target forwards, which may run in
        the packer's bank); each request resumes with its logits, or with the error."""
        if not parked:
            return
        assert self.packer is not None  # only a packer parks
        try:
            results = self.packer.run([park for _, park in parked], bank=targets)
        except Exception as exc:  # noqa: BLE001 - raised where each request asked for it
            for run, _ in parked:
                run.task.error = exc
            return
        for (run, _), logits in zip(parked, results, strict=True):
            run.task.value = logits

    def _end(self, run: Running) -> None:
        self.running.remove(run)
        if self.packer is not None:  # a set back in the pool holds its own caches
            self.packer.release([run.slot.target, run.slot.draft])
        self.pool.release(run.slot)


def left_of_prompt(run: Running) -> int:
    """Rows of the request's prompt not read yet: its carried forward's and the chunks after it
    (a prompt is read PREFILL_CHUNK rows a forward)."""
    carry = run.carry
    if carry is None:
        return 0
    return max(int(carry.inputs.shape[0]), len(run.job.prompt) - carry.state.cache[0].offset)


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


def with_peak(outcome: WorkerEvent, peak: int) -> WorkerEvent:
    """A Done's usage with the request's peak memory (bytes); any other outcome as it is."""
    if isinstance(outcome, Done):
        return replace(outcome, usage=replace(outcome.usage, peak_memory=peak))
    return outcome


def failure(exc: Exception) -> Failed:
    """A 400 for what the request asked (an EdgeSpecError), a 500 for a backend failure."""
    if isinstance(exc, EdgeSpecError):
        return Failed(400, one_line(exc))
    return Failed(500, f"generation failed: {one_line(exc, typed=True)}")


def job_rounds(
    engine: ServedEngine, job: Job, closing: threading.Event, gate: Gate | None = None
) -> Rounds:
    """The job's generation (its adaptive K under `gate`: the batch's mode), emitting a Piece
    per round (per token for plain decoding) and pausing after each; returns its Done (or
    Failed on shutdown)."""
    scanner = StopScanner(job.stop)
    plain = not job.config.spec.enabled
    released: list[Segment] = []
    shown, kind = 0, "target"
    for event in engine.generate(job.prompt, job.config, job.cancel, gate=gate):
        if isinstance(event, Token):
            shown, kind = shown + len(event.text), event.kind
            job.tokens += 1
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
