"""Orchestration of `edgespec bench`: prompts, method registry, interleaved measured runs.

    prompts = load_prompts(None, categories=["qa"], limit=4)       # the project's own set
    plan = BenchPlan(methods=("plain", "spec", "mlx-lm"), ks=(4,), temps=(0.0,), max_tokens=128)
    warm_up(engine, prompts, plan)
    records = list(iter_bench(engine, prompts, plan))               # Ctrl-C: keep what came
    records, notes = compare_greedy(engine, records, prompts)

Every method is timed the same way, from outside its token generator (see `_Timer`), after
`engine.reset()` so no method starts with a warm prefix cache. This module prints nothing; the
command shows progress from the yielded records.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx

from edgespec import loop
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.cpu import attention, blas, blocks, fastexp, leanops, rope
from edgespec.drafting.eagle import EagleModel
from edgespec.errors import ConfigError, PromptError
from edgespec.events import Finished, Round, Token
from edgespec.loading.load import on_cpu
from edgespec.metrics import PLAIN, RoundTotals, RunRecord, fold_rounds, rounds_from_flags

DEFAULT_PROMPTS = Path(__file__).resolve().parents[1] / "data" / "bench_prompts.jsonl"
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
NEAR_TIE = 1e-3  # |logit gap| / max(1, |top logit|) under which a greedy difference is a near-tie


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: the first user turn of a Spec-Bench style record."""

    id: str
    category: str
    text: str


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
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
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


@dataclass(frozen=True)
class Point:
    """The settings of one measured run."""

    k: int
    temp: float
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class Measured:
    """What one run produced, timed from outside the generator."""

    token_ids: tuple[int, ...]
    ttft: float
    decode_time: float
    wall_time: float
    finish_reason: str
    rounds: RoundTotals
    timed_rounds: bool  # whether rounds carry draft/verify timings
    t_model_decode: float | None = None  # draft + verify seconds of the rounds after the first


