"""The embedded default pair served several at once (edgespec/server/packing.py): the target's
forwards and the reduced-head draft's head-only steps run packed, and every answer is the one it
gets alone. Real models through the server's worker. Slow.
"""

from __future__ import annotations

import pytest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.runtime import Engine
from edgespec.server.worker import Done, Job, Worker
from tests.helpers.worker import Collect, run

pytestmark = pytest.mark.slow

QUESTIONS = [
    "Write a haiku about rivers.",
    "Name three uses of a paperclip.",
    "Explain what a hash table is in two sentences.",
]
SPECS = [
    SpecConfig(method="hybrid", adaptive=True),
    SpecConfig(method="draft", k=3, adaptive=False),
    SpecConfig(method="draft", k=1, adaptive=False),
]


def test_three_answers_at_once_are_their_solo_answers_with_forwards_packed():
    w = Worker(Engine.load, max_batch=len(QUESTIONS), budget_bytes=1 << 31)
    w.start()
    try:
        prompts = [w.engine.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
        cfgs = [GenerationConfig(SamplingConfig(temperature=0.0), s, 48) for s in SPECS]
        solo = [run(w, p, c).text for p, c in zip(prompts, cfgs, strict=True)]
        packer = w._batch.packer
        assert packer is not None and packer.counts["packed"] == 0  # alone: own forwards
        outs = [Collect() for _ in prompts]
        for p, c, out in zip(prompts, cfgs, outs, strict=True):
            w.submit(Job(p, c, (), out))
        assert all(isinstance(out.wait(), Done) for out in outs)
    finally:
        w.shutdown()
    assert [out.text for out in outs] == solo
    assert packer.counts["packed"] > 0
    assert packer.counts["head-only"] > 0  # the reduced-head draft's steps were packed too
