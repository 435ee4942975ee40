"""The draft architectures: the nn.Module model classes and their files, one file per model as
mlx-lm lays out its own (what runs them across rounds: edgespec/drafting/; which runs which:
edgespec/families/).

- token_draft.py: EdgeSpec's own small llama draft (a token draft: its own KV cache);
- eagle.py: EAGLE / EAGLE-3 feature drafts (one layer over the target's hidden states);
- mtp.py: a Qwen3.5 / Qwen3-Next checkpoint's own multi-token-prediction layer;
- nextn.py: DeepSeek-V3, GLM-4.5 and MiMo next-n layers (the MTP contract under other names);
- block_model.py and block_head.py: DFlash-style block drafts and their reduced output head
  (block_mask.py: which keys a block query sees; weight_keys.py: one-line weight-key errors);
- dflash2_model.py: DFlash2 block drafts (DFlash's layers with convolutions, a candidate selector);
- gemma4_assistant.py: Google's Gemma 4 `-assistant` drafters (heads over the target's states
  and KV cache).

Each model class names the draft family that runs it (`draft_family`: "feature", "mtp",
"block", "dflash2" or "assistant"; a model without one, such as any mlx-lm model, is a token
draft).
"""

from __future__ import annotations

from typing import Any

TOKEN_DRAFT = "edgespec_draft"  # model_type of token_draft.py's drafts
EAGLE = "edgespec_eagle"  # model_type of eagle.py's feature drafts
BLOCK = "edgespec_block"  # model_type of our block drafts
DFLASH = "DFlashDraftModel"  # the architecture of z-lab's published block drafts
DFLASH2 = "DFlash2DraftModel"  # z-lab's and Inco AI's DFlash2 block drafts
ASSISTANTS = ("gemma4_assistant", "gemma4_unified_assistant")  # Google's Gemma 4 drafters


def architecture_of(config: dict[str, Any]) -> str:
    """Which of these files builds the model of a folder's config.json: "token_draft",
    "eagle", "block", "dflash2", "gemma4_assistant", or "" (a model mlx-lm builds itself). Reads
    the config alone, so that loading a token draft imports none of the other architectures."""
    kind = config.get("model_type")
    if kind == TOKEN_DRAFT:
        return "token_draft"
    if kind == EAGLE:
        return "eagle"
    if DFLASH2 in (config.get("architectures") or []):
        return "dflash2"
    if kind == BLOCK or DFLASH in config.get("architectures", []):
        return "block"
    if kind in ASSISTANTS:
        return "gemma4_assistant"
    return ""


def head_apart(config: dict[str, Any]) -> bool:
    """Whether a target's own multi-token head ships as a checkpoint of its own rather than in
    the target's weights: a Gemma 4's is Google's `-assistant` (gemma4_assistant.py)."""
    kind = str(config.get("model_type", ""))
    return kind.startswith("gemma4") and kind not in ASSISTANTS
