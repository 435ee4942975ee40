"""Tiny 4-bit folders of many mlx-lm architectures, built with mlx-lm's own model classes.

`make_family(root, family)` writes `root/target` and `root/draft` for one family of
`FAMILIES` the way an mlx-community folder is made: the model built from a config by mlx-lm
(`mlx_lm.models.<type>.Model`), seeded weights, `mlx_lm.utils.quantize_model` to 4 bits,
`save_model` / `save_config`, plus the small byte-level BPE tokenizer of tests/helpers/tiny.py.
The draft is the same family with fewer layers: the target's embedding, head and first layers
(a layer subset agrees with the target often but not always), or the target itself.

Every family is tiny (hidden 64, 2-4 layers) so the per-architecture tests stay fast; the configs
keep each family's distinguishing parts (rope scaling, biases, q/k norms, sliding windows,
experts, recurrent layers).

    python -c "from tests.helpers.tiny_arch import make_family; make_family('DIR', 'gemma3_text')"
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from tests.helpers import tiny_gemma4
from tests.helpers.tiny import SPECIALS, make_tokenizer
from tests.helpers.tiny_long import long_context

HIDDEN = 64
EOS = SPECIALS.index("<|im_end|>")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _base(model_type: str, vocab: int, layers: int, **extra: Any) -> dict:
    return {
        "model_type": model_type,
        "hidden_size": HIDDEN,
        "num_hidden_layers": layers,
        "intermediate_size": 2 * HIDDEN,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "eos_token_id": EOS,
        **extra,
    }


def llama(vocab: int, layers: int) -> dict:
    """Llama 3.x: rope scaling of type llama3 (Llama3RoPE), tied embeddings as in 3.2 1B."""
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    return _base("llama", vocab, layers, rope_scaling=scaling, tie_word_embeddings=True)


def qwen2(vocab: int, layers: int) -> dict:
    """Qwen2.5: q/k/v projections with biases."""
    return _base("qwen2", vocab, layers, tie_word_embeddings=True)


def qwen3(vocab: int, layers: int) -> dict:
    """Qwen3: q/k RMS norms per head."""
    return _base("qwen3", vocab, layers, tie_word_embeddings=True)


def gemma3_text(vocab: int, layers: int) -> dict:
    """Gemma 3: sliding-window layers (RotatingKVCache) between global ones, a window of 24
    tokens so that answers pass it; its own RMSNorm (1 + weight), scaled embeddings."""
    return _base(
        "gemma3_text",
        vocab,
        layers,
        query_pre_attn_scalar=16,
        sliding_window=24,
        sliding_window_pattern=2,
        rope_local_base_freq=10000.0,
    )


def gemma4_text(vocab: int, layers: int) -> dict:
    """Gemma 4: windows and KV-shared layers (tests/helpers/tiny_gemma4.py)."""
    return tiny_gemma4.text_config(_base("gemma4_text", vocab, layers), layers)


def gemma4(vocab: int, layers: int) -> dict:
    """Gemma 4 as mlx-community folders ship it: gemma4_text inside a multimodal config."""
    return tiny_gemma4.wrapped(gemma4_text(vocab, layers))


def gemma4_moe(vocab: int, layers: int) -> dict:
    """Gemma 4 26B-A4B style: experts beside every MLP, no KV-shared layers."""
    return tiny_gemma4.moe_config(_base("gemma4_text", vocab, layers), layers)


def phi3(vocab: int, layers: int) -> dict:
    """Phi-3.5 / Phi-4-mini: fused qkv and gate_up projections, longrope (SuScaledRoPE)."""
    half = 16 // 2
    scaling = {"type": "longrope", "long_factor": [1.5] * half, "short_factor": [1.0] * half}
    return _base(
        "phi3",
        vocab,
        layers,
        rope_scaling=scaling,
        original_max_position_embeddings=2048,
        pad_token_id=0,  # transformers' Phi3Config would default to 32000, past this vocabulary
    )


def ministral3(vocab: int, layers: int) -> dict:
    """Ministral 3: yarn rope plus Llama 4's position-dependent query scaling."""
    rope = {
        "rope_type": "yarn",
        "rope_theta": 1_000_000.0,
        "factor": 16.0,
        "original_max_position_embeddings": 256,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1,
    }
    return _base("ministral3", vocab, layers, rope_parameters=rope, tie_word_embeddings=True)


