"""Run leases in a live process: the runtime holds them, renews them, and gives a run up when
another process has closed it (ADR 0009). The store side is in ``support.store_conformance``."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections import Counter
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from support.durable import until
from support.scripts import slow
from support.store_conformance import make_run

from thoughtgate.access.filter import filter_run
from thoughtgate.access.roles import ROLE_NAMES
from thoughtgate.config import Config
from thoughtgate.engine.steps import DirectSteps
from thoughtgate.errors import RunTakenOverError
from thoughtgate.events.schema import Event, EventType
from thoughtgate.events.views import RunView
from thoughtgate.orchestration.leases import LeaseKeeper
from thoughtgate.orchestration.resume import begin_execution
from thoughtgate.orchestration.runtime import RunRequest, Runtime, TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.durable import RunSpecRecord
from thoughtgate.store.leases import (
    ABANDONED,
    LOST_LEASE,
    Owner,
    close_orphaned_runs,
    close_run_interrupted,
)
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, text


class Watch:
    """A runtime sink that signals when an event type is recorded."""

    def __init__(self) -> None:
        self.seen: dict[str, asyncio.Event] = {}

    def __getitem__(self, event_type: str) -> asyncio.Event:
        return self.seen.setdefault(event_type, asyncio.Event())

    async def __call__(self, events: Sequence[Event]) -> None:
        for event in events:
            self[event.type].set()


def _runtime(lease_ttl_s: float = 15.0) -> tuple[Runtime, MemoryStore, Watch]:
    store = MemoryStore()
    watch = Watch()
    config = Config.from_mapping({"orchestration": {"lease_ttl_s": lease_ttl_s}})
    runtime = Runtime(
        store,
        config,
        provider_factory=lambda m: FakeProvider(slow, model=m),
        sinks=[watch],
    )
    return runtime, store, watch


async def test_a_run_carries_its_owner_and_a_lease_that_is_renewed_until_it_ends() -> None:
    runtime, store, watch = _runtime(lease_ttl_s=1.5)
    run = await runtime.create_run(RunRequest("x", model="fake:x"))
    assert run.owner == Owner.current().owner_id
    assert run.lease_expires_at is not None
    job = asyncio.create_task(runtime.execute(run.run_id))
    await watch[EventType.MESSAGE_DELTA].wait()
    first = (await store.get_run(run.run_id)).lease_expires_at
    assert first is not None
    await runtime.leases.renew()  # what the renewal task does every ttl/3
    renewed = (await store.get_run(run.run_id)).lease_expires_at
    assert renewed is not None and renewed >= first
    assert runtime.leases.held == {run.run_id}
    job.cancel("test over")
    with pytest.raises(asyncio.CancelledError):
        await job
    closed = await store.get_run(run.run_id)
    assert closed.status == "interrupted" and closed.lease_expires_at is None
    assert runtime.leases.held == frozenset()


async def test_no_reader_sees_which_process_executes_a_run() -> None:
    """The owner id (host digest, pid, nonce) and the lease stay in the run row: the run view
    declares neither, so no role gets them, not even the owner role."""
    runtime, store, _ = _runtime()
    run = await runtime.create_run(RunRequest("x", model="fake:x"))
    stored = await store.get_run(run.run_id)
    assert stored.owner and stored.lease_expires_at
    # every field the view declares but the one the daemon adds to a run its store's refusal
    # stopped (ADR 0151): the stored record is the whole view
    assert set(stored.to_view()) == set(RunView.model_fields) - {"record_out_of_date"}
    for role in ROLE_NAMES:
        view = filter_run(stored, role).to_json()
        assert not {"owner", "lease_expires_at"} & set(view), role
        assert stored.owner not in repr(view), role
        assert str(Owner.current().pid) not in repr(view.get("metadata")), role


async def test_a_run_closed_by_another_process_is_given_up_here() -> None:
    """A process that stalled past its lease (a suspended laptop) finds its run closed by
    another process: it stops executing it, and the run keeps its one honest end."""
    runtime, store, watch = _runtime()
    run = await runtime.create_run(RunRequest("x", model="fake:x", tasks=[TaskSpec("a")]))
    job = asyncio.create_task(runtime.execute(run.run_id))
    await watch[EventType.MESSAGE_DELTA].wait()
    await close_run_interrupted(store, run.run_id, "the process executing it stopped")
    await runtime.leases.renew()
    with pytest.raises(asyncio.CancelledError, match=LOST_LEASE):
        await job
    closed = await store.get_run(run.run_id)
    assert closed.status == "interrupted"
    assert closed.error == "interrupted: the process executing it stopped"
    types = [e.type for e in await store.read(run.run_id)]
    assert types.count(EventType.RUN_INTERRUPTED) == 1 and types[-1] == EventType.RUN_INTERRUPTED
    assert types.count(EventType.TASK_COMPLETED) == 1


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0
        self.renewed_twice = asyncio.Event()

    async def renew_leases(self, owner: str, ttl_s: float, run_ids: Collection[str]) -> list[str]:
        self.renewals += 1
        if self.renewals >= 2:
            self.renewed_twice.set()
        return await super().renew_leases(owner, ttl_s, run_ids)


async def test_the_keeper_renews_on_its_own_and_stops_when_it_holds_nothing() -> None:
    store = CountingStore()
    creator = Runtime(store)
    run = await creator.create_run(RunRequest("x", model="fake:echo"))
    creator.forget_admitted(run.run_id)  # its creator will not execute it: this keeper holds it
    store.renewals = 0
    keeper = LeaseKeeper(store, Owner.current(), ttl_s=0.3)
    keeper.hold(run.run_id)
    await asyncio.wait_for(store.renewed_twice.wait(), 5)  # at once, then every ttl/3
    lease = (await store.get_run(run.run_id)).lease_expires_at
    assert lease is not None and lease <= (await store.open_runs()).now + 0.3
    (renewer,) = _renewal_tasks()
    keeper.release(run.run_id)
    assert keeper.held == frozenset()
    count = store.renewals
    # holding nothing, the keeper ends its renewal task: nothing is left to renew ever again
    with pytest.raises(asyncio.CancelledError):
        await renewer
    assert _renewal_tasks() == [] and store.renewals == count


def _renewal_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "thoughtgate lease renewal"]


@pytest.mark.unit
async def test_the_keeper_renews_the_runs_it_holds_and_no_other_run_of_its_process() -> None:
    """A run this process started but no longer executes (its end was refused) keeps the lease
    it had, which expires: the sweep can then close it (ADR 0060)."""
    store = MemoryStore()
    runtime = Runtime(store, Config.from_mapping({"orchestration": {"lease_ttl_s": 60.0}}))
    executing = await runtime.create_run(RunRequest("x", model="fake:echo"))
    given_up = await runtime.create_run(RunRequest("y", model="fake:echo"))
    runtime.forget_admitted(given_up.run_id)  # its execution gave up before it began
    keeper = runtime.leases
    await store.renew_leases(keeper.owner.owner_id, -1.0, [given_up.run_id])
    keeper.hold(executing.run_id)
    try:
        await keeper.renew()
        now = (await store.open_runs()).now
        held = (await store.get_run(executing.run_id)).lease_expires_at
        left = (await store.get_run(given_up.run_id)).lease_expires_at
        assert held is not None and held > now + 30
        assert left is not None and left < now, "a run the keeper does not hold is not renewed"
    finally:
        keeper.release(executing.run_id)


@pytest.mark.unit
async def test_an_execution_that_lets_go_leaves_a_later_executions_hold_of_the_run() -> None:
    """ADR 0093: this process's own queue took a run back (a later claim) while its first
    execution stalled; when the first one ends it lets go of its own hold only, so the run the
    second executes is still renewed -- and its task is the one a lost lease cancels."""
    store = MemoryStore()
    runtime = Runtime(store, Config.from_mapping({"orchestration": {"lease_ttl_s": 60.0}}))
    run = await runtime.create_run(RunRequest("x", model="fake:echo"))
    runtime.forget_admitted(run.run_id)
    keeper = runtime.leases
    gate = asyncio.Event()
    first, second = (asyncio.create_task(gate.wait()) for _ in range(2))
    keeper.hold(run.run_id, first)
    keeper.hold(run.run_id, second)  # the later execution holds it now
    keeper.release(run.run_id, first)
    assert run.run_id in keeper.held, "still renewed for the second execution"
    await store.renew_leases(keeper.owner.owner_id, -1.0, [run.run_id])
    await close_run_interrupted(store, run.run_id, "closed by another process")
    await keeper.renew()  # the run is lost: the execution holding it is the one stopped
    await asyncio.sleep(0)
    assert second.cancelled() and not first.done()
    keeper.release(run.run_id, second)
    assert run.run_id not in keeper
    first.cancel()


@pytest.mark.unit
async def test_a_superseded_executions_refused_end_leaves_the_later_executions_hold() -> None:
    """ADR 0094: a run's first execution stalls right before it records the run's end; a sweep
    releases the run and this process takes it back (attempt 2), whose execution holds it now.
    The first wakes: its end is refused, and recording it drops nothing of the second's -- the
    run is still held for the second, renewed, and the second ends it."""
    store = MemoryStore()
    config = Config.from_mapping({"orchestration": {"lease_ttl_s": 60.0}})
    gate, entered, second = asyncio.Event(), asyncio.Event(), asyncio.Event()

    def model(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
        async def gen() -> AsyncIterator[Any]:
            if entered.is_set():  # the second execution's turn waits for the test
                second.set()
                await gate.wait()
            entered.set()
            yield text("done")

        return gen()

    runtime = Runtime(store, config, provider_factory=lambda m: FakeProvider(model, model=m))
    keeper = runtime.leases
    run = await runtime.create_run(RunRequest("x", model="fake:echo"))
    finish, stalled, woken = runtime._finish, asyncio.Event(), asyncio.Event()

    async def stalling(*args: Any, **kw: Any) -> None:
        if not stalled.is_set():  # the first execution's end: after a stall
            stalled.set()
            await woken.wait()
        await finish(*args, **kw)

    runtime._finish = stalling  # type: ignore[method-assign]
    begun = await begin_execution(runtime, run.run_id, runtime.forget_admitted(run.run_id))
    assert begun is not None
    one = asyncio.create_task(
        runtime._run_held(begun[0], begun[1].tasks, begun[2], DirectSteps(), attempt=begun[4])
    )
    await stalled.wait()
    assert await store.release_run(run.run_id, owner=keeper.owner.owner_id, queue=True)
    again = await begin_execution(runtime, run.run_id)
    assert again is not None and again[4] == 2
    two = asyncio.create_task(
        runtime._run_held(again[0], again[1].tasks, again[2], DirectSteps(), attempt=2)
    )
    await second.wait()  # the second execution holds the run and is in its turn
    woken.set()
    with pytest.raises(RunTakenOverError):
        await one
    assert run.run_id in keeper.held, "still renewed for the second execution"
    await store.renew_leases(keeper.owner.owner_id, -1.0, [run.run_id])
    await keeper.renew()
    lease = (await store.get_run(run.run_id)).lease_expires_at
    assert lease is not None and lease > (await store.open_runs()).now, "renewed"
    gate.set()
    assert await two == "completed"
    assert run.run_id not in keeper


@pytest.mark.unit
async def test_a_runs_lease_is_renewed_while_its_end_is_recorded_and_never_after() -> None:
    """While a run's end is recorded its lease is renewed, and a renewal that no longer finds
    the run (it has just ended) does not take it for a lost one; once the end is recorded or
    given up, the run's lease is renewed no more."""
    store = MemoryStore()
    runtime = Runtime(store)
    run = await runtime.create_run(RunRequest("x", model="fake:echo"))
    keeper = runtime.leases
    recording = asyncio.current_task()
    assert recording is not None
    keeper.hold(run.run_id, recording)
    with keeper.ending(run.run_id, recording):
        assert run.run_id in keeper and keeper.held == frozenset()
        await store.renew_leases(keeper.owner.owner_id, -1.0, [run.run_id])
        await keeper.renew()
        lease = (await store.get_run(run.run_id)).lease_expires_at
        assert lease is not None and lease > (await store.open_runs()).now
        await close_run_interrupted(store, run.run_id, "the end being recorded")
        await keeper.renew()  # finds the run ended: nothing to cancel
        (renewer,) = _renewal_tasks()
    assert not recording.cancelling()
    assert run.run_id not in keeper
    with pytest.raises(asyncio.CancelledError):  # nothing is left to renew
        await renewer


