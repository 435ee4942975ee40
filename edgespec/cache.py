"""KV-cache state for one model: mlx-lm's trimmable caches plus the token ids they hold.

Invariant (checked by the tests after every round): `len(state.tokens) == state.offset`, and
`state.tokens` is a prefix of the conversation's committed tokens. The loop keeps the newest
committed token out of both caches: it is the input of the next forward, which computes its K/V.

Beside it: a draft's attention bound (edgespec/bound.py: which positions a bounded draft keeps and
reads) and the feature taps (edgespec/taps.py: the hidden states a forward records for a feature
draft, the output head, the vocabulary's width).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

from edgespec.bound import READ_WINDOWS, Bound
from edgespec.config import DRAFT_SINKS, KV_BITS
from edgespec.errors import CacheNotTrimmableError, ConfigError
from edgespec.rewind import REFEED, Rewinder, rewindable
from edgespec.sampling import Softmax
from edgespec.taps import TOP, target_features, text_model

PREFILL_CHUNK = 512
# A prompt tail up to this long is fed in the first round's forward rather than prefilled apart
# (KVState.prefill, merge=True). That forward computes the target's head on every row, so a
# much longer tail costs more in head rows than the separate forward saves (measured:
# docs/measurements/2026-11-27-first-token.md).
MERGE_MAX = 32
CacheFactory = Callable[[Any], list[Any]]  # model -> a fresh prompt cache (one entry per layer)
# Who runs a state's forwards besides itself (a server's batch packs several sequences' into one,
# edgespec/server/packing.py): (state, inputs [L], head_only) -> the logits forward_alone gives.
Forward = Callable[["KVState", mx.array, bool], mx.array]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix. [1, 2, 3], [1, 2, 4, 5] -> 2."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def kv_group_size(model: Any) -> int:
    """The quantization group of `model`'s keys and values in a quantized cache: 64 positions of
    a head's vector where its size allows (mlx-lm's default), else 32; ConfigError for a head
    size MLX cannot quantize (not a multiple of 32)."""
    args = text_model(model).args
    head = getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads
    group = next((g for g in (64, 32) if head % g == 0), None)
    if group is None:
        raise ConfigError(
            f"--kv-bits: the model's attention heads ({head} wide) cannot be quantized"
        )
    return group


def check_kv_bits(bits: int | None) -> int | None:
    """`bits` if it is None, 8 or 4; ConfigError otherwise (in one line)."""
    if bits is not None and bits not in KV_BITS:
        raise ConfigError(f"--kv-bits must be 8 or 4, got {bits}")
    return bits


def quantized(new_cache: CacheFactory, bits: int | None) -> CacheFactory:
    """`new_cache` whose full-attention layers (plain KVCache) are mlx-lm's QuantizedKVCache of
    `bits` (8 or 4) instead; `new_cache` itself for None. Other layers (sliding windows,
    recurrent) keep their own kinds: mlx-lm quantizes only full ones. Each position's keys and
    values are quantized on their own as they are written, so a trimmed cache holds exactly what
    it held before (a rewind is a trim), and a draft's attention bound (Bound.windowed) leaves
    these layers as they are: a quantized draft is never bounded."""
    kv_bits = check_kv_bits(bits)
    if kv_bits is None:
        return new_cache

    def new_quantized_cache(model: Any) -> list[Any]:
        group = kv_group_size(model)
        return [
            QuantizedKVCache(group_size=group, bits=kv_bits) if type(layer) is KVCache else layer
            for layer in new_cache(model)
        ]

    return new_quantized_cache


def check_trimmable(cache: list[Any], name: str) -> list[Any]:
    """`cache` if every layer can go back to an earlier position (trimmed, or restored: see
    edgespec/rewind.py); CacheNotTrimmableError otherwise."""
    unknown = Rewinder(rewindable(cache)).unknown if cache else ["none"]
    if unknown:
        raise CacheNotTrimmableError(
            f"{name}: its cache layers ({', '.join(unknown)}) can be neither rewound nor restored, "
            "so rejected draft tokens could not be undone; speculative decoding does not support "
            "this model (run with --no-spec)"
        )
    return cache


class KVState:
    """One model, its KV cache, and the tokens that cache holds.

    `new_cache(model)` makes a fresh cache (default: mlx-lm's make_prompt_cache; the Engine
    passes the CPU backend's, which marks it for grouped attention). Sliding-window layers become
    rewindable ones (edgespec/rewind.py). Any cache decodes plainly; `check_speculation` says
    whether this one can also speculate. `softmax`: the backend's softmax for warping this
    model's logits (sampling.warp; None: MLX's own; the Engine passes its CPU backend's).
    `run`: who runs its forwards (a Forward, given at build; None: the state itself, alone)."""

    def __init__(
        self,
        model: Any,
        name: str = "model",
        new_cache: CacheFactory = make_prompt_cache,
        softmax: Softmax | None = None,
        run: Forward | None = None,
    ):
        self.model = model
        self.softmax = softmax
        self.name = name
        self.new_cache = new_cache
        self.cache = rewindable(new_cache(model))
        self.layers = Rewinder(self.cache)
        self.tokens: list[int] = []
        self.refeed = REFEED  # see `settle`
        # A draft's attention bound for this request (set by the RoundFactory; None: none).
        self.bound: Bound | None = None
        self.feature_layers: tuple[int, ...] = (TOP,)  # what forward_features returns
        self._run = run
        # Its forwards may run with other sequences': one queued behind another waits for theirs.
        self.shared = run is not None

    @property
    def offset(self) -> int:
        """Positions held by the cache (a Python int: reading it never syncs the device)."""
        return self.layers.offset

    @property
    def trims(self) -> bool:
        """Whether every layer goes back by trimming (no restore points): a drafter may then
        trim the cache itself (drafting/token.py's draft steps in pairs)."""
        return self.layers.trims

    def check_speculation(self) -> None:
        """CacheNotTrimmableError unless every layer can go back to an earlier position."""
        check_trimmable(self.cache, self.name)

    def settle(self, pending: mx.array) -> mx.array:
        """The inputs a verify should feed before its drafts: `pending` [P] (the committed tokens
        the cache does not hold), or only its newest token after the others ran as a forward of
        their own. That happens where the cache has recurrent layers and a restore left `refeed`
        or more committed tokens to feed again: a restore point then marks the committed context,
        and a rejection in the verify never sends them through again (docs/architectures.md)."""
        settled = int(pending.shape[0]) - 1
        if not self.layers.recurrent or settled < max(1, self.refeed):
            return pending
        self.forward(pending[:settled])  # lazy: its logits are never computed, only the cache
        return pending[settled:]

    def forward(self, inputs: mx.array, head_only: bool = False) -> mx.array:
        """inputs [L] int32 -> logits [L, V] (lazy). Appends L positions to the cache; the caller
        must `rewind` afterwards so that `tokens` matches again. `head_only`: a reduced-head draft's
        logits over its head columns, [L, H] (see architectures/token_draft.DraftModel.head_logits).
        With a Forward (`run`), that runs it (the same logits)."""
        if self._run is not None:
            return self._run(self, inputs, head_only)
        return self.forward_alone(inputs, head_only)

    def forward_alone(self, inputs: mx.array, head_only: bool = False) -> mx.array:
        """`forward` as this state's own forward, whoever else runs its forwards."""
        self.layers.before_forward(int(inputs.shape[0]))
        if head_only:
            return self.model.head_logits(inputs[None], cache=self.cache)[0]
        return self.model(inputs[None], cache=self.cache)[0]

    def forward_features(self, inputs: mx.array) -> tuple[mx.array, mx.array]:
        """`forward`, also returning the hidden states of `feature_layers` (the top one unless a
        feature draft asks for more): (features [L, k * d], logits [L, V])."""
        self.layers.before_forward(int(inputs.shape[0]))
        return target_features(self.model, inputs, self.cache, self.feature_layers)

    def rewind(self, context: list[int], keep: int) -> None:
        """Go back to the first `keep` positions, which must equal context[:keep]. A cache with
        recurrent layers may land earlier, at its latest restore point (or at 0, a fresh cache):
        the loop feeds context[offset:] next, so that costs time, never exactness."""
        if keep > self.offset:
            raise ValueError(f"{self.name}: cannot rewind forward ({self.offset} -> {keep})")
        if self.layers.go_back(keep) is None:
            self.reset()
        self.tokens = list(context[: self.offset])

    def keep_common(self, prompt: list[int]) -> None:
        """Go back to the longest prefix shared with `prompt` (at most prompt[:-1]), feeding
        nothing: the cache then holds a prefix of the prompt, as the loop's drafters expect."""
        self.rewind(self.tokens, min(common_prefix(self.tokens, prompt), len(prompt) - 1))

    def prefill(
        self,
        prompt: list[int],
        merge: bool = False,
        cancel: threading.Event | None = None,
        on_chunk: Callable[[int, int], object] | None = None,
    ) -> int:
        """Make the cache hold prompt[:-1], reusing the longest common prefix with what it holds.

        The last prompt token is left out: it is the input of the first decoding forward (so a
        fully cached prompt still gets its last logits recomputed). `merge`: where at most
        MERGE_MAX prompt tokens are not cached, leave them all to that forward instead, so that
        the first token comes from one forward (attention caches only: recurrent layers keep
        their restore point at prompt[:-1]). Returns the number of prompt tokens that will be
        run (the fed tail plus what is left to the first forward).

        After each chunk, `on_chunk(done, total)` (the tokens fed of those to feed); a `cancel`
        set before a chunk stops there: the cache then holds the prompt's first chunks, a prefix
        like any other, which the next request reuses or rewinds.
        """
        self.keep_common(prompt)
        end = len(prompt) - 1
        first = self.catch_up(prompt[:end])  # the common prefix, or an earlier restore point
        if merge and self.trims and len(prompt) - first <= MERGE_MAX:
            end = first
        for start in range(first, end, PREFILL_CHUNK):
            if cancel is not None and cancel.is_set():
                end = start
                break
            stop = min(start + PREFILL_CHUNK, end)
            self.forward(mx.array(prompt[start:stop], dtype=mx.int32))
            mx.eval([c.state for c in self.cache])
            if on_chunk is not None:
                on_chunk(stop - first, end - first)
        self.tokens = list(prompt[:end])
        self.layers.mark_anchor()
        return len(prompt) - first

    def catch_up(self, context: list[int], read: Callable[[int, int], Any] | None = None) -> int:
        """Before reading context[offset:]: a `bound` draft past its start turns its full cache
        into windows (Bound.windowed), and one far behind reads only its sinks (`read(a, b)` feeds
        positions a..b - 1: their tokens unless given) and its last READ_WINDOWS windows, skipping
        the rest (WindowKVCache.skip). Returns the offset to feed from (unchanged without a bound)."""
        bound = self.bound
        if bound is None or len(context) <= bound.start:
            return self.offset
        if (layers := bound.windowed(self.cache)) is not None:
            self.cache = layers
            self.layers = Rewinder(self.cache)
        reach = READ_WINDOWS * bound.window
        if not self.layers.all_windows or len(context) - self.offset <= reach + bound.sinks:
            return self.offset
        read = read or (lambda a, b: self.forward(mx.array(context[a:b], dtype=mx.int32)))
        if self.offset < bound.sinks:  # the sinks are read first, once
            read(self.offset, bound.sinks)
            mx.eval([c.state for c in self.cache])
        to = len(context) - reach
        self.layers.skip(to)
        self.tokens = list(context[:to])
        return to

    def bind(self, window: int) -> None:
        """A draft's attention bound from now on: `window` positions and DRAFT_SINKS sinks (Bound);
        0: none, and a cache turned into windows starts over (a draft tree needs a full one)."""
        self.bound = Bound(window, DRAFT_SINKS) if window else None
        if not window and any(getattr(layer, "bounded", False) for layer in self.layers.layers):
            self.reset()

    def reset(self) -> None:
        """Forget everything (a fresh cache)."""
        self.cache = rewindable(self.new_cache(self.model))
        self.layers = Rewinder(self.cache)
        self.tokens = []
