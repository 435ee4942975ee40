"""Several sequences' one-token forwards over one shared KV buffer (a bank): the plain steps of a
served batch, with one attention for all of them.

A packed forward (edgespec/server/packed.py) runs every sequence's attention on its own cache: per
layer and sequence, slices of the new rows, the cache update and an attention of its own. With
a handful of one-token steps that graph work costs more than the rows' products on a 2-core CPU
(docs/measurements/2026-11-27-serve-bank.md). A bank
holds the sequences' keys and values as rows of one [B, G, capacity, D] array per layer, each row
from position 0 with the unused tail masked, so a step appends one key per row and runs one
masked attention over all rows.

Exact: a row's attention over its first n keys, with the rest masked, gives the bits of the same
attention over those n keys alone (MLX's attention on the CPU; the masked keys add exact zeros
at the end of each sum), and the other rows of the forward are row-wise as in a packed forward.
A bank test checks the logits and the caches against lone forwards.

While a sequence is in a bank, the bank holds its keys and values and its own cache layers only
count positions (their offsets move with every step, and a rewind trims them as before: the bank
reads the offsets at each step). Anything that reads its cache (`BankedState.cache`) first
empties the bank (`flush`): every row goes back into its own cache layers. A bank takes only
BankedStates: the server builds its targets' states of that kind (Engine.new_states(run, kind),
edgespec/server/prefix.py); the core's KVState knows nothing of banks.

    bank = Bank(model, kernels)
    bank.take(states)                   # states' caches into the bank (BankedStates, llama-style)
    logits = bank.forward(states, ids)  # ids: one [1] int32 per state; logits [1, V] each, lazy
    bank.flush()                        # back into each state's own cache
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from edgespec.cache import KVState
from edgespec.trees.forward import PLAIN, Kernels, Rotary, block_qkv, head_of, tree_layers

STEP = 256  # positions a row grows by (mlx-lm's KVCache.step)


class BankedState(KVState):
    """A KVState whose keys and values a Bank may hold (`bank`, set while it does): reading its
    cache gives them back first."""

    bank: Bank | None = None

    @property  # type: ignore[override]
    def cache(self) -> list[Any]:
        """The cache's layers (mlx-lm's), with their keys and values: a bank holding them gives
        them back first."""
        if self.bank is not None:
            self.bank.flush()
        return self._cache

    @cache.setter
    def cache(self, layers: list[Any]) -> None:
        if self.bank is not None:
            self.bank.flush()
        self._cache = layers


def in_bank(state: Any) -> Bank | None:
    """The bank holding `state`'s keys and values, if any (any state: a KVState is never banked)."""
    return state.bank if isinstance(state, BankedState) else None


