"""Run the app on uvicorn with an orderly SIGTERM/SIGINT/SIGHUP and connection limits.

Connections are guarded (``connections``): a request head within ``server.header_timeout_s``,
idle keep-alive connections closed after ``server.idle_timeout_s``, at most
``server.max_connections`` open (below the open-file limit), idle ones making room for new ones.

On the first signal the daemon stops taking runs, gives in-flight runs the grace period, closes the
rest with ``run.interrupted`` (so live readers see the end of every run), and only then lets
uvicorn stop listening and close the remaining connections. It then exits with status 0. A second
signal falls through to uvicorn's own handling (a second Ctrl+C forces the exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import FrameType
from typing import Any, Final, TypeVar

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from thoughtgate.listening import listen
from thoughtgate.server.connections import ConnectionLimits, connection_budget, guarded_protocol
from thoughtgate.server.gc_policy import daemon_gc
from thoughtgate.server.hosts import check_exposure
from thoughtgate.server.logs import QuietLifecycle, RedactTickets
from thoughtgate.server.manager import RunManager
from thoughtgate.server.sse import LiveStreams
from thoughtgate.server.state import ServerState

__all__ = ["DaemonServer", "daemon_runner", "serve_app"]

T = TypeVar("T")


def daemon_runner() -> Callable[[Coroutine[Any, Any, T]], T]:
    """How the daemon runs its event loop: ``uvloop.run`` where uvloop is installed (ADR 0004:
    its transports, timers and thread hand-offs cost a fraction of asyncio's pure-Python ones,
    and a daemon spends its time in them), else ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:  # not on this platform (Windows): the standard loop
        return asyncio.run
    return uvloop.run


log = logging.getLogger("thoughtgate.server")

TICK_S: Final = 1.0
"""How often the daemon's server loop wakes while nothing asks it to stop (uvicorn: 0.1 s)."""


class DaemonServer(uvicorn.Server):
    """``uvicorn.Server`` that drains the daemon's runs before it stops listening, and whose main
    loop wakes once a second instead of ten times (ADR 0057).

    uvicorn's loop sleeps 0.1 s between checks of ``should_exit`` and refreshes the ``Date``
    header every tenth check: ten wake-ups a second, about 2 ms of CPU a second for an idle
    daemon with nothing to do. Here the loop waits up to :data:`TICK_S` for an exit request (a
    signal wakes it at once, so shutdown is as prompt) and refreshes the header at every wake, so
    the header is as fresh as uvicorn keeps it (to the second)."""

    def __init__(
        self,
        config: uvicorn.Config,
        manager: RunManager,
        *,
        on_ready: Callable[[str, int], None] | None = None,
        streams: LiveStreams | None = None,
    ) -> None:
        super().__init__(config)
        self.manager = manager
        self.streams = streams
        self.on_ready = on_ready
        self._draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._exit_requested: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._exit_requested = asyncio.Event()
        counter = 0
        while not await self.on_tick(counter):
            # a multiple of ten: uvicorn refreshes the Date header on those ticks
            counter = (counter + 10) % 864000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):  # not wait_for: keeps a cancellation (3.11)
                    await self._exit_requested.wait()

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        """Set by uvicorn's signal handling, the drain, and whoever stops the server: the loop
        sees it at once, not at its next tick."""
        self._should_exit = value
        loop = getattr(self, "_loop", None)
        wake = getattr(self, "_exit_requested", None)
        if value and loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.on_ready is not None and self.servers and not self.should_exit:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self.on_ready(str(host), int(port))

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's (``SIGINT``, ``SIGTERM``), and ``SIGHUP`` alike (ADR 0172): a daemon started
        in a terminal that is then closed stops as ``SIGTERM`` stops it -- runs drained, exit 0 --
        instead of dying by the signal (129) with its runs left for the next process. A daemon
        started with ``SIGHUP`` ignored (``nohup``) keeps ignoring it. As uvicorn's, the handlers
        are restored afterwards and a signal not drained is raised again then."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = [signal.SIGINT, signal.SIGTERM]
        hup = getattr(signal, "SIGHUP", None)  # not on Windows
        if hup is not None and signal.getsignal(hup) is not signal.SIG_IGN:
            handled.append(hup)
        if (ctrl_break := getattr(signal, "SIGBREAK", None)) is not None:  # Windows, as uvicorn
            handled.append(ctrl_break)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)
        for captured in reversed(self._captured_signals):
            signal.raise_signal(captured)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self.should_exit or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        self._loop.call_soon_threadsafe(self._begin_drain, sig, frame)

    def _begin_drain(self, sig: int, frame: FrameType | None) -> None:
        assert self._loop is not None
        self._drain_task = self._loop.create_task(self._drain(sig, frame))

    async def _drain(self, sig: int, frame: FrameType | None) -> None:
        try:
            interrupted = await self.manager.shutdown()
            if interrupted:
                log.warning("interrupted %d in-flight run(s) on shutdown", len(interrupted))
            await asyncio.sleep(0.2)  # let live readers receive the terminal events
        except Exception:  # never block the exit
            log.exception("draining runs failed")
        finally:
            if self.streams is not None:  # live readers of runs not executed here end too
                self.streams.stop_all()
            super().handle_exit(sig, frame)
            # A drained shutdown is a clean exit: do not re-raise the signal afterwards.
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()