class _Timer:
    """Timestamps of committed tokens: ttft = start -> first, decode = first -> last."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last = self.start
        self.ids: list[int] = []

    def token(self, token_id: int) -> None:
        self.last = time.perf_counter()
        self.first = self.last if self.first is None else self.first
        self.ids.append(token_id)

    def done(
        self, reason: str, rounds: RoundTotals, timed: bool, t_model: float | None = None
    ) -> Measured:
        first = self.last if self.first is None else self.first
        end = time.perf_counter()
        return Measured(
            tuple(self.ids), first - self.start, self.last - first, end - self.start, reason,
            rounds, timed, t_model,
        )  # fmt: skip


def _sampling(point: Point) -> SamplingConfig:
    return SamplingConfig(temperature=point.temp, seed=point.seed)


Extras = Callable[[Any, Point], dict[str, Any]]


def _engine_runner(
    spec: Callable[[Point], SpecConfig], extras: Extras | None = None
) -> Callable[[Any, list[int], Point], Measured]:
    """A runner that drives Engine.generate with the SpecConfig that `spec` builds, plus the
    keyword arguments `extras(engine, point)` returns (e.g. drafter=..., k_policy=...)."""

    def run(engine: Any, prompt_ids: list[int], point: Point) -> Measured:
        config = GenerationConfig(_sampling(point), spec(point), max_tokens=point.max_tokens)
        kwargs = extras(engine, point) if extras else {}
        engine.reset()
        timer, rounds, reason = _Timer(), [], "length"
        for event in engine.generate(prompt_ids, config, **kwargs):
            if isinstance(event, Token):
                timer.token(event.id)
            elif isinstance(event, Round):
                rounds.append(event)
            elif isinstance(event, Finished):
                reason = event.reason
        # Round events follow their tokens: the first round made the first token (TTFT side).
        t_model = sum(r.t_draft + r.t_verify for r in rounds[1:])
        return timer.done(reason, fold_rounds(rounds), timed=True, t_model=t_model)

    return run


def _mlx_lm_draft(engine: Any) -> Any | None:
    """The draft mlx-lm runs with: the engine's peer token draft when the bench set one (the
    pair's own is a feature draft), else the pair's draft (None without one)."""
    return getattr(engine, "peer_draft", None) or (engine.draft if engine.has_draft else None)


def _mlx_lm_runner(use_draft: bool) -> Callable[[Any, list[int], Point], Measured]:
    """mlx-lm's stream_generate on the engine's own model objects (same weights, fresh caches)."""

    def run(engine: Any, prompt_ids: list[int], point: Point) -> Measured:
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_sampler

        engine.reset()
        mx.random.seed(point.seed)  # mlx-lm samples from MLX's global random state
        kwargs: dict[str, Any] = {"sampler": make_sampler(temp=point.temp)}
        if use_draft:
            draft = _mlx_lm_draft(engine)
            assert draft is not None  # check_methods refuses mlx-lm without a draft
            kwargs |= {"draft_model": draft.model, "num_draft_tokens": point.k}
        timer, flags, reason = _Timer(), [], "length"
        tokenizer = engine.target.tokenizer
        with rope.native():  # the peer as mlx-lm runs it (EdgeSpec's rotary tables off)
            for resp in stream_generate(
                engine.target.model, tokenizer, mx.array(prompt_ids), point.max_tokens, **kwargs
            ):
                if resp.finish_reason == "stop":  # it carries the EOS token: not output
                    reason = "stop"
                    break
                timer.token(resp.token)
                flags.append(bool(resp.from_draft))
        # mlx-lm queues its next step before yielding a token, on its own stream: after an early
        # stop that step is still running. Let it finish here, so that it never overlaps the next
        # run: under a sharded target (edgespec.distributed) the all-reduces of two streams
        # would interleave differently on each rank and corrupt each other.
        from mlx_lm.generate import generation_stream

        mx.synchronize(generation_stream)
        rounds = rounds_from_flags(flags, point.k) if use_draft else RoundTotals()
        return timer.done(reason, rounds, timed=False)

    return run


@dataclass(frozen=True)
class Method:
    """A benchmarked way of decoding. uses_k: run once per K (else once per temperature, K=0)."""

    name: str
    description: str
    needs_draft: bool
    uses_k: bool
    run: Callable[[Any, list[int], Point], Measured]


def _registry() -> dict[str, Method]:
    """The methods `--methods` can name. A new EdgeSpec method is one line here: a SpecConfig
    (the Engine builds its drafter and K policy), or extras(engine, point) returning drafter=... /
    k_policy=... keyword arguments for Engine.generate. Adaptive methods take no K list (K is
    chosen per round, starting from SpecConfig's default and capped by its k_max)."""
    methods = [
        Method(PLAIN, "target alone through EdgeSpec's loop", False, False,
               _engine_runner(lambda p: SpecConfig(method="none"))),
        Method("spec", "EdgeSpec, draft model", True, True,
               _engine_runner(lambda p: SpecConfig(k=p.k, method="draft"))),
        Method("ngram", "EdgeSpec, n-gram prompt lookup (no draft)", False, True,
               _engine_runner(lambda p: SpecConfig(k=p.k, method="ngram"))),
        Method("hybrid", "EdgeSpec, n-gram when it matches, else the draft", True, True,
               _engine_runner(lambda p: SpecConfig(k=p.k, method="hybrid"))),
        Method("adaptive", "EdgeSpec, draft model, K chosen per round", True, False,
               _engine_runner(lambda p: SpecConfig(method="draft", adaptive=True))),
        Method("adaptive-ngram", "EdgeSpec, n-gram lookup, K chosen per round", False, False,
               _engine_runner(lambda p: SpecConfig(method="ngram", adaptive=True))),
        Method("adaptive-hybrid", "EdgeSpec, hybrid drafting, K chosen per round", True, False,
               _engine_runner(lambda p: SpecConfig(method="hybrid", adaptive=True))),
        Method("mlx-lm", "mlx_lm.stream_generate with the draft", True, True, _mlx_lm_runner(True)),
        Method("mlx-lm-plain", "mlx_lm.stream_generate, no draft", False, False,
               _mlx_lm_runner(False)),
    ]  # fmt: skip
    return {m.name: m for m in methods}


METHODS: dict[str, Method] = _registry()
# adaptive-hybrid: what `edgespec chat` and `generate` run by default.
DEFAULT_METHODS = (PLAIN, "spec", "mlx-lm", "adaptive-hybrid")


@dataclass(frozen=True)
class BenchPlan:
    """What to measure. Each (method, K, temp) variant runs on every prompt in every repeat."""

    methods: tuple[str, ...] = DEFAULT_METHODS
    ks: tuple[int, ...] = (4,)
    temps: tuple[float, ...] = (0.0,)
    max_tokens: int = 128
    repeats: int = 1
    seed: int = 0
    warmup_tokens: int = 16

    def __post_init__(self) -> None:
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
        for k in self.ks:  # the same checks and messages as generate's
            SpecConfig(k=k)
        for t in self.temps:
            SamplingConfig(temperature=t, seed=self.seed)
        if self.seed >= 2**63:  # each run's seed is this one plus an offset (iter_bench)
            raise ConfigError(f"bench's seed must be in [0, 2**63), got {self.seed}")
        if self.max_tokens < 1 or self.repeats < 1:
            raise ConfigError("max-tokens and repeats must be >= 1")

    def variants(self) -> list[tuple[str, int]]:
        """(method, K) pairs run at each temperature; K=0 for methods that take no K."""
        return [(m, k) for m in self.methods for k in (self.ks if METHODS[m].uses_k else (0,))]

    def total_runs(self, n_prompts: int) -> int:
        return self.repeats * n_prompts * len(self.temps) * len(self.variants())


def check_methods(engine: Any, plan: BenchPlan) -> None:
    """Raise ConfigError when a method needs a draft model the engine does not have."""
    missing = [m for m in plan.methods if METHODS[m].needs_draft and not engine.has_draft]
    if missing:
        raise ConfigError(
            f"methods {', '.join(missing)} need a draft model; pass --draft or drop them"
        )
    peer = _mlx_lm_draft(engine)
    if "mlx-lm" in plan.methods and peer is not None and isinstance(peer.model, EagleModel):
        raise ConfigError(
            "mlx-lm's speculative decoding needs a token draft; this pair's draft is a feature "
            "draft (EAGLE-style): pass one with --peer-draft or drop mlx-lm from --methods"
        )


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


# Input lengths whose kernels a GPU warm-up compiles: every verify / draft-step size the loop can
# ask for (K + 1 up to 16, hybrid lookups, adaptive K), and the catch-up and prefill chunks.
KERNEL_LENGTHS = (*range(1, 18), 32, 64, 128)


def warm_up(engine: Any, prompt_ids: list[int], plan: BenchPlan) -> None:
    """Run every variant once, briefly, so allocation and first-call costs stay out of timings.

    On a GPU backend both models first run once on every length in KERNEL_LENGTHS: MLX's CUDA
    backend compiles kernels per input shape on first use, and a variant's short warm-up run does
    not reach every shape (adaptive K's catch-up after plain rounds, say), so a compile (48-66 s on
    an H100) could otherwise land inside a timed run."""
    if not on_cpu():
        engine.warm_kernels(KERNEL_LENGTHS)
    n = min(plan.warmup_tokens, plan.max_tokens)
    for temp in plan.temps:
        for method, k in plan.variants():
            METHODS[method].run(engine, prompt_ids, Point(max(k, 1), temp, n, plan.seed))


def iter_bench(
    engine: Any,
    prompts: Sequence[Prompt],
    encoded: dict[str, list[int]],
    plan: BenchPlan,
) -> Iterator[RunRecord]:
    """Measure every variant on every encoded prompt; yield one RunRecord per run.

    Interleaved: for each repeat and prompt all variants run back to back, their order rotated by
    one per prompt so no method is always first (and drift hits every method alike). The sampling
    seed depends on (repeat, prompt) only: at a temperature every method sees the same seed.
    """
    todo = [p for p in prompts if p.id in encoded]
    for rep in range(plan.repeats):
        for temp in plan.temps:
            variants = plan.variants()
            for i, p in enumerate(todo):
                shift = (i + rep) % len(variants)
                seed = plan.seed + 100_003 * rep + i
                for method, k in variants[shift:] + variants[:shift]:
                    yield _measure(
                        engine, p, encoded[p.id], method, Point(k, temp, plan.max_tokens, seed), rep
                    )


def _measure(
    engine: Any, prompt: Prompt, ids: list[int], method: str, point: Point, repeat: int
) -> RunRecord:
    mx.reset_peak_memory()
    m = METHODS[method].run(engine, ids, replace(point, k=max(point.k, 1)))
    r = m.rounds
    return RunRecord(
        method=method, k=point.k, temp=point.temp, prompt_id=prompt.id, category=prompt.category,
        repeat=repeat, tokens=len(m.token_ids), ttft=m.ttft, decode_time=m.decode_time,
        wall_time=m.wall_time, finish_reason=m.finish_reason, peak_memory=mx.get_peak_memory(),
        rounds=r.rounds, drafted=r.drafted, accepted=r.accepted, rejections=r.rejections,
        accepted_hist=r.hist, t_draft=r.t_draft if m.timed_rounds else None,
        t_verify=r.t_verify if m.timed_rounds else None, t_model_decode=m.t_model_decode,
        token_ids=m.token_ids,
    )  # fmt: skip


@dataclass(frozen=True)
class MismatchNote:
    """A greedy run whose tokens differ from plain decoding's, and whether a near-tie explains it.

    logit_gap = target logit of plain's token - that of the other token, at the first differing
    position, from one full (cache-free) forward over prompt + the common prefix.
    """

    method: str
    k: int
    prompt_id: str
    category: str
    repeat: int
    position: int
    plain_token: int | None
    other_token: int | None
    logit_gap: float | None
    near_tie: bool


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token, or None when equal. [1,2,3] vs [1,2] -> 2."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_greedy(
    engine: Any, records: Sequence[RunRecord], encoded: dict[str, list[int]]
) -> tuple[list[RunRecord], list[MismatchNote]]:
    """Mark every temperature-0 run against plain's run on the same prompt (same repeat if any).

    Returns the records with `mismatch` / `first_diff` set and one note per mismatched run.
    """
    plain = {(r.prompt_id, r.repeat): r for r in records if r.method == PLAIN and r.temp == 0}
    plain_any = {r.prompt_id: r for r in reversed(records) if r.method == PLAIN and r.temp == 0}
    out, notes = [], []
    for r in records:
        ref = plain.get((r.prompt_id, r.repeat)) or plain_any.get(r.prompt_id)
        if r.temp != 0 or r.method == PLAIN or ref is None:
            out.append(r)
            continue
        pos = first_difference(ref.token_ids, r.token_ids)
        out.append(replace(r, mismatch=pos is not None, first_diff=pos))
        if pos is not None:
            notes.append(_explain(engine, r, ref, encoded[r.prompt_id], pos))
    return out, notes


