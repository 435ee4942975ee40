"""The drafter a SpecConfig asks for, fresh for one generation."""

from __future__ import annotations

from edgespec.cache import KVState
from edgespec.config import SamplingConfig, SpecConfig
from edgespec.drafting.assistant import AssistantDrafter, AssistantState
from edgespec.drafting.base import Drafter
from edgespec.drafting.block_draft import BlockDrafter, BlockState
from edgespec.drafting.features import EagleDrafter, EagleState
from edgespec.drafting.hybrid import HYBRID_MIN_MATCH, HybridDrafter
from edgespec.drafting.model import ConfidentDrafter, ModelDrafter
from edgespec.drafting.mtp import MtpModel
from edgespec.drafting.ngram import NgramDrafter
from edgespec.errors import ConfigError


def build_drafter(
    spec: SpecConfig,
    sampling: SamplingConfig,
    draft: KVState | EagleState | None,
    vocab: int,
    engine_name: str,
    stop_below: float = 0.0,
    pairs: bool = False,
) -> Drafter:
    """The drafter for spec.method ("draft", "ngram", "hybrid", "mtp": the target's own MTP
    head, loaded as the engine's draft, run as a feature draft, or "block": a block draft's).

    stop_below > 0 makes the draft model stop early below that top probability (ConfidentDrafter);
    pairs: run draft steps two positions at a time (edgespec.cpu.draft_pairs).
    Raises ConfigError when the method needs a draft model the engine does not have.
    """
    if spec.method == "ngram":
        return NgramDrafter(spec.ngram_min, spec.ngram_max, spec.long_match, spec.ngram_long_k)
    if spec.method == "mtp" and isinstance(draft, AssistantState):  # Gemma 4's MTP-style head
        return AssistantDrafter(draft, sampling, vocab)
    if spec.method == "mtp":
        if not isinstance(draft, EagleState) or not isinstance(draft.model, MtpModel):
            raise ConfigError(
                f"{engine_name} was loaded without its MTP head; --method mtp needs the draft "
                "'mtp' (the target's own head; --method mtp on generate, serve or chat loads it)"
            )
        return EagleDrafter(draft, sampling, vocab)
    if spec.method not in ("draft", "hybrid", "block"):
        raise ConfigError(f"method {spec.method!r} has no drafter; use draft, ngram or hybrid")
    if draft is None:
        raise ConfigError(
            f"{engine_name} has no draft model; pass a draft, use --method ngram, or --no-spec"
        )
    if spec.method == "block" and not isinstance(draft, BlockState):
        raise ConfigError(
            f"--method block needs a block draft (DFlash-style); {engine_name}'s is not"
        )
    model: Drafter
    if isinstance(draft, BlockState):  # a block draft (also for --method draft / hybrid)
        model = BlockDrafter(draft, sampling, vocab)
    elif isinstance(draft, AssistantState):
        model = AssistantDrafter(draft, sampling, vocab)
    elif isinstance(draft, EagleState):
        model = EagleDrafter(draft, sampling, vocab)
    elif stop_below > 0:
        model = ConfidentDrafter(draft, sampling, vocab, stop_below, pairs)
    else:
        model = ModelDrafter(draft, sampling, vocab, pairs)
    if spec.method in ("draft", "block"):
        return model
    min_match = max(spec.ngram_min, min(HYBRID_MIN_MATCH, spec.ngram_max))
    ngram = NgramDrafter(spec.ngram_min, spec.ngram_max, spec.long_match, spec.ngram_long_k)
    return HybridDrafter(ngram, model, min_match, max(spec.k, spec.ngram_k))
