"""Runs a process owns before they execute: admitted runs keep their lease, and a run another
process took from a daemon's waiting line never starts there (ADR 0065).

* A run this process admitted as its own is renewed by its lease keeper from its admission until
  its execution holds it: an execution slow to begin (more than a lease) no longer lets another
  process's sweep close the run under it. Once the run is executed, or will not be here, it is
  renewed no more (ADR 0060's point).
* A durable run waiting in its daemon for a slot (ADR 0031) that another process took meanwhile
  -- this daemon stalled past its lease, and a sweep put the run back on a queue -- leaves the
  waiting line, whether the keeper's renewal notices it first or its turn comes first; it is not
  claimed, let alone executed, here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.durable import until
from support.durable_engine import InProcessDaemon
from support.pg import PG_URL, pg_admin, pg_schema

from thoughtgate.config import Config, DurabilityConfig, OrchestrationConfig
from thoughtgate.errors import RuntimeFailure, StoreUnavailableError, UsageError
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.store.leases import ABANDONED, Owner, close_orphaned_runs, close_run_interrupted
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, text

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name

pytestmark = [pytest.mark.timeout(60)]

ELSEWHERE = Owner("0123456789abcdef", 4242, "elsewhere")
"""A process on another host sweeping the same store."""


# ---------------------------------------------------------------------- admitted runs
async def _an_admitted_run_keeps_its_lease_until_it_executes(store: EventStore) -> None:
    config = Config.from_mapping({"orchestration": {"lease_ttl_s": 1.0}})
    runtime = Runtime(store, config)
    run = await runtime.create_run(RunRequest("hi", model="fake:echo"))
    admitted_until = run.lease_expires_at
    assert admitted_until is not None

    async def admission_lease_over() -> bool:
        return (await store.open_runs()).now > admitted_until + 0.1

    # Its execution is slow to begin: the lease its admission gave it runs out meanwhile.
    await until(admission_lease_over)
    assert await close_orphaned_runs(store, me=ELSEWHERE) == []
    lease = (await store.get_run(run.run_id)).lease_expires_at
    assert lease is not None and lease > admitted_until, "renewed while it waited"

    ended = await runtime.execute(run.run_id)
    assert ended.status == "completed"
    assert run.run_id not in runtime.leases, "executed: renewed no more"
    assert runtime.leases.held == frozenset()


@pytest.mark.inprocess
async def test_an_admitted_run_keeps_its_lease_until_it_executes_sqlite(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "runs.db")
    try:
        await _an_admitted_run_keeps_its_lease_until_it_executes(store)
    finally:
        await store.close()


@pytest.mark.external
@pytest.mark.postgres
async def test_an_admitted_run_keeps_its_lease_until_it_executes_postgres(pg_schema: str) -> None:
    store = await PostgresStore.open(PG_URL, schema=pg_schema)
    try:
        await _an_admitted_run_keeps_its_lease_until_it_executes(store)
    finally:
        await store.close()


@pytest.mark.inprocess
async def test_a_run_whose_execution_gives_up_before_it_begins_is_renewed_no_more(
    tmp_path: Path,
) -> None:
    store = await SQLiteStore.open(tmp_path / "runs.db")
    try:
        runtime = Runtime(store, Config(orchestration=OrchestrationConfig(lease_ttl_s=1.0)))
        run = await runtime.create_run(RunRequest("hi", model="fake:echo"))
        assert run.run_id in runtime.leases
        await close_run_interrupted(store, run.run_id, "closed by hand")
        admitted_until = run.lease_expires_at
        assert admitted_until is not None

        async def admitted_copy_stale() -> bool:  # its execution then reads the run back
            return time.time() > admitted_until

        await until(admitted_copy_stale)
        with pytest.raises(UsageError, match="already ended"):
            await runtime.execute(run.run_id)
        assert run.run_id not in runtime.leases
    finally:
        await store.close()


# ---------------------------------------------------------------------- the waiting line
def _gated(name: str) -> Iterator[asyncio.Event]:
    """``fake:<name>`` answers once the event is set."""
    opened = asyncio.Event()

    def gated(request: TurnRequest, _: int) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            await opened.wait()
            yield text("done")

        return gen()

    FAKE_SCRIPTS[name] = gated
    yield opened
    opened.set()
    del FAKE_SCRIPTS[name]


@pytest.fixture
def gate() -> Iterator[asyncio.Event]:
    """``fake:gated``: its run keeps the daemon's one slot."""
    yield from _gated("gated")


