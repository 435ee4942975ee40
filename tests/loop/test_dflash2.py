"""DFlash2 drafts (edgespec/architectures/dflash2_model.py, drafting/dflash2.py) through the Engine:
a tiny random checkpoint of the published layout (tests/helpers/tiny_dflash2.py) for a tiny qwen3
target.

Greedy output equals plain decoding over 300 tokens (past the draft's 16-token sliding window),
with the checkpoint's own rows and with an "oracle" whose rows are the target's (most drafts
accepted); at T = 1 the emitted tokens follow the target (chi-square on first and second tokens,
and the PIT of whole answers), and planted bugs in the q handed to the ratio test are caught.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.architectures.dflash2_model import DFlash2Model
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.drafting.base import Proposal, no_proposal
from edgespec.drafting.dflash2 import DFlash2Drafter, choose_path, path_scores, walk
from edgespec.loading.load import load_pair
from edgespec.runtime import Engine
from edgespec.sampling import warp
from tests.helpers import PROMPT, chi2_pvalue, gen, plain_ids, rounds_of, token_ids
from tests.helpers.block_models import tiny_qwen3
from tests.helpers.stats import assert_follows
from tests.helpers.tiny_dflash2 import write_dflash2

N_SEEDS = 400


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    root = tmp_path_factory.mktemp("dflash2")
    target = tiny_qwen3(root)
    draft, _ = write_dflash2(target, root / "dflash2")
    return Engine(*load_pair(str(target), str(draft)))


def planted_q(model, hidden, logits, anchor: int, bug: str, sampling) -> mx.array:
    """A wrong q [k, V] for the path choose_path draws: "unary" (the warped logits over the
    candidates, before the selector's edges), "first" (every row's q as if the row before had
    drawn its first candidate, whatever it drew)."""
    ids, scores = path_scores(model, hidden, logits, anchor)
    if bug == "unary":
        rows = warp(mx.take_along_axis(logits, ids, axis=-1), sampling)
    else:
        rows = warp(scores[:, 0], sampling)
    return mx.put_along_axis(mx.zeros((ids.shape[0], model.vocab_size)), ids, rows, axis=-1)


class Oracle(DFlash2Drafter):
    """The checkpoint's forward and selector over the TARGET's rows as logits (row 1 after the
    context, row i after the context and the argmax of the rows before), so many drafts are
    accepted; `bug` (planted_q) hands the ratio test a wrong q."""

    def __init__(self, engine: Engine, sampling: SamplingConfig, bug: str | None = None):
        super().__init__(engine._draft, sampling, engine._vocab)
        self.target, self.bug = engine.target.model, bug

    def rows(self, context: list[int], k: int) -> mx.array:
        seq, rows = list(context), []
        for _ in range(k):
            rows.append(self.target(mx.array(seq)[None])[0, -1])
            seq.append(int(mx.argmax(rows[-1]).item()))
        return mx.stack(rows)

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        hidden = self.state.block_hidden(context, k)
        if hidden is None:
            return no_proposal(self.method)
        model, rows = self.state.block, self.rows(context, int(hidden.shape[0]))
        assert isinstance(model, DFlash2Model)
        tokens, q = choose_path(model, hidden, context[-1], self.sampling, key, logits=rows)
        if self.bug is not None and q is not None:
            q = planted_q(model, hidden, rows, context[-1], self.bug, self.sampling)
        return Proposal(tokens, q, self.method)


def test_greedy_equals_plain_over_300_tokens(engine):
    """The checkpoint's own drafts (K = 7, the block's whole width), and block trees over its
    rows, emit plain decoding's tokens, past the 16-token sliding window."""
    assert isinstance(engine._draft.block, DFlash2Model)
    ids = engine.encode_raw(PROMPT)
    events = gen(engine, ids, SpecConfig(method="block", k=7, adaptive=False), 300)
    assert token_ids(events) == plain_ids(engine, ids, 300)
    assert all(r.drafted == 7 for r in rounds_of(events)[1:])
    other = engine.encode_raw("the river and the moon")
    for spec in (
        SpecConfig(method="block", k=3, adaptive=False),
        SpecConfig(method="block-tree", k=3, adaptive=False),
    ):
        assert token_ids(gen(engine, other, spec, 40)) == plain_ids(engine, other, 40)


def test_the_family_walks_the_selector_for_every_chain_method(engine):
    """The model names the block family's DFlash2 variant (families/block_family.py): its chain
    drafter, alone or behind a lookup, is the selector's walk; its trees are the block family's."""
    from edgespec.drafting.block import BlockDrafter
    from edgespec.families import chain_drafter, family_of
    from edgespec.families.block_family import BLOCK, DFLASH2

    assert family_of(engine._draft) is DFLASH2 and DFLASH2.blocks and DFLASH2.name == "block"
    sampling = SamplingConfig(temperature=1.0)
    for method in ("block", "draft", "hybrid"):
        spec = SpecConfig(method=method, k=3, adaptive=False)
        drafter = chain_drafter(spec, sampling, DFLASH2, engine._draft, engine._vocab, "t")
        model = getattr(drafter, "model", drafter)  # a hybrid's model drafter
        assert type(model) is DFlash2Drafter, method
    plain = BLOCK.drafter(spec, sampling, engine._draft, engine._vocab, "t")
    assert type(plain) is BlockDrafter  # the DFlash family's: rows drawn independently


