"""`edgespec generate` as a user runs it: a subprocess, good runs and every bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.cli import mlx_lm_stopper, run_edgespec
from tests.helpers.tiny import make_tiny_pair


def edgespec(*args: str) -> subprocess.CompletedProcess:
    return run_edgespec("generate", *args)


def models(pair: tuple[Path, Path]) -> list[str]:
    return ["--target", str(pair[0]), "--draft", str(pair[1])]


def test_json_stream_schema(tiny_pair):
    r = edgespec("the cat", *models(tiny_pair), "--json", "--max-tokens", "12", "-k", "3")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    tokens = [x for x in lines if x["type"] == "token"]
    rounds = [x for x in lines if x["type"] == "round"]
    assert len(tokens) == 12 and rounds and lines[-1]["type"] == "summary"
    assert set(tokens[0]) >= {"id", "text", "kind", "round"}
    # "target": a plain step that adaptive K (the default) chose, or a round with nothing drafted
    kinds = {t["kind"] for t in tokens}
    assert kinds <= {"accepted", "corrected", "bonus", "target"} and kinds - {"target"}
    assert all(t["kind"] == "target" for t in tokens if rounds[t["round"]]["drafted"] == 0)
    assert set(rounds[0]) >= {"drafted", "accepted", "k", "t_draft", "t_verify"}
    summary = lines[-1]
    for key in ("tokens", "rounds", "acceptance", "tau", "ttft", "tokens_per_s", "reason", "text"):
        assert key in summary
    assert summary["tokens"] == 12 and summary["rounds"] == len(rounds)


def test_no_spec_raw_matches_speculative_greedy(tiny_pair):
    # The prompt repeats: its suffix occurred before, so the hybrid's first round is a lookup.
    prompt = "the cat and the dog, the cat and the dog"
    args = [prompt, *models(tiny_pair), "--raw", "--json", "--max-tokens", "16"]
    plain = edgespec(*args, "--no-spec")
    spec = edgespec(*args, "-k", "5")
    assert plain.returncode == spec.returncode == 0, plain.stderr + spec.stderr

    def ids(r):
        return [x["id"] for x in map(json.loads, r.stdout.splitlines()) if x["type"] == "token"]

    assert ids(plain) == ids(spec)

    def rounds_of(r):
        return [x for x in map(json.loads, r.stdout.splitlines()) if x["type"] == "round"]

    # The default is hybrid drafting with adaptive K (-k is the first rounds' K): lookups and the
    # draft model both draft, K varies; --no-adaptive --method draft keeps every round at -k.
    default = rounds_of(spec)
    assert {r["method"] for r in default if r["drafted"]} == {"draft", "ngram"}, default
    assert len({r["k"] for r in default}) > 1
    fixed = edgespec(*args, "-k", "5", "--method", "draft", "--no-adaptive")
    assert fixed.returncode == 0, fixed.stderr
    assert ids(fixed) == ids(plain) and {r["k"] for r in rounds_of(fixed)} == {5}
    kinds = {x.get("kind") for x in map(json.loads, plain.stdout.splitlines())}
    assert kinds == {"target", None}
    flags = ["--method", "ngram", "--ngram-min", "2", "--ngram-max", "3", "--adaptive"]
    lookup = edgespec(*args, *flags, "--k-max", "6")
    assert lookup.returncode == 0, lookup.stderr
    assert ids(lookup) == ids(plain)
    rounds = [x for x in map(json.loads, lookup.stdout.splitlines()) if x["type"] == "round"]
    assert rounds and all(0 <= r["k"] <= 6 for r in rounds)


def test_text_output_and_summary_line(tiny_pair):
    r = edgespec("hello", *models(tiny_pair), "--max-tokens", "8", "--temp", "0.7", "--seed", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and "8 tokens (length)" in r.stderr and "tokens/s" in r.stderr


@pytest.fixture(scope="module")
def broken(tmp_path_factory, tiny_pair) -> dict[str, Path]:
    """A truncated-weights target and a draft with a different tokenizer."""
    root = tmp_path_factory.mktemp("broken")
    trunc = root / "truncated"
    shutil.copytree(tiny_pair[0], trunc)
    weights = trunc / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    garbage = root / "garbage"
    shutil.copytree(tiny_pair[0], garbage)
    (garbage / "model.safetensors").write_bytes(b"not a safetensors file" * 10)
    _, other_draft = make_tiny_pair(root / "other", seed=1)
    return {"truncated": trunc, "garbage": garbage, "other_draft": other_draft}


BAD = {
    "unknown-model": (["x", "--target", "/nonexistent/model", "--no-spec"], "nonexistent"),
    "k-zero": (["x", "-k", "0"], "K"),
    "negative-temp": (["x", "--temp", "-1"], "temperature"),
    "top-p-zero": (["x", "--top-p", "0"], "top-p"),
    "top-p-above-one": (["x", "--top-p", "1.5"], "top-p"),
    "empty-prompt": ([""], "empty"),
    "blank-raw-prompt": (["  ", "--raw"], "empty"),
    "too-long": (["the cat " * 400, "--raw"], "context"),
    "ngram-min-above-max": (["x", "--ngram-min", "3", "--ngram-max", "2"], "ngram-min"),
    # a K this large used to draft up to the context window each round (a silent hang)
    "k-huge": (["x", "-k", "100000"], "1..64"),
    "k-max-huge": (["x", "--k-max", "65"], "k-max"),
    "ngram-max-huge": (["x", "--ngram-max", "65"], "ngram-max"),
    "ngram-long-negative": (["x", "--ngram-long", "-1"], "ngram-long"),
    "ngram-long-k-zero": (["x", "--ngram-long-k", "0"], "ngram-long-k"),
    "infinite-temp": (["x", "--temp", "inf"], "finite"),
    "nan-temp": (["x", "--temp", "nan"], "temperature"),
    "negative-seed": (["x", "--seed", "-1"], "seed"),
    "seed-too-big": (["x", "--seed", str(2**64)], "seed"),
    "parse-special-without-raw": (["x", "--parse-special"], "--raw"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_one_line_exit_2(tiny_pair, case):
    args, needle = BAD[case]
    extra = [] if "--target" in args else models(tiny_pair)
    _assert_one_line_error(edgespec(*args, *extra), needle)


@pytest.mark.parametrize("case", ["k-zero", "top-p-zero", "empty-prompt", "blank-raw-prompt"])
def test_bad_settings_and_empty_prompts_are_refused_before_mlx_lm_is_imported(case, tmp_path):
    args, needle = BAD[case]
    r = run_edgespec("generate", *args, path_first=mlx_lm_stopper(tmp_path))
    _assert_one_line_error(r, needle)


@pytest.mark.parametrize("case", ["truncated", "garbage", "mismatch"])
def test_bad_models_are_one_line_exit_2(tiny_pair, broken, case):
    if case == "mismatch":
        r = edgespec("x", "--target", str(tiny_pair[0]), "--draft", str(broken["other_draft"]))
        _assert_one_line_error(r, "tokeniz")
    else:
        r = edgespec("x", "--target", str(broken[case]), "--draft", str(tiny_pair[1]))
        _assert_one_line_error(r, case if case == "truncated" else "")


def _assert_one_line_error(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle.lower() in lines[0].lower(), lines[0]


def test_a_backend_failure_is_one_line_exit_1(tiny_pair, monkeypatch, capsys):
    # What MLX raises when a GPU runs out of memory or a kernel does not compile (seen on an
    # H100: "Failed to compile kernel: ... cannot open source file crt/mma.h"): a RuntimeError
    # from deep inside a forward. The user gets its first line, not a traceback.
    from edgespec import cli
    from edgespec.runtime import Engine

    def fail(self, *args, **kwargs):
        raise RuntimeError(
            "\n[metal::malloc] Attempting to allocate 9000000000 bytes which is greater than the "
            "maximum allowed buffer size of 8000000000 bytes.\nsecond line"
        )

    monkeypatch.setattr(Engine, "generate", fail)
    argv = ["generate", "hello", *models(tiny_pair)]
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "edgespec generate: error: RuntimeError: [metal::malloc] Attempting to allocate 9000000000 "
        "bytes which is greater than the maximum allowed buffer size of 8000000000 bytes. "
        "(EDGESPEC_DEBUG=1 shows the traceback)"
    ]
    monkeypatch.setenv("EDGESPEC_DEBUG", "1")
    with pytest.raises(RuntimeError, match="metal::malloc"):
        cli.main(argv)


def summary(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_a_prompt_is_text_unless_parse_special_is_asked_for(tiny_pair):
    """Issue 75: '<|im_end|>' typed in a prompt is characters (7 tokens here), with or without
    the chat template; --raw --parse-special reads it as the control token (1)."""
    base = [*models(tiny_pair), "--json", "--max-tokens", "1", "--no-spec"]
    text = summary(edgespec("x<|im_end|>", *base, "--raw"))["prompt_tokens"]
    parsed = summary(edgespec("x<|im_end|>", *base, "--raw", "--parse-special"))
    assert parsed["prompt_tokens"] == 2 and text > 2
    chat = summary(edgespec("x<|im_end|>", *base))["prompt_tokens"]
    assert chat == summary(edgespec("x", *base))["prompt_tokens"] + text - 1


@pytest.fixture(scope="module")
def thinking_pair(tmp_path_factory) -> tuple[Path, Path]:
    return make_tiny_pair(tmp_path_factory.mktemp("thinking"), thinking=True)


def test_think_and_no_think_reach_a_template_that_has_the_mode(thinking_pair):
    base = ["the cat", *models(thinking_pair), "--json", "--max-tokens", "1", "--no-spec"]
    default = edgespec(*base)
    on, off = edgespec(*base, "--think"), edgespec(*base, "--no-think")
    assert summary(default)["prompt_tokens"] == summary(on)["prompt_tokens"]
    assert summary(off)["prompt_tokens"] > summary(on)["prompt_tokens"]  # an empty reasoning part
    assert "note" not in default.stderr + on.stderr + off.stderr


def test_think_on_a_template_without_the_mode_says_so_once(tiny_pair):
    r = edgespec("the cat", *models(tiny_pair), "--max-tokens", "2", "--no-think")
    notes = [line for line in r.stderr.splitlines() if "note:" in line]
    assert r.returncode == 0 and len(notes) == 1
    assert "has no thinking mode; --no-think changes nothing" in notes[0]
    r = edgespec("the cat", *models(tiny_pair), "--max-tokens", "2", "--raw", "--think")
    assert "--think changes nothing with --raw" in r.stderr
    quiet = edgespec("the cat", *models(tiny_pair), "--max-tokens", "2")
    assert "note:" not in quiet.stderr
