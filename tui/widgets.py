"""Widgets of the chat screen: the user's messages, the legend, the live stats panel (the
answer itself is `edgespec.tui.answer.AnswerView`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from edgespec.tui.answer import AnswerView, Run, clean_text, merge_runs
from edgespec.tui.part import TextLines
from edgespec.tui.think import ThinkCounter
from rich.highlighter import Highlighter
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, Sparkline, Static

from edgespec.events import Round, Stats, Token

__all__ = ["AnswerView", "Legend", "PromptInput", "StatsPanel", "StatsView", "TurnMeter"]
__all__ += ["UserMessage"]
__all__ += ["clean_text", "merge_runs"]


class UserMessage(Static):
    """A user prompt in the conversation, shown as the text it is: square brackets are not
    Textual markup ('[/]' in a paste would end the app with a MarkupError) and special-token
    strings such as '<|im_end|>' are characters like any other."""

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

    def __init__(self, prompt: str) -> None:
        super().__init__(prompt, markup=False)


class _LineBreaks(Highlighter):
    """Draws each line break of the prompt box's one line as '⏎' (one cell, as the break
    counts for one character of the value); the value keeps the break."""

    def __call__(self, text: str | Text) -> Text:
        text = Text(text) if isinstance(text, str) else text
        shown = Text(text.plain.replace("\n", "⏎"), no_wrap=True, overflow="ignore", end="")
        shown.spans = list(text.spans)
        return shown

    def highlight(self, text: Text) -> None:  # everything is done in __call__
        pass


class PromptInput(Input):
    """The prompt box. A paste goes in whole: Textual's Input keeps only a paste's first line,
    which sent the question without the rest of a pasted document. Its line breaks stay in the
    value (drawn as '⏎') and reach the model."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(highlighter=_LineBreaks(), **kwargs)  # type: ignore[arg-type]

    def _on_paste(self, event: events.Paste) -> None:
        event.prevent_default()  # Input's own handler: the first line only
        event.stop()
        text = event.text.replace("\r\n", "\n").replace("\r", "\n")
        if not text:
            return
        if self.selection.is_empty:
            self.insert_text_at_cursor(text)
        else:
            self.replace(text, *self.selection)


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
    branches: tuple[int, int] = (0, 0)  # tree rounds, and those won by a non-first branch
    think: ThinkCounter = field(default_factory=ThinkCounter)  # reasoning tokens apart

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
                self.think.add(tok.text)
        for r in rounds:
            if r.method != "none":
                self.k_now = r.k
            if r.method == "none":
                continue
            self.branches = (self.branches[0] + (r.nodes > 0), self.branches[1] + (r.branch > 0))
            self.drafted += r.drafted
            self.accepted += r.accepted
            rows = max(r.k, r.accepted) + 1  # a row per length the round's K allows, as at the end
            self.hist.extend([0] * (rows - len(self.hist)))
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
    k_max: int = 8  # adaptive K's largest K
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
    branches: tuple[int, int] = (0, 0)  # tree rounds, and those won by a non-first branch
    think_tokens: tuple[int, int] | None = None  # (reasoning, answer), for a reasoning model
    # The most memory MLX held during the last answer, and during any answer of this session
    # (bytes; None: not measured, e.g. the fake engine, or no answer yet).
    peak_memory: int | None = None
    session_peak: int | None = None

    def with_think(self, counter: ThinkCounter | None) -> StatsView:
        """Count the reasoning apart when the answer had any."""
        if counter is not None and counter.think:
            self.think_tokens = (counter.think, counter.answer + counter.pending)
        return self

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
        self.k_now, self.branches = meter.k_now, meter.branches
        self.live = True
        return self.with_think(meter.think)

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


