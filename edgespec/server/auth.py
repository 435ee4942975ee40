"""The API key check of `edgespec serve --api-key`: `Authorization: Bearer KEY` on every route
but /health, the scheme's case ignored (RFC 7235: "bearer", "BEARER" are the same scheme).

A CORS preflight (OPTIONS) passes without a key: browsers never send credentials with one, and it
runs nothing (the CORS layer answers it, or the router refuses the method).
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from edgespec.server import responses as R

OPEN_PATHS = ("/health",)


def credentials(header: bytes) -> bytes | None:
    """The token of a Bearer Authorization header, whatever the scheme's case, else None.

    credentials(b"bearer sesame") -> b"sesame";  credentials(b"Basic c2VzYW1l") -> None
    """
    scheme, _, token = header.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return token.strip()


class ApiKeyMiddleware:
    """401 for requests without `Authorization: Bearer KEY` (/health and preflights stay open)."""

    def __init__(self, app: ASGIApp, key: str):
        self.app, self.expected = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._refused(scope):
            body = R.error_json(
                "missing or wrong API key: send 'Authorization: Bearer KEY'",
                code="invalid_api_key",
            )
            await JSONResponse(body, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refused(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["method"] == "OPTIONS":
            return False
        given = credentials(dict(scope["headers"]).get(b"authorization", b""))
        return given is None or not hmac.compare_digest(given, self.expected)
