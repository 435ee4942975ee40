"""Long contexts on the two other kinds of cache (edgespec/rewind.py; docs/architectures.md,
"Three kinds of cache"): greedy output equals plain decoding at 32K tokens of context on tiny
seeded targets whose layers are not all full attention, with a token draft whose attention bound
is on (SpecConfig.draft_window, bound.Bound), with the default method (hybrid, adaptive K) and
with the target's own kind of draft:

- sliding window: a Gemma 4 target (a sliding-window layer of 16 positions, a WindowKVCache
  that the prompt moves through 2,000 windows and that drops all but the last few hundred
  positions, and a global layer rotating a quarter of its dims with a base of 1e6), its token
  draft (a copy of the target: the bound is what tells them apart) and its assistant drafter;
- recurrent: a Qwen3.5 target (a gated delta-net layer, an ArraysCache restored after every
  rejection, and a gated attention layer, rope base 1e7 as its long-context releases ship it),
  its token draft (one attention layer, the target's) and its MTP head.

tests/loop/test_long_context.py does the same on a full-attention target. Each target is read
once per engine: the plain reference first, then every request reuses the prompt's prefix.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache

from edgespec.cache import KVState
from edgespec.config import DRAFT_SINKS, DRAFT_WINDOW, SpecConfig
from edgespec.drafting.assistant import AssistantState
from edgespec.drafting.feature import FeatureState
from edgespec.events import Round
from edgespec.rewind import WindowKVCache, leaves
from edgespec.runtime import Engine
from tests.helpers import PROMPT, gen, plain_ids, rounds_of, token_ids
from tests.helpers.mtp_models import attention_draft, make_checkpoint
from tests.helpers.tiny_gemma4_assistant import make_assistant

LONG = 32_768
CONTEXT = LONG + 512  # the tiny models' context window
N = 40  # tokens generated: fewer than a window cache's rewind depth (rewind.DEPTH)
TOKEN = SpecConfig(k=4, method="draft", draft_window=256, adaptive=False)


@dataclass
class Long:
    """One long-context target: an engine with its token draft, one with its own kind of draft
    (`native`, drafting as `method`), the prompt, and plain decoding's answer to it."""

    token: Engine
    native: Engine
    method: str
    prompt: list[int]

    @functools.cached_property
    def plain(self) -> list[int]:
        """Plain decoding's N tokens (the token engine's target reads the prompt once here)."""
        return plain_ids(self.token, self.prompt, N)


def _long(target: Path, draft: Path, native: str, method: str) -> Long:
    token = Engine.load(target=str(target), draft=str(draft))
    rng = np.random.default_rng(0)  # seeded token ids of the tiny vocabulary, no special tokens
    prompt = [int(t) for t in rng.integers(3, token._vocab, size=LONG - 64)]
    return Long(token, Engine.load(target=str(target), draft=native), method, prompt)


@pytest.fixture(scope="module")
def sliding(tmp_path_factory: pytest.TempPathFactory) -> Long:
    """Gemma 4, 2 layers (sliding, global; too few for KV-shared ones). make_assistant writes
    make_family's draft beside the target: its first 2 layers, here all of them."""
    root = tmp_path_factory.mktemp("long_gemma4")
    target, assistant, _ = make_assistant(root, length=120, layers=2, context=CONTEXT)
    return _long(target, root / "draft", str(assistant), "draft")


@pytest.fixture(scope="module")
def recurrent(tmp_path_factory: pytest.TempPathFactory) -> Long:
    """Qwen3.5, 2 layers (gated delta-net, attention), its MTP head trained on PROMPT's answer."""
    root = tmp_path_factory.mktemp("long_qwen3_5")
    checkpoint = make_checkpoint(root, [PROMPT], 120, steps=60, layers=2, context=CONTEXT)
    return _long(checkpoint, attention_draft(checkpoint, root / "draft"), "mtp", "mtp")


def _check_target(engine: Engine, kind: str, rounds: list[Round]) -> None:
    """The target's cache is of `kind` at the end of a long answer, and rounds rewound it."""
    layers = leaves(engine._target.cache)
    if kind == "sliding":  # a window that has dropped most of the prompt (a ring that wrapped)
        windows = [c for c in layers if isinstance(c, WindowKVCache)]
        assert windows and all(not c.bounded and c.start > LONG - 1024 for c in windows)
    else:
        assert any(isinstance(c, ArraysCache) for c in layers)
    assert any(r.accepted < r.drafted for r in rounds)  # rejected drafts were rewound


@pytest.mark.slow  # a 32K-token prompt per target and engine: 2-3 minutes on a 2-core CPU
@pytest.mark.parametrize("spec", [TOKEN, SpecConfig()], ids=["draft", "default"])
@pytest.mark.parametrize("kind", ["sliding", "recurrent"])
def test_a_bounded_token_draft_keeps_greedy_output_at_32k_tokens(kind, spec, request):
    long: Long = request.getfixturevalue(kind)
    engine, want = long.token, long.plain  # the target's prefill is reused from here on
    engine._draft.reset()  # the draft reads the long prompt again (bounded: only its end)
    events = gen(engine, long.prompt, spec, N)
    assert token_ids(events) == want and len(want) == N
    rounds = rounds_of(events)
    assert any(r.drafted and r.method == "draft" for r in rounds)
    _check_target(engine, kind, rounds)
    draft = engine._draft
    assert isinstance(draft, KVState)
    assert all(isinstance(c, WindowKVCache) for c in draft.cache)  # the bound was on ...
    assert any(c.bounded for c in draft.cache)  # ... on the draft's full-attention layers
    held = max(int(c.size()) for c in draft.cache)  # its sinks and about one window
    window = spec.window(DRAFT_WINDOW)  # the token family's default where none is asked for
    assert held <= DRAFT_SINKS + window + 2 * WindowKVCache.step


# The target's own draft kinds read its features over the whole context: they are passed
# SpecConfig's draft_window as any request is, but bounding a feature draft's attention is
# another change (edgespec/families/); only output is checked here.
@pytest.mark.slow
@pytest.mark.parametrize("default", [False, True], ids=["own-method", "default"])
@pytest.mark.parametrize("kind", ["sliding", "recurrent"])
def test_the_targets_own_draft_keeps_greedy_output_at_32k_tokens(kind, default, request):
    long: Long = request.getfixturevalue(kind)
    engine = long.native
    spec = SpecConfig() if default else SpecConfig(k=3, method=long.method, adaptive=False)
    events = gen(engine, long.prompt, spec, N)
    assert token_ids(events) == long.plain
    rounds = rounds_of(events)
    assert sum(r.drafted for r in rounds if r.method != "ngram") > 0
    _check_target(engine, kind, rounds)
    assert isinstance(engine._draft, AssistantState if kind == "sliding" else FeatureState)
    assert plain_ids(engine, long.prompt, N) == long.plain  # this engine's target agrees
