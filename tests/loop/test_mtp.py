"""MTP drafts (edgespec/architectures/mtp.py): a Qwen3.5 target's own multi-token-prediction head.

On a tiny qwen3_5 written as an original Hugging Face checkpoint with its `mtp.*` weights
(tests/helpers/mtp_models.py; its MTP layer learnt the target's greedy answer to PROMPT): greedy
output identical to plain decoding over 300 tokens (the hybrid target's recurrent state is restored
after rejections), through the Engine and the real CLI; sampled answers at T = 1 follow the target
(PIT test of tests/helpers/arch_models.py), and the same test fails on a planted q that is not the
distribution the drafted token was drawn from; an MTP head fed the wrong position's hidden state
stays exact, only slower. Loading: the weights read from the checkpoint match the training copy, a
folder without MTP weights is a one-line error, and the conversion keeps the head.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import huggingface_hub.constants as hf_constants
import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import kstest

from edgespec.architectures.mtp import (
    MTP_FILE,
    MtpModel,
    build,
    read_mtp,
    sanitize_hf,
    stack_experts,
)
from edgespec.cache import PREFILL_CHUNK
from edgespec.commands.common import draft_from_args
from edgespec.config import SamplingConfig, SpecConfig
from edgespec.drafting.feature import FeatureState
from edgespec.errors import ConfigError
from edgespec.loading.download import pull
from edgespec.loading.load import load_pair
from edgespec.loading.mtp_checkpoint import convert_checkpoint, converted_dir
from edgespec.loading.specs import parse_catalog
from edgespec.runtime import Engine
from edgespec.sampling import sample, warp
from edgespec.taps import TOP
from tests.helpers import gen, rounds_of, token_ids
from tests.helpers.arch_models import (
    PROMPT,
    first_difference,
    generate,
    pit_values,
    sampled_p_value,
)
from tests.helpers.cli import run_edgespec
from tests.helpers.hub import make_hub_cache
from tests.helpers.mtp_models import checkpoint_config, make_checkpoint, strip_mtp
from tests.helpers.stats import assert_follows

TOKENS = 300


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("mtp"), [PROMPT], TOKENS)


@pytest.fixture(scope="module")
def engine(checkpoint: Path) -> Engine:
    return Engine.load(target=str(checkpoint), draft="mtp")


@pytest.fixture(scope="module")
def plain(engine: Engine) -> list[int]:
    ids = engine.encode_raw(PROMPT)
    return generate(engine, ids, SpecConfig(method="none"), TOKENS)[0]


def _greedy(engine: Engine, spec: SpecConfig, n: int = TOKENS) -> tuple[list[int], float]:
    """(tokens, accepted per drafted token) of the greedy answer to PROMPT."""
    events = gen(engine, engine.encode_raw(PROMPT), spec, n)
    rounds = rounds_of(events)
    drafted = sum(r.drafted for r in rounds)
    return token_ids(events), sum(r.accepted for r in rounds) / max(drafted, 1)


def test_the_head_loads_from_the_checkpoint_as_a_feature_draft(engine, checkpoint):
    model = engine.draft.model
    assert isinstance(model, MtpModel) and model.feature_layers == (TOP,)
    assert engine._target.feature_layers == (TOP,)  # the verify records the final-normed state
    raw = mx.load(str(checkpoint / "model.safetensors"))
    norm = raw["mtp.norm.weight"]
    assert mx.allclose(model.norm.weight, norm + 1.0)  # stored as offsets from 1


SPECS = {
    "k1": SpecConfig(k=1, method="mtp", adaptive=False),
    "k3": SpecConfig(k=3, method="mtp", adaptive=False),
    "adaptive": SpecConfig(k=2, method="mtp", adaptive=True),
}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_greedy_output_equals_plain_decoding(engine, plain, spec):
    tokens, acceptance = _greedy(engine, spec)
    assert first_difference(tokens, plain) is None
    assert acceptance > 0.3  # the head learnt this answer: most drafts pass


def test_a_later_turn_reuses_the_caches_and_stays_exact(engine, checkpoint):
    """A chat's next turn (a prompt extending the last answer) reuses both caches, features
    included, and answers as plain decoding; so does a turn after a plain generation moved the
    target's restore points (its rewind then lands before the features' reusable prefix)."""
    alone = Engine.load(target=str(checkpoint), with_draft=False)
    spec, none = SpecConfig(k=3, method="mtp", adaptive=False), SpecConfig(method="none")
    ids = engine.encode_raw(PROMPT)
    first = generate(engine, ids, spec, 5)[0]  # stopped early, caches kept
    turn = ids + first + engine.encode_raw(" the river")
    events = gen(engine, turn, spec, 60)
    assert token_ids(events) == generate(alone, turn, none, 60)[0]
    assert events[-1].stats.prefilled_tokens < len(turn)  # the shared prefix was not run again
    later = turn + token_ids(events)[:10] + engine.encode_raw(" a cat")
    want = generate(engine, later, none, 60)[0]
    assert generate(engine, later, spec, 60)[0] == want


def test_a_qwen3_next_head_with_experts_drafts_exactly(tmp_path_factory):
    """Qwen3-Next: its MTP layer is a mixture-of-experts layer stored one weight per expert."""
    root = tmp_path_factory.mktemp("mtp-next")
    folder = make_checkpoint(root, [PROMPT], 120, steps=100, family="qwen3_next")
    engine = Engine.load(target=str(folder), draft="mtp")
    head = engine.draft.model.layers[0].mlp
    raw = mx.load(str(folder / "model.safetensors"))
    assert mx.array_equal(
        head.switch_mlp.up_proj.weight[1], raw["mtp.layers.0.mlp.experts.1.up_proj.weight"]
    )
    ids = engine.encode_raw(PROMPT)
    plain = generate(engine, ids, SpecConfig(method="none"), 120)[0]
    tokens, acceptance = _greedy(engine, SpecConfig(k=3, method="mtp", adaptive=False), 120)
    assert first_difference(tokens, plain) is None and acceptance > 0.3


def test_the_cli_answers_as_no_spec(checkpoint):
    args = ["generate", PROMPT, "--target", str(checkpoint), "--raw", "--temp", "0"]
    args += ["--max-tokens", str(TOKENS), "--json"]
    mtp = run_edgespec(*args, "--method", "mtp")
    plain = run_edgespec(*args, "--no-spec")
    assert mtp.returncode == 0 and plain.returncode == 0, mtp.stderr[-2000:] + plain.stderr
    records = [[json.loads(line) for line in out.stdout.splitlines()] for out in (mtp, plain)]
    ids = [[r["id"] for r in recs if r["type"] == "token"] for recs in records]
    assert len(ids[0]) == TOKENS and ids[0] == ids[1]
    assert sum(r["accepted"] for r in records[0] if r["type"] == "round") > 0


def test_sampled_answers_follow_the_target_distribution(engine):
    engine.reset()  # which tokens a seed gives depends on the drafts, so on what caches held
    spec = SpecConfig(k=3, method="mtp", adaptive=False)
    assert_follows(lambda seeds: sampled_p_value(engine, spec, seeds, 60)[0], range(6), "mtp")


def test_the_check_fails_on_a_q_that_did_not_draw_the_token(engine, monkeypatch):
    """Plant the bug: the draft token is drawn from a flatter distribution (T = 4) than the q it
    reports (T = 1). The ratio test then keeps tokens the target would rarely give."""

    def flat_pick(logits, sampling, u, i, head_ids, rows, softmax=None):
        rows.append(warp(logits, sampling, softmax))
        return sample(warp(logits, SamplingConfig(temperature=4.0)), u[i])

    monkeypatch.setattr("edgespec.drafting.feature.pick_token", flat_pick)
    # A biased answer may sample EOS early (the target makes it rare, not impossible): the PIT
    # values of the tokens emitted, as sampled_p_value computes them, at least 200 of them.
    ids, rng, values = engine.encode_raw(PROMPT), np.random.default_rng(1234), []
    engine.reset()  # a biased answer depends on what the caches held: start from none
    for seed in range(6):
        sampling = SamplingConfig(temperature=1.0, seed=seed)
        tokens, _ = generate(
            engine,
            ids,
            SpecConfig(k=3, method="mtp", adaptive=False),
            60,
            temperature=1.0,
            seed=seed,
        )
        values.append(pit_values(engine, ids, tokens, sampling, rng))
    assert sum(len(v) for v in values) >= 200
    assert kstest(np.concatenate(values), "uniform").pvalue < 1e-3


def test_a_head_fed_the_wrong_position_stays_exact_only_slower(engine, plain, monkeypatch):
    """Plant the bug: every committed position's feature is its predecessor's hidden state (one
    position late, zeros at position 0), prompt and rounds alike."""
    spec = SpecConfig(k=3, method="mtp", adaptive=False)
    engine.reset()
    _, right = _greedy(engine, spec)
    real, held = FeatureState.set_features, {}

    def late(state: FeatureState, context: list[int], start: int, new: mx.array) -> None:
        if new.shape[0] > 0:
            before = held.get(start - 1, mx.zeros_like(new[:1]))
            held[start + new.shape[0] - 1] = new[-1:]
            new = mx.concatenate([before, new[:-1]])
        real(state, context, start, new)

    monkeypatch.setattr(FeatureState, "set_features", late)
    engine.reset()
    tokens, wrong = _greedy(engine, spec)
    assert first_difference(tokens, plain) is None
    assert wrong < right, (wrong, right)


def test_the_same_prompt_again_is_not_read_again(engine):
    """The prefill leaves the target a restore point at the prompt's end (its recurrent layers
    cannot be trimmed back to it), so a request repeating the prompt runs only its last token
    and answers as before."""
    spec = SpecConfig(k=3, method="mtp", adaptive=False)
    ids = engine.encode_raw(PROMPT)
    engine.reset()
    first = gen(engine, ids, spec, 30)
    again = gen(engine, ids, spec, 30)
    assert first[-1].stats.prefilled_tokens == len(ids)
    assert again[-1].stats.prefilled_tokens == 1
    assert token_ids(again) == token_ids(first)


def test_a_long_prompt_is_read_by_the_head_a_chunk_at_a_time(engine, monkeypatch):
    """After a prompt three chunks long, the head's catch-up runs it PREFILL_CHUNK positions at a
    time (one forward over all of it would hold its length squared of attention scores per
    head), and the answer is still plain decoding's."""
    state = engine._draft
    head, lengths = state.model, []

    class Counting:
        def __getattr__(self, name: str):
            return getattr(head, name)

        def __call__(self, features: mx.array, tokens: mx.array, cache=None) -> mx.array:
            lengths.append(int(tokens.shape[1]))
            return head(features, tokens, cache=cache)

    monkeypatch.setattr(state, "model", Counting())
    rng = np.random.default_rng(5)
    ids = [int(t) for t in rng.integers(3, engine._vocab, size=3 * PREFILL_CHUNK)]
    want = generate(engine, ids, SpecConfig(method="none"), 20)[0]
    engine.reset()
    got = token_ids(gen(engine, ids, SpecConfig(k=3, method="mtp", adaptive=False), 20))
    assert got == want
    assert max(lengths) == PREFILL_CHUNK and sum(lengths) >= len(ids) - 1


