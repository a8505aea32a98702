"""A run a replica took from its work queue executes even when that replica stopped (ADR 0063).

A replica takes a run's workflow from the shared queue (DBOS marks it ``PENDING`` under that
replica's executor id) and then claims the run in the store. A replica killed between the two
leaves the run with no owner, queued, and its workflow ``PENDING`` under an executor that will
never run it: DBOS recovers a ``PENDING`` workflow only for its own executor id at launch, and
ours are never reused. The sweep puts such a run back on a queue once it has been taken for a
lease without a claim -- one sweep of many. A replica killed after its claim leaves a run whose
lease expires; the lease sweep puts that one back on a queue, and its ``PENDING`` workflow with it.

The replica that stops is simulated in this process: DBOS's own dequeue statement, run with
another executor id, takes the workflow from a queue this daemon does not listen to.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from dbos import DBOS
from support.durable import until
from support.durable_engine import SweepingDaemon

from thoughtgate.config import Config
from thoughtgate.events.schema import RUN_TERMINAL_TYPES, EventType
from thoughtgate.orchestration import dbos_private
from thoughtgate.orchestration.durable import APP_VERSION
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.store.durable import RunSpecRecord
from thoughtgate.store.leases import Owner, close_orphaned_runs
from thoughtgate.store.sqlite import SQLiteStore

pytestmark = [pytest.mark.inprocess, pytest.mark.timeout(60)]

TTL_S = 1.0
STOPPED = "0123456789abcdef.4242.stoppedbefore"
"""The executor id (run-lease owner id) of a replica on another host, which stopped."""
ITS_QUEUE = "thoughtgate-runs-stopped-replica-c1"
"""The queue the stopped replica took runs from (this daemon does not listen to it)."""


class _Daemon(SweepingDaemon[SQLiteStore]):
    def __init__(self, store: SQLiteStore) -> None:
        super().__init__(
            store,
            Config.from_mapping(
                {"orchestration": {"lease_ttl_s": TTL_S}, "durability": {"poll_interval_s": 0.1}}
            ),
        )

    async def taken_by_the_stopped_replica(self) -> str:
        """A run queued on the stopped replica's queue, which that replica took and never
        claimed."""
        await DBOS.register_queue_async(ITS_QUEUE, worker_concurrency=1, polling_interval_sec=60)
        run, rank = await self.runtime.admit(RunRequest("hi", model="fake:echo"), queue=ITS_QUEUE)
        assert run.owner is None, "queued for another replica"
        await self.engine.enqueue(run.run_id, ITS_QUEUE, priority=rank)
        queue = await DBOS.retrieve_queue_async(ITS_QUEUE)
        assert queue is not None
        system = dbos_private.system_database()
        taken, _ = await asyncio.to_thread(
            system.start_queued_workflows, queue, STOPPED, APP_VERSION, None
        )
        assert taken == [run.run_id]
        status = await DBOS.get_workflow_status_async(run.run_id)
        assert status is not None and (status.status, status.executor_id) == ("PENDING", STOPPED)
        return run.run_id


def _endings(types: list[str]) -> int:
    return sum(t in RUN_TERMINAL_TYPES for t in types)


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[_Daemon]:
    store = await SQLiteStore.open(tmp_path / "runs.db")
    made = _Daemon(store)
    try:
        await made.launch()
        yield made
    finally:
        await made.close()


async def test_a_run_taken_by_a_replica_that_stopped_before_claiming_it_completes(
    daemon: _Daemon,
) -> None:
    run_id = await daemon.taken_by_the_stopped_replica()
    daemon.manager.start_sweeping()
    await until(lambda: daemon.ended(run_id))
    run = await daemon.store.get_run(run_id)
    assert run.status == "completed"
    assert run.owner == daemon.runtime.leases.owner.owner_id
    types = await daemon.types(run_id)
    assert _endings(types) == 1
    assert EventType.RUN_RESUMED not in types, "its first execution: nothing of it ran before"
    status = await DBOS.get_workflow_status_async(run_id)
    assert status is None or status.executor_id == daemon.runtime.leases.owner.owner_id


async def test_a_run_taken_and_claimed_by_a_replica_that_stopped_resumes(
    daemon: _Daemon,
) -> None:
    """The lease sweep's case (ADR 0013): the requeue puts the workflow, ``PENDING`` under the
    stopped executor, back on a queue -- it is not left there."""
    run_id = await daemon.taken_by_the_stopped_replica()
    assert await daemon.store.claim_run(run_id, STOPPED, TTL_S) == 1
    daemon.manager.start_sweeping()
    await until(lambda: daemon.ended(run_id))
    run = await daemon.store.get_run(run_id)
    assert run.status == "completed"
    events = await daemon.store.read(run_id)
    (resumed,) = [e for e in events if e.type == EventType.RUN_RESUMED]
    assert resumed.payload["previous_executor"] == STOPPED
    assert resumed.payload["attempt"] == 2
    assert _endings([e.type for e in events]) == 1


async def test_sweeps_at_once_put_such_a_run_back_on_a_queue_once(daemon: _Daemon) -> None:
    run_id = await daemon.taken_by_the_stopped_replica()
    requeued: list[str] = []

    async def requeue(run_id: str, spec: RunSpecRecord) -> None:
        requeued.append(run_id)
        await daemon.manager._requeue(run_id, spec)

    async def sweep(me: Owner, lost_after_s: float) -> list[str]:
        return await close_orphaned_runs(
            daemon.store,
            me=me,
            requeue=requeue,
            on_queue=daemon.engine.on_queue,
            lost_after_s=lost_after_s,
        )

    replicas = [Owner("0123456789abcdef", pid, "sweeping") for pid in (1, 2, 3)]
    # Taken moments ago: the replica that took it may be claiming it now.
    await sweep(replicas[0], 3600)
    assert requeued == []
    status = await DBOS.get_workflow_status_async(run_id)
    assert status is not None and status.executor_id == STOPPED

    async def taken_for_a_lease() -> bool:
        found = (await daemon.store.open_runs()).now
        spec = await daemon.store.get_run_spec(run_id)
        status = await DBOS.get_workflow_status_async(run_id)
        assert spec is not None and spec.queued_at is not None
        assert status is not None and status.dequeued_at is not None
        return min(found - spec.queued_at, found - status.dequeued_at / 1000) >= TTL_S

    await until(taken_for_a_lease)
    await asyncio.gather(*(sweep(me, TTL_S) for me in replicas))
    assert requeued == [run_id]
    await until(lambda: daemon.ended(run_id))
    assert (await daemon.store.get_run(run_id)).status == "completed"
    assert _endings(await daemon.types(run_id)) == 1
