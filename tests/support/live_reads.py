"""A run's events as a live SSE stream reads them: one ``LiveReader`` (``RunFeeds.reader``), its
batches from ``next`` taken until it returns ``None``, the reader closed however the reading
ends -- what ``server.sse.live_frames`` does, without the framing and the socket."""

from __future__ import annotations

from collections.abc import AsyncIterator

from thoughtgate.events.schema import Event
from thoughtgate.server.fanout import RunFeeds

__all__ = ["live_events"]


async def live_events(feeds: RunFeeds, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
    """The stored events of ``run_id`` after ``after``, then the live ones, one at a time, until
    the run's terminal event."""
    reader = feeds.reader(run_id, after=after)
    try:
        while (batch := await reader.next()) is not None:
            for event in batch:
                yield event
    finally:
        reader.close()
