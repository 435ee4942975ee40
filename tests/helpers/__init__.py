"""Scaffolding the test modules share: reading event streams, running a generation, a drafter that
takes every K = 0 round on the round path (the reference for pipelined runs), bit-for-bit
comparison, states built the way the Engine builds them, and the statistical checks.

The statistical helpers never pass vacuously: each asserts that it was given at least the number of
samples its caller says the check needs, instead of returning early on too few.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np
from scipy.stats import chisquare

from edgespec.cache import KVState
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.cpu.backend import CpuBackend
from edgespec.drafting.base import Capabilities, Drafter, Proposal, no_proposal, point_mass
from edgespec.events import Event, Round, Token
from edgespec.sampling import warp

PROMPT = "the cat and the dog in the house"
GREEDY = SamplingConfig(temperature=0)

# ---------------------------------------------------------------------------- event streams


def token_ids(events: Iterable[Event]) -> list[int]:
    """The emitted token ids."""
    return [e.id for e in events if isinstance(e, Token)]


def rounds_of(events: Iterable[Event]) -> list[Round]:
    """The Round records, in order."""
    return [e for e in events if isinstance(e, Round)]


def token_rounds(events: Iterable[Event]) -> list[tuple[Token, Round]]:
    """(token, the round that committed it) pairs: a Round follows its round's tokens."""
    out: list[tuple[Token, Round]] = []
    pending: list[Token] = []
    for e in events:
        if isinstance(e, Token):
            pending.append(e)
        elif isinstance(e, Round):
            out += [(t, e) for t in pending]
            pending = []
    return out


def gen(
    engine: Any,
    prompt: list[int],
    spec: SpecConfig,
    n: int,
    sampling: SamplingConfig = GREEDY,
    **kw: Any,
) -> list[Event]:
    """Every event of one generation of up to n tokens (kw: Engine.generate's drafter, k_policy)."""
    return list(engine.generate(prompt, GenerationConfig(sampling, spec, max_tokens=n), **kw))


def plain_ids(engine: Any, prompt: list[int], n: int, sampling: SamplingConfig = GREEDY):
    """Plain target decoding's tokens (the reference every speculative method must match)."""
    return token_ids(gen(engine, prompt, SpecConfig(method="none"), n, sampling))


class Scripted:
    """A round policy (rounds.Policy) whose every decision is `choose(newest)`: the newest round
    observed since the last decision, or None (the first round, or nothing new read back yet:
    a pipelined run decides ahead). Example: Scripted(lambda _last: 3) is a fixed K = 3."""

    def __init__(self, choose: Any):
        self.choose = choose
        self.new: Round | None = None

    def observe(self, r: Round) -> None:
        self.new = r

    def decide(self) -> Any:
        last, self.new = self.new, None
        return self.choose(last)


def ask(policy: Any, last: Round | None) -> Any:
    """A policy's next plan after showing it `last` (None: nothing to show)."""
    if last is not None:
        policy.observe(last)
    return policy.decide()


def toks(prop: Proposal) -> list[int]:
    """A proposal's tokens as host ints."""
    return [int(t) for t in prop.tokens.tolist()]  # type: ignore[union-attr]


# ---------------------------------------------------------------------------- drafters


