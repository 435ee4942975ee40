"""Running a feature draft (edgespec/architectures/eagle.py): its state across rounds and its drafter.

State across rounds (FeatureState, kept by the Engine between generations):
- `features` [P, d]: f_0 .. f_{P-1} of `context` (the target's features of committed tokens; the
  newest committed token's feature is computed by the next verify, so P = len(context) - 1);
- the draft's KV cache: position i holds (f_i, context[i + 1]) for i < kv.offset, always from true
  features (positions run on the draft's own guesses are rolled back after every round).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from edgespec.architectures.eagle import EagleModel
from edgespec.architectures.mtp import MtpModel
from edgespec.cache import PREFILL_CHUNK, KVState, common_prefix
from edgespec.config import SamplingConfig
from edgespec.drafting.base import Capabilities, Drafter, Proposal, no_proposal
from edgespec.drafting.token import full_q, pick_token
from edgespec.sampling import Softmax, sampler

FEATURE_ROOM = 256  # rows a fresh feature buffer holds at least


class FeatureState:
    """A feature draft's KV cache plus the target features of the context it follows.

    Invariants: features[i] was computed from context[: i + 1]; draft cache position i holds
    (features[i], context[i + 1]) for every i < kv.offset, from true features only.
    """

    def __init__(
        self,
        model: EagleModel | MtpModel,
        name: str = "draft",
        new_cache: Callable[[Any], list[Any]] = make_prompt_cache,
        softmax: Softmax | None = None,
    ):
        self.model = model
        self.kv = KVState(model, name, new_cache, softmax)
        self.context: list[int] = []
        self.features = None  # [P, d]: the first P rows of a buffer with room for more

    @property
    def features(self) -> mx.array | None:
        return None if self._buffer is None else self._buffer[: self._held]

    @features.setter
    def features(self, value: mx.array | None) -> None:
        self._buffer, self._held = value, 0 if value is None else int(value.shape[0])

    @property
    def n_features(self) -> int:
        return 0 if self._buffer is None else self._held

    def reusable(self, prompt: list[int]) -> int:
        """How many of `prompt`'s features are already known (feature i depends on tokens <= i)."""
        return min(common_prefix(self.context, prompt), self.n_features)

    def set_features(self, context: list[int], start: int, new: mx.array) -> None:
        """Record the features of context positions start .. start + len(new) - 1 (committed
        tokens; `new` as the target returned them, fused here: EagleModel.fuse); those before
        `start` must already be known. Rolls the cache back to what stays valid (positions
        drafted on guesses, or whose token changed)."""
        new = self.model.fuse(new)
        common = common_prefix(self.context, context)
        if start > min(self.n_features, common):
            raise ValueError(f"feature gap: {min(self.n_features, common)} known, next at {start}")
        self._write(start, new)
        self.context = list(context)
        self.rewind(min(self.kv.offset, start, max(common - 1, 0)))

    def _write(self, start: int, new: mx.array) -> None:
        """features[start:] = new, in a buffer that doubles when full: a round writes its few
        rows without copying the whole context's (as mlx-lm's KVCache grows)."""
        end, buffer = start + int(new.shape[0]), self._buffer
        if buffer is None or start == 0 or buffer.shape[1:] != new.shape[1:]:
            buffer = None  # a fresh one (the rows before start, if any, are kept below)
        if buffer is None or end > buffer.shape[0]:
            grown = mx.zeros((max(FEATURE_ROOM, 2 * end), *new.shape[1:]), dtype=new.dtype)
            if buffer is not None:
                grown[:start] = buffer[:start]
            buffer = grown
        buffer[start:end] = new.astype(buffer.dtype)
        self._buffer, self._held = buffer, end

    def covers(self, context: list[int]) -> bool:
        """Whether the features are those of context[:-1] exactly (at least one): what a draft
        forward after `context` needs."""
        p = self.n_features
        return 0 < p == len(context) - 1 and self.context[:p] == context[:p]

    def first_input(self, context: list[int]) -> tuple[mx.array, mx.array] | None:
        """The draft's next input after `context`: the (features, tokens) of the positions its
        cache does not hold yet, at least one (its output is the first guess); None when the
        features do not cover context[:-1] (a one-token prompt: a plain target step). More than
        PREFILL_CHUNK such positions (a long prompt's): all but the last chunk are run here, a
        chunk at a time, as the target's prefill is (one forward over all of them would hold
        their number squared of attention scores per head: 32K positions, 4 GiB of float32)."""
        if not self.covers(context):
            return None
        p = self.n_features
        if self.kv.offset >= p:  # feed at least one position
            self.rewind(p - 1)
        start = self.kv.catch_up(context[:p], lambda a, b: self.read(context, a, b))
        assert self.features is not None
        while p - start > PREFILL_CHUNK:
            self.read(context, start, start + PREFILL_CHUNK)
            mx.eval([c.state for c in self.kv.cache])
            start += PREFILL_CHUNK
        toks = mx.array(context[start + 1 : p + 1], dtype=mx.int32)[None]
        return self.features[start:p][None], toks

    def read(self, context: list[int], start: int, stop: int) -> None:
        """Feed draft positions start..stop - 1 (true features, the tokens after them) into the
        cache, lazily: a bounded draft's sinks (KVState.catch_up)."""
        assert self.features is not None
        toks = mx.array(context[start + 1 : stop + 1], dtype=mx.int32)[None]
        self.model(self.features[start:stop][None], toks, cache=self.kv.cache)

    def rewind(self, keep: int) -> None:
        self.kv.rewind(self.context, keep)

    def reset(self) -> None:
        self.kv.reset()
        self.context, self.features = [], None


