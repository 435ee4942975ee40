"""`edgespec serve` as users run it: a subprocess on a free localhost port, driven with the
official `openai` client (streaming and not) and with raw HTTP for the error cases."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgespec.server.process import ServerProcess
from tests.helpers.cli import run_edgespec

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

MAX = 24


def models(pair) -> list[str]:
    return ["--target", str(pair[0]), "--draft", str(pair[1])]


@pytest.fixture(scope="module")
def server(tiny_pair):
    srv = ServerProcess(*models(tiny_pair), "--max-tokens", str(MAX), "--max-batch", "4")
    yield srv
    srv.kill()


def client(srv: ServerProcess, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base, api_key=key, timeout=60, max_retries=0)


def chat(srv, text: str, **kw):
    messages = kw.pop("messages", None) or [{"role": "user", "content": text}]
    return client(srv).chat.completions.create(model="target", messages=messages, **kw)


def streamed(srv, text: str, **kw) -> tuple[str, list]:
    chunks = list(chat(srv, text, stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return content, chunks


def generate_text(pair, prompt: str, *extra: str) -> str:
    r = run_edgespec("generate", prompt, *models(pair), "--json", "--max-tokens", str(MAX), *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])["text"]


def health(srv) -> dict:
    return httpx.get(f"{srv.url}/health", timeout=10).json()


def test_greedy_text_equals_edgespec_generate(server, tiny_pair):
    prompt = "the cat and the dog"
    want = generate_text(tiny_pair, prompt)
    whole = chat(server, prompt, temperature=0)
    assert whole.choices[0].message.content == want
    assert whole.choices[0].finish_reason in ("length", "stop")
    text, chunks = streamed(server, prompt, temperature=0)
    assert text == want
    # Provenance: each content chunk's segments join to its content and name token kinds.
    for c in chunks:
        if c.choices and c.choices[0].delta.content:
            prov = c.choices[0].model_extra["provenance"]
            assert "".join(p["text"] for p in prov) == c.choices[0].delta.content
            assert {p["kind"] for p in prov} <= {"accepted", "corrected", "bonus", "target"}
    raw = client(server).completions.create(model="target", prompt=prompt, temperature=0)
    assert raw.choices[0].text == generate_text(tiny_pair, prompt, "--raw")


def test_second_turn_reuses_the_cache_and_usage_says_so(server):
    first = [{"role": "user", "content": "why is the river light"}]
    one = chat(server, "", messages=first, temperature=0)
    follow = [
        *first,
        {"role": "assistant", "content": one.choices[0].message.content},
        {"role": "user", "content": "and the moon"},
    ]
    two = chat(server, "", messages=follow, temperature=0)
    cached = two.usage.prompt_tokens_details.cached_tokens
    assert cached >= one.usage.prompt_tokens
    assert two.usage.model_extra["prefilled_tokens"] == two.usage.prompt_tokens - cached
    spec = two.usage.model_extra["speculation"]
    assert set(spec) >= {"drafted", "accepted", "acceptance", "tokens_per_round"}
    assert spec["method"] == "hybrid" and spec["tokens_per_second"] > 0


def test_stop_strings_cut_exactly_streaming_and_not(server):
    prompt = "how is the dog"
    full = chat(server, prompt, temperature=0).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    want = full[: full.find(stop)]
    whole = chat(server, prompt, temperature=0, stop=[stop, "never-there"])
    assert whole.choices[0].message.content == want
    assert whole.choices[0].finish_reason == "stop"
    text, chunks = streamed(server, prompt, temperature=0, stop=stop)
    assert text == want and all(stop not in (c.choices[0].delta.content or "") for c in chunks)
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"


def test_include_usage_in_a_stream(server):
    _, chunks = streamed(server, "the sun", stream_options={"include_usage": True})
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_usage_reports_the_peak_memory_streaming_and_not(server, tiny_pair):
    """usage.peak_memory_bytes: the most memory MLX held in the server's process while the
    request ran, which holds both models' weights at least."""
    weights = sum(f.stat().st_size for d in tiny_pair for f in d.glob("*.safetensors"))
    assert weights > 0
    whole = chat(server, "the owl", temperature=0).usage.model_extra["peak_memory_bytes"]
    _, chunks = streamed(server, "the owl", stream_options={"include_usage": True})
    stream = chunks[-1].usage.model_extra["peak_memory_bytes"]
    text = client(server).completions.create(model="target", prompt="the owl", max_tokens=4)
    raw = text.usage.model_extra["peak_memory_bytes"]
    for peak in (whole, stream, raw):
        assert isinstance(peak, int) and weights <= peak < 1 << 30


