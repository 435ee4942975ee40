"""Engine behaviour: cache offsets per round, prefix reuse, cancel, events, errors."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import mlx.nn as nn
import pytest
from mlx_lm.models.cache import RotatingKVCache

from edgespec.bench.runner import warm_kernels
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.errors import CacheNotTrimmableError, ContextLengthError, PromptError
from edgespec.events import Finished, Round, Token
from edgespec.runtime import Engine
from tests.helpers import token_ids

GREEDY = GenerationConfig(
    SamplingConfig(temperature=0), SpecConfig(k=4, method="draft", adaptive=False), max_tokens=40
)
SAMPLED = GenerationConfig(
    SamplingConfig(temperature=1.0, seed=11),
    SpecConfig(k=3, method="draft", adaptive=False),
    max_tokens=40,
)
MESSAGES = [{"role": "user", "content": "why is the river light"}]


def _assert_consistent(engine: Engine, committed: list[int], bonus: bool) -> None:
    """Both caches hold a prefix of the committed tokens and their token lists match offsets."""
    t_tokens, d_tokens = engine.cached_tokens()
    assert engine._target.offset == len(t_tokens) == len(committed) - 1
    assert t_tokens == committed[:-1]
    assert engine._draft.offset == len(d_tokens) == len(committed) - (2 if bonus else 1)
    assert d_tokens == committed[: len(d_tokens)]


@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("models", ["tiny_models", "tiny_self_models"])
def test_cache_offsets_equal_committed_length_after_every_round(request, models, config):
    engine = Engine(*request.getfixturevalue(models))
    committed = engine.encode_chat(MESSAGES)
    rounds = 0
    for event in engine.generate(committed, config):
        if isinstance(event, Token):
            committed = committed + [event.id]
        elif isinstance(event, Round):
            rounds += 1
            _assert_consistent(engine, committed, bonus=event.accepted == event.k)
    assert rounds > 0


@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_prefix_reuse_gives_the_cold_start_output(tiny_models, config):
    warm = Engine(*tiny_models)
    first = list(warm.chat(MESSAGES, config))
    follow = MESSAGES + [
        {"role": "assistant", "content": first[-1].text},
        {"role": "user", "content": "and the moon"},
    ]
    second = list(warm.chat(follow, config))
    cold = list(Engine(*tiny_models).chat(follow, config))
    assert token_ids(second) == token_ids(cold)
    stats = second[-1].stats
    assert stats.prefilled_tokens < stats.prompt_tokens == cold[-1].stats.prefilled_tokens


def test_whole_prompt_cached_recomputes_only_the_last_token(engine):
    a = list(engine.chat(MESSAGES, GREEDY))
    b = list(engine.chat(MESSAGES, GREEDY))
    assert token_ids(a) == token_ids(b)
    assert b[-1].stats.prefilled_tokens == 1


def test_plain_then_speculative_share_the_target_cache(engine):
    plain = list(
        engine.chat(MESSAGES, GenerationConfig(GREEDY.sampling, SpecConfig(method="none"), 40))
    )
    spec = list(engine.chat(MESSAGES, GREEDY))
    assert token_ids(plain) == token_ids(spec)
    assert {e.kind for e in plain if isinstance(e, Token)} == {"target"}
    assert not any(isinstance(e, Round) for e in plain)
    assert plain[-1].stats.tau == 1.0 and plain[-1].stats.rounds == 40


def test_cancel_between_rounds_leaves_consistent_caches(tiny_models):
    engine = Engine(*tiny_models)
    cancel = threading.Event()
    committed = engine.encode_chat(MESSAGES)
    events = []
    for event in engine.generate(committed, GREEDY, cancel):
        events.append(event)
        if isinstance(event, Token):
            committed = committed + [event.id]
        if isinstance(event, Round) and event.index == 2:
            cancel.set()
            last_bonus = event.accepted == event.k
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled"
    assert sum(isinstance(e, Round) for e in events) == 3
    _assert_consistent(engine, committed, bonus=last_bonus)
    # and the next request still equals a cold start
    assert token_ids(engine.chat(MESSAGES, GREEDY)) == token_ids(
        Engine(*tiny_models).chat(MESSAGES, GREEDY)
    )


def test_event_stream_contract(engine):
    config = GenerationConfig(spec=SpecConfig(method="draft", adaptive=False), max_tokens=30)
    events = list(engine.chat(MESSAGES, config))
    assert [type(e) for e in events].count(Finished) == 1 and isinstance(events[-1], Finished)
    tokens = [e for e in events if isinstance(e, Token)]
    rounds = [e for e in events if isinstance(e, Round)]
    fin = events[-1]
    assert fin.reason == "length" and fin.stats.tokens == len(tokens) == 30
    assert fin.text.startswith("".join(t.text for t in tokens)[: len(fin.text) - 4])
    assert fin.stats.rounds == len(rounds) and fin.stats.drafted == sum(r.drafted for r in rounds)
    assert sum(fin.stats.accepted_hist) == len(rounds)
    assert fin.stats.ttft > 0 and fin.stats.tokens_per_s > 0
    assert all(t.kind in ("accepted", "corrected", "bonus") for t in tokens)
    assert engine.name == "target + draft" and engine.has_draft


def test_warm_kernels_runs_every_length_and_leaves_the_engine_as_it_was(engine):
    before = token_ids(engine.chat(MESSAGES, GREEDY))
    held = engine.cached_tokens()
    seen: list[tuple[str, int]] = []
    states = engine.new_states()
    for state in states:
        forward = state.forward

        def logged(inputs, head_only=False, forward=forward, name=state.name):
            seen.append((name, inputs.shape[0]))
            return forward(inputs, head_only)

        state.forward = logged
    engine.new_states = lambda: states
    warm_kernels(engine, (1, 5, 64))
    assert [n for name, n in seen if name.startswith("target")] == [1, 5, 64]
    assert {n for name, n in seen if name.startswith("draft")} == {1, 5, 64}
    assert engine.cached_tokens() == held
    assert token_ids(engine.chat(MESSAGES, GREEDY)) == before


def test_stops_at_eos_without_emitting_it(tiny_models):
    target, draft = tiny_models
    engine = Engine(target, draft)
    ids = engine.encode_chat(MESSAGES)
    free = token_ids(engine.generate(ids, GREEDY))
    stop_id = free[5]  # pretend this token is EOS: generation must stop right before it
    target = SimpleNamespace(**vars(target))
    target.tokenizer = SimpleNamespace(
        eos_token_ids={stop_id}, detokenizer=engine.tokenizer.detokenizer
    )
    events = list(Engine(target, draft).generate(ids, GREEDY))
    assert token_ids(events) == free[: free.index(stop_id)]
    assert events[-1].reason == "stop"


def test_prompt_errors(engine):
    with pytest.raises(PromptError, match="empty"):
        engine.generate([], GREEDY)
    with pytest.raises(PromptError, match="empty"):
        engine.encode_raw("   ")
    with pytest.raises(ContextLengthError, match="context window of .* is 512"):
        engine.generate([5] * 512, GREEDY)


def test_prompts_that_are_not_token_ids_are_refused_before_touching_the_caches(engine):
    import mlx.core as mx
    import numpy as np

    ids = engine.encode_chat(MESSAGES)
    first = token_ids(engine.generate(ids, GREEDY))
    vocab = engine._vocab
    with pytest.raises(PromptError, match="takes token ids"):
        engine.generate("why is the river light", GREEDY)  # type: ignore[arg-type]
    with pytest.raises(PromptError, match="must be token ids"):
        engine.generate([1.5, 2.0], GREEDY)  # type: ignore[list-item]
    with pytest.raises(
        PromptError, match=rf"{vocab} in the prompt is not a token id \(0..{vocab - 1}\)"
    ):
        engine.generate([*ids, vocab], GREEDY)  # one past the embedding: would read outside it
    with pytest.raises(PromptError, match="-1 in the prompt"):
        engine.generate([-1, *ids], GREEDY)
    # numpy and MLX ids are ids; the refusals left the caches as they were
    assert token_ids(engine.generate(np.array(ids), GREEDY)) == first
    assert token_ids(engine.generate(mx.array(ids), GREEDY)) == first  # type: ignore[arg-type]


class _Recurrent(nn.Module):
    """A model whose cache can be neither trimmed nor restored (a ring with sink tokens; SSM /
    hybrid layers, ArraysCache, are restored: tests/loading/test_architectures.py)."""

    def make_cache(self):
        return [RotatingKVCache(8, keep=4)]


def test_untrimmable_cache_is_refused(tiny_models):
    target, _ = tiny_models
    bad = SimpleNamespace(model=_Recurrent(), tokenizer=None, name="ssm", context_window=512)
    engine = Engine(target, bad)  # plain decoding never needs to refuse a cache
    with pytest.raises(CacheNotTrimmableError, match="ssm"):
        list(
            engine.generate(
                [1, 2, 3],
                GenerationConfig(
                    GREEDY.sampling, SpecConfig(k=2, method="draft", adaptive=False), 4
                ),
            )
        )


@pytest.mark.slow
def test_real_model_speculative_greedy_equals_plain():
    """SmolLM2-135M-Instruct as its own draft (separate caches): output unchanged, all accepted."""
    from edgespec.loading.load import load_model
    from edgespec.loading.specs import load_catalog
    from edgespec.loading.status import model_status

    name = load_catalog().pair().target
    if not model_status(name, load_catalog()).present:
        pytest.skip(f"{name} is not on this machine (edgespec pull)")
    target = load_model(name)
    engine = Engine(target, target)
    ids = engine.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    plain = list(
        engine.generate(ids, GenerationConfig(GREEDY.sampling, SpecConfig(method="none"), 24))
    )
    spec = list(
        engine.generate(
            ids,
            GenerationConfig(GREEDY.sampling, SpecConfig(k=4, method="draft", adaptive=False), 24),
        )
    )
    assert token_ids(plain) == token_ids(spec) and "Paris" in plain[-1].text
    assert spec[-1].stats.acceptance > 0.9
