"""Tiny seeded models for tests, demos and CI: real mlx-lm llama folders, made in milliseconds.

`make_tiny_pair(dir, seed=0)` writes a target and a draft that share a small byte-level BPE
tokenizer (with a ChatML chat template), so every code path (loading, tokenizer check, chat
template, detokenizer, caches) runs on them exactly as on a real pair. Weights are drawn from
numpy's seeded generator: same seed, same files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from research.distill.eagle import eagle_config

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A reasoning model's template (Qwen3's shape): thinking unless enable_thinking is false, which
# opens and closes an empty reasoning part itself.
THINKING_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
THINK_TOKENS = ["<think>", "</think>"]  # plain added tokens (not special), as Qwen3's
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_WORDS = (
    "the a of to and in is it that for on with as was at by this be from or are an have not "
    "model token draft target fast slow speculative decoding accept reject bonus correct sample "
    "cat dog house tree river mountain city country light water fire earth sun moon star "
    "one two three four five six seven eight nine ten hello world question answer why how what"
).split()


def _corpus(seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_WORDS, size=12)) + "." for _ in range(400)]


def make_tokenizer(
    path: Path, vocab_size: int = 384, seed: int = 0, *, thinking: bool = False
) -> int:
    """Train a byte-level BPE on a seeded word soup; write tokenizer.json + config. Returns vocab
    size. `thinking`: a reasoning model's tokenizer (THINK_TOKENS, THINKING_TEMPLATE)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    if thinking:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": THINKING_TEMPLATE if thinking else CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 512,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (path / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    )
    return tok.get_vocab_size()


def llama_config(
    vocab_size: int, layers: int, hidden: int = 64, context: int = 512, rope_theta: float = 1e4
) -> dict:
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": hidden * 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": vocab_size,
        "max_position_embeddings": context,
        "rope_theta": rope_theta,
        "tie_word_embeddings": True,
        "eos_token_id": SPECIALS.index("<|im_end|>"),
    }


def random_llama_weights(config: dict, seed: int, scale: float = 2.0) -> dict[str, np.ndarray]:
    """Seeded weights with mlx-lm llama names. `scale` sets how peaked the logits are."""
    rng = np.random.default_rng(seed)
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    hd = h // config["num_attention_heads"]
    kv = hd * config["num_key_value_heads"]

    def w(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    out = {"model.embed_tokens.weight": (rng.standard_normal((v, h)) * 1.0).astype(np.float32)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": w(h, h),
            p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h),
            p + "self_attn.o_proj.weight": w(h, h),
            p + "mlp.gate_proj.weight": w(f, h),
            p + "mlp.up_proj.weight": w(f, h),
            p + "mlp.down_proj.weight": w(h, f),
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
        }
    out["model.norm.weight"] = np.ones(h, np.float32)
    return out


