"""A draft's attention bound: past a start, each draft position attends to a few sink positions
and the last `window` ones, not to the whole context (docs/drafting.md).

    bound = Bound(window=1024)          # sinks 4; on past bound.start = 2 windows of context
    layers = bound.windowed(state.cache)  # full-attention layers -> window caches of the bound

The draft's KVState holds it (`KVState.bound`, set by `bind`) and applies it in `catch_up`; the
window caches it makes are edgespec/rewind.py's (`WindowKVCache.of`), so a bounded draft rewinds
by trimming like any other. Only drafts are bounded: the target verifies every token over the
whole context, so output never depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_lm.models.cache import KVCache

from edgespec.config import MIN_DRAFT_WINDOW
from edgespec.rewind import DEPTH, WindowKVCache

# A bounded draft's catch-up reads its sinks and the last READ_WINDOWS windows of what it has not
# read (Bound, KVState.catch_up): at least window - 1 + DEPTH positions, so its rewinds are trims.
READ_WINDOWS = 2


@dataclass(frozen=True)
class Bound:
    """A draft's attention bound: past `start` tokens of context, each of its positions attends
    to the first `sinks` positions and the last `window` ones, not to the whole context, so a draft
    step costs the same at 32K tokens as at `start`. Only drafts are bounded: the target verifies
    every token over the whole context, so output is unchanged whatever the draft reads
    (docs/drafting.md). Shorter contexts keep the draft's own full cache (and every path that
    needs one: a server's copied prefixes, draft trees).

    A bounded draft also reads only the sinks and the last READ_WINDOWS windows of a long prompt,
    skipping the rest (KVState.catch_up): a query past them would never attend to them. The
    first window's queries then see less than they would have (their own windows start in the
    skipped part), which costs a little acceptance at the start of an answer, never exactness;
    two windows keep that to positions the draft has long stopped looking at."""

    window: int
    sinks: int = 4

    def __post_init__(self) -> None:
        if self.window < MIN_DRAFT_WINDOW or not 0 <= self.sinks < self.window:
            raise ValueError(
                f"a draft window needs >= {MIN_DRAFT_WINDOW} positions and 0 <= sinks < window, "
                f"got window {self.window}, sinks {self.sinks}"
            )

    @property
    def start(self) -> int:
        """The context length past which the bound is on: READ_WINDOWS windows."""
        return READ_WINDOWS * self.window

    def windowed(self, layers: list[Any]) -> list[Any] | None:
        """`layers` with each full-attention layer (a KVCache) turned into a window cache of this
        bound holding its sinks and the positions the window still needs, or None when there is
        none to turn (the layers are windows already, or of other kinds)."""
        if not any(type(layer) is KVCache for layer in layers):
            return None
        return [
            WindowKVCache.of(layer, self.window, DEPTH, self.sinks)
            if type(layer) is KVCache
            else layer
            for layer in layers
        ]
