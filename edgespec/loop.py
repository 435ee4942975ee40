"""The draft-verify loop: one round generator for every speculative method. It orchestrates and
decides nothing itself: drafters propose (edgespec/drafting/), the maths accepts (sampling.py,
acceptance.py), rounds.py runs a round and schedules around it.

`speculate` runs rounds of one kind (`Rounds`): chains here (`Chains`: K drafted tokens in a row),
draft trees in edgespec/trees/loop.py (`Trees`). Each round: the plan (K or a tree shape) from the
policy through rounds.Plans, a proposal, one target forward verifying it, the accepted prefix plus
a correction or bonus committed. A round with nothing to draft (K = 0, an empty shape, a lookup
that missed) goes to the scheduler around the rounds, rounds.plain_run, which pipelines plain steps
(and lookups one token behind) like plain decoding; Plans alone shows each round to the policy,
once.

Cache invariant after every round: the target's cache holds context[:-1] (the newest committed token
is the next forward's input); a drafter's state holds some prefix of the context. The loops yield
`Step`s; the Engine (runtime.py) turns them into Token / Round / Finished events.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import mlx.core as mx

from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import PLAIN_ONLY, Capabilities, Drafter, Proposal
from edgespec.events import Round
from edgespec.rounds import (
    Limits,
    Plan,
    Plans,
    Policy,
    Progress,
    Step,
    cancelled,
    fed_one,
    is_set,
    plain_run,
    run_round,
    truncate,
)
from edgespec.sampling import make_key, round_keys, sample, split, uniforms, warp

Planned = TypeVar("Planned", contravariant=True)  # Plan, as the rounds' input

__all__ = ["Chains", "Limits", "Rounds", "Step", "decode_plain", "speculate"]


class Rounds(Protocol[Planned]):
    """How rounds of one kind are drafted and finished (Chains; trees.loop.Trees), and what their
    drafter can do (`caps`)."""

    caps: Capabilities

    def size(self, plan: Planned) -> int:
        """Tokens the plan drafts (0: a plain step)."""
        ...

    def draft(self, run: Progress, plan: Planned, key: mx.array) -> Proposal | None:
        """The round's proposal, or None: plain steps, pipelined (rounds.plain_run)."""
        ...

    def finish(
        self, run: Progress, plan: Planned, prop: Proposal, t0: float, key: mx.array
    ) -> Step:
        """Verify `prop` (drafting since t0) with `key`, commit the round, rewind the target."""
        ...


class Chains:
    """Chain rounds: K tokens from `drafter` (K from the policy), verified in one forward."""

    def __init__(self, target: KVState, drafter: Drafter, cfg: SamplingConfig):
        self.target, self.drafter, self.cfg = target, drafter, cfg
        self.caps = Capabilities.of(drafter)

    def size(self, plan: int) -> int:
        return plan

    def draft(self, run: Progress, plan: int, key: mx.array) -> Proposal | None:
        if plan <= PLAIN_ONLY:  # plain steps, pipelined, no lookups
            return None
        k = max(0, min(plan, run.room()))
        if k > 0:
            prop = self.drafter.propose(run.context, k, key)  # lazy: the draft runs meanwhile
        elif self.caps.free is not None:  # drafting is off, but a lookup costs next to nothing
            prop = self.caps.free.propose_free(run.context, key)
        else:  # drafting is off: plain steps, pipelined
            return None
        prop = prop.cut(run.room())  # a lookup may be longer than the room
        # A lookup missed: plain steps, pipelined, looking up one token behind meanwhile.
        return None if prop.size == 0 and self.caps.behind is not None else prop

    def finish(self, run: Progress, plan: int, prop: Proposal, t0: float, key: mx.array) -> Step:
        features = self.caps.features is not None
        timed = fed_one(self.target, run.context)
        out, feats, t_draft, t_verify = run_round(
            self.target, run.context, prop, t0, self.cfg, key, features
        )
        d, k = prop.size, max(0, min(plan, run.room()))
        n, nxt = out[d], out[d + 1]
        method, match = (prop.method, prop.match) if d else (self.drafter.method, 0)
        rnd = Round(
            run.index,
            d,
            n,
            max(k, d),
            t_draft,
            t_verify,
            method,
            timed,
            match,
            context=len(run.context),
        )
        step = run.commit(self.drafter, out[:n] + [nxt], rnd, feats)
        self.target.rewind(run.context, len(run.context) - 1)
        return step


