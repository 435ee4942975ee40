"""Refusing a request: RequestError (an HTTP status, a one-line message, the offending field), and
the strict readers of a request's typed fields, whose messages quote the value they got (cut to
QUOTE_MAX characters: an error never echoes a huge value back). JSON's true and false are not
numbers here, though Python compares them equal to 1 and 0.

    integer({"n": True}, "n", 1)   -> RequestError(400, "n must be an integer, got True", param="n")
    number({"top_p": 0.5}, "top_p", 1.0)  -> 0.5
"""

from __future__ import annotations

import math
from typing import Any

from edgespec.errors import EdgeSpecError

QUOTE_MAX = 200  # characters of a request's value quoted back in an error message


def quoted(value: Any) -> str:
    """repr(value), cut to QUOTE_MAX characters: an error never echoes a huge value back.

    quoted("x" * 1000) -> "'xxx...x'..." (200 characters of the repr, then "...")
    """
    text = repr(value)
    return text if len(text) <= QUOTE_MAX else text[:QUOTE_MAX] + "..."


class RequestError(EdgeSpecError):
    """A request the server refuses: HTTP status, one-line message, the offending field."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = (
            message,
            status,
            param,
            code,
            kind,
        )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(body: dict[str, Any], name: str, default: Any, prefix: str = "") -> Any:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise RequestError(
            f"{prefix}{name} must be an integer, got {quoted(value)}", param=prefix + name
        )
    return value


def number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {quoted(value)}", param=name)
    return float(value)


def boolean(body: dict[str, Any], name: str, default: bool, prefix: str = "") -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(
            f"{prefix}{name} must be true or false, got {quoted(value)}", param=prefix + name
        )
    return value
