"""CORS for browser clients on origins the operator lists (``server.cors_origins``, ADR 0164).

Off by default, and then not in the middleware stack at all: no answer names an origin, no
preflight is answered (``OPTIONS`` is ``405``), and a request pays nothing for it (ADR 0159
tested that state sound). A browser AG-UI client, or any page, on another origin reads the API
only when its origin is listed, spelled as the browser sends ``Origin``:

* the origin is matched exactly, never reflected unless listed, never ``*`` (the setting refuses
  a wildcard and ``null``); ``Vary: Origin`` on every answer to a request that named one, so no
  cache hands one origin's answer to another;
* no credentials: the daemon sets no cookie and reads a key only from ``Authorization``, which
  the client's script sets itself, so ``Access-Control-Allow-Credentials`` is never sent;
* a preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is answered with the API's
  methods and the headers a client sends (``Authorization``, ``Content-Type``, ``Last-Event-ID``
  to resume a stream), with ``nosniff`` and ``no-store`` as every answer (ADR 0159); one from
  an unlisted origin is ``400`` and allows nothing;
* the headers a client reads are exposed: ``Location`` (the run a follow stream started),
  ``Retry-After`` (a quota, a full connection table), ``WWW-Authenticate`` and the overhead
  header.

Starlette's ``CORSMiddleware`` does the work; it wraps ``send`` only, so a live stream's body,
written straight to the socket (``server.sse``), costs no more with it: only its head passes.

Every error the daemon sends is readable by a listed origin's script (ADR 0170): the daemon's
``500`` for an unexpected failure is written here, inside the middleware, rather than by
Starlette's ``ServerErrorMiddleware``, which sits outside every middleware and so named no
origin (a browser showed its script a network error); the connection's own answers (``400``,
``408``, ``431``: ``server.connections``) name a listed origin the request's head sent
(:func:`allow_lines`). A refused preflight is the daemon's JSON ``400`` with ``nosniff`` and
``no-store``, naming what was refused (origin, method, headers), never an allowed origin.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from thoughtgate.server.errors import error_response, unexpected_failure
from thoughtgate.server.middleware import OVERHEAD_HEADER
from thoughtgate.server.responses import NOT_KEPT

__all__ = [
    "ALLOWED_HEADERS",
    "ALLOWED_METHODS",
    "EXPOSED_HEADERS",
    "ListedOrigins",
    "allow_lines",
]

ALLOWED_METHODS = ("GET", "HEAD", "POST", "DELETE")
"""Every method a route of the API takes (``HEAD`` with each ``GET``)."""
ALLOWED_HEADERS = ("Authorization", "Content-Type", "Last-Event-ID")
"""What a client sends besides the headers every browser may send (``Accept``, ...)."""
EXPOSED_HEADERS = ("Location", "Retry-After", "WWW-Authenticate", OVERHEAD_HEADER)


class ListedOrigins(CORSMiddleware):
    """Starlette's ``CORSMiddleware`` for the listed origins only, its preflight answers with
    the headers of every other answer."""

    def __init__(self, app: ASGIApp, *, origins: Iterable[str]) -> None:
        listed = frozenset(origins)
        if not listed or "*" in listed or "null" in listed:  # the setting refuses these too
            raise ValueError("CORS takes listed origins only: no wildcard, no null")
        super().__init__(
            app,
            allow_origins=listed,
            allow_methods=ALLOWED_METHODS,
            allow_headers=ALLOWED_HEADERS,
            allow_credentials=False,
            expose_headers=EXPOSED_HEADERS,
            # a listed origin is trusted: a page of it calling a daemon on this machine passes
            # Chromium's private-network preflight too (an unlisted one is refused anyway)
            allow_private_network=True,
            max_age=600,
        )

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 200:  # Starlette's "Disallowed CORS origin, method" text
            refused = bytes(response.body).decode("latin-1").removeprefix("Disallowed CORS ")
            response = error_response(
                400,
                f"this cross-origin request is not allowed (its {refused}): the daemon answers "
                "browser scripts on the origins its operator listed (server.cors_origins), "
                "with the methods and headers its API takes",
                headers={"Vary": "Origin"},
            )
        response.headers.update(NOT_KEPT)
        return response

    async def simple_response(
        self, scope: Scope, receive: Receive, send: Send, request_headers: Headers
    ) -> None:
        """Starlette's, with the daemon's ``500`` written here when the app fails before it
        answered: ``ServerErrorMiddleware`` writes it outside this middleware, where the
        origin would not be named. Logged once, as that handler does; re-raised as after it
        (the server logs the traceback and closes the connection)."""
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await super().simple_response(scope, receive, watched, request_headers)
        except Exception as exc:
            if started:
                raise
            answer = await unexpected_failure(Request(scope), exc)
            await answer(
                scope,
                receive,
                functools.partial(self.send, send=send, request_headers=request_headers),
            )
            raise


def allow_lines(origins: frozenset[str], headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The CORS header lines of an answer the connection writes itself (``server.connections``)
    to a request whose head sent ``headers`` (as much of it as was read): the listed origin it
    named, with what a script may read, and ``Vary: Origin``; nothing for an unlisted one, or
    when none is listed (CORS off)."""
    if not origins:
        return b""
    sent = next((value for name, value in headers if name.lower() == b"origin"), None)
    if sent is None:
        return b""
    origin = sent.decode("latin-1").strip()
    if origin not in origins:
        return b"vary: Origin\r\n"
    exposed = ", ".join(EXPOSED_HEADERS)
    return (
        f"access-control-allow-origin: {origin}\r\naccess-control-expose-headers: {exposed}\r\n"
        "vary: Origin\r\n"
    ).encode("latin-1")
