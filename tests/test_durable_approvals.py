"""An approval's timeout runs from the request across a restart, with the real engine -- also when
the process stopped after the run's log recorded the request but before the engine recorded the
wait's deadline (they are two databases: the store, and DBOS's beside it).

The crash is deterministic: the first process's wait never begins (``receive`` is held), the run
is stopped there and left open like a daemon shutting down leaves it, and a fresh engine on the
same SQLite files resumes it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.durable import HOLD, SIDE_EFFECTS, TOOLS, side_effects
from support.durable_engine import InProcessDaemon

from thoughtgate.config import Config, DurabilityConfig, OrchestrationConfig
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.events.schema import Event, EventType
from thoughtgate.orchestration.runtime import SUSPENDED, RunRequest
from thoughtgate.store.leases import Owner, close_orphaned_runs
from thoughtgate.store.sqlite import SQLiteStore

pytestmark = [pytest.mark.timeout(60), pytest.mark.inprocess]

TIMEOUT_S = 3.0


class _Process(InProcessDaemon[SQLiteStore]):
    """One daemon's runtime and engine on the run store at ``path``."""

    def __init__(self, store: SQLiteStore) -> None:
        config = Config(
            orchestration=OrchestrationConfig(approval_timeout_s=TIMEOUT_S),
            durability=DurabilityConfig(poll_interval_s=0.1),
        )
        super().__init__(store, config, tools=ToolRegistry(TOOLS))

    @classmethod
    async def started(cls, path: Path) -> _Process:
        process = cls(await SQLiteStore.open(path))
        await process.launch()
        return process


@pytest.mark.parametrize("down_s", [1.0, TIMEOUT_S], ids=["part-of-it", "all-of-it"])
async def test_an_approval_whose_deadline_was_never_recorded_still_times_out_from_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, down_s: float
) -> None:
    """``down_s``: how much of the timeout passes while the run is between processes."""
    effects = tmp_path / "effects"
    monkeypatch.setenv(SIDE_EFFECTS, str(effects))
    monkeypatch.delenv(HOLD, raising=False)
    first = await _Process.started(tmp_path / "runs.db")
    in_window = asyncio.Event()

    async def stopped_before_the_deadline(topic: str, timeout_s: float) -> Any:
        in_window.set()
        await asyncio.Event().wait()  # the process dies here: no deadline is ever recorded

    try:
        monkeypatch.setattr(first.engine, "receive", stopped_before_the_deadline)
        run, rank = await first.runtime.admit(
            RunRequest("guarded go", model="fake:durable"), queue=first.queue
        )
        run_id = run.run_id
        await first.engine.submit(run_id, first.queue, priority=rank)
        await asyncio.wait_for(in_window.wait(), 20)
        asked = _first(await first.store.read(run_id), EventType.TOOL_APPROVAL_REQUIRED)
        await asyncio.sleep(max(0.0, asked.ts + down_s - time.time()))
        stopped_at = time.time()
        assert first.runtime.cancel(run_id, SUSPENDED)
        await _until(lambda: _is_empty(first.runtime.executing))
        await first.store.renew_leases(first.runtime.leases.owner.owner_id, 0.0, [run_id])
    finally:
        await first.close()

    second = await _Process.started(tmp_path / "runs.db")
    waits: list[float] = []
    receive = second.engine.receive

    async def noted(topic: str, timeout_s: float) -> Any:
        waits.append(timeout_s)
        return await receive(topic, timeout_s)

    try:
        monkeypatch.setattr(second.engine, "receive", noted)
        me = second.runtime.leases.owner
        restarted = Owner(me.host, me.pid, "restarted")

        async def requeue(run_id: str, _: object) -> None:
            await second.engine.resume(run_id, second.queue)

        assert await close_orphaned_runs(second.store, me=restarted, requeue=requeue) == []
        await _until(lambda: _ended(second.store, run_id), timeout_s=30.0)
        assert (await second.store.get_run(run_id)).status == "completed"
        log = await second.store.read(run_id)
        expired = _first(log, EventType.TOOL_APPROVAL_TIMEOUT)
        assert expired.ts - asked.ts >= TIMEOUT_S, "it waits out the whole timeout"
        # Run from the resume, the wait would be a whole TIMEOUT_S; run from the request, it is
        # at most what was left when the first process stopped (nothing, when nothing was left).
        # The wait's length is asserted, not when it ended: a loaded machine ends it late.
        left = max(0.0, asked.ts + TIMEOUT_S - stopped_at)
        assert len(waits) == 1 and waits[0] <= left, (waits, left)
        assert side_effects(effects) == [], "an expired approval runs nothing"
    finally:
        await second.close()


def _first(log: list[Event], event_type: str) -> Event:
    return next(e for e in log if e.type == event_type)


async def _is_empty(items: frozenset[str]) -> bool:
    return not items


async def _ended(store: SQLiteStore, run_id: str) -> bool:
    return (await store.get_run(run_id)).status not in ("pending", "running")


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)
