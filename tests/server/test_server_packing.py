"""Requests running together share their forwards (edgespec/server/packing.py): a batch's target
and draft forwards run packed, a lone request runs its own, and a packed forward that fails
fails the requests that were in it, not the server. (That each packed request still gets its
solo text is test_server_batch.py's.)"""

from __future__ import annotations

import pytest

from edgespec.server import packing
from edgespec.server.bank import Bank
from edgespec.server.worker import Done, Failed
from tests.helpers.worker import answer_together, greedy, run, tiny_worker


def test_a_batch_runs_its_target_and_draft_forwards_packed(tiny_pair):
    w = tiny_worker(tiny_pair)
    try:
        outs = answer_together(w, [greedy("draft"), greedy("hybrid"), greedy("none"), greedy()])
        assert all(isinstance(out.events[-1], Done) for out in outs)
        packer = w._batch.packer
        assert packer is not None
        assert packer.counts["packed"] > 0
        # Draft steps were packed too: more packed forwards than the verifies and steps alone.
        assert packer.counts["packed"] > 2 * sum(len(out.events) for out in outs)
    finally:
        w.shutdown()


def test_a_lone_request_runs_its_own_forwards(tiny_pair):
    w = tiny_worker(tiny_pair)
    w.start()
    try:
        assert isinstance(run(w, [3, 4, 5, 6], greedy()).wait(), Done)
        packer = w._batch.packer
        assert packer is not None and packer.counts["packed"] == 0 and packer.counts["alone"] > 0
    finally:
        w.shutdown()


def test_one_place_means_no_packer(tiny_pair):
    w = tiny_worker(tiny_pair, max_batch=1)
    w.start()
    try:
        assert isinstance(run(w, [3, 4, 5, 6], greedy()).wait(), Done)
        assert w._batch.packer is None
    finally:
        w.shutdown()


@pytest.mark.parametrize("where", ["packed", "bank"])
def test_a_failing_forward_fails_its_requests_and_the_server_goes_on(tiny_pair, monkeypatch, where):
    """A packed forward (drafting requests) or a bank step (plain ones, edgespec/server/bank.py) that
    raises: the requests in it fail with a one-line 500, no cache stays in a bank, and the next
    request is answered."""

    def broken(*_args, **_kw):
        raise RuntimeError("the device went away\nsecond line")

    if where == "packed":
        monkeypatch.setattr(packing, "packed_forward", broken)
    else:
        monkeypatch.setattr(Bank, "forward", broken)
    method = "draft" if where == "packed" else "none"
    w = tiny_worker(tiny_pair)
    try:
        outs = answer_together(w, [greedy(method), greedy(method)])
        for out in outs:
            end = out.events[-1]
            assert isinstance(end, Failed) and end.status == 500
            assert "the device went away" in end.message and "\n" not in end.message
        assert all(s.target.bank is None for s in w._batch.pool.slots)
        monkeypatch.undo()
        assert isinstance(run(w, [3, 4, 5, 6], greedy(method)).wait(), Done)
    finally:
        w.shutdown()


def test_requests_drafting_different_k_still_verify_together(tiny_pair, monkeypatch):
    """K = 1 beside K = 4 (fixed): the K = 1 request's verify waits for the other's last draft
    step, so every round of both verifies in one packed target forward."""
    sizes: list[tuple[bool, int]] = []
    packed_forward = packing.packed_forward

    def recording(model, parts, kernels):
        sizes.append((hasattr(model, "head_logits") or len(model.layers) == 1, len(parts)))
        return packed_forward(model, parts, kernels)

    monkeypatch.setattr(packing, "packed_forward", recording)
    w = tiny_worker(tiny_pair)
    try:
        outs = answer_together(w, [greedy(k=1), greedy(k=4)])
        assert all(isinstance(out.events[-1], Done) for out in outs)
    finally:
        w.shutdown()
    rounds = [sum(1 for e in out.events if not isinstance(e, Done)) for out in outs]
    target_packs = sum(1 for is_draft, n in sizes if not is_draft and n == 2)
    assert target_packs >= min(rounds)
