"""Tiny 4-bit folders of every architecture family (tests/helpers/tiny_arch.py), written once
per test session and loaded once per family; helpers shared by the per-architecture tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from scipy.stats import kstest

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Finished, Token
from edgespec.loading.load import LoadedModel, load_model
from edgespec.runtime import Engine
from edgespec.sampling import warp
from tests.helpers.tiny_arch import make_family

PROMPT = "the cat and the dog in the house"


class Families:
    """Family name -> (target, draft) LoadedModels, made on first use. The draft is the family's
    own subset draft; `self_draft(f)` is the target again (every draft accepted at T=0)."""

    def __init__(self, root: Path):
        self.root = root
        self.loaded: dict[str, tuple[LoadedModel, LoadedModel]] = {}

    def paths(self, family: str) -> tuple[Path, Path]:
        folder = self.root / family
        if not (folder / "draft" / "config.json").is_file():
            make_family(folder, family)
        return folder / "target", folder / "draft"

    def pair(self, family: str) -> tuple[LoadedModel, LoadedModel]:
        if family not in self.loaded:
            t, d = self.paths(family)
            self.loaded[family] = (load_model(str(t)), load_model(str(d)))
        return self.loaded[family]

    def engine(self, family: str, draft: str = "subset") -> Engine:
        target, subset = self.pair(family)
        return Engine(target, target if draft == "self" else subset)


def generate(engine: Engine, ids: list[int], spec: SpecConfig, n: int, **sampling: Any):
    """(token ids, Finished) of one generation."""
    config = GenerationConfig(SamplingConfig(**sampling), spec, max_tokens=n)
    events = list(engine.generate(ids, config))
    return [e.id for e in events if isinstance(e, Token)], events[-1]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return (
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if a != b
        else None
    )


def pit_values(
    engine: Engine, ids: list[int], tokens: list[int], sampling: SamplingConfig, rng
) -> np.ndarray:
    """Randomised probability integral transform of a sampled answer: for each token x_t, with
    the target's p_t = warp(logits at t) from one cache-free forward over prompt + answer and the
    tokens ranked by p_t (most likely first), u_t = P_t(ranked before x_t) + v_t p_t(x_t), v_t
    uniform. If every x_t was drawn from p_t, the u_t are independent and uniform on [0, 1]
    (whatever the history); a token drawn from another distribution shifts them.

    Worked example: p = [0.5, 0.3, 0.2] and x = token 1: ranked before it is token 0 (0.5), so
    u = 0.5 + 0.3 v, uniform on [0.5, 0.8]: over x ~ p, u covers [0, 1] evenly."""
    seq = mx.array(ids + tokens[:-1])[None]
    logits = engine.target.model(seq)[0, len(ids) - 1 :]
    p = np.array(warp(logits, sampling).astype(mx.float32), dtype=np.float64)
    out = []
    for row, x in zip(p, tokens, strict=True):
        tied = row[:x]  # equal probabilities: the smaller id ranks first
        before = row[row > row[x]].sum() + tied[tied == row[x]].sum()
        out.append(before + rng.uniform() * row[x])
    return np.array(out)


def sampled_p_value(
    engine: Engine, spec: SpecConfig, seeds: range, n: int, temperature: float = 1.0
) -> tuple[float, float]:
    """KS p-value of the PIT values (pit_values) of answers sampled with `spec`, one per seed,
    against the uniform distribution; and the mean tokens per round (tau)."""
    ids = engine.encode_raw(PROMPT)
    rng = np.random.default_rng(1234)
    values, taus = [], []
    for seed in seeds:
        sampling = SamplingConfig(temperature=temperature, seed=seed)
        tokens, fin = generate(engine, ids, spec, n, temperature=temperature, seed=seed)
        assert isinstance(fin, Finished) and len(tokens) == n
        values.append(pit_values(engine, ids, tokens, sampling, rng))
        taus.append(fin.stats.tau)
    return float(kstest(np.concatenate(values), "uniform").pvalue), float(np.mean(taus))
