"""Statistical losslessness of one verification round: every emitted position is distributed as p.

For each (p, q) case we run 200k vectorised rounds through `edgespec.acceptance.verify` (the code the
engine runs), then check with a chi-square test that the token emitted at position j, over the rounds
that reach j, follows p_j, that no token with p_j = 0 ever appears, and that the acceptance rate at j
matches sum_x min(p_j(x), q_j(x)). Rows are context-free here (p_j does not depend on x_<j), which is
exactly the setting in which the emitted token at every position must be distributed as p_j.
"""

from __future__ import annotations

import zlib

import mlx.core as mx
import numpy as np
import pytest

from edgespec.acceptance import expected_acceptance, verify, verify_greedy
from edgespec.sampling import make_key, sample, split
from tests.helpers import chi2_pvalue

N = 200_000
V = 8
MIN_REACH = 800  # rounds that must reach a position for its distribution to be tested


def _dirichlet(rng: np.random.Generator, k: int, alpha: float = 1.0) -> np.ndarray:
    return rng.dirichlet([alpha] * V, size=k).astype(np.float32)


def _one_hot(rows: list[int]) -> np.ndarray:
    return np.eye(V, dtype=np.float32)[rows]


def _with_zeros(rng: np.random.Generator, k: int) -> np.ndarray:
    m = _dirichlet(rng, k) * (rng.random((k, V)) < 0.5)
    m[:, 0] += 0.05  # keep every row non-empty
    return (m / m.sum(-1, keepdims=True)).astype(np.float32)


