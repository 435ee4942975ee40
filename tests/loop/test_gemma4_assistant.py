"""Gemma 4's assistant drafters (edgespec/architectures/gemma4_assistant.py, drafted by
edgespec/drafting/assistant.py) on a tiny checkpoint of the published layout beside a tiny
Gemma 4 target (tests/helpers/tiny_gemma4_assistant.py; the head learnt the target's answer to
PROMPT): loaded under its own tensor names, greedy output identical to plain decoding over 300
tokens (whatever the method names it: draft, hybrid, mtp, or the command line's default), the
centroid-routed head of the E2B / E4B assistants too; sampled answers at T = 1 follow the target
and the same check fails on a planted q that did not draw the token; a key missing, renamed or
reshaped, or a config field missing, is a one-line error naming it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import gemma4_text
from mlx_lm.models.cache import KVCache, QuantizedKVCache
from scipy.stats import kstest

from edgespec.architectures.gemma4_assistant import Gemma4Assistant
from edgespec.config import SamplingConfig, SpecConfig
from edgespec.drafting.assistant import AssistantState, _held
from edgespec.errors import ConfigError, TreeUnsupportedError
from edgespec.events import Token
from edgespec.families import model_family
from edgespec.loading.load import load_model, load_pair
from edgespec.loading.specs import Catalog, parse_catalog
from edgespec.rewind import WindowKVCache
from edgespec.runtime import Engine
from edgespec.sampling import sample, warp
from tests.helpers import gen, rounds_of, token_ids
from tests.helpers.arch_models import (
    PROMPT,
    first_difference,
    generate,
    pit_values,
    sampled_p_value,
)
from tests.helpers.cli import run_edgespec
from tests.helpers.stats import assert_follows
from tests.helpers.tiny_gemma4_assistant import make_assistant

TOKENS = 300


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_assistant(tmp_path_factory.mktemp("gemma4-assistant"))


@pytest.fixture(scope="module")
def engine(folders) -> Engine:
    return Engine.load(target=str(folders[0]), draft=str(folders[1]))


@pytest.fixture(scope="module")
def plain(engine: Engine) -> list[int]:
    return generate(engine, engine.encode_raw(PROMPT), SpecConfig(method="none"), TOKENS)[0]


def _greedy(engine: Engine, spec: SpecConfig, n: int = TOKENS) -> tuple[list[int], float]:
    """(tokens, accepted per drafted token) of the greedy answer to PROMPT."""
    events = gen(engine, engine.encode_raw(PROMPT), spec, n)
    rounds = rounds_of(events)
    return token_ids(events), sum(r.accepted for r in rounds) / max(
        sum(r.drafted for r in rounds), 1
    )


def test_the_published_layout_loads_as_a_draft_that_reads_the_target(engine, folders):
    model = engine.draft.model
    assert isinstance(model, Gemma4Assistant) and isinstance(engine._draft, AssistantState)
    raw = mx.load(str(folders[1] / "model.safetensors"))
    assert "model.layers.3.self_attn.q_proj.weight" in raw and "pre_projection.weight" in raw
    assert not any(".k_proj." in k or ".v_proj." in k for k in raw)  # every layer KV-shared
    assert mx.array_equal(model.pre_projection.weight, raw["pre_projection.weight"])
    assert engine._draft.target is engine._target  # its keys and values are the target's


SPECS = {
    "draft-k1": SpecConfig(k=1, method="draft", adaptive=False),
    "mtp-k3": SpecConfig(k=3, method="mtp", adaptive=False),
    "hybrid-adaptive": SpecConfig(k=2, method="hybrid", adaptive=True),
}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_greedy_output_equals_plain_decoding(engine, plain, spec):
    tokens, acceptance = _greedy(engine, spec)
    assert first_difference(tokens, plain) is None
    assert acceptance > 0.3  # the head learnt this answer: most drafts pass


def test_a_later_turn_reuses_the_target_cache_and_stays_exact(engine, folders):
    """A chat's next turn (a prompt extending the last answer): the target's cache is reused, the
    prefill computes the feature the first round drafts from, the answer is plain decoding's."""
    spec, none = SpecConfig(k=3, method="draft", adaptive=False), SpecConfig(method="none")
    ids = engine.encode_raw(PROMPT)
    first = generate(engine, ids, spec, 5)[0]
    turn = ids + first + engine.encode_raw(" the river")
    events = gen(engine, turn, spec, 60)
    assert events[-1].stats.prefilled_tokens < len(turn)
    assert token_ids(events) == generate(engine, turn, none, 60)[0]
    assert rounds_of(events)[0].drafted > 0  # the first round drafted from the prompt's feature


