"""A rank for tests/distributed/test_distributed_serve.py: rank 0 sends two requests and a stop, and
sets its cancel flag at the third check (rank 1 at the first); every rank prints, as one JSON line,
what it received, at which check it saw the cancellation and whether its caches agreed with the
other ranks'.

    mlx.launch --backend ring -n 2 -- python tests/helpers/dist_serve.py
"""

from __future__ import annotations

import json
import sys
import threading

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.distributed.group import init_group
from edgespec.distributed.messages import (
    GroupCancel,
    align_caches,
    encode_config,
    receive_request,
    send_request,
    send_stop,
)

REQUESTS = [
    ([5, 6, 7], GenerationConfig(SamplingConfig(temperature=0.7, seed=2**64 - 1), max_tokens=9)),
    (
        [9] * 40,
        GenerationConfig(spec=SpecConfig(k=3, method="ngram", adaptive=False), max_tokens=2),
    ),
]


class Caches:
    """What align_caches reads and resets of an Engine: rank r holds r + 1 prompt tokens."""

    def __init__(self, held: list[int]):
        self.held, self.resets = held, 0

    def cached_tokens(self) -> tuple[list[int], None]:
        return self.held, None

    def reset(self) -> None:
        self.held, self.resets = [], self.resets + 1


def main() -> int:
    group = init_group()
    assert group is not None
    received = []
    if group.is_primary:
        for prompt, config in REQUESTS:
            send_request(group, prompt, config)
        send_stop(group)
    else:
        while (request := receive_request(group)) is not None:
            prompt, config = request
            received.append([prompt, encode_config(config).decode()])
    flag = threading.Event()
    cancel = GroupCancel(group, flag)
    seen = None
    for check in range(6):
        if check == (2 if group.is_primary else 0):  # rank 1's own flag counts for nothing
            flag.set()
        if cancel.is_set() and seen is None:
            seen = check
    caches = Caches([5, 6, 7][: group.rank + 1])
    agreed = align_caches(caches, group, [5, 6, 7])
    same = Caches([5, 6])
    report = {
        "rank": group.rank,
        "received": received,
        "cancelled_at": seen,
        "agreed": [agreed, align_caches(same, group, [5, 6, 7])],
        "resets": [caches.resets, same.resets],
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
