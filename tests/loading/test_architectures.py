"""Every architecture family a Mac user runs, built by mlx-lm's own model classes and quantized to
4 bits like an mlx-community folder (tests/helpers/tiny_arch.py): attention KV caches (llama
with Llama 3 rope scaling, qwen2, qwen3, phi3 with longrope, ministral3 with yarn, qwen3_moe),
sliding windows (gemma3_text, gemma4_text with KV-shared layers, gpt_oss: answers several
windows long) and recurrent layers (qwen3_next, qwen3_5: gated delta-nets in ArraysCache).
Gemma 4's own checks: tests/loading/test_gemma4.py.

Per family, as target and as draft: greedy output identical to plain decoding at K = 1..4, a
self-draft (every token accepted, bonus paths), the family's model drafting for another family's
target, a statistical test of sampled answers (PIT, tests/helpers/arch_models.py) and the CPU
rewrites bit-identical or stepping aside. The last tests plant the bugs these checks exist for (a
recurrent state not restored, a window cache that forgets what a rewind needs) and see them caught.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import mlx.core as mx
import pytest
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import make_prompt_cache

from edgespec import blas
from edgespec.backend import Backend, on_cpu
from edgespec.cache import KVState
from edgespec.config import SpecConfig
from edgespec.cpu import attention, blocks, heads
from edgespec.cpu.backend import CpuBackend, twin
from edgespec.cpu.leanops import LeanLinear, LeanRMSNorm
from edgespec.cpu.rope import TableRoPE
from edgespec.errors import TreeUnsupportedError
from edgespec.loading.load import load_model
from edgespec.rewind import Rewinder, WindowKVCache
from edgespec.runtime import Engine
from tests.helpers.arch_models import Families, first_difference, generate, sampled_p_value
from tests.helpers.stats import assert_follows
from tests.helpers.tiny_arch import FAMILIES

ALL = list(FAMILIES)
WINDOWED = ("gemma3_text", "gemma4_text", "gpt_oss")
RECURRENT = ("qwen3_next", "qwen3_5")
GREEDY_TOKENS = 56  # two sliding windows (24) past the prompt


@pytest.fixture(scope="session")
def families(tmp_path_factory: pytest.TempPathFactory) -> Families:
    return Families(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="session")
def plain_answers(families: Families) -> dict[str, list[int]]:
    """Each family's plain greedy answer (computed on first use)."""

    class Answers(dict):
        def __missing__(self, family: str) -> list[int]:
            engine = families.engine(family)
            ids = engine.encode_raw("the cat and the dog in the house")
            self[family] = generate(engine, ids, SpecConfig(method="none"), GREEDY_TOKENS)[0]
            return self[family]

    return Answers()


def _greedy(engine: Engine, k: int, method: str = "draft") -> list[int]:
    ids = engine.encode_raw("the cat and the dog in the house")
    return generate(engine, ids, SpecConfig(k=k, method=method, adaptive=False), GREEDY_TOKENS)[0]


@pytest.mark.parametrize("family", ALL)
def test_greedy_speculation_equals_plain_decoding(families, plain_answers, family):
    engine = families.engine(family)
    plain = plain_answers[family]
    context = engine.encode_raw("the cat and the dog in the house") + plain
    assert len(plain) == GREEDY_TOKENS
    for k in (1, 2, 3, 4):
        assert first_difference(_greedy(engine, k), plain) is None, f"K={k}"
        for held in engine.cached_tokens():  # both caches hold a prefix of the conversation
            assert held is not None and held == context[: len(held)]


@pytest.mark.parametrize("family", ALL)
def test_a_self_draft_is_always_accepted_and_equals_plain(families, plain_answers, family):
    engine = families.engine(family, draft="self")
    ids = engine.encode_raw("the cat and the dog in the house")
    tokens, fin = generate(
        engine, ids, SpecConfig(k=4, method="draft", adaptive=False), GREEDY_TOKENS
    )
    assert tokens == plain_answers[family]
    assert fin.stats.acceptance == 1.0  # every round ends on a bonus token


@pytest.mark.parametrize("family", ALL)
def test_the_family_drafts_for_another_familys_target(families, plain_answers, family):
    """The family's 4-layer model as the draft of a qwen3 target (all tiny families share one
    tokenizer): its cache is the one rewound after every rejection."""
    other = "qwen3" if family != "qwen3" else "llama"
    engine = Engine(families.pair(other)[0], families.pair(family)[0])
    assert first_difference(_greedy(engine, 3), plain_answers[other]) is None
    assert first_difference(_greedy(engine, 2, "hybrid"), plain_answers[other]) is None


TREES = ("llama", "qwen2", "qwen3")  # the blocks the tree forward runs (edgespec/trees/forward.py)