def test_the_centroid_routed_head_drafts_exactly(folders):
    """The E2B / E4B form: only the top clusters' tokens get draft logits (-inf elsewhere)."""
    engine = Engine.load(target=str(folders[0]), draft=str(folders[2]))
    head = engine.draft.model
    logits = head.logits(mx.ones((1, 1, head.args.hidden_size)))
    assert (
        int(mx.isfinite(logits).sum()) == 2 * head.args.vocab_size // head.masked_embedding.clusters
    )
    ids = engine.encode_raw(PROMPT)
    plain = generate(engine, ids, SpecConfig(method="none"), 120)[0]
    tokens, _ = _greedy(engine, SpecConfig(k=3, method="draft", adaptive=False), 120)
    assert first_difference(tokens, plain) is None


def test_every_target_cache_kind_is_read_in_position_order():
    """The keys a draft query sees from each kind of target cache layer: a full KVCache's held
    positions, a WindowKVCache's (positions start.., after compaction too), and a --kv-bits
    QuantizedKVCache's, dequantized (within 8-bit rounding)."""
    keys = mx.random.normal((1, 2, 400, 32), key=mx.random.key(0))
    full, window, packed = KVCache(), WindowKVCache(16), QuantizedKVCache(group_size=32, bits=8)
    for layer in (full, window, packed):
        for start in range(0, 400, 50):  # in chunks, as prefills and verifies write them
            layer.update_and_fetch(
                keys[..., start : start + 50, :], keys[..., start : start + 50, :]
            )
    assert window.start > 0  # compacted: the oldest positions are gone
    assert mx.array_equal(_held(full, 400)[0], keys)
    assert mx.array_equal(_held(window, 400)[0], keys[..., window.start :, :])
    assert float(mx.abs(_held(packed, 400)[1] - keys).max()) < 0.05


@pytest.mark.slow  # another tiny target and assistant to make (tests/loading/test_gemma4.py's way)
def test_a_26b_a4b_style_target_with_experts_and_no_shared_layers(tmp_path_factory):
    """gemma4_moe: every layer stores keys (no KV-shared ones), experts beside each MLP; the
    assistant reads its last sliding and last full layer and drafts exactly."""
    root = tmp_path_factory.mktemp("gemma4-moe-assistant")
    target, head, _ = make_assistant(root, length=120, family="gemma4_moe")
    engine = Engine.load(target=str(target), draft=str(head))
    ids = engine.encode_raw(PROMPT)
    plain = generate(engine, ids, SpecConfig(method="none"), 120)[0]
    tokens, acceptance = _greedy(engine, SpecConfig(k=3, method="draft", adaptive=False), 120)
    assert first_difference(tokens, plain) is None and acceptance > 0.3


def test_the_cli_picks_the_assistant_and_answers_as_no_spec(folders):
    """No --method: the command line's default (hybrid) drafts with the assistant."""
    args = ["generate", PROMPT, "--target", str(folders[0]), "--draft", str(folders[1])]
    args += ["--raw", "--temp", "0", "--max-tokens", "120", "--json"]
    spec, plain = run_edgespec(*args), run_edgespec(*args, "--no-spec")
    assert spec.returncode == 0 and plain.returncode == 0, spec.stderr[-2000:] + plain.stderr
    records = [[json.loads(line) for line in out.stdout.splitlines()] for out in (spec, plain)]
    ids = [[r["id"] for r in recs if r["type"] == "token"] for recs in records]
    assert len(ids[0]) == 120 and ids[0] == ids[1]
    assert sum(r["accepted"] for r in records[0] if r["type"] == "round") > 0


def test_sampled_answers_follow_the_target_distribution(engine):
    engine.reset()  # which tokens a seed gives depends on the drafts, so on what caches held
    spec = SpecConfig(k=3, method="draft", adaptive=False)
    assert_follows(lambda s: sampled_p_value(engine, spec, s, 60)[0], range(6), "assistant")


