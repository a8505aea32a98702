"""DBOS's pollers that serve nothing thoughtgate uses are slowed when its engine launches
(ADR 0057), and only those: the daemon's own queue keeps its configured pace. DBOS's queue
manager reuses its list of queues once it holds every queue the process listens to (ADR 0067).

These pin the DBOS internals the saving relies on (``dbos`` 3.4): a DBOS that renames them fails
here, not in production, where it would only cost the saving.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, _queue, _workflow_commands
from dbos._dbos import _get_dbos_instance

from thoughtgate.config import Config, DurabilityConfig
from thoughtgate.orchestration.dbos_pollers import (
    INTERNAL_QUEUE_POLL_S,
    JOBS_INTERVAL_SQLITE_S,
    _ManagerList,
    reuse_queue_list,
    slow_unused_pollers,
)
from thoughtgate.orchestration.durable import DurableEngine
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.store.sqlite import SQLiteStore

pytestmark = pytest.mark.timeout(60)


@contextlib.asynccontextmanager
async def _launched_engine(tmp_path: Path) -> AsyncIterator[DurableEngine]:
    """A daemon's engine (its queue, no tools) launched on a SQLite store, closed after."""
    store = await SQLiteStore.open(tmp_path / "runs.db")
    config = Config(durability=DurabilityConfig(poll_interval_s=0.5))
    engine = DurableEngine.attach(Runtime(store, config), config.durability)
    try:
        await engine.launch(listen=[])
        yield engine
    finally:
        await engine.close()
        await store.close()


@pytest.mark.inprocess
async def test_a_launched_engine_slows_the_internal_queue_and_the_background_jobs_only(
    tmp_path: Path,
) -> None:
    async with _launched_engine(tmp_path) as engine:
        internal = _get_dbos_instance()._registry.get_internal_queue()
        assert internal._polling_interval_sec == INTERNAL_QUEUE_POLL_S
        assert _workflow_commands._BACKGROUND_JOBS_INTERVAL_SEC == JOBS_INTERVAL_SQLITE_S
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
async def test_a_launched_daemon_engine_has_the_queue_manager_reuse_its_list_and_serve_its_queue(
    tmp_path: Path,
) -> None:
    # dbos 3.4's queue manager reads the queues with ``list_queues`` (what the reuse hooks).
    assert "list_queues" in _queue.queue_thread.__code__.co_names
    async with _launched_engine(tmp_path) as engine:
        dbos = _get_dbos_instance()
        assert isinstance(dbos._sys_db.list_queues, _ManagerList)
        assert not reuse_queue_list()  # once per launch
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
