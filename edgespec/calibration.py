"""Warm-up and cost calibration: compile the shapes a speculative loop uses before the first
request, and keep the draft and verify costs measured after the compiles for adaptive K.

A fresh engine compiles each input shape on first use (a draft step, a verify of L tokens, the
CPU backend's compiled blocks, a GPU's kernels), so its first answer timed its compiles as draft
and verify costs. `warm_up` runs short generations whose K cycles over 1..k_max twice (every
verify length 2..k_max + 1, the draft's steps, a plain step; another generation where one stops
early), times the second cycle, and returns a `Calibration`. The calibration is saved as a small JSON file per pair under
``$EDGESPEC_HOME/calibration/``, keyed by the machine, the backend and the pair (`calibration_key`):
a file whose key differs is ignored and rewritten, so a new machine, MLX version or pair starts
over. The file keeps the last SAVED timings of each cost; adaptive K is seeded with their
medians (AdaptiveK.seed), one timing each, outvoted by a request's own after a few rounds.

Example: `engine.warm_up(config)` at load; `Calibration.load(path, key)` is None for another key.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from edgespec.drafting.costs import cost_key
from edgespec.events import Round

T = TypeVar("T")
SAVED = 5  # timings kept per cost in the file
# Not a list or a count: the hybrid's n-gram lookups would draft most rounds instead of the draft.
WARM_PROMPT = "Write a short story about a lighthouse keeper and a storm."
WARM_TRIES = 4  # generations at most, until every K of the cycle was used


def calibration_key(pair: str, backend: str, versions: dict[str, str]) -> dict[str, str]:
    """What a calibration is valid for: this machine (host, CPU, cores), the backend, the pair and
    the versions that compile the kernels.

    >>> calibration_key("T + D", "Device(cpu, 0)", {"mlx": "0.30"})["pair"]
    'T + D'
    """
    machine = f"{platform.node()} {platform.machine()} {platform.processor()} {os.cpu_count()}"
    return {"machine": machine, "backend": backend, "pair": pair} | versions


def calibration_path(folder: Path, pair: str) -> Path:
    """One file per pair: `folder`/<the pair's name as a file name>.json.

    >>> calibration_path(Path("c"), "a/b + d").name
    'a_b_d.json'
    """
    return folder / (re.sub(r"[^A-Za-z0-9.-]+", "_", pair).strip("_") + ".json")


def k_cycle(k_max: int, repeats: int = 2) -> list[int]:
    """The K sequence of a warm-up: 1..k_max then a plain step, `repeats` times.

    >>> k_cycle(3)
    [1, 2, 3, 0, 1, 2, 3, 0]
    """
    return [*range(1, k_max + 1), 0] * repeats


class Cycle(Generic[T]):
    """A warm-up's policy: `items` in turn, then `rest` every round; `done` once every one was
    used (a generation that stopped early leaves the rest to the next)."""

    def __init__(self, items: list[T], rest: T) -> None:
        self.items, self.rest, self.used = items, rest, 0

    def observe(self, r: Round) -> None:
        pass

    def decide(self) -> T:
        self.used += 1
        return self.items[self.used - 1] if self.used <= len(self.items) else self.rest

    @property
    def done(self) -> bool:
        return self.used >= len(self.items)


class KCycle(Cycle[int]):
    """A warm-up's K policy: the K of k_cycle(k_max) in turn, then plain steps.

    >>> policy = KCycle(2, repeats=1)
    >>> [policy.decide() for _ in range(4)], policy.done
    ([1, 2, 0, 0], True)
    """

    def __init__(self, k_max: int, repeats: int = 2) -> None:
        super().__init__(k_cycle(k_max, repeats), 0)

    @property
    def tokens(self) -> int:
        """The most the cycle can commit: its drafts, plus one a round."""
        return sum(self.items) + len(self.items)


def round_costs(rounds: Iterable[Round]) -> tuple[dict[str, float], dict[int, float]]:
    """Seconds per drafted token per method and seconds per verify of L tokens, each the median of
    the timed chain rounds, leaving out each shape's first round (its compile), the draft time of
    a round after a plain one (its catch-up) and tree rounds (`tree_costs`').

    >>> times = [(9.0, 5.0), (0.02, 0.1), (0.04, 0.3)]  # the first: a compile
    >>> rounds = [Round(index=i, drafted=2, accepted=1, k=2, t_draft=d, t_verify=v)
    ...           for i, (d, v) in enumerate(times)]
    >>> round_costs(rounds)
    ({'draft': 0.015}, {3: 0.2})
    """
    draft: dict[str, list[float]] = {}
    verify: dict[int, list[float]] = {}
    seen: set[tuple[str, int]] = set()
    after_plain = False
    for r in rounds:
        if cost_key(r.drafted, r.k)[0] == "tree":
            after_plain = False
            continue
        shape = (r.method, r.drafted)
        first, after_plain, was_plain = shape not in seen, r.drafted == 0, after_plain
        seen.add(shape)
        if first or not r.timed:
            continue
        verify.setdefault(r.drafted + 1, []).append(r.t_verify)
        if r.drafted and not was_plain:
            draft.setdefault(r.method, []).append(r.t_draft / r.drafted)
    med = statistics.median
    return {m: med(v) for m, v in draft.items()}, {L: med(v) for L, v in verify.items()}


def tree_costs(rounds: Iterable[Round]) -> tuple[dict[int, float], dict[int, float]]:
    """The tree rounds' costs: seconds per draft forward by nodes per depth (rounded up), and
    seconds per verify of L tokens (a tree's nodes + 1), each the median of the timed rounds,
    leaving out each (L, depth)'s first round (its compile) and a draft after a plain step.

    >>> rounds = [Round(index=i, drafted=6, accepted=2, k=3, t_draft=d, t_verify=v, nodes=6)
    ...           for i, (d, v) in enumerate([(9.0, 5.0), (0.3, 0.4), (0.6, 0.6)])]
    >>> tree_costs(rounds)
    ({2: 0.15}, {7: 0.5})
    """
    draft: dict[int, list[float]] = {}
    verify: dict[int, list[float]] = {}
    seen: set[tuple[int, int]] = set()
    after_plain = False
    for r in rounds:
        was_plain, after_plain = after_plain, r.drafted == 0
        kind, width = cost_key(r.drafted, r.k)  # the tree policies' keys
        if kind != "tree":
            continue
        shape = (r.drafted + 1, r.k)
        first = shape not in seen
        seen.add(shape)
        if first or not r.timed:
            continue
        verify.setdefault(r.drafted + 1, []).append(r.t_verify)
        if not was_plain:
            draft.setdefault(width, []).append(r.t_draft / r.k)
    med = statistics.median
    return {w: med(v) for w, v in draft.items()}, {L: med(v) for L, v in verify.items()}


@dataclass(frozen=True)
class Calibration:
    """Saved cost timings for one key: per drafting method and per verify length, the latest
    SAVED seconds (oldest first); trees' apart (`tree_costs`): per draft width and per verify
    length."""

    key: dict[str, str]
    draft: dict[str, list[float]] = field(default_factory=dict)
    verify: dict[int, list[float]] = field(default_factory=dict)
    tree_draft: dict[int, list[float]] = field(default_factory=dict)
    tree_verify: dict[int, list[float]] = field(default_factory=dict)

    def add(
        self,
        draft: dict[str, float],
        verify: dict[int, float],
        tree: tuple[dict[int, float], dict[int, float]] = ({}, {}),
    ) -> Calibration:
        """A calibration with one more timing per cost (the oldest beyond SAVED dropped); `tree`:
        tree_costs' (draft, verify)."""
        return Calibration(
            self.key,
            _added(self.draft, draft),
            _added(self.verify, verify),
            _added(self.tree_draft, tree[0]),
            _added(self.tree_verify, tree[1]),
        )

    def medians(self) -> tuple[dict[str, float], dict[int, float]]:
        """(seconds per drafted token per method, seconds per verify of L): AdaptiveK.seed's."""
        return _medians(self.draft), _medians(self.verify)

    def tree_medians(self) -> tuple[dict[int, float], dict[int, float]]:
        """(seconds per tree draft forward per width, seconds per tree verify of L)."""
        return _medians(self.tree_draft), _medians(self.tree_verify)

    def to_json(self) -> dict[str, Any]:
        def keyed(d: dict[int, list[float]]) -> dict[str, list[float]]:
            return {str(n): ts for n, ts in d.items()}

        trees = {"tree_draft": keyed(self.tree_draft), "tree_verify": keyed(self.tree_verify)}
        return {"key": self.key, "draft": self.draft, "verify": keyed(self.verify)} | trees

    @classmethod
    def load(cls, path: Path, key: dict[str, str]) -> Calibration | None:
        """The calibration saved at `path` if it was measured for `key`, else None (no file, an
        unreadable one, or another machine, backend, pair or version). A file from before trees
        were kept apart has none."""

        def keyed(d: dict[str, Any]) -> dict[int, list[float]]:
            return {int(n): [float(t) for t in ts] for n, ts in d.items()}

        try:
            data = json.loads(path.read_text())
            if data["key"] != key:
                return None
            draft = {str(m): [float(t) for t in ts] for m, ts in data["draft"].items()}
            trees = keyed(data.get("tree_draft", {})), keyed(data.get("tree_verify", {}))
            return cls(key, draft, keyed(data["verify"]), *trees)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def save(self, path: Path) -> None:
        """Write the file (atomically: a reader sees the old one or the new one)."""
        from edgespec.files import atomic_write_bytes

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(self.to_json(), indent=1).encode())


def _added(saved: dict[Any, list[float]], new: dict[Any, float]) -> dict[Any, list[float]]:
    """`saved` with one more timing per key of `new`, the latest SAVED kept."""
    return saved | {n: [*saved.get(n, []), t][-SAVED:] for n, t in new.items()}


def _medians(saved: dict[Any, list[float]]) -> dict[Any, float]:
    return {n: statistics.median(ts) for n, ts in saved.items() if ts}
