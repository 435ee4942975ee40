"""Draft families: how a loaded draft is run, chosen once when the pair is loaded.

    family = family_of(loaded_draft)        # the one place that asks what kind of draft it is
    target, draft = family.new_states(backend, loaded_target, loaded_draft, kv_bits)
    drafter = chain_drafter(spec, sampling, family, draft, vocab, name)

A family (`Family`) owns its draft's state across rounds, the prompt's prefill, its chain
drafter, its tree drafter (or a one-line refusal) and what it offers; the Engine and the round
factory ask the family, never the draft's type (the server, which copies and weighs cache sets,
asks a draft's state itself: edgespec/server/prefix.py):

- no draft (`NoDraft`): plain decoding or n-gram lookups only;
- token (`TokenFamily`, here: the default): a draft LM with its own KV cache (EdgeSpec's drafts,
  any mlx-lm model);
- feature (families/feature_family.py): EAGLE, EAGLE-3, MTP and next-n heads fed the target's
  hidden states (`own_head`: the target's own MTP / next-n head, `--method mtp`);
- block (families/block_family.py): DFlash-style block drafts, a whole block in one forward
  (DFlash2 drafts, model class `draft_family` "dflash2", are its variant whose chains walk a
  selector);
- assistant (families/assistant_family.py): Gemma 4's `-assistant` heads, which read the target's
  top hidden state and its KV cache (no cache of their own); also `--method mtp`.

The methods "ngram" and "hybrid" are choices over a family (`chain_drafter`, `tree_drafter`): a
lookup alone, or a lookup in front of the family's model drafter. Which family runs a model is
the model class's `draft_family` (edgespec/architectures/); each family's module is imported
only when a draft of that family is loaded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import mlx.core as mx

from edgespec.cache import Forward, KVState, quantized
from edgespec.config import DRAFT_WINDOW, WHOLE_CONTEXT, SamplingConfig, SpecConfig
from edgespec.drafting.base import Drafter
from edgespec.drafting.ngram import HYBRID_MIN_MATCH, HybridDrafter, NgramDrafter
from edgespec.drafting.token import DraftSteps, ModelDrafter, fit_vocab
from edgespec.errors import ConfigError

if TYPE_CHECKING:
    from edgespec.trees.forward import Kernels
    from edgespec.trees.proposal import TreeDrafter

OnChunk = Callable[[int, int], object] | None


class Family(Protocol):
    """What every family answers; the bodies are the empty family's (`NoDraft`). A family module
    imported by `family_of` answers it in full without importing this one
    (families/feature_family.py). `name`: "none", "token", "feature", "block" or "assistant".
    `reads_features`: its drafter reads the verify's features (FeatureInput); `own_head`: the
    target's own MTP / next-n head (`--method mtp`); `blocks`: it drafts a whole block in one
    forward (`--method block`); `reads_target_cache`: it keeps no cache of its own (nothing of it to
    check for rewinding). `default_window`: the draft window (SpecConfig.draft_window; 0: the
    whole context) its drafts get when a request asks for none (SpecConfig.window), measured per
    family (docs/drafting.md, Long contexts)."""

    name: str
    reads_features: bool
    own_head: bool
    blocks: bool
    reads_target_cache: bool

    @property
    def default_window(self) -> int:
        return WHOLE_CONTEXT  # no draft to bound

    def new_states(
        self,
        backend: Any,
        target: Any,
        draft: Any | None,
        kv_bits: int | None = None,
        run: Forward | None = None,
        kind: type[KVState] = KVState,
    ) -> tuple[KVState, Any]:
        """Empty caches for a loaded target and this family's draft, over the backend's
        models (its twins on the CPU), its caches and sampling softmax (edgespec/backend.py).
        `kv_bits` (8 or 4): the target's (and a token draft's) full-attention layers are
        quantized caches (cache.quantized). `run`: who runs the target's (and a token draft's)
        forwards (cache.Forward: a server's batch packs them; None: each state its own).
        `kind`: the target state's class (KVState, or a caller's subclass of it)."""
        kv = (quantized(backend.new_cache, kv_bits), backend.softmax)
        return kind(backend.model(target.model), f"target {target.name}", *kv, run), None

    def prepare(self, state: Any, spec: SpecConfig) -> None:
        """Before a speculative generation: check that the draft's cache can rewind and bound it
        to `spec`'s window (a tree's forward needs the draft's full cache)."""
        return None

    def prefill(
        self,
        target: KVState,
        state: Any,
        prompt: list[int],
        cancel: threading.Event | None,
        on_chunk: OnChunk,
        draft_too: bool,
    ) -> int:
        """Bring the target's cache (and, `draft_too`, the draft's) up to the prompt; returns
        the prompt tokens that run (KVState.prefill)."""
        return target.prefill(prompt, merge=True, cancel=cancel, on_chunk=on_chunk)

    def later(self, target: KVState, state: Any, draft_too: bool) -> KVState | None:
        """The draft state whose prompt reading waits for its first drafting round (a token
        draft whose forwards are shared with other sequences', KVState.shared), else None."""
        return None

    def drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: Any, vocab: int, name: str,
        steps: DraftSteps | None = None,
    ) -> Drafter:  # fmt: skip
        """The family's model drafter for a chain (methods draft, hybrid, block, mtp)."""
        raise ConfigError(
            f"{name} has no draft model; pass a draft, use --method ngram, or --no-spec"
        )

    def tree_drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: Any, vocab: int, name: str,
        kernels: Kernels, steps: DraftSteps | None = None,
    ) -> TreeDrafter:  # fmt: skip
        """The family's model drafter for draft trees, or a one-line refusal."""
        raise ConfigError(f"{name} has no draft model; tree drafting needs one")

    def cached_ids(self, state: Any) -> list[int] | None:
        """The token ids the draft's KV cache holds (None without a draft)."""
        return None

    def first_logits(self, target: Any, draft: Any, prompt: list[int]) -> tuple[mx.array, mx.array]:
        """The target's and the draft's logits [V] for the token after `prompt`, from the two
        models alone (no cache; edgespec.bench.unbiased). The draft's are over the target's
        vocabulary (-inf where it cannot propose)."""
        raise ConfigError("there is no draft model to check")


