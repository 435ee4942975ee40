"""A base model (no chat template) is benchmarked on text to continue: the catalogue marks it,
and the bench's default prompt file follows the target."""

from __future__ import annotations

from edgespec.bench.prompts import BASE_PROMPTS, DEFAULT_PROMPTS, default_prompt_file, load_prompts
from edgespec.loading.specs import load_catalog


def test_the_base_model_pair_gets_the_continuation_prompts():
    assert load_catalog().model("gemma3-270m").base_model
    assert default_prompt_file(None, None, "gemma3-270m") == BASE_PROMPTS
    assert default_prompt_file("gemma3-270m", None, None) == BASE_PROMPTS  # the model alone
    assert default_prompt_file(None, None, None) == DEFAULT_PROMPTS  # the embedded chat pair
    assert default_prompt_file(None, None, "no-such-pair") == DEFAULT_PROMPTS  # refused later


def test_the_continuation_set_covers_the_five_categories_twice():
    base, chat = load_prompts(BASE_PROMPTS), load_prompts(DEFAULT_PROMPTS)
    cats = [p.category for p in base]
    assert sorted(set(cats)) == sorted({p.category for p in chat})
    assert all(cats.count(c) == 2 for c in set(cats))
    assert not {p.text for p in base} & {p.text for p in chat}
