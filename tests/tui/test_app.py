"""Pilot tests of the chat app on the scripted fake engine: what a user types, sees and keeps."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from edgespec.tui.fake import FakeEngine, FakeScript
from edgespec.tui.part import TextLines
from edgespec.tui.screens import LoadingScreen, PastChatsScreen
from edgespec.tui.widgets import AnswerView, StatsPanel, UserMessage
from textual.widgets import Input, OptionList, Static

from edgespec.errors import ModelNotFoundError, PromptError
from tests.helpers.tui import ask, make_app, run, wait_for


def expected_answer(prompt: str, spec: bool = True, k: int = 4) -> tuple[str, list[str]]:
    """What the fake says to a one-message chat, and the kinds of its tokens (reference run)."""
    from edgespec.config import GenerationConfig, SpecConfig

    cfg = GenerationConfig(spec=SpecConfig(k=k, method="draft" if spec else "none", adaptive=False))
    events = list(FakeEngine().chat([{"role": "user", "content": prompt}], cfg))
    return events[-1].text, [e.kind for e in events if e.type == "token"]


def table_text(app) -> str:
    return str(app.query_one(StatsPanel).query_one("#table", TextLines).render())


def test_prompt_streams_a_coloured_answer_and_saves_it(tmp_path: Path) -> None:
    app, loader = make_app(tmp_path, FakeScript(round_delay=0.01))

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await ask(pilot, app, "hello there")
            answers = app.query(AnswerView).exclude("Legend").results()
            (answer,) = [a for a in answers if type(a) is AnswerView]
            text, kinds = expected_answer("hello there")
            assert answer.plain == text
            assert {k for k, _ in answer.runs} == {"accepted", "corrected", "bonus"}
            assert [u.render().plain for u in app.query(UserMessage)] == ["hello there"]
            assert app.query_one("#prompt", Input).value == ""
            table = table_text(app)
            assert "55.8 %" in table and "Rounds       13" in table
            saved = json.loads(next((tmp_path / "chats").glob("*.json")).read_text())
            assert [m["role"] for m in saved["messages"]] == ["user", "assistant"]
            assert saved["messages"][1]["content"] == text
            assert saved["messages"][1]["reason"] == "stop"
            kinds_saved = [k for k, _ in saved["messages"][1]["runs"]]
            assert set(kinds_saved) == set(kinds)

    run(scenario)


def test_engine_loads_and_generates_on_one_worker_thread(tmp_path: Path) -> None:
    app, loader = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await ask(pilot, app, "hi")
            threads = loader.engine.threads - {threading.main_thread().ident}
            assert len(threads) == 1  # load and chat ran on the same non-UI thread

    run(scenario)


def test_stop_mid_answer_keeps_the_partial_answer(tmp_path: Path) -> None:
    app, loader = make_app(tmp_path, FakeScript(hold_after=3))

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await wait_for(pilot, lambda: app.ready)
            await pilot.press(*"tell me", "enter")
            await wait_for(pilot, lambda: app._reply is not None and app._reply.content)
            await pilot.pause(0.1)
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.waiting is None)
            reply = app.conv.messages[-1]
            full, _ = expected_answer("tell me")
            assert reply.reason == "cancelled"
            assert reply.content and full.startswith(reply.content) and reply.content != full
            answer = [a for a in app.query(AnswerView) if type(a) is AnswerView][-1]
            assert answer.note == "[stopped]"
            # The next turn works and sends the partial answer as history.
            await pilot.press(*"go on", "enter")
            await wait_for(pilot, lambda: len(loader.engine.calls) == 2)
            sent = loader.engine.calls[1][0]
            assert sent[1] == {"role": "assistant", "content": reply.content}
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.waiting is None)

    run(scenario)


def test_answer_in_progress_is_saved_periodically(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, FakeScript(hold_after=2))

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await wait_for(pilot, lambda: app.ready)
            await pilot.press(*"q", "enter")
            path = tmp_path / "chats" / f"{app.conv.id}.json"

            def partial_saved() -> bool:
                if not path.exists():  # the saver's thread writes it
                    return False
                msgs = json.loads(path.read_text())["messages"]
                return len(msgs) == 2 and msgs[1]["reason"] == "partial" and msgs[1]["content"]

            await wait_for(pilot, partial_saved, timeout=5)
            assert app.waiting is not None  # still generating: this was a mid-answer save
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.waiting is None)

    run(scenario)


def test_a_chat_folder_that_cannot_be_written_is_one_notice_not_a_crash(tmp_path: Path) -> None:
    """The chats folder is a path under a file: the answers still stream and stay on screen and
    in the conversation (sent as history), and the app says once that the chat is not saved."""
    app, loader = make_app(tmp_path)
    (tmp_path / "chats").write_text("a file where the folder should be")

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await ask(pilot, app, "first")
            await ask(pilot, app, "second")
            assert [m.role for m in app.conv.messages] == ["user", "assistant"] * 2
            assert loader.engine.calls[-1][0][0] == {"role": "user", "content": "first"}
            notes = [n.message for n in app._notifications if "cannot save" in n.message]
            assert len(notes) == 1 and "\n" not in notes[0], notes
            assert str(tmp_path / "chats") in notes[0]

    run(scenario)


def test_new_chat_clears_view_and_resets_engine(tmp_path: Path) -> None:
    app, loader = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await ask(pilot, app, "first")
            old_id = app.conv.id
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: loader.engine.resets == 1)
            assert app.conv.id != old_id and app.conv.messages == []
            assert not app.query(UserMessage)
            await ask(pilot, app, "second")
            assert loader.engine.calls[-1][0] == [{"role": "user", "content": "second"}]
            assert len(list((tmp_path / "chats").glob("*.json"))) == 2

    run(scenario)


@pytest.mark.parametrize("idle", [True, False])
def test_garbage_is_collected_between_answers_not_during_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, idle: bool
) -> None:
    """The command line's app (`collect_when_idle`) schedules the garbage collector IDLE_COLLECT
    seconds after each answer ends, and the collection is skipped when the next answer is
    streaming by then; an app made without it never schedules one. The test holds the timers
    and fires them itself, so a slow machine cannot move one across an answer."""
    from edgespec.tui import app as tui_app

    app, loader = make_app(tmp_path, FakeScript(hold_after=2))  # held unless `release` is set
    app.collect_when_idle = idle
    calls: list[bool] = []  # app.generating at each collection
    monkeypatch.setattr(tui_app.gc, "collect", lambda *args: calls.append(app.generating))
    held: list[tuple[float, Callable[[], object]]] = []  # the collection timers, unfired
    set_timer = app.set_timer

    def hold(delay: float, callback: Callable[[], object] | None = None, **kwargs: Any) -> Any:
        if callback == app._collect:
            held.append((delay, callback))
            return None
        return set_timer(delay, callback, **kwargs)

    monkeypatch.setattr(app, "set_timer", hold)

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await wait_for(pilot, lambda: app.ready)
            assert loader.engine is not None
            loader.engine.release.set()
            await ask(pilot, app, "first")
            assert [d for d, _ in held] == ([tui_app.IDLE_COLLECT] if idle else [])
            loader.engine.release.clear()  # the second answer streams until released
            app.query_one("#prompt", Input).value = "second"  # sent at once, not typed
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.generating)
            for _, fire in held:  # the first answer's timer comes due while the second streams
                fire()
            assert calls == []
            loader.engine.release.set()
            await wait_for(pilot, lambda: app._turn == 2 and not app.generating)
            assert len(held) == (2 if idle else 0)
            for _, fire in held[1:]:  # the second's, with nothing streaming
                fire()

    run(scenario)
    assert calls == ([False] if idle else [])


def test_the_chat_commands_loader_freezes_what_it_loaded() -> None:
    """`edgespec chat`'s loader (run on the engine thread) loads the engine, then freezes what
    the process holds out of the garbage collector's full passes."""
    import argparse
    import gc

    from edgespec.tui import command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    gc.unfreeze()
    try:
        engine = command.loader(parser.parse_args(["--fake"]), None)(lambda text, fraction: None)
        assert isinstance(engine, FakeEngine)
        assert gc.get_freeze_count() > 0
        assert not any(o is engine for o in gc.get_objects())  # frozen: in no generation
    finally:
        gc.unfreeze()  # the test process's objects go back to the collector


