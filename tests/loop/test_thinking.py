"""The thinking switch (issue 72): `enable_thinking` reaches the chat template only where the
template has a thinking mode; the catalogue pair's `thinking` (the mode its draft was trained for)
is the engine's default; elsewhere the switch changes nothing. On a tiny reasoning model's
tokenizer and template (tests/helpers/tiny.py THINKING_TEMPLATE, Qwen3's shape)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec import prompting
from edgespec.loading.specs import load_catalog, pair_thinking, parse_catalog
from edgespec.runtime import Engine
from tests.helpers.tiny import make_tiny_pair

MESSAGES = [{"role": "user", "content": "the cat"}]


@pytest.fixture(scope="module")
def thinking_pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_tiny_pair(tmp_path_factory.mktemp("thinking"), thinking=True)


@pytest.fixture(scope="module")
def thinking_engine(thinking_pair) -> Engine:
    return Engine.load(target=str(thinking_pair[0]), draft=str(thinking_pair[1]))


def empty_reasoning(tok) -> list[int]:
    return list(tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False))


def test_a_template_with_the_mode_gets_the_switch(thinking_engine):
    e, tok = thinking_engine, thinking_engine.tokenizer
    assert prompting.thinking_default(tok) is True and e.thinking_mode() is True
    on = e.encode_chat(MESSAGES)
    assert e.encode_chat(MESSAGES, think=True) == on
    off = e.encode_chat(MESSAGES, think=False)
    assert off == on + empty_reasoning(tok)  # the template closes an empty reasoning part
    assert e.thinking_mode(think=False) is False


def test_the_engines_default_is_what_encode_chat_gets_when_not_told(thinking_engine):
    e = thinking_engine
    try:
        e.thinking = False
        assert e.thinking_mode() is False
        assert e.encode_chat(MESSAGES) == e.encode_chat(MESSAGES, think=False)
        assert e.encode_chat(MESSAGES, think=True) != e.encode_chat(MESSAGES)
    finally:
        e.thinking = None


def test_a_template_without_the_mode_is_left_alone(engine):
    assert prompting.thinking_default(engine.tokenizer) is None
    assert engine.thinking_mode() is None and engine.thinking_mode(think=False) is None
    assert engine.encode_chat(MESSAGES, think=False) == engine.encode_chat(MESSAGES)
    engine.thinking = False
    assert engine.encode_chat(MESSAGES) == engine.encode_chat(MESSAGES, think=True)


def test_the_catalogue_records_the_mode_the_drafts_were_trained_for():
    """z-lab's Qwen3 b16 DFlash drafts were trained on non-thinking output; its Qwen3.5 drafts
    are run with thinking on (docs/architectures.md cites the README and benchmark.py)."""
    cat = load_catalog()
    assert pair_thinking(None, "qwen3-4b-dflash", cat) is False
    assert pair_thinking(None, "qwen3-8b-dflash", cat) is False
    assert pair_thinking("qwen3-8b-dflash", None, cat) is False  # a pair named as the target
    assert pair_thinking(None, "qwen3.5-9b-dflash", cat) is True
    assert pair_thinking(None, None, cat) is None  # the embedded pair: SmolLM2 has no mode
    assert pair_thinking("org/some-model", None, cat) is None  # a model named directly
    with pytest.raises(Exception, match="thinking must be true or false"):
        parse_catalog(
            {"pairs": {"p": {"target": "a/b", "draft": "c/d", "thinking": "no"}}}, Path(".")
        )


def test_engine_load_takes_the_pairs_default(thinking_pair, monkeypatch):
    import edgespec.runtime as runtime

    raw = {
        "default_pair": "tiny",
        "pairs": {
            "tiny": {"target": str(thinking_pair[0]), "draft": str(thinking_pair[1])},
            "tiny-no-think": {
                "target": str(thinking_pair[0]),
                "draft": str(thinking_pair[1]),
                "thinking": False,
            },
        },
    }
    monkeypatch.setattr(runtime, "load_catalog", lambda: parse_catalog(raw, Path(".")))
    assert Engine.load(pair="tiny").thinking is None
    e = Engine.load(pair="tiny-no-think")
    assert e.thinking is False and e.thinking_mode() is False
    assert e.encode_chat(MESSAGES) == e.encode_chat(MESSAGES, think=False)
