"""The first token comes from one target forward: the prompt's last chunk is fed in the first
round (a plain step, or a lookup's round), and the draft reads the prompt only afterwards."""

from __future__ import annotations

import pytest

from edgespec import cache
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Round, Token
from edgespec.runtime import Engine

PROMPT = "the river runs under the old bridge"


def _watch(engine: Engine, monkeypatch) -> dict[str, list[int]]:
    """Input lengths of every target and draft forward, by state."""
    calls: dict[str, list[int]] = {"target": [], "draft": []}
    for name, state in (("target", engine._target), ("draft", engine._draft)):
        forward = state.forward

        def counted(inputs, head_only=False, _forward=forward, _name=name):
            calls[_name].append(int(inputs.shape[0]))
            return _forward(inputs, head_only)

        monkeypatch.setattr(state, "forward", counted)
    return calls


def _until_first_token(engine: Engine, ids: list[int], spec: SpecConfig) -> list:
    events = []
    for event in engine.generate(ids, GenerationConfig(SamplingConfig(temperature=0), spec, 24)):
        events.append(event)
        if isinstance(event, Token):
            break
    return events


@pytest.mark.parametrize("method", ["draft", "hybrid"])
def test_first_token_costs_one_target_forward_and_no_draft_forward(
    tiny_models, monkeypatch, method
):
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    calls = _watch(engine, monkeypatch)
    _until_first_token(engine, ids, SpecConfig(k=3, method=method))
    assert calls == {"target": [len(ids)], "draft": []}


def test_the_draft_catches_up_before_it_drafts_and_output_stays_exact(tiny_models):
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    greedy = SamplingConfig(temperature=0)
    plain = [
        e.id
        for e in engine.generate(ids, GenerationConfig(greedy, SpecConfig(method="none"), 24))
        if isinstance(e, Token)
    ]
    events = list(
        engine.generate(ids, GenerationConfig(greedy, SpecConfig(k=3, method="draft"), 24))
    )
    assert [e.id for e in events if isinstance(e, Token)] == plain
    rounds = [e for e in events if isinstance(e, Round)]
    assert rounds[0].drafted == 0 and all(r.drafted == 3 for r in rounds[1:-1])


def test_a_long_prompt_is_still_prefilled_in_chunks(tiny_models, monkeypatch):
    """Only the last chunk joins the first round; the ones before run as before."""
    monkeypatch.setattr(cache, "PREFILL_CHUNK", 8)
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(" ".join([PROMPT] * 3))
    assert len(ids) > 16
    calls = _watch(engine, monkeypatch)
    _until_first_token(engine, ids, SpecConfig(k=3, method="draft"))
    chunks = (len(ids) - 1) // 8
    assert calls["target"] == [8] * chunks + [len(ids) - 8 * chunks] and not calls["draft"]


def test_a_repeated_prompt_lets_a_lookup_propose_in_the_first_round(tiny_models, monkeypatch):
    """Hybrid drafting: a lookup costs no forward, so the first round verifies its tokens with
    the prompt's tail, still in one target forward."""
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(" ".join([PROMPT] * 3))
    calls = _watch(engine, monkeypatch)
    events = list(
        engine.generate(
            ids, GenerationConfig(SamplingConfig(0), SpecConfig(k=3, method="hybrid"), 8)
        )
    )
    first = next(e for e in events if isinstance(e, Round))
    assert first.method == "ngram" and first.drafted > 0 and not first.timed
    assert calls["target"][0] == len(ids) + first.drafted
