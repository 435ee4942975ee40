"""Greedy exactness in the bench: every temperature-0 run against plain decoding's on the same
prompt, and, where they differ, whether a floating-point near-tie of the target explains it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx

from edgespec.bench.records import PLAIN, RunRecord
from edgespec.cache import common_prefix

NEAR_TIE = 1e-3  # |logit gap| / max(1, |top logit|) under which a greedy difference is a near-tie


@dataclass(frozen=True)
class MismatchNote:
    """A greedy run whose tokens differ from plain decoding's, and whether a near-tie explains it.

    logit_gap = target logit of plain's token - that of the other token, at the first differing
    position, from one full (cache-free) forward over prompt + the common prefix.
    """

    method: str
    k: int
    prompt_id: str
    category: str
    repeat: int
    position: int
    plain_token: int | None
    other_token: int | None
    logit_gap: float | None
    near_tie: bool


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, or None when equal. [1,2,3] vs [1,2] -> 2."""
    i = common_prefix(a, b)
    return None if i == len(a) == len(b) else i


def compare_greedy(
    engine: Any, records: Sequence[RunRecord], encoded: dict[str, list[int]]
) -> tuple[list[RunRecord], list[MismatchNote]]:
    """Mark every temperature-0 run against plain's run on the same prompt (same repeat if any).

    Returns the records with `mismatch` / `first_diff` set and one note per mismatched run.
    """
    plain = {(r.prompt_id, r.repeat): r for r in records if r.method == PLAIN and r.temp == 0}
    plain_any = {r.prompt_id: r for r in reversed(records) if r.method == PLAIN and r.temp == 0}
    out, notes = [], []
    for r in records:
        ref = plain.get((r.prompt_id, r.repeat)) or plain_any.get(r.prompt_id)
        if r.temp != 0 or r.method == PLAIN or ref is None:
            out.append(r)
            continue
        pos = first_difference(ref.token_ids, r.token_ids)
        out.append(replace(r, mismatch=pos is not None, first_diff=pos))
        if pos is not None:
            notes.append(_explain(engine, r, ref, encoded[r.prompt_id], pos))
    return out, notes


def _explain(
    engine: Any, run: RunRecord, ref: RunRecord, prompt_ids: list[int], pos: int
) -> MismatchNote:
    """Measure the target's logit gap between the two tokens at the first difference."""
    a = ref.token_ids[pos] if pos < len(ref.token_ids) else None
    b = run.token_ids[pos] if pos < len(run.token_ids) else None
    gap, tie = None, False
    if a is not None and b is not None:
        seq = mx.array(list(prompt_ids) + list(ref.token_ids[:pos]))[None]
        logits = engine.target.model(seq)[0, -1].astype(mx.float32)
        gap = (logits[a] - logits[b]).item()
        tie = abs(gap) <= NEAR_TIE * max(1.0, abs(mx.max(logits).item()))
    return MismatchNote(
        run.method, run.k, run.prompt_id, run.category, run.repeat, pos, a, b, gap, tie
    )
