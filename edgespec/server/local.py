"""Who may talk to the server: a local model server must not be usable by the web pages its user
visits. A page's script can send a request to 127.0.0.1 (a "simple" request needs no CORS
preflight), and by DNS rebinding a page on its own name can reach the server as that name. So
every request is checked before anything else runs:

- `Host` must name this server: a loopback name (localhost, 127.0.0.0/8, ::1), the `--host` it
  listens on, or a name given with `--allow-host` (an IP literal too when it listens on every
  address: an address cannot be rebound). Else 421 Misdirected Request (RFC 9110 15.5.20: the
  request was meant for another authority), which is what a rebound page's request is.
- A request with an `Origin` (a browser sends one with every cross-origin request and every
  POST) is refused with 403 unless that origin was allowed with `--allow-origin`; a client that
  is not a browser sends none and is not concerned.
- A POST must say `Content-Type: application/json` (415 otherwise; app.py checks it): the types
  a page may send without a preflight (text/plain, forms) are refused before the body is read.

    app = LocalOnly(app, hosts=HostRule.of("127.0.0.1", ()), origins=())
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from edgespec.server import responses as R

LOOPBACK_NAMES = ("localhost",)
WILDCARDS = ("0.0.0.0", "::", "")  # --host values that listen on every address
JSON_TYPE = "application/json"


def host_name(header: str) -> str:
    """The name in a Host header, without its port, brackets or trailing dot, lower-cased.

    host_name("LocalHost:8080") -> "localhost";  host_name("[::1]:80") -> "::1"
    """
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


@dataclass(frozen=True)
class HostRule:
    """The Host names this server answers to (see the module docstring)."""

    names: frozenset[str]
    any_address: bool = False  # listening on every address: any IP literal names it
    anything: bool = False  # --allow-host '*'

    @classmethod
    def of(cls, listen_host: str, allowed: tuple[str, ...] = ()) -> HostRule:
        names = {host_name(n) for n in (*LOOPBACK_NAMES, listen_host, *allowed) if n != "*"}
        return cls(frozenset(names), listen_host in WILDCARDS, "*" in allowed)

    def allows(self, header: str | None) -> bool:
        """Whether a request with this Host header (None: it sent none, as HTTP/1.0 may) is
        meant for this server.

        HostRule.of("127.0.0.1").allows("localhost:8080") -> True
        HostRule.of("127.0.0.1").allows("evil.example") -> False
        """
        if header is None or self.anything:
            return True
        name = host_name(header)
        if name in self.names:
            return True
        address = _address(name)
        return address is not None and (address.is_loopback or self.any_address)


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header names JSON (its parameters, e.g. charset, aside).

    is_json("application/json; charset=utf-8") -> True;  is_json("text/plain") -> False
    """
    return (content_type or "").partition(";")[0].strip().lower() == JSON_TYPE


class LocalOnly:
    """421 for a Host that does not name this server, 403 for an Origin not allowed (`origins`:
    the --allow-origin values, '*' for any), on every route; the outermost layer."""

    def __init__(self, app: ASGIApp, hosts: HostRule, origins: tuple[str, ...] = ()):
        self.app, self.hosts, self.origins = app, hosts, origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                status, message, code = refusal
                body = R.error_json(message, code=code)
                await JSONResponse(body, status_code=status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        headers = [(k, v) for k, v in scope["headers"] if k in (b"host", b"origin")]
        hosts = [v.decode("latin-1") for k, v in headers if k == b"host"]
        origins = [v.decode("latin-1") for k, v in headers if k == b"origin"]
        if len(hosts) > 1 or not self.hosts.allows(hosts[0] if hosts else None):
            return (
                421,
                "this server does not answer to that Host name (edgespec serve --allow-host "
                "NAME lets it)",
                "misdirected_request",
            )
        if origins and not ("*" in self.origins or all(o in self.origins for o in origins)):
            return (
                403,
                "requests from web pages are refused unless their origin is allowed "
                "(edgespec serve --allow-origin ORIGIN)",
                "origin_not_allowed",
            )
        return None
