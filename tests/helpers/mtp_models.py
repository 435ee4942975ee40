"""A tiny Qwen3.5 or Qwen3-Next written as an original Hugging Face checkpoint, MTP weights kept.

`make_checkpoint(root, prompts)` builds the tiny qwen3_5 (or qwen3_next) target of
tests/helpers/tiny_arch.py with mlx-lm's classes, trains its MTP layer for a hundred or so
steps on the target's own greedy answers to `prompts` (so that drafts get accepted often enough
for the tests to see a slower planted bug), and writes the folder under the original names
(`model.language_model.*` and `mtp.*`), norm weights stored as offsets from 1, conv1d weights as
[C, 1, K], one weight per expert: the inverse of mlx-lm's qwen3_5 / qwen3_next sanitize.
A tiny GLM-4.5 (glm4_moe), MiMo (mimo) or DeepSeek-V3 (deepseek_v3) is written the same way, its
MTP layer as the checkpoint's next-n layer (`model.layers.{num_hidden_layers}` with the copies of
the embedding and head it carries; MiMo's `model.mtp_layers.0`), norms as they are, MLA weights
merged back into `kv_b_proj`.
`strip_mtp(src, dst)` writes the same model without its MTP weights, as mlx-community ships it.
`make_checkpoint(..., feed=PRE_NORM, norm_spread=1.0)` trains the head on a feed other than its
family's, on a target whose final norm has per-channel weights (as trained models' do: with all
ones, the two feeds differ by a scale the head's own RMSNorm removes, and could not be told apart).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models.cache import make_prompt_cache

from edgespec.architectures.mtp import MtpModel, feed_layers, text_config
from edgespec.architectures.nextn import FAMILIES, NextnModel, build_head, layer_prefix
from edgespec.taps import target_features
from tests.helpers.tiny import make_tokenizer
from tests.helpers.tiny_arch import (
    EOS,
    HIDDEN,
    SPREAD,
    build,
    calibrate,
    family_config,
    rare_eos,
    save_quantized,
    seed_weights,
)

LAYERS = 4
# Norms mlx-lm's qwen3_5 sanitize offsets by 1 when it reads an original checkpoint.
OFFSET_NORMS = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "model.norm.weight",
    "q_norm.weight",
    "k_norm.weight",
)
# A tiny DeepSeek-V3 keeps its next-n layer in a shard mlx-lm's loader does not read (it reads
# model*.safetensors): mlx-lm's sanitize drops that layer only under the name `model.layers.61`.
NEXTN_SHARD = "nextn.safetensors"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def glm4_moe(vocab: int) -> dict[str, Any]:
    """A tiny GLM-4.5 (glm4_moe): a dense first layer, then 4 routed experts (2 per token) and a
    shared one, q/k norms, half the head dims rotated, one next-n layer (itself an expert layer)."""
    return {
        "model_type": "glm4_moe",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "moe_intermediate_size": 32,
        "max_position_embeddings": 4096,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "n_group": 1,
        "topk_group": 1,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
        "first_k_dense_replace": 1,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "use_qk_norm": True,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "partial_rotary_factor": 0.5,
        "eos_token_id": EOS,
        "num_nextn_predict_layers": 1,
    }


def deepseek_v3(vocab: int) -> dict[str, Any]:
    """A tiny DeepSeek-V3: MLA attention (no q LoRA), dense layers, one next-n layer that is an
    expert layer (4 routed, 2 per token, one shared), dims that divide MLX's quantization group."""
    return {
        "model_type": "deepseek_v3",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "moe_intermediate_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "routed_scaling_factor": 1.0,
        "kv_lora_rank": 64,
        "q_lora_rank": None,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 64,
        "v_head_dim": 64,
        "first_k_dense_replace": LAYERS,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "eos_token_id": EOS,
        "num_nextn_predict_layers": 1,
    }


