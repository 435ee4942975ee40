"""The oldest mlx-lm that can build each model_type a catalogue pair loads, and a pair's floor.

mlx-lm builds a checkpoint from `config.json`'s `model_type`: `mlx_lm.models.<type>`, after
`MODEL_REMAPPING` in `mlx_lm/utils.py` (e.g. `gemma4_unified` -> `gemma4`). A type it does not
map fails the load with "Model type ... not supported", after the download. So each catalogue pair
lists the model types it loads (`model_types` in models/catalog.json: the target's and a token
draft's; EdgeSpec's own draft architectures are not mlx-lm's) and its floor is the newest of
their first releases, or the pair's own `min_mlx_lm` where something else needs a newer one.

    pair_floor(("qwen3", "gemma4_unified"), None)   # -> ("0.32.0", "model_type gemma4_unified")
    pair_floor(("gemma4",), "0.31.3")               # -> ("0.31.3", "")

Sources: the history of github.com/ml-explore/mlx-lm (`git log --diff-filter=A` on the model
file, `git tag --contains` for the release, `_version.py` for commits after the last tag). That
repository's first tag is v0.22.0; releases before it were cut from ml-explore/mlx-examples, so
for the older families the floor below is the first release of mlx-lm's own repository, a safe
floor rather than the very first. Imports nothing heavy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Floor:
    """The first mlx-lm release that maps a model_type, and where that was read."""

    release: str
    source: str


_FIRST_TAG = "already in v0.22.0, the first tag of ml-explore/mlx-lm"
MLX_LM_FLOORS: dict[str, Floor] = {
    "llama": Floor("0.22.0", f"mlx_lm/models/llama.py, {_FIRST_TAG}"),
    "qwen2": Floor("0.22.0", f"mlx_lm/models/qwen2.py, {_FIRST_TAG}"),
    "gemma3_text": Floor("0.22.0", f"mlx_lm/models/gemma3_text.py, {_FIRST_TAG}"),
    "gemma3": Floor("0.22.1", "mlx_lm/models/gemma3.py, mlx-lm PR #21 (70d555b3), tag v0.22.1"),
    "qwen3": Floor("0.24.1", "mlx_lm/models/qwen3.py, mlx-lm PR #41 (5c2c18d6), tag v0.24.1"),
    "qwen3_5": Floor("0.30.7", "mlx_lm/models/qwen3_5.py, mlx-lm PR #869 (0fd31264), tag v0.30.7"),
    "gemma4": Floor("0.31.2", "mlx_lm/models/gemma4.py, mlx-lm PR #1093 (4469ad46), tag v0.31.2"),
    "gemma4_unified": Floor(
        "0.32.0",
        "MODEL_REMAPPING gemma4_unified -> gemma4 in mlx_lm/utils.py, mlx-lm PR #1349 "
        "(8239c72d, after tag v0.31.3; first released in 0.32.0)",
    ),
}


def release(text: str) -> tuple[int, ...]:
    """The leading release numbers of a version string ('0.31.2.dev1' -> (0, 31, 2))."""
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3])


def pair_floor(model_types: tuple[str, ...], declared: str | None) -> tuple[str, str] | None:
    """(the oldest mlx-lm the pair runs on, why) or None when nothing bounds it: the newest of
    its model types' floors and its declared `min_mlx_lm` (why: "" for the declared one). An unknown type raises KeyError
    (the catalogue refuses it when read, loading/specs.py)."""
    best: tuple[str, str] | None = None
    for t in model_types:
        floor = MLX_LM_FLOORS[t].release
        if best is None or release(floor) > release(best[0]):
            best = (floor, f"model_type {t}")
    if declared is not None and (best is None or release(declared) > release(best[0])):
        best = (declared, "")
    return best
