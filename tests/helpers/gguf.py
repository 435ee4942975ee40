"""A tiny synthetic GGUF written here (llama.cpp's layout, permutation and quantized types) and
a slow, obvious reference BPE, for the GGUF conversion, loading and pull tests."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import mlx.core as mx
import numpy as np
import regex
from mlx.utils import tree_flatten
from mlx_lm.models import llama

# ---------------------------------------------------------------- tiny synthetic GGUF helpers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġa n", "Ġan d", "o r", "Ġ w", "Ġw or"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TINY = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4)
TINY_KV = 2


def byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100.."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


def tiny_tokens() -> list[str]:
    return SPECIALS + byte_chars() + [m.replace(" ", "") for m in MERGES]


def tiny_args(tied: bool = True) -> llama.ModelArgs:
    return llama.ModelArgs(
        model_type="llama",
        **TINY,
        num_key_value_heads=TINY_KV,
        rms_norm_eps=1e-5,
        vocab_size=len(tiny_tokens()),
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        max_position_embeddings=512,
    )


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's `permute`, verbatim in numpy (the reference)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def to_gguf_tensors(model: llama.Model, dtype: mx.Dtype) -> dict[str, mx.array]:
    """What llama.cpp's converter would write for this mlx-lm model (names, q/k permuted)."""
    out = {}
    for name, w in tree_flatten(model.parameters()):
        if name.startswith("model.layers."):
            _, _, i, *rest = name.split(".")
            mod, leaf = ".".join(rest[:-1]), rest[-1]
            g = HF_TO_GGUF[mod]
            a = np.array(w)
            if g in ("attn_q", "attn_k"):
                a = llamacpp_permute(a, TINY["num_attention_heads"] if g == "attn_q" else TINY_KV)
            out[f"blk.{i}.{g}.{leaf}"] = mx.array(a)
        else:
            top = {
                "model.embed_tokens": "token_embd",
                "model.norm": "output_norm",
                "lm_head": "output",
            }
            out[top[name.rsplit(".", 1)[0]] + ".weight"] = w
    return {k: (v if v.ndim == 1 else v.astype(dtype)) for k, v in out.items()}


def tiny_metadata(arch: str = "llama") -> dict:
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    f32 = lambda v: mx.array(v, dtype=mx.float32)  # noqa: E731
    tokens = tiny_tokens()
    return {
        "general.architecture": arch,
        "general.name": "tiny",
        "llama.embedding_length": u32(TINY["hidden_size"]),
        "llama.feed_forward_length": u32(TINY["intermediate_size"]),
        "llama.block_count": u32(TINY["num_hidden_layers"]),
        "llama.attention.head_count": u32(TINY["num_attention_heads"]),
        "llama.attention.head_count_kv": u32(TINY_KV),
        "llama.attention.layer_norm_rms_epsilon": f32(1e-5),
        "llama.rope.freq_base": f32(10000.0),
        "llama.context_length": u32(512),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.token_type": mx.array([3] * 3 + [1] * (len(tokens) - 3), dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(1),
        "tokenizer.ggml.eos_token_id": u32(2),
        "tokenizer.ggml.padding_token_id": u32(2),
        "tokenizer.chat_template": TEMPLATE,
    }


def write_tiny_gguf(path: Path, *, tied: bool = True, dtype: mx.Dtype = mx.float32, seed: int = 0):
    """Write a tiny random llama as GGUF at `path`; return the mlx-lm model it came from."""
    mx.random.seed(seed)
    model = llama.Model(tiny_args(tied))
    mx.eval(model.parameters())
    mx.save_gguf(str(path), to_gguf_tensors(model, dtype), tiny_metadata())
    return model


# ---------------------------------------------------------------- a minimal GGUF v3 writer with
# llama.cpp's Q8_0 / Q4_0 / Q4_1 block layouts (mx.save_gguf writes only dense tensors)


