"""The engine thread and batcher: bounded UI message rate, order, cancel, readable errors."""

from __future__ import annotations

import threading
import time

from edgespec.tui.engine_thread import Batcher, EngineThread, FrameBudget, error_line
from edgespec.tui.fake import FakeEngine, FakeScript
from edgespec.tui.messages import (
    EngineFailed,
    EngineReady,
    EngineWarm,
    StreamBatch,
    TurnFinished,
)

from edgespec.config import GenerationConfig
from edgespec.errors import ModelLoadError
from edgespec.events import Finished, Stats, Token


class Inbox:
    """Collects posted messages from any thread."""

    def __init__(self) -> None:
        self.items: list[object] = []
        self.done = threading.Event()

    def __call__(self, message: object) -> None:
        self.items.append(message)
        if isinstance(message, (TurnFinished, EngineFailed)):
            self.done.set()


def _stats() -> Stats:
    return Stats(0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)


def test_batcher_bounds_the_message_rate_and_keeps_order() -> None:
    inbox = Inbox()
    batcher = Batcher(inbox, interval=0.05)
    batcher.start()
    t0 = time.monotonic()
    n = 0
    for _ in range(40):  # a "model" committing tokens in bursts, far faster than the UI rate
        for _ in range(25):
            batcher.put(1, Token(n, f"t{n} ", "accepted", n))
            n += 1
        # the sleep may last much longer on a loaded machine: nothing below assumes it
        time.sleep(0.002)
    batcher.put(1, Finished("stop", _stats(), ""))
    assert inbox.done.wait(10)
    elapsed = time.monotonic() - t0
    batches = [m for m in inbox.items if isinstance(m, StreamBatch)]
    assert isinstance(inbox.items[-1], TurnFinished)
    assert [t.id for b in batches for t in b.tokens] == list(range(n))
    # at most one message per interval (plus the first and the final flush), whatever the timing
    assert len(batches) <= elapsed / 0.05 + 2
    assert len(batches) < n // 10  # tokens really were merged
    batcher.close()


def test_batcher_flushes_a_lone_token_without_waiting_for_more() -> None:
    inbox = Inbox()
    batcher = Batcher(inbox, interval=0.05)
    batcher.start()
    batcher.put(7, Token(0, "x", "bonus", 0))
    time.sleep(0.2)  # no further event: the token must still reach the UI
    assert [type(m) for m in inbox.items] == [StreamBatch]
    batcher.close()


def test_frame_budget_spaces_costly_redraws_out() -> None:
    """Cheap redraws keep the floor; a redraw that costs more than `share` of the floor's time
    spreads the batches until it costs `share` of the interval, up to the ceiling."""
    budget = FrameBudget(0.1, share=0.02, ceiling=0.25)
    assert budget.frame(0.001) == 0.1  # 1% of 100 ms
    cheap = FrameBudget(0.1)
    for _ in range(30):
        interval = cheap.frame(0.003)  # 3 ms a redraw: 150 ms apart keeps it at 2%
    assert abs(interval - 0.15) < 1e-6
    assert FrameBudget(0.1).frame(0.05) == 0.25  # the ceiling: a redraw every 250 ms at least
    assert FrameBudget(0.3).frame(0.05) == 0.3  # a floor above the ceiling wins


def test_engine_thread_paces_batches_by_the_ui_cost() -> None:
    """`drawn` with the UI thread's CPU clock sets the batcher's interval; a new turn starts a new
    measurement (the time between answers is not a redraw's)."""
    worker = EngineThread(lambda p: FakeEngine.load(FakeScript(), p), Inbox(), flush_interval=0.1)
    worker.drawn(10.0)
    worker.drawn(10.008)  # 8 ms of UI work for one batch
    assert abs(worker._batcher.interval - 0.25) < 1e-9
    worker.submit(1, [{"role": "user", "content": "hi"}], GenerationConfig())
    worker.drawn(50.0)  # the first batch of a turn only starts the clock
    assert abs(worker._batcher.interval - 0.25) < 1e-9
    worker.shutdown()


def test_engine_thread_runs_turns_and_cancels() -> None:
    inbox = Inbox()
    holder: dict[str, FakeEngine] = {}

    def load(progress):  # noqa: ANN001
        holder["e"] = FakeEngine.load(FakeScript(hold_after=2), progress)
        return holder["e"]

    worker = EngineThread(load, inbox, flush_interval=0.01)
    worker.start()
    worker.submit(1, [{"role": "user", "content": "hi"}], GenerationConfig())
    time.sleep(0.2)
    worker.cancel()
    assert inbox.done.wait(5)
    assert any(isinstance(m, EngineReady) for m in inbox.items)
    fin = inbox.items[-1]
    assert isinstance(fin, TurnFinished) and fin.finished.reason == "cancelled"
    streamed = "".join(t.text for m in inbox.items if isinstance(m, StreamBatch) for t in m.tokens)
    assert streamed == fin.finished.text != ""
    assert len(holder["e"].threads - {threading.main_thread().ident}) == 1
    worker.shutdown()


def test_load_failure_becomes_one_line() -> None:
    inbox = Inbox()
    worker = EngineThread(
        lambda p: FakeEngine.load(FakeScript(load_error=ModelLoadError("bad weights")), p), inbox
    )
    worker.start()
    assert inbox.done.wait(5)
    assert inbox.items[-1] == EngineFailed("bad weights")


def test_error_line_is_one_line() -> None:
    assert error_line(ValueError("a\nb")) == "ValueError: a"
    assert error_line(KeyError()) == "KeyError"
    assert error_line(MemoryError()).startswith("out of memory")


def test_engine_thread_warms_up_after_ready_and_before_the_first_turn() -> None:
    inbox = Inbox()
    order: list[str] = []

    class Slow(FakeEngine):
        def warm_up(self, config: GenerationConfig) -> None:
            time.sleep(0.2)  # the first turn, submitted meanwhile, waits
            order.append("warm")
            super().warm_up(config)

        def chat(self, messages, config, cancel=None, on_prefill=None, *, think=None):  # noqa: ANN001, ANN201
            order.append("chat")
            return super().chat(messages, config, cancel, on_prefill, think=think)

    config = GenerationConfig(max_tokens=5)
    worker = EngineThread(lambda p: Slow(FakeScript()), inbox, flush_interval=0.01, warm=config)
    worker.start()
    worker.submit(1, [{"role": "user", "content": "hi"}], GenerationConfig())
    assert inbox.done.wait(5)
    assert [type(m) for m in inbox.items[:2]] == [EngineReady, EngineWarm]
    assert order == ["warm", "chat"]
    worker.shutdown()


def test_a_failed_warm_up_becomes_one_line() -> None:
    inbox = Inbox()

    class Broken(FakeEngine):
        def warm_up(self, config: GenerationConfig) -> None:
            raise ModelLoadError("no kernels")

    worker = EngineThread(lambda p: Broken(), inbox, warm=GenerationConfig())
    worker.start()
    assert inbox.done.wait(5)
    assert inbox.items[-1] == EngineFailed("no kernels")
