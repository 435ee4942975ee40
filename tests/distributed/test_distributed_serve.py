"""`edgespec serve` on a sharded target: real multi-process runs on localhost (MLX's ring backend),
rank 0 answering HTTP, compared with the single-process server.

The tiny llama (4 heads, 2 KV heads) splits two ways tensor parallel, the tiny ministral3 two
ways pipeline parallel (mlx-lm has no pipeline for llama). Every test kills what it started: the
launcher's whole process group, or each rank it started itself.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.distributed.messages import decode_config, encode_config
from edgespec.server.process import READY, ServerProcess
from tests.helpers.cli import ROOT
from tests.helpers.dist_serve import REQUESTS
from tests.helpers.distributed import (
    env,
    launch_command,
    script_command,
    write_hostfile,
)
from tests.helpers.ministral import tiny_ministral as ministral_fixture

httpx = pytest.importorskip("httpx")
ministral = ministral_fixture  # tests/helpers/ministral.py's tiny ministral3, under a second name

# Each test starts a group of ranks: under pytest-xdist (`-n`), one such test at a time
# (`--dist loadgroup` keeps a group on one worker), so that ranks never wait on each other's cores.
pytestmark = pytest.mark.xdist_group("distributed")

MAX = 16
LOST = (
    "edgespec serve: error: rank 0 lost its group ([ring] connection to a peer was lost): "
    "another rank stopped or the network between them failed"
)


def models(pair) -> list[str]:
    return ["--target", str(pair[0]), "--draft", str(pair[1])]


def serve_args(pair, *extra: str) -> list[str]:
    return ["serve", *models(pair), "--host", "127.0.0.1", "--port", "0", "--k", "3", *extra]


class Ranks:
    """Processes serving one group; `url` once rank 0 (the first process's stdout) is ready."""

    def __init__(self, procs: list[subprocess.Popen], timeout: float = 180):
        self.procs, self.lines = procs, queue.Queue[str]()
        assert procs[0].stdout is not None
        threading.Thread(target=self._pump, args=(procs[0].stdout,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and procs[0].poll() is None:
            try:
                found = READY.search(self.lines.get(timeout=0.5))
            except queue.Empty:
                continue
            if found:
                self.url = found.group(1)
                return
        self.kill()
        raise AssertionError(f"the group did not start: {self.stderr(0)}")

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.put(line)

    def stderr(self, i: int) -> str:
        proc = self.procs[i]
        return proc.stderr.read() if proc.stderr and proc.poll() is not None else ""

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the launcher's group holds its ranks
            proc.wait(10)


def launched(n: int, *args: str) -> Ranks:
    """`mlx.launch --backend ring -n N -- edgespec ARGS`, in a session of its own."""
    proc = subprocess.Popen(
        launch_command(n, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
        start_new_session=True,
    )
    return Ranks([proc])


def ranks(hostfile: Path, n: int, *args: str) -> Ranks:
    """N ranks started directly on one hostfile (so that a test can kill one of them)."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "edgespec", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            start_new_session=True,
            env=env(MLX_HOSTFILE=str(hostfile), MLX_RANK=str(rank)),
        )
        for rank in range(n)
    ]
    return Ranks(procs)


def post(url: str, body: dict, timeout: float = 120) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(url: str, body: dict, on_first=None, timeout: float = 120) -> list[dict]:
    """The data objects of a streamed chat completion ([DONE] left out)."""
    chunks = []
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json=dict(body, stream=True), timeout=timeout
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
                if on_first is not None and len(chunks) == 2:  # the role chunk, then text
                    on_first()
    return chunks


def text_of(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def chat(text: str, **kw) -> dict:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": MAX, **kw}


REQUESTED = [
    chat("the cat and the dog", temperature=0),
    chat("the cat and the dog", temperature=0, edgespec={"method": "draft"}),
    chat("a dog", temperature=1.0, seed=7),
    chat("a dog", temperature=0.8, top_p=0.9, seed=11, edgespec={"method": "none"}),
]


def answers(url: str) -> list[tuple[str, str, Any]]:
    """(text, finish reason, (speculation rounds, cached prompt tokens)) of each REQUESTED, and
    (text, finish reason, None) of one streamed and of one cut by a stop string."""
    out = []
    for body in REQUESTED:
        r = post(url, body)
        choice = r["choices"][0]
        usage = r["usage"]
        figures = (usage.get("speculation", {}).get("rounds"), usage["prompt_tokens_details"])
        out.append((choice["message"]["content"], choice["finish_reason"], figures))
    chunks = streamed(url, REQUESTED[0])
    out.append((text_of(chunks), chunks[-1]["choices"][0]["finish_reason"], None))
    words = re.findall(r"[A-Za-z]{2,}", out[0][0])  # a stop string inside the greedy answer
    assert words, out[0][0]
    r = post(url, dict(REQUESTED[0], stop=[words[-1]]))
    out.append((r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"], None))
    return out


# ----------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    "config",
    [
        GenerationConfig(),
        GenerationConfig(
            SamplingConfig(temperature=0.6, top_p=0.5, top_k=7, min_p=0.1, seed=2**64 - 1),
            SpecConfig(k=5, method="hybrid", tree="3,2,1", ngram_long=0),
            max_tokens=33,
        ),
    ],
)
def test_a_request_config_survives_its_bytes(config):
    assert decode_config(encode_config(config)) == config


def test_requests_cancellation_and_caches_reach_every_rank():
    """Rank 0's requests arrive whole on rank 1, its cancel flag stops both ranks at the same
    check (rank 1's own flag counts for nothing), and caches that differ are reset."""
    cmd = script_command(2, "dist_serve.py")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=120)
    reports = {}
    for line in r.stdout.splitlines():
        if line.startswith("{"):
            report = json.loads(line)
            reports[report["rank"]] = report
    assert sorted(reports) == [0, 1], r.stdout + r.stderr
    got = [(ids, decode_config(data.encode())) for ids, data in reports[1]["received"]]
    assert got == REQUESTS
    for report in reports.values():
        assert report["cancelled_at"] == 3
        assert report["agreed"] == [False, True] and report["resets"] == [1, 0]


# ----------------------------------------------------------------------------- real launches


@pytest.mark.parametrize("shard", ["tensor", "pipeline"])
def test_launched_server_answers_as_the_single_process_server(tiny_pair, shard, request):
    """`mlx.launch --backend ring -n 2 -- edgespec serve`: greedy, sampled (seeded), plain,
    streamed and stop-string chat completions equal the single-process server's (speculation
    rounds and cached prompt tokens included where no stop string cuts the answer), split
    tensor parallel (llama) or pipeline parallel (ministral3)."""
    tiny_ministral = request.getfixturevalue("ministral") if shard == "pipeline" else None
    pair = (tiny_ministral if shard == "pipeline" else tiny_pair[0], tiny_pair[1])
    single = ServerProcess(*models(pair), "--k", "3", "--no-adaptive")
    try:
        expected = answers(single.url)
    finally:
        single.kill()
    group = launched(2, *serve_args(pair, "--shard", shard))
    try:
        assert answers(group.url) == expected
    finally:
        group.kill()


def test_a_refused_request_then_rank_0_stopping_stops_every_rank(tiny_pair, tmp_path):
    """Adaptive K is refused on every rank alike (400), the next request is answered, and
    SIGTERM on rank 0 ends both ranks cleanly."""
    group = ranks(write_hostfile(tmp_path / "hosts.json", 2), 2, *serve_args(tiny_pair))
    try:
        body = chat("the cat", temperature=0, edgespec={"adaptive": True})
        r = httpx.post(f"{group.url}/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 400 and "differ between ranks" in r.text, r.text
        assert post(group.url, chat("the cat", temperature=0))["choices"][0]["message"]["content"]
        group.procs[0].send_signal(signal.SIGTERM)
        codes = [p.wait(60) for p in group.procs]
        assert codes == [0, 0], group.stderr(0) + group.stderr(1)
        assert group.stderr(0).splitlines()[-1] == "edgespec serve: stopped"
    finally:
        group.kill()


@pytest.mark.parametrize(
    "when", ["mid-answer", "SIGTERM mid-answer", "idle, then a request", "idle, then SIGTERM"]
)
def test_a_lost_rank_fails_the_request_and_rank_0_exits_with_one_line(tiny_pair, tmp_path, when):
    """Rank 1 is killed or stopped mid-answer (the stream ends with an error object), or killed
    while the server is idle (the next request gets a 500; or rank 0 is stopped): either way rank 0 exits
    (status 2) with the group's one-line error, no traceback."""
    group = ranks(write_hostfile(tmp_path / "hosts.json", 2), 2, *serve_args(tiny_pair))
    try:
        how = signal.SIGTERM if when.startswith("SIGTERM") else signal.SIGKILL
        kill = lambda: os.kill(group.procs[1].pid, how)  # noqa: E731
        if when.endswith("mid-answer"):  # SIGTERM: as mlx.launch stops a rank
            chunks = streamed(group.url, chat("the cat", temperature=0, max_tokens=400), kill)
            error = chunks[-1].get("error", {}).get("message", "")
        else:
            kill()
            group.procs[1].wait(10)
        if when == "idle, then a request":
            body = chat("the cat", temperature=0)
            r = httpx.post(f"{group.url}/v1/chat/completions", json=body, timeout=120)
            assert r.status_code == 500, r.text
            error = r.json()["error"]["message"]
        elif when == "idle, then SIGTERM":
            group.procs[0].send_signal(signal.SIGTERM)
            error = "lost its group"
        assert "lost its group" in error, error
        assert group.procs[0].wait(60) == 2
        err = group.stderr(0)
        assert [line for line in err.splitlines() if line.startswith("edgespec")][-1] == LOST
        assert "Traceback" not in err, err
    finally:
        group.kill()


# ----------------------------------------------------------------------------- the real target


@pytest.mark.slow
def test_embedded_target_n3_serves_as_the_single_process_server():
    """SmolLM2-135M (9 heads, 3 KV heads) split three ways answers a greedy chat completion with
    the single-process server's text."""
    body = chat("Name three primary colours.", temperature=0, max_tokens=10)
    single = ServerProcess("--k", "3", "--no-adaptive")
    try:
        expected = post(single.url, body)["choices"][0]["message"]["content"]
    finally:
        single.kill()
    group = launched(3, "serve", "--host", "127.0.0.1", "--port", "0", "--k", "3")
    try:
        assert post(group.url, body, timeout=600)["choices"][0]["message"]["content"] == expected
    finally:
        group.kill()
