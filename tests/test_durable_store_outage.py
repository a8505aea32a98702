"""A durable run waits out an outage of its store and continues from its checkpoints (ADR 0152).

The outage is real: the run's own PostgreSQL database is made to refuse every connection
(``ALLOW_CONNECTIONS false``) and its backends are terminated -- that database's only, other
tests use the server meanwhile -- from inside the model's answer, so it lands mid-turn, where a
run's events are being appended. The store's pool waits half a second for a connection, not 30.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.durable import until
from support.durable_engine import InProcessDaemon, SweepingDaemon
from support.pg import PG_URL, schema_name

from thoughtgate.config import Config, DurabilityConfig, OrchestrationConfig
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.errors import StoreUnavailableError, store_outage
from thoughtgate.events.schema import EventType
from thoughtgate.orchestration.outages import STORE_BACK
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, text, tool_call

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

CALLS: list[str] = []


@tool
def lookup(query: str) -> str:
    """A tool with an effect to count."""
    CALLS.append(f"tool {query}")
    return f"found {query}"


class Outage:
    """One PostgreSQL database refusing every connection, its sessions ended, until
    :meth:`end`."""

    def __init__(self, admin: psycopg.AsyncConnection[Any], database: str) -> None:
        self.admin = admin
        self.database = database
        self.began = asyncio.Event()
        self.over = asyncio.Event()

    async def begin(self) -> None:
        name = sql.Identifier(self.database)
        await self.admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(name)
        )
        await self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (self.database,),
        )
        self.began.set()

    async def end(self) -> None:
        name = sql.Identifier(self.database)
        await self.admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(name)
        )
        self.over.set()


def outage_script(
    outage: Outage, *, lasts_s: float | None, looks_up: bool = True, after: int = 5
) -> Any:
    """A fake model: calls ``lookup`` once (``looks_up``), then answers in 40 pieces; the first
    time it answers, the store's outage begins after its ``after``-th piece (40: once its
    answer is whole and recorded, before the run's end) and ends ``lasts_s`` later, or when the
    test ends it."""

    def script(request: TurnRequest, _: int) -> AsyncIterator[Any]:
        asked = any(m.role == "tool" for m in request.messages) or not looks_up

        async def gen() -> AsyncIterator[Any]:
            if not asked:
                CALLS.append("turn with the tool call")
                yield tool_call("lookup", {"query": "q"}, call_id="call_1")
                return
            CALLS.append("answer")
            first = not outage.began.is_set()
            for i in range(41):
                if first and i == after:
                    await outage.begin()
                    if lasts_s is not None:
                        asyncio.get_running_loop().call_later(
                            lasts_s, lambda: asyncio.ensure_future(outage.end())
                        )
                if i < 40:
                    yield text(f"w{i} ")
                    await asyncio.sleep(0.05)

        return gen()

    return script


@contextlib.asynccontextmanager
async def own_database() -> AsyncIterator[tuple[psycopg.AsyncConnection[Any], str, str]]:
    """An admin connection (to the test database), a database of this test's own, and its URL."""
    admin = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True, connect_timeout=5)
    database = schema_name()
    await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    parts = urllib.parse.urlsplit(PG_URL)
    url = urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))
    try:
        yield admin, database, url
    finally:
        name = sql.Identifier(database)
        await admin.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(name))
        await admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        await admin.close()


def _config(wait_s: float, *, lease_ttl_s: float = 15.0) -> Config:
    return Config(
        durability=DurabilityConfig(store_outage_wait_s=wait_s),
        orchestration=OrchestrationConfig(lease_ttl_s=lease_ttl_s),
    )


@pytest.fixture(autouse=True)
def _clean() -> AsyncIterator[None] | Any:
    CALLS.clear()
    yield
    FAKE_SCRIPTS.pop("outage", None)


async def test_a_durable_run_waits_out_a_store_outage_and_continues_from_its_checkpoints(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="thoughtgate.durable")
    async with own_database() as (admin, database, url):
        outage = Outage(admin, database)
        FAKE_SCRIPTS["outage"] = outage_script(outage, lasts_s=2.0)
        store = await PostgresStore.open(url, schema="s", pool_wait_s=0.5)
        tools = ToolRegistry([lookup])
        async with InProcessDaemon.launched(store, _config(60), tools=tools, like="run") as daemon:
            run = await daemon.runtime.run(RunRequest("look", model="fake:outage"))
            assert outage.over.is_set()
            log = await store.read(run.run_id)
    assert run.status == "completed"
    # the turn with the tool call and the tool come back from their checkpoints: asked once;
    # the answer the outage cut is asked again (the last turn keeps no checkpoint, ADR 0029)
    assert CALLS == ["turn with the tool call", "tool q", "answer", "answer"]
    assert [e.seq for e in log] == list(range(1, len(log) + 1))  # no gap
    types = [e.type for e in log]
    assert EventType.RUN_FAILED not in types and types[-1] == EventType.RUN_SETTLEMENT_COMPLETED
    resumed = [e for e in log if e.type == EventType.RUN_RESUMED]
    assert len(resumed) == 1 and resumed[0].payload["reason"] == STORE_BACK
    for once in (EventType.RUN_STARTED, EventType.TASK_STARTED, EventType.TOOL_COMPLETED):
        assert types.count(once) == 1, once  # nothing recorded twice
    cut = types.index(EventType.RUN_RESUMED)
    answer = "".join(
        str(e.payload.get("text", "")) for e in log[cut:] if e.type == EventType.MESSAGE_DELTA
    )
    assert answer == "".join(f"w{i} " for i in range(40))
    said = [r.getMessage() for r in caplog.records if r.name == "thoughtgate.durable"]
    tries = [line for line in said if "its store is unavailable (" in line]
    assert tries and all("unreachable or the connection was lost" in line for line in tries)
    assert all("trying again in" in line and database in line for line in tries)
    assert any("its store answers again" in line for line in said)


