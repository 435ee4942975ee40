"""Gemma 3 GGUF files (llama.cpp's `gemma3` architecture, k-quant blocks, SentencePiece vocabulary)
converted to mlx-lm gemma3_text folders: the blocks decode as their layout says, a tiny model
converts to the same logits, and the rebuilt tokenizer encodes as SentencePiece BPE does."""

from __future__ import annotations

import json
import struct

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.utils import load as mlx_load

from edgespec.errors import ModelLoadError
from edgespec.loading import gguf
from edgespec.loading.gguf_file import GGUFFile
from edgespec.loading.gguf_gemma3 import pack_codes, quantization_entry
from edgespec.loading.gguf_spm import build_spm_tokenizer, spm_merges
from tests.helpers.gemma3_gguf import (
    TINY,
    reference_spm_encode,
    tiny_metadata,
    tiny_model,
    tiny_vocab,
    write_tiny_gemma3_gguf,
)
from tests.helpers.gguf import GGML_TYPES, write_quant_gguf


@pytest.mark.parametrize("qtype", sorted(GGML_TYPES))
def test_every_block_type_decodes_as_its_layout_says(tmp_path, qtype):
    """tests/helpers/gguf.py encodes blocks with plain loops over the layout; the reader's
    vectorised decoders must give back exactly what was encoded."""
    a = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    want = write_quant_gguf(tmp_path / "q.gguf", {"w": a}, {"general.architecture": "x"}, qtype)
    f = GGUFFile(tmp_path / "q.gguf")
    assert f.type_name("w") == qtype
    np.testing.assert_array_equal(f.dequantize("w"), want["w"])
    assert np.abs(want["w"] - a).max() < 0.1 * np.abs(a).max()  # and the encoding is a fair one


def test_a_q4_k_block_by_hand():
    """One Q4_K super-block: d = 1, dmin = 0.5; sub-block 0 has scale 2 and min 1; sub-block 5
    has scale 33 and min 17, whose top two bits live in the spare bits of bytes 1 and 5."""
    sc, mn = [2, 1, 1, 1, 1, 33, 1, 1], [1, 0, 0, 0, 0, 17, 0, 0]
    packed = [0] * 12
    for j in range(4):
        packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        packed[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6)
        packed[j + 8] = (sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4)
    assert packed[1] == 1 | (2 << 6) and packed[9] == 1 | (1 << 4)  # 33 = 0b10_0001, 17 = 0b01_0001
    q = [i % 16 for i in range(32)]
    runs = bytes(q[i] | (q[i] << 4) for i in range(32)) * 4  # every sub-block holds 0..15, 0..15
    block = struct.pack("<ee", 1.0, 0.5) + bytes(packed) + runs
    from edgespec.loading.gguf_file import TYPES

    x = TYPES[12][3](np.frombuffer(block, np.uint8)[None, :]).reshape(8, 32)
    assert x[0, :3].tolist() == [-0.5, 1.5, 3.5]  # 1 * 2 * q - 0.5 * 1
    assert x[5, :3].tolist() == [-8.5, 24.5, 57.5]  # 1 * 33 * q - 0.5 * 17
    assert x[1, 15] == 15.0


def test_tiny_gemma3_converts_to_the_same_logits(tmp_path):
    weights = write_tiny_gemma3_gguf(tmp_path / "tiny.gguf")
    ref = tiny_model()
    ref.load_weights([(k, mx.array(v)) for k, v in weights.items()])
    out = gguf.convert_gguf(tmp_path / "tiny.gguf", tmp_path / "conv", dtype="float32")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["tie_word_embeddings"] is True
    for key in ("sliding_window", "head_dim", "query_pre_attn_scalar", "num_key_value_heads"):
        assert config[key] == TINY[key], key
    assert (config["sliding_window_pattern"], config["rope_local_base_freq"]) == (6, 10000.0)
    model, _ = mlx_load(str(out))
    x = mx.array([list(range(5, 40))])  # 35 positions: past the 8-token window
    np.testing.assert_allclose(np.array(model(x)), np.array(ref(x)), atol=2e-4, rtol=1e-4)


