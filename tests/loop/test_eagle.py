"""Feature drafts (EAGLE-style, edgespec.architectures.eagle) on tiny seeded models.

Exactness the same way as for token drafts: greedy output identical to plain decoding (fixed K,
adaptive, hybrid, multi-turn with cache reuse), and a chi-square test at T > 0 that the first two
emitted tokens follow the target. The trainer is run for real on the tiny target's own answers and
must raise agreement; the trained draft must get tokens accepted through the Engine.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from edgespec import loop
from edgespec.architectures.eagle import EagleModel
from edgespec.bench.plan import BenchPlan
from edgespec.bench.runner import check_methods
from edgespec.bench.unbiased import verify_pair
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.distill.shards import Sequence
from edgespec.drafting.feature import FeatureDrafter, FeatureState
from edgespec.errors import ConfigError, ModelLoadError
from edgespec.events import Token
from edgespec.loading.load import load_model, load_pair, load_token_draft
from edgespec.runtime import Engine
from edgespec.taps import target_features
from research.distill.eagle import (
    EagleTrainConfig,
    agreement,
    extract_features,
    load_items,
    new_eagle,
    save_eagle,
    train_eagle,
)
from tests.helpers import (
    GREEDY,
    PROMPT,
    RoundByRound,
    Scripted,
    chi2_pvalue,
    gen,
    plain_ids,
    rounds_of,
    target_probs,
    token_ids,
)
from tests.helpers.cli import run_edgespec
from tests.helpers.stats import assert_follows
from tests.helpers.tiny import make_tiny_eagle, make_tiny_pair

TRAIN = EagleTrainConfig(steps=200, batch=8, lr=3e-3, warmup=10, eval_every=100)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eagle")
    make_tiny_pair(root, seed=3)
    make_tiny_eagle(root / "target", root / "eagle", seed=0, head=150)
    return root


@pytest.fixture(scope="module")
def trained(tiny_dir) -> tuple[Path, list[dict], list[Sequence]]:
    """Train a feature draft on the tiny target's greedy answers to seeded prompts."""
    target = load_model(str(tiny_dir / "target"), dequantize=False)
    engine = Engine(target, None)
    rng = np.random.default_rng(0)
    seqs = []
    for i in range(40):
        prompt = [int(t) for t in rng.integers(3, target.model.args.vocab_size, size=12)]
        answer = plain_ids(engine, prompt, 40)
        seqs.append(Sequence(i, len(prompt), np.array(prompt + answer)))
    cached = extract_features(target.model, seqs, tiny_dir / "features", 10**9, log=lambda s: None)
    assert cached == sum(len(s.ids) for s in seqs)
    items = load_items(tiny_dir / "features")
    config = json.loads((tiny_dir / "target" / "config.json").read_text())
    head = np.arange(config["vocab_size"])
    model, cfg = new_eagle(target.model, config, head, init_layer=3)
    # A random tiny target's answers do not generalise: held out = the training set's first 8 here,
    # so the curve measures what the draft learnt (the real target's held-out figures are in the
    # model card); what matters below is that the loop accepts what the draft learnt.
    curve = train_eagle(model, items, items[:8], TRAIN, tiny_dir / "run", log=lambda s: None)
    save_eagle(model, cfg, tiny_dir / "trained")
    return tiny_dir / "trained", curve, seqs


# ----------------------------------------------------------------------------- loading


def test_loads_as_a_feature_draft_sharing_the_targets_embedding(tiny_dir):
    t, d = load_pair(str(tiny_dir / "target"), str(tiny_dir / "eagle"))
    assert isinstance(d.model, EagleModel)
    assert d.model.embedding is t.model.model.embed_tokens  # shared, not copied
    want = t.model.model.embed_tokens.weight[d.model.head_ids]
    assert mx.array_equal(d.model.head_weight, want)
    names = {k for k, _ in __import__("mlx.utils").utils.tree_flatten(d.model.parameters())}
    assert not any("embed" in n for n in names)  # never saved / trained as its own parameter
    engine = Engine(t, d)
    assert isinstance(engine._draft, FeatureState)


