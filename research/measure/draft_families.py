"""The draft's attention bound (SpecConfig.draft_window, bound.Bound) for feature and block drafts,
measured side by side in one process on seeded models (no real EAGLE or DFlash draft is at hand
offline): a `hidden`-wide llama target (tests/helpers/tiny.py) with a one-layer EAGLE draft and a
two-layer DFlash draft of the same width.

    python -m research.measure.draft_families 1024 4096 8192 --hidden 512

At each context length and for each draft, two draft states (the whole context; bounded to the
default window and sinks) get the same seeded target features of the context, then alternate
ROUNDS draft-side rounds of K = 4, as the loop runs them: the verify's features of the K + 1
positions it committed (take_features), then the next proposal (propose; an EAGLE draft: K steps,
a block draft: one forward). Printed: each state's first proposal after the prompt (its reading
of the prompt's features) and its median round, after a warm-up at 256 tokens. Then a tiny
Gemma 4 target (tests/helpers/tiny_gemma4_assistant.py, seeded, 4-bit) and its assistant, which
keeps no cache: the median of ROUNDS proposals over the target's cache of the prompt, reading
all of its full layer or (bound) its sinks and last window, alternating.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edgespec.blas import reexec_with_blas

if __name__ == "__main__":
    reexec_with_blas(sys.argv[1:], module="research.measure.draft_families")

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from edgespec.blas import active, cpu_model  # noqa: E402
from edgespec.bound import Bound  # noqa: E402
from edgespec.config import DRAFT_SINKS, DRAFT_WINDOW, SamplingConfig, SpecConfig  # noqa: E402
from edgespec.families import chain_drafter, family_of  # noqa: E402
from edgespec.runtime import Engine  # noqa: E402
from tests.helpers.block_models import write_dflash  # noqa: E402
from tests.helpers.tiny import make_tiny_eagle, make_tiny_pair  # noqa: E402
from tests.helpers.tiny_gemma4_assistant import make_assistant  # noqa: E402

K = 4
ROUNDS = 30
GREEDY = SamplingConfig(temperature=0.0)


def models(root: Path, hidden: int, context: int) -> dict[str, Engine]:
    """The EAGLE and DFlash engines over one seeded target."""
    target, _ = make_tiny_pair(root, seed=3, target_layers=2, context=context, hidden=hidden)
    eagle = make_tiny_eagle(target, root / "eagle", seed=0)
    dflash = write_dflash(target, root / "dflash", layer_ids=(0, 1), block=K + 1, width=hidden)
    return {
        name: Engine.load(target=str(target), draft=str(path))
        for name, path in (("eagle", eagle), ("dflash", dflash))
    }


def measure(engine: Engine, n: int, seed: int) -> dict[str, tuple[float, float]]:
    """{"full" / "bound": (first proposal s, median round s)} at n tokens of context."""
    rng = np.random.default_rng(seed)
    width = len(engine.draft.model.feature_layers) * engine.draft.model.args.hidden_size
    need = n + 1 + ROUNDS * (K + 1)
    tokens = [int(t) for t in rng.integers(3, engine._vocab, size=need)]
    raw = mx.array(rng.standard_normal((need, width)).astype(np.float32))
    family = family_of(engine.draft)
    spec = SpecConfig(k=K, method="draft", adaptive=False)
    states: dict[str, Any] = {}
    for name, window in (("full", 0), ("bound", DRAFT_WINDOW)):
        state = engine.new_states()[1]
        family.prepare(state, SpecConfig(draft_window=window))
        assert (state.kv.bound is None) == (window == 0)
        drafter = chain_drafter(spec, GREEDY, family, state, engine._vocab, "draft")
        drafter.take_features(tokens[: n + 1], 0, raw[:n])
        states[name] = drafter
    first: dict[str, float] = {}
    for name, drafter in states.items():
        t0 = time.perf_counter()
        mx.eval(drafter.propose(tokens[: n + 1], K, mx.random.key(0)).tokens)
        first[name] = time.perf_counter() - t0
    rounds: dict[str, list[float]] = {"full": [], "bound": []}
    order = list(states.items())
    for r in range(ROUNDS):
        at = n + r * (K + 1)  # features known: tokens[:at]; the anchor tokens[at]
        ctx = tokens[: at + K + 2]
        for name, drafter in order if r % 2 else order[::-1]:
            t0 = time.perf_counter()
            drafter.take_features(ctx, at, raw[at : at + K + 1])
            mx.eval(drafter.propose(ctx, K, mx.random.key(r)).tokens)
            rounds[name].append(time.perf_counter() - t0)
    return {name: (first[name], statistics.median(rounds[name])) for name in states}


def assistant_rounds(engine: Engine, n: int, seed: int) -> dict[str, float]:
    """{"full" / "bound": median round s} of a Gemma 4 assistant at n tokens of context: the
    target's cache holds the prompt (its prefill records the feature), and the two settings'
    proposals alternate over it (an assistant keeps no cache: only what it reads differs)."""
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(3, engine._vocab - 8, size=n)]
    target, state = engine.new_states()
    family = family_of(engine.draft)
    family.prefill(target, state, prompt, None, None, True)
    spec = SpecConfig(k=K, method="draft", adaptive=False)
    drafter = chain_drafter(spec, GREEDY, family, state, engine._vocab, "draft")
    bounds = {"full": None, "bound": Bound(DRAFT_WINDOW, DRAFT_SINKS)}
    times: dict[str, list[float]] = {"full": [], "bound": []}
    order = list(bounds.items())
    for r in range(ROUNDS):
        for name, bound in order if r % 2 else order[::-1]:
            state.kv.bound = bound
            t0 = time.perf_counter()
            proposal = drafter.propose(prompt, K, mx.random.key(r))
            assert proposal.tokens is not None
            mx.eval(proposal.tokens)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(times[name]) for name in times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("lengths", type=int, nargs="+")
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args()
    print(f"cpu: {cpu_model()} | blas: {active()} | window {DRAFT_WINDOW}, sinks {DRAFT_SINKS}")
    bound = Bound(DRAFT_WINDOW, DRAFT_SINKS)
    print(f"width {args.hidden}, K = {K}, {ROUNDS} rounds; the bound is on past {bound.start}")
    with tempfile.TemporaryDirectory() as tmp:
        engines = models(Path(tmp), args.hidden, max(args.lengths) + 2 * ROUNDS * (K + 1))
        for name, engine in engines.items():
            measure(engine, 256, seed=0)  # a warm-up: first calls pay for allocations
            for n in args.lengths:
                got = measure(engine, n, seed=n)
                (ff, fr), (bf, br) = got["full"], got["bound"]
                print(
                    f"{name} n={n}: round full {fr * 1e3:6.2f} ms, bound {br * 1e3:6.2f} ms | "
                    f"first proposal full {ff:6.3f} s, bound {bf:6.3f} s",
                    flush=True,
                )
        target, draft, _ = make_assistant(Path(tmp) / "gemma4", steps=1, length=40)
        engine = Engine.load(target=str(target), draft=str(draft))
        for n in args.lengths:
            rounds = assistant_rounds(engine, n, seed=n)
            print(
                f"assistant n={n}: round full {rounds['full'] * 1e3:6.2f} ms, "
                f"bound {rounds['bound'] * 1e3:6.2f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
