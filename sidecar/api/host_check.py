"""An ASGI middleware that answers only requests whose Host header names this sidecar.

A page on any web site can make a browser on this host resolve its own name to 127.0.0.1 (DNS rebinding) and then
read the sidecar's answers as same-origin: every GET needs no token. The Host header still carries that site's
name, so a request naming a host the sidecar does not answer to is refused (400) before any route runs.

Which names: `sidecar.allowed_hosts` when set ("*" in it: any); otherwise the bound address itself, plus
`localhost`, `127.0.0.1` and `::1` when that is a loopback address. A sidecar bound to every interface (0.0.0.0,
::, a pod) is reached under names it cannot know (a Service, a pod IP), so there every Host is answered unless
the list says which.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
ANY = "*"


def allowed_hosts(bound: str, configured: Iterable[str]) -> frozenset[str] | None:
    """The host names to answer to (lower case, IPv6 without brackets); None: any."""
    names = {_bare(name) for name in configured}
    if names:
        return None if ANY in names else frozenset(names)
    host = _bare(bound)
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return frozenset({host})  # a name to bind: that name
    if address.is_unspecified:
        return None
    return frozenset({host, *LOOPBACK_NAMES}) if address.is_loopback else frozenset({host})


def host_of(header: str) -> str:
    """The host of a Host header value: "[::1]:9400" -> "::1", "Example.org:80" -> "example.org"."""
    header = header.strip()
    if header.startswith("["):
        return _bare(header[1:header.find("]")] if "]" in header else header)
    return _bare(header.rsplit(":", 1)[0] if header.count(":") == 1 else header)


def _bare(name: str) -> str:
    return name.strip().strip("[]").rstrip(".").lower()


class HostCheck:
    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.allowed is not None and scope["type"] == "http":
            header = dict(scope.get("headers") or ()).get(b"host")
            host = host_of(header.decode("latin-1")) if header is not None else None
            if host is not None and host not in self.allowed:
                body = json.dumps({"detail": "this sidecar does not answer to the Host header's name (sidecar."
                                             "allowed_hosts lists the names it answers to)"}).encode()
                await send({"type": "http.response.start", "status": 400,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
