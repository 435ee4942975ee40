"""The group of processes a sharded target runs on, and the check that its ranks stay in step.

`mlx.launch --backend ring -n 3 -- edgespec generate ...` starts one process per rank; each one
runs the same EdgeSpec loop on its shard of the target (edgespec/loading/shard.py) and a whole
copy of the draft. The loop's decisions are then the same on every rank without any extra
message, because every input to them is: the prompt and settings (from the command line), the
PRNG keys (from the request's seed, edgespec.sampling), the draft's output (the same weights on
the same inputs) and the target's logits (the sharded layers end in an all-reduce whose result
is the same on every rank, and the output head is replicated). Two things would break that, so
they are refused or checked here:

- decisions from timings, which differ per rank: adaptive K (`check_config` refuses it).
- logits that differ between ranks (different chips or MLX builds computing the replicated
  head): `Agreement` folds every committed step into a checksum and compares it across ranks
  with one small all_gather per step, so a divergence stops the run with a GroupError before
  the next forward (where ranks that disagree on a proposal's length would exchange arrays of
  different shapes: MLX's ring backend then returns wrong sums without an error).

Backends are MLX's own (mx.distributed.init: ring over TCP or Thunderbolt, JACCL over RDMA,
MPI); EdgeSpec adds no transport of its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from edgespec.config import GenerationConfig
from edgespec.errors import ConfigError, GroupError, one_line
from edgespec.launch import HOSTFILE, env_rank, launched_backend, lost_group
from edgespec.switches import RANK_CHECK

_MOD = 2_147_483_647  # 2**31 - 1: checksums fit an int32 all_gather


@dataclass(frozen=True)
class Group:
    """An initialised MLX group: `rank` of `size`, and the backend that connects it."""

    group: Any  # mx.distributed.Group
    backend: str

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    @property
    def size(self) -> int:
        return int(self.group.size())

    @property
    def is_primary(self) -> bool:
        """Rank 0: the one that prints, writes files and answers requests."""
        return self.rank == 0

    def barrier(self) -> None:
        """Return once every rank got here (an all_sum of one number)."""
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=self.group))


def _empty_hostfile(environ: Mapping[str, str]) -> bool:
    """mlx.launch -n 1 writes an empty ring hostfile, which mx.distributed.init cannot parse."""
    path = environ.get(HOSTFILE)
    try:
        return bool(path) and not Path(path).read_text().strip()  # type: ignore[arg-type]
    except OSError:
        return False


def init_group() -> Group | None:
    """The group this process was launched into, or None when no MLX launcher started it (a plain
    `edgespec` run: the target stays whole). A launch of one rank gives a Group of size 1, which
    runs the same code path as a larger one. Connecting waits for every rank (MLX retries for
    ~15 s); failure is a one-line GroupError."""
    backend = launched_backend()
    if backend is None:
        return None
    if backend == "ring" and _empty_hostfile(os.environ):
        os.environ.pop(HOSTFILE)  # a group of one: MLX's singleton group
        return Group(mx.distributed.init(), backend)
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except (RuntimeError, ValueError) as exc:
        raise GroupError(f"cannot join the {backend} group: {one_line(exc)}") from None
    return Group(group, backend)


def lost(exc: BaseException, group: Group | None = None) -> GroupError | None:
    """The GroupError a backend failure means (a peer gone: "[ring] connection to a peer was
    lost"), or None for any other exception."""
    text = one_line(exc)
    if not isinstance(exc, RuntimeError) or not text.startswith(("[ring]", "[jaccl]", "[mpi]")):
        return None
    return lost_group(text, group.rank if group is not None else env_rank())


def check_config(config: GenerationConfig, group: Group) -> None:
    """Refuse settings whose decisions could differ between ranks (ConfigError)."""
    if group.size > 1 and config.spec.enabled and config.spec.adaptive:
        raise ConfigError(
            "adaptive K picks K from each rank's own timings, which differ between ranks; "
            "a sharded target needs a fixed K (--no-adaptive --k N)"
        )
    if group.size > 1 and config.spec.enabled and config.spec.tree == "auto":
        raise ConfigError(
            "--tree auto picks shapes from each rank's own timings, which differ between ranks; "
            "a sharded target needs a fixed shape (--tree 3,2,1,1, dynamic or chain)"
        )


def fold(digest: int, values: list[int]) -> int:
    """A running checksum: digest' = (digest * 1000003 + v + 1) mod (2**31 - 1) for each v.
    Example: fold(0, [5]) -> 6; fold(6, [0]) -> 6000019."""
    for v in values:
        digest = (digest * 1_000_003 + int(v) + 1) % _MOD
    return digest


class Agreement:
    """Checks after every step that all ranks committed the same tokens in the same rounds.

    observe(step) folds the step's tokens and round shape into a running checksum, all_gathers
    it and compares. Speculative steps are checked before the loop goes on (the next forward's
    shape depends on them); plain decoding steps, whose shapes never change, are read one step
    late so that the check never waits on the forward already queued behind them.
    """

    def __init__(self, group: Group):
        self.group = group
        self.digest = 0
        self.steps = 0
        self._pending: tuple[mx.array, int] | None = None

    def observe(self, tokens: list[int], drafted: int | None, accepted: int | None) -> None:
        """Fold one step (drafted/accepted None: a plain decoding step) and check it."""
        shape = [-1, -1] if drafted is None else [drafted, accepted or 0]
        self.digest = fold(self.digest, [*tokens, *shape, len(tokens)])
        self.steps += 1
        local = mx.array([self.digest], dtype=mx.int32)
        gathered = mx.distributed.all_gather(local, group=self.group.group)
        self.settle()
        if drafted is None:
            mx.async_eval(gathered)
            self._pending = (gathered, self.steps)
        else:
            self._check(gathered, self.steps)

    def settle(self) -> None:
        """Check the step still waiting to be read (call before reporting the end)."""
        if self._pending is not None:
            gathered, step = self._pending
            self._pending = None
            self._check(gathered, step)

    def _check(self, gathered: mx.array, step: int) -> None:
        values = [int(v) for v in gathered.tolist()]  # type: ignore[union-attr,arg-type]
        if len(set(values)) > 1:
            raise GroupError(
                f"the {len(values)} ranks disagree on the tokens of step {step} (checksums "
                f"{values}): their logits differ (mixed chips or MLX versions?); run every rank "
                "on the same MLX build and hardware, or on one machine"
            )


def agreement_for(group: Group) -> Agreement | None:
    """The Agreement a run on `group` checks, or None with EDGESPEC_RANK_CHECK=0 (it costs one
    small all_gather per step; the tests keep it on)."""
    return None if os.environ.get(RANK_CHECK, "1").strip() == "0" else Agreement(group)
