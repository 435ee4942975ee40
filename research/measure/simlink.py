"""Slower links between local ranks, to simulate a network: a delaying TCP relay in front of each
rank's ring address. A simulation knob for measurements (research/measure/latency_sweep.py), never a
transport: the ranks still talk through MLX's own ring backend, only over a longer wire.

Why a relay: MLX's ring backend has no latency setting, `tc netem` needs a kernel module that
machines like ours lack, and a delay added on the host (a sleep per forward) would overlap with
the device's work where a real network delay does not. The relay delays the ring's own bytes:
every chunk a rank sends is delivered `delay` seconds after it arrived, in order, both ways, so
a collective's steps each pay it as they would on a slower link.

How the ranks are pointed at it: the ring backend has rank r listen on its own hostfile entry
and connect to entry r + 1. Each rank gets its own hostfile, with its real address at its own
index and the relays' addresses at the others, so every connection runs through a relay.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
CHUNK = 1 << 16


def _connect(port: int, deadline: float) -> socket.socket:
    """Connect to HOST:port, retrying until `deadline` (the rank may not be listening yet)."""
    while True:
        try:
            sock = socket.create_connection((HOST, port), timeout=5)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Copy src -> dst, each chunk `delay` seconds after it arrived (a reader and a writer
    thread, so that later chunks keep arriving while earlier ones wait)."""
    due: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def read() -> None:
        try:
            while chunk := src.recv(CHUNK):
                due.put((time.perf_counter() + delay, chunk))
        except OSError:
            pass
        due.put((0.0, b""))

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            at, chunk = due.get()
            if not chunk:
                break
            wait = at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@dataclass
class Relay:
    """Accepts on `listen` and relays each connection to `target`, `delay` seconds each way."""

    listen: int
    target: int
    delay: float
    _server: socket.socket | None = field(default=None, repr=False)

    def start(self, connect_timeout: float = 120.0) -> Relay:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((HOST, self.listen))
        server.listen(4)
        self._server = server

        def serve() -> None:
            while True:
                try:
                    client, _ = server.accept()
                except OSError:
                    return  # closed
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peer = _connect(self.target, time.monotonic() + connect_timeout)
                for a, b in ((client, peer), (peer, client)):
                    threading.Thread(target=_pump, args=(a, b, self.delay), daemon=True).start()

        threading.Thread(target=serve, daemon=True).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


def free_port_block(n: int, start: int = 41_000, stop: int = 60_000) -> int:
    """A base port b with b .. b + n - 1 free on HOST."""
    for base in range(start, stop - n, 97):
        taken = []
        try:
            for port in range(base, base + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                taken.append(s)
                s.bind((HOST, port))
            return base
        except OSError:
            continue
        finally:
            for s in taken:
                s.close()
    raise OSError("no block of free ports")


def relayed_hostfiles(folder: Path, size: int, delay: float) -> tuple[list[Path], list[Relay]]:
    """Start one relay per rank and write each rank's hostfile (its own real address, the others'
    relays). Returns (hostfile per rank, relays to close)."""
    base = free_port_block(2 * size)
    real = [base + r for r in range(size)]
    relays = [Relay(base + size + r, real[r], delay).start() for r in range(size)]
    files = []
    for rank in range(size):
        entries = [[f"{HOST}:{real[i] if i == rank else relays[i].listen}"] for i in range(size)]
        path = folder / f"hosts-rank{rank}.json"
        path.write_text(json.dumps(entries))
        files.append(path)
    return files, relays
