"""`edgespec serve` with a long prompt beside short requests (issue 75 item 2), on loopback:

    python -m research.measure.serve_prefill --checkout PATH [--notes 200] [--runs 3]
        [-- SERVE ARGS]

Starts `python -m edgespec serve --cache-slots 0 SERVE ARGS --port 0` from the checkout PATH
(its own `edgespec`: run it once with a checkout of main and once with the branch to compare),
the embedded pair by default, greedy requests, no prefix reuse (every prompt is read whole), and
prints one JSON line:

short_solo_s      a short chat request's latency alone (max_tokens 8; the median of --runs)
long_solo_ttft_s  a long prompt's time to its first token alone (--notes notes, ~15 tokens each)
short_beside_s    the short request's latency beside the long one's prefill: the median of --runs
                  such requests, one after another from 1 s after the long one started
                  (each in short_besides_s)
long_beside_ttft_s  the long prompt's TTFT in that run
long_beside4_ttft_s the long prompt's TTFT when it arrives while 4 short streams run
                    (max_tokens 32 each, started together just before it)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

READY = re.compile(r"at (http://127\.0\.0\.1:\d+)/v1")
SHORTS = ["Name three colors.", "Say hello.", "Name a fruit.", "Count to five.", "Name a dog."]


def long_text(notes: int) -> str:
    colors = ("red", "blue", "green")
    return " ".join(f"Note {i}: the lamp in room {i} is {colors[i % 3]}." for i in range(notes))


def start(checkout: Path, extra: list[str]) -> tuple[subprocess.Popen[str], str]:
    """The server of that checkout, and its base URL once it says it is ready."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    cmd = [sys.executable, "-m", "edgespec", "serve", "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--cache-slots", "0", *extra],
        cwd=checkout,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        found = READY.search(line)
        if found:
            return proc, found.group(1)
    raise SystemExit("the server did not start")


def chat(url: str, text: str, max_tokens: int) -> dict[str, Any]:
    """A greedy streamed chat: its seconds to the first token, to the end, and prompt tokens."""
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0, first, prompt = time.monotonic(), None, 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                prompt = chunk["usage"]["prompt_tokens"]
            choices = chunk.get("choices") or []
            if choices and choices[0]["delta"].get("content") and first is None:
                first = time.monotonic() - t0
    return {"ttft": first, "latency": time.monotonic() - t0, "prompt_tokens": prompt}


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(fn()), daemon=True)
    thread.start()
    return thread, out


def wait_running(url: str, n: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if httpx.get(f"{url}/health", timeout=30).json().get("running", 0) >= n:
            return
        time.sleep(0.05)


def measure(url: str, text: str, runs: int) -> dict[str, Any]:
    chat(url, SHORTS[0], 8)  # first request: compiles what warm-up did not
    short_solo = statistics.median(chat(url, SHORTS[0], 8)["latency"] for _ in range(runs))
    long_solo = chat(url, text, 4)
    thread, beside = in_thread(lambda: chat(url, text, 4))
    wait_running(url, 1)
    time.sleep(1.0)
    besides = [chat(url, SHORTS[0], 8)["latency"] for _ in range(runs)]  # one after another
    thread.join()
    streams = [in_thread(lambda s=s: chat(url, s, 32)) for s in SHORTS[1:5]]
    wait_running(url, 4)
    long4 = chat(url, text, 4)
    for t, _ in streams:
        t.join()
    return {
        "prompt_tokens": long_solo["prompt_tokens"],
        "short_solo_s": round(short_solo, 3),
        "long_solo_ttft_s": round(long_solo["ttft"], 3),
        "short_beside_s": round(statistics.median(besides), 3),
        "short_besides_s": [round(t, 3) for t in besides],
        "long_beside_ttft_s": round(beside["ttft"], 3),
        "long_beside4_ttft_s": round(long4["ttft"], 3),
        "short4_latency_s": [round(out["latency"], 3) for _, out in streams],
    }


def main(argv: list[str]) -> None:
    split = argv.index("--") if "--" in argv else len(argv)
    ours, serve_args = argv[:split], argv[split + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkout", type=Path, required=True)
    p.add_argument("--notes", type=int, default=200)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(ours)
    proc, url = start(args.checkout.resolve(), serve_args)
    try:
        figures = measure(url, long_text(args.notes), args.runs)
    finally:
        proc.kill()
    print(json.dumps({"checkout": str(args.checkout), **figures}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
