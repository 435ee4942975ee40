"""Export a trained draft: quantized (default 8-bit, group 64) safetensors + config.json
(draft_model format) + a model card (README.md) that says exactly how it was made and how good it
measured. 8 bits by default because plain 4-bit quantization cost the embedded draft held-out
agreement (docs/distill.md); the draft is small either way."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.nn as nn

from edgespec.architectures.token_draft import DraftModel, save_draft

GROUP_SIZE = 64
DEFAULT_BITS = 8  # `edgespec distill --bits` offers 4, 6, 8


@dataclass(frozen=True)
class Card:
    """What the model card reports. `quality` maps a metric name to its value (e.g. held-out
    agreement fp32 / quantized); `curve` rows are {step, tokens_seen, agreement, ...}."""

    target: str
    command: str
    data_sequences: int
    data_tokens: int
    tokens_seen: int
    steps: int
    layers: list[int]
    head_size: int
    bits: int = DEFAULT_BITS
    quality: dict[str, float] = field(default_factory=dict)
    loss: str = (
        "KL(p_target || q_draft) over the head, at completion positions only (soft labels from "
        "the target's top-k log-probabilities)"
    )
    curve: list[dict[str, float]] = field(default_factory=list)
    licence: str = ""  # the card's licence section; "" : derived_licence(target)


def derived_licence(target: str) -> str:
    """A distilled draft's licence text: the target's layers initialise it and its answers are
    the training data, so the target's terms carry over (whatever they are: EdgeSpec does not
    know them)."""
    return (
        f"Derived from {target}: its embedding and layers initialise this draft and its answers "
        "are the training data, so this draft is under the target's licence (see the target's "
        "model card and licence file)."
    )


def quantize(model: DraftModel, config: dict[str, Any], bits: int = DEFAULT_BITS) -> dict[str, Any]:
    """Quantize every Linear whose input dim divides by 64 (not the embedding), in place; return the
    config with `quantization` set (what load_draft needs to rebuild the layers)."""
    g = GROUP_SIZE
    nn.quantize(
        model,
        group_size=g,
        bits=bits,
        class_predicate=lambda p, m: (
            hasattr(m, "to_quantized") and m.weight.shape[-1] % g == 0 and "embed_tokens" not in p
        ),
    )
    return config | {"quantization": {"group_size": g, "bits": bits}}


def export_draft(model: DraftModel, config: dict[str, Any], out: Path, card: Card) -> Path:
    """Quantize `model` (in place) and write OUT/{config.json, model.safetensors, README.md}.
    The embedding is the target's own (frozen in training), so it is not written: the loader
    shares the target's (config.edgespec.shared_embedding)."""
    config = quantize(model, config, card.bits)
    config = config | {"edgespec": config.get("edgespec", {}) | {"shared_embedding": True}}
    out = Path(out)
    save_draft(model, config, out)
    (out / "README.md").write_text(model_card(card))
    return out


def model_card(card: Card) -> str:
    """The README.md text (markdown)."""
    q = "\n".join(f"| {k} | {v:.4f} |" for k, v in card.quality.items()) or "| - | - |"
    rows = "\n".join(
        f"| {r['step']} | {r['tokens_seen']} | {r['agreement']:.4f} |" for r in card.curve
    )
    return f"""# EdgeSpec draft for {card.target}

A small draft model for exact speculative decoding with EdgeSpec: {len(card.layers)} of the
target's layers (target layers {", ".join(map(str, card.layers))}, renumbered from 0), the
target's own (frozen) token embedding and final norm, and a {card.head_size}-token output head
over the tokens the target emits most. Tokens off the head get q = 0; the verification
residual max(0, p - q) covers them, so output is unchanged. Weights: {card.bits}-bit, group size 64.
The embedding is not stored here: it stayed frozen in training, so EdgeSpec loads this draft
with its target and shares the target's embedding (load it through `edgespec` with its target).

## How it was made

    {card.command}

- Data: the target's own answers to EdgeSpec's generated instruction set (no benchmark
  prompts): {card.data_sequences} answers, {card.data_tokens} completion tokens.
- Loss: {card.loss}.
- Training: {card.steps} steps, {card.tokens_seen} labelled tokens seen.

## Measured quality

Greedy agreement = draft argmax == target argmax on the target's greedy answers to held-out
instructions (teacher-forced).

| metric | value |
|---|---|
{q}

Curve (held-out agreement versus training tokens seen):

| step | tokens seen | agreement |
|---|---|---|
{rows}

## Licence

{card.licence or derived_licence(card.target)}
"""
