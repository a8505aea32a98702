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
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp

from thoughtgate.server.middleware import OVERHEAD_HEADER
from thoughtgate.server.responses import NOT_KEPT

__all__ = ["ALLOWED_HEADERS", "ALLOWED_METHODS", "EXPOSED_HEADERS", "ListedOrigins"]

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
        response.headers.update(NOT_KEPT)
        return response
