"""The bench's records and their folds: one RunRecord per measured generation, Summary per group
of runs (one method variant, overall and per category), with speedups measured side by side
against plain decoding on the same prompts. Pure: records in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from edgespec.events import (
    RoundTotals,
    add_hists,
    alpha_mle,
    median,
    position_acceptance,
    predicted_speedup,
    ratio_of_medians,
)

PLAIN = "plain"


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
    position_tries: tuple[int, ...] = ()  # per drafted position: metrics.RoundTotals.tries
    position_passes: tuple[int, ...] = ()
    t_draft: float | None = None
    t_verify: float | None = None
    t_model_decode: float | None = None  # draft + verify seconds within decode_time
    token_ids: tuple[int, ...] = ()
    mismatch: bool | None = None
    first_diff: int | None = None  # first position where token_ids differ from plain's
    prompt_tokens: int = 0
    # The long-context mode (`--context`): the requested length in tokens (0 outside it); its
    # runs decode from a prefilled cache, their ttft and peak_memory coming from one cold run of
    # the same method on the same prompt (edgespec/bench/runner.py, iter_context_bench).
    context: int = 0
    # Per answer span of settings' position_width tokens (a round falls in the span of its first
    # token): (rounds, tokens, drafted, accepted); empty when not asked for.
    position_buckets: tuple[tuple[int, int, int, int], ...] = ()

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
        d["position_tries"] = list(self.position_tries)
        d["position_passes"] = list(self.position_passes)
        d["token_ids"] = list(self.token_ids)
        d["position_buckets"] = [list(b) for b in self.position_buckets]
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
    detokenizing; the first round's calls fall in TTFT and are left out), overhead_per_round = the
    same time per round, in seconds. None where it does not apply.
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
    # Acceptance of drafted position i + 1 given positions 1..i accepted (metrics.position_acceptance).
    position_acceptance: tuple[float | None, ...] = ()
    c: float | None = None
    v: float | None = None
    predicted_speedup: float | None = None
    overhead: float | None = None
    overhead_per_round: float | None = None  # seconds (_loop_overhead)
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
        "position_acceptance": position_acceptance(
            add_hists(r.position_tries for r in runs), add_hists(r.position_passes for r in runs)
        ),
    }
    timed = [r for r in runs if r.t_draft is not None and r.t_verify is not None]
    if timed and plain_tpot and alpha is not None:
        t_draft = sum(r.t_draft or 0.0 for r in timed)
        t_verify = sum(r.t_verify or 0.0 for r in timed)
        c = t_draft / max(1, sum(r.drafted for r in timed)) / plain_tpot
        v = t_verify / max(1, sum(r.rounds for r in timed)) / plain_tpot
        out |= {
            "c": c,
            "v": v,
            "predicted_speedup": predicted_speedup(alpha, k_mean, c, v),
            **_loop_overhead(timed),
        }
    return out


def _loop_overhead(timed: Sequence[RunRecord]) -> dict[str, float | None]:
    """The loop's own time within decode (first -> last token), outside the draft and verify
    calls: its share of decode time and its seconds per round. A run's first round falls in TTFT,
    so a run of n rounds counts n - 1. E.g. two runs of 4 rounds, 0.25 s decode each, 0.2 s of it
    in the calls: overhead 0.1 / 0.5 = 0.2, overhead_per_round 0.1 / 6 s."""
    in_decode = [r for r in timed if r.t_model_decode is not None]
    decode = sum(r.decode_time for r in in_decode)
    if not decode:
        return {"overhead": None, "overhead_per_round": None}
    outside = max(0.0, decode - sum(r.t_model_decode or 0.0 for r in in_decode))
    rounds = sum(max(0, r.rounds - 1) for r in in_decode)
    return {
        "overhead": outside / decode,
        "overhead_per_round": outside / rounds if rounds else None,
    }


def summarize_runs(runs: Sequence[RunRecord], plain: Sequence[RunRecord] = ()) -> Summary:
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
            c: summarize_runs(
                [r for r in runs if r.category == c], [p for p in plain if p.category == c]
            )
            for c in cats
        }
        out.append(VariantSummary(method, k, temp, summarize_runs(runs, plain), by_cat))
    return out


def bucket_rounds(
    log: Sequence[tuple[int, int, int, int]], width: int
) -> tuple[tuple[int, int, int, int], ...]:
    """Fold a run's round log ((position, tokens, drafted, accepted) per round) into spans of
    `width` answer tokens: (rounds, tokens, drafted, accepted) per span, a round counted in the
    span of its first token. Width 4, rounds at 0 (3 tokens), 3 (2), 5 (1) -> spans
    (2, 5, .., ..) and (1, 1, .., ..). Empty when width < 1 or there are no rounds."""
    if width < 1 or not log:
        return ()
    spans = [[0, 0, 0, 0] for _ in range(max(p for p, *_ in log) // width + 1)]
    for position, tokens, drafted, accepted in log:
        span = spans[position // width]
        for i, x in enumerate((1, tokens, drafted, accepted)):
            span[i] += x
    return tuple((a, b, c, d) for a, b, c, d in spans)


@dataclass(frozen=True)
class PositionSpan:
    """Acceptance over one span of answer positions, summed over runs: tau = tokens per round,
    acceptance = accepted / drafted (None where nothing was drafted)."""

    start: int
    end: int
    rounds: int
    tokens: int
    drafted: int
    accepted: int

    @property
    def tau(self) -> float | None:
        return self.tokens / self.rounds if self.rounds else None

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"tau": self.tau, "acceptance": self.acceptance}


def position_spans(runs: Sequence[RunRecord], width: int) -> list[PositionSpan]:
    """The runs' position_buckets summed span by span (runs of different lengths: each span
    sums the runs that reached it)."""
    n = max((len(r.position_buckets) for r in runs), default=0)
    out = []
    for i in range(n):
        sums = [0, 0, 0, 0]
        for r in runs:
            if i < len(r.position_buckets):
                sums = [a + b for a, b in zip(sums, r.position_buckets[i], strict=True)]
        out.append(PositionSpan(i * width, (i + 1) * width, *sums))
    return out


def by_context(records: Sequence[RunRecord]) -> dict[int, list[VariantSummary]]:
    """The long-context mode's folds: per requested context length (ascending), aggregate() of
    its runs (speedups against plain at the same length)."""
    lengths = sorted({r.context for r in records if r.context})
    order = {(v.method, v.k, v.temp): i for i, v in enumerate(aggregate(records))}
    return {
        n: sorted(
            aggregate([r for r in records if r.context == n]),
            key=lambda v: order[(v.method, v.k, v.temp)],
        )
        for n in lengths
    }
