"""DBOS's pollers that serve nothing thoughtgate uses are slowed when its engine launches
(ADR 0057), and only those: the daemon's own queue keeps its configured pace.

These pin the DBOS internals the saving relies on (``dbos`` 3.4): a DBOS that renames them fails
here, not in production, where it would only cost the saving.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dbos import DBOS, _workflow_commands
from dbos._dbos import _get_dbos_instance

from thoughtgate.config import Config, DurabilityConfig
from thoughtgate.orchestration.dbos_pollers import (
    INTERNAL_QUEUE_POLL_S,
    JOBS_INTERVAL_SQLITE_S,
    slow_unused_pollers,
)
from thoughtgate.orchestration.durable import DurableEngine
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.store.sqlite import SQLiteStore

pytestmark = pytest.mark.timeout(60)


@pytest.mark.inprocess
async def test_a_launched_engine_slows_the_internal_queue_and_the_background_jobs_only(
    tmp_path: Path,
) -> None:
    store = await SQLiteStore.open(tmp_path / "runs.db")
    config = Config(durability=DurabilityConfig(poll_interval_s=0.5))
    runtime = Runtime(store, config)
    engine = DurableEngine.attach(runtime, config.durability)
    try:
        await engine.launch(listen=[])
        internal = _get_dbos_instance()._registry.get_internal_queue()
        assert internal._polling_interval_sec == INTERNAL_QUEUE_POLL_S
        assert _workflow_commands._BACKGROUND_JOBS_INTERVAL_SEC == JOBS_INTERVAL_SQLITE_S
        assert engine.queue is not None
        found = await DBOS.retrieve_queue_async(engine.queue)
        assert found is not None and found.polling_interval_sec == 0.5
        assert slow_unused_pollers(postgres=False) == ["background jobs", "internal queue"]
    finally:
        await engine.close()
        await store.close()
