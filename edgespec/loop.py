"""The draft-verify loop and its chain round, top to bottom: plan (the policy's K, rounds.Plans),
draft (Chains.draft), verify (verify_round: one target forward over the pending token and the
drafts), accept (acceptance.accept), commit (rounds.Progress.commit: cut at EOS / the limits, the
drafter rolled back). Plain decoding is this loop with K = 0 every round
(drafting.adaptive.FixedK(PLAIN_ONLY)); draft trees are rounds of another kind
(edgespec/trees/loop.py) in the same loop. It decides nothing itself: drafters propose
(edgespec/drafting/), the policy plans, the maths accepts (acceptance.py).

One schedule: a round that drafted nothing is a plain step, and while its token is computing the
loop already decides the next round and, when that round's proposal does not need the token
(another plain step, or a lookup one token behind: Rounds.behind), queues its forward
(mx.async_eval) before reading the current one back, as mlx-lm's plain decoding does. Same keys
and maths as one round at a time, so the output is the same; only the host sync no longer sits
between two forwards. The policy then decides round j + 1 before round j is read back: it has
seen rounds up to j - 1, each once (Plans). Where the target's forwards are shared with other
sequences (KVState.shared) the first round queues nothing behind it: a queued shared forward may
wait for the others, and the first token would wait with it.

Speed: drafted tokens stay lazy MLX arrays; the target's verify graph is built on them while the
draft computes, the acceptance runs on the device, and a round costs one host sync (d + 2 ints).

Cache invariant after every round: the target's cache holds context[:-1] (the newest committed
token is the next forward's input), plus the positions of a forward queued behind it; a drafter's
state holds some prefix of the context. The loop yields rounds.Steps; the Engine (runtime.py)
turns them into Token / Round / Finished events.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import cast

import mlx.core as mx

from edgespec.acceptance import accept
from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import PLAIN_ONLY, Capabilities, Drafter, Proposal, no_proposal
from edgespec.drafting.review import NO_REVIEWS, Watch
from edgespec.events import Round
from edgespec.rounds import (
    Limits,
    Plan,
    Plans,
    Policy,
    Progress,
    Queued,
    Rounds,
    Step,
    cancelled,
    fed_one,
    is_set,
    run_round,
)
from edgespec.sampling import make_key, round_keys

__all__ = ["Chains", "Limits", "Queued", "speculate", "verify_round"]


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
    `rounds` drafts and finishes each round (Chains, trees.loop.Trees) over `drafter`; `policy`
    plans each round (K, or a tree shape). The target may lag behind by a short prompt tail
    (Strategy.prefill, cache.MERGE_MAX): the first round's forward feeds it and gives the first
    token. `prepare(context)`, if given, brings the drafter's state up to the context before the
    first round that drafts.

    Example: speculate(target, Chains(target, drafter, cfg), drafter, prompt, cfg, FixedK(4),
    limits) drafts K = 4 tokens a round (drafting.adaptive.FixedK)."""
    run, plans = Progress(list(prompt), make_key(cfg.seed), limits), Plans(policy)
    queued: Queued | None = None  # a round whose forward is queued, not yet read back
    try:
        while run.index < limits.max_tokens and not run.stopped:
            if is_set(cancel):
                yield cancelled()
                return
            if queued is None:  # plan and draft a round
                plan = plans.next(run)
                if prepare is not None and rounds.size(plan) > 0:
                    prepare(run.context)
                    prepare = None
                t0 = time.perf_counter()
                run.key, draft_key, verify_key = round_keys(run.key)
                prop = rounds.draft(run, plan, draft_key)
                if prop.size:  # verify, accept, commit: one host sync
                    step = rounds.finish(run, plan, prop, t0, verify_key)
                    run.stopped = step.stop is not None
                    yield step
                    continue
                queued = rounds.queue(run, prop, verify_key)  # a plain step
            # The next round, queued behind this plain step when it needs not its token.
            upcoming = None
            if not queued.prop.size and run.can_queue() and not (target.shared and run.index == 0):
                plan = plans.decide(run)
                ahead = rounds.behind(run, plan)
                if ahead is None or is_set(cancel):
                    plans.ahead = plan  # it drafts from the token: decided, run after the read
                else:
                    run.key, _draft_key, verify_key = round_keys(run.key)
                    upcoming = rounds.queue(run, ahead, verify_key, queued)
            step = rounds.read(run, queued, upcoming)
            run.stopped = step.stop is not None
            queued = None if run.stopped else upcoming
            yield step
    finally:
        target.rewind(run.context, min(target.offset, len(run.context) - 1))
        drafter.commit(run.context)


