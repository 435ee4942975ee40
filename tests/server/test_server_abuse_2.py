"""`edgespec serve` against hostile clients, round 2 (loopback only, every loop bounded):
connections that send a request head and stall its body, max_tokens far past the context,
non-streaming requests whose client leaves, uploads cut off, a lone surrogate in an unknown
key, a 413's connection, and `python -m edgespec` started beside a json.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgespec.server.process import ServerProcess

httpx = pytest.importorskip("httpx")

ROOT = Path(__file__).resolve().parents[2]
HI = [{"role": "user", "content": "hi"}]
CAP = 12  # --max-connections: a flood of stalled bodies fills it at once
BODY_LIMIT = 65536
HEAD = "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
LONG = {"messages": [{"role": "user", "content": "go on"}], "temperature": 0}


@pytest.fixture(scope="module")
def server(tiny_pair):
    """Few connections, a request timeout far longer than any test here (so nothing is closed
    for taking too long), four requests at once."""
    limits = f"--max-connections {CAP} --request-timeout 60 --max-body-bytes {BODY_LIMIT}"
    srv = ServerProcess(*models(tiny_pair), *limits.split(), "--max-batch", "4")
    yield srv
    srv.kill()


def models(pair) -> list[str]:
    return ["--target", str(pair[0]), "--draft", str(pair[1]), "--max-tokens", "8"]


def port(srv: ServerProcess) -> int:
    return int(srv.url.rsplit(":", 1)[1])


def in_thread(fn):
    """Run fn in a thread; returns a callable giving its result (or raising its error)."""
    out: list = []

    def call() -> None:
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - handed back to the test
            out.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()

    def result():
        thread.join(120)
        assert out, "it did not end"
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]

    return result


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (at most 64 reads)."""
    got = b""
    for _ in range(64):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def health(srv: ServerProcess) -> dict:
    return httpx.get(f"{srv.url}/health", timeout=10).json()


def connect(srv: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port(srv)), timeout=10)


def stalled(srv: ServerProcess) -> socket.socket:
    """A connection that sent a whole request head and one byte of its 100-byte body."""
    s = connect(srv)
    s.sendall(f"{HEAD}Content-Length: 100\r\n\r\n{{".encode())
    return s


def wait_for(check, seconds: float) -> bool:
    """Whether check() turns true within `seconds` (polled every 20 ms)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def test_stalled_bodies_at_the_cap_make_room_for_whole_requests(server):
    """Twice the cap of connections that send a head and stall their body: /health and a
    normal request still get through, the stalled ones being closed for them."""
    flood: list[socket.socket] = []
    try:
        for _ in range(2 * CAP):
            flood.append(stalled(server))
        time.sleep(0.2)  # their heads have arrived: each is a request waiting for its body
        assert health(server)["status"] == "ok"
        r = httpx.post(f"{server.base}/chat/completions", json={"messages": HI}, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
        assert health(server)["connections"]["stalled"] >= 1
    finally:
        for s in flood:
            s.close()


def test_max_tokens_past_the_context_is_clamped_and_does_not_hold_others_back(server):
    """max_tokens 1e12 ends with "length" when the context fills, and is sized for what the
    context leaves: a short request sent while it runs is answered before it ends, instead of
    waiting for it."""
    url = f"{server.base}/chat/completions"
    # One request first: until a cache has grown, what a token costs is unknown, and a
    # request's size is counted as nothing.
    assert httpx.post(url, json={"messages": HI}, timeout=60).status_code == 200
    big = dict(LONG, max_tokens=1e12, stream=True)
    streaming = threading.Event()

    def read_big() -> tuple[list[str], float]:
        with httpx.stream("POST", url, json=big, timeout=60) as stream:
            lines = []
            for line in filter(None, stream.iter_lines()):
                lines.append(line)
                if '"content":"' in line and '"content":""' not in line:
                    streaming.set()
            return lines, time.monotonic()  # when the last line came

    reader = in_thread(read_big)
    assert streaming.wait(30), "the long request never streamed"
    r = httpx.post(url, json={"messages": HI}, timeout=60)
    answered = time.monotonic()
    lines, ended = reader()
    assert r.status_code == 200
    assert lines[-1] == "data: [DONE]" and any('"finish_reason":"length"' in x for x in lines)
    assert answered < ended, "the short request waited for the long one to end"


def test_a_dropped_non_streaming_request_is_cancelled_not_completed(server):
    """The client of a long non-streaming request closes its connection while tokens flow:
    the job stops at once (counted as cancelled); it used to run to its end (the context
    full), the server looking for the client only after a pause in the tokens."""
    before = health(server)["requests"]
    body = httpx.Request("POST", "http://a/", json=dict(LONG, max_tokens=1e12)).content
    s = connect(server)
    s.sendall(f"{HEAD}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert wait_for(lambda: health(server)["running"] == 1, 10), "the request never ran"
    s.close()
    assert wait_for(lambda: health(server)["running"] == 0, 2.0), "still running 2 s later"
    after = health(server)["requests"]
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["completed"] == before["completed"]


def test_an_upload_cut_off_mid_body_is_no_500(server):
    """A client that sends half its body and closes: no 500, no traceback in the log."""
    for _ in range(3):
        s = connect(server)
        s.sendall(f'{HEAD}Content-Length: 1000\r\n\r\n{{"messages": ['.encode())
        time.sleep(0.05)  # the head has arrived and the app reads the body
        s.close()
    time.sleep(1.0)  # the app has seen the disconnects (the log would say so by now)
    err = "".join(server.stderr)
    assert "Exception in ASGI application" not in err and "Traceback" not in err
    assert health(server)["status"] == "ok"


def test_a_lone_surrogate_in_an_unknown_edgespec_key_is_a_400(server):
    body = b'{"messages": [{"role": "user", "content": "hi"}], "edgespec": {"\\ud800x": 1}}'
    r = httpx.post(
        f"{server.base}/chat/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "invalid_request_error"
    assert "unknown field" in err["message"] and err["param"] == "edgespec.\\ud800x"


def test_a_413_closes_the_connection_without_reading_the_upload(server):
    """A declared body over the limit: 413 with Connection: close, and the connection ends at
    once (the upload is not read and discarded until the request timeout)."""
    s = connect(server)
    s.settimeout(5)
    try:
        s.sendall(f"{HEAD}Content-Length: {10 * BODY_LIMIT}\r\n\r\n".encode() + b" " * 1000)
        t0 = time.monotonic()
        answer = read_all(s).decode()  # ends when the server closes (socket timeout: 5 s)
        assert time.monotonic() - t0 < 5
    finally:
        s.close()
    assert answer.startswith("HTTP/1.1 413") and "connection: close" in answer.lower()


def test_python_m_edgespec_ignores_a_json_py_where_it_starts(tmp_path):
    """`python -m edgespec` puts the working directory first on the import path; a json.py
    there replaced the standard module (imported on the way to the server)."""
    (tmp_path / "json.py").write_text("raise ImportError('json.py of the working directory')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-m", "edgespec", "serve", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "--max-connections" in r.stdout and "json.py" not in r.stderr
