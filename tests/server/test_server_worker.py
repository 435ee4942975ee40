"""The server's MLX worker thread on tiny real models: FIFO order, stop strings, cancellation,
a full queue, shutdown and load errors (edgespec/server/worker.py)."""

from __future__ import annotations

import threading

import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.errors import ModelNotFoundError
from edgespec.runtime import Engine
from edgespec.server.worker import (
    Done,
    Failed,
    Job,
    Piece,
    QueueFullError,
    ShuttingDownError,
    Worker,
)
from tests.helpers.worker import TIMEOUT, Collect, run


def config(max_tokens: int = 24, **spec) -> GenerationConfig:
    return GenerationConfig(
        SamplingConfig(temperature=0),
        SpecConfig(**{"k": 3, "method": "hybrid", "adaptive": False, **spec}),
        max_tokens,
    )


def make_worker(pair, **kw) -> Worker:
    target, draft = (str(p) for p in pair)
    worker = Worker(lambda: Engine.load(target, draft), budget_bytes=1 << 30, **kw)
    worker.start()
    return worker


@pytest.fixture(scope="module")
def worker(tiny_pair):
    w = make_worker(tiny_pair, max_slots=4, max_queue=8)
    yield w
    w.shutdown()


def prompt_of(worker: Worker, text: str) -> list[int]:
    return worker.engine.encode_chat([{"role": "user", "content": text}])


def test_jobs_run_first_in_first_out(worker):
    order: list[int] = []
    outs = [Collect(on_end=lambda i=i: order.append(i)) for i in range(3)]
    for i, out in enumerate(outs):
        worker.submit(Job(prompt_of(worker, f"question {i}"), config(), (), out))
    for out in outs:
        assert isinstance(out.wait(), Done)
    assert order == [0, 1, 2]


def test_a_stop_string_cuts_exactly_and_the_next_request_is_unaffected(worker):
    ids = prompt_of(worker, "why is the river light")
    ref = run(worker, ids, config(40))
    full = ref.text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = run(worker, ids, config(40), stop=[stop])
    done = cut.events[-1]
    assert cut.text == full[: full.find(stop)] and stop not in cut.text
    assert done.finish_reason == "stop"
    assert done.usage.completion_tokens < ref.events[-1].usage.completion_tokens
    # Provenance: every released segment names a token kind.
    kinds = {s.kind for e in cut.events if isinstance(e, Piece) for s in e.segments}
    assert kinds and kinds <= {"accepted", "corrected", "bonus", "target"}
    assert run(worker, ids, config(40)).text == full


def test_cancel_ends_the_running_job_at_a_round_and_keeps_caches_right(worker):
    ids = prompt_of(worker, "tell me about the moon")
    ref = run(worker, ids, config(300)).text
    job = Job(ids, config(300), (), Collect())
    job.emit.on_piece = job.cancel.set  # the client went away after the first round's text
    before = dict(worker.counts)
    worker.submit(job)
    done = job.emit.wait()
    assert isinstance(done, Done) and done.finish_reason == "cancelled"
    assert done.usage.stats.tokens < 300
    assert worker.counts["cancelled"] == before["cancelled"] + 1
    assert run(worker, ids, config(300)).text == ref


def test_a_full_queue_refuses_and_loses_nothing(tiny_pair):
    w = make_worker(tiny_pair, max_slots=2, max_queue=1)
    try:
        started = threading.Event()
        long_job = Job(
            prompt_of(w, "a long one"), config(400, adaptive=False), (), Collect(started.set)
        )
        w.submit(long_job)
        assert started.wait(TIMEOUT)
        waiting = Job(prompt_of(w, "next"), config(8), (), Collect())
        w.submit(waiting)
        with pytest.raises(QueueFullError, match="busy"):
            w.submit(Job(prompt_of(w, "one too many"), config(8), (), Collect()))
        long_job.cancel.set()
        assert isinstance(long_job.emit.wait(), Done)
        assert isinstance(waiting.emit.wait(), Done)  # the queued one still ran
    finally:
        w.shutdown()


def test_a_burst_gets_exactly_max_queue_places_besides_the_running_one(tiny_pair):
    """Jobs that arrive together, before the thread takes the first: max_queue wait and one
    runs (the queue's own size counted the one about to run as waiting: one place fewer)."""
    target, draft = (str(p) for p in tiny_pair)
    w = Worker(lambda: Engine.load(target, draft), budget_bytes=1 << 30, max_queue=2)
    try:
        for _ in range(2):  # twice: places come back once jobs end
            burst = [Job([5, 6, 7], config(2), (), Collect()) for _ in range(3)]
            for job in burst:
                w.submit(job)
            with pytest.raises(QueueFullError, match="2 requests waiting"):
                w.submit(Job([5, 6, 7], config(2), (), Collect()))
            if not w.engine:
                w.start()
            assert all(isinstance(job.emit.wait(), Done) for job in burst)
    finally:
        w.shutdown()


def test_shutdown_fails_running_and_queued_jobs_and_refuses_new_ones(tiny_pair):
    w = make_worker(tiny_pair, max_slots=2, max_queue=4)
    started = threading.Event()
    running = Job(prompt_of(w, "a long one"), config(400, adaptive=False), (), Collect(started.set))
    w.submit(running)
    queued = [Job(prompt_of(w, f"q{i}"), config(8), (), Collect()) for i in range(2)]
    for job in queued:
        w.submit(job)
    assert started.wait(TIMEOUT)
    w.shutdown()
    for job in [running, *queued]:
        end = job.emit.wait()
        assert isinstance(end, Failed) and end.status == 503 and "shutting down" in end.message
    with pytest.raises(ShuttingDownError):
        w.submit(Job([1, 2], config(), (), Collect()))


def test_a_load_error_reaches_the_caller():
    def fail():
        raise ModelNotFoundError("no model called 'nope'")

    with pytest.raises(ModelNotFoundError, match="nope"):
        Worker(fail, budget_bytes=1).start()
