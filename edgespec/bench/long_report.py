"""The long-context and long-answer parts of a bench report (`--context`, `--by-position`):
results.json's `contexts` and `positions`, the table per context length, results.md's sections
and their plots. edgespec/bench/report.py writes them beside the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgespec.bench.formats import aligned, fmt, speedup_text, variant_json
from edgespec.bench.records import (
    PLAIN,
    PositionSpan,
    VariantSummary,
    aggregate,
    by_context,
    position_spans,
)
from edgespec.bench.runner import BenchResult


def contexts_json(result: BenchResult) -> list[dict[str, Any]]:
    """results.json's `contexts`: per context length, each variant's overall summary."""
    return [
        {
            "context": n,
            "label": context_label(n),
            "methods": [variant_json(v) for v in vs],
        }
        for n, vs in by_context(result.records).items()
    ]


def context_label(tokens: int) -> str:
    """'8k' for 8000 (edgespec.bench.context.label; here without importing the prompt texts)."""
    return f"{tokens / 1000:g}k" if tokens >= 1000 else str(tokens)


def positions(result: BenchResult) -> list[tuple[VariantSummary, list[PositionSpan]]]:
    """Per variant that drafted: its answer-position spans summed over its runs."""
    width = int(result.settings.get("position_width") or 0)
    if not width:
        return []
    out = []
    for v in aggregate(result.records):
        runs = [r for r in result.records if (r.method, r.k, r.temp) == (v.method, v.k, v.temp)]
        spans = position_spans(runs, width)
        if any(s.drafted for s in spans):
            out.append((v, spans))
    return out


def positions_json(result: BenchResult) -> dict[str, Any] | None:
    width = int(result.settings.get("position_width") or 0)
    if not width:
        return None
    return {
        "width": width,
        "methods": [
            {
                "method": v.method,
                "k": v.k,
                "temp": v.temp,
                "label": v.label,
                "spans": [s.to_json() for s in spans],
            }
            for v, spans in positions(result)
        ],
    }


CONTEXT_COLUMNS = ("context", "method", "tok/s", "speedup", "tau", "c", "v", "TTFT s", "peak MB")


def context_rows(contexts: dict[int, list[VariantSummary]]) -> list[list[str]]:
    """One row per context length and variant."""
    rows = []
    for n, vs in contexts.items():
        for v in vs:
            s = v.overall
            rows.append(
                [
                    context_label(n),
                    v.label,
                    fmt(s.tokens_per_s, ".1f"),
                    speedup_text(s),
                    fmt(s.tau, ".2f"),
                    fmt(s.c, ".2f"),
                    fmt(s.v, ".2f"),
                    fmt(s.ttft, ".2f"),
                    f"{s.peak_memory_mb:.0f}",
                ]
            )
    return rows


def format_context_table(contexts: dict[int, list[VariantSummary]]) -> str:
    """The long-context mode's table: per context length and variant (all kinds together)."""
    return aligned([list(CONTEXT_COLUMNS)] + context_rows(contexts))


CONTEXT_NOTE = (
    "TTFT: one cold run per method and prompt (its caches emptied first); tok/s, tau, c and v: "
    "runs decoding from the prefilled prompt. peak MB: the larger of the cold and measured runs' "
    "peaks, less what other methods' caches held at the time."
)


def markdown_sections(result: BenchResult) -> list[str]:
    """results.md's sections per context length and per answer position (none when not asked)."""
    out: list[str] = []
    contexts = by_context(result.records)
    if contexts:
        out += ["", "## By context length", "", "| " + " | ".join(CONTEXT_COLUMNS) + " |"]
        out += ["|" + "---|" * len(CONTEXT_COLUMNS)]
        out += ["| " + " | ".join(r) + " |" for r in context_rows(contexts)]
        out += ["", CONTEXT_NOTE]
    spans = positions(result)
    if spans:
        out += ["", f"## By answer position (spans of {result.settings['position_width']} tokens)"]
        out += ["", "tau (acceptance) per span, from the answer's start:", ""]
        for v, ss in spans:
            cells = [f"{fmt(s.tau, '.2f')} ({fmt(s.acceptance, '.2f')})" for s in ss]
            out.append(f"- {v.label}: " + " ".join(cells))
    return out


