"""`edgespec serve` against hostile clients (loopback only, every loop bounded): oversized
bodies, half-sent and idle connections by the thousand, slow bodies, out-of-range sampling,
a full queue; and the API key's edges (the scheme's case, CORS preflights)."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import pytest

from edgespec.server.process import ServerProcess

httpx = pytest.importorskip("httpx")

KEY = {"Authorization": "Bearer sesame"}
HI = [{"role": "user", "content": "hi"}]
BODY_LIMIT = 65536
TIMEOUT_S = 2


def models(pair) -> list[str]:
    return ["--target", str(pair[0]), "--draft", str(pair[1]), "--max-tokens", "8"]


@pytest.fixture(scope="module")
def server(tiny_pair):
    """Small limits, four running at once and a queue of one, an API key."""
    limits = f"--max-body-bytes {BODY_LIMIT} --request-timeout {TIMEOUT_S} --max-queue 1"
    limits += " --max-batch 4"
    srv = ServerProcess(*models(tiny_pair), *limits.split(), env={"EDGESPEC_API_KEY": "sesame"})
    yield srv
    srv.kill()


def port(srv: ServerProcess) -> int:
    return int(srv.url.rsplit(":", 1)[1])


def post(srv: ServerProcess, body=None, headers=KEY, **kw):
    """A chat completion; raw bytes are sent as JSON too (a POST of another type is a 415)."""
    body = {"messages": HI} if body is None else body
    kw.setdefault("timeout", 60)
    data = {"json": body} if isinstance(body, dict) else {"content": body}
    headers = {"Content-Type": "application/json", **headers}
    return httpx.post(f"{srv.base}/chat/completions", headers=headers, **data, **kw)


def health(srv: ServerProcess) -> dict:
    """Every figure: /health without the key says only that the server is alive."""
    return httpx.get(f"{srv.url}/health", headers=KEY, timeout=10).json()


def in_thread(fn):
    """Run fn in a thread; returns a callable giving its result (or raising its error)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(_call(fn)), daemon=True)
    thread.start()

    def result():
        thread.join(120)
        assert out, "the request did not end"
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]

    return result


def _call(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - handed back to the test
        return exc


def test_an_oversized_body_gets_413_at_once_while_another_request_completes(server):
    """A generation streams; meanwhile oversized bodies (declared, and chunked without a
    Content-Length) are refused within a second each; the generation runs to its end."""
    url = f"{server.base}/chat/completions"
    body = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 480, "stream": True}
    with httpx.stream("POST", url, json=dict(body, temperature=0), headers=KEY) as normal:
        lines = normal.iter_lines()
        next(line for line in lines if '"content":"' in line and '"content":""' not in line)
        for big in (b"x" * (1 << 20), b'{"messages": [' + b" " * BODY_LIMIT, chunked()):
            t0 = time.monotonic()
            r = post(server, big)
            assert r.status_code == 413 and time.monotonic() - t0 < 1.0
            assert "--max-body-bytes" in r.json()["error"]["message"]
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]" and any('"finish_reason":"length"' in x for x in rest)


def chunked():
    """A body sent without Content-Length: counted as it arrives."""
    for _ in range(40):
        yield b" " * 4096


