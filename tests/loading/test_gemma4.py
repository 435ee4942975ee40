"""Gemma 4: mlx-lm's gemma4_text, and gemma4 as mlx-community folders ship it (edgespec/loading/
tiny_arch.py builds both). Sliding-window layers (WindowKVCache) between global ones, and the last
half of the layers KV-shared: they have no cache of their own and attend over the keys and values
an earlier layer of their kind just stored, so rewinding the caches the model has rewinds them too.

The per-family checks (greedy identity at K = 1..4, self-draft, as a draft of another family,
trees refused, the T = 1 statistical test, CPU rewrites) run on gemma4_text in
tests/loading/test_architectures.py. Here: the cache layout those checks rely on, answers long
enough for the window caches to compact, a prompt sharing a prefix with the previous request, the
mlx-community form through the command line, and planted bugs the checks must catch.
"""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from edgespec.config import SpecConfig
from edgespec.errors import ConfigError
from edgespec.loading.load import load_pair
from edgespec.rewind import Rewinder, WindowKVCache
from edgespec.runtime import Engine
from edgespec.taps import TOP, target_features
from tests.helpers.arch_models import PROMPT, Families, first_difference, generate, sampled_p_value
from tests.helpers.cli import run_edgespec
from tests.helpers.stats import assert_follows

LONG = 360  # past a window cache's first compaction (window 16 + DEPTH 66 + step 256 positions)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Families:
    return Families(tmp_path_factory.mktemp("gemma4"))


def _plain_and_spec(engine: Engine, ids: list[int], n: int, k: int = 3) -> tuple[list, list]:
    plain = generate(engine, ids, SpecConfig(method="none"), n)[0]
    return plain, generate(engine, ids, SpecConfig(k=k, method="draft", adaptive=False), n)[0]


def _next_turn_is_exact(families: Families, family: str, engine: Engine, follow: list[int]) -> None:
    """The engine's speculative answer to `follow` (its caches hold an earlier request) equals a
    fresh engine's plain one."""
    spec = generate(engine, follow, SpecConfig(k=3, method="draft", adaptive=False), 40)[0]
    fresh = Engine(*families.pair(family))
    assert spec == generate(fresh, follow, SpecConfig(method="none"), 40)[0]


@pytest.mark.parametrize("family", ["gemma4_text", "gemma4"])
def test_only_the_layers_that_store_keys_have_caches(families, family):
    """4 layers: sliding, global, then two KV-shared ones reading layers 0 and 1's keys. The
    prompt cache has one rewindable layer per storing layer; the shared ones have none."""
    model = families.engine(family).target.model
    text = getattr(model, "language_model", model)
    assert text.args.num_kv_shared_layers == 2
    assert text.model.previous_kvs == [0, 1, 0, 1]
    state = families.engine(family)._target
    assert [type(c) for c in state.cache] == [WindowKVCache, KVCache]
    assert state.layers.trims  # every layer goes back by trimming: no restore, no start over


SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "family",
    ["gemma4_text", pytest.param("gemma4", marks=SLOW), pytest.param("gemma4_moe", marks=SLOW)],
)
def test_a_long_answer_equals_plain_decoding_past_window_compaction(families, family):
    """360 tokens: over 20 windows, and the window caches drop old keys (compaction) while the
    KV-shared layers read them (the experts form has none); speculation with the smaller Gemma 4
    equals plain decoding. Then a request sharing only the answer's first 20 tokens: keys the
    window caches dropped are needed again, so the caches start over, exactly."""
    engine = families.engine(family)
    ids = engine.encode_raw(PROMPT)
    plain, spec = _plain_and_spec(engine, ids, LONG)
    assert len(plain) == LONG and first_difference(spec, plain) is None
    assert engine._target.cache[0].start > 0  # the window cache compacted
    for held in engine.cached_tokens():
        assert held is not None and held == (ids + plain)[: len(held)]
    _next_turn_is_exact(families, family, engine, (ids + plain)[: len(ids) + 20] + ids)
    assert engine._target.cache[0].start == 0  # started over (this answer is too short to compact)


def test_a_prompt_longer_than_a_prefill_chunk_speculates_exactly(families):
    """700 prompt tokens: prefilled in chunks of 512, the window caches compacting inside the
    second chunk (a mask and held keys for 188 new positions at once, which the KV-shared layers
    share); the answer after it equals plain decoding."""
    engine = families.engine("gemma4_text")
    ids = [(5 * i + 1) % 300 + 4 for i in range(700)]
    plain, spec = _plain_and_spec(engine, ids, 40)
    assert first_difference(spec, plain) is None
    assert engine._target.cache[0].start > 0


