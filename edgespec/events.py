"""The one event stream every consumer (CLI, TUI, bench, scripts) reads.

Records are frozen dataclasses of plain Python values, so they cross threads and serialise to JSON
with `to_json` without special cases.

The second half of this module folds them: tau, alpha, costs, the closed-form prediction, and
the summary of one generation (Stats); the bench's folds over many runs: edgespec/bench/records.py.
Nothing here touches MLX, a model or the clock: records in, numbers out.

Notation (as in Leviathan et al.): K drafts per round; alpha = probability that one draft token is
accepted (assumed i.i.d. per position); c = cost of one draft step / cost of one target decode step;
v = cost of one verify forward over K+1 tokens / cost of one target decode step (v = 1 at K = 0).

The closed form. A round accepts i drafts with probability alpha^i (1 - alpha) for i < K and alpha^K
for i = K, and always commits one more token (the correction, or the bonus when all K passed), so

    E[tokens per round] = sum_{i=0..K} alpha^i = (1 - alpha^(K+1)) / (1 - alpha)        (= K+1 at 1)

A round costs K draft steps and one verify forward, K*c + v target steps, while plain decoding
commits one token per target step:

    predicted speedup = E[tokens per round] / (K*c + v)

Worked example: alpha = 0.8, K = 4, c = 0.1, v = 1.3:
    E = (1 - 0.8^5) / 0.2 = (1 - 0.32768) / 0.2 = 3.3616;  K*c + v = 0.4 + 1.3 = 1.7
    speedup = 3.3616 / 1.7 = 1.97741...
With v = 1 this is exactly Leviathan et al.'s (1 - alpha^(K+1)) / ((1 - alpha)(K*c + 1)).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
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
    # pipelined run of plain steps (loop.py) a read may return only once the forward
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


# ------------------------------------------------------------------ folds over events


def expected_tokens_per_round(alpha: float, k: float) -> float:
    """E[tokens committed per round] = (1 - alpha^(K+1)) / (1 - alpha); K + 1 when alpha = 1.

    >>> round(expected_tokens_per_round(0.8, 4), 4)
    3.3616
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: float, c: float, v: float = 1.0) -> float:
    """Closed-form speedup over plain decoding: E[tokens per round] / (K*c + v).

    >>> round(predicted_speedup(0.8, 4, 0.1, 1.3), 4)
    1.9774
    """
    return expected_tokens_per_round(alpha, k) / (k * c + v)


def verify_cost_line(points: Sequence[tuple[float, float]]) -> float:
    """Slope b of v(K) = 1 + b*K fitted (least squares, line through (0, 1)) to measured (K, v).

    A verify forward with no drafts is one decode step, hence the fixed intercept. One measured
    point (K=4, v=1.3) gives b = 0.3/4 = 0.075; no points give b = 0 (verify costs one step).
    """
    den = sum(k * k for k, _ in points)
    return sum(k * (v - 1.0) for k, v in points) / den if den else 0.0


def alpha_mle(accepted: int, rejections: int) -> float | None:
    """Per-token acceptance probability from a set of rounds (truncated-geometric MLE).

    Each accepted draft is a success; each round that stopped at a rejection is one failure; a round
    that accepted all its drafts has no failure. E.g. rounds with (drafted, accepted) = (4, 4),
    (4, 1), (4, 2): 7 successes, 2 failures -> alpha = 7/9. None when no draft was ever tried.
    Not the same as accepted/drafted (= 7/12 here), which undercounts alpha when K is finite.
    """
    trials = accepted + rejections
    return accepted / trials if trials else None


@dataclass(frozen=True)
class RoundTotals:
    """A fold of Round events. hist[i] = rounds that accepted exactly i drafts."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # rounds that drafted > 0 and accepted < drafted
    t_draft: float = 0.0
    t_verify: float = 0.0
    hist: tuple[int, ...] = ()
    # Per drafted position (depth, for a tree round): tries[i] = rounds that drafted position
    # i + 1 with positions 1..i all accepted, passes[i] = those that accepted it too.
    tries: tuple[int, ...] = ()
    passes: tuple[int, ...] = ()


def position_counts(rounds: Iterable[Round]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(tries, passes) per drafted position (RoundTotals); a tree round counts by depth (its k).
    Example: chain rounds (drafted 3, accepted 1) and (drafted 2, accepted 2): tries (2, 2, 0),
    passes (2, 1, 0) -> position 1 accepted 2 of 2 times, position 2 1 of 2, position 3 never
    reached (the first round rejected position 2)."""
    tries: list[int] = []
    passes: list[int] = []
    for r in rounds:
        span = r.k if r.nodes else r.drafted
        reached = min(span, r.accepted + 1)
        grow = max(0, span - len(tries))
        tries.extend([0] * grow)
        passes.extend([0] * grow)
        for i in range(reached):
            tries[i] += 1
            passes[i] += int(i < r.accepted)
    return tuple(tries), tuple(passes)


