"""DBOS's pollers that serve nothing thoughtgate uses are slowed when its engine launches
(ADR 0057), and only those: the daemon's own queue keeps its configured pace. DBOS's queue
manager reuses its list of queues once it holds every queue the process listens to (ADR 0067).
On PostgreSQL the background jobs run without their lock, so no process idles in a transaction
between them; the queue worker's question whether this is the latest application version is
answered from a kept answer for a while (ADR 0075).

These pin the DBOS internals the saving relies on (``dbos`` 3.4): a DBOS that renames them fails
here, not in production, where it would only cost the saving.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from dbos import DBOS, _queue, _workflow_commands
from dbos._sys_db import SystemDatabase
from dbos._sys_db_postgres import PostgresSystemDatabase
from psycopg import sql
from support.durable_engine import InProcessDaemon
from support.pg import PG_URL, schema_name

from thoughtgate.config import Config, DurabilityConfig
from thoughtgate.orchestration import dbos_private
from thoughtgate.orchestration.dbos_pollers import (
    INTERNAL_QUEUE_POLL_S,
    JOBS_INTERVAL_S,
    PSYCOPG_WAIT_STEP_S,
    WORKFLOWS_APPLICATION_NAME,
    _every_process_runs_the_jobs,
    _jobs_run_without_their_lock,
    _KeptAnswer,
    _ManagerList,
    _step_rarely,
    reuse_latest_version,
    reuse_queue_list,
    slow_unused_pollers,
    wake_rarely,
)
from thoughtgate.orchestration.durable import DurableEngine
from thoughtgate.store.base import EventStore
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def _launched_engine(
    tmp_path: Path, store: EventStore | None = None
) -> AsyncIterator[DurableEngine]:
    """A daemon's engine (its queue, no tools) launched on ``store`` (a SQLite one by default),
    closed after, with the store."""
    store = store or await SQLiteStore.open(tmp_path / "runs.db")
    config = Config(durability=DurabilityConfig(poll_interval_s=0.5))
    async with InProcessDaemon.launched(store, config) as daemon:
        yield daemon.engine


@pytest.mark.inprocess
async def test_a_launched_engine_slows_the_internal_queue_and_the_background_jobs_only(
    tmp_path: Path,
) -> None:
    async with _launched_engine(tmp_path) as engine:
        internal = dbos_private.instance()._registry.get_internal_queue()
        assert internal._polling_interval_sec == INTERNAL_QUEUE_POLL_S
        assert _workflow_commands._BACKGROUND_JOBS_INTERVAL_SEC == JOBS_INTERVAL_S
        assert engine.queue is not None
        found = await DBOS.retrieve_queue_async(engine.queue)
        assert found is not None and found.polling_interval_sec == 0.5
        assert slow_unused_pollers(postgres=False) == ["background jobs", "internal queue"]


@dataclass(frozen=True)
class _Queue:
    name: str


class _Reads:
    """A ``list_queues`` that counts its reads and answers what it is told to."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.count = 0

    def __call__(self, **_: Any) -> list[Any]:
        self.count += 1
        return [_Queue(name) for name in self.names]


def _as_manager(listing: _ManagerList) -> list[Any]:
    return listing(application_name="thoughtgate")


def _listing(reads: _Reads, reuse_s: float = 3600.0) -> _ManagerList:
    """The reuse for a process listening to ``ours``, with ``_as_manager`` as its manager."""
    return _ManagerList(reads, _as_manager.__code__, lambda: ["ours"], reuse_s=reuse_s)


@pytest.mark.unit
def test_the_queue_manager_reuses_a_list_that_holds_every_listened_queue() -> None:
    reads = _Reads("ours", "another")
    listing = _listing(reads)
    first = _as_manager(listing)
    again = _as_manager(listing)
    assert reads.count == 1
    assert [q.name for q in again] == [q.name for q in first] == ["ours", "another"]


