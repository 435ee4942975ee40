"""The API key check of `edgespec serve --api-key`: `Authorization: Bearer KEY` on every route,
the scheme's case ignored (RFC 7235: "bearer", "BEARER" are the same scheme).

- A 401 says which scheme it wants (`WWW-Authenticate: Bearer`, RFC 6750 section 3).
- More than one Authorization header is a 400: which one counts is not clear (a proxy that
  checks the first, and a server that reads the last, would disagree), so neither does.
- GET /health without an Authorization header answers liveness only (`{"status": "ok"}`), so a
  supervisor can probe the server without the key; with the key it shows every figure (model,
  counts, cache, connections), with a wrong one it is a 401 like any other route.
- A CORS preflight (OPTIONS) passes without a key: browsers never send credentials with one,
  and it runs nothing (the CORS layer answers it, or the router refuses the method).
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from edgespec.server import responses as R

HEALTH = "/health"
AUTHORIZED = "edgespec_authorized"  # scope["state"] key: the request carried the key


def credentials(header: bytes) -> bytes | None:
    """The token of a Bearer Authorization header, whatever the scheme's case, else None.

    credentials(b"bearer sesame") -> b"sesame";  credentials(b"Basic c2VzYW1l") -> None
    """
    scheme, _, token = header.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return token.strip()


def authorized(scope: Scope) -> bool:
    """Whether this request may see everything (no key is set, or it carried the key)."""
    return bool(scope.get("state", {}).get(AUTHORIZED, True))


class ApiKeyMiddleware:
    """401 for requests without `Authorization: Bearer KEY`, 400 for several Authorization
    headers; /health without one and preflights pass (see the module docstring)."""

    def __init__(self, app: ASGIApp, key: str):
        self.app, self.expected = app, key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        given = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(given) > 1:
            body = R.error_json(
                "send one Authorization header, not several", code="duplicate_authorization"
            )
            await JSONResponse(body, status_code=400)(scope, receive, send)
            return
        if not given and scope["path"] == HEALTH:
            scope.setdefault("state", {})[AUTHORIZED] = False  # liveness only
        elif not self._matches(given[0] if given else b""):
            body = R.error_json(
                "missing or wrong API key: send 'Authorization: Bearer KEY'",
                code="invalid_api_key",
            )
            headers = {"WWW-Authenticate": "Bearer"}
            await JSONResponse(body, status_code=401, headers=headers)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _matches(self, header: bytes) -> bool:
        token = credentials(header)
        return token is not None and hmac.compare_digest(token, self.expected)
