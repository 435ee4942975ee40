"""The conversation pool (edgespec/server/prefix.py) on tiny real models: every answer equals a
cold engine's, and the prefill figures show which conversation's cache was reused."""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Finished, Token
from edgespec.runtime import Engine
from edgespec.server.prefix import FORK_TAIL, ConversationPool, copy_prefix

GREEDY = GenerationConfig(
    SamplingConfig(temperature=0), SpecConfig(k=3, method="hybrid", adaptive=False), 24
)
SAMPLED = GenerationConfig(
    SamplingConfig(temperature=1.0, seed=5), SpecConfig(k=3, method="draft", adaptive=False), 24
)
SYSTEM = {"role": "system", "content": " ".join(["the river is light and the sun is one"] * 4)}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def ask(engine: Engine, pool: ConversationPool, messages, config=GREEDY):
    """One request through the pool, as the worker runs it: (answer text, ids, Finished)."""
    ids = engine.encode_chat(messages)
    pool.acquire(ids)
    events = list(engine.generate(ids, config))
    pool.release()
    tokens = [e.id for e in events if isinstance(e, Token)]
    return events[-1].text, tokens, events[-1]


def cold(models, messages, config=GREEDY) -> list[int]:
    engine = Engine(*models)
    return [e.id for e in engine.chat(messages, config) if isinstance(e, Token)]


def turn_two(messages, answer: str, text: str):
    return [*messages, {"role": "assistant", "content": answer}, user(text)]


@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_interleaved_conversations_each_reuse_their_own_cache(tiny_models, config):
    engine = Engine(*tiny_models)
    pool = ConversationPool(engine, budget_bytes=1 << 30, max_slots=4)
    a1, b1 = [user("why is the river light")], [user("how fast is the draft model")]
    ans_a, ids_a, _ = ask(engine, pool, a1, config)
    ans_b, ids_b, _ = ask(engine, pool, b1, config)
    a2, b2 = turn_two(a1, ans_a, "and the moon"), turn_two(b1, ans_b, "and the target")
    _, ids_a2, fin_a2 = ask(engine, pool, a2, config)
    _, ids_b2, fin_b2 = ask(engine, pool, b2, config)
    assert ids_a == cold(tiny_models, a1, config) and ids_b == cold(tiny_models, b1, config)
    assert ids_a2 == cold(tiny_models, a2, config) and ids_b2 == cold(tiny_models, b2, config)
    for first, fin in ((a1, fin_a2), (b1, fin_b2)):
        cached = fin.stats.prompt_tokens - fin.stats.prefilled_tokens
        assert cached >= len(engine.encode_chat(first))  # at least turn one's whole prompt
    assert len(pool.slots) == 2


def test_without_the_pool_the_other_conversation_is_prefilled_again(tiny_models):
    """The same turns with one slot: the second conversation pushed the first one out."""
    engine = Engine(*tiny_models)
    pool = ConversationPool(engine, budget_bytes=1 << 30, max_slots=1)
    a1, b1 = [user("why is the river light")], [user("how fast is the draft model")]
    ans_a, _, _ = ask(engine, pool, a1)
    ask(engine, pool, b1)
    _, _, fin = ask(engine, pool, turn_two(a1, ans_a, "and the moon"))
    assert fin.stats.prompt_tokens - fin.stats.prefilled_tokens < len(engine.encode_chat(a1)) // 2


def test_a_shared_system_prompt_is_copied_and_both_conversations_stay_cached(tiny_models):
    engine = Engine(*tiny_models)
    pool = ConversationPool(engine, budget_bytes=1 << 30, max_slots=4)
    a1, b1 = [SYSTEM, user("why is the river light")], [SYSTEM, user("what is a bonus token")]
    ans_a, _, _ = ask(engine, pool, a1)
    assert len(pool.slots[0].tokens) - len(engine.encode_chat([SYSTEM])) > FORK_TAIL
    _, ids_b, fin_b = ask(engine, pool, b1)  # shares the system prompt with A: a fork
    assert len(pool.slots) == 2
    shared = len(engine.encode_chat([SYSTEM])) - 3  # the template's assistant header differs
    assert fin_b.stats.prompt_tokens - fin_b.stats.prefilled_tokens >= shared
    assert ids_b == cold(tiny_models, b1)
    a2 = turn_two(a1, ans_a, "and the moon")
    _, ids_a2, fin_a2 = ask(engine, pool, a2)  # A's own cache survived B
    assert fin_a2.stats.prompt_tokens - fin_a2.stats.prefilled_tokens >= len(engine.encode_chat(a1))
    assert ids_a2 == cold(tiny_models, a2)


