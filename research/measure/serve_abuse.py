"""`edgespec serve` under a hostile client (issue 61's "done when"), on loopback:

    python -m research.measure.serve_abuse flood [--seconds 60] [--stalled 300] [--rate R]
        [-- SERVE ARGS]
    python -m research.measure.serve_abuse max-tokens [--runs 3] [-- SERVE ARGS]
    python -m research.measure.serve_abuse dropped [--dropped 20] [--settle 3] [-- SERVE ARGS]

Each starts `python -m edgespec serve SERVE ARGS --port 0` (the embedded pair by default) from
the checkout whose `edgespec` is imported (PYTHONPATH), and prints one JSON line of figures.

flood       keeps `--stalled` connections open that each sent a whole request head and one byte
            of its body (one is opened again whenever the server closes one, at most --rate a
            second when given), and meanwhile
            checks GET /health every 0.25 s and sends normal T = 0 chat requests one after
            another, each on a new connection: the share that succeed, and whether each text
            equals the text the same request got before the flood.
max-tokens  a normal request's latency alone (--runs times), then as often while a max_tokens
            1e12 request streams (a counting prompt that does not end by itself).
dropped     `--dropped` non-streaming max_tokens 1e12 requests whose clients close their
            connection `--settle` s after all reached the server (the running ones then
            streaming tokens); what /health says is running and queued 2 s later.
"""

from __future__ import annotations

import argparse
import json
import selectors
import socket
import statistics
import sys
import threading
import time
from typing import Any

import httpx

from edgespec.server.process import ServerProcess

NORMAL = {
    "messages": [{"role": "user", "content": "Name three colours."}],
    "temperature": 0,
    "max_tokens": 32,
}
COUNTING = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "temperature": 0, "max_tokens": 1e12}
HEAD = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
STALLED = f"{HEAD}Content-Length: 100\r\n\r\n{{".encode()


def normal(srv: ServerProcess, timeout: float = 60) -> tuple[bool, str, float]:
    """(answered 200, its text, seconds) for NORMAL on a new connection."""
    t0 = time.monotonic()
    try:
        r = httpx.post(f"{srv.base}/chat/completions", json=NORMAL, timeout=timeout)
    except httpx.HTTPError as exc:
        return False, type(exc).__name__, time.monotonic() - t0
    text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else ""
    return r.status_code == 200, text, time.monotonic() - t0


def health(srv: ServerProcess, timeout: float = 10) -> dict[str, Any] | None:
    try:
        r = httpx.get(f"{srv.url}/health", timeout=timeout)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


class Flood:
    """`count` connections stalled after their head and one body byte, kept up until stop()."""

    def __init__(self, port: int, count: int, rate: float = 0):
        self.port, self.count, self.rate = port, count, rate  # rate: reopened a second (0: all)
        self.next_open = 0.0
        self.opened = self.closed_by_server = self.failed = 0
        self.selector = selectors.DefaultSelector()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        for _ in range(self.count):
            self._open()
        self.thread.start()

    def _open(self) -> None:
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            s.sendall(STALLED)
            s.setblocking(False)
        except OSError:
            self.failed += 1
            return
        self.opened += 1
        self.selector.register(s, selectors.EVENT_READ)

    def _run(self) -> None:
        while not self.stopping.is_set():
            for key, _ in self.selector.select(timeout=0.1):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if data:
                    continue  # a 408 on its way: the close follows
                self.selector.unregister(s)
                s.close()
                self.closed_by_server += 1
            while len(self.selector.get_map()) < self.count and not self.stopping.is_set():
                if self.rate:  # at most `rate` a second
                    now = time.monotonic()
                    if now < self.next_open:
                        break
                    self.next_open = max(now, self.next_open) + 1 / self.rate
                self._open()  # closed by the server, or failed to open: opened again

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