def test_a_folder_without_mtp_weights_is_a_one_line_error(checkpoint, tmp_path):
    stripped = strip_mtp(checkpoint, tmp_path / "community")
    out = run_edgespec("generate", PROMPT, "--target", str(stripped), "--method", "mtp")
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line and "no MTP weights" in line and "edgespec pull" in line
    with pytest.raises(ConfigError, match="leave out --draft"):
        draft_from_args(argparse.Namespace(draft="x"), SpecConfig(method="mtp"))


def test_configs_without_one_mtp_layer_of_a_known_family_are_refused_in_one_line():
    config = checkpoint_config("qwen3_5", 300)
    config["text_config"]["mtp_num_hidden_layers"] = 2
    with pytest.raises(ConfigError, match="one MTP layer; this one declares 2"):
        build(config)
    with pytest.raises(ConfigError, match="not llama"):
        build({"model_type": "llama", "mtp_num_hidden_layers": 1})


def test_fused_and_per_expert_weights_stack_as_mlx_lm_holds_them():
    gate_up = mx.arange(2 * 4 * 3).reshape(2, 4, 3)  # 2 experts, 2 gate rows then 2 up rows
    fused = stack_experts({"layers.0.mlp.experts.gate_up_proj": gate_up})
    assert mx.array_equal(fused["layers.0.mlp.switch_mlp.gate_proj.weight"], gate_up[:, :2])
    assert mx.array_equal(fused["layers.0.mlp.switch_mlp.up_proj.weight"], gate_up[:, 2:])
    one = {f"layers.0.mlp.experts.{e}.down_proj.weight": mx.full((2, 2), e) for e in (1, 0)}
    stacked = stack_experts(one)["layers.0.mlp.switch_mlp.down_proj.weight"]
    assert stacked.shape == (2, 2, 2) and stacked[1, 0, 0].item() == 1


