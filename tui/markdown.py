"""Markdown that keeps token provenance: streamed answer text rendered to a rich `Text` in which
every character still carries the colour of the token it came from. No Textual imports.

`markdown_it` parses the text into blocks and inline tokens. Its tokens carry no character offsets,
so each rendered character is matched back to the source by a forward search from the previous
match (`_Out.put`): markup (``**``, ``#``, fences, link targets) is skipped, and a rendered
character finds the source character it was copied from. Its provenance `kinds[i]` then gives the
colour, layered over the Markdown style (bold, italic, code background): the colour wins, the
attributes add up. Characters with no source (bullet padding, code box margins) get no colour.

Streaming: `BlockCache` re-renders only the last, still open block (or a list's last item); a block
followed by another one cannot change any more (a blank line or a new block's start closed it), so
it is cached.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby

from markdown_it import MarkdownIt
from markdown_it.token import Token as MdToken
from rich.style import Style
from rich.syntax import Syntax
from rich.text import Span, Text

_MD = MarkdownIt("commonmark", {"html": False}).enable("strikethrough")

# Markdown element -> style key of `Look.marks`.
_INLINE = {"strong_open": "strong", "em_open": "emphasis", "s_open": "strike", "link_open": "link"}
_CLOSE = {"strong_close", "em_close", "s_close", "link_close"}
BOX_STEP = 16  # a code box's width is a multiple of this many cells (`_code`)


@dataclass(frozen=True)
class Look:
    """How to draw: provenance kind -> style, Markdown element -> style (keys: heading, h1,
    strong, emphasis, strike, link, code, code_block, label, quote, marker), whether to
    colour by provenance, and the Pygments theme for code when not colouring by provenance."""

    kinds: Mapping[str, Style]
    marks: Mapping[str, Style]
    provenance: bool = True
    code_theme: str = "ansi_dark"

    def mark(self, key: str) -> Style:
        return self.marks.get(key, Style())


class _Out:
    """A rendered block under construction: the `Text` and, per character, its source offset
    (-1: no source). `pos` is where the next forward search in `src` starts."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.pos = 0
        self.text = Text()
        self.origin: list[int] = []
        self.code: list[tuple[str, list[tuple[int, str]]]] = []  # per box: language, lines

    def put(self, piece: str, style: Style | None = None, aligned: bool = True) -> None:
        """Append `piece`; `aligned` matches its characters to the source, else they have none."""
        self.text.append(piece, style)
        at = self.src.find(piece[:1], self.pos) if aligned and piece else -1
        if at >= 0 and self.src.startswith(piece, at):  # what the search below would find
            self.origin.extend(range(at, at + len(piece)))
            self.pos = at + len(piece)
            return
        for ch in piece:
            i = self.src.find(ch, self.pos) if aligned else -1
            self.origin.append(i)
            if i >= 0:
                self.pos = i + 1

    def put_at(self, piece: str, source: int, style: Style | None = None) -> None:
        """Append `piece` drawn for the source character at `source` (e.g. a bullet for '-')."""
        self.text.append(piece, style)
        self.origin.extend([source] * len(piece))


@dataclass
class _Walk:
    """Where the block walker is: enclosing lists (ordered?), quote depth, a pending list
    marker (drawn at the start of the item's first line)."""

    lists: list[bool]
    quotes: int = 0
    marker: MdToken | None = None

    def prefix(self, out: _Out, look: Look) -> None:
        """Start a line: quote bars, list indentation, the item's bullet or number once."""
        if out.text:
            out.put("\n", aligned=False)
        if self.quotes:
            out.put("▌ " * self.quotes, look.mark("quote"), aligned=False)
        if self.lists:
            out.put("  " * (len(self.lists) - 1), aligned=False)
        marker, self.marker = self.marker, None
        if marker is None:
            if self.lists:
                out.put("  ", aligned=False)
            return
        if marker.info:  # ordered: the number as typed, then the delimiter
            out.put(f"{marker.info}{marker.markup}", look.mark("marker"))
        else:
            at = out.src.find(marker.markup, out.pos)
            out.pos = at + 1 if at >= 0 else out.pos
            out.put_at("•", at, look.mark("marker"))
        out.put(" ", aligned=False)


def _skip_target(out: _Out) -> None:
    """After a link's text: move past its ``](target)``, so that no later character is matched to
    a character of the target."""
    if out.src.startswith("](", out.pos):
        end = out.src.find(")", out.pos)
        out.pos = end + 1 if end >= 0 else out.pos