def prefill(target: KVState, state: FeatureState, prompt: list[int], chunk: int) -> int:
    """KVState.prefill for a target driving a feature draft: the target's cache ends up holding
    prompt[:-1] and `state` the features of those positions. Reuses what both still hold.
    Returns the number of prompt tokens that will be run (as KVState.prefill). A recurrent
    target keeps a restore point at prompt[:-1] (as KVState.prefill does), so that a request
    repeating the prompt, or ending inside the last answer, is not read from the start again."""
    keep = min(common_prefix(target.tokens, prompt), len(prompt) - 1, state.reusable(prompt))
    target.rewind(target.tokens, keep)
    keep = target.offset  # keep, or earlier: a recurrent cache lands on a restore point
    parts = []
    for start in range(keep, len(prompt) - 1, chunk):
        ids = prompt[start : min(start + chunk, len(prompt) - 1)]
        feats, _ = target.forward_features(mx.array(ids, dtype=mx.int32))
        mx.eval(feats, [c.state for c in target.cache])
        parts.append(feats)
    target.tokens = list(prompt[:-1])
    target.layers.mark_anchor()
    width = len(state.model.feature_layers) * state.model.args.hidden_size
    new = mx.concatenate(parts) if parts else mx.zeros((0, width))
    state.set_features(prompt, keep, new)
    return len(prompt) - keep


class FeatureDrafter(Drafter):
    """Drafter over an FeatureState. Head-only like ModelDrafter's reduced-head path: argmax / warp /
    sample over the H head columns, q scattered to the vocabulary once per round.

    propose(context): one catch-up forward over the draft positions not yet run (the n + 1 tokens
    committed last round; the whole prompt after a prefill) gives the first guess; each further
    token is a one-position forward on the previous guess. The loop hands the verify's features
    to `take_features`, which also rolls back the positions drafted on guesses.
    """

    def __init__(self, state: FeatureState, sampling: SamplingConfig, vocab: int):
        self.state, self.sampling, self.vocab = state, sampling, vocab
        self.head_ids = state.model.head_ids
        self._valid = state.kv.offset

    def take_features(self, context: list[int], start: int, new: mx.array) -> None:
        self.state.set_features(context, start, new)

    def capabilities(self) -> Capabilities:
        return Capabilities(features=self)  # it reads the verify's features

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        st, kv = self.state, self.state.kv
        first = st.first_input(context)
        if first is None:
            return no_proposal()  # no features yet (a one-token prompt): a plain target step
        feats, toks = first
        self._valid = st.n_features
        u = sampler(self.sampling).uniforms(key, k)
        tokens: list[mx.array] = []
        rows: list[mx.array] = []
        for i in range(k):
            guess = st.model(feats, toks, cache=kv.cache)[:, -1:]
            logits = st.model.head_logits(guess)[0, 0]
            tok = pick_token(logits, self.sampling, u, i, self.head_ids, rows, kv.softmax)
            tokens.append(tok)
            feats = guess if st.model.chain == "guess" else mx.zeros_like(guess)
            toks = tok.reshape(1, 1)
            mx.async_eval(tok)
        q = full_q(rows, self.head_ids, self.vocab) if rows else None
        return Proposal(mx.stack(tokens), q)

    def commit(self, context: list[int]) -> None:
        """Drop the positions drafted on guesses (take_features usually did already)."""
        kv = self.state.kv
        self.state.rewind(min(kv.offset, self._valid, self.state.n_features))
