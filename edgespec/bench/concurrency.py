"""The concurrency sweep of `python -m edgespec.bench.serve --sweep 1,2,4,8`: N clients at once,
each one streaming chat completion at T = 0 through the official openai client, released
together; per level the aggregate tokens/s (all answers' tokens over the time from the release
to the last token), and each request's time to first token and latency (median and max).

Servers, one after another on the same prompts: EdgeSpec batched (`--max-batch` at its
default), EdgeSpec one request at a time (`--max-batch 1`), and mlx_lm.server without a draft on
the same target as EdgeSpec runs it on the CPU (dequantized to float32: `float32_copy`), all
under the same BLAS (they inherit this process's environment). Solo, for the batch: each level
of the batched server against the one-at-a-time server's on the same questions, each of those
requests timed from its turn (`served_alone`), since the levels ask different questions (none
the server has cached).
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import EdgeSpecError


@dataclass(frozen=True)
class Stream:
    """One request: seconds to its first content and to its end (from the release), tokens."""

    ttft: float
    seconds: float
    tokens: int
    text: str


@dataclass(frozen=True)
class Level:
    """N requests released together on one server."""

    server: str
    streams: tuple[Stream, ...]

    @property
    def n(self) -> int:
        return len(self.streams)

    @property
    def tokens_per_s(self) -> float:
        """All answers' tokens over the time from the release to the last token."""
        return sum(s.tokens for s in self.streams) / max(s.seconds for s in self.streams)


def stream_chat(
    client: Any, model: str, messages: list[dict[str, str]], max_tokens: int, t0: float
) -> tuple[float | None, float, list[str], Any]:
    """One streamed chat completion at T = 0, timed from t0: (seconds to its first content, or
    None without any; seconds to its end; the content pieces; its usage, or None)."""
    first, parts, usage = None, [], None
    reply = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in reply:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.perf_counter() - t0
            parts.append(chunk.choices[0].delta.content)
    return first, time.perf_counter() - t0, parts, usage


def stream(client: Any, model: str, question: str, max_tokens: int, t0: float) -> Stream:
    """One streamed chat completion at T = 0, timed from t0 (the release)."""
    messages = [{"role": "user", "content": question}]
    first, seconds, parts, usage = stream_chat(client, model, messages, max_tokens, t0)
    tokens = usage.completion_tokens if usage is not None else None
    return Stream(first or seconds, seconds, tokens or len(parts), "".join(parts))


def level(name: str, client: Any, model: str, questions: Sequence[str], n: int, max_tokens: int):
    """N clients released together, request i asking questions[i % len(questions)]."""
    barrier = threading.Barrier(n + 1)
    t0 = [0.0]

    def one(i: int) -> Stream:
        barrier.wait()
        return stream(client, model, questions[i % len(questions)], max_tokens, t0[0])

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one, i) for i in range(n)]
        t0[0] = time.perf_counter()
        barrier.wait()
        return Level(name, tuple(f.result() for f in futures))


WARM_UP = "Say hello."  # the untimed first request's question, none of the levels'


def sweep(
    name: str, client: Any, model: str, questions: Sequence[str], ns: Sequence[int], max_tokens: int
) -> list[Level]:
    """One untimed request (warm-up), then each level in turn. Each level starts where the
    previous one's questions ended (1, 2, 4, 8 clients: 15 questions), so that no request asks
    what the server has answered, and cached, before: every TTFT includes its prompt's prefill
    (beyond a shared chat template), at N = 1 as at N = 8."""
    stream(client, model, WARM_UP, max_tokens, time.perf_counter())
    levels, start = [], 0
    for n in ns:
        turn = [questions[(start + i) % len(questions)] for i in range(len(questions))]
        levels.append(level(name, client, model, turn, n, max_tokens))
        start += n
    return levels


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MlxLmServer:
    """`mlx_lm server --model PATH` on a free localhost port; `base` once /v1/models answers."""

    def __init__(self, model: Path, timeout: float = 180):
        port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlx_lm",
                "server",
                "--model",
                str(model),
                "--port",
                str(port),
                "--log-level",
                "WARNING",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.base = f"http://127.0.0.1:{port}/v1"
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                httpx.get(f"{self.base}/models", timeout=2).raise_for_status()
                return
            except httpx.HTTPError:
                time.sleep(0.5)
        self.terminate()
        raise EdgeSpecError("mlx_lm server did not start")

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def target_folder(target: str | None, pair: str | None) -> Path:
    """The local folder of the target EdgeSpec serves (`--target`, else the pair's)."""
    from edgespec.loading.resolve import resolve_model
    from edgespec.loading.specs import load_catalog

    cat = load_catalog()
    return resolve_model(target or cat.pair(pair).target, catalog=cat)


def float32_copy(model: Path, folder: Path) -> Path:
    """The model as EdgeSpec runs it on the CPU: dequantized, float32 (mlx_lm convert)."""
    out = folder / f"{model.name}-float32"
    if not (out / "config.json").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "mlx_lm",
                "convert",
                "--hf-path",
                str(model),
                "--mlx-path",
                str(out),
                "-d",
                "--dtype",
                "float32",
            ],
            check=True,
            capture_output=True,
        )
    return out


