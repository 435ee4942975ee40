"""The draft-verify loop: it orchestrates (draft, one target forward, acceptance, rewind) and holds
no maths itself (that lives in sampling.py and acceptance.py).

Cache invariant after every round: the target's cache holds context[:-1] (the newest committed token
is the next forward's input); a drafter's state holds some prefix of the context (see ModelDrafter).
Both loops yield `Step`s; the Engine (runtime.py) turns them into Token / Round / Finished events.
Speed: drafted tokens stay lazy MLX arrays (async_eval, no .item() per token); the target's verify
graph is built on them while the draft computes, the acceptance runs on the device, and the round
costs one host sync: a transfer of K + 2 integers. Runs of K = 0 rounds (adaptive K switched the
draft off) and of n-gram misses are pipelined like plain decoding: the next forward is queued
before that sync; an n-gram drafter meanwhile looks up one token behind, and a match is verified
in the queued forward itself (_plain_run).
Cache invariant inside such a run: the target's cache may hold the queued forward's positions
too; it is rewound to context[:-1] when the run ends.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from edgespec.acceptance import verify, verify_greedy
from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.cpu import blas
from edgespec.cpu.attention import cpu_switch
from edgespec.drafting.draft_model import reduced_head
from edgespec.events import Round
from edgespec.sampling import make_key, round_keys, sample, split, uniforms, warp


@dataclass(frozen=True)
class Proposal:
    """A drafter's guess for the next k tokens. tokens [k] int32 (may be lazy); q [k, V] the warped
    draft distributions they were drawn from, or None for point masses (a deterministic proposal,
    e.g. n-gram lookup, or any drafter at temperature 0)."""

    tokens: mx.array
    q: mx.array | None


class Drafter(Protocol):
    """Who proposes tokens. `method` is reported in Round events ("draft", "ngram", ...)."""

    method: str

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        """Propose up to k tokens to follow `context` (all committed tokens); fewer (even none:
        the round is then a plain target step) when the drafter has no good guess. `key` seeds any
        sampling: draw `uniforms(key, k)` to stay in step with the numpy reference."""
        ...

    def commit(self, context: list[int]) -> None:
        """Called after every round with the committed context: roll back anything past it."""
        ...

    # Optional: `propose_free(context, key) -> Proposal`, tokens that cost next to nothing (an
    # n-gram lookup), made in rounds where the K policy chose K = 0 (HybridDrafter has one); the
    # loop cuts it to the room left in the context window, like any proposal.
    # Optional: `propose_behind(context, k) -> list[int] | None`, point-mass proposals for the
    # positions after len(context) + 1, made while the token at len(context) is still being
    # computed (loop._plain_run; NgramDrafter, HybridDrafter); None ends the pipelined run. A
    # drafter with one runs its misses (a round with nothing proposed) pipelined.
    # Optional: `wants_features = True` plus `take_features(context, start, features)`: a feature
    # draft (edgespec.drafting.eagle) is handed the target's top hidden states of each round's committed
    # positions start .. start + len(features) - 1 of `context`, the committed context.


def no_proposal() -> Proposal:
    """K = 0: nothing drafted, the round is a plain target step."""
    return Proposal(mx.array([], dtype=mx.int32), None)


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


def pairs_enabled() -> bool:
    """Whether draft steps run two positions instead of one (ModelDrafter): on MLX's CPU backend
    under Intel MKL (whose one-row products run on one thread; OpenBLAS's two-row ones are the
    slower), or everywhere on the CPU with EDGESPEC_DRAFT_PAIRS=1; off with EDGESPEC_DRAFT_PAIRS=0."""
    if not cpu_switch("EDGESPEC_DRAFT_PAIRS"):
        return False
    return os.environ.get("EDGESPEC_DRAFT_PAIRS") == "1" or blas.active() in ("mkl", "mkl-fast")


def fit_vocab(logits: mx.array, vocab: int) -> mx.array:
    """Cut or -inf-pad draft logits [..., Vd] to the target's width V (padded embedding tables)."""
    width = logits.shape[-1]
    if width == vocab:
        return logits
    if width > vocab:
        return logits[..., :vocab]
    pad = mx.full((*logits.shape[:-1], vocab - width), -mx.inf, dtype=logits.dtype)
    return mx.concatenate([logits, pad], axis=-1)


