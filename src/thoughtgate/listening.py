"""The listening sockets of ``thoughtgate serve`` and ``thoughtgate emulate``, bound first.

Left to uvicorn, a port already in use was found only after start-up had run (the daemon had
opened its store and made its bootstrap owner key, which was then never shown), and was told as
uvicorn's log line ``ERROR: OSError (EADDRINUSE)`` and exit status 3 -- or, for the emulator in
its thread, as a traceback five seconds later. :func:`listen` binds before anything else starts,
and a port in use, an address this machine does not have or a port it may not take is one line
in thoughtgate's words (:class:`ListenError`, exit status 1). The sockets are handed to uvicorn,
which listens on them."""

from __future__ import annotations

import errno
import socket

from thoughtgate.errors import ThoughtgateError

__all__ = ["ListenError", "host_port", "listen"]


class ListenError(ThoughtgateError):
    """The server cannot listen on the address and port it was given."""


_WHY = {
    errno.EADDRINUSE: "the port is already in use (another server holds it: stop it, or choose "
    "another port; 0 picks a free one)",
    errno.EADDRNOTAVAIL: "this machine has no such address",
    errno.EACCES: "permission denied (ports below 1024 need privileges; choose another port)",
}


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL writes it (an IPv6 address in brackets: ``[::1]:8765``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets bound to every address ``host`` names (all of this machine's for ``""``), on
    ``port`` (0: one free port for them all), not yet listening; a :class:`ListenError` saying
    why when one cannot be bound, with none left open."""
    where = host_port(host, port)
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a host name"
        raise ListenError(
            f"cannot listen on {where}: {host!r} is not an address ({reason})"
        ) from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(found):  # each address once
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # "::" would take IPv4 too, and collide with 0.0.0.0
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # one free port for every address of the host
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        reason = _WHY.get(exc.errno or 0) or exc.strerror or type(exc).__name__
        raise ListenError(f"cannot listen on {where}: {reason}") from None
    return sockets
