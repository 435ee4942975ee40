"""A target sharded with mlx.distributed: real multi-process runs on localhost (MLX's ring backend,
launched by mlx.launch as users do), compared with the single-process run.

Fast set: a tiny llama at N = 2 (tensor parallel), a tiny ministral3 at N = 2 (pipeline
parallel), a group of one, a sampled run at T = 1 against the target's exact distribution and
against the single process, a rank killed mid-run, and the one-line errors. Slow: the embedded
target (SmolLM2-135M: 9 heads, 3 KV heads) at N = 3.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgespec.bench.unbiased import chi_square
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.distributed.group import Agreement, Group, check_config, fold
from edgespec.errors import ConfigError, GroupError
from edgespec.launch import env_rank, launched_backend, local_ranks, share_threads
from edgespec.loading.shard import check_shardable, divisible_sizes
from tests.helpers.cli import ROOT, run_edgespec
from tests.helpers.distributed import (
    env,
    launch,
    script_command,
    token_ids,
    write_hostfile,
)
from tests.helpers.stats import assert_follows
from tests.helpers.tiny import make_tiny_pair

# Each test starts a group of ranks: under pytest-xdist (`-n`), one such test at a time
# (`--dist loadgroup` keeps a group on one worker), so that ranks never wait on each other's cores.
pytestmark = pytest.mark.xdist_group("distributed")

GREEDY = ["--temp", "0", "--json", "--raw", "--max-tokens", "16"]


def models(target: Path, draft: Path) -> list[str]:
    return ["--target", str(target), "--draft", str(draft)]


@pytest.fixture(scope="module")
def two_layer_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny pair with a 2-layer target: 4 all-reduces per sharded forward, not 8."""
    return make_tiny_pair(tmp_path_factory.mktemp("two_layers"), seed=0, target_layers=2)


# ----------------------------------------------------------------------------- pure parts


