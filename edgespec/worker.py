"""The one thread that owns MLX, for the server and the chat app alike.

MLX streams belong to the thread that made them (docs/library.md), so the engine is loaded *and*
run on one long-lived thread. An EngineWorker starts it, loads the engine there, hands every later
piece of work to it through a first-in, first-out inbox, and closes it. What the thread does with
the inbox is its owner's: the server takes jobs and runs them round by round, their forwards packed
(edgespec/server/worker.py); the chat app runs one turn after another and posts Textual messages
(tui/engine_thread.py). A generation stops between two rounds once its cancel event is set (the
Engine reads it), so other threads only put work in the inbox and set cancel events.

    def serve(engine):                       # on the worker's thread, once loaded
        while (item := mlx.take()) is not None:
            ...                              # run it on `engine`
    mlx = EngineWorker(load, serve, name="edgespec-mlx")
    mlx.start()
    engine = mlx.wait()                      # blocks until loaded; raises the load error
    mlx.put(item)                            # any thread
    mlx.close()                              # take() returns None once the inbox is empty
    mlx.join(timeout=5.0)
"""

from __future__ import annotations

import gc
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from edgespec.config import GenerationConfig
from edgespec.events import Event, Prefill

T = TypeVar("T")


class ServedEngine(Protocol):
    """What the worker's owners need of `edgespec.runtime.Engine` (tui/fake.py's fake has it
    too): generation from chat messages or token ids, the conversation's cache set to swap
    (edgespec/server/prefix.py), a reset and a warm-up."""

    name: str
    has_draft: bool
    context_window: int

    def chat(
        self,
        messages: list[dict[str, str]],
        config: GenerationConfig,
        cancel: threading.Event | None = None,
        on_prefill: Callable[[Prefill], object] | None = None,
        *,
        think: bool | None = None,
    ) -> Iterator[Event]: ...

    def thinking_mode(self, think: bool | None = None) -> bool | None: ...

    def generate(
        self,
        prompt_ids: list[int],
        config: GenerationConfig,
        cancel: threading.Event | None = None,
        *,
        gate: Callable[[Any], Any] | None = None,
    ) -> Iterator[Event]: ...

    def reset(self) -> None: ...

    def warm_up(self, config: GenerationConfig) -> object: ...

    def new_states(self, run: Any = None, kind: Any = ...) -> tuple[Any, Any]: ...

    def swap_states(self, target: Any, draft: Any) -> tuple[Any, Any]: ...


def reset_peak_memory() -> None:
    """Start measuring MLX's peak memory anew (on every backend: CPU, Metal, CUDA)."""
    import mlx.core as mx  # here, not at import: the fake engine's tests need no MLX

    mx.reset_peak_memory()


def peak_memory() -> int:
    """The most memory MLX held at once since `reset_peak_memory` (bytes; 0 if it allocated
    nothing since): the weights, the caches and the forwards' buffers."""
    import mlx.core as mx

    return int(mx.get_peak_memory())


class EngineWorker(Generic[T]):
    """A daemon thread that runs `load()`, then `serve(engine)`, whose work comes through the
    inbox (items of type T; None, put by `close`, means stop). A load that raises ends the
    thread; `wait` raises its error."""

    def __init__(
        self,
        load: Callable[[], ServedEngine],
        serve: Callable[[ServedEngine], None],
        *,
        name: str = "edgespec-mlx",
    ) -> None:
        self._load, self._serve = load, serve
        self._inbox: queue.Queue[T | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._ready = threading.Event()
        self.engine: ServedEngine | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        """Start the thread (loading begins on it); returns at once."""
        self._thread.start()

    def wait(self) -> ServedEngine:
        """Block until the engine is loaded and return it, or raise the load's error."""
        self._ready.wait()
        if self.error is not None:
            raise self.error
        assert self.engine is not None  # set before ready, when load() returned
        return self.engine

    def put(self, item: T) -> None:
        """Queue work behind the rest (any thread)."""
        self._inbox.put_nowait(item)

    def take(self, block: bool = True, timeout: float | None = None) -> T | None:
        """The next item (on the thread); None once closed. Raises queue.Empty when not
        `block`ing and nothing waits, or nothing came within `timeout` seconds."""
        return self._inbox.get(block=block, timeout=timeout)

    def drain(self) -> list[T]:
        """Take every item still waiting, the close mark left out (any thread)."""
        items: list[T] = []
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return items
            if item is not None:
                items.append(item)

    @property
    def pending(self) -> int:
        """Items (and the close mark) waiting in the inbox."""
        return self._inbox.qsize()

    def close(self) -> None:
        """Mark the end of the inbox: `take` returns None after the items before the mark."""
        self._inbox.put_nowait(None)

    def join(self, timeout: float | None = None) -> None:
        """Wait up to `timeout` seconds for the thread to end (no-op if it never started)."""
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            engine = self._load()
        except BaseException as exc:  # noqa: BLE001 - handed to wait()'s caller
            self.error = exc
            self._ready.set()
            return
        self.engine = engine
        self._ready.set()
        self._serve(engine)


def freeze_heap() -> None:
    """Collect garbage once, then exempt every object alive now from later collections.

    Call it once a long-lived process (the chat, the server) has loaded its engine. By then it
    holds hundreds of thousands of Python objects that live as long as it does (the tokenizer's
    tables, the models' modules, the app's widgets). CPython's full collection walks them all while
    it holds the GIL, so the engine and the UI both stop for it, at a moment nobody chose. Frozen,
    they are skipped; objects made later are collected as before. The collection first keeps
    garbage that is already unreachable from being frozen for good."""
    gc.collect()
    gc.freeze()
