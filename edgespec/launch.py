"""What MLX's launcher (`mlx.launch`, mpirun) tells a process through its environment, read
without importing MLX: the CLI needs it before its BLAS re-exec (edgespec/blas.py), which
must happen before MLX is loaded.

Thread shares: `mlx.launch -n 3` on one machine runs three ranks side by side. MKL (and
OpenMP / OpenBLAS) start one thread per core in each, so three ranks on a 2-core machine would
run six compute threads. `share_threads` gives each rank cores // local ranks (at least one)
unless the user set a count; the CLI calls it before the re-exec, whose environment keeps it
(and MLX_RANK / MLX_HOSTFILE, which the re-exec passes on unchanged).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from edgespec.blas import share_cores
from edgespec.errors import GroupError

HOSTFILE, RANK = "MLX_HOSTFILE", "MLX_RANK"


def launched_backend(environ: Mapping[str, str] = os.environ) -> str | None:
    """Which MLX launcher started this process, from the variables it sets: "ring" (mlx.launch
    --backend ring: MLX_HOSTFILE + MLX_RANK), "jaccl", "mpi", "nccl", or None (not launched)."""
    if environ.get("MLX_JACCL_COORDINATOR") or environ.get("MLX_IBV_DEVICES"):
        return "jaccl"
    if environ.get(HOSTFILE) and environ.get(RANK) is not None:
        return "ring"
    if environ.get("OMPI_COMM_WORLD_SIZE"):
        return "mpi"
    if environ.get("MLX_WORLD_SIZE") and environ.get("NCCL_HOST_IP"):
        return "nccl"
    return None


def env_rank(environ: Mapping[str, str] = os.environ) -> int | None:
    """This process's rank as the launcher set it, None when not launched. The CLI prefixes the
    error lines of ranks > 0 with it."""
    if launched_backend(environ) is None:
        return None
    for name in (RANK, "OMPI_COMM_WORLD_RANK"):
        value = environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def local_ranks(environ: Mapping[str, str] = os.environ) -> int:
    """How many ranks of a ring launch run on this rank's host (entries of the hostfile with its
    address); 1 when unknown. `mlx.launch -n 3` on one host: 3."""
    rank = env_rank(environ)
    try:
        hosts = json.loads(Path(environ.get(HOSTFILE, "")).read_text())
        mine = hosts[rank][0].rsplit(":", 1)[0] if rank is not None else None
        return max(1, sum(1 for h in hosts if h and h[0].rsplit(":", 1)[0] == mine))
    except (OSError, ValueError, IndexError, TypeError, AttributeError, KeyError):
        return 1


def share_threads(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """When several ranks share this machine, set each BLAS thread count that is unset to
    cores // local ranks (at least 1). Returns the share set, or None."""
    return share_cores(local_ranks(environ), environ)


RING_GAVE_UP = b"Too many send/recv errors"


def lost_group(text: str, rank: int | None) -> GroupError:
    """The one-line error of a rank whose group broke, from the backend's first line `text`:

    lost_group("[ring] connection to a peer was lost", 1) reads "rank 1 lost its group ([ring]
    connection to a peer was lost): another rank stopped or the network between them failed".
    """
    return GroupError(
        f"rank {rank} lost its group ({text}): another rank stopped or the network between "
        "them failed"
    )


def exit_when_ring_gives_up(who: str, grace: float = 10.0) -> None:
    """MLX's ring backend (0.32) can give up on a dead peer ("[ring] Too many send/recv errors.
    Failing pending tasks...", on stderr) without waking the eval that waits for those tasks: the
    rank then hangs in mx.synchronize instead of raising "[ring] connection to a peer was lost".
    This routes the process's stderr (fd 2) through a pipe that a thread copies to the real
    stderr, watching for that line; if the process is still running `grace` seconds after it,
    the thread prints the one-line error the exception path prints and exits with status 2.
    At exit stderr is restored and the pipe drained, so no line is lost."""
    import atexit
    import sys
    import threading

    real = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    exiting = threading.Event()

    def give_up() -> None:
        if exiting.wait(grace):
            return
        error = lost_group("[ring] connection to a peer was lost", env_rank())
        os.write(real, f"{who}: error: {error}\n".encode())
        os._exit(2)

    def copy() -> None:
        tail, fired = b"", False
        while chunk := os.read(read_end, 65536):
            os.write(real, chunk)
            tail = (tail + chunk)[-4096:]
            if not fired and RING_GAVE_UP in tail:
                fired = True
                threading.Thread(target=give_up, daemon=True).start()
        os.close(read_end)

    copier = threading.Thread(target=copy, daemon=True)
    copier.start()

    def restore() -> None:
        exiting.set()
        sys.stderr.flush()
        os.dup2(real, 2)  # closes the pipe's last write end: the copier drains it and stops
        copier.join(timeout=2)

    atexit.register(restore)
