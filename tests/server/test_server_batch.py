"""Requests answered together (edgespec/server/batching.py) on tiny real models: each answer is
the one it gets alone (T = 0, and seeded T > 0), streams interleave, requests join and leave
between rounds, the prefix pool and the cache budget keep working."""

from __future__ import annotations

import threading

import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.runtime import Engine
from edgespec.server.worker import Done, Job, QueueFullError, Worker
from tests.helpers.stats import assert_follows
from tests.helpers.worker import Collect, run

METHODS = ["hybrid", "draft", "ngram", "none"]
PROMPTS = ["why is the river light", "the cat and the dog", "tell me about the moon", "go on"]


def config(max_tokens: int = 40, temperature: float = 0.0, seed: int = 0, **spec):
    sampling = SamplingConfig(temperature=temperature, seed=seed)
    return GenerationConfig(
        sampling, SpecConfig(**{"k": 3, "method": "hybrid", "adaptive": False, **spec}), max_tokens
    )


def unstarted(pair, max_batch: int, **kw) -> Worker:
    """A worker not started yet: jobs submitted now are all waiting when it starts."""
    target, draft = (str(p) for p in pair)
    return Worker(lambda: Engine.load(target, draft), max_batch=max_batch, **kw)


class Timeline:
    """Emit callbacks that log (job, 'piece' | 'end') in the order the worker emitted them."""

    def __init__(self) -> None:
        self.log: list[tuple[int, str]] = []

    def collect(self, i: int) -> Collect:
        return Collect(lambda: self.log.append((i, "piece")), lambda: self.log.append((i, "end")))

    def all_streamed_before_any_ended(self, n: int) -> bool:
        first_end = next(k for k, (_, what) in enumerate(self.log) if what == "end")
        return {i for i, what in self.log[:first_end] if what == "piece"} == set(range(n))


def together(pair, jobs: list[tuple[list[int] | str, GenerationConfig]], **kw):
    """Answer the jobs in one batch (all waiting when the worker starts): (texts, Timeline)."""
    w = unstarted(pair, max_batch=len(jobs), budget_bytes=1 << 30, **kw)
    timeline = Timeline()
    outs = [timeline.collect(i) for i in range(len(jobs))]
    try:
        for (prompt, cfg), out in zip(jobs, outs, strict=True):
            w.submit(Job(prompt if isinstance(prompt, list) else [], cfg, (), out))
        w.start()
        assert all(isinstance(out.wait(), Done) for out in outs)
    finally:
        w.shutdown()
    return [out.text for out in outs], timeline


@pytest.fixture(scope="module")
def solo(tiny_pair):
    w = Worker(lambda: Engine.load(*(str(p) for p in tiny_pair)), budget_bytes=1 << 30)
    w.start()
    yield w
    w.shutdown()


def ids(worker: Worker, text: str) -> list[int]:
    return worker.engine.encode_chat([{"role": "user", "content": text}])


@pytest.mark.parametrize("method", METHODS)
def test_greedy_answers_in_a_batch_equal_their_solo_runs(tiny_pair, solo, method):
    """Four prompts, this method for two and the others' for the rest: every text is its own."""
    methods = [method, method, *(m for m in METHODS if m != method)][:4]
    jobs = [(ids(solo, p), config(40, method=m)) for p, m in zip(PROMPTS, methods, strict=True)]
    want = [run(solo, prompt, cfg).text for prompt, cfg in jobs]
    got, timeline = together(tiny_pair, jobs)
    assert got == want
    assert timeline.all_streamed_before_any_ended(4)


def test_seeded_sampled_answers_in_a_batch_equal_their_solo_runs(tiny_pair, solo):
    cfgs = [config(40, 1.0, seed=s, method=m) for s, m in zip((1, 2, 3, 4), METHODS, strict=True)]
    jobs = [(ids(solo, p), c) for p, c in zip(PROMPTS, cfgs, strict=True)]
    want = [run(solo, prompt, cfg).text for prompt, cfg in jobs]
    got, _ = together(tiny_pair, jobs)
    assert got == want
    # Two requests with one prompt and different seeds differ (the streams are the requests').
    same_prompt = [(jobs[0][0], config(40, 1.0, seed=s)) for s in (7, 8)]
    a, b = together(tiny_pair, same_prompt)[0]
    assert a != b