def test_a_new_chat_frees_the_answers_of_the_old_one(tmp_path: Path) -> None:
    """After ^n the old chat's answers, and the lines they drew, are freed: nothing (such as a
    theme watcher left on the app) keeps them alive."""
    import gc
    import weakref

    app, loader = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await ask(pilot, app, "first")
            (old,) = [weakref.ref(a) for a in app.query(AnswerView) if type(a) is AnswerView]
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: loader.engine.resets == 1)
            await ask(pilot, app, "second")
            gc.collect()
            assert old() is None
            new = [a for a in app.query(AnswerView) if type(a) is AnswerView]
            assert len(new) == 1 and new[0].plain  # the new chat's answer is the one left

    run(scenario)


def test_new_chats_do_not_keep_the_lines_old_chats_drew(tmp_path: Path) -> None:
    """A long session stays flat: after each ^n and a full collection the number of live Textual
    `Strip`s (each drawn line, with its segments and styles) does not grow with the number of
    chats, and the old chat's widgets' style caches are freed (Textual's `get_inner_outer` memo
    kept them, with their lines, for up to 1,024 widgets)."""
    import gc
    import itertools
    import statistics
    import weakref

    from textual.strip import Strip

    app, loader = make_app(tmp_path)
    live: list[int] = []

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            for i in range(8):
                await ask(pilot, app, f"question {i}")
                if i == 1:
                    (message,) = app.query(UserMessage)
                    old = weakref.ref(message._styles_cache)
                    del message
                await pilot.press("ctrl+n")
                await wait_for(pilot, lambda i=i: loader.engine.resets == i + 1)
                app.clear_notifications()  # "New chat" toasts: as many as the pace leaves up
                await pilot.pause(0.1)
                gc.collect()
                live.append(sum(1 for o in gc.get_objects() if type(o) is Strip))
            # Before the fix: +23 strips per chat at this size, however long the session. Now
            # the median step is 0: Textual may fill a bounded cache once (~230 strips over a
            # chat or two, seen at the 5th or the 10th chat, then flat); the leak was every chat.
            steps = [b - a for a, b in itertools.pairwise(live[1:])]
            assert statistics.median(steps) < 5, live
            assert old() is None

    run(scenario)


