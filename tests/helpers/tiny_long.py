"""Long-context settings for the tiny architecture folders (tests/helpers/tiny_arch.py,
tests/helpers/mtp_models.py): a context window (max_position_embeddings) and the RoPE base a
long-context checkpoint of the family ships, so that a 32K-token prompt is accepted and its
global positions stay apart.

Families not listed keep their rope: Gemma 4's global layers already rotate with a base of 1e6
(proportional, a quarter of their dims), its sliding layers see only their window.
"""

from __future__ import annotations

from typing import Any

# model_type (of the text config) -> the global rope base of the family's long-context releases:
# Qwen3.5 / Qwen3-Next 1e7 (in rope_parameters for Qwen3.5), Gemma 3 1e6 with linear scaling 8.
_QWEN_THETA = 10_000_000.0
GEMMA3_SCALING = {"rope_type": "linear", "factor": 8.0}


def long_context(config: dict[str, Any], context: int) -> dict[str, Any]:
    """`config` (changed in place and returned) with a context window of `context` tokens and,
    for the families that need it, the rope of their long-context checkpoints."""
    text = config.get("text_config", config)
    text["max_position_embeddings"] = int(context)
    kind = text["model_type"]
    if kind == "qwen3_5_text":
        text["rope_parameters"] = text["rope_parameters"] | {"rope_theta": _QWEN_THETA}
    elif kind == "qwen3_next":
        text["rope_theta"] = _QWEN_THETA
    elif kind == "gemma3_text":
        text["rope_theta"] = 1_000_000.0
        text["rope_scaling"] = dict(GEMMA3_SCALING)
    return config