class ModelDrafter:
    """Drafts with a small model and its own KV cache.

    Its cache holds a prefix of the context; the tokens after it (`pending`) are fed at the start of
    the next proposal. Usually one token, two after a bonus round: the draft never ran its K-th
    drafted token, which the target then accepted.

    A draft with a reduced output head (EdgeSpec's own drafts: `head_logits` + `head_ids`) is run
    head-only: argmax, warp and sampling over its H head columns instead of the full vocabulary,
    and q is scattered to the vocabulary once per round. Same tokens and same q as the full-width
    path (off-head tokens have q = 0 either way; head ids are sorted, so the inverse-CDF sample and
    the argmax tie-break pick the same token), for a fraction of the per-token work.

    Draft steps in pairs (`pairs`: MLX's CPU backend under MKL, `pairs_enabled`): a step with
    one new token runs the newest cached position again beside it, so that every draft forward
    multiplies two rows. Intel MKL runs a one-row product on one thread and a two-row one on both
    (edgespec/rowpad.py), so on the 2-core machines we measure on the two-position step is the
    faster one (in the loop: 4.0 ms against 5.7 ms for the embedded draft). The rerun position
    gets the same keys and values back (up to the BLAS's rounding); the proposal is still drawn
    from, and verified against, the q the draft computed, so output is unchanged whatever the
    draft computes.
    """

    method = "draft"

    def __init__(self, state: KVState, sampling: SamplingConfig, vocab: int):
        self.state, self.sampling, self.vocab = state, sampling, vocab
        self.head_ids = reduced_head(state.model)
        self.pairs = pairs_enabled()

    def _logits(self, inputs: mx.array) -> mx.array:
        if self.head_ids is not None:
            return self.state.forward(inputs, head_only=True)[-1]
        return fit_vocab(self.state.forward(inputs)[-1], self.vocab)

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        state, pairs = self.state, self.pairs
        if pairs and len(context) - state.offset == 1 and state.offset > 0:
            state.rewind(context, state.offset - 1)  # run the newest cached position again
        inputs = mx.array(context[state.offset :], dtype=mx.int32)
        u = None if self.sampling.greedy else uniforms(key, k)
        tokens: list[mx.array] = []
        rows: list[mx.array] = []
        for i in range(k):
            if i > 0:
                if pairs:  # [the previous input, the token drafted from it] over the last one
                    trim_prompt_cache(state.cache, 1)
                    inputs = mx.concatenate([inputs[-1:], tokens[-1].reshape(1)])
                else:
                    inputs = tokens[-1].reshape(1)
            tok = pick_token(self._logits(inputs), self.sampling, u, i, self.head_ids, rows)
            tokens.append(tok)
            mx.async_eval(tok)
        return Proposal(mx.stack(tokens), self._full_q(rows) if rows else None)

    def _full_q(self, rows: list[mx.array]) -> mx.array:
        return full_q(rows, self.head_ids, self.vocab)

    def commit(self, context: list[int]) -> None:
        self.state.rewind(context, min(self.state.offset, len(context) - 1))


def pick_token(
    logits: mx.array,
    sampling: SamplingConfig,
    u: mx.array | None,
    i: int,
    head_ids: mx.array | None,
    rows: list[mx.array],
) -> mx.array:
    """The i-th drafted token from one row of draft logits (lazy): argmax at temperature 0,
    else an inverse-CDF sample with uniform u[i] from the warped row, which is appended to `rows`
    (the drafted q). A reduced-head draft's column index is mapped to its token id."""
    if u is None:
        tok = mx.argmax(logits).astype(mx.int32)
    else:
        rows.append(warp(logits, sampling))
        tok = sample(rows[-1], u[i])
    return tok if head_ids is None else head_ids[tok]


def full_q(rows: list[mx.array], head_ids: mx.array | None, vocab: int) -> mx.array:
    """Stack drafted q rows; a reduced head's rows are scattered to the vocabulary (0 elsewhere)."""
    q = mx.stack(rows)
    if head_ids is None:
        return q
    full = mx.zeros((q.shape[0], vocab), dtype=q.dtype)
    full[:, head_ids] = q
    return full


def _truncate(new: list[int], kinds: list[str], emitted: int, limits: Limits, context: list[int]):
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


def _last_kind(n: int, drafted: int) -> str:
    """Kind of a round's final token: the target's own step when nothing was drafted, a bonus
    after all drafts passed, else the correction at the first rejection."""
    return "target" if drafted == 0 else "bonus" if n == drafted else "corrected"