def test_per_request_speculation_options(server):
    plain = chat(server, "the moon", temperature=0, extra_body={"edgespec": {"method": "none"}})
    spec = chat(
        server, "the moon", temperature=0, extra_body={"edgespec": {"k": 2, "adaptive": False}}
    )
    assert plain.choices[0].message.content == spec.choices[0].message.content
    assert plain.usage.model_extra["speculation"]["drafted"] == 0
    assert spec.usage.model_extra["speculation"]["drafted"] > 0


def test_a_client_that_disconnects_cancels_its_generation(server):
    prompt = "tell me about the star"
    want = chat(server, prompt, temperature=0, max_tokens=400).choices[0].message.content
    before = health(server)["requests"]["cancelled"]
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 400, "stream": True}
    with httpx.stream("POST", f"{server.base}/chat/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                break  # one round of text arrived: hang up
    deadline = time.monotonic() + 30
    while health(server)["requests"]["cancelled"] == before:
        assert time.monotonic() < deadline, "the generation was not cancelled"
        time.sleep(0.1)
    again = chat(server, prompt, temperature=0, max_tokens=400).choices[0].message.content
    assert again == want  # caches stayed consistent


def test_a_client_gone_while_queued_is_skipped(server):
    """B waits behind four long answers (the batch of four is full) and hangs up: B never runs;
    the four, cancelled too, end. The four start together, so none ends before B has waited."""
    before = health(server)["requests"]
    long_body = {"messages": [{"role": "user", "content": "go on"}], "max_tokens": 480}
    url = f"{server.base}/chat/completions"
    with contextlib.ExitStack() as held:
        for _ in range(4):
            held.enter_context(httpx.stream("POST", url, json=dict(long_body, stream=True)))
        wait_for(server, lambda h: h["running"] == 4)
        body_b = {"messages": [{"role": "user", "content": "me next"}], "stream": True}
        with httpx.stream("POST", url, json=body_b, timeout=30) as b:
            lines = b.iter_lines()  # held: a dropped line iterator closes the response (hangs up)
            assert '"role":"assistant"' in next(line for line in lines if line)
            wait_for(server, lambda h: h["queued"] == 1 and h["running"] == 4)
    wait_for(server, lambda h: h["requests"]["cancelled"] == before["cancelled"] + 5)
    after = health(server)
    assert after["requests"]["completed"] == before["completed"] and after["queued"] == 0


def wait_for(server, check, seconds: float = 30) -> None:
    """Poll /health until check(its JSON) holds."""
    deadline = time.monotonic() + seconds
    while not check(h := health(server)):
        assert time.monotonic() < deadline, h
        time.sleep(0.05)


def test_four_clients_at_once_all_get_their_own_answer(server):
    prompts = [
        f"question {i}: why is the {w} light" for i, w in enumerate("sun moon star fire".split())
    ]
    want = [chat(server, p, temperature=0).choices[0].message.content for p in prompts]
    latencies: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            health(server)
            latencies.append(time.monotonic() - t0)
            time.sleep(0.05)

    watcher = threading.Thread(target=poll_health, daemon=True)
    watcher.start()
    with ThreadPoolExecutor(4) as pool:
        got = list(
            pool.map(lambda p: streamed(server, p, temperature=0, max_tokens=MAX)[0], prompts)
        )
    stop.set()
    watcher.join(10)
    assert got == want
    assert latencies and max(latencies) < 5.0  # /health answers while generations run


BAD = [
    (b"{not json", 400, "not valid JSON"),
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}, 404, "does not exist"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_p": 2}, 400, "top-p"),
    ({"messages": []}, 400, "non-empty"),
    ({"messages": [{"role": "user", "content": "  "}]}, 400, "empty"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 3}, 400, "n=1"),
    ({"messages": [{"role": "user", "content": "the cat " * 400}]}, 400, "context window"),
    ({"messages": [{"role": "user", "content": "hi"}], "edgespec": {"k": 99}}, 400, "K"),
]


