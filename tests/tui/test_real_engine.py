"""End to end with the real Engine on tiny seeded models (no fake): load, two turns, stop."""

from __future__ import annotations

from pathlib import Path

import pytest
from edgespec.tui.app import ChatApp
from edgespec.tui.store import ChatStore
from edgespec.tui.widgets import AnswerView

from edgespec.config import GenerationConfig, SpecConfig
from tests.helpers.tui import ask, run, wait_for

pytest.importorskip("mlx.core")


def test_real_tiny_pair_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgespec.runtime import Engine
    from tests.helpers.tiny import make_tiny_pair

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))  # the warm-up's calibration
    target, draft = make_tiny_pair(tmp_path / "pair", seed=0, draft="self")

    def load(progress):  # noqa: ANN001
        return Engine.load(target=str(target), draft=str(draft), on_progress=progress)

    config = GenerationConfig(spec=SpecConfig(k=3), max_tokens=24)
    app = ChatApp(load, config, ChatStore(tmp_path / "chats"), what="tiny pair")

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready or app.load_error, timeout=120)
            assert app.load_error is None
            await wait_for(pilot, lambda: list((tmp_path / "home").glob("calibration/*.json")))
            await ask(pilot, app, "hello model")
            first = app.conv.messages[-1]
            assert first.reason == "length" and first.content
            # A self-draft agrees with the target always: accepted drafts and bonus tokens.
            assert {k for k, _ in first.runs} == {"accepted", "bonus"}
            assert first.stats["acceptance"] == 1.0
            await ask(pilot, app, "and again")
            second = app.conv.messages[-1].stats
            # The second turn reuses the cached prefix: fewer tokens prefilled than prompted.
            assert second["prefilled_tokens"] < second["prompt_tokens"]
            await pilot.press("ctrl+t")
            await ask(pilot, app, "plain now")
            answer = [a for a in app.query(AnswerView) if type(a) is AnswerView][-1]
            assert {k for k, _ in answer.runs} == {"target"}
            assert app.plain_tps and app.spec_tps

    run(scenario)