class _Daemon(InProcessDaemon):
    """A daemon of one slot, its queue polled once a minute: a run that waits, waits here."""

    def __init__(self, store: SQLiteStore) -> None:
        # A long lease: no renewal comes between the test's steps unless it asks for one.
        super().__init__(
            store,
            Config(
                orchestration=OrchestrationConfig(lease_ttl_s=60.0),
                durability=DurabilityConfig(concurrency=1, poll_interval_s=60.0),
            ),
        )

    def waiting(self) -> list[str]:
        return self.engine.waiting_here

    async def taken_elsewhere(self, run_id: str) -> None:
        """What another process's sweep does to a run whose lease expired while this daemon
        stalled: release it to a queue (it then enqueues it there)."""
        owner = self.runtime.leases.owner.owner_id
        assert await self.store.release_run(run_id, owner=owner, queue=True)

    async def untouched_here(self, run_id: str) -> None:
        run = await self.store.get_run(run_id)
        assert (run.status, run.owner) == ("pending", None)
        spec = await self.store.get_run_spec(run_id)
        assert spec is not None and spec.attempts == 0 and spec.queued_at is not None
        assert [e.type for e in await self.store.read(run_id)] == [
            "run.started",
            "capability.resolved",
        ]
        assert run_id not in self.runtime.leases
        assert run_id not in self.waiting()


@pytest.fixture
async def daemon(tmp_path: Path) -> AsyncIterator[_Daemon]:
    store = await SQLiteStore.open(tmp_path / "runs.db")
    made = _Daemon(store)
    try:
        await made.launch()
        yield made
    finally:
        await made.close()


@pytest.mark.inprocess
async def test_a_waiting_run_another_process_took_does_not_start_when_its_turn_comes(
    daemon: _Daemon, gate: asyncio.Event
) -> None:
    first = await daemon.start("fake:gated")
    second = await daemon.start("fake:echo")
    assert daemon.waiting() == [second]
    await daemon.taken_elsewhere(second)
    gate.set()  # the slot frees before any renewal of the keeper's
    await until(lambda: _ended(daemon, first))
    await until(lambda: _idle(daemon))
    await daemon.untouched_here(second)
    assert (await daemon.store.get_run(first)).status == "completed"


@pytest.mark.inprocess
async def test_a_waiting_run_another_process_took_leaves_the_line_at_the_next_renewal(
    daemon: _Daemon, gate: asyncio.Event
) -> None:
    first = await daemon.start("fake:gated")
    second = await daemon.start("fake:echo")
    third = await daemon.start("fake:echo")
    assert daemon.waiting() == [second, third]
    await daemon.taken_elsewhere(second)
    await daemon.runtime.leases.renew()
    assert daemon.waiting() == [third], "it left the line; the other still waits"
    await daemon.untouched_here(second)
    gate.set()
    await until(lambda: _ended(daemon, first))
    await until(lambda: _ended(daemon, third))
    await until(lambda: _idle(daemon))
    await daemon.untouched_here(second)


async def _ended(daemon: _Daemon, run_id: str) -> bool:
    return (await daemon.store.get_run(run_id)).status not in ("pending", "running")


async def _no_start_under_way(daemon: _Daemon) -> bool:
    return not daemon.engine.busy


async def _idle(daemon: _Daemon) -> bool:
    return not daemon.engine.busy and not daemon.runtime.executing


async def _let_go(
    daemon: _Daemon, gate: asyncio.Event, run_id: str, execution: asyncio.Task[bool]
) -> None:
    """The test's stand-in execution lets go of ``run_id``, which is closed; the gated run that
    keeps the slot may end."""
    daemon.runtime.leases.release(run_id, execution)  # type: ignore[arg-type]
    await close_run_interrupted(daemon.store, run_id, "the test is over")
    gate.set()


async def _spill(daemon: _Daemon, run_id: str) -> None:
    await daemon.engine._spill()


async def _withdraw(daemon: _Daemon, run_id: str) -> None:
    await daemon.engine.withdraw(run_id, "its client went away")


