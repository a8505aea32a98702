"""A daemon's shutdown stops a durable run whose workflow DBOS started but whose first step had
not run yet (ADR 0090).

``RunManager.shutdown`` suspends the durable executions under way -- the runtime's workflow
tasks -- so that their runs stay open and resume elsewhere. A workflow is among them only once
its body runs (``Runtime.execute_workflow``); between DBOS starting it (a run started here at
once, or one DBOS's queue worker just took) and that moment it was not, and it went on to claim
and execute its run after the daemon had shut down, while the daemon closed its databases. The
moment is held here deterministically: the workflow's body waits on a gate the test opens once
the shutdown is over.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from test_cancelled_daemon_starts import _Daemon, _two_tasks, asked, sqlite_daemon

from thoughtgate.events.schema import RUN_TERMINAL_TYPES, EventType

__all__ = ["asked", "sqlite_daemon"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(120)


@pytest.mark.inprocess
async def test_a_run_whose_workflow_has_not_begun_at_shutdown_is_left_open_here(
    sqlite_daemon: _Daemon, asked: list[str]
) -> None:
    daemon = sqlite_daemon
    entered, gate = asyncio.Event(), asyncio.Event()
    body = daemon.runtime.execute_workflow

    async def begins_late(run_id: str, **kw: Any) -> str:
        entered.set()
        await gate.wait()
        return await body(run_id, **kw)

    daemon.runtime.execute_workflow = begins_late  # type: ignore[method-assign]
    run = await daemon.manager.start(_two_tasks())
    await entered.wait()  # DBOS started its workflow; its first step has not run
    started = daemon.engine._started[run.run_id]  # pyright: ignore[reportPrivateUsage]
    assert run.run_id not in daemon.runtime.executing

    await daemon.manager.shutdown()
    gate.set()
    with contextlib.suppress(BaseException):
        await started
    assert asked == [], "the model was never asked after the shutdown"
    types = await daemon.types(run.run_id)
    assert EventType.TASK_STARTED not in types, "nothing of it executed here"
    assert not any(t in RUN_TERMINAL_TYPES for t in types), "not ended: it resumes elsewhere"
    assert (await daemon.events.get_run(run.run_id)).status in ("pending", "running")
    assert run.run_id not in daemon.runtime.leases, "renewed no more: its lease runs out"
