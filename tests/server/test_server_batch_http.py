"""`edgespec serve` answering several clients at once (edgespec/server/batching.py), driven with
the official `openai` client: four concurrent streams each get their solo answer, and all four
stream before any of them ends."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from edgespec.server.process import ServerProcess

openai = pytest.importorskip("openai")

MAX = 300
PROMPTS = ["why is the sun light", "the moon and the star", "tell me about fire", "go on"]
METHODS = ["hybrid", "draft", "ngram", "none"]


@pytest.fixture(scope="module")
def server(tiny_pair):
    target, draft = (str(p) for p in tiny_pair)
    srv = ServerProcess("--target", target, "--draft", draft, "--max-batch", "4")
    yield srv
    srv.kill()


def request(prompt: str, method: str) -> dict:
    return dict(
        model="target",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX,
        temperature=0,
        extra_body={"edgespec": {"method": method}},
    )


def test_four_concurrent_streams_get_their_solo_answers_side_by_side(server):
    client = openai.OpenAI(base_url=server.base, api_key="none", timeout=120, max_retries=0)
    jobs = list(zip(PROMPTS, METHODS, strict=True))
    solo = [client.chat.completions.create(**request(*job)) for job in jobs]
    want = [reply.choices[0].message.content for reply in solo]
    barrier = threading.Barrier(len(jobs))

    def stream(job: tuple[str, str]) -> tuple[str, float, float]:
        barrier.wait()
        first, parts = None, []
        for chunk in client.chat.completions.create(stream=True, **request(*job)):
            text = chunk.choices[0].delta.content if chunk.choices else None
            if text:
                first = first if first is not None else time.monotonic()
                parts.append(text)
        assert first is not None
        return "".join(parts), first, time.monotonic()

    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(stream, jobs))
    assert [text for text, _, _ in got] == want
    assert all(len(text) > 100 for text in want)  # long enough to overlap
    assert max(first for _, first, _ in got) < min(end for _, _, end in got)


def test_max_batch_below_one_is_one_line_exit_2():
    from tests.helpers.cli import run_edgespec

    r = run_edgespec("serve", "--max-batch", "0", timeout=120)
    assert r.returncode == 2 and "--max-batch must be >= 1, got 0" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
