"""Finding, fetching, converting and loading models (edgespec/loading/load.py: a pair), and the
progress reports they make while they do."""

from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[str, "float | None"], None]  # (stage, fraction done or None)


def report(on_progress: ProgressFn | None, stage: str, fraction: float | None = None) -> None:
    """Tell `on_progress` (if any) that `stage` is under way, `fraction` done."""
    if on_progress is not None:
        on_progress(stage, fraction)