def _explain(
    engine: Any, run: RunRecord, ref: RunRecord, prompt_ids: list[int], pos: int
) -> MismatchNote:
    """Measure the target's logit gap between the two tokens at the first difference."""
    a = ref.token_ids[pos] if pos < len(ref.token_ids) else None
    b = run.token_ids[pos] if pos < len(run.token_ids) else None
    gap, tie = None, False
    if a is not None and b is not None:
        seq = mx.array(list(prompt_ids) + list(ref.token_ids[:pos]))[None]
        logits = engine.target.model(seq)[0, -1].astype(mx.float32)
        gap = (logits[a] - logits[b]).item()
        tie = abs(gap) <= NEAR_TIE * max(1.0, abs(mx.max(logits).item()))
    return MismatchNote(
        run.method, run.k, run.prompt_id, run.category, run.repeat, pos, a, b, gap, tie
    )


@dataclass
class BenchResult:
    """Everything a report needs. complete=False when the run was stopped early."""

    records: list[RunRecord]
    notes: list[MismatchNote] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    pair: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    complete: bool = True


def environment() -> dict[str, Any]:
    """Versions and machine facts that change the numbers."""
    import os
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "mlx": ver("mlx"),
        "mlx_lm": ver("mlx-lm"),
        "edgespec": ver("edgespec"),
        "device": str(mx.default_device()),
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "blas": blas.active(),
        "blas_kernels": blas.kernels(),
        "cpu": blas.cpu_model(),
        "cpu_vendor": blas.cpu_vendor(),
        "blas_rows_exact": blas.rows_exact(),
        # EdgeSpec's CPU graph rewrites in force (README, "Optimised BLAS" and after): an A/B
        # with one switched off must say so in its results.
        "cpu_rewrites": {
            "grouped_attention": attention.enabled(),
            "table_rope": rope.enabled(),
            "lean_ops": leanops.enabled(),
            "compiled_blocks": blocks.enabled(),
            "fast_exp": fastexp.enabled(),
            "draft_pairs": loop.pairs_enabled(),
        },
    }


def pair_info(engine: Any) -> dict[str, Any]:
    """Names of the models measured."""
    draft = getattr(engine, "draft", None)
    return {
        "name": getattr(engine, "name", None),
        "target": getattr(engine.target, "name", None),
        "draft": getattr(draft, "name", None) if draft is not None else None,
        "peer_draft": getattr(getattr(engine, "peer_draft", None), "name", None),
        "context_window": getattr(engine, "context_window", None),
    }
