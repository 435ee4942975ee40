"""`edgespec serve`: an OpenAI-compatible HTTP server with exact speculative decoding."""

from __future__ import annotations

import argparse
import ipaddress
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from edgespec.commands.common import (
    add_model_args,
    add_sampling_args,
    add_shard_args,
    add_spec_args,
    draft_from_args,
    fixed_k_for_group,
    generation_from_args,
)
from edgespec.commands.serve_limits import (
    ACCEPT_BACKLOG,
    add_access_args,
    add_limit_args,
    check_limits,
    fitted_limits,
)
from edgespec.config import GenerationConfig
from edgespec.errors import ConfigError, EdgeSpecError
from edgespec.loading.specs import check_pair

HELP = (
    "Serve the model pair over an OpenAI-compatible API (/v1/chat/completions, /v1/completions, "
    "/v1/models, /health) with exact speculative decoding, prefix caches across requests and "
    "speculation figures in every response's usage. Listens on localhost unless --host says "
    "otherwise. The sampling and speculation options are the defaults of requests that leave "
    "those fields out."
)
DEFAULT_CACHE_MB = 1024
DEFAULT_SLOTS = 4
DEFAULT_BATCH = 8  # requests answered at once (docs/server.md: why eight)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_args(parser)
    add_sampling_args(parser)
    parser.set_defaults(seed=None)  # a request without a seed gets a fresh one, unless --seed
    add_spec_args(parser)
    add_shard_args(parser)
    parser.add_argument(
        "--max-tokens", type=int, default=512, help="answer length when a request sets none"
    )
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default localhost)")
    g.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = any free one)")
    g.add_argument(
        "--api-key",
        default=os.environ.get("EDGESPEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $EDGESPEC_API_KEY, else none)",
    )
    g.add_argument("--model-id", help="the model name clients send (default: the pair's name)")
    g.add_argument(
        "--cache-mb",
        type=int,
        default=DEFAULT_CACHE_MB,
        help=f"memory for conversations' prefix caches, MiB (default {DEFAULT_CACHE_MB})",
    )
    g.add_argument(
        "--cache-slots",
        type=int,
        default=DEFAULT_SLOTS,
        help=f"conversations kept cached (default {DEFAULT_SLOTS}; 0: no reuse across requests)",
    )
    g.add_argument(
        "--max-queue", type=int, default=64, help="requests that may wait (default 64; then 503)"
    )
    g.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_BATCH,
        help=f"requests answered at once, round by round, their forwards packed (default "
        f"{DEFAULT_BATCH}; 1: one after another)",
    )
    add_access_args(g)
    add_limit_args(g)
    g.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="answer at once: skip the warm-up (compiling the loop's shapes, calibrating "
        "adaptive K) that otherwise runs before the server listens",
    )
    g.add_argument("--verbose", action="store_true", help="log every request (uvicorn's log)")


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.cache_mb < 0 or args.cache_slots < 0:
        raise ConfigError("--cache-mb and --cache-slots must be >= 0")
    if args.max_queue < 1:
        raise ConfigError(f"--max-queue must be >= 1, got {args.max_queue}")
    if args.max_batch < 1:
        raise ConfigError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.api_key is not None and not args.api_key.strip():
        raise ConfigError("--api-key (or EDGESPEC_API_KEY) is empty")
    check_limits(args)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket, or a one-line error (port in use, unknown address)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(ACCEPT_BACKLOG)  # before the ready line: a client may connect on seeing it
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise EdgeSpecError(
            f"cannot listen on {host}:{port}: {reason}; choose another --port or --host"
        ) from None
    return sock


def _model_id(args: argparse.Namespace) -> str:
    if args.model_id:
        return str(args.model_id)
    if args.pair:
        return str(args.pair)
    if args.target:
        return Path(args.target.rstrip("/")).name or str(args.target)
    from edgespec.loading.specs import load_catalog

    return load_catalog().default_pair


def _progress(stage: str, fraction: float | None) -> None:
    if sys.stderr.isatty():
        print(f"\r{stage}".ljust(60), end="", file=sys.stderr, flush=True)


def _require_extra() -> None:
    try:
        import greenlet  # noqa: F401
        import sse_starlette  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise EdgeSpecError(
            f"edgespec serve needs its extra ({exc.name} is missing): pip install 'edgespec[serve]'"
        ) from None


def _load(args: argparse.Namespace, group: Any, draft: str | None) -> Any:
    """The pair (`draft`: draft_from_args's choice, e.g. the target's own MTP head)."""
    from edgespec.runtime import Engine

    return Engine.load(
        args.target,
        draft,
        args.pair,
        draft_bits=args.draft_bits,
        dtype=args.dtype,
        kv_bits=args.kv_bits,
        on_progress=_progress if group is None or group.is_primary else None,
        group=group,
        shard=args.shard,
    )


