"""`edgespec` command line: a thin dispatcher.

Each subcommand lives in its own module exposing HELP, add_arguments(parser) and run(args) -> int.
Modules are imported lazily (only the chosen command's), which keeps `edgespec --help` instant and
keeps `edgespec` free of static imports of `tui` (the chat command's module lives there).
Errors: EdgeSpecError -> one line on stderr, exit 2; Ctrl-C -> clean stop, exit 130.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from edgespec.blas import reexec_with_blas
from edgespec.errors import EdgeSpecError, GroupError, one_line
from edgespec.launch import (
    env_rank,
    exit_when_ring_gives_up,
    launched_backend,
    share_threads,
)
from edgespec.switches import DEBUG

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("edgespec.commands.generate", "answer one prompt, streaming tokens"),
    "chat": ("edgespec.tui.command", "chat in the terminal app, tokens coloured by provenance"),
    "serve": ("edgespec.commands.serve", "serve the pair over an OpenAI-compatible HTTP API"),
    "bench": ("edgespec.commands.bench", "measure plain vs speculative decoding on this machine"),
    "verify": ("edgespec.commands.verify", "check empirically that speculation is unbiased"),
    "tree-bench": ("edgespec.commands.tree_bench", "chains against draft trees, side by side"),
    "pull": ("edgespec.commands.pull", "download and convert a model into the cache"),
    "models": ("edgespec.commands.models", "list model pairs and what is cached"),
    "distill": ("edgespec.commands.distill", "train a draft model for a target"),
}


# Commands that run as one rank of an mlx.launch group (the target sharded; edgespec.distributed).
GROUP_COMMANDS = ("generate", "bench", "serve")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as a single line (exit 2), not usage + error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"edgespec: error: {message}\n")


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="edgespec", description="Exact speculative decoding on MLX.")
    parser.add_argument("--version", action="version", version="edgespec 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (_, help_) in COMMANDS.items():
        sub.add_parser(name, help=help_, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `edgespec` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        args, _ = _top_parser().parse_known_args(argv or ["--help"])
        return 2
    name, rest = argv[0], argv[1:]
    launched = launched_backend() is not None  # one rank of an mlx.launch group
    if launched:
        share_threads()  # ranks sharing a machine share its cores (before the BLAS loads)
        signal.signal(signal.SIGTERM, _stopped_by_launcher)
    reexec_with_blas(argv, report=lambda note: print(note, file=sys.stderr))
    rank = env_rank()
    who = f"edgespec {name}" + (f" [rank {rank}]" if rank else "")  # rank 0 reads as usual
    if launched and name not in GROUP_COMMANDS:
        print(
            f"{who}: error: {name} does not run under mlx.launch; "
            f"use {', '.join(GROUP_COMMANDS[:-1])} or {GROUP_COMMANDS[-1]} there",
            file=sys.stderr,
        )
        return 2
    if launched_backend() == "ring":
        exit_when_ring_gives_up(who)
    try:
        module = importlib.import_module(COMMANDS[name][0])
        parser = _Parser(prog=f"edgespec {name}", description=module.HELP)
        module.add_arguments(parser)
        args = parser.parse_args(rest)
        return int(module.run(args) or 0)
    except EdgeSpecError as exc:
        print(f"{who}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"edgespec {name}: stopped", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # the backend failed (out of memory, a kernel that did not compile)
        if os.environ.get(DEBUG):
            raise
        if launched:  # a peer lost mid-collective: say so in words
            from edgespec.distributed.group import lost

            group_error = lost(exc)
            if group_error is not None:
                print(f"{who}: error: {group_error}", file=sys.stderr)
                return 2
        print(
            f"{who}: error: {one_line(exc, typed=True)} (EDGESPEC_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _stopped_by_launcher(signum: int, frame: FrameType | None) -> None:
    """SIGTERM under mlx.launch: the launcher ends every rank once one has failed."""
    raise GroupError("stopped by mlx.launch (another rank ended first; its error line says why)")


if __name__ == "__main__":
    sys.exit(main())
