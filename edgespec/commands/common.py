"""Arguments shared by several commands (models, sampling, speculation) and their conversion."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from edgespec.config import (
    DRAFT_SINKS,
    DRAFT_WINDOW,
    KV_BITS,
    MTP_DRAFT,
    GenerationConfig,
    SamplingConfig,
    SpecConfig,
)
from edgespec.errors import ConfigError


def add_model_args(parser: argparse.ArgumentParser, *, kv_bits: bool = True) -> None:
    """The models' options; `kv_bits`: also --kv-bits (commands that run draft trees only leave
    it out)."""
    g = parser.add_argument_group("models")
    g.add_argument(
        "--pair", help="a named pair from `edgespec models` (default: the embedded pair)"
    )
    g.add_argument(
        "--target", help="target model: catalogue name, local folder, .gguf file or HF repo id"
    )
    g.add_argument(
        "--draft", help="draft model: catalogue name, local folder, .gguf file or HF repo id"
    )
    g.add_argument(
        "--draft-bits",
        type=int,
        default=4,
        choices=(0, 2, 3, 4, 6, 8),
        help="quantize an unquantized draft at load (0 = leave as is; default 4)",
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "float16", "bfloat16"),
        help="both models' float weights and activations (auto: float32 on the CPU, as stored "
        "on a GPU)",
    )
    if kv_bits:
        g.add_argument(
            "--kv-bits",
            type=int,
            choices=KV_BITS,
            help="quantize the KV caches of the target and a token draft to 8 or 4 bits (less "
            "memory at long contexts; output then equals plain decoding with the same setting)",
        )


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy; default 0)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    g.add_argument(
        "--min-p", type=float, default=0.0, help="drop tokens below min-p x the top prob"
    )
    g.add_argument("--seed", type=int, default=0, help="random seed (same seed => same tokens)")


WINDOW_HELP = (
    f"past 2N tokens of context a draft attends to its first {DRAFT_SINKS} positions and "
    f"its last N only, so its steps cost the same at any length (0: the whole context; default: "
    f"the draft family's, {DRAFT_WINDOW} for token and EAGLE drafts, the whole context for "
    f"block drafts, MTP heads and assistants; output is unchanged)"
)


def add_spec_args(parser: argparse.ArgumentParser) -> None:
    """The speculation options; their defaults are SpecConfig's (the library's)."""
    g = parser.add_argument_group("speculation")
    g.add_argument(
        "-k",
        "--k",
        type=int,
        default=SpecConfig.k,
        help=f"draft tokens per round; with --adaptive, the first rounds' K (default {SpecConfig.k})",
    )
    g.add_argument(
        "--method",
        default=SpecConfig.method,
        choices=("draft", "ngram", "hybrid", "mtp", "block", "block-tree"),
        help="who drafts: the draft model, n-gram prompt lookup, or both: a lookup when the "
        "context has a match, the draft model otherwise; mtp: the target's own multi-token "
        "prediction head (Qwen3.5, Qwen3-Next, DeepSeek-V3, GLM-4.5, MiMo); a block draft "
        "(DFlash-style): block (one forward a round), block-tree (a tree from it) "
        f"(default {SpecConfig.method})",
    )
    g.add_argument(
        "--adaptive",
        action=argparse.BooleanOptionalAction,
        default=SpecConfig.adaptive,
        help="choose K (0 = plain step) each round from the measured acceptance and costs; "
        f"--no-adaptive keeps K fixed (default: {'adaptive' if SpecConfig.adaptive else 'fixed'})",
    )
    g.add_argument(
        "--k-max",
        type=int,
        default=SpecConfig.k_max,
        help=f"largest K --adaptive may choose (default {SpecConfig.k_max})",
    )
    g.add_argument(
        "--ngram-min",
        type=int,
        default=SpecConfig.ngram_min,
        help=f"shortest n-gram suffix looked up (default {SpecConfig.ngram_min})",
    )
    g.add_argument(
        "--ngram-max",
        type=int,
        default=SpecConfig.ngram_max,
        help=f"longest n-gram suffix looked up (default {SpecConfig.ngram_max})",
    )
    g.add_argument(
        "--ngram-k",
        type=int,
        default=SpecConfig.ngram_k,
        help=f"hybrid: n-gram lookups propose up to max(K, this) tokens (default {SpecConfig.ngram_k})",
    )
    g.add_argument(
        "--ngram-long",
        type=int,
        default=SpecConfig.ngram_long,
        help="n-gram matches at least this long (capped at --ngram-max; 0: off) propose up to "
        f"--ngram-long-k tokens (default {SpecConfig.ngram_long})",
    )
    g.add_argument(
        "--ngram-long-k",
        type=int,
        default=SpecConfig.ngram_long_k,
        help=f"tokens a long n-gram match proposes, at least K (default {SpecConfig.ngram_long_k})",
    )
    g.add_argument(
        "--tree",
        default="",
        metavar="SHAPE",
        help="draft a tree of candidates per round, verified in one forward: widths such as "
        "3,2,1,1 (candidates per depth below the first-ranked path), 'dynamic' (EAGLE-2 style, "
        "-k deep), 'auto' (chain or tree chosen per round from measured costs) or 'chain' "
        "(default: chains, no tree); a shape runs where it is predicted to beat the best chain "
        "and plain steps, else those (--no-adaptive: the shape every round)",
    )
    g.add_argument("--draft-window", type=int, default=SpecConfig.draft_window, help=WINDOW_HELP)
    g.add_argument("--no-spec", action="store_true", help="plain target decoding (no speculation)")


def sampling_from_args(args: argparse.Namespace) -> SamplingConfig:
    return SamplingConfig(
        temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, seed=args.seed
    )


def spec_from_args(args: argparse.Namespace) -> SpecConfig:
    method = (
        "none" if getattr(args, "no_spec", False) else getattr(args, "method", SpecConfig.method)
    )
    spec = SpecConfig(
        k=args.k,
        method=method,
        adaptive=getattr(args, "adaptive", SpecConfig.adaptive),
        k_max=max(getattr(args, "k_max", SpecConfig.k_max), args.k),
        ngram_min=getattr(args, "ngram_min", SpecConfig.ngram_min),
        ngram_k=getattr(args, "ngram_k", SpecConfig.ngram_k),
        ngram_max=getattr(args, "ngram_max", SpecConfig.ngram_max),
        ngram_long=getattr(args, "ngram_long", SpecConfig.ngram_long),
        ngram_long_k=getattr(args, "ngram_long_k", SpecConfig.ngram_long_k),
        tree="" if method == "none" else getattr(args, "tree", ""),
        draft_window=getattr(args, "draft_window", SpecConfig.draft_window),
    )
    if spec.tree and getattr(args, "kv_bits", None):
        raise ConfigError(
            "--kv-bits: draft trees need full-precision KV caches; leave out --tree or --kv-bits"
        )
    return spec


def draft_from_args(args: argparse.Namespace, spec: SpecConfig) -> str | None:
    """The draft to load: --draft, or for --method mtp the target's own MTP head ("mtp")."""
    if spec.method != "mtp":
        return args.draft
    if args.draft is not None:
        raise ConfigError("--method mtp drafts with the target's own MTP head; leave out --draft")
    return MTP_DRAFT


