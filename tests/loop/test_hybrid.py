"""The hybrid drafter (edgespec.drafting.ngram): a lookup when the context has a match, the draft
model otherwise; each proposal names who made it. Its caches stay consistent across the switch
(the draft catches up in one forward), its lookups fit the context window, and chain_drafter picks
the drafter a SpecConfig asks for."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest

from edgespec.config import GenerationConfig, SpecConfig
from edgespec.drafting.base import PLAIN_ONLY, Drafter, Proposal, point_mass
from edgespec.drafting.ngram import HybridDrafter, NgramDrafter
from edgespec.errors import ConfigError
from edgespec.events import Round, Token
from edgespec.families import NO_DRAFT, chain_drafter
from edgespec.runtime import Engine
from tests.helpers import GREEDY, PROMPT, NeverDrafter, Scripted, gen, token_ids, toks


class Fixed(Drafter):
    """A model drafter proposing [1] whatever the context; records its commits."""

    def __init__(self):
        self.commits: list[list[int]] = []

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        return point_mass([1], self.method)

    def commit(self, context: list[int]) -> None:
        self.commits.append(list(context))


def test_hybrid_switches_method_per_round():
    model = Fixed()
    hybrid = HybridDrafter(NgramDrafter(1, 3), model, min_match=2)
    prop = hybrid.propose([4, 5, 6, 4, 5], 2, mx.random.key(0))  # "4 5" occurred: a lookup
    assert (prop.method, prop.match, toks(prop)) == ("ngram", 2, [6, 4, 5])
    prop = hybrid.propose([4, 5, 6, 7], 2, mx.random.key(0))  # no match: the model drafts
    assert (prop.method, prop.match, toks(prop)) == ("draft", 0, [1])
    hybrid.commit([4, 5, 6, 7, 1])
    assert model.commits == [[4, 5, 6, 7, 1]]


def test_hybrid_lookup_length_comes_from_lookup_k():
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]  # "1 2" matched: 3 4 5 6 7 8 9 1 2 follow
    asked = []

    def lookup_k(method, default):
        asked.append((method, default))
        return 6

    hybrid = HybridDrafter(NgramDrafter(2, 4), NeverDrafter(), free_k=4, lookup_k=lookup_k)
    key = mx.random.key(0)
    direct, free = hybrid.propose(context, 1, key), hybrid.propose_free(context, key)
    assert toks(direct) == toks(free) == [3, 4, 5, 6, 7, 8]
    assert asked == [("ngram", 4), ("ngram", 4)]
    assert direct.method == free.method == "ngram" and direct.match == free.match == 2
    plain = HybridDrafter(NgramDrafter(2, 4), NeverDrafter(), free_k=4)
    assert toks(plain.propose(context, 1, key)) == [3, 4, 5, 6]  # max(k, free_k)
    assert toks(plain.propose(context, 5, key)) == [3, 4, 5, 6, 7]


def test_hybrid_caches_stay_consistent_and_the_draft_catches_up(self_engine):
    """Self-draft (draft == target): every draft-model round must accept all K at greedy, which
    holds only if the draft's cache caught up exactly with the tokens the n-gram rounds committed."""
    engine = self_engine
    ids = engine.encode_raw(PROMPT) * 2  # the suffix occurred before: round 0 is an n-gram round
    cfg = GenerationConfig(
        GREEDY,
        SpecConfig(k=3, method="hybrid", ngram_min=1, ngram_max=1, adaptive=False),
        max_tokens=60,
    )
    committed, methods = list(ids), []
    for event in engine.generate(ids, cfg):
        if isinstance(event, Token):
            committed.append(event.id)
        elif isinstance(event, Round):
            methods.append(event.method)
            target, draft = engine.cached_tokens()
            assert target == committed[:-1] and len(target) == engine._target.offset
            assert draft == committed[: len(draft)] and len(draft) == engine._draft.offset
            if event.method == "draft":
                assert event.accepted == event.drafted == 3
    assert "ngram" in methods and "draft" in methods
    i = methods.index("ngram")
    assert "draft" in methods[i:]  # a model round after an n-gram round (the catch-up case)


@pytest.mark.parametrize("policy_k", [0, 1], ids=["free-lookups-at-k0", "lookups-longer-than-k"])
def test_hybrid_lookups_stay_inside_the_context_window(tiny_models, policy_k):
    """Hybrid n-gram lookups propose up to max(K, ngram_k) tokens, also in K = 0 rounds; like any
    proposal they must fit the context window: a round starting with C committed tokens verifies
    at most window - C."""
    near_the_end = longer_than_k = 0
    for window in range(56, 72):
        records = (SimpleNamespace(**{**vars(m), "context_window": window}) for m in tiny_models)
        engine = Engine(*records)
        ids = engine.encode_raw(PROMPT)
        # unigram lookups: matches abound
        spec = SpecConfig(k=1, method="hybrid", ngram_min=1, ngram_max=1, ngram_k=6, adaptive=False)
        events = gen(engine, ids, spec, 500, k_policy=Scripted(lambda _last: policy_k))
        committed = before = len(ids)  # tokens committed, and when the current round began
        for e in events:
            if isinstance(e, Token):
                committed += 1
            elif isinstance(e, Round):
                assert e.drafted <= window - before, (window, before, e)
                near_the_end += e.drafted > 0 and window - before < 6
                longer_than_k += e.method == "ngram" and e.drafted > 1
                before = committed
        assert events[-1].reason == "length"
    assert near_the_end > 0  # some lookups really were cut by the window
    assert longer_than_k > 0  # lookups are not held to the model's K


def test_chain_drafter_errors_and_choices(target_engine):
    engine = target_engine
    assert isinstance(
        chain_drafter(SpecConfig(method="ngram", adaptive=False), GREEDY, NO_DRAFT, None, 10, "x"),
        NgramDrafter,
    )
    for method in ("draft", "hybrid"):
        with pytest.raises(ConfigError, match="no draft model"):
            list(
                engine.generate(
                    [1, 2, 3], GenerationConfig(GREEDY, SpecConfig(method=method, adaptive=False))
                )
            )
    events = gen(
        engine, engine.encode_raw(PROMPT), SpecConfig(k=3, method="ngram", adaptive=False), 8
    )
    assert len(token_ids(events)) == 8  # n-gram needs no draft model


def test_plain_only_skips_every_lookup_and_decodes_as_plain(tiny_models):
    """K = 0 still looks up (free lookups, and one token behind each plain step); PLAIN_ONLY, what
    a batch stepping plainly asks for (server/mode.py), looks nothing up: every round is a plain
    step, and the text is plain decoding's."""
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    spec = SpecConfig(
        k=1, method="hybrid", ngram_min=1, ngram_max=1, ngram_k=6, adaptive=False
    )  # matches abound
    plain = token_ids(gen(engine, ids, SpecConfig(method="none"), 80))
    lookups = [
        e
        for e in gen(engine, ids, spec, 80, k_policy=Scripted(lambda _: 0))
        if isinstance(e, Round)
    ]
    assert any(r.drafted > 0 for r in lookups)  # K = 0: lookups verified
    events = gen(engine, ids, spec, 80, k_policy=Scripted(lambda _: PLAIN_ONLY))
    rounds = [e for e in events if isinstance(e, Round)]
    assert rounds and all(r.drafted == 0 for r in rounds)
    assert token_ids(events) == plain
