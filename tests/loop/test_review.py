"""Reviews (edgespec/acceptance.py, reviews): while adaptive K has the draft model off, its acceptance
is read from plain steps (min(1, q(x) / p(x)) at the sampled token, or whether its argmax is the
token at T = 0) instead of probe rounds. The values estimate the acceptance without bias, a
draft model reviews exactly what a fresh forward over the context gives, a hybrid's lookups are
reviewed by their guesses, the policy comes back on reviews alone (no probe rounds), and the
loop stays exact with them."""

from __future__ import annotations

import dataclasses
import math

import mlx.core as mx
import numpy as np
import pytest

from edgespec.acceptance import Review, review_values
from edgespec.config import SamplingConfig, SpecConfig
from edgespec.drafting import adaptive
from edgespec.drafting.adaptive import REVIEW_EVERY, REVIEW_MOST, AdaptiveK
from edgespec.drafting.ngram import NgramIndex
from edgespec.drafting.token import ModelDrafter
from edgespec.events import Round
from edgespec.trees.fallback import FallbackTree
from tests.helpers import PROMPT, ask, engine_state, gen, plain_ids, rounds_of, token_ids

T1 = SamplingConfig(temperature=1.0)
GREEDY = SamplingConfig(temperature=0)


def test_review_values_estimate_the_acceptance_without_bias():
    """x ~ p: the mean of min(1, q(x) / p(x)) is sum min(p, q), what a draft from q is accepted
    with; and it varies less than a probe's accepted-or-not. 4 sigma."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6)).astype(np.float32)
    q = rng.dirichlet(np.ones(6)).astype(np.float32)
    n = 20_000
    x = rng.choice(6, size=n, p=p / p.sum())
    logits = mx.broadcast_to(mx.log(mx.array(q)), (n, 6))
    values = np.array(review_values(logits, x.tolist(), p[x].tolist(), T1))
    alpha = float(np.minimum(p, q).sum())
    assert abs(values.mean() - alpha) < 4 * values.std() / math.sqrt(n)
    assert values.var() < alpha * (1 - alpha)
    assert values.min() >= 0 and values.max() <= 1


def test_review_values_at_t0_say_whether_the_drafts_argmax_is_the_token():
    logits = mx.array([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    assert np.array(review_values(logits, [1, 2], None, GREEDY)).tolist() == [1.0, 0.0]


def test_a_reduced_head_reviews_its_own_columns_and_zero_outside():
    head = np.array([3, 5, 9])  # a reduced head's sorted token ids: column i is token head[i]
    logits = mx.array([[0.0, 2.0, 1.0], [0.0, 2.0, 1.0], [0.0, 2.0, 1.0]])
    assert np.array(review_values(logits, [5, 9, 4], None, GREEDY, head=head)).tolist() == [
        1.0,
        0.0,
        0.0,
    ]
    q = np.exp([0.0, 2.0, 1.0]) / np.exp([0.0, 2.0, 1.0]).sum()
    got = np.array(review_values(logits, [5, 9, 4], [0.5, 0.1, 0.2], T1, head=head))
    assert got == pytest.approx([min(1.0, q[1] / 0.5), min(1.0, q[2] / 0.1), 0.0], rel=1e-5)


def _softmax(row: np.ndarray) -> np.ndarray:
    e = np.exp(row - row.max())
    return e / e.sum()


@pytest.mark.parametrize("sampling", [GREEDY, T1], ids=["t0", "t1"])
def test_a_draft_model_reviews_what_a_fresh_forward_gives(tiny_models, sampling):
    """The draft holds a prefix; the tokens after it are reviewed from one catch-up forward:
    each value is what the draft's distribution over the whole context, computed afresh, gives
    at that position; at T > 0 only positions with a target probability; the draft then holds
    context[:-1]."""
    target, draft = tiny_models
    context = target.tokenizer.encode(PROMPT)
    state = engine_state(draft.model, "draft")
    vocab = int(target.model(mx.array([context[:1]]))[0, -1].shape[-1])
    drafter = ModelDrafter(state, sampling, vocab)
    state.prefill(context[:6])  # holds context[:5]
    probs = {j: 0.25 + 0.05 * (j % 3) for j in range(6, len(context)) if j % 2 == 0}
    review = drafter.review(context, probs)
    assert review is not None
    got = review.done()
    assert state.offset == len(context) - 1 and state.tokens == context[:-1]
    fresh = np.array(draft.model(mx.array([context]))[0].astype(mx.float32))
    want = []
    for j in range(6, len(context)):
        row = fresh[j - 1]
        if sampling.greedy:
            want.append(float(int(np.argmax(row)) == context[j]))
        elif j in probs:
            want.append(min(1.0, float(_softmax(row)[context[j]]) / probs[j]))
    assert got.method == "draft" and len(got.values) == len(want)
    assert got.values == pytest.approx(want, abs=1e-4)
    assert drafter.review(context, probs) is None  # nothing new since


def _round(i: int, drafted: int, accepted: int, t_draft: float, t_verify: float) -> Round:
    return Round(i, drafted, accepted, drafted, t_draft, t_verify, "draft")


def _reviewing() -> AdaptiveK:
    policy = AdaptiveK(4, 8)
    policy.review_on()
    return policy


def test_with_reviews_a_losing_draft_goes_off_with_no_probe_and_reviews_bring_it_back():
    policy = _reviewing()
    k = ask(policy, None)
    for i in range(12):  # a draft never accepted: off within a few rounds
        k = ask(policy, _round(i, k, 0, 0.02 * k, 0.1 if k == 0 else 0.1 + 0.02 * k))
    assert k == 0
    due = []
    for i in range(12, 200):  # plain steps: no probe round; reviews, the gap doubling
        k = ask(policy, _round(i, 0, 0, 0.0, 0.1))
        assert k == 0
        due.append(policy.review_due())
    gaps = np.diff(np.flatnonzero(due)).tolist()
    assert gaps[:3] == [2 * REVIEW_EVERY, 4 * REVIEW_EVERY, REVIEW_MOST] and gaps[-1] == REVIEW_MOST
    policy.review(Review("draft", (1.0,) * REVIEW_EVERY))  # the draft now agrees everywhere
    assert ask(policy, _round(76, 0, 0, 0.0, 0.1)) > 0


@pytest.mark.parametrize("step,reviews", [(0.002, True), (0.06, False)], ids=["cheap", "dear"])
def test_a_review_runs_only_where_it_costs_a_small_share_of_the_steps_it_covers(step, reviews):
    """A draft switched off after losing rounds (never accepted): at 0.02 of a plain step a
    token, a review over 8 tokens (the target's growth with the rows, 0.1 + 0.02 a row) costs
    ~0.005 s against 8 steps of 0.1 s, and reviews run; at 0.6 of a step (an Apple M4 Pro
    beside a large draft, research/replay/) one costs ~0.14 s of 0.8 s, more than REVIEW_SHARE,
    and none runs however long the draft stays off."""
    policy = _reviewing()
    k = ask(policy, None)
    for i in range(30):
        k = ask(policy, _round(i, k, 0, step * k, 0.1 if k == 0 else 0.1 + 0.02 * k))
    assert k == 0
    due = []
    for i in range(30, 160):
        assert ask(policy, _round(i, 0, 0, 0.0, 0.1)) == 0
        due.append(policy.review_due())
    assert any(due) is reviews


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(0.7, seed=4)], ids=["t0", "t07"])
def test_the_loop_reviews_while_the_draft_is_off_and_stays_exact(engine, monkeypatch, sampling):
    """Rounds priced by a fixed cost model in which a draft step costs as much as a plain step
    (so the tiny pair's draft is switched off, whatever this machine's clock says): the loop
    reviews it in its plain runs (values in [0, 1]), greedy output equals plain decoding's, and
    a second answer after the first does too (the draft's cache stays a prefix of the context).
    A draft that dear would not be reviewed (REVIEW_SHARE): the share is lifted here, the loop's
    reviews being what is tested."""
    monkeypatch.setattr(adaptive, "REVIEW_SHARE", 1.0)
    seen: list[Review] = []
    fold, observe = AdaptiveK.review, AdaptiveK.observe

    def priced(self: AdaptiveK, r: Round) -> None:
        step = 1e-4 if r.method == "ngram" else 0.05
        cost = {"t_draft": step * r.drafted, "t_verify": 0.05 + 0.01 * r.drafted}
        observe(self, dataclasses.replace(r, timed=True, **cost))

    monkeypatch.setattr(AdaptiveK, "observe", priced)
    monkeypatch.setattr(AdaptiveK, "review", lambda self, r: (seen.append(r), fold(self, r)))
    ids = engine.encode_raw(PROMPT)
    spec = SpecConfig(k=4, method="hybrid", adaptive=True)
    events = gen(engine, ids, spec, 96, sampling)
    assert any(r.drafted == 0 for r in rounds_of(events))
    assert seen and all(0.0 <= v <= 1.0 for r in seen for v in r.values)
    if sampling.greedy:
        assert_plain_twice(engine, ids, spec, events)


def assert_plain_twice(engine, ids: list[int], spec: SpecConfig, events: list) -> None:
    """The 96 tokens `events` answered to `ids` are plain decoding's, and after a second
    answer of `spec`'s, one to a longer prompt is too (the draft's cache stays a prefix)."""
    engine.reset()
    plain = plain_ids(engine, ids, 96)
    assert token_ids(events) == plain
    more = ids + plain + engine.encode_raw(" and then")
    engine.reset()
    gen(engine, ids, spec, 96)
    assert token_ids(gen(engine, more, spec, 48)) == plain_ids(engine, more, 48)


def test_with_reviews_switched_off_lookups_come_back_on_their_reviews_not_on_probes():
    """A hybrid's lookups accepted one time in four at 8K tokens (a 2-row verify at 1.8 plain
    steps) are switched off; with reviews no probe lookup follows (the probes' schedule would
    have proposed some), and reviews of their guesses at plain steps, every one right, bring
    them back."""
    policy = AdaptiveK(1, 8, model="draft")
    policy.review_on()
    lengths = []
    for i in range(60):
        if i % 2 or i > 20:
            ask(policy, Round(i, 0, 0, 0, 0.0, 0.10, "draft"))
        else:
            ask(policy, Round(i, 1, int(i % 8 == 0), 1, 1e-5, 0.18, "ngram"))
        lengths.append(policy.lookup_k("ngram", 4))
    assert lengths[-1] == 0 and not any(lengths[25:])
    assert policy.lookup_review_due()
    for _ in range(6):
        policy.review(Review("ngram", (1.0,), match=2))
    ask(policy, Round(60, 0, 0, 0, 0.0, 0.10, "draft"))
    assert policy.lookup_k("ngram", 4) > 0 and not policy.lookup_review_due()


def test_the_loop_reviews_switched_off_lookups_by_their_guesses(engine, monkeypatch):
    """Lookups always off (lookups_pay), drafting too: at every plain step where the context
    matches, the loop reviews the hybrid's guess, each value whether it was the committed token
    (the same values as an n-gram index rebuilt here gives); output at T = 0 is plain
    decoding's."""
    seen: list[Review] = []
    fold = AdaptiveK.review
    monkeypatch.setattr(AdaptiveK, "review", lambda self, r: (seen.append(r), fold(self, r)))
    monkeypatch.setattr(AdaptiveK, "lookups_pay", lambda self, method: False)
    monkeypatch.setattr(AdaptiveK, "choose", lambda self, method: 0)
    ids = engine.encode_raw(" ".join([PROMPT] * 3))
    # One-token lookups (ngram_max 1): the tiny models' text seldom repeats two tokens in a row.
    spec = SpecConfig(k=4, method="hybrid", adaptive=True, ngram_max=1)
    events = gen(engine, ids, spec, 48)
    assert token_ids(events) == plain_ids(engine, ids, 48)
    lookups = [r for r in seen if r.method == "ngram"]
    assert lookups and all(r.match == 1 for r in lookups)
    context, want = list(ids), []
    for token in token_ids(events):
        index = NgramIndex(1, 1)
        index.extend(context)
        pos, n = index.find()
        if n:
            want.append((float(index.tokens[pos] == token),))
        context.append(token)
    assert [r.values for r in lookups] == want[: len(lookups)]
    assert len(lookups) >= len(want) - 2  # the last steps' reviews may be read after the end


