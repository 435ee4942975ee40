"""What the chat app does with the answers already on screen: copy one (or its last code block),
switch provenance colours off and on, fold or unfold the reasoning of every answer."""

from __future__ import annotations

from edgespec.tui.answer import AnswerView
from edgespec.tui.markdown import code_blocks
from edgespec.tui.store import Conversation
from edgespec.tui.think import split_think
from textual.app import App
from textual.binding import Binding

# Off the footer (it is full at 120 columns): in the keys panel, the palette and docs/cli.md.
ANSWER_BINDINGS = [
    Binding("f7", "toggle_provenance", "Colours", show=False, tooltip="Provenance colours on/off"),
    Binding("f8", "copy_code", "Copy code", show=False, tooltip="Copy the last code block"),
    Binding("f9", "toggle_thinking", "Thinking", show=False, tooltip="Show/fold the reasoning"),
]


def last_code_block(answers: list[str]) -> str | None:
    """The last code block of the newest answer that has one (reasoning left out).

    >>> last_code_block(["```\\na\\n```", "no code here"])
    'a\\n'
    """
    for text in reversed(answers):
        split = split_think(text)
        found = code_blocks(text if split is None else text[split.body :])
        if found:
            return found[-1]
    return None


class AnswerActions(App[int]):
    """The chat app's answer actions; `ChatApp` subclasses it and lists `ANSWER_BINDINGS`."""

    conv: Conversation
    provenance = True  # new answers are coloured by provenance
    show_thinking: bool | None = None  # None: reasoning shown while it streams, folded after

    def shown_answers(self) -> list[AnswerView]:
        """The answers in the conversation (not the legend)."""
        return list(self.query("#conversation AnswerView").results(AnswerView))

    def answer_view(self) -> AnswerView:
        """A new answer widget in the current colour mode and reasoning fold."""
        view = AnswerView(provenance=self.provenance)
        view.think_open, view.streaming = self.show_thinking, True
        return view

    def last_answer(self) -> str:
        """The text of the newest assistant message ('' if none)."""
        return next((m.content for m in reversed(self.conv.messages) if m.role == "assistant"), "")

    def action_copy_answer(self) -> None:
        """Copy the last answer to the clipboard (OSC 52)."""
        text = self.last_answer()
        if not text:
            self.notify("No answer to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(text)
        self.notify(f"Copied {len(text)} characters")

    def action_copy_code(self) -> None:
        """Copy the last code block of the answers to the clipboard (OSC 52)."""
        answers = [m.content for m in self.conv.messages if m.role == "assistant"]
        code = last_code_block(answers)
        if code is None:
            self.notify("No code block to copy yet.", severity="warning")
            return
        self.copy_to_clipboard(code)
        self.notify(f"Copied a code block ({len(code.splitlines())} lines)")

    def action_toggle_provenance(self) -> None:
        """Provenance colours off (Markdown only, code highlighted) or back on."""
        self.provenance = not self.provenance
        for view in self.shown_answers():
            view.provenance = self.provenance
        state = "on" if self.provenance else "off (code highlighted)"
        self.notify(f"Provenance colours {state}")

    def action_toggle_thinking(self) -> None:
        """Show or fold the reasoning (<think>) of every answer."""
        self.show_thinking = not self.show_thinking
        for view in self.shown_answers():
            view.toggle_think(self.show_thinking)
