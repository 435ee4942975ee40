"""`edgespec serve` reading a long prompt beside running requests (chunked prefill,
edgespec/server/pieces.py), on the embedded pair: a short request that arrives while a long
prompt is read gets its whole answer before the long prompt's first token, and both answers
are their solo answers, token for token (greedy). A prompt over --max-prompt-tokens is a 400
before any work. Loopback only, every loop bounded. Real model, so slow; the speed figures
live in docs/measurements/2026-12-06-server-prefill.md (research/measure/serve_prefill.py)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from edgespec.server.process import ServerProcess

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

MAX_PROMPT = 2000
LONG = " ".join(
    f"Note {i}: the lamp in room {i} is {('red', 'blue', 'green')[i % 3]}." for i in range(90)
)
SHORT = "Name three colors."


@pytest.fixture(scope="module")
def server():
    # No prefix reuse: every request reads its whole prompt, the solo runs included.
    srv = ServerProcess("--no-warmup", "--cache-slots", "0", "--max-prompt-tokens", str(MAX_PROMPT))
    yield srv
    srv.kill()


def health(srv: ServerProcess) -> dict:
    return httpx.get(f"{srv.url}/health", timeout=30).json()


def stream(
    srv: ServerProcess, text: str, max_tokens: int, log: list, tag: str, usage: dict | None = None
) -> str:
    """A greedy chat stream; `log` gets (time, tag, "token" | "done") as the chunks arrive,
    `usage` the usage object of its last chunk."""
    body = {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    parts = []
    with httpx.stream("POST", f"{srv.base}/chat/completions", json=body, timeout=900) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if usage is not None and chunk.get("usage"):
                usage.update(chunk["usage"])
            choices = chunk["choices"]
            content = choices[0]["delta"].get("content") if choices else None
            if content:
                log.append((time.monotonic(), tag, "token"))
                parts.append(content)
    log.append((time.monotonic(), tag, "done"))
    return "".join(parts)


def test_a_short_request_is_answered_while_a_long_prompt_is_read(server):
    solo_long = stream(server, LONG, 6, [], "long")
    solo_short = stream(server, SHORT, 8, [], "short")
    log: list = []
    got: dict[str, str] = {}
    long = threading.Thread(target=lambda: got.update(long=stream(server, LONG, 6, log, "long")))
    long.start()
    deadline = time.monotonic() + 120
    while health(server)["running"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    usage: dict = {}
    got["short"] = stream(server, SHORT, 8, log, "short", usage)
    long.join(900)
    assert not long.is_alive()
    short_done = next(t for t, tag, kind in log if (tag, kind) == ("short", "done"))
    long_first = next(t for t, tag, kind in log if (tag, kind) == ("long", "token"))
    assert short_done < long_first  # the short answer did not wait for the long prompt
    assert (got["long"], got["short"]) == (solo_long, solo_short)  # each its solo answer
    assert solo_long and solo_short
    # A prompt read in pieces runs no round: the short request is not a batch of two whose
    # mode (server/mode.py) may step it plainly; its own adaptive K drafts, as alone
    assert usage["speculation"]["drafted"] > 0


def test_a_prompt_over_max_prompt_tokens_is_a_400_before_any_work(server):
    before = health(server)["requests"]
    for text in (LONG * 3, "word " * 200_000):  # tokenized and counted; certain from its size
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1}
        r = httpx.post(f"{server.base}/chat/completions", json=body, timeout=120)
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded"
        assert err["param"] == "messages" and "--max-prompt-tokens" in err["message"]
    after = health(server)["requests"]
    assert after["completed"] == before["completed"] and after["failed"] == before["failed"]
    assert after["bad_request"] == before["bad_request"] + 2
