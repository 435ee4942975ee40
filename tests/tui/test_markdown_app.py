"""Pilot tests of Markdown answers in the app: the colour, reasoning and copy keys, the reasoning
counted apart in the stats panel, a reasoning part shown while it streams."""

from __future__ import annotations

from pathlib import Path

from edgespec.tui.answer import AnswerView
from edgespec.tui.fake import MARKDOWN, FakeScript
from edgespec.tui.part import TextLines
from edgespec.tui.widgets import StatsPanel
from rich.style import Style

from tests.helpers.tui import ask, make_app, run, wait_for


def shown(view: AnswerView) -> str:
    return view.text().plain


def colours(view: AnswerView) -> set[object]:
    styles = [
        Style.parse(s.style) if isinstance(s.style, str) else s.style for s in view.text().spans
    ]
    return {style.color for style in styles if style.color}


def test_keys_fold_reasoning_switch_colours_and_copy_code(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, FakeScript(text=MARKDOWN))
    pieces = FakeScript(text=MARKDOWN).pieces() or []
    think = next(i for i, p in enumerate(pieces) if "</think>" in p) + 1

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await ask(pilot, app, "Fibonacci?")
            (view,) = app.shown_answers()
            text = shown(view)
            assert text.startswith("▶ Thought") and "small example" not in text  # folded
            assert "```" not in text and "def fib(n: int) -> int:" in text
            table = str(app.query_one(StatsPanel).query_one("#table", TextLines).render())
            assert f"Reasoning    {think} tokens" in table
            assert f"Answer       {len(pieces) - think} tokens" in table
            await pilot.press("f9")
            assert "small example" in shown(view)
            await pilot.click(AnswerView, offset=(3, 0))  # the reasoning's title line
            assert "small example" not in shown(view)
            token_colours = {view._look.kinds[k].color for k in ("accepted", "corrected")}
            assert token_colours <= colours(view)
            await pilot.press("f7")
            assert not view.provenance and not token_colours & colours(view)
            app.query_one("#prompt").focus()  # the click focused the conversation
            await ask(pilot, app, "Again?")
            assert not app.shown_answers()[-1].provenance  # new answers keep the mode
            await pilot.press("f7")
            assert all(v.provenance for v in app.shown_answers())
            await pilot.press("f8")
            assert app.clipboard.startswith("from functools import cache\n")
            assert app.clipboard.endswith("fib(n - 2)\n")

    run(scenario)


def test_reasoning_is_shown_while_it_streams(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, FakeScript(text=MARKDOWN, hold_after=2))

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            await pilot.press(*"why", "enter")
            await wait_for(pilot, lambda: app._answer is not None and "user" in app._answer.plain)
            await pilot.pause(0.1)
            assert app.waiting is not None and app._answer is not None
            text = shown(app._answer)
            assert text.startswith("▼ Thinking…") and "<think>" not in text
            table = lambda: str(app.query_one(StatsPanel).query_one("#table", TextLines).render())  # noqa: E731
            await wait_for(pilot, lambda: "Reasoning" in table())  # the live panel's next tick
            assert "Answer       0 tokens" in table()
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.waiting is None)

    run(scenario)


def test_an_empty_reasoning_part_is_not_shown(tmp_path: Path) -> None:
    """Qwen3 with thinking off writes an empty <think></think> first: no block for it."""
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await wait_for(pilot, lambda: app.ready)
            empty = AnswerView([("target", "<think>\n\n</think>\n\nHi **there**")])
            full = AnswerView([("target", "<think>why</think>Hi")])
            await app.query_one("#conversation").mount(empty, full)
            assert shown(empty) == "Hi there"
            assert shown(full).startswith("▶ Thought") and shown(full).endswith("Hi")

    run(scenario)