class RoundByRound(Drafter):
    """Wraps a drafter so that its K = 0 rounds run one at a time: with `propose_free`
    (FreeLookups; always empty here) a K = 0 round looks up from the whole context, so the loop
    queues nothing behind the plain step before it (loop.Chains.behind). The reference the
    pipelined runs must equal."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.method = inner.method
        self._features = inner.capabilities().features  # a feature draft's, handed on

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        return self.inner.propose(context, k, key)

    def propose_free(self, context: list[int], key: mx.array) -> Proposal:
        return no_proposal(self.method)

    def capabilities(self) -> Capabilities:
        return Capabilities(free=self, features=self if self._features is not None else None)

    def take_features(self, context: list[int], start: int, features: mx.array) -> None:
        assert self._features is not None
        self._features.take_features(context, start, features)

    def commit(self, context: list[int]) -> None:
        self.inner.commit(context)


class NeverDrafter(Drafter):
    """A model drafter that must not be asked (a hybrid's lookup matches wherever it is used)."""

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        raise AssertionError("the model drafted although the lookup matched")


class BehindOnce(Drafter):
    """A lookup-like drafter whose fresh lookups always miss, so the loop runs plain steps
    pipelined (edgespec/loop.py), and which proposes `drafts` one token behind once: while the
    token after `at` committed tokens is being computed. The run's next step then verifies them,
    queued with that token still unknown. Every other lookup one behind misses (an empty
    proposal: the pipelined run goes on)."""

    method = "ngram"

    def __init__(self, at: int, drafts: list[int]):
        self.at, self.drafts, self.calls = at, drafts, 0

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        return no_proposal(self.method)

    def capabilities(self) -> Capabilities:
        return Capabilities(behind=self)

    def propose_behind(self, context: list[int], k: int) -> Proposal | None:
        self.calls += 1
        return point_mass(list(self.drafts) if len(context) == self.at else [], self.method)


# ---------------------------------------------------------------------------- models and states


def same_bits(a: mx.array, b: mx.array) -> bool:
    """Same shape, dtype and every bit (not just close)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(mx.array_equal(a, b).item())


def engine_state(model: Any, name: str = "model") -> KVState:
    """A KVState built as the Engine builds one: a CPU backend's twin of `model` with the rewrites
    that are switched on (`model` itself is left as it is) and the backend's cache."""
    cpu = CpuBackend()
    return KVState(cpu.model(model), name, cpu.new_cache)


# ---------------------------------------------------------------------------- statistics


def target_probs(model: Any, context: Sequence[int], sampling: SamplingConfig) -> np.ndarray:
    """p(. | context): the target's warped distribution of the next token, float64, from a
    cache-free forward (independent of the loop's caches)."""
    logits = model(mx.array(list(context))[None])[0, -1]
    return np.array(warp(logits, sampling), dtype=np.float64)


def chi2_pvalue(samples: Sequence[int], p: np.ndarray, min_samples: int) -> float:
    """p-value of a chi-square test that `samples` (token ids) were drawn from p, bins whose
    expected count is below 5 pooled into one. Asserts at least `min_samples` samples, no sample
    where p = 0, and at least two bins to compare (else the test would check nothing)."""
    assert len(samples) >= min_samples, (
        f"only {len(samples)} samples, the check needs {min_samples}"
    )
    p = np.asarray(p, dtype=np.float64)
    counts = np.bincount(np.asarray(samples, dtype=np.int64), minlength=p.size).astype(np.float64)
    assert counts[p == 0].sum() == 0, "a token the target excludes (p = 0) was emitted"
    expected = p / p.sum() * len(samples)
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    assert keep.sum() >= 2, "p puts (almost) all its mass on one token: nothing to compare"
    return float(chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


def first_two_p_value(
    engine: Any,
    ids: list[int],
    sampling: SamplingConfig,
    spec: SpecConfig,
    kinds: set[str],
    min_firsts: int,
    min_seconds: int,
) -> Any:
    """A p_value(seeds) for tests.helpers.stats.assert_follows: one 2-token answer to `ids` per
    seed; the first tokens tested against p(. | ids), the second tokens after the commonest first
    against p(. | ids, first) (chi2_pvalue), the smaller p-value returned. An end of turn drawn
    first counts as a first token with no second. Adds each token's kind to `kinds`."""
    model = engine.target.model
    (eos,) = engine.tokenizer.eos_token_ids

    def p_value(seeds: range) -> float:
        firsts: list[int] = []
        seconds: dict[int, list[int]] = {}
        for seed in seeds:
            cfg = GenerationConfig(replace(sampling, seed=seed), spec, max_tokens=2)
            events = list(engine.generate(ids, cfg))
            toks = token_ids(events)
            if events[-1].reason == "stop":  # an end of turn was drawn (it is not emitted)
                toks.append(eos)
            kinds.update(e.kind for e in events if hasattr(e, "kind"))
            firsts.append(toks[0])
            if toks[0] != eos:
                seconds.setdefault(toks[0], []).append(toks[1])
        p1 = chi2_pvalue(firsts, target_probs(model, ids, sampling), min_samples=min_firsts)
        top = max(seconds, key=lambda t: len(seconds[t]))
        p = target_probs(model, ids + [top], sampling)
        return min(p1, chi2_pvalue(seconds[top], p, min_samples=min_seconds))

    return p_value


def binomial_close(hits: int, n: int, rate: float, sigmas: float = 4.0) -> bool:
    """Whether hits / n is within `sigmas` standard deviations of `rate` (n trials)."""
    assert n > 0, "no trials"
    return bool(abs(hits / n - rate) < sigmas * np.sqrt(rate * (1 - rate) / n))
