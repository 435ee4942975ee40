"""A scripted fake engine with the real `Engine`'s interface, for Pilot and snapshot tests and demos.

It imports nothing from Textual or MLX. Every number it reports comes from a simulated clock, so the
same prompt and settings always give the same tokens, kinds and stats (snapshots stay stable).

Script: the answer is a fixed cycle of words (one token each), or the pieces of a given `text`
(each run of blanks with the word after it, e.g. `MARKDOWN`); round i accepts
`accept_pattern[i % len]` of its K drafts, the round then commits those accepted tokens plus one
corrected token (a rejection) or one bonus token (all K accepted). With speculation off
(`spec.method == "none"`) every token is a plain `target` token, one per round.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from edgespec.config import GenerationConfig
from edgespec.errors import EdgeSpecError
from edgespec.events import Finished, Prefill, Round, Stats, Token

WORDS = (
    "Speculative decoding lets a small draft model propose tokens and the target model verify "
    "them all in one forward pass so the answer is exactly what the target alone would write "
    "only faster when the draft guesses well."
).split()

# A reasoning model's answer in Markdown: a <think> part, a heading, emphasis, inline code, a fenced
# code block, a list and a link (demos: `edgespec chat --fake markdown`; snapshot tests).
MARKDOWN = """<think>
The user wants a *small* example. Show a cached function, then say why it is fast.
</think>

## Fibonacci in Python

Here is a **fast** version with `functools.cache`:

```python
from functools import cache

@cache
def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)
```

Why it is fast:

