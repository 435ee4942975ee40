"""Chunked prefill beside decoding: how much of a long prompt the batch reads in one turn.

A prompt's prefill runs as forwards of up to cache.PREFILL_CHUNK tokens. In a batch
(edgespec/server/batching.py) such a long forward does not run in one go: it is cut into pieces,
one piece per turn, run after the turn's other rounds, so the running requests keep streaming
while the prompt is read, and a request that arrives meanwhile joins at the next turn. The
piece's size follows vLLM's chunked prefill (vllm-project/vllm, vllm/v1/core/sched/scheduler.py
at 00024d31, `Scheduler.schedule`: running requests take their tokens first, a prompt gets what
is left of the step's token budget), with the budget in seconds rather than tokens, measured on
this machine. A long prompt first spends an allowance: while the time others' rounds have held
it up is within LAG (a quarter) of its own reading time (its rows at the measured cost a row),
its pieces wait and the others run at their full pace (a short request beside it is answered as
fast as alone, bar the wait to join), so its first token comes at most about 1.25 times as late
as alone. Past the allowance, the pieces take about SHARE (half) of the other rounds' time over
the turns, so a request beside it runs at about two thirds of its pace at worst (its turn 1.5
times as long) and the prompt is read at about a third of its pace while others run, at full
pace once alone. Alone, a piece takes about `join_s`, so that a request arriving meanwhile
waits about that long for its turn, yet at least `alone_rows` rows (a forward of fewer rows
reads the weights for less work).

    size = PieceSize()
    size.waits(held_s=1.0, prompt_rows=3000)  # True once a piece was timed at 10 ms a row
    rows = size.rows(others_s=0.24)       # rows of the next piece (0: none this turn)
    size.observe(rows, seconds=0.1)       # after it ran (taken off the credit)

Exact: a piece is the next rows of the same forward, appended to the same cache; each row
attends to the positions before it, as in the whole forward (rows keep their bits with a BLAS
whose products do not depend on the row count, as packed forwards do, edgespec/packed.py).
"""

from __future__ import annotations

import statistics
from collections import deque

from edgespec.cache import PREFILL_CHUNK

# A parked forward longer than this is a prompt's chunk, read in pieces (a verify, or the short
# prompt tail a first round feeds, cache.MERGE_MAX, is shorter).
LONG_ROWS = 64
MIN_ROWS = 8  # a piece beside others: at least this many rows
ALONE_ROWS = 64  # a piece with nothing else running: at least this many rows
START_ROWS = 64  # before any piece has been timed
JOIN_S = 0.25  # alone: about this long a piece, so a new request joins within about that
SHARE = 0.5  # beside others: a piece takes about this fraction of the turn's other rounds' time
WINDOW = 5  # pieces whose cost a row is the median of
LAG = 0.25  # a long prompt may be held up by others' rounds this fraction of its reading time
# A forward whose rows cost at most this at the measured cost a row (about two pieces alone) is
# read whole, in the turn's packed forward beside the others' rounds: cut into pieces beside
# them, a chat question of ~100 tokens was read 2-6 rows a turn, each piece paying the weights'
# reading (~58 ms against ~3 ms a row on a 2-core CPU), and came 2.4 s after its release
# against ~0.4 s alone (edgespec bench's serve sweep, four summarization questions).
WHOLE_S = 0.5


class PieceSize:
    """Rows for the next piece from the measured seconds a row (the median of the last WINDOW
    pieces). Beside others, the pieces take `share` of the other rounds' time over the turns:
    each turn adds that much to a credit, a piece runs when the credit is positive, as many rows
    as it buys (at least min_rows), and its measured time is taken off (a piece of a few rows
    still reads all the weights, so it may cost more than a turn's credit: the next piece then
    waits a turn or more). Alone, `join_s` worth of rows, at least alone_rows; never more than
    max_rows."""

    def __init__(
        self,
        join_s: float = JOIN_S,
        share: float = SHARE,
        min_rows: int = MIN_ROWS,
        alone_rows: int = ALONE_ROWS,
        max_rows: int = PREFILL_CHUNK,
    ):
        self.join_s, self.share = join_s, share
        self.min_rows, self.alone_rows, self.max_rows = min_rows, alone_rows, max_rows
        self._row_s: deque[float] = deque(maxlen=WINDOW)
        self.credit = 0.0  # seconds the pieces may still take beside others

    def rows(self, others_s: float) -> int:
        """Rows of the next piece, where the turn's other rounds took `others_s` (0: none ran);
        0: no piece this turn.

        With 10 ms a row measured and no credit: rows(0.24) -> 12 (half of 0.24 s); rows(0.0)
        -> 64 (join_s 0.25 alone would be 25, below alone_rows); with 1 ms a row, rows(0.0)
        -> 250.
        """
        if others_s <= 0:
            self.credit = 0.0
            budget, floor = self.join_s, self.alone_rows
        else:
            self.credit = min(self.credit + self.share * others_s, self.share * others_s * 2)
            budget, floor = self.credit, self.min_rows
            if budget <= 0:
                return 0
        if not self._row_s:
            return START_ROWS
        fit = int(budget / statistics.median(self._row_s))
        return max(floor, min(self.max_rows, fit))

    def reads_whole(self, rows: int, whole_s: float = WHOLE_S) -> bool:
        """Whether a forward of `rows` rows is read whole rather than in pieces: it costs at
        most `whole_s` at the median cost a row (False before a piece was timed).

        With 3.8 ms a row: 107 rows (0.41 s) are read whole, a 512-row chunk (1.9 s) in pieces.
        """
        return bool(self._row_s) and rows * statistics.median(self._row_s) <= whole_s

    def waits(self, held_s: float, prompt_rows: int) -> bool:
        """Whether a long prompt's pieces wait this turn beside others: the others' rounds have
        held it up `held_s` seconds (this turn's included), within LAG of its reading time
        (`prompt_rows` at the median cost a row; the cost a row grows with the context, so the
        estimate from earlier pieces is low, and the allowance with it). No piece timed yet:
        no allowance.

        With 10 ms a row: a 3,000-row prompt reads in about 30 s, so it may wait while others
        have held it up to 7.5 s.
        """
        if not self._row_s:
            return False
        return held_s <= LAG * prompt_rows * statistics.median(self._row_s)

    def observe(self, rows: int, seconds: float, beside: bool = True) -> None:
        """A piece of `rows` rows took `seconds` (`beside` others: off the credit)."""
        if rows > 0 and seconds > 0:
            self._row_s.append(seconds / rows)
            if beside:
                self.credit -= seconds
