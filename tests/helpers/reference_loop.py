"""A slow, obviously-correct numpy reference of the whole draft-verify loop (llm.c style).

No KV caches: every distribution comes from a full forward over the token list so far, and all maths
(warps, ratio tests, residuals, inverse-CDF sampling) is plain numpy in float64, one token at a time.
Randomness: the reference follows the engine's documented key schedule (`round_keys`: per round a
drafting key giving K uniforms and a verify key giving K + 1 uniforms; plain decoding is rounds of
K = 0, one verify uniform each) and turns those MLX-drawn uniforms into numpy floats, so both
implementations consume identical uniforms and must emit identical tokens.

`reference_rounds` is the loop's whole schedule for a draft model or hybrid drafting (n-gram lookup
first, the draft model where it misses) under any round policy (fixed or adaptive K), written out
token by token: plans decided ahead in runs of plain steps, free lookups when K = 0, lookups one
token behind while a plain step computes, each round with its own keys. Its n-gram lookup is a
plain search of the whole context (no index).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from edgespec.config import SamplingConfig, SpecConfig
from edgespec.drafting.base import PLAIN_ONLY
from edgespec.drafting.ngram import HYBRID_MIN_MATCH
from edgespec.events import Round
from edgespec.sampling import make_key, round_keys, uniforms


def warp_np(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Same contract as edgespec.sampling.warp, for one row, in float64."""
    z = np.asarray(logits, dtype=np.float64)
    if cfg.greedy:
        return (np.arange(len(z)) == np.argmax(z)).astype(np.float64)
    z = z / cfg.temperature
    if 0 < cfg.top_k < len(z):
        kth = np.sort(z)[len(z) - cfg.top_k]
        z = np.where(z >= kth, z, -np.inf)
    e = np.exp(z - z.max())
    probs = e / e.sum()
    if cfg.top_p < 1.0:
        desc = np.sort(probs)[::-1]
        before = np.cumsum(desc) - desc
        cut = desc[before < cfg.top_p].min()
        probs = np.where(probs >= cut, probs, 0.0)
    if cfg.min_p > 0.0:
        probs = np.where(probs >= cfg.min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


def sample_np(weights: np.ndarray, u: float) -> int:
    """Inverse CDF: first index whose cumulative weight exceeds u * total."""
    cdf = np.cumsum(np.asarray(weights, dtype=np.float64))
    return int(min(np.sum(cdf <= u * cdf[-1]), len(cdf) - 1))


def verify_np(
    x: list[int], q: list[np.ndarray], p: list[np.ndarray], u: np.ndarray
) -> tuple[int, int]:
    """One round, token by token: ratio test, residual at the first rejection, bonus otherwise."""
    for i, tok in enumerate(x):
        if u[i] * q[i][tok] < p[i][tok]:
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0:
            residual = p[i]
        return i, sample_np(residual, u[len(x)])
    return len(x), sample_np(p[len(x)], u[len(x)])


def full_logits(model, tokens: list[int]) -> np.ndarray:
    """Logits [L, V] of a full, cache-free forward over `tokens`."""
    out = model(mx.array(tokens, dtype=mx.int32)[None])[0]
    return np.array(out.astype(mx.float32), dtype=np.float64)


def _draft(model, ctx: list[int], k: int, cfg: SamplingConfig, u: np.ndarray | None):
    xs: list[int] = []
    qs: list[np.ndarray] = []
    for i in range(k):
        q = warp_np(full_logits(model, ctx + xs)[-1], cfg)
        xs.append(int(np.argmax(q)) if u is None else sample_np(q, float(u[i])))
        qs.append(q)
    return xs, qs


def _take(new: Iterable[int], out: list[int], eos: set[int], max_tokens: int) -> bool:
    """Append committed tokens to `out`; True when generation ends (EOS or length)."""
    for tok in new:
        if tok in eos:
            return True
        out.append(tok)
        if len(out) >= max_tokens:
            return True
    return False


def reference_speculative(
    target, draft, prompt: list[int], cfg: SamplingConfig, k: int, max_tokens: int, eos=()
) -> list[int]:
    """The generated token ids (EOS excluded) of speculative decoding with a fixed K."""
    key, ctx, out = make_key(cfg.seed), list(prompt), []
    while True:
        key, draft_key, verify_key = round_keys(key)
        ud = None if cfg.greedy else np.array(uniforms(draft_key, k))
        xs, qs = _draft(draft, ctx, k, cfg, ud)
        logits = full_logits(target, ctx + xs)[-(k + 1) :]
        ps = [warp_np(row, cfg) for row in logits]
        if cfg.greedy:
            best = [int(np.argmax(row)) for row in logits]
            n = next((i for i in range(k) if xs[i] != best[i]), k)
            nxt = best[n]
        else:
            n, nxt = verify_np(xs, qs, ps, np.array(uniforms(verify_key, k + 1)))
        new = xs[:n] + [nxt]
        if _take(new, out, set(eos), max_tokens):
            return out
        ctx += new


def reference_plain(target, prompt: list[int], cfg: SamplingConfig, max_tokens: int, eos=()):
    """Plain target decoding: rounds of K = 0, each with a round's keys (round_keys), the token
    drawn with the verify key's one uniform."""
    key, ctx, out = make_key(cfg.seed), list(prompt), []
    while True:
        key, _draft_key, verify_key = round_keys(key)
        p = warp_np(full_logits(target, ctx)[-1], cfg)
        tok = int(np.argmax(p)) if cfg.greedy else sample_np(p, float(uniforms(verify_key, 1)[0]))
        if _take([tok], out, set(eos), max_tokens):
            return out
        ctx.append(tok)


def ngram_lookup(
    tokens: list[int],
    k: int,
    n_min: int,
    n_max: int,
    skip: int = 0,
    long_n: int = 0,
    long_k: int = 1,
) -> tuple[list[int], int]:
    """The longest suffix of n_min..n_max tokens that occurred earlier with a known next token,
    its most recent such occurrence, and up to k tokens of what followed it, past `skip`
    (max(k, long_k) on a match of long_n or more): (tokens, n), ([], 0) without a match."""
    size = len(tokens)
    for n in range(min(n_max, size), n_min - 1, -1):
        after = [i for i in range(n, size) if tokens[i - n : i] == tokens[size - n :]]
        if after:
            k = max(k, long_k) if long_n and n >= long_n else k
            return tokens[after[-1] + skip : after[-1] + skip + k], n
    return [], 0


@dataclass
class _Proposal:
    tokens: list[int]
    q: list[np.ndarray] | None  # None: point masses
    method: str
    match: int = 0


@dataclass
class _Run:
    """One generation of reference_rounds: the committed context, keys, and rounds not yet shown
    to the policy (as rounds.Progress and rounds.Plans)."""

    target: Any
    draft: Any
    cfg: SamplingConfig
    spec: SpecConfig
    policy: Any
    lookup_k: Callable[[str, int], int] | None
    long_k: Callable[[int], int] | None
    ctx: list[int]
    max_tokens: int
    eos: set[int]
    key: mx.array = None  # type: ignore[assignment]
    out: list[int] = field(default_factory=list)
    fresh: list[Round] = field(default_factory=list)
    rounds: list[tuple[int, int, str]] = field(default_factory=list)
    done: bool = False

    def decide(self) -> int:
        for r in self.fresh:
            self.policy.observe(r)
        self.fresh.clear()
        return self.policy.decide()

    def lookup(self, k: int, skip: int = 0) -> _Proposal:
        """The hybrid's lookup (HybridDrafter: up to max(K, free_k) tokens, or lookup_k's; on a
        long match ngram_long_k, or long_k's)."""
        spec = self.spec
        free_k = max(spec.k, spec.ngram_k)
        length = self.lookup_k("ngram", free_k) if self.lookup_k else max(k, free_k)
        long = self.long_k(spec.ngram_long_k) if self.long_k else spec.ngram_long_k
        n_min = max(spec.ngram_min, min(HYBRID_MIN_MATCH, spec.ngram_max))
        found, n = ngram_lookup(
            self.ctx, length, n_min, spec.ngram_max, skip, spec.long_match, long
        )
        return _Proposal(found, None, "ngram", n)

    def propose(self, plan: int, draft_key: mx.array) -> _Proposal | None:
        """A round's proposal for K = plan (loop.Chains.draft); None: plain steps."""
        hybrid = self.spec.method == "hybrid"
        if plan <= PLAIN_ONLY or (plan == 0 and not hybrid):
            return None
        prop = self.lookup(plan) if hybrid else _Proposal([], None, "ngram")
        if plan > 0 and not prop.tokens:
            u = None if self.cfg.greedy else np.array(uniforms(draft_key, plan))
            xs, qs = _draft(self.draft, self.ctx, plan, self.cfg, u)
            prop = _Proposal(xs, qs, "draft")
        return prop if prop.tokens else None

    def behind(self, plan: int) -> _Proposal | None:
        """What a plain run queues behind the step computing (loop.Chains.behind): a lookup one token
        behind while K <= 0 (hybrid), a plain step, or None (the run ends)."""
        if plan <= PLAIN_ONLY or (plan <= 0 and self.spec.method != "hybrid"):
            return _Proposal([], None, "draft")
        return self.lookup(0, skip=1) if plan <= 0 else None

    def finish(self, prop: _Proposal, verify_key: mx.array) -> None:
        """Verify (ratio test, or argmax agreement at T = 0), commit, record the round."""
        xs, d = prop.tokens, len(prop.tokens)
        logits = full_logits(self.target, self.ctx + xs)[-(d + 1) :]
        if self.cfg.greedy:
            best = [int(np.argmax(row)) for row in logits]
            n = next((i for i in range(d) if xs[i] != best[i]), d)
            nxt = best[n]
        else:
            onehot = [(np.arange(logits.shape[-1]) == x).astype(np.float64) for x in xs]
            ps = [warp_np(row, self.cfg) for row in logits]
            u = np.array(uniforms(verify_key, d + 1))
            n, nxt = verify_np(xs, prop.q or onehot, ps, u)
        method = prop.method if d else "draft"
        self.fresh.append(
            Round(
                index=len(self.rounds),
                drafted=d,
                accepted=n,
                k=d,
                t_draft=0.0,
                t_verify=0.0,
                method=method,
                match=prop.match,
            )
        )
        self.rounds.append((d, n, method))
        new = xs[:n] + [nxt]
        self.done = _take(new, self.out, self.eos, self.max_tokens)
        self.ctx += new

    def plain_run(self) -> int | None:
        """Plain steps, each decided before the previous one is read back (edgespec/loop.py);
        returns the plan decided for the round after the run, if any."""
        self.key, _, verify_key = round_keys(self.key)
        queued = (_Proposal([], None, "draft"), verify_key)
        while True:
            decided, upcoming = None, None
            more = max(len(self.out), len(self.rounds)) + 1 < self.max_tokens
            if not queued[0].tokens and more:
                decided = self.decide()
                ahead = self.behind(decided)
                if ahead is not None:
                    self.key, _, verify_key = round_keys(self.key)
                    upcoming = (ahead, verify_key)
                    decided = None if ahead.tokens else decided
            self.finish(*queued)
            if upcoming is None or self.done:
                return decided
            queued = upcoming


def reference_rounds(
    target,
    draft,
    prompt: list[int],
    cfg: SamplingConfig,
    spec: SpecConfig,
    policy: Any,
    max_tokens: int,
    eos=(),
    lookup_k: Callable[[str, int], int] | None = None,
    long_k: Callable[[int], int] | None = None,
) -> tuple[list[int], list[tuple[int, int, str]]]:
    """The generated token ids (EOS excluded) and every round's (drafted, accepted, method) of
    spec.method "draft" or "hybrid" under `policy` (a rounds.Policy, shown the reference's own
    rounds in the loop's order); `lookup_k` / `long_k`: the hybrid's lookup length and a long
    match's (AdaptiveK.lookup_k / long_k when adaptive). The context window is taken to be far away."""
    run = _Run(
        target, draft, cfg, spec, policy, lookup_k, long_k, list(prompt), max_tokens, set(eos)
    )
    run.key = make_key(cfg.seed)
    ahead: int | None = None
    while len(run.rounds) < max_tokens and not run.done:
        plan = ahead if ahead is not None else run.decide()
        ahead = None
        nxt, draft_key, verify_key = round_keys(run.key)
        prop = run.propose(plan, draft_key)
        if prop is None:  # plain steps, pipelined, the first with this round's keys
            ahead = run.plain_run()
            continue
        run.key = nxt
        run.finish(prop, verify_key)
    return run.out, run.rounds
