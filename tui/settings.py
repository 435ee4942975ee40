"""The chat's generation settings as the keys change them: pure functions from one
GenerationConfig to the next (the app shows them and applies them from the next answer)."""

from __future__ import annotations

import dataclasses

from edgespec.config import GenerationConfig

K_RANGE = (1, 16)
TEMP_RANGE, TEMP_STEP = (0.0, 2.0), 0.1


def with_method(config: GenerationConfig, method: str) -> GenerationConfig:
    """The config drafting with `method` ("none": plain decoding)."""
    return dataclasses.replace(config, spec=dataclasses.replace(config.spec, method=method))


def with_k(config: GenerationConfig, k: int) -> GenerationConfig:
    """K fixed at k (clamped to K_RANGE; adaptive K off, k_max raised to k if needed)."""
    k = max(K_RANGE[0], min(K_RANGE[1], k))
    spec = dataclasses.replace(config.spec, k=k, k_max=max(k, config.spec.k_max), adaptive=False)
    return dataclasses.replace(config, spec=spec)


def with_adaptive(config: GenerationConfig, on: bool) -> GenerationConfig:
    """Adaptive K on or off (K chosen each round from the measured costs)."""
    return dataclasses.replace(config, spec=dataclasses.replace(config.spec, adaptive=on))


def with_temperature(config: GenerationConfig, t: float) -> GenerationConfig:
    """The temperature t, clamped to TEMP_RANGE and rounded to 0.01 (0 = greedy)."""
    t = round(max(TEMP_RANGE[0], min(TEMP_RANGE[1], t)), 2)
    return dataclasses.replace(config, sampling=dataclasses.replace(config.sampling, temperature=t))
