"""OpenAI response bodies (chat and text completions, their stream chunks, usage, errors).

Shapes follow the OpenAI API so the official client parses them unchanged; EdgeSpec's additions
are extra keys the client keeps (`usage.prefilled_tokens`, `usage.peak_memory_bytes`,
`usage.speculation`, a chunk choice's `provenance`). Plain dicts at this edge only: they are JSON on the wire.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from edgespec.events import Stats
from edgespec.server.stops import Segment


@dataclass(frozen=True)
class Usage:
    """Token counts and speculation figures of one request."""

    prompt_tokens: int
    completion_tokens: int  # tokens in the answer returned (cut at a stop string)
    cached_tokens: int  # prompt tokens whose KV came from the prefix cache
    stats: Stats  # the engine's summary (its `tokens` counts any generated past a stop string)
    method: str
    # The most memory MLX held at once in the server's process during the request's turns, in
    # bytes (server/batching.py): process-wide, so with requests batched theirs together
    peak_memory: int = 0

    @classmethod
    def of(cls, stats: Stats, completion_tokens: int, method: str) -> Usage:
        cached = stats.prompt_tokens - stats.prefilled_tokens
        return cls(stats.prompt_tokens, completion_tokens, cached, stats, method)


def usage_json(u: Usage) -> dict[str, Any]:
    """OpenAI's usage object plus `prefilled_tokens`, `peak_memory_bytes` and a `speculation`
    object."""
    s = u.stats
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "prefilled_tokens": s.prefilled_tokens,
        "peak_memory_bytes": u.peak_memory,
        "speculation": {
            "method": u.method,
            "generated_tokens": s.tokens,
            "rounds": s.rounds,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance": round(s.acceptance, 4),
            "tokens_per_round": round(s.tau, 4),
            "tokens_per_second": round(s.tokens_per_s, 2),
            "ttft_s": round(s.ttft, 4),
            "decode_s": round(s.decode_time, 4),
        },
    }


def new_id(kind: str) -> str:
    """'chatcmpl-…' for chat, 'cmpl-…' for text completions."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def provenance(segments: list[Segment]) -> list[dict[str, str]]:
    """[{"text": piece, "kind": accepted|corrected|bonus|target}] in order; texts join to the
    chunk's content."""
    return [{"text": s.text, "kind": s.kind} for s in segments]


def chat_response(
    rid: str, created: int, model: str, text: str, finish: str, usage: Usage
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
        ],
        "usage": usage_json(usage),
    }


def completion_response(
    rid: str, created: int, model: str, text: str, finish: str, usage: Usage
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": usage_json(usage),
    }


def chunk(
    kind: str,
    rid: str,
    created: int,
    model: str,
    *,
    segments: list[Segment] | None = None,
    finish: str | None = None,
    role: bool = False,
    usage: Usage | None = None,
    with_usage: bool = False,
) -> dict[str, Any]:
    """One stream chunk. Content chunks carry `provenance`; the usage chunk has no choices (as
    OpenAI's with stream_options.include_usage), and then every other chunk has usage null."""
    text = "".join(s.text for s in segments or [])
    if kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if segments:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice, obj = {"index": 0, "text": text, "logprobs": None}, "text_completion"
    choice["finish_reason"] = finish
    if segments:
        choice["provenance"] = provenance(segments)
    body: dict[str, Any] = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [] if usage is not None else [choice],
    }
    if usage is not None:
        body["usage"] = usage_json(usage)
    elif with_usage:
        body["usage"] = None
    return body


def error_json(
    message: str, kind: str = "invalid_request_error", param: str | None = None, code: Any = None
) -> dict[str, Any]:
    """{"error": {"message", "type", "param", "code"}}: what OpenAI returns with a 4xx / 5xx.
    The message and param may quote the request (a field's name): a lone surrogate there
    ("\\ud800", valid in JSON, not in UTF-8) is spelled as its escape, so the error can be sent."""
    param = None if param is None else encodable(param)
    return {"error": {"message": encodable(message), "type": kind, "param": param, "code": code}}


def encodable(text: str) -> str:
    """`text` with whatever UTF-8 cannot encode (lone surrogates) as backslash escapes.

    encodable("edgespec.\\ud800") -> "edgespec.\\\\ud800"
    """
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def models_json(model_id: str, created: int, description: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": model_id,
                "object": "model",
                "created": created,
                "owned_by": "edgespec",
                "description": description,
            }
        ],
    }
