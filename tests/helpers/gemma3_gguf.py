"""A tiny Gemma 3 GGUF written as llama.cpp's converter writes one (norms stored as 1 + w, no q/k
permutation, k-quant blocks, a SentencePiece vocabulary with scores and types), and a slow,
obvious SentencePiece BPE encoder to check the rebuilt tokenizer against."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text

from tests.helpers.gguf import write_quant_gguf

SPACE = "\u2581"
CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>"]
USER = ["\n", "\n\n", "  "]  # as llama.cpp writes Gemma's user-defined pieces (spaces, not ▁)
NORMAL = [
    SPACE,
    *"abcdefghijklmnopqrstuvwxyz.,",
    f"{SPACE}t",
    "he",
    f"{SPACE}the",
    "in",
    f"{SPACE}a",
    "an",
    f"{SPACE}an",
    "nd",
    f"{SPACE}and",
    "er",
    "th",
    "on",
    f"{SPACE}o",
]
TINY = dict(
    hidden_size=256,
    num_hidden_layers=7,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    query_pre_attn_scalar=64,
    sliding_window=8,
    sliding_window_pattern=6,
    rms_norm_eps=1e-6,
    rope_theta=1_000_000.0,
    rope_local_base_freq=10_000.0,
    max_position_embeddings=4096,
)
# GGUF types per tensor kind, as a Q4_K_M file mixes them
TYPES = {
    "attn_q": "Q5_0",
    "attn_k": "Q5_0",
    "attn_v": "Q8_0",
    "attn_output": "Q4_K",
    "ffn_gate": "Q4_K",
    "ffn_up": "Q5_0",
    "ffn_down": "Q6_K",
    "token_embd": "Q8_0",
}
_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """(pieces, scores, types): control, user-defined, 256 byte pieces, then normal pieces whose
    score falls with their id (as Gemma's)."""
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    pieces = CONTROL + USER + bytes_ + NORMAL
    types = [3] * len(CONTROL) + [4] * len(USER) + [6] * 256 + [1] * len(NORMAL)
    scores = [-1000.0] * (len(CONTROL) + len(USER)) + [0.0] * 256
    scores += [-float(i) for i in range(len(NORMAL))]
    return pieces, scores, types


def tiny_metadata() -> dict:
    pieces, scores, types = tiny_vocab()
    a = TINY
    return {
        "general.architecture": "gemma3",
        "general.name": "tiny gemma3",
        "general.license": "test",
        "gemma3.context_length": a["max_position_embeddings"],
        "gemma3.embedding_length": a["hidden_size"],
        "gemma3.block_count": a["num_hidden_layers"],
        "gemma3.feed_forward_length": a["intermediate_size"],
        "gemma3.attention.head_count": a["num_attention_heads"],
        "gemma3.attention.head_count_kv": a["num_key_value_heads"],
        "gemma3.attention.key_length": a["head_dim"],
        "gemma3.attention.value_length": a["head_dim"],
        "gemma3.attention.layer_norm_rms_epsilon": a["rms_norm_eps"],
        "gemma3.rope.freq_base": a["rope_theta"],
        "gemma3.attention.sliding_window": a["sliding_window"],
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": pieces,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": 1,
        "tokenizer.ggml.add_space_prefix": 0,
    }


def tiny_model(seed: int = 0) -> gemma3_text.Model:
    """A random tiny gemma3_text model (norm weights random too, so an offset error shows)."""
    mx.random.seed(seed)
    vocab = len(tiny_vocab()[0])
    model = gemma3_text.Model(
        gemma3_text.ModelArgs(model_type="gemma3_text", vocab_size=vocab, **TINY)
    )
    model.sanitize({})  # no lm_head: the embedding is tied
    params = {}
    for k, v in tree_flatten(model.parameters()):
        scale = 0.3 if "norm" in k else 0.05
        params[k] = mx.random.normal(v.shape) * scale
    model.load_weights(list(params.items()))
    return model


def write_tiny_gemma3_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the tiny model as a GGUF; returns its mlx-lm weights as the GGUF decodes them
    (quantized matrices as dequantized, norms exactly)."""
    model = tiny_model(seed)
    tensors, kinds, names = {}, {}, {}
    for k, v in tree_flatten(model.parameters()):
        a = np.array(v, np.float32)
        if k == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif k == "model.norm.weight":
            g = "output_norm.weight"
        else:
            _, _, i, *rest = k.split(".")
            module = ".".join(rest[:-1])
            g = f"blk.{i}.{_NAMES[module]}.weight"
        if g.endswith("norm.weight"):
            a = a + 1.0  # llama.cpp stores Gemma's 1 + w
        tensors[g], names[g] = a, k
        kind = g.split(".")[-2] if g.startswith("blk") else g.split(".")[0]
        if kind in TYPES:
            kinds[g] = TYPES[kind]
    decoded = write_quant_gguf(path, tensors, tiny_metadata(), kinds)
    return {names[g]: (d - 1.0 if g.endswith("norm.weight") else d) for g, d in decoded.items()}


def reference_spm_encode(
    text: str, pieces: list[str], scores: list[float], types: list[int]
) -> list[int]:
    """Slow, obvious SentencePiece BPE as llama.cpp runs it: control and user-defined pieces are
    cut out of the raw text first (longest at each position), spaces become ▁, then the adjacent
    pair whose join is a normal piece with the highest score merges (leftmost on ties) until
    none does; what is left outside the vocabulary becomes UTF-8 byte pieces."""
    vocab = {p: i for i, p in reversed(list(enumerate(pieces)))}
    whole = sorted(
        (p for p, t in zip(pieces, types, strict=False) if t in (3, 4)), key=len, reverse=True
    )
    ids: list[int] = []
    i, start = 0, 0
    while i <= len(text):
        hit = next((p for p in whole if text.startswith(p, i)), None) if i < len(text) else None
        if hit is not None or i == len(text):
            ids += _bpe(text[start:i].replace(" ", SPACE), vocab, scores, types, pieces)
            if hit is None:
                break
            ids.append(vocab[hit])
            i = start = i + len(hit)
        else:
            i += 1
    return ids


def _bpe(
    text: str, vocab: dict, scores: list[float], types: list[int], pieces: list[str]
) -> list[int]:
    syms = list(text)
    while True:
        best = None
        for j in range(len(syms) - 1):
            joined = syms[j] + syms[j + 1]
            k = vocab.get(joined)
            if k is not None and types[k] == 1 and (best is None or scores[k] > best[0]):
                best = (scores[k], j)
        if best is None:
            break
        j = best[1]
        syms[j : j + 2] = [syms[j] + syms[j + 1]]
    out = []
    for s in syms:
        if s in vocab and types[vocab[s]] == 1:
            out.append(vocab[s])
        else:
            out += [vocab[f"<0x{b:02X}>"] for b in s.encode("utf-8")]
    return out