def test_the_tree_loop_reviews_while_its_chain_policy_has_the_draft_off(engine, monkeypatch):
    """`--tree` where the tree never pays (FallbackTree.tree_pays held False): every round is
    adaptive K's, which switches the dear draft off (the cost model of the chain loop's test
    above) and reads reviews at the tree loop's plain steps, under the tree loop's method;
    greedy output equals plain decoding's, and a second answer after it too."""
    monkeypatch.setattr(adaptive, "REVIEW_SHARE", 1.0)
    monkeypatch.setattr(FallbackTree, "tree_pays", lambda self: False)
    seen: list[Review] = []
    fold, observe = AdaptiveK.review, AdaptiveK.observe

    def priced(self: AdaptiveK, r: Round) -> None:
        cost = {"t_draft": 0.05 * r.drafted, "t_verify": 0.05 + 0.01 * r.drafted}
        observe(self, dataclasses.replace(r, timed=True, **cost))

    monkeypatch.setattr(AdaptiveK, "observe", priced)
    monkeypatch.setattr(AdaptiveK, "review", lambda self, r: (seen.append(r), fold(self, r)))
    ids = engine.encode_raw(PROMPT)
    spec = SpecConfig(k=4, method="draft", tree="dynamic")
    events = gen(engine, ids, spec, 96)
    rounds = rounds_of(events)
    assert any(r.drafted == 0 for r in rounds)
    assert all(r.drafted == r.k for r in rounds)  # chains and plain steps, never a tree
    assert seen and {r.method for r in seen} == {"tree"}
    assert all(0.0 <= v <= 1.0 for r in seen for v in r.values)
    assert_plain_twice(engine, ids, spec, events)
