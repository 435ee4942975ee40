"""Reports of a bench run: terminal table, results.json, results.md and PNG plots.

results.json (schema_version 1) -- see docs/bench.md:
    {"schema_version": 1, "complete": bool, "created": ISO-8601 UTC,
     "environment": {...}, "pair": {...}, "settings": {...},
     "methods": [{"method", "k", "temp", "label", "overall": SUMMARY, "categories": {name: SUMMARY}}],
     "mismatches": [{"method", "k", "prompt_id", "category", "repeat", "position",
                     "plain_token", "other_token", "logit_gap", "near_tie"}],
     "skipped": [{"prompt_id", "reason"}], "refused": [{"method", "reason"}],
     "contexts": [{"context", "label", "methods": [{"method", "k", "temp", "label",
                   "overall": SUMMARY}]}],                      (--context; else [])
     "positions": {"width", "methods": [{"method", "k", "temp", "label",
                   "spans": [{"start", "end", "rounds", "tokens", "drafted", "accepted",
                              "tau", "acceptance"}]}]},         (--by-position; else null)
     "runs": [RUN, ...]}
SUMMARY holds the fields of metrics.Summary; RUN those of metrics.RunRecord plus tokens_per_s.
Plots need matplotlib (the `plot` extra); without it the other files are still written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgespec.bench.formats import aligned, fmt, speedup_text, summary_json, variant_json
from edgespec.bench.plan import TOKEN_METHODS
from edgespec.bench.records import (
    PLAIN,
    Summary,
    VariantSummary,
)
from edgespec.bench.runner import BenchResult
from edgespec.events import predicted_speedup, verify_cost_line

SCHEMA_VERSION = 1


def results_json(result: BenchResult, variants: Sequence[VariantSummary]) -> dict[str, Any]:
    """The results.json document (see the module docstring for the schema)."""
    from edgespec.bench.long_report import contexts_json, positions_json

    return {
        "schema_version": SCHEMA_VERSION,
        "complete": result.complete,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": result.environment,
        "pair": result.pair,
        "settings": result.settings,
        "methods": [
            {
                **variant_json(v),
                "categories": {c: summary_json(s) for c, s in v.by_category.items()},
            }
            for v in variants
        ],
        "mismatches": [asdict(n) for n in result.notes],
        "skipped": result.skipped,
        "refused": result.refused,
        "contexts": contexts_json(result),
        "positions": positions_json(result),
        "runs": [r.to_json() for r in result.records],
    }


COLUMNS = (
    "method",
    "category",
    "runs",
    "tok/s",
    "speedup",
    "pred",
    "TTFT ms",
    "TPOT ms",
    "tau",
    "alpha",
    "c",
    "v",
    "ovh %",
    "mism",
    "peak MB",
)


def _row(label: str, category: str, s: Summary) -> list[str]:
    ms = 1000.0
    return [
        label,
        category,
        str(s.runs),
        fmt(s.tokens_per_s, ".1f"),
        speedup_text(s),
        fmt(s.predicted_speedup, ".2f"),
        fmt(s.ttft and s.ttft * ms, ".0f"),
        fmt(s.tpot and s.tpot * ms, ".1f"),
        fmt(s.tau, ".2f"),
        fmt(s.alpha, ".2f"),
        fmt(s.c, ".2f"),
        fmt(s.v, ".2f"),
        fmt(s.overhead and 100 * s.overhead, ".1f"),
        fmt(s.mismatches, "d"),
        f"{s.peak_memory_mb:.0f}",
    ]


def table_rows(variants: Sequence[VariantSummary], categories: bool = True) -> list[list[str]]:
    """One row per variant ('all'), each followed by its per-category rows."""
    rows = []
    for v in variants:
        rows.append(_row(v.label, "all", v.overall))
        if categories and len(v.by_category) > 1:
            rows += [_row("", c, s) for c, s in v.by_category.items()]
    return rows


def format_table(variants: Sequence[VariantSummary], categories: bool = True) -> str:
    """A plain-text, column-aligned table for the terminal."""
    return aligned([list(COLUMNS)] + table_rows(variants, categories))


def format_markdown(result: BenchResult, variants: Sequence[VariantSummary]) -> str:
    """results.md: settings, the table, greedy mismatches and the definitions."""
    from edgespec.bench.long_report import markdown_sections

    st, env = result.settings, result.environment
    out = [
        "# EdgeSpec bench" + ("" if result.complete else " (stopped early: partial results)"),
        "",
        f"- pair: {result.pair.get('name')} (target {result.pair.get('target')}, "
        f"draft {result.pair.get('draft')})"
        + (
            f"; token-draft methods ({', '.join(TOKEN_METHODS)}) on {token}"
            if (token := result.pair.get("token_methods_draft"))
            else ""
        ),
        f"- machine: {env.get('platform')}, {env.get('device')}, mlx {env.get('mlx')}, "
        f"mlx-lm {env.get('mlx_lm')}" + (f", BLAS {env['blas']}" if env.get("blas") else ""),
        f"- prompts: {st.get('n_prompts')} from {st.get('prompts')}; max new tokens "
        f"{st.get('max_tokens')}; repeats {st.get('repeats')}; seed {st.get('seed')}",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    out += ["| " + " | ".join(r) + " |" for r in table_rows(variants)]
    out += ["", "## Greedy output vs plain", ""]
    if not result.notes:
        compared = any(v.overall.mismatches is not None for v in variants)
        out.append("All compared runs match plain decoding." if compared else "Nothing compared.")
    for n in result.notes:
        why = "near-tie" if n.near_tie else "NOT a near-tie"
        out.append(
            f"- {n.method} K={n.k} prompt {n.prompt_id} ({n.category}, repeat {n.repeat}): first "
            f"difference at token {n.position} ({n.plain_token} vs {n.other_token}), target "
            f"logit gap {fmt(n.logit_gap, '.2e')}: {why}"
        )
    out += position_lines(variants)
    out += markdown_sections(result)
    out += ["", DEFINITIONS]
    return "\n".join(out) + "\n"


def position_lines(variants: Sequence[VariantSummary]) -> list[str]:
    """results.md's per-position acceptance, one line per variant that drafted: position i's
    acceptance given positions < i accepted, e.g. '- block K=4 T=0: 0.71 0.55 0.40 -'."""
    lines = [
        f"- {v.label}: " + " ".join(fmt(a, ".2f") for a in v.overall.position_acceptance)
        for v in variants
        if v.overall.position_acceptance
    ]
    return ["", "## Acceptance per drafted position", "", *lines] if lines else []


DEFINITIONS = """## Definitions
- tok/s: decode throughput, (tokens - 1) / (last token time - first token time), median of runs.
- speedup: median tok/s / median plain tok/s on the same prompts and temperature; [min-max] of
  the same ratio per repeat. pred: closed form E[tokens/round] / (K*c + v) with
  E = (1 - alpha^(K+1)) / (1 - alpha).