def test_a_long_prompt_shows_its_reading_and_esc_stops_it_cleanly(tmp_path: Path) -> None:
    """While a long prompt is read the answer's place says how far ("reading prompt 512 /
    ..."); Esc then stops the turn before its answer: the question leaves the conversation and
    goes back to the prompt box, and the next question gets a fresh chat's answer."""
    app, loader = make_app(tmp_path, FakeScript(prefill_delay=0.3))
    pasted = "lorem ipsum " * 300  # 3,600 characters: 8 fake prefill chunks, 2.4 s to read

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            prompt = app.query_one("#prompt", Input)
            prompt.value = pasted
            await pilot.press("enter")
            answer = app._answer
            assert answer is not None
            await wait_for(pilot, lambda: answer.note.startswith("reading prompt 512 / 3,6"))
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.waiting is None)
            assert loader.engine._cached and len(loader.engine._cached) < len(pasted)
            assert app.conv.messages == []
            await wait_for(pilot, lambda: not app.query(UserMessage))  # removed from view
            assert prompt.value == pasted.strip()
            assert app.saver.flush(timeout=10)
            (saved,) = (tmp_path / "chats").glob("*.json")
            assert json.loads(saved.read_text())["messages"] == []  # as on screen
            prompt.value = ""
            await ask(pilot, app, "short question")
            assert app.conv.messages[-1].content == expected_answer("short question")[0]
            assert [m.role for m in app.conv.messages] == ["user", "assistant"]

    run(scenario)


def test_toggle_speculation_measures_speedup(tmp_path: Path) -> None:
    app, loader = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await ask(pilot, app, "one")
            assert "Speedup      —" in table_text(app)
            await pilot.press("ctrl+t")
            assert "off (plain)" in table_text(app)
            await ask(pilot, app, "two")
            assert loader.engine.calls[-1][1].spec.method == "none"
            plain = [a for a in app.query(AnswerView) if type(a) is AnswerView][-1]
            assert {k for k, _ in plain.runs} == {"target"}
            assert app.plain_tps == pytest.approx(40.0) and app.spec_tps is not None
            assert f"{app.spec_tps / app.plain_tps:.2f}×" in table_text(app)
            await pilot.press("ctrl+t")
            await ask(pilot, app, "three")
            assert loader.engine.calls[-1][1].spec.method == "draft"

    run(scenario)