def test_kept_quantized_with_the_gguf_codes_computes_the_same_logits(tmp_path):
    """dtype "keep": affine blocks repacked as MLX groups of 32 with their own codes, scales and
    biases, so the converted model computes with exactly the GGUF's weights."""
    weights = write_tiny_gemma3_gguf(tmp_path / "tiny.gguf")
    ref = tiny_model()
    ref.load_weights([(k, mx.array(v)) for k, v in weights.items()])
    out = gguf.convert_gguf(tmp_path / "tiny.gguf", tmp_path / "conv")  # dtype "keep"
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert (q["group_size"], q["bits"]) == (32, 8)  # Q5_0 and Q8_0 codes go to 8 bits
    assert q["model.layers.3.self_attn.o_proj"] == {"group_size": 32, "bits": 4}  # Q4_K
    assert "model.layers.0.mlp.down_proj" not in q  # Q6_K: dense float32
    model, _ = mlx_load(str(out))
    assert type(model.model.layers[0].self_attn.o_proj).__name__ == "QuantizedLinear"
    x = mx.array([list(range(5, 40))])
    np.testing.assert_allclose(np.array(model(x)), np.array(ref(x)), atol=2e-4, rtol=1e-4)


def test_pack_codes_is_the_layout_mx_quantize_writes():
    w = mx.array(np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32))
    for bits in (4, 8):
        packed, scales, biases = mx.quantize(w, group_size=32, bits=bits)
        back = mx.dequantize(packed, scales, biases, group_size=32, bits=bits)
        codes = np.round(
            (np.array(back) - np.repeat(np.array(biases), 32, 1))
            / np.repeat(np.array(scales), 32, 1)
        ).astype(np.uint8)
        assert (pack_codes(codes, bits) == np.array(packed)).all()


def test_quantization_entry_lists_the_odd_widths():
    assert quantization_entry({}) == {}
    assert quantization_entry({"a": 8, "b": 8, "c": 4}) == {
        "group_size": 32,
        "bits": 8,
        "c": {"group_size": 32, "bits": 4},
    }


TEXTS = [
    "the and an other",
    "  two spaces and the end  ",
    "tab\there, new\nline\n\npara",
    "naïve café 東京 🙂",
    "theandthe.the,the",
    "",
    " ",
    "unknown: ÿ and Ω",
]


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_tokenizer_matches_the_reference_encoder(text):
    pieces, scores, types = tiny_vocab()
    tok = build_spm_tokenizer(tiny_metadata())
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids == reference_spm_encode(text, pieces, scores, types)
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_sentencepiece_tokenizer_adds_bos_and_keeps_pieces_whole():
    tok = build_spm_tokenizer(tiny_metadata())
    pieces = tiny_vocab()[0]
    ids = tok.encode("the  end").ids
    assert ids[0] == 2  # <bos>
    assert [pieces[i] for i in ids[1:]] == ["t", "he", "  ", "e", "nd"]  # "he" outranks "th"
    assert [pieces[i] for i in tok.encode(" the\n\nand").ids[1:]] == [
        "\u2581the",
        "\n\n",
        "an",
        "d",
    ]


def test_merges_rank_joined_pieces_by_score():
    assert spm_merges(["a", "b", "c", "ab", "abc", "bc"], [0, 0, 0, -1, -3, -2], [1] * 6) == [
        ("a", "b"),
        ("b", "c"),
        ("a", "bc"),
        ("ab", "c"),
    ]


def test_a_gemma3_gguf_with_a_foreign_tokenizer_is_one_line(tmp_path):
    meta = tiny_metadata() | {"tokenizer.ggml.model": "gpt2"}
    write_quant_gguf(tmp_path / "t.gguf", {"token_embd.weight": np.zeros((4, 32))}, meta, {})
    with pytest.raises(ModelLoadError, match="SentencePiece") as err:
        gguf.convert_gguf(tmp_path / "t.gguf", tmp_path / "out")
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_an_unknown_block_type_is_one_line(tmp_path):
    write_quant_gguf(
        tmp_path / "q.gguf", {"w": np.zeros((2, 32))}, {"general.architecture": "x"}, "Q8_0"
    )
    raw = bytearray((tmp_path / "q.gguf").read_bytes())
    f = GGUFFile(tmp_path / "q.gguf")
    at = raw.find(b"w", 24) + 1 + 4 + 16  # name, n_dims, two dims: the type field
    raw[at : at + 4] = struct.pack("<I", 99)
    (tmp_path / "q.gguf").write_bytes(bytes(raw))
    with pytest.raises(ModelLoadError, match="ggml type 99"):
        GGUFFile(tmp_path / "q.gguf").dequantize("w")
    assert f.type_name("w") == "Q8_0"
