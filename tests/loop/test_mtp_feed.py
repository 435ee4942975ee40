"""The MTP feed (edgespec/architectures/mtp.py FEEDS): which hidden state of the target a head reads.

A head's own RMSNorm absorbs the scale of what it reads, so a head fed the other state (before the
target's final norm instead of after it, or the reverse) still drafts fluent tokens that the
verify keeps exact; only acceptance shows the mistake. Here, on a tiny seeded Qwen3.5 whose final
norm has per-channel weights (as a trained model's has; with all ones the two states differ by a
scale only), two MTP heads learn the target's greedy answer to PROMPT, one on each feed
(tests/helpers/mtp_models.py). Each head, run with greedy speculation under each feed, is accepted
clearly more often with the feed it learnt; all four answers equal plain decoding; and the normal
loading path gives Qwen3.5 the feed of its reference implementation (after the final norm:
docs/architectures.md), so the head trained that way gets its high acceptance there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.architectures.mtp import FEEDS, POST_NORM, PRE_NORM
from edgespec.config import SpecConfig
from edgespec.runtime import Engine
from edgespec.taps import TOP
from tests.helpers import gen, rounds_of, token_ids
from tests.helpers.arch_models import PROMPT, first_difference, generate
from tests.helpers.mtp_models import make_checkpoint

# Two heads to train and five loads and answers: about 30 s on a quiet 2-core CPU.
pytestmark = pytest.mark.slow

FAMILY = "qwen3_5"
TOKENS = 200
# Accepted per drafted token with the feed a head learnt minus with the other one, for each head;
# measured per seed in docs/measurements/2026-11-29-mtp-feed.md. Targets whose answer cycles
# through a few tokens cannot tell the feeds apart (the last token predicts the next by itself),
# hence the check on `plain` below.
MARGIN = 0.15
DISTINCT = 50  # tokens the target's answer must use for the hidden state to matter (seed 0: 71)
SPEC = SpecConfig(k=1, method="mtp", adaptive=False)
FEED_NAMES = (POST_NORM, PRE_NORM)


@pytest.fixture(scope="module")
def heads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """feed -> a checkpoint of the same target whose head learnt on that feed."""
    root = tmp_path_factory.mktemp("feed")
    return {
        feed: make_checkpoint(
            root / feed, [PROMPT], TOKENS, family=FAMILY, feed=feed, norm_spread=1.0
        )
        for feed in FEED_NAMES
    }


def _load(path: Path, feed: str | None = None) -> Engine:
    """The checkpoint's target and head through the normal loading path; `feed`: the family's
    feed replaced by that one while it loads (None: the family's own)."""
    with pytest.MonkeyPatch.context() as patch:
        if feed is not None:
            patch.setitem(FEEDS, FAMILY, feed)
        return Engine.load(target=str(path), draft="mtp")


def _greedy(engine: Engine) -> tuple[list[int], float]:
    """(tokens, accepted per drafted token) of the greedy answer to PROMPT."""
    events = gen(engine, engine.encode_raw(PROMPT), SPEC, TOKENS)
    rounds = rounds_of(events)
    drafted = sum(r.drafted for r in rounds)
    return token_ids(events), sum(r.accepted for r in rounds) / max(drafted, 1)


@pytest.fixture(scope="module")
def runs(heads: dict[str, Path]) -> dict[tuple[str, str], tuple[list[int], float]]:
    """(feed learnt, feed run) -> (tokens, acceptance)."""
    out = {}
    for learnt in FEED_NAMES:
        for fed in FEED_NAMES:
            engine = _load(heads[learnt], fed)
            assert engine.draft.model.feed == fed
            out[learnt, fed] = _greedy(engine)
    return out


@pytest.fixture(scope="module")
def plain(heads: dict[str, Path]) -> list[int]:
    engine = Engine.load(target=str(heads[POST_NORM]), with_draft=False)
    return generate(engine, engine.encode_raw(PROMPT), SpecConfig(method="none"), TOKENS)[0]


@pytest.mark.parametrize("learnt", FEED_NAMES)
def test_a_head_is_accepted_clearly_more_with_the_feed_it_learnt(runs, learnt):
    other = PRE_NORM if learnt == POST_NORM else POST_NORM
    matched, crossed = runs[learnt, learnt][1], runs[learnt, other][1]
    assert matched - crossed > MARGIN, (learnt, matched, crossed)


def test_the_answer_needs_more_than_its_last_token(plain):
    """The premise: an answer that cycles through a few tokens is predicted by the embedding of
    the last one alone, whatever the feed, and could not tell the feeds apart."""
    assert len(set(plain)) >= DISTINCT


def test_every_feed_stays_exact(runs, plain):
    for key, (tokens, _) in runs.items():
        assert first_difference(tokens, plain) is None, key


def test_loading_gives_the_family_its_reference_feed(heads, runs, plain):
    """Qwen3.5's reference implementation (vLLM's) feeds the state after the final norm: a
    plain load reads it, and the head that learnt on it gets the acceptance of its own feed,
    clearly above the other head's."""
    engine = _load(heads[POST_NORM])
    assert engine.draft.model.feed == POST_NORM
    assert engine._target.feature_layers == (TOP,)  # the verify records the final-normed state
    tokens, acceptance = _greedy(engine)
    assert first_difference(tokens, plain) is None
    assert acceptance == runs[POST_NORM, POST_NORM][1]
    assert acceptance - runs[PRE_NORM, POST_NORM][1] > MARGIN