def flood(srv: ServerProcess, seconds: float, stalled: int, rate: float) -> dict[str, Any]:
    ok, expected, solo = normal(srv)
    assert ok, expected
    port = int(srv.url.rsplit(":", 1)[1])
    load = Flood(port, stalled, rate)
    load.start()
    time.sleep(1.0)  # the flood is in place
    checks: list[bool] = []
    answers: list[tuple[bool, str, float]] = []
    end = time.monotonic() + seconds

    def check_health() -> None:
        while time.monotonic() < end:
            checks.append(health(srv) is not None)
            time.sleep(0.25)

    def send_normal() -> None:
        while time.monotonic() < end:
            answers.append(normal(srv, timeout=30))

    threads = [threading.Thread(target=f) for f in (check_health, send_normal)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    figures = health(srv)
    load.stop()
    answered = [a for a in answers if a[0]]
    return {
        "seconds": seconds,
        "stalled_connections": stalled,
        "reopened_per_s_at_most": rate or "unlimited",
        "stalled_opened": load.opened,
        "stalled_closed_by_server": load.closed_by_server,
        "health_ok": f"{sum(checks)}/{len(checks)}",
        "normal_ok": f"{len(answered)}/{len(answers)}",
        "normal_same_text": f"{sum(a[1] == expected for a in answered)}/{len(answered)}",
        "normal_failures": sorted({a[1] for a in answers if not a[0]}),
        "normal_s_solo": round(solo, 3),
        "normal_s_median_in_flood": round(statistics.median(a[2] for a in answered), 3)
        if answered
        else None,
        "server_connections": figures["connections"] if figures else None,
    }


def max_tokens(srv: ServerProcess, runs: int = 3) -> dict[str, Any]:
    normal(srv)  # the first request warms the caches
    solo = [normal(srv)[2] for _ in range(runs)]
    big: dict[str, Any] = {}
    streaming = threading.Event()

    def run_big() -> None:
        body = dict(COUNTING, stream=True, stream_options={"include_usage": True})
        with httpx.stream("POST", f"{srv.base}/completions", json=body, timeout=600) as r:
            for line in r.iter_lines():
                streaming.set()
                if '"usage":{' in line:
                    big["usage"] = json.loads(line[6:])["usage"]
                if line == "data: [DONE]" or big.get("stop"):
                    break

    thread = threading.Thread(target=run_big, daemon=True)
    thread.start()
    streaming.wait(60)
    time.sleep(1.0)
    beside = []
    running = []
    for _ in range(runs):
        ok, text, seconds = normal(srv, timeout=120)
        beside.append(seconds if ok else None)
        figures = health(srv)
        running.append(figures["running"] if figures else None)
    big_still_running = thread.is_alive()
    big["stop"] = True
    thread.join(30)
    solo_median = statistics.median(solo)
    done = [s for s in beside if s is not None]
    return {
        "solo_s": [round(s, 3) for s in solo],
        "beside_max_tokens_1e12_s": [None if s is None else round(s, 3) for s in beside],
        "ratio_of_medians": round(statistics.median(done) / solo_median, 2) if done else None,
        "big_still_streaming_after": big_still_running,
        "running_after_each": running,
    }


def dropped(srv: ServerProcess, count: int, settle: float) -> dict[str, Any]:
    normal(srv)
    before = health(srv)
    assert before is not None
    body = json.dumps(dict(COUNTING, max_tokens=10**12)).encode()
    head = HEAD.replace("/v1/chat/completions", "/v1/completions")
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", int(srv.url.rsplit(":", 1)[1])), timeout=10)
        s.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        socks.append(s)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = health(srv)
        if now and now["running"] >= 1 and now["running"] + now["queued"] >= count:
            break
        time.sleep(0.05)
    time.sleep(settle)  # the running ones are well into their answers, tokens flowing
    at_drop = health(srv)
    for s in socks:
        s.close()
    dropped_at, idle_after = time.monotonic(), None
    while time.monotonic() < dropped_at + 2.0:
        now = health(srv)
        if idle_after is None and now and now["running"] + now["queued"] == 0:
            idle_after = round(time.monotonic() - dropped_at, 2)
        time.sleep(0.05)
    after = health(srv)
    assert at_drop is not None and after is not None
    counts = {k: after["requests"][k] - before["requests"][k] for k in after["requests"]}
    return {
        "dropped": count,
        "dropped_s_after_all_admitted": settle,
        "at_drop": {"running": at_drop["running"], "queued": at_drop["queued"]},
        "s_until_none_running_or_queued": idle_after,
        "2s_later": {"running": after["running"], "queued": after["queued"]},
        "requests_since": counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("flood", "max-tokens", "dropped"))
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--stalled", type=int, default=300)
    parser.add_argument("--dropped", type=int, default=20)
    parser.add_argument(
        "--settle", type=float, default=3, help="dropped: seconds of answers before the drop"
    )
    parser.add_argument("--runs", type=int, default=3, help="max-tokens: normal requests each way")
    parser.add_argument(
        "--rate", type=float, default=0, help="flood: reopen at most this many a second (0: all)"
    )
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])  # what follows "--" is edgespec serve's
    srv = ServerProcess(*argv[cut + 1 :])
    try:
        if args.what == "flood":
            out = flood(srv, args.seconds, args.stalled, args.rate)
        elif args.what == "max-tokens":
            out = max_tokens(srv, args.runs)
        else:
            out = dropped(srv, args.dropped, args.settle)
    finally:
        srv.terminate()
    err = "".join(srv.stderr)
    out["server_stderr_lines"] = len(err.splitlines())
    out["server_tracebacks"] = err.count("Traceback")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
