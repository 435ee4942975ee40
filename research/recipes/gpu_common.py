"""What the GPU recipes share (gpu_distill.py, gpu_finetune.py): the target read from its GGUF
into a PyTorch LlamaForCausalLM, its batched answers, EdgeSpec's data shards, and two training
helpers (padded batches, the learning-rate schedule).

Like the recipes it runs where MLX is not installed (a lent GPU machine with PyTorch), and is
imported by its bare name from the scripts beside it.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import torch

# The same table as edgespec/loading/gguf.py's _LAYER_NAMES, written again on purpose: this script runs
# where MLX is not installed, and edgespec.loading.gguf imports MLX.
GGUF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
EOS = 2


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- target


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's RoPE row permutation: rows (head, 2, half) were stored as (head, half, 2)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf_state(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """GGUF -> (hyper-parameters, HF llama state dict as float32 numpy)."""
    import gguf

    reader = gguf.GGUFReader(path)

    def field(name):
        return reader.fields[name].contents()

    hp = {
        "layers": int(field("llama.block_count")),
        "hidden": int(field("llama.embedding_length")),
        "ffn": int(field("llama.feed_forward_length")),
        "heads": int(field("llama.attention.head_count")),
        "kv_heads": int(field("llama.attention.head_count_kv")),
        "rope_theta": float(field("llama.rope.freq_base")),
        "eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "vocab": int(field("llama.vocab_size")),
        "context": int(field("llama.context_length")),
    }
    state: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape(tuple(int(s) for s in reversed(t.shape)))
        if t.name == "token_embd.weight":
            state["model.embed_tokens.weight"] = w
        elif t.name == "output_norm.weight":
            state["model.norm.weight"] = w
        else:
            _, i, kind, _ = t.name.split(".")
            if kind == "attn_q":
                w = unpermute(w, hp["heads"])
            elif kind == "attn_k":
                w = unpermute(w, hp["kv_heads"])
            state[f"model.layers.{i}.{GGUF_NAMES[kind]}.weight"] = w
    return hp, state


def hf_config(hp: dict, layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=hp["vocab"],
        hidden_size=hp["hidden"],
        intermediate_size=hp["ffn"],
        num_hidden_layers=layers,
        num_attention_heads=hp["heads"],
        num_key_value_heads=hp["kv_heads"],
        rms_norm_eps=hp["eps"],
        rope_theta=hp["rope_theta"],
        max_position_embeddings=hp["context"],
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=EOS,
    )


def build_target(hp: dict, state: dict[str, np.ndarray], device: str):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(hf_config(hp, hp["layers"]))
    sd = {k: torch.from_numpy(v) for k, v in state.items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [m for m in missing if "rotary" not in m]
    assert not missing and not unexpected, (missing, unexpected)
    return model.to(device).eval()


# ----------------------------------------------------------------------------- answers and data shards


def write_shard(
    path: Path, seqs: list[np.ndarray], plens: list[int], ids: list[int], kinds=None, compress=False
) -> None:
    """EdgeSpec's data shard (edgespec/distill/shards.py), plus `kinds` codes when given; written
    atomically, compressed for files that travel back or are committed."""
    starts = np.zeros(len(seqs) + 1, np.int64)
    starts[1:] = np.cumsum([len(s) for s in seqs])
    arrays = {
        "tokens": np.concatenate(seqs).astype(np.uint16),
        "starts": starts,
        "prompt_lens": np.array(plens, np.int32),
        "instr_ids": np.array(ids, np.int32),
    }
    if kinds is not None:
        arrays["kinds"] = np.array(kinds, np.uint8)
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    (np.savez_compressed if compress else np.savez)(tmp, **arrays)
    os.replace(tmp, path)


def read_shards(files: list[Path]) -> tuple[list[np.ndarray], list[int], list[int]]:
    seqs, plens, ids = [], [], []
    for f in files:
        d = dict(np.load(f))
        for j in range(len(d["prompt_lens"])):
            seqs.append(d["tokens"][d["starts"][j] : d["starts"][j + 1]].astype(np.int64))
        plens += d["prompt_lens"].tolist()
        ids += d["instr_ids"].tolist()
    return seqs, plens, ids


@torch.no_grad()
def answer(model, prompts: list[np.ndarray], greedy: bool, args) -> list[np.ndarray]:
    """The target's answers to a batch of prompts (left-padded; each cut after its first EOS)."""
    width = max(len(p) for p in prompts)
    inp = torch.full((len(prompts), width), EOS, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        inp[r, width - len(p) :] = torch.from_numpy(p)
        mask[r, width - len(p) :] = 1
    kw = {"do_sample": False} if greedy else {"do_sample": True, "temperature": args.gen_temp}
    kw["top_p"] = None if greedy else args.gen_top_p
    out = model.generate(
        input_ids=inp.to(args.device),
        attention_mask=mask.to(args.device),
        max_new_tokens=args.max_new,
        top_k=None,
        pad_token_id=EOS,
        eos_token_id=EOS,
        **kw,
    )
    answers = []
    for row in out[:, width:].cpu().numpy():
        end = np.nonzero(row == EOS)[0]
        answers.append(row[: end[0] + 1] if len(end) else row)
    return answers


# ----------------------------------------------------------------------------- training


def pad_batch(seqs, plens, chunk: list[int], max_len: int):
    """Sequences `chunk`, right-padded to the longest (at most max_len): (x, m), m marking the
    positions whose next token is a completion token. Causal attention: padding never reaches a
    real position, so no mask is needed."""
    width = min(max_len, max(len(seqs[i]) for i in chunk))
    x = np.full((len(chunk), width), EOS, np.int64)
    m = np.zeros((len(chunk), width), np.float32)
    for r, i in enumerate(chunk):
        seq = seqs[i][:width]
        x[r, : len(seq)] = seq
        m[r, max(0, plens[i] - 1) : len(seq) - 1] = 1.0
    return torch.from_numpy(x), torch.from_numpy(m)


def cosine_lr(lr: float, step: int, warmup: int, frac: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine from lr to lr / 10 as `frac` of the
    budget (time) goes 0 -> 1."""
    return lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
