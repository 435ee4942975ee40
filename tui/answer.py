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
from edgespec.tui.think import ThinkSplit, split_think
from rich.style import Style
from rich.text import Text
from textual import events
from textual.widget import Widget

from edgespec.events import TOKEN_KINDS, Token

Run = tuple[str, str]  # (kind, text)

# C0 controls and DEL (except newline and tab) would move the terminal's cursor: show their
# Unicode "control pictures" instead (one cell each). Random tiny models emit them.
_CONTROLS = {c: 0x2400 + c for c in range(32) if chr(c) not in "\n\t"} | {0x7F: 0x2421}

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


class AnswerView(Widget):
    """One assistant answer. `append` only records the tokens; the text is rendered once per
    refresh, where finished Markdown blocks come from a cache and only the open one is redrawn.
    Everything is redrawn when the theme, the colour mode or the reasoning fold changes."""

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
        self._caches: dict[str, tuple[int, BlockCache]] = {}  # part -> (offset, cache)
        self._shown: Text | None = None
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

    def on_mount(self) -> None:
        self.watch(self.app, "theme", self._restyle, init=False)

    def _restyle(self) -> None:
        self._look, self._caches, self._shown = None, {}, None
        self.refresh(layout=True)

    def _make_look(self) -> Look:
        def own(name: str) -> Style:  # the component's style less what it inherits
            style = self.get_component_rich_style(name, default=Style())
            return _own(style, self.rich_style)

        kinds = {k: own(f"token--{k}") for k in TOKEN_KINDS}
        marks = {m: own(f"md--{m}") for m in MARKS}
        theme = "ansi_dark" if self.app.current_theme.dark else "ansi_light"
        return Look(kinds, marks, provenance=self._provenance, code_theme=theme)

    def append(self, tokens: Sequence[Token]) -> None:
        """Add streamed tokens at the end, each coloured by its kind."""
        if not tokens:
            return
        merge_runs(self._runs, tokens)
        pieces = [(tok.kind, clean_text(tok.text)) for tok in tokens]
        self._plain += "".join(text for _, text in pieces)
        self._kinds.extend(kind for kind, text in pieces for _ in text)
        self._shown = None
        self.refresh(layout=True)

    def set_note(self, note: str) -> None:
        """A dim remark after the answer, e.g. '[stopped]'."""
        self.note = note
        self.refresh(layout=True)

    def toggle_think(self, show: bool | None = None) -> None:
        """Fold or unfold the reasoning (`show` None: the other way from now)."""
        split = split_think(self._plain)
        self.think_open = (not self._think_shown(split)) if show is None else show
        self._shown = None
        self.refresh(layout=True)

    def _think_shown(self, split: ThinkSplit | None) -> bool:
        if self.think_open is not None:
            return self.think_open
        return split is not None and not split.closed

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is not None and offset.y == 0 and split_think(self._plain) is not None:
            self.toggle_think()

    def _part(self, name: str, start: int, end: int, look: Look) -> Text:
        offset, cache = self._caches.get(name, (-1, None))
        if cache is None or offset != start:
            cache = BlockCache(look)
            self._caches[name] = (start, cache)
        return cache.render(self._plain[start:end], self._kinds[start:end])

    def _render_all(self) -> Text:
        if self._look is None:
            self._look = self._make_look()
        split = split_think(self._plain)
        if split is not None and split.closed and not self._plain[split.start : split.end].strip():
            return self._part("body", split.body, len(self._plain), self._look)  # thinking off
        if split is None:
            return self._part("body", 0, len(self._plain), self._look)
        shown = self._think_shown(split)
        state = "Thought" if split.closed else "Thinking…"
        text = Text()
        text.append(f"{'▼' if shown else '▶'} {state}", "italic dim")
        if not shown:
            text.append("  (click or F9 to show)", "dim")
        else:
            think = self._part("think", split.start, split.end, self._look)
            think.stylize(Style(dim=True))
            text.append("\n")
            text.append_text(think)
        body = self._part("body", split.body, len(self._plain), self._look)
        if body.plain.strip():
            text.append("\n\n")
            text.append_text(body)
        return text

    def render(self) -> Text:
        if self._shown is None:
            self._shown = self._render_all()
        if not self.note:
            return self._shown
        return Text.assemble(self._shown, (f"  {self.note}", "dim italic"))