class Chains:
    """Chain rounds: K tokens from `drafter` (K from the policy), verified in one forward; a round
    that drafts nothing is a plain target step. `watch` sees each plain step (reviews for a policy
    that reads them, drafting/review.py)."""

    def __init__(
        self, target: KVState, drafter: Drafter, cfg: SamplingConfig, watch: Watch = NO_REVIEWS
    ):
        self.target, self.drafter, self.cfg, self.watch = target, drafter, cfg, watch
        self.caps = Capabilities.of(drafter)

    def watched(self, watch: Watch) -> Chains:
        """These rounds with `watch` shown their plain steps (the reviews the policy reads)."""
        return Chains(self.target, self.drafter, self.cfg, watch)

    def size(self, plan: int) -> int:
        return plan

    def draft(self, run: Progress, plan: int, key: mx.array) -> Proposal:
        """The proposal for K = `plan`, lazy (the draft runs while the verify is built); empty:
        a plain step (K <= 0, or a lookup that missed)."""
        k = max(0, min(plan, run.room()))
        if k > 0:
            prop = self.drafter.propose(run.context, k, key)
        elif plan > PLAIN_ONLY and self.caps.free is not None:  # a lookup costs next to nothing
            prop = self.caps.free.propose_free(run.context, key)
        else:
            return no_proposal(self.drafter.method)
        return prop.cut(run.room())  # a lookup may be longer than the room

    def behind(self, run: Progress, plan: int) -> Proposal | None:
        """The proposal of the round after the plain step computing, made without its token: a
        plain step (K <= 0 and no lookup), a lookup one token behind (LooksBehind, cut to the room
        left), or None: the round drafts from that token, after it is read."""
        if plan <= PLAIN_ONLY:
            return no_proposal(self.drafter.method)
        if self.caps.behind is not None:
            prop = self.caps.behind.propose_behind(run.context, plan)
            return None if prop is None else prop.cut(max(0, run.room() - 2))
        plain = plan <= 0 and self.caps.free is None
        return no_proposal(self.drafter.method) if plain else None

    def queue(
        self, run: Progress, prop: Proposal, key: mx.array, before: Queued | None = None
    ) -> Queued:
        """Queue a round's verify over `prop` (a plain step, or a lookup): behind the step
        `before` still computing (its token, lazy, is the pending input), else after the
        committed context. Exact: the proposal depends only on committed tokens, and the ratio
        test does not care how good it is."""
        pending = (
            before.out[-1:]
            if before is not None
            else mx.array(run.context[self.target.offset :], dtype=mx.int32)
        )
        keep: list[mx.array] | None = [] if self.watch.probs else None
        features = self.caps.features is not None
        out, feats = verify_round(self.target, pending, prop, self.cfg, key, features, keep)
        px = keep[0] if keep else None
        mx.async_eval([a for a in (out, feats, px) if a is not None])
        start = before.start if before is not None else time.perf_counter()
        return Queued(prop, out, feats, px, before is not None, start)

    def read(self, run: Progress, queued: Queued, upcoming: Queued | None) -> Step:
        """Read a queued round back (one host sync) and commit it; the target is rewound to
        context[:-1] unless `upcoming` was queued behind it.

        On MLX's CPU backend a read returns only once the forward queued behind it is done too,
        so a run's first interval holds two forwards and its last almost none: only a plain step
        queued behind a plain step with a plain step queued behind it is timed (Round.timed), and
        not one whose interval holds a review's forward (Watch.read)."""
        host = cast(list[int], queued.out.tolist())
        now, prop, (n, value) = time.perf_counter(), queued.prop, host[-2:]
        reviewed = self.watch.read()
        timed = queued.behind and upcoming is not None and not upcoming.prop.size
        timed = timed and not prop.size and not reviewed
        d = prop.size
        rnd = Round(
            index=run.index,
            drafted=d,
            accepted=n,
            k=d,
            t_draft=0.0,
            t_verify=now - queued.start,
            method=prop.method if d else self.drafter.method,
            timed=timed,
            match=prop.match,
            context=len(run.context),
        )
        if upcoming is not None:
            upcoming.start = now
        if not d:
            px = None if queued.px is None else cast(float, queued.px.item())
            self.watch.plain_step(run.context, value, px)
        step = run.commit(self.drafter, host[:n] + [value], rnd, queued.feats)
        if upcoming is None:
            self.target.rewind(run.context, len(run.context) - 1)
        elif step.stop is None:
            self.watch.queue(run.context)  # behind the queued forward: read with the next step
        return step

    def finish(self, run: Progress, plan: int, prop: Proposal, t0: float, key: mx.array) -> Step:
        """Verify and accept a drafted round (one host sync), commit, rewind the target to
        context[:-1]."""
        features = self.caps.features is not None
        timed = fed_one(self.target, run.context)
        out, feats, t_draft, t_verify = run_round(
            self.target, run.context, prop, t0, self.cfg, key, features, verify_round
        )
        d, k = prop.size, max(0, min(plan, run.room()))
        n, nxt = out[d], out[d + 1]
        rnd = Round(
            index=run.index,
            drafted=d,
            accepted=n,
            k=max(k, d),
            t_draft=t_draft,
            t_verify=t_verify,
            method=prop.method,
            timed=timed,
            match=prop.match,
            context=len(run.context),
        )
        step = run.commit(self.drafter, out[:n] + [nxt], rnd, feats)
        self.target.rewind(run.context, len(run.context) - 1)
        return step