def _inline(tok: MdToken, walk: _Walk, out: _Out, look: Look, base: Style) -> None:
    """Render an inline token's children with the emphasis / code / link styles."""
    stack = [base]
    for child in tok.children or []:
        kind = child.type
        if kind in _INLINE:
            stack.append(stack[-1] + look.mark(_INLINE[kind]))
        elif kind in _CLOSE:
            if len(stack) > 1:
                stack.pop()
            if kind == "link_close":
                _skip_target(out)
        elif kind in ("softbreak", "hardbreak"):  # kept as a line break, as the model wrote it
            nl = out.src.find("\n", out.pos)
            out.pos = nl + 1 if nl >= 0 else out.pos
            walk.prefix(out, look)
        elif kind == "code_inline":
            out.put(child.content, stack[-1] + look.mark("code"))
        elif kind == "image":
            _inline(child, walk, out, look, stack[-1] + look.mark("link"))
            _skip_target(out)
        else:
            out.put(child.content, stack[-1])


def _code(tok: MdToken, walk: _Walk, out: _Out, look: Look) -> None:
    """A code box: the language label, then the code lines on the code background, padded to
    the longest line rounded up to BOX_STEP cells, so the box is a rectangle that a streaming
    line widens seldom (each widening restyles every line of the box: a redraw of all of them).
    The fences are not drawn."""
    box = look.mark("code_block")
    lang = tok.info.split()[0] if tok.info.strip() else ""
    lines = tok.content.rstrip("\n").split("\n")
    width = max(len(lang), *(len(line) for line in lines)) + 2
    width += -width % BOX_STEP
    if lang:
        walk.prefix(out, look)
        out.put(" ", box, aligned=False)
        out.put(lang, box + look.mark("label"))
        out.put(" " * (width - len(lang) - 1), box, aligned=False)
    out.code.append((lang, []))
    for line in lines:
        walk.prefix(out, look)
        out.put(" ", box, aligned=False)
        out.code[-1][1].append((len(out.text), line))
        out.put(line, box)
        out.put(" " * (width - len(line) - 1), box, aligned=False)


def _walk(tokens: Sequence[MdToken], out: _Out, look: Look) -> None:
    walk = _Walk(lists=[])
    heading = Style()
    for tok in tokens:
        kind = tok.type
        if kind in ("bullet_list_open", "ordered_list_open"):
            walk.lists.append(kind == "ordered_list_open")
        elif kind in ("bullet_list_close", "ordered_list_close"):
            walk.lists.pop()
        elif kind == "list_item_open":
            walk.marker = tok
        elif kind == "blockquote_open":
            walk.quotes += 1
        elif kind == "blockquote_close":
            walk.quotes -= 1
        elif kind == "heading_open":
            heading = look.mark("heading") + (look.mark("h1") if tok.tag == "h1" else Style())
        elif kind == "heading_close":
            heading = Style()
        elif kind == "inline":
            walk.prefix(out, look)
            _inline(tok, walk, out, look, heading)
        elif kind in ("fence", "code_block"):
            _code(tok, walk, out, look)
        elif kind == "hr":
            walk.prefix(out, look)
            out.put_at("─" * 24, out.src.find(tok.markup[:1], out.pos), look.mark("marker"))


def _provenance(out: _Out, kinds: Sequence[str], look: Look) -> None:
    """Colour each character by its source character's kind (run-length spans, layered last)."""
    n = len(kinds)
    start = 0
    for kind, run in groupby([kinds[o] if 0 <= o < n else "" for o in out.origin]):
        end = start + len(list(run))
        if look.kinds.get(kind):
            out.text.spans.append(Span(start, end, look.kinds[kind]))
        start = end


def _highlight(out: _Out, look: Look) -> None:
    """Syntax colours for the code boxes (the provenance-off view), each box lexed whole."""
    for lang, lines in out.code:
        if not lang:
            continue
        code = "\n".join(line for _, line in lines)
        lit = Syntax(code, lang, theme=look.code_theme).highlight(code)
        for (offset, line), part in zip(lines, lit.split("\n", allow_blank=True), strict=False):
            out.text.spans.extend(
                Span(offset + s.start, offset + min(s.end, len(line)), s.style)
                for s in part.spans
                if s.start < len(line)
            )


def render_block(tokens: Sequence[MdToken], src: str, kinds: Sequence[str], look: Look) -> Text:
    """One block's tokens (from `blocks`) drawn from its source `src`, `kinds[i]` the provenance
    of `src[i]`.

    >>> look = Look({"accepted": Style(color="green")}, {"strong": Style(bold=True)})
    >>> src = "a **b**"
    >>> text = render_block(_MD.parse(src), src, ["target"] * 4 + ["accepted"] * 3, look)
    >>> text.plain, [(s.start, s.end, str(s.style)) for s in text.spans]
    ('a b', [(2, 3, 'bold'), (2, 3, 'green')])
    """
    out = _Out(src)
    _walk(tokens, out, look)
    if look.provenance:
        _provenance(out, kinds, look)
    else:
        _highlight(out, look)
    return out.text


