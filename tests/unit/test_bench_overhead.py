"""The bench's accounting of the loop's own time: which rounds' draft and verify seconds fall
between a run's first and last token (edgespec/bench/methods.py, decode_model_time)."""

from __future__ import annotations

import pytest

from edgespec.bench.methods import decode_model_time
from edgespec.events import Round


def test_model_time_in_decode_leaves_out_the_first_and_a_tokenless_last_round():
    """A round whose only commit was EOS emits no Token: it ran after the last token, outside
    decode time, so counting it would hide the loop's overhead (even make it negative)."""
    rounds = [Round(0, 3, 2, 3, 0.1, 0.2), Round(1, 3, 1, 3, 0.05, 0.15), Round(2, 3, 0, 3, 1, 2)]
    assert decode_model_time(list(zip(rounds, (3, 2, 0), strict=True))) == pytest.approx(0.2)
    assert decode_model_time(list(zip(rounds, (3, 2, 1), strict=True))) == pytest.approx(3.2)
