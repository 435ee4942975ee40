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

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx

import edgespec.blas as blas
from edgespec.architectures.token_draft import reduced_head
from edgespec.bench.context import ContextPrompt
from edgespec.bench.greedy import MismatchNote
from edgespec.bench.methods import (
    METHODS,
    PEER_METHODS,
    Point,
    engine_for,
    forget_kept,
    mlx_lm_draft,
    peer_draft,
)
from edgespec.bench.plan import SPEC_METHODS, BenchPlan
from edgespec.bench.prompts import Prompt
from edgespec.bench.records import RunRecord, bucket_rounds
from edgespec.cache import KVState
from edgespec.config import GenerationConfig, SpecConfig
from edgespec.errors import ConfigError
from edgespec.families import family_of


def check_methods(engine: Any, plan: BenchPlan) -> None:
    """Raise ConfigError when a method needs a draft model the engine does not have."""
    missing = [m for m in plan.methods if METHODS[m].needs_draft and not engine.has_draft]
    if missing:
        raise ConfigError(
            f"methods {', '.join(missing)} need a draft model; pass --draft or drop them"
        )
    family = engine.family
    blocks = [m for m in plan.methods if "block" in m.split("-")]
    if blocks and not family.blocks:
        raise ConfigError(f"methods {', '.join(blocks)} need a block draft (DFlash-style)")
    if "mtp" in plan.methods and not family.own_head:
        raise ConfigError("method mtp needs the target's own MTP head: pass --draft mtp")
    peer = mlx_lm_draft(engine)
    # a draft that reads the target's features (feature, block): not for mlx-lm
    if "mlx-lm" in plan.methods and peer is not None and family_of(peer).reads_features:
        raise ConfigError(
            "mlx-lm's speculative decoding needs a token draft; this pair's draft is a feature "
            "draft (EAGLE-style): pass one with --peer-draft or drop mlx-lm from --methods"
        )


def refused_methods(engine: Any, plan: BenchPlan) -> list[dict[str, str]]:
    """The methods of `plan` that cannot run on this pair, each {"method", "reason"}: mlx-lm's
    speculative decoding refuses a target whose prompt cache it cannot trim (recurrent layers:
    Qwen3.5, Qwen3-Next, Mamba...; mlx_lm.generate.speculative_generate_step). The bench leaves
    them out and says so in results.json (`refused`) instead of failing."""
    from mlx_lm.models.cache import make_prompt_cache

    out = []
    if "mlx-lm" in plan.methods:
        cache = make_prompt_cache(engine.target.model)
        stuck = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
        if stuck:
            out.append(
                {
                    "method": "mlx-lm",
                    "reason": "mlx-lm's speculative decoding requires a trimmable prompt cache; "
                    f"this target's has {', '.join(stuck)} layers",
                }
            )
    return out


# Input lengths whose kernels a GPU warm-up compiles: every verify / draft-step size the loop can
# ask for (K + 1 up to 16, hybrid lookups, adaptive K), and the catch-up and prefill chunks.
KERNEL_LENGTHS = (*range(1, 18), 32, 64, 128)


def warm_kernels(engine: Any, lengths: Iterable[int]) -> None:
    """Run each model of `engine` once on an input of every length in `lengths`, on a fresh set
    of its caches (Engine.new_states: the ones it holds stay as they are).

    GPU backends compile some kernels on first use, per input shape (MLX's CUDA backend builds
    its quantized matmuls with NVRTC, up to a minute each), so that no compile lands inside a
    timed run. A token draft's KVState runs too; a feature draft is left out (it needs features)."""
    target, draft = engine.new_states()
    for state in [target] + ([draft] if isinstance(draft, KVState) else []):
        for n in lengths:
            inputs = mx.zeros((n,), dtype=mx.int32)
            outs = [state.forward(inputs)]
            if reduced_head(state.model) is not None:
                outs.append(state.forward(inputs, head_only=True))
            mx.eval(outs)


def warm_up(engine: Any, prompt_ids: list[int], plan: BenchPlan) -> None:
    """Run every variant once, briefly, so allocation and first-call costs stay out of timings.

    On a GPU backend both models first run once on every length in KERNEL_LENGTHS: MLX's CUDA
    backend compiles kernels per input shape on first use, and a variant's short warm-up run does
    not reach every shape (adaptive K's catch-up after plain rounds, say), so a compile (48-66 s on
    an H100) could otherwise land inside a timed run."""
    if engine.backend.compiles_per_shape:
        warm_kernels(engine, KERNEL_LENGTHS)
    calibrate(engine, plan)
    n = min(plan.warmup_tokens, plan.max_tokens)
    for temp in plan.temps:
        for method, k in plan.variants():
            METHODS[method].run(
                engine_for(engine, method), prompt_ids, Point(max(k, 1), temp, n, plan.seed)
            )


def calibrate(engine: Any, plan: BenchPlan) -> None:
    """Calibrate adaptive K and the adaptive tree policies on each engine an adaptive method of
    `plan` runs on, as the chat and the server do at load (Engine.warm_up,
    edgespec.calibration): the bench then times the policy users run, which starts from
    measured costs (a plain step's, a tree verify's) instead of learning them inside each
    answer. Once per engine for chains and once for trees (a tree's warm-up times its trees)."""
    done: set[tuple[int, bool]] = set()
    for method, _ in plan.variants():
        fields = SPEC_METHODS[method][3] if method in SPEC_METHODS else {}
        runs_on = engine_for(engine, method)
        adaptive = fields.get("adaptive") or fields.get("tree") == "auto"
        kind = (id(runs_on), bool(fields.get("tree")))
        if not adaptive or kind in done or not runs_on.has_draft:
            continue
        done.add(kind)
        runs_on.warm_up(GenerationConfig(spec=SpecConfig(**fields)))


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
                    point = Point(k, temp, plan.max_tokens, seed)
                    yield _measure(
                        engine, p, encoded[p.id], method, point, rep, plan.position_width
                    )


