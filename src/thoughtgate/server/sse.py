"""The live channel: one encoder for an event, and the per-connection frame stream.

Frames: ``id: <seq>`` and ``data: <the event envelope as JSON>`` (the same shape as
``GET /v1/runs/{id}/events``); no ``event:`` name, so a browser's ``onmessage`` gets them all.
Keep-alive comment lines and disconnect handling are sse-starlette's ``EventSourceResponse``.

Each connection reads the run's event log in a small pump task that passes every event through
the one output filter into a bounded queue; the response drains the queue, coalescing what is
ready into one write. In the daemon the log comes from the run's shared feed (``fanout``: one
store read per event however many readers follow the run, each frame filtered and encoded once
per role), else straight from ``EventStore.tail``. So a slow reader holds at most ``queue_size``
events in memory, never slows the run (the run writes to the store, not to readers) and never slows other
readers. A reader that takes no frame for ``lag_timeout_s`` while its queue is full is closed after
an ``event: lagging`` frame whose data names the last ``id`` it was sent; it resumes from there
with ``Last-Event-ID`` and loses nothing, because nothing is ever dropped from the log.

A stream is also ended when its reader's access goes: ``watch_access`` registers a callback (the
daemon's ``AccessWatch``) that, once the ticket's key is revoked or loses the role, stops the pump,
drops whatever is queued and not yet sent, and closes the response after an
``event: access_revoked`` frame whose data says why. A finished run (``follow=False``) is
replayed up to its last stored event and the response ends there, terminal event or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from sse_starlette.event import ServerSentEvent

from thoughtgate.access.filter import filter_event
from thoughtgate.access.roles import Role
from thoughtgate.events.schema import Event
from thoughtgate.server.access_watch import OnAccessLost
from thoughtgate.server.fanout import RunFeeds, replay
from thoughtgate.store.base import EventStore

__all__ = ["encode_event", "frame_bytes", "live_frames"]

log = logging.getLogger("thoughtgate.server")

_END: Final = "end"
_LAGGING: Final = "lagging"
_FAILED: Final = "failed"
_REVOKED: Final = "access_revoked"
_MAX_COALESCE = 64


def encode_event(event: Event) -> dict[str, Any]:
    """An (already filtered) event as SSE fields: ``id`` is its sequence number."""
    return {
        "id": str(event.seq),
        "data": json.dumps(event.to_dict(), ensure_ascii=False, separators=(",", ":")),
    }


def frame_bytes(fields: dict[str, Any]) -> bytes:
    return ServerSentEvent(**fields).encode()


def _encode(event: Event) -> bytes:
    return frame_bytes(encode_event(event))


async def live_frames(
    store: EventStore,
    run_id: str,
    *,
    role: Role,
    mode: str,
    after: int,
    queue_size: int = 256,
    lag_timeout_s: float = 10.0,
    feeds: RunFeeds | None = None,
    follow: bool = True,
    watch_access: Callable[[OnAccessLost], Callable[[], None]] | None = None,
) -> AsyncIterator[bytes]:
    """Frames for one connection: replay after ``after``, then live, until the terminal event
    (``follow=False``: only what is stored now), or until ``watch_access`` reports lost access."""
    queue: asyncio.Queue[tuple[int, bytes] | str] = asyncio.Queue(maxsize=queue_size)
    last_sent = after
    lost: list[str] = []

    def frame(event: Event) -> bytes | None:
        if feeds is not None:
            return feeds.frame(event, role, mode, _encode)
        shown = filter_event(event, role, mode=mode)
        return None if shown is None else _encode(shown)

    async def pump() -> None:
        outcome = _END
        if not follow:
            source = replay(store, run_id, after)
        elif feeds is None:
            source = store.tail(run_id, after=after)
        else:
            source = feeds.tail(run_id, after=after)
        try:
            async for event in source:
                data = frame(event)
                if data is None:
                    continue
                item = (event.seq, data)
                if not queue.full():
                    queue.put_nowait(item)  # no suspension: a whole batch becomes one write
                    continue
                try:
                    await asyncio.wait_for(queue.put(item), lag_timeout_s)
                except TimeoutError:
                    outcome = _LAGGING
                    break
        except asyncio.CancelledError:
            raise
        except Exception:  # reported to the reader, who may resume
            log.exception("live stream of run %s failed", run_id)
            outcome = _FAILED
        finally:  # a lagging reader leaves the run's feed now, not when collected
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()
        await queue.put(outcome)

    task = asyncio.create_task(pump(), name=f"sse pump {run_id}")

    def access_lost(message: str) -> None:
        """Stop at once: nothing queued after this moment reaches the reader."""
        if lost:
            return
        lost.append(message)
        task.cancel()
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(_REVOKED)  # room: the pump is cancelled and the queue was emptied

    unwatch = watch_access(access_lost) if watch_access is not None else None
    try:
        while True:
            item = await queue.get()
            batch: list[bytes] = []
            while True:
                if isinstance(item, str):
                    if batch:
                        yield b"".join(batch)
                    if item == _REVOKED:
                        yield frame_bytes(
                            {
                                "event": item,
                                "data": json.dumps({"reason": item, "message": lost[0]}),
                            }
                        )
                    elif item != _END:
                        yield frame_bytes(
                            {
                                "event": item,
                                "data": json.dumps({"reason": item, "resume_after": last_sent}),
                            }
                        )
                    return
                last_sent, data = item
                batch.append(data)
                if len(batch) >= _MAX_COALESCE or queue.empty():
                    break
                item = queue.get_nowait()
            yield b"".join(batch)
    finally:
        if unwatch is not None:
            unwatch()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
