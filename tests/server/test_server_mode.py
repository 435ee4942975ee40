"""The batch's drafting mode (edgespec/server/mode.py): measured, the better kept, measured again,
started over when the batch changes (before the turn's rounds decide); only adaptive policies are
gated."""

from __future__ import annotations

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.drafting.adaptive import AdaptiveK, FixedK
from edgespec.drafting.base import PLAIN_ONLY
from edgespec.drafting.costs import EARLY, MARGIN, RETRY_EVERY, SETTLE, WINDOW
from edgespec.events import Round
from edgespec.server.batching import Batch
from edgespec.server.mode import BatchMode, Gated
from tests.helpers.worker import answer_together, tiny_worker


def window(mode: BatchMode, tokens_per_s: float, running: int = 2) -> None:
    """One whole measurement (its settling turns included) at this rate."""
    for _ in range(SETTLE + WINDOW):
        mode.observe(running, int(tokens_per_s), 1.0)


def test_drafting_first_then_plain_then_the_faster():
    mode = BatchMode()
    assert not mode.plain
    window(mode, 40)
    assert mode.plain  # drafting measured: plain next
    window(mode, 60)
    assert mode.plain and mode.rates == {False: 40, True: 60}  # plain was faster: kept
    mode = BatchMode()
    window(mode, 60)
    window(mode, 40)
    assert not mode.plain  # drafting was faster: back to it


def test_the_other_mode_is_measured_again():
    mode = BatchMode()
    window(mode, 60)
    window(mode, 40)  # drafting kept
    for _ in range(SETTLE + (RETRY_EVERY - 1) * WINDOW):
        mode.observe(2, 60, 1.0)
    assert not mode.plain
    for _ in range(WINDOW):
        mode.observe(2, 60, 1.0)
    assert mode.plain  # the RETRY_EVERY-th window: plain measured again
    for _ in range(SETTLE + EARLY):
        mode.observe(2, 40, 1.0)
    assert not mode.plain  # plain trailed: drafting again, and again for RETRY_EVERY windows
    for _ in range(SETTLE + (RETRY_EVERY - 1) * WINDOW):
        mode.observe(2, 60, 1.0)
    assert not mode.plain
    for _ in range(WINDOW):
        mode.observe(2, 60, 1.0)
    assert mode.plain  # the gap does not grow: a window is already WINDOW turns


def test_one_stalled_turn_does_not_switch_the_batch():
    """A mode's rate is the median of its recent windows (drafting/costs.py, as the chain's
    timings are): a window slowed by one stalled turn does not hand the batch to the slower
    mode, which a slowdown that lasts does."""
    mode = BatchMode()
    window(mode, 60)
    window(mode, 40)  # drafting 60, plain 40: drafting kept
    for _ in range(SETTLE + 2 * WINDOW):
        mode.observe(2, 60, 1.0)
    mode.observe(2, 60, 20.0)  # a stall: that window's rate trails plain's
    for _ in range(2 * WINDOW):
        mode.observe(2, 60, 1.0)
    assert not mode.plain and mode.rates == {False: 60, True: 40}
    for _ in range(WINDOW):
        mode.observe(2, 30, 1.0)  # slower for good: the median follows
    assert mode.plain and mode.rates[True] == 40


def test_a_new_batch_size_starts_over_and_a_known_one_where_it_was_faster():
    mode = BatchMode()
    window(mode, 40)
    assert mode.plain
    mode.observe(3, 10, 1.0)
    assert not mode.plain and mode.rates == {}  # three running: not measured yet
    window(mode, 40, running=3)
    window(mode, 60, running=3)
    assert mode.plain  # plain was faster with three
    mode.observe(2, 10, 1.0)
    assert mode.plain and mode.rates == {False: 40}  # two: plain not measured yet, so plain now
    mode.observe(3, 10, 1.0)
    assert mode.plain and mode.rates == {False: 40, True: 60}  # three again: plain at once


def test_one_request_is_never_gated():
    alone = BatchMode()
    for _ in range(10 * WINDOW):
        alone.observe(1, 1, 1.0)
    assert not alone.plain and alone.rates == {}


def test_only_adaptive_policies_are_gated_and_they_see_every_round():
    mode = BatchMode()
    fixed = FixedK(3)
    assert mode.gate(fixed) is fixed
    adaptive = AdaptiveK(k_init=3)
    gated = mode.gate(adaptive)
    assert isinstance(gated, Gated)
    assert gated.decide() == 3
    mode.plain = True
    assert gated.decide() == PLAIN_ONLY  # a plain step that looks nothing up either
    gated.observe(Round(0, 3, 2, 3, 0.01, 0.02, "draft"))
    assert adaptive.estimates["draft"].timings == 1


