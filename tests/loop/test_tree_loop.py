"""Tree speculation end to end on tiny seeded models (edgespec/trees/loop.py).

Greedy output identical to plain decoding for every shape (fixed, dynamic, adaptive, with an n-gram
branch, with a feature draft); token-for-token agreement with the numpy reference
(tests/helpers/reference_tree.py) at T = 0 and T > 0; a chain-shaped tree emits exactly the chain
loop's tokens; the caches hold the committed context after every round; and a chi-square test that
the first two sampled tokens follow the target at T > 0, which fails with a planted bug.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chisquare

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Round, Token
from edgespec.runtime import Engine
from edgespec.sampling import warp
from edgespec.trees.shapes import chain_shape, widths_shape
from tests.helpers.reference_tree import reference_tree
from tests.helpers.stats import assert_follows

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
    spec = SpecConfig(k=4, method="draft", tree=tree, adaptive=False)  # the shape every round
    assert _ids(_gen(engine, ids, spec, 24, sampling)) == want


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
        _ids(
            _gen(
                engine,
                ids,
                SpecConfig(k=3, method="draft", tree="2,2,1", adaptive=False),
                24,
                sampling,
            )
        )
        == want
    )


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(0.9, seed=11)])
def test_chain_shaped_tree_emits_the_chain_loops_tokens(tiny_models, sampling):
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    chain = _ids(_gen(engine, ids, SpecConfig(k=3, method="draft", adaptive=False), 32, sampling))
    tree = _ids(_gen(engine, ids, SpecConfig(k=3, method="draft", tree="chain"), 32, sampling))
    assert tree == chain
    assert list(widths_shape([1, 1, 1])) == list(chain_shape(3))


N_SEEDS = 250


def _p_value(engine: Engine, samples: list[int], context: list[int], sampling) -> float:
    p = np.array(warp(engine.target.model(mx.array(context)[None])[0, -1], sampling), np.float64)
    counts = np.bincount(samples, minlength=p.size).astype(np.float64)
    if counts[p == 0].sum():
        return 0.0
    exp = p / p.sum() * len(samples)
    big = exp >= 5
    obs, e = np.append(counts[big], counts[~big].sum()), np.append(exp[big], exp[~big].sum())
    keep = e > 0
    return float(chisquare(obs[keep], e[keep] * obs[keep].sum() / e[keep].sum()).pvalue)


@pytest.mark.parametrize(
    "tree,bug", [("4,2", None), ("dynamic:6", None), ("4,2", "against-p"), ("chain", None)]
)
def test_sampled_tree_tokens_follow_the_target(tiny_models, monkeypatch, tree, bug):
    """T = 2 over many seeds: the first emitted token follows p(. | prompt) and the second, given
    the most frequent first, p(. | prompt, first) (EOS included: a round may end on it). With a
    planted bug (siblings tried against p instead of the residual) the same check must fail.
    "chain": a chain-shaped tree, drafted by the chain drafter and verified by the chain path."""
    from edgespec.trees import tree_acceptance
    from edgespec.trees.tree_acceptance import verify_tree

    if bug:  # where the round's acceptance (tree_acceptance.accept_tree) looks it up
        monkeypatch.setattr(tree_acceptance, "verify_tree", lambda *a: verify_tree(*a, bug=bug))
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    (eos,) = engine.tokenizer.eos_token_ids
    branched = []

    def p_values(seeds: range) -> tuple[float, float]:
        firsts, seconds, branches = [], {}, 0
        for seed in seeds:
            sampling = SamplingConfig(temperature=2.0, seed=seed)
            events = _gen(
                engine, ids, SpecConfig(k=2, method="draft", tree=tree, adaptive=False), 2, sampling
            )
            toks = _ids(events) + [eos, eos]  # EOS ends the answer without a Token event
            firsts.append(toks[0])
            seconds.setdefault(toks[0], []).append(toks[1])
            branches += sum(e.branch > 0 for e in events if isinstance(e, Round))
        branched.append(branches)
        sampling = SamplingConfig(temperature=2.0)
        top = max(seconds, key=lambda t: len(seconds[t]))
        p_first = _p_value(engine, firsts, ids, sampling)
        return p_first, _p_value(engine, seconds[top], ids + [top], sampling)

    if bug:
        assert p_values(range(N_SEEDS))[0] < 1e-6
    else:
        assert_follows(lambda seeds: min(p_values(seeds)), range(N_SEEDS), tree)
    if tree != "chain":  # second-ranked candidates were accepted: the residual path is exercised
        assert branched[0] > 20


@pytest.fixture(scope="module")
def eagle_pair(tiny_pair, tmp_path_factory):
    from edgespec.loading.load import load_pair
    from tests.helpers.tiny import make_tiny_eagle

    out = make_tiny_eagle(tiny_pair[0], tmp_path_factory.mktemp("eagle") / "eagle", head=150)
    return load_pair(str(tiny_pair[0]), str(out))


@pytest.mark.parametrize(
    "tree,method", [("3,2,1", "draft"), ("dynamic", "draft"), ("2,2", "hybrid")]
)
def test_feature_draft_trees_keep_greedy_output(eagle_pair, tree, method):
    """A feature draft drafts trees from the target's features (trees/eagle_tree.py); two
    answers in a row also check that its state follows the committed context."""
    engine = Engine(*eagle_pair)
    plain = Engine(eagle_pair[0], None)
    for prompt in (PROMPT, "the river and the moon and the river"):
        ids = engine.encode_raw(prompt)
        want = _ids(_gen(plain, ids, SpecConfig(method="none"), 30))
        events = _gen(engine, ids, SpecConfig(k=3, method=method, tree=tree, adaptive=False), 30)
        assert _ids(events) == want
        assert any(e.accepted > 0 for e in events if isinstance(e, Round))
        state = engine._draft
        assert state.kv.offset <= state.n_features <= len(state.context)
        assert state.context[: state.n_features] == (ids + want)[: state.n_features]


def test_feature_draft_tree_samples_like_the_chain_with_a_chain_shape(eagle_pair):
    engine = Engine(*eagle_pair)
    ids = engine.encode_raw(PROMPT)
    sampling = SamplingConfig(temperature=0.9, seed=4)
    chain = _ids(_gen(engine, ids, SpecConfig(k=3, method="draft", adaptive=False), 24, sampling))
    tree = _ids(_gen(engine, ids, SpecConfig(k=3, method="draft", tree="chain"), 24, sampling))
    assert tree == chain


def test_cli_generate_json_reports_tree_rounds(tiny_pair):
    import json

    from tests.helpers.cli import run_edgespec

    target, draft = (str(p) for p in tiny_pair)
    args = ["generate", "the cat", "--raw", "--target", target, "--draft", draft]
    proc = run_edgespec(
        *args,
        "--draft-bits",
        "0",
        "--tree",
        "3,2,1",
        "--no-adaptive",
        "-k",
        "3",
        "--max-tokens",
        "12",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    rounds = [r for r in records if r["type"] == "round"]
    assert rounds and all(r["nodes"] == 6 and r["k"] == 3 and r["method"] == "tree" for r in rounds)
    assert all("branch" in r for r in rounds)
    bad = run_edgespec(*args, "--tree", "3,x", "--max-tokens", "4")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "--tree must be" in bad.stderr


def test_hybrid_tree_adds_lookup_branches_at_a_temperature(tiny_models):
    """An n-gram match adds a branch of deterministic candidates after the draft's sampled
    siblings (exact: tests/unit/test_tree_acceptance.py); the caches stay consistent."""
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(" ".join([PROMPT] * 4))
    sampling = SamplingConfig(temperature=0.3, seed=2)
    events = _gen(
        engine, ids, SpecConfig(k=2, method="hybrid", tree="2,1", adaptive=False), 40, sampling
    )
    rounds = [e for e in events if isinstance(e, Round)]
    assert any(r.match > 0 and r.nodes > 3 for r in rounds)  # lookup nodes beyond the 3 drafted
    target_cached, draft_cached = engine.cached_tokens()
    context = ids + _ids(events)
    assert target_cached == context[: len(target_cached)]
    assert draft_cached == context[: len(draft_cached)]


def test_trees_stop_at_the_context_window(tiny_models):
    """Near the end of the context window shapes (and lookup branches) are cut to fit, and the
    generation ends with "length" like the chain loop's."""
    from types import SimpleNamespace

    target, draft = tiny_models
    ids = Engine(target, draft).encode_raw(" ".join([PROMPT] * 3))
    small = SimpleNamespace(**{**vars(target), "context_window": len(ids) + 9})
    engine = Engine(small, draft)
    plain = _ids(_gen(engine, ids, SpecConfig(method="none"), 40))
    for tree, method in [("3,2,1,1", "draft"), ("2,1", "hybrid"), ("dynamic", "draft")]:
        events = _gen(engine, ids, SpecConfig(k=4, method=method, tree=tree), 40)
        assert _ids(events) == plain and events[-1].reason == "length"