def _accept(
    prop: Proposal, logits: mx.array, cfg: SamplingConfig, key
) -> tuple[mx.array, mx.array]:
    """The acceptance step on the target's logits [K + 1, V] of the pending token and the K
    drafted ones: (n_accepted, next_token), lazy. K = 0 is a plain target step."""
    if cfg.greedy:
        return verify_greedy(prop.tokens, logits)
    k = int(prop.tokens.shape[0])
    return verify(prop.tokens, prop.q, warp(logits, cfg), uniforms(key, k + 1))


def _verify_round(
    target: KVState,
    pending: mx.array,
    prop: Proposal,
    k: int,
    cfg: SamplingConfig,
    key,
    features: bool = False,
) -> tuple[mx.array, mx.array | None]:
    """One target forward over [pending..., x_1..x_K] and the acceptance step, built lazily on the
    (possibly still running) draft; `pending` (int32, may be lazy) are the inputs the cache does not
    hold yet. Returns [x_1..x_K, n_accepted, next_token] as one lazy int32 array (the round's only
    host transfer) and, when `features`, the target's top hidden states of the K + 1 verified
    positions (lazy). K = 0 is a plain target step."""
    inputs = mx.concatenate([pending, prop.tokens])
    feats = None
    if features:
        from edgespec.drafting.eagle import target_features

        feats, logits = target_features(target.model, inputs, target.cache)
        feats, logits = feats[-(k + 1) :], logits[-(k + 1) :]
    else:
        logits = target.forward(inputs)[-(k + 1) :]
    n, nxt = _accept(prop, logits, cfg, key)
    out = mx.concatenate([prop.tokens, n.reshape(1), nxt.reshape(1)])
    return out.astype(mx.int32), feats


def _run_round(
    target: KVState,
    context: list[int],
    prop: Proposal,
    d: int,
    t0: float,
    cfg: SamplingConfig,
    key,
    features: bool,
) -> tuple[list[int], mx.array | None, float, float]:
    """Verify a proposal of d tokens whose draft may still be computing; one host sync. Returns
    the host list [x_1..x_d, n_accepted, next_token], the features (or None), t_draft, t_verify.

    The verify's graph is built while the draft computes (on Metal the GPU runs the draft while
    the CPU builds the 30-layer target graph; a sync in between would leave the device idle for
    that long), and queued before the draft's tokens are awaited. The round's time is split by
    marginal cost: t_verify = building the verify + waiting for it after the draft was ready,
    t_draft = the rest (the draft's time not hidden behind the verify's building), so
    t_draft + t_verify is the round's time and t_draft > 0."""
    drafted = [a for a in (prop.tokens, prop.q) if a is not None]
    mx.async_eval(drafted)  # its own event: awaiting it below waits for the draft alone
    t_built_draft = time.perf_counter()
    pending = mx.array(context[target.offset :], dtype=mx.int32)
    out, feats = _verify_round(target, pending, prop, d, cfg, key, features)
    mx.async_eval([a for a in (out, feats) if a is not None])
    t_built_verify = time.perf_counter()
    mx.eval(drafted)
    t_draft_ready = time.perf_counter()
    host = [int(v) for v in out.tolist()]  # type: ignore[union-attr,arg-type]
    t_draft = (t_draft_ready - t0) - (t_built_verify - t_built_draft)
    return host, feats, t_draft, time.perf_counter() - t0 - t_draft