def test_a_joining_request_and_a_leaving_one_leave_the_others_alone(tiny_pair, solo):
    """A runs; B joins after A's first round and is cancelled after its own; C (A's prompt and
    more) joins when B has left, while A still runs. A and C get their solo answers, B ends
    cancelled, and C's prompt prefix comes from the pool (a copy of A's held cache set)."""
    a_ids, b_ids = ids(solo, PROMPTS[0]), ids(solo, PROMPTS[1])
    c_ids = a_ids + ids(solo, "and the sun")[1:]
    cfg = config(120, adaptive=False)
    want_a, want_c = run(solo, a_ids, cfg).text, run(solo, c_ids, cfg).text
    w = unstarted(tiny_pair, max_batch=4, budget_bytes=1 << 30)
    w.start()
    timeline = Timeline()
    a, b, c = (Job(p, cfg, (), timeline.collect(i)) for i, p in enumerate((a_ids, b_ids, c_ids)))
    a.emit.on_piece = once(lambda: w.submit(b))
    b.emit.on_piece = once(b.cancel.set)
    b.emit.on_end = once(lambda: w.submit(c))
    try:
        w.submit(a)
        ends = [job.emit.wait() for job in (a, b, c)]
    finally:
        w.shutdown()
    assert isinstance(ends[1], Done) and ends[1].finish_reason == "cancelled"
    assert a.emit.text == want_a and c.emit.text == want_c
    assert timeline.log.index((2, "piece")) < timeline.log.index((0, "end"))  # side by side
    assert ends[2].usage.cached_tokens >= len(a_ids) - 1


def test_usage_reports_the_peak_memory_of_the_requests_turns(tiny_pair):
    """usage.peak_memory: MLX's peak in the server's process, measured anew after every turn, the
    highest of the request's turns. A short request after a long one reports less than the long
    one's prefill took; requests submitted together each report at least both models' weights."""
    weights = sum(f.stat().st_size for d in tiny_pair for f in d.glob("*.safetensors"))
    w = unstarted(tiny_pair, max_batch=2, budget_bytes=1 << 30)
    w.start()
    try:
        long, short = ids(w, "the cat and the dog " * 60), ids(w, PROMPTS[3])
        alone = [run(w, prompt, config(8)).events[-1].usage.peak_memory for prompt in (long, short)]
        outs = [Collect(), Collect()]
        for prompt, out in zip((short, ids(w, PROMPTS[1])), outs, strict=True):
            w.submit(Job(prompt, config(8), (), out))
        batched = [out.wait().usage.peak_memory for out in outs]
    finally:
        w.shutdown()
    assert weights <= alone[1] < alone[0]
    assert all(weights <= peak for peak in batched)


def once(fn):
    """A callback that calls `fn` the first time only."""
    done = threading.Event()

    def call() -> None:
        if not done.is_set():
            done.set()
            fn()

    return call


@pytest.mark.parametrize("announced", [True, False])
def test_requests_sent_together_to_an_idle_worker_start_in_one_turn(
    tiny_pair, monkeypatch, announced
):
    """A job finding the worker idle waits for requests still arriving (Worker.arriving: read
    and tokenized by the HTTP side; worker.BURST_MOST at most), so their prompts are read in one
    packed forward and their first pieces come in the same turn: here the second is submitted
    0.3 s after the first. One not announced (nothing arriving) is not waited for: the first
    streams alone first (the old behaviour for all)."""
    import time

    import edgespec.server.worker as served

    monkeypatch.setattr(served, "BURST_MOST", 5.0)  # well past the 0.3 s, on a loaded machine
    w = Worker(lambda: Engine.load(*(str(p) for p in tiny_pair)), max_batch=4, budget_bytes=1 << 30)
    timeline = Timeline()
    outs = [timeline.collect(i) for i in range(2)]
    try:
        w.start()
        prompts = [ids(w, p) for p in PROMPTS[:2]]
        with w.arriving() as submit:
            if announced:
                w.submit(Job(prompts[0], config(40), (), outs[0]))
                time.sleep(0.3)
                submit(Job(prompts[1], config(40), (), outs[1]))
        if not announced:
            w.submit(Job(prompts[0], config(40), (), outs[0]))
            time.sleep(0.3)
            w.submit(Job(prompts[1], config(40), (), outs[1]))
        assert all(isinstance(out.wait(), Done) for out in outs)
        with pytest.raises(ValueError), w.arriving():
            raise ValueError("a bad request leaves before its submit")
        assert w._arriving == 0
    finally:
        w.shutdown()
    together = timeline.log.index((1, "piece")) <= 2  # in the first turn (it may emit two)
    assert together == announced, timeline.log[:8]