def iter_context_bench(
    engine: Any, prompts: Sequence[ContextPrompt], plan: BenchPlan
) -> Iterator[RunRecord]:
    """The long-context mode: per prompt (one per length and kind, in order), every variant's
    time to first token once, cold, then its decode runs from the prefilled caches.

    Prefill dominates at these lengths on a CPU, so it runs once per method and prompt: each
    method's cold run (max_tokens 1, its own caches emptied first) times TTFT and leaves the
    prompt in the caches; the measured runs then start from that prefix (Point.reuse: the Engine
    reuses its common prefix, mlx-lm a kept prompt cache trimmed back after each run), decoding
    the same tokens they would from scratch (the caches hold the same prompt). Each measured
    record carries its cold run's TTFT, and the peak memory of the cold and measured runs less
    what other methods' kept caches held (as if it ran alone). Interleaving and seeds as in
    iter_bench; the cold runs use the first temperature.
    """
    base = mx.get_active_memory()  # weights and the like: held by every method alike
    for rep in range(plan.repeats):
        for i, p in enumerate(prompts):
            variants = plan.variants()
            shift = (i + rep) % len(variants)
            order = variants[shift:] + variants[:shift]
            ids = list(p.ids)
            cold: dict[tuple[str, int], tuple[float, int]] = {}
            for method, k in order:
                _empty_caches(engine, method)
                point = Point(max(k, 1), plan.temps[0], 1, plan.seed, reuse=True)
                cold[(method, k)] = _timed_peak(engine, method, ids, point, base)
            for temp in plan.temps:
                seed = plan.seed + 100_003 * rep + i
                for method, k in order:
                    point = Point(k, temp, plan.max_tokens, seed, reuse=True)
                    prompt = Prompt(p.id, p.id, "")
                    mx.reset_peak_memory()
                    held = mx.get_active_memory() - base
                    rec = _measure(engine, prompt, ids, method, point, rep, plan.position_width)
                    ttft, peak = cold[(method, k)]
                    yield replace(
                        rec,
                        ttft=ttft,
                        peak_memory=max(peak, rec.peak_memory - max(0, held)),
                        context=p.length,
                    )


def _empty_caches(engine: Any, method: str) -> None:
    """Before a cold run: empty the caches `method` runs on (the Engine's, or mlx-lm's kept
    set), leaving the other methods' prefixes in place."""
    if method in PEER_METHODS:
        forget_kept(engine, with_draft=METHODS[method].needs_draft)
    else:
        engine_for(engine, method).reset()


def _timed_peak(
    engine: Any, method: str, ids: list[int], point: Point, base: int
) -> tuple[float, int]:
    """(TTFT, peak memory less what other methods' caches held) of one cold run."""
    mx.reset_peak_memory()
    held = mx.get_active_memory() - base
    m = METHODS[method].run(engine_for(engine, method), ids, point)
    return m.ttft, mx.get_peak_memory() - max(0, held)


def _measure(
    engine: Any,
    prompt: Prompt,
    ids: list[int],
    method: str,
    point: Point,
    repeat: int,
    position_width: int = 0,
) -> RunRecord:
    mx.reset_peak_memory()
    m = METHODS[method].run(engine_for(engine, method), ids, replace(point, k=max(point.k, 1)))
    r = m.rounds
    return RunRecord(
        method=method,
        k=point.k,
        temp=point.temp,
        prompt_id=prompt.id,
        category=prompt.category,
        repeat=repeat,
        tokens=len(m.token_ids),
        ttft=m.ttft,
        decode_time=m.decode_time,
        wall_time=m.wall_time,
        finish_reason=m.finish_reason,
        peak_memory=mx.get_peak_memory(),
        rounds=r.rounds,
        drafted=r.drafted,
        accepted=r.accepted,
        rejections=r.rejections,
        accepted_hist=r.hist,
        position_tries=r.tries,
        position_passes=r.passes,
        t_draft=r.t_draft if m.timed_rounds else None,
        t_verify=r.t_verify if m.timed_rounds else None,
        t_model_decode=m.t_model_decode,
        token_ids=m.token_ids,
        prompt_tokens=len(ids),
        position_buckets=bucket_rounds(m.round_log, position_width),
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
    refused: list[dict[str, str]] = field(default_factory=list)  # refused_methods


def environment(engine: Any) -> dict[str, Any]:
    """Versions and machine facts that change the numbers (and `engine`'s backend's rewrites)."""
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
        # EdgeSpec's CPU graph rewrites in force (docs/cpu-backend.md): an A/B
        # with one switched off must say so in its results.
        "cpu_rewrites": engine.backend.recorded(),
    }


def token_draft_name(engine: Any) -> str | None:
    """The name of the token draft the token-draft methods ran on, when a token engine is set."""
    other = engine_for(engine, "spec")
    return None if other is engine else getattr(other.draft, "name", None)


def pair_info(engine: Any) -> dict[str, Any]:
    """Names of the models measured."""
    draft = getattr(engine, "draft", None)
    return {
        "name": getattr(engine, "name", None),
        "target": getattr(engine.target, "name", None),
        "draft": getattr(draft, "name", None) if draft is not None else None,
        "peer_draft": getattr(peer_draft(engine), "name", None),
        # the draft the token-draft methods ran with, when not the pair's own (a block pair)
        "token_methods_draft": token_draft_name(engine),
        "context_window": getattr(engine, "context_window", None),
    }