def _cases() -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, p [K+1, V], q [K, V]) for several K, including the corner cases the issue names."""
    rng = np.random.default_rng(1234)
    out = []
    for k in (1, 2, 4):
        out.append((f"random-K{k}", _dirichlet(rng, k + 1), _dirichlet(rng, k)))
        out.append((f"peaked-K{k}", _dirichlet(rng, k + 1, 0.2), _dirichlet(rng, k, 0.2)))
    p = _dirichlet(rng, 4)
    out.append(("p==q-K3", p, p[:3].copy()))
    out.append(("p-one-hot-K2", _one_hot([3, 5, 1]), _dirichlet(rng, 2)))
    out.append(("q-one-hot-K2", _dirichlet(rng, 3), _one_hot([2, 2])))
    half = np.zeros((3, V), np.float32)
    half[:, : V // 2] = _dirichlet(rng, 3)[:, : V // 2]
    half /= half.sum(-1, keepdims=True)
    other = np.roll(half, V // 2, axis=-1)[:2]  # disjoint supports: nothing is ever accepted
    out.append(("disjoint-K2", half, other))
    out.append(("zeros-K3", _with_zeros(rng, 4), _with_zeros(rng, 3)))
    out.append(("same-one-hot-K2", _one_hot([4, 4, 6]), _one_hot([4, 4])))
    return out


def _run(p: np.ndarray, q: np.ndarray | None, seed: int, x_fixed: np.ndarray | None = None):
    """N rounds: draft x ~ q (or fixed tokens for a point-mass proposal), then verify.
    Returns (x [N, K], n [N], next [N]) as numpy."""
    k = p.shape[0] - 1
    kd, kv = split(make_key(seed), 2)
    if x_fixed is None:
        ud = mx.random.uniform(shape=(N, k), key=kd)
        x = sample(mx.broadcast_to(mx.array(q), (N, k, V)), ud)
    else:
        x = mx.broadcast_to(mx.array(x_fixed, dtype=mx.int32), (N, k))
    u = mx.random.uniform(shape=(N, k + 1), key=kv)
    qb = None if q is None else mx.broadcast_to(mx.array(q), (N, k, V))
    n, nxt = verify(x, qb, mx.broadcast_to(mx.array(p), (N, k + 1, V)), u)
    return np.array(x), np.array(n), np.array(nxt)


def _emitted(x: np.ndarray, n: np.ndarray, nxt: np.ndarray, j: int) -> np.ndarray:
    """Tokens emitted at position j (0-based) over the rounds that reach it."""
    reach = n >= j
    if j == x.shape[1]:
        return nxt[reach]  # the bonus position
    return np.where(n[reach] > j, x[reach, j], nxt[reach])


def _expected_reach(p: np.ndarray, q: np.ndarray | None, x_fixed: np.ndarray | None) -> np.ndarray:
    """Expected number of the N rounds that reach each position 0..K: N times the acceptance rates
    before it (rows are context-free), sum_x min(p_j, q_j) or, for a point mass, p_j(x_j)."""
    k = p.shape[0] - 1
    rates = [
        float(p[j, x_fixed[j]])
        if q is None
        else float(expected_acceptance(mx.array(p[j]), mx.array(q[j])))
        for j in range(k)
    ]
    return N * np.concatenate([[1.0], np.cumprod(rates)])


def _check_distribution(tokens: np.ndarray, p: np.ndarray, label: str) -> None:
    """At least MIN_REACH tokens emitted at one position follow p: a chi-square test, or for a
    one-hot p every token its one token."""
    support = np.flatnonzero(p > 0)
    if len(support) == 1:
        assert len(tokens) >= MIN_REACH, f"{label}: only {len(tokens)} rounds reached it"
        assert (tokens == support[0]).all(), f"{label}: a token other than p's only one"
        return
    pval = chi2_pvalue(tokens, p, min_samples=MIN_REACH)
    assert pval > 1e-4, f"{label}: emitted distribution != p (chi-square p = {pval:.2e})"


def _check_acceptance(x, n, p, q, j: int, label: str) -> None:
    reach = n >= j
    m = int(reach.sum())
    assert m >= MIN_REACH, f"{label}: only {m} rounds reached it"
    rate = float((n[reach] > j).mean())
    if q is None:
        want = float(p[j, x[0, j]])
    else:
        want = float(expected_acceptance(mx.array(p[j]), mx.array(q[j])))
    sigma = max(np.sqrt(want * (1 - want) / m), 1e-9)
    assert abs(rate - want) < 5 * sigma + 1e-6, f"{label}: acceptance {rate:.4f} vs {want:.4f}"


def _check_rounds(x, n, nxt, p, q, x_fixed, label: str) -> int:
    """Every position: no token with p = 0 ever emitted; and wherever MIN_REACH rounds are expected
    to reach it with 5 sigma to spare, its emitted distribution and acceptance rate (asserting that
    enough rounds did reach it: a position is never skipped for want of samples). Returns the
    number of positions tested that way."""
    k = p.shape[0] - 1
    expected = _expected_reach(p, q, x_fixed)
    tested = 0
    for j in range(k + 1):
        tokens = _emitted(x, n, nxt, j)
        counts = np.bincount(tokens, minlength=V)
        assert counts[p[j] == 0].sum() == 0, f"{label} {j}: emitted tokens that have p = 0"
        if expected[j] - 5 * np.sqrt(expected[j]) < MIN_REACH:
            continue
        _check_distribution(tokens, p[j], f"{label} position {j}")
        if j < k:
            _check_acceptance(x, n, p, q, j, f"{label} position {j}")
        tested += 1
    return tested


@pytest.mark.parametrize("name,p,q", _cases(), ids=[c[0] for c in _cases()])
def test_every_position_is_distributed_as_p(name, p, q):
    x, n, nxt = _run(p, q, seed=zlib.crc32(name.encode()) % 1000)
    k = q.shape[0]
    assert ((n >= 0) & (n <= k)).all()
    # Beyond the first position (the acceptance path) wherever anything can be accepted.
    assert _check_rounds(x, n, nxt, p, q, None, name) >= (1 if name == "disjoint-K2" else 2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_point_mass_proposal_is_lossless(seed):
    """A deterministic proposal (n-gram style): accept with prob p(x), else resample p without x."""
    rng = np.random.default_rng(seed)
    p = _dirichlet(rng, 4, 0.5)
    x_fixed = rng.integers(0, V, size=3)
    x, n, nxt = _run(p, None, seed, x_fixed=x_fixed)
    assert _check_rounds(x, n, nxt, p, None, x_fixed, "point mass") >= 1


def test_disjoint_supports_never_accept_and_p_equal_q_always_accepts():
    cases = {c[0]: c for c in _cases()}
    _, p, q = cases["disjoint-K2"]
    assert (_run(p, q, 5)[1] == 0).all()
    _, p, q = cases["p==q-K3"]
    assert (_run(p, q, 6)[1] == 3).all()


def test_hand_worked_round():
    """K=1, p_1 = [.5, .5], q_1 = [1, 0], x = 0: u = .3 accepts; u = .7 rejects -> residual -> 1."""
    p = mx.array([[0.5, 0.5], [0.9, 0.1]])
    q = mx.array([[1.0, 0.0]])
    x = mx.array([0])
    n, t = verify(x, q, p, mx.array([0.3, 0.95]))
    assert (n.item(), t.item()) == (1, 1)  # bonus from p_2 = [.9, .1] with u = .95 -> 1
    n, t = verify(x, q, p, mx.array([0.7, 0.0]))
    assert (n.item(), t.item()) == (0, 1)


def test_greedy_rule():
    logits = mx.log(mx.array(_one_hot([5, 7, 1, 4]) + 0.01))
    n, t = verify_greedy(mx.array([5, 7, 2]), logits)
    assert (n.item(), t.item()) == (2, 1)
    n, t = verify_greedy(mx.array([5, 7, 1]), logits)
    assert (n.item(), t.item()) == (3, 4)
    n, t = verify_greedy(mx.array([0, 7, 1]), logits)
    assert (n.item(), t.item()) == (0, 5)


def test_nothing_drafted_is_a_plain_sample_from_p():
    """K = 0 (a plain step through the same verify): n = 0 and the token is p_1's inverse-CDF
    sample, with or without a (zero-row) q."""
    p = mx.array([[0.2, 0.3, 0.5]])
    x = mx.zeros((0,), dtype=mx.int32)
    for q in (None, mx.zeros((0, 3))):
        for u, want in ((0.1, 0), (0.3, 1), (0.6, 2)):
            n, t = verify(x, q, p, mx.array([u]))
            assert (n.item(), t.item()) == (0, want)


def test_only_the_first_rejected_row_is_resampled():
    """K=3, batch of two rounds: the first rejects x_2 and samples the residual of row 2 (not of
    row 1 or 3); the second accepts all and takes the bonus row. Hand-worked."""
    p = mx.array([[1.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    q = mx.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    x = mx.array([[0, 1, 2], [0, 1, 2]])
    # x_2 = 1 has p/q = 0.5: u = 0.9 rejects it; residual max(0, p_2 - q_2) = [0, 0, 0.5] -> 2.
    u = mx.array([[0.1, 0.9, 0.1, 0.0], [0.1, 0.2, 0.1, 0.5]])
    n, t = verify(x, mx.broadcast_to(q, (2, 3, 3)), mx.broadcast_to(p, (2, 4, 3)), u)
    assert n.tolist() == [1, 3] and t.tolist() == [2, 1]