@pytest.mark.inprocess
@pytest.mark.parametrize("move", [_spill, _withdraw], ids=["spilled", "start withdrawn"])
async def test_the_line_leaves_a_run_this_process_took_back_to_its_execution(
    daemon: _Daemon, gate: asyncio.Event, move: Callable[[_Daemon, str], Awaitable[None]]
) -> None:
    """ADR 0094: a run waiting here is taken elsewhere while this daemon stalled -- a sweep
    releases it to its queue -- and this daemon's own queue takes it back: its execution
    claims it (attempt 1, this process's owner id) and holds it. The line then spilled to the
    queue, or the run's start withdrawn (its client went away), moves only what still waits
    in it (attempt 0): not this run, which stays its execution's -- held, leased, not
    queued, renewed here."""
    first = await daemon.start("fake:gated")
    second = await daemon.start("fake:echo")
    assert daemon.waiting() == [second]
    await daemon.taken_elsewhere(second)
    keeper = daemon.runtime.leases
    owner = keeper.owner.owner_id
    assert await daemon.store.claim_run(second, owner, keeper.ttl_s) == 1
    execution = asyncio.create_task(gate.wait())  # what its execution's task holds it by
    keeper.hold(second, execution)  # type: ignore[arg-type]
    try:
        await move(daemon, second)
        run = await daemon.store.get_run(second)
        assert (run.status, run.owner) == ("running", owner), "still its execution's"
        spec = await daemon.store.get_run_spec(second)
        assert spec is not None and spec.queued_at is None and spec.attempts == 1
        assert second in keeper.held, "still renewed for its execution"
        assert daemon.waiting() == []
    finally:
        await _let_go(daemon, gate, second, execution)
    await until(lambda: _ended(daemon, first))
    await until(lambda: _idle(daemon))


@pytest.fixture
def held() -> Iterator[asyncio.Event]:
    """``fake:held``: a second run kept under way by the test."""
    yield from _gated("held")


@pytest.mark.inprocess
@pytest.mark.parametrize("tasks", [1, 2], ids=["without a workflow", "as a workflow"])
async def test_a_waiting_run_this_process_took_back_is_not_started_again_from_the_line(
    daemon: _Daemon, gate: asyncio.Event, held: asyncio.Event, tasks: int
) -> None:
    """ADR 0099: a run waiting here is taken elsewhere while this daemon stalled (a sweep
    releases it to its queue), and this daemon's own queue takes it back: its workflow executes
    here, claimed at attempt 1 by this process's owner id. When the line's turn for it comes (a
    slot frees), the line does not start it again -- neither as a second execution (a run of
    one task starts without a workflow: it claimed the run at attempt 2 and executed it beside
    the first) nor as a workflow (its start found the workflow written and closed the run under
    its execution). The execution goes on, held and renewed here, and ends the run; each task
    started once, in one claim."""
    first = await daemon.start("fake:gated")
    request = RunRequest("hi", model="fake:held", tasks=[TaskSpec("hi")] * tasks)
    run, rank = await daemon.runtime.admit(request, queue=daemon.queue)
    second = run.run_id
    await daemon.engine.submit(second, daemon.queue, priority=rank)
    assert daemon.waiting() == [second]
    await daemon.taken_elsewhere(second)
    keeper = daemon.runtime.leases
    owner = keeper.owner.owner_id
    # As this process's queue worker dequeues it: its workflow, started here.
    execution = await daemon.engine.start(second)

    async def under_way() -> bool:
        return "task.started" in await daemon.types(second)

    await until(under_way)
    spec = await daemon.store.get_run_spec(second)
    assert spec is not None and spec.attempts == 1
    gate.set()  # the slot frees: the line's turn for the run comes
    await until(lambda: _ended(daemon, first))
    await until(lambda: _no_start_under_way(daemon))
    ran = await daemon.store.get_run(second)
    assert (ran.status, ran.owner) == ("running", owner), "still its execution's"
    assert second in keeper.held, "still renewed for its execution"
    assert daemon.waiting() == []
    held.set()
    await execution
    assert (await daemon.store.get_run(second)).status == "completed"
    types = await daemon.types(second)
    assert types.count("task.started") == tasks
    assert "run.resumed" not in types
    spec = await daemon.store.get_run_spec(second)
    assert spec is not None and spec.attempts == 1
    await until(lambda: _idle(daemon))


