"""Whether a batch drafts: the aggregate tokens/s of the running requests with drafting on (each
by its own adaptive K) against all of them stepping plainly, measured turn by turn as the batch
runs, the better one kept.

Why the batch decides and not each request: a request's adaptive K (drafting/adaptive.py) prices
its own round, but in a packed forward (server/packed.py) its drafted rows also lengthen every
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

The cost model is the chain and tree policies' one (drafting/costs.py): each (batch size, mode)'s
rate is the median of its recent windows (Timings), a window is costs.Window (settling turns, an
early end when it trails), and the losing mode is measured again on a Probes schedule. This
module says what the batch measures (its turns' tokens and seconds) and what it decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgespec.drafting.adaptive import AdaptiveK
from edgespec.drafting.base import PLAIN_ONLY
from edgespec.drafting.costs import RETRY_EVERY, Probes, Timings, Window
from edgespec.events import Round

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
    turns of each (costs.Window: WINDOW turns after SETTLE, only EARLY where it trails the other
    mode's rate by MARGIN): the likelier one first, then the other, then the better one, the
    other measured again after RETRY_EVERY windows of the better one (costs.Probes). A mode's
    rate is the median of its recent windows (costs.Timings), kept per number of running
    requests: a batch of a size seen before starts in the mode that was faster at that size.
    Where a size has not had both measured, the sizes that have decide: plain where plain won at
    a smaller size (a drafted row costs more, the more requests share each forward), drafting
    where drafting won at a larger one; that mode is then kept without measuring the other until
    RETRY_EVERY windows have passed. Otherwise the size measures the mode it has not measured, or
    starts as `prefer_plain` says (the server's guess for its backend)."""

    def __init__(self, prefer_plain: bool = False) -> None:
        self.prefer_plain = prefer_plain
        self._running = 0
        # (running requests, plain) -> its recent windows' tokens/s
        self.estimates: Timings[tuple[int, bool]] = Timings()
        self._reset()

    @property
    def rates(self) -> dict[bool, float]:
        """Tokens/s by mode (plain or not) at this size, for the modes measured at it."""
        return self._rates(self._running)

    def _rates(self, running: int) -> dict[bool, float]:
        return {plain: r for (n, plain), r in self.estimates.medians().items() if n == running}

    def _reset(self) -> None:
        """This size's mode, as a batch of it starts (the class docstring)."""
        rates = self.rates
        self._window = Window()
        # The better mode, and when the other is measured again (after RETRY_EVERY windows)
        self._best: bool | None = None
        self._probes = Probes(RETRY_EVERY, RETRY_EVERY)
        # Whether the mode was inferred from other sizes' verdicts: the other one is then left
        # unmeasured until RETRY_EVERY windows have passed.
        self._inferred = False
        if self._running < 2:
            self.plain = False  # a request alone: left to its own policy
        elif len(rates) == 2:
            self.plain = self._choose(rates[True] > rates[False])
        else:
            inferred = self._infer()
            measured = next(iter(rates), None)  # the one mode measured at this size
            if inferred is not None and measured in (None, inferred):
                self.plain, self._inferred = self._choose(inferred), True
            elif measured is not None:  # seen before, one mode measured: the other now
                self.plain = not measured
            else:
                self.plain = self.prefer_plain

    def _infer(self) -> bool | None:
        """The likelier mode at this size from the sizes where both were measured: plain where
        plain won at a smaller size (a drafted row costs more, the more requests share each
        forward), drafting where drafting won at a larger one; None where neither holds."""
        by_size: dict[int, dict[bool, float]] = {}
        for (n, plain), rate in self.estimates.medians().items():
            by_size.setdefault(n, {})[plain] = rate
        won = {n: r[True] > r[False] for n, r in by_size.items() if len(r) == 2}
        if any(plain for n, plain in won.items() if n <= self._running):
            return True
        if any(not plain for n, plain in won.items() if n >= self._running):
            return False
        return None

    def _choose(self, best: bool) -> bool:
        """The next window's mode where `best` (plain or not) is the better one: itself, or the
        other once RETRY_EVERY windows of it have passed (a probe)."""
        if best != self._best:
            self._best = best
            self._probes.won()
        return not best if self._probes.probe() else best

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
        other = not self.plain
        rate = self._window.add(tokens, seconds, rival=self.estimates.median((running, other)))
        if rate is None:
            return
        self.estimates.add((running, self.plain), rate)
        rates = self.rates
        if other not in rates and not self._inferred:
            mode = other  # not measured at this size yet
        elif len(rates) == 2:
            mode = self._choose(rates[True] > rates[False])
        else:  # inferred, the other not measured yet
            mode = self._choose(self.plain)
        if mode != self.plain:
            self.plain, self._window, self._inferred = mode, Window(), False
