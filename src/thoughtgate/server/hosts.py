"""Which ``Host`` a request may name: DNS rebinding (ADR 0159).

A page on ``evil.example`` can point its own name at ``127.0.0.1`` and call the daemon on a
developer's machine: the browser sends ``Host: evil.example:8765``, and treats every answer as
that page's own (same origin), so the page reads whatever answers without a key (the page, its
files, ``/healthz``, ``/readyz``, ``/openapi.json``) and can show the daemon's own sign-in form
under its name. Its answers need no key to be refused; a name is the only thing that tells.

A request that arrived at a loopback address is answered only when its ``Host`` is an IP
address (no name to rebind: a page's origin is then that address), ``localhost``, the configured
``server.host`` when it is a name, or a name in ``server.allowed_hosts``; any other is ``400``
(``host_not_allowed``), before any route runs. On other addresses every name is answered unless
``server.allowed_hosts`` lists some: then only those, IP addresses and ``localhost`` are.
``"*"`` answers every name everywhere. A request with no ``Host`` (HTTP/1.0) is no browser's.

A daemon that listens on an address other than loopback with no names listed would answer any
name there (its clients' names are not known to it), so a page that rebinds its name to that
address (a LAN address, say) reads what answers without a key: ``thoughtgate serve`` refuses to
start so (:func:`check_exposure`, ADR 0164) and says which setting to give.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence

from starlette.types import ASGIApp, Receive, Scope, Send

from thoughtgate.errors import ConfigError
from thoughtgate.server.errors import error_response

__all__ = ["HostCheckMiddleware", "check_exposure", "host_name"]

_LOOPBACK_NAMES = frozenset({"localhost"})


def host_name(header: str) -> str:
    """The name a ``Host`` header holds: lower case, without its port, brackets or final dot."""
    value = header.strip().lower()
    if value.startswith("["):  # "[::1]:8765"
        return value[1 : value.find("]")] if "]" in value else value[1:]
    name, _, _ = value.partition(":")
    return name.rstrip(".")


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _is_loopback(address: object) -> bool:
    try:
        return ipaddress.ip_address(str(address)).is_loopback
    except ValueError:
        return False


class HostCheckMiddleware:
    """Refuses (``400``) a request whose ``Host`` names a host the daemon does not answer for."""

    def __init__(self, app: ASGIApp, *, allowed: Iterable[str], bind_host: str = "") -> None:
        self.app = app
        names = {host_name(n) for n in allowed}
        self.any_name = "*" in names
        self.listed = bool(names)
        """Whether the operator named hosts: then other addresses answer only those too."""
        bind = host_name(bind_host)
        if bind and not _is_address(bind):
            names.add(bind)
        self.names = frozenset(names | _LOOPBACK_NAMES)
        self.seen: dict[tuple[object, bytes], bool] = {}
        """Whether each (local address, ``Host``) pair met is answered: a few hundred at most are
        kept, which spares a request the two address parses (each several times the rest of the
        check)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.any_name or self._answers(scope):
            await self.app(scope, receive, send)
            return
        await error_response(
            400,
            "this daemon does not answer for that Host name; a name it should answer for goes "
            "in server.allowed_hosts",
            code="host_not_allowed",
        )(scope, receive, send)

    def _answers(self, scope: Scope) -> bool:
        host = None
        for name, value in scope.get("headers", ()):
            if name == b"host":
                host = value
                break
        if host is None:
            return True
        server = scope.get("server")
        address = server[0] if server else None
        known = self.seen.get((address, host))
        if known is None:
            known = self._decide(address, host)
            if len(self.seen) < 256:
                self.seen[(address, host)] = known
        return known

    def _decide(self, address: object, host: bytes) -> bool:
        if not self.listed and not _is_loopback(address):
            return True  # another address, no names listed: any name
        name = host_name(host.decode("latin-1"))
        return name in self.names or _is_address(name)


def check_exposure(
    sockets: Sequence[socket.socket], allowed: Iterable[str], *, source: str = ""
) -> None:
    """Refuses (:class:`ConfigError`, naming ``server.allowed_hosts``) to serve on ``sockets``
    when one is bound to an address that is not loopback (``0.0.0.0``, ``::``, a LAN address)
    and ``allowed`` names no host: the daemon would answer any ``Host`` there, a rebound name's
    too (ADR 0164). Loopback needs no list: the middleware refuses every other name there."""
    if tuple(allowed):
        return
    exposed = [s.getsockname()[0] for s in sockets if not _is_loopback(s.getsockname()[0])]
    if not exposed:
        return
    where = ", ".join(dict.fromkeys(f"[{a}]" if ":" in a else a for a in exposed))
    raise ConfigError(
        "server.allowed_hosts",
        None,
        "host names",
        source=source,
        problem=(
            f"is empty, and the daemon would listen on {where}, which is not a loopback address: "
            "it would answer any Host name there, so a web page could point a name of its own at "
            "it and read what answers without a key (DNS rebinding). List the names its clients "
            'use (server.allowed_hosts = ["tg.example.com"], or '
            "THOUGHTGATE_SERVER__ALLOWED_HOSTS=tg.example.com), listen on 127.0.0.1, or set "
            '["*"] to answer every name (unsafe)'
        ),
    )