def test_feature_draft_without_or_with_a_wrong_target_is_a_one_line_error(tiny_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="load it together with its target") as e:
        load_model(str(tiny_dir / "eagle"), tokenizer_fallback=tiny_dir / "target")
    assert "\n" not in str(e.value)
    other = make_tiny_pair(tmp_path / "wide", seed=1)[0]  # same vocabulary, other width below
    cfg = json.loads((other / "config.json").read_text())
    cfg["hidden_size"] = 32
    wide = tmp_path / "wide32"
    wide.mkdir()
    from tests.helpers.tiny import random_llama_weights, write_model

    write_model(wide, cfg, random_llama_weights(cfg, 0), tmp_path / "wide" / "tokenizer")
    with pytest.raises(ModelLoadError, match="made for a target with") as e:
        load_pair(str(wide), str(tiny_dir / "eagle"))
    assert "\n" not in str(e.value)


def test_target_features_are_the_forward_the_loop_verifies_with(tiny_dir):
    t = load_model(str(tiny_dir / "target"))
    x = mx.array([5, 9, 11, 40, 7], dtype=mx.int32)
    feats, logits = target_features(t.model, x, None)
    assert feats.shape == (5, t.model.args.hidden_size)
    assert mx.allclose(logits, t.model(x[None])[0], atol=1e-5)


# ----------------------------------------------------------------------------- exactness


@pytest.mark.parametrize(
    "spec",
    [
        SpecConfig(k=1, method="draft", adaptive=False),
        SpecConfig(k=4, method="draft", adaptive=False),
        SpecConfig(k=2, adaptive=True, k_max=5, method="draft"),
        SpecConfig(k=3, method="hybrid", adaptive=False),
    ],
    ids=["k1", "k4", "adaptive", "hybrid"],
)
@pytest.mark.parametrize("which", ["random", "trained"])
def test_greedy_output_equals_plain_decoding(tiny_dir, trained, spec, which):
    draft = tiny_dir / "eagle" if which == "random" else trained[0]
    engine = Engine.load(target=str(tiny_dir / "target"), draft=str(draft))
    ids = engine.encode_raw(PROMPT)
    plain = plain_ids(engine, ids, 48)
    events = gen(engine, ids, spec, 48)
    assert token_ids(events) == plain and len(plain) == 48


def test_the_loop_accepts_what_the_feature_draft_learnt(tiny_dir, trained):
    """On prompts it was trained on, the draft predicts the target's answers; the loop must turn
    that into accepted tokens (a misaligned feature or token would make them all fail)."""
    engine = Engine.load(target=str(tiny_dir / "target"), draft=str(trained[0]))
    accepted = drafted = 0
    for s in trained[2][8:12]:
        prompt = s.ids[: s.prompt_len].tolist()
        events = gen(engine, prompt, SpecConfig(k=2, method="draft", adaptive=False), 30)
        assert token_ids(events) == s.ids[s.prompt_len : s.prompt_len + 30].tolist()
        accepted += sum(r.accepted for r in rounds_of(events))
        drafted += sum(r.drafted for r in rounds_of(events))
    assert accepted / drafted > 0.3, (accepted, drafted)


def test_multi_turn_chat_reuses_features_and_stays_exact(tiny_dir, trained):
    """Second turn: the prompt extends the first turn's context. Target and draft caches keep what
    they can; the output still equals plain decoding, and the draft cache holds true features only."""
    engine = Engine.load(target=str(tiny_dir / "target"), draft=str(trained[0]))
    plain_engine = Engine.load(target=str(tiny_dir / "target"), with_draft=False)
    spec = SpecConfig(k=3, method="draft", adaptive=False)
    msgs = [{"role": "user", "content": PROMPT}]
    for turn in range(3):
        ids = engine.encode_chat(msgs)
        got = gen(engine, ids, spec, 24)
        want = plain_ids(plain_engine, ids, 24)
        assert token_ids(got) == want
        state = engine._draft
        assert state.n_features == len(state.context) - 1
        assert state.kv.offset <= state.n_features
        target_tokens, draft_tokens = engine.cached_tokens()
        assert draft_tokens == state.context[: state.kv.offset]
        text = engine.tokenizer.decode(want)
        msgs += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"more {turn}"},
        ]
    assert state.kv.offset > 0


