"""Start the real `edgespec serve` in a subprocess on a free localhost port (tests, benchmark).

    srv = ServerProcess("--pair", "smollm2-135m")     # waits for the ready line
    openai.OpenAI(base_url=srv.base, api_key="none")  # srv.base: "http://127.0.0.1:PORT/v1"
    srv.terminate()                                   # SIGTERM; returns the exit status

Run from a checkout, the subprocess imports that checkout (PYTHONPATH), as tests/helpers/cli.py
does.
"""

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
from typing import IO

from edgespec.errors import EdgeSpecError

ROOT = Path(__file__).resolve().parents[2]  # the checkout, when run from one
READY = re.compile(r"at (http://127\.0\.0\.1:\d+)/v1")


class ServerStartError(EdgeSpecError):
    """The server subprocess exited or stayed silent before saying it was ready."""


class ServerProcess:
    """`python -m edgespec serve ARGS --port 0`; `url` once it said it is ready."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, timeout: float = 180):
        checkout = (ROOT / "edgespec" / "__init__.py").exists()
        extra = {"PYTHONPATH": str(ROOT)} if checkout else {}
        full_env = dict(os.environ, **extra, **(env or {}))
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
            cwd=ROOT if checkout else None,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True).start()
        self.url = self._wait_ready(timeout)
        self.base = f"{self.url}/v1"

    def _pump(self, stream: IO[str], out: bool) -> None:
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
        tail = "".join(self.stderr).strip().splitlines()[-1:] or ["no output"]
        raise ServerStartError(f"edgespec serve did not start: {tail[0]}")

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
