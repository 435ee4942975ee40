"""Prefix caches for several conversations: a small LRU pool of cache sets, bounded by bytes.

The Engine holds one cache set (target + draft) and reuses the longest common prefix with what it
holds. A chat client resends the whole conversation every turn, and a server talks to several
clients, so the pool keeps other conversations' cache sets aside and, before each request,
installs the one that shares the longest prefix with the new prompt (Engine.swap_states):

    pool = ConversationPool(engine, budget_bytes=1 << 30, max_slots=4)
    pool.acquire(prompt_ids)     # on the MLX thread, before engine.generate(prompt_ids, ...)
    ...                          # generate; the Engine prefills only the uncached tail
    pool.release()               # after it: enforce the budget (LRU first, never the one in use)

How a set is chosen for a prompt (match = tokens it shares with the set's cached ones):
  - no set shares anything: a fresh set (the least recently used one is dropped if needed);
  - the best set holds at most FORK_TAIL tokens past the match (the same conversation, one turn
    on; the tail is the retokenized or stop-cut end of the last answer): that set is used;
  - it holds more (another conversation with the same system prompt, or an edited turn): the
    match is copied into a new set, so the other conversation stays cached too.
Memory: a set's bytes are its KV arrays' allocated bytes (mlx-lm grows caches 256 positions at a
time and never shrinks them on rewind). The set in use is never dropped, even over the budget.

Several requests at once (edgespec/server/batching.py): each running request holds its own set
(`acquire` returns it, `activate` installs it before each of its rounds, `release(slot)` frees
it). A held set is never given to another request nor dropped; a request whose best match is
held gets a copy of the shared prefix (or a fresh set where a copy is not possible).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from edgespec.cache import Forward, KVState, common_prefix
from edgespec.server.bank import BankedState, in_bank
from edgespec.worker import ServedEngine

# A set whose cached tokens go on for more than this past the prompt's match is copied, not taken.
FORK_TAIL = 32


@dataclass
class Slot:
    """One conversation's cache set (target KVState, its draft family's state or None)."""

    target: KVState
    draft: Any
    used: int = 0  # the pool's clock at its last use (LRU)

    @property
    def tokens(self) -> list[int]:
        return self.target.tokens

    def nbytes(self) -> int:
        """Allocated bytes of both caches (and a feature draft's features)."""
        caches, more = draft_memory(self.draft)
        return cache_size(self.target)[1] + cache_bytes(caches) + more


def per_token(slot: Slot) -> float:
    """A set's allocated bytes per position it holds (0.0 where it holds none)."""
    held = cache_size(slot.target)[0]
    return slot.nbytes() / held if held else 0.0


def cache_bytes(cache: list[Any]) -> int:
    """Allocated bytes of an mlx-lm prompt cache (a list of per-layer caches)."""
    total = 0
    for layer in cache:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, mx.array):
            total += int(keys.nbytes) + int(layer.values.nbytes)
        else:
            total += int(getattr(layer, "nbytes", 0) or 0)
    return total


def cache_size(state: KVState) -> tuple[int, int]:
    """(positions allocated, bytes) of a target's cache, or of its row where a bank holds it
    (edgespec/server/bank.py; reading `state.cache` would give the cache back)."""
    bank = in_bank(state)
    if bank is not None:
        return bank.row_size()
    return positions(state.cache), cache_bytes(state.cache)


def positions(cache: list[Any]) -> int:
    """Positions allocated in a prompt cache's first KV layer (0 when none has grown)."""
    keys = next((c.keys for c in cache if isinstance(getattr(c, "keys", None), mx.array)), None)
    return 0 if keys is None else int(keys.shape[-2])


def forkable(slot: Slot) -> bool:
    """Whether a set's prefix can be copied: plain mlx-lm KVCache layers (no rotating or
    quantized ones) and a draft that allows it (`draft_forkable`)."""
    target = slot.target
    plain = isinstance(target, KVState) and all(type(c) is KVCache for c in target.cache)
    return plain and draft_forkable(slot.draft)


# A draft's state is None (no draft), a token draft's KVState, or a feature family's state (a
# FeatureState, edgespec/drafting/feature.py: EAGLE, MTP, block and assistant drafts): the pool
# asks these two what it holds, by its type, without importing the families' modules.


def draft_memory(draft: Any) -> tuple[list[Any], int]:
    """What a draft's state holds: its per-layer caches, and the bytes it holds besides them (a
    feature draft's features)."""
    if draft is None:
        return [], 0
    if isinstance(draft, KVState):
        return draft.cache, 0
    features = 0 if draft.features is None else int(draft.features.nbytes)
    return draft.kv.cache, features


def draft_forkable(draft: Any) -> bool:
    """Whether a prefix of a draft's state can be copied into another: none's, or a token
    draft's on plain KVCache layers; never a feature draft's (it also holds features, which a
    copied prefix would not bring)."""
    if draft is None:
        return True
    if isinstance(draft, KVState):
        return all(type(c) is KVCache for c in draft.cache)
    return False


def copy_prefix(src: KVState, dst: KVState, n: int) -> None:
    """Make `dst` (an empty state of the same model) hold src's first n cached positions, as
    copies (src is left unchanged and keeps growing on its own)."""
    n = min(n, src.offset)
    dst.rewind(dst.tokens, 0)
    if n == 0:
        return
    copies = []
    for s, d in zip(src.cache, dst.cache, strict=True):
        d.keys = mx.contiguous(s.keys[..., :n, :])
        d.values = mx.contiguous(s.values[..., :n, :])
        d.offset = n
        copies += [d.keys, d.values]
    mx.eval(copies)
    dst.tokens = list(src.tokens[:n])


