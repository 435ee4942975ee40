"""Cost profiles for the replay: what a forward costs on machines the project cannot run, each
with its source. Every profile is in units of one plain target step at a 1,024-token context
on that machine (so only ratios matter, and a profile needs no clock).

A Hardware gives v(L, N): a target forward of L rows (the pending token + L - 1 drafts, or a
tree's nodes) at a context of N tokens, and `rows(L)`: the same forward's growth with L at a
short context, which also shapes a draft forward of L rows (a block draft's K + 1 rows, a tree
depth's candidates) scaled by the draft's cost ratio. A Profile is a Hardware crossed with a
draft cost ratio c (one draft step, or one block forward of 1 row, over a plain step at 1K) and
a context N.

Sources (the project's own files are docs/measurements/; the others public threads):
- zen4: AMD EPYC (family 25 model 17), one core, MKL, the fused attention kernel:
  2026-11-29-epyc-fused-attention.md, "The embedded target, its KV cache filled with N random
  positions", kernel on (ms for L = 1, 2, 3, 5, 8 at N = 1,024 / 4,096 / 8,192). 32K: each L's
  line through 4K and 8K, extended (not measured).
- xeon: the Intel CPU of the 2026-11-23 sessions (2 cores, MKL exact mode):
  2026-11-23-intel-mkl-exact.md (verify v = 1.19 / 1.26 / 1.35 steps for L = 2 / 3 / 4 at
  MT-bench lengths); its context growth from 2026-11-23-intel-openblas-and-h100.md ("30
  softmaxes over the context cost 15 ms for one query row at 1,000 tokens" of a ~95 ms step:
  0.16 steps per row per 1,000 keys, MLX's unfused CPU attention of that session). Beyond
  L = 4, +0.09 a row (the measured slope), not measured.
- m1m2: Apple M1 / M2 (Metal): a comment on mlx-lm PR #990 (AirRunner, 2026-05-16,
  https://github.com/ml-explore/mlx-lm/pull/990): an L = 2 verify costs beta = 1.725 steps on
  an M2, "caps the MTP benefit to ~1.1x or ~1.2x on M1/M2", and `qmv` runs one kernel below a
  vector limit of 6 rows on those GPUs; so 1.725 for L = 2..5, then +0.1 a row (assumed).
  Context: a plain step 1 + N / 32K (KV reads of an 8B-class model; assumed) and, after
  dflash-mlx #32 (an M1 Max at an 8.4K prompt: plain 56.7 tok/s, DFlash 19.3), 0.02 steps per
  extra row per 1,000 keys (assumed, shaped to that collapse).
- m3m5: Apple M3 / M4 / M5 (Metal), as the issue states it: a verify of up to 8 rows costs
  about one step (+0.01 a row), +0.03 a row to 16, +0.1 a row beyond (assumed from the same
  comment: "on M3+ L = 2 ~ L = 1"); context as m1m2's step, 0.002 per extra row per 1K keys.
- m4pro: Apple M4 Pro with a 4-bit model, mlx 0.32.0's `qmv_wide`: mlx issue #3839
  (https://github.com/ml-explore/mlx/issues/3839), cost relative to one row of 4-bit linears of
  an 8B model; weighted by their parameters (the MLP's two thirds): 1.10 / 1.30 / 1.49 / 2.06 /
  2.58 for L = 2 / 3 / 4 / 6 / 8, +0.25 a row beyond (assumed). Context as m3m5.
- h100: NVIDIA H100, MLX's CUDA backend, the embedded pair: 2026-11-23-intel-openblas-and-h100.md
  ("verify cost v (spec)" 1.09 / 1.03 / 1.74 / 1.68 for K = 1..4, so L = 2..5), +0.05 a row
  beyond (assumed); context as m3m5 (no long-context GPU measurement).

Lookup cost (an n-gram lookup, research/measure/ngram_cost) and loop overhead per round
(2026-11-26-loop-overhead.md: ~0.3 ms a round on the CPU against ~57 ms steps; 1.0-1.6% of decode
time on the H100) are small constants per hardware.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

K1 = 1024  # the context every profile's unit step is measured at


def piecewise(points: dict[int, float], slope: float) -> Callable[[int], float]:
    """Linear between the given L, `slope` a row past the last. {1: 1, 3: 2}, 0.1 -> v(2) = 1.5,
    v(5) = 2.2."""
    xs = sorted(points)

    def f(length: int) -> float:
        if length >= xs[-1]:
            return points[xs[-1]] + slope * (length - xs[-1])
        j = max(bisect_right(xs, length) - 1, 0)
        a, b = xs[j], xs[j + 1]
        return points[a] + (points[b] - points[a]) * (length - a) / (b - a)

    return f


@dataclass(frozen=True)
class Hardware:
    """v(L, N) = forward(L, N) / forward(1, 1024); rows(L) = its growth with L at a short
    context (draft forwards of L rows scale by it)."""

    name: str
    label: str
    forward: Callable[[int, int], float]  # (rows, context) -> any unit
    rows: Callable[[int], float]  # rows -> relative to 1 row
    lookup: float  # steps per n-gram lookup
    overhead: float  # steps per round (the loop's own)

    def v(self, length: int, context: int) -> float:
        return self.forward(length, context) / self.forward(1, K1)


def _zen4() -> Hardware:
    table = {  # ms, kernel on: N -> {L: ms}
        1024: {1: 57.6, 2: 47.8, 3: 76.7, 5: 102.4, 8: 113.0},
        4096: {1: 64.0, 2: 59.4, 3: 92.9, 5: 128.5, 8: 150.9},
        8192: {1: 80.3, 2: 79.1, 3: 123.5, 5: 173.5, 8: 206.9},
    }
    curves = {n: piecewise(pts, (pts[8] - pts[5]) / 3) for n, pts in table.items()}

    def forward(length: int, n: int) -> float:
        if n <= 1024:
            return curves[1024](length)
        lo, hi = (1024, 4096) if n <= 4096 else (4096, 8192)
        a, b = curves[lo](length), curves[hi](length)
        return a + (b - a) * (n - lo) / (hi - lo)  # past 8K: the 4K-8K line extended

    return Hardware(
        "zen4", "AMD EPYC Zen 4, 1 core, MKL, fused attention", forward,
        lambda L: forward(L, 1024) / forward(1, 1024), lookup=0.003, overhead=0.005,
    )  # fmt: skip


def _xeon() -> Hardware:
    m = piecewise({1: 1.0, 2: 1.19, 3: 1.26, 4: 1.35}, 0.09)
    return Hardware(
        "xeon", "Intel Xeon, 2 cores, MKL (2026-11-23)",
        lambda L, n: m(L) + 0.16 * L * n / 1000, m, lookup=0.003, overhead=0.005,
    )  # fmt: skip


def _metal(name: str, label: str, m: Callable[[int], float], per_row_key: float) -> Hardware:
    def forward(length: int, n: int) -> float:
        return m(length) + n / 32768 + per_row_key * (length - 1) * n / 1000

    return Hardware(name, label, forward, m, lookup=0.005, overhead=0.01)


HARDWARE: dict[str, Hardware] = {
    hw.name: hw
    for hw in (
        _zen4(),
        _xeon(),
        _metal("m1m2", "Apple M1/M2 (Metal)", piecewise({1: 1.0, 2: 1.725, 5: 1.725}, 0.1), 0.02),
        _metal(
            "m3m5", "Apple M3/M4/M5 (Metal)", piecewise({1: 1.0, 8: 1.07, 16: 1.31}, 0.1), 0.002
        ),
        _metal(
            "m4pro",
            "Apple M4 Pro, 4-bit, mlx 0.32.0",
            piecewise({1: 1.0, 2: 1.10, 3: 1.30, 4: 1.49, 6: 2.06, 8: 2.58}, 0.25),
            0.002,
        ),
        _metal(
            "h100",
            "NVIDIA H100, MLX CUDA (2026-11-23)",
            piecewise({1: 1.0, 2: 1.09, 3: 1.03, 4: 1.74, 5: 1.68}, 0.05),
            0.002,
        ),
    )
}
DRAFT_COSTS = (0.05, 0.1, 0.3, 0.6)
CONTEXTS = (1024, 8192, 32768)


@dataclass(frozen=True)
class Profile:
    """A machine, a draft cost ratio c and a context N: the seconds (in steps) of each piece."""

    hw: Hardware
    c: float
    context: int

    @property
    def name(self) -> str:
        return f"{self.hw.name} c={self.c} N={self.context // 1024}K"

    def verify(self, length: int) -> float:
        """A target forward of `length` rows (plain step: 1), the loop's overhead included."""
        return self.hw.v(length, self.context) + self.hw.overhead

    def draft(self, rows: int = 1) -> float:
        """One draft forward over `rows` rows (a token draft's step: 1; a catch-up: the gap)."""
        return self.c * self.hw.rows(max(rows, 1))

    def block(self, k: int) -> float:
        """One block-draft forward drafting k tokens (k + 1 rows)."""
        return self.c * self.hw.rows(k + 1)


def profiles(
    hardware: tuple[str, ...] | None = None,
    costs: tuple[float, ...] = DRAFT_COSTS,
    contexts: tuple[int, ...] = CONTEXTS,
) -> list[Profile]:
    """Every hardware x draft cost x context (in that order)."""
    names = hardware or tuple(HARDWARE)
    return [Profile(HARDWARE[h], c, n) for h in names for c in costs for n in contexts]