@pytest.mark.unit
async def test_a_processs_sweep_closes_its_own_runs_it_no_longer_executes_once_expired() -> None:
    store = MemoryStore()
    runtime = Runtime(store)
    keeper = runtime.leases
    me = keeper.owner
    executing = await runtime.create_run(RunRequest("a", model="fake:echo"))
    given_up = await runtime.create_run(RunRequest("b", model="fake:echo"))
    fresh = await runtime.create_run(RunRequest("c", model="fake:echo"))
    for run in (executing, given_up, fresh):  # created, not executed here (it would hold them)
        runtime.forget_admitted(run.run_id)
    expired = [executing.run_id, given_up.run_id]
    await store.renew_leases(me.owner_id, -1.0, expired)  # as a long store outage leaves them
    keeper.hold(executing.run_id)
    try:
        # Opening the store (no keeper to ask) leaves this process's own runs alone.
        assert await close_orphaned_runs(store, me=me) == []
        assert await close_orphaned_runs(store, me=me, executing=keeper) == [given_up.run_id]
    finally:
        keeper.release(executing.run_id)
    closed = await store.get_run(given_up.run_id)
    assert closed.status == "interrupted" and closed.error == f"interrupted: {ABANDONED}"
    for run_id in (executing.run_id, fresh.run_id):  # executed here, or its lease still runs
        assert (await store.get_run(run_id)).status == "pending"


