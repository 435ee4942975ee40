"""Stop strings, cut exactly: text is released token by token, holding back any tail that could
still become a stop string, and cut at the first stop string found.

    scan = StopScanner(("\\n\\n",))
    scan.feed("Hi", "accepted")   -> [Segment("Hi", "accepted")]      nothing to hold back
    scan.feed(" there\\n", "bonus") -> []                                "\\n" may start "\\n\\n"
    scan.feed("\\nBye", "target")   -> [Segment(" there", "bonus")], scan.stopped is True

A released segment is one token's text (its whole text, or the part before a stop string), with
the token's kind, so a client can colour the answer by provenance (events.TOKEN_KINDS). Pure
Python, no MLX: the worker feeds it the engine's Token events.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """Text released for one token (a token's `count` is 0 for the detokenizer's final flush)."""

    text: str
    kind: str
    count: int = 1


def held_tail(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string.

    >>> held_tail("see you\\n", ("\\n\\n", "END"))
    1
    >>> held_tail("the E", ("END",)), held_tail("the end", ("END",))
    (1, 0)
    """
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


def first_stop(text: str, stops: tuple[str, ...]) -> int:
    """Index of the earliest occurrence of any stop string in `text`, or -1.

    >>> first_stop("a.b!c", (".", "!")), first_stop("abc", ("x",))
    (1, -1)
    """
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found, default=-1)


class StopScanner:
    """Feeds token texts in, releases the segments that can no longer be part of a stop string.

    Invariant: the released text never contains a stop string, and `released + pending` is all
    the text fed so far until a stop string is found; from then on everything is dropped.
    """

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops = tuple(s for s in stops if s)
        self.pending: list[Segment] = []
        self.stopped = False
        self.tokens = 0  # tokens released (whole, or cut by the stop string)

    def feed(self, text: str, kind: str, count: int = 1) -> list[Segment]:
        """Add one token's text; return the segments released by it (possibly none)."""
        if self.stopped:
            return []
        self.pending.append(Segment(text, kind, count))
        if not self.stops:
            return self._release(len(self.pending))
        joined = "".join(s.text for s in self.pending)
        cut = first_stop(joined, self.stops)
        if cut >= 0:
            self.stopped = True
            return self._cut(cut)
        keep = len(joined) - held_tail(joined, self.stops)
        whole, end = 0, 0
        for seg in self.pending:  # release the tokens that end before the held tail
            if end + len(seg.text) > keep:
                break
            end += len(seg.text)
            whole += 1
        return self._release(whole)

    def flush(self) -> list[Segment]:
        """Generation ended without a stop string: release everything held back."""
        return [] if self.stopped else self._release(len(self.pending))

    def _release(self, n: int) -> list[Segment]:
        out, self.pending = self.pending[:n], self.pending[n:]
        self.tokens += sum(s.count for s in out)
        return [s for s in out if s.text]

    def _cut(self, cut: int) -> list[Segment]:
        out: list[Segment] = []
        end = 0
        for seg in self.pending:
            if end >= cut:
                break
            piece = seg.text[: cut - end]
            end += len(seg.text)
            out.append(Segment(piece, seg.kind, seg.count))
        self.pending = []
        self.tokens += sum(s.count for s in out)
        return [s for s in out if s.text]