def test_launcher_environment(tmp_path):
    hostfile = write_hostfile(tmp_path / "hosts.json", 3)
    ring = {"MLX_HOSTFILE": str(hostfile), "MLX_RANK": "2"}
    assert launched_backend(ring) == "ring" and env_rank(ring) == 2
    assert launched_backend({}) is None and env_rank({"MLX_RANK": "1"}) is None
    assert launched_backend({"MLX_JACCL_COORDINATOR": "10.0.0.1:32323", "MLX_RANK": "0"}) == "jaccl"
    assert local_ranks(ring) == 3
    threads = dict(ring, MKL_NUM_THREADS="4")
    assert share_threads(threads) == str(max(1, (os.cpu_count() or 1) // 3))
    assert threads["MKL_NUM_THREADS"] == "4"  # a count the user set stays
    assert threads["OMP_NUM_THREADS"] == threads["OPENBLAS_NUM_THREADS"] != "4"
    hostfile.write_text(json.dumps([["10.0.0.1:1"], ["10.0.0.2:1"]]))
    alone = dict(ring, MLX_RANK="1")
    assert (
        local_ranks(alone) == 1 and share_threads(alone) is None and "OMP_NUM_THREADS" not in alone
    )


def test_checksum_worked_example():
    assert fold(0, [5]) == 6 and fold(6, [0]) == 6000019
    assert fold(0, [1, 2]) != fold(0, [2, 1])


def test_shardable_checks_name_the_fix():
    smollm = {
        "model_type": "llama",
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
    }
    assert divisible_sizes(smollm) == [3]
    check_shardable(smollm, "smollm", {"tensor": True, "pipeline": False}, "tensor", 3)
    with pytest.raises(GroupError, match=r"9 attention heads, 3 KV heads .* size 2 .*fit: 3\)"):
        check_shardable(smollm, "smollm", {"tensor": True, "pipeline": False}, "tensor", 2)
    with pytest.raises(GroupError, match="no pipeline parallelism .* use --shard tensor"):
        check_shardable(smollm, "smollm", {"tensor": True, "pipeline": False}, "pipeline", 3)
    with pytest.raises(GroupError, match="neither tensor nor pipeline"):
        check_shardable(smollm, "smollm", {"tensor": False, "pipeline": False}, "tensor", 3)
    with pytest.raises(GroupError, match="30 layers, fewer than the 32 pipeline stages"):
        check_shardable(smollm, "smollm", {"tensor": False, "pipeline": True}, "pipeline", 32)


def test_timing_driven_choices_are_refused_for_a_sharded_target():
    """Adaptive K and --tree auto pick from each rank's own timings: refused for two ranks."""

    class Two:
        def size(self) -> int:
            return 2

    group = Group(Two(), "ring")
    for spec in (
        SpecConfig(adaptive=True, method="draft"),
        SpecConfig(method="draft", tree="auto", adaptive=False),
    ):
        with pytest.raises(ConfigError, match="differ between ranks"):
            check_config(GenerationConfig(spec=spec), group)
    check_config(
        GenerationConfig(spec=SpecConfig(method="draft", tree="3,2,1", adaptive=False)), group
    )


def test_agreement_on_a_group_of_one():
    import mlx.core as mx

    from edgespec.distributed.group import Group

    agreement = Agreement(Group(mx.distributed.init(), "none"))
    agreement.observe([1, 2, 3], 2, 1)
    agreement.observe([4], None, None)  # a plain step: read one step late
    agreement.settle()
    assert agreement.steps == 2 and agreement.digest == fold(
        fold(0, [1, 2, 3, 2, 1, 3]), [4, -1, -1, 1]
    )


# ----------------------------------------------------------------------------- real launches


def single(*args: str) -> list[int]:
    r = run_edgespec("generate", *args)
    assert r.returncode == 0, r.stderr
    return token_ids(r.stdout)


@pytest.mark.parametrize(
    "n, shard, kind",
    [(2, "tensor", "llama"), (2, "pipeline", "ministral3"), (1, "tensor", "llama")],
)
def test_greedy_sharded_matches_single_process(tiny_pair, tiny_ministral, n, shard, kind):
    target = tiny_ministral if kind == "ministral3" else tiny_pair[0]
    args = ["the cat and the dog", *models(target, tiny_pair[1]), *GREEDY, "-k", "3"]
    args += ["--method", "hybrid"]  # n-gram rounds and draft rounds, both checked across ranks
    expected = single(*args)
    r = launch(n, "generate", *args, "--shard", shard)
    assert token_ids(r.stdout) == expected, r.stderr
    summary = json.loads(r.stdout.splitlines()[-1])
    assert summary["type"] == "summary" and summary["rounds"] > 0
    assert r.stdout.count('"type": "summary"') == 1  # rank 0 alone prints
    if n > 1:  # adaptive K is the default: under a group it is fixed, and the note says so
        assert "K stays 3" in r.stderr


def test_sampled_run_follows_p_and_the_single_process(two_layer_pair, tmp_path):
    """T = 1: the sharded run's tokens are the single process's for every seed (same keys, same
    logits after the all-reduce), and their joint distribution (x1, x2) is the target's."""
    import mlx.core as mx
    from mlx_lm import load

    from tests.helpers.dist_sample import PROMPT, samples

    tiny_pair, count, out = two_layer_pair, 100, tmp_path / "samples.json"
    cmd = script_command(
        2, "dist_sample.py", str(tiny_pair[0]), str(tiny_pair[1]), str(out), str(count)
    )
    r = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=600)
    assert out.exists(), r.stdout + r.stderr
    got = json.loads(out.read_text())
    assert got["size"] == 2

    from edgespec.runtime import Engine

    engine = Engine.load(str(tiny_pair[0]), str(tiny_pair[1]), draft_bits=0)
    assert got["ids"] == samples(engine, range(count))  # decision for decision

    model, tokenizer = load(str(tiny_pair[0]))
    prompt = tokenizer.encode(PROMPT)
    cfg = SamplingConfig(temperature=1.0)
    vocab = model.args.vocab_size
    p1 = np.array(mx.softmax(model(mx.array([prompt]))[0, -1] / cfg.temperature), np.float64)
    both = mx.array([prompt + [x] for x in range(vocab)])  # p(x2 | x1) for every x1
    p2 = np.array(mx.softmax(model(both)[:, -1], axis=-1), np.float64)
    joint = (p1[:, None] * p2).reshape(-1)

    def p_value(seeds: range) -> float:
        """Stage one judges the sharded run's draws; stage two, if it comes, the single
        process's (the same decisions on stage one's seeds, as asserted above)."""
        counts = np.zeros(vocab * vocab, np.int64)
        for x1, x2 in got["ids"] if seeds == range(count) else samples(engine, seeds):
            counts[x1 * vocab + x2] += 1
        return chi_square(counts, joint / joint.sum())[2]

    assert_follows(p_value, range(count), "sharded (x1, x2)")


def test_ranks_that_disagree_all_stop(tmp_path):
    """The agreement check can fail: a step committed differently on one rank stops every rank."""
    cmd = script_command(2, "dist_agreement.py")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=120)
    # mlx.launch relays each rank's output in chunks, so one rank's line may end inside another's:
    # split at the marker, not at line breaks.
    caught = sorted(re.findall(r"rank \d caught: .*?(?=rank \d caught: |\n|$)", r.stdout))
    assert len(caught) == 2, r.stdout + r.stderr
    assert caught[0].startswith("rank 0 caught: the 2 ranks disagree on the tokens of step 2")
    assert caught[1].startswith("rank 1 caught: the 2 ranks disagree on the tokens of step 2")


