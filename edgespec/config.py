"""Frozen, validated settings. Invalid values raise ConfigError with a message a user can act on."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from edgespec.errors import ConfigError

# The largest K (drafted tokens per round, also k-max and ngram-k) and n-gram length accepted: a
# round's cost grows with K while its expected gain stops growing long before (docs/drafting.md).
MAX_K = 64
DEFAULT_K_MAX = 8  # SpecConfig.k_max's default
# A draft's attention bound (SpecConfig.draft_window, bound.Bound): the window, in positions,
# and the first positions every draft position also sees (attention sinks). On this project's
# measurements a window of 256 to 1024 kept a token draft's acceptance at 2K tokens of context
# (docs/measurements/2026-11-28-long-context-draft.md); 1024 leaves room to spare. The window a
# draft gets when no window is asked for is its family's (Family.default_window, measured per
# family at 4K and 8K: docs/measurements/2026-12-06-block-bound-and-window.md); DRAFT_WINDOW is
# the one a family that keeps a window takes.
DRAFT_WINDOW = 1024
WHOLE_CONTEXT = 0  # a draft_window of 0: the draft attends to the whole context
DRAFT_SINKS = 4
MIN_DRAFT_WINDOW = 2 * (MAX_K + 2)  # twice what a rewind may drop (rewind.DEPTH)
# Bits of a quantized KV cache (Engine kv_bits, --kv-bits; edgespec/cache.py quantized).
KV_BITS = (8, 4)
MAX_TREE_NODES = 64  # one verify forward of a draft tree: its nodes plus the pending token
TREE_SPECS = "'chain', a width list such as '3,2,1,1', 'dynamic', 'dynamic:NODES' or 'auto'"
SEED_LIMIT = 2**64  # MLX keys are two uint32 words: seeds are in [0, 2**64)


@dataclass(frozen=True)
class SamplingConfig:
    """How a distribution is warped before sampling; applied identically to p (target) and q (draft).

    temperature == 0 means greedy (argmax); the other warps are then irrelevant.
    top_k == 0 and min_p == 0 and top_p == 1 disable those warps.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < math.inf:
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ConfigError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")
        if not (0 <= self.min_p < 1):
            raise ConfigError(f"min-p must be in [0, 1), got {self.min_p}")
        if not 0 <= self.seed < SEED_LIMIT:
            raise ConfigError(f"seed must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# Drafting methods: "draft" (a draft model), "ngram" (prompt lookup), "hybrid", "mtp" (the target's
# own multi-token-prediction head, edgespec/architectures/mtp.py), "block" a block draft (DFlash-style:
# architectures/block_model.py), "block-tree" trees from it, or "none" (plain target).
METHODS = ("draft", "ngram", "hybrid", "mtp", "none", "block", "block-tree")
MTP_DRAFT = "mtp"  # the draft spec that names the target's own MTP head
BLOCK_METHODS = ("block", "block-tree")
# Why a method drafts no trees, where it is not plain (the tree forward: edgespec/trees/forward.py).
NO_TREE_REASON = {
    "mtp": ": the tree forward runs llama, mistral, qwen2 and qwen3 targets, and the models that "
    "ship an MTP head (Qwen3.5, Qwen3-Next, DeepSeek-V3, GLM-4.5, MiMo) are none of them; "
    "drop --tree"
}


def parse_tree_spec(text: str) -> str:
    """Validate a --tree value: 'chain', 'dynamic' (or 'dynamic:N', keeping N nodes), 'auto' or
    widths '3,2,1,1' (1..8 deep, at most MAX_TREE_NODES nodes). Returns it normalised;
    ConfigError otherwise."""
    text = text.strip().lower().replace(" ", "")
    if text in ("chain", "dynamic", "auto"):
        return text
    found = re.fullmatch(r"dynamic:(\d+)", text)
    if found:
        if not 1 <= int(found[1]) <= MAX_TREE_NODES:
            raise ConfigError(f"--tree dynamic:N needs 1 <= N <= {MAX_TREE_NODES}, got {text!r}")
        return f"dynamic:{int(found[1])}"
    if not re.fullmatch(r"\d+(,\d+)*", text):
        raise ConfigError(f"--tree must be {TREE_SPECS}, got {text!r}")
    widths = [int(w) for w in text.split(",")]
    if not 1 <= len(widths) <= 8 or min(widths) < 1 or sum(widths) > MAX_TREE_NODES:
        raise ConfigError(
            f"--tree widths need 1..8 depths of >= 1 candidates and at most {MAX_TREE_NODES} "
            f"nodes in all, got {text!r}"
        )
    return ",".join(str(w) for w in widths)


def spec_widths(text: str) -> list[int]:
    """The widths of a validated width-list spec: '3,2,1' -> [3, 2, 1]."""
    return [int(w) for w in text.split(",")]


@dataclass(frozen=True)
class SpecConfig:
    """How speculation runs. k is the (maximum) number of drafted tokens per round, except that a
    hybrid round drafted by the n-gram lookup proposes up to max(k, ngram_k) tokens (a lookup
    costs no draft steps; ngram_k 1 by default, because on the CPU a verify of 3+ tokens costs
    much more than one of 2: docs/drafting.md). Adaptive K picks the lookup length itself.
    Whatever the K, a lookup whose suffix match is at least ngram_long tokens long (or ngram_max,
    if shorter; 0 turns this off) proposes up to max(K, ngram_long_k) tokens: a long match is a copy
    in progress (docs/drafting.md)."""

    # The default, for the library and the command line alike: the fastest setting measured on
    # every input kind (docs/measurements/: MT-bench and grounded inputs alike), and one that tunes
    # K to the machine it runs on. k is then the first rounds' K.
    k: int = 4
    method: str = "hybrid"
    adaptive: bool = True
    ngram_max: int = 8
    ngram_min: int = (
        1  # a 2-token verify costs ~1 step now, so one-token matches pay (docs/drafting.md)
    )
    # Adaptive K's bound. Left at DEFAULT_K_MAX, a block draft's own bound replaces it: its block
    # size - 1, the tokens one draft forward fills as it was trained (strategy.py k_bound).
    k_max: int = DEFAULT_K_MAX
    ngram_k: int = 1
    ngram_long: int = 8
    ngram_long_k: int = 5
    # Draft trees (docs/drafting.md, Trees): "" for chains (the default loop), else "chain", a
    # width list such as "3,2,1,1", "dynamic" or "auto" (the adaptive policy's choice per round).
    tree: str = ""
    # A draft's attention bound (bound.Bound; token, feature and block drafts' own attention, a
    # Gemma 4 assistant's reading of the target's full layer): past 2 * draft_window tokens of
    # context it attends to its first DRAFT_SINKS positions and its last draft_window ones, so a
    # draft step costs the same at any length; 0 attends to the whole context; None (the
    # default) takes the draft family's own default (`window`, Family.default_window). Drafts
    # only: the target verifies every token over the whole context, so output is unchanged.
    draft_window: int | None = None

    def __post_init__(self) -> None:
        if self.draft_window and not MIN_DRAFT_WINDOW <= self.draft_window:
            raise ConfigError(
                f"draft-window must be 0 (the whole context) or >= {MIN_DRAFT_WINDOW}, got "
                f"{self.draft_window}"
            )
        if not 1 <= self.k <= MAX_K:
            raise ConfigError(f"K (draft tokens per round) must be in 1..{MAX_K}, got {self.k}")
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        if not (1 <= self.ngram_min <= self.ngram_max <= MAX_K):
            raise ConfigError(
                f"need 1 <= ngram-min <= ngram-max <= {MAX_K}, got {self.ngram_min}, "
                f"{self.ngram_max}"
            )
        if not 1 <= self.ngram_k <= MAX_K:
            raise ConfigError(f"ngram-k must be in 1..{MAX_K}, got {self.ngram_k}")
        if not 0 <= self.ngram_long <= MAX_K:
            raise ConfigError(
                f"ngram-long must be in 0..{MAX_K} (0: no long lookups), got {self.ngram_long}"
            )
        if not 1 <= self.ngram_long_k <= MAX_K:
            raise ConfigError(f"ngram-long-k must be in 1..{MAX_K}, got {self.ngram_long_k}")
        if self.k_max > MAX_K:
            raise ConfigError(f"k-max must be <= {MAX_K}, got {self.k_max}")
        if self.k_max < self.k:
            object.__setattr__(self, "k_max", self.k)
        if self.method == "block-tree" and not self.tree:
            object.__setattr__(self, "tree", "dynamic")  # best-first under a node budget
        if self.tree:
            object.__setattr__(self, "tree", parse_tree_spec(self.tree))
            if self.method not in ("draft", "hybrid", *BLOCK_METHODS):
                why = NO_TREE_REASON.get(self.method, "")
                raise ConfigError(
                    f"--tree needs --method draft, hybrid, block or block-tree, not "
                    f"{self.method}{why}"
                )

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def uses_draft(self) -> bool:
        """Whether the method runs the draft model (every method but ngram and none)."""
        return self.method in ("draft", "hybrid", "mtp", *BLOCK_METHODS)

    @property
    def long_match(self) -> int:
        """The suffix match length from which a lookup proposes up to ngram_long_k tokens
        (0: never): ngram_long, capped at ngram_max, the longest match looked up."""
        return min(self.ngram_long, self.ngram_max)

    def window(self, default: int) -> int:
        """The draft window this request bounds a draft to (0: the whole context): the one asked
        for, else `default` (the draft family's, Family.default_window); 0 for a tree, whose
        forward needs the draft's full cache."""
        if self.tree:
            return WHOLE_CONTEXT
        return default if self.draft_window is None else self.draft_window


@dataclass(frozen=True)
class GenerationConfig:
    """One request: sampling + speculation + length."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    spec: SpecConfig = field(default_factory=SpecConfig)
    max_tokens: int = 256

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError(f"max-tokens must be >= 1, got {self.max_tokens}")