def _plain_run(
    target: KVState,
    drafter: Drafter,
    context: list[int],
    key: mx.array,
    cfg: SamplingConfig,
    choose_k: Callable[[Round | None], int],
    last: Round | None,
    limits: Limits,
    cancel: threading.Event | None,
    index: int,
    emitted: int,
):
    """Consecutive plain steps, pipelined like decode_plain: before a step's token is read back,
    the policy picks the next round's K and, while that is 0, the next step's forward is queued.
    Each step is exactly the d = 0 round speculate would run (same keys, same maths: the target's
    token at position len(context), through `_verify_round` with nothing drafted), so
    the output is unchanged; only the host sync no longer sits between two forwards. The policy
    decides round j + 1 before round j is read back, so it is shown round j - 1 then: rounds reach
    it in order, the one before a run twice in a row (a policy must count a repeat once, as
    AdaptiveK does), the last of a run not at all.

    A drafter with `propose_behind` (an n-gram lookup) keeps the run going whatever K is chosen,
    as long as it says so (a list, not None): it proposes the tokens after the one still being
    computed, from the context without it. A non-empty proposal is queued with that token, as one
    forward [pending, x_1..x_d] verified like any round; the run ends on it (how many tokens it
    commits is known only once it is read back). Exact: the proposal depends only on committed
    tokens, and the ratio test does not care how good it is.

    Generator of Steps; returns (key, last round, next index, emitted, the K already chosen for the
    next round or None, whether the run yielded the final Step)."""

    wants = bool(getattr(drafter, "wants_features", False))
    behind = getattr(drafter, "propose_behind", None)

    def step(
        pending: mx.array, key: mx.array, drafts: list[int]
    ) -> tuple[mx.array, mx.array, mx.array | None]:
        """(next key, the step's output [x_1..x_d, n_accepted, next_token] (_verify_round), the
        verified positions' target features when the drafter wants them (a feature draft gets
        every committed position's, as in a round)), lazy."""
        key, _draft_key, verify_key = round_keys(key)
        prop = Proposal(mx.array(drafts, dtype=mx.int32), None) if drafts else no_proposal()
        out, feats = _verify_round(target, pending, prop, len(drafts), cfg, verify_key, wants)
        return key, out, feats

    t_prev = time.perf_counter()
    drafts: list[int] = []  # the current step's proposal (only a run's last step has one)
    method, match, up_match, first = drafter.method, 0, 0, True
    key, tok, feats = step(mx.array(context[target.offset :], dtype=mx.int32), key, [])
    mx.async_eval([a for a in (tok, feats) if a is not None])
    while True:
        decided, upcoming, up_feats, up_drafts = None, None, None, None
        more = emitted + 1 < limits.max_tokens and index + 1 < limits.max_tokens
        if not drafts and more and len(context) + 2 <= limits.context_window:
            decided = choose_k(last)
            if behind is not None:
                up_drafts = behind(context, decided)
                up_match = getattr(drafter, "match", 0)
            elif decided <= 0:
                up_drafts = []
            if up_drafts is not None and not (cancel is not None and cancel.is_set()):
                up_drafts = up_drafts[: max(0, limits.context_window - len(context) - 2)]
                key, upcoming, up_feats = step(tok[-1:], key, up_drafts)
                mx.async_eval([a for a in (upcoming, up_feats) if a is not None])
                if up_drafts:
                    decided = None  # the policy decides after that round is read back
        *_, n, value = (int(v) for v in tok.tolist())  # type: ignore[union-attr,arg-type]
        now, d = time.perf_counter(), len(drafts)
        new, new_kinds = drafts[:n] + [value], ["accepted"] * n + [_last_kind(n, d)]
        # Which forward an interval between two reads measures depends on the backend: on MLX's
        # CPU backend a read returns only once the forward queued behind it is done too, so a
        # run's first interval holds two forwards, its last almost none, and each one between
        # them the forward queued behind it. Only a plain step with a plain step queued behind
        # it, not the run's first, is timed whichever way the backend reads (events.Round.timed).
        timed = not d and upcoming is not None and not up_drafts and not first
        first = False
        last = Round(
            index, d, n, d, 0.0, now - t_prev, method if d else drafter.method, timed, match
        )
        t_prev, index = now, index + 1
        toks, kinds, committed, stop = _truncate(new, new_kinds, emitted, limits, context)
        if feats is not None:  # the step's committed inputs: its pending token on, as in a round
            drafter.take_features(  # type: ignore[attr-defined]
                context + committed, len(context) - 1, feats[: len(committed)]
            )
        context += committed
        emitted += len(toks)
        drafter.commit(context)
        if upcoming is None or stop:
            target.rewind(context, len(context) - 1)
            yield Step(toks, kinds, last, stop)
            return key, last, index, emitted, decided, stop is not None
        yield Step(toks, kinds, last, None)
        if cancel is not None and cancel.is_set():
            target.rewind(context, len(context) - 1)
            yield Step([], [], stop="cancelled")
            return key, last, index, emitted, None, True
        tok, feats = upcoming, up_feats
        drafts, method, match = up_drafts or [], drafter.method, up_match if up_drafts else 0