- tau: tokens committed per round (correction or bonus included). alpha: per-token acceptance
  probability (accepted / (accepted + rounds ending in a rejection)).
- c: draft time per drafted token / plain TPOT. v: verify time per round / plain TPOT.
- ovh %: share of decode time spent outside the draft and verify calls (Python, events, detok).
- mism: prompts whose greedy output differs from plain decoding (must be 0).
- acceptance per drafted position i (depth i in a tree): rounds that accepted it / rounds that
  drafted it with positions 1..i-1 accepted ('-': never reached)."""


@dataclass
class ReportFiles:
    """Paths written; plot_error says why plots are missing, if they are."""

    json: Path
    markdown: Path
    plots: list[Path] = field(default_factory=list)
    plot_error: str | None = None


def write_report(
    result: BenchResult, variants: Sequence[VariantSummary], out_dir: str | Path
) -> ReportFiles:
    """Write results.json, results.md and (if matplotlib is importable) the PNG plots."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out / "results.json", out / "results.md")
    files.json.write_text(json.dumps(results_json(result, variants), indent=2) + "\n")
    files.markdown.write_text(format_markdown(result, variants))
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
    except ImportError as exc:  # the optional `plot` extra is not installed
        files.plot_error = f"plots skipped ({exc}); pip install 'edgespec[plot]'"
        return files
    from edgespec.bench.long_report import plots as long_plots

    plots = (
        plot_speedups(variants, out),
        plot_landscape(variants, out),
        *long_plots(result, out),
    )
    files.plots = [p for p in plots if p]
    return files


