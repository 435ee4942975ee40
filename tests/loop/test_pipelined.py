"""Rounds with nothing drafted, pipelined like plain decoding (edgespec/loop.py): runs of
K = 0 rounds and of lookup misses, lookups made one token behind, and cancelling inside a run.
Each pipelined step is the d = 0 round the loop would otherwise run, so tokens, kinds and Round
records must equal the round-by-round path's, and the caches must stay consistent."""

from __future__ import annotations

import threading

import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.drafting.token import ModelDrafter
from edgespec.events import Finished, Round, Token
from edgespec.runtime import Engine
from tests.helpers import (
    GREEDY,
    PROMPT,
    BehindOnce,
    RoundByRound,
    Scripted,
    gen,
    plain_ids,
    rounds_of,
    token_ids,
    token_rounds,
)

SCRIPT = [3, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0]  # runs of K = 0 of lengths 6, 3 and 2


def _scripted(calls: list):
    def policy(last):
        calls.append(last)
        return SCRIPT[(len(calls) - 1) % len(SCRIPT)]

    return Scripted(policy)


class Recording:
    """A rounds.Policy (observe / decide) following SCRIPT, recording every round it is shown."""

    def __init__(self) -> None:
        self.seen: list[Round] = []
        self.decided = 0

    def observe(self, r: Round) -> None:
        self.seen.append(r)

    def decide(self) -> int:
        self.decided += 1
        return SCRIPT[(self.decided - 1) % len(SCRIPT)]


@pytest.mark.parametrize("method", ["draft", "hybrid"])
def test_every_round_reaches_the_policy_once_in_order(engine, method):
    """Pipelined runs decide a round before the previous one is read back; the scheduler still
    shows the policy each round exactly once, in order: none twice, none skipped (the last
    round of a run used to be)."""
    policy = Recording()
    spec = SpecConfig(k=3, method=method, adaptive=False)
    events = gen(engine, engine.encode_raw(PROMPT), spec, 60, k_policy=policy)
    rounds = rounds_of(events)
    assert policy.seen == rounds[: len(policy.seen)]
    assert len(policy.seen) >= len(rounds) - 2  # the last rounds come after the last decision
    assert any(r.k == 0 for r in rounds)  # pipelined runs did happen


def test_round_events_carry_the_policy_k(engine):
    script = [1, 3, 2, 5, 4, 1, 6]
    calls: list[Round | None] = []

    def policy(last: Round | None) -> int:
        calls.append(last)
        return script[(len(calls) - 1) % len(script)]

    events = gen(
        engine,
        engine.encode_raw(PROMPT),
        SpecConfig(k=2, method="draft", adaptive=False),
        30,
        k_policy=Scripted(policy),
    )
    rounds = rounds_of(events)
    assert [r.k for r in rounds] == [script[i % len(script)] for i in range(len(rounds))]
    assert calls[0] is None and calls[1:] == rounds[: len(calls) - 1]


@pytest.mark.parametrize("method", ["draft", "hybrid"])
def test_k0_rounds_are_plain_steps_and_output_stays_exact(engine, method):
    """A policy alternating K = 0 and K = 3: greedy output still equals plain decoding, K = 0 rounds
    of the draft method commit one "target" token without drafting, and the draft cache (which
    lags behind during K = 0 rounds) catches up."""
    ids = engine.encode_raw(PROMPT)
    plain = plain_ids(engine, ids, 48)
    calls = iter(range(1000))
    events = gen(
        engine,
        ids,
        SpecConfig(k=3, method=method, adaptive=False),
        48,
        k_policy=Scripted(lambda last: 0 if next(calls) % 2 else 3),
    )
    assert token_ids(events) == plain
    rounds = rounds_of(events)
    assert {r.k for r in rounds} >= ({0, 3} if method == "draft" else {3})
    tokens = [e for e in events if isinstance(e, Token)]
    kinds_of_k0 = {t.kind for t, r in token_rounds(events) if r.k == 0}
    if method == "draft":
        assert kinds_of_k0 == {"target"} and all(r.drafted == 0 for r in rounds if r.k == 0)
    else:  # hybrid: K = 0 rounds still look up n-grams (k reports the lookup's length)
        assert any(r.method == "ngram" and r.drafted > 0 for r in rounds)
    assert len(tokens) == 48
    assert engine._draft.offset == len(engine._draft.tokens)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(0.8, seed=5)], ids=["greedy", "t0.8"])
