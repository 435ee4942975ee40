"""`edgespec serve` on a target sharded over an MLX group (`mlx.launch ... -- edgespec serve`).

Rank 0 serves HTTP as a lone server does, through a GroupWorker whose engine is a GroupEngine:
before each generation it sends the request to the other ranks (edgespec.distributed.messages),
and the cancel flag it hands the loop is read alike on every rank. The other ranks run
`follow`: the same conversation pool and engine loop on each request received, output dropped,
until rank 0 stops. A lost rank, or ranks that disagree on a step, fail the request running
(or the next one) with a 500, and rank 0 then stops serving and exits with the one-line error.

    worker = GroupWorker(lambda: GroupEngine(Engine.load(..., group=group), group), ...)
    follow(Engine.load(..., group=group), group, budget_bytes, max_slots)   # ranks > 0
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, cast

from edgespec.distributed.group import Group, lost
from edgespec.distributed.messages import (
    GroupCancel,
    align_caches,
    receive_request,
    send_request,
    send_stop,
)
from edgespec.errors import GroupError
from edgespec.server.prefix import ConversationPool
from edgespec.server.worker import Worker


class LostGroup(RuntimeError):
    """A peer rank went away during a request (the server answers 500, then stops)."""


class GroupEngine:
    """Rank 0's engine: an Engine whose generate() first sends the request to the other ranks.
    Everything else is the wrapped Engine's. `lost` is set once a peer was lost (or the ranks
    disagreed on a step); `on_lost` (set by the command) is then called once, on the worker
    thread, to stop the server."""

    def __init__(self, engine: Any, group: Group):
        self.engine, self.group = engine, group
        self.lost: GroupError | None = None
        self.on_lost: Callable[[], None] = lambda: None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(
        self,
        prompt_ids: list[int],
        config: Any,
        cancel: threading.Event | None = None,
        *,
        gate: Callable[[Any], Any] | None = None,
    ) -> Iterator[Any]:
        if self.lost is not None:
            raise LostGroup(str(self.lost))
        prompt = self.engine.check_prompt(prompt_ids)  # a bad prompt is refused here alone
        try:
            send_request(self.group, prompt, config)
            align_caches(self.engine, self.group, prompt)
            shared = cast(threading.Event, GroupCancel(self.group, cancel))
            events = self.engine.generate(prompt, config, shared, gate=gate)
        except RuntimeError as exc:
            raise self._lose(exc) from None
        return self._guarded(events)

    def _guarded(self, events: Iterator[Any]) -> Iterator[Any]:
        try:
            yield from events
        except (RuntimeError, GroupError) as exc:  # GroupError: the ranks' steps differ
            raise self._lose(exc) from None

    def stop_followers(self) -> None:
        """Tell the other ranks to exit (on the worker thread, after its last job); a peer
        already gone is recorded in `lost`."""
        try:
            send_stop(self.group)
        except RuntimeError as exc:
            self.lost = lost(exc, self.group)
            if self.lost is None:
                raise

    def _lose(self, exc: Exception) -> Exception:
        """LostGroup for a backend failure that means a lost peer, or for ranks that disagree
        (after stopping the server: the ranks cannot go on together); any other error as it is."""
        error = exc if isinstance(exc, GroupError) else lost(exc, self.group)
        if error is None:
            return exc
        self.lost = error
        self.on_lost()
        return LostGroup(str(error))


class GroupWorker(Worker):
    """The Worker of rank 0: once its thread has served its last job, it tells the other ranks
    to stop (from that thread: MLX's collectives run on the thread that owns the models)."""

    def _serve(self, engine: Any) -> None:
        try:
            super()._serve(engine)
        finally:
            if isinstance(engine, GroupEngine) and engine.lost is None:
                engine.stop_followers()


def follow(engine: Any, group: Group, budget_bytes: int, max_slots: int) -> int:
    """Ranks > 0: run every request rank 0 sends, as its worker does, output dropped; returns
    how many were received once rank 0 stops. A request that fails (the same error on every
    rank) is skipped, as rank 0 answers it with that error; a GroupError or a lost peer ends
    the loop."""
    pool = ConversationPool(engine, budget_bytes, max_slots)
    received = 0
    while (request := receive_request(group)) is not None:
        prompt, config = request
        received += 1
        pool.acquire(prompt)
        try:
            align_caches(engine, group, prompt)
            cancel = cast(threading.Event, GroupCancel(group))
            for _ in engine.generate(prompt, config, cancel):
                pass
        except Exception as exc:  # refused or failed alike on every rank: rank 0 answers it
            # with the error and goes on, and so does this rank; not a lost peer, ranks that
            # disagree, or the launcher stopping this rank (GroupError): those end it.
            if isinstance(exc, GroupError) or lost(exc, group) is not None:
                raise
        finally:
            pool.release()
    return received