def memory_text(peak: int | None, session: int | None) -> str:
    """The peak memory row: the last answer's, and the session's where it was higher.

    >>> memory_text(300 * 2**20, 3 * 2**29)
    '300 MB (max 1.50 GB)'
    >>> memory_text(None, 2**30), memory_text(2**30, 2**30)
    ('— (max 1.00 GB)', '1.00 GB')
    """

    def size(n: int) -> str:
        return f"{n / 2**30:.2f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"

    text = "—" if peak is None else size(peak)
    if session is not None and session != peak:
        text += f" (max {size(session)})"
    return text


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
    if v.branches[0]:  # draft trees: how often a branch other than the first-ranked path won
        rows.insert(5, ("Other branch", f"{v.branches[1]} of {v.branches[0]} rounds"))
    if v.think_tokens is not None:  # a reasoning model: tokens inside <think> and after it
        rows[5:5] = [
            ("Reasoning", f"{v.think_tokens[0]} tokens"),
            ("Answer", f"{v.think_tokens[1]} tokens"),
        ]
    if v.session_peak is not None:  # MLX allocated something: a real engine
        rows.insert(4, ("Peak memory", memory_text(v.peak_memory, v.session_peak)))
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
        yield TextLines(id="table")
        yield Static("Tokens per round", classes="panel-title")
        yield Sparkline([], id="sparkline")
        yield Static("Accepted drafts per round", classes="panel-title")
        yield TextLines(id="histogram")
        yield Static("Legend", classes="panel-title")
        yield Legend()

    _rows: tuple[tuple[int, bool], int] | None = None  # ((K's rows, spec on), histogram lines)

    def show(self, view: StatsView) -> None:
        """Redraw all numbers from `view`: only the lines that changed repaint, and the screen is
        laid out only where the lines are not as many as before."""
        self.query_one("#sparkline", Sparkline).data = [float(n) for n in view.per_round[-64:]]
        hist = histogram(view.hist)
        if not any(view.hist) and not view.spec_on:
            hist = Text("speculation off: plain decoding", "dim")
        hist = self._held(hist, ((view.k_max if view.adaptive else view.k) + 1, view.spec_on))
        self.query_one("#table", TextLines).show(stats_table(view))
        self.query_one("#histogram", TextLines).show(hist)

    def _held(self, hist: Text, settings: tuple[int, bool]) -> Text:
        """`hist` padded with blank lines to the most lines it took under these settings (the
        rows K allows at first, with speculation on): a new turn's empty histogram and its first
        rounds repaint it instead of laying out the screen twice a turn."""
        lines = hist.plain.count("\n") + 1
        if self._rows is None or self._rows[0] != settings:
            self._rows = (settings, settings[0] if settings[1] else 1)
        most = max(self._rows[1], lines)
        self._rows = (settings, most)
        return Text.assemble(hist, "\n" * (most - lines))


class SteadyFooter(Footer):
    """Textual's footer, except that when only which bindings are enabled changes (Stop, at each
    turn's start and end), its keys are greyed or lit in place. Textual's recomposes the footer
    (every key unmounted, mounted again, the screen laid out), about 35 ms of the UI thread a turn
    here. Any other change (keys added or gone), or a Textual whose keys differ, still
    recomposes."""

    def bindings_changed(self, screen: Screen) -> None:
        enabled: dict[str, bool] = {}
        for _node, binding, on, _tip in screen.active_bindings.values():
            if binding.show:
                enabled.setdefault(binding.action, on)
        keys = [key for key in self.query("FooterKey") if not key.has_class("-command-palette")]
        actions = {getattr(key, "action", None) for key in keys}
        same = keys and actions == set(enabled) and getattr(self, "_bindings_ready", False)
        if same and all(hasattr(key, "_disabled") for key in keys):
            for key in keys:  # what FooterKey's constructor does with `disabled`
                key._disabled = not enabled[key.action]  # type: ignore[attr-defined]
                key.set_class(key._disabled, "-disabled")  # type: ignore[attr-defined]
            return
        super().bindings_changed(screen)
