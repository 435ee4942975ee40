"""Measure a draft against its target on MT-bench-style prompts it never saw (temperature 0):

- greedy agreement: draft argmax == target argmax along the target's own greedy answers;
- c = draft per-token decode time / target per-token decode time (batch 1, KV cache);
- speculative (K=4) vs plain decoding through the Engine, interleaved prompt by prompt in one
  run: acceptance, tau (tokens per round, correction/bonus included), tokens/s, speedup, and
  whether the outputs are identical (they must be at temperature 0).

Prompts are read at run time from ../shared/prompts/mt_bench_question.jsonl (first turns):
evaluation only, never training. Run: `edgespec distill --evaluate --target T --draft D`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.distill.data import SamplingPlan, answer
from edgespec.distill.train import agreement, head_index
from edgespec.drafting.draft_model import reduced_head
from edgespec.errors import ConfigError
from edgespec.events import Finished
from edgespec.runtime import Engine

PROMPT_FILE = "mt_bench_question.jsonl"


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def find_prompt_file(explicit: str | None = None) -> Path:
    """--prompts, else ../shared/prompts/<file> beside the working directory or the repo."""
    here = Path(__file__).resolve().parents[2]
    candidates = [Path(explicit)] if explicit else []
    candidates += [Path.cwd().parent / "shared" / "prompts" / PROMPT_FILE]
    candidates += [here.parent / "shared" / "prompts" / PROMPT_FILE]
    for c in candidates:
        if c.is_file():
            return c
    raise ConfigError(f"cannot find {PROMPT_FILE}; pass --prompts PATH")


def load_prompts(path: Path, n: int) -> list[str]:
    """First turns of the first n questions."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows[:n]]


def greedy_agreement(
    target: Any, tokenizer: Any, draft: Any, prompts: list[str], max_new: int, batch: int = 16
) -> tuple[float, int]:
    """(agreement, positions compared): the target answers greedily (batched), then the draft
    is teacher-forced along prompt + answer."""

    plan = SamplingPlan(max_new_tokens=max_new, top_k_saved=1)
    seqs = answer(target, tokenizer, [(i, p, True) for i, p in enumerate(prompts)], plan, batch)
    hidx = head_index(np.array(draft.head_ids), draft.vocab_size)
    n = sum(s.n_completion for s in seqs)
    return agreement(draft, seqs, hidx, max_len=1 << 30), n


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


def spec_vs_plain(engine: Any, prompts: list[str], k: int, max_tokens: int) -> dict[str, float]:
    """Plain and speculative greedy decoding, interleaved per prompt; pooled statistics."""

    greedy = SamplingConfig(temperature=0.0)
    runs: dict[str, list[Finished]] = {"none": [], "draft": []}
    for p in prompts:
        ids = engine.encode_chat([{"role": "user", "content": p}])
        for method in ("none", "draft"):
            cfg = GenerationConfig(greedy, SpecConfig(k=k, method=method), max_tokens)
            runs[method].extend(e for e in engine.generate(ids, cfg) if isinstance(e, Finished))
            engine.reset()
    plain, spec = runs["none"], runs["draft"]

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


def evaluate(
    target: str, draft: str, *, prompts_path: str | None, n: int, max_tokens: int, k: int = 4
) -> EvalReport:
    """Load the pair through the Engine and run all three measurements."""

    prompts = load_prompts(find_prompt_file(prompts_path), n)
    engine = Engine.load(target=target, draft=draft)
    if engine.draft is None:
        raise ConfigError(f"{draft}: no draft model was loaded")
    tm, dm, tok = engine.target.model, engine.draft.model, engine.tokenizer
    agree, n_tok = greedy_agreement(tm, tok, dm, prompts, max_tokens)
    ids = engine.encode_chat([{"role": "user", "content": prompts[0]}])
    t_ms, d_ms = decode_ms(tm, ids), decode_ms(dm, ids)
    report = EvalReport(len(prompts), agree, n_tok, d_ms, t_ms, d_ms / t_ms, k)
    for key, value in spec_vs_plain(engine, prompts, k, max_tokens).items():
        setattr(report, key, value)
    return report
