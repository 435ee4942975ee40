"""Runs on a real pair (the embedded default pair, the shipped feature-draft pair): an answer's
events, greedy speculative against plain decoding, MT-bench first turns."""

from __future__ import annotations

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Finished
from tests.helpers import token_ids
from tests.helpers.prompt_sets import MT_BENCH, first_turns, own_prompts, prompt_set, spread


def mt_bench_prompts(n: int) -> list[str]:
    """n MT-bench first turns (the test skips without EDGESPEC_MT_BENCH)."""
    return spread(first_turns(prompt_set(MT_BENCH)), n)


def answer(engine, prompt: str, spec: SpecConfig, temp: float = 0.0, n: int = 48) -> list:
    cfg = GenerationConfig(SamplingConfig(temperature=temp, seed=3), spec, max_tokens=n)
    engine.reset()
    return list(engine.chat([{"role": "user", "content": prompt}], cfg))


def assert_greedy_speculative_equals_plain(engine, k: int, n_prompts: int = 3) -> None:
    """On the project's own prompts, greedy speculative decoding at K = k emits plain decoding's
    tokens, and it did draft."""
    for prompt in own_prompts(n_prompts):
        plain = token_ids(answer(engine, prompt, SpecConfig(method="none")))
        events = answer(engine, prompt, SpecConfig(k=k, method="draft", adaptive=False))
        assert token_ids(events) == plain, prompt
        assert isinstance(events[-1], Finished) and events[-1].stats.drafted > 0
        assert events[-1].stats.tau >= 1.0
