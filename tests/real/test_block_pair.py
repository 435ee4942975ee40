"""The block-draft pair (SmolLM2-135M-Instruct + research/block_draft/smollm2-135m-block, in a
clone of the repository), end to end.

Real models through the real code path: the catalogue pair, the pulled target, the committed
8-bit block draft attached to the target's embedding and to its head's rows of the draft's 8,192
tokens. Slow.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.architectures.block_head import ReducedHead
from edgespec.architectures.block_model import BlockModel
from edgespec.config import SpecConfig
from edgespec.events import Finished
from tests.helpers import token_ids
from tests.helpers.pair import answer
from tests.helpers.prompt_sets import own_prompts

pytestmark = pytest.mark.slow
PAIR = "smollm2-135m-block"


@pytest.fixture(scope="module")
def engine():
    from edgespec.runtime import Engine

    return Engine.load(pair=PAIR)


def test_the_pair_loads_its_block_draft_with_a_reduced_head(engine):
    block = engine.draft.model
    assert isinstance(block, BlockModel) and isinstance(block.head, ReducedHead)
    assert block.embedding is engine.target.model.model.embed_tokens
    ids = np.array(block.head_ids)
    assert len(ids) == block.args.head_size == 8192 and len(np.unique(ids)) == 8192


@pytest.mark.parametrize(
    "spec",
    [
        SpecConfig(method="block", k=7, adaptive=False),
        SpecConfig(method="block-tree", k=4, adaptive=False),
        SpecConfig(method="hybrid", k=4, adaptive=True),  # the default method on a block draft
    ],
    ids=["block", "block-tree", "adaptive-hybrid"],
)
def test_greedy_equals_plain_and_the_trained_draft_gets_tokens_accepted(engine, spec):
    """Untrained (the target's layers and an identity fusion), the draft agreed with the target
    at about 0.06 per position (the CPU run's step 50); trained, 0.52 at position 1 and tau 1.79
    teacher-forced (model card). Require a clear margin over untrained, and plain's tokens."""
    rounds = tokens = 0
    for prompt in own_prompts(3):
        plain = token_ids(answer(engine, prompt, SpecConfig(method="none")))
        events = answer(engine, prompt, spec)
        assert token_ids(events) == plain, prompt
        assert isinstance(events[-1], Finished)
        rounds, tokens = rounds + events[-1].stats.rounds, tokens + events[-1].stats.tokens
    if spec.method != "hybrid":  # adaptive K may step plainly where drafting does not pay
        assert tokens / rounds > 1.3
