"""The run list: filtered, searchable keyset pages (``GET /v1/runs``) and its live stream
(``GET /v1/runs/stream``, one SSE subscription for the whole list).

Every run either one sends passes the one output filter (``filter_run``) for the reader's role.
The stream sends a run each time it changes (created; status, usage, error or metadata changed),
in its latest state, with the change number as the SSE ``id``: a client loads a page, then
follows the stream from the page's ``changes``, and resumes with ``Last-Event-ID`` after a drop
without missing a change. The stream carries every run's changes; a client keeps only those that
match its own filters (the page does).

Who started a run (``started_by``, a key id) is operator detail: admin and above may filter by any
key; everyone may list their own runs (``key=me``, or their own key id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, get_args

from sse_starlette.event import ServerSentEvent
from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.access.filter import filter_run, reads_task_apart
from thoughtgate.access.keys import Principal
from thoughtgate.access.roles import Role
from thoughtgate.disclosure import CHAIN_OF_THOUGHT_MODES
from thoughtgate.errors import AccessDeniedError, RunNotFoundError, StoreError, UsageError
from thoughtgate.events.payloads import RunStatus
from thoughtgate.events.views import RunView
from thoughtgate.server.access_watch import OnAccessLost
from thoughtgate.server.api import Endpoint, QueryParam, query_int
from thoughtgate.server.errors import ApiError
from thoughtgate.server.models import RunList
from thoughtgate.server.responses import JSONResponse
from thoughtgate.server.routes.live import access_watcher, stream_response
from thoughtgate.server.state import state_of
from thoughtgate.store.base import EventStore
from thoughtgate.store.listing import MAX_SEARCH_CHARS, RunCursor, RunQuery
from thoughtgate.store.records import RunRecord

__all__ = ["ENDPOINTS", "run_list_frames"]

_STATUSES: Final = frozenset(get_args(RunStatus))
_FILTERS: Final = ("before", "status", "mode", "model", "key", "since", "until", "q")
_CHANGES_PAGE = 100

OutOfDate = Callable[[RunRecord], str | None]
"""The store's refusal word when a run's record is out of date (``RunManager.out_of_date``)."""


def _text(request: Request, name: str, *, limit: int = 200) -> str | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > limit:
        raise ApiError(422, f"{name} is limited to {limit} characters")
    return raw


def _one_of(request: Request, name: str, allowed: frozenset[str]) -> tuple[str, ...]:
    raw = _text(request, name)
    if raw is None:
        return ()
    values = tuple(dict.fromkeys(v.strip() for v in raw.split(",") if v.strip()))
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ApiError(422, f"{name} {unknown[0]!r} is not one of: {', '.join(sorted(allowed))}")
    return values


def _started_by(request: Request, who: Principal) -> str | None:
    """``key=me`` is the caller's own key; another key id needs admin (key ids are operator
    detail: filtering by one would tell a lower role which runs that key started)."""
    key = _text(request, "key")
    if key is None:
        return None
    if key == "me" or key == who.key_id:
        return who.key_id
    if who.role < Role.ADMIN:
        raise AccessDeniedError("filtering runs by another key requires role admin or above")
    return key


def run_query(request: Request, who: Principal, limit: int) -> RunQuery:
    """The page a ``GET /v1/runs`` asks for (422 for a malformed filter)."""
    before = _text(request, "before")
    since = query_int(request, "since", -1, minimum=0)
    until = query_int(request, "until", -1, minimum=0)
    try:
        return RunQuery(
            limit=limit,
            before=None if before is None else RunCursor.decode(before),
            statuses=_one_of(request, "status", _STATUSES),  # type: ignore[arg-type]
            modes=_one_of(request, "mode", frozenset(CHAIN_OF_THOUGHT_MODES)),
            model=_text(request, "model"),
            started_by=_started_by(request, who),
            since=None if since < 0 else float(since),
            until=None if until < 0 else float(until),
            text=_text(request, "q", limit=MAX_SEARCH_CHARS),
        )
    except UsageError as exc:
        if isinstance(exc, AccessDeniedError):
            raise
        raise ApiError(422, str(exc)) from None


async def list_runs(request: Request, principal: Principal | None) -> Response:
    assert principal is not None
    store = state_of(request).store
    limit = query_int(request, "limit", 50, minimum=1, maximum=500)
    offset = query_int(request, "offset", 0, minimum=0)
    changes = await store.latest_run_change()  # before the page: a change in between is resent
    apart = reads_task_apart(principal.role, mode=None)  # (ADR 0160, amendment 1)
    if offset:
        if any(request.query_params.get(name) for name in _FILTERS):
            raise ApiError(422, "offset cannot be combined with before or filters; use before")
        runs, cursor = await store.list_runs(limit=limit, offset=offset, apart=apart), None
    else:
        page = await store.query_runs(run_query(request, principal, limit), apart=apart)
        runs, cursor = page.runs, page.next
    out_of_date = state_of(request).manager.out_of_date
    return JSONResponse(
        {
            "runs": [_view(r, principal.role, out_of_date).to_json() for r in runs],
            "next": None if cursor is None else cursor.encode(),
            "changes": changes,
        }
    )


def _view(run: RunRecord, role: Role, out_of_date: OutOfDate | None) -> RunView:
    """The run through the one output filter, with ``record_out_of_date`` when its record is
    out of date (ADR 0151, amendment 2)."""
    view = filter_run(run, role)
    refusal = None if out_of_date is None else out_of_date(run)
    return view if refusal is None else view.model_copy(update={"record_out_of_date": refusal})


async def run_list_frames(
    store: EventStore,
    *,
    role: Role,
    after: int,
    watch_access: Callable[[OnAccessLost], Callable[[], None]] | None = None,
    out_of_date: OutOfDate | None = None,
    watch_stopped: Callable[[Callable[[str], None]], Callable[[], None]] | None = None,
) -> AsyncIterator[bytes]:
    """Frames of the live run list after change ``after``: each changed run through the one
    output filter, then every new change as it commits, until the reader leaves or loses access
    (``event: access_revoked``) or the store fails (``event: failed``; resume after the last id).
    ``out_of_date``/``watch_stopped``: a run whose execution stops on a refused write is sent
    again, marked ``record_out_of_date``, without an ``id`` (it is no change of the store's, which
    cannot record one: ADR 0151, amendment 2)."""
    loop = asyncio.get_running_loop()
    lost: asyncio.Future[str] = loop.create_future()
    stopped: list[str] = []
    poked: asyncio.Future[None] = loop.create_future()

    def access_lost(message: str) -> None:
        if not lost.done():
            lost.set_result(message)

    def stopped_by_store(run_id: str) -> None:
        stopped.append(run_id)
        if not poked.done():
            poked.set_result(None)

    unwatch = watch_access(access_lost) if watch_access is not None else None
    unwatch_stopped = watch_stopped(stopped_by_store) if watch_stopped is not None else None
    cursor = after
    apart = reads_task_apart(role, mode=None)  # (ADR 0160, amendment 1)
    try:
        while not lost.done():
            told, stopped[:] = list(stopped), []  # (one told while these reads wait stays)
            if poked.done():
                poked = loop.create_future()
            try:
                changes = (
                    await store.run_changes(after=cursor, limit=_CHANGES_PAGE, apart=apart)
                ).changes
                again = []
                for run_id in told:
                    with contextlib.suppress(RunNotFoundError):  # (gone: nothing to mark)
                        again.append(await store.get_run(run_id, apart=apart))
            except StoreError:
                data = json.dumps({"reason": "failed", "resume_after": cursor})
                yield ServerSentEvent(data=data, event="failed").encode()
                return
            if lost.done():
                break
            batch = []
            for number, run in changes:
                cursor = number
                view = _view(run, role, out_of_date).to_json_text()
                batch.append(ServerSentEvent(data=view, id=str(number)).encode())
            for run in again:
                view = _view(run, role, out_of_date).to_json_text()
                batch.append(ServerSentEvent(data=view).encode())
            if batch:
                yield b"".join(batch)
                continue
            waiting = asyncio.ensure_future(store.wait_for_run_changes(cursor))
            either: set[asyncio.Future[Any]] = {waiting, lost, poked}
            try:
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
                with contextlib.suppress(asyncio.CancelledError, StoreError):
                    await waiting
        data = json.dumps({"reason": "access_revoked", "message": lost.result()})
        yield ServerSentEvent(data=data, event="access_revoked").encode()
    finally:
        if unwatch is not None:
            unwatch()
        if unwatch_stopped is not None:
            unwatch_stopped()


async def stream_runs(request: Request, principal: Principal | None) -> Response:
    assert principal is not None  # verified from a run-list ticket by the endpoint wrapper
    state = state_of(request)
    after = max(
        query_int(request, "last_event_id", 0, minimum=0),
        query_int(request, "Last-Event-ID", 0, minimum=0, header="last-event-id", query=False),
    )
    latest = await state.store.latest_run_change()
    if after > latest:
        raise ApiError(
            422,
            f"last_event_id {after} is past the run list's last change ({latest}); resume from "
            "an id this stream sent you, or from the changes of GET /v1/runs",
        )
    frames = run_list_frames(
        state.store,
        role=principal.role,
        after=after,
        watch_access=access_watcher(state, principal),
        out_of_date=state.manager.out_of_date,
        watch_stopped=state.manager.watch_stopped_by_store,
    )
    return stream_response(state, frames)


_LIST_PARAMS = (
    QueryParam("limit", "at most this many runs (1-500)", minimum=1, maximum=500),
    QueryParam("before", "the `next` of the previous page: the page after it", type="string"),
    QueryParam(
        "status",
        "only runs in these statuses, comma-separated (pending, running, completed, partial, "
        "failed, error, interrupted)",
        type="string",
    ),
    QueryParam("mode", "only runs in these disclosure modes, comma-separated", type="string"),
    QueryParam("model", "only runs of this model (PROVIDER:MODEL, exact)", type="string"),
    QueryParam(
        "key",
        "only runs started with this API key: `me` (yours; any role) or a key id (admin+)",
        type="string",
    ),
    QueryParam("since", "only runs created at or after this Unix time (seconds)", minimum=0),
    QueryParam("until", "only runs created before this Unix time (seconds)", minimum=0),
    QueryParam(
        "q",
        f"only runs whose prompt contains this text (case-insensitive; at most "
        f"{MAX_SEARCH_CHARS} characters)",
        type="string",
    ),
    QueryParam("offset", "skip this many (newest first; no filters; prefer before)", minimum=0),
)

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "GET",
        "/v1/runs",
        list_runs,
        "list runs",
        role=Role.VIEWER,
        response=RunList,
        params=_LIST_PARAMS,
        errors=(403, 422),
        description="Newest first, in keyset pages: pass `next` back as `before` (a page costs "
        "the same at any depth, and runs created meanwhile neither shift nor repeat rows). "
        "Filters combine with AND; a filter's comma-separated values with OR. `changes` is "
        "where to start following GET /v1/runs/stream. 403 for `key` naming another key "
        "below admin.",
    ),
    Endpoint(
        "GET",
        "/v1/runs/stream",
        stream_runs,
        "follow the run list live (SSE)",
        auth="ticket",
        media_type="text/event-stream",
        params=(
            QueryParam(
                "ticket", 'from POST /v1/tickets {"scope": "runs"}', type="string", required=True
            ),
            QueryParam("last_event_id", "resume after this change number", minimum=0),
            QueryParam("Last-Event-ID", "resume after this id", minimum=0, location="header"),
        ),
        errors=(401, 403, 422, 429),
        description="Server-sent events, one per run change (created; status, usage, error or "
        "metadata changed): `id:` is the change number, `data:` the run as GET /v1/runs/{id} "
        "shows it to your role. Each run comes once per resume, in its latest state, in "
        "change order; then new changes as they commit. Every run's changes are sent: keep "
        "those matching your filters. Never ends on its own; keep-alive comments every "
        "server.keepalive_s seconds. `event: access_revoked` when the ticket's key is revoked "
        "or loses its role; `event: failed` when the store fails (resume after "
        "`resume_after`). 422 past the last change; 429 with Retry-After when the ticket's key "
        "holds quotas.max_live_streams_per_key live streams already.",
    ),
)
