"""The cost of a streamed batch does not grow with the answer: finished Markdown units are drawn
once in parts of their own (GROUP lines or more each), only the open part redraws, and a batch
that adds no line repaints without a layout of the screen (the answer view and the stats panel
alike)."""

from __future__ import annotations

from pathlib import Path

import pytest
from edgespec.tui.answer import GROUP, HOLD, AnswerView
from edgespec.tui.app import PANEL_EVERY, ChatApp
from edgespec.tui.fake import FakeScript
from edgespec.tui.part import AnswerPart, TextLines
from edgespec.tui.widgets import StatsPanel, StatsView, SteadyFooter
from rich.text import Text
from textual.geometry import Region
from textual.pilot import Pilot
from textual.selection import Selection
from textual.visual import Visual, visualize
from textual.widget import Widget
from textual.widgets import Input
from textual.widgets._footer import FooterKey

from edgespec.events import Token
from tests.helpers.tui import make_app, run, wait_for


def tokens(*texts: str) -> list[Token]:
    kinds = ("accepted", "corrected", "bonus")
    return [Token(i, t, kinds[i % 3], i) for i, t in enumerate(texts)]  # type: ignore[arg-type]


def spy_refresh(monkeypatch: pytest.MonkeyPatch, cls: type[Widget]) -> list[tuple[Widget, bool]]:
    """Record (widget, layout) for every refresh of a `cls` widget."""
    calls: list[tuple[Widget, bool]] = []
    real = Widget.refresh

    def refresh(self, *regions, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if isinstance(self, cls):
            calls.append((self, bool(kwargs.get("layout"))))
        return real(self, *regions, **kwargs)

    monkeypatch.setattr(Widget, "refresh", refresh)
    return calls


def spy_regions(monkeypatch: pytest.MonkeyPatch, cls: type[Widget] = AnswerPart) -> list[Region]:
    """Record the regions of every `cls` refresh that names some."""
    regions: list[Region] = []
    real = cls.refresh

    def refresh(self, *given, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        regions.extend(given)
        return real(self, *given, **kwargs)

    monkeypatch.setattr(cls, "refresh", refresh)
    return regions


async def streaming_view(app: ChatApp, pilot: Pilot) -> AnswerView:
    """Once the app is ready, a new answer as the app makes it (streaming), in the conversation."""
    await wait_for(pilot, lambda: app.ready)
    view = app.answer_view()
    await app.query_one("#conversation").mount(view)
    return view


def test_finished_units_are_drawn_once_and_only_the_open_part_redraws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            view = AnswerView()
            await app.query_one("#conversation").mount(view)
            view.append(tokens("# Title", "\n\n", "One", " two", "\n\n", "- a", "\n", "- b"))
            await pilot.pause()
            shown = [p.text.plain for p in view.query(AnswerPart) if p.display]
            assert shown == ["Title\n\nOne two\n\n• a\n• b"]  # fewer than GROUP lines: one part
            paras = [t for i in range(GROUP // 2) for t in ("\n\n", f"Para {i}")]
            view.append(tokens(*paras, "\n\n", "Open"))
            await pilot.pause()
            group, tail = [p for p in view.query(AnswerPart) if p.display]
            assert group.text.plain.count("\n") + 1 >= GROUP  # finished units, drawn once
            assert group.text.plain.endswith(f"Para {GROUP // 2 - 1}")
            assert tail.text.plain == "\nOpen"
            calls = spy_refresh(monkeypatch, AnswerPart)
            view.append(tokens(" more", " words"))
            await pilot.pause()
            assert {part for part, _ in calls} == {tail}  # the open part, nothing else
            body = "\n\n".join(f"Para {i}" for i in range(GROUP // 2))
            head = "Title\n\nOne two\n\n• a\n• b"
            assert view.text().plain == f"{head}\n\n{body}\n\nOpen more words"

    run(scenario)


def test_text_lines_draw_as_textual_does_and_only_the_lines_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TextLines draws a text line by line into exactly the strips Textual draws for the whole
    text (wrapping, styles, blank lines, wide characters, the offsets selections use), and a new
    text draws only its lines that differ at their place."""
    app, _ = make_app(tmp_path)
    texts = [
        Text.assemble(
            ("bold", "bold"), " plain ", ("x" * 150, "green"), "\n\n", ("中文字" * 40, "red")
        ),
        Text("one\ntwo\n\nfour\n", "italic"),  # the same lines, but italic: all drawn again
        Text("one\ntwo\n\nfour\n"),
        Text.assemble("one\n", ("two changed", "blue"), "\n\nfour\n"),
        Text(""),
        # a wrapped piece of blanks only (drawn with no text), then lines of blanks
        Text.assemble("a" + " " * 300 + "b\n", ("   \n", "on blue"), "x" * 90, "\n \n"),
        Text.assemble("a" + " " * 300 + "c\n", ("   \n", "on blue"), "x" * 91, "\n \n"),
    ]

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            part = TextLines(Text("shown"))
            await app.query_one("#conversation").mount(part)
            await pilot.pause()
            look = (part.content_size.width, part.visual_style)
            assert look[0] > 60
            for text in texts:
                whole = Visual.to_strips(part, visualize(part, text), look[0], None, look[1])
                assert part._by_line.draw(part, text, *look) == whole
                for mine, theirs in zip(part._by_line.draw(part, text, *look), whole, strict=True):
                    assert list(mine) == list(theirs)  # styles and offsets too
            drawn: list[str] = []
            real = Visual.to_strips

            def to_strips(widget, visual, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
                drawn.append(str(visual).strip("\n"))
                return real(widget, visual, *args, **kwargs)

            monkeypatch.setattr(Visual, "to_strips", to_strips)
            part._by_line.draw(part, texts[2], *look)
            assert drawn == ["one\ntwo\n\nfour"]  # after the italic lines: all, in one drawing
            drawn.clear()
            part._by_line.draw(part, texts[3], *look)
            assert drawn == ["two changed"]
            part._by_line.draw(part, texts[6], *look)
            drawn.clear()
            mine = part._by_line.draw(part, texts[5], *look)  # lines 0 and 2 wrap and differ
            assert len(drawn) == 1 and drawn[0].count("\n") == 2  # one drawing, line 1 blank
            assert mine == real(part, visualize(part, texts[5]), look[0], None, look[1])

    run(scenario)


def test_a_batch_that_adds_no_line_repaints_without_a_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            view = AnswerView()
            await app.query_one("#conversation").mount(view)
            view.append(tokens("Some", " words"))
            await pilot.pause()
            calls = spy_refresh(monkeypatch, AnswerPart)
            regions = spy_regions(monkeypatch)
            view.append(tokens(" on", " one", " line"))
            assert [(r.y, r.height) for r in regions] == [(0, 1)]  # the one line that changed
            view.append(tokens("\n", "and", " a", " second", " line"))
            assert [layout for _, layout in calls] == [False, True]

    run(scenario)


def test_the_stats_panel_repaints_without_a_layout_while_its_lines_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            panel = app.query_one(StatsPanel)
            view = StatsView(k=1, temperature=0.0, spec_on=True, hist=[1, 2])
            panel.show(view)
            await pilot.pause()
            calls = spy_refresh(monkeypatch, TextLines)
            regions = spy_regions(monkeypatch, TextLines)
            panel.show(StatsView(k=1, temperature=0.0, spec_on=True, hist=[1, 3], rounds=9))
            assert calls and not any(layout for _, layout in calls)
            table = str(app.query_one("#table", TextLines).render()).splitlines()
            rounds = next(y for y, line in enumerate(table) if line.startswith("Rounds"))
            # the one table line that changed, then both bars (the longest sets the scale)
            assert [(r.y, r.height) for r in regions] == [(rounds, 1), (0, 2)]
            calls.clear()
            panel.show(StatsView(k=1, temperature=0.0, spec_on=True, hist=[1, 3, 1]))
            assert [s.id for s, layout in calls if layout] == ["histogram"]  # one more line

    run(scenario)


def test_the_histogram_keeps_its_rows_from_turn_to_turn_until_the_settings_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """K + 1 rows from the start (adaptive K: its largest K + 1); a new turn's empty histogram
    keeps the rows the last one took (no layout at its start, none at its first rounds); new
    settings start again from there."""
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            panel, hist = app.query_one(StatsPanel), app.query_one("#histogram", TextLines)
            panel.show(StatsView(k=2, temperature=0.0, spec_on=True))
            await pilot.pause()
            assert hist.size.height == 3  # "no drafted rounds yet" and two held lines
            panel.show(StatsView(k=2, temperature=0.0, spec_on=True, hist=[1, 0, 2, 4]))
            await pilot.pause()
            assert hist.size.height == 4  # a round took a long n-gram match: one line more
            calls = spy_refresh(monkeypatch, TextLines)
            for turn in ([], [2], [2, 1, 0, 1]):  # the next turn: its start and first rounds
                panel.show(StatsView(k=2, temperature=0.0, spec_on=True, hist=turn))
            assert not any(s.id == "histogram" and layout for s, layout in calls)
            panel.show(StatsView(k=1, temperature=0.0, spec_on=True))  # K changed
            await pilot.pause()
            assert hist.size.height == 2
            panel.show(StatsView(k=1, temperature=0.0, spec_on=True, adaptive=True, k_max=5))
            await pilot.pause()
            assert hist.size.height == 6  # adaptive K: a row per length up to its largest K

    run(scenario)


def test_a_streaming_answer_holds_lines_from_the_start_and_lays_out_once_per_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mount lays the held lines out with the question, so the first tokens repaint; then a
    layout comes once per hold, and none is held once the answer ends."""
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            view = await streaming_view(app, pilot)
            await pilot.pause()
            tail, hold = list(view.query(AnswerPart))[-1], view.hold()
            conversation = app.query_one("#conversation").scrollable_content_region.height
            assert hold == max(HOLD, conversation // 2) > HOLD  # half the view at 120x40
            assert tail.display and tail.size.height == hold and not view.text().plain
            calls = spy_refresh(monkeypatch, AnswerPart)
            view.append(tokens("```", "\n", "line", " 0"))  # the first tokens
            await pilot.pause()
            assert tail.size.height == hold  # one code line, the rest held blank
            for i in range(1, hold):  # each token starts a code line: all within the hold
                view.append(tokens("\n", f"line {i}"))
            assert [layout for _, layout in calls] == [False] * hold
            view.append(tokens("\n", f"line {hold}"))  # one more line than held
            assert calls[-1][1]
            await pilot.pause()
            assert tail.size.height == 2 * hold
            view.set_note("")  # the answer ends: no line held
            await pilot.pause()
            assert tail.size.height == hold + 1 and not view.text().plain.endswith("\n")
            finished = AnswerView()  # an answer that does not stream takes no room while empty
            await app.query_one("#conversation").mount(finished)
            await pilot.pause()
            assert not any(part.display for part in finished.query(AnswerPart))

    run(scenario)


def test_the_live_panel_is_redrawn_in_a_batch_at_most_every_panel_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While batches come, the panel is redrawn in the frame of a batch (one paint for both), at
    most every PANEL_EVERY; the timer only catches up when the batches stop (within 2 periods
    of the last redraw, and a tick)."""
    held = round(3 * PANEL_EVERY / 0.05)  # rounds streamed before the hold: 3 periods
    app, _ = make_app(tmp_path, FakeScript(answer_tokens=200, round_delay=0.05, hold_after=held))
    batches: list[int] = []
    shows: list[tuple[bool, bool]] = []  # (live, in a batch)
    in_batch = [False]
    real_batch, real_show = ChatApp.on_stream_batch, StatsPanel.show

    def on_batch(self, message):  # noqa: ANN001, ANN202
        batches.append(1)
        in_batch[0] = True
        try:
            real_batch(self, message)
        finally:
            in_batch[0] = False

    monkeypatch.setattr(ChatApp, "on_stream_batch", on_batch)
    monkeypatch.setattr(
        StatsPanel, "show", lambda s, v: [shows.append((v.live, in_batch[0])), real_show(s, v)]
    )

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            await pilot.press(*"hi", "enter")
            # every Round folded in (a round's tokens can come a batch before its Round)
            await wait_for(pilot, lambda: app._meter is not None and sum(app._meter.hist) == held)
            live = [batch for is_live, batch in shows if is_live]
            assert 0 < len(live) < len(batches)  # fewer live redraws than batches
            assert any(live)  # drawn in a batch's frame
            shows.clear(), batches.clear()
            table = app.query_one("#table", TextLines)
            rounds = f"Rounds       {held}"
            await wait_for(pilot, lambda: rounds in str(table.render()), 4 * PANEL_EVERY)
            await pilot.pause(2 * PANEL_EVERY)  # held mid-answer: the panel caught up, once
            assert batches == [] and len(shows) <= 1  # by the timer, at most once
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.waiting is None)
            assert shows[-1][0] is False  # the final stats, drawn at once

    run(scenario)


def test_stop_greys_and_lights_in_the_footer_without_a_recompose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's start and end only change whether Stop is enabled: the footer's keys stay mounted
    and Stop is lit while the answer streams, greyed before and after."""
    app, _ = make_app(tmp_path, FakeScript(answer_tokens=200, round_delay=0.02, hold_after=10))
    recomposes: list[int] = []
    real = SteadyFooter.recompose
    monkeypatch.setattr(SteadyFooter, "recompose", lambda s: [recomposes.append(1), real(s)][1])

    def stop_key() -> FooterKey:
        return next(k for k in app.query_one(SteadyFooter).query(FooterKey) if k.action == "stop")

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            await pilot.pause()
            key, recomposes[:] = stop_key(), []
            assert key.has_class("-disabled")
            await pilot.press(*"hi", "enter")
            await wait_for(pilot, lambda: app._meter is not None and app._meter.per_round)
            await pilot.pause()
            assert not key.has_class("-disabled") and stop_key() is key
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.waiting is None)
            await pilot.pause()
            assert key.has_class("-disabled") and stop_key() is key
            assert recomposes == []

    run(scenario)


def test_a_streaming_answer_groups_finished_units_only_when_it_lays_out(tmp_path: Path) -> None:
    """Mounting a part lays out the screen: finished units stay in the open part while it grows
    within the lines it holds, and move into a part of their own when it outgrows them."""
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            view = await streaming_view(app, pilot)
            view.append(tokens("First"))
            await pilot.pause()
            hold, n = view.hold(), 1

            def lines() -> int:
                return view.text().plain.count("\n") + 1

            while lines() + 2 <= hold:  # paragraphs of a line and a blank, within the hold
                view.append(tokens("\n\n", f"Para {n}"))
                n += 1
            await pilot.pause()
            assert n > GROUP // 2 + 1  # more finished lines than GROUP, yet one part
            assert len([p for p in view.query(AnswerPart) if p.display]) == 1
            while lines() <= hold:
                view.append(tokens("\n\n", f"Para {n}"))
                n += 1
            await pilot.pause()
            group, tail = [p for p in view.query(AnswerPart) if p.display]
            assert group.text.plain.startswith("First") and tail.text.plain.endswith(
                f"Para {n - 1}"
            )
            paras = ["First", *(f"Para {i}" for i in range(1, n))]
            assert view.text().plain == "\n\n".join(paras)

    run(scenario)


def test_the_prompt_cursor_stops_blinking_while_an_answer_streams(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, FakeScript(answer_tokens=200, round_delay=0.02, hold_after=10))

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            prompt = app.query_one("#prompt", Input)
            assert prompt.cursor_blink
            await pilot.press(*"hi", "enter")
            await wait_for(pilot, lambda: app._meter is not None and app._meter.per_round)
            assert not prompt.cursor_blink
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.waiting is None)
            assert prompt.cursor_blink

    run(scenario)


def test_an_answer_ending_within_its_hold_keeps_no_blank_lines_and_copies_as_text(
    tmp_path: Path,
) -> None:
    """The held lines go with the stream's end even when the height stays (the text filled them),
    and a selection over a part copies its text (Textual reads it from `render`)."""
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            view = await streaming_view(app, pilot)
            view.append(tokens("```", "\n", "line 0"))
            await pilot.pause()
            hold = view.hold()
            longer = " is a longer line of code"  # every other line wraps when narrower
            more = [t for i in range(1, hold) for t in ("\n", f"line {i}{longer * (i % 2)}")]
            view.append(tokens(*more))
            await pilot.pause()
            tail = list(view.query(AnswerPart))[-1]
            assert tail.size.height == hold  # the text fills the hold exactly
            view.set_note("")  # ends: the height stays, held at 1 line from now
            await pilot.pause()
            await pilot.resize_terminal(70, 40)  # narrower: the code lines wrap
            await pilot.pause()
            width = tail.content_size.width
            drawn = Visual.to_strips(
                tail, visualize(tail, tail.text), width, None, tail.visual_style
            )
            assert tail.size.height == len(drawn)  # no blank lines held after them
            assert len(drawn) % hold  # (held ones would have shown: not a multiple)
            await pilot.resize_terminal(120, 40)
            await pilot.pause()
            app.screen.selections = {tail: Selection(None, None)}
            copied = app.screen.get_selected_text()
            assert copied is not None and copied.splitlines()[-1].strip() == more[-1]

    run(scenario)
