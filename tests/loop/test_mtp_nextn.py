"""Next-n MTP layers (edgespec/architectures/nextn.py): a GLM-4.5 (glm4_moe), MiMo (mimo) or DeepSeek-V3
(deepseek_v3) target's own head.

On a tiny model of each family written as an original Hugging Face checkpoint, its MTP layer
stored as the family stores it (tests/helpers/mtp_models.py: GLM-4.5's `model.layers.4` with enorm /
hnorm / eh_proj / shared_head and the copies of the embedding and head; MiMo's
`model.mtp_layers.0` with token_layernorm / hidden_layernorm / input_proj / final_layernorm,
[h, e] into the projection; DeepSeek-V3's `model.layers.4` with its MLA `kv_b_proj`, in a shard
of its own, since mlx-lm drops the layer by its 61-layer name only; the layer learnt the
target's greedy answer to PROMPT): the head loads under NextnModel's names with the copies left
out, greedy output equals plain decoding over 300 tokens (Engine and CLI), sampled answers at
T = 1 follow the target and the same check fails on a planted q that did not draw the token; a
folder without the layer is a one-line error and `edgespec pull FOLDER` converts the checkpoint
keeping it.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import kstest

from edgespec.architectures.nextn import (
    FAMILIES,
    NextnModel,
    build_head,
    layer_prefix,
    read_head,
    sanitize_nextn,
)
from edgespec.config import SamplingConfig, SpecConfig
from edgespec.errors import ConfigError
from edgespec.loading.mtp_checkpoint import is_checkpoint_with_mtp
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
from tests.helpers.mtp_models import checkpoint_config, make_checkpoint, merged_kv_b, strip_mtp
from tests.helpers.stats import assert_follows

TOKENS = 300
FAMILY = "glm4_moe"


@pytest.fixture(scope="module", params=["glm4_moe", "mimo", "deepseek_v3"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"nextn-{request.param}")
    return make_checkpoint(root, [PROMPT], TOKENS, family=request.param)


@pytest.fixture(scope="module")
def engine(checkpoint: Path) -> Engine:
    return Engine.load(target=str(checkpoint), draft="mtp")


@pytest.fixture(scope="module")
def plain(engine: Engine) -> list[int]:
    return generate(engine, engine.encode_raw(PROMPT), SpecConfig(method="none"), TOKENS)[0]


def test_the_next_n_layer_loads_under_its_own_names(engine, checkpoint):
    model = engine.draft.model
    raw = stored(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    # the feed of the family's reference implementation: MiMo's is the last layer's output
    fed = (3,) if config["model_type"] == "mimo" else (TOP,)
    assert isinstance(model, NextnModel) and model.feature_layers == fed
    assert engine._target.feature_layers == fed
    prefix, names = layer_prefix(config), FAMILIES[config["model_type"]].names
    assert mx.array_equal(model.enorm.weight, raw[f"{prefix}{names['enorm']}.weight"])
    assert mx.array_equal(model.eh_proj.weight, raw[f"{prefix}{names['eh_proj']}.weight"])
    assert mx.array_equal(
        model.shared_head.norm.weight, raw[f"{prefix}{names['shared_head.norm']}.weight"]
    )
    if config["model_type"] != "mimo":  # an expert layer
        experts = model.layers[0].mlp.switch_mlp.gate_proj.weight
        assert mx.array_equal(experts[2], raw[f"{prefix}mlp.experts.2.gate_proj.weight"])
    if config["model_type"] == "deepseek_v3":  # MLA: kv_b_proj split as mlx-lm splits it
        attn = model.layers[0].self_attn
        split = {"self_attn.embed_q.weight": attn.embed_q.weight}
        split["self_attn.unembed_out.weight"] = attn.unembed_out.weight
        kv_b = merged_kv_b(split)["self_attn.kv_b_proj.weight"]
        assert mx.array_equal(kv_b, raw[f"{prefix}self_attn.kv_b_proj.weight"])


def stored(folder: Path) -> dict[str, mx.array]:
    """Every array of a checkpoint folder's safetensors files."""
    found: dict[str, mx.array] = {}
    for f in folder.glob("*.safetensors"):
        found |= mx.load(str(f))  # type: ignore[arg-type]
    return found


def test_sanitize_keeps_the_layer_and_drops_the_shared_copies():
    w = mx.ones((2,))
    glm = {
        f"model.layers.4.{n}.weight": w
        for n in (
            "hnorm",
            "input_layernorm",
            "embed_tokens",
            "shared_head.head",
            "shared_head.norm",
        )
    }
    out = sanitize_nextn(glm, checkpoint_config("glm4_moe", 300))
    assert set(out) == {
        "hnorm.weight",
        "layers.0.input_layernorm.weight",
        "shared_head.norm.weight",
    }
    mimo = {f"model.mtp_layers.0.{n}.weight": w for n in ("input_proj", "input_layernorm")}
    out = sanitize_nextn(mimo, checkpoint_config("mimo", 300))
    assert set(out) == {"eh_proj.weight", "layers.0.input_layernorm.weight"}