class CallCountingStore(MemoryStore):
    """Counts each call of a public store method: on a database, each is a round trip."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr):
            return attr
        calls = super().__getattribute__("calls")

        @functools.wraps(attr)
        async def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return await attr(*args, **kwargs)

        return counted


class SpecReadsStore(CallCountingStore):
    """Also keeps the ids each ``get_run_specs`` asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.spec_reads: list[set[str]] = []

    async def get_run_specs(self, run_ids: Collection[str]) -> dict[str, RunSpecRecord]:
        self.spec_reads.append(set(run_ids))
        return await super().get_run_specs(run_ids)


@dataclass
class Sweep:
    """What one sweep asked and did (``_sweep_beside_suspended_runs``)."""

    calls: Counter[str]
    requeued: list[str]
    spec_reads: list[set[str]]
    asked_on_queue: list[set[str]]
    moved: set[str]
    """The runs the sweep moves: the lost queued run, the durable orphan, the plain orphan."""


async def _sweep_beside_suspended_runs(suspended: int) -> Sweep:
    """One daemon sweep of a store holding ``suspended`` durable runs waiting for a manual
    resume, beside one run of each other kind the sweep moves: a queued run on no queue, a
    durable orphan and a plain one of a process on another host whose leases expired -- and a
    run queued moments ago, which it leaves. What the sweep asked and did (after checking every
    run ended where it should)."""
    store = SpecReadsStore()
    far = Owner("another-host", 4242, "n").owner_id

    async def admit(spec: dict[str, Any], **run: Any) -> str:
        record = make_run(tasks=1, **run)
        assert (await store.admit_run(record, RunSpecRecord(record.run_id, {}, **spec))).admitted
        return record.run_id

    waiting = [await admit({"durable": True}) for _ in range(suspended)]
    lost = await admit({"durable": True, "resume": "queue", "queue": "q", "queued_at": 1.0})
    just_queued = await admit(
        {"durable": True, "resume": "queue", "queue": "q", "queued_at": time.time() + 60}
    )
    orphan = await admit({"durable": True}, status="running", owner=far, lease_expires_at=1.0)
    plain = make_run(status="running", owner=far, lease_expires_at=1.0)
    await store.create_run(plain)
    requeued: list[str] = []
    asked: list[set[str]] = []

    async def requeue(run_id: str, spec: RunSpecRecord) -> None:
        requeued.append(run_id)

    async def on_queue(run_ids: Sequence[str]) -> dict[str, float | None]:
        asked.append(set(run_ids))
        return {}  # none of them waits on a queue

    store.calls.clear()
    closed = await close_orphaned_runs(store, requeue=requeue, on_queue=on_queue, lost_after_s=1)
    calls = Counter(store.calls)
    assert closed == [plain.run_id]
    assert (await store.get_run(orphan)).metadata["suspended"]["resume"] == "manual"
    for run_id in (*waiting, lost, just_queued, orphan):
        run = await store.get_run(run_id)
        assert run.status in ("pending", "running") and run.owner is None
    spec = await store.get_run_spec(just_queued)
    assert spec is not None and spec.queued_at is not None and spec.queued_at > time.time()
    return Sweep(calls, requeued, store.spec_reads, asked, {lost, orphan, plain.run_id})


