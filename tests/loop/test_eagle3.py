"""EAGLE-3-style feature drafts on tiny seeded models: features fused from several target layers
(edgespec.architectures.eagle `feature_layers`) and training-time test (research.distill.eagle3).

Exactness as for every draft (greedy output identical to plain decoding, chain and tree); the
multi-layer features must be the target's own hidden states, taken from the verify forward; the
training-time-test unroll must be what the drafter computes in the loop; its loss must go down.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from edgespec.architectures.eagle import EagleModel
from edgespec.config import SpecConfig
from edgespec.distill.shards import Sequence
from edgespec.errors import ConfigError
from edgespec.events import Round
from edgespec.loading.load import load_model, load_pair
from edgespec.runtime import Engine
from edgespec.taps import TOP, target_features
from research.distill.eagle import (
    EagleTrainConfig,
    extract_features,
    load_items,
    make_batch,
    save_eagle,
    train_eagle,
)
from research.distill.eagle3 import chain_agreement, ttt_loss, unroll, warm_start
from tests.helpers import PROMPT, gen, plain_ids, token_ids
from tests.helpers.tiny import make_tiny_eagle, make_tiny_pair

LAYERS = (1, 2, TOP)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eagle3")
    make_tiny_pair(root, seed=3)
    make_tiny_eagle(root / "target", root / "eagle", seed=0, head=150)
    make_tiny_eagle(root / "target", root / "eagle3", seed=0, head=150, feature_layers=LAYERS)
    return root


@pytest.fixture(scope="module")
def items(tiny) -> list:
    """The tiny target's greedy answers to seeded prompts, with the features of LAYERS."""
    target = load_model(str(tiny / "target"), dequantize=False)
    engine = Engine(target, None)
    rng = np.random.default_rng(0)
    seqs = []
    for i in range(24):
        prompt = [int(t) for t in rng.integers(3, target.model.args.vocab_size, size=10)]
        seqs.append(Sequence(i, len(prompt), np.array(prompt + plain_ids(engine, prompt, 30))))
    extract_features(target.model, seqs, tiny / "feats", 10**9, log=lambda s: None, layers=LAYERS)
    return load_items(tiny / "feats")


def test_layer_features_come_from_the_same_forward(tiny):
    target = load_model(str(tiny / "target"), dequantize=False).model
    x = mx.array([5, 9, 14, 3, 7], dtype=mx.int32)
    top, logits = target_features(target, x, None)
    feats, logits3 = target_features(target, x, None, (3, 0, TOP))
    d = top.shape[-1]
    assert feats.shape == (5, 3 * d)
    assert mx.array_equal(logits3, logits) and mx.array_equal(feats[:, 2 * d :], top)
    # the last layer's output, final-normed, is the top feature: the blocks are in the asked order
    assert mx.allclose(target.model.norm(feats[:, :d]), top, atol=1e-5)
    assert not mx.allclose(feats[:, d : 2 * d], feats[:, :d])
    assert all(type(b).__name__ != "_Tap" for b in target.model.layers)  # taps removed


@pytest.mark.parametrize(
    "spec",
    [
        SpecConfig(k=1, method="draft", adaptive=False),
        SpecConfig(k=3, method="draft", adaptive=False),
        SpecConfig(k=2, adaptive=True, k_max=4, method="draft"),
    ]
    + [SpecConfig(k=3, method="draft", tree=t) for t in ("3,2,1", "dynamic")],
    ids=["k1", "k3", "adaptive", "tree", "dynamic-tree"],
)
def test_greedy_output_equals_plain_with_a_multi_layer_draft(tiny, spec):
    engine = Engine.load(target=str(tiny / "target"), draft=str(tiny / "eagle3"))
    assert engine._target.feature_layers == LAYERS
    plain = Engine.load(target=str(tiny / "target"), with_draft=False)
    for prompt in (PROMPT, "the river and the moon and the river"):
        ids = engine.encode_raw(prompt)
        assert token_ids(gen(engine, ids, spec, 32)) == plain_ids(plain, ids, 32)
        state = engine._draft
        assert state.features.shape[-1] == engine.draft.model.args.hidden_size  # fused


def test_feature_layers_the_target_lacks_is_a_one_line_config_error(tiny, tmp_path):
    bad = make_tiny_eagle(tiny / "target", tmp_path / "bad", feature_layers=(1, 9, TOP))
    with pytest.raises(ConfigError, match=r"feature_layers.*layers 0-3") as e:
        load_pair(str(tiny / "target"), str(bad))
    assert "\n" not in str(e.value)