@pytest.mark.unit
def test_the_queue_manager_reads_again_while_a_listened_queue_is_missing() -> None:
    reads = _Reads("another")
    listing = _listing(reads)
    _as_manager(listing)
    reads.names.append("ours")  # the daemon registers its queue after the launch
    assert [q.name for q in _as_manager(listing)] == ["another", "ours"]
    _as_manager(listing)
    assert reads.count == 2


@pytest.mark.unit
def test_the_queue_manager_reads_again_once_its_list_is_older_than_the_reuse() -> None:
    reads = _Reads("ours")
    listing = _listing(reads, reuse_s=0.0)
    _as_manager(listing)
    _as_manager(listing)
    assert reads.count == 2


@pytest.mark.unit
def test_every_other_caller_of_list_queues_reads_the_database() -> None:
    reads = _Reads("ours")
    listing = _listing(reads)
    _as_manager(listing)
    listing(application_name="thoughtgate")
    listing()
    assert reads.count == 3


@pytest.mark.inprocess
async def test_a_launched_daemon_engine_reuses_its_queue_list_and_version_and_serves_its_queue(
    tmp_path: Path,
) -> None:
    # dbos 3.4's queue manager reads the queues with ``list_queues`` (what the reuse hooks).
    assert "list_queues" in _queue.queue_thread.__code__.co_names
    async with _launched_engine(tmp_path) as engine:
        dbos = dbos_private.instance()
        assert isinstance(dbos._sys_db.list_queues, _ManagerList)
        assert not reuse_queue_list()  # once per launch
        # dbos 3.4's dequeue asks ``_is_latest_version`` (what the kept answer hooks).
        assert "_is_latest_version" in SystemDatabase.start_queued_workflows.__code__.co_names
        assert isinstance(dbos._sys_db._is_latest_version, _KeptAnswer)
        assert not reuse_latest_version()  # once per launch
        assert engine.queue is not None
        # The queue registered after the launch still gets its worker from the manager.
        worker = f"queue-worker-{engine.queue}"
        for _ in range(200):
            if any(t.name == worker and t.is_alive() for t in threading.enumerate()):
                break
            await asyncio.sleep(0.05)
        assert any(t.name == worker and t.is_alive() for t in threading.enumerate())
        # Anyone else still reads the database: a queue registered now is listed at once.
        await DBOS.register_queue_async("later", worker_concurrency=1)
        assert "later" in {q.name for q in dbos._sys_db.list_queues()}


class _Versions:
    """An ``_is_latest_version`` that counts its reads and answers what it is told to."""

    def __init__(self) -> None:
        self.latest = True
        self.reads: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any) -> bool:
        self.reads.append(args)
        return self.latest


@pytest.mark.unit
def test_the_latest_version_answer_is_kept_per_version_for_a_while() -> None:
    versions = _Versions()
    kept = _KeptAnswer(versions, reuse_s=3600.0)
    assert kept("v2", "connection")
    versions.latest = False  # a newer version registered: seen once the answer is old
    assert kept("v2")
    assert not kept("v1")
    assert versions.reads == [("v2", "connection"), ("v1",)]


@pytest.mark.unit
def test_the_latest_version_is_read_again_once_the_answer_is_older_than_the_reuse() -> None:
    versions = _Versions()
    kept = _KeptAnswer(versions, reuse_s=0.0)
    assert kept("v2")
    versions.latest = False
    assert not kept("v2")
    assert len(versions.reads) == 2


@pytest.mark.unit
def test_postgres_background_jobs_run_without_their_lock() -> None:
    # dbos 3.4's lock (an advisory lock held in an idle transaction) is recognised and replaced;
    # a DBOS whose lock is not recognised keeps it, and fails here.
    assert _jobs_run_without_their_lock()
    assert PostgresSystemDatabase.background_job_lock is _every_process_runs_the_jobs
    with PostgresSystemDatabase.background_job_lock(None, "background_jobs") as granted:
        assert granted
    assert _jobs_run_without_their_lock()  # a second launch in the process finds it done