def _room(positions: int) -> int:
    """Capacity for `positions`: a multiple of STEP, at least one."""
    return max(1, -(-positions // STEP)) * STEP


def fits(lengths: Sequence[int]) -> bool:
    """Whether rows of these lengths share a bank without padding the shorter ones by more than
    STEP positions each beyond what their own caches allocate: a long conversation beside short
    ones would make every row as long as it, and the memory several times theirs."""
    rows = len(lengths) * _room(max(lengths) + 1)
    return rows <= sum(_room(n + 1) for n in lengths) + len(lengths) * STEP


class Bank:
    """The keys and values of some sequences of one model, as rows of shared arrays."""

    def __init__(self, model: Any, kernels: Kernels = PLAIN):
        self.model, self.kernels = model, kernels
        self.states: list[BankedState] = []
        self.keys: list[mx.array] = []  # per layer [B, G, capacity, D]
        self.values: list[mx.array] = []

    def holds(self, states: Sequence[KVState]) -> bool:
        """Whether the bank holds exactly these states, in this order."""
        return len(states) == len(self.states) and all(
            a is b for a, b in zip(states, self.states, strict=True)
        )

    def row_size(self) -> tuple[int, int]:
        """(positions allocated, bytes) of one row."""
        rows = max(1, len(self.states))
        nbytes = sum(int(a.nbytes) for a in (*self.keys, *self.values))
        return (int(self.keys[0].shape[2]) if self.keys else 0), nbytes // rows

    def take(self, states: Sequence[BankedState]) -> None:
        """Move the states' keys and values into the bank (emptying it first)."""
        self.flush()
        caches = [state.cache for state in states]  # each flushed from any other bank
        self.states = list(states)  # from here on theirs (`drop` starts them over on a failure)
        for state in states:
            state.bank = self
        lengths = [int(cache[0].offset) for cache in caches]
        room = _room(max(lengths) + 1)
        for i in range(len(caches[0])):
            self.keys.append(_rows([c[i].keys for c in caches], lengths, room))
            self.values.append(_rows([c[i].values for c in caches], lengths, room))
            for cache in caches:
                cache[i].keys = cache[i].values = None  # the bank holds them now
        mx.eval(self.keys, self.values)

    def flush(self) -> None:
        """Every row back into its state's own cache layers; the bank is empty after."""
        if not self.states:
            return
        restored = []
        for b, state in enumerate(self.states):
            state.bank = None
            cache = state.cache
            room = _room(int(cache[0].offset))
            for i, layer in enumerate(cache):
                layer.keys = mx.contiguous(self.keys[i][b : b + 1, :, :room])
                layer.values = mx.contiguous(self.values[i][b : b + 1, :, :room])
                restored += [layer.keys, layer.values]
        mx.eval(restored)
        self.states, self.keys, self.values = [], [], []

    def drop(self) -> None:
        """Empty the bank without giving the rows back (a step failed and left them unknown):
        each state starts over with a fresh cache, as after `KVState.reset`."""
        states, self.states, self.keys, self.values = self.states, [], [], []
        for state in states:
            state.bank = None
            state.reset()

    def forward(self, states: Sequence[BankedState], inputs: Sequence[mx.array]) -> list[mx.array]:
        """One token per state (`holds(states)` must be true): logits [1, V] each, lazy; one
        position appended to each state's row and counted in its cache layers."""
        lengths = [state.offset for state in states]
        if max(lengths) + 1 > self.keys[0].shape[2]:
            self._grow(_room(max(lengths) + 1))
        top = max(lengths) + 1
        offsets = mx.array(lengths, dtype=mx.int32)
        allowed = (mx.arange(top)[None, :] <= offsets[:, None])[:, None, None, :]
        trunk = self.model.model
        h = trunk.embed_tokens(mx.concatenate(list(inputs))[None])  # [1, B, d]: the rows
        rotary, where = Rotary(offsets), None
        for i, layer in enumerate(tree_layers(self.model)):
            q, k, v, finish = block_qkv(layer, h, rotary, self.kernels)
            q, k, v = (a.swapaxes(0, 2) for a in (q, k, v))  # [B, heads, 1, D]: a row each
            if where is None:  # the column each row writes, for every layer's keys and values
                where = mx.broadcast_to(offsets[:, None, None, None], k.shape)
            keys = self.keys[i] = mx.put_along_axis(self.keys[i], where, k, axis=2)
            values = self.values[i] = mx.put_along_axis(self.values[i], where, v, axis=2)
            heads = mx.fast.scaled_dot_product_attention(
                q, keys[:, :, :top], values[:, :, :top], scale=layer.self_attn.scale, mask=allowed
            )
            h = finish(heads.swapaxes(0, 2))
        for state in states:
            for layer in state.layers.layers:
                layer.offset += 1
        logits = head_of(self.model)(trunk.norm(h))[0]
        return [logits[b : b + 1] for b in range(len(states))]

    def _grow(self, room: int) -> None:
        def grown(a: mx.array) -> mx.array:
            b, g, n, d = a.shape
            return mx.concatenate([a, mx.zeros((b, g, room - n, d), a.dtype)], axis=2)

        self.keys = [grown(a) for a in self.keys]
        self.values = [grown(a) for a in self.values]


def _rows(parts: Sequence[mx.array], lengths: Sequence[int], room: int) -> mx.array:
    """[B, G, room, D]: each part's first `length` positions, zeros after."""
    rows = []
    for part, n in zip(parts, lengths, strict=True):
        row = part[:, :, :n]
        rows.append(mx.pad(row, [(0, 0), (0, 0), (0, room - n), (0, 0)]))
    return mx.concatenate(rows)
