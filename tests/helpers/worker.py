"""Driving the server's worker thread in tests: a job's emit callback that keeps its events, and
one job run to its end (the worker and batching tests)."""

from __future__ import annotations

import threading

from edgespec.config import GenerationConfig
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
