"""The running requests' forwards, run together: one packed forward (edgespec/server/packed.py) per
model per step of the batch instead of one forward per request.

Each running request's generation runs in a `Task`, a greenlet of the MLX thread (greenlets are
coroutines that switch inside one OS thread, so MLX only ever sees that thread). The loop knows
nothing of it: the server's cache sets are built with the packer as their states' Forward
(cache.Forward, Engine.new_states(packer)), so when the loop asks the target state for a forward
(KVState.forward: a verify, a plain step, a prefill chunk) or the draft state for a draft step,
`Packer.__call__` parks the request and switches back to the batch
(edgespec/server/batching.py); outside a request it runs the forward alone. Once every
running request has finished its round or parked a forward, `Packer.run` runs the parked
forwards together and each request resumes with its own logits, as if its own forward had
returned them. Where the same requests' targets step one token each, forward after forward (a
batch stepping plainly), those steps run in a bank instead (edgespec/server/bank.py): the requests'
keys and values in one shared array, one attention for all of them.

    packer = Packer(kernels)
    target, draft = engine.new_states(packer)   # a set whose forwards go through it
    task = Task(step)                    # step(): one round of the request, its outcome at the end
    msg = task.resume()                  # ROUND, a Park, or the request's outcome
    logits = packer.run([park, ...])     # then task.value = logits; task.resume()

Exact: every request runs its own rounds on its own caches with its own random stream; only its
target forwards share the weights' reads with the others' (server/packed.py says why each row
and each cache comes out as in a forward of its own); its drafts are the ones it drafts alone
(up to the BLAS's rounding of a draft row, which changes what is proposed, never what is
kept). A lone parked forward runs as its own (`KVState.forward_alone`), so a request alone runs
exactly as without batching. A model the packed forward does not support (`packed.packable`)
runs one forward per request.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import greenlet
import mlx.core as mx

from edgespec.cache import KVState
from edgespec.server.bank import Bank, BankedState, fits, in_bank
from edgespec.server.packed import packable, packed_forward
from edgespec.trees.forward import PLAIN, Kernels

ROUND = "round"  # what a task switches back with after each round


@dataclass(frozen=True)
class Park:
    """A forward a request asked for: its state (target or draft), the new tokens [L] int32,
    and whether a reduced-head draft asked for its head's logits only (KVState.forward)."""

    state: KVState
    inputs: mx.array
    head_only: bool = False

    def alone(self) -> mx.array:
        return self.state.forward_alone(self.inputs, self.head_only)


class _Green(greenlet.greenlet):  # type: ignore[misc]
    """A request's greenlet (so the packer parks only a request's own forwards)."""


class Task:
    """One request's rounds in a greenlet of the MLX thread, created on that thread.
    `step()` runs one round and returns None, or the request's outcome when it ended."""

    def __init__(self, step: Callable[[], Any]):
        self._step = step
        self._green = _Green(self._body)
        self.value: mx.array | None = None  # what the next resume hands back (a parked forward's)
        self.error: BaseException | None = None  # or raises there (the packed forward failed)

    def _body(self, _first: Any = None) -> Any:  # the first switch's value (None)
        while True:
            outcome = self._step()
            if outcome is not None:
                return outcome
            self._green.parent.switch(ROUND)

    def close(self) -> None:
        """End the request's rounds where they stand (GreenletExit at its park point: its
        generator's cleanup runs, on this thread)."""
        if self._green and not self._green.dead:
            self._green.throw(greenlet.GreenletExit)

    def resume(self) -> Any:
        """Run the request until it parks a forward (a Park), ends its round (ROUND) or ends
        (its outcome)."""
        if self.error is not None:
            error, self.error = self.error, None
            return self._green.throw(error)
        value, self.value = self.value, None
        return self._green.switch(value)