def speculate(
    target: KVState,
    drafter: Drafter,
    prompt: list[int],
    cfg: SamplingConfig,
    choose_k: Callable[[Round | None], int],
    limits: Limits,
    cancel: threading.Event | None = None,
) -> Iterator[Step]:
    """Speculative decoding. Both states must already hold a prefix of `prompt` (Engine.prefill)."""
    context, key, emitted, last = list(prompt), make_key(cfg.seed), 0, None
    wants = bool(
        getattr(drafter, "wants_features", False)
    )  # a feature draft (edgespec.drafting.eagle)
    # K = 0 rounds run pipelined (_plain_run, which hands a feature draft its features too) unless
    # the drafter has something for them: a free lookup (propose_free).
    pipelined = getattr(drafter, "propose_free", None) is None
    # A drafter that can look up one token behind runs its misses pipelined too (_plain_run).
    behind = getattr(drafter, "propose_behind", None) is not None
    index, chosen = 0, None
    try:
        while index < limits.max_tokens:
            if cancel is not None and cancel.is_set():
                yield Step([], [], stop="cancelled")
                return
            room = limits.context_window - len(context)  # tokens one verify may add
            k = max(0, min(choose_k(last) if chosen is None else chosen, room))
            chosen = None
            if k == 0 and pipelined:
                run = _plain_run(target, drafter, context, key, cfg, choose_k, last, limits,
                                 cancel, index, emitted)  # fmt: skip
                key, last, index, emitted, chosen, done = yield from run
                if done:
                    return
                continue
            round_key = key
            key, draft_key, verify_key = round_keys(key)
            t0 = time.perf_counter()
            if k > 0:
                prop = drafter.propose(context, k, draft_key)  # lazy: the draft runs meanwhile
            else:  # drafting is off this round; a drafter may still offer a free lookup
                free = getattr(drafter, "propose_free", None)
                prop = free(context, draft_key) if free is not None else no_proposal()
            if prop.tokens.shape[0] > room:  # a lookup longer than the window has room for
                prop = Proposal(prop.tokens[:room], None if prop.q is None else prop.q[:room])
            d = int(prop.tokens.shape[0])  # drafted: <= k (n-gram miss, early stop) or a lookup
            if d == 0 and behind:
                # A lookup missed: plain steps, pipelined, looking up one token behind meanwhile
                # (the same keys as this round's: the run's first step is this round).
                run = _plain_run(target, drafter, context, round_key, cfg, choose_k, last,
                                 limits, cancel, index, emitted)  # fmt: skip
                key, last, index, emitted, chosen, done = yield from run
                if done:
                    return
                continue
            k = max(k, d)  # a free lookup at K = 0 reports the K it used
            out, feats, t_draft, t_verify = _run_round(
                target, context, prop, d, t0, cfg, verify_key, wants
            )
            n, nxt = out[d], out[d + 1]
            match = getattr(drafter, "match", 0) if d else 0
            last = Round(index, d, n, k, t_draft, t_verify, drafter.method, match=match)
            kinds = ["accepted"] * n + [_last_kind(n, d)]
            toks, kinds, committed, stop = _truncate(
                out[:n] + [nxt], kinds, emitted, limits, context
            )
            if feats is not None:  # features of the verified positions whose input is committed
                drafter.take_features(  # type: ignore[attr-defined]
                    context + committed, len(context) - 1, feats[: len(committed)]
                )
            context += committed
            emitted += len(toks)
            target.rewind(context, len(context) - 1)
            drafter.commit(context)
            index += 1
            yield Step(toks, kinds, last, stop)
            if stop:
                return
    finally:
        target.rewind(context, min(target.offset, len(context) - 1))
        drafter.commit(context)


def decode_plain(
    target: KVState,
    prompt: list[int],
    cfg: SamplingConfig,
    limits: Limits,
    cancel: threading.Event | None = None,
) -> Iterator[Step]:
    """Plain target decoding through the same caches, pipelined like mlx-lm: the next token's
    forward is queued (async_eval) before the current token is read back."""
    context, key = list(prompt), make_key(cfg.seed)

    def step(inputs: mx.array) -> mx.array:
        nonlocal key
        key, sample_key = split(key, 2)
        logits = target.forward(inputs)[-1]
        if cfg.greedy:
            return mx.argmax(logits).astype(mx.int32)
        return sample(warp(logits, cfg), uniforms(sample_key, 1)[0])

    try:
        tok = step(mx.array(context[target.offset :], dtype=mx.int32))
        mx.async_eval(tok)
        for emitted in range(1, limits.max_tokens + 1):
            if cancel is not None and cancel.is_set():
                yield Step([], [], stop="cancelled")
                return
            upcoming = None
            if emitted < limits.max_tokens and len(context) + 2 <= limits.context_window:
                upcoming = step(tok.reshape(1))
                mx.async_eval(upcoming)
            value = int(tok.item())  # type: ignore[arg-type]
            toks, kinds, committed, stop = _truncate(
                [value], ["target"], emitted - 1, limits, context
            )
            context += committed
            yield Step(toks, kinds, None, stop or (None if upcoming is not None else "length"))
            if stop or upcoming is None:
                return
            tok = upcoming
    finally:
        target.rewind(context, min(target.offset, len(context) - 1))