def run_sweep(
    edgespec: Callable[..., Any],
    target: Path,
    questions: Sequence[str],
    ns: Sequence[int],
    max_tokens: int,
    client: Callable[[str], Any],
    batched: Sequence[str] = (),
    runs: int = 1,
) -> list[Level]:
    """The three servers' sweeps. `edgespec(*extra)` starts an EdgeSpec server process;
    `batched`: the batched one's extra arguments (e.g. --max-batch 8); `runs`: each level that
    many times, each on questions not asked before (the report pools them)."""
    ns = list(ns) * runs
    levels: list[Level] = []
    for name, extra in (
        ("edgespec batched", batched),
        ("edgespec one at a time", ("--max-batch", "1")),
    ):
        srv = edgespec(*extra)
        try:
            c = client(srv.base)
            model = str(c.models.list().data[0].id)
            levels += sweep(name, c, model, questions, ns, max_tokens)
        finally:
            srv.terminate()
    with tempfile.TemporaryDirectory() as tmp:
        peer = MlxLmServer(float32_copy(target, Path(tmp)))
        try:
            c = client(peer.base)
            levels += sweep(
                "mlx_lm.server (no draft)", c, "default_model", questions, ns, max_tokens
            )
        finally:
            peer.terminate()
    return levels


def served_alone(lv: Level) -> tuple[Stream, ...]:
    """A one-request-at-a-time server's level, each request timed from its turn (the end of
    the one served before it, in order of their ends): what each question costs alone, on the
    questions the batched server answered together. Example: ends 1.0 and 2.5 s, first
    tokens at 0.2 and 1.4 s -> TTFTs alone 0.2 and 0.4 s, latencies 1.0 and 1.5 s."""
    out, start = [], 0.0
    for s in sorted(lv.streams, key=lambda s: s.seconds):
        out.append(Stream(s.ttft - start, s.seconds - start, s.tokens, s.text))
        start = s.seconds
    return tuple(out)


def pooled_rate(levels: Sequence[Level]) -> float:
    """Tokens per second over several runs of a level: all their tokens over the sum of their
    times (each from its release to its last token); one run's is its own tokens_per_s."""
    tokens = sum(s.tokens for lv in levels for s in lv.streams)
    return tokens / sum(max(s.seconds for s in lv.streams) for lv in levels)


def report(levels: Sequence[Level]) -> None:
    """A row per server and level (the runs of a level pooled), then the ratios side by side."""
    by: dict[tuple[str, int], list[Level]] = {}
    for lv in levels:
        by.setdefault((lv.server, lv.n), []).append(lv)
    runs = max(len(lvs) for lvs in by.values())
    if runs > 1:
        print(f"each level ran {runs} times, on questions not asked before; the rows pool them")
    head = f"{'server':<26} {'N':>2} {'tok/s':>7} {'TTFT p50':>9} {'TTFT max':>9}"
    print(f"{head} {'latency p50':>12} {'latency max':>12}")
    for (server, n), lvs in by.items():
        streams = [s for lv in lvs for s in lv.streams]
        ttft, lat = [s.ttft for s in streams], [s.seconds for s in streams]
        row = f"{server:<26} {n:>2} {pooled_rate(lvs):>7.2f}"
        row += f" {statistics.median(ttft):>9.2f} {max(ttft):>9.2f}"
        print(f"{row} {statistics.median(lat):>12.2f} {max(lat):>12.2f}")
    servers = list(dict.fromkeys(server for server, _ in by))
    same = total = 0
    for n in sorted({n for _, n in by}):
        rows = [by[(s, n)] for s in servers]
        first = pooled_rate(rows[0])
        pairs = list(zip(servers, rows, strict=True))
        ratios = [f"{s} {pooled_rate(lvs) / first:.2f}x" for s, lvs in pairs[1:]]
        p50 = [f"{_median_ttft(lvs):.2f} s" for lvs in rows]
        print(f"N={n}: tok/s vs {servers[0]}: {', '.join(ratios)}; TTFT p50 {' / '.join(p50)}")
        for a, b in zip(rows[0], rows[1], strict=True):
            same += sum(x.text == y.text for x, y in zip(a.streams, b.streams, strict=True))
            total += n
        if n > 1:
            _against_alone(rows[0], rows[1])
    print(f"answers identical, {servers[0]} vs {servers[1]}: {same} of {total}")


def _median_ttft(levels: Sequence[Level]) -> float:
    return statistics.median(s.ttft for lv in levels for s in lv.streams)


def _against_alone(together: Sequence[Level], in_turn: Sequence[Level]) -> None:
    """The first server's level against the same questions served alone (`served_alone`)."""
    ttft = _median_ttft(together)
    ttft_alone = statistics.median(s.ttft for lv in in_turn for s in served_alone(lv))
    rate = pooled_rate(together) / pooled_rate(in_turn)
    print(
        f"N={together[0].n}: {together[0].server} against the same questions served alone "
        f"({in_turn[0].server}, each timed from its turn): tok/s {rate:.2f}x, TTFT p50 "
        f"{ttft / ttft_alone:.2f}x ({ttft:.2f} s / {ttft_alone:.2f} s)"
    )
