"""Screens besides the chat: loading (progress or a readable error) and the past-chats list."""

from __future__ import annotations

import time
from collections.abc import Sequence

from edgespec.tui.store import ChatSummary
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Center, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Label, OptionList, ProgressBar, Static
from textual.widgets.option_list import Option


class LoadingScreen(Screen[None]):
    """Shown while the engine loads: the current step and a progress bar; on failure the error
    as one readable line (never a traceback) and how to quit."""

    DEFAULT_CSS = """
    LoadingScreen { align: center middle; }
    LoadingScreen > Vertical {
        width: 72; height: auto; padding: 1 2;
        border: round $primary; background: $surface;
    }
    LoadingScreen #title { text-style: bold; margin: 0 0 1 0; }
    LoadingScreen #step { color: $text-muted; margin: 1 0 0 0; }
    LoadingScreen #error { color: $text-error; text-style: bold; display: none; margin: 1 0 0 0; }
    LoadingScreen.-failed #error { display: block; }
    LoadingScreen.-failed ProgressBar { display: none; }
    """
    BINDINGS = [Binding("ctrl+q,q,escape", "app.quit", "Quit")]

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Loading {self.what}", id="title")
            with Center():
                yield ProgressBar(total=1.0, show_eta=False, id="bar")
            yield Static(id="error")
            yield Label("starting…", id="step")
        yield Footer()

    def progress(self, text: str, fraction: float | None) -> None:
        """Show one loading step; `fraction` None = indeterminate."""
        self.query_one("#step", Label).update(text)
        bar = self.query_one("#bar", ProgressBar)
        bar.update(total=None if fraction is None else 1.0, progress=fraction or 0.0)

    def fail(self, error: str) -> None:
        """Replace the progress bar by the error line."""
        self.add_class("-failed")
        self.query_one("#title", Label).update(f"Could not load {self.what}")
        self.query_one("#error", Static).update(error)
        self.query_one("#step", Label).update("Press q to quit.")


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


class PastChatsScreen(ModalScreen[str | None]):
    """A list of saved chats, newest first; Enter reopens one (dismisses with its id)."""

    DEFAULT_CSS = """
    PastChatsScreen { align: center middle; }
    PastChatsScreen > Vertical {
        width: 90%; max-width: 100; height: 80%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    PastChatsScreen #heading { text-style: bold; margin: 0 0 1 0; }
    PastChatsScreen OptionList { height: 1fr; }
    """
    BINDINGS = [Binding("escape", "dismiss_none", "Close")]

    def __init__(self, chats: Sequence[ChatSummary]) -> None:
        super().__init__()
        self.chats = list(chats)

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Past chats ({len(self.chats)})", id="heading")
            options = [
                Option(f"{_when(c.updated)}  {c.title}  ({c.messages} messages)", id=c.id)
                for c in self.chats
            ]
            yield OptionList(*options) if options else Label("No saved chats yet.")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