def test_a_target_loaded_without_its_head_refuses_method_mtp(checkpoint):
    engine = Engine.load(target=str(checkpoint), with_draft=False)
    with pytest.raises(ConfigError, match="without its MTP head"):
        generate(engine, engine.encode_raw(PROMPT), SpecConfig(method="mtp", adaptive=False), 4)


def test_pull_of_a_folder_converts_it_keeping_the_head(checkpoint, tmp_path, monkeypatch):
    """`edgespec pull FOLDER`: the model at 4 bits, the MTP layer at 8 beside it, once."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    folder = _pulled(checkpoint)
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["mtp_quantization"]["bits"] == 8
    stored = read_mtp(folder, config)
    raw = mx.load(str(checkpoint / "model.safetensors"))
    want = sanitize_hf({k: v for k, v in raw.items() if k.startswith("mtp.")})
    assert "fc.scales" in stored and set(want) <= set(stored)
    assert mx.array_equal(stored["norm.weight"], want["norm.weight"])  # norms stay float
    assert convert_checkpoint(checkpoint, folder) == folder  # converted once
    _speculates_exactly(Engine.load(target=str(folder), draft="mtp"))


def test_pull_mtp_bits_sets_the_heads_bits_in_a_folder_of_its_own(
    checkpoint, tmp_path, monkeypatch
):
    """`pull FOLDER --mtp-bits 4` stores the head at 4 bits, `--mtp-bits 0` keeps it float; each
    converts into its own folder, not the default 8-bit one, and the float head drafts exactly."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    four, floats = _pulled(checkpoint, "--mtp-bits", "4"), _pulled(checkpoint, "--mtp-bits", "0")
    assert len({four, floats, converted_dir(checkpoint)}) == 3
    config = json.loads((four / "config.json").read_text())
    assert config["mtp_quantization"] == {"group_size": 64, "bits": 4}
    assert read_mtp(four, config)["fc.weight"].dtype == mx.uint32  # packed
    config = json.loads((floats / "config.json").read_text())
    assert config["mtp_quantization"] is None and "fc.scales" not in read_mtp(floats, config)
    _speculates_exactly(Engine.load(target=str(floats), draft="mtp"))