def position_acceptance(tries: Sequence[int], passes: Sequence[int]) -> tuple[float | None, ...]:
    """passes[i] / tries[i] per position (None where never tried): the acceptance of drafted
    position i + 1 given positions 1..i accepted. (2, 2, 0), (2, 1, 0) -> (1.0, 0.5, None)."""
    return tuple(p / t if t else None for t, p in zip(tries, passes, strict=True))


def fold_rounds(rounds: Iterable[Round]) -> RoundTotals:
    """Sum Round events. Rounds with drafted == 0 (e.g. no n-gram match) count as plain steps."""
    rounds = list(rounds)
    n = drafted = accepted = rejections = 0
    t_draft = t_verify = 0.0
    hist: list[int] = []
    for r in rounds:
        n += 1
        drafted += r.drafted
        accepted += r.accepted
        rejections += int(0 < r.drafted and r.accepted < r.drafted)
        t_draft += r.t_draft
        t_verify += r.t_verify
        hist.extend([0] * (r.accepted + 1 - len(hist)))
        hist[r.accepted] += 1
    tries, passes = position_counts(rounds)
    return RoundTotals(
        n, drafted, accepted, rejections, t_draft, t_verify, tuple(hist), tries, passes
    )


def add_hists(hists: Iterable[Sequence[int]]) -> tuple[int, ...]:
    """Element-wise sum of histograms of different lengths: (1, 2) + (0, 0, 5) -> (1, 2, 5)."""
    out: list[int] = []
    for h in hists:
        out.extend([0] * (len(h) - len(out)))
        for i, n in enumerate(h):
            out[i] += n
    return tuple(out)


def median(xs: Iterable[float]) -> float | None:
    """Median, or None for no values."""
    xs = list(xs)
    return statistics.median(xs) if xs else None


def ratio_of_medians(num: Iterable[float], den: Iterable[float]) -> float | None:
    """median(num) / median(den): the Spec-Bench style speedup of one method over another.

    >>> ratio_of_medians([10, 30, 20], [10, 10])
    2.0
    """
    a, b = median(num), median(den)
    return a / b if a is not None and b else None


def accepted_histogram(rounds: Sequence[Round]) -> tuple[int, ...]:
    """hist[i] = rounds that accepted exactly i drafts. [acc 2, acc 0, acc 2] -> (1, 0, 2)."""
    if not rounds:
        return ()
    hist = [0] * (max(r.k for r in rounds) + 1)
    for r in rounds:
        hist[r.accepted] += 1
    return tuple(hist)


def generation_stats(
    rounds: Sequence[Round],
    tokens: int,
    *,
    t_request: float,
    t_first: float | None,
    t_last: float | None,
    prompt_tokens: int,
    prefilled_tokens: int,
) -> Stats:
    """Fold a generation into Stats. No rounds means plain decoding (tau = 1, one token a step).

    tau = mean tokens committed per round, correction/bonus included: sum(accepted + 1) / rounds.
    tokens_per_s counts decode only: (tokens - 1) / (t_last - t_first), the first token being TTFT.
    Example: rounds accepting 3 and 1 of K=4 -> drafted 8, accepted 4, acceptance .5, tau 3.0.
    """
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    n_rounds = len(rounds) if rounds else tokens
    tau = (accepted + len(rounds)) / len(rounds) if rounds else (1.0 if tokens else 0.0)
    ttft = (t_first - t_request) if t_first is not None else 0.0
    decode = (t_last - t_first) if t_first is not None and t_last is not None else 0.0
    return Stats(
        tokens=tokens,
        rounds=n_rounds,
        drafted=drafted,
        accepted=accepted,
        acceptance=accepted / drafted if drafted else 0.0,
        tau=tau,
        ttft=ttft,
        decode_time=decode,
        tokens_per_s=(tokens - 1) / decode if tokens > 1 and decode > 0 else 0.0,
        prompt_tokens=prompt_tokens,
        prefilled_tokens=prefilled_tokens,
        accepted_hist=accepted_histogram(rounds),
    )
