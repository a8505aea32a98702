"""The daemon's ASGI application: ``create_app(runtime_or_store, config)``.

>>> app = create_app(MemoryStore(), Config())          # or create_app(Runtime(store, config))
>>> uvicorn.run(app)                                    # ``thoughtgate serve`` does this for you

Startup (lifespan) prepares the ticket secret, starts the durable engine when the runtime has
one (``orchestration.durable``: this daemon then takes runs from its work queue), and resumes or
closes runs a crashed process left running, then keeps doing so periodically (ADR 0009, 0010);
shutdown gives in-flight runs ``shutdown_grace_s`` to finish, leaves durable ones to resume
elsewhere, interrupts the rest, and closes the provider connections the runs shared. The app does
not own the store: whoever opened it closes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import NotModifiedResponse, StaticFiles
from starlette.types import Lifespan, Receive, Scope, Send

from thoughtgate.config import Config
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.orchestration.recorder import EventSink
from thoughtgate.orchestration.runtime import ProviderFactory, Runtime
from thoughtgate.providers.clients import shared_clients
from thoughtgate.server.access_watch import AccessWatch
from thoughtgate.server.api import starlette_route
from thoughtgate.server.cors import ListedOrigins
from thoughtgate.server.errors import exception_handlers
from thoughtgate.server.fanout import RunFeeds
from thoughtgate.server.hosts import HostCheckMiddleware
from thoughtgate.server.manager import RunManager
from thoughtgate.server.middleware import BodyLimitMiddleware, OverheadHeaderMiddleware
from thoughtgate.server.openapi import build_openapi
from thoughtgate.server.routes import all_endpoints
from thoughtgate.server.routes.meta import package_version
from thoughtgate.server.routing import DepthRouter
from thoughtgate.server.sse import SERVER_SEND, LiveStreams
from thoughtgate.server.state import ServerState
from thoughtgate.store.base import EventStore

__all__ = ["PAGE_POLICY", "create_app"]

log = logging.getLogger("thoughtgate.server")

STATIC_DIR = Path(__file__).with_name("static")
PAGE_POLICY = "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
"""The page's content security policy: it needs no inline script or style (ADR 0159)."""
_PAGE_HEADERS = {
    # base-uri and form-action are not covered by default-src: no <base> may move the page's
    # scripts elsewhere, and no form may post anywhere (the page's forms are handled by its
    # scripts, ADR 0159)
    "Content-Security-Policy": PAGE_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # asked again each time (a 304 while unchanged): an upgraded daemon's page never runs
    # with scripts a browser kept from the one before
    "Cache-Control": "no-cache",
}


class _App(Starlette):
    """Starlette that keeps the server's own ``send`` in the scope before its middlewares wrap
    it: a live stream writes to its socket through it without awaiting (``server.sse``,
    ADR 0022); its router asks only the routes that can match the path (``server.routing``)."""

    def __init__(
        self, *, routes: Sequence[BaseRoute], lifespan: Lifespan[Starlette], **options: Any
    ) -> None:
        super().__init__(routes=routes, lifespan=lifespan, **options)
        self.router = DepthRouter(routes, lifespan=lifespan)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[SERVER_SEND] = send
        try:
            await super().__call__(scope, receive, send)
        finally:
            # uvicorn's ``send`` is a method of the request's cycle, which holds this scope: left
            # here, every request's cycle, scope, headers and request objects would be garbage
            # only the cyclic collector frees (ADR 0138).
            scope.pop(SERVER_SEND, None)


