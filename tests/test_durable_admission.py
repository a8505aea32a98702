"""How a daemon admits and starts its durable runs (ADR 0031), with the real engine.

* A run the daemon starts at once is claimed by its admission; one of a single model task without
  tools executes its first execution without a DBOS workflow (nothing in it needs a checkpoint).
* Runs beyond the daemon's concurrency wait in the daemon, held by it, and start as slots free;
  they go on the queue when the daemon stops starting runs (it is shutting down).
* A run admitted by a process that stopped before it began is put on the queue by the lease sweep
  and completes -- its workflow is written then.
* An execution without a workflow that needs a checkpoint after all continues as a workflow.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS
from support.durable import one_lookup, until
from support.durable_engine import InProcessDaemon

import thoughtgate.orchestration.durable as durable_module
from thoughtgate.config import Config, DurabilityConfig
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.leases import UNWRITTEN, Owner, close_orphaned_runs
from thoughtgate.store.records import RunRecord
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, text

pytestmark = [pytest.mark.timeout(60), pytest.mark.inprocess]


def _slow(request: TurnRequest, _: int) -> AsyncIterator[Any]:
    async def gen() -> AsyncIterator[Any]:
        await asyncio.sleep(0.2)
        yield text("done")

    return gen()


@pytest.fixture
def scripts() -> Iterator[None]:
    FAKE_SCRIPTS["admit-slow"] = _slow
    FAKE_SCRIPTS["unasked-tool"] = one_lookup  # a tool nobody offered
    yield
    del FAKE_SCRIPTS["admit-slow"], FAKE_SCRIPTS["unasked-tool"]


async def _daemon(tmp_path: Path, **durability: Any) -> InProcessDaemon:
    store = await SQLiteStore.open(tmp_path / "runs.db")
    daemon = InProcessDaemon(store, Config(durability=DurabilityConfig(**durability)))
    await daemon.launch()
    return daemon


async def test_a_run_started_at_once_is_claimed_by_its_admission_and_writes_no_workflow(
    tmp_path: Path,
) -> None:
    daemon = await _daemon(tmp_path)
    try:
        run_id = await daemon.start("fake:echo")
        spec = await daemon.store.get_run_spec(run_id)
        assert spec is not None and spec.attempts == 1 and spec.queued_at is None
        run = await daemon.store.get_run(run_id)
        assert run.owner == daemon.runtime.leases.owner.owner_id
        await until(lambda: _ended(daemon, [run_id]))
        assert (await daemon.store.get_run(run_id)).status == "completed"
        assert await DBOS.get_workflow_status_async(run_id) is None
        assert "run.resumed" not in await daemon.types(run_id)
        spec = await daemon.store.get_run_spec(run_id)
        assert spec is not None and spec.attempts == 1, "claimed once, by its admission"
    finally:
        await daemon.close()


async def test_runs_beyond_the_concurrency_wait_in_the_daemon_and_all_complete(
    tmp_path: Path, scripts: None
) -> None:
    """With a queue polled once a minute, a run that waited on it would outlast the test."""
    daemon = await _daemon(tmp_path, concurrency=2, poll_interval_s=60.0)
    try:
        runs = [await daemon.start("fake:admit-slow") for _ in range(5)]
        most = 0
        while not await _ended(daemon, runs):
            most = max(most, len(daemon.runtime.executing))
            await asyncio.sleep(0.005)
        assert 1 <= most <= 2
        assert [(await daemon.store.get_run(r)).status for r in runs] == ["completed"] * 5
        for run_id in runs:
            assert await DBOS.get_workflow_status_async(run_id) is None
            assert "run.resumed" not in await daemon.types(run_id)
        assert daemon.engine.starts is not None and not daemon.engine.starts.waiting
    finally:
        await daemon.close()


async def test_a_daemon_that_stops_starting_puts_the_runs_waiting_in_it_on_the_queue(
    tmp_path: Path, scripts: None
) -> None:
    """Any replica may take them there (or this daemon's restart), at once."""
    daemon = await _daemon(tmp_path, concurrency=1, poll_interval_s=60.0)
    try:
        first, *waiting = [await daemon.start("fake:admit-slow") for _ in range(3)]
        await daemon.engine.stop_starting()
        for run_id in waiting:
            status = await DBOS.get_workflow_status_async(run_id)
            assert status is not None and status.status == "ENQUEUED"
            spec = await daemon.store.get_run_spec(run_id)
            assert spec is not None and spec.queued_at is not None and spec.attempts == 0
            assert (await daemon.store.get_run(run_id)).owner is None
        await until(lambda: _ended(daemon, [first]))
        assert await DBOS.get_workflow_status_async(first) is None
        assert [(await daemon.store.get_run(r)).status for r in waiting] == ["pending"] * 2
    finally:
        await daemon.close()


async def test_a_run_whose_process_stopped_between_its_admission_and_its_start_completes(
    tmp_path: Path,
) -> None:
    """Its admission claimed it; the lease sweep finds its process gone and puts it on the
    queue, where no workflow of it exists yet: it gets one, and resumes."""
    daemon = await _daemon(tmp_path, poll_interval_s=0.1)
    try:
        run, _ = await daemon.runtime.admit(RunRequest("hi", model="fake:echo"), queue=daemon.queue)
        daemon.engine.unreserve(run.run_id)  # it never starts here: as if the process stopped
        daemon.runtime.forget_admitted(run.run_id)
        me = daemon.runtime.leases.owner
        restarted = Owner(me.host, me.pid, "restarted")

        async def requeue(run_id: str, _: object) -> None:
            await daemon.engine.resume(run_id, daemon.queue)

        assert await close_orphaned_runs(daemon.store, me=restarted, requeue=requeue) == []
        await until(lambda: _ended(daemon, [run.run_id]))
        assert (await daemon.store.get_run(run.run_id)).status == "completed"
        assert (await daemon.types(run.run_id)).count("run.resumed") == 1
    finally:
        await daemon.close()


async def test_an_execution_without_a_workflow_that_needs_a_checkpoint_continues_as_one(
    tmp_path: Path, scripts: None
) -> None:
    daemon = await _daemon(tmp_path)
    try:
        run_id = await daemon.start("fake:unasked-tool")
        await until(lambda: _ended(daemon, [run_id]))
        run = await daemon.store.get_run(run_id)
        assert run.status == "completed" and run.tasks[0].output == "the answer"
        events = await daemon.store.read(run_id)
        resumed = [e for e in events if e.type == "run.resumed"]
        assert len(resumed) == 1 and resumed[0].payload["reason"] == UNWRITTEN
        status = await DBOS.get_workflow_status_async(run_id)
        assert status is not None and status.status == "SUCCESS"
        steps = await DBOS.list_workflow_steps_async(run_id)
        assert [s["function_name"].split(": ", 1)[1] for s in steps][:1] == ["model turn 0"]
    finally:
        await daemon.close()


async def test_a_run_taken_over_before_it_continues_as_a_workflow_is_left_to_its_holder(
    tmp_path: Path, scripts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0094: the daemon stalls after its execution without a workflow stopped for a
    checkpoint and before it records why the run waits (``suspended``); meanwhile the run was
    released and another process claimed it. On waking, its record is refused: nothing of it
    lands on the run the other process executes, no workflow is written here for it, and the
    run is neither closed nor suspended."""
    daemon = await _daemon(tmp_path)
    stalled, woken = asyncio.Event(), asyncio.Event()
    record = durable_module.suspend

    async def stalling(*args: Any, **kw: Any) -> None:
        stalled.set()
        await woken.wait()
        await record(*args, **kw)

    monkeypatch.setattr(durable_module, "suspend", stalling)
    try:
        run_id = await daemon.start("fake:unasked-tool")
        await stalled.wait()
        me = daemon.runtime.leases.owner.owner_id
        assert await daemon.store.release_run(run_id, owner=me, queue=True)
        assert await daemon.store.claim_run(run_id, "elsewhere", 60) == 2
        woken.set()

        async def idle() -> bool:
            return not daemon.engine.busy

        await until(idle)
        run = await daemon.store.get_run(run_id)
        assert (run.status, run.owner) == ("running", "elsewhere")
        assert run.metadata.get("suspended") is None, "nothing of this daemon's lands"
        assert await DBOS.get_workflow_status_async(run_id) is None, "no workflow here"
    finally:
        await daemon.close()


async def test_a_run_that_cannot_continue_as_a_workflow_is_closed_not_left_open(
    tmp_path: Path, scripts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its daemon holds it, so no lease sweep of a live daemon would ever take it."""
    daemon = await _daemon(tmp_path)

    async def refused(run_id: str) -> asyncio.Future[Any]:
        raise RuntimeError("the workflows database is gone")

    try:
        monkeypatch.setattr(daemon.engine, "start", refused)
        run_id = await daemon.start("fake:unasked-tool")
        await until(lambda: _ended(daemon, [run_id]))
        run = await daemon.store.get_run(run_id)
        assert run.status == "interrupted"
        assert "could not continue as a workflow" in (run.error or "")
    finally:
        await daemon.close()


async def test_a_run_taken_back_before_its_workflow_starts_is_left_to_the_later_claim(
    tmp_path: Path, scripts: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0099: the daemon's execution without a workflow (attempt 1) stopped for a
    checkpoint and recorded why; the daemon stalls before the run's workflow starts, a sweep
    releases the run to its queue and this daemon's own queue takes it back (attempt 2, the
    same owner id). Its start then finds that workflow there and fails: the close of the run
    that could not continue names the execution that stopped and is refused; the run stays
    the later claim's."""
    daemon = await _daemon(tmp_path)
    me = daemon.runtime.leases.owner.owner_id

    async def taken_back(run_id: str) -> asyncio.Future[Any]:
        assert await daemon.store.release_run(run_id, owner=me, queue=True)
        assert await daemon.store.claim_run(run_id, me, 60) == 2
        raise RuntimeError(f"run {run_id!r} did not start in this process")

    try:
        run_id, run = await _continued_with(daemon, monkeypatch, taken_back)
        assert (run.status, run.owner) == ("running", me), "the later claim's"
        assert "run.interrupted" not in await daemon.types(run_id)
    finally:
        await daemon.close()


@pytest.mark.parametrize("taken_back", [False, True], ids=["failed", "taken back meanwhile"])
async def test_a_run_whose_continued_workflow_failed_is_closed_at_the_attempt_it_held(
    tmp_path: Path, scripts: None, monkeypatch: pytest.MonkeyPatch, taken_back: bool
) -> None:
    """ADR 0112: the daemon's execution without a workflow (attempt 1) stopped for a checkpoint;
    the run's workflow started here, claimed it (attempt 2) and failed before its execution could
    end it. The run is closed ``interrupted`` -- its daemon holds it and nothing executes it --
    at the attempt it was left at. Unless, meanwhile, this process stalled past a lease, a sweep
    released the run and this process's own queue took it back (attempt 3, the same owner id):
    that later execution holds it, and the close is not its to make (before: closed by the owner
    alone, ending the run under the later execution)."""
    daemon = await _daemon(tmp_path)
    me = daemon.runtime.leases.owner.owner_id

    async def fails(run_id: str) -> asyncio.Future[Any]:
        assert await daemon.store.claim_run(run_id, me, 60) == 2  # the workflow's claim
        if taken_back:
            assert await daemon.store.release_run(run_id, owner=me, queue=True)
            assert await daemon.store.claim_run(run_id, me, 60) == 3
        failed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        failed.set_exception(RuntimeError("the workflow failed before its run's end"))
        return failed

    try:
        run_id, run = await _continued_with(daemon, monkeypatch, fails)
        if taken_back:
            assert (run.status, run.owner) == ("running", me), "the later claim's"
            assert "run.interrupted" not in await daemon.types(run_id)
        else:
            assert run.status == "interrupted"
            assert "could not continue as a workflow" in (run.error or "")
    finally:
        await daemon.close()


async def _continued_with(
    daemon: InProcessDaemon,
    monkeypatch: pytest.MonkeyPatch,
    start: Callable[[str], Awaitable[asyncio.Future[Any]]],
) -> tuple[str, RunRecord]:
    """A run whose execution without a workflow stops for a checkpoint, continued by ``start``
    in place of the engine's start of its workflow; its id and its record once the daemon has
    nothing under way."""
    monkeypatch.setattr(daemon.engine, "start", start)
    run_id = await daemon.start("fake:unasked-tool")

    async def idle() -> bool:
        return not daemon.engine.busy

    await until(idle)
    return run_id, await daemon.store.get_run(run_id)


async def _ended(daemon: InProcessDaemon, run_ids: list[str]) -> bool:
    statuses = [(await daemon.store.get_run(r)).status for r in run_ids]
    return all(s not in ("pending", "running") for s in statuses)
