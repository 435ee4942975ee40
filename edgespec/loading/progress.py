"""Progress reports while models are resolved, downloaded, converted and loaded."""

from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[str, "float | None"], None]  # (stage, fraction done or None)


def report(on_progress: ProgressFn | None, stage: str, fraction: float | None = None) -> None:
    """Tell `on_progress` (if any) that `stage` is under way, `fraction` done."""
    if on_progress is not None:
        on_progress(stage, fraction)


def one_line(e: BaseException) -> str:
    """An exception as one short line (the first line of its message, else its type)."""
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]