@pytest.mark.parametrize(("body", "status", "words"), BAD, ids=lambda v: str(v)[:30])
def test_bad_requests_get_an_openai_error_and_the_server_goes_on(server, body, status, words):
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    json_type = {"Content-Type": "application/json"}
    r = httpx.post(f"{server.base}/chat/completions", headers=json_type, timeout=30, **kw)
    assert r.status_code == status
    err = r.json()["error"]
    assert words in err["message"] and "\n" not in err["message"] and err["type"]
    if "context window" in words:
        assert err["code"] == "context_length_exceeded"
    assert chat(server, "ok?", max_tokens=2).choices[0].message.content is not None


def test_routes_and_methods(server):
    assert httpx.get(f"{server.base}/chat/completions", timeout=10).status_code == 405
    missing = httpx.get(f"{server.base}/nothing", timeout=10)
    assert missing.status_code == 404 and "no such endpoint" in missing.json()["error"]["message"]
    assert [m.id for m in client(server).models.list()] == ["target"]
    h = health(server)
    assert h["status"] == "ok" and h["model"] == "target" and "cache" in h
    bad_prompt = httpx.post(f"{server.base}/completions", json={"prompt": [10**9]}, timeout=10)
    assert (
        bad_prompt.status_code == 400 and "not a token id" in bad_prompt.json()["error"]["message"]
    )


def test_api_key_cors_then_sigterm_mid_stream(tiny_pair):
    origin = "http://localhost:3000"
    srv = ServerProcess(
        *models(tiny_pair), "--allow-origin", origin, env={"EDGESPEC_API_KEY": "sesame"}
    )
    try:
        preflight = httpx.options(
            f"{srv.base}/chat/completions",
            headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
            timeout=10,
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == origin
        other = httpx.get(f"{srv.url}/health", headers={"Origin": "http://evil.test"}, timeout=10)
        assert "access-control-allow-origin" not in other.headers
        for key in ("none", "wrong"):
            with pytest.raises(openai.AuthenticationError):
                client(srv, key).models.list()
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
        assert [m.id for m in client(srv, "sesame").models.list()] == ["target"]
        started = threading.Event()
        ended: list[str] = []

        def stream() -> None:
            body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 480}
            headers = {"Authorization": "Bearer sesame"}
            url = f"{srv.base}/chat/completions"
            try:
                with httpx.stream("POST", url, json=dict(body, stream=True), headers=headers) as r:
                    for line in r.iter_lines():
                        started.set()
                        ended.append(line)
            except httpx.HTTPError as exc:
                ended.append(f"closed: {exc}")

        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        assert started.wait(60)
        assert srv.terminate(signal.SIGTERM) == 0
        reader.join(20)
        assert not reader.is_alive()
        assert any("shutting down" in line for line in ended)  # the stream was told why
        assert "stopped" in "".join(srv.stderr) and "Traceback" not in "".join(srv.stderr)
    finally:
        srv.kill()


def test_a_port_in_use_is_one_clear_line(server, tiny_pair):
    port = server.url.rsplit(":", 1)[1]
    r = run_edgespec("serve", *models(tiny_pair), "--port", port, timeout=120)
    assert r.returncode == 2 and "cannot listen on 127.0.0.1:" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_embedded_pair_greedy_equals_edgespec_generate():
    prompt = "Name three uses of a paperclip."
    r = run_edgespec("generate", prompt, "--json", "--max-tokens", "48")
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout.splitlines()[-1])["text"]
    srv = ServerProcess()
    try:
        c = client(srv)
        got = c.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=48,
            temperature=0,
        )
        assert got.choices[0].message.content == want
        assert got.usage.model_extra["speculation"]["accepted"] > 0
    finally:
        srv.kill()
