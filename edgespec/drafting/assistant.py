"""Running a Gemma 4 assistant (edgespec/architectures/gemma4_assistant.py): its state across
rounds and its drafter.

The assistant keeps no cache: each round it reads the target's. AssistantState holds the target's
KVState and one feature: the target's final-normed top hidden state at position n - 1 of the
committed context x_0..x_n (the verify that committed x_n computed it). A round (propose) reads the
keys and values of the target's last sliding and last full cache layer as they hold x_0..x_{n-1}
(the loop's invariant; with the draft's attention bound, bound.Bound, past its start only the
full layer's sinks and last window of them), then runs K draft steps at position n - 1, each on
the token drafted before it (x_n first) and the hidden state the step before returned (the
feature first).

Exact like any draft: at T > 0 token i is drawn from q_i = warp(logits_i) with the round's
uniform u_i and the ratio test min(1, p_i / q_i) judges it against that same q_i; at T = 0 it is
the argmax. A feature that does not match the context (a new prompt, a one-token prompt) makes
the round a plain target step, never a wrong one.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from edgespec.architectures.gemma4_assistant import KV, Gemma4Assistant
from edgespec.bound import Bound
from edgespec.cache import KVState
from edgespec.config import SamplingConfig
from edgespec.drafting.base import Capabilities, Drafter, Proposal, no_proposal
from edgespec.drafting.feature import FeatureState
from edgespec.drafting.token import fit_vocab, full_q, pick_token
from edgespec.rewind import WindowKVCache
from edgespec.sampling import Softmax, sampler
from edgespec.taps import text_model


def _no_cache(_model: Any) -> list[Any]:
    return []


class AssistantState(FeatureState):
    """A FeatureState over the assistant (its `kv` holds no layers) that keeps only the newest
    feature: `features` [1, B] is the target's top hidden state at position `at`, computed from
    context[: at + 1]. It covers a context of at + 2 tokens that starts with those."""

    def __init__(
        self,
        model: Gemma4Assistant,
        target: KVState,
        name: str = "draft",
        softmax: Softmax | None = None,
    ):
        super().__init__(model, name, _no_cache, softmax)  # type: ignore[arg-type]
        self.assistant, self.target, self.at = model, target, -1

    def covers(self, context: list[int]) -> bool:
        at = self.at
        return (
            self.features is not None
            and at == len(context) - 2
            and (self.context[: at + 1] == context[: at + 1])
        )

    def reusable(self, prompt: list[int]) -> int:
        """All of prompt[:-1] when the feature covers the prompt, else all but its last position,
        so that a prefill computes the feature the first round drafts from."""
        return len(prompt) - 1 if self.covers(prompt) else max(len(prompt) - 2, 0)

    def set_features(self, context: list[int], start: int, new: mx.array) -> None:
        """The features of positions start.. (committed); only the newest is kept."""
        n = int(new.shape[0])
        if n > 0:
            self.features, self.at = new[-1:], start + n - 1
        self.context = list(context)

    def rewind(self, keep: int) -> None:
        """Nothing drafted is kept: there is nothing to roll back."""

    def reset(self) -> None:
        self.context, self.features, self.at = [], None, -1


def _held(layer: Any, n: int, bound: Bound | None = None) -> tuple[mx.array, mx.array]:
    """A target cache layer's keys and values of its held positions before `n`, oldest first;
    with a `bound` (a draft's attention bound, bound.Bound) past its start, only those of its
    sinks and of the last `bound.window` positions (a full layer's: a window holds no more)."""
    if isinstance(layer, WindowKVCache):  # positions layer.start.. (a target's has no sinks)
        n, bound = layer.size(), None
    spans = [(0, n)]
    if bound is not None and n > bound.start:
        spans = [(0, bound.sinks), (n - bound.window, n)]

    def held(part: Any, a: int, b: int) -> mx.array:
        if isinstance(layer, QuantizedKVCache):  # --kv-bits: (codes, scales, biases) each
            codes, scales, biases = (x[..., a:b, :] for x in part)
            group, bits = layer.group_size, layer.bits
            return mx.dequantize(codes, scales, biases, group_size=group, bits=bits)
        return part[..., a:b, :]

    if not isinstance(layer, QuantizedKVCache | WindowKVCache | KVCache):
        raise TypeError(f"a Gemma 4 assistant cannot read a {type(layer).__name__} cache")
    assert layer.keys is not None and layer.values is not None
    keys, values = ([held(part, a, b) for a, b in spans] for part in (layer.keys, layer.values))
    if len(spans) == 1:
        return keys[0], values[0]
    return mx.concatenate(keys, axis=2), mx.concatenate(values, axis=2)


def shared_kv(target: KVState, window: int, bound: Bound | None = None) -> KV:
    """Per layer kind, the keys and values a draft query at position target.offset - 1 sees:
    those of the target's last cache layer of that kind (what its KV-shared layers read too),
    all positions (full; with a `bound`, the draft's attention bound, its sinks and last window
    past its start) or the last `window` (sliding)."""
    cache = target.cache
    kinds = text_model(target.model).args.layer_types[: len(cache)]
    last = {kind: layer for kind, layer in zip(kinds, cache, strict=True)}
    out: KV = {}
    for kind, layer in last.items():
        keys, values = _held(layer, target.offset, bound)
        if kind == "sliding_attention":
            keys, values = keys[..., -window:, :], values[..., -window:, :]
        out[kind] = (keys, values)
    return out


class AssistantDrafter(Drafter):
    """Drafter over an AssistantState (module docstring). The loop hands the verify's features
    to `take_features`; nothing needs rolling back after a round."""

    def __init__(self, state: AssistantState, sampling: SamplingConfig, vocab: int):
        self.state, self.sampling, self.vocab = state, sampling, vocab

    def take_features(self, context: list[int], start: int, features: mx.array) -> None:
        self.state.set_features(context, start, features)

    def capabilities(self) -> Capabilities:
        return Capabilities(features=self)  # it reads the verify's features

    def propose(self, context: list[int], k: int, key: mx.array) -> Proposal:
        st = self.state
        if not st.covers(context) or st.target.offset != len(context) - 1:
            return no_proposal()  # no feature for this context yet: a plain target step
        model = st.assistant
        kv = shared_kv(st.target, model.window, st.kv.bound)  # prepare set the bound
        assert st.features is not None
        hidden = st.features[None]
        token = mx.array([context[-1]], dtype=mx.int32)
        u = sampler(self.sampling).uniforms(key, k)
        tokens: list[mx.array] = []
        rows: list[mx.array] = []
        for i in range(k):
            logits, hidden = model.draft_step(token, hidden, kv, len(context) - 2)
            logits = fit_vocab(logits, self.vocab)
            tok = pick_token(logits, self.sampling, u, i, None, rows, st.kv.softmax)
            tokens.append(tok)
            mx.async_eval(tok)
            token = tok.reshape(1)
        q = full_q(rows, None, self.vocab) if rows else None
        return Proposal(mx.stack(tokens), q)