def qwen3_moe(vocab: int, layers: int) -> dict:
    """Qwen3 MoE: 4 experts, 2 per token (SwitchGLU)."""
    return _base(
        "qwen3_moe",
        vocab,
        layers,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        norm_topk_prob=True,
    )


def gpt_oss(vocab: int, layers: int) -> dict:
    """gpt-oss: experts, attention sinks, sliding-window layers between full ones."""
    types = ["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (
        layers % 2
    )
    return _base(
        "gpt_oss",
        vocab,
        layers,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=24,
        layer_types=types,
    )


def _linear_attention(layers: int) -> dict:
    return {
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
    }


def qwen3_next(vocab: int, layers: int) -> dict:
    """Qwen3-Next: gated delta-net layers (ArraysCache) and gated attention, experts."""
    return _base(
        "qwen3_next",
        vocab,
        layers,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=32,
        mlp_only_layers=[],
        moe_intermediate_size=32,
        partial_rotary_factor=0.25,
        norm_topk_prob=True,
        **_linear_attention(layers),
    )


def qwen3_5(vocab: int, layers: int) -> dict:
    """Qwen3.5 (dense): gated delta-net layers and gated attention, the text part of a
    conditional-generation config (`text_config`), as mlx-community folders ship it."""
    text = _base("qwen3_5_text", vocab, layers, tie_word_embeddings=True)
    text |= _linear_attention(layers)
    text["rope_parameters"] = {
        "type": "default",
        "mrope_section": [2, 1, 1],
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
    }
    return {
        "model_type": "qwen3_5",
        "text_config": text,
        "tie_word_embeddings": True,
        "eos_token_id": EOS,
    }


def mamba2(vocab: int, layers: int) -> dict:
    """Mamba 2: recurrent layers only (ArraysCache), no attention and no layer counting positions."""
    return {
        "model_type": "mamba2",
        "num_heads": 8,
        "head_dim": 16,
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "state_size": 16,
        "num_hidden_layers": layers,
        "layer_norm_epsilon": 1e-5,
        "conv_kernel": 4,
        "n_groups": 1,
        "use_bias": False,
        "use_conv_bias": True,
        "tie_word_embeddings": True,
        "time_step_limit": [0.001, 100.0],
        "time_step_rank": "auto",
        "eos_token_id": EOS,
    }


Family = Callable[[int, int], dict]
FAMILIES: dict[str, Family] = {
    f.__name__: f
    for f in (
        llama,
        qwen2,
        qwen3,
        gemma3_text,
        gemma4_text,
        phi3,
        ministral3,
        qwen3_moe,
        gpt_oss,
        qwen3_next,
        qwen3_5,
    )
}
# Built on request only (tests/loop/test_restore.py, tests/loading/test_gemma4.py), not in every
# per-architecture test.
MORE: dict[str, Family] = {"mamba2": mamba2, "gemma4": gemma4, "gemma4_moe": gemma4_moe}
TARGET_LAYERS, DRAFT_LAYERS = 4, 2
SPREAD = 3.0  # logit standard deviation (calibrate)


def build(config: dict) -> Any:
    """The mlx-lm model for `config` (mlx_lm.models.<model_type>.Model), unevaluated weights."""
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    return module.Model(module.ModelArgs.from_dict(config))


def seed_weights(model: Any, seed: int, scale: float = 1.5) -> None:
    """Replace every weight by seeded numpy draws: matrices N(0, scale^2 / fan_in) (logits peaked
    enough for sampling tests), embeddings N(0, 1); vectors (norms, biases, sinks, A_log, dt_bias)
    keep mlx-lm's initial values, except biases, which get small draws."""
    rng = np.random.default_rng(seed)
    new = []
    params: dict[str, mx.array] = dict(tree_flatten(model.parameters()))
    for name in sorted(params):
        shape = tuple(params[name].shape)
        if "embed" in name:
            draw = rng.standard_normal(shape)
        elif len(shape) >= 2:
            fan_in = shape[-1] if shape[-1] > 1 else shape[-2]
            draw = rng.standard_normal(shape) * scale / np.sqrt(fan_in)
        elif name.endswith("bias") and "dt_bias" not in name:
            draw = rng.standard_normal(shape) * 0.1
        else:
            continue
        new.append((name, mx.array(draw.astype(np.float32))))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


