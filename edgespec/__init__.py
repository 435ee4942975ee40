"""EdgeSpec: exact speculative decoding on MLX.

from edgespec import Engine, GenerationConfig, SamplingConfig, SpecConfig
engine = Engine.load()                      # the embedded default pair
for event in engine.chat([{"role": "user", "content": "Hi"}], GenerationConfig()):
    ...                                     # Token / Round / Finished records (edgespec.events)
"""

import os as _os
import sys as _sys


def _off_the_working_directory() -> None:
    """Under `python -m edgespec ...` (not -P), take the working directory off the import path
    before anything else is imported, as the `edgespec` command (whose path starts with its
    own folder) and its safe-path re-exec (edgespec/blas.py) do: a json.py where the
    server was started replaced the standard module. This package is already being imported,
    so its own modules still load from a source checkout."""
    argv = getattr(_sys, "orig_argv", [])
    pairs = zip(argv, argv[1:], strict=False)
    as_main = any(a == "-m" and b.split(".")[0] == __name__ for a, b in pairs)
    if not as_main or getattr(_sys.flags, "safe_path", False) or not _sys.path:
        return
    try:
        if _os.path.samefile(_sys.path[0] or _os.curdir, _os.curdir):
            del _sys.path[0]
    except OSError:  # the first entry is not a folder (a zip) or the cwd is gone: leave it
        pass


_off_the_working_directory()

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig  # noqa: E402
from edgespec.errors import EdgeSpecError  # noqa: E402
from edgespec.events import Finished, Round, Stats, Token  # noqa: E402

__all__ = [
    "EdgeSpecError",
    "Engine",
    "Finished",
    "GenerationConfig",
    "Round",
    "SamplingConfig",
    "SpecConfig",
    "Stats",
    "Token",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """`edgespec.Engine` without importing MLX at `import edgespec` (the CLI must be able to
    re-execute itself with an optimised BLAS before MLX loads; see edgespec/blas.py)."""
    if name == "Engine":
        from edgespec.runtime import Engine

        return Engine
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
