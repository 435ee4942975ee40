"""EdgeSpec: exact speculative decoding on MLX.

from edgespec import Engine, GenerationConfig, SamplingConfig, SpecConfig
engine = Engine.load()                      # the embedded default pair
for event in engine.chat([{"role": "user", "content": "Hi"}], GenerationConfig()):
    ...                                     # Token / Round / Finished records (edgespec.events)
"""

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.errors import EdgeSpecError
from edgespec.events import Finished, Round, Stats, Token

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
    re-execute itself with an optimised BLAS before MLX loads; see edgespec/cpu/blas.py)."""
    if name == "Engine":
        from edgespec.runtime import Engine

        return Engine
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