def calibrate(model: Any, spread: float) -> None:
    """Scale the output head so that the logits of a probe prompt have standard deviation
    `spread` (peaked, but with several likely tokens: what sampling tests need). Scaled: lm_head,
    or where the head is the tied embedding, the final norm's weight."""
    params = dict(tree_flatten(model.parameters()))
    probe = mx.array([[(7 * i + 3) % 300 + 4 for i in range(12)]])
    factor = spread / float(mx.std(model(probe)[0, -1]).item())  # type: ignore[arg-type]
    name = next((k for k in params if k.endswith("lm_head.weight")), None)
    if name is None:  # tied: the final norm (outside the layers) scales the logits
        name = next(k for k in params if "layers." not in k and ".norm" in k and "weight" in k)
    model.update(tree_unflatten([(name, params[name] * factor)]))
    mx.eval(model.parameters())


def rare_eos(model: Any, eos: int = EOS) -> None:
    """Make EOS unlikely (its output row scaled down), so that answers run to max_tokens and pass
    the sliding windows; the output head is lm_head, or the embedding where it is tied."""
    params = dict(tree_flatten(model.parameters()))
    name = next((k for k in params if k.endswith("lm_head.weight")), None)
    name = name or next(k for k in params if "embed" in k and k.endswith("weight"))
    weight = params[name]
    model.update(tree_unflatten([(name, weight.at[eos].multiply(0.1))]))
    mx.eval(model.parameters())


def _subset(target: Any, draft: Any) -> None:
    """Give `draft` the target's parameters wherever a name and shape match (the embedding, the
    head, the final norm and the first layers)."""
    have = dict(tree_flatten(target.parameters()))
    mine = dict(tree_flatten(draft.parameters()))
    draft.update(
        tree_unflatten(
            [(k, have[k]) for k, v in mine.items() if k in have and have[k].shape == v.shape]
        )
    )


def save_quantized(
    model: Any, config: dict, path: Path, tokenizer_dir: Path, bits: int = 4
) -> Path:
    """Quantize with mlx-lm (group 32, affine, as mlx-community's 4-bit folders) and save an
    HF-style folder: model.safetensors, config.json (with its quantization entry), tokenizer."""
    from mlx_lm.utils import quantize_model, save_config, save_model

    model, config = quantize_model(model, dict(config), group_size=32, bits=bits)
    save_model(path, model)
    save_config(config, path / "config.json")
    for name in _TOKENIZER_FILES:
        (path / name).write_bytes((tokenizer_dir / name).read_bytes())
    return path


def family_config(family: str, vocab: int, layers: int, context: int | None = None) -> dict:
    """The tiny config of `family` (a FAMILIES key) with this vocabulary and layer count;
    `context`: a context window of that many tokens (tests/helpers/tiny_long.py)."""
    made = FAMILIES.get(family) or MORE.get(family)
    if made is None:
        raise ValueError(f"unknown family {family!r}; choose from {', '.join(FAMILIES)}")
    config = made(vocab, layers)
    return config if context is None else long_context(config, context)


def make_family(
    root: str | Path,
    family: str,
    seed: int = 0,
    *,
    draft: str = "subset",
    layers: int = TARGET_LAYERS,
    context: int | None = None,
) -> tuple[Path, Path]:
    """Write `root/target` (`layers` layers) and `root/draft` of one family, 4-bit; return
    their paths. draft="subset": DRAFT_LAYERS layers holding the target's first layers, embedding
    and head; "self": the target again (every drafted token is accepted at temperature 0).
    `context`: both models' context window, rope as long-context checkpoints ship it."""
    root = Path(root)
    tok_dir = root / "tokenizer"
    vocab = make_tokenizer(tok_dir, seed=seed)
    tcfg = family_config(family, vocab, layers, context)
    target = build(tcfg)
    seed_weights(target, seed)
    tiny_gemma4.boost_attention(target, family)
    calibrate(target, SPREAD)
    rare_eos(target)
    if draft == "self":
        dcfg, dmodel = tcfg, build(tcfg)
        dmodel.update(target.parameters())
    elif draft == "subset":
        dcfg = family_config(family, vocab, DRAFT_LAYERS, context)
        dmodel = build(dcfg)
        seed_weights(dmodel, seed + 1000)
        tiny_gemma4.boost_attention(dmodel, family)
        _subset(target, dmodel)
    else:
        raise ValueError(f"unknown draft kind {draft!r}")
    return (
        save_quantized(target, tcfg, root / "target", tok_dir),
        save_quantized(dmodel, dcfg, root / "draft", tok_dir),
    )
