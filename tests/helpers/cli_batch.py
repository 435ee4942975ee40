"""Run several `edgespec` commands in one process: `python -m tests.helpers.cli_batch` reads a
JSON list of {"argv": [...], "offline": bool} on stdin, runs each through `edgespec.cli.main`
(the console script's entry point) in order, and prints a JSON list of {"rc", "stdout",
"stderr"}, one per command. A test that runs dozens of short commands pays for the imports once
rather than per command (seconds each on a CI core).

"offline": from this command on, huggingface_hub is offline, as HF_HUB_OFFLINE=1 at start-up
would make it (the constant is read at import, so it is set there too): the commands after a
`pull` then show that it left everything a run needs in the caches.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

import mlx.core  # noqa: F401  (imported first: edgespec's BLAS re-exec then leaves this process be)


def run_one(argv: list[str]) -> dict[str, object]:
    """`edgespec *argv` here: its exit code and what it printed."""
    from edgespec.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as stop:  # argparse's refusals
            rc = stop.code if isinstance(stop.code, int) else 1
    return {"rc": rc, "stdout": out.getvalue(), "stderr": err.getvalue()}


def go_offline() -> None:
    import huggingface_hub.constants as hf_constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    hf_constants.HF_HUB_OFFLINE = True


def main() -> int:
    results = []
    for command in json.load(sys.stdin):
        if command.get("offline"):
            go_offline()
        results.append(run_one(list(command["argv"])))
    sys.stdout.write(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
