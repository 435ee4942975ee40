"""The draft-verify loop: greedy speculative == plain decoding, self-draft, seeds."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from edgespec.config import SamplingConfig, SpecConfig
from edgespec.cpu.pairs import PairedSteps
from edgespec.device import for_device
from edgespec.drafting.adaptive import FixedK
from edgespec.drafting.token import DraftSteps, ModelDrafter
from edgespec.events import Token
from edgespec.loop import Chains, speculate
from edgespec.rounds import Limits
from tests.helpers import GREEDY, PROMPT, engine_state, gen, plain_ids, rounds_of, token_ids


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_speculative_equals_plain_decoding(engine, k):
    ids = engine.encode_raw(PROMPT)
    plain = plain_ids(engine, ids, 48)
    engine.reset()
    spec = gen(engine, ids, SpecConfig(k=k, method="draft", adaptive=False), 48)
    assert token_ids(spec) == plain
    assert len(plain) == 48


@pytest.mark.parametrize("k", [1, 3, 8])
def test_self_draft_accepts_every_token_and_ends_rounds_with_a_bonus(self_engine, k):
    engine = self_engine
    events = gen(
        engine,
        engine.encode_raw(PROMPT),
        SpecConfig(k=k, method="draft", adaptive=False),
        5 * (k + 1),
    )
    rounds = rounds_of(events)
    assert rounds and all(r.accepted == r.drafted == k for r in rounds)
    kinds = [e.kind for e in events if isinstance(e, Token)]
    assert kinds == (["accepted"] * k + ["bonus"]) * 5
    assert events[-1].stats.acceptance == 1.0 and events[-1].stats.tau == k + 1


def test_same_seed_same_tokens_other_seed_other_tokens(engine):
    ids = engine.encode_raw(PROMPT)
    a, b, c = (
        token_ids(
            gen(
                engine,
                ids,
                SpecConfig(k=4, method="draft", adaptive=False),
                32,
                SamplingConfig(1.0, seed=s),
            )
        )
        for s in (5, 5, 6)
    )
    assert a == b and a != c


def test_sampled_self_draft_accepts_almost_everything(self_engine):
    """p == q at temperature > 0: the ratio test passes (float noise aside)."""
    engine = self_engine
    events = gen(
        engine,
        engine.encode_raw(PROMPT),
        SpecConfig(k=4, method="draft", adaptive=False),
        60,
        SamplingConfig(1.0, seed=3),
    )
    assert events[-1].stats.acceptance > 0.97


def test_a_round_builds_the_verify_before_waiting_for_the_draft(tiny_models, monkeypatch):
    """One host sync per round, after the target's verify graph is built on the lazy drafts: on
    a GPU the draft computes while the host builds the verify (no idle device in between)."""
    (target, draft), log = tiny_models, []
    t_state, d_state = engine_state(target.model, "target"), engine_state(draft.model, "draft")
    draft_steps = for_device().draft_steps  # (building a backend may evaluate: not logged)
    for state, name in ((t_state, "verify"), (d_state, "draft")):
        forward = state.forward
        monkeypatch.setattr(
            state, "forward", lambda *a, _f=forward, _n=name, **k: log.append(_n) or _f(*a, **k)
        )
    real_eval = mx.eval
    monkeypatch.setattr(mx, "eval", lambda *a: log.append("sync") or real_eval(*a))
    prompt = list(range(3, 20))
    t_state.prefill(prompt)
    d_state.prefill(prompt)
    log.clear()
    vocab = int(target.model.args.vocab_size)
    drafter = ModelDrafter(d_state, GREEDY, vocab, draft_steps)
    limits = Limits(12, frozenset(), 512)
    chains = Chains(t_state, drafter, GREEDY)
    steps = list(speculate(t_state, chains, drafter, prompt, GREEDY, FixedK(2), limits))
    rounds = " ".join(log).split("verify")  # what happened before each verify, and after the last
    assert len(rounds) - 1 == len(steps) >= 4
    assert rounds[0].split() == ["draft", "draft"]  # the first round waits for nothing
    assert all(r.split() == ["sync", "draft", "draft"] for r in rounds[1:-1]), log
    assert rounds[-1].split() == ["sync"]
    assert all(s.round.t_draft > 0 and s.round.t_verify > 0 for s in steps)


def test_draft_steps_run_in_pairs_on_the_cpu(tiny_models, monkeypatch):
    """On the CPU every draft forward runs two positions: a step with one new token runs the
    newest cached position again beside it (edgespec/cpu/pairs.py; one-row products are the slow
    ones under MKL). The default DraftSteps run one. Same proposals, same q up to rounding, and
    the draft's cache holds the same positions afterwards, across rounds."""
    target, draft = tiny_models
    vocab = int(target.model.args.vocab_size)
    prompt = list(range(3, 20))
    seen = {}
    for pairs in ("1", "0"):
        steps = PairedSteps() if pairs == "1" else DraftSteps()
        state = engine_state(draft.model, "draft")
        state.prefill(prompt)  # holds prompt[:-1]: one token pending
        lengths: list[int] = []
        forward = state.forward

        def counted(inputs, _f=forward, _log=lengths, **kw):
            _log.append(int(inputs.shape[0]))
            return _f(inputs, **kw)

        monkeypatch.setattr(state, "forward", counted)
        context, out = list(prompt), []
        for i, cfg in enumerate([SamplingConfig(temperature=0), SamplingConfig(1.0)] * 2):
            drafter = ModelDrafter(state, cfg, vocab, steps)
            prop = drafter.propose(context, 3, mx.random.key(i))
            tokens = [int(t) for t in prop.tokens.tolist()]
            assert state.offset == len(context) + 2  # context and x_1, x_2 (x_3 never fed)
            out.append((tokens, None if prop.q is None else np.array(prop.q)))
            # all 3 and a bonus (2 tokens pending next), or 1 and a correction (1 pending)
            held = len(context) + 2
            context += tokens + [7] if i % 2 == 0 else tokens[:1] + [5]
            drafter.commit(context)
            assert state.offset == min(held, len(context) - 1)
            assert state.tokens == context[: state.offset]
        seen[pairs] = (lengths, out)
    assert seen["1"][0] == [2] * 12
    assert seen["0"][0] == [1, 1, 1, 2, 1, 1, 1, 1, 1, 2, 1, 1]  # 2 pending after a bonus
    for (tok_a, q_a), (tok_b, q_b) in zip(seen["1"][1], seen["0"][1], strict=True):
        assert tok_a == tok_b
        if q_a is not None:
            np.testing.assert_allclose(q_a, q_b, rtol=1e-4, atol=1e-6)