def test_least_recently_used_conversation_goes_first(tiny_models):
    engine = Engine(*tiny_models)
    pool = ConversationPool(engine, budget_bytes=1 << 30, max_slots=2)
    firsts = [[user(q)] for q in ("why is the river light", "what is one", "how is the dog")]
    answers = [ask(engine, pool, m)[0] for m in firsts]
    assert len(pool.slots) == 2
    cached = pool.cached()
    assert cached[0][:5] == engine.encode_chat(firsts[2])[:5]
    prompts = [engine.encode_chat(m) for m in firsts]
    assert not any(c[: len(prompts[0]) - 1] == prompts[0][:-1] for c in cached)  # the first: gone
    _, _, fin = ask(engine, pool, turn_two(firsts[1], answers[1], "and two"))
    assert fin.stats.prompt_tokens - fin.stats.prefilled_tokens >= len(prompts[1])


def test_the_byte_budget_keeps_only_the_conversation_in_use(tiny_models):
    engine = Engine(*tiny_models)
    pool = ConversationPool(engine, budget_bytes=1, max_slots=4)
    a1, b1 = [user("why is the river light")], [user("how fast is the draft model")]
    ans_a, _, _ = ask(engine, pool, a1)
    assert pool.nbytes() > 1 and len(pool.slots) == 1  # the one in use is kept over budget
    ask(engine, pool, b1)
    a2 = turn_two(a1, ans_a, "and the moon")
    _, ids, fin = ask(engine, pool, a2)
    assert len(pool.slots) == 1 and ids == cold(tiny_models, a2)
    assert fin.stats.prompt_tokens - fin.stats.prefilled_tokens < len(engine.encode_chat(a1)) // 2


def test_zero_slots_prefills_every_prompt_whole(tiny_models):
    engine = Engine(*tiny_models)
    pool = ConversationPool(engine, budget_bytes=1 << 30, max_slots=0)
    a1 = [user("why is the river light")]
    ans, _, _ = ask(engine, pool, a1)
    a2 = turn_two(a1, ans, "and the moon")
    _, ids, fin = ask(engine, pool, a2)
    assert fin.stats.prefilled_tokens == fin.stats.prompt_tokens and ids == cold(tiny_models, a2)


def test_what_a_token_costs_is_kept_when_no_set_holds_one(tiny_models):
    """With no reuse the next request gets an emptied set, yet the cost of a token measured on
    the last one stays known: a batch admits a burst's jobs beside its first (Batch.fits)
    instead of waiting for the first one's cache to grow again."""
    engine = Engine(*tiny_models)
    pool = ConversationPool(engine, budget_bytes=1 << 30, max_slots=0)
    assert pool.bytes_per_token() == 0.0  # nothing measured yet
    ask(engine, pool, [user("why is the river light")])
    measured = pool.bytes_per_token()
    assert measured > 0
    pool.acquire(engine.encode_chat([user("and the moon")]))  # an emptied set: no position held
    assert pool.bytes_per_token() == measured


def test_copy_prefix_gives_the_same_logits_and_leaves_the_source_alone(tiny_models):
    engine = Engine(*tiny_models)
    ids = engine.encode_chat([SYSTEM, user("why is the river light")])
    src, _ = engine.new_states()
    src.prefill(ids)
    dst, _ = engine.new_states()
    n = len(ids) - 6
    copy_prefix(src, dst, n)
    assert dst.offset == n and dst.tokens == ids[:n]
    tail = mx.array(ids[n : n + 3], dtype=mx.int32)
    got = dst.forward(tail)
    src.rewind(ids, n)
    want = src.forward(tail)
    assert mx.allclose(got, want, atol=1e-5).item()


def test_a_stop_cut_answer_continues_like_a_cold_engine(tiny_models):
    """The worker stops mid-round at a stop string: the caches then hold tokens past the cut;
    the next turn (with the cut answer) must still equal a cold engine's."""
    engine = Engine(*tiny_models)
    pool = ConversationPool(engine, budget_bytes=1 << 30, max_slots=4)
    a1 = [user("why is the river light")]
    ids = engine.encode_chat(a1)
    pool.acquire(ids)
    text, n, cancel = "", 0, threading.Event()
    for event in engine.generate(ids, GREEDY, cancel):
        if isinstance(event, Token) and not cancel.is_set():
            text, n = text + event.text, n + 1
            if n == 5:
                cancel.set()  # as the worker does at a stop string: the round runs on
    pool.release()
    held, _ = engine.cached_tokens()
    assert len(held) > len(ids)  # the cache kept generated tokens
    a2 = turn_two(a1, text, "and the moon")
    _, got, fin = ask(engine, pool, a2)
    assert got == cold(tiny_models, a2)
    assert isinstance(fin, Finished) and fin.stats.prefilled_tokens < fin.stats.prompt_tokens
