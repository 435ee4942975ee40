"""`--method mtp` through `edgespec serve` and `edgespec chat` (edgespec/commands/serve.py,
tui/command.py): both load the target's own MTP head as `edgespec generate` does
(commands/common.py draft_from_args), on the tiny qwen3_5 checkpoint of tests/helpers/mtp_models.py.

The server answers a greedy chat completion exactly as the same server with speculation off,
drafting with the head; the chat command's loader gives an engine whose draft is the head. Draft
trees with --method mtp are refused in one line that says why: the tree forward
(edgespec/trees/forward.py) runs none of the targets that ship an MTP head.
"""

from __future__ import annotations

import argparse
import gc
import json
from pathlib import Path

import pytest

from edgespec.architectures.mtp import MtpModel
from edgespec.config import SpecConfig
from edgespec.errors import TreeUnsupportedError
from edgespec.server.process import ServerProcess
from edgespec.taps import text_model
from edgespec.trees.forward import tree_layers
from tests.helpers.arch_models import PROMPT, generate
from tests.helpers.cli import run_edgespec
from tests.helpers.mtp_models import checkpoint_config, make_checkpoint
from tests.helpers.tiny_arch import build

openai = pytest.importorskip("openai")

TOKENS = 120


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Trained on the chat-templated prompt the server sends: trained on the raw prompt, the head
    # met text it had never seen and got 0-5 of 345-360 drafts accepted, which left the check
    # below to floating-point luck.
    folder = tmp_path_factory.mktemp("mtp-cmd")
    return make_checkpoint(folder, [PROMPT], TOKENS, steps=100, chat=True)


def test_serve_method_mtp_answers_greedy_as_no_spec(checkpoint):
    srv = ServerProcess("--target", str(checkpoint), "--method", "mtp", "--no-adaptive", "-k", "3")
    try:
        client = openai.OpenAI(base_url=srv.base, api_key="none", timeout=120, max_retries=0)

        def ask(method: str):
            return client.chat.completions.create(
                model=checkpoint.name,
                messages=[{"role": "user", "content": PROMPT}],
                temperature=0,
                max_tokens=TOKENS,
                extra_body={"edgespec": {"method": method}},
            )

        mtp, plain = ask("mtp"), ask("none")
    finally:
        srv.kill()
    assert mtp.choices[0].message.content == plain.choices[0].message.content
    assert mtp.usage.completion_tokens == TOKENS
    args = ["--target", str(checkpoint), "--temp", "0", "--max-tokens", str(TOKENS), "--json"]
    alone = run_edgespec("generate", PROMPT, *args, "--no-spec")  # the same chat template
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert mtp.choices[0].message.content == json.loads(alone.stdout.splitlines()[-1])["text"]
    spec = mtp.usage.model_extra["speculation"]
    assert spec["method"] == "mtp" and spec["accepted"] > 0, spec
    assert plain.usage.model_extra["speculation"]["drafted"] == 0


def test_serve_method_mtp_with_a_draft_is_a_one_line_error(checkpoint):
    out = run_edgespec("serve", "--target", str(checkpoint), "--method", "mtp", "--draft", "x")
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line and "leave out --draft" in line


def test_chat_method_mtp_loads_the_head(checkpoint, monkeypatch):
    """The chat command's loader (run on the app's engine thread) gives the engine with its MTP
    head as the draft; the engine then speculates exactly with it."""
    from edgespec.tui import app as tui_app
    from edgespec.tui import command

    loaded = []

    class NoUi:
        load_error = None

        def __init__(self, load, config, what, collect_when_idle, think=None):
            self.load, self.config = load, config

        def run(self) -> None:
            loaded.append((self.load(lambda text, fraction: None), self.config))

    monkeypatch.setattr(tui_app, "ChatApp", NoUi)
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    try:
        assert command.run(parser.parse_args(["--target", str(checkpoint), "--method", "mtp"])) == 0
    finally:
        gc.unfreeze()  # the loader froze the test process's objects (freeze_heap)
    engine, config = loaded[0]
    assert isinstance(engine.draft.model, MtpModel) and config.spec.method == "mtp"
    ids = engine.encode_raw(PROMPT)
    tokens, _ = generate(engine, ids, SpecConfig(k=3, method="mtp", adaptive=False), 40)
    assert tokens == generate(engine, ids, SpecConfig(method="none"), 40)[0]


def test_trees_with_method_mtp_are_refused_in_one_line_saying_why(checkpoint):
    out = run_edgespec(
        "generate", PROMPT, "--target", str(checkpoint), "--method", "mtp", "--tree", "3,2,1"
    )
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line and "--method draft, hybrid, block or block-tree, not mtp" in line
    assert "tree forward runs llama, mistral, qwen2 and qwen3 targets" in line


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "deepseek_v3", "glm4_moe", "mimo"])
def test_the_tree_forward_cannot_run_a_target_that_ships_an_mtp_head(family):
    """The reason the refusal gives: should the tree forward learn one of these targets, this
    fails, and --tree with --method mtp can be wired instead of refused."""
    with pytest.raises(TreeUnsupportedError, match="tree drafting supports llama"):
        tree_layers(text_model(build(checkpoint_config(family, 300))).model)
