"""`edgespec generate`: answer one prompt, streaming the answer as it is committed."""

from __future__ import annotations

import argparse
import os
import sys

from edgespec.commands.common import (
    add_model_args,
    add_sampling_args,
    add_shard_args,
    add_spec_args,
    add_think_arg,
    apply_think,
    draft_from_args,
    fixed_k_for_group,
    generation_from_args,
)
from edgespec.errors import ConfigError, PromptError
from edgespec.events import Finished, Stats, Token, json_line
from edgespec.loading.specs import check_pair

HELP = (
    "Answer PROMPT with speculative decoding (the draft proposes, the target verifies; the output "
    "is distributed exactly as the target's). The chat template is applied unless --raw."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt (a user message unless --raw)")
    add_model_args(parser)
    add_sampling_args(parser)
    add_spec_args(parser)
    parser.add_argument("--max-tokens", type=int, default=256, help="answer length limit")
    parser.add_argument(
        "--raw",
        action="store_true",
        help="feed the prompt as is, no template (special-token strings in it stay text unless "
        "--parse-special)",
    )
    parser.add_argument(
        "--parse-special",
        action="store_true",
        help="with --raw: read special-token strings in the prompt (e.g. <|im_end|>) as the "
        "control tokens, for a prompt that writes a template's markers itself",
    )
    add_think_arg(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="JSON lines: token and round records, then a summary",
    )
    add_shard_args(parser)


def summary_line(reason: str, s: Stats) -> str:
    """One human line: '64 tokens (length) | 23 rounds, tau 2.78, acceptance 0.45 | ...'."""
    spec = (
        f"{s.rounds} rounds, tau {s.tau:.2f}, acceptance {s.acceptance:.2f}"
        if s.drafted
        else "plain decoding"
    )
    return (
        f"{s.tokens} tokens ({reason}) | {spec} | TTFT {s.ttft * 1000:.0f} ms | "
        f"{s.tokens_per_s:.1f} tokens/s | prompt {s.prompt_tokens} (prefilled {s.prefilled_tokens})"
    )


def _progress(stage: str, fraction: float | None) -> None:
    if sys.stderr.isatty():
        print(f"\r{stage}".ljust(60), end="", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # our errors say it in one line
    config = generation_from_args(args)  # validate before importing or loading anything
    if args.parse_special and not args.raw:
        raise ConfigError("--parse-special reads a --raw prompt; chat messages are always text")
    if not args.prompt.strip():  # Engine.encode_* would say the same after loading the models
        raise PromptError("the prompt is empty")
    draft = draft_from_args(args, config.spec)
    with_draft = config.spec.uses_draft
    check_pair(args.target, draft, args.pair, with_draft=with_draft)  # an unknown name: no import
    from edgespec.launch import launched_backend
    from edgespec.runtime import Engine

    group = None  # a lone process: nothing of edgespec.distributed is imported
    if launched_backend() is not None:  # one rank of an mlx.launch group
        from edgespec.distributed.group import init_group

        group = init_group()
    primary = group is None or group.is_primary  # rank 0 alone prints; the others follow
    config, note = fixed_k_for_group(config, group)
    if note and primary:
        print(f"edgespec generate: note: {note}", file=sys.stderr)
    engine = Engine.load(
        args.target,
        draft,
        args.pair,
        draft_bits=args.draft_bits,
        dtype=args.dtype,
        kv_bits=args.kv_bits,
        on_progress=_progress if primary else None,
        with_draft=with_draft,
        group=group,
        shard=args.shard,
    )
    if sys.stderr.isatty() and primary:
        print("\r".ljust(61), end="\r", file=sys.stderr, flush=True)
    if group is None:
        engine.use_saved_calibration()  # adaptive K starts from the chat's or bench's costs
    note = apply_think(engine, args.think, raw=args.raw)
    if note and primary:
        print(f"edgespec generate: note: {note}", file=sys.stderr)
    if args.raw:
        ids = engine.encode_raw(args.prompt, parse_special=args.parse_special)
    else:
        ids = engine.encode_chat([{"role": "user", "content": args.prompt}])
    if not primary:
        for _ in engine.generate(ids, config):
            pass
        return 0
    if args.json:
        for event in engine.generate(ids, config):
            print(json_line(event), flush=True)
        return 0
    shown = 0
    for event in engine.generate(ids, config):
        if isinstance(event, Token):
            print(event.text, end="", flush=True)
            shown += len(event.text)
        elif isinstance(event, Finished):
            print(event.text[shown:])  # what the detokenizer held back (a split character)
            print(summary_line(event.reason, event.stats), file=sys.stderr)
    return 0