def test_oracle_drafts_are_accepted_and_greedy_still_equals_plain(engine):
    ids = engine.encode_raw(PROMPT)
    config = GenerationConfig(
        SamplingConfig(temperature=0), SpecConfig(method="block", k=7, adaptive=False), 300
    )
    events = list(engine.generate(ids, config, drafter=Oracle(engine, config.sampling)))
    assert token_ids(events) == plain_ids(engine, ids, 300)
    rounds = rounds_of(events)
    assert sum(r.accepted for r in rounds) > sum(r.drafted for r in rounds) / 2


def test_the_walk_follows_the_edges():
    """walk: argmax of each step's row given the step before; sampled: inverse CDF per row."""
    scores = np.zeros((2, 2, 2), dtype=np.float32)
    scores[0, :] = [0.2, 0.8]
    scores[1, 1] = [0.9, 0.1]
    scores[1, 0] = [0.1, 0.9]
    assert walk(scores, None) == [1, 0]
    assert walk(scores, np.array([0.1, 0.95], dtype=np.float32)) == [0, 1]
    assert walk(scores, np.array([0.5, 0.5], dtype=np.float32)) == [1, 0]


def _draw_p_value(engine: Engine, seeds: range, bug: str | None = None) -> float:
    """Chi-square p-value that choose_path's tokens were drawn from the q it hands over (or a
    planted q): first tokens against q_1, second tokens after the commonest first token against
    that path's q_2. Cheap: one block forward, then only the walk per seed."""
    ids = engine.encode_raw(PROMPT)
    gen(engine, ids, SpecConfig(method="block", k=3, adaptive=False), 4)
    state, sampling = engine._draft, SamplingConfig(temperature=1.0)
    model, anchor = state.block, state.context[-1]
    hidden = state.block_hidden(state.context, 2)
    firsts, seconds, rows = [], {}, {}
    wrong = bug and planted_q(model, hidden, model.logits(hidden), anchor, bug, sampling)
    for seed in seeds:
        tokens, q = choose_path(model, hidden, anchor, sampling, mx.random.key(seed))
        q = wrong if bug else q
        first, second = tokens.tolist()
        firsts.append(first)
        seconds.setdefault(first, []).append(second)
        rows[first] = np.array(q)
    top = max(seconds, key=lambda t: len(seconds[t]))
    p1 = chi2_pvalue(firsts, rows[top][0], min_samples=len(seeds))
    return min(p1, chi2_pvalue(seconds[top], rows[top][1], min_samples=200))


def test_drafted_tokens_follow_the_q_handed_over(engine):
    assert_follows(lambda seeds: _draw_p_value(engine, seeds), range(3000), "the walk's q")


@pytest.mark.parametrize("bug", ["unary", "first"])
def test_a_q_other_than_the_walks_is_caught(engine, bug):
    assert _draw_p_value(engine, range(3000), bug) < 1e-3


def _pit_p_value(engine: Engine, seeds: range, bug: str | None = None, n: int = 30) -> float:
    """KS p-value of the PIT values (tests/helpers/arch_models.py pit_values) of whole answers
    at T = 1 drafted by the Oracle (K = 3): every token must follow the target."""
    from scipy.stats import kstest

    from tests.helpers.arch_models import pit_values

    ids = engine.encode_raw(PROMPT)
    rng, values = np.random.default_rng(seeds.start), []
    for seed in seeds:
        sampling = SamplingConfig(temperature=1.0, seed=seed)
        config = GenerationConfig(sampling, SpecConfig(method="block", k=3, adaptive=False), n)
        events = list(engine.generate(ids, config, drafter=Oracle(engine, sampling, bug)))
        values.append(pit_values(engine, ids, token_ids(events), sampling, rng))
    return float(kstest(np.concatenate(values), "uniform").pvalue)


def test_whole_sampled_answers_follow_the_target(engine):
    """Many rounds per answer, past the sliding window, the caches rewound after every
    rejection, many drafts accepted: the PIT values are uniform (KS)."""
    assert_follows(lambda seeds: _pit_p_value(engine, seeds), range(12), "whole answers")


def test_the_unary_q_is_caught_in_whole_answers(engine):
    """The planted bug of a selector ignored by the ratio test: q the logits' own rows."""
    assert _pit_p_value(engine, range(16), "unary") < 1e-3


def test_greedy_q_is_none_and_sampled_q_rows_are_distributions(engine):
    ids = engine.encode_raw(PROMPT)
    gen(engine, ids, SpecConfig(method="block", k=3, adaptive=False), 4)
    state = engine._draft
    hidden = state.block_hidden(state.context, 5)
    key = mx.random.key(3)
    tokens, q = choose_path(state.block, hidden, state.context[-1], SamplingConfig(0.0), key)
    assert q is None and tokens.shape == (5,)
    tokens, q = choose_path(state.block, hidden, state.context[-1], SamplingConfig(1.0), key)
    assert q is not None and np.allclose(np.array(q.sum(-1)), 1.0, atol=1e-5)
    picked = np.array(q)[np.arange(5), np.array(tokens)]
    assert (picked > 0).all() and (np.array(q) > 0).sum(-1).max() <= 16
