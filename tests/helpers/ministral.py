"""A tiny ministral3 target (mlx-lm has pipeline parallelism for it), a fixture for the
distributed tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.tiny import llama_config, random_llama_weights, write_model


@pytest.fixture(scope="module")
def tiny_ministral(tiny_pair: tuple[Path, Path]) -> Path:
    """A 4-layer ministral3 (mlx-lm has pipeline parallelism for it) on the tiny pair's tokenizer."""
    root = tiny_pair[0].parent
    cfg = llama_config(384, 4) | {
        "model_type": "ministral3",
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 512,
        },
    }
    weights = random_llama_weights(llama_config(384, 4), seed=3)
    return write_model(root / "ministral", cfg, weights, root / "tokenizer")
