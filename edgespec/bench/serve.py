"""What the server costs, side by side in one run (a benchmark, not a test):

    python -m edgespec.bench.serve [--pair NAME | --target T --draft D] [--per-category N]
                                   [--max-tokens M] [-k K] [--method M] [--no-adaptive]

1. Overhead: the same prompts at T=0, alternately generated in this process (Engine.chat, caches
   reset first) and through `edgespec serve --cache-slots 0` (a subprocess, the official openai
   client, streaming), so both sides prefill every prompt whole. Tokens/s = answer tokens / time
   from the request to the last token. Both sides must give the same text (checked).
   The same requests also split the server's time: the engine's own (TTFT + decode time, from
   `usage.speculation`) against the client's wall time, request to last token; the rest is the
   server's overhead, measured within each request, so it holds on a noisy machine too.
2. Second-turn time to first token: turn one, then turn two (turn one + its answer + a follow-up)
   on a server with the prefix cache (the default pool), against turn two on the server without.
3. With --sweep 1,2,4,8 (instead of 1 and 2): N clients at once, for EdgeSpec batched (serve's
   default --max-batch, or --max-batch M), EdgeSpec one request at a time and mlx_lm.server
   without a draft (edgespec/bench/concurrency.py); --sweep-runs R runs each level R times on
   questions not asked before, and pools them.

Prompts: the project's own set (edgespec/data/bench_prompts.jsonl) unless --prompts names one.
Only `main` prints; the measuring functions return records.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.bench.concurrency import stream_chat
from edgespec.bench.prompts import DEFAULT_PROMPTS, load_prompts
from edgespec.blas import reexec_with_blas
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.errors import EdgeSpecError

# This module imports no MLX at load time, so that main() can first re-execute with the optimised
# BLAS preloaded (the server subprocess inherits it): both sides must run on the same BLAS.
FOLLOW_UP = "Now summarise your answer in one sentence."


@dataclass(frozen=True)
class Timed:
    """One answer: tokens, seconds from request to last token, to first token, its text."""

    tokens: int
    seconds: float
    ttft: float
    text: str
    prefilled: int = 0
    prompt_tokens: int = 0
    engine_s: float = 0.0  # through the server: the engine's own time (its TTFT + decode time)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


Turns = list[tuple[list[dict[str, str]], Timed]]  # (the second turn's messages, its answer)


def in_process(engine: Any, question: str, config: GenerationConfig) -> Timed:
    """Engine.chat on a cold cache, timed from the call to the Finished event."""
    from edgespec.events import Finished, Token

    engine.reset()
    t0 = time.perf_counter()
    first, count, text = None, 0, ""
    for event in engine.chat([{"role": "user", "content": question}], config):
        if isinstance(event, Token):
            count += 1
            first = first if first is not None else time.perf_counter() - t0
        elif isinstance(event, Finished):
            text = event.text
    return Timed(count, time.perf_counter() - t0, first or 0.0, text)


def through_server(
    client: Any, model: str, messages: list[dict[str, str]], max_tokens: int
) -> Timed:
    """A streamed chat completion at T=0, timed from the request to the last chunk."""
    t0 = time.perf_counter()
    first, seconds, parts, usage = stream_chat(client, model, messages, max_tokens, t0)
    tokens = usage.completion_tokens if usage else 0
    prompt = usage.prompt_tokens if usage else 0
    extra = usage.model_extra if usage else {}
    prefilled = extra.get("prefilled_tokens", prompt)
    spec = extra.get("speculation", {})
    engine_s = spec.get("ttft_s", 0.0) + spec.get("decode_s", 0.0)
    return Timed(tokens, seconds, first or seconds, "".join(parts), prefilled, prompt, engine_s)


def overhead(
    engine: Any, client: Any, model: str, questions: Sequence[str], config: GenerationConfig
) -> Iterator[tuple[Timed, Timed]]:
    """(in-process, server) per question, alternating, after one untimed warm-up of each."""
    in_process(engine, questions[0], config)
    msgs = [[{"role": "user", "content": q}] for q in questions]
    through_server(client, model, msgs[0], config.max_tokens)
    for q, m in zip(questions, msgs, strict=True):
        yield in_process(engine, q, config), through_server(client, model, m, config.max_tokens)


def second_turns(client: Any, model: str, questions: Sequence[str], max_tokens: int) -> Turns:
    """Turn one for each question, then its turn two right after (the cache holds turn one)."""
    out = []
    for q in questions:
        first = [{"role": "user", "content": q}]
        answer = through_server(client, model, first, max_tokens).text
        turn = [*first, {"role": "assistant", "content": answer}, user(FOLLOW_UP)]
        out.append((turn, through_server(client, model, turn, 8)))
    return out


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _ratio(pairs: list[tuple[Timed, Timed]]) -> tuple[float, float]:
    local = sum(a.tokens for a, _ in pairs) / sum(a.seconds for a, _ in pairs)
    served = sum(b.tokens for _, b in pairs) / sum(b.seconds for _, b in pairs)
    return local, served


def _client(base: str) -> Any:
    import openai

    return openai.OpenAI(base_url=base, api_key="none", timeout=600, max_retries=0)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    """The options both sides share (the models and how they speculate); the rest of the
    server's options keep their defaults, which is what a user gets."""
    parser = argparse.ArgumentParser(
        prog="python -m edgespec.bench.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pair", help="a named pair (default: the embedded pair)")
    parser.add_argument("--target", help="target model (as in edgespec generate)")
    parser.add_argument("--draft", help="draft model (as in edgespec generate)")
    parser.add_argument("--draft-bits", type=int, default=4, help="as in generate (default 4)")
    parser.add_argument("--dtype", default="auto", help="as in generate (default auto)")
    parser.add_argument("-k", "--k", type=int, default=4, help="draft tokens per round (default 4)")
    parser.add_argument(
        "--method",
        default="hybrid",
        choices=("draft", "ngram", "hybrid", "none", "block", "block-tree"),
        help="who drafts (default hybrid, as serve's default; none: plain decoding)",
    )
    parser.add_argument(
        "--adaptive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="adaptive K (default on, as serve's default)",
    )
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="a JSONL prompt set")
    parser.add_argument(
        "--per-category", type=int, default=None, help="first N prompts of each category only"
    )
    parser.add_argument("--max-tokens", type=int, default=128, help="answer length (default 128)")
    parser.add_argument(
        "--sweep",
        help="comma-separated client counts, e.g. 1,2,4,8: the concurrency sweep instead",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="the sweep's batched server's --max-batch (default: serve's own default)",
    )
    parser.add_argument(
        "--sweep-runs",
        type=int,
        default=1,
        help="the sweep's levels that many times each, on questions not asked before (pooled)",
    )
    return parser.parse_args(argv)


