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

import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edgespec.cache import KVState
from edgespec.config import DEFAULT_K_MAX, SamplingConfig, SpecConfig
from edgespec.drafting.adaptive import AdaptiveK, FixedK, make_k_policy
from edgespec.drafting.base import PLAIN_ONLY, Capabilities, Drafter
from edgespec.drafting.review import Reviewer
from edgespec.families import NO_DRAFT, Family, chain_drafter, tree_drafter
from edgespec.loop import Chains, speculate
from edgespec.rounds import Limits, Policy, Rounds, Step

if TYPE_CHECKING:
    from edgespec.calibration import Calibration
    from edgespec.drafting.token import DraftSteps
    from edgespec.trees.forward import Kernels


@dataclass(frozen=True)
class Strategy:
    """One generation's parts. `rounds` None: plain decoding (rounds of K = 0, no drafter).
    `draft_prefill`: the draft reads the prompt too (a token draft into its own cache, a feature
    or block draft the target's features of it), as its family does it."""

    target: KVState
    draft: Any  # the family's draft state, or None
    family: Family = NO_DRAFT
    drafter: Drafter | None = None
    policy: Policy[Any] | None = None  # FixedK, AdaptiveK, a ShapePolicy
    rounds: Rounds | None = None
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
        return self.family.prefill(
            self.target, self.draft, prompt, cancel, on_chunk, self.draft_prefill
        )

    def steps(
        self,
        prompt: list[int],
        sampling: SamplingConfig,
        limits: Limits,
        cancel: threading.Event | None,
    ) -> Iterator[Step]:
        """The generation's Steps (after `prefill`). Plain decoding: rounds of K = 0, pipelined
        (edgespec/loop.py), reported without Round records. Chain and tree rounds show their
        plain steps to the reviews the policy reads (drafting/review.py), if any."""
        if self.rounds is None or self.drafter is None or self.policy is None:
            drafter = Drafter()
            plain = Chains(self.target, drafter, sampling)
            steps = speculate(
                self.target, plain, drafter, prompt, sampling, FixedK(PLAIN_ONLY), limits, cancel
            )
            return (dataclasses.replace(step, round=None) for step in steps)
        later = self.family.later(self.target, self.draft, self.draft_prefill)
        prepare = later.prefill if later is not None else None
        rounds = self.rounds
        watched = getattr(rounds, "watched", None)  # chain and tree rounds (loop.Chains, Trees)
        if watched is not None:  # the policy is known only now (Engine.generate's gate)
            rounds = watched(Reviewer.of(self.policy, self.drafter))
        return speculate(
            self.target,
            rounds,
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
    errors), the draft's family, the backend's token-draft steps (drafting/token.py DraftSteps), and the
    backend's tree-forward pieces (`kernels()`, asked for when a tree is first built)."""

    vocab: int
    name: str
    family: Family = NO_DRAFT
    draft_steps: DraftSteps | None = None
    kernels: Callable[[], Kernels] | None = None

    def build(
        self,
        spec: SpecConfig,
        sampling: SamplingConfig,
        target: KVState,
        draft: Any,
        drafter: Drafter | None = None,
        k_policy: Policy[Any] | None = None,
        calibration: Calibration | None = None,
    ) -> Strategy:
        """The Strategy for `spec` over these states. `drafter` / `k_policy` replace the ones the
        spec asks for (with a tree, k_policy is a trees.loop.ShapePolicy); `calibration` seeds
        adaptive K and the adaptive tree policies. Raises ConfigError / CacheNotTrimmableError /
        TreeUnsupportedError."""
        family = self.family
        if not spec.enabled:
            return Strategy(target, draft, family)
        own = spec.uses_draft and drafter is None
        # Plain decoding rewinds nothing that cannot start over; speculation must rewind.
        target.check_speculation()
        if draft is not None:
            family.prepare(draft, spec)
        if spec.tree:  # draft trees (edgespec/trees/loop.py)
            return self._trees(spec, sampling, target, draft, k_policy, own, calibration)
        if drafter is None:
            drafter = chain_drafter(
                spec, sampling, family, draft, self.vocab, self.name, self.draft_steps
            )
        policy = k_policy or self.k_policy(spec, drafter, calibration)
        reads = family.reads_features and Capabilities.of(drafter).features is not None
        rounds = Chains(target, drafter, sampling)
        return Strategy(target, draft, family, drafter, policy, rounds, own or reads)

    def _trees(self, spec, sampling, target, draft, k_policy, own, calibration) -> Strategy:
        from edgespec.trees.build import make_shape_policy
        from edgespec.trees.forward import PLAIN
        from edgespec.trees.loop import ShapePolicy, Trees
        from edgespec.trees.policy import AdaptiveTree

        kernels = self.kernels() if self.kernels is not None else PLAIN
        tree = tree_drafter(
            spec, sampling, self.family, draft, self.vocab, self.name, kernels, self.draft_steps
        )
        shapes: ShapePolicy = k_policy or make_shape_policy(spec)  # type: ignore[assignment]
        if calibration is not None and k_policy is None and isinstance(shapes, AdaptiveTree):
            shapes.seed(*calibration.medians(), *calibration.tree_medians())
        rounds: Rounds = Trees(target, tree, sampling, shapes, kernels)
        return Strategy(target, draft, self.family, tree, shapes, rounds, own)

    def k_policy(
        self, spec: SpecConfig, drafter: Drafter, calibration: Calibration | None
    ) -> Policy[int]:
        """Fixed K, or AdaptiveK seeded from the calibration. Adaptive hybrid: K is the draft
        model's (from its estimates); a lookup sizes its own proposals from the lookup's
        estimates (AdaptiveK.lookup_k)."""
        hybrid = Capabilities.of(drafter).lookups
        model = hybrid.model.method if hybrid else None  # "draft", or "block"
        k_max = k_bound(spec, hybrid.model if hybrid else drafter)
        policy = make_k_policy(
            min(spec.k, k_max), spec.adaptive, k_max, model, spec.long_match, drafter.method
        )
        if hybrid is not None and isinstance(policy, AdaptiveK):
            hybrid.lookup_k, hybrid.long_k = policy.lookup_k, policy.long_k
        if calibration is not None and isinstance(policy, AdaptiveK):
            policy.seed(*calibration.medians())
        return policy


def k_bound(spec: SpecConfig, drafter: Any) -> int:
    """Adaptive K's bound: spec.k_max, unless left at its default and the drafter is a block
    draft (`bound`: its block size - 1), whose one forward fills the block it was trained on;
    the policy chooses K within it by measured cost. Example: a b16 DFlash draft -> 15."""
    own = getattr(drafter, "bound", None)
    if own is None or spec.k_max != DEFAULT_K_MAX:
        return spec.k_max
    return max(1, int(own))
