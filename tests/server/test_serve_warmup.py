"""`edgespec serve` warms the engine up (compiles the loop's shapes, calibrates adaptive K) on
its worker thread before the worker reports the engine loaded, so before the server listens and
/health answers; `--no-warmup` skips it. Either way, what is loaded is then frozen out of the
garbage collector's full passes (edgespec.worker.freeze_heap)."""

from __future__ import annotations

import argparse
import gc

import pytest
from edgespec.tui.fake import FakeEngine

from edgespec.commands import serve
from edgespec.commands.common import generation_from_args


@pytest.mark.parametrize("flags, warmed", [((), True), (("--no-warmup",), False)])
def test_the_engine_is_warm_before_the_server_starts(
    monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...], warmed: bool
) -> None:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(["--seed", "0", *flags])
    config = generation_from_args(args)
    monkeypatch.setattr(serve, "_load", lambda args, group, draft: FakeEngine())
    gc.unfreeze()
    worker, engine = serve._start_worker(args, config)
    try:
        assert engine.warmed == ([config] if warmed else [])
        assert engine.threads == {worker.mlx._thread.ident}  # on the thread that owns MLX
        assert gc.get_freeze_count() > 0
        assert not any(o is engine for o in gc.get_objects())  # frozen: out of every generation
    finally:
        gc.unfreeze()  # the test process's objects go back to the collector
        worker.shutdown()