@pytest.mark.parametrize("family", ALL)
def test_trees_run_where_supported_and_are_refused_in_one_line_elsewhere(
    families, plain_answers, family
):
    """Draft trees on every family: greedy output identical to plain decoding where the tree
    forward runs the blocks (Llama 3's scaled rope included); elsewhere (sliding windows,
    recurrent layers, other blocks) a one-line TreeUnsupportedError, never a traceback."""
    engine = families.engine(family)
    ids = engine.encode_raw("the cat and the dog in the house")
    spec = SpecConfig(k=3, method="draft", tree="3,2,1")
    if family in TREES:
        tokens, _ = generate(engine, ids, spec, GREEDY_TOKENS)
        assert first_difference(tokens, plain_answers[family]) is None
        return
    with pytest.raises(TreeUnsupportedError, match="--tree chain") as err:
        generate(engine, ids, spec, 8)
    assert "\n" not in str(err.value)
    assert first_difference(_greedy(engine, 2), plain_answers[family]) is None  # nothing lost


@pytest.mark.parametrize("family", ALL)
def test_sampled_answers_follow_the_target_distribution(families, family):
    """Answers sampled at T=1 with the subset draft (most rounds reject a draft, so caches are
    trimmed or restored every round): their PIT values are uniform (KS test)."""
    engine, spec = families.engine(family), SpecConfig(k=3, method="draft", adaptive=False)
    assert_follows(lambda seeds: sampled_p_value(engine, spec, seeds, 40)[0], range(3), family)


def _logits(state: KVState, prefix: list[int], lengths: list[int]) -> list[mx.array]:
    ids = [(7 * i + 3) % 300 + 4 for i in range(sum(lengths))]
    outs = [state.forward(mx.array(prefix, dtype=mx.int32))]
    at = 0
    for n in lengths:
        outs.append(state.forward(mx.array(ids[at : at + n], dtype=mx.int32)))
        mx.eval(outs[-1])
        at += n
    return outs


# Which rewrites take each family: rotary tables replace plain nn.RoPE only (Llama 3's, longrope
# and yarn keep theirs), compiled blocks take exact llama blocks only, grouped attention takes
# the families whose attention the twin writes out (edgespec/cpu/heads.py), for multi-token
# forwards whose mask is None or causal.
TABLE_ROPE = {"llama": 0, "phi3": 0, "ministral3": 0, "qwen3_next": 2, "qwen3_5": 2}
TABLE_ROPE["gemma4_text"] = 2  # its sliding layers: global ones keep their proportional rope
COMPILED = {"llama": 4}
GROUPED = tuple(f for f in ALL if f != "gpt_oss")  # gpt-oss: attention sinks, MLX's kernel


@pytest.mark.parametrize("family", ALL)
def test_cpu_rewrites_keep_the_logits_bit_for_bit_or_step_aside(families, family, monkeypatch):
    """The model with the rotary tables, lean Linear / RMSNorm and compiled blocks against
    mlx-lm's own over a prompt, decode steps and verifies reaching past the sliding windows: the
    same bits. Grouped attention computes the same values (it keeps a verify's rows bit-exact
    only under a row-exact BLAS: test_verify_rows_carry_the_bits_of_steps)."""
    monkeypatch.delenv("EDGESPEC_CPU_OPT", raising=False)
    if not on_cpu():
        pytest.skip("the rewrites run on the CPU backend only")
    path = families.paths(family)[0]
    slow, cpu = load_model(str(path)).model, CpuBackend()
    fast = cpu.model(slow)  # the twin: mlx-lm's model itself is left as it is
    ungrouped = dataclasses.replace(
        cpu.switches, grouped_attention=False, numpy_softmax=False, fused_attention=False
    )
    exact = CpuBackend(ungrouped).model(slow)  # the same rewrites, mlx-lm's attention
    kinds = [type(m) for _, m in fast.named_modules()]
    assert kinds.count(TableRoPE) == TABLE_ROPE.get(family, 4)
    assert LeanLinear in kinds or LeanRMSNorm in kinds
    if cpu.switches.compiled_blocks:
        assert kinds.count(blocks.CompiledBlock) == COMPILED.get(family, 0)
    assert not {TableRoPE, LeanLinear, LeanRMSNorm} & {type(m) for _, m in slow.named_modules()}
    lengths = [1, 2, 1, 3, 5, 1, 2, 8, 1, 4, 1, 1, 6, 1, 3]
    prefix = [(5 * i + 1) % 300 + 4 for i in range(20)]
    want = _logits(KVState(slow, "mlx-lm", make_prompt_cache), prefix, lengths)
    got = _logits(KVState(exact, "rewritten", make_prompt_cache), prefix, lengths)
    assert all(mx.array_equal(x, y).item() for x, y in zip(got, want, strict=True))
    grouped, masked = [], []
    real, real_masked = attention.grouped_attention, attention.masked_attention
    monkeypatch.setattr(
        attention, "grouped_attention", lambda *a, **k: grouped.append(1) or real(*a, **k)
    )
    monkeypatch.setattr(  # a window layer's verify past its window: under its own mask
        attention, "masked_attention", lambda *a, **k: masked.append(1) or real_masked(*a, **k)
    )
    marked = _logits(KVState(fast, "grouped", cpu.new_cache), prefix, lengths)
    for x, y in zip(marked, want, strict=True):
        assert mx.allclose(x, y, rtol=1e-4, atol=1e-4).item()
    if cpu.switches.grouped_attention:
        assert bool(grouped) == (family in GROUPED)
        assert bool(masked) == (family in GROUPED and family in WINDOWED)


