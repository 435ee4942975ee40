"""One default: the commands that speculate run what the library's SpecConfig() runs."""

from __future__ import annotations

import argparse
import importlib

import pytest

from edgespec.cli import COMMANDS
from edgespec.commands.common import spec_from_args
from edgespec.config import GenerationConfig, SpecConfig


@pytest.mark.parametrize("command", ["generate", "serve", "chat"])
def test_a_command_without_flags_runs_the_library_default(command):
    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    args, _ = parser.parse_known_args(["a prompt"] if command == "generate" else [])
    assert spec_from_args(args) == SpecConfig() == GenerationConfig().spec


def test_the_default_is_hybrid_drafting_with_adaptive_k():
    spec = SpecConfig()
    assert (spec.method, spec.adaptive, spec.k) == ("hybrid", True, 4)
