"""The draft-verify loop. It orchestrates and decides nothing itself: drafters propose
(edgespec/drafting/), the maths accepts (sampling.py, acceptance.py), rounds.py runs a round.

Cache invariant after every round: the target's cache holds context[:-1] (the newest committed token
is the next forward's input); a drafter's state holds some prefix of the context. Both loops yield
`Step`s; the Engine (runtime.py) turns them into Token / Round / Finished events. Runs of K = 0
rounds (adaptive K switched the draft off) and of n-gram misses are pipelined like plain decoding
(rounds.plain_run).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import mlx.core as mx

from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import Drafter
from edgespec.events import Round
from edgespec.rounds import (
    KPolicy,
    Limits,
    Progress,
    Step,
    cancelled,
    is_set,
    plain_run,
    run_round,
    truncate,
)
from edgespec.sampling import make_key, round_keys, sample, split, uniforms, warp

__all__ = ["Limits", "Step", "decode_plain", "speculate"]


def speculate(
    target: KVState,
    drafter: Drafter,
    prompt: list[int],
    cfg: SamplingConfig,
    choose_k: KPolicy,
    limits: Limits,
    cancel: threading.Event | None = None,
) -> Iterator[Step]:
    """Speculative decoding. Both states must already hold a prefix of `prompt` (Engine.prefill).
    Each round: K from the policy, a proposal of d <= K tokens (more for a lookup), one target
    forward verifying them, the accepted prefix plus a correction or bonus committed."""
    run = Progress(list(prompt), make_key(cfg.seed), limits)
    chosen: int | None = None  # a K a pipelined run already chose for the next round
    try:
        while run.index < limits.max_tokens and not run.stopped:
            if is_set(cancel):
                yield cancelled()
                return
            k = max(0, min(choose_k(run.last) if chosen is None else chosen, run.room()))
            if k == 0 and not drafter.free_lookups:  # drafting is off: plain steps, pipelined
                chosen = yield from plain_run(target, drafter, run, cfg, choose_k, cancel)
                continue
            round_key = run.key
            run.key, draft_key, verify_key = round_keys(run.key)
            t0 = time.perf_counter()
            if k > 0:
                prop = drafter.propose(run.context, k, draft_key)  # lazy: the draft runs meanwhile
            else:  # drafting is off this round, but a lookup costs next to nothing
                prop = drafter.propose_free(run.context, draft_key)
            prop, chosen = prop.cut(run.room()), None  # a lookup may be longer than the room
            if prop.size == 0 and drafter.looks_behind:
                # A lookup missed: plain steps, pipelined, looking up one token behind meanwhile
                # (with this round's keys: the run's first step is this round).
                run.key = round_key
                chosen = yield from plain_run(target, drafter, run, cfg, choose_k, cancel)
                continue
            out, feats, t_draft, t_verify = run_round(
                target, run.context, prop, t0, cfg, verify_key, drafter.wants_features
            )
            d = prop.size
            n, nxt = out[d], out[d + 1]
            method, match = (prop.method, prop.match) if d else (drafter.method, 0)
            rnd = Round(run.index, d, n, max(k, d), t_draft, t_verify, method, True, match)
            step = run.commit(drafter, out[:n] + [nxt], rnd, feats)
            target.rewind(run.context, len(run.context) - 1)
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
    forward is queued (async_eval) before the current token is read back."""
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
            upcoming = None
            if emitted < limits.max_tokens and len(context) + 2 <= limits.context_window:
                upcoming = step(tok.reshape(1))
                mx.async_eval(upcoming)
            value = int(tok.item())  # type: ignore[arg-type]
            toks, kinds, committed, stop = truncate(
                [value], ["target"], emitted - 1, limits, context
            )
            context += committed
            yield Step(toks, kinds, None, stop or (None if upcoming is not None else "length"))
            if stop or upcoming is None:
                return
            tok = upcoming
    finally:
        target.rewind(context, min(target.offset, len(context) - 1))
