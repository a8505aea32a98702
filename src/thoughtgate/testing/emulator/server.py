"""The emulator's HTTP server: routes per wire format, scenario selection, request log.

Routes (base URLs as the official SDKs expect them):

* ``POST /v1/messages``          Anthropic Messages (base URL = host root)
* ``POST /v1/chat/completions``  OpenRouter and OpenAI-compatible chat (base URL ends in ``/v1``)
* ``POST /v1/responses``         OpenAI Responses

The scenario is chosen by the ``x-emulator-scenario`` header, else by the request's model name when
a scenario has that name, else the default scenario. A header naming no known scenario is a 400
that lists the known ones (in the format's own error shape), never a silent fallback.
``EmulatorServer.connections`` counts the TCP connections accepted and open (keep-alive reuse is
visible there).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from thoughtgate.listening import host_port, listen
from thoughtgate.testing.emulator.scenario import Scenario

__all__ = ["ConnectionCount", "Emulator", "EmulatorServer", "RecordedRequest", "serve_emulator"]


@dataclass(slots=True)
class RecordedRequest:
    """A request the emulator received, kept for tests to assert on the exact body sent."""

    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0


@dataclass
class Emulator:
    """Scenarios plus the log of received requests; ``app`` is the Starlette application."""

    scenarios: dict[str, Scenario] = field(default_factory=dict)
    default: str | None = None
    requests: list[RecordedRequest] = field(default_factory=list)
    attempts: dict[tuple[str, int], int] = field(default_factory=dict)

    def add(self, scenario: Scenario, *, default: bool = False) -> Emulator:
        self.scenarios[scenario.name] = scenario
        if default or self.default is None:
            self.default = scenario.name
        return self

    def known(self) -> list[str]:
        """Every scenario name a request may ask for: this emulator's and the built-in ones."""
        from thoughtgate.testing.emulator.scenarios import builtin_scenarios

        return sorted({*self.scenarios, *builtin_scenarios()})

    def pick(self, headers: Mapping[str, str], model: str | None) -> Scenario:
        name = headers.get("x-emulator-scenario") or (
            model if model in self.scenarios else self.default
        )
        if name is None or name not in self.scenarios:
            from thoughtgate.testing.emulator.scenarios import builtin_scenarios

            builtins = builtin_scenarios()
            return builtins.get(name or "", builtins["think-and-answer"])
        return self.scenarios[name]

    def attempt(self, scenario: str, turn: int) -> int:
        """Count attempts at one turn of one scenario (for ``Fail(times=...)``)."""
        key = (scenario, turn)
        self.attempts[key] = self.attempts.get(key, 0) + 1
        return self.attempts[key]

    def bodies(self, path_suffix: str = "") -> list[Any]:
        return [r.body for r in self.requests if r.path.endswith(path_suffix)]

    @property
    def app(self) -> Starlette:
        return _build_app(self)


_FORMATS = {
    "/messages": "anthropic_format",
    "/chat/completions": "chat_format",
    "/responses": "responses_format",
}
"""Path suffix -> the format module whose ``async handle(request, emulator)`` answers it."""


def _build_app(emulator: Emulator) -> Starlette:
    async def dispatch(request: Request) -> Response:
        path = request.url.path
        name = next((m for suffix, m in _FORMATS.items() if path.endswith(suffix)), None)
        if name is None:
            return JSONResponse({"error": {"message": f"no route {path}"}}, status_code=404)
        asked = request.headers.get("x-emulator-scenario")
        if asked is not None and asked not in emulator.known():
            message = f"unknown x-emulator-scenario {asked!r}; known scenarios: " + ", ".join(
                emulator.known()
            )
            return _bad_request(name, message)
        module = importlib.import_module(f"thoughtgate.testing.emulator.{name}")
        handle: Callable[[Request, Emulator], Awaitable[Response]] = module.handle
        return await handle(request, emulator)

    async def health(_: Request) -> Response:
        return JSONResponse({"ok": True, "scenarios": sorted(emulator.scenarios)})

    return Starlette(
        routes=[
            Route("/healthz", health),
            Route("/{path:path}", dispatch, methods=["POST"]),
        ]
    )


def _bad_request(format_module: str, message: str) -> JSONResponse:
    """A 400 in the wire format's own error shape."""
    if format_module == "anthropic_format":
        body: dict[str, Any] = {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": message},
        }
    else:
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    return JSONResponse(body, status_code=400)


@dataclass(slots=True)
class ConnectionCount:
    """TCP connections the emulator's server accepted, and how many are open now.

    Tests read it to prove that clients reuse keep-alive connections and close them at the end.
    """

    accepted: int = 0
    open: int = 0


def _counting(base: type[asyncio.Protocol], count: ConnectionCount) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol class, counting the connections it is made for."""

    def connection_made(self: asyncio.Protocol, transport: asyncio.BaseTransport) -> None:
        count.accepted += 1
        count.open += 1
        base.connection_made(self, transport)

    def connection_lost(self: asyncio.Protocol, exc: Exception | None) -> None:
        count.open -= 1
        base.connection_lost(self, exc)

    namespace = {"connection_made": connection_made, "connection_lost": connection_lost}
    return type("CountingHTTPProtocol", (base,), namespace)


class EmulatorServer:
    """Runs an emulator with uvicorn in a background thread on loopback.

    ``keep_alive_s``: how long an idle keep-alive connection stays open (uvicorn's
    ``timeout_keep_alive``, 5 s by default, as a real server closes idle ones). A test that
    counts connections kept alive across runs sets it beyond its own length, so that a slow
    host's pause between two requests cannot close one (ADR 0165)."""

    def __init__(
        self,
        emulator: Emulator,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        keep_alive_s: int = 5,
    ) -> None:
        self.emulator = emulator
        self.host = host
        # bound here (a port in use is a ListenError now, not uvicorn's exit in the thread);
        # port 0 takes a free port at once, with no window for another process to take it
        self._sockets = listen(host, port)
        self.port: int = self._sockets[0].getsockname()[1]
        self.connections = ConnectionCount()
        config = uvicorn.Config(
            emulator.app,
            host=host,
            port=self.port,
            log_level="warning",
            lifespan="off",
            http=_counting(AutoHTTPProtocol, self.connections),
            timeout_keep_alive=keep_alive_s,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": self._sockets}, daemon=True
        )

    @property
    def url(self) -> str:
        """The host root (Anthropic's base URL convention)."""
        return f"http://{host_port(self.host, self.port)}"

    @property
    def v1(self) -> str:
        """The ``/v1`` base URL (OpenAI / OpenRouter / compatible convention)."""
        return f"{self.url}/v1"

    def start(self) -> EmulatorServer:
        self._thread.start()
        for _ in range(500):
            if self._server.started:
                return self
            threading.Event().wait(0.01)
        self.stop()
        raise RuntimeError("emulator did not start within 5 s")

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for sock in self._sockets:  # closed by uvicorn when it served; here when it never did
            sock.close()


@contextlib.contextmanager
def serve_emulator(
    emulator: Emulator | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    keep_alive_s: int = 5,
) -> Iterator[EmulatorServer]:
    """``with serve_emulator(emu) as server: ...`` -- started on entry, stopped on exit."""
    server = EmulatorServer(
        emulator or Emulator(), host=host, port=port, keep_alive_s=keep_alive_s
    ).start()
    try:
        yield server
    finally:
        server.stop()