def test_the_check_fails_on_a_q_that_did_not_draw_the_token(engine, monkeypatch):
    """Plant the bug: the drafted token is drawn from a flatter distribution (T = 4) than the q
    it reports (T = 1); the ratio test then keeps tokens the target would rarely give."""

    def flat_pick(logits, sampling, u, i, head_ids, rows, softmax=None):
        rows.append(warp(logits, sampling, softmax))
        return sample(warp(logits, SamplingConfig(temperature=4.0)), u[i])

    monkeypatch.setattr("edgespec.drafting.assistant.pick_token", flat_pick)
    ids, rng, values = engine.encode_raw(PROMPT), np.random.default_rng(1234), []
    engine.reset()
    for seed in range(6):
        sampling = SamplingConfig(temperature=1.0, seed=seed)
        spec = SpecConfig(k=3, method="draft", adaptive=False)
        tokens, _ = generate(engine, ids, spec, 60, temperature=1.0, seed=seed)
        values.append(pit_values(engine, ids, tokens, sampling, rng))
    assert sum(len(v) for v in values) >= 200
    assert kstest(np.concatenate(values), "uniform").pvalue < 1e-3


def test_trees_are_refused_in_one_line(engine):
    spec = SpecConfig(k=3, method="draft", adaptive=False, tree="chain")
    with pytest.raises(TreeUnsupportedError, match="chains only") as err:
        gen(engine, engine.encode_raw(PROMPT), spec, 4)
    assert "\n" not in str(err.value)


def _broken(src: Path, dst: Path, weights=None, config=None) -> Path:
    """A copy of the assistant folder with `weights(arrays)` / `config(dict)` applied."""
    shutil.copytree(src, dst)
    if weights is not None:
        arrays = dict(mx.load(str(dst / "model.safetensors")))
        mx.save_safetensors(str(dst / "model.safetensors"), weights(arrays))
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _rename(arrays: dict, old: str, new: str) -> dict:
    arrays[new] = arrays.pop(old)
    return arrays