def test_early_stop_then_new_prompt_keeps_caches_consistent(tiny_dir, trained):
    engine = Engine.load(target=str(tiny_dir / "target"), draft=str(trained[0]))
    ids = engine.encode_raw(PROMPT)
    stream = engine.generate(
        ids,
        GenerationConfig(GREEDY, SpecConfig(k=4, method="draft", adaptive=False), max_tokens=40),
    )
    for _ in range(5):  # the consumer walks away mid-answer (Ctrl-C in the app)
        next(stream)
    stream.close()
    state = engine._draft
    assert state.kv.offset <= state.n_features <= len(state.context)
    other = engine.encode_raw("the river and the moon")
    plain = Engine.load(target=str(tiny_dir / "target"), with_draft=False)
    want = plain_ids(plain, other, 30)
    assert (
        token_ids(gen(engine, other, SpecConfig(k=4, method="draft", adaptive=False), 30)) == want
    )


N_SEEDS = 500
MIN_SECONDS = 100  # second tokens after the likeliest first token (495 of the 500 here)


def test_sampled_tokens_follow_the_target_distribution(tiny_dir, trained):
    """T = 1: over many seeds, the first emitted token follows p(. | prompt), and the second,
    given the first, follows p(. | prompt, first), whether drafted, corrected or bonus."""
    engine = Engine.load(target=str(tiny_dir / "target"), draft=str(trained[0]))
    sampling = SamplingConfig(temperature=1.0, top_p=1.0)
    ids = engine.encode_raw(PROMPT)
    model, kinds = engine.target.model, set()

    def p_value(seeds: range) -> float:
        firsts, seconds = [], {}
        for seed in seeds:
            cfg = GenerationConfig(
                replace(sampling, seed=seed),
                SpecConfig(k=2, method="draft", adaptive=False),
                max_tokens=2,
            )
            toks = [e for e in engine.generate(ids, cfg) if isinstance(e, Token)]
            firsts.append(toks[0].id)
            kinds.update(t.kind for t in toks)
            seconds.setdefault(toks[0].id, []).append(toks[1].id)
        p1 = chi2_pvalue(firsts, target_probs(model, ids, sampling), min_samples=N_SEEDS)
        top = max(seconds, key=lambda t: len(seconds[t]))
        p = target_probs(model, ids + [top], sampling)
        return min(p1, chi2_pvalue(seconds[top], p, min_samples=MIN_SECONDS))

    assert_follows(p_value, range(N_SEEDS), "eagle")
    assert {"accepted", "corrected"} <= kinds


def test_the_chi_square_check_has_power_against_the_draft(tiny_dir, trained):
    """The same check rejects tokens drawn from the draft's q instead of the target's p, so the
    test above can fail (a loop that kept draft tokens without the ratio test would be caught)."""
    from edgespec.bench.unbiased import last_distributions

    t, d = load_pair(str(tiny_dir / "target"), str(trained[0]))
    ids = Engine(t, d).encode_raw(PROMPT)
    p, q = last_distributions(t.model, d.model, ids, SamplingConfig(temperature=1.0))
    p, q = np.array(p, np.float64), np.array(q, np.float64)
    rng = np.random.default_rng(0)
    samples = rng.choice(p.size, size=N_SEEDS, p=q / q.sum())
    assert chi2_pvalue(samples, p, min_samples=N_SEEDS) < 1e-3


