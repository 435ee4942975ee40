"""Arguments shared by several commands (models, sampling, speculation) and their conversion."""

from __future__ import annotations

import argparse

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig


def add_model_args(parser: argparse.ArgumentParser) -> None:
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


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--temp", type=float, default=0.0, help="temperature (0 = greedy; default 0)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    g.add_argument(
        "--min-p", type=float, default=0.0, help="drop tokens below min-p x the top prob"
    )
    g.add_argument("--seed", type=int, default=0, help="random seed (same seed => same tokens)")


def add_spec_args(parser: argparse.ArgumentParser, *, k_default: int = 4) -> None:
    g = parser.add_argument_group("speculation")
    g.add_argument(
        "-k",
        "--k",
        type=int,
        default=k_default,
        help=f"draft tokens per round (default {k_default})",
    )
    g.add_argument(
        "--method",
        default="draft",
        choices=("draft", "ngram", "hybrid"),
        help="who drafts: the draft model, n-gram prompt lookup, or both",
    )
    g.add_argument(
        "--adaptive",
        action="store_true",
        help="choose K (0 = plain step) each round from the measured costs",
    )
    g.add_argument(
        "--k-max", type=int, default=8, help="largest K --adaptive may choose (default 8)"
    )
    g.add_argument(
        "--ngram-min", type=int, default=2, help="shortest n-gram suffix looked up (default 2)"
    )
    g.add_argument(
        "--ngram-max", type=int, default=4, help="longest n-gram suffix looked up (default 4)"
    )
    g.add_argument(
        "--ngram-k",
        type=int,
        default=4,
        help="hybrid: n-gram lookups propose up to max(K, this) tokens (default 4)",
    )
    g.add_argument("--no-spec", action="store_true", help="plain target decoding (no speculation)")


def sampling_from_args(args: argparse.Namespace) -> SamplingConfig:
    return SamplingConfig(
        temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, seed=args.seed
    )


def spec_from_args(args: argparse.Namespace) -> SpecConfig:
    method = "none" if getattr(args, "no_spec", False) else getattr(args, "method", "draft")
    return SpecConfig(
        k=args.k,
        method=method,
        adaptive=getattr(args, "adaptive", False),
        k_max=max(getattr(args, "k_max", 8), args.k),
        ngram_min=getattr(args, "ngram_min", 2),
        ngram_k=getattr(args, "ngram_k", 4),
        ngram_max=getattr(args, "ngram_max", 4),
    )


def generation_from_args(args: argparse.Namespace) -> GenerationConfig:
    return GenerationConfig(
        sampling=sampling_from_args(args), spec=spec_from_args(args), max_tokens=args.max_tokens
    )
