"""`edgespec bench`: measure plain vs speculative decoding (and mlx-lm) on this machine."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from edgespec.bench.context import ContextRequest, context_request, engine_prompts
from edgespec.bench.plan import DEFAULT_METHODS, USES_K, BenchPlan
from edgespec.bench.prompts import DEFAULT_PROMPTS, default_prompt_file, load_prompts
from edgespec.commands.common import add_model_args, add_shard_args, add_think_arg, apply_think
from edgespec.errors import ConfigError, PromptError
from edgespec.loading.specs import check_pair

if TYPE_CHECKING:
    from edgespec.bench.records import RunRecord

HELP = (
    "Measure decode throughput of plain decoding, EdgeSpec's speculative decoding and mlx-lm's, "
    "on the same prompts and settings, interleaved; write results.json, results.md and plots. "
    "Ctrl-C stops and still writes what was measured."
)
T = TypeVar("T")
# The long-context mode's warm-up prompt: short, so that warming up prefills nothing long.
WARM_PROMPT = "Name three uses of a sliding-window cache."


def _list_of(kind: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    """argparse type for comma-separated values: '2,4' -> (2, 4)."""

    def parse(text: str) -> tuple[T, ...]:
        try:
            items = tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from None
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        return items

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    g = parser.add_argument_group("bench")
    g.add_argument(
        "--prompts",
        help="Spec-Bench style question.jsonl (default: built-in set; text to continue for a base model)",
    )
    g.add_argument("--categories", type=_list_of(str), help="e.g. writing,coding or mt-bench")
    g.add_argument("--limit", type=int, help="at most N prompts per category")
    g.add_argument("--max-tokens", type=int, default=128, help="new tokens per run (default 128)")
    g.add_argument("-k", "--k", type=_list_of(int), default=(4,), help="K list (default 4)")
    g.add_argument("--temp", type=_list_of(float), default=(0.0,), help="temperatures (0)")
    g.add_argument(
        "--methods",
        type=_list_of(str),
        default=DEFAULT_METHODS,
        help=f"from {', '.join(USES_K)} (default {','.join(DEFAULT_METHODS)})",
    )
    g.add_argument(
        "--peer-draft",
        help="token draft for the mlx-lm method (default: the pair's draft, or the pair's token "
        "draft when its own is a feature draft, which mlx-lm cannot run)",
    )
    g.add_argument("--repeats", type=int, default=1, help="runs of each prompt (default 1)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    g.add_argument("--out", help="output folder (default ./bench-out/<timestamp>)")
    g.add_argument("--no-warmup", action="store_true", help="skip the warm-up runs")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    g.add_argument(
        "--context",
        metavar="LENGTHS",
        help="long-context mode: built-in long prompts cut to these token counts, e.g. 1k,4k,8k "
        "(k = 1000); TTFT timed once per method and prompt, decode runs from the prefilled cache",
    )
    g.add_argument(
        "--context-kinds",
        default="doc,code,chat",
        help="long prompts per length: doc (documentation to summarize), code (the package's "
        "source to explain), chat (a long conversation); default doc,code,chat",
    )
    g.add_argument(
        "--context-file",
        metavar="PATH",
        help="long-context mode on this UTF-8 text instead of the built-in prompts (cut to each "
        "--context length, or whole without --context)",
    )
    g.add_argument(
        "--by-position",
        type=int,
        metavar="N",
        help="acceptance and tokens per round per N answer tokens (default 256 when "
        "--max-tokens >= 512, else off; 0: off)",
    )
    g.add_argument(
        "--cold",
        action="store_true",
        help="each prompt's first answer in fresh processes: cold, warmed up, and in the chat app "
        "(headless); methods plain,adaptive-hybrid unless --methods (edgespec/bench/cold.py)",
    )
    add_think_arg(g)
    add_shard_args(g)


def _plan(args: argparse.Namespace) -> BenchPlan:
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    width = args.by_position
    if width is None:
        width = POSITION_WIDTH if args.max_tokens >= AUTO_POSITIONS else 0
    return BenchPlan(
        methods=tuple(dict.fromkeys(args.methods)),
        ks=tuple(dict.fromkeys(args.k)),
        temps=tuple(dict.fromkeys(args.temp)),
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        seed=args.seed,
        warmup_tokens=0 if args.no_warmup else 16,
        position_width=width,
    )


# Answers this long or longer get acceptance by position (--by-position) unless told otherwise.
AUTO_POSITIONS = 512
POSITION_WIDTH = 256


def _measure(runs: Iterator[RunRecord], total: int, quiet: bool) -> tuple:
    """Run the bench under a progress bar; Ctrl-C ends it early. Returns (records, complete)."""
    from tqdm import tqdm

    records: list[RunRecord] = []
    bar = tqdm(total=total, file=sys.stderr, unit="run", disable=quiet, dynamic_ncols=True)
    try:
        for rec in runs:
            records.append(rec)
            bar.set_postfix_str(f"{rec.method} {rec.tokens_per_s:.1f} tok/s", refresh=False)
            bar.update()
    except KeyboardInterrupt:
        bar.write("edgespec bench: stopped; writing what was measured", file=sys.stderr)
        return records, False
    finally:
        bar.close()
    return records, True


# Under mlx.launch (a sharded target) when --methods is not given: adaptive K cannot run there
# (edgespec.distributed.group.check_config), and mlx-lm's own plain decoding is the peer.
GROUP_METHODS = ("plain", "spec", "mlx-lm-plain")


def _group_plan(args: argparse.Namespace, group: Any) -> None:
    """Under a group of several ranks: the default methods become GROUP_METHODS; adaptive ones
    are refused (ConfigError) before anything loads."""
    if group is None or group.size <= 1:
        return
    if args.methods is DEFAULT_METHODS:
        args.methods = GROUP_METHODS
    adaptive = [m for m in args.methods if m.startswith("adaptive")]
    if adaptive:
        raise ConfigError(
            f"{', '.join(adaptive)}: adaptive K chooses from each rank's own timings, which "
            "differ between ranks; with a sharded target bench fixed K (spec, hybrid, ngram)"
        )
    args.quiet = args.quiet or not group.is_primary


def _kv_plan(args: argparse.Namespace) -> None:
    """With --kv-bits: the default methods run without mlx-lm's (it keeps its own full-precision
    caches, so its output would differ from plain's); mlx-lm's and draft trees (which need
    full-precision caches) are refused when asked for (ConfigError) before anything loads."""
    if not args.kv_bits:
        return
    if args.methods is DEFAULT_METHODS:
        args.methods = tuple(m for m in DEFAULT_METHODS if not m.startswith("mlx-lm"))
    refused = [m for m in args.methods if m.startswith("mlx-lm") or "tree" in m.split("-")]
    if refused:
        raise ConfigError(
            f"--kv-bits: {', '.join(refused)} cannot run on quantized KV caches; drop them or --kv-bits"
        )


def run(args: argparse.Namespace) -> int:
    from edgespec.distributed.group import init_group

    group = init_group()  # None unless mlx.launch started this process
    _group_plan(args, group)
    _kv_plan(args)
    plan = _plan(args)
    context = context_request(args)
    if not context and args.prompts is None:  # a base model continues text (bench/prompts.py)
        chosen = default_prompt_file(args.target, args.draft, args.pair)
        args.prompts = None if chosen == DEFAULT_PROMPTS else str(chosen)
    prompts = [] if context else load_prompts(args.prompts, args.categories, args.limit)
    out = Path(args.out or Path("bench-out") / time.strftime("%Y%m%d-%H%M%S"))
    primary = group is None or group.is_primary  # rank 0 alone writes; the others follow
    created = _writable_folder(out) if primary else False
    try:
        if args.cold:
            return _run_cold(args, prompts, out)
        check_pair(args.target, args.draft, args.pair)  # an unknown model: before the imports
        from edgespec.bench.methods import one_stream  # mlx-lm: after the settings are checked

        with one_stream():  # EdgeSpec's runs and mlx-lm's on one thread (methods.one_stream)
            return _run(args, plan, prompts, out, group, context)
    except BaseException:
        if created:  # a run that ends before writing leaves no empty folder behind
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def _writable_folder(out: Path) -> bool:
    """Create `out` now and check that a file can be written in it, so a bad --out fails before the
    models load, not after the measurements. True when this created the folder."""
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write the results to {out}: {exc.strerror or exc}") from None
    return created


def _run_cold(args: argparse.Namespace, prompts: list, out: Path) -> int:
    from edgespec.bench import cold

    methods = cold.DEFAULT_COLD if args.methods is DEFAULT_METHODS else args.methods
    model = {"target": args.target, "draft": args.draft, "pair": args.pair}
    model |= {"draft_bits": args.draft_bits, "dtype": args.dtype, "kv_bits": args.kv_bits}
    settings = {"max_tokens": args.max_tokens, "k": args.k[0], "temp": args.temp[0]}
    settings["think"] = args.think
    jobs = cold.plan_jobs(model, prompts, cold.check_cold_methods(methods), **settings)
    print(cold.format_summary(cold.run_cold(jobs, out, args.quiet)))
    print(f"\nwrote {out / 'cold.json'}")
    return 0


def _token_side(engine: Any, plan: BenchPlan) -> bool:
    """Whether the token-draft methods of `plan` should run on the pair's token draft: the
    engine's own draft is a block draft (which drafts as a block whatever the method)."""
    from edgespec.bench.plan import TOKEN_METHODS
    from edgespec.families import family_of

    draft = engine.draft if engine.has_draft else None
    return any(m in TOKEN_METHODS for m in plan.methods) and family_of(draft).blocks