def write_model(
    path: Path, config: dict, weights: dict[str, np.ndarray], tokenizer_dir: Path
) -> Path:
    """Write an mlx-lm folder: config.json, model.safetensors and the shared tokenizer files."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    mx.save_safetensors(
        str(path / "model.safetensors"), {k: mx.array(a) for k, a in weights.items()}
    )
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (path / name).write_bytes((tokenizer_dir / name).read_bytes())
    return path


def make_tiny_pair(
    root: str | Path,
    seed: int = 0,
    *,
    target_layers: int = 4,
    draft: str = "subset",
    noise: float = 0.0,
    context: int = 512,
    hidden: int = 64,
    thinking: bool = False,
) -> tuple[Path, Path]:
    """Write `root/target` and `root/draft`; return their paths.

    draft="subset": the target's embedding + its first layer (agrees often, not always);
    draft="self": an exact copy of the target (every draft token must be accepted);
    draft="random": independent weights (rarely agrees). `noise` perturbs the draft's weights.
    `context`: both models' max_position_embeddings (the engine's context window); past the
    default 512 RoPE's base grows with it (as long-context checkpoints scale theirs), so
    positions stay apart. `hidden`: the models' width (4 heads; 128
    makes heads of 32, the narrowest a quantized KV cache takes). `thinking`: the tokenizer
    and chat template of a reasoning model (make_tokenizer).
    """
    root = Path(root)
    tok_dir = root / "tokenizer"
    vocab = make_tokenizer(tok_dir, seed=seed, thinking=thinking)
    theta = 1e4 * max(1.0, context / 512) ** 2
    tcfg = llama_config(vocab, target_layers, hidden, context=context, rope_theta=theta)
    tw = random_llama_weights(tcfg, seed)
    target = write_model(root / "target", tcfg, tw, tok_dir)
    if draft == "self":
        dcfg, dw = tcfg, dict(tw)
    elif draft == "subset":
        dcfg = llama_config(vocab, 1, hidden, context=context, rope_theta=theta)
        dw = {
            k: v
            for k, v in tw.items()
            if not k.startswith("model.layers.") or k.startswith("model.layers.0.")
        }
    elif draft == "random":
        dcfg = llama_config(vocab, 1, hidden, context=context, rope_theta=theta)
        dw = random_llama_weights(dcfg, seed + 1000)
    else:
        raise ValueError(f"unknown draft kind {draft!r}")
    if noise:
        rng = np.random.default_rng(seed + 7)
        dw = {
            k: (a + noise * rng.standard_normal(a.shape) * a.std()).astype(np.float32)
            for k, a in dw.items()
        }
    return target, write_model(root / "draft", dcfg, dw, tok_dir)


def make_tiny_eagle(
    target: str | Path,
    out: str | Path,
    seed: int = 0,
    head: int | None = None,
    feature_layers: tuple[int, ...] | None = None,
):
    """Write a seeded feature draft (edgespec.architectures.eagle) for the tiny target at `target`: one llama
    layer, fc initialised to pass the feature through plus the token's embedding. `head`: score
    only that many token ids (every other one, from 0), so off-head tokens get q = 0.
    `feature_layers` (EAGLE-3, must hold -1): a fusion of those target layers, the identity on
    the top block plus seeded noise on every block."""

    target, out = Path(target), Path(out)
    tcfg = json.loads((target / "config.json").read_text())
    vocab, h = tcfg["vocab_size"], tcfg["hidden_size"]
    ids = np.arange(vocab) if head is None else np.arange(0, vocab, 2)[:head]
    cfg = eagle_config(tcfg, 1, len(ids))
    layer = random_llama_weights({**tcfg, "num_hidden_layers": 1}, seed + 2000, scale=0.5)
    weights = {
        k.removeprefix("model."): a for k, a in layer.items() if k.startswith("model.layers.")
    }
    weights |= {
        "fc.weight": np.concatenate([np.eye(h), np.eye(h)], axis=1).astype(np.float32),
        "fc.bias": np.zeros(h, np.float32),
        "norm.weight": np.ones(h, np.float32),
        "head_ids": ids.astype(np.int32),
    }
    if feature_layers:
        k, j = len(feature_layers), feature_layers.index(-1)
        fuse = np.random.default_rng(seed + 3000).normal(0, 0.5 / np.sqrt(h), (h, k * h))
        fuse[:, j * h : (j + 1) * h] += np.eye(h)
        weights["fuse_fc.weight"] = fuse.astype(np.float32)
        cfg |= {"feature_layers": list(feature_layers), "layer_scale": 1.0}
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    mx.save_safetensors(
        str(out / "model.safetensors"), {k: mx.array(a) for k, a in weights.items()}
    )
    return out


def tiny_gpt2() -> Any:
    """A one-layer GPT-2 (seeded by MLX's default key): an architecture that neither draft trees
    nor packed forwards run (their llama-style blocks only)."""
    from mlx_lm.models import gpt2

    args = gpt2.ModelArgs(
        model_type="gpt2",
        n_ctx=64,
        n_embd=32,
        n_head=4,
        n_layer=1,
        n_positions=64,
        layer_norm_epsilon=1e-5,
        vocab_size=50,
    )
    return gpt2.Model(args)