SPECS = {
    "k1": SpecConfig(k=1, method="mtp", adaptive=False),
    "k3": SpecConfig(k=3, method="mtp", adaptive=False),
    "adaptive": SpecConfig(k=2, method="mtp", adaptive=True),
}


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_greedy_output_equals_plain_decoding(engine, plain, spec):
    events = gen(engine, engine.encode_raw(PROMPT), spec, TOKENS)
    rounds = rounds_of(events)
    assert first_difference(token_ids(events), plain) is None
    acceptance = sum(r.accepted for r in rounds) / max(sum(r.drafted for r in rounds), 1)
    assert acceptance > 0.3  # the layer learnt this answer: most drafts pass


def test_the_cli_answers_as_no_spec(checkpoint):
    args = ["generate", PROMPT, "--target", str(checkpoint), "--raw", "--temp", "0"]
    args += ["--max-tokens", str(TOKENS), "--json"]
    mtp, none = run_edgespec(*args, "--method", "mtp"), run_edgespec(*args, "--no-spec")
    assert mtp.returncode == 0 and none.returncode == 0, mtp.stderr[-2000:] + none.stderr
    records = [[json.loads(line) for line in out.stdout.splitlines()] for out in (mtp, none)]
    ids = [[r["id"] for r in recs if r["type"] == "token"] for recs in records]
    assert len(ids[0]) == TOKENS and ids[0] == ids[1]
    assert sum(r["accepted"] for r in records[0] if r["type"] == "round") > 0


def test_sampled_answers_follow_the_target_distribution(engine):
    engine.reset()
    spec = SpecConfig(k=3, method="mtp", adaptive=False)
    assert_follows(lambda seeds: sampled_p_value(engine, spec, seeds, 60)[0], range(6), "mtp")


def test_the_check_fails_on_a_q_that_did_not_draw_the_token(engine, monkeypatch):
    """Plant the bug: drafts drawn at T = 4, reported as drawn from the T = 1 q."""

    def flat_pick(logits, sampling, u, i, head_ids, rows, softmax=None):
        rows.append(warp(logits, sampling, softmax))
        return sample(warp(logits, SamplingConfig(temperature=4.0)), u[i])

    monkeypatch.setattr("edgespec.drafting.feature.pick_token", flat_pick)
    ids, rng, values = engine.encode_raw(PROMPT), np.random.default_rng(1234), []
    engine.reset()
    for seed in range(6):
        sampling = SamplingConfig(temperature=1.0, seed=seed)
        spec = SpecConfig(k=3, method="mtp", adaptive=False)
        tokens, _ = generate(engine, ids, spec, 60, temperature=1.0, seed=seed)
        values.append(pit_values(engine, ids, tokens, sampling, rng))
    assert sum(len(v) for v in values) >= 200
    assert kstest(np.concatenate(values), "uniform").pvalue < 1e-3


def test_a_folder_without_the_layer_is_a_one_line_error(checkpoint, tmp_path):
    stripped = strip_mtp(checkpoint, tmp_path / "community")
    out = run_edgespec("generate", PROMPT, "--target", str(stripped), "--method", "mtp")
    assert out.returncode == 2
    line = out.stderr.strip()
    assert "\n" not in line and "no MTP weights" in line and "edgespec pull" in line


def test_only_a_checkpoint_holding_the_layer_is_converted_by_pull(checkpoint, tmp_path):
    """An mlx-community folder keeps `num_nextn_predict_layers` in its config but not the layer:
    `pull` must not take it for an original checkpoint to convert."""
    assert is_checkpoint_with_mtp(checkpoint)
    assert not is_checkpoint_with_mtp(strip_mtp(checkpoint, tmp_path / "community"))


def test_configs_without_one_next_n_layer_are_refused_in_one_line():
    config = checkpoint_config(FAMILY, 300)
    config["num_nextn_predict_layers"] = 2
    with pytest.raises(ConfigError, match="one MTP layer; this one declares 2"):
        build_head(config)
    with pytest.raises(ConfigError, match="DeepSeek-V3, GLM-4.5.*not llama"):
        build_head({"model_type": "llama", "num_nextn_predict_layers": 1})


def test_pull_of_a_folder_converts_it_keeping_the_layer(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    out = run_edgespec("pull", str(checkpoint))
    assert out.returncode == 0, out.stderr[-2000:]
    folder = Path(out.stdout.split(": ", 1)[1].rsplit(" (", 1)[0])
    config = json.loads((folder / "config.json").read_text())
    assert config["quantization"]["bits"] == 4 and config["mtp_quantization"]["bits"] == 8
    stored = read_head(folder, config)
    assert "eh_proj.scales" in stored and "layers.0.self_attn.q_proj.scales" in stored
    assert not any(k.startswith(("embed_tokens", "shared_head.head")) for k in stored)
    engine = Engine.load(target=str(folder), draft="mtp")
    assert isinstance(engine.draft.model, NextnModel)
    ids = engine.encode_raw(PROMPT)
    tokens, _ = generate(engine, ids, SpecConfig(k=3, method="mtp", adaptive=False), 40)
    assert tokens == generate(engine, ids, SpecConfig(method="none"), 40)[0]
