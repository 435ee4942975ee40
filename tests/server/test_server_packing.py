"""Requests running together share their forwards (edgespec/server/packing.py): a batch's target
and draft forwards run packed, a lone request runs its own, and a packed forward that fails
fails the requests that were in it, not the server. (That each packed request still gets its
solo text is test_server_batch.py's.)"""

from __future__ import annotations

import pytest

from edgespec.server import packing
from edgespec.server.bank import Bank
from edgespec.server.batching import Batch
from edgespec.server.pieces import MIN_ROWS, PieceSize
from edgespec.server.worker import Done, Failed, Job
from tests.helpers.worker import Collect, answer_together, greedy, run, tiny_worker


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


def test_what_is_left_of_a_short_long_prompt_is_read_whole(tiny_pair, monkeypatch):
    """A prompt just over pieces.LONG_ROWS beside a running request: once a piece has priced its
    rows, the rest is read in one piece (PieceSize.reads_whole), not a few rows a turn (here
    every share is MIN_ROWS, as beside dear rounds); both answers are their solo answers."""
    monkeypatch.setattr(PieceSize, "rows", lambda self, others_s: MIN_ROWS if others_s else 64)
    runs: list[list[int]] = []
    run_pieces = Batch._run_pieces

    def recording(self, parked, size, beside):
        runs.append([int(p.inputs.shape[0]) for _, p in parked])
        return run_pieces(self, parked, size, beside)

    monkeypatch.setattr(Batch, "_run_pieces", recording)
    long_prompt = [3 + (i * 7) % 50 for i in range(150)]
    short_prompt = list(range(3, 12))
    solo = tiny_worker(tiny_pair)
    solo.start()
    try:
        want = [run(solo, p, greedy("draft")).text for p in (short_prompt, long_prompt)]
    finally:
        solo.shutdown()
    runs.clear()
    w = tiny_worker(tiny_pair)
    outs = [Collect(), Collect()]
    for prompt, out in zip((short_prompt, long_prompt), outs, strict=True):
        w.submit(Job(prompt, greedy("draft"), (), out))
    w.start()
    try:
        assert all(isinstance(out.wait(), Done) for out in outs)
    finally:
        w.shutdown()
    assert [out.text for out in outs] == want
    target = [r for r in runs if sum(r) > MIN_ROWS]
    assert sum(map(sum, target)) >= len(long_prompt) - 1 - 32  # the prompt went through pieces
    assert len(runs) <= 4  # a first piece and the rest whole (target and draft), not 8 rows a turn


def test_a_turn_that_raises_fails_its_requests_and_the_server_goes_on(tiny_pair, monkeypatch):
    """An exception from the batch's own bookkeeping (here its pieces' step, on the third turn),
    not from a request's round: the running requests fail with a one-line 500, their cache sets
    are emptied, and the next request gets its solo answer (before, the MLX thread ended and
    every client waited for ever)."""
    solo = tiny_worker(tiny_pair)
    solo.start()
    try:
        want = run(solo, [3, 4, 5, 6], greedy("draft")).text
    finally:
        solo.shutdown()
    turns = [0]
    pieces = Batch._pieces

    def breaking(self, others_s):
        turns[0] += 1
        if turns[0] == 3:
            raise RuntimeError("a bookkeeping bug\nsecond line")
        return pieces(self, others_s)

    monkeypatch.setattr(Batch, "_pieces", breaking)
    w = tiny_worker(tiny_pair)
    try:
        outs = answer_together(w, [greedy("draft"), greedy("hybrid")])
        for out in outs:
            end = out.events[-1]
            assert isinstance(end, Failed) and end.status == 500
            assert "a bookkeeping bug" in end.message and "\n" not in end.message
        assert w.running == 0 and not w._batch.pool.held
        assert all(not s.target.tokens for s in w._batch.pool.slots)  # emptied, not half written
        after = run(w, [3, 4, 5, 6], greedy("draft"))
        assert isinstance(after.wait(), Done) and after.text == want
        assert w.counts["failed"] == 2 and w.counts["completed"] == 1
    finally:
        w.shutdown()
