"""The asyncio client: runs, events, the live channel with resume, and the thread.

Everything it shows has already passed the daemon's one output filter for the key's role; the
client adds no filter of its own and never asks for more than the key may read.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Final, Unpack
from urllib.parse import quote, urlsplit

import httpx
from pydantic import ValidationError

from thoughtgate.client.errors import DaemonError, DaemonUnreachableError, raise_for_response
from thoughtgate.client.run_list import RunListFilters, RunListPage, run_list_params
from thoughtgate.errors import UsageError, public_url
from thoughtgate.events.schema import EVENT_VERSION, Event, is_run_terminal
from thoughtgate.events.thread import ThreadBuilder, ThreadView
from thoughtgate.events.views import RunView
from thoughtgate.providers.sse import SSEDecoder

__all__ = ["EventPage", "ThoughtgateClient", "Ticket", "event_from_dict"]

_RUN_PAGE_MAX: Final = 500
"""The most runs ``GET /v1/runs`` answers in one page."""
_RESUME_EVENTS = frozenset({"lagging", "failed"})
_ACCESS_REVOKED = "access_revoked"
"""Frames after which the daemon closes the stream and the reader resumes from its last id."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """A live-channel ticket: bound to one run and to the role of the key that asked for it."""

    ticket: str
    expires_at: float
    run_id: str
    role: str


@dataclass(frozen=True, slots=True)
class EventPage:
    """One page of ``GET /v1/runs/{id}/events``: read on with ``after=next_after``."""

    events: tuple[Event, ...]
    next_after: int


def event_from_dict(data: Any) -> Event:
    """An event from its wire form (``Event.to_dict()``, as HTTP reads and SSE frames carry it)."""
    if not isinstance(data, Mapping):
        raise DaemonError(f"an event must be a JSON object, got {type(data).__name__}")
    seq, etype, run_id = data.get("seq"), data.get("type"), data.get("run_id")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise DaemonError(f"an event without a valid seq: {seq!r}")
    if not isinstance(etype, str) or not isinstance(run_id, str):
        raise DaemonError(f"event {seq} lacks its type or run id")
    payload = data.get("payload")
    task_id = data.get("task_id")
    ts = data.get("ts")
    version = data.get("v", EVENT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version > EVENT_VERSION:
        raise DaemonError(
            f"event {seq} is in event vocabulary version {version!r}; this client reads up to "
            f"version {EVENT_VERSION}: upgrade thoughtgate"
        )
    return Event(
        seq,
        run_id,
        etype,
        payload if isinstance(payload, Mapping) else {},
        task_id=task_id if isinstance(task_id, str) else None,
        ts=float(ts) if isinstance(ts, int | float) and not isinstance(ts, bool) else 0.0,
        v=version,
    )


def _run_view(data: Any) -> RunView:
    try:
        return RunView.model_validate(data)
    except ValidationError as exc:
        raise DaemonError(f"the daemon answered a run view this client cannot read: {exc}") from exc


def check_daemon_address(base_url: str, *, named: str = "") -> None:
    """Refuse, before any request, an address that is not ``http(s)://HOST[:PORT]``: without a
    scheme (``localhost:8765``) httpx would take the host for one, and each call would fail with
    "unsupported protocol 'localhost://'". ``named``: how the caller gave it (``"--url "``)."""
    try:
        parts = urlsplit(base_url)
    except ValueError:  # a broken IPv6 address
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"{named}{public_url(base_url)!r} is not a daemon's address: use http://HOST:PORT "
            "(or https://HOST:PORT)"
        )


class ThoughtgateClient:
    """A client for ``thoughtgate serve``, for one API key.

    >>> async with ThoughtgateClient("http://127.0.0.1:8765", key) as tg:
    ...     run_id = await tg.start_run("Plan the offsite", "fake:echo", chain_of_thought="surface")
    ...     async for view in tg.watch(run_id):          # the thread after every event
    ...         ...
    ...     view = await tg.thread(run_id, live=False)   # the same thread, rebuilt on reload

    ``follow`` resumes the live channel after a dropped connection or a ``lagging`` frame from the
    last id it yielded, asking for a fresh ticket when the old one expired, so a reader sees every
    event once, in order. After ``access_revoked`` (the key was revoked or lost a role) it asks
    for a fresh ticket: a revoked key then raises ``AuthenticationError``; a demoted key goes on
    with what its new role may see. It gives up with :class:`DaemonError` after ``max_reconnects``
    consecutive attempts that brought nothing new. ``clock`` is for tests (a skewed clock).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        stream_read_timeout: float = 60.0,
        max_reconnects: int = 10,
        reconnect_delay: float = 0.25,
        ticket_margin_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_daemon_address(base_url)
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )
        self._stream_timeout = httpx.Timeout(timeout, read=stream_read_timeout)
        self.max_reconnects = max_reconnects
        self.reconnect_delay = reconnect_delay
        self.ticket_margin_s = ticket_margin_s
        self._clock = clock
        self.tickets_issued = 0
        """How many tickets this client asked for (one per run followed, plus refreshes)."""
        self.connections = 0
        """How many live-channel connections this client opened."""

    async def __aenter__(self) -> ThoughtgateClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ plain requests

    async def _request(
        self,
        method: str,
        path: str,
        *,
        run_id: str | None = None,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
    ) -> Any:
        try:
            response = await self._http.request(method, path, json=json_body, params=params)
        except httpx.TransportError as exc:
            # the address and httpx's own words, not its repr: one line a user can act on
            reason = str(exc) or type(exc).__name__
            raise DaemonUnreachableError(
                f"cannot reach the daemon at {public_url(str(self._http.base_url))}: {reason}"
            ) from exc
        raise_for_response(response, run_id=run_id)
        try:
            return response.json()
        except ValueError as exc:
            raise DaemonError(f"{method} {path} answered something that is not JSON") from exc

    async def me(self) -> dict[str, Any]:
        """The key's name, role and permissions (``GET /v1/me``)."""
        body: dict[str, Any] = await self._request("GET", "/v1/me")
        return body

    async def create_key(self, *, name: str, role: str) -> dict[str, Any]:
        """Create an API key (admin and above; never above this key's role): its id, name, role
        and the key itself, which is shown only in this answer (``POST /v1/keys``)."""
        body: dict[str, Any] = await self._request(
            "POST", "/v1/keys", json_body={"name": name, "role": role}
        )
        return body

    async def list_keys(self) -> list[dict[str, Any]]:
        """Every API key, revoked ones too, never a secret (admin and above; ``GET /v1/keys``)."""
        body = await self._request("GET", "/v1/keys")
        return list(body["keys"])

    async def revoke_key(self, key: str) -> dict[str, Any]:
        """Revoke a key by exact id or by the name one active key has (admin and above;
        ``DELETE /v1/keys/{key}``); ``RequestRejectedError`` (404) when none is active by that
        id or name."""
        body: dict[str, Any] = await self._request("DELETE", f"/v1/keys/{quote(key, safe='')}")
        return body

    async def start_run(
        self,
        prompt: str,
        model: str | None,
        chain_of_thought: str | None = None,
        tools: Sequence[str] | None = None,
        *,
        system: str | None = None,
        tasks: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        """Start a run (member and above); returns its id. The run executes in the background.
        ``model=None`` takes the daemon's ``orchestration.default_model``."""
        body: dict[str, Any] = {"prompt": prompt}
        if model is not None:
            body["model"] = model
        if chain_of_thought is not None:
            body["chain_of_thought"] = chain_of_thought
        if tools is not None:
            body["tools"] = list(tools)
        if system is not None:
            body["system"] = system
        if tasks is not None:
            body["tasks"] = [dict(t) for t in tasks]
        created = await self._request("POST", "/v1/runs", json_body=body)
        return str(created["run_id"])

    async def get_run(self, run_id: str) -> RunView:
        """The run with its tasks, as the key's role may see it: the same :class:`RunView` the
        daemon's filter built (a withheld field is unset, absent from ``to_json()``)."""
        return _run_view(await self._request("GET", _run_path(run_id), run_id=run_id))

    async def list_runs(
        self, *, limit: int = 50, offset: int = 0, **filters: Unpack[RunListFilters]
    ) -> list[RunView]:
        """Runs, newest first: at most ``limit`` of those matching ``filters`` (status, mode,
        model, key, since, until, search: :class:`RunListFilters`), read in as many pages as
        that takes. ``offset`` skips runs; it cannot be combined with filters, and reads one page
        (``runs_page`` pages by cursor instead)."""
        if offset:
            params = {"limit": limit, "offset": offset, **run_list_params(filters)}
            body = await self._request("GET", "/v1/runs", params=params)
            return [_run_view(run) for run in body["runs"]]
        runs: list[RunView] = []
        before: str | None = None
        while len(runs) < limit:
            wanted = min(limit - len(runs), _RUN_PAGE_MAX)
            page = await self.runs_page(limit=wanted, before=before, **filters)
            runs.extend(page.runs)
            if page.next is None:
                break
            before = page.next
        return runs

    async def runs_page(
        self, *, limit: int = 50, before: str | None = None, **filters: Unpack[RunListFilters]
    ) -> RunListPage:
        """One page of runs matching ``filters``, newest first (``limit`` at most 500); pass its
        ``next`` as ``before`` for the page after it."""
        params: dict[str, str | int] = {"limit": limit, **run_list_params(filters)}
        if before is not None:
            params["before"] = before
        body = await self._request("GET", "/v1/runs", params=params)
        return RunListPage(
            tuple(_run_view(run) for run in body["runs"]),
            None if body.get("next") is None else str(body["next"]),
            int(body.get("changes", 0)),
        )

    async def resume_run(self, run_id: str) -> str:
        """Ask the daemon to continue a suspended durable run from its last completed step
        (member and above); returns its id. It executes in the background: ``follow`` it.
        ``RequestRejectedError`` (409) when it is not waiting to resume (it ended, is executing,
        or uses tools the daemon lacks)."""
        body = await self._request("POST", _run_path(run_id, "/resume"), run_id=run_id)
        return str(body["run_id"])

    async def events_page(self, run_id: str, *, after: int = 0, limit: int = 500) -> EventPage:
        """One page of events after ``after`` (``limit`` counts events before filtering)."""
        body = await self._request(
            "GET",
            _run_path(run_id, "/events"),
            run_id=run_id,
            params={"after": after, "limit": limit},
        )
        events = tuple(event_from_dict(e) for e in body["events"])
        return EventPage(events, int(body.get("next_after", after)))

    async def events(self, run_id: str, *, after: int = 0) -> list[Event]:
        """Every event recorded so far after ``after``, paging through with ``next_after``."""
        out: list[Event] = []
        while True:
            page = await self.events_page(run_id, after=after, limit=1000)
            out.extend(page.events)
            if page.next_after <= after:
                return out
            after = page.next_after

    async def trace(self, run_id: str) -> list[Event]:
        """The run's trace metadata (``worker.completed`` events on the trace surface; developer
        and above)."""
        body = await self._request("GET", _run_path(run_id, "/trace"), run_id=run_id)
        return [event_from_dict(e) for e in body["events"]]

    async def answer_approval(self, run_id: str, call_id: str, decision: str) -> dict[str, Any]:
        """``approve`` or ``reject`` a tool call that waits for a person (member and above)."""
        path = _run_path(run_id, f"/approvals/{quote(call_id, safe='')}")
        result: dict[str, Any] = await self._request("POST", path, json_body={"decision": decision})
        return result

    async def ticket(self, run_id: str) -> Ticket:
        """A short-lived live-channel ticket for the run, with this key's role."""
        body = await self._request(
            "POST", "/v1/tickets", run_id=run_id, json_body={"run_id": run_id}
        )
        self.tickets_issued += 1
        return Ticket(str(body["ticket"]), float(body["expires_at"]), run_id, str(body["role"]))

    # ------------------------------------------------------------------ the live channel

    async def follow(self, run_id: str, *, after: int = 0) -> AsyncIterator[Event]:
        """The run's events after ``after`` (as the key's role may see them), live, each once and
        in order, until the run's terminal event. Resumes by itself (see the class docstring).

        Close it early with ``contextlib.aclosing`` (or ``break`` inside ``async with``)."""
        last = after
        ticket: Ticket | None = None
        idle = 0  # consecutive connections that brought nothing new
        while True:
            before = last
            try:
                fresh = ticket is None or ticket.expires_at - self.ticket_margin_s <= self._clock()
                if ticket is None or fresh:
                    ticket = await self.ticket(run_id)  # none yet, or about to expire
                async with self._open_stream(run_id, ticket.ticket, last) as response:
                    if response.status_code == 204:
                        return  # resumed after the terminal event: nothing more will come
                    await _check_stream(response, run_id, retry_401=not fresh)
                    if response.status_code == 401:
                        ticket = None  # expired by the daemon's clock: ask for a fresh one
                        continue
                    decoder = SSEDecoder()
                    resume = False
                    async for chunk in response.aiter_bytes():
                        for message in decoder.feed(chunk):
                            if message.event in _RESUME_EVENTS:
                                resume = True  # the daemon closes now; resume from `last`
                                break
                            if message.event == _ACCESS_REVOKED:
                                # The key was revoked or lost a role: a fresh ticket carries what
                                # it may see now, or is refused (AuthenticationError).
                                ticket, resume = None, True
                                break
                            if message.event != "message" or not message.data:
                                continue
                            event = event_from_dict(_json(message.data))
                            if event.seq <= last:
                                continue  # overlap after a resume: never twice
                            last = event.seq
                            yield event
                            if is_run_terminal(event.type):
                                return
                        if resume:
                            break
            except (httpx.TransportError, DaemonUnreachableError):
                pass  # a dropped or stalled connection (or ticket request): resume below
            idle = 0 if last > before else idle + 1
            if idle > self.max_reconnects:
                raise DaemonError(
                    f"the live channel of run {run_id!r} brought nothing new after "
                    f"{self.max_reconnects} reconnects (last event {last})"
                )
            await asyncio.sleep(self.reconnect_delay * min(idle, 8))

    def _open_stream(
        self, run_id: str, ticket: str, last: int
    ) -> AbstractAsyncContextManager[httpx.Response]:
        self.connections += 1
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-store"}
        if last:
            headers["Last-Event-ID"] = str(last)
        return self._http.stream(
            "GET",
            _run_path(run_id, "/stream"),
            params={"ticket": ticket, "last_event_id": last},
            headers=headers,
            timeout=self._stream_timeout,
        )

    # ------------------------------------------------------------------ the thread

    async def watch(self, run_id: str) -> AsyncIterator[ThreadView]:
        """The thread after every event the key may see, live, until the run ends."""
        builder = ThreadBuilder()
        async for event in self.follow(run_id):
            builder.feed(event)
            yield builder.view()

    async def thread(self, run_id: str, *, live: bool = True) -> ThreadView:
        """The run's thread: visible steps, tool cards, the answer and the receipt.

        ``live=True`` follows the live channel until the run ends; ``live=False`` rebuilds from
        the events recorded so far (what a reload shows). Both give the same view of a finished
        run. :class:`~thoughtgate.events.thread.ThreadBuilder` applies the client rules: unmarked
        or malformed ``cot.*`` payloads are discarded, reasoning is never taken from tool data or
        provider fields, and a missing step blocks nothing.
        """
        builder = ThreadBuilder()
        if live:
            async for event in self.follow(run_id):
                builder.feed(event)
        else:
            builder.feed_all(await self.events(run_id))
        return builder.view()


def _run_path(run_id: str, tail: str = "") -> str:
    return f"/v1/runs/{quote(run_id, safe='')}{tail}"


async def _check_stream(response: httpx.Response, run_id: str, *, retry_401: bool) -> None:
    """Raise for a live-channel answer other than 200, except a 401 worth one fresh ticket."""
    if response.status_code == 200:
        return
    await response.aread()
    if response.status_code == 401 and retry_401:
        return
    raise_for_response(response, run_id=run_id)
    raise DaemonError(
        f"the live channel answered {response.status_code}", status=response.status_code
    )


def _json(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise DaemonError("the live channel sent a frame that is not JSON") from exc
