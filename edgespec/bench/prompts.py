"""Benchmark prompts: Spec-Bench style question.jsonl records ({question_id, category, turns}),
the project's own set (edgespec/data/bench_prompts.jsonl) by default, chat-encoded per engine."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgespec.errors import ConfigError, PromptError

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "bench_prompts.jsonl"
# A base model (no chat template) is measured on text to continue, in the same five categories.
BASE_PROMPTS = DEFAULT_PROMPTS.with_name("bench_prompts_base.jsonl")
# Spec-Bench's eight MT-bench categories; `--categories mt-bench` expands to them.
MT_BENCH = (
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
)


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: the first user turn of a Spec-Bench style record."""

    id: str
    category: str
    text: str


def default_prompt_file(target: str | None, draft: str | None, pair: str | None) -> Path:
    """The built-in prompt set for these models: BASE_PROMPTS when the target is a catalogue
    base model (`base_model` in catalog.json), else DEFAULT_PROMPTS. Reads the catalogue only."""
    from edgespec.loading.specs import load_catalog, pair_specs

    cat = load_catalog()
    try:
        target_spec, _, _ = pair_specs(target, draft, pair, cat)
    except Exception:  # an unknown pair: check_pair says so in one line later
        return DEFAULT_PROMPTS
    entry = cat.models.get(target_spec)
    return BASE_PROMPTS if entry is not None and entry.base_model else DEFAULT_PROMPTS


def load_prompts(
    path: str | Path | None = None,
    categories: Sequence[str] | None = None,
    limit: int | None = None,
) -> list[Prompt]:
    """Read Spec-Bench question.jsonl lines ({question_id, category, turns}); first turns only.

    categories filters (the name 'mt-bench' means MT_BENCH); limit keeps at most that many prompts
    per category, in file order. Raises PromptError for a missing/invalid file or no prompts.
    """
    path = Path(path) if path else DEFAULT_PROMPTS
    if not path.is_file():
        raise PromptError(f"prompt file not found: {path}")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            prompts.append(Prompt(str(rec["question_id"]), rec["category"], rec["turns"][0]))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise PromptError(f"{path}:{n}: not a Spec-Bench record ({exc!r})") from None
    wanted = _expand_categories(categories, {p.category for p in prompts})
    if wanted is not None:
        prompts = [p for p in prompts if p.category in wanted]
    if limit is not None:
        seen: dict[str, int] = {}
        prompts = [p for p in prompts if seen.setdefault(p.category, 0) < limit and _bump(seen, p)]
    if not prompts:
        raise PromptError(f"no prompts selected from {path}")
    return prompts


def _bump(seen: dict[str, int], p: Prompt) -> bool:
    seen[p.category] += 1
    return True


def _expand_categories(categories: Sequence[str] | None, known: set[str]) -> set[str] | None:
    if not categories:
        return None
    wanted = set()
    for c in categories:
        wanted |= set(MT_BENCH) if c == "mt-bench" else {c}
    unknown = wanted - known - set(MT_BENCH)
    if unknown:
        raise ConfigError(
            f"unknown categories {', '.join(sorted(unknown))}; the file has {', '.join(sorted(known))}"
        )
    return wanted


def encode_prompts(
    engine: Any, prompts: Sequence[Prompt], max_tokens: int
) -> tuple[dict[str, list[int]], list[dict[str, str]]]:
    """Chat-encode each prompt; prompts that cannot fit prompt + max_tokens are skipped.

    Returns ({prompt id: token ids}, [{"prompt_id", "reason"} for each skipped prompt]).
    """
    encoded, skipped = {}, []
    for p in prompts:
        ids = engine.encode_chat([{"role": "user", "content": p.text}])
        if len(ids) + max_tokens > engine.context_window:
            reason = (
                f"{len(ids)} prompt + {max_tokens} new tokens > context {engine.context_window}"
            )
            skipped.append({"prompt_id": p.id, "reason": reason})
        else:
            encoded[p.id] = ids
    return encoded, skipped