@pytest.mark.inprocess
@pytest.mark.parametrize("move", ["start", "spill"])
async def test_the_lines_close_of_a_run_it_could_not_move_leaves_a_later_claim_alone(
    daemon: _Daemon,
    gate: asyncio.Event,
    monkeypatch: pytest.MonkeyPatch,
    move: str,
) -> None:
    """ADR 0099: the line moves a waiting run -- starts it (its claim, attempt 1) or spills it
    to the queue (from its hold, attempt 0) -- and this daemon stalls in the middle: a sweep
    releases the run to its queue and this daemon's own queue takes it back and claims it (one
    attempt more, the same owner id). The move then fails -- the start finds the queue's
    workflow there, the spill's store call gives up -- and the line closes the run it could
    not move: at its own attempt, which is refused; the run stays its execution's."""
    first = await daemon.start("fake:gated")
    # Two tasks: it starts as a workflow (``DurableEngine.start``).
    request = RunRequest("hi", model="fake:echo", tasks=[TaskSpec("hi")] * 2)
    run, rank = await daemon.runtime.admit(request, queue=daemon.queue)
    second = run.run_id
    await daemon.engine.submit(second, daemon.queue, priority=rank)
    assert daemon.waiting() == [second]
    keeper = daemon.runtime.leases
    owner = keeper.owner.owner_id
    execution = asyncio.create_task(gate.wait())  # what its execution's task holds it by
    claims: list[int | None] = []
    release = daemon.store.release_run

    async def taken_back() -> None:
        assert await release(second, owner=owner, queue=True)  # another process's sweep
        claims.append(await daemon.store.claim_run(second, owner, keeper.ttl_s))
        keeper.hold(second, execution)  # type: ignore[arg-type]

    if move == "start":

        async def start(run_id: str, *, unwritten: bool = False) -> asyncio.Future[Any]:
            await taken_back()
            raise RuntimeFailure(f"run {run_id!r} did not start in this process")

        monkeypatch.setattr(daemon.engine, "start", start)
    else:

        async def release_run(run_id: str, **kw: Any) -> bool:
            await taken_back()
            raise StoreUnavailableError("database is locked")

        monkeypatch.setattr(daemon.store, "release_run", release_run)
    try:
        if move == "start":
            gate.set()  # the slot frees: the line claims and starts the run
            await until(lambda: _ended(daemon, first))
            await until(lambda: _no_start_under_way(daemon))
        else:
            await daemon.engine._spill()
            monkeypatch.setattr(daemon.store, "release_run", release)
        assert claims == [2 if move == "start" else 1]
        run = await daemon.store.get_run(second)
        assert (run.status, run.owner) == ("running", owner), "still its execution's"
        assert "run.interrupted" not in await daemon.types(second)
        assert second in keeper.held, "still renewed for its execution"
    finally:
        await _let_go(daemon, gate, second, execution)
    await until(lambda: _ended(daemon, first))
    await until(lambda: _idle(daemon))


@pytest.mark.inprocess
async def test_a_run_the_line_claimed_whose_start_stalls_is_released_by_a_sweep_not_left_running(
    tmp_path: Path, gate: asyncio.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ADR 0112: the daemon claims the next run of its line (attempt 1, ADR 0099) and its start
    stalls before the run's execution holds it. Nothing renews the run meanwhile (the line's
    hold is let go at the claim, and its admission's renewal ended when it joined the line), so
    its lease runs out one lease after the claim, and a sweep -- this daemon's own, which sees
    it among neither its executions nor its admitted runs (ADR 0060) -- releases it to its
    queue, saying why: never an open run held by a process that does not execute it. The
    stalled start, woken, finds the run no longer its own and executes nothing."""
    store = await SQLiteStore.open(tmp_path / "runs.db")
    daemon = InProcessDaemon(
        store,
        Config(
            orchestration=OrchestrationConfig(lease_ttl_s=1.0),
            durability=DurabilityConfig(concurrency=1, poll_interval_s=60.0),
        ),
    )
    stalled, woken = asyncio.Event(), asyncio.Event()
    begin = daemon.engine._begin

    async def stalling(run_id: str, slot: Any, unwritten: bool) -> asyncio.Future[Any]:
        if run_id == second:
            stalled.set()
            await woken.wait()
        return await begin(run_id, slot, unwritten)

    requeued: list[str] = []

    async def requeue(run_id: str, spec: Any) -> None:
        requeued.append(run_id)

    try:
        await daemon.launch()
        first = await daemon.start("fake:gated")
        second = await daemon.start("fake:echo")
        assert daemon.engine.waiting_here == [second]
        monkeypatch.setattr(daemon.engine, "_begin", stalling)
        gate.set()
        await stalled.wait()  # the line's claim committed; its start stalls
        me = daemon.runtime.leases.owner.owner_id
        spec = await store.get_run_spec(second)
        assert spec is not None and spec.attempts == 1
        assert second not in daemon.runtime.leases, "renewed by nobody"

        async def lease_expired() -> bool:
            return second in {r.run_id for r in (await store.open_runs(expired=True)).runs}

        await until(lease_expired)
        await close_orphaned_runs(
            store, me=Owner.parse(me), executing=daemon.runtime.leases, requeue=requeue
        )
        run = await store.get_run(second)
        assert run.owner is None and requeued == [second], "released to its queue"
        assert run.metadata["suspended"]["reason"] == ABANDONED
        woken.set()
        await until(lambda: _idle(daemon))
        assert (await store.get_run(first)).status == "completed"
        run = await store.get_run(second)
        spec = await store.get_run_spec(second)
        assert (run.status, run.owner) == ("running", None), "left to its queue"
        assert spec is not None and spec.attempts == 1 and spec.queued_at is not None
        assert "run.completed" not in [e.type for e in await store.read(second)]
    finally:
        woken.set()
        await daemon.close()
