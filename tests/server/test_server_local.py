"""`edgespec serve` as a local server on the embedded pair, against what a web page or a careless
client sends (loopback only, every loop bounded): a page's POSTs (text/plain, forms), a foreign
Host (DNS rebinding) or Origin; duplicate Authorization headers and /health without the key;
fields the server does not implement, loosely typed values, a method the pair cannot run.
Real model (the embedded pair), so slow."""

from __future__ import annotations

import json

import pytest

from edgespec.server.local import HostRule, host_name, is_json
from edgespec.server.process import ServerProcess
from edgespec.server.protocol import QUOTE_MAX

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

SECRET = "sesame"
KEY = {"Authorization": f"Bearer {SECRET}"}
HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--no-warmup", "--max-tokens", "4", env={"EDGESPEC_API_KEY": SECRET})
    yield srv
    srv.kill()


def port(srv: ServerProcess) -> int:
    return int(srv.url.rsplit(":", 1)[1])


def post(srv: ServerProcess, body: dict | None = None, headers=None, **kw) -> httpx.Response:
    """A chat completion with the key and a JSON content type unless `headers` says otherwise
    (a list of pairs may repeat a header)."""
    content = json.dumps(HI if body is None else body)
    if headers is None:
        headers = {**KEY, "Content-Type": "application/json"}
    return httpx.post(f"{srv.base}/chat/completions", content=content, headers=headers, timeout=120)


def refusal(r: httpx.Response) -> tuple[int, str | None, str]:
    err = r.json()["error"]
    return r.status_code, err.get("param"), err["message"]


# ---- item 3: local means local


def test_posts_that_a_web_page_sends_without_a_preflight_are_415(server):
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = post(server, headers={**KEY, "Content-Type": kind})
        assert r.status_code == 415, kind
        assert r.json()["error"]["code"] == "unsupported_media_type"
    r = post(server, headers=KEY)  # no Content-Type at all
    assert r.status_code == 415
    r = post(server, headers={**KEY, "Content-Type": "Application/JSON; charset=utf-8"})
    assert r.status_code == 200


def test_a_host_that_does_not_name_this_server_is_421(server):
    url = f"{server.base}/models"
    for host in ("evil.example", f"evil.example:{port(server)}", "localhost.evil.example"):
        r = httpx.get(url, headers={**KEY, "Host": host}, timeout=30)
        assert r.status_code == 421, host
        assert "--allow-host" in r.json()["error"]["message"]
    r = post(server, headers={**KEY, "Content-Type": "application/json", "Host": "evil.example"})
    assert r.status_code == 421  # nothing ran: the body was not read
    for host in (f"localhost:{port(server)}", "127.0.0.1", f"LOCALHOST.:{port(server)}", "[::1]"):
        assert httpx.get(url, headers={**KEY, "Host": host}, timeout=30).status_code == 200, host


def test_a_request_from_a_web_page_is_refused_with_or_without_the_key(server):
    for origin in ("http://evil.example", "null", f"http://127.0.0.1:{port(server)}"):
        headers = {**KEY, "Content-Type": "application/json", "Origin": origin}
        r = post(server, headers=headers)
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
        assert "access-control-allow-origin" not in r.headers  # CORS stays off
        health = httpx.get(f"{server.url}/health", headers={"Origin": origin}, timeout=30)
        assert health.status_code == 403
    assert post(server).status_code == 200  # a client that is no browser sends no Origin


def test_host_rule_names_and_addresses():
    assert host_name("LocalHost:8080") == "localhost" and host_name("[::1]:80") == "::1"
    loop = HostRule.of("127.0.0.1")
    assert all(loop.allows(h) for h in ("localhost", "127.0.0.2:80", "[::1]:8080", None))
    assert not any(loop.allows(h) for h in ("evil.example", "10.0.0.1", "example.localhost"))
    named = HostRule.of("127.0.0.1", ("box.lan",))
    assert named.allows("BOX.LAN:8080") and not named.allows("other.lan")
    everywhere = HostRule.of("0.0.0.0")
    assert everywhere.allows("192.168.1.5:8080") and not everywhere.allows("evil.example")
    assert HostRule.of("127.0.0.1", ("*",)).allows("anything.example")
    assert is_json("application/json;charset=utf-8") and not is_json("text/json")


# ---- item 4: auth done right


def test_two_authorization_headers_are_a_400_in_either_order(server):
    right, wrong = ("Authorization", f"Bearer {SECRET}"), ("Authorization", "Bearer nope")
    json_type = ("Content-Type", "application/json")
    for pair in ((wrong, right), (right, wrong), (right, right)):
        r = post(server, headers=[*pair, json_type])
        assert r.status_code == 400 and r.json()["error"]["code"] == "duplicate_authorization"


def test_a_401_names_the_bearer_scheme(server):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic c2VzYW1l"}):
        r = post(server, headers={**headers, "Content-Type": "application/json"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


def test_health_without_the_key_says_only_that_the_server_is_alive(server):
    bare = httpx.get(f"{server.url}/health", timeout=30)
    assert bare.status_code == 200 and bare.json() == {"status": "ok"}
    full = httpx.get(f"{server.url}/health", headers=KEY, timeout=30).json()
    assert full["status"] == "ok" and {"model", "requests", "cache"} <= set(full)
    wrong = httpx.get(f"{server.url}/health", headers={"Authorization": "Bearer no"}, timeout=30)
    assert wrong.status_code == 401


# ---- item 5: refuse what is not done


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tool_choice", "required"),
        ("tool_choice", {"type": "function", "function": {"name": "f"}}),
        ("function_call", {"name": "f"}),
        ("parallel_tool_calls", True),
        ("n", True),
        ("n", 2),
        ("best_of", 3),
        ("presence_penalty", False),
        ("frequency_penalty", "0"),
        ("max_tokens", True),
        ("seed", 1.5),
        ("temperature", "0"),
        ("model", 12345),
        ("model", ["smollm2-135m"]),
    ],
)
def test_a_field_not_done_or_loosely_typed_is_a_400_naming_it(server, field, value):
    status, param, _ = refusal(post(server, {**HI, field: value}))
    assert (status, param) == (400, field)


def test_neutral_values_of_refused_fields_are_accepted(server):
    neutral = {"tool_choice": "none", "parallel_tool_calls": False, "n": 1, "presence_penalty": 0}
    assert post(server, {**HI, **neutral}).status_code == 200


def test_a_huge_value_is_quoted_back_cut_short(server):
    status, param, message = refusal(post(server, {**HI, "model": "m" * 10_000}))
    assert (status, param) == (404, "model")
    assert "m" * QUOTE_MAX not in message and len(message) < 2 * QUOTE_MAX + 200
    status, param, message = refusal(post(server, {**HI, "edgespec": {"k" * 10_000: 1}}))
    assert status == 400 and len(param or "") <= QUOTE_MAX + 10 and len(message) < 600


def test_a_method_the_pair_cannot_run_is_a_bad_request_not_a_failure(server):
    def counts() -> dict:
        return httpx.get(f"{server.url}/health", headers=KEY, timeout=30).json()["requests"]

    before = counts()
    for method in ("block", "block-tree", "mtp"):
        status, param, message = refusal(post(server, {**HI, "edgespec": {"method": method}}))
        assert (status, param) == (400, "edgespec.method") and "needs" in message
    after = counts()
    assert after["failed"] == before["failed"]
    assert after["bad_request"] >= before.get("bad_request", 0) + 3