class NoDraft(Family):
    """No draft model: plain decoding, or n-gram lookups alone (the draft state is None)."""

    name = "none"
    reads_features = False
    own_head = False
    blocks = False
    reads_target_cache = False


NO_DRAFT = NoDraft()


class TokenFamily(NoDraft):
    """A token draft's state is a KVState like the target's: it prefills the prompt itself,
    rewinds like the target (checked before speculation) and may be bounded to a window."""

    name = "token"

    @property
    def default_window(self) -> int:
        """DRAFT_WINDOW: a window costs a token draft no acceptance at 8K tokens of context
        (docs/drafting.md, Long contexts)."""
        return DRAFT_WINDOW

    def new_states(
        self,
        backend: Any,
        target: Any,
        draft: Any,
        kv_bits: int | None = None,
        run: Forward | None = None,
        kind: type[KVState] = KVState,
    ) -> tuple[KVState, KVState]:
        """The target's and the draft's KVStates, alike (both quantized with `kv_bits`; the
        target's of `kind`)."""
        kv = (quantized(backend.new_cache, kv_bits), backend.softmax)
        verifier = kind(backend.model(target.model), f"target {target.name}", *kv, run)
        return verifier, KVState(backend.model(draft.model), f"draft {draft.name}", *kv, run)

    def prepare(self, state: KVState, spec: SpecConfig) -> None:
        if spec.method in ("draft", "hybrid"):
            state.check_speculation()
        state.bind(spec.window(self.default_window))  # 0 for a tree: it needs the full cache

    def prefill(
        self,
        target: KVState,
        state: KVState,
        prompt: list[int],
        cancel: threading.Event | None,
        on_chunk: OnChunk,
        draft_too: bool,
    ) -> int:
        prefilled = target.prefill(prompt, merge=True, cancel=cancel, on_chunk=on_chunk)
        if (later := self.later(target, state, draft_too)) is not None:
            later.keep_common(prompt)  # it reads the prompt when it first drafts
        elif draft_too:
            state.prefill(prompt, cancel=cancel)
        return prefilled

    def later(self, target: KVState, state: KVState, draft_too: bool) -> KVState | None:
        """Where the target's forwards are shared (a server's batch, which may decode plainly
        for a while), the draft reads the prompt at its first drafting round."""
        return state if draft_too and target.shared else None

    def drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: KVState, vocab: int, name: str,
        steps: DraftSteps | None = None,
    ) -> Drafter:  # fmt: skip
        return ModelDrafter(state, sampling, vocab, steps)

    def tree_drafter(
        self, spec: SpecConfig, sampling: SamplingConfig, state: KVState, vocab: int, name: str,
        kernels: Kernels, steps: DraftSteps | None = None,
    ) -> TreeDrafter:  # fmt: skip
        """Trees from the draft's own cache; chain-shaped rounds go through the chain drafter
        (ModelTreeDrafter's `chains`) unless a lookup branch is added (method hybrid)."""
        if spec.method in ("block", "block-tree"):
            raise ConfigError(f"--method {spec.method} needs a block draft (DFlash-style)")
        from edgespec.trees.draft import ModelTreeDrafter

        chains = None if spec.method == "hybrid" else ModelDrafter(state, sampling, vocab, steps)
        return ModelTreeDrafter(state, sampling, vocab, kernels, chains)

    def cached_ids(self, state: KVState) -> list[int]:
        return list(state.tokens)

    def first_logits(self, target: Any, draft: Any, prompt: list[int]) -> tuple[mx.array, mx.array]:
        inputs = mx.array(prompt, dtype=mx.int32)[None]
        t_logits = target(inputs)[0, -1]
        return t_logits, fit_vocab(draft(inputs)[0, -1], t_logits.shape[-1])


