"""One round of speculative decoding, top to bottom: plan (the policy's K, through Plans), draft
(Chains.draft; draft trees: edgespec/trees/loop.py), verify (verify_round: one target forward over
the pending token and the drafts), accept (acceptance.accept: the ratio test, or the longest
agreeing prefix at temperature 0), commit (Progress.commit: cut at EOS / the limits, the drafter
rolled back). A round with nothing drafted (K = 0) is a plain target step; plain decoding is rounds
of K = 0 (drafting.adaptive.FixedK(PLAIN_ONLY)). The generation around the rounds, and the pipelining of runs of
plain steps, is edgespec/loop.py's.

Speed: drafted tokens stay lazy MLX arrays (async_eval, no .item() per token); the target's verify
graph is built on them while the draft computes, the acceptance runs on the device, and a round
costs one host sync: a transfer of d + 2 integers.

Cache invariant after every round: the target's cache holds context[:-1] (the newest committed
token is the next forward's input); a drafter's state holds some prefix of the context.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, cast

import mlx.core as mx

from edgespec.acceptance import Review, accept
from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import PLAIN_ONLY, Capabilities, Drafter, FeatureInput, Proposal
from edgespec.events import Round

Plan = TypeVar("Plan")  # what a policy chooses for a round: K (chains) or a Shape (trees)
Chosen = TypeVar("Chosen", covariant=True)  # Plan, as a policy's output
Planned = TypeVar("Planned", contravariant=True)  # Plan, as the rounds' input


class Policy(Protocol[Chosen]):
    """A round policy: shown every committed round once, in order (`observe`), asked for each
    round's plan (`decide`). FixedK and AdaptiveK (drafting/adaptive.py), the tree shape policies
    (trees/policy.py) and a server batch's Gated (server/mode.py) are ones."""

    def observe(self, r: Round) -> None: ...

    def decide(self) -> Chosen: ...


class Plans(Generic[Plan]):
    """The only caller of a generation's round policy. Before each decision it hands the policy
    every round committed since the last one (Progress.fresh), so each round reaches it exactly
    once and in order, however far ahead a pipelined run decides; a policy never de-duplicates.
    `ahead` holds a plan a pipelined run decided for the round after it. `reviews`: the drafter
    can review (acceptance.py, reviews) and the policy reads reviews (`review(r)`, `review_due()`:
    AdaptiveK); they reach it like rounds (Progress.reviews), before the rounds of the same
    decision."""

    def __init__(self, policy: Policy[Plan], reviews: bool = False):
        self.policy = policy
        self.ahead: Plan | None = None
        self.reviews = reviews and callable(getattr(policy, "review", None))
        if self.reviews:
            cast(Reviewing, policy).review_on()

    def decide(self, run: Progress) -> Plan:
        """A plan now, from everything committed so far."""
        for review in run.reviews:
            cast(Reviewing, self.policy).review(review)
        run.reviews.clear()
        for r in run.fresh:
            self.policy.observe(r)
        run.fresh.clear()
        return self.policy.decide()

    def next(self, run: Progress) -> Plan:
        """The next round's plan: one decided ahead, else a fresh decision."""
        plan, self.ahead = self.ahead, None
        return self.decide(run) if plan is None else plan

    def review_due(self) -> bool:
        """Whether the drafter should review the tokens committed since it last drafted."""
        return self.reviews and cast(Reviewing, self.policy).review_due()

    def lookup_review_due(self) -> bool:
        """Whether a hybrid's lookups are off and their guesses should be reviewed."""
        return self.reviews and cast(Reviewing, self.policy).lookup_review_due()


class Reviewing(Protocol):
    """A policy that reads reviews (acceptance.py, reviews) in place of probe rounds: AdaptiveK."""

    def review_on(self) -> None: ...

    def review(self, r: Review) -> None: ...

    def review_due(self) -> bool: ...

    def lookup_review_due(self) -> bool: ...


@dataclass(frozen=True)
class Limits:
    """When generation stops: max_tokens emitted, an EOS id, or the context window full."""

    max_tokens: int
    eos: frozenset[int]
    context_window: int


@dataclass(frozen=True)
class Step:
    """Tokens committed by one round, EOS excluded. `stop` is set on the last step: "stop" (EOS),
    "length" (max tokens / context window) or "cancelled"."""

    tokens: list[int]
    kinds: list[str]
    round: Round | None = None
    stop: str | None = None


def cancelled() -> Step:
    """The last Step of a generation stopped by its caller."""
    return Step([], [], stop="cancelled")