@pytest.mark.unit
def test_psycopg_waits_in_steps_that_dbos_connections_can_lengthen() -> None:
    # psycopg 3.3's blocking waits look up every ``interval`` (0.1 s), ``notifies`` through them.
    assert wake_rarely()
    assert wake_rarely()  # installed once


@pytest.mark.external
@pytest.mark.postgres
def test_only_the_workflows_engine_s_connections_wait_in_long_steps() -> None:
    """An application embedding thoughtgate may have SQLAlchemy connections of its own: their
    blocking waits keep psycopg's short step (a signal is seen within 0.1 s), only DBOS's
    engine's, which thoughtgate names, get the long one."""
    with (
        psycopg.connect(PG_URL, application_name=WORKFLOWS_APPLICATION_NAME) as ours,
        psycopg.connect(PG_URL, application_name="someone-else") as theirs,
        psycopg.connect(PG_URL) as unnamed,
    ):
        for conn in (ours, theirs, unnamed):
            _step_rarely(conn, None)
        assert ours.wait.keywords["interval"] == PSYCOPG_WAIT_STEP_S  # type: ignore[attr-defined]
        assert "wait" not in vars(theirs) and "wait" not in vars(unnamed)


def _jobs_lock_holders(workflows_schema: str) -> int:
    """Sessions holding the background jobs' advisory lock of ``workflows_schema`` (dbos 3.4 keys
    it by the leading 8 bytes of a SHA-256 of its name; PostgreSQL shows a bigint key as two
    32-bit halves)."""
    name = f"dbos.background_job.{workflows_schema}.thoughtgate.background_jobs"
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
            " AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND granted",
            (key >> 32, key & 0xFFFFFFFF),
        ).fetchone()
    return 0 if row is None else int(row[0])


@pytest.mark.external
@pytest.mark.postgres
@pytest.mark.timeout(300)
async def test_a_launched_postgres_engine_holds_no_jobs_lock_and_listens_without_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The jobs' lock was held in an idle transaction, which every ``CREATE INDEX CONCURRENTLY``
    of the database waits for (ADR 0075): the jobs run, and nothing is held between them. DBOS's
    notification listener waits on its connection in long steps, not ten times a second."""
    schema = schema_name()
    jobs_ran = threading.Event()
    transition = PostgresSystemDatabase.transition_delayed_workflows

    def noted(self: PostgresSystemDatabase) -> None:
        transition(self)
        jobs_ran.set()

    monkeypatch.setattr(PostgresSystemDatabase, "transition_delayed_workflows", noted)
    try:
        store = await PostgresStore.open(PG_URL, schema=schema)
        async with _launched_engine(tmp_path, store):
            jobs = [t for t in threading.enumerate() if t.name == "dbos-background-jobs"]
            assert jobs and jobs[0].is_alive()
            # The jobs' first round, which begins at the launch, has run: a lock it took would be
            # held now, for the rest of its interval.
            assert await asyncio.to_thread(jobs_ran.wait, 30.0)
            assert _jobs_lock_holders(f"{schema}_workflows") == 0
            assert _workflow_commands._BACKGROUND_JOBS_INTERVAL_SEC == JOBS_INTERVAL_S
            sys_db = dbos_private.system_database()
            await _until_set(lambda: sys_db.notification_conn)  # the listener's thread opens it
            listening = sys_db.notification_conn
            assert listening.dbapi_connection.wait.keywords["interval"] == PSYCOPG_WAIT_STEP_S
            name = listening.dbapi_connection.info.get_parameters()["application_name"]
            assert name == WORKFLOWS_APPLICATION_NAME
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            for name in (schema, f"{schema}_workflows"):
                admin.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )


async def _until_set(value: Callable[[], object], timeout_s: float = 30.0) -> None:
    """Until ``value()`` is not ``None`` (another thread sets it), or fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while value() is None:
        assert asyncio.get_running_loop().time() < deadline, "never set"
        await asyncio.sleep(0.01)
