"""Pure folds over generation events and bench runs: throughput, tau, alpha, costs, predictions.

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

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from edgespec.events import Round

PLAIN = "plain"


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


def fold_rounds(rounds: Iterable[Round]) -> RoundTotals:
    """Sum Round events. Rounds with drafted == 0 (e.g. no n-gram match) count as plain steps."""
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
    return RoundTotals(n, drafted, accepted, rejections, t_draft, t_verify, tuple(hist))


def rounds_from_flags(from_draft: Sequence[bool], k: int) -> RoundTotals:
    """Rebuild round counts from mlx-lm's per-token `from_draft` flags (no timings available).

    Every token not from the draft closes a round (a correction or a bonus); a trailing run of
    draft tokens is a round cut short by the token limit or EOS. E.g. K=2, flags
    T T F | T F | F | T -> rounds accepting 2, 1, 0, 1 (the last cut short): drafted 2+2+2+1 = 7,
    rejections 2 (the rounds that accepted 1 and 0), hist (1, 2, 1).
    (Near the token limit mlx-lm drafts fewer than K; such a round still counts K here.)
    """
    runs: list[tuple[int, bool]] = []  # (accepted drafts, closed by a target token)
    run = 0
    for flag in from_draft:
        if flag:
            run += 1
        else:
            runs.append((run, True))
            run = 0
    if run:
        runs.append((run, False))
    drafted = sum(k if closed else a for a, closed in runs)
    rejections = sum(1 for a, closed in runs if closed and a < k)
    hist = add_hists((0,) * a + (1,) for a, _ in runs)
    accepted = sum(a for a, _ in runs)
    return RoundTotals(len(runs), drafted, accepted, rejections, 0.0, 0.0, hist)


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


@dataclass(frozen=True)
class RunRecord:
    """One measured generation: one method variant on one prompt in one repeat.

    Times are seconds, measured identically for every method from outside the generator:
    ttft = call -> first token; decode_time = first token -> last token; wall_time = call -> end.
    Round fields are 0 for plain decoding; t_draft / t_verify are None where the method does not
    report them (mlx-lm). mismatch: at temperature 0, whether token_ids differ from plain's on the
    same prompt (None where not compared).
    """

    method: str
    k: int
    temp: float
    prompt_id: str
    category: str
    repeat: int
    tokens: int
    ttft: float
    decode_time: float
    wall_time: float
    finish_reason: str
    peak_memory: int = 0  # bytes
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    accepted_hist: tuple[int, ...] = ()
    t_draft: float | None = None
    t_verify: float | None = None
    t_model_decode: float | None = None  # draft + verify seconds within decode_time
    token_ids: tuple[int, ...] = ()
    mismatch: bool | None = None
    first_diff: int | None = None  # first position where token_ids differ from plain's

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: (tokens - 1) / decode_time (the first token belongs to TTFT)."""
        return (
            (self.tokens - 1) / self.decode_time
            if self.tokens > 1 and self.decode_time > 0
            else 0.0
        )

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first."""
        return self.decode_time / (self.tokens - 1) if self.tokens > 1 else None

    def to_json(self) -> dict:
        """Plain JSON dict, derived throughput included."""
        d = asdict(self)
        d["accepted_hist"] = list(self.accepted_hist)
        d["token_ids"] = list(self.token_ids)
        d["tokens_per_s"] = self.tokens_per_s
        return d


@dataclass(frozen=True)
class Summary:
    """Aggregates of a group of runs of one method variant (one category, or all).

    tokens_per_s is the median over runs; speedup_vs_plain = median(tokens_per_s) /
    median(plain's tokens_per_s) over the same prompts, with speedup_min/max the same ratio taken
    per repeat. tau = tokens committed per round; alpha = per-token acceptance (alpha_mle);
    acceptance = accepted / drafted; c, v = measured draft step / verify forward cost in plain
    decode steps; predicted_speedup = the closed form at (alpha, K, c, v); overhead = share of
    decode time (first -> last token) spent outside the draft and verify calls (Python, events,
    detokenizing; the first round's calls fall in TTFT and are left out). None where it does not apply.
    """

    runs: int
    prompts: int
    tokens: float
    tokens_per_s: float | None
    ttft: float | None
    tpot: float | None
    peak_memory_mb: float
    speedup_vs_plain: float | None = None
    speedup_min: float | None = None
    speedup_max: float | None = None
    tau: float | None = None
    alpha: float | None = None
    acceptance: float | None = None
    k_mean: float | None = None
    accepted_hist: tuple[int, ...] = ()
    c: float | None = None
    v: float | None = None
    predicted_speedup: float | None = None
    overhead: float | None = None
    mismatches: int | None = None
    mismatched_prompts: tuple[str, ...] = field(default=())


def _speedups(runs: Sequence[RunRecord], plain: Sequence[RunRecord]) -> dict:
    """Ratio of medians overall and per repeat (its min and max are the spread)."""
    if not plain:
        return {}
    per_repeat = []
    for rep in sorted({r.repeat for r in runs}):
        ratio = ratio_of_medians(
            [r.tokens_per_s for r in runs if r.repeat == rep],
            [p.tokens_per_s for p in plain if p.repeat == rep],
        )
        if ratio is not None:
            per_repeat.append(ratio)
    return {
        "speedup_vs_plain": ratio_of_medians(
            [r.tokens_per_s for r in runs], [p.tokens_per_s for p in plain]
        ),
        "speedup_min": min(per_repeat, default=None),
        "speedup_max": max(per_repeat, default=None),
    }


def _speculation(runs: Sequence[RunRecord], plain_tpot: float | None) -> dict:
    """tau, alpha, acceptance, histogram and the cost model of runs that have rounds."""
    rounds = sum(r.rounds for r in runs)
    drafted = sum(r.drafted for r in runs)
    if not rounds or not drafted:
        return {}
    accepted = sum(r.accepted for r in runs)
    alpha = alpha_mle(accepted, sum(r.rejections for r in runs))
    k_mean = drafted / rounds
    out: dict[str, Any] = {
        "tau": 1.0 + accepted / rounds,
        "alpha": alpha,
        "acceptance": accepted / drafted,
        "k_mean": k_mean,
        "accepted_hist": add_hists(r.accepted_hist for r in runs),
    }
    timed = [r for r in runs if r.t_draft is not None and r.t_verify is not None]
    if timed and plain_tpot and alpha is not None:
        t_draft = sum(r.t_draft or 0.0 for r in timed)
        t_verify = sum(r.t_verify or 0.0 for r in timed)
        c = t_draft / max(1, sum(r.drafted for r in timed)) / plain_tpot
        v = t_verify / max(1, sum(r.rounds for r in timed)) / plain_tpot
        in_decode = [r for r in timed if r.t_model_decode is not None]
        decode = sum(r.decode_time for r in in_decode)
        t_model = sum(r.t_model_decode or 0.0 for r in in_decode)
        out |= {
            "c": c,
            "v": v,
            "predicted_speedup": predicted_speedup(alpha, k_mean, c, v),
            "overhead": max(0.0, 1.0 - t_model / decode) if decode else None,
        }
    return out


def summarize(runs: Sequence[RunRecord], plain: Sequence[RunRecord] = ()) -> Summary:
    """Fold one group of runs (plain: the plain-decoding runs over the same prompts and temp)."""
    compared = [r for r in runs if r.mismatch is not None]
    bad = sorted({r.prompt_id for r in compared if r.mismatch})
    tpots = [t for t in (p.tpot for p in plain) if t is not None]
    return Summary(
        runs=len(runs),
        prompts=len({r.prompt_id for r in runs}),
        tokens=sum(r.tokens for r in runs) / len(runs) if runs else 0.0,
        tokens_per_s=median(r.tokens_per_s for r in runs),
        ttft=median(r.ttft for r in runs),
        tpot=median(t for t in (r.tpot for r in runs) if t is not None),
        peak_memory_mb=max((r.peak_memory for r in runs), default=0) / 2**20,
        mismatches=len(bad) if compared else None,
        mismatched_prompts=tuple(bad),
        **_speedups(runs, plain),
        **_speculation(runs, median(tpots)),
    )


@dataclass(frozen=True)
class VariantSummary:
    """One method at one (K, temperature): overall and per category."""

    method: str
    k: int
    temp: float
    overall: Summary
    by_category: dict[str, Summary]

    @property
    def label(self) -> str:
        """Short name for tables and plots, e.g. 'spec K=4 T=0' or 'plain T=0.7' (no K: K=0)."""
        k = f" K={self.k}" if self.k else ""
        return f"{self.method}{k} T={self.temp:g}"


def aggregate(records: Sequence[RunRecord]) -> list[VariantSummary]:
    """Group runs by (method, K, temp) and summarise each, overall and per category.

    Speedups and costs compare each group with the plain runs at the same temperature over the
    same category. Order: first appearance of each variant in `records`.
    """
    variants = list(dict.fromkeys((r.method, r.k, r.temp) for r in records))
    out = []
    for method, k, temp in variants:
        runs = [r for r in records if (r.method, r.k, r.temp) == (method, k, temp)]
        ids = {r.prompt_id for r in runs}
        plain = [r for r in records if r.method == PLAIN and r.temp == temp and r.prompt_id in ids]
        cats = list(dict.fromkeys(r.category for r in runs))
        by_cat = {
            c: summarize(
                [r for r in runs if r.category == c], [p for p in plain if p.category == c]
            )
            for c in cats
        }
        out.append(VariantSummary(method, k, temp, summarize(runs, plain), by_cat))
    return out
