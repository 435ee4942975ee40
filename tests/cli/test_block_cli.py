"""`edgespec generate --method block / block-tree` as a user runs it (a subprocess): greedy output
token for token equal to --no-spec with a tiny DFlash-format draft
(tests/helpers/block_models.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.helpers.block_models import tiny_qwen3, write_dflash
from tests.helpers.cli import run_edgespec


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("block_cli")
    target = tiny_qwen3(root)
    draft = write_dflash(target, root / "dflash", block=4)
    return ["--target", str(target), "--draft", str(draft)]


def _ids(r: subprocess.CompletedProcess) -> list[int]:
    assert r.returncode == 0, r.stderr
    return [x["id"] for x in map(json.loads, r.stdout.splitlines()) if x["type"] == "token"]


def _rounds(r: subprocess.CompletedProcess) -> list[dict]:
    return [x for x in map(json.loads, r.stdout.splitlines()) if x["type"] == "round"]


def test_block_methods_equal_plain_greedy(models):
    args = ["generate", "the cat and the dog", *models, "--raw", "--json", "--temp", "0"]
    args += ["--max-tokens", "20"]
    plain = _ids(run_edgespec(*args, "--no-spec"))
    assert len(plain) == 20
    block = run_edgespec(*args, "--method", "block", "-k", "3", "--no-adaptive")
    assert _ids(block) == plain
    assert {r["drafted"] for r in _rounds(block)} == {3}
    tree = run_edgespec(*args, "--method", "block-tree", "-k", "3", "--no-adaptive")
    assert _ids(tree) == plain
    assert max(r["drafted"] for r in _rounds(tree)) > 3  # a tree: more nodes than depths


def test_block_method_without_a_block_draft_is_one_line(models, tiny_pair):
    r = run_edgespec(
        "generate",
        "the cat",
        "--target",
        str(tiny_pair[0]),
        "--draft",
        str(tiny_pair[1]),
        "--method",
        "block",
        "--max-tokens",
        "4",
    )
    assert r.returncode == 2 and "block draft" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_draft_for_another_target_is_one_line(models, tmp_path):
    target = models[1]
    other = write_dflash(Path(target), tmp_path / "other", num_target_layers=6)
    r = run_edgespec(
        "generate",
        "the cat",
        "--target",
        target,
        "--draft",
        str(other),
        "--method",
        "block",
        "--max-tokens",
        "4",
    )
    assert r.returncode == 2 and "6 layers" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_server_takes_block_methods():
    pytest.importorskip("openai.types")
    from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
    from edgespec.server.protocol import Defaults, RequestError, parse_chat

    base = GenerationConfig(SamplingConfig(), SpecConfig(k=4, method="hybrid", adaptive=False), 64)
    msg = [{"role": "user", "content": "Hi"}]
    with_draft = Defaults("pair", base, random_seed=False, has_draft=True)
    tree = parse_chat({"messages": msg, "edgespec": {"method": "block-tree"}}, with_draft)
    assert (tree.config.spec.method, tree.config.spec.tree) == ("block-tree", "dynamic")
    no_draft = Defaults("pair", base, random_seed=False, has_draft=False)
    for method in ("block", "block-tree"):
        with pytest.raises(RequestError, match="needs a draft model"):
            parse_chat({"messages": msg, "edgespec": {"method": method}}, no_draft)
