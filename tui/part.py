"""Text that changes often (an answer's pieces, the live stats), drawn line by line: a new text
repaints only the lines that changed, and lays out the screen only when its height changes.
Drawing keeps each line of the text (up to a newline) with its strips, so a new text draws only
the lines it changed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from rich.text import Span, Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.style import Style as VisualStyle
from textual.visual import Visual, visualize
from textual.widget import Widget


class _Drawing(NamedTuple):
    text: Text
    look: tuple[object, ...]  # (width, visual style, selection)
    strips: list[Strip]


_LineKey = tuple[int, str, object, tuple[Span, ...]]  # (line number, text, style, spans)


def whole_strips(widget: Widget, text: Text, width: int, style: VisualStyle) -> list[Strip]:
    """`text` drawn whole for `widget`, as Textual draws a widget's content."""
    visual = visualize(widget, text)  # type: ignore[arg-type]
    return Visual.to_strips(widget, visual, width, None, style)


class LineStrips:
    """A text's strips at one width and style, drawn line by line (a line ends at a newline):
    a line already drawn at the same place is not drawn again. Textual wraps and styles each
    line of a text on its own, knowing only its number (its strips' offsets, for selections),
    so these are the strips Textual draws for the whole text. A streaming answer changes its
    last line or two per batch; the lines before it keep their strips."""

    def __init__(self) -> None:
        self._look: tuple[int, VisualStyle] | None = None
        self._lines: dict[_LineKey, list[Strip]] = {}

    def draw(self, widget: Widget, text: Text, width: int, style: VisualStyle) -> list[Strip]:
        """`text`'s strips for `widget`, as `whole_strips` draws them."""
        if (width, style) != self._look:
            self._look, self._lines = (width, style), {}
        lines = list(text.split("\n", allow_blank=True))
        keys = [(y, line.plain, line.style, tuple(line.spans)) for y, line in enumerate(lines)]
        missed = [y for y, key in enumerate(keys) if key not in self._lines]
        if missed:
            drawn = _draw_lines(widget, lines, missed, width, style)
            if drawn is None:  # its lines could not be told apart: drawn whole, kept not
                self._lines = {}
                return whole_strips(widget, text, width, style)
            self._lines.update(zip([keys[y] for y in missed], drawn, strict=True))
        self._lines = {key: self._lines[key] for key in keys}
        return [strip for key in keys for strip in self._lines[key]]


def _draw_lines(
    widget: Widget, lines: Sequence[Text], missed: list[int], width: int, style: VisualStyle
) -> list[list[Strip]] | None:
    """The strips of `lines[y]` for each y in `missed`, from one drawing (Textual's cost per
    drawing is as large as a short line's): up to the last missed line, the others drawn as
    blank lines, so that each line keeps its number. Each strip carries its line's number in
    its offsets (an empty line's too); None where one does not, or they are out of order."""
    last = missed[-1]
    miss = set(missed)
    placed = Text("\n").join([lines[y] if y in miss else Text() for y in range(last + 1)])
    strips = whole_strips(widget, placed, width, style)
    by_line: list[list[Strip]] = [[] for _ in range(last + 1)]
    at = 0
    for strip in strips:
        y = _line_of(strip)
        if y is None or not at <= y <= last:
            return None
        by_line[y].append(strip)
        at = y
    if not all(by_line):
        return None
    return [by_line[y] for y in missed]


def _line_of(strip: Strip) -> int | None:
    """The text line a strip draws, from its segments' offsets (None: no segment says)."""
    for segment in strip:
        offset = segment.style.meta.get("offset") if segment.style is not None else None
        if offset is not None:
            return int(offset[1])
    return None


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


class TextLines(Widget):
    """A `Text` drawn line by line, for text that changes often (a streaming answer's parts, the
    live stats): a new text repaints only the lines that differ from the ones shown, and lays
    out the screen only when its height changes. Textual's `Static` draws its whole content
    again and lays out the screen at every update."""

    DEFAULT_CSS = "TextLines { height: auto; }"

    def __init__(self, text: Text | None = None, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.text = text or Text()  # the text shown (the lines held after it are not in it)
        self.display = shown(self.text, 1)
        self._held = 1  # the height is held at a multiple of this many lines
        self._drawn: _Drawing | None = None  # the lines of `text`
        self._next: _Drawing | None = None  # the lines of the last text measured
        self._by_line = LineStrips()

    def _strips(self, text: Text, width: int) -> list[Strip]:
        """`text` drawn at `width` (as Textual draws a widget's content)."""
        look = (width, self.visual_style, self.text_selection)
        for known in (self._drawn, self._next):
            if known is not None and known.text is text and known.look == look:
                return known.strips
        if self.text_selection is None:  # (a selection restyles some lines in place)
            strips = self._by_line.draw(self, text, width, self.visual_style)
        else:
            strips = whole_strips(self, text, width, self.visual_style)
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


class AnswerPart(TextLines):
    """One piece of an answer on screen: a finished Markdown unit, the open one, the reasoning."""