def is_set(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


def truncate(new: list[int], kinds: list[str], emitted: int, limits: Limits, context: list[int]):
    """Cut a round's commits at EOS / max_tokens. Returns (tokens to emit, their kinds, committed
    tokens incl. EOS, stop reason or None)."""
    out: list[int] = []
    for i, tok in enumerate(new):
        if tok in limits.eos:
            return out, kinds[: len(out)], new[: i + 1], "stop"
        out.append(tok)
        if emitted + len(out) >= limits.max_tokens:
            return out, kinds[: len(out)], new[: i + 1], "length"
    if len(context) + len(new) + 1 > limits.context_window:
        return out, kinds, new, "length"
    return out, kinds, new, None


def round_kinds(n: int, drafted: int) -> list[str]:
    """Kinds of a round's n accepted drafts and its final token: the target's own step when nothing
    was drafted, a bonus after all drafts passed, else the correction at the first rejection."""
    last = "target" if drafted == 0 else "bonus" if n == drafted else "corrected"
    return ["accepted"] * n + [last]


@dataclass
class Progress:
    """A generation's committed state, advanced by every round."""

    context: list[int]  # every committed token, the prompt included
    key: mx.array  # the next round's PRNG key (sampling.round_keys)
    limits: Limits
    emitted: int = 0  # tokens emitted (EOS excluded)
    index: int = 0  # the next round's index
    stopped: bool = False  # the final Step was yielded
    fresh: list[Round] = field(default_factory=list)  # committed, not yet shown to the policy
    reviews: list[Review] = field(default_factory=list)  # read, not yet shown to the policy
    # Plain steps' target probabilities of their sampled tokens, by position, for a review.
    probs: dict[int, float] = field(default_factory=dict)

    def room(self) -> int:
        """Tokens one verify may still add within the context window."""
        return self.limits.context_window - len(self.context)

    def can_queue(self) -> bool:
        """Whether another plain step may be queued behind the one being computed."""
        more = max(self.emitted, self.index) + 1 < self.limits.max_tokens
        return more and len(self.context) + 2 <= self.limits.context_window

    def commit(
        self, drafter: Drafter, new: list[int], rnd: Round, feats: mx.array | None = None
    ) -> Step:
        """Commit one verified round's tokens: cut at EOS / the limits, hand a feature draft the
        features of the verified positions whose input is committed (`feats`, verified only for a
        FeatureInput drafter), roll the drafter back to the committed context. The target's cache
        is the caller's to rewind."""
        kinds = round_kinds(rnd.accepted, rnd.drafted)
        toks, kinds, committed, stop = truncate(new, kinds, self.emitted, self.limits, self.context)
        if feats is not None:
            cast(FeatureInput, drafter).take_features(
                self.context + committed, len(self.context) - 1, feats[: len(committed)]
            )
        self.context += committed
        self.emitted += len(toks)
        self.index += 1
        self.fresh.append(rnd)
        drafter.commit(self.context)
        return Step(toks, kinds, rnd, stop)


class Rounds(Protocol[Planned]):
    """How rounds of one kind are drafted and finished (Chains; trees.loop.Trees), and what their
    drafter can do (`caps`)."""

    caps: Capabilities

    def size(self, plan: Planned) -> int:
        """Tokens the plan drafts (0: a plain step)."""
        ...

    def draft(self, run: Progress, plan: Planned, key: mx.array) -> Proposal | None:
        """The round's proposal, or None: plain steps, pipelined (loop.plain_run)."""
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
        """The proposal for K = `plan`, lazy (the draft runs while the verify is built), or None:
        plain steps, pipelined."""
        if plan <= PLAIN_ONLY:  # plain steps, pipelined, no lookups
            return None
        k = max(0, min(plan, run.room()))
        if k > 0:
            prop = self.drafter.propose(run.context, k, key)
        elif self.caps.free is not None:  # drafting is off, but a lookup costs next to nothing
            prop = self.caps.free.propose_free(run.context, key)
        else:  # drafting is off: plain steps, pipelined
            return None
        prop = prop.cut(run.room())  # a lookup may be longer than the room
        # A lookup missed: plain steps, pipelined, looking up one token behind meanwhile.
        return None if prop.size == 0 and self.caps.behind is not None else prop

    def finish(self, run: Progress, plan: int, prop: Proposal, t0: float, key: mx.array) -> Step:
        """Verify and accept (one host sync), commit, rewind the target to context[:-1]."""
        features = self.caps.features is not None
        timed = fed_one(self.target, run.context)
        out, feats, t_draft, t_verify = run_round(
            self.target, run.context, prop, t0, self.cfg, key, features
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
            method=prop.method if d else self.drafter.method,
            timed=timed,
            match=prop.match if d else 0,
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
    states of the d + 1 verified positions (lazy). `keep`: a plain step at T > 0 appends to it
    the target's probability of the token it samples (lazy), for a review (acceptance.py, reviews)."""
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


# verify_round's signature: (target, pending, proposal, cfg, key, features) -> (out, features);
# the tree loop passes its own (edgespec/trees/loop.py).
Verify = Callable[..., tuple[mx.array, mx.array | None]]


def fed_one(target: KVState, context: list[int]) -> bool:
    """Whether a round's verify feeds only the newest committed token besides its drafts (not a
    prompt tail as well, Strategy.prefill): only then is its time a verify's cost (Round.timed)."""
    return len(context) - target.offset == 1


def run_round(
    target: KVState,
    context: list[int],
    prop: Proposal,
    t0: float,
    cfg: SamplingConfig,
    key: mx.array,
    features: bool,
    verify: Verify = verify_round,
) -> tuple[list[int], mx.array | None, float, float]:
    """Verify a proposal whose draft may still be computing; one host sync. Returns the host list
    [x_1..x_d, n_accepted, next_token] (`verify`'s output), the features (or None), t_draft,
    t_verify.

    The verify's graph is built while the draft computes (on Metal the GPU runs the draft while
    the CPU builds the target graph; a sync in between would leave the device idle for that long),
    and queued before the draft's tokens are awaited. The round's time is split by marginal cost:
    t_verify = building the verify + waiting for it after the draft was ready, t_draft = the rest
    (the draft's time not hidden behind the verify's building), so t_draft + t_verify is the
    round's time and t_draft > 0."""
    drafted = [a for a in (prop.tokens, prop.q) if a is not None]
    mx.async_eval(drafted)  # its own event: awaiting it below waits for the draft alone
    t_built_draft = time.perf_counter()
    pending = mx.array(context[target.offset :], dtype=mx.int32)
    out, feats = verify(target, pending, prop, cfg, key, features)
    mx.async_eval([a for a in (out, feats) if a is not None])
    t_built_verify = time.perf_counter()
    mx.eval(drafted)
    t_draft_ready = time.perf_counter()
    host = cast(list[int], out.tolist())
    t_draft = (t_draft_ready - t0) - (t_built_verify - t_built_draft)
    return host, feats, t_draft, time.perf_counter() - t0 - t_draft