def test_k_and_temperature_keys_change_the_next_request(tmp_path: Path) -> None:
    app, loader = make_app(tmp_path, k=2, temperature=0.0)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            await pilot.press("f3", "f3", "f3", "f2")  # K 2 -> 4
            await pilot.press("f5", "f5", "f5", "f4")  # T 0 -> 0.2
            await pilot.press("f4", "f4", "f4")  # clamped at 0 ... then back up
            await pilot.press("f5", "f5")
            table = table_text(app)
            assert "K            4" in table and "Temperature  0.2" in table
            await ask(pilot, app, "x")
            cfg = loader.engine.calls[-1][1]
            assert cfg.spec.k == 4 and cfg.sampling.temperature == 0.2
            for _ in range(3):
                await pilot.press("f2")
            await pilot.press("f2")
            assert app.config.spec.k == 1  # never below 1

    run(scenario)


def test_the_meter_keeps_the_latest_rounds_k_plain_steps_included() -> None:
    from edgespec.tui.widgets import TurnMeter

    from edgespec.events import Round

    meter = TurnMeter(started=0.0)
    meter.add([], [Round(0, 3, 1, 3, 0.01, 0.02, "draft")], 1.0)
    assert meter.k_now == 3 and meter.drafted == 3
    meter.add([], [Round(1, 0, 0, 0, 0.0, 0.02, "draft")], 1.1)  # adaptive K chose a plain step
    assert meter.k_now == 0 and meter.drafted == 3
    meter.add([], [Round(2, 0, 0, 0, 0.0, 0.02, "none")], 1.2)  # speculation off: not a K
    assert meter.k_now == 0


def test_the_live_histogram_has_the_rows_of_the_final_one() -> None:
    """A row per length each round's K allows, and a plain step (K = 0) counted as a round that
    accepted none, as `accepted_histogram` gives at the end: the panel's histogram does not
    change when the final stats come."""
    from edgespec.tui.widgets import TurnMeter

    from edgespec.events import Round, accepted_histogram

    rounds = [Round(0, 3, 1, 3, 0.01, 0.02, "draft"), Round(1, 5, 2, 5, 0.01, 0.02, "draft")]
    rounds.append(Round(2, 0, 0, 0, 0.0, 0.02, "draft"))  # adaptive K chose a plain step
    meter = TurnMeter(started=0.0)
    meter.add([], rounds[:1], 1.0)
    assert meter.hist == [0, 1, 0, 0]
    meter.add([], rounds[1:], 1.1)
    assert meter.hist == list(accepted_histogram(rounds)) == [1, 1, 1, 0, 0, 0]
    assert (meter.drafted, meter.accepted) == (8, 3)


def test_adaptive_k_shows_the_latest_choice_and_the_keys_fix_or_free_k(tmp_path: Path) -> None:
    app, loader = make_app(tmp_path, k=3, adaptive=True)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            assert "K            auto\n" in table_text(app)
            await ask(pilot, app, "x")
            assert loader.engine.calls[-1][1].spec.adaptive
            assert "K            auto (now 3)" in table_text(app)  # the fake drafts K = 3
            await pilot.press("f2")  # fixes K, one below the latest choice
            assert not app.config.spec.adaptive and app.config.spec.k == 2
            assert "K            2\n" in table_text(app)
            await ask(pilot, app, "y")
            assert loader.engine.calls[-1][1].spec.k == 2
            assert not loader.engine.calls[-1][1].spec.adaptive
            await pilot.press("f6")  # back to auto K
            assert app.config.spec.adaptive and "K            auto" in table_text(app)
            await ask(pilot, app, "z")
            assert loader.engine.calls[-1][1].spec.adaptive

    run(scenario)


def test_reopen_a_saved_chat(tmp_path: Path) -> None:
    app, loader = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await ask(pilot, app, "remember me")
            first_id, first_answer = app.conv.id, app.last_answer()
            first_runs = app.conv.messages[1].runs
            await pilot.press("ctrl+n")
            await ask(pilot, app, "other chat")
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, PastChatsScreen))
            options = app.screen.query_one(OptionList)
            ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
            assert set(ids) == {first_id, app.conv.id}
            options.highlighted = ids.index(first_id)
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.conv.id == first_id)
            assert [u.render().plain for u in app.query(UserMessage)] == ["remember me"]
            answer = [a for a in app.query(AnswerView) if type(a) is AnswerView][-1]
            assert answer.plain == first_answer and answer.runs == first_runs
            await ask(pilot, app, "and again")
            sent = loader.engine.calls[-1][0]
            assert [m["content"] for m in sent] == ["remember me", first_answer, "and again"]

    run(scenario)


