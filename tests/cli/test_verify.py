"""`edgespec verify`: the empirical check on a real (tiny) pair, its statistics, and its CLI."""

from __future__ import annotations

import json
import subprocess

import mlx.core as mx
import numpy as np
import pytest
from scipy.stats import chi2

from edgespec.bench.unbiased import chi2_sf, chi_square, last_distributions, simulate, verify_pair
from edgespec.config import SamplingConfig
from tests.helpers.cli import run_edgespec

HOT = SamplingConfig(temperature=2.5, seed=0)


@pytest.fixture(scope="module")
def context(tiny_models) -> list[int]:
    return tiny_models[0].tokenizer.encode("the river and the")


def test_l1_shrinks_with_rounds_and_matches_sampling_noise(tiny_models, context):
    target, draft = (m.model for m in tiny_models)
    small, large = (verify_pair(target, draft, context, HOT, 3, n) for n in (500, 40_000))
    assert large.l1 < small.l1 / 3
    for r in (small, large):
        assert r.l1 < 1.5 * r.l1_noise
        assert r.p_value > 1e-3
        sigma = np.sqrt(r.expected_acceptance * (1 - r.expected_acceptance) / r.rounds)
        assert abs(r.acceptance - r.expected_acceptance) < 5 * sigma + 1e-9
    assert 0.05 < large.expected_acceptance < 0.99  # a non-trivial pair at this temperature


def test_the_check_flags_a_biased_sampler(tiny_models, context):
    """Counts drawn from q instead of p (what a wrong residual tends towards) must be rejected."""
    target, draft = (m.model for m in tiny_models)
    p, q = last_distributions(target, draft, context, HOT)
    counts, _ = simulate(q, q, 2, 20_000, seed=1)  # an "exact" sampler of the WRONG distribution
    _, _, p_value = chi_square(counts, np.array(p, np.float64) / float(mx.sum(p).item()))
    assert p_value < 1e-6


def test_impossible_tokens_fail_the_check():
    assert chi_square(np.array([10, 0, 1]), np.array([0.5, 0.5, 0.0]))[2] == 0.0


@pytest.mark.parametrize("x,dof", [(0.16, 1), (3.0, 2), (50.0, 40), (500.0, 450), (30.0, 3)])
def test_chi2_survival_function_matches_scipy(x, dof):
    assert chi2_sf(x, dof) == pytest.approx(chi2.sf(x, dof), rel=1e-9, abs=1e-300)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_edgespec("verify", *args)


def test_cli_json(tiny_pair):
    args = ["--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--temp", "2.5"]
    r = _cli(*args, "--rounds", "3000", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"l1", "acceptance", "expected_acceptance", "p_value", "rounds"} <= set(out)
    assert out["rounds"] == 3000 and out["p_value"] > 1e-3
    human = _cli(*args, "--rounds", "1000")
    assert human.returncode == 0 and "L1(empirical, p)" in human.stdout


@pytest.mark.parametrize(
    "bad", [["--rounds", "0"], ["-k", "0"], ["-k", "65"], ["--temp", "-1"], ["--temp", "inf"]]
)
def test_cli_bad_input(tiny_pair, bad):
    r = _cli("--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), *bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_verify_takes_the_thinking_switch(tmp_path):
    from tests.helpers.tiny import make_tiny_pair

    pair = make_tiny_pair(tmp_path / "thinking", thinking=True)
    args = ["--target", str(pair[0]), "--draft", str(pair[1]), "--rounds", "200", "--json"]

    def context(*extra: str) -> int:
        r = _cli(*args[:-1], *extra)
        assert r.returncode == 0, r.stderr
        return int(r.stdout.split("context ")[1].split()[0])

    assert context("--no-think") > context("--think") == context()