def _server_args(args: argparse.Namespace) -> list[str]:
    out = []
    for name in ("pair", "target", "draft"):
        if getattr(args, name):
            out += [f"--{name}", getattr(args, name)]
    out += ["--draft-bits", str(args.draft_bits), "--dtype", args.dtype, "-k", str(args.k)]
    out += ["--adaptive" if args.adaptive else "--no-adaptive"]
    return out + (["--no-spec"] if args.method == "none" else ["--method", args.method])


def main(argv: Sequence[str] | None = None) -> int:
    reexec_with_blas(list(sys.argv[1:] if argv is None else argv), module="edgespec.bench.serve")
    args = _arguments(argv)
    try:
        if args.sweep:
            _sweep(args)
        else:
            _report(*_measure(args))
    except EdgeSpecError as exc:  # bad options, a missing model or prompt file: one line
        print(f"python -m edgespec.bench.serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _measure(args: argparse.Namespace) -> tuple[list[tuple[Timed, Timed]], Turns, Turns]:
    """Both measurements: (in-process, server) pairs, then second turns without and with the
    prefix cache. Prints each prompt's pair as it comes."""
    import edgespec.blas as blas
    from edgespec.runtime import Engine
    from edgespec.server.process import ServerProcess

    spec = SpecConfig(
        k=args.k, method=args.method, adaptive=args.adaptive, k_max=max(SpecConfig.k_max, args.k)
    )
    config = GenerationConfig(SamplingConfig(temperature=0), spec, args.max_tokens)
    questions = [p.text for p in load_prompts(args.prompts, limit=args.per_category)]
    engine = Engine.load(
        args.target, args.draft, args.pair, draft_bits=args.draft_bits, dtype=args.dtype
    )
    print(
        f"{engine.name}: {len(questions)} prompts, {args.max_tokens} tokens, T=0, BLAS "
        f"{blas.active()} (both sides)",
        flush=True,
    )
    cold = ServerProcess(*_server_args(args), "--cache-slots", "0")
    try:
        model = _model_of(cold)
        pairs = _rows(overhead(engine, _client(cold.base), model, questions, config))
        without = second_turns(_client(cold.base), model, questions, args.max_tokens)
    finally:
        cold.terminate()
    warm = ServerProcess(*_server_args(args))
    try:
        with_cache = second_turns(_client(warm.base), _model_of(warm), questions, args.max_tokens)
    finally:
        warm.terminate()
    return pairs, without, with_cache


def _sweep(args: argparse.Namespace) -> None:
    import edgespec.blas as blas
    from edgespec.bench import concurrency
    from edgespec.server.process import ServerProcess

    try:
        ns = [int(n) for n in args.sweep.split(",")]
    except ValueError:
        raise EdgeSpecError(
            f"--sweep takes client counts like 1,2,4,8, got {args.sweep!r}"
        ) from None
    questions = [p.text for p in load_prompts(args.prompts, limit=args.per_category)]
    asked = sum(ns) * args.sweep_runs
    if args.sweep_runs < 1 or asked > len(questions):
        raise EdgeSpecError(
            f"--sweep {args.sweep} --sweep-runs {args.sweep_runs} asks {asked} questions; the "
            f"prompt set has {len(questions)} (a question asked twice is answered from the cache)"
        )
    target = concurrency.target_folder(args.target, args.pair)
    print(
        f"{target.name}: {len(questions)} prompts, {args.max_tokens} tokens, T=0, BLAS "
        f"{blas.active()} (all servers)",
        flush=True,
    )
    levels = concurrency.run_sweep(
        lambda *extra: ServerProcess(*_server_args(args), *extra),
        target,
        questions,
        ns,
        args.max_tokens,
        _client,
        () if args.max_batch is None else ("--max-batch", str(args.max_batch)),
        args.sweep_runs,
    )
    concurrency.report(levels)


def _model_of(srv: Any) -> str:
    return str(_client(srv.base).models.list().data[0].id)


def _rows(measured: Iterator[tuple[Timed, Timed]]) -> list[tuple[Timed, Timed]]:
    """Print each prompt's pair of figures as it comes; return them all."""
    print(f"{'prompt':>6} {'tokens':>6} {'in-process tok/s':>17} {'server tok/s':>13} same text")
    pairs = []
    for a, b in measured:
        pairs.append((a, b))
        same = "yes" if a.text == b.text else "NO"
        n, local, served = len(pairs) - 1, a.tokens_per_s, b.tokens_per_s
        print(f"{n:>6} {a.tokens:>6} {local:>17.2f} {served:>13.2f} {same:>9}", flush=True)
    return pairs


def _report(
    pairs: list[tuple[Timed, Timed]],
    without: Turns,
    with_cache: Turns,
) -> None:
    local, served = _ratio(pairs)
    print(
        f"overall: in-process {local:.2f} tok/s, server {served:.2f} tok/s, "
        f"overhead {100 * (1 - served / local):.1f}% of tokens/s"
    )
    inside = sum(b.engine_s for _, b in pairs) / sum(b.seconds for _, b in pairs)
    outside = [b.seconds - b.engine_s for _, b in pairs]
    per_token = sum(outside) / sum(b.tokens for _, b in pairs)
    print(
        f"within each server request: the engine's own time is {100 * inside:.1f}% of the "
        f"client's, so HTTP, tokenizing, queueing and streaming cost {100 * (1 - inside):.1f}% "
        f"(median {1000 * statistics.median(outside):.0f} ms a request, "
        f"{1000 * per_token:.2f} ms a token)"
    )
    diff = sum(a.text != b.text for a, b in pairs)
    print(f"answers that differ in-process vs server: {diff} of {len(pairs)}")
    same = sum(a == b for (a, _), (b, _) in zip(without, with_cache, strict=True))
    print(f"second turns with the same prompt on both servers: {same} of {len(without)}")
    ttft_off = [t.ttft for _, t in without]
    ttft_on = [t.ttft for _, t in with_cache]
    pre_off = statistics.mean(t.prefilled for _, t in without)
    pre_on = statistics.mean(t.prefilled for _, t in with_cache)
    prompt = statistics.mean(t.prompt_tokens for _, t in with_cache)
    print(
        f"second-turn TTFT, median: without cache {1000 * statistics.median(ttft_off):.0f} ms "
        f"(prefilled {pre_off:.0f} of {prompt:.0f} prompt tokens), with cache "
        f"{1000 * statistics.median(ttft_on):.0f} ms (prefilled {pre_on:.0f}); "
        f"{statistics.median(ttft_off) / statistics.median(ttft_on):.2f}x faster"
    )


if __name__ == "__main__":
    sys.exit(main())
