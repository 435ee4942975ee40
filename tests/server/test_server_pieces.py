"""How much of a long prompt a batch reads in one turn (edgespec/server/pieces.py): a piece
costs about SHARE of what the turn's other rounds cost (once its allowance, LAG, is spent), or
JOIN_S alone, within its bounds."""

from __future__ import annotations

from edgespec.server.pieces import ALONE_ROWS, LAG, MIN_ROWS, START_ROWS, PieceSize


def test_the_first_piece_has_the_start_size():
    assert PieceSize().rows(0.5) == START_ROWS


def test_a_piece_takes_a_share_of_the_others_rounds_at_the_measured_cost_a_row():
    size = PieceSize(join_s=0.25, share=0.5, max_rows=512)
    size.observe(64, 0.64, beside=False)  # 10 ms a row
    assert size.rows(0.24) == 12  # beside others: half as long as their rounds took
    size.observe(12, 0.12)
    assert size.rows(0.01) == MIN_ROWS  # never fewer than MIN_ROWS
    assert size.rows(0.0) == ALONE_ROWS  # alone: join_s would be 25 rows, the floor is 64
    assert size.rows(100.0) == 512  # never more than max_rows
    for _ in range(5):
        size.observe(100, 0.1, beside=False)  # 1 ms a row now: the median follows
    assert size.rows(0.0) == 250


def test_a_piece_that_cost_more_than_its_share_makes_the_next_wait():
    size = PieceSize(share=0.5)
    size.observe(8, 0.08, beside=False)  # 10 ms a row
    assert size.rows(0.1) == MIN_ROWS  # 0.05 s of credit buys 5 rows: the floor, 8
    size.observe(8, 0.3)  # a small piece still read all the weights: 0.3 s
    rows = [size.rows(0.1) for _ in range(6)]  # credit -0.25, then 0.05 more a turn
    assert rows == [0, 0, 0, 0, 0, MIN_ROWS]  # paid back after five turns: the next piece


def test_a_median_ignores_one_slow_piece():
    size = PieceSize()
    for seconds in (0.1, 0.1, 5.0, 0.1, 0.1):
        size.observe(100, seconds, beside=False)
    assert size.rows(0.0) == 250


def test_a_long_prompt_waits_within_its_allowance_then_takes_its_share():
    size = PieceSize(share=0.5)
    assert not size.waits(held_s=0.0, prompt_rows=3000)  # no piece timed: no allowance
    size.observe(64, 0.64, beside=False)  # 10 ms a row: 3,000 rows read in about 30 s
    assert size.waits(held_s=7.4, prompt_rows=3000)  # held up less than LAG of that
    assert not size.waits(held_s=LAG * 30 + 0.1, prompt_rows=3000)
    assert not size.waits(held_s=1.0, prompt_rows=64)  # a short prompt's allowance is small


def test_a_forward_that_costs_little_is_read_whole():
    size = PieceSize()
    assert not size.reads_whole(100)  # no piece timed: its cost is unknown
    size.observe(64, 64 * 0.0038, beside=False)  # 3.8 ms a row
    assert size.reads_whole(107)  # 0.41 s: read whole, beside the others' rounds
    assert not size.reads_whole(512)  # a prompt's chunk (1.9 s): in pieces
    assert size.reads_whole(512, whole_s=2.0)
