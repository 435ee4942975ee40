"""Reduced-head drafts (EdgeSpec's own DraftModel) are drafted head-only: argmax, warp and sampling
over the H head columns. The proposal (tokens and the full-vocabulary q) must equal the full-width
path through `DraftModel.__call__` (-inf off the head), and greedy output must equal plain decoding."""

from __future__ import annotations

import json
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from edgespec.config import SamplingConfig, SpecConfig
from edgespec.device import for_device
from edgespec.distill.init_draft import build_draft
from edgespec.drafting.token import ModelDrafter
from edgespec.runtime import Engine
from edgespec.sampling import make_key, round_keys
from tests.helpers import engine_state, gen, plain_ids, token_ids

PROMPT = "the quick brown fox jumps over the lazy dog and then"


@pytest.fixture(scope="module")
def head_pair(tiny_models):
    """(target record, draft record): the draft is target layers 0 and 3 + a 1/3-vocabulary head."""
    target, _ = tiny_models
    cfg = json.loads((target.path / "config.json").read_text())
    vocab = int(cfg["vocab_size"])
    head = np.sort(np.random.default_rng(1).choice(vocab, size=vocab // 3, replace=False))
    draft, _ = build_draft(target.model, cfg, [0, 3], head.astype(np.int32), "tiny")
    record = SimpleNamespace(
        model=draft,
        tokenizer=target.tokenizer,
        name="head-draft",
        path=target.path,
        context_window=target.context_window,
    )
    return target, record


def _drafters(draft_model, vocab: int, sampling: SamplingConfig, prompt: list[int]):
    """The same draft twice: head-only (default) and forced through the full-width logits."""
    out = []
    for head_only in (True, False):
        state = engine_state(draft_model, "draft")  # as the Engine builds it
        state.prefill(prompt)
        d = ModelDrafter(state, sampling, vocab, for_device().draft_steps)
        assert d.head_ids is not None  # the draft is detected as reduced-head
        if not head_only:
            d.head_ids = None
        out.append(d)
    return out


SAMPLINGS = [
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0, seed=3),
    SamplingConfig(temperature=0.7, top_p=0.9, seed=4),
    SamplingConfig(temperature=1.2, top_k=20, min_p=0.05, seed=5),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["greedy", "t1", "top-p", "top-k-min-p"])
def test_head_only_proposals_equal_the_full_width_path(head_pair, sampling):
    target, draft = head_pair
    vocab = int(target.model.args.vocab_size)
    prompt = target.tokenizer.encode(PROMPT)
    fast, full = _drafters(draft.model, vocab, sampling, prompt)
    context, key = list(prompt), make_key(sampling.seed)
    for _ in range(6):
        key, draft_key, _ = round_keys(key)
        a, b = fast.propose(context, 4, draft_key), full.propose(context, 4, draft_key)
        assert a.tokens.tolist() == b.tokens.tolist()
        assert set(a.tokens.tolist()) <= set(np.array(draft.model.head_ids).tolist())
        if sampling.greedy:
            assert a.q is None and b.q is None
        else:
            assert a.q.shape == b.q.shape == (4, vocab)
            assert mx.allclose(a.q, b.q, atol=1e-6).item()
        context += a.tokens.tolist()[:2]  # commit two drafted tokens, as a partial acceptance
        for d in (fast, full):
            d.commit(context)


def test_head_draft_greedy_output_equals_plain_decoding(head_pair):
    engine = Engine(*head_pair)
    ids = engine.encode_raw(PROMPT)

    plain = plain_ids(engine, ids, 40)
    assert (
        token_ids(gen(engine, ids, SpecConfig(k=3, method="draft", adaptive=False), 40)) == plain
        and len(plain) == 40
    )


def test_exported_draft_shares_the_target_embedding_through_load_pair(head_pair, tmp_path):
    from edgespec.distill.export import Card, export_draft
    from edgespec.errors import ModelLoadError
    from edgespec.loading.load import load_pair
    from tests.helpers.tiny import llama_config, random_llama_weights, write_model

    target, draft = head_pair
    cfg = json.loads((target.path / "config.json").read_text())
    model, config = build_draft(target.model, cfg, [0, 3], np.array(draft.model.head_ids), "tiny")
    card = Card("tiny", "test", 0, 0, 0, 0, [0, 3], int(config["head_size"]))
    out = export_draft(model, config, tmp_path / "draft", card)
    t, d = load_pair(target=str(target.path), draft=str(out))
    assert d.model.model.embed_tokens is t.model.model.embed_tokens
    ids = mx.array([[5, 6, 7, 8]])
    assert mx.allclose(d.model(ids), model(ids), atol=1e-4).item()  # same draft, minus the copy

    other_cfg = llama_config(int(cfg["vocab_size"]), 2, hidden=128)
    other = write_model(
        tmp_path / "other", other_cfg, random_llama_weights(other_cfg, 5), target.path
    )
    with pytest.raises(ModelLoadError) as e:
        load_pair(target=str(other), draft=str(out))
    assert "embedding" in str(e.value) and "\n" not in str(e.value)
