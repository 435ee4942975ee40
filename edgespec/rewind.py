"""Going back to an earlier position of a prompt cache, whatever its layers are made of.

A speculative round appends the verified drafts to a cache, then drops the rejected ones. mlx-lm's
prompt caches hold three kinds of layer, and each goes back its own way:

- attention KV caches (KVCache, QuantizedKVCache, ChunkedKVCache): trimmed, the offset moved back.
- sliding-window caches (RotatingKVCache: Gemma 3, gpt-oss, Mistral-style windows): a ring of
  exactly `window` positions cannot be trimmed once it has wrapped. `rewindable` swaps each for a
  WindowKVCache, which keeps DEPTH positions beyond the window and masks attention to the window
  itself, so any rewind of up to DEPTH positions is a trim, past the window too.
  Gemma 4's KV-shared layers have no cache: they attend over what an earlier layer's cache just
  returned, so rewinding that cache rewinds them too (docs/architectures.md).
- recurrent state (ArraysCache: gated delta-nets of Qwen3.5 / Qwen3-Next, Mamba, LFM2 convolutions;
  the recurrent half of a CacheList): one state sums up every position and cannot be trimmed.
  `Rewinder` keeps a few restore points (the state arrays as they were before a forward) and a
  rewind goes back to the newest point at or before the wanted position; the loop then feeds the
  tokens after it again (they are the "pending" inputs of its next forward, the cache invariant of
  edgespec/loop.py). A point holds references, not copies: mlx-lm's recurrent layers replace their
  state arrays (`cache[i] = new`) rather than write into them, so the old arrays keep their
  values, and MLX does not reuse a buffer that is still referenced.

Any other kind of layer (RotatingKVCache with `keep` sink tokens, a model's own cache class) can go
back only by starting over: plain decoding does that, speculative decoding refuses such a model
(`Rewinder.unknown`). What a restore costs: docs/architectures.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import ArraysCache, CacheList, RotatingKVCache, _BaseCache

from edgespec.config import MAX_K

# How far back a sliding-window cache can be trimmed: a verify of up to MAX_K drafts plus the
# pending input, plus a pipelined step queued behind it (edgespec/loop.py).
DEPTH = MAX_K + 2
# A verify refeeds the tokens a restore dropped together with its drafts while they are fewer than
# this, else in a forward of their own first (KVState.settle; docs/architectures.md).
REFEED = 8
HISTORY = 12
TRIMMED = (
    "trim",
    "window",
)  # restore points kept besides the oldest (the last commit) and the prompt's end


class WindowKVCache(_BaseCache):
    """A sliding-window KV cache that can be rewound: keys of positions start..offset - 1 in
    temporal order, at least `window - 1 + depth` of them once that many were seen, and masks that
    let position i see only i - window + 1..i (what mlx-lm's RotatingKVCache(window) computes).

    `sinks` > 0: position i also sees the first `sinks` positions (attention sinks, as in
    StreamingLLM): once the window has moved past them, they are kept in front of the window's
    keys (`lead`). A draft's attention bound (cache.Bound) is such a cache on every layer.

    Compaction (dropping positions no query or rewind can need) happens in update_and_fetch, and
    make_mask, called before it, knows where the held keys will start (`_start_after`): every
    window layer of a model shares one offset history, so one mask fits them all.
    """

    step = 256

    def __init__(self, window: int, depth: int = DEPTH, sinks: int = 0):
        if not 0 <= sinks < window:
            raise ValueError(f"need 0 <= sinks < window, got {sinks}, {window}")
        self.window, self.depth, self.sinks = int(window), int(depth), int(sinks)
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0  # positions seen
        self.start = 0  # position of the first held key after the sinks
        self.bounded = False  # made by a draft's attention bound (WindowKVCache.of)

    @classmethod
    def of(cls, full: Any, window: int, depth: int = DEPTH, sinks: int = 0) -> WindowKVCache:
        """A window cache (marked `bounded`: a draft's attention bound made it) holding what a
        full KVCache `full` holds that its queries from now on may see: the sinks and the last
        window - 1 + depth positions (all of them while that reaches back to the sinks)."""
        out = cls(window, depth, sinks)
        out.bounded = True
        n = int(full.offset)
        out.offset = n
        if n == 0 or full.keys is None:
            return out
        start = max(0, n - (window - 1 + depth))
        out.start = 0 if start < sinks + cls.step else start
        kept = []
        for a in (full.keys, full.values):
            if out.start:  # the sinks, then the positions the window still needs
                a = mx.concatenate([a[..., :sinks, :], a[..., out.start : n, :]], axis=2)
            kept.append(mx.contiguous(a[..., : out.size(), :]))
        out.keys, out.values = kept
        return out

    @staticmethod
    def _lead(sinks: int, start: int) -> int:
        """Sink positions held in front of the window's keys: none while the held keys start at
        position 0 (the sinks are then the first of them), else all of them."""
        return sinks if start > 0 else 0

    def _start_after(self, n: int) -> int:
        """Where the held keys start once n more positions arrive. Compaction keeps the last
        window - 1 positions the new queries need plus `depth` more for rewinds, once the buffer
        holds a `step` more than that (so it copies once per `step` positions)."""
        if self.offset + n - self.start <= self.window + self.depth + self.step:
            return self.start
        start = max(self.start, self.offset - self.window + 1 - max(0, self.depth - n))
        return 0 if start < self.sinks else start  # the sinks are never dropped

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        n = keys.shape[2]
        start = self._start_after(n)
        at = self._lead(self.sinks, start) + self.offset - start  # where the new positions go
        if self.keys is None or start != self.start or at + n > self.keys.shape[2]:
            self._reallocate(start, at + n, keys, values)
        assert self.keys is not None and self.values is not None
        self.keys[..., at : at + n, :] = keys
        self.values[..., at : at + n, :] = values
        self.offset += n
        return self.keys[..., : at + n, :], self.values[..., : at + n, :]

    def _reallocate(self, start: int, need: int, keys: mx.array, values: mx.array) -> None:
        """A buffer of room for `need` slots (the sinks in front, then positions from `start`),
        holding the kept ones."""
        room = -(-need // self.step) * self.step
        lead, old_lead = self._lead(self.sinks, start), self._lead(self.sinks, self.start)
        held = self.offset - start
        new = []
        for old, like in ((self.keys, keys), (self.values, values)):
            parts = []
            if old is not None and lead:
                parts.append(old[..., :lead, :])  # the sinks: first in either layout
            if old is not None and held:
                first = old_lead + start - self.start
                parts.append(old[..., first : first + held, :])
            kept = sum(int(p.shape[2]) for p in parts)
            b, heads, _, _ = like.shape
            parts.append(mx.zeros((b, heads, room - kept, like.shape[3]), like.dtype))
            new.append(parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2))
        self.keys, self.values = new
        self.start = start

    def make_mask(self, n: int, window_size: int | None = None, return_array: bool = False) -> Any:
        """The mask of n new queries over the keys update_and_fetch will return: None or "causal"
        while every held key lies inside every query's window, else a boolean array."""
        window = window_size or self.window
        start = self._start_after(n)
        before = self.offset - start  # held keys older than the new ones (sinks apart)
        if start == 0 and self.offset + n <= window and not return_array:
            return None if n == 1 else "causal"
        if not self.sinks:
            if before + n <= window and not return_array:
                return None if n == 1 else "causal"
            return create_causal_mask(n, before, window_size=window)
        lead = self._lead(self.sinks, start)
        queries = mx.arange(self.offset, self.offset + n)[:, None]
        keys = mx.concatenate([mx.arange(lead), mx.arange(start, self.offset + n)])[None]
        return (keys <= queries) & ((keys > queries - window) | (keys < self.sinks))

    def positions(self) -> mx.array:
        """The positions of the keys it holds, in their order: the sinks in front, then the rest."""
        lead = mx.arange(self._lead(self.sinks, self.start))
        return mx.concatenate([lead, mx.arange(self.start, self.offset)])

    def skip(self, to: int) -> None:
        """Jump to position `to` without the positions before it: a bounded draft's catch-up
        (cache.KVState.catch_up), whose later queries never attend to them. The sinks stay;
        they must be held already (offset >= sinks)."""
        if to <= self.offset:
            return
        if self.offset < self.sinks:
            raise ValueError(f"skip: the {self.sinks} sink positions are not held yet")
        keep = self.sinks
        if self.keys is not None and self.values is not None:
            self.keys = self.keys[..., :keep, :] if keep else None
            self.values = self.values[..., :keep, :] if keep else None
        self.offset = self.start = to

    def can_trim(self, n: int) -> bool:
        """Whether dropping the last n positions keeps every key the next queries can see."""
        if n > self.offset:
            return False
        return self.start == 0 or self.offset - n - self.window + 1 >= self.start

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        if not self.can_trim(n):
            raise ValueError(f"a window cache cannot go back {n} positions (depth {self.depth})")
        self.offset -= n
        return n

    @property
    def state(self) -> Any:
        return self.keys, self.values

    @state.setter
    def state(self, v: Any) -> None:
        self.keys, self.values = v

    def size(self) -> int:
        return self._lead(self.sinks, self.start) + self.offset - self.start

    def empty(self) -> bool:
        return self.keys is None and self.offset == 0

    @property
    def nbytes(self) -> int:
        return (
            0 if self.keys is None or self.values is None else self.keys.nbytes + self.values.nbytes
        )


def rewindable(cache: list[Any], depth: int = DEPTH) -> list[Any]:
    """`cache` with every empty RotatingKVCache without sink tokens replaced by a WindowKVCache of
    the same window (inside CacheLists too). Idempotent; other layers are kept as they are."""

    def swap(layer: Any) -> Any:
        if type(layer) is RotatingKVCache and layer.keep == 0 and layer.empty():
            return WindowKVCache(layer.max_size, depth)
        if isinstance(layer, CacheList):
            layer.caches = tuple(swap(c) for c in layer.caches)
        return layer

    return [swap(layer) for layer in cache]


def leaves(cache: list[Any]) -> list[Any]:
    """The layers of a prompt cache, a CacheList's parts in its place."""
    out: list[Any] = []
    for layer in cache:
        out.extend(leaves(list(layer.caches)) if isinstance(layer, CacheList) else [layer])
    return out


def kind(layer: Any) -> str:
    """How a cache layer goes back: "trim", "window", "restore" or "unknown" (start over)."""
    if isinstance(layer, WindowKVCache):
        return "window"
    if isinstance(layer, ArraysCache):
        return "restore"
    if isinstance(layer, RotatingKVCache):  # sink tokens, or already wrapped: not trimmable
        return "unknown"
    trimmable = getattr(layer, "is_trimmable", lambda: False)()
    return "trim" if trimmable and isinstance(getattr(layer, "offset", None), int) else "unknown"


@dataclass(frozen=True)
class Point:
    """A restore point: the state of every recurrent layer after the first `offset` positions."""

    offset: int
    states: tuple[tuple[list[Any], Any, Any], ...]  # (arrays, left_padding, lengths) per layer


def _state(layer: ArraysCache) -> tuple[list[Any], Any, Any]:
    return list(layer.cache), layer.left_padding, layer.lengths


class Rewinder:
    """How one prompt cache goes back: its layers by kind, and the restore points of its recurrent
    layers. KVState (edgespec/cache.py) owns one per cache and calls `before_forward` before every
    forward and `go_back` for every rewind.

    Restore points are taken only where a cache has recurrent layers. Kept: the oldest point (where
    the last rewind landed: the committed context), the newest HISTORY others (a draft's steps),
    and `anchor`, the end of the latest prompt, so that a chat's next turn whose template rewrites
    the previous answer restarts there rather than at position 0.
    """

    def __init__(self, cache: list[Any], history: int = HISTORY):
        self.layers = leaves(cache)
        kinds = [kind(layer) for layer in self.layers]
        self.windows = [c for c, k in zip(self.layers, kinds, strict=True) if k == "window"]
        self.trimmed = [c for c, k in zip(self.layers, kinds, strict=True) if k in TRIMMED]
        self.recurrent = [c for c, k in zip(self.layers, kinds, strict=True) if k == "restore"]
        self.unknown = sorted(
            {type(c).__name__ for c, k in zip(self.layers, kinds, strict=True) if k == "unknown"}
        )
        self.history = history
        self.points: list[Point] = []
        self.anchor: Point | None = None
        self.fed = 0  # positions fed: the offset of a cache none of whose layers counts them

    @property
    def offset(self) -> int:
        """Positions the cache holds: the first layer that counts them, else `fed`."""
        for layer in self.layers:
            if isinstance(getattr(layer, "offset", None), int):
                return int(layer.offset)
        return self.fed

    @property
    def trims(self) -> bool:
        """Whether every layer goes back by trimming alone (no restore, no start over)."""
        return not self.recurrent and not self.unknown

    def before_forward(self, length: int) -> None:
        """Called before a forward of `length` positions: a restore point where there are
        recurrent layers."""
        if self.recurrent:
            here = self.offset
            self.points = [p for p in self.points if p.offset != here]
            self.points.append(Point(here, tuple(_state(c) for c in self.recurrent)))
            if len(self.points) > self.history + 1:
                del self.points[1]  # the oldest stays: it is where the committed context ends
        self.fed += length

    @property
    def all_windows(self) -> bool:
        """Whether every layer is a window cache (a bounded draft's, cache.Bound): only then may
        the cache `skip`."""
        return bool(self.windows) and len(self.windows) == len(self.layers)

    def skip(self, to: int) -> None:
        """Jump every (window) layer to position `to` without computing the positions between
        (WindowKVCache.skip); forgets nothing else: such a cache has no restore points."""
        for layer in self.windows:
            layer.skip(to)
        self.fed = to

    def mark_anchor(self) -> None:
        """Keep the current state as the prompt's restore point (after a prefill)."""
        if self.recurrent:
            self.anchor = Point(self.offset, tuple(_state(c) for c in self.recurrent))

    def reachable(self, keep: int) -> int | None:
        """The latest position <= keep that every layer can go back to, or None (start over)."""
        offset = self.offset
        if keep == offset:
            return keep
        if self.unknown:
            return None
        target = keep
        if self.recurrent:
            found = [p.offset for p in (*self.points, self.anchor) if p and p.offset <= keep]
            if not found:
                return None
            target = max(found)
        if not all(w.can_trim(offset - target) for w in self.windows):
            return None
        return target

    def go_back(self, keep: int) -> int | None:
        """Go back to the latest reachable position <= keep and return it; None when the cache
        must start over (the caller makes a fresh one). Forgets the restore points past it and
        those before it (the loop never goes back past a committed context)."""
        target = self.reachable(keep)
        if target is None:
            return None
        drop = self.offset - target
        if drop:
            for layer in self.trimmed:
                layer.trim(drop)
            self._restore(target)
        self.fed = target
        self.points = [p for p in self.points if p.offset <= target]
        newest = max((p.offset for p in self.points), default=None)
        self.points = [p for p in self.points if p.offset == newest]
        if self.anchor is not None and self.anchor.offset > target:
            self.anchor = None
        return target

    def _restore(self, target: int) -> None:
        """Put the recurrent layers' state back to the restore point at `target`."""
        if not self.recurrent:
            return
        kept = (*reversed(self.points), self.anchor)
        point = next(p for p in kept if p is not None and p.offset == target)
        for layer, (arrays, padding, lengths) in zip(self.recurrent, point.states, strict=True):
            layer.cache, layer.left_padding, layer.lengths = list(arrays), padding, lengths
