"""A rank for tests/distributed/test_distributed.py: every rank commits the same first step, then
rank 1 a different second one; the Agreement check must stop every rank with a GroupError.

    mlx.launch --backend ring -n 2 -- python tests/helpers/dist_agreement.py
"""

from __future__ import annotations

import sys

from edgespec.distributed.group import Agreement, init_group
from edgespec.errors import GroupError


def main() -> int:
    group = init_group()
    assert group is not None
    agreement = Agreement(group)
    agreement.observe([11, 12], 2, 1)  # the same on every rank
    try:
        agreement.observe([13 + group.rank], 1, 0)  # rank 1 committed another token
    except GroupError as exc:
        print(f"rank {group.rank} caught: {exc}", flush=True)
        return 0
    print(f"rank {group.rank} saw no disagreement", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
