"""Block drafts (edgespec/drafting/block.py, trees/block_tree.py) through the Engine: a tiny
random DFlash-format draft (tests/helpers/block_models.py) for a tiny qwen3 target.

Greedy output equals plain decoding (fixed K, K past the block, adaptive K, trees fixed and
dynamic, a second prompt reusing the caches); the draft's cached context gives the same block as a
cache-free forward; at T = 0.7 and 1.0 the emitted tokens follow the target (chi-square), with the
random draft and with an "oracle" block whose rows are the target's own (so drafts are accepted
and both positions' tests run), and planted bugs in the reported q are caught.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.drafting.base import Proposal, no_proposal
from edgespec.drafting.block import BlockDrafter, BlockState
from edgespec.errors import ConfigError
from edgespec.loading.load import load_pair
from edgespec.runtime import Engine
from edgespec.sampling import sample, uniforms, warp
from tests.helpers import (
    GREEDY,
    PROMPT,
    ask,
    chi2_pvalue,
    gen,
    plain_ids,
    rounds_of,
    target_probs,
    token_ids,
)
from tests.helpers.block_models import tiny_qwen3, write_dflash
from tests.helpers.stats import assert_follows


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    root = tmp_path_factory.mktemp("block_draft")
    target = tiny_qwen3(root)
    t, d = load_pair(str(target), str(write_dflash(target, root / "dflash", block=4)))
    return Engine(t, d)


SPECS = [
    SpecConfig(method="block", k=1, adaptive=False),
    SpecConfig(method="block", k=3, adaptive=False),
    SpecConfig(method="block", k=8, adaptive=False),  # capped at block_size - 1 = 3
    SpecConfig(method="block", k=2, adaptive=True),
    # a block draft drafts as a block whatever the method
    SpecConfig(method="draft", k=3, adaptive=False),
    SpecConfig(method="block-tree", k=3, adaptive=False),  # dynamic: best-first under a node budget
    SpecConfig(method="block", k=3, tree="3,2,1"),
    SpecConfig(method="block-tree", k=5, tree="2,2,1,1,1"),  # deeper than the block: cut
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.method}-{s.k}-{s.tree}-{s.adaptive}")
def test_greedy_equals_plain(engine, spec):
    for prompt in (PROMPT, "the river and the moon", PROMPT + " again"):
        ids = engine.encode_raw(prompt)
        events = gen(engine, ids, spec, 24)
        assert token_ids(events) == plain_ids(engine, ids, 24)
        rounds = rounds_of(events)
        assert any(r.drafted > 0 for r in rounds)
        if not spec.tree:
            assert all(r.drafted <= min(spec.k_max, 3) for r in rounds)
        state = engine._draft
        assert state.kv.offset <= state.n_features <= len(state.context)


def test_a_method_block_needs_a_block_draft(tiny_pair):
    other = Engine.load(target=str(tiny_pair[0]), draft=str(tiny_pair[1]))
    for method in ("block", "block-tree"):
        with pytest.raises(ConfigError, match="block draft"):
            gen(other, other.encode_raw(PROMPT), SpecConfig(method=method, adaptive=False), 4)


def test_cached_context_matches_a_cache_free_block(engine):
    """After a generation the draft's cache plus the features it lacks give the same block as
    one cache-free forward over every known feature."""
    ids = engine.encode_raw(PROMPT)
    events = gen(engine, ids, SpecConfig(method="block", k=3, adaptive=False), 20)
    context = ids + token_ids(events)
    state: BlockState = engine._draft
    model = state.block
    assert state.n_features == len(context) - 1 and state.context == context
    cached = state.block_logits(context, 3)
    toks = mx.array([[context[-1]] + [model.args.mask_token_id] * 3], dtype=mx.int32)
    free = model.logits(model(toks, state.features[None])[0, 1:])
    assert mx.allclose(cached, free, atol=1e-4).item()
    assert state.kv.offset == len(context) - 1


# ---------------------------------------------------------------------------- T > 0

N_SEEDS = 400


class Oracle(BlockDrafter):
    """The real drafter's forward (the cache advances as usual), its rows replaced by the
    target's: row 1 the target's logits after the context, row i after the context and the
    argmax of the rows before (a block: q_i does not depend on the tokens drawn). `bug` plants
    an error: "argmax" (tokens the argmax of each row at T > 0, q reported as if sampled),
    "shifted" (token i drawn from row i + 1, an off-by-one between tokens and q)."""

    def __init__(self, engine: Engine, sampling: SamplingConfig, bug: str | None = None):
        super().__init__(engine._draft, sampling, engine._vocab)
        self.target, self.bug = engine.target.model, bug

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        if self.state.block_logits(context, k) is None:
            return no_proposal()
        seq, rows = list(context), []
        for _ in range(k + 1):
            rows.append(self.target(mx.array(seq)[None])[0, -1])
            seq.append(int(mx.argmax(rows[-1]).item()))
        q = warp(mx.stack(rows), self.sampling)
        tokens = sample(q[1:] if self.bug == "shifted" else q[:k], uniforms(key, k))
        if self.bug == "argmax":
            tokens = mx.argmax(q[:k], axis=-1).astype(mx.int32)
        return Proposal(tokens, q[:k])


def _samples(engine: Engine, temp: float, drafter_for=None, spec=None, seeds=range(N_SEEDS)):
    """First tokens, and second tokens by first token, over two-token generations, one per
    seed."""
    spec = spec or SpecConfig(method="block", k=2, adaptive=False)
    ids = engine.encode_raw(PROMPT)
    firsts, seconds, accepted = [], {}, 0
    for seed in seeds:
        sampling = SamplingConfig(temperature=temp, seed=seed)
        drafter = drafter_for(sampling) if drafter_for else None
        config = GenerationConfig(sampling, spec, max_tokens=2)
        events = list(engine.generate(ids, config, drafter=drafter))
        toks = token_ids(events)
        firsts.append(toks[0])
        seconds.setdefault(toks[0], []).append(toks[1])
        accepted += rounds_of(events)[0].accepted
    return ids, firsts, seconds, accepted


def _check(engine, ids, firsts, seconds, temp) -> tuple[float, float]:
    sampling = SamplingConfig(temperature=temp)
    model = engine.target.model
    p1 = chi2_pvalue(firsts, target_probs(model, ids, sampling), min_samples=N_SEEDS)
    top = max(seconds, key=lambda t: len(seconds[t]))
    p = target_probs(model, ids + [top], sampling)
    return p1, chi2_pvalue(seconds[top], p, min_samples=60)


def _follows(engine: Engine, temp: float, drafter_for=None, spec=None) -> int:
    """_check's first and second tokens, judged by the two-stage rule (tests/helpers/stats.py);
    returns how many drafts stage one accepted."""
    accepted = []

    def p_value(seeds: range) -> float:
        ids, firsts, seconds, n = _samples(engine, temp, drafter_for, spec, seeds)
        accepted.append(n)
        return min(_check(engine, ids, firsts, seconds, temp))

    assert_follows(p_value, range(N_SEEDS), f"T = {temp}")
    return accepted[0]


@pytest.mark.parametrize("temp", [0.7, 1.0])
def test_sampled_tokens_follow_the_target(engine, temp):
    _follows(engine, temp)


@pytest.mark.parametrize("temp", [0.7, 1.0])
def test_accepted_block_tokens_follow_the_target(engine, temp):
    accepted = _follows(engine, temp, lambda s: Oracle(engine, s))
    assert accepted > N_SEEDS  # most first drafts and many second ones were accepted


@pytest.mark.parametrize("bug, temp", [("argmax", 1.0), ("shifted", 0.7)])
def test_planted_bugs_are_caught(engine, bug, temp):
    ids, firsts, seconds, _ = _samples(engine, temp, lambda s: Oracle(engine, s, bug))
    assert min(_check(engine, ids, firsts, seconds, temp)) < 1e-3


@pytest.mark.parametrize("tree, temp", [("3,2", 1.0), ("dynamic", 0.7)])
def test_block_tree_samples_follow_the_target(engine, tree, temp):
    _follows(engine, temp, spec=SpecConfig(method="block-tree", k=2, tree=tree))


def test_draws_follow_each_row():
    """draw_block: token i is the inverse-CDF sample of q_i at u_i (worked example)."""
    from edgespec.drafting.block import draw_block

    logits = mx.log(mx.array([[0.7, 0.3], [0.2, 0.8]]))
    key = mx.random.key(0)
    toks, q = draw_block(logits, SamplingConfig(temperature=1.0), key)
    u = np.array(uniforms(key, 2))
    want = [int(u[0] >= 0.7), int(u[1] >= 0.2)]
    assert toks.tolist() == want and np.allclose(np.array(q), [[0.7, 0.3], [0.2, 0.8]])
    greedy, none = draw_block(logits, SamplingConfig(temperature=0), key)
    assert greedy.tolist() == [0, 1] and none is None


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_other_target_families_greedy_equals_plain(tmp_path, family):
    """A llama target (no q/k norms of its own) and Qwen3.5 (a multimodal wrapper whose gated
    delta-net layers are restored, not trimmed, after rejections) drafted by a block draft."""
    from tests.helpers.tiny_arch import make_family

    target, _ = make_family(tmp_path / family, family)
    t, d = load_pair(str(target), str(write_dflash(target, tmp_path / "dflash")))
    engine = Engine(t, d)
    ids = engine.encode_raw(PROMPT)
    events = gen(engine, ids, SpecConfig(method="block", k=3, adaptive=False), 20)
    assert token_ids(events) == plain_ids(engine, ids, 20)
    assert any(r.drafted == 3 for r in rounds_of(events))


def test_adaptive_k_counts_a_block_round_as_one_draft_forward():
    """A block round's draft time is one forward whatever K: adaptive K counts it per round, so
    where the same timings counted per drafted token keep K short, a block draft drafts long."""
    from edgespec.drafting.adaptive import AdaptiveK
    from edgespec.events import Round

    per_token, per_round = AdaptiveK(4, 8), AdaptiveK(4, 8)
    for i in range(20):  # 6 of 8 accepted, a dear draft forward, a cheap verify
        kd = ask(per_token, Round(i, 8, 6, 8, 0.2, 0.1 + 0.005 * 9, "draft"))
        kb = ask(per_round, Round(i, 8, 6, 8, 0.2, 0.1 + 0.005 * 9, "block"))
    assert per_round.estimates["block"].draft_cost == pytest.approx(0.2)
    assert per_token.estimates["draft"].draft_cost == pytest.approx(0.2 / 8)
    assert kb == 6 and kd < kb  # position 7 was never accepted: drafting it does not pay


def test_a_block_round_costs_what_was_measured_at_its_k():
    """The draft forward's cost per K (on a CPU the head over the vocabulary grows with K):
    measured K as measured, a line between and beyond."""
    from edgespec.drafting.adaptive import AdaptiveK
    from edgespec.events import Round

    policy = AdaptiveK(4, 8)
    for i in range(6):
        ask(policy, Round(2 * i, 2, 1, 2, 0.05, 0.11, "block"))
        ask(policy, Round(2 * i + 1, 8, 1, 8, 0.2, 0.14, "block"))
    cost = policy.estimates["block"].round_cost()
    assert [round(cost(k), 4) for k in (2, 4, 8, 10)] == [0.05, 0.1, 0.2, 0.25]


def test_adaptive_k_for_a_block_uses_its_acceptance_per_position():
    """Position 1 always accepted, position 2 never: a single alpha (0.5) promises more from
    longer blocks; per position, K = 1 is the best a cheap block draft can do."""
    from edgespec.drafting.adaptive import AdaptiveK
    from edgespec.events import Round

    policy = AdaptiveK(4, 8)
    for i in range(20):
        k = ask(policy, Round(i, 4, 1, 4, 0.02, 0.12, "block"))
    est = policy.estimates["block"]
    assert est.alpha == pytest.approx(0.5, abs=0.05)
    assert est.expected(1) > 1.8 and est.expected(4) - est.expected(1) < 0.2
    assert k == 1


def test_a_catalogue_pair_with_a_hub_block_draft(offline_hub, tmp_path):
    """A pair whose draft is a repo id of a DFlash draft (no tokenizer of its own, as z-lab's):
    resolved from the hub cache, loaded as a block draft, greedy equal to plain."""
    from edgespec.loading import specs as catalog
    from tests.helpers.hub import make_hub_cache

    target = tiny_qwen3(tmp_path / "src")
    draft = write_dflash(target, tmp_path / "src" / "dflash")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (draft / name).unlink(missing_ok=True)
    make_hub_cache(offline_hub, "mlx-community/Tiny-Qwen3-4bit", target)
    make_hub_cache(offline_hub, "z-lab/Tiny-Qwen3-DFlash", draft)
    pairs = {
        "tiny-dflash": {
            "target": "mlx-community/Tiny-Qwen3-4bit",
            "draft": "z-lab/Tiny-Qwen3-DFlash",
            "platform": "mac",
        }
    }
    cat = catalog.parse_catalog({"default_pair": "tiny-dflash", "pairs": pairs}, tmp_path)
    t, d = load_pair(pair="tiny-dflash", catalog=cat)
    assert d is not None and type(d.model).__name__ == "BlockModel"
    engine = Engine(t, d)
    ids = engine.encode_raw(PROMPT)
    events = gen(engine, ids, SpecConfig(method="block", k=3, adaptive=False), 16)
    assert token_ids(events) == plain_ids(engine, ids, 16)


def test_a_stop_mid_answer_then_a_new_prompt(engine):
    """The consumer stops a block generation after a few events: the caches stay consistent and
    the next prompt (sharing the first one's opening) still decodes exactly."""
    ids = engine.encode_raw(PROMPT)
    config = GenerationConfig(
        SamplingConfig(temperature=0), SpecConfig(method="block", k=3, adaptive=False), 30
    )
    stream = engine.generate(ids, config)
    for _ in range(5):
        next(stream)
    stream.close()
    state = engine._draft
    assert state.kv.offset <= state.n_features <= len(state.context)
    other = engine.encode_raw(PROMPT + " and the river")
    events = gen(engine, other, SpecConfig(method="block", k=3, adaptive=False), 20)
    assert token_ids(events) == plain_ids(engine, other, 20)


def _pit_p_value(engine: Engine, spec: SpecConfig, drafter_for=None, seeds=range(12), n=40):
    """KS p-value of the PIT values (tests/helpers/arch_models.py pit_values) of whole sampled
    answers (T = 1): every token, over many rounds, must follow the target given what came
    before."""
    from scipy.stats import kstest

    from tests.helpers.arch_models import pit_values

    ids = engine.encode_raw(PROMPT)
    rng, values, accepted = np.random.default_rng(7), [], 0
    for seed in seeds:
        sampling = SamplingConfig(temperature=1.0, seed=seed)
        drafter = drafter_for(sampling) if drafter_for else None
        events = list(engine.generate(ids, GenerationConfig(sampling, spec, n), drafter=drafter))
        tokens = token_ids(events)
        accepted += sum(r.accepted for r in rounds_of(events))
        values.append(pit_values(engine, ids, tokens, sampling, rng))
    return float(kstest(np.concatenate(values), "uniform").pvalue), accepted


@pytest.mark.parametrize("method", ["block", "block-tree", "oracle", "oracle-argmax"])
def test_whole_sampled_answers_follow_the_target(engine, method):
    """Many rounds per answer, the caches rewound after every rejection: the PIT values of the
    answers are uniform, with the random draft and with the target's rows as the block (most
    drafts accepted); argmax tokens reported as sampled are caught."""
    spec = SpecConfig(
        method="block-tree" if method == "block-tree" else "block", k=3, adaptive=False
    )

    def drafter_for(sampling: SamplingConfig) -> Oracle:
        return Oracle(engine, sampling, "argmax" if method == "oracle-argmax" else None)

    if method == "oracle-argmax":
        assert _pit_p_value(engine, spec, drafter_for)[0] < 1e-3
        return
    accepted = []

    def p_value(seeds: range) -> float:
        value, n = _pit_p_value(engine, spec, drafter_for if method == "oracle" else None, seeds)
        accepted.append(n)
        return value

    assert_follows(p_value, range(12), method)
    assert method != "oracle" or accepted[0] > 120


def _chain_and_tree_equal_plain(engine, prompts=(PROMPT, "the river and the moon")) -> None:
    """Greedy block chain and block tree (K = 3) emit plain decoding's 20 tokens, drafting."""
    for prompt in prompts:
        ids = engine.encode_raw(prompt)
        for spec in (
            SpecConfig(method="block", k=3, adaptive=False),
            SpecConfig(method="block-tree", k=3, adaptive=False),
        ):
            events = gen(engine, ids, spec, 20)
            assert token_ids(events) == plain_ids(engine, ids, 20)
            assert any(r.drafted > 0 for r in rounds_of(events))


def test_a_draft_that_reads_the_newest_context_stays_exact(tmp_path):
    """An `input_context` draft (each block row also reads the context of the position before
    the anchor) drafts other tokens than without it, and greedy output still equals plain."""
    target = tiny_qwen3(tmp_path)
    with_ctx = write_dflash(target, tmp_path / "ctx", block=4, input_context=True)
    engine = Engine(*load_pair(str(target), str(with_ctx)))
    state = engine._draft
    assert "ctx_in" in state.block
    _chain_and_tree_equal_plain(engine)
    ids = engine.encode_raw(PROMPT)
    gen(engine, ids, SpecConfig(method="block", k=3, adaptive=False), 8)
    context = state.context
    rows = state.block_logits(context, 3)
    state.block.ctx_in.weight = mx.zeros_like(state.block.ctx_in.weight)
    assert not mx.allclose(rows, state.block_logits(context, 3)).item()


def test_a_reduced_head_scores_its_tokens_alone_and_stays_exact(tmp_path):
    """A draft that scores only head_ids (edgespec/architectures/block_head.py): its logits are the
    full head's on those ids and -inf elsewhere; greedy output equals plain; sampled first
    tokens follow the target at T = 1, though most tokens can never be drafted."""
    from edgespec.architectures.block_model import load_block

    target = tiny_qwen3(tmp_path)
    full = write_dflash(target, tmp_path / "full", block=4)
    reduced = write_dflash(target, tmp_path / "reduced", block=4, head_size=48)
    engine = Engine(*load_pair(str(target), str(reduced)))
    block = engine._draft.block
    ids = np.array(block.head_ids)
    whole, _ = load_block(full, engine.target.model)
    h = mx.random.normal((3, 64))
    got, want = np.array(block.logits(h)), np.array(whole.logits(h))
    off = np.setdiff1d(np.arange(got.shape[-1]), ids)
    assert np.allclose(got[:, ids], want[:, ids], atol=1e-5) and np.isneginf(got[:, off]).all()
    for prompt in (PROMPT, "the river and the moon"):
        _chain_and_tree_equal_plain(engine, (prompt,))
        rows = engine._draft.block_logits(engine._draft.context, 3)
        assert set(np.argmax(np.array(rows), -1).tolist()) <= set(ids.tolist())
    _follows(engine, 1.0)


def test_head_rows_of_a_quantized_head_are_its_dequantized_rows():
    from edgespec.architectures.block_head import head_rows

    lin = nn.Linear(64, 96, bias=False)
    q = nn.QuantizedLinear.from_linear(lin, group_size=32, bits=4)
    ids = mx.array([3, 0, 95], dtype=mx.int32)
    dense = mx.dequantize(q.weight, q.scales, q.biases, 32, 4)
    assert mx.allclose(head_rows(q, ids), dense[ids]).item()
    assert mx.allclose(head_rows(lin, ids), lin.weight[ids]).item()


@pytest.mark.parametrize(
    ("block", "method", "k_max", "bound"),
    [
        (16, "block", None, 15),  # a b16 draft: its block, not the default 8
        (16, "hybrid", None, 15),  # a block draft behind the lookup too
        (16, "block", 6, 6),  # an explicit bound is the user's
        (4, "block", None, 3),
    ],
)
def test_adaptive_k_of_a_block_draft_is_bound_by_its_block(tmp_path, block, method, k_max, bound):
    """A block draft fills block_size - 1 positions in one forward, as it was trained: the
    adaptive policy chooses K within that, by measured cost; greedy output stays plain's."""
    target = tiny_qwen3(tmp_path)
    t, d = load_pair(str(target), str(write_dflash(target, tmp_path / "dflash", block=block)))
    engine = Engine(t, d)
    spec = SpecConfig(method=method, k=4, adaptive=True, **({"k_max": k_max} if k_max else {}))
    strategy = engine.factory.build(spec, GREEDY, engine._target, engine._draft)
    assert strategy.policy.k_max == bound
    ids = engine.encode_raw(PROMPT)
    assert token_ids(gen(engine, ids, spec, 24)) == plain_ids(engine, ids, 24)