def speculate(
    target: KVState,
    rounds: Rounds[Plan],
    drafter: Drafter,
    prompt: list[int],
    cfg: SamplingConfig,
    policy: Policy[Plan] | Callable[[Round | None], Plan],
    limits: Limits,
    cancel: threading.Event | None = None,
    prepare: Callable[[list[int]], object] | None = None,
) -> Iterator[Step]:
    """Speculative decoding. Both states must already hold a prefix of `prompt` (Engine.prefill).
    `rounds` drafts and finishes each round (Chains, trees.loop.Trees) over `drafter`; `policy`
    plans each round (K, or a tree shape): a rounds.Policy, or a callable `policy(last) -> plan`.
    The target may lag behind by a short prompt tail (Strategy.prefill, cache.MERGE_MAX): the
    first round's forward feeds it and gives the first token. In a packed batch (the target has
    a packer, edgespec/server/packing.py) a first round that drafts nothing reads its token back
    before queueing another forward: a queued forward waits for the others' turn, and the first
    token would wait with it. `prepare(context)`, if given, brings the drafter's state up to the
    context before the first round that drafts (a token draft's prefill, left until then in a
    packed batch, which may decode plainly for a while).

    Example: speculate(target, Chains(target, drafter, cfg), drafter, prompt, cfg,
    lambda _last: 4, limits) drafts K = 4 tokens a round."""
    run = Progress(list(prompt), make_key(cfg.seed), limits)
    plans: Plans[Plan] = Plans(policy)
    caps, first = rounds.caps, target.packer is not None
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
                pipelined, first = not first, False  # packed: the first token read at once
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


def decode_plain(
    target: KVState,
    prompt: list[int],
    cfg: SamplingConfig,
    limits: Limits,
    cancel: threading.Event | None = None,
) -> Iterator[Step]:
    """Plain target decoding through the same caches, pipelined like mlx-lm: the next token's
    forward is queued (async_eval) before the current token is read back; in a packed batch
    (the target has a packer, edgespec/server/packing.py) from the second token on, since a
    queued forward waits for the others' turn and the first token would wait with it."""
    context, key = list(prompt), make_key(cfg.seed)

    def step(inputs: mx.array) -> mx.array:
        nonlocal key
        key, sample_key = split(key, 2)
        logits = target.forward(inputs)[-1]
        if cfg.greedy:
            return mx.argmax(logits).astype(mx.int32)
        return sample(warp(logits, cfg, target.softmax), uniforms(sample_key, 1)[0])

    try:
        tok = step(mx.array(context[target.offset :], dtype=mx.int32))
        mx.async_eval(tok)
        for emitted in range(1, limits.max_tokens + 1):
            if is_set(cancel):
                yield cancelled()
                return
            room = emitted < limits.max_tokens and len(context) + 2 <= limits.context_window
            upcoming = None
            if room and (emitted > 1 or target.packer is None):
                upcoming = step(tok.reshape(1))
                mx.async_eval(upcoming)
            value = int(tok.item())  # type: ignore[arg-type]
            toks, kinds, committed, stop = truncate(
                [value], ["target"], emitted - 1, limits, context
            )
            context += committed
            yield Step(toks, kinds, None, stop or (None if room else "length"))
            if stop or not room:
                return
            if upcoming is None:
                upcoming = step(tok.reshape(1))
                mx.async_eval(upcoming)
            tok = upcoming
    finally:
        target.rewind(context, min(target.offset, len(context) - 1))
