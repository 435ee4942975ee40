"""Four questions sent together to an idle batching worker, in-process: each request's time to
first token and the level's tokens/s, with the burst's wait (Worker.arriving: the requests are
announced as arriving, as the HTTP side does while it reads and tokenizes them) and without (each
submitted plainly), alternated in one process over the built-in prompts' categories. Submissions
are 2 ms apart, as `edgespec serve` logged HTTP requests reaching the worker 1-4 ms apart.

    python -m research.measure.serve_burst --reps 4

A benchmark, not a test (docs/measurements/2026-12-07-policy-and-checks.md, section 16).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from contextlib import ExitStack
from typing import Any, cast

from edgespec.bench.prompts import DEFAULT_PROMPTS
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.runtime import Engine
from edgespec.server.worker import Job, Piece, Worker

CATEGORIES = ("writing", "qa", "coding", "math", "summarization")
GAP_S = 0.002


class Timed:
    """A job's emit: when its first piece came, its end event."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.end: Any = None
        self.done = threading.Event()

    def __call__(self, event) -> None:
        if isinstance(event, Piece):
            self.first = self.first or time.perf_counter()
        else:
            self.end = event
            self.done.set()


def level(worker: Worker, prompts: list[list[int]], cfg: GenerationConfig, burst: bool):
    """(tokens, seconds, TTFTs) of the prompts sent together."""
    outs = [Timed() for _ in prompts]
    t0 = time.perf_counter()
    with ExitStack() as stack:
        subs = [stack.enter_context(worker.arriving()) for _ in prompts] if burst else None
        for i, (ids, out) in enumerate(zip(prompts, outs, strict=True)):
            (subs[i] if subs else worker.submit)(Job(ids, cfg, (), out))
            time.sleep(GAP_S)
    for out in outs:
        out.done.wait(600)
    seconds = time.perf_counter() - t0
    tokens = sum(out.end.usage.completion_tokens for out in outs)
    return tokens, seconds, [out.first - t0 for out in outs]  # type: ignore[operator]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    cfg = GenerationConfig(
        SamplingConfig(temperature=0.0), SpecConfig(method="hybrid", k=4), args.max_tokens
    )

    def load() -> Engine:
        engine = Engine.load()
        engine.warm_up(cfg)
        return engine

    worker = Worker(load, max_batch=4, max_slots=0, budget_bytes=1 << 30)
    engine = cast(Engine, worker.start())
    rows = [json.loads(line) for line in DEFAULT_PROMPTS.read_text().splitlines() if line.strip()]
    results: dict[bool, list] = {True: [], False: []}
    try:
        for rep in range(args.reps):
            for cat in CATEGORIES:
                texts = [r["turns"][0] for r in rows if r["category"] == cat][:4]
                prompts = [engine.encode_chat([{"role": "user", "content": t}]) for t in texts]
                for burst in (True, False) if rep % 2 == 0 else (False, True):
                    tokens, seconds, ttft = level(worker, prompts, cfg, burst)
                    results[burst].append((tokens, seconds, ttft))
                    print(rep, cat, "burst" if burst else "plain", f"{tokens / seconds:.1f} tok/s",
                          "TTFT", [round(t, 2) for t in sorted(ttft)], flush=True)  # fmt: skip
    finally:
        worker.shutdown()
    for burst in (False, True):
        res = results[burst]
        ttfts = [t for *_, ts in res for t in ts]
        rate = sum(r[0] for r in res) / sum(r[1] for r in res)
        print(f"{'burst' if burst else 'plain'}: {rate:.1f} tok/s pooled, TTFT p50 "
              f"{statistics.median(ttfts):.3f} s, mean {statistics.mean(ttfts):.3f} s, "
              f"max {max(ttfts):.3f} s")  # fmt: skip


if __name__ == "__main__":
    main()
