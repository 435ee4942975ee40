"""The first token comes from the first round's own forward: the prompt's last chunk is fed in
it rather than in a prefill forward of its own, and a first round that drafts nothing is read
back before another forward is queued."""

from __future__ import annotations

import pytest

from edgespec import cache
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Round, Token
from edgespec.runtime import Engine
from tests.helpers import Scripted

PROMPT = "the river runs under the old bridge"
GREEDY = SamplingConfig(temperature=0)


def _watch(engine: Engine, monkeypatch) -> list[tuple[str, int]]:
    """(state, input length) of every target and draft forward, in order."""
    calls: list[tuple[str, int]] = []
    for name, state in (("target", engine._target), ("draft", engine._draft)):
        forward = state.forward

        def counted(inputs, head_only=False, _forward=forward, _name=name):
            calls.append((_name, int(inputs.shape[0])))
            return _forward(inputs, head_only)

        monkeypatch.setattr(state, "forward", counted)
    return calls


def _until_first_token(engine: Engine, ids: list[int], spec: SpecConfig) -> list:
    events = []
    for event in engine.generate(ids, GenerationConfig(GREEDY, spec, 24)):
        events.append(event)
        if isinstance(event, Token):
            break
    return events


@pytest.mark.parametrize("k", [0, 3])
def test_the_first_rounds_forward_reads_the_prompt_and_gives_the_first_token(
    tiny_models, monkeypatch, k
):
    """K = 3: the draft's prefill and steps, then one target forward of the prompt's tail plus
    the drafts. K = 0 (plain decoding): one target forward of the prompt."""
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    calls = _watch(engine, monkeypatch)
    spec = SpecConfig(k=k, method="draft", adaptive=False) if k else SpecConfig(method="none")
    _until_first_token(engine, ids, spec)
    targets = [n for who, n in calls if who == "target"]
    assert targets[0] == len(ids) + k  # (K = 0: the next step's forward queued behind it)
    assert targets[1:] == ([] if k else [1])
    assert [n for who, n in calls if who == "draft"][:1] == ([len(ids) - 1] if k else [])


@pytest.mark.parametrize("packed", [False, True])
def test_a_first_plain_round_in_a_packed_batch_is_read_back_before_the_next_forward(
    tiny_models, monkeypatch, packed
):
    """K = 0 rounds: alone, the second step's forward is queued before the first token is read
    back (pipelined, like mlx-lm); with a packer (a server's batch) the first token is out after
    one forward, since a queued forward would wait for the others' turn."""
    engine = Engine(*tiny_models)
    if packed:  # states built with a shared forward (a batch of one: each forward as its own)
        engine.swap_states(*engine.new_states(_alone))
    ids = engine.encode_raw(PROMPT)
    calls = _watch(engine, monkeypatch)
    config = GenerationConfig(GREEDY, SpecConfig(k=3, method="draft", adaptive=False), 6)
    seen = [
        len([c for c in calls if c[0] == "target"])
        for e in engine.generate(ids, config, k_policy=Scripted(lambda _last: 0))
        if isinstance(e, Token)
    ]
    assert seen[:2] == ([1, 3] if packed else [2, 3])


@pytest.mark.parametrize("k", [0, 3])
def test_a_longer_tail_is_prefilled_apart(tiny_models, monkeypatch, k):
    """Past MERGE_MAX uncached tokens the prompt is prefilled as before (all but its last
    token): the first forward computes the target's head on every row it feeds."""
    monkeypatch.setattr(cache, "MERGE_MAX", 8)
    engine = Engine(*tiny_models)
    ids = engine.encode_raw(PROMPT)
    assert len(ids) > 8
    calls = _watch(engine, monkeypatch)
    spec = SpecConfig(k=k, method="draft", adaptive=False) if k else SpecConfig(method="none")
    _until_first_token(engine, ids, spec)
    assert [n for who, n in calls if who == "target"][:2] == [len(ids) - 1, 1 + k]


@pytest.mark.parametrize("method", ["draft", "hybrid"])
def test_output_with_the_merged_prompt_equals_plain_decoding(tiny_models, method):
    engine = Engine(*tiny_models)

    def ids_of(ids: list[int], spec: SpecConfig) -> list[int]:
        events = Engine(*tiny_models).generate(ids, GenerationConfig(GREEDY, spec, 32))
        return [e.id for e in events if isinstance(e, Token)]

    for text in (PROMPT, " ".join([PROMPT] * 2)):  # merged, and past MERGE_MAX
        ids = engine.encode_raw(text)
        assert ids_of(ids, SpecConfig(k=3, method=method, adaptive=False)) == ids_of(
            ids, SpecConfig(method="none")
        )
    # A fresh engine: its first verify also reads the prompt, so adaptive K does not time it.
    fresh = Engine(*tiny_models)
    config = GenerationConfig(GREEDY, SpecConfig(k=3, method=method, adaptive=False), 8)
    short = engine.encode_raw(PROMPT)  # within MERGE_MAX: merged
    rounds = [e for e in fresh.generate(short, config) if isinstance(e, Round)]
    assert not rounds[0].timed and all(r.timed for r in rounds[1:] if r.drafted)


def _alone(state: cache.KVState, inputs, head_only: bool):
    """The shared forward of a batch of one (cache.Forward): each forward as its own."""
    return state.forward_alone(inputs, head_only)


def test_in_a_packed_batch_the_draft_reads_the_prompt_when_it_first_drafts(
    tiny_models, monkeypatch
):
    """A batch may decode plainly for a while (the server's BatchMode): its requests' drafts
    read the prompt only before their first drafting round, and a warm draft cache that holds
    another conversation is cut back to what it shares with the prompt (not trusted as is)."""
    engine = Engine(*tiny_models)
    engine.swap_states(*engine.new_states(_alone))
    other = engine.encode_raw("a different conversation about the sea")
    list(
        engine.generate(
            other, GenerationConfig(GREEDY, SpecConfig(k=3, method="draft", adaptive=False), 12)
        )
    )
    ids = engine.encode_raw(PROMPT)
    plain = [
        e.id
        for e in Engine(*tiny_models).generate(
            ids, GenerationConfig(GREEDY, SpecConfig(method="draft", adaptive=False), 24)
        )
        if isinstance(e, Token)
    ]
    calls = _watch(engine, monkeypatch)
    script = iter([0, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3])
    out, drafts_at_first_drafting = [], None
    config = GenerationConfig(GREEDY, SpecConfig(k=3, method="draft", adaptive=False), 24)
    for event in engine.generate(ids, config, k_policy=Scripted(lambda _last: next(script, 3))):
        if isinstance(event, Token):
            out.append(event.id)
        elif isinstance(event, Round) and event.drafted and drafts_at_first_drafting is None:
            drafts_at_first_drafting = [n for who, n in calls if who == "draft"]
    assert out == plain
    first_draft = [n for who, n in calls if who == "draft"][0]
    # plain steps first, no draft forward; then the draft reads the prompt and what followed
    assert calls[0] == ("target", len(ids)) and first_draft > 2
    assert drafts_at_first_drafting and drafts_at_first_drafting[0] == first_draft
