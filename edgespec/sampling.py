"""Pure warps and seeded sampling. Arrays and keys in, arrays out; no global random state.

`warp` turns logits into the distribution that is actually sampled, and the SAME function is applied
to the target's logits (p) and the draft's (q), so the ratio test compares like with like.
Sampling is inverse-CDF on an explicit uniform, so a slow reference
(tests/helpers/reference_loop.py) fed the same uniforms picks the same tokens.

Greedy is decided once, where the sampler is built (`sampler(cfg)`): a Sampler at T > 0, Greedy at
T = 0 (argmax, no uniforms, no distributions). Drafters pick their tokens with it, and the
acceptance reads what it hands over (`probs`: None at T = 0, where the argmax rule applies).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import mlx.core as mx

from edgespec.config import SamplingConfig

# softmax(z, scale): the softmax over the last axis of scale * z that a backend computes faster
# (MLX's CPU backend: edgespec/cpu/fastexp.py). The Engine hands its backend's to the states
# (KVState.softmax), and whatever warps a state's logits passes it on to `warp`.
Softmax = Callable[[mx.array, float], mx.array]


def warp(logits: mx.array, cfg: SamplingConfig, softmax: Softmax | None = None) -> mx.array:
    """Logits [..., V] -> probabilities [..., V] (float32, rows sum to 1); the softmax is
    `softmax` (a backend's, Softmax above) or MLX's own.

    Order: temperature, top-k, top-p, min-p, renormalise (after a top-p / min-p cut; a softmax
    row is normalised already, so a row with nothing cut is returned as it is). Temperature 0
    gives a one-hot row at the argmax (the greedy special case of the same maths). Ties at a
    cut-off are all kept, so the result does not depend on sort order. Example (temperature 1,
    top_p 0.6): probs [0.5, 0.3, 0.2] keep [0.5, 0.3] (mass before 0.3 is 0.5 < 0.6, mass before
    0.2 is 0.8) -> [0.625, 0.375, 0].
    """
    logits = logits.astype(mx.float32)
    vocab = logits.shape[-1]
    if cfg.greedy:
        return (mx.arange(vocab) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
    z, t = logits, cfg.temperature
    if 0 < cfg.top_k < vocab:
        z, t = logits / cfg.temperature, 1.0
        kth = mx.sort(z, axis=-1)[..., vocab - cfg.top_k : vocab - cfg.top_k + 1]
        z = mx.where(z >= kth, z, -mx.inf)
    # The backend's softmax when it has one (the CPU's: a compiled, faster, more accurate exp,
    # edgespec/cpu/fastexp.py), the temperature applied inside it.
    probs = softmax(z, 1.0 / t) if softmax is not None else mx.softmax(z / t, axis=-1)
    if cfg.top_p >= 1.0 and cfg.min_p <= 0.0:
        return probs  # nothing cut: the softmax is already normalised
    if cfg.top_p < 1.0:
        desc = -mx.sort(-probs, axis=-1)
        before = mx.cumsum(desc, axis=-1) - desc  # mass strictly above each sorted entry
        cut = mx.min(mx.where(before < cfg.top_p, desc, mx.inf), axis=-1, keepdims=True)
        probs = mx.where(probs >= cut, probs, 0.0)
    if cfg.min_p > 0.0:
        top = mx.max(probs, axis=-1, keepdims=True)
        probs = mx.where(probs >= cfg.min_p * top, probs, 0.0)
    return probs / mx.sum(probs, axis=-1, keepdims=True)


def sample(weights: mx.array, u: mx.array) -> mx.array:
    """Inverse-CDF sample: weights [..., V] (>= 0, need not be normalised), u [...] in [0, 1).

    Returns int32 [...]: the first index whose cumulative weight exceeds u * total. Zero-weight
    entries are never chosen. Example: weights [0, 2, 0, 2], u 0.49 -> 1; u 0.5 -> 3.
    """
    cdf = mx.cumsum(weights.astype(mx.float32), axis=-1)
    threshold = mx.expand_dims(u, -1) * cdf[..., -1:]
    index = mx.sum(cdf <= threshold, axis=-1)
    return mx.minimum(index, weights.shape[-1] - 1).astype(mx.int32)


def make_key(seed: int) -> mx.array:
    """The root PRNG key of one request."""
    return mx.random.key(seed)


def split(key: mx.array, num: int) -> list[mx.array]:
    """`num` independent child keys of `key` (the parent must not be used again)."""
    keys = mx.random.split(key, num)
    return [keys[i] for i in range(num)]


def uniforms(key: mx.array, n: int) -> mx.array:
    """n uniforms in [0, 1) drawn from `key` (float32 [n])."""
    return mx.random.uniform(shape=(n,), key=key)


def round_keys(key: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """The key schedule of one speculative round: (next round's key, drafting key, verify key).

    Drafting draws `uniforms(draft_key, K)` (one per drafted token); verification draws
    `uniforms(verify_key, K + 1)` (K ratio tests + one for the correction or bonus). The numpy
    reference follows the same schedule, so both consume identical uniforms.
    """
    nxt, draft_key, verify_key = split(key, 3)
    return nxt, draft_key, verify_key


class Sampler:
    """Sampling at T > 0 (`sampler(cfg)` builds the one a config asks for): drafted tokens are
    drawn by inverse CDF from warped rows with the round's uniforms, and the acceptance runs the
    ratio test on the target's warped rows."""

    def __init__(self, cfg: SamplingConfig):
        self.cfg = cfg

    def uniforms(self, key: mx.array, n: int) -> mx.array | None:
        """The n uniforms a draft of n tokens draws (None: it draws none, Greedy)."""
        return uniforms(key, n)

    def probs(self, logits: mx.array, softmax: Softmax | None = None) -> mx.array | None:
        """The distribution rows [..., V] tokens are drawn from (None: Greedy, the argmax)."""
        return warp(logits, self.cfg, softmax)

    def pick(
        self,
        logits: mx.array,
        u: mx.array | None,
        i: int,
        rows: list[mx.array],
        softmax: Softmax | None = None,
    ) -> mx.array:
        """The i-th drafted token from one row of logits [V] (lazy): an inverse-CDF sample with
        u[i] from the warped row, which is appended to `rows` (the drafted q)."""
        assert u is not None
        rows.append(warp(logits, self.cfg, softmax))
        return sample(rows[-1], u[i])

    def draw(
        self, logits: mx.array, key: mx.array, softmax: Softmax | None = None
    ) -> tuple[mx.array, mx.array | None]:
        """Tokens [k] and their q [k, V] from k rows of logits at once (a block draft): q =
        warp(rows), token i = sample(q_i, u_i), u = uniforms(key, k)."""
        q = warp(logits, self.cfg, softmax)
        return sample(q, uniforms(key, int(logits.shape[0]))), q

    def reviews(self, position: int, probs: dict[int, float]) -> bool:
        """Whether a review reads `position` (acceptance.py, reviews): at T > 0 only where the
        target's probability of its token is known (a plain step's)."""
        return position in probs


class Greedy(Sampler):
    """Temperature 0: every token is its row's argmax; nothing is drawn, q is None."""

    def uniforms(self, key: mx.array, n: int) -> mx.array | None:
        return None

    def probs(self, logits: mx.array, softmax: Softmax | None = None) -> mx.array | None:
        return None

    def pick(
        self,
        logits: mx.array,
        u: mx.array | None,
        i: int,
        rows: list[mx.array],
        softmax: Softmax | None = None,
    ) -> mx.array:
        return mx.argmax(logits).astype(mx.int32)

    def draw(
        self, logits: mx.array, key: mx.array, softmax: Softmax | None = None
    ) -> tuple[mx.array, mx.array | None]:
        return mx.argmax(logits, axis=-1).astype(mx.int32), None

    def reviews(self, position: int, probs: dict[int, float]) -> bool:
        return True  # every committed token is the target's argmax


@lru_cache(maxsize=64)
def sampler(cfg: SamplingConfig) -> Sampler:
    """The sampler `cfg` asks for: the one place temperature 0 is decided."""
    return Greedy(cfg) if cfg.greedy else Sampler(cfg)
