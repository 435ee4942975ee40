"""Prompts for the tests: the project's own (edgespec/data/bench_prompts.jsonl, written for
EdgeSpec), and the public sets (MT-bench, Spec-Bench) only where a path to one is given.

    EDGESPEC_MT_BENCH=PATH/mt_bench_question.jsonl
    EDGESPEC_SPEC_BENCH=PATH/spec_bench_question.jsonl

.ci/run sets both when a prompts folder lies beside the clone; a test that needs one calls
prompt_set(...), which skips it with the variable's name when the path is missing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edgespec.bench.prompts import load_prompts

MT_BENCH = "EDGESPEC_MT_BENCH"
SPEC_BENCH = "EDGESPEC_SPEC_BENCH"


def given(variable: str) -> Path | None:
    """The file the environment variable names, or None when it is unset or missing."""
    value = os.environ.get(variable, "")
    return Path(value) if value and Path(value).is_file() else None


def prompt_set(variable: str) -> Path:
    """The file the variable names; skips the calling test when there is none."""
    path = given(variable)
    if path is None:
        pytest.skip(f"needs a public prompt set: set {variable} to its question.jsonl")
    return path


def first_turns(path: Path, category: str | None = None) -> list[str]:
    """The first turn of every question in an MT-bench / Spec-Bench style file, in file order."""
    rows = [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
    return [r["turns"][0] for r in rows if category is None or r.get("category") == category]


def spread(items: list[str], n: int) -> list[str]:
    """n items spread evenly over the list: spread(list("abcdef"), 3) == ["a", "c", "e"]."""
    return items[:: max(1, len(items) // n)][:n]


def own_prompts(n: int, category: str | None = None) -> list[str]:
    """n of the project's own prompts (spread over its categories, or from one category)."""
    chosen = load_prompts(None, categories=[category] if category else None)
    return spread([p.text for p in chosen], n)


def given_turns() -> list[str]:
    """Every turn of every public set given (both variables), [] when none is."""
    turns = []
    for path in filter(None, (given(MT_BENCH), given(SPEC_BENCH))):
        rows = (json.loads(line) for line in path.read_text().split("\n") if line.strip())
        turns += [str(t) for r in rows for t in r.get("turns", [])]
    return turns
