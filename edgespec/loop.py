"""The draft-verify loop: a generation as a sequence of rounds (edgespec/rounds.py: plan, draft,
verify, accept, commit, one file), and the scheduler around them that pipelines runs of plain
steps like mlx-lm's plain decoding (plain_run). It decides nothing itself: drafters propose
(edgespec/drafting/), the policy plans (rounds.Plans), the maths accepts (acceptance.py).

`speculate` runs rounds of one kind (rounds.Rounds): chains (rounds.Chains: K drafted tokens in a
row) or draft trees (edgespec/trees/loop.py). A round with nothing to draft (K = 0, an empty shape,
a lookup that missed) goes to plain_run, which queues the next step's forward (mx.async_eval)
before reading the current token back, and keeps going while the policy asks for plain steps (or
while a lookup one token behind proposes). Plain decoding is this with K = 0 every round
(drafting.adaptive.FixedK(PLAIN_ONLY)): one key schedule (sampling.round_keys) for every round.

Cache invariant after every round: the target's cache holds context[:-1]; inside a pipelined run
it may hold the queued forward's positions too, and is rewound to context[:-1] when the run ends.
The loops yield rounds.Steps; the Engine (runtime.py) turns them into Token / Round / Finished
events.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import cast

import mlx.core as mx

from edgespec.acceptance import PendingReview, Review
from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.adaptive import LOOKUP
from edgespec.drafting.base import (
    PLAIN_ONLY,
    Capabilities,
    Drafter,
    Proposal,
    SizedLookups,
    no_proposal,
)
from edgespec.events import Round
from edgespec.rounds import (
    Limits,
    Plan,
    Plans,
    Policy,
    Progress,
    Rounds,
    Step,
    cancelled,
    is_set,
    verify_round,
)
from edgespec.sampling import make_key, round_keys

__all__ = ["Limits", "plain_run", "speculate"]


def speculate(
    target: KVState,
    rounds: Rounds[Plan],
    drafter: Drafter,
    prompt: list[int],
    cfg: SamplingConfig,
    policy: Policy[Plan],
    limits: Limits,
    cancel: threading.Event | None = None,
    prepare: Callable[[list[int]], object] | None = None,
) -> Iterator[Step]:
    """Speculative decoding. Both states must already hold a prefix of `prompt` (Engine.prefill).
    `rounds` drafts and finishes each round (rounds.Chains, trees.loop.Trees) over `drafter`;
    `policy` plans each round (K, or a tree shape). The target may lag behind by a short prompt
    tail (Strategy.prefill, cache.MERGE_MAX): the first round's forward feeds it and gives the
    first token. Where the target's forwards are shared with other sequences (KVState.shared)
    a first round that drafts nothing reads its token back before queueing another forward: a
    queued shared forward may wait for the others, and the first token would wait with it.
    `prepare(context)`, if given, brings the drafter's state up to the context before the first
    round that drafts.

    Example: speculate(target, Chains(target, drafter, cfg), drafter, prompt, cfg, FixedK(4),
    limits) drafts K = 4 tokens a round (rounds.Chains, drafting.adaptive.FixedK)."""
    run = Progress(list(prompt), make_key(cfg.seed), limits)
    caps, first = rounds.caps, target.shared
    plans: Plans[Plan] = Plans(policy, reviews=caps.reviews is not None)
    try:
        while run.index < limits.max_tokens and not run.stopped:
            if is_set(cancel):
                yield cancelled()
                return
            plan = plans.next(run)
            if prepare is not None and rounds.size(plan) > 0:
                prepare(run.context)
                prepare = None
            round_key = run.key
            run.key, draft_key, verify_key = round_keys(run.key)
            t0 = time.perf_counter()
            prop = rounds.draft(run, plan, draft_key)
            if prop is None:  # plain steps, pipelined, the first with this round's keys
                run.key = round_key
                pipelined, first = not first, False  # shared: the first token read at once
                yield from plain_run(
                    target, drafter, run, cfg, plans, rounds.size, caps, cancel, pipelined
                )
                continue
            first = False
            step = rounds.finish(run, plan, prop, t0, verify_key)
            yield step
            if step.stop:
                return
    finally:
        target.rewind(run.context, min(target.offset, len(run.context) - 1))
        drafter.commit(run.context)


@dataclass(frozen=True)
class Queued:
    """A step whose forward is queued: its proposal, lazy output and features (verify_round), and
    the target's probability of its token (a plain step at T > 0 when reviews are read)."""

    prop: Proposal
    out: mx.array
    feats: mx.array | None
    px: mx.array | None = None


def _queue(
    target: KVState,
    run: Progress,
    cfg: SamplingConfig,
    pending: mx.array,
    prop: Proposal,
    feats: bool,
    probs: bool = False,
) -> Queued:
    """Queue one step's forward (the d = 0 round speculate would run, or a lookup's), with the
    same keys as that round: a round's draft key goes unused here. `probs`: keep the target's
    probability of a plain step's token (Queued.px), for reviews."""
    run.key, _draft_key, verify_key = round_keys(run.key)
    keep: list[mx.array] | None = [] if probs else None
    out, features = verify_round(target, pending, prop, cfg, verify_key, feats, keep)
    px = keep[0] if keep else None
    mx.async_eval([a for a in (out, features, px) if a is not None])
    return Queued(prop, out, features, px)