def merged_kv_b(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """mlx-lm's MLA weights (`self_attn.embed_q` [H, r, n], `unembed_out` [H, v, r]) as the
    checkpoint's `self_attn.kv_b_proj` [H (n + v), r]: the inverse of mlx-lm's split."""
    out = {}
    for key, value in weights.items():
        if key.endswith("self_attn.unembed_out.weight"):
            continue
        if key.endswith("self_attn.embed_q.weight"):
            unembed = weights[key.replace("embed_q", "unembed_out")]
            both = mx.concatenate([value.swapaxes(-1, -2), unembed], axis=1)
            key, value = key.replace("embed_q", "kv_b_proj"), both.reshape(-1, both.shape[-1])
        out[key] = value
    return out


def mimo(vocab: int) -> dict[str, Any]:
    """A tiny MiMo-7B (mimo): Qwen2 blocks (q/k/v biases), one MTP layer."""
    return {
        "model_type": "mimo",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": 2 * HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "eos_token_id": EOS,
        "num_nextn_predict_layers": 1,
    }


def checkpoint_config(
    family: str, vocab: int, layers: int = LAYERS, context: int | None = None
) -> dict[str, Any]:
    """The tiny config of `family` (qwen3_5, qwen3_next, glm4_moe, mimo or deepseek_v3) with one
    MTP layer declared where the original configs declare it (Qwen3.5: in its text_config).
    `layers`, `context` (a context window, tests/helpers/tiny_long.py): Qwen3.5 / Qwen3-Next's."""
    made = {"glm4_moe": glm4_moe, "mimo": mimo, "deepseek_v3": deepseek_v3}.get(family)
    if made is not None:
        return made(vocab)
    config = family_config(family, vocab, layers, context)
    text_config(config)["mtp_num_hidden_layers"] = 1
    return config


def unstacked(name: str, value: mx.array) -> dict[str, mx.array]:
    """Stacked experts (mlx-lm's `mlp.switch_mlp.up_proj.weight` [E, ...]) as the original
    checkpoint stores them, one weight per expert (`mlp.experts.{e}.up_proj.weight`)."""
    if ".switch_mlp." not in name:
        return {name: value}
    mlp, proj = name.split(".switch_mlp.")
    return {f"{mlp}.experts.{e}.{proj}": value[e] for e in range(value.shape[0])}


def hf_target_weights(model: nn.Module, offsets: bool = True) -> dict[str, mx.array]:
    """An mlx-lm qwen3_5 / qwen3_next (or, offsets=False, glm4_moe) model's weights under the
    original checkpoint's names and layouts."""
    out = {}
    for name, value in tree_flatten(model.parameters()):
        key = name.replace("language_model.model.", "model.language_model.", 1)
        if "conv1d.weight" in key:
            value = value.moveaxis(2, 1)  # mlx [C, K, 1] -> torch [C, 1, K]
        elif offsets and key.endswith(OFFSET_NORMS) and value.ndim == 1:
            value = value - 1.0
        out |= unstacked(key, value)
    return merged_kv_b(out)


def hf_mtp_weights(mtp: MtpModel) -> dict[str, mx.array]:
    """An MtpModel's weights as `mtp.*` keys, norm weights stored as offsets from 1."""
    out = {}
    for name, value in tree_flatten(mtp.parameters()):
        if name.endswith("norm.weight") and value.ndim == 1:
            value = value - 1.0
        out |= unstacked(f"mtp.{name}", value)
    return out


def hf_nextn_weights(mtp: NextnModel, model: nn.Module, config: dict) -> dict[str, mx.array]:
    """A NextnModel's weights under the checkpoint's names: GLM-4.5's layer `num_hidden_layers`,
    with the copies of the target's embedding and head that such a layer carries, or MiMo's
    `model.mtp_layers.0` (its own module names, no copies)."""
    prefix = layer_prefix(config)
    names = FAMILIES[config["model_type"]].names
    out = {}
    if config["model_type"] != "mimo":  # DeepSeek-V3 style: the layer carries copies
        out[f"{prefix}embed_tokens.weight"] = model.model.embed_tokens.weight
        out[f"{prefix}shared_head.head.weight"] = model.lm_head.weight
    for name, value in tree_flatten(mtp.parameters()):
        own = next((n for n in names if name.startswith(f"{n}.")), None)
        key = names[own] + name[len(own) :] if own else name.removeprefix("layers.0.")
        out |= unstacked(prefix + key, value)
    return merged_kv_b(out)


def greedy_answer(model: nn.Module, prompt: list[int], length: int) -> list[int]:
    """`prompt` followed by the target's greedy answer of `length` tokens."""
    ids = list(prompt)
    cache = make_prompt_cache(model)
    logits = model(mx.array([ids]), cache=cache)
    for _ in range(length):
        ids.append(int(mx.argmax(logits[0, -1]).item()))
        logits = model(mx.array([ids[-1:]]), cache=cache)
    return ids


def train_mtp(
    model: nn.Module, mtp: MtpModel, seqs: list[list[int]], steps: int, depth: int = 1
) -> float:
    """Fit the MTP layer to the target's next-next distributions: at position i it reads
    (h_i, x_{i+1}) and should give p(. | x_0..x_{i+1}); with `depth` 2 also the chained step,
    which reads its own output at i (what `mtp(...)` returns: the state it recycles) beside
    x_{i+2} and should give p(. | x_0..x_{i+2}). Returns the last loss."""
    batch = []
    for ids in seqs:
        feats, logits = target_features(model, mx.array(ids), None, mtp.feature_layers)
        p = mx.softmax(logits)
        batch.append((feats[None, :-2], mx.array(ids)[None], p[1:-1], p[2:-1]))
    mx.eval(batch)

    def loss_fn(m: MtpModel) -> mx.array:
        total = mx.array(0.0)
        for feats, ids, p1, p2 in batch:
            out = m(feats, ids[:, 1:-1])
            logq = nn.log_softmax(m.head_logits(out)[0], axis=-1)
            total = total - (p1 * logq).sum(-1).mean()
            if depth > 1:  # the chained step, teacher-forced on the true tokens
                chained = m.head_logits(m(out[:, :-1], ids[:, 2:-1]))[0]
                total = total - (p2 * nn.log_softmax(chained, axis=-1)).sum(-1).mean()
        return total / len(batch)

    opt = optim.Adam(learning_rate=3e-3)
    step = nn.value_and_grad(mtp, loss_fn)
    loss = mx.array(0.0)
    for _ in range(steps):
        loss, grads = step(mtp)
        opt.update(mtp, grads)
        mx.eval(mtp.parameters(), opt.state, loss)
    return float(loss.item())


def spread_final_norm(model: nn.Module, spread: float, seed: int) -> None:
    """Give the target's final norm seeded per-channel weights exp(spread * N(0, 1))."""
    params = dict(tree_flatten(model.parameters()))
    name = next(k for k in params if "layers." not in k and k.endswith("model.norm.weight"))
    rng = np.random.default_rng(seed)
    w = np.exp(spread * rng.standard_normal(params[name].shape)).astype(np.float32)
    model.update(tree_unflatten([(name, mx.array(w))]))
    mx.eval(model.parameters())


def spread_head_norm(mtp: nn.Module, seed: int, spread: float = 1.0) -> None:
    """A next-n head's output norm (`shared_head.norm`) with seeded per-channel weights
    exp(spread * N(0, 1)), frozen: training leaves them as they are."""
    norm = mtp.shared_head.norm
    rng = np.random.default_rng(seed)
    w = np.exp(spread * rng.standard_normal(norm.weight.shape)).astype(np.float32)
    norm.weight = mx.array(w)
    norm.freeze()


def make_checkpoint(
    root: Path,
    prompts: list[str],
    length: int = 300,
    steps: int = 150,
    family: str = "qwen3_5",
    chat: bool = False,
    *,
    layers: int = LAYERS,
    context: int | None = None,
    feed: str | None = None,
    norm_spread: float = 0.0,
    seed: int = 0,
    recycle: str | None = None,
) -> Path:
    """Write `root/checkpoint` (original layout, MTP kept) of the tiny `family` model whose MTP
    layer learnt the target's greedy answers (`length` tokens) to `prompts`: raw text, or with
    `chat` each prompt as a user turn through the chat template (as the server and the chat
    send it), so that the head has seen the very answers those commands decode. `layers`,
    `context`: checkpoint_config's (Qwen3.5 / Qwen3-Next only). `feed`: the
    hidden state the head is trained on (None: its family's); `norm_spread` > 0: the target's
    final norm gets per-channel weights (spread_final_norm); `seed`: the target's weights (the
    head's: seed + 1). `recycle` (a next-n family's "raw" or "normed", nextn.RECYCLES): the
    head's output norm gets fixed per-channel weights (as a trained head's has; all ones make
    the two states differ by a scale that `hnorm` removes) and the head learns two steps deep,
    chaining that state."""
    from mlx_lm.utils import load_tokenizer

    tok_dir = root / "tokenizer"
    vocab = make_tokenizer(tok_dir, seed=0)
    tokenizer = load_tokenizer(tok_dir)
    config = checkpoint_config(family, vocab, layers, context)
    mx.random.seed(seed)  # the weights seed_weights leaves at mlx-lm's draws (A_log)
    model = build(config)
    seed_weights(model, seed)
    if norm_spread > 0:
        spread_final_norm(model, norm_spread, seed)
    calibrate(model, SPREAD)
    rare_eos(model)
    mtp = build_head(config)
    seed_weights(mtp, seed + 1)
    if feed is not None:
        mtp.feed, mtp.feature_layers = feed, feed_layers(feed, LAYERS)
    if recycle is not None:
        mtp.recycle = recycle
        spread_head_norm(mtp, seed + 2)
    mtp.attach(model)
    turns = [[{"role": "user", "content": p}] for p in prompts]
    encoded = (
        [list(tokenizer.apply_chat_template(t, add_generation_prompt=True)) for t in turns]
        if chat
        else [tokenizer.encode(p) for p in prompts]
    )
    answers = [greedy_answer(model, ids, length) for ids in encoded]
    train_mtp(model, mtp, answers, steps, depth=2 if recycle is not None else 1)
    path = root / "checkpoint"
    path.mkdir(parents=True)
    if not isinstance(mtp, NextnModel):
        weights = hf_target_weights(model) | hf_mtp_weights(mtp)
    elif family == "deepseek_v3":  # mlx-lm drops the next-n layer only as 61-layer V3 names it
        weights = hf_target_weights(model, offsets=False)
        mx.save_safetensors(str(path / NEXTN_SHARD), hf_nextn_weights(mtp, model, config))
    else:
        weights = hf_target_weights(model, offsets=False) | hf_nextn_weights(mtp, model, config)
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    for name in _TOKENIZER_FILES:
        shutil.copyfile(tok_dir / name, path / name)
    return path


def attention_draft(checkpoint: Path, out: Path) -> Path:
    """Write `out`: a token draft for the tiny Qwen3.5 / Qwen3-Next `checkpoint` of
    make_checkpoint, one layer of attention only (full_attention_interval 1: a KVCache, which a
    draft's attention bound turns into a window, where the target's recurrent layers hold an
    ArraysCache) with the weights of the target's last layer (an attention layer), its
    embedding, final norm and head; 4-bit, mlx-lm's layout, the checkpoint's tokenizer."""
    from mlx_lm.utils import load_model

    target, config = load_model(checkpoint)
    config = json.loads(json.dumps(config))
    text = text_config(config)
    last = int(text["num_hidden_layers"]) - 1
    text |= {"num_hidden_layers": 1, "full_attention_interval": 1, "mtp_num_hidden_layers": 0}
    draft = build(config)
    have = dict(tree_flatten(target.parameters()))
    names = [name for name, _ in tree_flatten(draft.parameters())]
    draft.update(
        tree_unflatten([(n, have[n.replace("layers.0.", f"layers.{last}.")]) for n in names])
    )
    mx.eval(draft.parameters())
    return save_quantized(draft, config, out, checkpoint)


def strip_mtp(src: Path, dst: Path) -> Path:
    """A copy of checkpoint `src` without its `mtp.*` weights (config unchanged)."""
    dst.mkdir(parents=True)
    arrays = mx.load(str(src / "model.safetensors"))
    assert isinstance(arrays, dict)
    config = json.loads((src / "config.json").read_text())
    head = layer_prefix(config) if "num_nextn_predict_layers" in config else "mtp."
    kept = {k: v for k, v in arrays.items() if not k.startswith(head)}
    mx.save_safetensors(str(dst / "model.safetensors"), kept)
    for f in src.iterdir():
        if f.suffix == ".json":
            shutil.copyfile(f, dst / f.name)
    return dst
