"""A queued durable run that is on no work queue does not stay open (ADR 0062).

A queued run has no owner, so no lease of it expires: when what puts it on its queue fails and
its close fails too (the store unavailable past the retries of ADR 0059), only a sweep that asks
the engine which queued runs are on a queue can find it. Such a run is put back on a queue once
it has been queued for a lease, or closed when that fails; a run on a queue, one queued moments
ago, and a suspended run are left alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from support.durable import queued_run, until
from support.durable_engine import SweepingDaemon

from thoughtgate.config import Config
from thoughtgate.errors import RuntimeFailure, StoreUnavailableError
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.store.base import RunEnding
from thoughtgate.store.durable import RunQueueRecord, RunSpecRecord
from thoughtgate.store.leases import ON_NO_QUEUE, close_orphaned_runs
from thoughtgate.store.sqlite import SQLiteStore

pytestmark = [pytest.mark.inprocess, pytest.mark.timeout(60)]

TTL_S = 1.0


class RefusingEnds(SQLiteStore):
    """Refuses to record any run's end while ``refusing`` (a store down past the retries)."""

    refusing = False

    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        if self.refusing:
            raise StoreUnavailableError("database is locked")
        return await super().finish_run(run_id, events, ending)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RefusingEnds]:
    opened = await RefusingEnds.open(tmp_path / "runs.db")
    assert isinstance(opened, RefusingEnds)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_queued_run_whose_enqueue_and_close_failed_is_closed_within_about_a_lease(
    store: RefusingEnds,
) -> None:
    """The daemon's path: a run for another replica's queue, whose enqueue fails (no replica
    registered that queue with DBOS) and whose close the store refuses."""
    config = Config.from_mapping({"orchestration": {"lease_ttl_s": TTL_S}})
    daemon = SweepingDaemon(store, config)
    manager = daemon.manager
    try:
        await daemon.launch()
        # Another replica, with a tool this one lacks, said it takes runs from its queue.
        await store.save_run_queue(RunQueueRecord("elsewhere-queue", ("elsewhere",), 1))
        store.refusing = True
        with pytest.raises(RuntimeFailure, match="no work queue") as raised:
            await manager.start(RunRequest("hi", model="fake:echo"), tools=["elsewhere"])
        # The caller learns why the run did not start; the close that failed too is noted.
        (note,) = raised.value.__notes__
        assert "failed too" in note and "database is locked" in note
        (stuck,) = (await store.open_runs()).runs
        assert stuck.owner is None, "queued: no lease of it will ever expire"
        store.refusing = False  # the store is back
        manager.start_sweeping()

        async def closed() -> bool:
            return (await store.get_run(stuck.run_id)).status == "interrupted"

        await until(closed)
        run = await store.get_run(stuck.run_id)
        assert run.error is not None and ON_NO_QUEUE in run.error
        log = [e.type for e in await store.read(stuck.run_id)]
        assert log.count(EventType.RUN_INTERRUPTED) == 1
    finally:
        await daemon.stop()


async def test_the_sweep_requeues_only_a_queued_run_on_no_queue_for_a_lease(
    store: RefusingEnds,
) -> None:
    lost, waiting, suspended = [await queued_run(store) for _ in range(3)]
    # Executed by a process that stopped, and released for ``thoughtgate resume``.
    await store.claim_run(suspended, "someone", 60)
    assert await store.release_run(suspended, owner="someone", queue=False)
    requeued: list[str] = []
    asked: list[set[str]] = []

    async def requeue(run_id: str, spec: RunSpecRecord) -> None:
        assert spec.queue == "q"
        requeued.append(run_id)

    async def on_queue(run_ids: Sequence[str]) -> dict[str, float | None]:
        asked.append(set(run_ids))
        return {waiting: None}

    # Queued moments ago: its enqueue may be under way, so it is left on no queue (the engine
    # is asked all the same: a workflow that ended is put back at once, ADR 0065).
    assert (
        await close_orphaned_runs(store, requeue=requeue, on_queue=on_queue, lost_after_s=3600)
        == []
    )
    assert requeued == []
    assert (
        await close_orphaned_runs(store, requeue=requeue, on_queue=on_queue, lost_after_s=0) == []
    )
    assert requeued == [lost]
    # Asked about the queued runs only: a suspended run is on no queue (ADR 0066).
    assert asked == [{lost, waiting}, {lost, waiting}]
    for run_id in (lost, waiting, suspended):
        assert (await store.get_run(run_id)).status in ("pending", "running")


async def test_a_queued_run_on_no_queue_that_cannot_be_requeued_is_closed(
    store: RefusingEnds, caplog: pytest.LogCaptureFixture
) -> None:
    lost = await queued_run(store)

    async def requeue(run_id: str, spec: RunSpecRecord) -> None:
        raise RuntimeError("no work queue 'q' is registered")

    async def on_queue(run_ids: Sequence[str]) -> dict[str, float | None]:
        return {}

    store.refusing = True  # the close fails: the next sweep tries again
    with pytest.raises(StoreUnavailableError):
        await close_orphaned_runs(store, requeue=requeue, on_queue=on_queue, lost_after_s=0)
    assert (await store.get_run(lost)).status in ("pending", "running")
    store.refusing = False
    assert await close_orphaned_runs(store, requeue=requeue, on_queue=on_queue, lost_after_s=0) == [
        lost
    ]
    run = await store.get_run(lost)
    assert run.status == "interrupted" and run.error is not None
    # The public reason names the failure by its class; its words are not thoughtgate's, so
    # they go to the daemon's log only (ADR 0071).
    assert ON_NO_QUEUE in run.error and "RuntimeError" in run.error
    assert "no work queue 'q'" not in run.error
    assert "no work queue 'q' is registered" in caplog.text
