"""What a chained next-n draft step reads (edgespec/architectures/nextn.py RECYCLES): the head's
own output before its output norm (DeepSeek-V3, GLM-4.5, as vLLM's deepseek_mtp.py and
glm4_moe_mtp.py recycle `residual + hidden_states`) or after it (MiMo).

Only the second and later tokens of a round read it, and the head's `hnorm` absorbs a scale, so
a wrong choice never looks broken: the first draft token is the same, later ones are accepted
less. Here, on a tiny seeded GLM-4.5 whose head's output norm has per-channel weights (as a
trained head's has), two heads learn the target's greedy answer to PROMPT two steps deep, one
chaining each state (tests/helpers/mtp_models.py). At K = 2 each head is accepted clearly more
often when it chains the state it learnt; every answer equals plain decoding; and a plain load
gives GLM-4.5 the raw state of its reference, where the head trained that way keeps its
acceptance.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.architectures.nextn import NORMED, RAW, RECYCLES
from edgespec.config import SpecConfig
from edgespec.runtime import Engine
from tests.helpers import gen, rounds_of, token_ids
from tests.helpers.arch_models import PROMPT, first_difference, generate
from tests.helpers.mtp_models import make_checkpoint

pytestmark = pytest.mark.slow  # two heads to train, five loads and answers

FAMILY = "glm4_moe"
TOKENS = 160
STEPS = 300  # training steps of each head
# The chained token's acceptance, matched chaining minus crossed: on average over the two heads,
# and for each one.
MARGIN, FLOOR = 0.1, 0.02
SPEC = SpecConfig(k=2, method="mtp", adaptive=False)
MODES = (RAW, NORMED)


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """recycle -> a checkpoint of the same target whose head learnt chaining that state."""
    root = tmp_path_factory.mktemp("chain")
    return {
        mode: make_checkpoint(root / mode, [PROMPT], TOKENS, STEPS, family=FAMILY, recycle=mode)
        for mode in MODES
    }


def _load(path: Path, recycle: str | None = None) -> Engine:
    """The checkpoint through the normal loading path; `recycle` replaces the family's own
    while it loads (None: the family's)."""
    with pytest.MonkeyPatch.context() as patch:
        if recycle is not None:
            patch.setitem(RECYCLES, FAMILY, recycle)
        return Engine.load(target=str(path), draft="mtp")


def _greedy(engine: Engine) -> tuple[list[int], float]:
    """(tokens, how often the chained token is accepted) of the greedy answer to PROMPT at
    K = 2: of the rounds whose first draft token was accepted, the share that kept the second
    (the one that read the recycled state)."""
    events = gen(engine, engine.encode_raw(PROMPT), SPEC, TOKENS)
    rounds = [r for r in rounds_of(events) if r.drafted == 2 and r.accepted >= 1]
    return token_ids(events), sum(r.accepted == 2 for r in rounds) / max(len(rounds), 1)


@pytest.fixture(scope="module")
def runs(heads: dict[str, Path]) -> dict[tuple[str, str], tuple[list[int], float]]:
    """(state learnt, state chained) -> (tokens, acceptance)."""
    out = {}
    for learnt in MODES:
        for chained in MODES:
            engine = _load(heads[learnt], chained)
            assert engine.draft.model.recycle == chained
            out[learnt, chained] = _greedy(engine)
    return out


@pytest.fixture(scope="module")
def plain(heads: dict[str, Path]) -> list[int]:
    engine = Engine.load(target=str(heads[RAW]), with_draft=False)
    return generate(engine, engine.encode_raw(PROMPT), SpecConfig(method="none"), TOKENS)[0]


def test_each_head_is_accepted_more_chaining_the_state_it_learnt(runs):
    """Measured (seed 0, 300 steps): the raw-trained head 0.65 matched vs 0.60 crossed, the
    normed-trained one 0.79 vs 0.52; a head fed the normed state where it learnt the raw one
    loses less (the per-channel weights distort a state it partly ignores)."""
    gains = {
        learnt: runs[learnt, learnt][1] - runs[learnt, NORMED if learnt == RAW else RAW][1]
        for learnt in MODES
    }
    assert min(gains.values()) > FLOOR and sum(gains.values()) / 2 > MARGIN, gains


def test_every_chaining_stays_exact(runs, plain):
    for key, (tokens, _) in runs.items():
        assert first_difference(tokens, plain) is None, key


def test_loading_gives_glm_the_raw_state_of_its_reference(heads, runs, plain):
    """vLLM's Glm4MoeMultiTokenPredictorLayer returns the un-normed residual stream: a plain
    load recycles it, and the head that learnt so keeps the acceptance of its own chaining."""
    assert RECYCLES == {"deepseek_v3": RAW, "glm4_moe": RAW, "mimo": NORMED}
    engine = _load(heads[RAW])
    assert engine.draft.model.recycle == RAW
    tokens, acceptance = _greedy(engine)
    assert first_difference(tokens, plain) is None
    assert acceptance == runs[RAW, RAW][1]
