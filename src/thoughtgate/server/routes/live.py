"""The live channel: ``POST /v1/tickets`` with a key, then ``GET /v1/runs/{id}/stream?ticket=``;
or, in one request, ``POST /v1/runs/follow`` with a key."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from urllib.parse import quote

from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.access.filter import reads_apart
from thoughtgate.access.keys import Principal
from thoughtgate.access.roles import Role
from thoughtgate.events.schema import is_run_terminal
from thoughtgate.server.access_watch import OnAccessLost
from thoughtgate.server.api import (
    Endpoint,
    Prefetch,
    QueryParam,
    parse_body,
    prefetched,
    query_int,
)
from thoughtgate.server.errors import ApiError
from thoughtgate.server.fanout import FirstPage
from thoughtgate.server.middleware import READER_ROLE
from thoughtgate.server.models import CreateRunBody, TicketBody, TicketView
from thoughtgate.server.responses import NOT_KEPT, JSONResponse
from thoughtgate.server.routes.runs import start_run
from thoughtgate.server.sse import DirectWrites, LiveResponse, live_frames
from thoughtgate.server.state import ServerState, state_of
from thoughtgate.store.base import EventStore
from thoughtgate.store.records import TERMINAL_RUN_STATUSES

__all__ = ["ENDPOINTS", "access_watcher", "stream_response"]


async def create_ticket(request: Request, principal: Principal | None) -> Response:
    assert principal is not None
    body = await parse_body(request, TicketBody)
    state = state_of(request)
    run_id = body.run_id
    if run_id is not None and not _ran_here(state, run_id):
        await state.store.get_run(run_id)  # 404 for an unknown run
    signer = await state.signer()
    ticket, expires_at = signer.issue(body.run_id, principal.role, key_id=principal.key_id)
    where = "/v1/runs" if body.run_id is None else f"/v1/runs/{quote(body.run_id)}"
    return JSONResponse(
        {
            "ticket": ticket,
            "expires_at": expires_at,
            "run_id": body.run_id,
            "scope": body.scope,
            "role": principal.role.label,
            "stream_url": f"{where}/stream?ticket={ticket}",
        }
    )


def _ran_here(state: ServerState, run_id: str) -> bool:
    """Whether this daemon is executing the run or executed it lately: then it exists (a run
    is never deleted), and a ticket for it needs no read (ADR 0028 and its amendment)."""
    manager = state.manager
    return manager.executing_mode(run_id) is not None or manager.executed_mode(run_id) is not None


async def stream_run(request: Request, principal: Principal | None) -> Response:
    assert principal is not None  # verified from the ticket by the endpoint wrapper
    state = state_of(request)
    run_id = request.path_params["run_id"]
    # The header is what a reconnecting EventSource sends; the query is for first connections
    # (and clients that cannot set headers). A reconnect keeps its old URL, so take the later.
    after = max(
        query_int(request, "last_event_id", 0, minimum=0),
        query_int(request, "Last-Event-ID", 0, minimum=0, header="last-event-id", query=False),
    )
    mode = state.manager.executing_mode(run_id)
    finished = False  # executing here: it exists and has not ended (ADR 0028), no read needed
    whole: FirstPage | None = None
    ended = state.manager.executed_mode(run_id) if mode is None and after == 0 else None
    if ended is not None:
        # Executed here (so it exists, and its mode is known) and over: if the first page
        # reaches the terminal event, the run has ended and that page is all of it.
        whole = await _ready(prefetched(request))
        if whole is not None and whole.ends_run():
            mode, finished = ended, True
        elif whole is not None:
            whole.close()
            whole = None
    if mode is None:  # not a run this daemon executes now: what the store says of it
        run = await state.store.get_run(run_id)
        finished, mode = run.status in TERMINAL_RUN_STATUSES, run.chain_of_thought
    if after > 0 and await _nothing_after(state.store, run_id, after, finished=finished):
        # At or past the end of a finished run: 204 tells an EventSource to stop reconnecting.
        return Response(status_code=204, headers=NOT_KEPT)
    first_page = whole
    if first_page is None:
        first_page = _first_page_of(prefetched(request))
        if first_page is not None and (after != 0 or finished):
            # Read before the run's status: only a stream that follows on may start from it
            # (the feed brings what was stored after it); a finished run's replay reads for
            # itself, unless the page was seen to hold the run's end (above).
            first_page.close()
            first_page = None
        first_page = await _ready(first_page)
    # a finished run ends after its last stored event, whatever it is
    return _live(
        state, run_id, mode, principal, after=after, follow=not finished, first_page=first_page
    )


def _first_page(request: Request) -> FirstPage | None:
    """A first connection's first read (``Endpoint.prefetch``): the run's events from the
    start, read while the ticket's key is checked (queued right behind it). A resume reads
    for itself."""
    feeds = state_of(request).feeds
    if feeds is None or "last_event_id" in request.query_params:
        return None
    if "last-event-id" in request.headers:
        return None
    # The role the ticket grants (set before the prefetch); the run's mode is not known yet.
    role = request.scope.get(READER_ROLE)
    apart = role is None or reads_apart(role, mode=None)
    return feeds.start_first_page(request.path_params["run_id"], 0, apart=apart)


def _first_page_of(page: Prefetch | None) -> FirstPage | None:
    if isinstance(page, FirstPage):
        return page
    if page is not None:
        page.close()
    return None


async def _ready(page: Prefetch | None) -> FirstPage | None:
    """A prefetched first page once read, or ``None`` (there is none, or its read failed: the
    reader then reads for itself, and meets the error there)."""
    first = _first_page_of(page)
    if first is None:
        return None
    try:
        await first.ready()
    except Exception:
        return None
    return first


async def start_and_follow(request: Request, principal: Principal | None) -> Response:
    """One request per run: start it, and follow it on the same response. Its execution starts
    while its admission commits (ADR 0040): this response is its reader, there from the start."""
    assert principal is not None
    run = await start_run(request, principal, early=True)
    location = f"/v1/runs/{quote(run.run_id)}"
    return _live(
        state_of(request),
        run.run_id,
        run.chain_of_thought,
        principal,
        after=0,
        follow=True,
        location=location,
    )


def _live(
    state: ServerState,
    run_id: str,
    mode: str,
    principal: Principal,
    *,
    after: int,
    follow: bool,
    location: str | None = None,
    first_page: FirstPage | None = None,
) -> Response:
    """The live response for ``principal``'s role; it ends if that key loses the role."""
    direct = DirectWrites()
    frames = live_frames(
        state.store,
        run_id,
        role=principal.role,
        mode=mode,
        after=after,
        queue_size=state.sse_queue_size,
        lag_timeout_s=state.sse_lag_timeout_s,
        feeds=state.feeds,
        follow=follow,
        watch_access=access_watcher(state, principal),
        ping_s=state.server.keepalive_s,
        streams=state.streams,
        direct=direct,
        first_page=first_page,
    )
    headers = {**NOT_KEPT, "X-Accel-Buffering": "no"}
    if location is not None:
        headers["Location"] = location
    return LiveResponse(
        frames,
        send_timeout_s=state.sse_send_timeout_s,
        headers=headers,
        streams=state.streams,
        direct=direct,
    )


