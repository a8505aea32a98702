"""Two replicas on PostgreSQL put back, once, a run a stopped replica took (ADR 0063).

The stopped replica is this test process: it admits a run for a queue only it listened to, takes
the run's workflow from that queue with DBOS's own dequeue statement under its executor id, and
stops DBOS before claiming the run -- as a replica killed between the two would leave it. Two
``thoughtgate serve`` replicas with the run's tools sweep the store: one of them puts the run
back on their queue, and it executes once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from dbos import DBOS
from support.daemon import PG_START_S
from support.durable import TOOLS, side_effects
from support.durable_engine import InProcessDaemon
from test_durable_replicas import two_replicas_on_postgres

from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.orchestration import dbos_private
from thoughtgate.orchestration.durable import APP_VERSION
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.store.leases import TAKEN_UNCLAIMED
from thoughtgate.store.urls import open_store

pytestmark = [
    pytest.mark.external,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(PG_START_S + 180),
]

ITS_QUEUE = "thoughtgate-runs-stopped-replica-c1"


async def _taken_by_a_stopped_replica(db: str) -> str:
    """A run this process (a replica with the run's tools) put on a queue of its own and took
    from it under its executor id, unclaimed: DBOS stops before the claim."""
    store = await open_store(db)
    async with InProcessDaemon.launched(store, Config(), tools=ToolRegistry(TOOLS)) as replica:
        await DBOS.register_queue_async(ITS_QUEUE, worker_concurrency=1, polling_interval_sec=60)
        run, rank = await replica.runtime.admit(
            RunRequest("do it", model="fake:durable"), tools=["side_effect"], queue=ITS_QUEUE
        )
        await replica.engine.enqueue(run.run_id, ITS_QUEUE, priority=rank)
        queue = await DBOS.retrieve_queue_async(ITS_QUEUE)
        assert queue is not None
        system = dbos_private.system_database()  # DBOS's own dequeue, as its queue worker runs it
        me = replica.runtime.leases.owner.owner_id
        taken, _ = await asyncio.to_thread(
            system.start_queued_workflows, queue, me, APP_VERSION, None
        )
        assert taken == [run.run_id]
        return run.run_id


def test_two_replicas_put_back_once_a_run_a_stopped_replica_took_and_it_completes(
    tmp_path: Path,
) -> None:
    with two_replicas_on_postgres(tmp_path) as (service, a, b):
        run_id = asyncio.run(_taken_by_a_stopped_replica(service.db))
        run = service.done(a, run_id)
        assert run["status"] == "completed"
        assert len(side_effects(service.effects)) == 1, "the tool ran exactly once"
        types = [e["type"] for e in service.events(b, run_id)]
        assert "run.resumed" not in types, "its first execution"
    put_back = [
        line
        for daemon in (a, b)
        for line in daemon.stderr_lines
        if run_id in line and TAKEN_UNCLAIMED in line
    ]
    assert len(put_back) == 1, put_back