def test_killed_rank_stops_rank_0_with_one_line(tiny_pair, tmp_path):
    """Rank 1 is killed mid-answer; rank 0 (no launcher to stop it) must end on its own, within
    the timeout, with a one-line error that says what happened."""
    hostfile = write_hostfile(tmp_path / "hosts.json", 2)
    args = [
        sys.executable,
        "-m",
        "edgespec",
        "generate",
        "the cat",
        *models(*tiny_pair),
        "--temp",
        "0",
        "--json",
        "--max-tokens",
        "400",
        "--method",
        "draft",
        "--no-adaptive",
    ]
    ranks = [
        subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env(MLX_HOSTFILE=str(hostfile), MLX_RANK=str(rank)),
        )
        for rank in range(2)
    ]
    try:
        assert ranks[0].stdout is not None
        first = ranks[0].stdout.readline()  # rank 0 is answering
        assert first.startswith("{"), ranks[0].stderr.read() if ranks[0].stderr else ""
        os.kill(ranks[1].pid, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = ranks[0].communicate(timeout=120)
        assert time.monotonic() - t0 < 120
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
    ours = [line for line in err.splitlines() if line.startswith("edgespec")]
    assert ranks[0].returncode == 2, err
    assert ours == [
        "edgespec generate: error: rank 0 lost its group ([ring] connection to a peer was lost): "
        "another rank stopped or the network between them failed"
    ], err


def test_heads_that_do_not_divide_give_one_line(tiny_pair):
    r = launch(3, "generate", "hi", *models(*tiny_pair), "--max-tokens", "2", timeout=120)
    # The launcher relays the ranks' stderr as it comes: a rank's line may land right after
    # another's before its newline, so the lines are split where each message begins too.
    lines = [
        line
        for chunk in re.split(r"(?=edgespec generate)", r.stderr)
        for line in chunk.splitlines()
    ]
    rank_0 = [line for line in lines if line.startswith("edgespec generate: err")]
    assert "Traceback" not in r.stderr
    assert rank_0 == [
        "edgespec generate: error: target has 4 attention heads, 2 KV heads and an MLP of 128: "
        "tensor parallelism needs all three divisible by the group size 3 (sizes that fit: 2)"
    ], r.stderr


def test_commands_without_a_group_path_refuse_the_launcher(tmp_path):
    hostfile = write_hostfile(tmp_path / "hosts.json", 2)
    r = subprocess.run(
        [sys.executable, "-m", "edgespec", "verify"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env(MLX_HOSTFILE=str(hostfile), MLX_RANK="0"),
        timeout=120,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "edgespec verify: error: verify does not run under mlx.launch; use generate, bench or serve "
        "there"
    )


# ----------------------------------------------------------------------------- the real target


@pytest.mark.slow
def test_embedded_target_n3_greedy_matches_single_process():
    """`mlx.launch --backend ring -n 3 -- edgespec generate "..." --temp 0 --json`: SmolLM2-135M
    (9 heads, 3 KV heads) split three ways gives the single process's token ids."""
    args = ["Name three primary colours.", "--temp", "0", "--json", "--max-tokens", "10"]
    expected = single(*args, "--no-adaptive")
    r = launch(3, "generate", *args, timeout=900)
    assert token_ids(r.stdout) == expected, r.stderr


RING_WATCH = """
import os, sys, time
from edgespec.launch import exit_when_ring_gives_up
exit_when_ring_gives_up("edgespec generate", grace=0.5)
print("before", file=sys.stderr, flush=True)
if sys.argv[1] == "hang":
    os.write(2, b"[ring] Too many send/recv errors. Failing pending tasks...\\n")
    time.sleep(60)  # what MLX's wait does once its ring has given up
print("last line", file=sys.stderr)
"""


@pytest.mark.parametrize("case", ["hang", "normal"])
def test_ring_giving_up_ends_a_hung_rank_with_one_line(case):
    """MLX's ring can fail a dead peer's tasks without waking the eval waiting on them; the CLI's
    stderr watch ends such a rank with the group error and status 2, and loses no line when the
    process exits on its own."""
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", RING_WATCH, case],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        env=env(MLX_RANK="0", MLX_HOSTFILE="hosts.json"),  # read as a launched rank 0
    )
    lines = r.stderr.splitlines()
    if case == "hang":
        assert r.returncode == 2 and time.monotonic() - t0 < 20, r.stderr
        assert lines[0] == "before" and lines[-1] == (
            "edgespec generate: error: rank 0 lost its group ([ring] connection to a peer was "
            "lost): another rank stopped or the network between them failed"
        )
    else:
        assert r.returncode == 0 and lines == ["before", "last line"], r.stderr