def _start_worker(
    args: argparse.Namespace, config: GenerationConfig, group: Any = None
) -> tuple[Any, Any]:
    """Load the pair on the worker thread (it owns MLX); (worker, engine) or a one-line error.
    Under a group, rank 0's worker and engine send each request to the other ranks."""
    from edgespec.server.sharded import GroupEngine, GroupWorker
    from edgespec.server.worker import Worker
    from edgespec.worker import freeze_heap

    draft = draft_from_args(args, config.spec)  # --method mtp: the target's own MTP head

    def load() -> Any:
        engine = _load(args, group, draft)
        if group is not None:
            engine = GroupEngine(engine, group)
        elif getattr(args, "warmup", True):  # before start() returns, so before /health answers
            _progress("warming up (compiling, calibrating adaptive K)", None)
            engine.warm_up(config)
        freeze_heap()  # what is loaded now lives as long as the server: out of full collections
        return engine

    budget = args.cache_mb << 20
    kind = Worker if group is None else GroupWorker
    # Under a group every rank runs rank 0's requests one after another (server/sharded.py).
    worker = kind(
        load,
        budget_bytes=budget,
        max_slots=args.cache_slots,
        max_queue=args.max_queue,
        max_batch=args.max_batch if group is None else 1,
    )
    engine = worker.start()
    if sys.stderr.isatty():
        print("\r".ljust(61), end="\r", file=sys.stderr, flush=True)
    if config.spec.uses_draft and not engine.has_draft:
        worker.shutdown()
        raise ConfigError(f"--method {config.spec.method} needs a draft model; none was loaded")
    return worker, engine


def run(args: argparse.Namespace) -> int:
    from edgespec.distributed.group import init_group

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    _require_extra()
    _check(args)
    random_seed = args.seed is None
    args.seed = 0 if random_seed else args.seed
    config = generation_from_args(args)  # validate before loading anything
    draft = draft_from_args(args, config.spec)
    check_pair(args.target, draft, args.pair)  # an unknown model: before the imports
    group = init_group()  # under mlx.launch: rank 0 serves, the others follow it
    if group is not None and not group.is_primary:
        return _follow(args, group, draft)
    config, note = fixed_k_for_group(config, group)
    if note:
        print(f"edgespec serve: note: {note}", file=sys.stderr)
    sock = _listen(args.host, args.port)
    try:
        worker, engine = _start_worker(args, config, group)
    except BaseException:
        sock.close()
        raise
    app, guard = _make_app(args, worker, engine, config, random_seed)
    model_id = app.state.edgespec.defaults.model_id
    server = _make_server(app, worker, guard, args.verbose)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"edgespec serve: {engine.name} at http://{shown}:{port}/v1 (model {model_id!r}; "
        "Ctrl-C stops)",
        flush=True,
    )
    if not args.api_key and not ipaddress.ip_address(host).is_loopback:
        print(
            f"edgespec serve: warning: listening on {host} without --api-key: anyone who can "
            "reach this machine can use it",
            file=sys.stderr,
        )
    if group is not None:  # a lost rank stops the server (edgespec.server.sharded)
        engine.on_lost = lambda: server.handle_exit(signal.SIGTERM, None)
    _serve(server, sock, worker)
    if getattr(engine, "lost", None) is not None:
        raise engine.lost
    print("edgespec serve: stopped", file=sys.stderr)
    return 0


def _follow(args: argparse.Namespace, group: Any, draft: str | None) -> int:
    """Ranks > 0: load this rank's shard, then run what rank 0 sends until it stops."""
    from edgespec.server.sharded import follow

    follow(_load(args, group, draft), group, args.cache_mb << 20, args.cache_slots)
    return 0


def _make_app(
    args: argparse.Namespace, worker: Any, engine: Any, config: GenerationConfig, random_seed: bool
) -> tuple[Any, Any]:
    """The ASGI app over the started worker, and the connection guard whose figures it shows."""
    from edgespec.server.app import create_app
    from edgespec.server.guard import ConnectionGuard
    from edgespec.server.local import HostRule
    from edgespec.server.protocol import Defaults, served_methods
    from edgespec.taps import vocab_size

    vocab = vocab_size(engine.target.model)
    defaults = Defaults(
        _model_id(args),
        config,
        random_seed,
        has_draft=engine.has_draft,
        vocab_size=vocab,
        methods=served_methods(engine.has_draft, getattr(engine, "family", None)),
    )
    limits = fitted_limits(args)
    guard = ConnectionGuard(limits.max_connections, limits.request_timeout_s)
    app = create_app(
        worker,
        defaults,
        api_key=args.api_key,
        description=engine.name,
        budget_bytes=args.cache_mb << 20,
        allow_origins=tuple(args.allow_origin),
        limits=limits,
        connections=guard.figures,
        hosts=HostRule.of(args.host, tuple(args.allow_host)),
        max_prompt_tokens=args.max_prompt_tokens,
    )
    return app, guard


def _make_server(app: Any, worker: Any, guard: Any, verbose: bool) -> Any:
    """uvicorn's Server, whose exit signal also stops the worker (running and queued jobs), on
    its h11 protocol under the connection guard; repeated log lines are said once unless
    --verbose."""
    import uvicorn

    from edgespec.server.app import GRACEFUL_SHUTDOWN_S
    from edgespec.server.guard import guarded_h11, quiet_repeats

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            worker.close()
            super().handle_exit(sig, frame)

    if not verbose:
        quiet_repeats()
    config = uvicorn.Config(
        app,
        http=guarded_h11(guard),
        backlog=ACCEPT_BACKLOG,
        log_level="info" if verbose else "warning",
        access_log=verbose,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        lifespan="off",
    )
    return Server(config)


def _serve(server: Any, sock: socket.socket, worker: Any) -> None:
    """Run until Ctrl-C / SIGTERM. uvicorn re-raises the signal it caught once it has shut
    down; the handlers set here take it, so the command ends with its own exit status (0)."""
    stopping = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stopping.set())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        server.run(sockets=[sock])
    finally:
        worker.shutdown(timeout=5.0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
