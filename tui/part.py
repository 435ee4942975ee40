"""One piece of an answer on screen, drawn line by line: a new text repaints only the lines that
changed, and lays out the screen only when the piece's height changes."""

from __future__ import annotations

from typing import NamedTuple

from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.visual import Visual, visualize
from textual.widget import Widget


class _Drawing(NamedTuple):
    text: Text
    look: tuple[object, ...]  # (width, visual style, selection)
    strips: list[Strip]


def shown(text: Text, lines: int) -> bool:
    """Whether a part is on screen: while it has text, or holds lines for text to come."""
    return bool(text) or lines > 1


def held_height(height: int, lines: int) -> int:
    """`height` lines rounded up to a multiple of `lines`; a part that holds lines (`lines` > 1)
    keeps them before its first line comes.

    >>> held_height(0, 1), held_height(0, 4), held_height(5, 4), held_height(8, 4)
    (0, 4, 8, 8)
    """
    if lines > 1:
        height = max(height, 1)
    return height + -height % lines


class AnswerPart(Widget):
    """One piece of an answer on screen (a finished Markdown unit, the open one, the reasoning):
    a `Text` drawn line by line. A new text repaints only the lines that differ from the ones
    shown, and lays out the screen only when its height changes."""

    DEFAULT_CSS = "AnswerPart { height: auto; }"

    def __init__(self, text: Text | None = None) -> None:
        super().__init__()
        self.text = text or Text()  # the text shown (the lines held after it are not in it)
        self.display = shown(self.text, 1)
        self._held = 1  # the height is held at a multiple of this many lines
        self._drawn: _Drawing | None = None  # the lines of `text`
        self._next: _Drawing | None = None  # the lines of the last text measured

    def _strips(self, text: Text, width: int) -> list[Strip]:
        """`text` drawn at `width` (as Textual draws a widget's content)."""
        look = (width, self.visual_style, self.text_selection)
        for known in (self._drawn, self._next):
            if known is not None and known.text is text and known.look == look:
                return known.strips
        visual = visualize(self, text)  # type: ignore[arg-type]
        strips = Visual.to_strips(self, visual, width, None, self.visual_style)
        self._next = _Drawing(text, look, strips)
        return strips

    def _lines(self) -> list[Strip]:
        strips = self._strips(self.text, self.content_size.width)
        assert self._next is not None
        self._drawn = self._next if self._next.text is self.text else self._drawn
        return strips

    def _height(self, text: Text, lines: int) -> int | None:
        """The lines `text` takes at the present width, held at a multiple of `lines`."""
        width = self.content_size.width
        if not width:
            return None
        return held_height(len(self._strips(text, width)) if text else 0, lines)

    def needs_layout(self, text: Text, lines: int = 1) -> bool:
        """Whether showing `text` (with `lines`) changes this part's height."""
        height = self._height(text, lines)
        if height is None or shown(text, lines) != self.display:
            return True
        return height != self.content_size.height

    def show(self, text: Text, lines: int = 1) -> None:
        """Draw `text`; nothing happens when it is the text shown, and only the lines that
        changed repaint while the height stays (no layout of the screen). With `lines` > 1 the
        height is rounded up to a multiple of `lines` with blank lines at the end, so that a
        growing text needs a layout only every `lines` lines; an empty text then holds `lines`
        blank lines, so its first line repaints too. Empty, with `lines` 1, the part is hidden."""
        if lines == self._held and text == self.text:
            return
        if self.needs_layout(text, lines):
            self.text, self._held, self.display = text, lines, shown(text, lines)
            self.refresh(layout=True)
            return
        width = self.content_size.width
        old, new = self._lines(), self._strips(text, width)
        self.text, self._held = text, lines
        changed = [y for y in range(len(new)) if y >= len(old) or old[y] != new[y]]
        changed += range(len(new), len(old))  # lines the text no longer reaches
        if changed:
            self.refresh(Region(0, changed[0], width, changed[-1] - changed[0] + 1))

    def render(self) -> Text:  # what Textual copies from a selection (drawing: render_line)
        return self.text

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return held_height(len(self._strips(self.text, width)) if self.text else 0, self._held)

    def render_line(self, y: int) -> Strip:
        lines = self._lines()
        if y < len(lines):
            return lines[y]
        return Strip.blank(self.content_size.width, self.visual_style.rich_style)
