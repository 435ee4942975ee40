"""Measure a draft against its target on prompts it never saw (temperature 0):

- greedy agreement: draft argmax == target argmax along the target's own greedy answers;
- c = draft per-token decode time / target per-token decode time (batch 1, KV cache);
- speculative (K=4) vs plain decoding through the Engine, interleaved prompt by prompt in one
  run: acceptance, tau (tokens per round, correction/bonus included), tokens/s, speedup, and
  whether the outputs are identical (they must be at temperature 0).

Agreement, acceptance, tau and identical outputs are also given per prompt category (the
`category` field of MT-bench / Spec-Bench questions), with the categories that fall below the
overall figure by more than a margin, or below a floor, flagged (`flag_categories`).

Prompts: the first turns of a question file in MT-bench / Spec-Bench format the user gives
(--prompts), else the project's own bench prompts (edgespec/data/bench_prompts.jsonl); evaluation
only, never training. Run: `edgespec distill --evaluate --target T --draft D --prompts FILE`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from edgespec.architectures.token_draft import reduced_head
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.distill.data import SamplingPlan, answer
from edgespec.distill.train import agreement_counts, head_index
from edgespec.errors import ConfigError
from edgespec.events import Finished
from edgespec.runtime import Engine

OWN_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "bench_prompts.jsonl"
NO_CATEGORY = "-"  # questions without a `category` field
MARGIN = 0.10  # default: flag a category this far below the overall figure


@dataclass
class CategoryReport:
    """The pair's figures on one category's prompts (pooled over its tokens and rounds)."""

    prompts: int
    agreement: float
    agreement_tokens: int
    acceptance: float = float("nan")
    tau: float = float("nan")
    identical: int = 0


@dataclass
class EvalReport:
    """One evaluation run. Times in ms per token; rates in tokens/s."""

    prompts: int
    agreement: float
    agreement_tokens: int
    draft_ms: float
    target_ms: float
    c: float
    k: int = 4
    acceptance: float = float("nan")
    tau: float = float("nan")
    spec_tokens_per_s: float = float("nan")
    plain_tokens_per_s: float = float("nan")
    speedup: float = float("nan")
    identical: int = 0
    categories: dict[str, CategoryReport] = field(default_factory=dict)
    margin: float = MARGIN
    min_category: float = 0.0
    flagged: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def find_prompt_file(explicit: str | None = None) -> Path:
    """--prompts, else the project's own prompts (OWN_PROMPTS, the bench's default)."""
    path = Path(explicit) if explicit else OWN_PROMPTS
    if not path.is_file():
        raise ConfigError(f"prompt file not found: {path}")
    return path


@dataclass(frozen=True)
class Question:
    category: str
    text: str  # the first turn


def load_prompts(path: Path, n: int, per_category: int | None = None) -> list[Question]:
    """First turns of the first n questions; with `per_category`, of the first that many
    questions of each category instead (file order)."""
    questions = []
    for i, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            questions.append(Question(str(row.get("category") or NO_CATEGORY), row["turns"][0]))
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{path}:{i}: not a question record ({exc!r})") from None
    if per_category is None:
        chosen = questions[:n]
    else:
        seen: dict[str, int] = {}
        chosen = []
        for q in questions:
            if seen.setdefault(q.category, 0) < per_category:
                seen[q.category] += 1
                chosen.append(q)
    if not chosen:
        raise ConfigError(f"no prompts selected from {path}")
    return chosen


def greedy_agreement(
    target: Any, tokenizer: Any, draft: Any, prompts: list[str], max_new: int, batch: int = 16
) -> np.ndarray:
    """[len(prompts), 2]: (draft argmax == target argmax, positions compared) for each prompt;
    the target answers greedily (batched), then the draft is teacher-forced along prompt +
    answer."""

    plan = SamplingPlan(max_new_tokens=max_new, top_k_saved=1)
    seqs = answer(target, tokenizer, [(i, p, True) for i, p in enumerate(prompts)], plan, batch)
    hidx = head_index(np.array(draft.head_ids), draft.vocab_size)
    return agreement_counts(draft, seqs, hidx, max_len=1 << 30)


def decode_ms(model: Any, prompt: list[int], steps: int = 48) -> float:
    """Median ms per greedy decode step with a KV cache, batch 1 (after one warm-up step). A
    reduced-head draft is timed the way the loop runs it: head logits only, argmax mapped to ids."""
    from mlx_lm.models.cache import make_prompt_cache

    head = reduced_head(model)

    def step(inputs: mx.array, cache: Any) -> mx.array:
        if head is None:
            return mx.argmax(model(inputs, cache=cache)[:, -1], axis=-1)
        return head[mx.argmax(model.head_logits(inputs, cache=cache)[:, -1], axis=-1)]

    cache = make_prompt_cache(model)
    tok = step(mx.array(prompt)[None], cache)
    mx.eval(tok)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        tok = step(tok[:, None], cache)
        mx.eval(tok)
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]) * 1000)


def run_pair(
    engine: Any, prompts: list[str], k: int, max_tokens: int
) -> tuple[list[Finished], list[Finished]]:
    """(plain, speculative) greedy runs, one Finished per prompt each, interleaved per prompt."""

    greedy = SamplingConfig(temperature=0.0)
    runs: dict[str, list[Finished]] = {"none": [], "draft": []}
    for p in prompts:
        ids = engine.encode_chat([{"role": "user", "content": p}])
        for method in ("none", "draft"):
            cfg = GenerationConfig(
                greedy, SpecConfig(k=k, method=method, adaptive=False), max_tokens
            )
            runs[method].extend(e for e in engine.generate(ids, cfg) if isinstance(e, Finished))
            engine.reset()
    return runs["none"], runs["draft"]


def pooled(plain: list[Finished], spec: list[Finished]) -> dict[str, float]:
    """Statistics pooled over the runs' tokens and rounds."""

    def rate(fs: list[Finished]) -> float:
        return sum(f.stats.tokens - 1 for f in fs) / max(sum(f.stats.decode_time for f in fs), 1e-9)

    drafted = sum(f.stats.drafted for f in spec)
    return {
        "acceptance": sum(f.stats.accepted for f in spec) / max(drafted, 1),
        "tau": sum(f.stats.tokens for f in spec) / max(sum(f.stats.rounds for f in spec), 1),
        "spec_tokens_per_s": rate(spec),
        "plain_tokens_per_s": rate(plain),
        "speedup": rate(spec) / max(rate(plain), 1e-9),
        "identical": sum(a.text == b.text for a, b in zip(plain, spec, strict=True)),
    }


