"""A run its own process no longer executes ends: a live daemon does not keep it open.

A run whose end the store refused for longer than its retries is left open by the process that
executed it (ADR 0059). The lease sweep closes it once its lease expires (ADR 0009) -- which a
daemon executing other runs must let happen: it renews the leases of the runs it executes, not
those of every open run it ever started, and its own sweep closes its own runs it no longer
executes (ADR 0060).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.durable import until
from support.pg import PG_URL, pg_admin, pg_schema

from thoughtgate.config import Config
from thoughtgate.errors import StoreUnavailableError
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.server.manager import RunManager
from thoughtgate.store.base import EventStore, RunEnding
from thoughtgate.store.leases import ABANDONED
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FakeProvider, text

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name

TTL_S = 1.0
"""A short lease: renewed every third of it, swept every two thirds of it."""


class RefusesEnds:
    """A store that refuses to record the end of the runs in ``refused`` (as a store that is
    unavailable for longer than the retries would), and records every other write."""

    refused: set[str]

    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        if run_id in self.refused:
            raise StoreUnavailableError("database is locked")
        return await super().finish_run(run_id, events, ending)  # type: ignore[misc, no-any-return]


class RefusingSQLite(RefusesEnds, SQLiteStore):
    pass


class RefusingPostgres(RefusesEnds, PostgresStore):
    pass


@pytest.fixture
async def refusing_sqlite(tmp_path: Path) -> AsyncIterator[RefusesEnds]:
    store = await RefusingSQLite.open(tmp_path / "runs.db")
    store.refused = set()
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def refusing_postgres(pg_schema: str) -> AsyncIterator[RefusesEnds]:
    store = await RefusingPostgres.open(PG_URL, schema=pg_schema)
    store.refused = set()
    try:
        yield store
    finally:
        await store.close()


class Provider:
    """``fake:long`` answers once ``finish_long`` is set; ``fake:short`` answers at once."""

    def __init__(self) -> None:
        self.finish_long = asyncio.Event()
        self.long_started = asyncio.Event()

    def __call__(self, model: str) -> FakeProvider:
        return FakeProvider(self.long if model == "fake:long" else _short, model=model)

    async def long(self, request: TurnRequest, turn: int) -> AsyncIterator[Any]:
        yield text("Working on ")
        self.long_started.set()
        await self.finish_long.wait()
        yield text("it.")


async def _short(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    yield text("Done.")


async def _run_whose_end_was_refused_ends_interrupted(store: RefusesEnds) -> None:
    assert isinstance(store, EventStore)
    provider = Provider()
    config = Config.from_mapping({"orchestration": {"lease_ttl_s": TTL_S}})
    runtime = Runtime(store, config, provider_factory=provider)
    manager = RunManager(runtime, grace_s=0)
    manager.start_sweeping()
    try:
        long = await manager.start(RunRequest("think long", model="fake:long"))
        await asyncio.wait_for(provider.long_started.wait(), 20)
        # The daemon keeps executing the long run while the short one's end is refused
        # throughout its retries: its execution here is over, the run still open.
        stuck = await manager.start(RunRequest("answer", model="fake:short"))
        store.refused.add(stuck.run_id)
        await until(lambda: _no_longer_executing(manager, stuck.run_id))
        assert (await store.get_run(stuck.run_id)).status == "running"
        store.refused.clear()  # the store recovers

        async def stuck_closed() -> bool:
            return (await store.get_run(stuck.run_id)).status == "interrupted"

        await until(stuck_closed)
        ended = await store.get_run(stuck.run_id)
        # and why: what stopped its execution here, not only that its end went unrecorded
        assert ended.error == f"interrupted: {ABANDONED} (database is locked)", ended.error
        log = [e.type for e in await store.read(stuck.run_id)]
        assert log.count(EventType.RUN_INTERRUPTED) == 1
        assert log[-2:] == [EventType.TASK_COMPLETED, EventType.RUN_INTERRUPTED]

        # The long run was executed throughout and is untouched: it completes.
        assert (await store.get_run(long.run_id)).status == "running"
        assert runtime.leases.held == {long.run_id}
        provider.finish_long.set()

        async def long_completed() -> bool:
            return (await store.get_run(long.run_id)).status == "completed"

        await until(long_completed)
        log = [e.type for e in await store.read(long.run_id)]
        assert EventType.RUN_INTERRUPTED not in log
        assert log[-1] == EventType.RUN_SETTLEMENT_COMPLETED
    finally:
        provider.finish_long.set()
        await manager.shutdown()


async def _no_longer_executing(manager: RunManager, run_id: str) -> bool:
    return manager.executing_mode(run_id) is None


@pytest.mark.inprocess
async def test_a_run_whose_end_was_refused_is_closed_while_the_daemon_executes_others_sqlite(
    refusing_sqlite: RefusesEnds,
) -> None:
    await _run_whose_end_was_refused_ends_interrupted(refusing_sqlite)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_run_whose_end_was_refused_is_closed_while_the_daemon_executes_others_postgres(
    refusing_postgres: RefusesEnds,
) -> None:
    await _run_whose_end_was_refused_ends_interrupted(refusing_postgres)