def landscape(
    variants: Sequence[VariantSummary], alphas: Sequence[float], ks: Sequence[int]
) -> tuple[list[list[float]], float, float] | None:
    """Predicted speedup grid [K][alpha] at the measured c and v(K) = 1 + b*K, or None if no cost
    was measured. c and b come from the 'spec' variants when present (else any with costs)."""
    timed = [v for v in variants if v.overall.c is not None and v.method != PLAIN]
    timed = [v for v in timed if v.method == "spec"] or timed
    if not timed:
        return None
    c = sum(v.overall.c or 0.0 for v in timed) / len(timed)
    b = verify_cost_line([(v.overall.k_mean or v.k, v.overall.v or 1.0) for v in timed])
    grid = [[predicted_speedup(a, k, c, 1.0 + b * k) for a in alphas] for k in ks]
    return grid, c, b


def plot_speedups(variants: Sequence[VariantSummary], out: Path) -> Path | None:
    """speedup_by_category.png: grouped bars, one group per category, one bar per variant."""
    import matplotlib.pyplot as plt

    shown = [v for v in variants if v.method != PLAIN and v.overall.speedup_vs_plain is not None]
    if not shown:
        return None
    cats = list(dict.fromkeys(c for v in shown for c in v.by_category)) + ["all"]
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(cats) + 2), 4))
    for i, v in enumerate(shown):
        sums = [v.by_category.get(c, v.overall) if c != "all" else v.overall for c in cats]
        ys = [s.speedup_vs_plain or 0.0 for s in sums]
        xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(cats))]
        ax.bar(xs, ys, width, label=v.label)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(cats)), cats, rotation=30, ha="right")
    ax.set_ylabel("speedup over plain (ratio of medians)")
    ax.set_title("Decode speedup by category")
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = out / "speedup_by_category.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_landscape(variants: Sequence[VariantSummary], out: Path) -> Path | None:
    """speedup_landscape.png: predicted speedup over alpha x K at the measured c and v(K), with
    each measured variant drawn at (alpha, mean K) and labelled with its measured speedup."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    max_k = max([8] + [v.k + 2 for v in variants])
    alphas = [i / 100 for i in range(100)]
    ks = list(range(1, max_k + 1))
    land = landscape(variants, alphas, ks)
    if land is None:
        return None
    grid, c, b = land
    fig, ax = plt.subplots(figsize=(7, 4.5))
    hi = max(max(row) for row in grid)
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(0.5, min(min(r) for r in grid)), vmax=max(1.5, hi))
    mesh = ax.pcolormesh(alphas, ks, grid, cmap="RdBu", norm=norm, shading="nearest")
    ax.contour(alphas, ks, grid, levels=[1.0], colors="black", linewidths=1.0)
    fig.colorbar(mesh, ax=ax, label="predicted speedup")
    # One marker and colour per variant, named in a legend beside the map (labels written next
    # to the points piled up where variants measured alike).
    shown = [v for v in variants if v.overall.alpha is not None]
    colours = plt.get_cmap("tab10" if len(shown) <= 10 else "tab20")
    for i, v in enumerate(shown):
        s = v.overall
        ax.plot(
            s.alpha or 0.0,
            s.k_mean or v.k,
            "osD^vP*Xph<>"[i % 12],
            color=colours(i % colours.N),
            markeredgecolor="black",
            markersize=8,
            linestyle="none",
            label=f"{v.label}: {fmt(s.speedup_vs_plain, '.2f')}x",
        )
    ax.set_xlabel("alpha (per-token acceptance)")
    ax.set_ylabel("K (drafts per round)")
    ax.set_title(f"Speedup landscape at c = {c:.3f}, v(K) = 1 {b:+.3f} K")
    if shown:
        fig.set_size_inches(7 + 0.6 * max(len(v.label) for v in shown) / 10 + 2.5, 4.5)
        ax.legend(
            title="measured (speedup)",
            loc="upper left",
            bbox_to_anchor=(1.28, 1.0),
            fontsize=8,
            title_fontsize=8,
            frameon=False,
        )
    fig.tight_layout()
    path = out / "speedup_landscape.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
