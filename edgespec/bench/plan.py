"""What `edgespec bench` can measure and how much of it: the methods' names and settings, and
the plan (methods, K, temperatures, lengths) checked as the command line gives it. Nothing here
imports MLX or mlx-lm, so the command refuses bad settings at once (edgespec/bench/methods.py
gives each method its runner)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgespec.bench.records import PLAIN
from edgespec.config import SamplingConfig, SpecConfig
from edgespec.errors import ConfigError

# The `tree` method's shape (SpecConfig.tree): EAGLE-2 style dynamic trees, K deep
# (docs/drafting.md, Trees).
BENCH_TREE = "dynamic"


# EdgeSpec's methods: name -> (description, needs a draft, takes a K list, SpecConfig fields).
# A method that takes a K list gets SpecConfig(k=K, adaptive=False, ...) per K (`tree` and
# `block-tree` keep their fallback: adaptive=True, K the depth, trees/fallback.py FallbackTree, as
# `--tree` and `--method block-tree` run); adaptive ones take
# no K list (K is chosen per round, starting from SpecConfig's default and capped by its k_max).
SPEC_METHODS: dict[str, tuple[str, bool, bool, dict[str, Any]]] = {
    PLAIN: ("target alone through EdgeSpec's loop", False, False, {"method": "none"}),
    "spec": ("EdgeSpec, draft model", True, True, {"method": "draft"}),
    "ngram": ("EdgeSpec, n-gram prompt lookup (no draft)", False, True, {"method": "ngram"}),
    "hybrid": (
        "EdgeSpec, n-gram when it matches, else the draft",
        True,
        True,
        {"method": "hybrid"},
    ),
    "adaptive": (
        "EdgeSpec, draft model, K chosen per round",
        True,
        False,
        {"method": "draft", "adaptive": True},
    ),
    "adaptive-ngram": (
        "EdgeSpec, n-gram lookup, K chosen per round",
        False,
        False,
        {"method": "ngram", "adaptive": True},
    ),
    "adaptive-hybrid": (
        "EdgeSpec, hybrid drafting, K chosen per round",
        True,
        False,
        {"method": "hybrid", "adaptive": True},
    ),
    "tree": (
        f"EdgeSpec, draft trees {BENCH_TREE} K deep, a chain or plain steps where they lose",
        True,
        True,
        {"method": "draft", "tree": BENCH_TREE, "adaptive": True},  # as `--tree` (FallbackTree)
    ),
    "adaptive-tree": (
        "EdgeSpec, chain or tree chosen per round",
        True,
        False,
        {"method": "draft", "tree": "auto"},
    ),
    "block": ("EdgeSpec, block draft (one draft forward a round)", True, True, {"method": "block"}),
    "adaptive-block": (
        "EdgeSpec, block draft, K chosen per round",
        True,
        False,
        {"method": "block", "adaptive": True},
    ),
    "block-tree": (
        f"EdgeSpec, trees from a block draft, {BENCH_TREE} K deep",
        True,
        True,
        # as `--method block-tree` runs: the tree where it pays, else a chain or a plain step
        {"method": "block-tree", "adaptive": True},
    ),
    "mtp": ("EdgeSpec, the target's own MTP head (--draft mtp)", True, True, {"method": "mtp"}),
}


# mlx-lm's own decoding, the peers: name -> (description, needs a draft, takes a K list).
PEER_METHODS: dict[str, tuple[str, bool, bool]] = {
    "mlx-lm": ("mlx_lm.stream_generate with the draft", True, True),
    "mlx-lm-plain": ("mlx_lm.stream_generate, no draft", False, False),
}

# Every method's name -> whether it takes a K list.
USES_K: dict[str, bool] = {
    **{name: row[2] for name, row in SPEC_METHODS.items()},
    **{name: row[2] for name, row in PEER_METHODS.items()},
}
# adaptive-hybrid: what `edgespec chat` and `generate` run by default.
DEFAULT_METHODS = (PLAIN, "spec", "mlx-lm", "adaptive-hybrid")
# The methods that run a draft model token by token (the token engine's, when one is set).
TOKEN_METHODS = ("spec", "hybrid", "adaptive", "adaptive-hybrid", "tree", "adaptive-tree")


@dataclass(frozen=True)
class BenchPlan:
    """What to measure. Each (method, K, temp) variant runs on every prompt in every repeat."""

    methods: tuple[str, ...] = DEFAULT_METHODS
    ks: tuple[int, ...] = (4,)
    temps: tuple[float, ...] = (0.0,)
    max_tokens: int = 128
    repeats: int = 1
    seed: int = 0
    warmup_tokens: int = 16
    # Acceptance and tokens per round per span of this many answer tokens (0: not measured).
    position_width: int = 0

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in USES_K]
        if unknown:
            raise ConfigError(f"unknown methods {unknown}; choose from {', '.join(USES_K)}")
        for k in self.ks:  # the same checks and messages as generate's
            SpecConfig(k=k)
        for t in self.temps:
            SamplingConfig(temperature=t, seed=self.seed)
        if self.seed >= 2**63:  # each run's seed is this one plus an offset (iter_bench)
            raise ConfigError(f"bench's seed must be in [0, 2**63), got {self.seed}")
        if self.max_tokens < 1 or self.repeats < 1:
            raise ConfigError("max-tokens and repeats must be >= 1")
        if self.position_width < 0:
            raise ConfigError(f"--by-position must be >= 1 token, got {self.position_width}")

    def variants(self) -> list[tuple[str, int]]:
        """(method, K) pairs run at each temperature; K=0 for methods that take no K."""
        return [(m, k) for m in self.methods for k in (self.ks if USES_K[m] else (0,))]

    def total_runs(self, n_prompts: int) -> int:
        return self.repeats * n_prompts * len(self.temps) * len(self.variants())
