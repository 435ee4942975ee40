"""The concurrency sweep's measuring and report (edgespec/bench/concurrency.py) with a stand-in
client whose streams take known times: no model, no server."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from edgespec.bench.concurrency import (
    WARM_UP,
    Level,
    Stream,
    level,
    pooled_rate,
    report,
    served_alone,
    sweep,
)


class FakeClient:
    """`chat.completions.create(stream=True)`: `words` chunks `delay` s apart, then usage; counts
    how many streams run at once."""

    def __init__(self, words: int = 3, delay: float = 0.05):
        self.words, self.delay, self.now, self.most = words, delay, 0, 0
        self.lock = threading.Lock()
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, messages, max_tokens, **_):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            for i in range(self.words):
                time.sleep(self.delay)
                delta = SimpleNamespace(content=f"{messages[0]['content']}{i} ")
                yield SimpleNamespace(usage=None, choices=[SimpleNamespace(delta=delta)])
            usage = SimpleNamespace(completion_tokens=self.words)
            yield SimpleNamespace(usage=usage, choices=[])
        finally:
            with self.lock:
                self.now -= 1


def test_a_level_releases_its_clients_together_and_times_them_from_the_release():
    client = FakeClient(words=3, delay=0.05)
    lv = level("fake", client, "m", ["a", "b"], 4, 8)
    assert client.most == 4 and lv.n == 4
    assert [s.text for s in lv.streams] == ["a0 a1 a2 ", "b0 b1 b2 ", "a0 a1 a2 ", "b0 b1 b2 "]
    for s in lv.streams:
        assert 0.04 < s.ttft < s.seconds and s.tokens == 3
    assert lv.tokens_per_s == pytest.approx(12 / max(s.seconds for s in lv.streams))


def test_the_report_puts_the_servers_side_by_side(capsys):
    def lv(server: str, n: int, seconds: float, text: str = "x") -> Level:
        return Level(server, tuple(Stream(0.5, seconds, 10, text) for _ in range(n)))

    levels = [lv("one", 1, 1.0), lv("one", 2, 1.0), lv("two", 1, 2.0), lv("two", 2, 4.0, "y")]
    report(levels)
    out = capsys.readouterr().out
    assert "N=1: tok/s vs one: two 0.50x" in out and "N=2: tok/s vs one: two 0.25x" in out
    assert "answers identical, one vs two: 1 of 3" in out


def test_a_level_served_in_turn_is_timed_from_each_requests_turn(capsys):
    """Solo on the same questions: a one-at-a-time server's requests, each from the end of the
    one before it (TTFT N = 4 against N = 1 compared different questions)."""
    in_turn = Level("in turn", (Stream(1.4, 2.5, 10, "b"), Stream(0.2, 1.0, 10, "a")))
    alone = served_alone(in_turn)
    assert [(s.text, s.ttft, s.seconds) for s in alone] == [
        ("a", 0.2, 1.0), ("b", pytest.approx(0.4), 1.5),
    ]  # fmt: skip
    together = Level("together", (Stream(0.5, 2.0, 10, "a"), Stream(0.7, 2.0, 10, "b")))
    report([Level("together", (Stream(0.3, 1.0, 10, "q"),)), together,
            Level("in turn", (Stream(0.3, 1.0, 10, "q"),)), in_turn])  # fmt: skip
    out = capsys.readouterr().out
    assert "N=2: together against the same questions served alone" in out
    assert "tok/s 1.25x, TTFT p50 2.00x (0.60 s / 0.30 s)" in out


def test_runs_of_a_level_are_pooled(capsys):
    """--sweep-runs: each level's runs pool into one row, tokens over the runs' summed times."""
    one = [Level("a", (Stream(0.1, 1.0, 10, "p"),)), Level("a", (Stream(0.3, 3.0, 30, "q"),))]
    two = [Level("b", (Stream(0.2, 2.0, 10, "p"),)), Level("b", (Stream(0.4, 2.0, 30, "x"),))]
    assert pooled_rate(one) == pytest.approx(10.0) and pooled_rate(two) == pytest.approx(10.0)
    report([one[0], two[0], one[1], two[1]])  # as run_sweep lists them: server by server
    out = capsys.readouterr().out
    assert "each level ran 2 times" in out
    assert "N=1: tok/s vs a: b 1.00x; TTFT p50 0.20 s / 0.30 s" in out
    assert "answers identical, a vs b: 1 of 2" in out


def test_the_sweep_refuses_more_questions_than_the_set_has():
    from edgespec.bench.serve import _arguments, _sweep
    from edgespec.errors import EdgeSpecError

    args = _arguments(["--sweep", "1,4", "--sweep-runs", "2", "--per-category", "1"])
    with pytest.raises(EdgeSpecError, match="asks 10 questions; the prompt set has 5"):
        _sweep(args)  # before any server starts


def test_a_sweep_never_asks_a_question_twice_so_every_prompt_is_prefilled():
    client = FakeClient(words=1, delay=0.0)
    asked: list[str] = []
    create = client.create
    client.chat.completions.create = lambda messages, **kw: (
        asked.append(messages[0]["content"]) or create(messages, **kw)
    )
    levels = sweep("fake", client, "m", [f"q{i}" for i in range(15)], [1, 2, 4, 8], 4)
    assert asked[0] == WARM_UP and sorted(asked[1:]) == sorted(f"q{i}" for i in range(15))
    assert [lv.n for lv in levels] == [1, 2, 4, 8]
    assert [s.text for s in levels[1].streams] == ["q10 ", "q20 "]
