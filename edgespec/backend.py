"""The device MLX computes on, as one object: what EdgeSpec runs differently there.

    backend = for_device()                 # once per Engine (edgespec/device.py)
    fast = backend.model(loaded.model)     # the model it runs (here: the model itself)
    state = KVState(fast, "target", backend.new_cache, backend.softmax)

`Backend` is MLX's own way on a GPU (Metal, CUDA): the models as mlx-lm made them, mlx-lm's
caches (made rewindable, edgespec/rewind.py), MLX's softmax and attention, draft steps one token
at a time, quantized weights kept quantized. On MLX's CPU backend edgespec/device.py's
`for_device` returns the CPU backend instead (edgespec/cpu/backend.py, a subclass: optimised twins
of the models, its own caches, softmax and attention, draft steps in pairs under MKL, dequantized
weights); that is the only place that imports edgespec.cpu, so a GPU process loads none of it. Every "which device am I
on" decision is an attribute or method here, answered by the backend in use: the rest of EdgeSpec
asks the object, never the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from edgespec.drafting.token import DraftSteps
from edgespec.rewind import rewindable
from edgespec.sampling import Softmax

if TYPE_CHECKING:
    from edgespec.trees.forward import Kernels

__all__ = ["Backend", "on_cpu"]


def on_cpu() -> bool:
    """True when MLX computes on its CPU backend (no Metal / CUDA device is the default)."""
    return mx.default_device().type == mx.DeviceType.cpu


class Backend:
    """MLX's own forwards (a GPU). Subclassed by the CPU backend; not thread-safe, like the
    Engine that holds it."""

    name = "mlx"
    # loading/: dequantize quantized weights as they load (MLX's quantized matmul is slow on the
    # CPU; the same values in float32 arithmetic), and load unquantized ones as float32
    dequantizes = False
    # bench/: compile kernels per input shape before timing (MLX's CUDA backend compiles on
    # first use per shape, 48-66 s on an H100; the CPU backend compiles nothing per shape)
    compiles_per_shape = True
    # server/: a batch runs plain steps first (several requests' one-token steps fill the cheap
    # rows of one forward on the CPU; a GPU drafts from the start)
    batches_plain_first = False
    softmax: Softmax | None = None  # the sampling softmax (sampling.warp); None: MLX's own
    draft_steps = DraftSteps()  # how a token draft feeds its K steps (drafting/token.py)

    def model(self, model: Any) -> Any:
        """The model a state runs for `model`: here `model` itself."""
        return model

    def new_cache(self, model: Any) -> list[Any]:
        """A fresh prompt cache for `model`: mlx-lm's, with rewindable window layers."""
        return rewindable(make_prompt_cache(model))

    def kernels(self) -> Kernels:
        """The draft-tree (and packed) forward's attention and block parts: MLX's own."""
        from edgespec.trees.forward import PLAIN

        return PLAIN

    def recorded(self) -> dict[str, bool]:
        """What the bench records of this backend's rewrites (`environment.cpu_rewrites`): none."""
        return {}
