"""The empirical unbiasedness check behind `edgespec verify`.

At one fixed context, take the pair's real warped distributions p (target) and q (draft), run N
rounds of the SAME acceptance step generation uses (`edgespec.acceptance.verify`), and compare the
first emitted token's empirical distribution with p: L1 distance (it must shrink towards 0 as N
grows, like sampling noise alone), a chi-square goodness-of-fit p-value, and the acceptance rate
next to its exact value sum_x min(p(x), q(x)). Rows 2..K+1 reuse the same p and q (the later
positions do not influence the first emitted token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from edgespec.acceptance import expected_acceptance, verify
from edgespec.config import SamplingConfig
from edgespec.families import model_family
from edgespec.sampling import make_key, sample, split, warp

CELLS = 2**22  # floats per batched chunk of rounds (keeps memory flat for a 49k vocabulary)


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of N rounds. l1_noise: the L1 an exact sampler is expected to show at this N."""

    rounds: int
    k: int
    l1: float
    l1_noise: float
    acceptance: float
    expected_acceptance: float
    p_value: float
    chi_square: float
    dof: int


def last_distributions(
    target: Any, draft: Any, prompt: list[int], sampling: SamplingConfig
) -> tuple[mx.array, mx.array]:
    """Warped next-token distributions (p, q) [V] of both models after `prompt` (cache-free)."""
    t_logits, q_logits = model_family(draft).first_logits(target, draft, prompt)
    return warp(t_logits, sampling), warp(q_logits, sampling)


def simulate(p: mx.array, q: mx.array, k: int, rounds: int, seed: int) -> tuple[np.ndarray, int]:
    """Run `rounds` acceptance steps in batched chunks. Returns (counts [V] of the first emitted
    token, rounds whose first draft was accepted)."""
    vocab = p.shape[-1]
    chunk = max(1, CELLS // ((k + 1) * vocab))
    counts, accepted, key, done = np.zeros(vocab, np.int64), 0, make_key(seed), 0
    while done < rounds:
        b = min(chunk, rounds - done)
        key, kd, kv = split(key, 3)
        qb = mx.broadcast_to(q, (b, k, vocab))
        x = sample(qb, mx.random.uniform(shape=(b, k), key=kd))
        u = mx.random.uniform(shape=(b, k + 1), key=kv)
        n, nxt = verify(x, qb, mx.broadcast_to(p, (b, k + 1, vocab)), u)
        first = mx.where(n > 0, x[:, 0], nxt)
        counts += np.bincount(np.array(first), minlength=vocab)
        accepted += int(np.array(mx.sum(n > 0)))
        done += b
    return counts, accepted


def chi_square(counts: np.ndarray, p: np.ndarray) -> tuple[float, int, float]:
    """Goodness of fit of `counts` to `p`: (statistic, degrees of freedom, p-value).

    Cells with an expected count below 5 are pooled into one; any count where p == 0 is an
    impossible token and gives p-value 0. Example: counts [48, 52], p [.5, .5] -> (0.16, 1, 0.69).
    """
    n = counts.sum()
    if counts[p <= 0].sum() > 0:
        return math.inf, 0, 0.0
    expected = p * n
    big = expected >= 5
    obs = list(counts[big]) + ([counts[~big & (p > 0)].sum()] if (~big & (p > 0)).any() else [])
    exp = list(expected[big]) + ([expected[~big & (p > 0)].sum()] if (~big & (p > 0)).any() else [])
    obs_a, exp_a = np.array(obs, np.float64), np.array(exp, np.float64)
    keep = exp_a > 0
    stat = float(((obs_a[keep] - exp_a[keep]) ** 2 / exp_a[keep]).sum())
    dof = int(keep.sum()) - 1
    return stat, dof, chi2_sf(stat, dof) if dof > 0 else 1.0


def chi2_sf(x: float, dof: int) -> float:
    """P(Chi2_dof >= x): the regularised upper incomplete gamma Q(dof/2, x/2)."""
    a, z = dof / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    log_front = -z + a * math.log(z) - math.lgamma(a)
    if z < a + 1:  # series for the lower function P
        term = total = 1.0 / a
        for i in range(1, 10_000):
            term *= z / (a + i)
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300  # continued fraction for Q (modified Lentz)
    b, c, d = z + 1 - a, 1 / tiny, 1 / (z + 1 - a)
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(log_front) * h


def verify_pair(
    target: Any, draft: Any, prompt: list[int], sampling: SamplingConfig, k: int, rounds: int
) -> VerifyReport:
    """The whole check on two models (mlx-lm modules) at one context."""
    p, q = last_distributions(target, draft, prompt, sampling)
    counts, accepted = simulate(p, q, k, rounds, sampling.seed)
    p_np = np.array(p, dtype=np.float64)
    p_np /= p_np.sum()
    stat, dof, p_value = chi_square(counts, p_np)
    return VerifyReport(
        rounds=rounds,
        k=k,
        l1=float(np.abs(counts / rounds - p_np).sum()),
        l1_noise=float(np.sqrt(2 * p_np * (1 - p_np) / (math.pi * rounds)).sum()),
        acceptance=accepted / rounds,
        expected_acceptance=float(np.array(expected_acceptance(p, q))),
        p_value=p_value,
        chi_square=stat,
        dof=dof,
    )
