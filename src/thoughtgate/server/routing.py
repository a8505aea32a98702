"""The daemon's router: Starlette's, asking only the routes that can match a path of that depth.

Starlette's router asks every route, in order, whether it matches a request (a regular expression
per route): twenty-odd matches for ``POST /v1/tickets`` or a run's stream, ~25 µs of each request
on the bench machine. A route whose parameters cannot hold a ``/`` (every ``{name}`` of ours)
matches only paths with as many ``/`` as its template, so :class:`DepthRouter` asks, in the same
order, only those routes and the ones it cannot tell about (a ``Mount``, a ``{name:path}``
parameter). Whatever matches there is what Starlette would have chosen (the first full match,
else the first partial one: a 405); when nothing does, Starlette's own routing runs (its 404),
so no answer changes but one: the trailing-slash redirect (``/static`` to ``/static/``,
``/v1/runs/`` to ``/v1/runs``) is made here, its ``Location`` a path on this server. Starlette's
builds an absolute URL from the request's ``Host`` header, which the caller chooses: a forged one
(through a cache or proxy in front of the daemon) sent a browser to another site (ADR 0128).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from starlette._utils import get_route_path
from starlette.convertors import FloatConvertor, IntegerConvertor, StringConvertor, UUIDConvertor
from starlette.responses import RedirectResponse
from starlette.routing import BaseRoute, Match, Route, Router
from starlette.types import Receive, Scope, Send

from thoughtgate.server.responses import NOT_KEPT

__all__ = ["DepthRouter"]

_NO_SLASH = (StringConvertor, IntegerConvertor, FloatConvertor, UUIDConvertor)
"""Convertors whose pattern never matches a ``/``."""


def _depth(route: BaseRoute) -> int | None:
    """How many ``/`` every path this route matches has; ``None`` when that is not fixed."""
    if type(route) is not Route or not route.path.startswith("/"):
        return None
    if not all(type(c) in _NO_SLASH for c in route.param_convertors.values()):
        return None
    return route.path.count("/")


class DepthRouter(Router):
    """A :class:`~starlette.routing.Router` that skips the routes that cannot match the path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slash_redirects = self.redirect_slashes
        self.redirect_slashes = False  # made here (:meth:`_slash_redirect`), never from ``Host``
        self._indexed: tuple[BaseRoute, ...] = ()
        self._by_depth: dict[int, list[BaseRoute]] = {}
        self._any_depth: list[BaseRoute] = []
        self._index()

    def _candidates(self, path: str) -> list[BaseRoute]:
        """The routes that may match ``path``, in the routes' order."""
        if tuple(self.routes) != self._indexed:  # again if someone changed the routes
            self._index()
        return self._by_depth.get(path.count("/"), self._any_depth)

    def _index(self) -> None:
        depths = [_depth(route) for route in self.routes]
        self._by_depth = {
            depth: [r for r, d in zip(self.routes, depths, strict=True) if d in (depth, None)]
            for depth in {d for d in depths if d is not None}
        }
        self._any_depth = [r for r, d in zip(self.routes, depths, strict=True) if d is None]
        self._indexed = tuple(self.routes)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().app(scope, receive, send)
            return
        chosen: tuple[BaseRoute, Scope] | None = None
        for route in self._candidates(get_route_path(scope)):
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                chosen = route, child_scope
                break
            if match is Match.PARTIAL and chosen is None:
                chosen = route, child_scope  # a 405, unless a later route matches fully
        if chosen is None:  # no route: a redirect to the other slash, or Starlette's 404
            if not await self._slash_redirect(scope, receive, send):
                await super().app(scope, receive, send)
            return
        route, child_scope = chosen
        if "router" not in scope:
            scope["router"] = self
        scope["route"] = route
        scope.update(child_scope)
        await route.handle(scope, receive, send)

    async def _slash_redirect(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """Starlette's trailing-slash redirect (the path with its last ``/`` added or taken
        away, when a route matches that), with a relative ``Location``: that path and the request's
        query. Whether it answered."""
        path = get_route_path(scope)
        if not self._slash_redirects or path == "/":
            return False
        other = dict(scope)
        other["path"] = scope["path"].rstrip("/") if path.endswith("/") else scope["path"] + "/"
        if not any(route.matches(other)[0] is not Match.NONE for route in self.routes):
            return False
        location = quote(other["path"], safe="/:@!$&'()*+,;=~")
        if not location.startswith("/") or location.startswith(("//", "/\\")):
            return False  # a path another host could be read from: never a redirect
        query = scope.get("query_string", b"").decode("latin-1")
        response = RedirectResponse(location + (f"?{query}" if query else ""), headers=NOT_KEPT)
        await response(scope, receive, send)
        return True
