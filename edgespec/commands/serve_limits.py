"""`edgespec serve`'s options for who may reach the server and what one request may cost:
web origins and Host names (server/local.py), body size, time to send a request, open
connections (server/limits.py, server/guard.py) and prompt length."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from edgespec.errors import ConfigError

# Connections accepted in one go (and the listen backlog): asyncio accepts up to this many before
# the guard sees any, and a connection the guard closes frees its descriptor a loop turn later.
ACCEPT_BACKLOG = 128
# File descriptors kept beyond --max-connections: the process's own files, and two accept batches.
FILES_RESERVED = 64 + 2 * ACCEPT_BACKLOG


def add_access_args(g: Any) -> None:
    """Which web pages and Host names the server answers."""
    g.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let scripts on this web origin call the API (CORS), e.g. http://localhost:3000; "
        "repeat for several, '*' for any (default none: a request from a web page is refused)",
    )
    g.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="answer requests whose Host is NAME too (besides localhost, loopback addresses and "
        "--host), e.g. a name this machine has on your network; repeat for several, '*' for any "
        "(others get 421: a web page reaching the server by DNS rebinding)",
    )


def add_limit_args(g: Any) -> None:
    """What one client may hold: body size, time to send a request, open connections."""
    from edgespec.server.limits import Limits

    d = Limits()
    g.add_argument(
        "--max-body-bytes",
        type=int,
        default=d.max_body_bytes,
        help=f"largest request body, bytes (default {d.max_body_bytes}; above: 413)",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout_s,
        help="seconds a client has to send a request's head, and again its body (default "
        f"{d.request_timeout_s:g}); a connection that sends nothing for that long is closed",
    )
    g.add_argument(
        "--max-connections",
        type=int,
        default=d.max_connections,
        help=f"open connections (default {d.max_connections}; at the cap a new one closes the "
        "longest idle one, or one stalled before its body ends; lowered to fit the open-file "
        "limit)",
    )
    g.add_argument(
        "--max-prompt-tokens",
        type=int,
        default=None,
        metavar="N",
        help="refuse prompts longer than N tokens with a 400 before any work (default: what the "
        "context window holds)",
    )


def check_limits(args: argparse.Namespace) -> None:
    """A one-line ConfigError for a limit out of range."""
    if args.max_prompt_tokens is not None and args.max_prompt_tokens < 1:
        raise ConfigError(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    if args.max_body_bytes < 1 or args.max_connections < 1 or not args.request_timeout > 0:
        raise ConfigError("--max-body-bytes, --max-connections and --request-timeout must be > 0")


def fitted_limits(args: argparse.Namespace) -> Any:
    """The request limits, --max-connections fitted under the open-file limit (raised first,
    up to its hard ceiling, when it is lower: each connection holds a file descriptor)."""
    from edgespec.server.limits import Limits

    cap = args.max_connections
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = cap + FILES_RESERVED
        if soft != resource.RLIM_INFINITY and soft < want:
            ceiling = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
            soft = ceiling
        if soft != resource.RLIM_INFINITY and soft < want:
            cap = max(1, soft - FILES_RESERVED)
            note = f"--max-connections lowered to {cap} to fit the open-file limit ({soft})"
            print(f"edgespec serve: {note}", file=sys.stderr)
    except (ImportError, ValueError, OSError):  # no such limit here (Windows), or not allowed
        pass
    return Limits(args.max_body_bytes, args.request_timeout, cap)