class ConversationPool:
    """Cache sets of up to `max_slots` conversations within `budget_bytes` (max_slots 0: no
    reuse across requests at all; every request prefills its whole prompt). `run`: the Forward
    every set is built with (a batch's packer, edgespec/server/packing.py; None: each state
    its own). Not thread-safe: the MLX thread owns it, like the Engine."""

    def __init__(
        self,
        engine: ServedEngine,
        budget_bytes: int,
        max_slots: int = 4,
        run: Forward | None = None,
    ):
        if budget_bytes < 0 or max_slots < 0:
            raise ValueError("the cache budget and the number of conversations must be >= 0")
        self.engine, self.budget, self.max_slots = engine, budget_bytes, max_slots
        self._clock, self._run = 0, run
        self.active = Slot(*engine.new_states(run, BankedState))
        engine.swap_states(self.active.target, self.active.draft)
        self.slots = [self.active]
        self.held: list[Slot] = []  # sets held by running requests
        self._per_token = 0.0  # bytes_per_token's last measure

    def acquire(self, prompt: list[int]) -> Slot:
        """Install the best free cache set for `prompt` (see the module docstring), hold it and
        return it; `len(slot.tokens)` it holds beforehand (the Engine recomputes the last one)."""
        self._clock += 1
        if self.max_slots == 0:  # no reuse: any free set, emptied
            slot = next((s for s in self.slots if not self._is_held(s)), None) or self._empty()
            self.empty(slot)
        else:
            slot = self._choose(prompt)
        self.held.append(slot)
        self.activate(slot)
        self._evict()
        return slot

    def _choose(self, prompt: list[int]) -> Slot:
        match, best = self._best(prompt)
        if best is None or match == 0:
            return self._empty()
        taken = self._is_held(best)
        if (taken or len(best.tokens) - match > FORK_TAIL) and self.max_slots > 1:
            if forkable(best):
                return self._fork(best, prompt, match)
        return self._empty() if taken else best

    @staticmethod
    def empty(slot: Slot) -> None:
        """Forget what a set holds (its next request prefills from scratch)."""
        slot.target.reset()
        if slot.draft is not None:
            slot.draft.reset()

    def release(self, slot: Slot | None = None) -> None:
        """After a request (`slot`: its set, default the active one): the set grew; it is free
        again; drop least recently used sets over the limits."""
        slot = self.active if slot is None else slot
        slot.used = self._clock
        self.held = [s for s in self.held if s is not slot]
        self.bytes_per_token()  # measured while the set holds the request's positions
        self._evict()

    def activate(self, slot: Slot) -> None:
        """Install `slot` in the engine (a running request's set, before each of its rounds)."""
        if slot is not self.active:
            self.engine.swap_states(slot.target, slot.draft)
            self.active = slot
        slot.used = self._clock

    def bytes_per_token(self) -> float:
        """Allocated cache bytes per held position, measured on the largest set so far (0.0
        before any set has grown): what one more token of a request costs. Kept once measured:
        a set emptied for the next request (no reuse, `max_slots` 0) holds no position, and
        until a running one grew again a burst's jobs after the first waited a whole turn (its
        prompt's reading) to start."""
        largest = max(self.slots, key=lambda s: cache_size(s.target)[0])
        self._per_token = per_token(largest) or self._per_token
        return self._per_token

    def _is_held(self, slot: Slot) -> bool:
        return any(s is slot for s in self.held)

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.slots)

    def cached(self) -> list[list[int]]:
        """The token ids each set's target cache holds, most recently used first (for tests)."""
        return [list(s.tokens) for s in sorted(self.slots, key=lambda s: -s.used)]

    def _best(self, prompt: list[int]) -> tuple[int, Slot | None]:
        """The set sharing the longest prefix with `prompt` (held ones too: they can be copied)."""
        best, match = None, -1
        for slot in sorted(self.slots, key=lambda s: -s.used):  # ties: the most recent
            m = common_prefix(slot.tokens, prompt)
            if m > match:
                best, match = slot, m
        return max(match, 0), best

    def _empty(self) -> Slot:
        """A set holding nothing: an idle empty one (the first, or one reset after a failure),
        else a new one."""
        slot = next((s for s in self.slots if not s.tokens and not self._is_held(s)), None)
        if slot is None:
            slot = Slot(*self.engine.new_states(self._run, BankedState))
            self.slots.append(slot)
        return slot

    def _fork(self, src: Slot, prompt: list[int], match: int) -> Slot:
        slot = Slot(*self.engine.new_states(self._run, BankedState))
        copy_prefix(src.target, slot.target, min(match, len(prompt) - 1))
        if src.draft is not None:
            shared = common_prefix(src.draft.tokens, prompt)
            copy_prefix(src.draft, slot.draft, min(shared, len(prompt) - 1))
        self.slots.append(slot)
        return slot

    def _evict(self) -> None:
        dropped = False
        while len(self.slots) > 1 and (
            len(self.slots) > self.max_slots or self.nbytes() > self.budget
        ):
            free = [s for s in self.slots if s is not self.active and not self._is_held(s)]
            if not free:
                break
            victim = min(free, key=lambda s: s.used)
            self.slots.remove(victim)
            dropped = True
        if dropped:
            mx.clear_cache()  # hand the dropped arrays' memory back rather than keep it pooled
