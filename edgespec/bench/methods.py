"""The runner of each method `edgespec bench --methods` can name (the names and settings are in
edgespec/bench/plan.py), and how one run of each is timed: every method from outside its token
generator (see `_Timer`), after `engine.reset()` so no method starts with a warm prefix cache."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm import stream_generate
from mlx_lm.generate import generation_stream
from mlx_lm.sample_utils import make_sampler

from edgespec.bench.plan import PEER_METHODS, SPEC_METHODS, TOKEN_METHODS
from edgespec.bench.records import rounds_from_flags
from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Finished, Round, RoundTotals, Token, fold_rounds


def one_stream() -> Any:
    """The context every bench run executes in: MLX's default stream switched to mlx-lm's
    generation stream, so EdgeSpec's methods and mlx-lm's run their products on one thread. On
    the CPU backend under a multi-threaded BLAS (Intel MKL's OpenMP), a second thread that
    calls the BLAS leaves every later multi-row product of the process short of threads: after
    one mlx-lm run on its own stream, EdgeSpec's verifies on the default stream ran about half
    as fast (docs/cpu-backend.md). One stream also keeps a sharded target's all-reduces in one
    order on every rank."""
    return mx.stream(generation_stream)


@dataclass(frozen=True)
class Point:
    """The settings of one measured run."""

    k: int
    temp: float
    max_tokens: int
    seed: int
    # Start from the prefix this prompt left in the caches (the long-context mode's decode runs,
    # edgespec/bench/context.py): the Engine keeps its caches (no reset) and reuses the longest
    # common prefix as always; mlx-lm runs on a prompt cache kept per engine and trimmed back to
    # the prompt after each run. False: every run prefills from scratch.
    reuse: bool = False


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
    # Per round: (answer position of its first token, tokens committed, drafted, accepted).
    round_log: tuple[tuple[int, int, int, int], ...] = ()


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
        self,
        reason: str,
        rounds: RoundTotals,
        timed: bool,
        t_model: float | None = None,
        log: tuple[tuple[int, int, int, int], ...] = (),
    ) -> Measured:
        first = self.last if self.first is None else self.first
        end = time.perf_counter()
        return Measured(
            tuple(self.ids),
            first - self.start,
            self.last - first,
            end - self.start,
            reason,
            rounds,
            timed,
            t_model,
            log,
        )


def _sampling(point: Point) -> SamplingConfig:
    return SamplingConfig(temperature=point.temp, seed=point.seed)


Extras = Callable[[Any, Point], dict[str, Any]]


def decode_model_time(rounds: Sequence[tuple[Round, int]]) -> float:
    """Draft + verify seconds of the rounds run between a generation's first and last token, from
    its Round events each with the count of Token events just before it (a round's tokens come
    before its Round): the first round made the first token (TTFT side), and a round with no
    tokens (it committed only EOS) ended after the last one. E.g. rounds of 0.1, 0.2 and 0.3 s
    after 3, 2 and 0 tokens -> 0.2 s."""
    return sum(r.t_draft + r.t_verify for r, tokens in rounds[1:] if tokens)


def _engine_runner(
    spec: Callable[[Point], SpecConfig], extras: Extras | None = None
) -> Callable[[Any, list[int], Point], Measured]:
    """A runner that drives Engine.generate with the SpecConfig that `spec` builds, plus the
    keyword arguments `extras(engine, point)` returns (e.g. drafter=..., k_policy=...)."""

    def run(engine: Any, prompt_ids: list[int], point: Point) -> Measured:
        config = GenerationConfig(_sampling(point), spec(point), max_tokens=point.max_tokens)
        kwargs = extras(engine, point) if extras else {}
        if not point.reuse:
            engine.reset()
        timer, reason = _Timer(), "length"
        rounds: list[tuple[Round, int]] = []  # each Round with the tokens just before it
        tokens = 0
        for event in engine.generate(prompt_ids, config, **kwargs):
            if isinstance(event, Token):
                timer.token(event.id)
                tokens += 1
            elif isinstance(event, Round):
                rounds.append((event, tokens))
                tokens = 0
            elif isinstance(event, Finished):
                reason = event.reason
        t_model = decode_model_time(rounds)
        totals = fold_rounds(r for r, _ in rounds)
        return timer.done(reason, totals, timed=True, t_model=t_model, log=round_log(rounds))

    return run


def round_log(rounds: Sequence[tuple[Round, int]]) -> tuple[tuple[int, int, int, int], ...]:
    """(answer position of the round's first token, tokens, drafted, accepted) per round, from
    Round events each with the count of tokens just before it. E.g. rounds committing 3 and 2
    tokens -> positions 0 and 3."""
    out, position = [], 0
    for r, tokens in rounds:
        out.append((position, tokens, r.drafted, r.accepted))
        position += tokens
    return tuple(out)


def round_log_from_flags(
    from_draft: Sequence[bool], k: int
) -> tuple[tuple[int, int, int, int], ...]:
    """The same log from mlx-lm's per-token `from_draft` flags, as rounds_from_flags counts them:
    a run of draft tokens closed by a target token is one round that drafted K; a trailing run of
    draft tokens, a round cut short. E.g. K=2, T T F | F -> (0, 3, 2, 2), (3, 1, 2, 0)."""
    out, start, run = [], 0, 0
    for i, flag in enumerate(from_draft):
        if flag:
            run += 1
            continue
        out.append((start, run + 1, k, run))
        start, run = i + 1, 0
    if run:
        out.append((start, run, run, run))
    return tuple(out)


# A token draft for peers that cannot run an engine's draft (mlx-lm, when that is a feature
# draft), per engine: bench state (`edgespec bench --peer-draft`), which the Engine never holds.
_PEER_DRAFTS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def set_peer_draft(engine: Any, draft: Any) -> None:
    """Have peers (mlx-lm) run `draft` (a loaded token draft) instead of `engine`'s draft."""
    _PEER_DRAFTS[engine] = draft


def peer_draft(engine: Any) -> Any | None:
    """The token draft set for `engine`'s peers, or None."""
    return _PEER_DRAFTS.get(engine)


# An Engine over the same target with the pair's token draft, per engine, for the token-draft
# methods when the engine's own draft is a block draft (`edgespec bench --pair` of a block pair):
# the block and token drafts then run side by side in one bench. Bench state, like peer drafts.
_TOKEN_ENGINES: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def set_token_engine(engine: Any, token_engine: Any) -> None:
    """Run TOKEN_METHODS on `token_engine` (same target, a token draft) instead of `engine`."""
    _TOKEN_ENGINES[engine] = token_engine


def engine_for(engine: Any, method: str) -> Any:
    """The engine `method` runs on: the token engine set for `engine` for a token-draft method,
    else `engine` itself."""
    if method in TOKEN_METHODS:
        return _TOKEN_ENGINES.get(engine, engine)
    return engine


def mlx_lm_draft(engine: Any) -> Any | None:
    """The draft mlx-lm runs with: the engine's peer token draft when the bench set one (the
    pair's own is a feature draft), else the pair's draft (None without one)."""
    return peer_draft(engine) or (engine.draft if engine.has_draft else None)


def _mlx_lm_runner(use_draft: bool) -> Callable[[Any, list[int], Point], Measured]:
    """mlx-lm's stream_generate on the engine's own model objects (same weights, fresh caches)."""

    def run(engine: Any, prompt_ids: list[int], point: Point) -> Measured:
        engine.reset()
        mx.random.seed(point.seed)  # mlx-lm samples from MLX's global random state
        kwargs: dict[str, Any] = {"sampler": make_sampler(temp=point.temp)}
        draft = mlx_lm_draft(engine) if use_draft else None
        if use_draft:
            assert draft is not None  # check_methods refuses mlx-lm without a draft
            kwargs |= {"draft_model": draft.model, "num_draft_tokens": point.k}
        kept = _kept_cache(engine, prompt_ids, draft) if point.reuse else None
        prompt = mx.array(prompt_ids)
        if kept is not None:
            kwargs["prompt_cache"] = kept.caches
            prompt = mx.array(prompt_ids[kept.offset :])
        timer, flags, reason = _Timer(), [], "length"
        tokenizer = engine.target.tokenizer
        # engine.target.model is mlx-lm's model as loaded: the Engine runs a twin of it with its
        # CPU layers (edgespec/cpu/backend.py), so the peer runs mlx-lm's own code.
        for resp in stream_generate(
            engine.target.model, tokenizer, prompt, point.max_tokens, **kwargs
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
        mx.synchronize(generation_stream)
        if kept is not None:
            kept.keep(engine, len(prompt_ids))
        rounds = rounds_from_flags(flags, point.k) if use_draft else RoundTotals()
        log = round_log_from_flags(flags, point.k) if use_draft else ()
        return timer.done(reason, rounds, timed=False, log=log)

    return run


@dataclass
class _Kept:
    """mlx-lm prompt caches (target's layers, then the draft's) kept for one prompt: they hold
    its first `offset` tokens, and a run feeds the rest."""

    prompt: tuple[int, ...]
    draft: Any
    caches: list[Any]
    offset: int = 0

    def keep(self, engine: Any, prompt_len: int) -> None:
        """Trim every cache back to the prompt's first prompt_len - 1 tokens (what the run added
        goes), or forget them where one cannot be trimmed (recurrent layers: the next run
        prefills afresh)."""
        keep = prompt_len - 1
        if not all(c.is_trimmable() for c in self.caches):
            _KEPT.get(engine, {}).pop(self.draft is not None, None)
            return
        for c in self.caches:
            c.trim(max(0, c.offset - keep))
        self.offset = keep


# mlx-lm's caches kept per engine for the long-context mode's decode runs (Point.reuse): one
# set for mlx-lm with its draft, one for mlx-lm-plain (keyed by whether a draft runs).
_KEPT: weakref.WeakKeyDictionary[Any, dict[bool, _Kept]] = weakref.WeakKeyDictionary()


def forget_kept(engine: Any, with_draft: bool | None = None) -> None:
    """Drop mlx-lm's kept caches for `engine` (those with or without a draft; None: both); the
    next reusing run prefills from scratch."""
    if with_draft is None:
        _KEPT.pop(engine, None)
    else:
        _KEPT.get(engine, {}).pop(with_draft, None)


def _kept_cache(engine: Any, prompt_ids: list[int], draft: Any) -> _Kept:
    """The kept caches for this prompt and draft, or fresh empty ones (then kept)."""
    from mlx_lm.models.cache import make_prompt_cache

    sets = _KEPT.setdefault(engine, {})
    kept = sets.get(draft is not None)
    if kept is None or kept.prompt != tuple(prompt_ids) or kept.draft is not draft:
        caches = make_prompt_cache(engine.target.model)
        if draft is not None:
            caches += make_prompt_cache(draft.model)
        kept = _Kept(tuple(prompt_ids), draft, caches)
        sets[draft is not None] = kept
    return kept


@dataclass(frozen=True)
class Method:
    """A benchmarked way of decoding. uses_k: run once per K (else once per temperature, K=0)."""

    name: str
    description: str
    needs_draft: bool
    uses_k: bool
    run: Callable[[Any, list[int], Point], Measured]


def _spec_runner(
    fields: dict[str, Any], uses_k: bool
) -> Callable[[Any, list[int], Point], Measured]:
    """The runner of an EdgeSpec method: Engine.generate with SpecConfig(**fields); a method
    that takes a K list runs the point's k, fixed, unless its fields say adaptive (`tree`: the
    point's k is the tree's depth, with the fallback to chains a user's --tree gets)."""
    return _engine_runner(
        lambda p: SpecConfig(**({"adaptive": False, **fields, "k": p.k} if uses_k else fields))
    )


def _registry() -> dict[str, Method]:
    """The methods `--methods` can name (edgespec.bench.plan's tables), each with its runner: an
    EdgeSpec method is one row of SPEC_METHODS (the Engine builds its drafter and K policy from
    the SpecConfig); mlx-lm's are the peers."""
    methods = [
        Method(name, text, draft, uses_k, _spec_runner(fields, uses_k))
        for name, (text, draft, uses_k, fields) in SPEC_METHODS.items()
    ]
    for name, (text, draft, uses_k) in PEER_METHODS.items():
        methods.append(Method(name, text, draft, uses_k, _mlx_lm_runner(draft)))
    return {m.name: m for m in methods}


METHODS: dict[str, Method] = _registry()
