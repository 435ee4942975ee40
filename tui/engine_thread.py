"""The app's side of the one long-lived thread that owns the engine (and so all MLX state:
edgespec/worker.py, shared with the server), plus a batcher.

The engine is loaded *and* run on that thread, which serves chat turns and resets one after
another for the app's whole life. The UI thread only enqueues requests and sets cancel events;
it never waits on the engine.

Events do not go to the UI one by one: the engine thread hands them to a small batcher thread that
posts one `StreamBatch` per interval at most, however fast the model is, and at most an interval
late. The interval starts at `flush_interval` (the app's: 100 ms) and follows what the app's redraws
cost (`FrameBudget`: where a redraw takes more than 2% of the interval's CPU time, the batches come
less often, 250 ms apart at most). The batcher knows nothing about MLX.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edgespec.tui.messages import (
    EngineFailed,
    EngineReady,
    EngineWarm,
    LoadProgress,
    PrefillProgress,
    StreamBatch,
    TurnFailed,
    TurnFinished,
)
from textual.message import Message

from edgespec.config import GenerationConfig
from edgespec.errors import EdgeSpecError, one_line
from edgespec.events import Finished, Prefill, Round, Token
from edgespec.worker import EngineWorker, ServedEngine, peak_memory, reset_peak_memory

ProgressFn = Callable[[str, "float | None"], None]
Post = Callable[[Message], object]


Loader = Callable[[ProgressFn], ServedEngine]


def error_line(exc: BaseException) -> str:
    """A one-line message for the user: EdgeSpecError messages verbatim, others summarised.

    >>> error_line(MemoryError())
    'out of memory: try a smaller model pair or a lower --draft-bits'
    """
    if isinstance(exc, MemoryError):
        return "out of memory: try a smaller model pair or a lower --draft-bits"
    return one_line(exc, typed=not isinstance(exc, EdgeSpecError))


@dataclass
class _Chat:
    turn: int
    messages: list[dict[str, str]]
    config: GenerationConfig
    think: bool | None = None  # the chat template's thinking mode (None: the engine's default)
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Reset:
    pass


@dataclass
class _Failed:
    turn: int
    error: str


@dataclass
class _Done:
    finished: Finished
    peak_memory: int | None


_Item = Token | Round | Finished | _Done | _Failed


class Batcher:
    """Merges a turn's events into `StreamBatch` messages, one per `interval` at most.

    Feed it with `put(turn, event)` from any thread; `TurnFinished` / `TurnFailed` are posted after
    the turn's last batch, so the app sees every token before the end of the turn.
    """

    def __init__(self, post: Post, interval: float = 0.04) -> None:
        self._post = post
        self.interval = interval  # seconds; the UI thread may change it (EngineThread.drawn)
        self._q: queue.Queue[tuple[int, _Item] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="edgespec-batcher", daemon=True)
        self._turn = -1
        self._tokens: list[Token] = []
        self._rounds: list[Round] = []
        self._last_flush = 0.0

    def start(self) -> None:
        self._thread.start()

    def put(self, turn: int, event: _Item) -> None:
        self._q.put((turn, event))

    def close(self) -> None:
        self._q.put(None)

    def _flush(self) -> None:
        if self._tokens or self._rounds:
            self._post(StreamBatch(self._turn, self._tokens, self._rounds))
            self._tokens, self._rounds = [], []
        self._last_flush = time.monotonic()

    def _run(self) -> None:
        deadline = 0.0
        while True:
            pending = bool(self._tokens or self._rounds)
            timeout = max(0.0, deadline - time.monotonic()) if pending else None
            try:
                item = self._q.get(timeout=timeout)
            except queue.Empty:
                self._flush()
                continue
            if item is None:
                self._flush()
                return
            turn, event = item
            if turn != self._turn:
                self._flush()
                self._turn = turn
            if isinstance(event, (Token, Round)):
                if not pending:
                    deadline = max(time.monotonic(), self._last_flush + self.interval)
                (self._tokens if isinstance(event, Token) else self._rounds).append(event)  # type: ignore[arg-type]
            else:
                self._flush()
                if isinstance(event, Finished):
                    self._post(TurnFinished(turn, event))
                elif isinstance(event, _Done):
                    self._post(TurnFinished(turn, event.finished, event.peak_memory))
                else:
                    self._post(TurnFailed(turn, event.error))
            if (self._tokens or self._rounds) and time.monotonic() >= deadline:
                self._flush()


class FrameBudget:
    """Paces a streaming answer's redraws so that the UI thread's CPU time (Textual's layout and
    paint, the panel, the saves) stays near `share` of the wall time: a redraw every `floor`
    seconds where they are cheap, less often where they are not, every `ceiling` seconds at the
    least. `frame(cpu)` takes the UI thread's CPU seconds since the last batch and returns the
    interval for the next ones; the cost it learns carries over to the next answer.

    >>> budget = FrameBudget(0.1)
    >>> budget.frame(0.001), budget.frame(0.004)
    (0.1, 0.1)
    >>> round(FrameBudget(0.1).frame(0.004), 3), FrameBudget(0.1).frame(0.5)
    (0.2, 0.25)
    """

    def __init__(self, floor: float, share: float = 0.02, ceiling: float = 0.25) -> None:
        self.floor, self.share, self.ceiling = floor, share, max(floor, ceiling)
        self.cost: float | None = None  # CPU seconds per redraw, smoothed

    def frame(self, cpu: float) -> float:
        self.cost = cpu if self.cost is None else 0.8 * self.cost + 0.2 * cpu
        return min(self.ceiling, max(self.floor, self.cost / self.share))


class EngineThread:
    """Loads the engine with `loader` and then serves chat / reset requests, all on one thread.
    With `warm` (the app's settings at start), the engine first compiles the shapes a turn with
    those settings uses and calibrates adaptive K (`Engine.warm_up`), after `EngineReady`: while
    the user types, and before the first turn, which waits in the queue until it is done."""

    def __init__(
        self,
        loader: Loader,
        post: Post,
        flush_interval: float = 0.04,
        warm: GenerationConfig | None = None,
    ) -> None:
        self._loader = loader
        self._warm = warm
        self._post = post
        self._batcher = Batcher(post, flush_interval)
        self._budget = FrameBudget(flush_interval)
        self._ui_cpu: float | None = None  # the UI thread's CPU time at the last batch
        self.mlx: EngineWorker[_Chat | _Reset] = EngineWorker(
            self._load, self._serve, name="edgespec-engine"
        )
        self._latest: _Chat | None = None
        self._last_progress = 0.0

    def start(self) -> None:
        """Start loading in the background; `EngineReady` or `EngineFailed` follows."""
        self._batcher.start()
        self.mlx.start()

    def submit(
        self,
        turn: int,
        messages: list[dict[str, str]],
        config: GenerationConfig,
        think: bool | None = None,
    ) -> None:
        """Queue one chat turn (`think`: the template's thinking mode, None = the engine's
        default); its events arrive as `StreamBatch` ... `TurnFinished`."""
        request = _Chat(turn, list(messages), config, think)
        self._latest, self._ui_cpu = request, None
        self.mlx.put(request)

    def drawn(self, ui_cpu: float) -> None:
        """A batch was drawn; `ui_cpu` is the UI thread's `time.thread_time()` now. The UI's
        CPU time since the last batch (one redraw and what came with it) paces the batches."""
        if self._ui_cpu is not None:
            self._batcher.interval = self._budget.frame(ui_cpu - self._ui_cpu)
        self._ui_cpu = ui_cpu

    def cancel(self) -> None:
        """Ask the last submitted turn to stop (the engine ends it with Finished('cancelled')).
        A turn still waiting in the queue starts already cancelled."""
        latest = self._latest
        if latest is not None:
            latest.cancel.set()

    def reset(self) -> None:
        """Queue an engine reset (forget cached prefixes) after any running turn."""
        self.mlx.put(_Reset())

    def shutdown(self, timeout: float = 2.0) -> None:
        """Cancel the running turn, stop both threads, wait up to `timeout` seconds."""
        self.cancel()
        self.mlx.close()
        self._batcher.close()
        self.mlx.join(timeout)

    def _progress(self, text: str, fraction: float | None) -> None:
        now = time.monotonic()
        if fraction is None or fraction < 1.0:
            if now - self._last_progress < 0.05:
                return  # a download can report thousands of steps; the UI needs ~20/s
        self._last_progress = now
        self._post(LoadProgress(text, fraction))

    def _load(self) -> ServedEngine:
        try:
            return self._loader(self._progress)
        except BaseException as exc:  # every failure becomes a readable line
            self._post(EngineFailed(error_line(exc)))
            raise

    def _serve(self, engine: ServedEngine) -> None:
        thinking = engine.thinking_mode()
        tokenizer = getattr(engine, "tokenizer", None)  # a base model has no chat template
        base = tokenizer is not None and not getattr(tokenizer, "has_chat_template", True)
        ready = EngineReady(engine.name, engine.has_draft, engine.context_window, thinking, base)
        self._post(ready)
        if self._warm is not None:
            start = time.monotonic()
            try:
                engine.warm_up(self._warm)
            except Exception as exc:  # noqa: BLE001 - a turn would fail alike: say it once
                self._post(EngineFailed(error_line(exc)))
                return
            self._post(EngineWarm(time.monotonic() - start))
        while (request := self.mlx.take()) is not None:
            if isinstance(request, _Reset):
                engine.reset()
                continue
            reading = _Reading(request.turn, self._post)
            try:
                reset_peak_memory()  # the panel shows each answer's own peak
                for event in engine.chat(
                    request.messages,
                    request.config,
                    request.cancel,
                    on_prefill=reading,
                    think=request.think,
                ):
                    if isinstance(event, Finished):  # 0: the turn allocated nothing (the fake)
                        self._batcher.put(request.turn, _Done(event, peak_memory() or None))
                    else:
                        self._batcher.put(request.turn, event)
            except Exception as exc:  # noqa: BLE001
                self._batcher.put(request.turn, _Failed(request.turn, error_line(exc)))


class _Reading:
    """Posts a turn's prefill progress (`Engine.chat`'s `on_prefill`), 20 a second at most, and
    always the last chunk's: on a GPU a chunk of the prompt may take milliseconds."""

    def __init__(self, turn: int, post: Post, every: float = 0.05) -> None:
        self.turn, self._post, self._every, self._last = turn, post, every, 0.0

    def __call__(self, progress: Prefill) -> None:
        now = time.monotonic()
        if progress.done < progress.total and now - self._last < self._every:
            return
        self._last = now
        self._post(PrefillProgress(self.turn, progress))