def test_verify_command_maths_accepts_a_feature_draft(tiny_dir, trained):
    t, d = load_pair(str(tiny_dir / "target"), str(trained[0]))
    ids = [5, 9, 11, 40, 7, 3]
    report = verify_pair(t.model, d.model, ids, SamplingConfig(temperature=1.0), 2, 20000)
    assert report.p_value > 1e-3 and 0 < report.acceptance <= 1
    assert abs(report.acceptance - report.expected_acceptance) < 0.03
    with pytest.raises(ConfigError, match="two tokens"):
        verify_pair(t.model, d.model, [5], SamplingConfig(temperature=1.0), 2, 10)


# ----------------------------------------------------------------------------- training


def test_training_raises_agreement_and_resumes(tiny_dir, trained):
    path, curve, _ = trained
    measured = [c["agreement"] for c in curve]
    items = load_items(tiny_dir / "features")
    t = load_model(str(tiny_dir / "target"))
    cfg = json.loads((tiny_dir / "target" / "config.json").read_text())
    fresh, _ = new_eagle(t.model, cfg, np.arange(cfg["vocab_size"]), init_layer=3)
    start = agreement(fresh, items[:8])
    assert measured[-1] > start + 0.4, (start, measured)
    # resume: the checkpoint is at the last step, so asking for the same steps does no work
    again = train_eagle(fresh, items, items[:8], TRAIN, tiny_dir / "run", log=lambda s: None)
    assert again == curve
    assert agreement(fresh, items[:8]) == pytest.approx(measured[-1], abs=1e-6)


def test_bench_refuses_mlx_lm_with_a_feature_draft(tiny_dir):
    engine = Engine.load(target=str(tiny_dir / "target"), draft=str(tiny_dir / "eagle"))
    with pytest.raises(ConfigError, match="--peer-draft"):
        check_methods(engine, BenchPlan(methods=("plain", "spec", "mlx-lm")))
    check_methods(engine, BenchPlan(methods=("plain", "spec", "adaptive")))
    with pytest.raises(ConfigError, match="feature draft"):  # a peer must be a token draft
        load_token_draft(str(tiny_dir / "eagle"), engine.target)


def test_bench_runs_mlx_lm_with_a_peer_token_draft_beside_a_feature_draft(tiny_dir, tmp_path):
    """`--peer-draft`: EdgeSpec speculates with the feature draft, mlx-lm with the token draft,
    side by side in one run; results.json names both."""
    out = run_edgespec(
        "bench",
        "--target",
        str(tiny_dir / "target"),
        "--draft",
        str(tiny_dir / "eagle"),
        "--peer-draft",
        str(tiny_dir / "draft"),
        "--methods",
        "plain,spec,mlx-lm",
        "-k",
        "2",
        "--max-tokens",
        "8",
        "--limit",
        "1",
        "--no-warmup",
        "--quiet",
        "--out",
        str(tmp_path),
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["pair"]["peer_draft"] == str(tiny_dir / "draft")
    assert doc["pair"]["draft"] == str(tiny_dir / "eagle")
    peer = {m["label"]: m["overall"] for m in doc["methods"]}["mlx-lm K=2 T=0"]
    assert peer["tokens"] > 0 and peer["tau"] is not None


def test_a_draft_grown_from_a_token_draft_starts_as_it_and_stores_only_the_mixer(
    tiny_dir, tmp_path
):
    """from_token_draft: fc = [0, I], so before training the feature draft predicts exactly what
    the token draft does one position later; export_grown stores the mixer and points at the base
    (checked by sha256), and loading it back gives the same model."""
    from edgespec.architectures.token_draft import save_draft
    from edgespec.distill.init_draft import build_draft
    from research.distill.eagle import export_grown, from_token_draft

    t = load_model(str(tiny_dir / "target"))
    cfg = json.loads((tiny_dir / "target" / "config.json").read_text())
    head = np.arange(0, cfg["vocab_size"], 3)
    token, tcfg = build_draft(t.model, cfg, [0, 3], head, "tiny")
    save_draft(token, tcfg, tmp_path / "token")
    grown, gcfg = from_token_draft(t.model, cfg, token)
    x = mx.array([[7, 30, 2, 99, 41, 5]])
    feats, _ = target_features(t.model, x[0], None)
    want = token.head_logits(x[:, 1:])  # token draft fed tokens 1.. : predicts 2..
    got = grown.head_logits(grown(feats[None, :-1], x[:, 1:]))
    assert mx.allclose(got, want, atol=1e-4)
    grown.fc.weight = grown.fc.weight + 0.01  # as if trained
    export_grown(grown, gcfg, tmp_path / "grown", tmp_path / "token")
    on_disk = mx.load(str(tmp_path / "grown" / "model.safetensors"))
    assert set(on_disk) == {"fc.weight", "fc.bias"}
    t2, d2 = load_pair(str(tiny_dir / "target"), str(tmp_path / "grown"))
    again = d2.model.head_logits(d2.model(feats[None, :-1], x[:, 1:]))
    assert mx.allclose(again, grown.head_logits(grown(feats[None, :-1], x[:, 1:])), atol=1e-2)
    assert d2.model.chain == "zero"
    engine = Engine(t2, d2)
    ids = engine.encode_raw(PROMPT)
    plain = plain_ids(engine, ids, 30)
    assert token_ids(gen(engine, ids, SpecConfig(k=3, method="draft", adaptive=False), 30)) == plain
    # a changed base is refused in one line
    save_draft(build_draft(t.model, cfg, [1, 2], head, "tiny")[0], tcfg, tmp_path / "token")
    with pytest.raises(ModelLoadError, match="changed since") as e:
        load_pair(str(tiny_dir / "target"), str(tmp_path / "grown"))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(0.8, seed=5)], ids=["greedy", "t0.8"])
