"""The draft window per family (docs/drafting.md, Long contexts): with no window asked for, each
draft family takes its own default, the one its long-context measurement or its reference sets;
a window asked for (--draft-window N, SpecConfig.draft_window) wins; trees take the whole
context."""

from __future__ import annotations

import argparse

import pytest

from edgespec.commands.common import add_spec_args, spec_from_args
from edgespec.config import DRAFT_WINDOW, SpecConfig
from edgespec.families import NO_DRAFT, TOKEN
from edgespec.families.assistant_family import ASSISTANT
from edgespec.families.block_family import BLOCK, DFLASH2
from edgespec.families.feature_family import FEATURE, OWN_HEAD

# The table in docs/drafting.md: 0 is the whole context.
DEFAULTS = {
    "token": (TOKEN, DRAFT_WINDOW),
    "eagle": (FEATURE, DRAFT_WINDOW),
    "mtp": (OWN_HEAD, 0),
    "dflash": (BLOCK, 0),
    "dflash2": (DFLASH2, 0),
    "assistant": (ASSISTANT, 0),
    "none": (NO_DRAFT, 0),
}


@pytest.mark.parametrize("name", DEFAULTS)
def test_each_family_takes_its_default_window_when_none_is_asked_for(name):
    family, window = DEFAULTS[name]
    assert family.default_window == window
    assert SpecConfig().window(family.default_window) == window


@pytest.mark.parametrize("asked", [0, 256, 4096])
@pytest.mark.parametrize("name", DEFAULTS)
def test_a_window_asked_for_wins_over_the_familys(name, asked):
    family, _ = DEFAULTS[name]
    assert SpecConfig(draft_window=asked).window(family.default_window) == asked


def test_a_tree_takes_the_whole_context():
    assert SpecConfig(tree="2,1", draft_window=512).window(DRAFT_WINDOW) == 0
    assert SpecConfig(tree="2,1").window(DRAFT_WINDOW) == 0


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_spec_args(parser)
    return parser.parse_args(list(argv))


def test_the_command_line_leaves_the_window_to_the_family_unless_given():
    assert spec_from_args(_args()).draft_window is None
    assert spec_from_args(_args("--draft-window", "0")).draft_window == 0
    assert spec_from_args(_args("--draft-window", "2048")).draft_window == 2048


def test_a_block_draft_edgespec_trained_keeps_the_window():
    """z-lab's block drafts attend to the whole context (their reference); the block drafts
    EdgeSpec trains (model_type edgespec_block) were measured to draft better through the
    window at 4K and 8K, and keep it; a window asked for still wins."""
    from types import SimpleNamespace

    from edgespec.architectures.block_model import BlockArgs

    base = {"target_layer_ids": [1], "mask_token_id": 3, "block_size": 8, "rope_theta": 1e4}
    base |= {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1}
    base |= {"num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128}
    base |= {"rms_norm_eps": 1e-6, "max_position_embeddings": 512}
    ours = BlockArgs.from_config({"model_type": "edgespec_block", **base})
    zlab = BlockArgs.from_config({"architectures": ["DFlashDraftModel"], "dflash_config": base})
    assert ours.ours and not zlab.ours
    for family in (BLOCK, DFLASH2):
        state = SimpleNamespace(block=SimpleNamespace(args=ours))
        assert SpecConfig().window(family.window_of(state)) == DRAFT_WINDOW
        assert SpecConfig(draft_window=0).window(family.window_of(state)) == 0
        state = SimpleNamespace(block=SimpleNamespace(args=zlab))
        assert SpecConfig().window(family.window_of(state)) == 0
