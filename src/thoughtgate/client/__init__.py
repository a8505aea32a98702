"""The Python client of the daemon: start runs, follow them live, read their thread.

>>> from thoughtgate.client import ThoughtgateClient
>>> async with ThoughtgateClient("http://127.0.0.1:8765", key) as tg:
...     run_id = await tg.start_run("Plan the offsite", "fake:echo", chain_of_thought="surface")
...     async for event in tg.follow(run_id):   # SSE with a ticket; resumes after a drop
...         ...
...     view = await tg.thread(run_id, live=False)   # ThreadView: steps, tool cards, answer

:class:`SyncThoughtgateClient` offers the same calls, blocking. The thread comes from
:mod:`thoughtgate.events.thread`, so the client keeps the same rules as every other reader: it
discards unmarked or malformed ``cot.*`` payloads, never recovers reasoning from tool input or
output or provider fields, and lets nothing wait for a step. It shows only what the daemon's one
output filter sent for the key's role: a viewer's client never receives raw reasoning.
"""

from __future__ import annotations

from thoughtgate.client.aio import EventPage, ThoughtgateClient, Ticket, event_from_dict
from thoughtgate.client.errors import (
    AnswerError,
    DaemonError,
    DaemonUnreachableError,
    ForbiddenError,
    KeyRefusedError,
    NoSuchRunError,
    RequestRejectedError,
    TicketRefusedError,
)
from thoughtgate.client.run_list import RunListFilters, RunListPage
from thoughtgate.client.sync import SyncThoughtgateClient

__all__ = [
    "AnswerError",
    "DaemonError",
    "DaemonUnreachableError",
    "EventPage",
    "ForbiddenError",
    "KeyRefusedError",
    "NoSuchRunError",
    "RequestRejectedError",
    "RunListFilters",
    "RunListPage",
    "SyncThoughtgateClient",
    "ThoughtgateClient",
    "Ticket",
    "TicketRefusedError",
    "event_from_dict",
]
