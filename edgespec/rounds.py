"""The mechanics of a round, for loop.speculate: one target forward over the pending token and the
drafted ones, the acceptance step, the one host sync, committing what was accepted; and the
scheduler around the rounds: runs of plain steps pipelined like plain decoding (plain_run), and the
one caller of the round policy (Plans). Orchestration only: the maths lives in sampling.py and
acceptance.py.

Speed: drafted tokens stay lazy MLX arrays (async_eval, no .item() per token); the target's verify
graph is built on them while the draft computes, the acceptance runs on the device, and a round
costs one host sync: a transfer of d + 2 integers.

Cache invariant inside a pipelined run: the target's cache may hold the queued forward's positions
too; it is rewound to context[:-1] when the run ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, cast, runtime_checkable

import mlx.core as mx

from edgespec.acceptance import verify, verify_greedy
from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import (
    PLAIN_ONLY,
    Capabilities,
    Drafter,
    FeatureInput,
    Proposal,
    no_proposal,
)
from edgespec.events import Round
from edgespec.sampling import Softmax, round_keys, uniforms, warp

KPolicy = Callable[[Round | None], int]
Plan = TypeVar("Plan")  # what a policy chooses for a round: K (chains) or a Shape (trees)
Chosen = TypeVar("Chosen", covariant=True)  # Plan, as a policy's output


@runtime_checkable
class Policy(Protocol[Chosen]):
    """A round policy that learns from every round: Plans hands it each committed round once, in
    order (`observe`), and asks it for each round's plan (`decide`). AdaptiveK and the tree
    policies are ones; a plain callable `policy(last) -> plan` is wrapped (Newest)."""

    def observe(self, r: Round) -> None: ...

    def decide(self) -> Chosen: ...


class Newest(Generic[Plan]):
    """A callable `fn(last) -> plan` as a Policy: each call gets the newest round committed since
    the previous call, or None (the first round; a plan decided ahead, before anything new was
    read back). Example: rounds 3 and 4 observed, then decide() calls fn(round 4); decide()
    again, with nothing observed since, calls fn(None)."""

    def __init__(self, fn: Callable[[Round | None], Plan]):
        self.fn = fn
        self.new: Round | None = None

    def observe(self, r: Round) -> None:
        self.new = r

    def decide(self) -> Plan:
        last, self.new = self.new, None
        return self.fn(last)


class Plans(Generic[Plan]):
    """The only caller of a generation's round policy. Before each decision it hands the policy
    every round committed since the last one (Progress.fresh), so each round reaches it exactly
    once and in order, however far ahead a pipelined run decides; a policy never de-duplicates.
    `ahead` holds a plan a pipelined run decided for the round after it."""

    def __init__(self, policy: Policy[Plan] | Callable[[Round | None], Plan]):
        self.policy: Policy[Plan] = policy if isinstance(policy, Policy) else Newest(policy)
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
    """Tokens committed by one round (or one plain decoding step), EOS excluded. `stop` is set on the
    last step: "stop" (EOS), "length" (max tokens / context window) or "cancelled"."""

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
    """A generation's committed state, advanced by every round (loop.speculate, plain_run)."""

    context: list[int]  # every committed token, the prompt included
    key: mx.array  # the next round's PRNG key (sampling.round_keys)
    limits: Limits
    emitted: int = 0  # tokens emitted (EOS excluded)
    index: int = 0  # the next round's index
    last: Round | None = None  # the latest committed round
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
        self.index, self.last = self.index + 1, rnd
        self.fresh.append(rnd)
        drafter.commit(self.context)
        return Step(toks, kinds, rnd, stop)


def accept(
    prop: Proposal,
    logits: mx.array,
    cfg: SamplingConfig,
    key: mx.array,
    softmax: Softmax | None = None,
):
    """The acceptance step on the target's logits [d + 1, V] of the pending token and the d
    drafted ones: (n_accepted, next_token), lazy. d = 0 is a plain target step. `softmax`: the
    target's (KVState.softmax) for warping."""
    if cfg.greedy:
        return verify_greedy(prop.tokens, logits)
    p = warp(logits, cfg, softmax)
    return verify(prop.tokens, prop.q, p, uniforms(key, prop.size + 1))


