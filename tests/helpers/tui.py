"""Shared helpers for the TUI tests: an app on the scripted fake engine and a polling wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from edgespec.tui.app import ChatApp
from edgespec.tui.fake import FakeEngine, FakeScript
from edgespec.tui.store import ChatStore
from textual.pilot import Pilot

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig


class FakeLoader:
    """A loader that remembers the engine it built, so tests can inspect calls and threads."""

    def __init__(self, script: FakeScript) -> None:
        self.script = script
        self.engine: FakeEngine | None = None

    def __call__(self, on_progress: Callable[[str, float | None], None]) -> FakeEngine:
        self.engine = FakeEngine.load(self.script, on_progress)
        return self.engine


def make_app(
    tmp_path: Path,
    script: FakeScript | None = None,
    k: int = 4,
    temperature: float = 0.0,
    adaptive: bool = False,
) -> tuple[ChatApp, FakeLoader]:
    loader = FakeLoader(script or FakeScript())
    config = GenerationConfig(
        sampling=SamplingConfig(temperature=temperature),
        spec=SpecConfig(k=k, adaptive=adaptive, method="draft"),
        max_tokens=256,
    )
    return ChatApp(loader, config, ChatStore(tmp_path / "chats"), what="fake pair"), loader


async def wait_for(pilot: Pilot, predicate: Callable[[], object], timeout: float = 10.0) -> None:
    """Let the app run until `predicate()` is true; fail the test after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {predicate}")
        await pilot.pause(0.02)


async def ask(pilot: Pilot, app: ChatApp, prompt: str) -> None:
    """Type a prompt, press Enter and wait until the answer finished and its save is written."""
    await wait_for(pilot, lambda: app.ready)
    turn = app._turn
    await pilot.press(*prompt, "enter")
    await wait_for(pilot, lambda: app._turn == turn + 1 and app.waiting is None)
    assert app.saver.flush(timeout=10)


def run(scenario: Callable[[], object]) -> None:
    """Run an async test scenario to completion (no async pytest plugin needed)."""
    asyncio.run(scenario())  # type: ignore[arg-type]
