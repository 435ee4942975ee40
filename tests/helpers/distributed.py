"""Launch real multi-process runs on localhost with MLX's ring backend, as users do (`mlx.launch
--backend ring -n N -- edgespec ...`), bounded by timeouts."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers.cli import ROOT

# mlx.launch, run from its console-script entry point (it need not be on PATH in a venv).
LAUNCH = (
    "import sys; from importlib.metadata import entry_points; "
    "(ep,) = entry_points(group='console_scripts', name='mlx.launch'); "
    "sys.argv[0] = 'mlx.launch'; sys.exit(ep.load()())"
)


def env(**extra: str) -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **extra)


def free_ports(n: int) -> int:
    """A base port b with b .. b + n - 1 free on 127.0.0.1 (the ring binds one per rank)."""
    for _ in range(200):
        base = random.randrange(40_000, 60_000 - n)
        sockets = []
        try:
            for port in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free ports")


def ring_command(n: int, *program: str) -> list[str]:
    """`mlx.launch --backend ring -n N -p PORT -- PROGRAM` on free local ports."""
    ports = str(free_ports(n))
    return [
        sys.executable,
        "-c",
        LAUNCH,
        "--backend",
        "ring",
        "-n",
        str(n),
        "-p",
        ports,
        "--",
        *program,
    ]


def launch_command(n: int, *args: str) -> list[str]:
    """`mlx.launch --backend ring -n N -p PORT -- python -m edgespec ARGS`."""
    return ring_command(n, sys.executable, "-m", "edgespec", *args)


def script_command(n: int, script: str, *args: str) -> list[str]:
    """`mlx.launch --backend ring -n N -p PORT -- python tests/helpers/SCRIPT ARGS`."""
    return ring_command(n, sys.executable, str(ROOT / "tests" / "helpers" / script), *args)


def launch(n: int, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `edgespec ARGS` on N ranks; the merged output of all ranks comes back (rank 0 alone
    writes to stdout; error lines of ranks > 0 say `[rank r]`)."""
    return subprocess.run(
        launch_command(n, *args),
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=timeout,
    )


def token_ids(stdout: str) -> list[int]:
    """The token ids of `edgespec generate --json` output."""
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [r["id"] for r in records if r["type"] == "token"]


def write_hostfile(path: Path, n: int) -> Path:
    """A ring hostfile for N local ranks: [["127.0.0.1:port"], ...]."""
    base = free_ports(n)
    path.write_text(json.dumps([[f"127.0.0.1:{base + r}"] for r in range(n)]))
    return path