def test_pipelined_plain_runs_hand_the_feature_draft_its_features(
    tiny_dir, trained, sampling, monkeypatch
):
    """Runs of K = 0 rounds are pipelined for a feature draft too, and still give it the target's
    features of every committed position: the rounds after a run draft (and get accepted) exactly
    as when each K = 0 round goes through the round path."""
    engine = Engine.load(target=str(tiny_dir / "target"), draft=str(trained[0]))
    s = trained[2][9]
    prompt = s.ids[: s.prompt_len].tolist()
    script = [2, 0, 0, 0, 0, 2, 0, 0, 1, 2]
    plain_runs: list = []  # plain steps queued behind a plain step still computing
    real = loop.Chains.queue

    def queue(self, run, prop, key, before=None):
        if before is not None:
            plain_runs.append(1)
        return real(self, run, prop, key, before)

    monkeypatch.setattr(loop.Chains, "queue", queue)
    runs = {}
    for name, wrap in (("pipelined", lambda d: d), ("round by round", RoundByRound)):
        drafter = wrap(FeatureDrafter(engine._draft, sampling, engine._vocab))
        engine.reset()
        calls: list = []

        def policy(last, calls=calls):
            calls.append(last)
            return script[(len(calls) - 1) % len(script)]

        events = gen(
            engine,
            prompt,
            SpecConfig(k=2, method="draft", adaptive=False),
            40,
            sampling,
            drafter=drafter,
            k_policy=Scripted(policy),
        )
        runs[name] = (
            [(e.id, e.kind) for e in events if isinstance(e, Token)],
            [(r.drafted, r.accepted, r.k) for r in rounds_of(events)],
        )
        assert engine._draft.n_features == len(engine._target.tokens)  # every committed position
        if name == "pipelined":
            assert len(plain_runs) >= 3  # the K = 0 runs were pipelined
            taken = len(plain_runs)
    assert len(plain_runs) == taken  # and none in the round-by-round reference
    assert runs["pipelined"] == runs["round by round"]
    assert sum(a for _, a, _ in runs["pipelined"][1]) > 0  # drafts after runs are accepted
    if sampling.greedy:
        assert [t for t, _ in runs["pipelined"][0]] == s.ids[
            s.prompt_len : s.prompt_len + 40
        ].tolist()
