"""Metric folds and the closed-form speedup, checked against hand-worked numbers."""

from __future__ import annotations

import pytest

from edgespec.bench.records import RunRecord, aggregate, rounds_from_flags, summarize_runs
from edgespec.events import (
    Round,
    add_hists,
    alpha_mle,
    expected_tokens_per_round,
    fold_rounds,
    predicted_speedup,
    ratio_of_medians,
    verify_cost_line,
)


@pytest.mark.parametrize(
    ("alpha", "k", "expected"),
    [
        (0.8, 4, 3.3616),  # (1 - 0.32768) / 0.2
        (0.5, 1, 1.5),  # 1 + 0.5
        (0.5, 3, 1.875),  # 1 + .5 + .25 + .125
        (0.0, 4, 1.0),  # every round commits only the correction
        (1.0, 4, 5.0),  # every draft accepted + bonus
    ],
)
def test_expected_tokens_per_round_hand_worked(alpha: float, k: int, expected: float) -> None:
    assert expected_tokens_per_round(alpha, k) == pytest.approx(expected)


def test_expected_tokens_is_continuous_at_alpha_one() -> None:
    assert expected_tokens_per_round(1 - 1e-9, 4) == pytest.approx(5.0, rel=1e-6)


def test_predicted_speedup_hand_worked() -> None:
    # E = 3.3616; cost = 4 * 0.1 + 1.3 = 1.7
    assert predicted_speedup(0.8, 4, 0.1, 1.3) == pytest.approx(3.3616 / 1.7)
    # Leviathan et al. with v = 1: alpha .6, K 3, c .05 -> (1 - .6^4)/(.4 * 1.15)
    assert predicted_speedup(0.6, 3, 0.05) == pytest.approx((1 - 0.6**4) / (0.4 * 1.15))
    # a useless draft (alpha 0) with a costly verify is a slowdown
    assert predicted_speedup(0.0, 4, 0.2, 1.5) == pytest.approx(1 / 2.3)


def test_alpha_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens_per_round(1.2, 4)


def test_verify_cost_line_through_one() -> None:
    assert verify_cost_line([(4, 1.3)]) == pytest.approx(0.075)
    # (2, 1.2), (4, 1.4): slope exactly 0.1
    assert verify_cost_line([(2, 1.2), (4, 1.4)]) == pytest.approx(0.1)
    assert verify_cost_line([]) == 0.0


def test_alpha_mle_hand_worked() -> None:
    # rounds (4, 4), (4, 1), (4, 2): 7 accepted, 2 rejections
    assert alpha_mle(7, 2) == pytest.approx(7 / 9)
    assert alpha_mle(0, 0) is None


def _round(i: int, drafted: int, accepted: int, td: float = 0.01, tv: float = 0.02) -> Round:
    return Round(index=i, drafted=drafted, accepted=accepted, k=4, t_draft=td, t_verify=tv)


def test_fold_rounds() -> None:
    t = fold_rounds([_round(0, 4, 4), _round(1, 4, 1), _round(2, 4, 2), _round(3, 0, 0)])
    assert (t.rounds, t.drafted, t.accepted, t.rejections) == (4, 12, 7, 2)
    assert t.hist == (1, 1, 1, 0, 1)
    assert t.t_draft == pytest.approx(0.04) and t.t_verify == pytest.approx(0.08)


def test_rounds_from_mlx_lm_flags() -> None:
    t = rounds_from_flags([True, True, False, True, False, False, True], k=2)
    assert (t.rounds, t.drafted, t.accepted, t.rejections) == (4, 7, 4, 2)
    assert t.hist == (1, 2, 1)
    assert rounds_from_flags([False, False], k=3).hist == (2,)


def test_add_hists_and_ratio_of_medians() -> None:
    assert add_hists([(1, 2), (0, 0, 5), ()]) == (1, 2, 5)
    assert ratio_of_medians([10, 30, 20], [10, 10]) == 2.0
    assert ratio_of_medians([], [1.0]) is None


