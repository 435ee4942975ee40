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
from edgespec.families.assistant import ASSISTANT
from edgespec.families.block import BLOCK, DFLASH2
from edgespec.families.feature import FEATURE, OWN_HEAD

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
