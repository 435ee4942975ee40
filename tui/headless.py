"""The chat app driven headless through Textual's Pilot, for `edgespec bench --cold` (mode
"app"): a user at a 120x40 terminal who waits for the warm-up, types one prompt and reads the
answer. It returns the engine's own Stats of that answer as the panel shows them, so that the
bench can set them beside the same engine's without the app (edgespec.bench.cold).

The bench runs one job of mode "app" as `python -m edgespec.tui.headless JOB` in a fresh process
(edgespec.bench.cold.APP_MODULE): this side imports the bench's job, the bench imports nothing
of tui/ (pyproject.toml's layers).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from edgespec.tui.app import ChatApp
from edgespec.tui.engine_thread import ProgressFn
from edgespec.tui.store import ChatStore

from edgespec.bench.cold import ColdJob, run_job
from edgespec.config import GenerationConfig
from edgespec.errors import EdgeSpecError
from edgespec.worker import ServedEngine

SIZE = (120, 40)


async def _wait(predicate: Callable[[], object], timeout: float, every: float = 0.05) -> None:
    """Poll `predicate` every `every` seconds with plain sleeps: a Pilot pause waits for the app
    to go idle, which made the bench's own polling a visible share of the UI thread's time."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise EdgeSpecError(f"the headless chat timed out after {timeout:.0f} s")
        await asyncio.sleep(every)


def first_answer(
    load: Callable[[ProgressFn], ServedEngine],
    config: GenerationConfig,
    prompt: str,
    timeout: float = 600.0,
) -> dict:
    """Open the app on `load`'s engine, wait until it is warm, ask `prompt`; returns the saved
    answer's stats (ChatStore's JSON: tokens_per_s, ttft, acceptance, ...) plus "warm_up_s" and
    "ui_cpu_s", the CPU time of the UI thread (the app's own work) from Enter to the end."""
    with tempfile.TemporaryDirectory() as tmp:
        app = ChatApp(load, config, ChatStore(Path(tmp)), what="headless")
        out: dict = {}

        async def scenario() -> None:
            async with app.run_test(size=SIZE) as pilot:
                start = time.monotonic()
                await _wait(lambda: app.warm or app.load_error, timeout)
                if app.load_error:
                    raise EdgeSpecError(app.load_error)
                out["warm_up_s"] = time.monotonic() - start
                app.query_one("#prompt").value = prompt  # type: ignore[attr-defined]
                cpu = time.thread_time()
                await pilot.press("enter")
                # Seldom: each wake-up is UI-thread time that is the bench's, not the app's (at
                # 20 a second, 0.7% of the decode time on a 2-core CPU); the end is seen late
                # by 0.25 s at most, while the app idles.
                await _wait(lambda: app._turn == 1 and app.waiting is None, timeout, every=0.25)
                reply = app.conv.messages[-1]
                out.update(reply.stats or {}, reason=reply.reason)
                out["ui_cpu_s"] = time.thread_time() - cpu

        asyncio.run(scenario())
        return out


def app_answer(job: ColdJob) -> dict:
    """One `bench --cold` job of mode "app": first_answer on the job's pair and settings."""
    from edgespec.runtime import Engine

    def load(on_progress: ProgressFn) -> ServedEngine:  # called on the app's engine thread
        engine = Engine.load(**job.model, on_progress=on_progress)
        if job.think is not None and engine.thinking_mode() is not None:
            engine.thinking = job.think
        return engine

    return first_answer(load, job.config(), job.prompt)


if __name__ == "__main__":
    run_job(app_answer)
