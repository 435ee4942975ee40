"""`edgespec chat`: watch speculative decoding work, every token coloured by where it came from.

The app never touches the engine directly: an `EngineThread` owns it (load and generate on one
thread, as MLX requires) and posts typed messages (`tui.messages`) back. Each turn has a number;
messages of a turn the app no longer waits for are dropped.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Iterable

from edgespec.tui import settings
from edgespec.tui.answer_actions import ANSWER_BINDINGS
from edgespec.tui.chat_actions import ChatActions, release_style_caches
from edgespec.tui.engine_thread import EngineThread, Loader
from edgespec.tui.messages import (
    EngineFailed,
    EngineReady,
    EngineWarm,
    LoadProgress,
    PrefillProgress,
    SaveFailed,
    StreamBatch,
    TurnFailed,
    TurnFinished,
)
from edgespec.tui.screens import LoadingScreen
from edgespec.tui.store import ChatMessage, ChatStore, Conversation, Saver, stats_to_json
from edgespec.tui.transcript import finish_answer
from edgespec.tui.widgets import (
    AnswerView,
    PromptInput,
    StatsPanel,
    StatsView,
    SteadyFooter,
    TurnMeter,
    UserMessage,
)
from textual import on
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Header, Input

from edgespec.config import GenerationConfig, SpecConfig

SAVE_EVERY = 1.0  # seconds between saves of an answer in progress
# Seconds between redraws of a streaming answer (at least: FrameBudget keeps them near 2% of the
# CPU) and of the live stats panel: a redraw is a Textual frame on the UI thread, beside the engine.
FRAME, PANEL_EVERY = 0.1, 1.0
# Seconds after an answer ends before the garbage collector runs (collect_when_idle): between
# turns, while the user reads, rather than at a moment CPython picks in the middle of an answer.
IDLE_COLLECT = 2.0


class ChatApp(ChatActions):
    """The chat app. `loader(on_progress)` builds the engine on the engine thread."""

    TITLE = "EdgeSpec chat"
    CSS = """
    #main { height: 1fr; }
    /* The scrollbar's room is kept while there is none: when it comes or goes, no line of the
       chat wraps anew, and Textual lays the screen out once where it did two or three times. */
    #conversation { width: 1fr; padding: 0 1; scrollbar-gutter: stable; }
    #prompt { dock: bottom; margin: 0 1; }
    """
    BINDINGS = [
        Binding("escape", "stop", "Stop", tooltip="Stop generating; the partial answer is kept"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("f2", "k_down", "K−"),
        Binding("f3", "k_up", "K+"),
        # Off the footer (it would cut "Past chats" at 120 columns); in the palette, docs/cli.md,
        # and named by the notice a K key shows.
        Binding("f6", "toggle_adaptive", "Auto K", show=False),
        # Off the footer too: the chat template's thinking mode, where it has one (the header
        # shows it; F9, "Thinking", folds an answer's reasoning).
        Binding(
            "f10",
            "toggle_think",
            "Think on/off",
            show=False,
            tooltip="The chat template's thinking mode, from the next answer",
        ),
        Binding("f4", "temp_down", "Temp−"),
        Binding("f5", "temp_up", "Temp+"),
        Binding("ctrl+t", "toggle_spec", "Spec on/off"),
        Binding("ctrl+y", "copy_answer", "Copy answer"),
        Binding("ctrl+o", "open_chats", "Past chats"),
        *ANSWER_BINDINGS,
    ]

    def __init__(
        self,
        loader: Loader,
        config: GenerationConfig,
        store: ChatStore | None = None,
        what: str = "models",
        flush_interval: float = FRAME,
        collect_when_idle: bool = False,
        think: bool | None = None,
    ) -> None:
        super().__init__()
        self.collect_when_idle = collect_when_idle  # gc.collect() between turns (the CLI's app)
        self.config, self.store, self.what = config, store or ChatStore(), what
        self.saver = Saver(lambda error: self.post_message(SaveFailed(error)))
        self.engine_thread = EngineThread(loader, self.post_message, flush_interval, config)
        self.engine_name, self.has_draft, self.ready = "", True, False
        self.warm = False  # the engine compiled a turn's shapes (EngineWarm)
        self.load_error: str | None = None
        # The chat template's thinking mode each turn asks for (F10 toggles it); None: the template
        # has none. `think` (--think / --no-think) replaces the pair's default once loaded.
        self.think: bool | None = None
        self.base_model = False  # the target has no chat template (EngineReady)
        self._asked_think = think
        self.conv = Conversation()
        # the method speculation turns back on with: the one asked for, else the default
        self._spec_method = config.spec.method if config.spec.enabled else SpecConfig.method
        self._turn = 0
        self._waiting: int | None = None  # the turn whose messages we accept
        self._answer: AnswerView | None = None
        self._reply: ChatMessage | None = None
        self._meter: TurnMeter | None = None
        self._dirty = False  # the streaming answer changed since the last save
        self._panel_stale = False  # the live panel lags the streamed batches
        self._panel_at = 0.0  # time.monotonic() of its last redraw
        self.plain_tps: float | None = None
        self.spec_tps: float | None = None
        self.session_peak: int | None = None  # the largest answer's peak memory (bytes)
        self._last_view: StatsView | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="main"):
            yield VerticalScroll(id="conversation")
            yield StatsPanel(id="stats")
        yield PromptInput(placeholder="Ask something and press Enter", id="prompt")
        yield SteadyFooter()

    def on_mount(self) -> None:
        self.push_screen(LoadingScreen(self.what))
        self.engine_thread.start()
        self.set_interval(SAVE_EVERY, self._autosave)
        self.set_interval(PANEL_EVERY, self._refresh_panel)
        self._show_stats()

    def on_unmount(self) -> None:
        self.engine_thread.shutdown()
        self.saver.close()  # what the last save handed over reaches the disk

    @property
    def waiting(self) -> int | None:
        """The turn whose messages the app accepts (None = idle)."""
        return self._waiting

    @waiting.setter
    def waiting(self, turn: int | None) -> None:
        self._waiting = turn
        self.refresh_bindings()  # Stop is enabled only while an answer streams
        # A blinking cursor repaints twice a second: not while the engine needs the CPU.
        self.query_one("#prompt", Input).cursor_blink = turn is None

    @property
    def generating(self) -> bool:
        return self.waiting is not None

    def _loading(self) -> LoadingScreen | None:
        screen: Screen[object] = self.screen
        return screen if isinstance(screen, LoadingScreen) else None

    def on_load_progress(self, message: LoadProgress) -> None:
        if screen := self._loading():
            screen.progress(message.text, message.fraction)

    def on_engine_ready(self, message: EngineReady) -> None:
        self.engine_name, self.has_draft, self.ready = message.name, message.has_draft, True
        self.conv.model = message.name
        self.base_model = message.base_model  # no chat template: the header says so
        self._ready_thinking(message.thinking)
        if not message.has_draft and self.config.spec.enabled:
            self.config = settings.with_method(self.config, "none")
        if self._loading():
            self.pop_screen()
        self.refresh_bindings()
        self.query_one("#prompt", Input).focus()
        self._show_stats()

    def on_engine_warm(self, message: EngineWarm) -> None:
        self.warm = True

    def on_engine_failed(self, message: EngineFailed) -> None:
        self.load_error, self.ready = message.error, False
        if screen := self._loading():
            screen.fail(message.error)
        else:
            self.notify(message.error, title="Engine failed", severity="error", timeout=30)

    # ----------------------------------------------------------------- one turn
    @on(Input.Submitted, "#prompt")
    def send(self, event: Input.Submitted) -> None:
        """Send the prompt: show it, save the chat, queue the turn on the engine thread."""
        prompt = event.value.strip()
        if not prompt:
            return
        if not self.ready or self.generating:
            self.notify("Wait for the answer to finish (Esc stops it).", severity="warning")
            return
        event.input.value = ""
        self.conv.messages.append(ChatMessage("user", prompt))
        history = self.conv.history()
        self._reply = ChatMessage("assistant", "", reason="partial")
        self.conv.messages.append(self._reply)
        self._save()
        view = self.query_one("#conversation", VerticalScroll)
        self._answer = self.answer_view()
        view.mount(UserMessage(prompt), self._answer)
        view.scroll_end(animate=False)
        self._turn += 1
        self.waiting = self._turn
        self._meter = TurnMeter(started=time.monotonic())
        self.engine_thread.submit(self._turn, history, self.config, self.think)
        self._show_stats()

    def on_prefill_progress(self, message: PrefillProgress) -> None:
        """A long prompt is being read: say how far, where the answer will start."""
        if message.turn != self.waiting or self._answer is None or self._answer.plain:
            return
        done, total = message.progress.done, message.progress.total
        self._answer.show_reading(f"reading prompt {done:,} / {total:,} tokens")

    def on_stream_batch(self, message: StreamBatch) -> None:
        if message.turn != self.waiting or self._answer is None or self._reply is None:
            return
        view = self.query_one("#conversation", VerticalScroll)
        follow = view.is_vertical_scroll_end or view.max_scroll_y == 0
        self._answer.append(message.tokens)
        self._reply.runs = self._answer.runs
        self._reply.content = self._answer.plain
        if self._meter is not None:
            self._meter.add(message.tokens, message.rounds, time.monotonic())
        if follow:
            view.scroll_end(animate=False)
        self._dirty = True
        if time.monotonic() - self._panel_at >= PANEL_EVERY:
            self._show_stats()  # in the answer's frame: one paint for both
        else:
            self._panel_stale = True  # a later batch or the timer redraws it
        self.engine_thread.drawn(time.thread_time())

    def on_turn_finished(self, message: TurnFinished) -> None:
        if message.turn != self.waiting or self._answer is None or self._reply is None:
            return
        fin, answer, reply = message.finished, self._answer, self._reply
        if message.peak_memory is not None:
            self.session_peak = max(self.session_peak or 0, message.peak_memory)
        if fin.reason == "cancelled" and not fin.text and not answer.plain:
            self._withdraw()
            return
        finish_answer(answer, fin)
        reply.runs, reply.content = answer.runs, fin.text
        reply.reason, reply.stats = fin.reason, stats_to_json(fin.stats)
        if fin.stats.tokens > 0 and fin.stats.tokens_per_s > 0:
            if self.config.spec.enabled and fin.stats.drafted > 0:
                self.spec_tps = fin.stats.tokens_per_s
            elif not self.config.spec.enabled:
                self.plain_tps = fin.stats.tokens_per_s
        per_round = [] if self._meter is None else self._meter.rounds_in_order()
        k_now = None if self._meter is None else self._meter.k_now
        branches = (0, 0) if self._meter is None else self._meter.branches  # tree rounds
        think = None if self._meter is None else self._meter.think
        self.waiting, self._meter = None, None
        release_style_caches()  # what this turn removed (footer keys, notices) goes too
        self._save()
        self._show_stats(final=(fin, per_round, k_now, branches, think, message.peak_memory))
        if self.collect_when_idle:
            self.set_timer(IDLE_COLLECT, self._collect)

    def _withdraw(self) -> None:
        """The question was stopped before its answer began (while its prompt was read): it
        leaves the conversation, so the next question is asked as if it had never been sent,
        and goes back to the prompt box to be edited or sent again."""
        assert self._answer is not None and self._reply is not None
        question = self.conv.messages[-2]
        del self.conv.messages[-2:]
        self.query(UserMessage).last().remove()
        self._answer.remove()
        prompt = self.query_one("#prompt", Input)
        if not prompt.value:
            prompt.value = question.content
        self.waiting, self._meter, self._answer, self._reply = None, None, None, None
        self.saver.put(*self.store.prepare(self.conv))  # the file too, even left empty
        self._dirty = False
        self._show_stats()
        self.notify("Stopped while reading the prompt; the question is back in the prompt box.")

    def _collect(self) -> None:
        """Timer: collect garbage now that an answer has ended, unless the next one is under way
        (its end schedules another)."""
        if not self.generating:
            gc.collect()

    def on_turn_failed(self, message: TurnFailed) -> None:
        if message.turn != self.waiting:
            return
        if self._answer is not None:
            self._answer.set_note(f"[error: {message.error}]")
        if self._reply is not None:
            if self._reply.content:
                self._reply.reason = "error"
            else:
                self.conv.messages.remove(self._reply)
        self.waiting, self._meter = None, None
        self._save()
        self.notify(message.error, title="Generation failed", severity="error", timeout=15)
        self._show_stats()

    def _save(self) -> None:
        """Hand the chat to the saver's thread (ChatStore.save's file, without the wait)."""
        if self.conv.messages:
            self.conv.model = self.conv.model or self.engine_name
            self.saver.put(*self.store.prepare(self.conv))
        self._dirty = False

    def on_save_failed(self, message: SaveFailed) -> None:
        """The chat stays on screen and in memory; the next save tries again."""
        self.notify(message.error, title="Chat not saved", severity="error", timeout=15)

    def _autosave(self) -> None:
        """Timer: save the answer in progress, so a crash loses at most SAVE_EVERY seconds of it."""
        if self._dirty:
            self._save()

    def _refresh_panel(self) -> None:
        """Timer: the live panel, when batches stopped before they redrew it. While they come,
        one comes within PANEL_EVERY + a frame of the last redraw and redraws it in its frame."""
        stale = self._panel_stale and self._meter is not None
        if stale and time.monotonic() - self._panel_at >= 2 * PANEL_EVERY:
            self._show_stats()

    def _show_stats(self, final: tuple | None = None) -> None:
        view = StatsView(
            k=self.config.spec.k,
            temperature=self.config.sampling.temperature,
            spec_on=self.config.spec.enabled,
            adaptive=self.config.spec.adaptive,
            k_max=self.config.spec.k_max,
            plain_tps=self.plain_tps,
            spec_tps=self.spec_tps,
        )
        if final is not None:
            fin, per_round, k_now, branches, think, view.peak_memory = final
            view.with_stats(fin.stats, per_round, k_now).branches = branches
            view.with_think(think)
        elif self._meter is not None:
            view.with_meter(self._meter)
        elif self._last_view is not None:  # keep the last turn's numbers, new settings
            keep = dataclasses.replace(
                self._last_view, k=view.k, temperature=view.temperature, adaptive=view.adaptive
            )
            view = dataclasses.replace(keep, spec_on=view.spec_on, plain_tps=view.plain_tps)
            view.spec_tps = self.spec_tps
        view.session_peak = self.session_peak
        self._last_view, self._panel_stale, self._panel_at = view, False, time.monotonic()
        self.query_one(StatsPanel).show(view)

    # ----------------------------------------------------------------- actions
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide chat actions (every binding's) until the engine is ready; grey out Stop when
        nothing runs."""
        if all(not isinstance(b, Binding) or b.action != action for b in self.BINDINGS):
            return True
        if not self.ready:
            return False
        if action == "stop" and not self.generating:
            return None
        return True

    def action_stop(self) -> None:
        """Stop generating: the engine ends the turn as 'cancelled'; the partial answer stays."""
        if self.generating:
            self.engine_thread.cancel()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            assert isinstance(binding, Binding)
            if not self.check_action(binding.action, ()):
                continue
            method = getattr(self, f"action_{binding.action}")
            yield SystemCommand(
                f"{binding.description} ({binding.key})", method.__doc__ or "", method
            )