def test_pull_of_a_catalogue_checkpoint_converts_the_download(checkpoint, tmp_path, monkeypatch):
    """A catalogue model whose Hugging Face repo is an original checkpoint: `pull` converts it
    in place, and the pair whose draft is "mtp" loads its head."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    make_hub_cache(tmp_path / "hub", "org/Tiny-MTP", checkpoint)
    model = {"license": "Apache-2.0", "hf_repo": "org/Tiny-MTP"}
    raw = {"models": {"tiny": model}, "pairs": {"tiny-mtp": {"target": "tiny", "draft": "mtp"}}}
    cat = parse_catalog(raw, tmp_path)
    folder = pull("tiny", catalog=cat, progress_bar=False)
    assert (folder / MTP_FILE).is_file() and not (folder / ".original").exists()
    assert "quantization" in json.loads((folder / "config.json").read_text())
    _speculates_exactly(Engine(*load_pair(pair="tiny-mtp", catalog=cat)))


def _speculates_exactly(engine: Engine) -> None:
    assert isinstance(engine.draft.model, MtpModel)
    ids = engine.encode_raw(PROMPT)
    tokens, _ = generate(engine, ids, SpecConfig(k=3, method="mtp", adaptive=False), 40)
    assert tokens == generate(engine, ids, SpecConfig(method="none"), 40)[0]


def _pulled(checkpoint: Path, *flags: str) -> Path:
    """The folder `edgespec pull CHECKPOINT FLAGS` converted it into."""
    out = run_edgespec("pull", str(checkpoint), *flags)
    assert out.returncode == 0, out.stderr[-2000:]
    return Path(out.stdout.split(": ", 1)[1].rsplit(" (", 1)[0])