@dataclass(frozen=True)
class Block:
    """A unit of rendering: `text[start:end]` of the parsed text and its tokens, drawn after the
    previous unit with `joint` between them. A top-level block, or one top-level item of a list
    (wrapped in its list's tokens): a long list then streams item by item, not redrawn whole."""

    start: int
    end: int
    tokens: tuple[MdToken, ...]
    joint: str = "\n\n"


_LISTS = ("bullet_list_open", "ordered_list_open")


def blocks(text: str) -> list[Block]:
    """The units of `text`, in order (link reference definitions give none).

    >>> [(b.start, b.end, b.joint) for b in blocks("# Hi\\n\\n- a\\n- b\\n")]
    [(0, 5, '\\n\\n'), (6, 10, '\\n\\n'), (10, 14, '\\n')]
    """
    lines = [0, *(m.end() for m in re.finditer("\n", text)), len(text)]  # line -> offset

    def span(tok: MdToken) -> tuple[int, int]:
        first = tok.map or [0, 0]
        return lines[first[0]], lines[min(first[1], len(lines) - 1)]

    out: list[Block] = []
    group: list[MdToken] = []
    for tok in _MD.parse(text):
        group.append(tok)
        if tok.level == 0 and tok.nesting <= 0:
            out.extend(_units(group, span))
            group = []
    return out


def _units(group: list[MdToken], span: Callable[[MdToken], tuple[int, int]]) -> list[Block]:
    """One top-level block, or a list's items each in its own unit."""
    if group[0].type not in _LISTS:
        return [Block(*span(group[0]), tuple(group))]
    units: list[Block] = []
    item: list[MdToken] = []
    for tok in group[1:-1]:
        item.append(tok)
        if tok.type == "list_item_close" and tok.level == 1:
            tokens = (group[0], *item, group[-1])
            units.append(Block(*span(item[0]), tokens, "\n" if units else "\n\n"))
            item = []
    return units


def code_blocks(text: str) -> list[str]:
    """The code of every fenced or indented code block, in order.

    >>> code_blocks("Try:\\n\\n```sh\\nls -l\\n```\\n")
    ['ls -l\\n']
    """
    return [t.content for t in _MD.parse(text) if t.type in ("fence", "code_block")]


def _digits(block: Block, text: str, base: int) -> bool:
    return text[base + block.start : base + block.end].strip().isdigit()


class BlockCache:
    """The rendering of one growing text: finished blocks are drawn once, the last one each time.

    `update(text, kinds)` / `render(text, kinds)` must be called with the same text grown at the
    end (or a new cache made): everything before `upto` is assumed unchanged. Finished units are
    kept apart in `units`, each as (joint before it, drawing), so that a view can show each one
    once and redraw only the open part.

    >>> cache = BlockCache(Look({}, {}))
    >>> joint, drawn = cache.update("# Hi\\n\\nsome", ["target"] * 10)
    >>> joint, drawn.plain, [(j, t.plain) for j, t in cache.units]
    ('\\n\\n', 'some', [('', 'Hi')])
    """

    def __init__(self, look: Look) -> None:
        self.look = look
        self.units: list[tuple[str, Text]] = []  # finished units: (joint before it, drawing)
        self.upto = 0  # text[:upto] is rendered into `units`
        self.joint = "\n\n"  # before the unit at `upto` (a list's next item: one line break)

    @property
    def blocks(self) -> int:
        """How many finished units."""
        return len(self.units)

    def update(self, text: str, kinds: Sequence[str]) -> tuple[str, Text]:
        """Move the units that finished into `units`; return the open part: (joint, drawing)."""
        base = self.upto
        found = blocks(text[base:])
        if found:
            found[0] = replace(found[0], joint=self.joint)
        # A paragraph of digits may still become the next item of the list before it ("3" -> "3.")
        keep = 2 if len(found) > 1 and _digits(found[-1], text, base) else 1
        for block in found[:-keep]:
            self.units.append(self._unit(base, block, text, kinds, first=not self.units))
        opened = [
            self._unit(base, block, text, kinds, first=not self.units and i == 0)
            for i, block in enumerate(found[-keep:])
        ]
        if found:
            self.upto, self.joint = base + found[-keep].start, found[-keep].joint
        if not opened:
            return "", Text()
        drawn = Text()
        for i, (joint, part) in enumerate(opened):
            drawn.append(joint if i else "")
            drawn.append_text(part)
        return opened[0][0], drawn

    def render(self, text: str, kinds: Sequence[str]) -> Text:
        """The whole text rendered: the cached finished units plus the open one."""
        tail = self.update(text, kinds)  # first: it moves the units that finished
        shown = Text()
        for joint, drawn in (*self.units, tail):
            shown.append(joint)
            shown.append_text(drawn)
        return shown

    def _unit(
        self, base: int, block: Block, text: str, kinds: Sequence[str], first: bool
    ) -> tuple[str, Text]:
        a, b = base + block.start, base + block.end
        drawn = render_block(block.tokens, text[a:b], kinds[a:b], self.look)
        return ("" if first else block.joint), drawn
