"""What every round kind shares: the generation's committed state (Progress: commit cuts at EOS /
the limits and rolls the drafter back), the policy's one caller (Plans), the Rounds protocol a
round kind implements (loop.Chains; trees.loop.Trees) and the timing of a drafted round
(run_round). The loop and its chain round, top to bottom, are edgespec/loop.py's.

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

from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import Drafter, FeatureInput, Proposal
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
    once and in order, however far ahead the loop decides; a policy never de-duplicates.
    `ahead` holds a plan decided ahead (behind a plain step) for a round that runs later."""

    def __init__(self, policy: Policy[Plan]):
        self.policy = policy
        self.ahead: Plan | None = None

    def decide(self, run: Progress) -> Plan:
        """A plan now, from everything committed so far."""
        for r in run.fresh:
            self.policy.observe(r)
        run.fresh.clear()
        return self.policy.decide()

    def next(self, run: Progress) -> Plan:
        """The next round's plan: one decided ahead, else a fresh decision."""
        plan, self.ahead = self.ahead, None
        return self.decide(run) if plan is None else plan


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
    """How rounds of one kind are drafted and finished (loop.Chains; trees.loop.Trees). A round
    that drafts nothing is a plain step, queued and read back like a chain round of d = 0."""

    def size(self, plan: Planned) -> int:
        """Tokens the plan drafts (0: a plain step)."""
        ...

    def draft(self, run: Progress, plan: Planned, key: mx.array) -> Proposal:
        """The round's proposal, lazy; empty: a plain step."""
        ...

    def behind(self, run: Progress, plan: Planned) -> Proposal | None:
        """The round's proposal made while the token before it is still computing (a plain step,
        a lookup one token behind), or None: it drafts from that token, once read."""
        ...

    def queue(
        self, run: Progress, prop: Proposal, key: mx.array, before: Queued | None = None
    ) -> Queued:
        """Queue a chain round's verify over `prop` (behind `before`, still computing)."""
        ...

    def read(self, run: Progress, queued: Queued, upcoming: Queued | None) -> Step:
        """Read a queued round back and commit it."""
        ...

    def finish(
        self, run: Progress, plan: Planned, prop: Proposal, t0: float, key: mx.array
    ) -> Step:
        """Verify a drafted `prop` (drafting since t0) with `key`, commit, rewind the target."""
        ...


@dataclass
class Queued:
    """A chain round whose forward is queued: its proposal, lazy output and features
    (loop.verify_round), the target's lazy probability of a plain step's token (`px`, kept for
    reviews), whether it was queued behind a plain step still computing (`behind`), and when its
    interval began (`start`: once queued, or at the read of the step it was queued behind)."""

    prop: Proposal
    out: mx.array
    feats: mx.array | None
    px: mx.array | None
    behind: bool
    start: float


# A round kind's verify: (target, pending, proposal, cfg, key, features) -> (out, features)
# (loop.verify_round; trees.loop.verify_tree_round).
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
    verify: Verify,
) -> tuple[list[int], mx.array | None, float, float]:
    """Verify a proposal whose draft may still be computing; one host sync. `verify`: the round
    kind's (loop.verify_round, trees.loop.verify_tree_round). Returns the host list
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