def verify_round(
    target: KVState,
    pending: mx.array,
    prop: Proposal,
    cfg: SamplingConfig,
    key: mx.array,
    features: bool = False,
) -> tuple[mx.array, mx.array | None]:
    """One target forward over [pending..., x_1..x_d] and the acceptance step, built lazily on the
    (possibly still running) draft; `pending` (int32, may be lazy) are the inputs the cache does not
    hold yet. Returns [x_1..x_d, n_accepted, next_token] as one lazy int32 array (the round's only
    host transfer) and, when `features`, the target's top hidden states of the d + 1 verified
    positions (lazy)."""
    d = prop.size
    pending = target.settle(pending)  # a restored recurrent cache may catch up first (cache.py)
    inputs = mx.concatenate([pending, prop.tokens])
    feats = None
    if features:
        feats, logits = target.forward_features(inputs)
        feats, logits = feats[-(d + 1) :], logits[-(d + 1) :]
    else:
        logits = target.forward(inputs)[-(d + 1) :]
    n, nxt = accept(prop, logits, cfg, key, target.softmax)
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


@dataclass(frozen=True)
class Queued:
    """A step whose forward is queued: its proposal, lazy output and features (verify_round)."""

    prop: Proposal
    out: mx.array
    feats: mx.array | None


def _queue(
    target: KVState,
    run: Progress,
    cfg: SamplingConfig,
    pending: mx.array,
    prop: Proposal,
    feats: bool,
) -> Queued:
    """Queue one step's forward (the d = 0 round speculate would run, or a lookup's), with the
    same keys as that round: a round's draft key goes unused here."""
    run.key, _draft_key, verify_key = round_keys(run.key)
    out, features = verify_round(target, pending, prop, cfg, verify_key, feats)
    mx.async_eval([a for a in (out, features) if a is not None])
    return Queued(prop, out, features)


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
    """Consecutive plain steps, pipelined like decode_plain: before a step's token is read back,
    the policy picks the next round's plan (`size`: its drafted tokens, 0 for a plain step) and,
    while that is a plain step, the next step's forward is queued. Each step is exactly the d = 0
    round speculate would run (same keys, same maths), so the output is unchanged; only the host
    sync no longer sits between two forwards. The policy decides round j + 1 before round j is
    read back: it has then seen rounds up to j - 1, each once (Plans).

    `caps`: the drafter's (Capabilities.of, looked up once per generation). A drafter that looks
    behind (LooksBehind: an n-gram lookup) keeps the run going whatever is
    chosen, as long as it proposes (not None): the tokens after the one still being computed, from
    the context without it. A non-empty proposal is queued with that token, as one forward
    [pending, x_1..x_d] verified like any round; the run ends on it. Exact: the proposal depends
    only on committed tokens, and the ratio test does not care how good it is.

    Yields Steps; leaves a plan already chosen for the next round in plans.ahead. Sets
    run.stopped when it yielded the generation's final Step. Not `pipelined`: one step, read
    back before any other forward is queued (a generation's first token: in a packed batch a
    queued forward waits for the others' turn)."""
    wants = caps.features is not None
    queued = _queue(
        target,
        run,
        cfg,
        mx.array(run.context[target.offset :], dtype=mx.int32),
        no_proposal(drafter.method),
        wants,
    )
    t_prev, first = time.perf_counter(), True
    while True:
        decided, upcoming = None, None
        if pipelined and not queued.prop.size and run.can_queue():
            decided = plans.decide(run)
            ahead = _ahead(caps, drafter.method, run, size(decided))
            if ahead is not None and not is_set(cancel):
                upcoming = _queue(target, run, cfg, queued.out[-1:], ahead, wants)
                decided = None if ahead.size else decided  # decided after that round is read
        host = cast(list[int], queued.out.tolist())
        now, prop, (n, value) = time.perf_counter(), queued.prop, host[-2:]
        # On MLX's CPU backend a read returns only once the forward queued behind it is done too,
        # so a run's first interval holds two forwards and its last almost none: only a plain
        # step with a plain step queued behind it, not the run's first, is timed (Round.timed).
        timed = not prop.size and upcoming is not None and not upcoming.prop.size and not first
        method = prop.method if prop.size else drafter.method
        d, at = prop.size, len(run.context)
        rnd = Round(run.index, d, n, d, 0.0, now - t_prev, method, timed, prop.match, context=at)
        t_prev, first = now, False
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
        queued = upcoming


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