BROKEN = {
    "missing": (lambda a: {k: v for k, v in a.items() if k != "model.norm.weight"}, None),
    "renamed": (lambda a: _rename(a, "post_projection.weight", "post_proj.weight"), None),
    "reshaped": (lambda a: a | {"pre_projection.weight": a["pre_projection.weight"][:, :8]}, None),
    "no-backbone": (None, lambda c: c.pop("backbone_hidden_size")),
    "no-layer-types": (None, lambda c: c["text_config"].pop("layer_types")),
    "other-target": (None, lambda c: c.update(backbone_hidden_size=48)),
}
NAMED = {
    "missing": "model.norm.weight",
    "renamed": "post_projection.weight",
    "reshaped": "pre_projection.weight",
    "no-backbone": "backbone_hidden_size",
    "no-layer-types": "layer_types",
    "other-target": "backbone_hidden_size",
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_changed_or_missing_key_is_a_one_line_error_naming_it(folders, tmp_path, case):
    weights, config = BROKEN[case]
    head = _broken(folders[1], tmp_path / case, weights, config)
    with pytest.raises(ConfigError) as err:
        load_pair(str(folders[0]), str(head))
    assert NAMED[case] in str(err.value) and "\n" not in str(err.value)


def test_method_mtp_on_a_gemma4_target_points_to_its_assistant(folders):
    """--method mtp loads the target's own head (draft "mtp"); Gemma 4's is a checkpoint apart."""
    with pytest.raises(ConfigError, match="-assistant") as err:
        load_pair(str(folders[0]), "mtp")
    assert "\n" not in str(err.value)


def test_an_assistant_given_as_the_target_is_a_one_line_error(folders):
    with pytest.raises(ConfigError, match="--draft") as err:
        load_model(str(folders[1]))
    assert "\n" not in str(err.value)


def _pair_catalog(root: Path, target: Path, draft: Path) -> Catalog:
    pairs = {"tiny-assistant": {"target": str(target), "draft": str(draft), "platform": "mac"}}
    return parse_catalog({"default_pair": "tiny-assistant", "pairs": pairs}, root)


def test_method_mtp_on_an_assistant_pair_drafts_with_its_assistant(folders, tmp_path, plain):
    """The draft "mtp" (what --method mtp loads) on a pair whose draft is a Gemma 4 assistant:
    the pair's assistant, the target's own head in all but its file; greedy equals plain."""
    cat = _pair_catalog(tmp_path, folders[0], folders[1])
    t, d = load_pair(draft="mtp", pair="tiny-assistant", catalog=cat)
    assert d is not None and isinstance(d.model, Gemma4Assistant)
    engine = Engine(t, d)
    spec = SpecConfig(k=3, method="mtp", adaptive=False)
    events = gen(engine, engine.encode_raw(PROMPT), spec, 64)
    assert first_difference(token_ids(events), plain[:64]) is None
    assert sum(r.accepted for r in rounds_of(events)) > 0


def test_method_mtp_on_a_gemma4_pair_with_a_token_draft_is_one_line(folders, tmp_path):
    cat = _pair_catalog(tmp_path, folders[0], folders[0])  # the target drafting for itself
    with pytest.raises(ConfigError, match="--method draft or hybrid") as err:
        load_pair(draft="mtp", pair="tiny-assistant", catalog=cat)
    assert "\n" not in str(err.value)


def test_the_cache_free_first_logits_are_the_first_draft_steps(engine):
    """The unbiasedness check's q (the family's first_logits: no cache, edgespec.bench) is the
    q of the first round the engine drafts after the same prompt, at T = 1."""
    ids = engine.encode_raw(PROMPT)[:40]
    family = model_family(engine.draft.model)
    t_logits, q_logits = family.first_logits(engine.target.model, engine.draft.model, ids)
    engine.reset()
    sampling = SamplingConfig(temperature=1.0)
    target, state = engine._target, engine._draft
    family.prefill(target, state, ids, None, None, True)
    drafter = family.drafter(SpecConfig(k=1), sampling, state, int(t_logits.shape[-1]), "d")
    proposal = drafter.propose(ids, 1, mx.random.key(0))
    assert proposal.q is not None and proposal.size == 1
    assert mx.allclose(proposal.q[0], mx.softmax(q_logits.astype(mx.float32)), atol=1e-5)
    plain_logits = engine.target.model(mx.array(ids)[None])[0, -1]
    assert mx.allclose(t_logits, plain_logits)
    engine.reset()


def test_an_mlx_lm_whose_shared_layers_hold_keys_is_named(folders, monkeypatch):
    """mlx-lm before 0.31.3 gave KV-shared Gemma 4 layers key weights, which an assistant's
    checkpoint lacks: one line naming the release it needs, not a missing key."""
    base = gemma4_text.DecoderLayer

    class Old(base):  # type: ignore[misc, valid-type]
        def __init__(self, args, layer_idx):
            super().__init__(args, layer_idx)
            if args.num_kv_shared_layers == args.num_hidden_layers:  # the assistant's layers
                self.self_attn.k_proj = nn.Linear(args.hidden_size, args.head_dim, bias=False)

    monkeypatch.setattr(gemma4_text, "DecoderLayer", Old)
    with pytest.raises(ConfigError, match=r"mlx-lm >= 0\.31\.3") as err:
        load_pair(str(folders[0]), str(folders[1]))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("head", [1, 2], ids=["dense-head", "centroid-head"])
def test_generation_config_suppress_tokens_are_never_proposed(folders, tmp_path, head):
    """Google's assistants list tokens in generation_config.json's `suppress_tokens` (as vLLM
    masks them from its drafter, PR #53884): here the three tokens the head drafts and gets
    accepted most often. With them suppressed they are never accepted from a draft (only
    corrected or bonus tokens from the target), and the answer is still plain decoding's."""
    spec = SpecConfig(k=3, method="draft", adaptive=False)
    before = Engine.load(target=str(folders[0]), draft=str(folders[head]))
    ids = before.encode_raw(PROMPT)
    plain = generate(before, ids, SpecConfig(method="none"), 120)[0]
    first = [e for e in gen(before, ids, spec, 120) if isinstance(e, Token)]
    counts: dict[int, int] = {}
    for t in first:
        if t.kind == "accepted":
            counts[t.id] = counts.get(t.id, 0) + 1
    banned = sorted(counts, key=lambda i: -counts[i])[:3]
    assert banned and [t.id for t in first] == plain
    draft = shutil.copytree(folders[head], tmp_path / "assistant")
    (draft / "generation_config.json").write_text(json.dumps({"suppress_tokens": banned}))
    after = Engine.load(target=str(folders[0]), draft=str(draft))
    events = gen(after, ids, spec, 120)
    tokens = [e for e in events if isinstance(e, Token)]
    assert [t.id for t in tokens] == plain
    assert {t.id for t in tokens} & set(banned)  # the target still says them
    assert not [t for t in tokens if t.kind == "accepted" and t.id in banned]
    logits = after.draft.model.logits(mx.ones((1, 1, after.draft.model.args.hidden_size)))
    assert bool(mx.all(mx.isneginf(logits[..., mx.array(banned)])))


def test_a_bad_suppress_tokens_list_is_one_line(folders, tmp_path):
    draft = shutil.copytree(folders[1], tmp_path / "assistant")
    (draft / "generation_config.json").write_text(json.dumps({"suppress_tokens": [-1]}))
    with pytest.raises(ConfigError, match="suppress_tokens must be token ids below") as err:
        Engine.load(target=str(folders[0]), draft=str(draft))
    assert "\n" not in str(err.value)
