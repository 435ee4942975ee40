"""One assistant answer on screen: Markdown rendered as it streams, every character coloured by the
token it came from, and a reasoning model's ``<think>`` part as a dimmed block that folds.

Token styles are component classes (`token--accepted` ...), so themes and users restyle them in CSS.
They differ in more than hue, for colour-blind users and monochrome terminals:
accepted = plain colour, corrected = bold + underline, bonus = italic on a tinted background,
target (speculation off) = the default text style. Markdown styles (`md--strong` ...) add their
attributes under the token colour; with provenance off (`provenance = False`) only they remain and
code blocks get syntax colours.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from edgespec.tui.markdown import BlockCache, Look
from edgespec.tui.part import AnswerPart
from edgespec.tui.think import ThinkSplit, split_think
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.widget import Widget

from edgespec.events import TOKEN_KINDS, Token

Run = tuple[str, str]  # (kind, text)

# C0 controls and DEL (except newline and tab) would move the terminal's cursor: show their
# Unicode "control pictures" instead (one cell each). Random tiny models emit them.
_CONTROLS = {c: 0x2400 + c for c in range(32) if chr(c) not in "\n\t"} | {0x7F: 0x2421}

# While an answer streams, its open part's height is held at a multiple of half the view's height
# (this many lines at least): a token that starts a line then repaints a line or two instead of
# laying out (and redrawing) the whole screen, and the view moves on half a screen at a time.
HOLD = 4
# Finished Markdown units stay in the open part until they fill this many lines and the screen is
# laid out anyway, then move into a part of their own together: mounting a part lays out the
# whole screen, and one part per unit did that on most frames of a streamed answer.
GROUP = 12

MARKS = "heading h1 strong emphasis strike link code code_block label quote marker".split()


def clean_text(text: str) -> str:
    r"""Text safe to draw: control characters become visible symbols.

    >>> clean_text("a\x0bb\n")
    'a␋b\n'
    """
    return text.translate(_CONTROLS)


def merge_runs(runs: list[Run], tokens: Iterable[Token]) -> list[Run]:
    """Append tokens to run-length `(kind, text)` runs in place and return `runs`.

    >>> merge_runs([("accepted", "a")], [Token(1, "b", "accepted", 0), Token(2, "c", "bonus", 0)])
    [('accepted', 'ab'), ('bonus', 'c')]
    """
    for tok in tokens:
        text = clean_text(tok.text)
        if runs and runs[-1][0] == tok.kind:
            runs[-1] = (tok.kind, runs[-1][1] + text)
        elif text:
            runs.append((tok.kind, text))
    return runs


def _own(style: Style, base: Style) -> Style:
    """`style` without the colours it shares with `base` (the widget's), so that layered over a
    Markdown style it keeps that style's background (e.g. a code block's).

    >>> str(_own(Style.parse("bold red on black"), Style.parse("white on black")))
    'bold red'
    """
    color = None if style.color == base.color else style.color
    bgcolor = None if style.bgcolor == base.bgcolor else style.bgcolor
    return Style(color=color, bgcolor=bgcolor) + Style(
        bold=style.bold,
        dim=style.dim,
        italic=style.italic,
        underline=style.underline,
        strike=style.strike,
        reverse=style.reverse,
    )


def part_text(joint: str, drawn: Text) -> Text:
    r"""A unit drawn in its own part: each part starts a line, so its joint (the line breaks
    between it and the unit before) loses one line break.

    >>> part_text("\n\n", Text("b")).plain, part_text("\n", Text("b")).plain
    ('\nb', 'b')
    """
    return Text(joint[1:]) + drawn


class AnswerView(Widget):
    """One assistant answer, drawn in parts (`AnswerPart`): the reasoning, finished Markdown units
    (GROUP lines or more a part, drawn once, so Textual lays each out and renders it once), and
    the open part (the units not yet grouped, the open unit and the note), the only part a
    streamed batch redraws: the cost of a batch does not grow with the answer. Everything is
    redrawn when the theme, the colour mode or the reasoning fold changes. `text()` is the whole
    answer as drawn."""

    COMPONENT_CLASSES = {f"token--{kind}" for kind in TOKEN_KINDS} | {f"md--{m}" for m in MARKS}
    DEFAULT_CSS = """
    AnswerView {
        height: auto;
        padding: 0 1;
        margin: 0 0 1 0;
    }
    AnswerView > .token--accepted { color: $text-success; }
    AnswerView > .token--corrected { color: $text-error; text-style: bold underline; }
    AnswerView > .token--bonus { color: $text-accent; background: $accent 20%; text-style: italic; }
    AnswerView > .token--target { }
    AnswerView > .md--heading { text-style: bold; }
    AnswerView > .md--h1 { text-style: bold underline; }
    AnswerView > .md--strong { text-style: bold; }
    AnswerView > .md--emphasis { text-style: italic; }
    AnswerView > .md--strike { text-style: strike; }
    AnswerView > .md--link { text-style: underline; }
    AnswerView > .md--code { background: $foreground 12%; }
    AnswerView > .md--code_block { background: $foreground 8%; }
    AnswerView > .md--label { color: $text-muted; text-style: italic; }
    AnswerView > .md--quote { color: $text-muted; }
    AnswerView > .md--marker { color: $text-primary; text-style: bold; }
    """

    def __init__(
        self,
        runs: Sequence[Run] = (),
        note: str = "",
        *,
        provenance: bool = True,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self._runs: list[Run] = list(runs)
        self._plain = "".join(text for _, text in self._runs)
        self._kinds: list[str] = [kind for kind, text in self._runs for _ in text]
        self._provenance = provenance
        self.think_open: bool | None = None  # None: shown while it streams, folded after
        self._look: Look | None = None  # built lazily: component styles need a mounted widget
        self._think: tuple[int, BlockCache] | None = None  # (offset, cache) of the reasoning
        self._body: tuple[int, bool, BlockCache] | None = None  # (offset, after reasoning, cache)
        self._head, self._tail = AnswerPart(), AnswerPart()
        self._units: list[AnswerPart] = []  # finished units of the body, GROUP lines a part
        self._placed = 0  # how many finished units are in `_units` (the rest: in the open part)
        self._live = False  # mounted: the parts can be drawn (styles and theme known)
        self.streaming = False  # tokens still come: the open part keeps blank lines (HOLD)
        self.note = note

    @property
    def runs(self) -> list[Run]:
        """Run-length (kind, text) pairs of everything shown so far."""
        return list(self._runs)

    @property
    def plain(self) -> str:
        """The answer text without styles (Markdown and tags as the model wrote them)."""
        return self._plain

    @property
    def provenance(self) -> bool:
        """Colour by provenance (True) or show the Markdown only, code highlighted (False)."""
        return self._provenance

    @provenance.setter
    def provenance(self, on: bool) -> None:
        self._provenance = on
        self._restyle()

    def compose(self) -> ComposeResult:
        yield self._head
        yield self._tail

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._on_theme)
        self._live = True
        self._sync()

    def on_unmount(self) -> None:
        # Textual forgets a subscriber (or a watcher) only when its signal next fires: until the
        # theme changed, every answer ever shown, and every line it drew, would stay in memory.
        self.app.theme_changed_signal.unsubscribe(self)

    def _on_theme(self, theme: object = None) -> None:
        self.call_after_refresh(self._restyle)  # then the component styles have its colours

    def _restyle(self) -> None:
        self._look, self._think = None, None
        self._reset_body()
        self._sync()

    def _reset_body(self) -> None:
        for part in self._units:
            part.remove()
        self._units, self._body, self._placed = [], None, 0

    def _make_look(self) -> Look:
        def own(name: str) -> Style:  # the component's style less what it inherits
            style = self.get_component_rich_style(name, default=Style())
            return _own(style, self.rich_style)

        kinds = {k: own(f"token--{k}") for k in TOKEN_KINDS}
        marks = {m: own(f"md--{m}") for m in MARKS}
        theme = "ansi_dark" if self.app.current_theme.dark else "ansi_light"
        return Look(kinds, marks, provenance=self._provenance, code_theme=theme)

    def show_reading(self, note: str) -> None:
        """A dim line where the answer will start, e.g. 'reading prompt 2,048 / 8,000 tokens',
        until its first tokens replace it (the answer keeps streaming)."""
        self.note = note
        self._sync()

    def append(self, tokens: Sequence[Token]) -> None:
        """Add streamed tokens at the end, each coloured by its kind."""
        if not tokens:
            return
        if self.streaming:
            self.note = ""  # show_reading's: the answer has started
        merge_runs(self._runs, tokens)
        pieces = [(tok.kind, clean_text(tok.text)) for tok in tokens]
        self._plain += "".join(text for _, text in pieces)
        self._kinds.extend(kind for kind, text in pieces for _ in text)
        self._sync()

    def set_note(self, note: str) -> None:
        """End the answer with a dim remark, e.g. '[stopped]' ('' for none): it stops
        streaming, and the open part loses the blank lines held for it."""
        self.note, self.streaming = note, False
        self._sync()

    def toggle_think(self, show: bool | None = None) -> None:
        """Fold or unfold the reasoning (`show` None: the other way from now)."""
        split = split_think(self._plain)
        self.think_open = (not self._think_shown(split)) if show is None else show
        self._sync()

    def _think_shown(self, split: ThinkSplit | None) -> bool:
        if self.think_open is not None:
            return self.think_open
        return split is not None and not split.closed

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None and offset.y == 0 and split_think(self._plain) is not None:
            self.toggle_think()

    def _head_text(self, split: ThinkSplit, look: Look) -> Text:
        """The reasoning's line (▼/▶ Thought) and, unfolded, its text dimmed."""
        shown = self._think_shown(split)
        text = Text()
        text.append(f"{'▼' if shown else '▶'} {'Thought' if split.closed else 'Thinking…'}")
        text.stylize("italic dim")
        if not shown:
            text.append("  (click or F9 to show)", "dim")
            return text
        if self._think is None or self._think[0] != split.start:
            self._think = (split.start, BlockCache(look))
        think = self._think[1].render(
            self._plain[split.start : split.end], self._kinds[split.start : split.end]
        )
        think.stylize(Style(dim=True))
        return Text.assemble(text, "\n", think)

    def _sync(self) -> None:
        """Bring the parts up to date with the text (once mounted): only what changed redraws."""
        if not self._live:
            return
        if self._look is None:
            self._look = self._make_look()
        split = split_think(self._plain)
        head, start = Text(), 0
        if split is not None:
            start = split.body
            if not (split.closed and not self._plain[split.start : split.end].strip()):
                head = self._head_text(split, self._look)  # else thinking off: body only
        self._head.show(head)
        note, lines = self._note_text(), self.hold() if self.streaming else 1
        held, joint, unit = self._body_tail(start, bool(head))
        tail = (held + Text(joint) + unit if held else part_text(joint, unit)) + note
        if held and held.plain.count("\n") + 1 >= GROUP and self._tail.needs_layout(tail, lines):
            self._group(held)  # the screen is laid out anyway: move the finished units now
            tail = part_text(joint, unit) + note
        self._tail.show(tail, lines)

    def hold(self) -> int:
        """Lines a streaming open part holds: half the conversation's height (HOLD at least), so
        that the view moves on half a screen at a time and most batches repaint a line or two."""
        parent = self.parent
        height = parent.scrollable_content_region.height if isinstance(parent, Widget) else 0
        return max(HOLD, height // 2)

    def _note_text(self) -> Text:
        return Text(f"  {self.note}", "dim italic") if self.note else Text()

    def _body_tail(self, start: int, after_head: bool) -> tuple[Text, str, Text]:
        """The body from `start`, less the units already in parts: (the finished units not yet in
        a part, the open unit's joint, the open unit)."""
        if self._body is None or self._body[:2] != (start, after_head):
            self._reset_body()
            assert self._look is not None
            self._body = (start, after_head, BlockCache(self._look))
        cache = self._body[2]
        joint, tail = cache.update(self._plain[start:], self._kinds[start:])
        if after_head and not cache.units and not tail.plain.strip():
            return Text(), "", Text()  # no answer after the reasoning yet
        first = "\n\n" if after_head else ""  # a blank line after the reasoning
        held = Text()  # finished units not yet in a part of their own
        for i, (unit_joint, drawn) in enumerate(cache.units[self._placed :], self._placed):
            unit_joint = unit_joint or (first if i == 0 else "")
            if held:  # in place: a copy per unit made each batch quadratic in the held lines
                held.append(unit_joint)
                held.append_text(drawn)
            else:
                held = part_text(unit_joint, drawn)  # a new Text: the cached unit stays as is
        return held, joint if held else joint or first, tail

    def _group(self, held: Text) -> None:
        """Move the finished units not yet in a part (`held`) into a part of their own."""
        assert self._body is not None
        part = AnswerPart(held)
        self._units.append(part)
        self._placed = len(self._body[2].units)
        self.mount(part, before=self._tail)

    def text(self) -> Text:
        """The whole answer as drawn: its parts, one after another."""
        parts = [p.text for p in (self._head, *self._units, self._tail) if p.text]
        return Text("\n").join(parts)
