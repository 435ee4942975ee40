"""A bank (edgespec/server/bank.py): several sequences' one-token steps over one shared KV buffer give
the logits and leave the caches their own forwards give, bit for bit, across a rewind and past
the bank's first capacity; reading a banked cache gives it back; a served batch of plain
requests runs its steps there."""

from __future__ import annotations

import mlx.core as mx
import pytest

from edgespec.cache import KVState
from edgespec.runtime import Engine
from edgespec.server.bank import STEP, Bank, BankedState, fits
from edgespec.server.packing import Packer
from edgespec.server.worker import Done
from tests.helpers.worker import answer_together, greedy, tiny_worker


@pytest.fixture(scope="module")
def engine(tiny_pair):
    return Engine.load(*(str(p) for p in tiny_pair))


def prefilled(engine, lengths):
    """(banked states, their twins that run their own forwards), each pair holding one prompt."""
    pairs = []
    for n in lengths:
        prompt = [3 + (i * 7 + n) % 50 for i in range(n)]
        a, b = engine.new_states(kind=BankedState)[0], engine.new_states()[0]
        for s in (a, b):
            s.prefill(prompt)
        pairs.append((a, b))
    return [a for a, _ in pairs], [b for _, b in pairs]


def keys_of(state):
    return [layer.keys[:, :, : layer.offset] for layer in state.cache]


def test_bank_steps_equal_each_sequence_alone_bit_for_bit(engine):
    banked, alone = prefilled(engine, [5, 40, STEP - 3])
    bank = Bank(banked[0].model, engine.kernels)
    bank.take(banked)
    assert all(s.bank is bank for s in banked)
    assert all(layer.keys is None for layer in banked[0]._cache)  # held once, by the bank
    for step in range(8):  # the longest row passes the first capacity (STEP)
        ids = [mx.array([4 + (step * 5 + b) % 40], dtype=mx.int32) for b in range(3)]
        got = bank.forward(banked, ids)
        want = [s.forward_alone(i) for s, i in zip(alone, ids, strict=True)]
        for g, w in zip(got, want, strict=True):
            assert mx.array_equal(g, w).item()
        if step == 3:  # a rejected draft: both go back two positions
            for s in (banked[1], alone[1]):
                s.layers.go_back(s.offset - 2)
    assert [s.offset for s in banked] == [s.offset for s in alone]
    for a, b in zip(banked, alone, strict=True):  # reading the cache gives it back
        for ka, kb in zip(keys_of(a), keys_of(b), strict=True):
            assert mx.array_equal(ka, kb).item()
    assert all(s.bank is None for s in banked) and not bank.states
    ids = mx.array([7, 8, 9], dtype=mx.int32)  # and the caches go on as their own
    for a, b in zip(banked, alone, strict=True):
        assert mx.array_equal(a.forward_alone(ids), b.forward_alone(ids)).item()


def test_a_served_batch_of_plain_requests_steps_in_the_bank(tiny_pair):
    w = tiny_worker(tiny_pair)
    try:
        outs = answer_together(w, [greedy("none"), greedy("none"), greedy("none")])
        assert all(isinstance(out.events[-1], Done) for out in outs)
        counts = w._batch.packer.counts
        assert counts["banked"] >= 1 and counts["bank steps"] > 10
    finally:
        w.shutdown()


def test_a_set_leaving_the_batch_takes_its_cache_out_of_the_bank(engine):
    banked, alone = prefilled(engine, [5, 9])
    bank = Bank(banked[0].model, engine.kernels)
    bank.take(banked)
    Packer(engine.kernels).release([banked[0], None])  # its request ended: back to the pool
    assert banked[0].bank is None and banked[0]._cache[0].keys is not None
    for a, b in zip(keys_of(banked[0]), keys_of(alone[0]), strict=True):
        assert mx.array_equal(a, b).item()


def test_only_the_servers_target_states_can_be_banked(tiny_pair):
    """The pool builds its targets as BankedStates (Engine.new_states' kind); the core's
    KVState, a draft's included, knows nothing of banks."""
    w = tiny_worker(tiny_pair)
    try:
        answer_together(w, [greedy("draft"), greedy("none")])
        slots = w._batch.pool.slots
        assert all(type(s.target) is BankedState for s in slots)
        assert all(not isinstance(s.draft, BankedState) for s in slots)
    finally:
        w.shutdown()
    assert not hasattr(KVState, "bank")


def test_rows_share_a_bank_only_when_padding_them_stays_small():
    assert fits([40, 55, 70, 85])  # one STEP each, as their own caches
    assert fits([40, STEP + 10])  # the short row padded by one STEP
    assert not fits([40, 40, 40, 4 * STEP])  # three short rows padded to a long one's length


def test_a_take_that_fails_half_way_starts_its_states_over(engine, monkeypatch):
    banked, _ = prefilled(engine, [5, 9])
    bank = Bank(banked[0].model, engine.kernels)

    def broken(parts, lengths, room):
        raise MemoryError("no room")

    monkeypatch.setattr("edgespec.server.bank._rows", broken)
    with pytest.raises(MemoryError):
        bank.take(banked)
    bank.drop()  # what the packer does on any failure
    assert all(s.bank is None and s.offset == 0 and not s.tokens for s in banked)