def _warm_up(engine: Any, plan: BenchPlan, first: list[int], long: bool, quiet: bool) -> None:
    """Warm every variant up on the first prompt, or on a short one in the long-context mode (a
    long prompt would prefill once per method just to warm up)."""
    from edgespec.bench.runner import warm_up

    if not quiet:
        print("edgespec bench: warming up", file=sys.stderr)
    short = engine.encode_chat([{"role": "user", "content": WARM_PROMPT}]) if long else first
    warm_up(engine, short, plan)


def _settings(
    args: argparse.Namespace,
    plan: BenchPlan,
    n_prompts: int,
    context: ContextRequest | None,
    long: list,
) -> dict[str, Any]:
    """results.json's `settings`: what was asked for and measured."""
    return {
        "methods": list(plan.methods),
        "k": list(plan.ks),
        "temp": list(plan.temps),
        "max_tokens": plan.max_tokens,
        "repeats": plan.repeats,
        "seed": plan.seed,
        "dtype": args.dtype,
        "prompts": str(args.prompts or "built-in"),
        "categories": list(args.categories or []),
        "limit": args.limit,
        "n_prompts": n_prompts,
        "warmup": bool(plan.warmup_tokens),
        "position_width": plan.position_width,
        "context": list(context.lengths or [len(p.ids) for p in long]) if context else [],
        "context_kinds": sorted({p.kind for p in long}),
        "context_file": context.file if context else None,
        "context_prompt_tokens": {p.id: len(p.ids) for p in long},
    }


