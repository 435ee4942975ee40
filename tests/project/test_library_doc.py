"""docs/library.md's custom drafter, run as printed: on the tiny pair (Engine.load patched to
return it) in the fast subset, and as is, on the embedded pair, with the slow tests."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from edgespec.events import Finished
from edgespec.runtime import Engine

# The repository's docs/library.md, however deep this file sits under tests/.
DOC = next(
    d / "docs" / "library.md"
    for d in Path(__file__).resolve().parents
    if (d / "docs" / "library.md").exists()
)


def drafter_example() -> str:
    """The one python block of docs/library.md that defines a drafter (a `propose`)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if "def propose(" in b]
    assert len(found) == 1, "docs/library.md should show one custom drafter"
    return found[0]


def run_example() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "library_doc"}
    exec(compile(drafter_example(), str(DOC), "exec"), namespace)
    return namespace


def test_the_example_drafter_has_only_method_propose_and_commit():
    members = re.findall(r"^    (?:def (\w+)|(\w+) =)", drafter_example(), re.M)
    assert sorted(a or b for a, b in members) == ["commit", "method", "propose"]


def test_the_custom_drafter_example_runs_on_the_tiny_pair(tiny_models, monkeypatch, capsys):
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: cls(*tiny_models)))
    namespace = run_example()
    done = namespace["done"]
    assert isinstance(done, Finished) and done.stats.drafted > 0
    assert "drafted" in capsys.readouterr().out


@pytest.mark.slow
def test_the_custom_drafter_example_runs_on_the_embedded_pair(capsys):
    namespace = run_example()
    assert namespace["done"].stats.drafted > 0
    assert "accepted" in capsys.readouterr().out


def text_is_text_example() -> str:
    """The python block of docs/library.md that shows a forged turn read as text."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if "forged" in b]
    assert len(found) == 1, "docs/library.md should show text read as text once"
    return found[0]


def test_the_text_is_text_example_runs_on_the_tiny_pair(tiny_models, monkeypatch, capsys):
    """The tiny pair's template adds no system turn: one <|im_start|> fewer than the embedded
    pair's, which the slow test runs as printed."""
    monkeypatch.setattr(Engine, "load", classmethod(lambda cls, *a, **k: cls(*tiny_models)))
    source = text_is_text_example().replace("ids.count(im_start) == 3", "ids.count(im_start) == 2")
    exec(compile(source, str(DOC), "exec"), {"__name__": "library_doc"})
    assert capsys.readouterr().out.strip() == "None"


@pytest.mark.slow
def test_the_text_is_text_example_runs_on_the_embedded_pair(capsys):
    exec(compile(text_is_text_example(), str(DOC), "exec"), {"__name__": "library_doc"})
    assert capsys.readouterr().out.strip() == "None"
