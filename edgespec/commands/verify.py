"""`edgespec verify`: check empirically, on the pair's real distributions, that speculation is
unbiased (the first emitted token is distributed as the target's p)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from edgespec.commands.common import (
    add_model_args,
    add_sampling_args,
    add_think_arg,
    apply_think,
    sampling_from_args,
)
from edgespec.config import SpecConfig
from edgespec.errors import ConfigError
from edgespec.loading.specs import check_pair

HELP = (
    "Run N rounds of the real acceptance step at one fixed context and compare the first emitted "
    "token with the target's distribution p: L1 distance (shrinks towards 0 as N grows), "
    "acceptance next to sum min(p, q), and a chi-square p-value. Exit 1 if p-value < 1e-4."
)
DEFAULT_PROMPT = "Explain why the sky is blue."
ALARM = 1e-4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_sampling_args(parser)
    parser.set_defaults(temp=1.0)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the fixed context (chat)")
    parser.add_argument("--raw", action="store_true", help="use --prompt as is, no template")
    add_think_arg(parser)
    parser.add_argument("-k", "--k", type=int, default=4, help="draft tokens per round")
    parser.add_argument("--rounds", type=int, default=20000, help="rounds to simulate (N)")
    parser.add_argument("--json", action="store_true", help="one JSON object")


def _report_lines(name: str, prompt_tokens: int, temp: float, r) -> list[str]:
    verdict = (
        "consistent with exact sampling"
        if r.p_value >= ALARM
        else "BIASED: the emitted tokens do not follow p"
    )
    return [
        f"pair {name} | context {prompt_tokens} tokens | temperature {temp} | K {r.k}",
        f"rounds                      {r.rounds}",
        f"L1(empirical, p)            {r.l1:.4f}   (sampling noise alone: ~{r.l1_noise:.4f})",
        f"acceptance                  {r.acceptance:.4f}   (exact: sum min(p, q) = "
        f"{r.expected_acceptance:.4f})",
        f"chi-square                  {r.chi_square:.1f} on {r.dof} dof, p-value {r.p_value:.3f}",
        f"verdict                     {verdict}",
    ]


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sampling = sampling_from_args(args)
    SpecConfig(k=args.k)  # K's checks and message, as everywhere
    if args.rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {args.rounds}")
    check_pair(args.target, args.draft, args.pair)  # an unknown model: before the imports
    from edgespec.bench.unbiased import verify_pair
    from edgespec.runtime import Engine

    engine = Engine.load(
        args.target,
        args.draft,
        args.pair,
        draft_bits=args.draft_bits,
        dtype=args.dtype,
        kv_bits=args.kv_bits,
    )
    if engine.draft is None:
        raise ConfigError(f"{engine.name} has no draft model to verify; pass --draft")
    note = apply_think(engine, args.think, raw=args.raw)
    if note:
        print(f"edgespec verify: note: {note}", file=sys.stderr)
    ids = (
        engine.encode_raw(args.prompt)
        if args.raw
        else engine.encode_chat([{"role": "user", "content": args.prompt}])
    )
    report = verify_pair(
        engine.target.model, engine.draft.model, ids, sampling, args.k, args.rounds
    )
    if args.json:
        print(json.dumps(asdict(report)))
    else:
        print("\n".join(_report_lines(engine.name, len(ids), sampling.temperature, report)))
    if report.p_value < ALARM:
        print("edgespec verify: the check failed; please report it", file=sys.stderr)
        return 1
    return 0