def generation_from_args(args: argparse.Namespace) -> GenerationConfig:
    return GenerationConfig(
        sampling=sampling_from_args(args), spec=spec_from_args(args), max_tokens=args.max_tokens
    )


def add_shard_args(parser: argparse._ActionsContainer) -> None:
    parser.add_argument(
        "--shard",
        default="tensor",
        choices=("tensor", "pipeline"),
        help="under mlx.launch: split the target over the ranks tensor parallel (mlx-lm's "
        "model.shard) or pipeline parallel (model.model.pipeline, where mlx-lm has it); the "
        "draft stays whole on every rank (default tensor)",
    )


def fixed_k_for_group(
    config: GenerationConfig, group: Any | None
) -> tuple[GenerationConfig, str | None]:
    """Under a group of several ranks, adaptive K becomes fixed K (AdaptiveK decides from this
    rank's own timings, which differ between ranks). Returns (config, a note for the user or
    None)."""
    spec = config.spec
    if group is None or group.size <= 1 or not spec.enabled or not spec.adaptive:
        return config, None
    fixed = dataclasses.replace(config, spec=dataclasses.replace(spec, adaptive=False))
    return fixed, (
        f"the target is split over {group.size} ranks, so K stays {spec.k} (--k): adaptive K "
        "would choose from each rank's own timings, which differ"
    )


def add_think_arg(parser: argparse._ActionsContainer) -> None:
    """--think / --no-think: the chat template's thinking mode (absent: the pair's default)."""
    parser.add_argument(
        "--think",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the chat template's thinking mode (enable_thinking: Qwen3, Qwen3.5, ...); "
        "--no-think answers without a reasoning part (default: the pair's, the mode its draft "
        "was trained for, see `edgespec models`; else the template's own)",
    )


def apply_think(engine: Any, think: bool | None, *, raw: bool = False) -> str | None:
    """Set `engine.thinking` from --think / --no-think. Returns a note for the user where the
    switch, asked for, changes nothing: the template has no thinking mode, or --raw (no template).
    Not asked for (None): the pair's default stays, and no note."""
    if think is None:
        return None
    flag = "--think" if think else "--no-think"
    if raw:
        return f"{flag} changes nothing with --raw (no chat template is applied)"
    if engine.thinking_mode() is None:
        return f"the chat template of {engine.name} has no thinking mode; {flag} changes nothing"
    engine.thinking = think
    return None
