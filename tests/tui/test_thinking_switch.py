"""The chat's thinking switch (issue 72): the header shows the chat template's thinking mode
where it has one, F10 turns it on and off from the next answer, --think / --no-think set it at
start, and on a template without the mode the switch says so instead of pretending."""

from __future__ import annotations

from pathlib import Path

from edgespec.tui.app import ChatApp
from edgespec.tui.fake import FakeScript
from edgespec.tui.store import ChatStore

from edgespec.config import GenerationConfig, SpecConfig
from tests.helpers.tui import FakeLoader, ask, run, wait_for


class Recording(ChatApp):
    """The chat app keeping every notification it made: Textual drops one from its own list
    once its timeout (5 s) has passed, and under the full suite on 2 cores that passed once
    between the engine's ready message and the check that read it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.said: list[str] = []

    def notify(self, message, *args, **kwargs) -> None:
        self.said.append(str(message))
        super().notify(message, *args, **kwargs)

    def clear_notifications(self) -> None:
        self.said.clear()
        super().clear_notifications()


def app_with(tmp_path: Path, thinking: bool | None, think: bool | None = None):
    loader = FakeLoader(FakeScript(thinking=thinking))
    config = GenerationConfig(spec=SpecConfig(k=2, method="draft", adaptive=False))
    app = Recording(loader, config, ChatStore(tmp_path / "chats"), what="fake", think=think)
    return app, loader


def notes(app: Recording) -> list[str]:
    return list(app.said)


def test_the_header_shows_the_mode_and_f10_switches_it_for_the_next_answer(tmp_path):
    app, loader = app_with(tmp_path, thinking=True)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            assert app.sub_title == "fake-target + fake-draft · thinking on"
            await ask(pilot, app, "one")
            await pilot.press("f10")
            assert app.sub_title.endswith("· thinking off")
            await ask(pilot, app, "two")
            await pilot.press("f10")
            await ask(pilot, app, "three")
            assert loader.engine is not None
            assert loader.engine.thinks == [True, False, True]

    run(scenario)


def test_no_think_at_start_replaces_the_pairs_default(tmp_path):
    app, loader = app_with(tmp_path, thinking=True, think=False)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            assert app.sub_title.endswith("· thinking off")
            await ask(pilot, app, "one")
            assert loader.engine is not None and loader.engine.thinks == [False]
            assert not any("thinking mode" in n for n in notes(app))

    run(scenario)


def test_a_template_without_the_mode_shows_nothing_and_says_so_once_when_asked(tmp_path):
    app, loader = app_with(tmp_path, thinking=None, think=False)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            assert app.sub_title == "fake-target + fake-draft"
            said = [n for n in notes(app) if "has no thinking mode" in n]
            assert len(said) == 1 and "--no-think changes nothing" in said[0]
            app.clear_notifications()
            await pilot.press("f10")
            assert any("has no thinking mode" in n for n in notes(app))
            assert app.sub_title == "fake-target + fake-draft"
            await ask(pilot, app, "one")
            assert loader.engine is not None and loader.engine.thinks == [None]

    run(scenario)
