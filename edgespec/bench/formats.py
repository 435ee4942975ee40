"""How the bench's reports write a summary: as results.json entries and as aligned text
(shared by report.py and long_report.py)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from edgespec.bench.records import Summary, VariantSummary


def summary_json(s: Summary) -> dict[str, Any]:
    d = asdict(s)
    d["accepted_hist"] = list(s.accepted_hist)
    d["position_acceptance"] = list(s.position_acceptance)
    d["mismatched_prompts"] = list(s.mismatched_prompts)
    return d


def fmt(x: float | int | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def speedup_text(s: Summary) -> str:
    if s.speedup_vs_plain is None:
        return "-"
    text = f"{s.speedup_vs_plain:.2f}x"
    if s.speedup_min is not None and s.speedup_max is not None and s.speedup_min != s.speedup_max:
        text += f" [{s.speedup_min:.2f}-{s.speedup_max:.2f}]"
    return text


def aligned(rows: list[list[str]]) -> str:
    """A header row and its rows as column-aligned text: the first two columns to the left, the
    figures to the right, a rule under the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def variant_json(v: VariantSummary) -> dict[str, Any]:
    """A variant's identity and overall summary, as results.json lists it (`methods`, and each
    context length's `methods`)."""
    return {
        "method": v.method,
        "k": v.k,
        "temp": v.temp,
        "label": v.label,
        "overall": summary_json(v.overall),
    }
