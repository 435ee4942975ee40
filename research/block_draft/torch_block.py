"""The block draft's arithmetic in PyTorch, for gpu_train.py (the lent GPU has PyTorch, no MLX).

Two pure forwards over plain dicts of tensors, each the twin of an MLX one:

- `layer_outputs`: the target (a llama: weights in Hugging Face / mlx-lm names, "model.layers.3.
  self_attn.q_proj.weight") run causally over right-padded token ids, returning the outputs of the
  chosen layers concatenated, as features.py's `layer_outputs` does with mlx-lm's llama;
- `block_hidden`: the draft (weights in edgespec.architectures.block_model's names,
  "layers.0.mlp.up_proj.weight", "fc.weight") over the blocks of several sequences at once, as
  train.py's `block_forward` does for one sequence: block r of sequence s sits at positions
  a .. a + B - 1 (a = its anchor), sees the context positions before a and its own block, nothing
  else.

RoPE is MLX's non-traditional one (the two halves of each head rotated), RMSNorm MLX's
(x * rsqrt(mean(x^2) + eps) * weight). Example: anchors [[5, 9]] with B = 4 give the 8 block
queries positions 5..8 and 9..12; the first four see context keys 0..4, the last four keys 0..8.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """x [b, heads, L, hd] rotated at positions pos ([L] or [b, L])."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) / half)
    ang = pos.to(torch.float32)[..., None] * freqs  # [L, half] or [b, L, half]
    if ang.dim() == 3:
        ang = ang[:, None]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """[b, L, n * hd] -> [b, n, L, hd]."""
    b, L, _ = x.shape
    return x.reshape(b, L, n, -1).transpose(1, 2)


def mlp(x: torch.Tensor, w: dict[str, torch.Tensor], p: str) -> torch.Tensor:
    gate = x @ w[p + "mlp.gate_proj.weight"].T
    return (F.silu(gate) * (x @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T


def attend(q, k, v, mask=None, causal=False) -> torch.Tensor:
    """Scaled dot-product attention with grouped K/V heads (query head h reads K/V head
    h // (heads / kv_heads), as MLX's fast attention does) -> [b, L, heads * hd]."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


@torch.no_grad()
def layer_outputs(
    w: dict[str, torch.Tensor], hp: dict, tokens: torch.Tensor, layers
) -> torch.Tensor:
    """Outputs of target `layers` for right-padded token ids [b, L] -> [b, L, len(layers) * d]
    (causal attention: padding never changes earlier positions)."""
    h = w["model.embed_tokens.weight"][tokens]
    pos = torch.arange(tokens.shape[1], device=tokens.device)
    eps, theta, taken = hp["eps"], hp["rope_theta"], {}
    for i in range(max(layers) + 1):
        p = f"model.layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = rope(heads(x @ w[p + "self_attn.q_proj.weight"].T, hp["heads"]), pos, theta)
        k = rope(heads(x @ w[p + "self_attn.k_proj.weight"].T, hp["kv_heads"]), pos, theta)
        v = heads(x @ w[p + "self_attn.v_proj.weight"].T, hp["kv_heads"])
        h = h + attend(q, k, v, causal=True) @ w[p + "self_attn.o_proj.weight"].T
        h = h + mlp(rms_norm(h, w[p + "post_attention_layernorm.weight"], eps), w, p)
        if i in layers:
            taken[i] = h
    return torch.cat([taken[i] for i in layers], dim=-1)


def block_mask(anchors: torch.Tensor, S: int, B: int) -> torch.Tensor:
    """[b, 1, n * B, S + n * B] booleans (True: may attend): block r's queries see the context
    positions before its anchor and the B keys of block r."""
    b, n = anchors.shape
    seen = torch.arange(S, device=anchors.device)[None, None, :] < anchors[:, :, None]
    seen = seen[:, :, None, :].expand(b, n, B, S).reshape(b, n * B, S)
    blk = torch.arange(n * B, device=anchors.device) // B
    own = (blk[:, None] == blk[None, :]).expand(b, n * B, n * B)
    return torch.cat([seen, own], dim=-1)[:, None]


def block_hidden(w, cfg: dict, embed, raw, anchors, toks) -> torch.Tensor:
    """The draft's normed hidden states [b, n, B, d] for n blocks in each of b sequences:
    raw [b, S, n_layers * d] (the target's layer outputs; positions past an anchor are never
    read by its block), anchors [b, n], toks [b, n, B] ([token a, mask, ...])."""
    b, n, B = toks.shape
    S = raw.shape[1]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    ctx = rms_norm(raw @ w["fc.weight"].T, w["hidden_norm.weight"], eps)
    h = embed[toks].reshape(b, n * B, -1)
    pos = (anchors[:, :, None] + torch.arange(B, device=toks.device)).reshape(b, n * B)
    cpos = torch.arange(S, device=toks.device)
    mask = block_mask(anchors, S, B)
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = rope(heads(x @ w[p + "self_attn.q_proj.weight"].T, nh), pos, theta)
        k = rope(heads(x @ w[p + "self_attn.k_proj.weight"].T, nkv), pos, theta)
        v = heads(x @ w[p + "self_attn.v_proj.weight"].T, nkv)
        ck = rope(heads(ctx @ w[p + "self_attn.k_proj.weight"].T, nkv), cpos, theta)
        cv = heads(ctx @ w[p + "self_attn.v_proj.weight"].T, nkv)
        out = attend(q, torch.cat([ck, k], 2), torch.cat([cv, v], 2), mask=mask)
        h = h + out @ w[p + "self_attn.o_proj.weight"].T
        h = h + mlp(rms_norm(h, w[p + "post_attention_layernorm.weight"], eps), w, p)
    return rms_norm(h, w["norm.weight"], eps).reshape(b, n, B, -1)


def draft_names(n_layers: int) -> list[str]:
    """Every parameter of a block draft with `n_layers` layers (qk_norm off, no biases), in
    edgespec.architectures.block_model's names."""
    per = [f"self_attn.{x}_proj.weight" for x in "qkvo"]
    per += [f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    per += ["input_layernorm.weight", "post_attention_layernorm.weight"]
    names = ["fc.weight", "hidden_norm.weight", "norm.weight"]
    return names + [f"layers.{i}.{x}" for i in range(n_layers) for x in per]


def init_draft(target: dict, cfg: dict, init_layers: list[int], seed: int) -> dict:
    """train.py's init_from_target: draft layer j = target layer init_layers[j]; fc passes the
    last target layer's output through (identity block) plus N(0, 1e-3) on the others; norms 1."""
    d, n = cfg["hidden_size"], len(cfg["target_layer_ids"])
    gen = torch.Generator().manual_seed(seed)
    fc = torch.randn(d, n * d, generator=gen) * 1e-3
    fc[:, (n - 1) * d :] = torch.eye(d)
    w = {"fc.weight": fc, "hidden_norm.weight": torch.ones(d), "norm.weight": torch.ones(d)}
    for name in draft_names(len(init_layers)):
        if name.startswith("layers."):
            _, j, rest = name.split(".", 2)
            w[name] = target[f"model.layers.{init_layers[int(j)]}.{rest}"].detach().cpu().clone()
    return {k: v.float() for k, v in w.items()}
