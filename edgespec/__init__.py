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
    "Finished",
    "GenerationConfig",
    "Round",
    "SamplingConfig",
    "SpecConfig",
    "Stats",
    "Token",
]
__version__ = "0.1.0"
