"""The one event stream every consumer (CLI, TUI, bench, scripts) reads.

Records are frozen dataclasses of plain Python values, so they cross threads and serialise to JSON
with `to_json` without special cases.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

# accepted: a draft token that passed the ratio test; corrected: the target's resample at the first
# rejection; bonus: the target's extra token after all K drafts passed; target: plain decoding.
TokenKind = Literal["accepted", "corrected", "bonus", "target"]
TOKEN_KINDS: tuple[str, ...] = ("accepted", "corrected", "bonus", "target")


@dataclass(frozen=True)
class Token:
    """One committed token. `text` is the detokenizer's new text piece (may be '' mid-character)."""

    id: int
    text: str
    kind: TokenKind
    round: int
    type: str = field(default="token", init=False)


@dataclass(frozen=True)
class Round:
    """One draft-verify round. `accepted` <= `drafted`; the round commits accepted + 1 tokens
    (the +1 is a correction or a bonus). `k` is the K chosen for this round (adaptive K may vary)."""

    index: int
    drafted: int
    accepted: int
    k: int
    # The round's seconds, split by marginal cost (the verify is built while the draft computes):
    t_draft: float  # drafting time not hidden behind building the verify
    t_verify: float  # building the target's verify forward + waiting for it (and the acceptance)
    method: str = "draft"
    # False where the split of time between this round and its neighbours is unknown: in a
    # pipelined run of plain steps (loop.plain_run) a read may return only once the forward
    # queued behind it is done too (MLX's CPU backend), so the run's first interval holds two
    # forwards and its last almost none, and a step with an n-gram lookup queued behind it holds
    # that longer forward. The sum over a run is right; cost estimates (AdaptiveK) leave these
    # rounds out.
    timed: bool = True
    # The n-gram suffix match behind an n-gram round's proposal (tokens; 0 for other rounds).
    match: int = 0
    # Tree rounds (edgespec/trees/loop.py): the tree's node count (0 for a chain round; `drafted`
    # is it too, `k` the tree's depth), and which branch won: 0 when every accepted node was its
    # parent's first candidate (the path a chain would have drafted), else the rank (1 = second
    # candidate, ...) of the first accepted node that was not.
    nodes: int = 0
    branch: int = 0
    # Committed tokens (the prompt included) when the round began: the context length its costs
    # were measured at (AdaptiveK prices rounds with costs measured near the current length).
    context: int = 0
    type: str = field(default="round", init=False)


@dataclass(frozen=True)
class Stats:
    """Summary of one generation. tau = mean tokens committed per round (correction/bonus included);
    acceptance = accepted / drafted over all rounds; tokens_per_s counts decode time only (after TTFT)."""

    tokens: int
    rounds: int
    drafted: int
    accepted: int
    acceptance: float
    tau: float
    ttft: float  # seconds from request to first committed token (includes prefill)
    decode_time: float  # seconds from the first token to the last
    tokens_per_s: float
    prompt_tokens: int
    prefilled_tokens: int  # prompt tokens actually run (the rest came from the prefix cache)
    accepted_hist: tuple[int, ...] = ()  # accepted_hist[i] = rounds that accepted exactly i drafts


@dataclass(frozen=True)
class Finished:
    """Last event. reason: 'length' (max tokens), 'stop' (EOS / stop token), 'cancelled' (user stop)."""

    reason: Literal["length", "stop", "cancelled"]
    stats: Stats
    text: str
    type: str = field(default="summary", init=False)


Event = Token | Round | Finished


@dataclass(frozen=True)
class Prefill:
    """The prompt being read: `done` of `total` uncached prompt tokens are in the target's cache
    (after each prefill chunk). Not in the event stream: `Engine.generate(on_prefill=...)` hands
    it to a callback, on the engine's thread, so a long prompt can show its progress."""

    done: int
    total: int


def to_json(event: Event) -> dict:
    """Flatten an event to the JSON-lines schema of `edgespec generate --json`.

    Token -> {"type": "token", "id", "text", "kind", "round"}; Round -> {"type": "round", ...};
    Finished -> {"type": "summary", "reason", "text", **stats}.
    """
    d = asdict(event)
    if isinstance(event, Finished):
        stats = d.pop("stats")
        stats["accepted_hist"] = list(stats["accepted_hist"])
        d.update(stats)
    return d


# Characters JSON leaves raw but `str.splitlines` and other Unicode-aware readers break lines at.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def json_line(event: Event) -> str:
    """One JSON-lines record for `event`: UTF-8 text kept readable, but no character in it that
    any line reader takes for a line break (a token's text may hold U+0085, U+2028 or U+2029)."""
    return json.dumps(to_json(event), ensure_ascii=False).translate(_LINE_BREAKS)
