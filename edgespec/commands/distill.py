"""`edgespec distill`: generate data with the target -> train a draft -> export it (quantized + card).

Every stage resumes: data generation skips instructions already answered, training continues
from OUT/train/latest with --resume, export rewrites OUT/draft from the final checkpoint.
`--evaluate --target T --draft D` measures an existing pair instead (see distill/evaluate.py).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from edgespec.errors import ConfigError

if TYPE_CHECKING:
    from edgespec.distill.evaluate import CategoryReport, EvalReport

MARGIN = 0.10  # edgespec.distill.evaluate.MARGIN (not imported: that loads MLX)

HELP = "train a small draft for a target on the target's own answers (generate, train, export)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="target model: catalogue name, folder or .gguf")
    parser.add_argument("--out", help="output folder (data/, train/, draft/)")
    parser.add_argument("--data", help="data folder (default OUT/data); shared across runs")
    parser.add_argument("--resume", action="store_true", help="continue training from OUT/train")
    parser.add_argument("--evaluate", action="store_true", help="measure --draft against --target")
    parser.add_argument("--draft", help="with --evaluate: the draft folder to measure")
    g = parser.add_argument_group("data")
    g.add_argument("--tokens", type=int, default=200_000, help="completion tokens of data")
    g.add_argument("--instructions", type=int, default=50_000, help="instruction pool size")
    g.add_argument("--instruction-seed", type=int, default=0)
    g.add_argument("--gen-batch", type=int, default=32, help="sequences decoded together")
    g.add_argument("--shard-size", type=int, default=64, help="answers per shard (checkpoint)")
    g.add_argument("--max-new-tokens", type=int, default=192)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--greedy-fraction", type=float, default=0.25)
    g = parser.add_argument_group("training")
    g.add_argument(
        "--layers", default="0,1,-2,-1", help="target layers to keep (default 0,1,-2,-1)"
    )
    g.add_argument("--head-size", type=int, default=8192, help="output head tokens (default 8192)")
    g.add_argument("--steps", type=int, default=2000)
    g.add_argument("--batch", type=int, default=4096, help="tokens per micro-batch (padded)")
    g.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--lr", type=float, default=5e-4)
    g.add_argument("--warmup", type=int, default=50, help="linear warm-up steps (default 50)")
    g.add_argument("--eval-every", type=int, default=100)
    g.add_argument("--ckpt-every", type=int, default=100)
    g.add_argument(
        "--bits",
        type=int,
        default=8,
        choices=(4, 6, 8),
        help="weight bits of the exported draft (default 8: 4 bits cost agreement)",
    )
    g = parser.add_argument_group("evaluation")
    g.add_argument(
        "--prompts", help="question file, MT-bench style (default: the built-in bench prompts)"
    )
    g.add_argument("--n-prompts", type=int, default=20, help="the first N questions (default 20)")
    g.add_argument("--eval-tokens", type=int, default=128, help="tokens per evaluated answer")
    g.add_argument(
        "--per-category",
        type=int,
        metavar="N",
        help="the first N questions of each category instead of the first --n-prompts",
    )
    g.add_argument(
        "--category-margin",
        type=float,
        default=MARGIN,
        help=f"flag a category this far below the overall figure (default {MARGIN})",
    )
    g.add_argument(
        "--min-category",
        type=float,
        default=0.0,
        help="also flag a category below this agreement or acceptance (default 0: off)",
    )
    g.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def command_line(a: argparse.Namespace) -> str:
    """The canonical command that reproduces this run (goes into the model card)."""
    return (
        f"edgespec distill --target {a.target} --out {a.out} --tokens {a.tokens} "
        f"--instructions {a.instructions} --instruction-seed {a.instruction_seed} "
        f"--max-new-tokens {a.max_new_tokens} --temperature {a.temperature} "
        f"--greedy-fraction {a.greedy_fraction} --layers {a.layers} --head-size {a.head_size} "
        f"--steps {a.steps} --batch {a.batch} --accum {a.accum} --lr {a.lr} --warmup {a.warmup} "
        f"--bits {a.bits}"
    )


def run(args: argparse.Namespace) -> int:
    if args.evaluate:
        return _evaluate(args)
    if not args.target or not args.out:
        raise ConfigError("--target and --out are required (or --evaluate with --draft)")
    from edgespec.distill.pipeline import run_pipeline

    summary = run_pipeline(args, command_line(args), progress=True)
    for line in summary:
        print(line)
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    if not args.target or not args.draft:
        raise ConfigError("--evaluate needs --target and --draft")
    if args.per_category is not None and args.per_category < 1:
        raise ConfigError("--per-category must be at least 1")
    if not 0.0 <= args.category_margin <= 1.0 or not 0.0 <= args.min_category <= 1.0:
        raise ConfigError("--category-margin and --min-category must lie in [0, 1]")
    from edgespec.distill.evaluate import evaluate

    r = evaluate(
        args.target,
        args.draft,
        prompts_path=args.prompts,
        n=args.n_prompts,
        max_tokens=args.eval_tokens,
        per_category=args.per_category,
        margin=args.category_margin,
        min_category=args.min_category,
    )
    if args.json:
        print(r.to_json())
        return 0
    for line in report_lines(r):
        print(line)
    return 0


def report_lines(r: EvalReport) -> list[str]:
    """The evaluation as text: cost and speed, then agreement and acceptance by category."""
    rows = [["category", "prompts", "agreement", "tokens", "acceptance", "tau", "identical"]]

    def row(name: str, c: EvalReport | CategoryReport) -> list[str]:
        return [
            name,
            str(c.prompts),
            f"{c.agreement:.3f}",
            str(c.agreement_tokens),
            f"{c.acceptance:.3f}",
            f"{c.tau:.2f}",
            f"{c.identical}/{c.prompts}",
        ]

    if len(r.categories) > 1:
        rows += [row(name, c) for name, c in r.categories.items()]
    rows.append(row("overall", r))
    widths = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    lines = [
        f"draft cost c {r.c:.3f} ({r.draft_ms:.2f} / {r.target_ms:.2f} ms per token); "
        f"K={r.k} speculative {r.spec_tokens_per_s:.1f} vs plain {r.plain_tokens_per_s:.1f} "
        f"tok/s, {r.speedup:.2f}x",
        "",
    ]
    lines += ["  ".join(v.ljust(w) for v, w in zip(x, widths, strict=True)).rstrip() for x in rows]
    flagged = [f"warning: {f}" for f in r.flagged]
    return lines + ([""] + flagged if flagged else [])
