"""`edgespec serve` warms the engine up (compiles the loop's shapes, calibrates adaptive K) on
its worker thread before the worker reports the engine loaded, so before the server listens and
/health answers; `--no-warmup` skips it."""

from __future__ import annotations

import argparse

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
    worker, engine = serve._start_worker(args, config)
    try:
        assert engine.warmed == ([config] if warmed else [])
        assert engine.threads == {worker.mlx._thread.ident}  # on the thread that owns MLX
    finally:
        worker.shutdown()
