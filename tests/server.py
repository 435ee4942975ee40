"""Start the real `edgespec serve` in a subprocess on a free localhost port (for tests)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"at (http://127\.0\.0\.1:\d+)/v1")


class ServerProcess:
    """`python -m edgespec serve ARGS --port 0`; `url` once it said it is ready."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180):
        full_env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT), **(env or {}))
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edgespec",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            cwd=ROOT,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True).start()
        self.url = self._wait_ready(timeout)
        self.base = f"{self.url}/v1"

    def _pump(self, stream, out: bool) -> None:
        for line in stream:
            (self.lines.put if out else self.stderr.append)(line)

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            found = READY.search(line)
            if found:
                return found.group(1)
        self.kill()
        raise RuntimeError(f"the server did not start: {''.join(self.stderr)[-2000:]}")

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Send `sig` and wait for the exit status (killed after `timeout` seconds)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
