"""A conversation on screen: the widgets of saved messages, and an answer made final when its turn
finishes (the detokenizer's last text, the note for a stopped or cut answer)."""

from __future__ import annotations

from collections.abc import Iterator

from edgespec.tui.store import Conversation
from edgespec.tui.widgets import AnswerView, UserMessage, clean_text
from textual.widget import Widget

from edgespec.events import Finished, Token

NOTES = {"cancelled": "[stopped]", "partial": "[interrupted]"}  # a reopened answer's note


def message_widgets(
    conv: Conversation, provenance: bool = True, think_open: bool | None = None
) -> Iterator[Widget]:
    """One widget per saved message: the user's text, or the answer coloured by its runs (or
    Markdown only, with `provenance` False; `think_open` folds its reasoning, see AnswerView)."""
    for m in conv.messages:
        if m.role == "user":
            yield UserMessage(m.content)
        else:
            runs, note = m.runs or [("target", m.content)], NOTES.get(m.reason or "", "")
            view = AnswerView(runs, note, provenance=provenance)
            view.think_open = think_open
            yield view


def finish_answer(answer: AnswerView, fin: Finished) -> None:
    """Show what the detokenizer still held back (in the last run's colour) and end the answer,
    with a note when it was stopped or hit the token limit."""
    shown, final = answer.plain, clean_text(fin.text)
    if final != shown and final.startswith(shown):
        kind = answer.runs[-1][0] if answer.runs else "target"
        answer.append([Token(id=-1, text=final[len(shown) :], kind=kind, round=-1)])  # type: ignore[arg-type]
    answer.set_note({"cancelled": "[stopped]", "length": "[max tokens]"}.get(fin.reason, ""))
