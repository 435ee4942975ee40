"""What keeps a served, sharded target's ranks in step: rank 0 answers HTTP, and every request it
runs, and every cancellation, reaches the other ranks through the group's own collectives.

    send_request(group, prompt, config)      # rank 0, before it generates
    request = receive_request(group)         # ranks > 0: (prompt, config), None once rank 0 stops
    align_caches(engine, group, prompt)      # every rank: the same cached prefix, or none
    cancel = GroupCancel(group, job.cancel)  # rank 0's flag, read alike on every rank
    engine.generate(prompt, config, cancel)  # every rank, the same steps

A message is an all_sum of int32 arrays to which the ranks other than 0 add zeros: a header
[kind, config bytes, prompt ids] of fixed size, then one payload holding the config's JSON bytes
and the prompt's token ids. The loop's own decisions need no message (edgespec.distributed.group
says why); only the request (prompt ids, sampling settings and seed, method and K) and the
moment to stop do, because they come from one HTTP client talking to rank 0.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from typing import Any, cast

import mlx.core as mx

from edgespec.cache import common_prefix
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.distributed.group import Group

STOP, REQUEST = 0, 1  # a header's kind


def encode_config(config: GenerationConfig) -> bytes:
    """A request's settings as JSON bytes (the backend's softmax is the Engine's, not sent).
    Example: decode_config(encode_config(c)) == c for any GenerationConfig c."""
    sampling = {
        f.name: getattr(config.sampling, f.name)
        for f in dataclasses.fields(SamplingConfig)
        if f.name != "softmax"
    }
    body = {
        "sampling": sampling,
        "spec": dataclasses.asdict(config.spec),
        "max_tokens": config.max_tokens,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_config(data: bytes) -> GenerationConfig:
    body = json.loads(data.decode())
    return GenerationConfig(
        sampling=SamplingConfig(**body["sampling"]),
        spec=SpecConfig(**body["spec"]),
        max_tokens=int(body["max_tokens"]),
    )


def _share(group: Group, values: list[int], size: int) -> list[int]:
    """Rank 0's `values` (`size` int32s) on every rank: an all_sum to which the others add 0."""
    local = values if group.is_primary else [0] * size
    total = mx.distributed.all_sum(mx.array(local, dtype=mx.int32), group=group.group)
    return [int(v) for v in cast(list[int], total.tolist())]


def send_request(group: Group, prompt: list[int], config: GenerationConfig) -> None:
    """Rank 0: tell the other ranks to run `prompt` with `config` (two collectives)."""
    data = encode_config(config)
    _share(group, [REQUEST, len(data), len(prompt)], 3)
    _share(group, [*data, *prompt], len(data) + len(prompt))


def send_stop(group: Group) -> None:
    """Rank 0: no more requests; the other ranks' receive_request returns None."""
    _share(group, [STOP, 0, 0], 3)


def receive_request(group: Group) -> tuple[list[int], GenerationConfig] | None:
    """Ranks > 0: wait for rank 0's next request (prompt ids, config), or None for its stop."""
    kind, n_config, n_prompt = _share(group, [], 3)
    if kind == STOP:
        return None
    payload = _share(group, [], n_config + n_prompt)
    return payload[n_config:], decode_config(bytes(payload[:n_config]))


def align_caches(engine: Any, group: Group, prompt: list[int]) -> bool:
    """Make every rank reuse the same cached prefix of `prompt`: if the ranks' caches share
    different lengths with it (a cache set one rank dropped and another kept), every rank forgets
    its caches, so all prefill the whole prompt alike. Returns whether they already agreed.
    `engine`: an edgespec Engine (cached_tokens(), reset())."""
    target, draft = engine.cached_tokens()
    local = [common_prefix(target, prompt), -1 if draft is None else common_prefix(draft, prompt)]
    gathered = mx.distributed.all_gather(mx.array(local, dtype=mx.int32), group=group.group)
    rows = {tuple(row) for row in cast(list[list[int]], gathered.reshape(-1, 2).tolist())}
    if len(rows) > 1:
        engine.reset()
    return len(rows) == 1


class GroupCancel:
    """A cancel flag every rank reads alike: each is_set() all_sums rank 0's own flag (`local`;
    the other ranks add 0) and answers the previous call's sum, so the check never waits for the
    forward queued before it. A cancellation on rank 0 thus stops every rank at the same check,
    one check after it was seen. Pass it as the Engine's `cancel`: the loops call is_set() at
    the same points on every rank."""

    def __init__(self, group: Group, local: threading.Event | None = None):
        self.group, self.local = group, local
        self._pending: mx.array | None = None

    def is_set(self) -> bool:
        flag = int(self.group.is_primary and self.local is not None and self.local.is_set())
        now = mx.distributed.all_sum(mx.array([flag], dtype=mx.int32), group=self.group.group)
        mx.async_eval(now)
        previous, self._pending = self._pending, now
        return previous is not None and cast(int, previous.item()) > 0
