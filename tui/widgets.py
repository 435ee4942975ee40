"""Widgets of the chat screen: the token-coloured answer, the legend, the live stats panel.

Token styles are component classes (`token--accepted` ...), so themes and users restyle them in CSS.
They differ in more than hue, for colour-blind users and monochrome terminals:
accepted = plain colour, corrected = bold + underline, bonus = italic on a tinted background,
target (speculation off) = the default text style.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rich.style import Style
from rich.text import Span, Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Sparkline, Static

from edgespec.events import TOKEN_KINDS, Round, Stats, Token

Run = tuple[str, str]  # (kind, text)

# C0 controls and DEL (except newline and tab) would move the terminal's cursor: show their
# Unicode "control pictures" instead (one cell each). Random tiny models emit them.
_CONTROLS = {c: 0x2400 + c for c in range(32) if chr(c) not in "\n\t"} | {0x7F: 0x2421}


def clean_text(text: str) -> str:
    """Text safe to draw: control characters become visible symbols.

    >>> clean_text("a\x0bb\n")
    'a␋b\n'
    """
    return text.translate(_CONTROLS)


def append_styled(text: Text, piece: str, style: Style) -> None:
    """Append `piece` to `text`, extending the last span when it has the same style.

    Building an answer token by token or run by run then gives identical spans (and identical
    screen output), whatever the batching was.
    """
    start = len(text)
    text.append(piece)
    if not style or not piece:
        return
    spans = text.spans
    if spans and spans[-1].end == start and spans[-1].style == style:
        spans[-1] = Span(spans[-1].start, len(text), style)
    else:
        spans.append(Span(start, len(text), style))


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


class AnswerView(Widget):
    """One assistant answer. `append` adds styled spans to a cached `Text` (O(batch), no
    re-styling of earlier tokens); the whole text is re-styled only when the theme changes."""

    COMPONENT_CLASSES = {f"token--{kind}" for kind in TOKEN_KINDS}
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
    """

    def __init__(
        self,
        runs: Sequence[Run] = (),
        note: str = "",
        *,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self._runs: list[Run] = list(runs)
        self._text: Text | None = None  # built lazily: component styles need a mounted widget
        self.note = note

    @property
    def runs(self) -> list[Run]:
        """Run-length (kind, text) pairs of everything shown so far."""
        return list(self._runs)

    @property
    def plain(self) -> str:
        """The answer text without styles."""
        return "".join(text for _, text in self._runs)

    def on_mount(self) -> None:
        self.watch(self.app, "theme", self._restyle, init=False)

    def _restyle(self) -> None:
        self._text = None
        self.refresh(layout=True)

    def _style(self, kind: str) -> Style:
        return self.get_component_rich_style(f"token--{kind}", default=Style())

    def _build(self) -> Text:
        text = Text()
        for kind, piece in self._runs:
            append_styled(text, piece, self._style(kind))
        return text

    def append(self, tokens: Sequence[Token]) -> None:
        """Add streamed tokens at the end, each styled by its kind."""
        if not tokens:
            return
        merge_runs(self._runs, tokens)
        if self._text is not None:
            for tok in tokens:
                append_styled(self._text, clean_text(tok.text), self._style(tok.kind))
        self.refresh(layout=True)

    def set_note(self, note: str) -> None:
        """A dim remark after the answer, e.g. '[stopped]'."""
        self.note = note
        self.refresh(layout=True)

    def render(self) -> Text:
        if self._text is None:
            self._text = self._build()
        if not self.note:
            return self._text
        return Text.assemble(self._text, (f"  {self.note}", "dim italic"))


class UserMessage(Static):
    """A user prompt in the conversation."""

    DEFAULT_CSS = """
    UserMessage {
        height: auto;
        padding: 0 1;
        margin: 1 0 1 0;
        border-left: thick $primary;
        background: $boost;
        text-style: bold;
    }
    """


class Legend(AnswerView):
    """The key to token colours, drawn with the answer's own styles."""

    DEFAULT_CSS = """
    Legend { margin: 0; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        runs: list[Run] = [
            ("accepted", "accepted"),
            ("target", " "),
            ("corrected", "corrected"),
            ("target", " "),
            ("bonus", "bonus"),
            ("target", " target"),
        ]
        super().__init__(runs, id=id, classes=classes)


@dataclass
class TurnMeter:
    """Live statistics of the turn in progress, folded from streamed tokens and rounds.

    Times are `time.monotonic()` values passed in by the caller (so tests can fix them).
    """

    started: float
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    per_round: dict[int, int] = field(default_factory=dict)  # round index -> tokens committed
    hist: list[int] = field(default_factory=list)  # hist[i] = rounds that accepted i drafts
    k_now: int | None = None  # K of the latest speculative round (adaptive K: the chosen one)

    def rounds_in_order(self) -> list[int]:
        """Tokens committed by each round so far, in round order."""
        return [self.per_round[i] for i in sorted(self.per_round)]

    def add(self, tokens: Sequence[Token], rounds: Sequence[Round], now: float) -> None:
        """Fold one batch in."""
        if tokens:
            if self.first_token is None:
                self.first_token = now
            self.last_token = now
            self.tokens += len(tokens)
            for tok in tokens:
                self.per_round[tok.round] = self.per_round.get(tok.round, 0) + 1
        for r in rounds:
            if r.method != "none":
                self.k_now = r.k
            if r.method == "none" or r.drafted == 0:
                continue
            self.drafted += r.drafted
            self.accepted += r.accepted
            if len(self.hist) <= r.accepted:
                self.hist.extend([0] * (r.accepted + 1 - len(self.hist)))
            self.hist[r.accepted] += 1

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.started

    @property
    def tokens_per_s(self) -> float | None:
        if (
            self.first_token is None
            or self.last_token is None
            or self.last_token <= self.first_token
        ):
            return None
        return self.tokens / (self.last_token - self.first_token)


@dataclass
class StatsView:
    """Everything the stats panel shows, as plain values (None = not measured yet)."""

    k: int
    temperature: float
    spec_on: bool
    adaptive: bool = False
    k_now: int | None = None  # adaptive K: the latest round's choice
    acceptance: float | None = None
    tau: float | None = None
    tokens_per_s: float | None = None
    ttft: float | None = None
    prompt_tokens: int | None = None
    prefilled_tokens: int | None = None
    rounds: int = 0
    tokens: int = 0
    plain_tps: float | None = None
    spec_tps: float | None = None
    per_round: list[int] = field(default_factory=list)
    hist: list[int] = field(default_factory=list)
    live: bool = False

    def with_meter(self, meter: TurnMeter) -> StatsView:
        """Fill the turn's numbers from a live meter."""
        self.rounds = len(meter.per_round)
        self.tokens = meter.tokens
        self.acceptance = meter.accepted / meter.drafted if meter.drafted else None
        self.tau = meter.tokens / self.rounds if self.rounds else None
        self.tokens_per_s = meter.tokens_per_s
        self.ttft = meter.ttft
        self.per_round = [meter.per_round[i] for i in sorted(meter.per_round)]
        self.hist = list(meter.hist)
        self.k_now = meter.k_now
        self.live = True
        return self

    def with_stats(self, stats: Stats, per_round: list[int], k_now: int | None) -> StatsView:
        """Fill the turn's numbers from the engine's final `Stats` (exact), the streamed
        per-round counts and the latest round's K."""
        self.rounds, self.tokens = stats.rounds, stats.tokens
        self.acceptance = stats.acceptance if stats.drafted else None
        self.tau = stats.tau if stats.rounds else None
        self.tokens_per_s = stats.tokens_per_s
        self.ttft = stats.ttft
        self.prompt_tokens, self.prefilled_tokens = stats.prompt_tokens, stats.prefilled_tokens
        self.per_round = list(per_round)
        self.hist = list(stats.accepted_hist)
        self.k_now = k_now
        self.live = False
        return self


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{unit}"


def k_text(v: StatsView) -> str:
    """The K row: the fixed K, or 'auto' with the latest round's choice (0 = a plain step).

    >>> k_text(StatsView(k=4, temperature=0, spec_on=True))
    '4'
    >>> k_text(StatsView(k=4, temperature=0, spec_on=True, adaptive=True, k_now=1))
    'auto (now 1)'
    """
    if not v.adaptive:
        return str(v.k)
    return "auto" if v.k_now is None else f"auto (now {v.k_now})"


def stats_table(v: StatsView) -> Text:
    """The panel's key/value lines."""
    speedup = "—"
    if v.plain_tps and v.spec_tps:
        speedup = f"{v.spec_tps / v.plain_tps:.2f}×"
    ttft = _fmt(None if v.ttft is None else v.ttft * 1000, ".0f", " ms")
    if v.prefilled_tokens is not None and v.prompt_tokens:
        ttft += f" ({v.prefilled_tokens}/{v.prompt_tokens} new)"
    rows = [
        ("Acceptance", _fmt(None if v.acceptance is None else v.acceptance * 100, ".1f", " %")),
        ("Tokens/round", _fmt(v.tau, ".2f")),
        ("Tokens/s", _fmt(v.tokens_per_s, ".1f")),
        ("TTFT", ttft),
        ("Rounds", str(v.rounds)),
        ("K", k_text(v)),
        ("Temperature", f"{v.temperature:.1f}"),
        ("Speculation", "on" if v.spec_on else "off (plain)"),
        ("Plain tok/s", _fmt(v.plain_tps, ".1f")),
        ("Spec tok/s", _fmt(v.spec_tps, ".1f")),
        ("Speedup", speedup),
    ]
    text = Text()
    for i, (key, value) in enumerate(rows):
        text.append(f"{key:<13}", "dim")
        text.append(value, "bold")
        if i < len(rows) - 1:
            text.append("\n")
    return text


def histogram(hist: Sequence[int], width: int = 16) -> Text:
    """Horizontal bars: one line per accepted length, e.g. ``2 ████▌ 5``.

    >>> histogram([1, 2], width=4).plain
    '0 ██   1\\n1 ████ 2'
    """
    if not hist or not any(hist):
        return Text("no drafted rounds yet", "dim")
    top = max(hist)
    eighths = " ▏▎▍▌▋▊▉█"
    lines = []
    for i, n in enumerate(hist):
        cells = n * width / top
        bar = "█" * int(cells) + (eighths[round((cells % 1) * 8)] if cells % 1 else "")
        lines.append(f"{i} {bar:<{width}} {n}")
    return Text("\n".join(lines))


class StatsPanel(Vertical):
    """Live numbers, a sparkline of tokens per round and a histogram of accepted lengths."""

    DEFAULT_CSS = """
    StatsPanel {
        width: 36;
        height: 100%;
        border-left: tall $primary 40%;
        padding: 0 1;
    }
    StatsPanel > .panel-title { text-style: bold; color: $text-primary; margin: 1 0 0 0; }
    StatsPanel > #sparkline { height: 3; margin: 0 0 0 0; }
    StatsPanel > #sparkline > .sparkline--max-color { color: $success; }
    StatsPanel > #sparkline > .sparkline--min-color { color: $error; }
    StatsPanel > #histogram { height: auto; }
    """

    def compose(self) -> ComposeResult:
        yield Static("Speculation stats", classes="panel-title")
        yield Static(id="table")
        yield Static("Tokens per round", classes="panel-title")
        yield Sparkline([], id="sparkline")
        yield Static("Accepted drafts per round", classes="panel-title")
        yield Static(id="histogram")
        yield Static("Legend", classes="panel-title")
        yield Legend()

    def show(self, view: StatsView) -> None:
        """Redraw all numbers from `view`."""
        self.query_one("#table", Static).update(stats_table(view))
        self.query_one("#sparkline", Sparkline).data = [float(n) for n in view.per_round[-64:]]
        hist = histogram(view.hist)
        if not any(view.hist) and not view.spec_on:
            hist = Text("speculation off: plain decoding", "dim")
        self.query_one("#histogram", Static).update(hist)
