"""KV-cache state for one model: mlx-lm's trimmable caches plus the token ids they hold.

Invariant (checked by the tests after every round): `len(state.tokens) == state.offset`, and
`state.tokens` is a prefix of the conversation's committed tokens. The loop keeps the newest
committed token out of both caches: it is the input of the next forward, which computes its K/V.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from edgespec.cpu import blocks, leanops, rope
from edgespec.cpu.attention import mark
from edgespec.errors import CacheNotTrimmableError

PREFILL_CHUNK = 512


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix. [1, 2, 3], [1, 2, 4, 5] -> 2."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def vocab_size(model: Any) -> int:
    """Width of the model's output logits (its `args.vocab_size`)."""
    return int(model.args.vocab_size)


def check_trimmable(model: Any, name: str) -> list[Any]:
    """A fresh prompt cache for `model`; refuse models whose caches cannot be rewound."""
    cache = make_prompt_cache(model)
    if not cache or not can_trim_prompt_cache(cache) or not hasattr(cache[0], "offset"):
        kinds = sorted({type(c).__name__ for c in cache}) or ["none"]
        raise CacheNotTrimmableError(
            f"{name}: its KV cache ({', '.join(kinds)}) cannot be rewound, so rejected draft "
            "tokens could not be undone; speculative decoding needs a trimmable (attention) cache"
        )
    return cache


class KVState:
    """One model, its KV cache, and the tokens that cache holds."""

    def __init__(self, model: Any, name: str = "model"):
        self.model = model
        self.name = name
        self.cache = check_trimmable(model, name)
        mark(self.cache)  # short multi-token forwards: grouped attention on the CPU
        rope.install(model)  # rotary embeddings from tables on the CPU (same bits, fewer ops)
        leanops.install(model)  # Linear/RMSNorm without per-call transposes/broadcasts (same)
        blocks.install(model)  # llama blocks in two compiled pieces around the attention (same)
        self.tokens: list[int] = []

    @property
    def offset(self) -> int:
        """Positions held by the cache (a Python int: reading it never syncs the device)."""
        return int(self.cache[0].offset)

    def forward(self, inputs: mx.array, head_only: bool = False) -> mx.array:
        """inputs [L] int32 -> logits [L, V] (lazy). Appends L positions to the cache; the caller
        must `rewind` afterwards so that `tokens` matches again. `head_only`: a reduced-head draft's
        logits over its head columns, [L, H] (see draft_model.DraftModel.head_logits)."""
        if head_only:
            return self.model.head_logits(inputs[None], cache=self.cache)[0]
        return self.model(inputs[None], cache=self.cache)[0]

    def rewind(self, context: list[int], keep: int) -> None:
        """Trim the cache to its first `keep` positions, which must equal context[:keep]."""
        if keep > self.offset:
            raise ValueError(f"{self.name}: cannot rewind forward ({self.offset} -> {keep})")
        trim_prompt_cache(self.cache, self.offset - keep)
        self.tokens = list(context[:keep])

    def prefill(self, prompt: list[int]) -> int:
        """Make the cache hold prompt[:-1], reusing the longest common prefix with what it holds.

        The last prompt token is left out: it is the input of the first decoding forward (so a
        fully cached prompt still gets its last logits recomputed). Returns the number of prompt
        tokens that will be run (the fed tail plus that last token).
        """
        keep = min(common_prefix(self.tokens, prompt), len(prompt) - 1)
        self.rewind(self.tokens, keep)
        for start in range(keep, len(prompt) - 1, PREFILL_CHUNK):
            chunk = prompt[start : min(start + PREFILL_CHUNK, len(prompt) - 1)]
            self.forward(mx.array(chunk, dtype=mx.int32))
            mx.eval([c.state for c in self.cache])
        self.tokens = list(prompt[:-1])
        return len(prompt) - keep

    def reset(self) -> None:
        """Forget everything (a fresh cache)."""
        self.cache = make_prompt_cache(self.model)
        mark(self.cache)
        self.tokens = []
