"""One way to write an exception as one line (edgespec.errors.one_line), used everywhere a
message is cut to its first line: loading, the server, the CLI and the TUI."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from edgespec.tui.engine_thread import error_line

from edgespec.errors import ContextLengthError, ModelLoadError, check_context, one_line
from edgespec.server.app import tokenize
from edgespec.server.batching import failure
from edgespec.server.protocol import ParsedRequest, RequestError

ROOT = Path(__file__).resolve().parents[1]
MLX_ERROR = RuntimeError("\n[metal::malloc] cannot allocate 9 GB\n  at buffer.cpp:42\n")


def test_one_line_keeps_the_first_non_blank_line_or_the_type():
    assert one_line(MLX_ERROR) == "[metal::malloc] cannot allocate 9 GB"
    assert one_line(MLX_ERROR, typed=True) == "RuntimeError: [metal::malloc] cannot allocate 9 GB"
    assert one_line(KeyError()) == one_line(KeyError(), typed=True) == "KeyError"
    assert one_line(ValueError("x" * 500)) == "x" * 300
    assert one_line(ValueError("  padded  \nmore"), limit=4) == "padd"


def test_the_server_and_the_tui_cut_messages_alike():
    assert failure(MLX_ERROR).message == f"generation failed: {one_line(MLX_ERROR, typed=True)}"
    assert failure(ModelLoadError("bad\nweights")).message == "bad"
    assert error_line(MLX_ERROR) == one_line(MLX_ERROR, typed=True)
    assert error_line(ModelLoadError("bad\nweights")) == "bad"


def test_no_module_cuts_an_exception_to_its_first_line_by_hand():
    by_hand = re.compile(r"str\(\w+\)[\w.()]*\.splitlines\(")
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for top in ("edgespec", "tui")
        for path in sorted((ROOT / top).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if by_hand.search(line)
    ]
    assert not found, f"use edgespec.errors.one_line: {found}"


def test_one_context_check_for_the_engine_and_the_server():
    check_context(511, 512)
    with pytest.raises(ContextLengthError, match="is 512 tokens but the context window is 512"):
        check_context(512, 512)
    # The server refuses with the same check before the engine's own (which also reads ids).
    engine = SimpleNamespace(context_window=8, check_prompt=lambda ids: pytest.fail("reached"))
    parsed = ParsedRequest("completion", "m", None, prompt=(99,) * 8)  # type: ignore[arg-type]
    with pytest.raises(RequestError) as info:
        tokenize(engine, parsed)
    assert info.value.code == "context_length_exceeded"
    assert info.value.message.startswith("the prompt is 8 tokens but the context window is 8")