@pytest.mark.unit
async def test_a_sweep_makes_as_many_store_calls_beside_300_suspended_runs_as_beside_3() -> None:
    """Runs waiting days for an approval stay suspended, each sweep of each replica looks at
    them, and their number grows with the store: their specs come in one read (ADR 0064)."""
    few = await _sweep_beside_suspended_runs(3)
    many = await _sweep_beside_suspended_runs(300)
    assert len(few.requeued) == len(many.requeued) == 1, "the run on no queue is put back"
    assert many.calls == few.calls
    assert many.calls["get_run_specs"] == 1 and many.calls["get_run_spec"] == 0
    assert many.calls["open_runs"] == 1


@pytest.mark.unit
async def test_an_admitted_run_the_keeper_no_longer_finds_is_dropped_once_surely_committed() -> (
    None
):
    """A run admitted but never executed here -- its caller was cancelled before its execution
    began, and the run was closed -- is not renewed for the life of the process: a renewal that
    began a renewal period after its admission and does not find it drops it (ADR 0065). One
    admitted moments ago (its admission may still be committing) is kept."""
    store = MemoryStore()
    keeper = LeaseKeeper(store, Owner.current(), ttl_s=0.3)
    creator = Runtime(store)
    run = await creator.create_run(RunRequest("x", model="fake:echo"))
    creator.forget_admitted(run.run_id)  # this keeper stands for its process's
    keeper.admit(run.run_id)
    await close_run_interrupted(store, run.run_id, "cancelled before it executed")
    keeper.admit("run_still_committing")
    await keeper.renew()
    assert run.run_id in keeper and "run_still_committing" in keeper

    admitted_at = time.monotonic()

    async def a_renewal_period_later() -> bool:
        return time.monotonic() >= admitted_at + keeper.renew_every

    await until(a_renewal_period_later)
    keeper.admit("run_still_committing")  # admitted again just now: kept
    await keeper.renew()
    assert run.run_id not in keeper, "not found a renewal period after its admission: dropped"
    assert "run_still_committing" in keeper
    keeper.unadmit("run_still_committing")

    # An open run whose execution never began is renewed for ``admitted_for_s`` at most.
    never = await creator.create_run(RunRequest("y", model="fake:echo"))
    creator.forget_admitted(never.run_id)
    keeper.admit(never.run_id)
    await keeper.renew()
    assert never.run_id in keeper
    keeper.admitted_for_s = 0.0
    await keeper.renew()
    assert never.run_id not in keeper


@pytest.mark.unit
async def test_a_sweep_reads_the_specs_of_the_runs_it_moves_only() -> None:
    """The rows a sweep reads do not grow with the suspended runs either: it decides from
    ``open_runs`` (a suspended run is not queued), asks the engine about the queued runs only
    (the one queued moments ago too: its workflow may have ended, ADR 0065), and reads the specs
    of the three runs it moves (ADR 0066). Before, every suspended run's spec came with every
    sweep."""
    sweep = await _sweep_beside_suspended_runs(300)
    lost = sweep.requeued[0]
    assert len(sweep.asked_on_queue) == 1 and lost in sweep.asked_on_queue[0]
    assert len(sweep.asked_on_queue[0]) == 2, "the two queued runs, no suspended one"
    assert sweep.spec_reads == [sweep.moved]