def _run(method: str, pid: str, tokens: int, decode: float, rep: int = 0, **kw) -> RunRecord:
    base = dict(
        method=method,
        k=0 if method == "plain" else 4,
        temp=0.0,
        prompt_id=pid,
        category=kw.pop("category", "qa"),
        repeat=rep,
        tokens=tokens,
        ttft=0.1,
        decode_time=decode,
        wall_time=decode + 0.1,
        finish_reason="length",
    )
    return RunRecord(**(base | kw))


def test_run_record_throughput() -> None:
    r = _run("plain", "a", 11, 0.5)
    assert r.tokens_per_s == pytest.approx(20.0)  # 10 tokens after the first in 0.5 s
    assert r.tpot == pytest.approx(0.05)
    assert _run("plain", "a", 1, 0.0).tokens_per_s == 0.0


def test_summary_speedup_costs_and_prediction() -> None:
    # plain: 20 tok/s (tpot 0.05 s). spec: 10 tokens in 0.25 s after the first -> 40 tok/s.
    plain = [_run("plain", "a", 11, 0.5), _run("plain", "b", 11, 0.5)]
    spec = [
        _run(
            "spec",
            pid,
            11,
            0.25,
            rounds=4,
            drafted=16,
            accepted=6,
            rejections=4,
            accepted_hist=(1, 1, 1, 1),
            t_draft=0.08,
            t_verify=0.16,
            t_model_decode=0.2,
            mismatch=(pid == "b"),
        )
        for pid in ("a", "b")
    ]
    s = summarize_runs(spec, plain)
    assert s.speedup_vs_plain == pytest.approx(2.0)
    assert s.tau == pytest.approx(1 + 12 / 8)
    assert s.alpha == pytest.approx(12 / 20) and s.acceptance == pytest.approx(12 / 32)
    # c = (0.16 s / 32 drafts) / 0.05 s = 0.1; v = (0.32 s / 8 rounds) / 0.05 s = 0.8
    assert s.c == pytest.approx(0.1) and s.v == pytest.approx(0.8)
    assert s.predicted_speedup == pytest.approx(predicted_speedup(0.6, 4, 0.1, 0.8))
    # 0.2 s of the 0.25 s decode time in draft/verify calls -> 20 % overhead
    assert s.overhead == pytest.approx(0.2)
    # 0.1 s outside the calls over 2 x (4 - 1) rounds (each run's first round is in TTFT)
    assert s.overhead_per_round == pytest.approx(0.1 / 6)
    assert s.accepted_hist == (2, 2, 2, 2)
    assert (s.mismatches, s.mismatched_prompts) == (1, ("b",))


def test_speedup_spread_over_repeats() -> None:
    plain = [_run("plain", "a", 11, 0.5, rep) for rep in (0, 1)]
    spec = [_run("spec", "a", 11, 0.25, 0), _run("spec", "a", 11, 0.5 / 3, 1)]
    s = summarize_runs(spec, plain)
    assert (s.speedup_min, s.speedup_max) == pytest.approx((2.0, 3.0))
    assert s.speedup_vs_plain == pytest.approx(50 / 20)  # median(40, 60) / 20


def test_aggregate_groups_variants_and_categories() -> None:
    recs = [
        _run("plain", "a", 11, 0.5, category="math"),
        _run("plain", "b", 11, 1.0, category="code"),
        _run("spec", "a", 11, 0.25, category="math"),
        _run("spec", "b", 11, 0.25, category="code"),
    ]
    out = {v.label: v for v in aggregate(recs)}
    assert set(out) == {"plain T=0", "spec K=4 T=0"}
    spec = out["spec K=4 T=0"]
    assert spec.by_category["math"].speedup_vs_plain == pytest.approx(2.0)
    assert spec.by_category["code"].speedup_vs_plain == pytest.approx(4.0)
    assert spec.overall.speedup_vs_plain == pytest.approx(40 / 15)
    assert out["plain T=0"].overall.speedup_vs_plain == pytest.approx(1.0)
    assert spec.overall.tau is None and spec.overall.mismatches is None
    assert (spec.overall.prompts, spec.overall.tokens_per_s) == (2, pytest.approx(40.0))
