"""The daemon's shared state, reachable from every request as ``state_of(request)``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.requests import Request

from thoughtgate.access.tickets import TicketSigner, ticket_secret
from thoughtgate.config import ServerConfig
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.server.access_watch import AccessWatch
from thoughtgate.server.fanout import RunFeeds
from thoughtgate.server.manager import RunManager
from thoughtgate.server.readiness import Readiness
from thoughtgate.server.sse import LiveStreams
from thoughtgate.server.stream_slots import StreamSlots
from thoughtgate.store.base import EventStore

__all__ = ["ServerState", "state_of"]


@dataclass(slots=True)
class ServerState:
    runtime: Runtime
    manager: RunManager
    server: ServerConfig
    sse_queue_size: int = 256
    sse_lag_timeout_s: float = 10.0
    sse_send_timeout_s: float = 30.0
    feeds: RunFeeds | None = None
    """Shared per-run live feeds for the SSE channel (``None``: each reader tails the store)."""
    access: AccessWatch | None = None
    """Ends live streams whose key is revoked or loses the role (``None``: nobody watches)."""
    streams: LiveStreams = field(default_factory=LiveStreams)
    """The open live streams, ended all at once when the server shuts down."""
    stream_slots: StreamSlots = field(default_factory=StreamSlots)
    """How many live streams each key holds (``quotas.max_live_streams_per_key``, ADR 0155)."""
    readiness: Readiness = field(init=False)
    """What ``GET /readyz`` asks: one over ``runtime.store``."""
    _signer: TicketSigner | None = None
    _signer_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.readiness = Readiness(self.runtime.store)

    @property
    def store(self) -> EventStore:
        return self.runtime.store

    async def signer(self) -> TicketSigner:
        """The ticket signer; its secret comes from config or, once, from the store."""
        if self._signer is None:
            async with self._signer_lock:
                if self._signer is None:
                    secret = await ticket_secret(self.store, self.server.secret)
                    self._signer = TicketSigner(secret, ttl_s=self.server.ticket_ttl_s)
        return self._signer


def state_of(request: Request) -> ServerState:
    state = request.app.state.thoughtgate
    assert isinstance(state, ServerState)
    return state