def test_a_size_not_measured_starts_in_the_likelier_mode():
    """A drafted row costs more the more requests share each forward: a size starts plain where
    plain won at a smaller one, drafting where drafting won at a larger one, else as the
    backend's guess (prefer_plain) says; a request alone is never gated."""
    mode = BatchMode(prefer_plain=True)
    mode.observe(1, 1, 1.0)
    assert not mode.plain  # alone: its own policy
    mode.observe(2, 1, 1.0)
    assert mode.plain  # nothing measured: the guess
    mode = BatchMode()
    mode.observe(3, 1, 1.0)
    assert not mode.plain
    window(mode, 40, running=3)
    window(mode, 60, running=3)  # plain won with three
    mode.observe(4, 1, 1.0)
    assert mode.plain  # four: plain first
    mode.observe(2, 1, 1.0)
    assert not mode.plain  # two: nothing known below three, the guess (drafting)
    window(mode, 50, running=2)
    window(mode, 30, running=2)  # drafting won with two
    mode.observe(5, 1, 1.0)
    assert mode.plain  # plain won at three, below five
    mode = BatchMode(prefer_plain=True)
    window(mode, 10, running=4)
    window(mode, 60, running=4)  # started plain (10), then drafting (60) won with four
    mode.observe(3, 1, 1.0)
    assert not mode.plain  # three: drafting won with more requests, so drafting first


def test_a_window_that_trails_the_other_mode_ends_early():
    mode = BatchMode(prefer_plain=True)
    window(mode, 60)  # plain: 60
    assert not mode.plain  # drafting measured next
    slow = int(60 * (1 - MARGIN)) - 1
    for _ in range(SETTLE + EARLY - 1):
        mode.observe(2, slow, 1.0)
    assert not mode.plain  # not yet: EARLY turns first
    mode.observe(2, slow, 1.0)
    assert mode.plain and mode.rates == {True: 60, False: slow}  # ended early, plain again
    mode = BatchMode(prefer_plain=True)
    window(mode, 60)
    close = int(60 * (1 - MARGIN)) + 1  # within the margin: a whole window
    for _ in range(SETTLE + WINDOW - 1):
        mode.observe(2, close, 1.0)
    assert not mode.plain and False not in mode.rates
    mode.observe(2, close, 1.0)
    assert mode.plain and mode.rates[False] == close


def test_a_size_inferred_from_a_smaller_one_keeps_its_mode_until_a_retry():
    """Plain won with two: four starts plain and does not measure drafting (it would cost the
    batch) until RETRY_EVERY windows have passed, also when four comes back later."""
    mode = BatchMode(prefer_plain=True)
    window(mode, 60)
    window(mode, 40)  # plain 60, drafting 40 with two
    assert mode.plain and mode.rates == {True: 60, False: 40}
    mode.observe(4, 1, 1.0)
    for _ in range(SETTLE - 1 + (RETRY_EVERY - 1) * WINDOW):
        mode.observe(4, 80, 1.0)
    assert mode.plain and mode.rates == {True: 80}  # fifteen windows: drafting never measured
    mode.observe(2, 1, 1.0)
    mode.observe(4, 1, 1.0)
    assert mode.plain  # four again: still plain, not the unmeasured mode
    for _ in range(SETTLE - 1 + RETRY_EVERY * WINDOW):
        mode.observe(4, 80, 1.0)
    assert not mode.plain  # the retry: drafting measured now
    for _ in range(SETTLE + EARLY):
        mode.observe(4, 50, 1.0)
    assert mode.plain and mode.rates == {True: 80, False: 50}  # trailed: ended early, plain


def test_requests_joining_a_batch_decide_under_its_new_size(tiny_pair, monkeypatch):
    """The batch sets its mode's size before a turn's rounds decide their K: requests that join
    a batch step as that size's mode says from their first round (not as the smaller batch's
    mode, e.g. drafting when one ran alone)."""
    seen: list[tuple[int, int]] = []  # (the turn's running requests, the mode's size) per decide
    turn, decide = Batch.turn, Gated.decide
    running = [0]

    def turning(batch):
        running[0] = len(batch.running)
        return turn(batch)

    def deciding(gated):
        seen.append((running[0], gated.mode._running))
        return decide(gated)

    monkeypatch.setattr(Batch, "turn", turning)
    monkeypatch.setattr(Gated, "decide", deciding)
    spec = SpecConfig(k=3, method="hybrid", adaptive=True)
    cfg = GenerationConfig(SamplingConfig(temperature=0.0), spec, 24)
    w = tiny_worker(tiny_pair)
    try:
        answer_together(w, [cfg, cfg, cfg])
    finally:
        w.shutdown()
    assert any(n == 3 for n, _ in seen)  # they did run together
    assert all(n == size for n, size in seen)