def plain_run(
    target: KVState,
    drafter: Drafter,
    run: Progress,
    cfg: SamplingConfig,
    plans: Plans,
    size: Callable[[Plan], int],
    caps: Capabilities,
    cancel: threading.Event | None,
    pipelined: bool = True,
) -> Generator[Step, None, None]:
    """Consecutive plain steps, pipelined like mlx-lm: before a step's token is read back, the
    policy picks the next round's plan (`size`: its drafted tokens, 0 for a plain step) and,
    while that is a plain step, the next step's forward is queued. Each step is exactly the d = 0
    round speculate would run (same keys, same maths), so the output is unchanged; only the host
    sync no longer sits between two forwards. The policy decides round j + 1 before round j is
    read back: it has then seen rounds up to j - 1, each once (Plans).

    `caps`: the drafter's (Capabilities.of, looked up once per generation). A drafter that looks
    behind (LooksBehind: an n-gram lookup) keeps the run going whatever is chosen, as long as it
    proposes (not None): the tokens after the one still being computed, from the context without
    it. A non-empty proposal is queued with that token, as one forward [pending, x_1..x_d]
    verified like any round; the run ends on it. Exact: the proposal depends only on committed
    tokens, and the ratio test does not care how good it is.

    Yields Steps; leaves a plan already chosen for the next round in plans.ahead. Sets
    run.stopped when it yielded the generation's final Step. Not `pipelined`: one step, read
    back before any other forward is queued (a generation's first token on a shared forward)."""
    wants = caps.features is not None
    reviews = caps.reviews if plans.reviews else None
    probs = reviews is not None and not cfg.greedy
    context = mx.array(run.context[target.offset :], dtype=mx.int32)
    queued = _queue(target, run, cfg, context, no_proposal(drafter.method), wants, probs)
    t_prev, first = time.perf_counter(), True
    # A review queued behind the next step (acceptance.py, reviews), read after it.
    review: PendingReview | None = None
    while True:
        decided, upcoming = None, None
        if pipelined and not queued.prop.size and run.can_queue():
            decided = plans.decide(run)
            ahead = _ahead(caps, drafter.method, run, size(decided))
            if ahead is not None and not is_set(cancel):
                upcoming = _queue(target, run, cfg, queued.out[-1:], ahead, wants, probs)
                decided = None if ahead.size else decided  # decided after that round is read
        host = cast(list[int], queued.out.tolist())
        now, prop, (n, value) = time.perf_counter(), queued.prop, host[-2:]
        # On MLX's CPU backend a read returns only once the forward queued behind it is done too,
        # so a run's first interval holds two forwards and its last almost none: only a plain
        # step with a plain step queued behind it, not the run's first, is timed (Round.timed);
        # nor one read after a review's forward was queued (it holds that forward too).
        timed = not prop.size and upcoming is not None and not upcoming.prop.size and not first
        timed = timed and review is None
        if review is not None:
            run.reviews.append(review.done())
            review = None
        rnd = _step_round(run, prop, drafter.method, n, now - t_prev, timed)
        t_prev, first = now, False
        if queued.px is not None:  # the target's probability of this plain step's token
            run.probs[len(run.context)] = cast(float, queued.px.item())
        if not prop.size and caps.lookups is not None and plans.lookup_review_due():
            _review_lookup(caps.lookups, run, value)
        step = run.commit(drafter, host[:n] + [value], rnd, queued.feats)
        if upcoming is None or step.stop:
            target.rewind(run.context, len(run.context) - 1)
            run.stopped = step.stop is not None
            plans.ahead = decided
            yield step
            return
        yield step
        if is_set(cancel):
            target.rewind(run.context, len(run.context) - 1)
            run.stopped = True
            yield cancelled()
            return
        if reviews is not None and plans.review_due():
            review = reviews.review(run.context, run.probs)
            run.probs.clear()
        queued = upcoming


def _step_round(
    run: Progress, prop: Proposal, method: str, n: int, seconds: float, timed: bool
) -> Round:
    """The Round event of a pipelined step (a plain step, or a lookup queued behind one)."""
    d = prop.size
    return Round(
        index=run.index,
        drafted=d,
        accepted=n,
        k=d,
        t_draft=0.0,
        t_verify=seconds,
        method=prop.method if d else method,
        timed=timed,
        match=prop.match,
        context=len(run.context),
    )


def _review_lookup(lookups: SizedLookups, run: Progress, token: int) -> None:
    """A review of switched-off lookups at one plain step (acceptance.py, reviews): whether the
    lookup's guess for the token after the context is the token the target sampled."""
    guess = lookups.guess(run.context)
    if guess is not None:
        run.reviews.append(Review(LOOKUP, (float(guess[0] == token),), guess[1]))


def _ahead(caps: Capabilities, method: str, run: Progress, k: int) -> Proposal | None:
    """What to queue behind the step being computed: a lookup one token behind (cut to the room
    left), a plain step when K = 0 (or PLAIN_ONLY: no lookup), or None (the run ends: the drafter
    wants a proper round)."""
    if k <= PLAIN_ONLY:
        return no_proposal(method)
    if caps.behind is not None:
        behind = caps.behind.propose_behind(run.context, k)
        return None if behind is None else behind.cut(max(0, run.room() - 2))
    return no_proposal(method) if k <= 0 else None
