"""The round's parts for one generation, from a SpecConfig and the loaded models' states: the
drafter, the K or shape policy, and the rounds the loop runs (chains or trees), or plain decoding.
The Engine (runtime.py) holds the models, their caches and a RoundFactory; it asks the factory for a
Strategy per request and runs it, never looking at what kind of draft it holds.

    strategy = factory.build(config.spec, config.sampling, target_state, draft_state)
    prefilled = strategy.prefill(prompt)
    for step in strategy.steps(prompt, config.sampling, limits, cancel):
        ...
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from edgespec.architectures.gemma4_assistant import Gemma4Assistant
from edgespec.cache import PREFILL_CHUNK, Bound, KVState, quantized
from edgespec.calibration import Calibration
from edgespec.config import DRAFT_SINKS, SamplingConfig, SpecConfig
from edgespec.drafting.adaptive import AdaptiveK, make_k_policy
from edgespec.drafting.assistant import AssistantState
from edgespec.drafting.base import Drafter, FeatureInput
from edgespec.drafting.block import BlockModel
from edgespec.drafting.block_draft import BlockState
from edgespec.drafting.build import build_drafter
from edgespec.drafting.eagle import EagleModel
from edgespec.drafting.features import EagleState
from edgespec.drafting.features import prefill as feature_prefill
from edgespec.drafting.hybrid import HybridDrafter
from edgespec.drafting.mtp import MtpModel
from edgespec.loop import Chains, Rounds, decode_plain, speculate
from edgespec.rounds import Limits, Step
from edgespec.trees.build import build_tree_drafter, make_shape_policy
from edgespec.trees.forward import PLAIN, Kernels
from edgespec.trees.loop import ShapePolicy, Trees


@dataclass(frozen=True)
class Strategy:
    """One generation's parts. `rounds` None: plain decoding (no drafter, no policy).
    `feature_prefill`: the prompt's target features go to the feature draft's state;
    `draft_prefill`: a token draft prefills its own cache."""

    target: KVState
    draft: KVState | EagleState | None
    drafter: Drafter | None = None
    policy: Any = None  # a rounds.Policy (AdaptiveK, a ShapePolicy) or a callable (last) -> K
    rounds: Rounds | None = None
    feature_prefill: bool = False
    draft_prefill: bool = False

    def prefill(
        self,
        prompt: list[int],
        cancel: threading.Event | None = None,
        on_chunk: Callable[[int, int], object] | None = None,
    ) -> int:
        """Bring the caches up to the prompt (reusing their common prefix); prompt tokens run.
        Without a feature draft, a short uncached tail (cache.MERGE_MAX) is left to the target's
        first forward (the first round's verify, or plain step), which gives the first token.
        `on_chunk` and `cancel`: KVState.prefill's, for the target's prefill (and `cancel` for a
        token draft's); a cancelled prefill leaves each cache holding a prefix of the prompt."""
        if self.feature_prefill and isinstance(self.draft, EagleState):
            return feature_prefill(self.target, self.draft, prompt, PREFILL_CHUNK)
        prefilled = self.target.prefill(prompt, merge=True, cancel=cancel, on_chunk=on_chunk)
        if (later := self._draft_later()) is not None:
            later.keep_common(prompt)  # it reads the prompt when it first drafts (`steps`)
        elif self.draft_prefill and isinstance(self.draft, KVState):
            self.draft.prefill(prompt, cancel=cancel)
        return prefilled

    def _draft_later(self) -> KVState | None:
        """The token draft whose prompt reading waits for its first drafting round: in a packed
        batch (the target has a packer), which may decode plainly for a while; else None."""
        draft = self.draft
        if self.draft_prefill and isinstance(draft, KVState) and self.target.packer is not None:
            return draft
        return None

    def steps(
        self,
        prompt: list[int],
        sampling: SamplingConfig,
        limits: Limits,
        cancel: threading.Event | None,
    ) -> Iterator[Step]:
        """The generation's Steps (after `prefill`)."""
        if self.rounds is None or self.drafter is None:
            return decode_plain(self.target, prompt, sampling, limits, cancel)
        later = self._draft_later()
        prepare = later.prefill if later is not None else None
        return speculate(
            self.target,
            self.rounds,
            self.drafter,
            prompt,
            sampling,
            self.policy,
            limits,
            cancel,
            prepare,
        )


@dataclass(frozen=True)
class RoundFactory:
    """What the factory knows of the loaded pair: the target's vocabulary, the pair's name (for
    errors), draft steps in pairs (edgespec.cpu.draft_pairs), the backend's tree-forward pieces."""

    vocab: int
    name: str
    pairs: bool = False
    kernels: Kernels = PLAIN

    def build(
        self,
        spec: SpecConfig,
        sampling: SamplingConfig,
        target: KVState,
        draft: KVState | EagleState | None,
        drafter: Drafter | None = None,
        k_policy: Callable[..., Any] | None = None,
        calibration: Calibration | None = None,
    ) -> Strategy:
        """The Strategy for `spec` over these states. `drafter` / `k_policy` replace the ones the
        spec asks for (with a tree, k_policy is a trees.loop.ShapePolicy); `calibration` seeds
        adaptive K. Raises ConfigError / CacheNotTrimmableError / TreeUnsupportedError."""
        if not spec.enabled:
            return Strategy(target, draft)
        own = spec.uses_draft and drafter is None
        # Plain decoding rewinds nothing that cannot start over; speculation must rewind.
        target.check_speculation()
        if spec.method in ("draft", "hybrid") and isinstance(draft, KVState):
            draft.check_speculation()
        if isinstance(draft, KVState):  # a tree's forward needs the draft's full cache
            window = 0 if spec.tree else spec.draft_window
            draft.bound = Bound(window, DRAFT_SINKS) if window else None
            if draft.bound is None:
                draft.unbind()
        if spec.tree:  # draft trees (edgespec/trees/loop.py)
            tree = build_tree_drafter(
                spec, sampling, draft, self.vocab, self.name, self.kernels, self.pairs
            )
            shapes: ShapePolicy = k_policy or make_shape_policy(spec)  # type: ignore[assignment]
            rounds: Rounds = Trees(target, tree, sampling, shapes, self.kernels)
            return Strategy(target, draft, tree, shapes, rounds, own, own)
        if drafter is None:
            drafter = build_drafter(spec, sampling, draft, self.vocab, self.name, pairs=self.pairs)
        policy = k_policy or self.k_policy(spec, drafter, calibration)
        features = own or isinstance(drafter, FeatureInput)
        return Strategy(
            target, draft, drafter, policy, Chains(target, drafter, sampling), features, own
        )

    def k_policy(
        self, spec: SpecConfig, drafter: Drafter, calibration: Calibration | None
    ) -> Callable[..., int]:
        """Fixed K, or AdaptiveK seeded from the calibration. Adaptive hybrid: K is the draft
        model's (from its estimates); a lookup sizes its own proposals from the lookup's
        estimates (AdaptiveK.lookup_k)."""
        hybrid = drafter if isinstance(drafter, HybridDrafter) else None
        model = hybrid.model.method if hybrid else None  # "draft", or "block"
        policy = make_k_policy(spec.k, spec.adaptive, spec.k_max, model, spec.long_match)
        if hybrid is not None and isinstance(policy, AdaptiveK):
            hybrid.lookup_k = policy.lookup_k
        if calibration is not None and isinstance(policy, AdaptiveK):
            policy.seed(*calibration.medians())
        return policy


def new_states(
    cpu: Any, target: Any, draft: Any | None, kv_bits: int | None = None
) -> tuple[KVState, KVState | EagleState | None]:
    """Empty caches for a loaded target and draft (or None), over the backend `cpu`'s twins of
    the models, its caches and sampling softmax (edgespec/cpu/backend.py): a block draft's
    BlockState, a feature draft's EagleState (the target then returns the features it reads), a
    token draft's KVState. `kv_bits` (8 or 4): the target's and a token draft's full-attention
    layers are quantized caches (cache.quantized); a feature or block draft keeps its own, which
    its own attention code reads."""
    backend = (cpu.new_cache, cpu.softmax)
    kv = (quantized(cpu.new_cache, kv_bits), cpu.softmax)
    state: KVState | EagleState | None = None
    verifier = KVState(cpu.model(target.model), f"target {target.name}", *kv)
    if draft is not None and isinstance(draft.model, BlockModel):  # a block draft
        state = BlockState(draft.model, f"draft {draft.name}", *backend)
        verifier.feature_layers = draft.model.feature_layers
    elif draft is not None and isinstance(draft.model, Gemma4Assistant):  # reads the target's
        state = AssistantState(draft.model, verifier, f"draft {draft.name}", cpu.softmax)
    elif draft is not None and isinstance(draft.model, EagleModel | MtpModel):  # features
        state = EagleState(cpu.model(draft.model), f"draft {draft.name}", *backend)
        verifier.feature_layers = draft.model.feature_layers  # what it reads
    elif draft is not None:
        state = KVState(cpu.model(draft.model), f"draft {draft.name}", *kv)
    return verifier, state


def cached_ids(draft: KVState | EagleState | None) -> list[int] | None:
    """The token ids a draft state's KV cache holds (None without a draft)."""
    kv = draft.kv if isinstance(draft, EagleState) else draft
    return list(kv.tokens) if kv is not None else None
