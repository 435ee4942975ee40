"""Whether a batch drafts: the aggregate tokens/s of the running requests with drafting on (each
by its own adaptive K) against all of them stepping plainly, measured turn by turn as the batch
runs, the better one kept.

Why the batch decides and not each request: a request's adaptive K (drafting/adaptive.py) prices
its own round, but in a packed forward (edgespec/packed.py) its drafted rows also lengthen every
other request's turn. Where a forward of a few rows costs about one of a single row (a laptop
GPU's decode step; the CPU under MKL, whose one-row products run on one thread), several
requests' plain steps already fill those rows, and drafting on top can lose: measured on a
2-core CPU, two requests stepping plainly together beat the same two drafting. On other
machines, or with a draft that is accepted more often, drafting wins. Only measuring says.

    mode = BatchMode()
    engine.generate(ids, config, cancel, gate=mode.gate)   # the generation's adaptive K under it
    mode.begin(running=4)                # before every turn
    mode.observe(running=4, tokens=11, seconds=0.09)   # after it

A request with a fixed K (adaptive off) keeps it: the gate wraps AdaptiveK policies only. A
batch of one is left to its policy. Exact either way: the gate only chooses K.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgespec.drafting.adaptive import AdaptiveK
from edgespec.drafting.base import PLAIN_ONLY
from edgespec.events import Round

WINDOW = 16  # turns per measurement of a mode
SETTLE = 2  # turns after a change left out (rounds already under way, a pipelined run starting)
RETRY_EVERY = 16  # windows in the better mode before the other is measured again
# A window ends early once it has EARLY turns and trails the other mode's rate by MARGIN or more:
# measuring the slower mode costs the batch, and the requests may leave before a whole window.
EARLY, MARGIN = 4, 0.2
Gate = Callable[[Any], Any]  # a generation's round policy -> the policy its rounds ask


class Gated:
    """An adaptive request's policy under the batch's mode (a rounds.Policy): its own K while
    the batch drafts, PLAIN_ONLY (a plain step, no lookup either) while it does not. It sees
    every round either way."""

    def __init__(self, policy: AdaptiveK, mode: BatchMode):
        self.policy, self.mode = policy, mode

    def observe(self, r: Round) -> None:
        self.policy.observe(r)

    def decide(self) -> int:
        k = self.policy.decide()
        return PLAIN_ONLY if self.mode.plain else k


class BatchMode:
    """The batch's choice, drafting or plain (`plain`), from tokens/s measured in windows of
    WINDOW turns of each (after SETTLE turns; a window that trails the other mode's rate by
    MARGIN ends after EARLY turns): the likelier one first, then the other, then the better one,
    the other measured again every RETRY_EVERY windows. The rates are kept per number of running
    requests: a batch of a size seen before starts in the mode that was faster at that size.
    Where a size has not had both measured, the sizes that have decide: plain where plain won at
    a smaller size (a drafted row costs more, the more requests share each forward), drafting
    where drafting won at a larger one; that mode is then kept without measuring the other until
    RETRY_EVERY windows have passed. Otherwise the size measures the mode it has not measured, or
    starts as `prefer_plain` says (the server's guess for its backend)."""

    def __init__(self, prefer_plain: bool = False) -> None:
        self.prefer_plain = prefer_plain
        self._running = 0
        self._by_size: dict[int, dict[bool, float]] = {}  # running requests -> their rates
        self._reset()

    def _reset(self) -> None:
        self.rates: dict[bool, float] = self._by_size.setdefault(self._running, {})
        # Whether the mode was inferred from other sizes' verdicts: the other one is then left
        # unmeasured until RETRY_EVERY windows have passed.
        self._inferred = False
        if self._running < 2:
            self.plain = False  # a request alone: left to its own policy
        elif len(self.rates) == 2:
            self.plain = self.rates[True] > self.rates[False]
        else:
            inferred = self._infer()
            measured = next(iter(self.rates), None)  # the one mode measured at this size
            if inferred is not None and measured in (None, inferred):
                self.plain, self._inferred = inferred, True
            elif measured is not None:  # seen before, one mode measured: the other now
                self.plain = not measured
            else:
                self.plain = self.prefer_plain
        self._tokens, self._seconds, self._turns = 0, 0.0, -SETTLE
        self._windows = 0  # windows since the last change of mode

    def _infer(self) -> bool | None:
        """The likelier mode at this size from the sizes where both were measured: plain where
        plain won at a smaller size (a drafted row costs more, the more requests share each
        forward), drafting where drafting won at a larger one; None where neither holds."""
        won = {n: r[True] > r[False] for n, r in self._by_size.items() if len(r) == 2}
        if any(plain for n, plain in won.items() if n <= self._running):
            return True
        if any(not plain for n, plain in won.items() if n >= self._running):
            return False
        return None

    def gate(self, policy: Any) -> Any:
        """`policy` under this mode (an AdaptiveK), or as it is."""
        return Gated(policy, self) if isinstance(policy, AdaptiveK) else policy

    def begin(self, running: int) -> None:
        """A turn of `running` requests starts: the mode of that size, before its rounds decide
        their K (a request joining a plain batch steps plainly from its first round)."""
        if running != self._running:
            self._running = running
            self._reset()

    def observe(self, running: int, tokens: int, seconds: float) -> None:
        """One turn: `running` requests committed `tokens` in `seconds`."""
        self.begin(running)
        if running < 2:
            return
        if self._turns < 0:  # settling
            self._turns += 1
            return
        self._tokens, self._seconds, self._turns = (
            self._tokens + tokens,
            self._seconds + seconds,
            self._turns + 1,
        )
        rate, other = self._tokens / max(self._seconds, 1e-9), not self.plain
        behind = self._turns >= EARLY and rate < (1 - MARGIN) * self.rates.get(other, 0.0)
        if self._turns < WINDOW and not behind:
            return
        self.rates[self.plain] = rate
        self._tokens, self._seconds, self._turns = 0, 0.0, 0
        self._windows += 1
        unmeasured = other not in self.rates and not self._inferred
        ahead = self.rates.get(other, 0.0) > rate
        if unmeasured or ahead or self._windows >= RETRY_EVERY:
            self.plain, self._windows, self._turns = other, 0, -SETTLE
            self._inferred = False