async def test_an_outage_at_a_durable_runs_end_is_logged_as_waited_out_not_left_to_its_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The outage begins once the answer is recorded, so the run's end is the write it stops:
    the operator's log says the run waits for its store, not that it stays open until its
    lease expires (it does not: it continues here once the store answers)."""
    caplog.set_level(logging.WARNING)
    async with own_database() as (admin, database, url):
        outage = Outage(admin, database)
        # longer than the end's own retries (about 4 s), which a shorter outage ends within
        FAKE_SCRIPTS["outage"] = outage_script(outage, lasts_s=8.0, after=40)
        store = await PostgresStore.open(url, schema="s", pool_wait_s=0.5)
        tools = ToolRegistry([lookup])
        async with InProcessDaemon.launched(store, _config(60), tools=tools, like="run") as daemon:
            run = await daemon.runtime.run(RunRequest("look", model="fake:outage"))
    assert run.status == "completed" and outage.over.is_set()
    said = [r.getMessage() for r in caplog.records if r.name.startswith("thoughtgate")]
    assert not [line for line in said if "until its lease expires" in line], said
    assert any("its store answers again" in line for line in said), said


async def test_a_run_without_checkpoints_yet_continues_as_a_workflow_after_an_outage() -> None:
    """A run of one turn without tools executes without a workflow (ADR 0031): after the
    outage it continues as one, from its log, the cut answer asked again."""
    async with own_database() as (admin, database, url):
        outage = Outage(admin, database)
        FAKE_SCRIPTS["outage"] = outage_script(outage, lasts_s=2.0, looks_up=False)
        store = await PostgresStore.open(url, schema="s", pool_wait_s=0.5)
        async with InProcessDaemon.launched(store, _config(60), like="run") as daemon:
            run = await daemon.runtime.run(RunRequest("hi", model="fake:outage"))
            log = await store.read(run.run_id)
    assert run.status == "completed" and CALLS == ["answer", "answer"]
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    types = [e.type for e in log]
    assert EventType.RUN_FAILED not in types and types.count(EventType.TASK_STARTED) == 1
    resumed = [e for e in log if e.type == EventType.RUN_RESUMED]
    assert len(resumed) == 1 and resumed[0].payload["reason"] == STORE_BACK


async def test_a_store_outage_longer_than_the_wait_leaves_the_run_open_to_resume() -> None:
    """``thoughtgate run``'s process gives up on the store after the wait: the run is left open,
    nothing recorded of the failure, and ``thoughtgate resume`` (here a daemon's) continues it
    from its checkpoints."""
    config = _config(1, lease_ttl_s=1)
    async with own_database() as (admin, database, url):
        outage = Outage(admin, database)
        FAKE_SCRIPTS["outage"] = outage_script(outage, lasts_s=None)
        store = await PostgresStore.open(url, schema="s", pool_wait_s=0.5)
        tools = ToolRegistry([lookup])
        async with InProcessDaemon.launched(store, config, tools=tools, like="run") as daemon:
            created: list[str] = []
            request = RunRequest("look", model="fake:outage")
            running = asyncio.create_task(
                daemon.runtime.run(request, created=lambda r: created.append(r.run_id))
            )
            await outage.began.wait()

            async def given_up() -> bool:  # its execution here is over, the store still down
                return created[0] not in daemon.runtime.executing

            await until(given_up, timeout_s=60)
            # (DBOS records its workflow's end once its database answers: it waits for it)
            await outage.end()
            with pytest.raises(StoreUnavailableError) as raised:
                await running
            while True:  # the store's pool connects again after its own pause
                with contextlib.suppress(StoreUnavailableError):
                    run = await store.get_run(created[0])
                    break
            log = await store.read(created[0])
        again = await PostgresStore.open(url, schema="s", pool_wait_s=0.5)
        async with SweepingDaemon.launched(again, config, tools=tools) as resuming:

            async def suspended() -> bool:
                await resuming.manager.recover()  # its lease lapsed: suspended, to resume
                return (await again.get_run(created[0])).metadata.get("suspended") is not None

            await until(suspended, timeout_s=60)
            await resuming.manager.resume(created[0])
            await until(lambda: resuming.ended(created[0]), timeout_s=60)
            resumed = await again.get_run(created[0])
    assert resumed.status == "completed"
    assert CALLS == ["turn with the tool call", "tool q", "answer", "answer"]
    assert "stayed unavailable for more than 1 s" in str(raised.value)
    assert "left open and resumes from its checkpoints" in str(raised.value)
    assert store_outage(raised.value) is None  # not waited for again
    assert run.status == "running"  # open: neither failed nor ended
    types = [e.type for e in log]
    assert not {EventType.RUN_FAILED, EventType.RUN_ERROR, EventType.TASK_COMPLETED} & set(types)