TOKEN = TokenFamily()


def family_of(draft: Any | None) -> Family:
    """The family that runs `draft`: a loaded draft (loading.LoadedModel) or a draft state an
    engine made (both hold the model as `.model`), or None (no draft)."""
    return NO_DRAFT if draft is None else model_family(draft.model)


def model_family(model: Any) -> Family:
    """The family that runs a draft model (an nn.Module): the model class names it
    (`draft_family`, edgespec/architectures/); a model without one is a token draft."""
    kind = getattr(model, "draft_family", "token")
    if kind == "token":
        return TOKEN
    if kind in ("feature", "mtp"):
        from edgespec.families.feature_family import FEATURE, OWN_HEAD

        return OWN_HEAD if kind == "mtp" else FEATURE
    if kind in ("block", "dflash2"):
        from edgespec.families.block_family import BLOCK, DFLASH2

        return DFLASH2 if kind == "dflash2" else BLOCK
    if kind == "assistant":
        from edgespec.families.assistant_family import ASSISTANT

        return ASSISTANT
    raise ValueError(f"unknown draft family {kind!r}")


def chain_drafter(
    spec: SpecConfig,
    sampling: SamplingConfig,
    family: Family,
    state: Any,
    vocab: int,
    name: str,
    steps: DraftSteps | None = None,
) -> Drafter:
    """The drafter for spec.method over `family`'s draft: "ngram" a lookup alone, "hybrid" a
    lookup in front of the family's model drafter, "draft" / "block" / "mtp" the model drafter
    (a block draft drafts as a block for "draft" and "hybrid" too; "block" needs one, "mtp" the
    target's own head). steps: the backend's token-draft steps (drafting/token.py DraftSteps).
    Raises ConfigError when the method needs a draft the engine does not have."""
    if spec.method == "ngram":
        return _ngram(spec)
    if spec.method == "mtp" and not family.own_head:
        raise ConfigError(
            f"{name} was loaded without its MTP head; --method mtp needs the draft "
            "'mtp' (the target's own head; --method mtp on generate, serve or chat loads it)"
        )
    if spec.method not in ("draft", "hybrid", "block", "mtp"):
        raise ConfigError(f"method {spec.method!r} has no drafter; use draft, ngram or hybrid")
    if spec.method == "block" and family.name != "none" and not family.blocks:
        raise ConfigError(f"--method block needs a block draft (DFlash-style); {name}'s is not")
    model = family.drafter(spec, sampling, state, vocab, name, steps)
    if spec.method != "hybrid":
        return model
    return HybridDrafter(_ngram(spec), model, _min_match(spec), max(spec.k, spec.ngram_k))


def tree_drafter(
    spec: SpecConfig,
    sampling: SamplingConfig,
    family: Family,
    state: Any,
    vocab: int,
    name: str,
    kernels: Kernels,
    steps: DraftSteps | None = None,
) -> TreeDrafter:
    """The family's tree drafter; with method "hybrid" an n-gram lookup adds a branch
    (trees/ngram_branch.py). ConfigError without a draft model, TreeUnsupportedError for a draft the
    tree forward cannot run."""
    model = family.tree_drafter(spec, sampling, state, vocab, name, kernels, steps)
    if spec.method != "hybrid":
        return model
    from edgespec.trees.ngram_branch import NgramBranch

    return NgramBranch(model, _ngram(spec), _min_match(spec), max(spec.k, spec.ngram_k), vocab)


def _ngram(spec: SpecConfig) -> NgramDrafter:
    return NgramDrafter(spec.ngram_min, spec.ngram_max, spec.long_match, spec.ngram_long_k)


def _min_match(spec: SpecConfig) -> int:
    return max(spec.ngram_min, min(HYBRID_MIN_MATCH, spec.ngram_max))
