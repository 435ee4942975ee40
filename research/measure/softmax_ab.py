"""The attention's softmax in NumPy (edgespec/cpu/attention.py) against MLX's, paired in one
process: two engines on the embedded pair, one built with EDGESPEC_CPU_OPT=-numpy_softmax and one with
it on (the switch is read when an engine's CPU backend is built), plain decoding and the default
method on each, interleaved prompt by prompt (the order of the two engines alternates).

    python -m research.measure.softmax_ab --short 4 --max-tokens 128
    python -m research.measure.softmax_ab --context 4k,8k --kinds code --max-tokens 64

Prints per prompt and run: time to first token (the prefill), decode tok/s (first token to
last) and tokens; then per length and engine the default's speedup over plain, and whether
each engine's default answer equals its own plain answer (greedy, T = 0). A first short
generation on each engine warms the compiled kernels and is not counted.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

from edgespec.bench.context import build_prompts, parse_lengths
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Token
from edgespec.runtime import Engine
from research.measure.round_timeline import PROMPTS

METHODS = ("none", "hybrid")  # plain decoding; the default (hybrid drafting, adaptive K)


def engine_with(numpy_softmax: bool) -> Engine:
    before = os.environ.get("EDGESPEC_CPU_OPT")
    os.environ["EDGESPEC_CPU_OPT"] = "1" if numpy_softmax else "-numpy_softmax"
    try:
        return Engine.load()
    finally:
        os.environ.pop("EDGESPEC_CPU_OPT", None)
        if before is not None:
            os.environ["EDGESPEC_CPU_OPT"] = before


def run(engine: Engine, ids: list[int], method: str, max_tokens: int) -> tuple[float, float, list]:
    """(TTFT s, decode tok/s, tokens) of one greedy generation from a cold cache."""
    spec = SpecConfig(method=method, adaptive=True)
    config = GenerationConfig(
        sampling=SamplingConfig(temperature=0.0), spec=spec, max_tokens=max_tokens
    )
    engine.reset()
    t0 = time.perf_counter()
    times, toks = [], []
    for event in engine.generate(ids, config):
        if isinstance(event, Token):
            times.append(time.perf_counter())
            toks.append(event.id)
    rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return times[0] - t0, rate, toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--short", type=int, default=0, help="how many short built-in prompts")
    ap.add_argument("--context", default="", help="long-context lengths, e.g. 4k,8k")
    ap.add_argument("--kinds", default="code", help="long-context kinds (doc, code, chat)")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    engines = {"mlx": engine_with(False), "numpy": engine_with(True)}
    first = engines["mlx"]
    prompts = [
        (f"short{i}", first.encode_chat([{"role": "user", "content": p}]))
        for i, p in enumerate(PROMPTS)
    ]
    prompts = prompts[: args.short]
    if args.context:
        for p in build_prompts(
            args.kinds.split(","), parse_lengths(args.context), first.encode_chat
        ):
            prompts.append((f"{p.kind}@{p.length // 1000}k", list(p.ids)))
    for engine in engines.values():
        warm = first.encode_chat([{"role": "user", "content": PROMPTS[0]}])
        run(engine, warm, "hybrid", 16)
    rates: dict[tuple[str, str, str], float] = {}
    answers: dict[tuple[str, str, str], list] = defaultdict(list)
    for i, (label, ids) in enumerate(prompts):
        order = list(engines) if i % 2 == 0 else list(reversed(engines))
        for method in METHODS:
            for name in order:
                ttft, rate, toks = run(engines[name], ids, method, args.max_tokens)
                key = (label, name, method)
                rates[key] = rate
                answers[key] = toks
                print(
                    f"{label:10s} {len(ids):6d} tok  {name:5s} {method:6s}  TTFT {ttft:7.2f} s"
                    f"  {rate:6.2f} tok/s  {len(toks)} tokens",
                    flush=True,
                )
    for label, _ in prompts:
        cells = []
        for name in engines:
            plain, spec = rates[(label, name, "none")], rates[(label, name, "hybrid")]
            same = answers[(label, name, "none")] == answers[(label, name, "hybrid")]
            cells.append(f"{name}: default/plain {spec / plain:.3f} (same answer: {same})")
        agree = answers[(label, "mlx", "none")] == answers[(label, "numpy", "none")]
        print(f"{label:10s} " + "  ".join(cells) + f"  plain answers agree: {agree}")


if __name__ == "__main__":
    main()
