"""Driving the server's worker thread in tests: a job's emit callback that keeps its events, and
one job run to its end (the worker and batching tests)."""

from __future__ import annotations

import threading

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.runtime import Engine
from edgespec.server.worker import Done, Failed, Job, Piece, Worker

TIMEOUT = 60


class Collect:
    """A job's emit callback: keeps the events, signals the end."""

    def __init__(self, on_piece=None, on_end=None):
        self.events: list = []
        self.done = threading.Event()
        self.on_piece, self.on_end = on_piece, on_end

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, Piece) and self.on_piece is not None:
            self.on_piece()
        if isinstance(event, (Done, Failed)):
            if self.on_end is not None:
                self.on_end()
            self.done.set()

    def wait(self):
        assert self.done.wait(TIMEOUT), "the job never ended"
        return self.events[-1]

    @property
    def text(self) -> str:
        return "".join(s.text for e in self.events if isinstance(e, Piece) for s in e.segments)


def run(worker: Worker, prompt: list[int], cfg: GenerationConfig, stop=()) -> Collect:
    out = Collect()
    worker.submit(Job(prompt, cfg, tuple(stop), out))
    out.wait()
    return out


# A batch of the tiny pair's requests side by side (the packing and bank tests).
PROMPTS = ["why is the river light", "the cat and the dog", "tell me about the moon", "go on"]


def greedy(method: str = "draft", k: int = 3) -> GenerationConfig:
    """T = 0, 24 tokens, fixed K."""
    return GenerationConfig(
        SamplingConfig(temperature=0.0), SpecConfig(k=k, method=method, adaptive=False), 24
    )


def tiny_worker(pair, max_batch: int = 4) -> Worker:
    """A worker on the tiny pair, not started yet."""
    target, draft = (str(p) for p in pair)
    return Worker(lambda: Engine.load(target, draft), max_batch=max_batch, budget_bytes=1 << 30)


def answer_together(w: Worker, cfgs: list[GenerationConfig]) -> list[Collect]:
    """Submit one job per config before the worker starts (so they run side by side)."""
    outs = [Collect() for _ in cfgs]
    for text, cfg, out in zip(PROMPTS, cfgs, outs, strict=False):
        w.submit(Job(list(range(3, 12)) + [len(text)], cfg, (), out))
    w.start()
    for out in outs:
        out.wait()
    return outs
