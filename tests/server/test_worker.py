"""The one thread that owns MLX (edgespec/worker.py): it loads and serves on the same thread,
hands work over first in, first out, and both the server and the chat app run on it."""

from __future__ import annotations

import queue
import threading

import pytest
from edgespec.tui.engine_thread import EngineThread
from edgespec.tui.fake import FakeEngine

from edgespec.config import GenerationConfig
from edgespec.errors import ModelNotFoundError
from edgespec.events import Finished
from edgespec.server.worker import Worker
from edgespec.worker import EngineWorker, ServedEngine


def test_load_and_serve_run_on_one_thread_in_order():
    seen: list[object] = []
    threads: set[int] = set()

    def load() -> ServedEngine:
        threads.add(threading.get_ident())
        return FakeEngine()

    def serve(engine: ServedEngine) -> None:
        threads.add(threading.get_ident())
        while (item := mlx.take()) is not None:
            seen.append(item)

    mlx: EngineWorker[int] = EngineWorker(load, serve, name="test-mlx")
    mlx.start()
    assert isinstance(mlx.wait(), FakeEngine)
    for n in (3, 1, 2):
        mlx.put(n)
    mlx.close()
    mlx.join(5)
    assert seen == [3, 1, 2]
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_a_load_error_reaches_wait_and_nothing_is_served():
    served = []

    def load() -> ServedEngine:
        raise ModelNotFoundError("no model called 'nope'")

    mlx: EngineWorker[int] = EngineWorker(load, served.append)
    mlx.start()
    with pytest.raises(ModelNotFoundError, match="nope"):
        mlx.wait()
    assert served == [] and mlx.engine is None


def test_drain_takes_what_waits_without_the_close_mark():
    mlx: EngineWorker[str] = EngineWorker(FakeEngine, lambda engine: None)  # never started
    for item in ("a", "b"):
        mlx.put(item)
    mlx.close()
    assert mlx.pending == 3
    assert mlx.drain() == ["a", "b"] and mlx.pending == 0
    with pytest.raises(queue.Empty):
        mlx.take(block=False)


def test_the_server_and_the_chat_app_own_mlx_through_the_same_worker():
    server = Worker(FakeEngine, budget_bytes=1 << 20)
    app = EngineThread(lambda on_progress: FakeEngine(), lambda message: None)
    assert isinstance(server.mlx, EngineWorker) and isinstance(app.mlx, EngineWorker)


def test_the_fake_keeps_one_cache_set_per_conversation_like_the_engine():
    engine, config = FakeEngine(), GenerationConfig(max_tokens=4)

    def prefilled(prompt: list[int]) -> int:
        *_, end = engine.generate(prompt, config)
        assert isinstance(end, Finished)
        return end.stats.prefilled_tokens

    assert prefilled([1, 2, 3]) == 3
    assert prefilled([1, 2, 3, 4]) == 1  # the same conversation: its prefix is cached
    held = engine.swap_states(*engine.new_states())  # another conversation
    assert prefilled([1, 2, 3, 4, 5]) == 5
    engine.swap_states(*held)  # back to the first: still cached
    assert prefilled([1, 2, 3, 4, 5]) == 1