def test_pipelined_plain_runs_equal_the_round_path_token_for_token(engine, sampling):
    """Runs of K = 0 rounds are pipelined (the next forward is queued before the current token is
    read back): same keys and maths as one d = 0 round at a time, so the same tokens, kinds and
    round records at T > 0 too, and greedy output equals plain decoding."""
    ids = engine.encode_raw(PROMPT)
    runs = {}
    for name, wrap in (("pipelined", lambda d: d), ("round by round", RoundByRound)):
        drafter = wrap(
            ModelDrafter(engine._draft, sampling, engine._vocab, engine.backend.draft_steps)
        )
        engine.reset()
        calls: list = []
        events = gen(
            engine,
            ids,
            SpecConfig(k=3, method="draft", adaptive=False),
            60,
            sampling,
            drafter=drafter,
            k_policy=_scripted(calls),
        )
        rounds = rounds_of(events)
        runs[name] = (
            [(e.id, e.kind) for e in events if isinstance(e, Token)],
            [(r.index, r.drafted, r.accepted, r.k, r.method) for r in rounds],
        )
        assert [r.k for r in rounds] == [SCRIPT[i % len(SCRIPT)] for i in range(len(rounds))]
        seen = [c.index for c in calls if c is not None]
        once = [i for n, i in enumerate(seen) if n == 0 or seen[n - 1] != i]
        assert once == sorted(set(seen))  # rounds reach the policy in order (a repeat: in a row)
        assert all(c is None or c.index >= i - 2 for i, c in enumerate(calls))  # at most 1 late
        assert engine._target.offset == len(engine._target.tokens)
    assert runs["pipelined"] == runs["round by round"]
    assert len(runs["pipelined"][0]) == 60
    if sampling.greedy:
        plain = plain_ids(engine, ids, 60)
        assert [t for t, _ in runs["pipelined"][0]] == plain


@pytest.mark.parametrize("stop_at", [3, 6])  # inside a plain run; its last round
def test_cancel_inside_a_pipelined_plain_run_leaves_consistent_caches(tiny_models, stop_at):
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    cancel = threading.Event()
    committed, events = list(ids), []
    cfg = GenerationConfig(GREEDY, SpecConfig(k=3, method="draft", adaptive=False), max_tokens=60)
    for event in engine.generate(ids, cfg, cancel, k_policy=_scripted([])):
        events.append(event)
        if isinstance(event, Token):
            committed.append(event.id)
        if isinstance(event, Round) and event.index == stop_at:
            cancel.set()
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled"
    assert rounds_of(events)[-1].index == stop_at
    t_tokens, d_tokens = engine.cached_tokens()
    assert engine._target.offset == len(t_tokens) == len(committed) - 1
    assert t_tokens == committed[:-1] and d_tokens == committed[: len(d_tokens)]
    assert engine._draft.offset == len(d_tokens)
    plain = plain_ids(Engine(*tiny_models), ids, 60)
    assert (
        token_ids(gen(engine, ids, SpecConfig(k=3, method="draft", adaptive=False), 60)) == plain
    )  # the next request is exact


def test_drafts_one_token_behind_keep_greedy_output_and_caches(target_engine):
    """Greedy: the drafted step commits the target's own tokens (drafts accepted or not), and the
    cache holds exactly the committed context after it; a bad guess is only rejected."""
    engine = target_engine
    ids = engine.encode_raw(PROMPT)
    plain = plain_ids(engine, ids, 12)
    accepted = []
    bad = (plain[3] + 1) % engine._vocab
    for drafts in ([plain[2]], plain[2:5], [plain[2], bad], [bad, plain[3]]):
        engine.reset()
        drafter = BehindOnce(len(ids) + 1, drafts)  # after x_m: drafts for x_m+2 ...
        events = gen(
            engine, ids, SpecConfig(k=1, method="draft", adaptive=False), 12, drafter=drafter
        )
        assert token_ids(events) == plain
        rounds = rounds_of(events)
        r = rounds[2]
        # Timed (Round.timed): only plain steps with a plain step queued behind them, not a
        # run's first. Untimed: the run's first step, the one the drafts were queued behind, the
        # drafted step; then a new run (lookups miss): its first, and its last (nothing queued
        # behind it at max_tokens).
        timed = [x.timed for x in rounds]
        assert timed == [False, False, False, False] + [True] * (len(rounds) - 5) + [False]
        good = 0
        while good < len(drafts) and drafts[good] == plain[2 + good]:
            good += 1
        assert (r.drafted, r.accepted, r.method) == (len(drafts), good, "ngram")
        accepted.append(good)
        assert engine._target.offset == len(engine._target.tokens) == len(ids) + 11
    assert accepted == [1, 3, 1, 0]