def plots(result: BenchResult, out: Path) -> list[Path | None]:
    """The long-context and long-answer plots that apply (matplotlib imported by the caller)."""
    return [plot_context(by_context(result.records), out), plot_positions(positions(result), out)]


def plot_context(contexts: dict[int, list[VariantSummary]], out: Path) -> Path | None:
    """speedup_by_context.png: speedup over plain (left) and TTFT (right) against context length,
    one line per variant, named in a legend."""
    import matplotlib.pyplot as plt

    if not contexts:
        return None
    lengths = list(contexts)
    labels = list(dict.fromkeys(v.label for vs in contexts.values() for v in vs))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, name in enumerate(labels):
        found = [(n, v) for n in lengths for v in contexts[n] if v.label == name]
        style = _line_style(i, len(labels), name)
        if not name.startswith(PLAIN + " "):
            pts = [(n, v.overall.speedup_vs_plain) for n, v in found]
            pts = [(n, y) for n, y in pts if y is not None]
            if pts:
                left.plot(*zip(*pts, strict=True), **style)
        ttft = [(n, v.overall.ttft) for n, v in found if v.overall.ttft is not None]
        if ttft:
            right.plot(*zip(*ttft, strict=True), **style)
    left.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    left.set_ylabel("decode speedup over plain")
    left.set_title("Speedup against context length")
    right.set_ylabel("time to first token (s)")
    right.set_title("TTFT against context length")
    for ax in (left, right):
        ax.set_xticks(lengths, [context_label(n) for n in lengths])
        ax.set_xlabel("context (prompt tokens)")
    _side_legend(fig, right)  # the TTFT panel has every variant, plain included
    path = out / "speedup_by_context.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def plot_positions(
    spans: list[tuple[VariantSummary, list[PositionSpan]]], out: Path
) -> Path | None:
    """acceptance_by_position.png: tokens per round (left) and acceptance (right) per span of
    answer positions, one line per variant, named in a legend."""
    import matplotlib.pyplot as plt

    if not spans:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (v, ss) in enumerate(spans):
        style = _line_style(i, len(spans), v.label)
        tau = [(s.start, s.tau) for s in ss if s.tau is not None]
        acc = [(s.start, s.acceptance) for s in ss if s.acceptance is not None]
        if tau:
            left.plot(*zip(*tau, strict=True), **style)
        if acc:
            right.plot(*zip(*acc, strict=True), **style)
    width = spans[0][1][0].end - spans[0][1][0].start
    left.set_ylabel("tokens per round (tau)")
    left.set_title("Tokens per round by answer position")
    right.set_ylabel("acceptance (accepted / drafted)")
    right.set_title("Acceptance by answer position")
    right.set_ylim(0, 1.05)
    for ax in (left, right):
        ax.set_xlabel(f"answer position (start of each {width}-token span)")
    _side_legend(fig, left)
    path = out / "acceptance_by_position.png"
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _line_style(i: int, n: int, name: str) -> dict[str, Any]:
    """Line i of n: its own colour and marker (up to 20 colours), dashed at a temperature > 0."""
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10" if n <= 10 else "tab20")
    dashed = not name.endswith(" T=0")
    return {
        "marker": "osD^vP*Xph<>"[i % 12],
        "color": colours(i % colours.N),
        "linestyle": "--" if dashed else "-",
        "label": name,
    }


def _side_legend(fig: Any, ax: Any) -> None:
    """One legend for the figure, from `ax`'s lines, beside the panels (never over the data)."""
    handles, names = ax.get_legend_handles_labels()
    fig.tight_layout()
    if handles:
        fig.legend(
            handles,
            names,
            loc="center left",
            bbox_to_anchor=(1.0, 0.5),
            fontsize="small",
            frameon=False,
        )
