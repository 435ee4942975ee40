"""`edgespec chat`: the subcommand module the CLI dispatcher loads (HELP, add_arguments, run)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from edgespec.commands.common import (
    add_model_args,
    add_sampling_args,
    add_spec_args,
    add_think_arg,
    draft_from_args,
    generation_from_args,
)
from edgespec.loading.specs import check_pair

if TYPE_CHECKING:
    from edgespec.tui.engine_thread import Loader, ProgressFn

    from edgespec.worker import ServedEngine

HELP = (
    "Chat in the terminal app and watch speculative decoding: every token is coloured by where "
    "it came from (accepted draft, corrected, bonus, plain target), with live stats."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Model, sampling and speculation options, plus the answer length."""
    add_model_args(parser)
    add_sampling_args(parser)
    add_spec_args(parser)
    add_think_arg(parser)
    parser.add_argument(
        "--max-tokens", type=int, default=512, help="longest answer in tokens (default 512)"
    )
    # Hidden: run the UI on the scripted fake engine (demos, UI work without models).
    # `--fake markdown`: its answer is a reasoning model's, in Markdown (tui/fake.py MARKDOWN).
    parser.add_argument(
        "--fake", nargs="?", const="words", choices=("words", "markdown"), help=argparse.SUPPRESS
    )


def describe(args: argparse.Namespace) -> str:
    """What the loading screen says it loads, e.g. 'T + draft D'."""
    if args.pair:
        return f"pair {args.pair}"
    if args.target:
        return f"{args.target} + draft {args.draft}" if args.draft else args.target
    return "the embedded default pair"


def run(args: argparse.Namespace) -> int:
    """Open the app; returns 0, or 2 when the models could not be loaded (an unknown model name
    is refused before the app opens)."""
    config = generation_from_args(args)  # invalid settings raise ConfigError before the UI starts
    draft = draft_from_args(args, config.spec)  # --method mtp: the target's own MTP head
    if not args.fake:
        check_pair(args.target, draft, args.pair)
    from edgespec.tui.app import ChatApp

    what = "fake engine" if args.fake else describe(args)
    app = ChatApp(loader(args, draft), config, what=what, collect_when_idle=True, think=args.think)
    app.run()
    return 2 if app.load_error else 0


def loader(args: argparse.Namespace, draft: str | None) -> Loader:
    """The app's loader for these arguments. Once loaded, what the process holds is frozen out of
    the garbage collector's full passes (`freeze_heap`), and the app collects when idle."""
    from edgespec.worker import freeze_heap

    def load(on_progress: ProgressFn) -> ServedEngine:
        engine = _load(args, draft, on_progress)
        freeze_heap()  # on the engine thread, before the app says it is ready
        return engine

    return load


def _load(args: argparse.Namespace, draft: str | None, on_progress: ProgressFn) -> ServedEngine:
    if args.fake:
        from edgespec.tui.fake import MARKDOWN, FakeEngine, FakeScript

        text = MARKDOWN if args.fake == "markdown" else None
        script = FakeScript(round_delay=0.05, load_delay=0.2, text=text)
        return FakeEngine.load(script, on_progress)
    from edgespec.runtime import Engine  # imported on the engine thread: it owns MLX

    return Engine.load(  # type: ignore[no-any-return]
        target=args.target,
        draft=draft,
        pair=args.pair,
        draft_bits=args.draft_bits,
        dtype=args.dtype,
        kv_bits=args.kv_bits,
        on_progress=on_progress,
    )