def _gg_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _gg_kv(key: str, v) -> bytes:
    out = _gg_str(key)
    if isinstance(v, str):
        return out + struct.pack("<I", 8) + _gg_str(v)
    if isinstance(v, float):
        return out + struct.pack("<If", 6, v)
    if isinstance(v, int):
        return out + struct.pack("<II", 4, v)
    if all(isinstance(x, str) for x in v):
        return out + struct.pack("<IIQ", 9, 8, len(v)) + b"".join(_gg_str(x) for x in v)
    if any(isinstance(x, float) for x in v):  # e.g. SentencePiece scores
        return out + struct.pack("<IIQ", 9, 6, len(v)) + np.asarray(v, "<f4").tobytes()
    return out + struct.pack("<IIQ", 9, 5, len(v)) + np.asarray(v, "<i4").tobytes()


def _q8_0(b: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """Blocks of 32: fp16 d, 32 x int8 q; x = q * d."""
    d = (np.abs(b).max(1) / 127).astype("<f2")
    d[d == 0] = 1
    q = np.round(b / d.astype(np.float32)[:, None]).astype(np.int8)
    return [x.tobytes() + y.tobytes() for x, y in zip(d, q, strict=True)], q * d.astype(np.float32)[
        :, None
    ]


def _nibbles(q: np.ndarray) -> np.ndarray:
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)  # element j low nibble, j+16 high


