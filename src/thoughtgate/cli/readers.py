"""Where the read commands read from: the local store, or a daemon (``--url`` / ``--key``).

``status``, ``runs``, ``events`` and ``trace`` are written once, against :class:`RunReader`;
the two readers differ only in where the filtered data comes from:

* :class:`StoreReader` reads the local store and passes everything through the one output
  filter for the local role (``access.local_role``, or ``--view-as`` below it);
* :class:`DaemonReader` asks the daemon with :class:`thoughtgate.client.ThoughtgateClient`: the
  daemon's filter already applied the key's role, and nothing here filters again or asks for more.

So a command prints the same shapes against either, and a script works against both.

A store that does not exist (a SQLite file, a PostgreSQL schema) is never created by a read:
:class:`NoStoreReader` stands in for it, so a mistyped ``--db`` says so instead of leaving a stray
empty database behind (``cli.missing_store``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from thoughtgate.cli.common import Context, resolve_run_id, run_async
from thoughtgate.cli.missing_store import missing_store, note_no_store, nothing_there
from thoughtgate.cli.options import ReadOptions
from thoughtgate.cli.remote import needs_role, resolve_on_daemon, resolve_remote, wants_daemon
from thoughtgate.cli.run_selection import EVERY_RUN, MINE_NEEDS_DAEMON, RunSelection
from thoughtgate.errors import AccessDeniedError, UsageError

if TYPE_CHECKING:
    from thoughtgate.access.roles import Role
    from thoughtgate.client import ThoughtgateClient
    from thoughtgate.events.schema import Event
    from thoughtgate.events.views import RunView
    from thoughtgate.store.base import EventStore

__all__ = [
    "DaemonReader",
    "NoStoreReader",
    "RunReader",
    "StoreReader",
    "read_command",
]


class RunReader(Protocol):
    """What the read commands need: runs and events as one reader may see them."""

    async def role(self) -> str: ...

    async def resolve(self, given: str) -> str:
        """A full run id from an id or a unique start of it (``git``-style)."""
        ...

    async def view(self, run_id: str) -> RunView: ...

    async def runs(self, limit: int, selection: RunSelection = EVERY_RUN) -> list[RunView]:
        """The newest ``limit`` runs of ``selection``, newest first."""
        ...

    async def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        """Events after ``after``; ``limit`` counts recorded events, before the filter."""
        ...

    def follow(self, run_id: str, *, after: int = 0) -> AsyncGenerator[Event, None]:
        """Events as they are recorded, until the run ends."""
        ...

    async def trace(self, run_id: str) -> list[Event]: ...


class StoreReader:
    """The local store, through the one output filter for the local role."""

    def __init__(self, store: EventStore, role: Role) -> None:
        self.store = store
        self.reader = role

    async def role(self) -> str:
        return self.reader.label

    async def resolve(self, given: str) -> str:
        return await resolve_run_id(self.store, given)

    async def view(self, run_id: str) -> RunView:
        from thoughtgate.access.filter import filter_run, reads_task_apart

        apart = reads_task_apart(self.reader, mode=None)  # (ADR 0160)
        return filter_run(await self.store.get_run(run_id, apart=apart), self.reader)

    async def runs(self, limit: int, selection: RunSelection = EVERY_RUN) -> list[RunView]:
        from thoughtgate.access.filter import filter_run, reads_task_apart

        if selection.mine:
            raise UsageError(MINE_NEEDS_DAEMON)
        apart = reads_task_apart(self.reader, mode=None)  # (ADR 0160, amendment 1)
        page = await self.store.query_runs(selection.store_query(limit), apart=apart)
        return [filter_run(r, self.reader) for r in page.runs]

    async def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        from thoughtgate.access.filter import filter_events, reads_apart

        run = await self.store.get_run(run_id)
        mode = run.chain_of_thought
        apart = reads_apart(self.reader, mode=mode)
        raw = await self.store.read(run_id, after=after, limit=limit, apart=apart)
        return filter_events(raw, self.reader, mode=mode)

    async def follow(self, run_id: str, *, after: int = 0) -> AsyncGenerator[Event, None]:
        from thoughtgate.access.filter import event_filter, reads_apart

        run = await self.store.get_run(run_id)
        mode = run.chain_of_thought
        show = event_filter(self.reader, mode=mode)  # resolved once (ADR 0143)
        apart = reads_apart(self.reader, mode=mode)
        async for event in self.store.tail(run_id, after=after, apart=apart):
            shown = show(event)
            if shown is not None:
                yield shown

    async def trace(self, run_id: str) -> list[Event]:
        from thoughtgate.access.filter import filter_events, require_role
        from thoughtgate.access.roles import Role
        from thoughtgate.events.schema import EventType

        require_role(self.reader, Role.DEVELOPER, "the trace")
        run = await self.store.get_run(run_id)
        raw = [e for e in await self.store.read(run_id) if e.type == EventType.WORKER_COMPLETED]
        return filter_events(raw, self.reader, mode=run.chain_of_thought, surface="trace")


class DaemonReader:
    """A daemon's HTTP API, read with one API key (the daemon filters for the key's role)."""

    def __init__(self, client: ThoughtgateClient) -> None:
        self.client = client
        self._role: str | None = None

    async def role(self) -> str:
        if self._role is None:
            self._role = str((await self.client.me())["role"])
        return self._role

    async def resolve(self, given: str) -> str:
        return await resolve_on_daemon(self.client, given)

    async def view(self, run_id: str) -> RunView:
        return await self.client.get_run(run_id)

    async def runs(self, limit: int, selection: RunSelection = EVERY_RUN) -> list[RunView]:
        return await self.client.list_runs(limit=limit, **selection.daemon_filters())

    async def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        if limit is None:
            return await self.client.events(run_id, after=after)
        # as locally: at most ``limit`` recorded events, before the filter
        return list((await self.client.events_page(run_id, after=after, limit=limit)).events)

    async def follow(self, run_id: str, *, after: int = 0) -> AsyncGenerator[Event, None]:
        stream = self.client.follow(run_id, after=after)
        try:
            async for event in stream:
                yield event
        finally:  # close the live channel when the command stops reading (--limit, Ctrl-C)
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()

    async def trace(self, run_id: str) -> list[Event]:
        try:
            return await self.client.trace(run_id)
        except AccessDeniedError:  # the daemon's 403 is generic: as locally, with the role
            with needs_role("the trace", "developer", await self.role()):
                raise


class NoStoreReader:
    """A store that does not exist, read without creating it: it holds no runs, so ``runs``
    lists none (and says where it looked) and a run id is a usage error naming the place, the
    exit code of an unknown run."""

    def __init__(self, where: str, role: Role) -> None:
        self.where = where
        self.reader = role

    def _nothing_here(self, given: str) -> UsageError:
        return nothing_there(self.where, f"run {given!r}")

    async def role(self) -> str:
        return self.reader.label

    async def resolve(self, given: str) -> str:
        raise self._nothing_here(given)

    async def view(self, run_id: str) -> RunView:
        raise self._nothing_here(run_id)

    async def runs(self, limit: int, selection: RunSelection = EVERY_RUN) -> list[RunView]:
        if selection.mine:
            raise UsageError(MINE_NEEDS_DAEMON)
        note_no_store(self.where)
        return []

    async def events(self, run_id: str, *, after: int = 0, limit: int | None = None) -> list[Event]:
        raise self._nothing_here(run_id)

    async def follow(self, run_id: str, *, after: int = 0) -> AsyncGenerator[Event, None]:
        raise self._nothing_here(run_id)
        yield  # pragma: no cover - makes this an async generator, as the protocol has it

    async def trace(self, run_id: str) -> list[Event]:
        raise self._nothing_here(run_id)


@contextlib.asynccontextmanager
async def _open_reader(
    url: str | None, key: str | None, *, db: str | None, view_as: str | None, config: str | None
) -> AsyncIterator[RunReader]:
    remote = resolve_remote(url, key, db=db, view_as=view_as)
    if remote is not None:
        async with remote.client() as client:
            yield DaemonReader(client)
        return
    ctx = Context(config_path=config, db=db, view_as=view_as)
    missing = await missing_store(ctx.db_url)
    if missing is not None:  # opening would create it (its directory, its schema)
        yield NoStoreReader(missing, ctx.role)
        return
    try:
        yield StoreReader(await ctx.store(), ctx.role)
    finally:
        await ctx.close()


def read_command(body: Callable[[RunReader], Awaitable[None]], read: ReadOptions) -> None:
    """Run a read command's ``body`` against the daemon ``--url`` names, else the local store;
    errors become one clear line and an exit code (``run_async``)."""
    wants_daemon(read.url, read.key)  # a --key without --url is a usage error

    async def main() -> None:
        async with _open_reader(
            read.url, read.key, db=read.db, view_as=read.view_as, config=read.config
        ) as reader:
            await body(reader)

    run_async(main())
