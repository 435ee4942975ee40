"""`edgespec tree-bench`: chains against draft trees side by side in one run (edgespec/bench/tree.py).

edgespec tree-bench --depth 4 --trees 3,2,1,1 dynamic --max-tokens 64
edgespec tree-bench --prompts question.jsonl --limit 2
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgespec.commands.common import add_model_args, add_sampling_args, sampling_from_args
from edgespec.config import parse_tree_spec
from edgespec.loading.specs import check_pair

HELP = (
    "Measure tau (tokens per round) and tokens/s of the chain loop against draft trees at the same "
    "depth, plus adaptive K and adaptive shapes, on every prompt in turn; check greedy output "
    "against plain decoding and the tree closed form against the measured tau."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser, kv_bits=False)
    add_sampling_args(parser)
    parser.add_argument("--depth", type=int, default=4, help="draft forwards per round (K)")
    parser.add_argument(
        "--trees", nargs="+", default=["3,2,1,1", "dynamic"], help="tree shapes (as --tree)"
    )
    parser.add_argument("--prompts", help="a Spec-Bench style question.jsonl (default: built-in)")
    parser.add_argument("--categories", help="comma-separated categories to keep")
    parser.add_argument("--limit", type=int, help="at most N prompts per category")
    parser.add_argument("--max-tokens", type=int, default=64, help="new tokens per run")
    parser.add_argument("--no-adaptive", action="store_true", help="skip the adaptive variants")
    parser.add_argument("--json", type=Path, help="also write the runs and summary here")


def _table(summaries, chain_tau: float | None, plain_tps: float | None) -> list[str]:
    head = (
        f"{'method':<18}{'tau':>7}{'x chain':>9}{'closed form':>13}{'tok/s':>8}{'speedup':>9}"
        f"{'CPU ms/tok':>12}{'greedy same':>13}"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        ratio = f"{s.tau / chain_tau:.2f}" if chain_tau and s.variant != "plain" else "-"
        pred = f"{s.predicted:.2f}" if s.predicted is not None else "-"
        speed = f"{s.tokens_per_s / plain_tps:.2f}" if plain_tps else "-"
        same = f"{s.identical}/{s.prompts}"
        lines.append(
            f"{s.variant:<18}{s.tau:>7.2f}{ratio:>9}{pred:>13}{s.tokens_per_s:>8.2f}{speed:>9}"
            f"{s.cpu_ms_per_token:>12.1f}{same:>13}"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    from edgespec.bench.prompts import encode_prompts, load_prompts
    from edgespec.config import SpecConfig

    trees = [parse_tree_spec(t) for t in args.trees]
    SpecConfig(k=args.depth)  # the usual checks and message
    sampling = sampling_from_args(args)
    categories = args.categories.split(",") if args.categories else None
    prompts = load_prompts(args.prompts, categories, args.limit)
    check_pair(args.target, args.draft, args.pair)  # an unknown model: before the imports
    from edgespec.bench.tree import iter_runs, summarise, variants
    from edgespec.runtime import Engine

    engine = Engine.load(args.target, args.draft, args.pair, draft_bits=args.draft_bits or None)
    encoded, skipped = encode_prompts(engine, prompts, args.max_tokens)
    block = engine.family.blocks
    plan = variants(args.depth, trees, adaptive=not args.no_adaptive, block=block)
    print(
        f"{engine.name}: {len(encoded)} prompts x {len(plan)} variants, depth {args.depth}, "
        f"{args.max_tokens} tokens, temperature {sampling.temperature}",
        file=sys.stderr,
    )
    for warm in plan:  # first-use compiles (kernels, traced blocks) outside the measured runs
        next(iter_runs(engine, dict(list(encoded.items())[:1]), [warm], sampling, 8))
    runs = []
    for r in iter_runs(engine, encoded, plan, sampling, args.max_tokens):
        runs.append(r)
        print(
            f"  {r.prompt_id:>6} {r.variant:<16} tau {r.tau:.2f}  {r.tokens_per_s:6.2f} tok/s",
            file=sys.stderr,
            flush=True,
        )
    summaries = summarise(runs, sampling.greedy)
    by = {s.variant: s for s in summaries}
    chain = by.get("chain")
    plain = by.get("plain")
    for line in _table(
        summaries, chain.tau if chain else None, plain.tokens_per_s if plain else None
    ):
        print(line)
    if skipped:
        print(f"skipped {len(skipped)} prompts that do not fit the context window", file=sys.stderr)
    if args.json:
        out = {
            "summary": [vars(s) for s in summaries],
            "runs": [
                {
                    "variant": r.variant,
                    "prompt": r.prompt_id,
                    "tokens": len(r.tokens),
                    "rounds": r.rounds,
                    "tokens_per_s": r.tokens_per_s,
                    "cpu_seconds": r.cpu_seconds,
                }
                for r in runs
            ],
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0