def test_the_mixture_of_experts_form_speculates_exactly(families):
    """26B-A4B style (experts beside every MLP): greedy output equals plain decoding at K = 1..4,
    and answers sampled at T = 1 follow the target's distribution (KS test on PIT values)."""
    engine = families.engine("gemma4_moe")
    ids = engine.encode_raw(PROMPT)
    plain = generate(engine, ids, SpecConfig(method="none"), 56)[0]
    for k in (1, 2, 3, 4):
        assert (
            generate(engine, ids, SpecConfig(k=k, method="draft", adaptive=False), 56)[0] == plain
        ), k
    spec = SpecConfig(k=3, method="draft", adaptive=False)
    assert_follows(lambda seeds: sampled_p_value(engine, spec, seeds, 40)[0], range(3), "moe")


def test_a_next_request_sharing_a_prefix_reuses_the_caches_exactly(families):
    """A chat's next turn: the previous prompt and part of its answer, then more. The caches are
    trimmed back to the common prefix (before compaction a window cache holds every position;
    after it: the long-answer test) and the answer equals a fresh engine's plain one."""
    engine = families.engine("gemma4_text")
    ids = engine.encode_raw(PROMPT)
    first = generate(engine, ids, SpecConfig(k=3, method="draft", adaptive=False), 60)[0]
    for cut in (len(ids) + 55, len(ids) + 20):  # a few positions back, then past the window
        follow = (ids + first)[:cut] + engine.encode_raw(" and the bird")
        _next_turn_is_exact(families, "gemma4_text", engine, follow)
        assert engine._target.tokens[:cut] == follow[:cut]


@pytest.mark.parametrize("family", ["gemma4_text", "gemma4"])
def test_a_forward_with_features_gives_the_models_own_logits(families, family):
    """What a feature draft's verify reads (taps.target_features): the logits of model(ids),
    soft-capped, through the multimodal config too (once: no soft-capping, and an AttributeError
    on gemma4), and the hidden states of the layers asked for (here layer 1 and the top)."""
    model = families.pair(family)[0].model
    ids = mx.array([(7 * i + 3) % 300 + 4 for i in range(20)], dtype=mx.int32)
    feats, logits = target_features(model, ids, None, (1, TOP))
    assert mx.array_equal(logits, model(ids[None])[0]).item()
    assert feats.shape == (20, 2 * 64)


def _token_ids(*args: str) -> list[int]:
    proc = run_edgespec("generate", PROMPT, "--json", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    return [e["id"] for e in lines if e.get("type") == "token"]


def test_the_command_line_speculates_exactly_on_an_mlx_community_style_gemma4(families):
    """`edgespec generate` with the gemma4 (multimodal-config) target and the smaller Gemma 4 as
    --draft at --temp 0 prints --no-spec's tokens; --tree is refused in one line."""
    target, draft = (str(p) for p in families.paths("gemma4"))
    models = ("--target", target, "--draft", draft, "--temp", "0", "--max-tokens", "150")
    plain = _token_ids(*models, "--no-spec")
    assert len(plain) == 150
    assert _token_ids(*models, "--method", "draft", "--no-adaptive", "-k", "3") == plain
    proc = run_edgespec("generate", PROMPT, *models, "--tree", "3,2,1")
    assert proc.returncode != 0 and "--tree chain" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr


def test_a_gemma4_assistant_without_its_config_fields_is_a_one_line_error(families, tmp_path):
    """Google's Gemma 4 drafters (`-assistant`, gemma4_assistant) load as drafts of a Gemma 4
    target (tests/loop/test_gemma4_assistant.py); a config.json without the fields they need is
    one line naming the first missing one."""
    head = tmp_path / "gemma-4-E2B-it-assistant"
    head.mkdir()
    config = {"model_type": "gemma4_assistant", "text_config": {"model_type": "gemma4_text"}}
    (head / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(head / "model.safetensors"), {"w": mx.zeros((4,))})
    with pytest.raises(ConfigError, match="backbone_hidden_size") as err:
        load_pair(str(families.paths("gemma4")[0]), str(head))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- planted bugs


def _forget_global_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rewinds trim the window layers only: the global layer's cache, which the KV-shared global
    layer reads too, keeps the rejected drafts."""

    def windows_only(self, keep):
        drop = self.offset - keep
        for layer in self.windows:
            layer.trim(drop)
        self.fed = keep
        return keep

    monkeypatch.setattr(Rewinder, "go_back", windows_only)


def test_the_checks_catch_a_global_cache_not_rewound(families, monkeypatch):
    """Greedy identity and the T = 1 statistical test (which passes on the real rewind:
    test_architectures.py's test_sampled_answers_follow_the_target_distribution) both fail."""
    engine = families.engine("gemma4_text")
    ids = engine.encode_raw(PROMPT)
    plain = generate(engine, ids, SpecConfig(method="none"), 56)[0]
    _forget_global_layers(monkeypatch)
    spec = generate(engine, ids, SpecConfig(k=3, method="draft", adaptive=False), 56)[0]
    assert first_difference(spec, plain) is not None
    p_value, _ = sampled_p_value(
        engine, SpecConfig(k=3, method="draft", adaptive=False), range(4), 60
    )
    assert p_value < 1e-6  # far from the test's 1e-3 threshold: docs/measurements