def access_watcher(
    state: ServerState, principal: Principal
) -> Callable[[OnAccessLost], Callable[[], None]] | None:
    """What a live stream registers to end when its ticket's key is revoked or loses the role."""
    if state.access is None:
        return None
    return functools.partial(state.access.watch, principal.key_id, principal.role)


def stream_response(state: ServerState, frames: AsyncIterator[bytes]) -> Response:
    """An SSE response with the daemon's keep-alive and send timeout, never cached (the run
    list's change feed; a run's own stream is a :class:`LiveResponse`, see ``_live``)."""
    return EventSourceResponse(
        frames,
        ping=state.server.keepalive_s,
        send_timeout=state.sse_send_timeout_s,
        headers={**NOT_KEPT, "X-Accel-Buffering": "no"},
    )


async def _nothing_after(store: EventStore, run_id: str, after: int, *, finished: bool) -> bool:
    """Whether a resume after ``after`` has nothing to wait for: ``after`` is at or past the end
    of a run that has ended. Past the last event of a run still going is the caller's mistake
    (422): waiting there would hold the stream open after the run ends, since no event id it
    will ever append is above ``after``."""
    # event ``after`` and the next (their types only: nothing kept apart is read)
    around = await store.read(run_id, after=after - 1, limit=2, apart=False)
    if len(around) == 2:
        return False
    if finished or (around and is_run_terminal(around[0].type)):
        return True
    if around:
        return False  # at the live end of a running run: follow it
    if (await store.get_run(run_id)).status in TERMINAL_RUN_STATUSES:
        return True  # it ended while we looked
    raise ApiError(
        422,
        f"last_event_id {after} is past the last event of run {run_id!r}; resume from an id "
        "this stream sent you",
    )


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        "/v1/runs/follow",
        start_and_follow,
        "start a run and follow it (SSE)",
        role=Role.MEMBER,
        body=CreateRunBody,
        media_type="text/event-stream",
        errors=(400, 413, 422, 429, 503),
        description="One request per run: what `POST /v1/runs` records and starts, answered with "
        "the run's events on the same response, as `GET /v1/runs/{run_id}/stream` sends them "
        "to the calling key's role (`Location` names the run). Ends after the run's terminal "
        "event, or with `event: access_revoked` if the key is revoked or loses the role. To "
        "resume after a dropped connection, get a ticket and use the stream route with "
        "`Last-Event-ID`. 429 with Retry-After when the key holds "
        "quotas.max_live_streams_per_key live streams already (no run is started).",
    ),
    Endpoint(
        "POST",
        "/v1/tickets",
        create_ticket,
        "get a live-channel ticket for a run or the run list",
        role=Role.VIEWER,
        body=TicketBody,
        response=TicketView,
        errors=(400, 404, 413, 422),
        description="A short-lived signed ticket bound to the run (or, with "
        '`{"scope": "runs"}`, to the run list) and to your key\'s role.',
    ),
    Endpoint(
        "GET",
        "/v1/runs/{run_id}/stream",
        stream_run,
        "follow a run live (SSE)",
        auth="ticket",
        prefetch=_first_page,
        media_type="text/event-stream",
        params=(
            QueryParam("ticket", "from POST /v1/tickets", type="string", required=True),
            QueryParam("last_event_id", "resume after this event id", minimum=0),
            QueryParam("Last-Event-ID", "resume after this id", minimum=0, location="header"),
        ),
        errors=(204, 401, 403, 404, 422, 429),
        description="Server-sent events; `id:` is the event sequence. Replays after "
        "Last-Event-ID, then follows live, and ends after the run's terminal event (a finished "
        "run: after its last event). Keep-alive comments every server.keepalive_s seconds. 204 "
        "when resuming at or past the end of a finished run; 422 past the last event of a run "
        "still going. Ends with `event: access_revoked` within seconds of the ticket's key being "
        "revoked or losing the ticket's role. 429 with Retry-After when the ticket's key holds "
        "quotas.max_live_streams_per_key live streams already.",
    ),
)