def _run(
    args: argparse.Namespace,
    plan: BenchPlan,
    prompts: list,
    out: Path,
    group: Any,
    context: ContextRequest | None = None,
) -> int:
    from edgespec.bench.greedy import compare_greedy
    from edgespec.bench.methods import set_peer_draft, set_token_engine
    from edgespec.bench.prompts import encode_prompts
    from edgespec.bench.runner import (
        BenchResult,
        check_methods,
        environment,
        iter_bench,
        iter_context_bench,
        pair_info,
        refused_methods,
    )
    from edgespec.distributed.probe import probe
    from edgespec.loading.load import load_token_draft, peer_draft_spec
    from edgespec.runtime import Engine

    engine = Engine.load(
        args.target,
        args.draft,
        args.pair,
        draft_bits=args.draft_bits,
        dtype=args.dtype,
        kv_bits=args.kv_bits,
        group=group,
        shard=args.shard,
    )
    _think(engine, args.think, group)
    peer = args.peer_draft or peer_draft_spec(args.target, args.draft, args.pair)
    token_side = _token_side(engine, plan) and group is None
    if peer is not None and ("mlx-lm" in plan.methods or token_side):
        draft = load_token_draft(peer, engine.target, draft_bits=args.draft_bits, dtype=args.dtype)
        set_peer_draft(engine, draft)
        if token_side:  # the block draft's methods and the token draft's, side by side
            set_token_engine(engine, Engine(engine.target, draft, engine.kv_bits))
    check_methods(engine, plan)
    refused = refused_methods(engine, plan)
    if refused:
        gone = {r["method"] for r in refused}
        plan = dataclasses.replace(plan, methods=tuple(m for m in plan.methods if m not in gone))
        for r in refused:
            print(f"edgespec bench: {r['method']} left out: {r['reason']}", file=sys.stderr)
    long = engine_prompts(engine, context, plan.max_tokens) if context else []
    skipped: list[dict[str, str]] = []
    if context:
        encoded = {p.id: list(p.ids) for p in long}
    else:
        encoded, skipped = encode_prompts(engine, prompts, plan.max_tokens)
    if not encoded:
        raise PromptError(f"no prompt fits the context window: {skipped[0]['reason']}")
    if plan.warmup_tokens:
        _warm_up(engine, plan, next(iter(encoded.values())), bool(context), args.quiet)
    lengths = tuple(sorted({1, *(k + 1 for k in plan.ks)}))
    # the target as the Engine runs it (its CPU backend's twin); every rank, in step
    latency = probe(engine.backend.model(engine.target.model), group, args.shard, lengths)
    if context:
        runs = iter_context_bench(engine, long, plan)
        total = plan.total_runs(len(long))
    else:
        runs, total = iter_bench(engine, prompts, encoded, plan), plan.total_runs(len(encoded))
    records, complete = _measure(runs, total, args.quiet)
    records, notes = compare_greedy(engine, records, encoded)
    if group is not None and not group.is_primary:
        return 0 if complete else 130
    settings = _settings(args, plan, len(encoded), context, long)
    settings["thinking"] = engine.thinking_mode()  # None: the template has no thinking mode
    env = environment(engine) | {"distributed": latency.to_json()}  # group size 1 when not launched
    result = BenchResult(
        records, notes, skipped, settings, pair_info(engine), env, complete, refused
    )
    _report(result, out, bool(context))
    return 0 if complete else 130


def _think(engine: Any, think: bool | None, group: Any) -> None:
    """--think / --no-think on the loaded engine (every method's prompts, mlx-lm's too, are
    encoded with it); rank 0 says so where the template has no thinking mode."""
    note = apply_think(engine, think)
    if note and (group is None or group.is_primary):
        print(f"edgespec bench: note: {note}", file=sys.stderr)


def _report(result: Any, out: Path, long: bool) -> None:
    """Print the tables (first: the figures stay on screen whatever happens to the files), then
    write the files."""
    from edgespec.bench.long_report import format_context_table
    from edgespec.bench.records import aggregate, by_context
    from edgespec.bench.report import format_table, write_report

    variants = aggregate(result.records)
    print(format_table(variants))
    if long:
        print("\n" + format_context_table(by_context(result.records)))
    files = write_report(result, variants, out)
    print(f"\nwrote {files.json}, {files.markdown}" + "".join(f", {p}" for p in files.plots))
    if files.plot_error:
        print(files.plot_error, file=sys.stderr)