def by_category(
    categories: list[str], counts: np.ndarray, plain: list[Finished], spec: list[Finished]
) -> dict[str, CategoryReport]:
    """Per-category figures (first-appearance order): agreement from the per-prompt `counts`
    of `greedy_agreement`, acceptance, tau and identical outputs pooled over the category's runs."""
    out = {}
    for name in dict.fromkeys(categories):
        idx = [i for i, c in enumerate(categories) if c == name]
        hits, total = int(counts[idx, 0].sum()), int(counts[idx, 1].sum())
        p = pooled([plain[i] for i in idx], [spec[i] for i in idx])
        out[name] = CategoryReport(
            len(idx), hits / max(total, 1), total, p["acceptance"], p["tau"], int(p["identical"])
        )
    return out


def flag_categories(report: EvalReport) -> list[str]:
    """One line per (category, agreement or acceptance) below max(overall - margin,
    min_category): the kinds of request the draft serves worse than the rest."""
    lines = []
    for name, cat in report.categories.items():
        for metric in ("agreement", "acceptance"):
            value, overall = getattr(cat, metric), getattr(report, metric)
            floor = max(overall - report.margin, report.min_category)
            if value < floor:  # False for NaN (nothing measured)
                why = (
                    f"overall {overall:.3f} - margin {report.margin:.2f}"
                    if floor > report.min_category
                    else f"the floor {report.min_category:.2f}"
                )
                lines.append(f"{name}: {metric} {value:.3f} is below {floor:.3f} ({why})")
    return lines


def evaluate(
    target: str,
    draft: str,
    *,
    prompts_path: str | None,
    n: int,
    max_tokens: int,
    k: int = 4,
    per_category: int | None = None,
    margin: float = MARGIN,
    min_category: float = 0.0,
) -> EvalReport:
    """Load the pair through the Engine and run all three measurements, overall and by
    category; flag the categories below max(overall - margin, min_category)."""

    questions = load_prompts(find_prompt_file(prompts_path), n, per_category)
    prompts = [q.text for q in questions]
    engine = Engine.load(target=target, draft=draft)
    if engine.draft is None:
        raise ConfigError(f"{draft}: no draft model was loaded")
    tm, dm, tok = engine.target.model, engine.draft.model, engine.tokenizer
    counts = greedy_agreement(tm, tok, dm, prompts, max_tokens)
    hits, n_tok = int(counts[:, 0].sum()), int(counts[:, 1].sum())
    ids = engine.encode_chat([{"role": "user", "content": prompts[0]}])
    t_ms, d_ms = decode_ms(tm, ids), decode_ms(dm, ids)
    report = EvalReport(len(prompts), hits / max(n_tok, 1), n_tok, d_ms, t_ms, d_ms / t_ms, k)
    plain, spec = run_pair(engine, prompts, k, max_tokens)
    for key, value in pooled(plain, spec).items():
        setattr(report, key, value)
    report.categories = by_category([q.category for q in questions], counts, plain, spec)
    report.margin, report.min_category = margin, min_category
    report.flagged = flag_categories(report)
    return report
