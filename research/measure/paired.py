"""What the paired policy A/Bs (lookup_policy_ab, review_ab) share: their prompt options and the
prompt set they build from them (short built-in prompts, then long ones from bench --context's
documents, code and chats)."""

from __future__ import annotations

import argparse
import time

from edgespec.bench.context import build_prompts, parse_lengths
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Round, Token
from edgespec.runtime import Engine
from research.measure.round_timeline import PROMPTS


def prompt_args(ap: argparse.ArgumentParser, kinds: str) -> None:
    """--short, --context, --kinds (default `kinds`), --temp, --seeds."""
    ap.add_argument("--short", type=int, default=4, help="how many short built-in prompts")
    ap.add_argument("--context", default="", help="long-context lengths, e.g. 1k,8k")
    ap.add_argument("--kinds", default=kinds)
    ap.add_argument("--temp", type=float, default=0.7)
    ap.add_argument("--seeds", type=int, default=3)


def prompt_set(engine: Engine, args: argparse.Namespace) -> list[tuple[str, list[int]]]:
    """(label, token ids) of args.short built-in prompts ("short0", ...) and of each long kind
    at each --context length ("code@8k", ...)."""
    prompts = [
        (f"short{i}", engine.encode_chat([{"role": "user", "content": p}]))
        for i, p in enumerate(PROMPTS[: args.short])
    ]
    if args.context:
        for p in build_prompts(
            args.kinds.split(","), parse_lengths(args.context), engine.encode_chat
        ):
            prompts.append((f"{p.kind}@{p.length // 1000}k", list(p.ids)))
    return prompts


def generate(
    engine: Engine, ids: list[int], hybrid: bool, temp: float, seed: int, max_tokens: int
) -> tuple[list[float], list[Round]]:
    """One answer, plain decoding or the default (`hybrid`, adaptive K): the clock at each Token
    event and the Round events."""
    spec = SpecConfig(method="hybrid" if hybrid else "none", adaptive=True)
    sampling = SamplingConfig(temperature=temp, seed=seed)
    config = GenerationConfig(sampling=sampling, spec=spec, max_tokens=max_tokens)
    times: list[float] = []
    rounds: list[Round] = []
    for event in engine.generate(ids, config):
        if isinstance(event, Token):
            times.append(time.perf_counter())
        elif isinstance(event, Round):
            rounds.append(event)
    return times, rounds
