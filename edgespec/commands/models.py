"""`edgespec models`: the catalogue's named pairs and what of them is on this machine."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from edgespec.config import MTP_DRAFT

HELP = (
    "List the named model pairs (target + draft), which of their models are already on this "
    "machine and their size on disk. Nothing is downloaded."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


def pair_rows() -> list[dict[str, Any]]:
    """One record per pair: names, platform, and for target and draft presence/path/size."""
    from edgespec.loading.specs import load_catalog
    from edgespec.loading.status import model_status

    cat = load_catalog()
    rows = []
    for pair in cat.pairs.values():
        row: dict[str, Any] = {
            "pair": pair.name,
            "default": pair.name == cat.default_pair,
            "platform": pair.platform,
            "description": pair.description,
            "thinking": pair.thinking,
        }
        for role in ("target", "draft"):
            st = model_status(getattr(pair, role), cat)
            row[role] = {
                "model": st.spec,
                "present": st.present,
                "path": str(st.path) if st.path else None,
                "size_bytes": st.size_bytes,
                "revision": st.revision,
                "pinned_by": st.pinned_by,
                "pin": st.pin,
            }
        rows.append(row)
    return rows


def _cell(m: dict[str, Any], role: str) -> str:
    if m["model"] == MTP_DRAFT:
        return "the target's MTP head"
    if m["present"]:
        return f"yes, {_size(m['size_bytes'])}"
    if role == "draft" and not m["model"].count("/"):
        return "not yet available"
    return "not downloaded"


def _rev(m: dict[str, Any]) -> str:
    """'pinned 4dcb3d101c2a', 'locked 1a2b…', 'unpinned', 'in repository' or '-'."""
    if m["pin"] in ("pinned", "locked") and m["revision"]:
        return f"{m['pin']} {m['revision'][:12]}"
    if m["pin"] == "pinned" and str(m["pinned_by"]).startswith("pypi:"):
        return "pinned (wheel)"  # the PyPI wheel at a version whose GGUF sha256 is checked
    return str(m["pin"])


def _thinking(value: bool | None) -> str:
    """The THINKING cell: the pair's default thinking mode, '-' where none is recorded."""
    return "-" if value is None else ("on" if value else "off")


def run(args: argparse.Namespace) -> int:
    rows = pair_rows()
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    header = (
        "PAIR",
        "TARGET",
        "CACHED",
        "REVISION",
        "DRAFT",
        "CACHED",
        "REVISION",
        "THINKING",
        "WHERE",
    )
    table = [header]
    for r in rows:
        name = r["pair"] + (" *" if r["default"] else "")
        t, d = r["target"], r["draft"]
        table.append(
            (name, t["model"], _cell(t, "target"), _rev(t))
            + (d["model"], _cell(d, "draft"), _rev(d), _thinking(r["thinking"]), r["platform"])
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(
        "\n* default pair. `edgespec pull NAME` fetches a model or a pair; WHERE=mac: 4-bit, fast on Metal."
        "\nREVISION: the commit a hub model loads at: pinned (named by EdgeSpec's catalogue), locked"
        " (recorded by the first download, moved only by `edgespec pull NAME --update`) or unpinned"
        " (the first download takes the repo's default branch, then locks it)."
        "\nTHINKING: the chat template's thinking mode the pair runs by default, the one its draft"
        " was trained for (--think / --no-think change it); -: none recorded, the template's own."
    )
    return 0