def verify_round(
    target: KVState,
    pending: mx.array,
    prop: Proposal,
    cfg: SamplingConfig,
    key: mx.array,
    features: bool = False,
    keep: list[mx.array] | None = None,
) -> tuple[mx.array, mx.array | None]:
    """One target forward over [pending..., x_1..x_d] and the acceptance step, built lazily on the
    (possibly still running) draft; `pending` (int32, may be lazy) are the inputs the cache does not
    hold yet. d = 0 is a plain target step. Returns [x_1..x_d, n_accepted, next_token] as one lazy
    int32 array (the round's only host transfer) and, when `features`, the target's top hidden
    states of the d + 1 verified positions (lazy). `keep`: a plain step appends to it the target's
    probability of the token it samples (lazy; none where the sampler hands the acceptance no
    distribution, at temperature 0), for a review (acceptance.py, reviews)."""
    d = prop.size
    pending = target.settle(pending)  # a restored recurrent cache may catch up first (cache.py)
    inputs = mx.concatenate([pending, prop.tokens]) if d else pending
    feats = None
    if features:
        feats, logits = target.forward_features(inputs)
        feats, logits = feats[-(d + 1) :], logits[-(d + 1) :]
    else:
        logits = target.forward(inputs)[-(d + 1) :]
    n, nxt, p = accept(prop.tokens, prop.q, logits, cfg, key, target.softmax)
    if keep is not None and p is not None and d == 0:
        keep.append(p[0, nxt])
    out = mx.concatenate([prop.tokens, n.reshape(1), nxt.reshape(1)])
    return out.astype(mx.int32), feats