def test_copy_last_answer(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await ask(pilot, app, "copy this")
            await pilot.press("ctrl+y")
            assert app.clipboard == app.last_answer() != ""

    run(scenario)


def test_load_error_is_one_readable_line(tmp_path: Path) -> None:
    err = ModelNotFoundError("no model named 'nope'; run `edgespec models` to list them")
    app, _ = make_app(tmp_path, FakeScript(load_error=err))

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await wait_for(pilot, lambda: app.load_error is not None)
            await pilot.pause(0.05)
            assert isinstance(app.screen, LoadingScreen)
            shown = str(app.screen.query_one("#error", Static).render())
            assert shown == str(err) and "Traceback" not in shown
            await pilot.press("q")
        assert app.return_code == 0

    run(scenario)


def test_generation_error_is_shown_not_raised(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, FakeScript(chat_error=PromptError("prompt is longer than 512")))

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await ask(pilot, app, "too long")
            assert any("prompt is longer than 512" in n.message for n in app._notifications)
            assert [m.role for m in app.conv.messages] == ["user"]
            await ask(pilot, app, "next")  # the app keeps working

    run(scenario)


def test_command_palette_lists_every_action(tmp_path: Path) -> None:
    app, _ = make_app(tmp_path, FakeScript(hold_after=1, load_delay=0.3))

    def titles() -> list[str]:
        return [c.title for c in app.get_system_commands(app.screen)]

    async def scenario() -> None:
        async with app.run_test() as pilot:
            assert not any(t.startswith("New chat") for t in titles())  # still loading
            await wait_for(pilot, lambda: app.ready)
            names = ("New chat", "K+", "K−", "Temp+", "Temp−", "Spec on/off", "Copy answer")
            names += ("Colours", "Copy code", "Thinking")
            for name in (*names, "Past chats"):
                assert any(t.startswith(name) for t in titles()), name
            assert not any(t.startswith("Stop") for t in titles())  # nothing to stop
            await pilot.press("a", "enter")
            assert any(t.startswith("Stop") for t in titles())
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.waiting is None)

    run(scenario)


def test_answer_redraws_only_its_open_block_and_restyles_on_theme_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgespec.tui import markdown

    from edgespec.events import Token

    drawn: list[str] = []
    real = markdown.render_block

    def counting(tokens, src, kinds, look):  # noqa: ANN001, ANN202
        drawn.append(src)
        return real(tokens, src, kinds, look)

    monkeypatch.setattr(markdown, "render_block", counting)
    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await wait_for(pilot, lambda: app.ready)
            view = AnswerView()
            await app.query_one("#conversation").mount(view)
            view.append([Token(1, "Hi", "accepted", 0), Token(2, " there", "corrected", 0)])
            await pilot.pause()
            view.append([Token(3, "\n\n", "accepted", 1), Token(4, "!\x1b[2J", "bonus", 1)])
            await pilot.pause()
            drawn.clear()
            view.append([Token(5, " more", "bonus", 2)])
            text = view.text()
            assert drawn == ["!␛[2J more"]  # the finished first paragraph came from the cache
            assert text.plain == "Hi there\n\n!␛[2J more"  # no control char reaches the screen
            styles = [str(span.style) for span in text.spans]
            assert len(styles) == 3 and styles[1] != styles[0] and "underline" in styles[1]
            accepted_dark = text.spans[0].style.color
            app.theme = "textual-light"
            await pilot.pause()
            assert view.text().spans[0].style.color != accepted_dark
            assert view.runs[-1] == ("bonus", "!␛[2J more")

    run(scenario)


def test_a_base_model_is_named_as_one_in_the_header(tmp_path: Path) -> None:
    """A target without a chat template (Gemma 3 270M, a base model) continues text; the header
    says so, so that a continuation is not read as a broken answer."""
    from edgespec.tui.messages import EngineReady

    app, _ = make_app(tmp_path)

    async def scenario() -> None:
        async with app.run_test() as pilot:
            await ask(pilot, app, "hi")
            assert "base model" not in app.sub_title
            app.post_message(EngineReady("gemma3-270m", True, 4096, base_model=True))
            await wait_for(pilot, lambda: "base model" in app.sub_title)
            assert app.sub_title.startswith("gemma3-270m") and "continues" in app.sub_title

    run(scenario)
