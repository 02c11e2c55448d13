"""Keeping web pages out: DNS rebinding (foreign `Host`) and cross-site writes (`Origin`).

Without FXTUNE_API_TOKEN the service trusts loopback clients, and a browser on the same machine
is a loopback client for any page it shows. Two checks close that door before routing:

- every request must name this service in `Host`: a loopback name or the bound address on the
  port it listens on, or a name in FXTUNE_ALLOWED_HOSTS. A page whose DNS name was rebound to
  127.0.0.1 still sends its own name, so it is refused (and its scripts read nothing);
- writes (any method but GET, HEAD, OPTIONS) must not come from another origin: a browser says
  so with `Origin` or `Sec-Fetch-Site: cross-site | same-site`. Clients that send neither
  (curl, httpx, workers) are not browsers and pass; the dashboard's own forms are same-origin.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def split_host(value: str, scheme: str) -> tuple[str, int | None]:
    """`name[:port]` or `[v6]:port` -> (lowercase name without brackets, port or the default)."""
    value = value.strip().lower()
    name, port = value, ""
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest.removeprefix(":")
    elif value.count(":") == 1:
        name, port = value.split(":")
    if not port:
        return name, DEFAULT_PORTS.get(scheme)
    return name, int(port) if port.isdigit() else None


def _same_address(a: str, b: str) -> bool:
    """Only literal IPs: the bound address is one, and a name proves nothing about itself."""
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


class BrowserGuard:
    """Pure ASGI middleware (cheap: it reads headers only) for the two checks above."""

    def __init__(self, app: ASGIApp, allowed_hosts: Iterable[str] = ()) -> None:
        self.app = app
        self.allowed = frozenset(h.lower() for h in allowed_hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = {k: v for k, v in scope["headers"] if k in _WANTED}
            detail = self._refusal(scope, headers)
            if detail is not None:
                await JSONResponse({"detail": detail}, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[bytes, bytes]) -> str | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if not self._host_ok(host, scope):
            return (
                f"Host {host!r} is not an address of this service (a DNS-rebinding page "
                "looks like this); add the name to FXTUNE_ALLOWED_HOSTS if it is yours"
            )
        if scope.get("method", "GET") in SAFE_METHODS:
            return None
        site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
        if site in ("cross-site", "same-site"):
            return f"cross-site write refused (Sec-Fetch-Site: {site}); use this service's own page"
        origin = headers.get(b"origin")
        if origin is not None:
            scheme = scope.get("scheme", "http")
            own = (scheme, *split_host(host, scheme))
            theirs = origin.decode("latin-1").lower()
            other_scheme, _, rest = theirs.partition("://")
            if (other_scheme, *split_host(rest, other_scheme)) != own:
                return f"cross-origin write refused (Origin {theirs!r} is not this service)"
        return None

    def _host_ok(self, host: str, scope: Scope) -> bool:
        if "*" in self.allowed:
            return True
        if not host:
            return False
        scheme = scope.get("scheme", "http")
        name, port = split_host(host, scheme)
        if name in self.allowed or f"{name}:{port}" in self.allowed:
            return True
        server = scope.get("server")
        if not server or server[1] is None:  # a unix socket: only local names make sense
            return name in LOOPBACK_NAMES
        bound, bound_port = server[0], server[1]
        if port != bound_port:
            return False
        return name in LOOPBACK_NAMES or _same_address(name, str(bound))


_WANTED = frozenset({b"host", b"origin", b"sec-fetch-site"})
