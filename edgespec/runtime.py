"""The Engine: a target (and optional draft) with their tokenizer, chat template, detokenizer and
shared-prefix KV caches. The CLI, the TUI and the bench all drive generation through it. What a
request runs (drafter, K or shape policy, chain or tree rounds, plain decoding) comes from a
RoundFactory (edgespec/strategy.py); the Engine never looks at what kind of draft it holds.

    engine = Engine.load(target="path/or/repo", draft="path/or/repo")
    for event in engine.chat([{"role": "user", "content": "Hi"}], GenerationConfig()):
        ...  # Token* Round (per round) ... Finished

Threading: MLX streams belong to one thread; load and generate on the same thread (docs/library.md).
`cancel` (a threading.Event) may be set from any thread; it is checked between rounds.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import edgespec.prompting as prompting
from edgespec.backend import Backend
from edgespec.cache import Forward, KVState, check_kv_bits
from edgespec.config import GenerationConfig
from edgespec.device import for_device
from edgespec.drafting.base import Drafter
from edgespec.errors import PromptError, check_context
from edgespec.events import Event, Finished, Prefill, Round, Token, generation_stats
from edgespec.families import family_of
from edgespec.loading.load import load_pair
from edgespec.loading.specs import load_catalog, pair_thinking
from edgespec.rounds import Limits, Policy, Step, cancelled
from edgespec.strategy import RoundFactory
from edgespec.taps import vocab_size

if TYPE_CHECKING:  # imported where used: a lone process on a token draft needs none of them
    from edgespec.calibration import Calibration
    from edgespec.distributed.group import Agreement, Group
    from edgespec.trees.forward import Kernels

ProgressFn = Callable[[str, float | None], None]


class Engine:
    """Owns both models and their prefix caches. Not thread-safe: one generation at a time."""

    def __init__(self, target: Any, draft: Any | None, kv_bits: int | None = None):
        self.target, self.draft = target, draft
        # 8 or 4: the target's and a token draft's KV caches are quantized (mlx-lm's
        # QuantizedKVCache, edgespec/cache.py quantized) in every state this engine makes; greedy
        # output then equals plain decoding with the same setting. None: full-precision caches.
        self.kv_bits = check_kv_bits(kv_bits)
        self.tokenizer = target.tokenizer
        self.has_draft = draft is not None
        # How the draft runs (edgespec/families/): its state, prefill and drafters. Chosen once.
        self.family = family_of(draft)
        self.name = f"{target.name} + {draft.name}" if draft is not None else str(target.name)
        self.context_window = int(target.context_window)
        if draft is not None:
            self.context_window = min(self.context_window, int(draft.context_window))
        # The device's backend (edgespec/backend.py): on the CPU the states run twins of the
        # models with its optimised layers (target.model / draft.model stay mlx-lm's), its
        # caches, draft steps and sampling softmax; on a GPU the models and MLX's own.
        self.backend: Backend = for_device()
        self._draft: Any  # the family's draft state, or None
        self._target, self._draft = self.new_states()
        self._vocab = vocab_size(target.model)
        # Each request's drafter, policy and rounds (the tree forward's pieces: `kernels`).
        self.factory = RoundFactory(
            self._vocab, self.name, self.family, self.backend.draft_steps, lambda: self.kernels
        )
        self._eos = frozenset(int(t) for t in self.tokenizer.eos_token_ids)
        # Launched as one rank of a group (edgespec.distributed): every rank runs this engine,
        # and the ranks compare what each step committed (Agreement). None: a lone process.
        self.group: Group | None = None
        self.agreement: Agreement | None = None
        self.calibration: Calibration | None = None  # set by warm_up: seeds adaptive K
        # The chat template's thinking mode encode_chat uses when not told (enable_thinking):
        # the catalogue pair's default (Engine.load: the mode its draft was trained for), or a
        # caller's choice (--think / --no-think); None = the template's own default.
        self.thinking: bool | None = None

    @functools.cached_property
    def kernels(self) -> Kernels:
        """The draft-tree forward's pieces (and the server's packed forward's, server/packed.py):
        the backend's attention and compiled blocks. Made when first asked for."""
        return self.backend.kernels()

    @classmethod
    def load(
        cls,
        target: str | None = None,
        draft: str | None = None,
        pair: str | None = None,
        *,
        draft_bits: int | None = 4,
        on_progress: ProgressFn | None = None,
        with_draft: bool = True,
        dtype: str | None = None,
        group: Group | None = None,
        shard: str = "tensor",
        kv_bits: int | None = None,
    ) -> Engine:
        """Load a pair (all None: the embedded default pair). with_draft=False skips the draft
        (plain decoding only). dtype: the models' float parameters (`loading.load_model`).
        group: this process's group (edgespec.distributed.group.init_group); more than one rank
        splits the target `shard` ("tensor" / "pipeline") parallel, and every rank must load and
        generate alike. kv_bits: quantized KV caches of 8 or 4 bits (None: full precision; see
        `Engine`); any other value is a ConfigError before anything loads. A named pair's
        catalogue "thinking" becomes `thinking`, encode_chat's default. Raises
        ModelNotFoundError / ModelLoadError / TokenizerMismatchError / CacheNotTrimmableError
        with one-line messages."""
        check_kv_bits(kv_bits)  # before anything loads
        catalog = load_catalog()
        t, d = load_pair(
            target,
            draft,
            pair,
            draft_bits=draft_bits,
            on_progress=on_progress,
            with_draft=with_draft,
            dtype=dtype,
            group=group,
            shard=shard,
            catalog=catalog,
        )
        engine = cls(t, d, kv_bits)
        engine.thinking = pair_thinking(target, pair, catalog)
        if group is not None:
            from edgespec.distributed.group import agreement_for

            engine.group, engine.agreement = group, agreement_for(group)
        return engine

    # ------------------------------------------------------------------ prompts

    def encode_chat(
        self, messages: list[dict[str, str]], *, think: bool | None = None
    ) -> list[int]:
        """Token ids of a conversation through the chat template, ready for the assistant's turn.
        The messages' text is text: a special-token string in it (e.g. '<|im_end|>') is
        tokenized as characters, never as the control token (edgespec/prompting.py); only the
        template's own markers are control tokens. `think`: the template's thinking mode
        (enable_thinking), None = `self.thinking` (the pair's default); passed only to a
        template that has one (`thinking_mode`)."""
        if not any(str(m.get("content", "")).strip() for m in messages):
            raise PromptError("the prompt is empty")
        if not getattr(self.tokenizer, "has_chat_template", False):
            return self.encode_raw("\n".join(m["content"] for m in messages))
        think = self.thinking if think is None else think
        kwargs = {} if think is None or self.thinking_mode() is None else {"enable_thinking": think}
        return prompting.encode_chat(self.tokenizer, messages, **kwargs)

    def encode_raw(self, text: str, *, parse_special: bool = False) -> list[int]:
        """Token ids of `text` as is, no template (the tokenizer's BOS, if it has one, is added).
        Special-token strings in it are text unless `parse_special`: then '<|im_end|>' is the
        control token, for a caller that writes a template's markers itself."""
        if not text.strip():
            raise PromptError("the prompt is empty")
        return prompting.encode_text(self.tokenizer, text, parse_special=parse_special)

    def thinking_mode(self, think: bool | None = None) -> bool | None:
        """The thinking mode `encode_chat(think=think)` renders: None where the chat template
        has no thinking mode (the switch changes nothing there), else True (thinking) or False.

        For SmolLM2's template: None. For Qwen3's: the pair's default, or the template's (on)."""
        template = self._template_thinking
        if template is None:
            return None
        chosen = self.thinking if think is None else think
        return template if chosen is None else chosen

    @functools.cached_property
    def _template_thinking(self) -> bool | None:
        return prompting.thinking_default(self.tokenizer)

    def _check_prompt(self, prompt_ids: Iterable[int]) -> list[int]:
        """The prompt as a list of ints, or PromptError: empty, not token ids of the target's
        embedding (an id out of range would read outside it), or too long."""
        if isinstance(prompt_ids, (str, bytes)):
            raise PromptError(
                "generate() takes token ids: encode text with encode_raw() or encode_chat(), or "
                "call chat()"
            )
        try:
            prompt_ids = [operator.index(t) for t in prompt_ids]  # ints, numpy or MLX scalars
        except TypeError as exc:
            raise PromptError(f"the prompt must be token ids (ints): {exc}") from None
        if not prompt_ids:
            raise PromptError("the prompt is empty")
        bad = next((t for t in prompt_ids if not 0 <= t < self._vocab), None)
        if bad is not None:
            raise PromptError(f"{bad} in the prompt is not a token id (0..{self._vocab - 1})")
        check_context(len(prompt_ids), self.context_window, self.name)
        return prompt_ids

    # ------------------------------------------------------------------ generation

    def chat(
        self,
        messages: list[dict[str, str]],
        config: GenerationConfig,
        cancel: threading.Event | None = None,
        on_prefill: Callable[[Prefill], object] | None = None,
        *,
        think: bool | None = None,
    ) -> Iterator[Event]:
        """generate(encode_chat(messages, think=think), config, cancel, on_prefill=on_prefill)."""
        ids = self.encode_chat(messages, think=think)
        return self.generate(ids, config, cancel, on_prefill=on_prefill)

    def generate(
        self,
        prompt_ids: list[int],
        config: GenerationConfig,
        cancel: threading.Event | None = None,
        *,
        drafter: Drafter | None = None,
        k_policy: Policy[Any] | None = None,
        on_prefill: Callable[[Prefill], object] | None = None,
        gate: Callable[[Policy[Any]], Policy[Any]] | None = None,
    ) -> Iterator[Event]:
        """Stream Token events as they are committed, one Round after each round's tokens
        (speculative methods only), then exactly one Finished.

        config.spec.method "none" decodes plainly with the target (kind "target"); "draft",
        "ngram" and "hybrid" pick the drafter (edgespec.families.chain_drafter). `drafter` replaces it;
        `k_policy` picks K per round (default: config.spec.k, or AdaptiveK when
        config.spec.adaptive): a rounds.Policy (shown every round once: observe / decide); with
        a tree, a trees.loop.ShapePolicy. `gate(policy)`, if given, is the policy the rounds ask
        instead (a server's batch mode, edgespec/server/mode.py).
        `on_prefill(Prefill(done, total))` is called after each chunk of the prompt's prefill,
        on this thread; `cancel` set during the prefill stops it after the chunk under way, and
        the generation finishes 'cancelled' with no token. Errors surface on the first next()."""
        prompt = self._check_prompt(prompt_ids)
        if self.group is not None and k_policy is None:
            from edgespec.distributed.group import check_config

            check_config(config, self.group)
        return self._run(prompt, config, cancel, drafter, k_policy, on_prefill, gate)

    def _run(
        self, prompt, config, cancel, drafter, k_policy, on_prefill=None, gate=None
    ) -> Iterator[Event]:
        t_request = time.perf_counter()
        try:
            spec, sampling = config.spec, config.sampling
            strategy = self.factory.build(
                spec, sampling, self._target, self._draft, drafter, k_policy, self.calibration
            )
            if gate is not None and strategy.policy is not None:
                strategy = dataclasses.replace(strategy, policy=gate(strategy.policy))
            limits = Limits(config.max_tokens, self._eos, self.context_window)
            steps = strategy.steps(prompt, sampling, limits, cancel)
            on_chunk = None if on_prefill is None else lambda d, t: on_prefill(Prefill(d, t))
            prefilled = strategy.prefill(prompt, cancel, on_chunk)
            if cancel is not None and cancel.is_set():
                steps = iter([cancelled()])  # stopped while reading: no forward over the rest
            yield from self._events(prompt, steps, t_request, prefilled)
        except GeneratorExit:
            raise  # the consumer stopped early; the loops' `finally` left the caches consistent
        except Exception:
            self.reset()  # unknown state after a failure mid-round: start cold next time
            raise

    def _events(self, prompt, steps: Iterator[Step], t_request: float, prefilled: int):
        detok = self.tokenizer.detokenizer
        rounds: list[Round] = []
        count, t_first, t_last, reason = 0, None, None, "length"
        for step in steps:
            for tok, kind in zip(step.tokens, step.kinds, strict=True):
                detok.add_token(tok)
                t_last = time.perf_counter()
                t_first = t_first if t_first is not None else t_last
                index = step.round.index if step.round else count
                yield Token(tok, detok.last_segment, kind, index)  # type: ignore[arg-type]
                count += 1
            if step.round is not None:
                rounds.append(step.round)
                yield step.round
            if self.agreement is not None:  # a sharded target: all ranks committed the same?
                r = step.round
                shape = (r.drafted, r.accepted) if r is not None else (None, None)
                self.agreement.observe(step.tokens, *shape)
            if step.stop:
                reason = step.stop
                break
        if self.agreement is not None:
            self.agreement.settle()
        detok.finalize()
        stats = generation_stats(
            rounds,
            count,
            t_request=t_request,
            t_first=t_first,
            t_last=t_last,
            prompt_tokens=len(prompt),
            prefilled_tokens=prefilled,
        )
        yield Finished(reason, stats, detok.text)  # type: ignore[arg-type]

    def warm_up(self, config: GenerationConfig, folder: Path | None = None) -> Calibration:
        """Compile the shapes `config`'s loop will use and calibrate adaptive K and the tree
        policies (edgespec.calibration): short generations whose K cycles over 1..k_max twice
        (calibration.KCycle; a tree: the chains, then its trees, trees/build.py warm_shapes),
        their post-compile costs added to the calibration saved in `folder` (default
        <home>/calibration) for this machine, backend and pair; then forget both caches. Later
        adaptive requests start from the calibration's medians."""
        import edgespec.calibration as calib
        from edgespec.trees.build import ShapeCycle, warm_shapes

        key, path = self._calibration_file(folder)
        saved = calib.Calibration.load(path, key) or calib.Calibration(key)
        prompt = self.encode_chat([{"role": "user", "content": calib.WARM_PROMPT}])
        cycle: calib.KCycle | ShapeCycle = calib.KCycle(config.spec.k_max)
        if config.spec.tree:
            cycle = ShapeCycle(warm_shapes(config.spec))
        policy = cycle if config.spec.enabled else None
        budget = dataclasses.replace(config, max_tokens=cycle.tokens)
        events: list[Event] = []
        for _ in range(calib.WARM_TRIES if policy else 1):  # an answer may stop early (EOS)
            # The caches are kept between tries: a try's first round then reads one prompt token,
            # not the whole prompt, and is timed like the others (loop.Chains.finish).
            events += self.generate(prompt, budget, k_policy=policy)
            if cycle.done:
                break
        self.reset()
        rounds = [e for e in events if isinstance(e, Round)]
        self.calibration = saved.add(*calib.round_costs(rounds), calib.tree_costs(rounds))
        self.calibration.save(path)
        return self.calibration

    def use_saved_calibration(self, folder: Path | None = None) -> Calibration | None:
        """Seed adaptive K from the calibration an earlier warm_up saved for this machine,
        backend and pair (`folder`: as warm_up's), without measuring anything; None (and no
        seed) where there is none. `edgespec generate` starts from it."""
        from edgespec.calibration import Calibration

        key, path = self._calibration_file(folder)
        saved = Calibration.load(path, key)
        if saved is not None:
            self.calibration = saved
        return saved

    def _calibration_file(self, folder: Path | None) -> tuple[dict[str, str], Path]:
        """This engine's calibration key and the file it is saved in (edgespec.calibration)."""
        from importlib.metadata import version

        import mlx.core as mx

        import edgespec.calibration as calib
        from edgespec.loading.paths import home

        key = calib.calibration_key(self.name, str(mx.default_device()), {"mlx": version("mlx")})
        return key, calib.calibration_path(folder or home() / "calibration", self.name)

    def reset(self) -> None:
        """Forget both caches (the next request prefills from scratch)."""
        self._target.reset()
        if self._draft is not None:
            self._draft.reset()

    # ------------------------------------------------------------------ cache sets

    def new_states(
        self, run: Forward | None = None, kind: type[KVState] = KVState
    ) -> tuple[KVState, Any]:
        """Empty caches for both models (target, the draft family's state or None), e.g. for
        one more conversation kept aside (edgespec.server.prefix); `swap_states` installs them.
        `run`: who runs the target's and a token draft's forwards (cache.Forward: a server's
        batch packs them; None: each state its own). `kind`: the target state's class (KVState,
        or a caller's subclass of it: the server's, edgespec/server/bank.py)."""
        return self.family.new_states(
            self.backend, self.target, self.draft, self.kv_bits, run, kind
        )

    def swap_states(self, target: KVState, draft: Any) -> tuple[KVState, Any]:
        """Hold these caches (from `new_states`, or returned by an earlier swap) from now on and
        return the ones held until now. The next request reuses the longest common prefix with
        what the new caches hold, as always."""
        if (draft is None) != (self._draft is None) or type(draft) is not type(self._draft):
            raise ValueError("swap_states: the draft state does not match this engine's draft")
        held = self._target, self._draft
        self._target, self._draft = target, draft
        return held

    def check_prompt(self, prompt_ids: Iterable[int]) -> list[int]:
        """The prompt as a list of ints, or the PromptError generate() would raise (empty, not
        token ids of the target, longer than the context window). Touches no MLX state."""
        return self._check_prompt(prompt_ids)

    def cached_tokens(self) -> tuple[list[int], list[int] | None]:
        """The token ids each KV cache holds (target, draft); for tests and the TUI's status."""
        return list(self._target.tokens), self.family.cached_ids(self._draft)