class _PageFiles(StaticFiles):
    """The page's files, each with the page's headers: ``/static/index.html`` is the page too,
    and must be no more frameable, nor its scripts less confined, than ``/``.

    They say ``no-cache`` (ADR 0159): a browser asks again at every load, and is answered
    ``304`` with no body while its copy's ``ETag`` (``If-None-Match``) is still the file's, so a
    reload costs a few hundred bytes (ADR 0164). The tag is a digest of the file's bytes, not
    Starlette's of its time and size: an upgrade that changes a script changes its tag even when
    the installer kept the files' times (a wheel's fixed ones) and the size did not change."""

    def __init__(self, *, directory: Path) -> None:
        super().__init__(directory=directory)
        self._tags: dict[tuple[str, int, int, int, int], str] = {}

    def file_response(
        self,
        full_path: PathLike[str] | str,
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response: Response = FileResponse(
            full_path, status_code=status_code, stat_result=stat_result, headers=_PAGE_HEADERS
        )
        response.headers["etag"] = self._tag(full_path, stat_result)
        if self.is_not_modified(response.headers, Headers(scope=scope)):
            response = NotModifiedResponse(response.headers)  # keeps the tag and no-cache
            response.headers.update(_PAGE_HEADERS)
        return response

    def _tag(self, full_path: PathLike[str] | str, stat_result: os.stat_result) -> str:
        """The file's ``ETag``: read once per version of the file (its inode, size, and the times
        of its last write and of its inode's last change, which no one can set back)."""
        key = (
            os.fspath(full_path),
            stat_result.st_ino,
            stat_result.st_size,
            stat_result.st_mtime_ns,
            stat_result.st_ctime_ns,
        )
        tag = self._tags.get(key)
        if tag is None:
            digest = hashlib.sha256(Path(full_path).read_bytes()).hexdigest()[:32]
            tag = self._tags[key] = f'"{digest}"'
        return tag


def _page_routes() -> list[BaseRoute]:
    """The web page (``/``, ``/static``); it reads everything through the API like any client."""
    if not (STATIC_DIR / "index.html").is_file():
        return []
    files = _PageFiles(directory=STATIC_DIR)

    async def index(request: Request) -> Response:
        return await files.get_response("index.html", request.scope)  # a 304 as the files'

    return [
        Route("/", index, methods=["GET"], include_in_schema=False),
        Mount("/static", app=files, name="static"),
    ]


def _cors(origins: Sequence[str]) -> list[Middleware]:
    """CORS for the listed origins (``server.cors_origins``), none when none is listed."""
    return [Middleware(ListedOrigins, origins=origins)] if origins else []


def _warm_providers() -> None:
    """Import every provider adapter and build the TLS context before serving.

    Both happen on first use (a CLI command pays only for the provider it runs); in a daemon
    that first use was a run's provider request, on the event loop every other run shares:
    ~15 ms of imports and ~50 ms of TLS context stalled every stream under way once per
    provider after each start."""
    from thoughtgate.providers.base import PROVIDER_MODULES
    from thoughtgate.providers.clients import build_tls_context

    for target in PROVIDER_MODULES.values():
        importlib.import_module(target.partition(":")[0])
    build_tls_context()


def create_app(
    runtime_or_store: Runtime | EventStore,
    config: Config | None = None,
    *,
    provider_factory: ProviderFactory | None = None,
    tools: ToolRegistry | None = None,
    approvals: ApprovalBroker | None = None,
    sinks: Sequence[EventSink] = (),
    shutdown_grace_s: float = 3.0,
    recover_on_start: bool = True,
    sse_queue_size: int = 256,
    sse_lag_timeout_s: float = 10.0,
    sse_send_timeout_s: float = 30.0,
    access_check_s: float = 1.0,
) -> Starlette:
    """Build the HTTP API over a runtime (or over a store, with a runtime built from ``config``).

    ``provider_factory``, ``tools``, ``approvals`` and ``sinks`` only apply when a store is given;
    a given runtime brings its own. ``config`` defaults to the runtime's (or the built-in one).
    ``access_check_s``: how often open live streams re-check their key (revoked or demoted keys
    end their streams within about that long).
    """
    if isinstance(runtime_or_store, Runtime):
        runtime = runtime_or_store
        config = config or runtime.config
    else:
        config = config or Config()
        runtime = Runtime(
            runtime_or_store,
            config,
            provider_factory=provider_factory,
            tools=tools,
            approvals=approvals,
            sinks=sinks,
        )
    manager = RunManager(runtime, grace_s=shutdown_grace_s)
    state = ServerState(
        runtime,
        manager,
        config.server,
        sse_queue_size=sse_queue_size,
        sse_lag_timeout_s=sse_lag_timeout_s,
        sse_send_timeout_s=sse_send_timeout_s,
        feeds=RunFeeds(runtime.store),
        access=AccessWatch(runtime.store, interval_s=access_check_s),
        streams=LiveStreams(
            tick_s=min(1.0, config.server.keepalive_s / 2, sse_send_timeout_s / 4),
            refusal=runtime.store.write_refusal,
        ),
    )
    endpoints = all_endpoints()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The visible-reasoning pipeline is imported on first use (a CLI command that runs
        # nothing should not pay for it); a daemon imports it now, or its first run waits for
        # ~50-70 ms of imports on the event loop every other run shares.
        importlib.import_module("thoughtgate.events.pipeline")
        _warm_providers()
        await state.signer()
        engine = runtime.durable
        if engine is not None:  # a launch that fails leaves nothing launched (ADR 0125)
            await engine.launch(listen=[t.name for t in runtime.tools])
        try:
            if recover_on_start:
                recovered = await manager.recover()
                if recovered:
                    log.warning("marked %d run(s) left running as interrupted", len(recovered))
                manager.start_sweeping()
        except BaseException:
            # A start-up that fails after the launch closes what it launched: the process can
            # launch durable runs again (an application serving this app, a test).
            await manager.shutdown(0)
            if engine is not None:
                await engine.close()
            raise
        # Provider clients are shared by every run of this process and closed after the last one.
        async with shared_clients().lease():
            try:
                yield
            finally:
                await manager.shutdown()
                state.streams.stop_all()
                if engine is not None:
                    await engine.close()
                if state.feeds is not None:
                    await state.feeds.close()
                if state.access is not None:
                    await state.access.close()

    app = _App(
        routes=[*(starlette_route(e) for e in endpoints), *_page_routes()],
        middleware=[
            Middleware(
                HostCheckMiddleware,
                allowed=config.server.allowed_hosts,
                bind_host=config.server.host,
            ),
            # only when origins are listed: without, no request pays for it (ADR 0164)
            *_cors(config.server.cors_origins),
            Middleware(OverheadHeaderMiddleware),
            Middleware(
                BodyLimitMiddleware,
                max_body_bytes=config.server.max_body_bytes,
                keys=runtime.store,
            ),
        ],
        exception_handlers=exception_handlers(),
        lifespan=lifespan,
    )
    app.state.thoughtgate = state
    app.state.openapi = build_openapi(endpoints, version=package_version())
    return app