async def serve_app(
    app: Starlette,
    *,
    host: str,
    port: int,
    log_level: str = "info",
    on_ready: Callable[[str, int], None] | None = None,
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve until a signal, on the running loop. ``on_ready(host, port)`` runs once listening.
    ``sockets``: already bound to ``host`` and ``port`` (:func:`thoughtgate.listening.listen`,
    so that a port in use is told before anything starts), else bound here; closed when serving
    ends. Refuses (:class:`~thoughtgate.errors.ConfigError`) to serve on an address that is not
    loopback without ``server.allowed_hosts`` (:func:`~thoughtgate.server.hosts.check_exposure`)."""
    state = app.state.thoughtgate
    assert isinstance(state, ServerState)
    if sockets is None:  # bound here, so that what they are bound to is checked (ADR 0164)
        sockets = listen(host, port)
    try:
        check_exposure(sockets, state.server.allowed_hosts)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    max_connections, open_files = connection_budget(state.server.max_connections)
    if max_connections < state.server.max_connections:
        log.warning(
            "serving at most %d connections (server.max_connections is %d, but the open-file "
            "limit is %s)",
            max_connections,
            state.server.max_connections,
            open_files,
        )
    limits = ConnectionLimits(
        max_connections,
        state.server.header_timeout_s,
        state.server.body_timeout_s,
        state.server.max_header_bytes,
        frozenset(state.server.cors_origins),
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="on",
        http=guarded_protocol(AutoHTTPProtocol, limits),
        # no route takes a WebSocket: an upgrade is answered by the app as any request is, never
        # by a WebSocket library's own handshake refusal, which carries none of the daemon's
        # headers (ADR 0164)
        ws="none",
        timeout_keep_alive=state.server.idle_timeout_s,
        timeout_graceful_shutdown=int(max(5.0, state.manager.grace_s + 5.0)),
        proxy_headers=False,
        server_header=False,
    )
    # configures logging
    server = DaemonServer(config, state.manager, on_ready=on_ready, streams=state.streams)
    redact = RedactTickets()
    access = logging.getLogger("uvicorn.access")
    access.addFilter(redact)
    quiet = QuietLifecycle()
    lifecycle = logging.getLogger("uvicorn.error")  # (uvicorn's own lines, not only errors)
    if log_level.lower() != "debug":
        lifecycle.addFilter(quiet)
    try:
        with daemon_gc(state.server.gc_young_threshold):  # built up to here: frozen (ADR 0045)
            await server.serve(sockets)
    finally:
        lifecycle.removeFilter(quiet)
        access.removeFilter(redact)
        for sock in sockets or ():  # also when start-up failed before uvicorn's shutdown
            sock.close()