def test_warm_start_drafts_exactly_as_the_draft_it_starts_from(tiny, items, tmp_path):
    """Identity on the top block: the same proposals, so the same rounds; a fused block taken
    from the wrong layer or position would change them."""
    target = load_model(str(tiny / "target"), dequantize=False)
    model, cfg = warm_start(target.model, tiny / "eagle", LAYERS, items)
    save_eagle(model, cfg, tmp_path / "grown")
    rounds = []
    for draft in (tiny / "eagle", tmp_path / "grown"):
        engine = Engine.load(target=str(tiny / "target"), draft=str(draft))
        events = gen(
            engine, engine.encode_raw(PROMPT), SpecConfig(k=3, method="draft", adaptive=False), 40
        )
        rounds.append([(e.drafted, e.accepted) for e in events if isinstance(e, Round)])
    assert rounds[0] == rounds[1] and sum(a for _, a in rounds[0]) > 0


def test_an_8_bit_fusion_fuses_as_the_float_one(tiny, items):
    """The shipped drafts are 8-bit: the quantized fusion reads the features, not their bits."""
    from edgespec.distill.export import quantize

    target = load_model(str(tiny / "target"), dequantize=False)
    model, cfg = warm_start(target.model, tiny / "eagle3", LAYERS, items)
    raw = mx.array(items[0].feats[:8].astype(np.float32))
    want = model.fuse(raw)
    quantize(model, cfg, 8)
    assert "scales" in model.fuse_fc
    got = model.fuse(raw)
    assert got.dtype == mx.float32 and mx.allclose(got, want, atol=0.05 * float(mx.abs(want).max()))


def test_unroll_is_what_the_drafter_computes_in_the_loop(tiny, items):
    """Step s at position i = the draft run on true positions up to i - s, then on its own
    guesses (its cache, as in FeatureDrafter.propose)."""
    m: EagleModel = load_pair(str(tiny / "target"), str(tiny / "eagle3"))[1].model
    f, t, _, _ = make_batch(items[:1])
    feats = m.fuse(f)
    steps = unroll(m, feats, t, 3)
    assert mx.allclose(steps[0], m(feats, t), atol=1e-5)
    i = 12
    for s in (1, 2):
        cache = make_prompt_cache(m)
        out = m(feats[:, : i - s + 1], t[:, : i - s + 1], cache=cache)[:, -1:]
        for p in range(i - s + 1, i + 1):
            out = m(out, t[:, p : p + 1], cache=cache)
        assert mx.allclose(out[0, 0], steps[s][0, i], atol=1e-4), s


def test_training_time_test_loss_goes_down(tiny, items, tmp_path):
    target = load_model(str(tiny / "target"), dequantize=False)
    model, cfg = warm_start(target.model, tiny / "eagle", LAYERS, items)
    held = items[:6]
    f, t, ft, m = make_batch(held)
    before = float(ttt_loss(model, f, t, ft, m)[0].item())
    chain_before = chain_agreement(model, held, 3)
    tc = EagleTrainConfig(steps=60, batch=8, lr=3e-3, warmup=5, eval_every=60, reg_weight=0.0)
    train_eagle(model, items, held, tc, tmp_path / "run", lambda s: None, loss_of=ttt_loss)
    after = float(ttt_loss(model, f, t, ft, m)[0].item())
    chain_after = chain_agreement(model, held, 3)
    assert after < 0.5 * before, (before, after)  # 78 -> 14 when written
    assert sum(chain_after) > sum(chain_before), (chain_before, chain_after)
    assert json.loads(json.dumps(cfg))["feature_layers"] == list(LAYERS)


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2])
def test_shipped_eagle3_pair_keeps_greedy_output_and_reads_three_layers(k):
    """research/recipes/smollm2-135m-eagle3 through the catalogue pair: the verify returns
    layers 2, 15 and the top, and greedy output on the project's own prompts is plain
    decoding's."""
    from tests.helpers.pair import assert_greedy_speculative_equals_plain

    engine = Engine.load(pair="smollm2-135m-eagle3")
    assert engine._target.feature_layers == (2, 15, TOP)
    assert_greedy_speculative_equals_plain(engine, k, n_prompts=2)
