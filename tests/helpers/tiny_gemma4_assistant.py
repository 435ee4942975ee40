"""A tiny Gemma 4 assistant drafter of the published layout, beside the tiny Gemma 4 target of
tests/helpers/tiny_arch.py (`gemma4`: mlx-community's multimodal config, 4 layers, the last two
KV-shared, a window of 16, keys as values on the global layers).

`make_assistant(root)` writes `root/target` (make_family's 4-bit folder), `root/assistant`:
config.json with the full key set of Google's `-assistant` configs (`assistant_config`, sizes
scaled down) and model.safetensors under the checkpoint's own tensor names
(edgespec/architectures/gemma4_assistant.py lists them), no tokenizer files (the target's is
used). Its weights are trained for a few hundred steps on the target's greedy answer to PROMPT,
two draft steps deep, so that drafts are accepted often enough for a planted bug to show; and
`root/assistant-ordered`, the same weights with the centroid-routed head of the E2B / E4B
assistants (`masked_embedding.*`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import KVCache

from edgespec.architectures.gemma4_assistant import Gemma4Assistant, assistant_args
from edgespec.loading.load import load_model
from edgespec.taps import TOP, target_features, text_model
from tests.helpers.arch_models import PROMPT
from tests.helpers.mtp_models import greedy_answer
from tests.helpers.tiny_arch import EOS, TARGET_LAYERS, make_family, seed_weights

HIDDEN = 32  # the assistant's own width (the target's is 64: backbone_hidden_size)


def training_masks(model: Gemma4Assistant, length: int) -> dict[str, Any]:
    """Masks for `length` queries at positions 0.. over as many keys, each query seeing what a
    draft step at its position sees: all keys up to it (full), the last window (sliding)."""
    return {
        "full_attention": "causal",
        "sliding_attention": create_causal_mask(length, 0, window_size=model.window),
    }


def assistant_config(target: dict[str, Any], ordered: bool = False) -> dict[str, Any]:
    """The assistant config.json for a tiny gemma4_text `target` config: every field Google's
    configs carry (docs/architectures.md), sizes scaled down; `ordered`: the E2B / E4B form."""
    vocab = int(target["vocab_size"])
    clusters = next(c for c in (8, 6, 4, 3, 2, 1) if vocab % c == 0)
    text = {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attention_k_eq_v": target["attention_k_eq_v"],
        "bos_token_id": 2,
        "dtype": "bfloat16",
        "enable_moe_block": False,
        "eos_token_id": EOS,
        "final_logit_softcapping": None,
        "global_head_dim": target["global_head_dim"],
        "head_dim": target["head_dim"],
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": HIDDEN,
        "hidden_size_per_layer_input": 0,
        "initializer_range": 0.02,
        "intermediate_size": 2 * HIDDEN,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "max_position_embeddings": target["max_position_embeddings"],
        "model_type": "gemma4_text",
        "moe_intermediate_size": None,
        "num_attention_heads": 4,
        "num_experts": None,
        "num_global_key_value_heads": target["num_global_key_value_heads"],
        "num_hidden_layers": 4,
        "num_key_value_heads": target["num_key_value_heads"],
        "num_kv_shared_layers": 4,
        "pad_token_id": 0,
        "rms_norm_eps": 1e-6,
        "rope_parameters": target["rope_parameters"],
        "sliding_window": target["sliding_window"],
        "tie_word_embeddings": True,
        "top_k_experts": None,
        "use_bidirectional_attention": None,
        "use_cache": True,
        "use_double_wide_mlp": False,
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
    }
    return {
        "architectures": ["Gemma4AssistantForCausalLM"],
        "backbone_hidden_size": target["hidden_size"],
        "centroid_intermediate_top_k": 2,
        "dtype": "bfloat16",
        "model_type": "gemma4_assistant",
        "num_centroids": clusters,
        "text_config": text,
        "tie_word_embeddings": True,
        "transformers_version": "5.7.0.dev0",
        "use_ordered_embeddings": ordered,
    }


def full_states(target: nn.Module, ids: list[int]) -> tuple[mx.array, mx.array, dict]:
    """One forward of `target` over `ids` with a full cache on every storing layer: (top hidden
    states [L, B], logits [L, V], layer kind -> the keys and values of its last storing layer)."""
    args = text_model(target).args
    kinds = args.layer_types[: args.num_hidden_layers - args.num_kv_shared_layers]
    cache = [KVCache() for _ in kinds]
    feats, logits = target_features(target, mx.array(ids), cache, (TOP,))
    last = {kind: (c.keys, c.values) for kind, c in zip(kinds, cache, strict=True)}
    return feats, logits, last


def train(model: Gemma4Assistant, target: nn.Module, ids: list[int], steps: int) -> float:
    """Fit two draft steps at every position t of `ids`: from (x_{t+1}, h_t) to the target's
    p(. | x_0..x_{t+1}), then from (x_{t+2}, the first step's next state) to the one after, by
    the tied head over every token (a centroid-routed head then picks among them). Returns the
    last loss."""
    feats, logits, kv = full_states(target, ids)
    n = len(ids) - 3
    p1, p2 = mx.softmax(logits[1 : n + 1]), mx.softmax(logits[2 : n + 2])
    kv = {k: (keys[..., :n, :], values[..., :n, :]) for k, (keys, values) in kv.items()}
    e1, e2 = (model.embed(mx.array(ids[a : a + n])[None]) for a in (1, 2))
    masks = training_masks(model, n)
    mx.eval(feats, p1, p2, kv, e1, e2)
    model.freeze(keys=["token_ordering"], strict=False)  # an index, never trained

    def loss_fn(m: Gemma4Assistant) -> mx.array:
        y1, nxt = m(mx.concatenate([e1, feats[None, :n]], -1), kv, 0, masks)
        y2, _ = m(mx.concatenate([e2, nxt], -1), kv, 0, masks)
        total = mx.array(0.0)
        for y, p in ((y1, p1), (y2, p2)):
            dense = m.model.embed_tokens.as_linear(y)[0]  # the tied head over every token
            total = total - (p * nn.log_softmax(dense, axis=-1)).sum(-1).mean()
        return total

    opt = optim.Adam(learning_rate=3e-3)
    step = nn.value_and_grad(model, loss_fn)
    loss = mx.array(0.0)
    for _ in range(steps):
        loss, grads = step(model)
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state, loss)
    return float(loss.item())


def hf_weights(model: Gemma4Assistant) -> dict[str, mx.array]:
    """The assistant's weights under the checkpoint's names, bfloat16 as published (the token
    ordering as int64, as Google stores it)."""
    out = {}
    for name, value in tree_flatten(model.parameters()):
        floating = mx.issubdtype(value.dtype, mx.floating)
        out[name] = value.astype(mx.bfloat16 if floating else mx.int64)
    return out


def save(model: Gemma4Assistant, config: dict[str, Any], path: Path) -> Path:
    """Write the checkpoint folder: model.safetensors and config.json."""
    path.mkdir()
    mx.save_safetensors(str(path / "model.safetensors"), hf_weights(model))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def write_assistant(target: Path, out: Path, ordered: bool = False, unified: bool = False) -> Path:
    """An untrained (seeded) assistant of the published layout for the tiny Gemma 4 folder
    `target`: `ordered`, the E2B / E4B centroid-routed head; `unified`, the 12B's model type
    (gemma4_unified_assistant, beside a gemma4_unified target). Drafts are rarely accepted;
    exactness and the layout are what it checks."""
    target_config = json.loads((target / "config.json").read_text())
    config = assistant_config(target_config.get("text_config", target_config), ordered)
    model = Gemma4Assistant(config, assistant_args(config, "tiny"))
    seed_weights(model, 7, scale=1.0)
    if ordered:
        order = np.random.default_rng(3).permutation(model.args.vocab_size).astype(np.int32)
        model.masked_embedding.token_ordering = mx.array(order)
    if unified:
        config["model_type"] = "gemma4_unified_assistant"
    return save(model, config, out)


def make_assistant(
    root: Path,
    steps: int = 40,
    length: int = 300,
    family: str = "gemma4",
    *,
    layers: int = TARGET_LAYERS,
    context: int | None = None,
) -> tuple[Path, Path, Path]:
    """Write `root/target` (a tiny_arch `family`: gemma4, or gemma4_moe for 26B-A4B's form, of
    `layers` layers and a context window of `context` tokens, make_family's), `root/assistant`
    (trained: module docstring) and `root/assistant-ordered` (the same weights with a
    centroid-routed head: seeded centroids, a seeded token ordering); return their paths."""
    target_path, _ = make_family(root, family, layers=layers, context=context)
    target_config = json.loads((target_path / "config.json").read_text())
    target_config = target_config.get("text_config", target_config)
    loaded = load_model(str(target_path), dequantize=True)
    config = assistant_config(target_config)
    model = Gemma4Assistant(config, assistant_args(config, "tiny"))
    seed_weights(model, 7, scale=1.0)
    model.attach(loaded.model)
    train(
        model,
        loaded.model,
        greedy_answer(loaded.model, loaded.tokenizer.encode(PROMPT), length),
        steps,
    )
    ordered_config = assistant_config(target_config, ordered=True)
    ordered = Gemma4Assistant(ordered_config, assistant_args(ordered_config, "tiny"))
    seed_weights(ordered, 8, scale=1.0)
    ordered.update(model.parameters())
    vocab = int(target_config["vocab_size"])
    order = np.random.default_rng(3).permutation(vocab).astype(np.int32)
    ordered.masked_embedding.token_ordering = mx.array(order)
    return (
        target_path,
        save(model, config, root / "assistant"),
        save(ordered, ordered_config, root / "assistant-ordered"),
    )