class Packer:
    """Parks a request's forwards (the Forward its KVStates were built with, cache.Forward) and
    runs parked ones together. `kernels`: the backend's attention and compiled block parts (the
    Engine's)."""

    def __init__(self, kernels: Kernels = PLAIN):
        self.kernels = kernels
        # Forwards run "packed" and "alone", and of the packed ones a draft's "head-only" steps.
        self.counts: Counter[str] = Counter()
        self._packable: dict[int, bool] = {}
        self._banks: dict[int, Bank] = {}  # a model's bank of one-token steps
        self._last: tuple[int, ...] = ()  # the requests of the last one-token target forward

    def __call__(self, state: KVState, inputs: mx.array, head_only: bool = False) -> mx.array:
        current = greenlet.getcurrent()
        if not isinstance(current, _Green):  # not inside a request: a forward of its own
            return state.forward_alone(inputs, head_only)
        logits: mx.array = current.parent.switch(Park(state, inputs, head_only))
        return logits

    def release(self, states: list[Any]) -> None:
        """The states' caches out of any bank (a request ended: its set, back in the pool, holds
        its own; a fake engine's sets have no bank)."""
        for state in states:
            bank = in_bank(state)
            if bank is not None:
                bank.flush()

    def drop_banks(self) -> None:
        """Forget every bank (after a failed turn: what they held may be half written)."""
        for bank in self._banks.values():
            bank.drop()
        self._banks.clear()
        self._last = ()

    def run(self, parked: list[Park], bank: bool = False) -> list[mx.array]:
        """The parked forwards' logits (lazy), in order: the ones packed_forward supports in one
        forward per model, the others (and a lone one) each on its own. `bank`: the forwards are
        the requests' targets, whose one-token steps may run in a bank (`_banked`)."""
        out: dict[int, mx.array] = {}
        groups: dict[int, list[int]] = {}
        for i, park in enumerate(parked):
            if self._can_pack(park):
                groups.setdefault(id(park.state.model), []).append(i)
            else:
                out[i] = park.alone()
                self.counts["alone"] += 1
        for members in groups.values():
            if len(members) == 1:
                out[members[0]] = parked[members[0]].alone()
                self.counts["alone"] += 1
                continue
            self.counts["packed"] += len(members)
            self.counts["head-only"] += len(members) if parked[members[0]].head_only else 0
            for i in members:
                parked[i].state.layers.before_forward(int(parked[i].inputs.shape[0]))
            parks = [parked[i] for i in members]
            logits = self._banked(parks) if bank else None
            if logits is None:
                model, parts = parks[0].state.model, [(p.state.cache, p.inputs) for p in parks]
                logits = packed_forward(model, parts, self.kernels)
            out.update(zip(members, logits, strict=True))
        return [out[i] for i in range(len(parked))]

    def _banked(self, parks: list[Park]) -> list[mx.array] | None:
        """One-token steps of the same requests as the forward before: run in the model's bank
        (server/bank.py), which takes their caches on the second such forward in a row (so a
        turn of one-token steps between verifies does not move them). None: not such steps, not
        the server's BankedStates, or rows too unequal to share one bank (`bank.fits`)."""
        states = [p.state for p in parks if isinstance(p.state, BankedState)]
        model = parks[0].state.model
        lengths = [s.offset for s in states]
        one_token = all(p.inputs.shape[0] == 1 and not p.head_only for p in parks)
        banked = len(states) == len(parks)  # the server's targets are all BankedStates
        if not banked or not one_token or min(lengths) < 1 or not fits(lengths):
            self._last = ()
            return None
        key = tuple(id(s) for s in states)
        bank = self._banks.get(id(model))
        if bank is None:
            bank = self._banks[id(model)] = Bank(model, self.kernels)
        if not bank.holds(states) and key != self._last:
            self._last = key
            return None
        try:
            if not bank.holds(states):
                bank.take(states)
                self.counts["banked"] += 1
            logits = bank.forward(states, [p.inputs for p in parks])
        except Exception:
            bank.drop()  # their requests fail with the error; their caches start over
            raise
        self.counts["bank steps"] += 1
        return logits

    def _can_pack(self, park: Park) -> bool:
        """A target's full forward, or a reduced-head draft's head-only one (the head the
        packed forward runs, trees.forward.head_of), on a model and cache it supports."""
        state = park.state
        key = id(state.model)
        if key not in self._packable:
            self._packable[key] = packable(state)
        return self._packable[key] and park.head_only == hasattr(state.model, "head_logits")
