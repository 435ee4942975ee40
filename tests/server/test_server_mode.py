"""The batch's drafting mode (edgespec/server/mode.py): measured, the better kept, measured again,
started over when the batch changes; only adaptive policies are gated."""

from __future__ import annotations

from edgespec.drafting.adaptive import AdaptiveK
from edgespec.events import Round
from edgespec.server.mode import RETRY_EVERY, SETTLE, WINDOW, BatchMode, Gated


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
    assert not mode.plain and mode.rates == {False: 40}  # two: plain not measured yet
    mode.observe(3, 10, 1.0)
    assert mode.plain and mode.rates == {False: 40, True: 60}  # three again: plain at once


def test_one_request_is_never_gated():
    alone = BatchMode()
    for _ in range(10 * WINDOW):
        alone.observe(1, 1, 1.0)
    assert not alone.plain and alone.rates == {}


def test_only_adaptive_policies_are_gated_and_they_see_every_round():
    mode = BatchMode()
    fixed = lambda _last: 3  # noqa: E731 - a fixed K, as a callable policy
    assert mode.gate(fixed) is fixed
    adaptive = AdaptiveK(k_init=3)
    gated = mode.gate(adaptive)
    assert isinstance(gated, Gated)
    assert gated.decide() == 3
    mode.plain = True
    assert gated.decide() == 0
    gated.observe(Round(0, 3, 2, 3, 0.01, 0.02, "draft"))
    assert adaptive.estimates["draft"].timings == 1
