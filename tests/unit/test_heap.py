"""`edgespec.worker.freeze_heap`: what a long-lived process (the chat, the server) calls once its
engine is loaded, so that CPython's full collections stop walking everything it loaded."""

from __future__ import annotations

import gc
import weakref

from edgespec.worker import freeze_heap


class _Node:
    me: _Node


def test_freeze_heap_collects_garbage_first_and_freezes_what_is_alive() -> None:
    live = _Node()
    live.me = live  # a cycle still reachable: it must be frozen
    dead = _Node()
    dead.me = dead  # a cycle nothing reaches: it must be freed, not frozen for good
    gone = weakref.ref(dead)
    del dead
    gc.disable()  # so that only freeze_heap can free the dead cycle
    gc.unfreeze()
    try:
        assert gone() is not None
        freeze_heap()
        assert gone() is None
        assert gc.get_freeze_count() > 0
        assert not any(o is live for o in gc.get_objects())  # frozen: in no generation
    finally:
        gc.unfreeze()  # the test process's objects go back to the collector
        gc.enable()
