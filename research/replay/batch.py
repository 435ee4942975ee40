"""The server's batch mode replayed (edgespec/server/mode.py BatchMode): `running` requests answer
together, one round each per turn, their target rows in one packed forward (the weights read once
for all), each request's K from its own AdaptiveK under the batch's gate (drafting, or a plain
step for all: PLAIN_ONLY). A turn costs every request's draft steps one after another and one
forward over all their rows at the profile's context; each request sees that forward's time as
its verify (what it waited for). Requests answer recorded token-draft traces (a request that
ends starts the next trace, so the batch stays full); the batch mode observes every turn's
tokens and seconds. Compared with: every request drafting by its own policy (no gate), every
request stepping plainly, and every request at one fixed K.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from edgespec.events import Round
from edgespec.server.mode import BatchMode
from research.replay.chains import Outcome, adaptive, fixed
from research.replay.profiles import Profile
from research.replay.traces import Trace


class Request:
    """One request's place in its trace and its policy's pending rounds."""

    def __init__(self, trace: Trace, policy: Any):
        self.trace, self.policy, self.i = trace, policy, 0
        self.fresh: list[Round] = []

    def decide(self) -> int:
        for r in self.fresh:
            self.policy.observe(r)
        self.fresh.clear()
        return self.policy.decide()


def replay(
    traces: list[Trace],
    profile: Profile,
    make_policy: Callable[[], Any],
    running: int = 4,
    turns: int = 600,
    mode: BatchMode | None = None,
) -> Outcome:
    """`turns` turns of `running` requests over `traces` (cycled); `mode` gates their policies."""
    queue = iter(traces * (1 + running * turns // max(sum(t.size for t in traces), 1) * 2 + 2))

    def start() -> Request:
        policy = make_policy()
        return Request(next(queue), mode.gate(policy) if mode is not None else policy)

    reqs, out = [start() for _ in range(running)], Outcome()
    for _ in range(turns):
        if mode is not None:
            mode.begin(running)
        ks = [max(r.decide(), 0) for r in reqs]  # the gate's PLAIN_ONLY: a plain step
        drafts = [profile.draft(1) * k for k in ks]
        forward = profile.verify(sum(k + 1 for k in ks))
        seconds, tokens = sum(drafts) + forward, 0
        for j, (req, k) in enumerate(zip(reqs, ks, strict=True)):
            n = req.trace.chain(req.i, k) if k else 0
            step = min(n + 1, req.trace.size - req.i)
            ctx = req.trace.context + req.i
            req.fresh.append(Round(req.i, k, n, k, drafts[j], forward, "draft", True, context=ctx))
            req.i += step
            tokens += step
            if req.i >= req.trace.size:
                reqs[j] = start()
        out.tokens += tokens
        out.seconds += seconds
        if mode is not None:
            mode.observe(running, tokens, seconds)
    return out


CPUS = ("zen4", "xeon")  # the server starts a batch plain on a CPU (BatchMode's prefer_plain)


def variants(profile: Profile) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """name -> (policy factory, mode factory): the batch mode, no gate, plain, fixed K."""

    def none() -> None:
        return None

    cpu = profile.hw.name in CPUS
    out: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
        "batch mode": (lambda: adaptive("draft"), lambda: BatchMode(prefer_plain=cpu)),
        "own K (no gate)": (lambda: adaptive("draft"), none),
        "plain": (lambda: fixed(0), none),
    }
    out.update({f"K={k}": (partial(fixed, k), none) for k in range(1, 5)})
    return out
