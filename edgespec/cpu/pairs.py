"""Draft steps in pairs: every token-draft forward multiplies two rows instead of one.

Intel MKL runs a one-row product (x [1, d] @ W.T) on one thread and a two-row one on every
thread, so on a 2-core machine a two-position draft step is the faster one (OpenBLAS is the other
way round; figures: docs/cpu-backend.md). A step with one new token therefore runs the newest
cached position again beside it: the cache is trimmed by one and [previous input, new token]
fed. The rerun position gets the same keys and values back (up to the BLAS's rounding); the
proposal is still drawn from, and verified against, the q the draft computed, so output is
unchanged whatever the draft computes.

The CPU backend (backend.py) hands these steps to token drafters under MKL (or wherever
EDGESPEC_CPU_OPT asks for `+draft_pairs`); drafting/token.py's ModelDrafter feeds them one token a
step otherwise, and wherever its cache restores rather than trims.

    steps = PairedSteps()
    inputs = steps.first(state, context)           # [newest cached token, pending token]
    inputs = steps.next(state, inputs, token)      # [last input, drafted token]
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from edgespec.cache import KVState
from edgespec.drafting.token import DraftSteps


class PairedSteps(DraftSteps):
    """DraftSteps whose one-token forwards run two positions (module docstring). The state's
    cache must go back by trimming (ModelDrafter checks)."""

    def first(self, state: KVState, context: list[int]) -> mx.array:
        if len(context) - state.offset == 1 and state.offset > 0:
            state.rewind(context, state.offset - 1)  # run the newest cached position again
        return super().first(state, context)

    def next(self, state: KVState, inputs: mx.array, token: mx.array) -> mx.array:
        trim_prompt_cache(state.cache, 1)  # [the previous input, the token drafted from it]
        return mx.concatenate([inputs[-1:], token.reshape(1)])
