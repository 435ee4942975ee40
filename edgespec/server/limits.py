"""What one request may cost before it is refused: body size, time to send it, prompt length.

    limits = Limits(max_body_bytes=4 << 20, request_timeout_s=10.0)
    raw = await read_body(request, limits)    # 413 above the size, 408 when it stalls
    bound = TextBound.of(engine.tokenizer)    # once; None when no exact bound is known
    bound.fewest_tokens("abc" * 10**6)        # a floor on the count, without tokenizing

A prompt is refused before tokenizing only when it is certain not to fit the context window:
every token stands for at most `token_bytes` bytes of the (normalized) text, the most any
vocabulary entry spells, so a text of B bytes is at least ceil(B / token_bytes) tokens. For a
byte-level BPE an entry spells each byte it covers with one character of one or two UTF-8
bytes, for a SentencePiece-style vocabulary (Metaspace) with the text's own characters ("▁" for
a space); added and special tokens match their own text. Pre-tokenizers that drop characters
(WordPiece's whitespace splitting) break the floor, so for them there is no bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.requests import ClientDisconnect, Request

from edgespec.server.protocol import ParsedRequest, RequestError

DEFAULT_MAX_BODY_BYTES = 4 << 20  # 4 MiB: JSON of a 128k-token prompt with room to spare
DEFAULT_REQUEST_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 256
INCOMPLETE_BODY = "incomplete_body"  # the error code of a body cut off by its client
# Pre-tokenizers that drop part of the text (whitespace): no floor on the count for them.
DROPPING = ("Whitespace", "WhitespaceSplit", "BertPreTokenizer", "CharDelimiterSplit")


@dataclass(frozen=True)
class Limits:
    """`edgespec serve`'s --max-body-bytes, --request-timeout and --max-connections."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS


async def read_body(request: Request, limits: Limits) -> bytes:
    """The request body, or RequestError: 413 above `max_body_bytes` (from Content-Length when
    the client declares it, before reading a byte; else once that many arrived), 408 when it
    is not all there within `request_timeout_s` of the request's head, 400 when the client
    closed the connection before it was (nobody reads that answer: it only ends the request
    quietly, where starlette's ClientDisconnect would be a 500 with a traceback)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise _too_large(limits.max_body_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(limits.request_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise _too_large(limits.max_body_bytes)
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(
            f"the request body did not arrive within {limits.request_timeout_s:g} s",
            status=408,
            code="request_timeout",
        ) from None
    except ClientDisconnect:
        raise RequestError(
            "the connection closed before the request body arrived", code=INCOMPLETE_BODY
        ) from None
    return b"".join(chunks)


def _too_large(limit: int) -> RequestError:
    return RequestError(
        f"the request body is larger than this server's limit of {limit} bytes "
        "(edgespec serve --max-body-bytes)",
        status=413,
        code="request_too_large",
    )


@dataclass(frozen=True)
class TextBound:
    """A floor on the number of tokens a text becomes, computed without tokenizing it."""

    token_bytes: int  # the most UTF-8 bytes of normalized text one token stands for
    normalize: Callable[[str], str] | None = None  # the tokenizer's normalizer, if any

    @classmethod
    def of(cls, tokenizer: Any) -> TextBound | None:
        """The bound for a Hugging Face tokenizer (mlx-lm's wrapper or the tokenizer itself),
        or None when it has no vocabulary to read or its pre-tokenizer drops characters."""
        try:
            vocab = tokenizer.get_vocab()
        except Exception:  # noqa: BLE001 - no readable vocabulary: no bound, the server goes on
            return None
        longest = max((len(piece.encode("utf-8")) for piece in vocab), default=0)
        backend = _backend(tokenizer)
        if longest < 1 or backend is None or _drops_characters(backend):
            return None
        normalizer = backend.normalizer
        return cls(longest, normalizer.normalize_str if normalizer is not None else None)

    def fewest_tokens(self, text: str) -> int:
        """A floor on the number of tokens `text` becomes.

        TextBound(4).fewest_tokens("abcdefgh") -> 2
        """
        if self.normalize is not None:
            text = self.normalize(text)
        return -(-len(text.encode("utf-8", "surrogatepass")) // self.token_bytes)

    def exceeds(self, text: str, tokens: int) -> bool:
        """Whether `text` is certain to be more than `tokens` tokens. A text whose raw bytes
        could fit returns False at once, without normalizing (the tokenizer, exact, decides)."""
        if len(text.encode("utf-8", "surrogatepass")) <= tokens * self.token_bytes:
            return False
        return self.fewest_tokens(text) > tokens


def _backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` under a fast tokenizer (or mlx-lm's wrapper of one), or None."""
    for holder in (tokenizer, getattr(tokenizer, "_tokenizer", None)):
        backend = getattr(holder, "backend_tokenizer", None)
        if backend is not None:
            return backend
    return None


def _drops_characters(backend: Any) -> bool:
    """Whether the pre-tokenizer (or one in its sequence) drops part of the text."""
    shown = repr(backend.pre_tokenizer)
    return any(f"{kind}(" in shown for kind in DROPPING) or "behavior=Removed" in shown


def refuse_certain_overflow(
    engine: Any, parsed: ParsedRequest, bound: TextBound, param: str, most: int | None = None
) -> None:
    """RequestError when the prompt's text (the chat template's output for messages) is
    certain to be more tokens than the context window holds (or than `most`, the server's
    --max-prompt-tokens); the template is only rendered when the messages alone are that long."""
    room = engine.context_window - 1 if most is None else min(most, engine.context_window - 1)
    if parsed.messages is not None:
        if not bound.exceeds("".join(m["content"] for m in parsed.messages), room):
            return
        text = _rendered(engine, list(parsed.messages))
    elif isinstance(parsed.prompt, str):
        text = parsed.prompt
    else:
        return
    if bound.exceeds(text, room):
        raise RequestError(
            f"the prompt is at least {bound.fewest_tokens(text)} tokens but this server takes "
            f"at most {room} (the context window is {engine.context_window}: prompt + at least "
            "one answer token; edgespec serve --max-prompt-tokens); shorten it",
            param=param,
            code="context_length_exceeded",
        )


def _rendered(engine: Any, messages: list[dict[str, str]]) -> str:
    """The text engine.encode_chat tokenizes."""
    if not getattr(engine.tokenizer, "has_chat_template", False):
        return "\n".join(m["content"] for m in messages)
    text = engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    return str(text)