@pytest.mark.parametrize("family", GROUPED)
def test_the_twins_attention_written_out_gives_mlx_lms_bits(families, family):
    """Each family's twin attention (edgespec/cpu/heads.py) projects, normalises, rotates and
    updates the cache as mlx-lm's module does: with mlx-lm's own attention function as its
    `attend`, the twin's logits over a prompt, decode steps and verifies reaching past the
    sliding windows are mlx-lm's bit for bit, on the caches an EdgeSpec state holds, and every
    forward went through `attend`."""
    slow = load_model(str(families.paths(family)[0])).model
    made: dict[type, type | None] = {}
    fast = twin(slow, lambda key, module: heads.twin_class(module, made), {})
    calls = []

    def attend(*args, **kwargs):
        calls.append(args[0].shape[2])
        return scaled_dot_product_attention(*args, **kwargs)

    twinned = [m for _, m in fast.named_modules() if isinstance(m, heads.GroupedAttention)]
    assert twinned
    for module in twinned:
        module.attend = attend
    lengths = [1, 2, 1, 3, 5, 1, 2, 8, 1, 4, 1, 1, 6, 1, 3]
    prefix = [(5 * i + 1) % 300 + 4 for i in range(20)]
    caches = Backend().new_cache  # mlx-lm's caches, window layers made rewindable
    want = _logits(KVState(slow, "mlx-lm", caches), prefix, lengths)
    got = _logits(KVState(fast, "twin", caches), prefix, lengths)
    assert all(mx.array_equal(x, y).item() for x, y in zip(got, want, strict=True))
    assert 2 in calls and 8 in calls  # verifies took the twin's attention


ROWS = """
import sys
import mlx.core as mx
from edgespec.cache import KVState
from edgespec import blas
from edgespec.cpu.backend import CpuBackend
from edgespec.loading.load import load_model
assert blas.rows_exact(), blas.active()
prefix = [(5 * i + 1) % 300 + 4 for i in range(30)]
ids = [(7 * i + 3) % 300 + 4 for i in range(6)]
for path in sys.argv[1:]:
    cpu = CpuBackend()
    model = cpu.model(load_model(path).model)
    a, b = KVState(model, "a", cpu.new_cache), KVState(model, "b", cpu.new_cache)
    for state in (a, b):
        mx.eval(state.forward(mx.array(prefix, dtype=mx.int32)))
    verify = a.forward(mx.array(ids, dtype=mx.int32))
    steps = mx.concatenate([b.forward(mx.array([t], dtype=mx.int32)) for t in ids])
    print(mx.array_equal(verify, steps).item())
"""


def test_verify_rows_carry_the_bits_of_steps_under_a_row_exact_blas(families):
    """Why greedy identity holds by construction, not by luck, on every family: under a row-exact
    BLAS (the reference one here) a verify's rows are bit-identical to one-token steps, past the
    sliding windows and through the gated delta-nets too, with every CPU rewrite on."""
    paths = [str(families.paths(f)[0]) for f in ALL]
    drop = (blas.ACTIVE, "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["EDGESPEC_BLAS"] = "system"  # the reference BLAS
    out = subprocess.run(
        [sys.executable, "-c", ROWS, *paths], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True"] * len(ALL)


# ---------------------------------------------------------------------------- planted bugs


def test_the_checks_catch_a_recurrent_state_not_restored(families, plain_answers, monkeypatch):
    """Plant the bug the restore exists for: rewinds trim the attention layers but leave the
    gated delta-net state as the verify left it (rejected drafts included). Greedy identity and
    the statistical test must both fail."""
    engine, plain = families.engine("qwen3_next"), plain_answers["qwen3_next"]

    def no_restore(self, keep):
        drop = self.offset - keep
        for layer in self.layers:
            if layer not in self.recurrent:
                layer.trim(drop)
        self.fed = keep
        return keep

    monkeypatch.setattr(Rewinder, "go_back", no_restore)
    assert first_difference(_greedy(engine, 3), plain) is not None
    p_value, _ = sampled_p_value(
        engine, SpecConfig(k=3, method="draft", adaptive=False), range(4), 40
    )
    assert p_value < 1e-3


def test_the_checks_catch_a_window_cache_that_forgets_too_much(
    families, plain_answers, monkeypatch
):
    """Plant a window cache that keeps only the window (no room for rewinds) yet claims it can
    trim: past the window, a rejection leaves the next query without its oldest keys."""
    plain = plain_answers["gemma3_text"]
    monkeypatch.setattr(WindowKVCache, "can_trim", lambda self, n: n <= self.offset)
    monkeypatch.setattr(
        WindowKVCache,
        "_start_after",
        lambda self, n: max(self.start, self.offset + n - self.window),
    )
    engine = families.engine("gemma3_text")
    assert first_difference(_greedy(engine, 3), plain) is not None
