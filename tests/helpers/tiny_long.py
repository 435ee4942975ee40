"""Long-context settings for the tiny architecture folders (tests/helpers/tiny_arch.py,
tests/helpers/mtp_models.py): a context window (max_position_embeddings) and, where the tiny
config's rope would not be a long-context checkpoint's, the rope base the family's long-context
releases ship, so that a 32K-token prompt is accepted and its global positions stay apart.

Qwen3.5 (qwen3_5_text): a base of 1e7, as its releases ship it (the tiny config's is 1e4).
Gemma 4 keeps its rope: its global layers already rotate a quarter of their dims with a base of
1e6 (proportional), and its sliding layers see only their window. Other families: the window
only (tests/loop/test_long_context_caches.py builds these two).
"""

from __future__ import annotations

from typing import Any

QWEN3_5_THETA = 10_000_000.0


def long_context(config: dict[str, Any], context: int) -> dict[str, Any]:
    """`config` (changed in place and returned) with a context window of `context` tokens and,
    for Qwen3.5, the rope base of its long-context releases."""
    text = config.get("text_config", config)
    text["max_position_embeddings"] = int(context)
    if text["model_type"] == "qwen3_5_text":
        text["rope_parameters"] = text["rope_parameters"] | {"rope_theta": QWEN3_5_THETA}
    return config
