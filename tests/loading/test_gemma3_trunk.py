"""A token draft built from a Gemma 3 target keeps each copied layer's kind (sliding window or
global, and its RoPE base), so with every layer copied it is the target."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from edgespec.architectures.token_draft import load_draft, save_draft
from edgespec.distill.init_draft import build_draft
from tests.helpers.gemma3_gguf import TINY, tiny_model


def _config() -> dict:
    return {"model_type": "gemma3_text", "vocab_size": 306, **TINY}


def test_a_draft_of_every_layer_is_the_target():
    target = tiny_model()
    vocab = target.model.embed_tokens.weight.shape[0]
    draft, config = build_draft(
        target, _config() | {"vocab_size": vocab}, list(range(7)), np.arange(vocab), "tiny"
    )
    assert config["trunk"] == "gemma3_text"
    x = mx.array([list(range(3, 40))])  # 37 positions: past the 8-token window
    np.testing.assert_allclose(np.array(draft(x)), np.array(target(x)), atol=1e-5, rtol=1e-5)


def test_copied_layers_keep_their_kind_and_survive_a_save(tmp_path):
    target = tiny_model()
    vocab = target.model.embed_tokens.weight.shape[0]
    head = np.arange(0, vocab, 3)
    draft, config = build_draft(target, _config() | {"vocab_size": vocab}, [0, 1, 5], head, "t")
    # layer 5 of 7 is the global one ((5 + 1) % 6 == 0); the others slide, with RoPE base 10000
    assert [layer.self_attn.is_sliding for layer in draft.layers] == [True, True, False]
    assert [layer.self_attn.rope.base for layer in draft.layers] == [10_000.0, 10_000.0, 1e6]
    config = config | {"edgespec": config["edgespec"] | {"shared_embedding": True}}
    save_draft(draft, config, tmp_path / "d")
    back, _ = load_draft(tmp_path / "d", target.model.embed_tokens)
    x = mx.array([list(range(3, 30))])
    np.testing.assert_array_equal(np.array(back(x)), np.array(draft(x)))
    assert np.isneginf(np.array(back(x))[0, 0, 1])  # token 1 is off the head: q = 0