def _q4_0(b: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """Blocks of 32: fp16 d, 16 bytes of nibbles; x = (q - 8) * d."""
    d = (b[np.arange(len(b)), np.abs(b).argmax(1)] / -8).astype("<f2")
    d[d == 0] = 1
    df = d.astype(np.float32)[:, None]
    q = np.clip(np.round(b / df + 8), 0, 15).astype(np.uint8)
    return [x.tobytes() + y.tobytes() for x, y in zip(d, _nibbles(q), strict=True)], (q - 8.0) * df


def _q4_1(b: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """Blocks of 32: fp16 d, fp16 m, 16 bytes of nibbles; x = q * d + m."""
    m = b.min(1).astype("<f2")
    d = ((b.max(1) - b.min(1)) / 15).astype("<f2")
    d[d == 0] = 1
    df, mf = d.astype(np.float32)[:, None], m.astype(np.float32)[:, None]
    q = np.clip(np.round((b - mf) / df), 0, 15).astype(np.uint8)
    blocks = [
        x.tobytes() + y.tobytes() + z.tobytes() for x, y, z in zip(d, m, _nibbles(q), strict=True)
    ]
    return blocks, q * df + mf


def _f16(x: float) -> np.float16:
    return np.float16(x if x != 0 else 1.0)


def _q5_0(b: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """Blocks of 32: fp16 d, u32 of fifth bits, 16 bytes of nibbles; x = (q - 16) * d."""
    blocks, out = [], []
    for x in b:
        d = _f16(x[np.abs(x).argmax()] / -16)
        q = np.clip(np.round(x / np.float32(d) + 16), 0, 31).astype(np.uint32)
        qh = sum(int(q[j] >> 4) << j for j in range(32))
        low = [(int(q[j]) & 15) | ((int(q[j + 16]) & 15) << 4) for j in range(16)]
        blocks.append(d.tobytes() + struct.pack("<I", qh) + bytes(low))
        out.append((q.astype(np.float32) - 16) * np.float32(d))
    return blocks, np.array(out)


def _q4_k(b: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """Super-blocks of 256: fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs for 8
    sub-blocks of 32, 128 bytes of nibbles; x = d * sc * q - dmin * mn."""
    blocks, out = [], []
    for x in b:
        sub = x.reshape(8, 32)
        lo = np.minimum(sub.min(1), 0)
        step, mins = (sub.max(1) - lo) / 15, -lo
        d, dmin = _f16(step.max() / 63), _f16(mins.max() / 63)
        sc = np.clip(np.round(step / np.float32(d)), 1, 63).astype(int)
        mn = np.clip(np.round(mins / np.float32(dmin)), 0, 63).astype(int)
        eff = np.float32(d) * sc[:, None]
        q = np.clip(np.round((sub + np.float32(dmin) * mn[:, None]) / eff), 0, 15).astype(int)
        packed = [0] * 12
        for j in range(4):
            packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
            packed[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6)
            packed[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
        qs = [q[2 * r][i] | (q[2 * r + 1][i] << 4) for r in range(4) for i in range(32)]
        blocks.append(d.tobytes() + dmin.tobytes() + bytes(packed) + bytes(qs))
        out.append((eff * q - np.float32(dmin) * mn[:, None]).reshape(256))
    return blocks, np.array(out, np.float32)


def _q6_k(b: np.ndarray) -> tuple[list[bytes], np.ndarray]:
    """Super-blocks of 256: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales
    (sub-blocks of 16), fp16 d; x = d * sc * (q - 32)."""
    blocks, out = [], []
    for x in b:
        sub = x.reshape(16, 16)
        step = np.abs(sub).max(1) / 31
        d = _f16(step.max() / 127)
        sc = np.clip(np.round(step / np.float32(d)), 1, 127).astype(int)
        eff = np.float32(d) * sc[:, None]
        q = (np.clip(np.round(sub / eff), -32, 31) + 32).astype(int).reshape(256)
        ql, qh = [0] * 128, [0] * 64
        for h in range(2):
            v = q[128 * h : 128 * h + 128].reshape(4, 32)  # v[g, l] is value 32 g + l of the half
            for i in range(32):
                ql[64 * h + i] = (v[0, i] & 15) | ((v[2, i] & 15) << 4)
                ql[64 * h + 32 + i] = (v[1, i] & 15) | ((v[3, i] & 15) << 4)
                qh[32 * h + i] = sum((v[g, i] >> 4) << (2 * g) for g in range(4))
        scales = np.array(sc, np.int8).tobytes()
        blocks.append(bytes(ql) + bytes(qh) + scales + d.tobytes())
        out.append((eff * (q.reshape(16, 16) - 32)).reshape(256))
    return blocks, np.array(out, np.float32)


# name -> (ggml type id, values per block, encoder)
GGML_TYPES = {
    "Q8_0": (8, 32, _q8_0),
    "Q4_0": (2, 32, _q4_0),
    "Q4_1": (3, 32, _q4_1),
    "Q5_0": (6, 32, _q5_0),
    "Q4_K": (12, 256, _q4_k),
    "Q6_K": (14, 256, _q6_k),
}


def write_quant_gguf(
    path: Path, tensors: dict[str, np.ndarray], meta: dict, qtype: str | dict[str, str]
) -> dict:
    """Write GGUF v3: 2-D tensors as `qtype` (one type, or a type per tensor name; a name not in
    the dict stays F32), the rest F32. Returns what each tensor decodes to."""
    infos, blobs, decoded, offset = [], [], {}, 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, np.float32)
        kind_name = qtype.get(name) if isinstance(qtype, dict) else qtype
        if a.ndim == 2 and kind_name is not None:
            kind, per_block, quant = GGML_TYPES[kind_name]
            blocks, deq = quant(a.reshape(-1, per_block))
            raw, decoded[name] = b"".join(blocks), deq.reshape(a.shape)
        else:
            kind, raw, decoded[name] = 0, a.astype("<f4").tobytes(), a
        dims = a.shape[::-1]  # GGUF lists the innermost (column) dimension first
        info = _gg_str(name) + struct.pack("<I", len(dims))
        infos.append(
            info + b"".join(struct.pack("<Q", n) for n in dims) + struct.pack("<IQ", kind, offset)
        )
        raw += b"\0" * (-len(raw) % 32)
        blobs.append(raw)
        offset += len(raw)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    head += b"".join(_gg_kv(k, v) for k, v in meta.items()) + b"".join(infos)
    path.write_bytes(head + b"\0" * (-len(head) % 32) + b"".join(blobs))
    return decoded


# ---------------------------------------------------------------- reference BPE (minbpe style)


def reference_encode(text: str, tokens: list[str], merges: list[str]) -> list[int]:
    """Slow, obvious byte-level BPE: split digits singly, GPT-2 regex, merge lowest rank first."""
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    rank = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
    enc = byte_chars()
    gpt2 = regex.compile(
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    )
    ids: list[int] = []
    for chunk in regex.split(r"(\p{N})", text):
        for piece in gpt2.findall(chunk):
            sym = [enc[b] for b in piece.encode("utf-8")]
            while len(sym) > 1:
                r, i = min(
                    (rank.get(p, math.inf), i)
                    for i, p in enumerate(zip(sym, sym[1:], strict=False))
                )
                if r == math.inf:
                    break
                sym[i : i + 2] = [sym[i] + sym[i + 1]]
            ids += [vocab[s] for s in sym]
    return ids
