"""Stop strings cut exactly, whatever the token boundaries (edgespec/server/stops.py)."""

from __future__ import annotations

import random

import pytest

from edgespec.server.stops import Segment, StopScanner, first_stop, held_tail


def run(pieces: list[str], stops: tuple[str, ...]) -> tuple[list[Segment], StopScanner]:
    scan = StopScanner(stops)
    out: list[Segment] = []
    for i, p in enumerate(pieces):
        out += scan.feed(p, "accepted" if i % 2 else "bonus")
    return out + scan.flush(), scan


def test_worked_example():
    scan = StopScanner(("\n\n",))
    assert scan.feed("Hi", "accepted") == [Segment("Hi", "accepted")]
    assert scan.feed(" there\n", "bonus") == []  # "\n" may start "\n\n": held back
    assert scan.feed("\nBye", "target") == [Segment(" there", "bonus")]
    assert scan.stopped and scan.tokens == 2
    assert scan.feed("more", "target") == [] and scan.flush() == []


def test_a_held_tail_that_does_not_become_a_stop_is_released_whole():
    scan = StopScanner(("END",))
    assert scan.feed("the E", "bonus") == []
    assert scan.feed("lephant", "accepted") == [
        Segment("the E", "bonus"),
        Segment("lephant", "accepted"),
    ]
    assert not scan.stopped


def test_stop_at_the_very_start_releases_nothing():
    out, scan = run(["STOP", "after"], ("STOP",))
    assert out == [] and scan.stopped and scan.tokens == 0


def test_helpers():
    assert held_tail("see you\n", ("\n\n", "END")) == 1
    assert held_tail("the E", ("END",)) == 1 and held_tail("the end", ("END",)) == 0
    assert held_tail("abab", ("abac",)) == 2  # "ab" starts the stop; "bab" and "abab" do not
    assert first_stop("a.b!c", (".", "!")) == 1 and first_stop("abc", ("x",)) == -1


def test_no_stops_releases_every_token_at_once_and_empty_pieces_count():
    scan = StopScanner()
    assert scan.feed("", "target") == []  # a token in the middle of a character
    assert scan.feed("é", "target") == [Segment("é", "target")]
    assert scan.tokens == 2


@pytest.mark.parametrize("seed", range(200))
def test_random_splits_cut_exactly_where_the_text_first_holds_a_stop(seed):
    """Against the obvious reference on the whole text: text[:first occurrence], never more."""
    rng = random.Random(seed)
    alphabet = "ab\n."
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    stops = tuple(
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
        for _ in range(rng.randint(1, 3))
    )
    cuts = sorted(rng.sample(range(1, len(text)), k=min(max(len(text) - 1, 0), rng.randint(0, 12))))
    pieces = (
        [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)] if text else []
    )
    out, scan = run(pieces, stops)
    released = "".join(s.text for s in out)
    at = first_stop(text, stops)
    assert released == (text if at < 0 else text[:at])
    assert scan.stopped == (at >= 0)
    # Provenance: each released segment is (a prefix of) one fed piece, in order, with its kind.
    assert len(out) <= len(pieces)
    # Tokens counted: every piece up to the one holding the cut (that one only if cut inside it).
    starts = [sum(map(len, pieces[:i])) for i in range(len(pieces))]
    limit = len(text) if at < 0 else at
    assert scan.tokens == sum(1 for s in starts if s < limit)
