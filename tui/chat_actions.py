"""The chat app's conversation switching: a new chat, a past chat reopened, and letting the old
chat's widgets go with every line they drew (Textual's style memo kept them: see
`release_style_caches`)."""

from __future__ import annotations

from typing import Any

from edgespec.tui.screens import PastChatsScreen
from edgespec.tui.setting_actions import SettingActions
from edgespec.tui.store import ChatStore, Conversation, Saver
from edgespec.tui.transcript import message_widgets
from textual._styles_cache import StylesCache
from textual.await_remove import AwaitRemove
from textual.containers import VerticalScroll


def release_style_caches() -> None:
    """Let the widgets the chat removed go, with every line they drew.

    Textual memoizes `StylesCache.get_inner_outer` with `functools.lru_cache` on the instance
    method, so the memo's keys hold up to 1,024 `StylesCache` objects, one per widget that drew a
    background, each with the `Strip`s (segments, styles) of its last frame: every old chat's
    messages stayed in memory long after they were removed (Textual issue 6665). The memo holds
    only two `Style`s per key; emptying it costs a handful of recomputed styles at the next frame.
    """
    StylesCache.get_inner_outer.cache_clear()


class ChatActions(SettingActions):
    """New chat and reopen; `ChatApp` subclasses it and lists their bindings."""

    conv: Conversation
    store: ChatStore
    saver: Saver
    engine_name: str
    provenance: bool
    show_thinking: bool
    engine_thread: Any
    waiting: Any
    _meter: Any
    _answer: Any
    _reply: Any
    generating: bool  # ChatApp's: an answer is under way

    def action_new_chat(self) -> None:
        """Start an empty conversation (the old one is already saved)."""
        self._start_conversation(Conversation(model=self.engine_name))
        self.notify("New chat")

    def _start_conversation(self, conv: Conversation) -> None:
        if self.generating:
            self.engine_thread.cancel()
        self.waiting, self._meter, self._answer, self._reply = None, None, None, None
        self.engine_thread.reset()
        self.conv = conv
        view = self.query_one("#conversation", VerticalScroll)
        self.call_next(self._release_when_removed, view.remove_children())
        view.mount(*message_widgets(conv, self.provenance, self.show_thinking))
        view.scroll_end(animate=False)
        self._last_view = None
        self._show_stats()

    async def _release_when_removed(self, removal: AwaitRemove) -> None:
        """Once the old chat's widgets are gone, let the lines they drew go too."""
        await removal
        release_style_caches()

    def action_open_chats(self) -> None:
        """List saved chats; choosing one reopens it."""
        self.saver.flush()  # the list shows this chat as last saved
        self.push_screen(PastChatsScreen(self.store.list()), self._reopen)

    def _reopen(self, chat_id: str | None) -> None:
        if not chat_id:
            return
        try:
            conv = self.store.load(chat_id)
        except (OSError, ValueError, KeyError) as exc:
            self.notify(f"Cannot open chat {chat_id}: {exc}", severity="error")
            return
        for m in conv.messages:  # an answer interrupted by a crash is shown, not re-sent
            if m.reason == "partial":
                m.reason = "cancelled"
        self._start_conversation(conv)
        self.notify(f"Reopened: {conv.title}")