def test_a_burst_gets_max_queue_places_besides_max_batch_running(tiny_pair):
    w = unstarted(tiny_pair, max_batch=3, budget_bytes=1 << 30, max_queue=2)
    try:
        jobs = [Job([5, 6, 7], config(4), (), Collect()) for _ in range(5)]
        for job in jobs:
            w.submit(job)
        with pytest.raises(QueueFullError, match="2 requests waiting"):
            w.submit(Job([5, 6, 7], config(4), (), Collect()))
        w.start()
        assert all(isinstance(job.emit.wait(), Done) for job in jobs)
    finally:
        w.shutdown()


def test_a_request_whose_cache_would_pass_the_budget_waits_for_the_running_one(tiny_pair, solo):
    """Budget 1 byte: every request alone is over it (it runs, as without batching), and none
    starts beside another: the second streams only once the first has ended."""
    jobs = [(ids(solo, p), config(40)) for p in PROMPTS[:2]]
    want = [run(solo, prompt, cfg).text for prompt, cfg in jobs]
    w = unstarted(tiny_pair, max_batch=2, budget_bytes=1)
    timeline = Timeline()
    outs = [timeline.collect(i) for i in range(2)]
    try:
        for (prompt, cfg), out in zip(jobs, outs, strict=True):
            w.submit(Job(prompt, cfg, (), out))
        w.start()
        assert all(isinstance(out.wait(), Done) for out in outs)
    finally:
        w.shutdown()
    assert [out.text for out in outs] == want
    assert timeline.log.index((0, "end")) < timeline.log.index((1, "piece"))


def test_sampled_first_tokens_inside_a_batch_follow_the_target(tiny_pair):
    """T = 1, K = 2 drafts, one token each, seeds 0..N-1, four at a time beside a long greedy
    answer: the first tokens' texts are distributed as the target's p(x1 | prompt), pooled by
    text (the worker streams text)."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm import load

    from edgespec.bench.unbiased import chi_square

    prompt_text = "the moon"  # p(x1) spread: 0.48, 0.30, 0.17, ...
    model, tokenizer = load(str(tiny_pair[0]))
    prompt = tokenizer.encode(prompt_text)
    p1 = np.array(mx.softmax(model(mx.array([prompt]))[0, -1]), np.float64)
    texts = [streamed(tokenizer, x) for x in range(p1.shape[0])]  # as the engine streams them
    classes = {t: i for i, t in enumerate(dict.fromkeys(texts))}
    p = np.zeros(len(classes))
    np.add.at(p, [classes[t] for t in texts], p1)

    def p_value(seeds: range) -> float:
        w = unstarted(tiny_pair, max_batch=4, budget_bytes=1 << 30, max_queue=len(seeds) + 1)
        neighbour = Job(prompt, config(200, adaptive=False), (), Collect())
        outs = [Collect() for _ in seeds]
        try:
            w.submit(neighbour)
            for seed, out in zip(seeds, outs, strict=True):
                w.submit(Job(prompt, config(1, 1.0, seed=seed, k=2, method="draft"), (), out))
            w.start()
            assert all(isinstance(out.wait(), Done) for out in outs)
        finally:
            w.shutdown()
        counts = np.zeros(len(classes), np.int64)
        for out in outs:
            counts[classes[out.text]] += 1
        return chi_square(counts, p / p.sum())[2]

    assert_follows(p_value, range(300), "first tokens in a batch")


def streamed(tokenizer, token: int) -> str:
    """A one-token answer's text, through the streaming detokenizer as the engine uses it."""
    detok = tokenizer.detokenizer
    detok.reset()
    detok.add_token(token)
    detok.finalize()
    return detok.text
