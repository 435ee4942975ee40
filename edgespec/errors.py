"""Typed errors. Every message is one line a user can act on; the CLI prints it and exits 2."""

from __future__ import annotations


class EdgeSpecError(Exception):
    """Base class: a user-facing, one-line error (no traceback is ever shown for these)."""


class ConfigError(EdgeSpecError, ValueError):
    """Bad settings: K < 1, temperature < 0, top-p outside (0, 1], ..."""


class ModelNotFoundError(EdgeSpecError):
    """A model path / repo id / pair name that cannot be resolved."""


class ModelLoadError(EdgeSpecError):
    """Weights or config that exist but cannot be read (corrupt, truncated, unsupported)."""


class TokenizerMismatchError(EdgeSpecError):
    """Target and draft do not share a tokenizer; speculative decoding would be meaningless."""


class CacheNotTrimmableError(EdgeSpecError):
    """A model whose KV cache cannot be rewound, so rejected draft tokens cannot be undone."""


class PromptError(EdgeSpecError):
    """Empty prompt, or a prompt longer than the model's context window."""


class ContextLengthError(PromptError):
    """A prompt that leaves no room in the context window for one answer token."""


def check_context(prompt_tokens: int, window: int, model: str | None = None) -> None:
    """ContextLengthError unless a prompt of `prompt_tokens` leaves room for at least one answer
    token in a context window of `window` (the one check of the Engine and the server).

    >>> check_context(511, 512)
    >>> check_context(512, 512, "tiny")
    Traceback (most recent call last):
    edgespec.errors.ContextLengthError: the prompt is 512 tokens but the context window of tiny is 512 (prompt + at least one answer token); shorten it
    """
    if prompt_tokens + 1 > window:
        of = f" of {model}" if model else ""
        raise ContextLengthError(
            f"the prompt is {prompt_tokens} tokens but the context window{of} is {window} "
            "(prompt + at least one answer token); shorten it"
        )


class DownloadError(EdgeSpecError):
    """Fetching a model failed (no network, bad checksum, disk full, interrupted)."""


class TreeUnsupportedError(ConfigError):
    """Tree drafting asked of a model or cache the tree forward cannot run (not llama-style)."""


class GroupError(EdgeSpecError):
    """A sharded run (edgespec.distributed) whose ranks cannot go on together: a rank was lost,
    the ranks disagree on what was committed, or the group cannot shard the model."""


def one_line(exc: BaseException, *, typed: bool = False, limit: int = 300) -> str:
    """An exception as one short line: the first line of its message, else its type's name;
    `typed` puts the type's name in front. At most `limit` characters.

    >>> one_line(RuntimeError("\\n[metal::malloc] cannot allocate\\nsecond line"))
    '[metal::malloc] cannot allocate'
    >>> one_line(ValueError("a\\nb"), typed=True), one_line(KeyError(), typed=True)
    ('ValueError: a', 'KeyError')
    """
    text = str(exc).strip()
    line = text.splitlines()[0].strip() if text else ""
    name = type(exc).__name__
    if typed and line:
        line = f"{name}: {line}"
    return (line or name)[:limit]
