"""Live streams per API key: one key holds at most ``quotas.max_live_streams_per_key`` at once.

Why: every live stream (a run's SSE stream, ``/v1/runs/follow``, the run list's stream, AG-UI)
holds a connection for as long as it lasts, and ``server.max_connections`` is shared by every
key; without a per-key limit one key could hold them all and lock the others out (ADR 0155).

A stream takes its key's slot once the caller is known and before the route does anything (a
refused ``/v1/runs/follow`` starts no run), and gives it back when its response ends, however it
ends: the run's end, the client going away, an abort on a stuck reader, an error, a cancel at
shutdown. The slot is freed in a ``finally`` around the response, and by the admission itself
when the route fails before it has a response: no path keeps one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from thoughtgate.errors import QuotaExceededError

__all__ = ["RETRY_AFTER_S", "HeldStream", "StreamSlot", "StreamSlots", "admitted"]

RETRY_AFTER_S = 1.0
"""What a refused stream is told to wait: a slot frees as soon as one of the key's streams ends,
which nothing here can foresee (the connection limit's ``503`` says the same)."""


class StreamSlots:
    """How many live streams each key holds now (keys holding none are not kept)."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def held(self, key_id: str) -> int:
        return self._held.get(key_id, 0)

    def take(self, key_id: str, limit: int) -> StreamSlot:
        """A slot of ``key_id``'s, or :class:`QuotaExceededError` (a ``429``) when it holds
        ``limit`` already."""
        held = self._held.get(key_id, 0)
        if held >= limit:
            raise QuotaExceededError(
                f"this key already holds {held} live streams, the most it may "
                "(quotas.max_live_streams_per_key); end one, then open this one again",
                retry_after=RETRY_AFTER_S,
            )
        self._held[key_id] = held + 1
        return StreamSlot(self, key_id)

    def _give_back(self, key_id: str) -> None:
        left = self._held[key_id] - 1
        if left:
            self._held[key_id] = left
        else:
            del self._held[key_id]


class StreamSlot:
    """One stream's place in its key's count; :meth:`release` frees it (once, however often
    it is called)."""

    __slots__ = ("_slots", "key_id")

    def __init__(self, slots: StreamSlots, key_id: str) -> None:
        self._slots: StreamSlots | None = slots
        self.key_id = key_id

    def release(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots._give_back(self.key_id)


class HeldStream(Response):
    """``response``, sent as it is, holding ``slot`` until it ends."""

    def __init__(self, response: Response, slot: StreamSlot) -> None:
        # not Response.__init__: nothing of this one's own is sent, only the wrapped response
        self.response = response
        self.slot = slot
        self.status_code = response.status_code
        self.raw_headers = response.raw_headers
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.slot.release()


async def admitted(
    slots: StreamSlots, key_id: str, limit: int, respond: Callable[[], Awaitable[Response]]
) -> Response:
    """``respond()``'s response holding a slot of ``key_id``'s (``429`` when it has none left);
    if ``respond`` fails, the slot is freed before the error goes on."""
    slot = slots.take(key_id, limit)
    try:
        response = await respond()
    except BaseException:
        slot.release()
        raise
    return HeldStream(response, slot)