def test_a_text_certain_to_overflow_is_refused_before_tokenizing(server):
    """Under the body limit, far over the context window: refused from its length alone."""
    r = post(server, {"messages": [{"role": "user", "content": "the cat " * 7000}]})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded"
    assert re.search(r"the prompt is at least \d+ tokens", err["message"])


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (at most 64 reads)."""
    got = b""
    for _ in range(64):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_a_half_sent_request_is_closed_and_a_slow_body_gets_408(server):
    half = socket.create_connection(("127.0.0.1", port(server)), timeout=TIMEOUT_S + 10)
    half.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
    slow = socket.create_connection(("127.0.0.1", port(server)), timeout=TIMEOUT_S + 10)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer sesame\r\n"
    )
    slow.sendall(f"{head}Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{".encode())
    t0 = time.monotonic()
    assert half.recv(100) == b""  # closed by the server
    assert TIMEOUT_S - 0.5 < time.monotonic() - t0 < TIMEOUT_S + 5
    answer = read_all(slow).decode()
    assert answer.startswith("HTTP/1.1 408") and "did not arrive within" in answer
    half.close()
    slow.close()
    assert health(server)["connections"]["timed_out"] >= 1


def test_sampling_out_of_range_is_a_400_that_says_the_range(server):
    for field, value, words in (("temperature", 1e9, "between 0 and 2"), ("top_k", 10**9, "384")):
        r = post(server, {"messages": HI, field: value})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == field and words in err["message"]


def test_the_bearer_scheme_in_any_case_and_preflights_without_a_key(server):
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert post(server, headers={"Authorization": f"{scheme} sesame"}).status_code == 200
    for wrong in ("bearer nope", "Basic sesame", "sesame", ""):
        assert post(server, headers={"Authorization": wrong}).status_code == 401
    preflight = httpx.options(
        f"{server.base}/chat/completions",
        headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST"},
        timeout=10,
    )
    assert preflight.status_code != 401  # no CORS configured: the method is refused (405)


def test_a_flood_of_bad_request_lines_is_logged_once(server):
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port(server)), timeout=10) as s:
            s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert read_all(s).startswith(b"HTTP/1.1 400")
    assert health(server)["status"] == "ok"
    assert "".join(server.stderr).count("Invalid HTTP request") == 1


def test_a_full_queue_answers_503_with_retry_after(server):
    """Eight long requests at once, --max-batch 4 --max-queue 1: four run, one waits, the others
    are refused with Retry-After (how many exactly is tests/server/test_server_worker.py's,
    without HTTP timing)."""
    body = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 480}
    start = threading.Barrier(8)

    def one():
        start.wait(30)
        return post(server, dict(body, temperature=0))

    answers = [r() for r in [in_thread(one) for _ in range(8)]]
    refused = [r for r in answers if r.status_code == 503]
    assert refused and all(r.status_code == 200 for r in answers if r not in refused)
    assert len(answers) - len(refused) >= 2  # the running one and the waiting one
    for r in refused:
        assert int(r.headers["retry-after"]) >= 1 and "busy" in r.json()["error"]["message"]


def open_files_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line")


def room_for(files: int) -> bool:
    """Whether this process may open `files` files (raising its soft limit if need be)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= files:
        return True
    if hard != resource.RLIM_INFINITY and hard < files:
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (files, hard))
    return True


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="needs /proc (Linux)")
def test_more_idle_connections_than_open_files_do_not_stop_a_request(tiny_pair):
    """Half-sent and silent connections, more than the server may open files: a normal request
    still gets its answer, the flood is closed, the log says each kind of event once."""
    srv = ServerProcess(*models(tiny_pair))
    socks: list[socket.socket] = []
    try:
        count = open_files_limit(srv.proc.pid) + 100
        if count > 10_000 or not room_for(count + 64):
            pytest.skip(f"{count} connections: more than this test may open here")
        t0 = time.monotonic()
        for i in range(count):
            assert time.monotonic() - t0 < 60, f"only {i} connections in 60 s"
            s = socket.create_connection(("127.0.0.1", port(srv)), timeout=10)
            if i % 2:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
            socks.append(s)
        r = httpx.post(f"{srv.base}/chat/completions", json={"messages": HI}, timeout=30)
        assert r.status_code == 200
        figures = health(srv)["connections"]
        assert figures["evicted"] >= count - 256 and figures["open"] <= 256
        err = "".join(srv.stderr)
        assert "Traceback" not in err and "out of system resource" not in err  # no EMFILE
        assert err.count("closing the longest idle one") == 1
    finally:
        for s in socks:
            s.close()
        srv.kill()
