"""SVG snapshots of what the user sees: the token-coloured answer and the stats panel.

Deterministic: the fake engine reports simulated timings, so every number on screen is fixed.
Update after an intended visual change with `pytest tests/tui/test_snapshots.py --snapshot-update`
and look at the SVGs under tests/tui/__snapshots__/ before committing them.
"""

from __future__ import annotations

from pathlib import Path

from edgespec.tui.fake import MARKDOWN, FakeScript
from textual.pilot import Pilot
from textual.widgets import Input

from edgespec.errors import TokenizerMismatchError
from tests.helpers.tui import ask, make_app, wait_for

SIZE = (120, 40)


async def _quiet(pilot: Pilot) -> None:
    pilot.app.query_one(Input).cursor_blink = False
    pilot.app.clear_notifications()
    await pilot.pause()


def test_coloured_answer_and_stats_panel(snap_compare, tmp_path: Path) -> None:
    """One speculative answer, one plain answer (speculation toggled off), then back on:
    accepted / corrected / bonus / target tokens, acceptance, TTFT, speedup, sparkline, histogram."""
    app, _ = make_app(tmp_path)

    async def run_before(pilot: Pilot) -> None:
        await ask(pilot, app, "What is speculative decoding?")
        await pilot.press("ctrl+t")
        await ask(pilot, app, "Again without speculation")
        await pilot.press("ctrl+t")
        await ask(pilot, app, "And with it")
        await _quiet(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_light_theme(snap_compare, tmp_path: Path) -> None:
    """The same token styles must stay readable on a light theme."""
    app, _ = make_app(tmp_path)

    async def run_before(pilot: Pilot) -> None:
        pilot.app.theme = "textual-light"
        await ask(pilot, app, "What is speculative decoding?")
        await _quiet(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_markdown_answer_coloured_by_provenance(snap_compare, tmp_path: Path) -> None:
    """A reasoning model's Markdown answer: the reasoning folded (and counted apart in the
    panel), a heading, bold, inline code, a fenced block with its language label and no fences,
    a list and a link, every character in its token's colour."""
    app, _ = make_app(tmp_path, FakeScript(text=MARKDOWN))

    async def run_before(pilot: Pilot) -> None:
        await ask(pilot, app, "Fibonacci in Python?")
        await _quiet(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_markdown_answer_without_provenance(snap_compare, tmp_path: Path) -> None:
    """The same answer with provenance colours off (F7) and the reasoning unfolded (F9): the
    Markdown styles only, the reasoning dimmed, the code in syntax colours."""
    app, _ = make_app(tmp_path, FakeScript(text=MARKDOWN))

    async def run_before(pilot: Pilot) -> None:
        await ask(pilot, app, "Fibonacci in Python?")
        await pilot.press("f7", "f9")
        await _quiet(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_load_error_screen(snap_compare, tmp_path: Path) -> None:
    err = TokenizerMismatchError("draft and target tokenizers differ (vocab 49152 vs 32000)")
    app, _ = make_app(tmp_path, FakeScript(load_error=err))

    async def run_before(pilot: Pilot) -> None:
        await wait_for(pilot, lambda: app.load_error is not None)
        await pilot.pause(0.05)

    assert snap_compare(app, terminal_size=(100, 24), run_before=run_before)