1. each value is computed *once*
2. later calls are lookups
- see [the docs](https://docs.python.org/3/library/functools.html)
"""

# Simulated costs (seconds): drafting one token, one verify forward, one plain decode step,
# and prefill per prompt token. Chosen so speculation at K=4 looks ~1.9x faster than plain.
T_DRAFT, T_VERIFY, T_PLAIN, T_PREFILL = 0.002, 0.030, 0.025, 0.0004
PREFILL_CHUNK = 512  # prompt ids read per prefill step (edgespec.cache's)


@dataclass
class FakeScript:
    """What the fake says and how fast. `round_delay` is real sleep per round (0 = instant);
    `hold_after` blocks after that many rounds until cancelled or `release` is set (tests use it
    to stop mid-answer deterministically)."""

    answer_tokens: int = 40
    accept_pattern: Sequence[int] = (3, 1, 4, 0, 2, 4, 1)
    round_delay: float = 0.0
    hold_after: int | None = None
    load_steps: int = 3
    load_delay: float = 0.0
    load_error: EdgeSpecError | None = None
    chat_error: EdgeSpecError | None = None
    text: str | None = None  # say this (in pieces) instead of the cycle of words
    prefill_delay: float = 0.0  # real sleep per prefill chunk (PREFILL_CHUNK new prompt ids)
    # The chat template's thinking mode when not told (Engine.thinking_mode): None = it has none.
    thinking: bool | None = None

    def pieces(self) -> list[str] | None:
        """`text` cut into tokens: each run of blanks with the word after it.

        >>> FakeScript(text="a **b**\\n\\n- c").pieces()
        ['a', ' **b**', '\\n\\n-', ' c']
        """
        return None if self.text is None else re.findall(r"\s*\S+|\s+", self.text)


class FakeEngine:
    """Stand-in for `edgespec.runtime.Engine` (edgespec.worker.ServedEngine): `load`, `chat`,
    `generate`, `reset`, `warm_up`, `new_states` / `swap_states`, `name`, `has_draft`,
    `context_window`. Like the real engine it reuses a prompt prefix across turns, so a later turn
    reports fewer prefilled tokens and a lower TTFT; its "cache" is the prompt ids it last saw
    (a chat's are its characters), one set per conversation."""

    name = "fake-target + fake-draft"
    has_draft = True
    context_window = 4096

    def __init__(self, script: FakeScript | None = None) -> None:
        self.script = script or FakeScript()
        self.release = threading.Event()
        self.calls: list[tuple[list[dict[str, str]], GenerationConfig]] = []
        self.thinks: list[bool | None] = []  # each chat call's `think`, in order
        self.thinking: bool | None = None  # the engine's default mode (Engine.thinking)
        self.resets = 0
        self.warmed: list[GenerationConfig] = []  # warm_up's settings, in order
        self.threads: set[int] = {threading.get_ident()}  # threads that loaded or ran the engine
        self._cached: list[
            int
        ] = []  # "token ids" (chars) of the last conversation, for prefix reuse

    @classmethod
    def load(
        cls,
        script: FakeScript | None = None,
        on_progress: Callable[[str, float | None], None] | None = None,
    ) -> FakeEngine:
        """Report `load_steps` progress steps, then return an engine (or raise `load_error`)."""
        script = script or FakeScript()
        for i in range(script.load_steps):
            if on_progress:
                on_progress(
                    f"loading fake weights {i + 1}/{script.load_steps}", i / script.load_steps
                )
            time.sleep(script.load_delay)
        if script.load_error is not None:
            raise script.load_error
        if on_progress:
            on_progress("ready", 1.0)
        return cls(script)

    def thinking_mode(self, think: bool | None = None) -> bool | None:
        """As Engine.thinking_mode: None without a thinking mode, else the mode a chat with
        `think` renders."""
        if self.script.thinking is None:
            return None
        chosen = self.thinking if think is None else think
        return self.script.thinking if chosen is None else chosen

    def reset(self) -> None:
        """Forget the cached prefix (a new conversation)."""
        self._cached = []
        self.resets += 1

    def warm_up(self, config: GenerationConfig) -> None:
        """Record the settings (the fake has no kernels to compile)."""
        self.threads.add(threading.get_ident())
        self.warmed.append(config)

    def new_states(self, run: object = None, kind: object = None) -> tuple[list[int], None]:
        """An empty cache set for one more conversation (the fake's draft keeps no cache)."""
        return [], None

    def swap_states(self, target: list[int], draft: None) -> tuple[list[int], None]:
        """Hold `target` (from `new_states` or an earlier swap); return the set held until now."""
        held, self._cached = self._cached, target
        return held, draft

    def _prefill(
        self,
        ids: list[int],
        cancel: threading.Event | None = None,
        on_prefill: Callable[[Prefill], object] | None = None,
    ) -> tuple[int, int]:
        """Like KVState.prefill: the new ids in chunks of PREFILL_CHUNK, `on_prefill` after each,
        a set `cancel` stops before the next (the "cache" then holds what was read)."""
        common = 0
        for a, b in zip(ids, self._cached, strict=False):
            if a != b:
                break
            common += 1
        end = len(ids)
        for start in range(common, len(ids), PREFILL_CHUNK):
            if cancel is not None and cancel.is_set():
                end = start
                break
            time.sleep(self.script.prefill_delay)
            if on_prefill is not None:
                on_prefill(Prefill(min(start + PREFILL_CHUNK, end) - common, end - common))
        self._cached = ids[:end]
        return len(ids), len(ids) - common

    def chat(
        self,
        messages: list[dict[str, str]],
        config: GenerationConfig,
        cancel: threading.Event | None = None,
        on_prefill: Callable[[Prefill], object] | None = None,
        *,
        think: bool | None = None,
    ) -> Iterator[Token | Round | Finished]:
        """Yield the scripted tokens and rounds, then one `Finished` with simulated stats."""
        self.calls.append((list(messages), config))
        self.thinks.append(think)
        ids = [ord(c) for m in messages for c in f"<{m['role']}>{m['content']}"]
        start = sum(len(m["content"]) for m in messages)  # vary the words between turns
        yield from self._answer(ids, start, config, cancel, on_prefill)

    def generate(
        self,
        prompt_ids: list[int],
        config: GenerationConfig,
        cancel: threading.Event | None = None,
        *,
        gate: object = None,
    ) -> Iterator[Token | Round | Finished]:
        """`chat` for a prompt of token ids (any ints): the same script, from word len(ids); the
        fake has no round policy for a `gate` to wrap."""
        yield from self._answer(list(prompt_ids), len(prompt_ids), config, cancel)

    def _answer(
        self,
        ids: list[int],
        start: int,
        config: GenerationConfig,
        cancel: threading.Event | None,
        on_prefill: Callable[[Prefill], object] | None = None,
    ) -> Iterator[Token | Round | Finished]:
        self.threads.add(threading.get_ident())
        if self.script.chat_error is not None:
            raise self.script.chat_error
        prompt_tokens, prefilled = self._prefill(ids, cancel, on_prefill)
        spec = config.spec.enabled and self.has_draft
        k = config.spec.k
        pieces = self.script.pieces()
        length = self.script.answer_tokens if pieces is None else len(pieces)
        limit = min(length, config.max_tokens)
        texts: list[str] = []
        hist = [0] * (k + 1)
        drafted = accepted_total = rounds = 0
        decode = 0.0
        reason = "stop" if limit == length else "length"
        while len(texts) < limit:
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            hold = self.script.hold_after
            if hold is not None and rounds >= hold and not self.release.is_set():
                while not self.release.wait(0.01):
                    if cancel is not None and cancel.is_set():
                        break
                continue
            if spec:
                acc = min(self.script.accept_pattern[rounds % len(self.script.accept_pattern)], k)
                kinds = ["accepted"] * acc + ["bonus" if acc == k else "corrected"]
                t_draft, t_verify = T_DRAFT * k, T_VERIFY
                drafted += k
                accepted_total += acc
                hist[acc] += 1
            else:
                acc, kinds, t_draft, t_verify = 0, ["target"], 0.0, T_PLAIN
            kinds = kinds[: limit - len(texts)]
            for kind in kinds:
                word = WORDS[(start + len(texts)) % len(WORDS)]
                text = (word if not texts else " " + word) if pieces is None else pieces[len(texts)]
                texts.append(text)
                yield Token(id=len(texts), text=text, kind=kind, round=rounds)  # type: ignore[arg-type]
            yield Round(
                index=rounds,
                drafted=k if spec else 0,
                accepted=acc,
                k=k if spec else 0,
                t_draft=t_draft,
                t_verify=t_verify,
                method=config.spec.method if spec else "none",
                # --tree: a tree of 2K nodes, won by a second-ranked branch every third round
                nodes=2 * k if spec and config.spec.tree else 0,
                branch=int(spec and bool(config.spec.tree) and rounds % 3 == 1),
            )
            decode += t_draft + t_verify
            rounds += 1
            if self.script.round_delay:
                time.sleep(self.script.round_delay)
        tokens = len(texts)
        stats = Stats(
            tokens=tokens,
            rounds=rounds,
            drafted=drafted,
            accepted=accepted_total,
            acceptance=accepted_total / drafted if drafted else 0.0,
            tau=tokens / rounds if rounds else 0.0,
            ttft=0.010 + T_PREFILL * prefilled,
            decode_time=decode,
            tokens_per_s=tokens / decode if decode > 0 else 0.0,
            prompt_tokens=prompt_tokens,
            prefilled_tokens=prefilled,
            accepted_hist=tuple(hist) if spec else (),
        )
        yield Finished(reason=reason, stats=stats, text="".join(texts))  # type: ignore[arg-type]
