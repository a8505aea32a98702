"""Run leases in a live process: the runtime holds them, renews them, and gives a run up when
another process has closed it (ADR 0009). The store side is in ``support.store_conformance``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from support.scripts import slow

from thoughtgate.access.filter import filter_run
from thoughtgate.access.roles import ROLE_NAMES
from thoughtgate.config import Config
from thoughtgate.events.schema import Event, EventType
from thoughtgate.events.views import RunView
from thoughtgate.orchestration.leases import LeaseKeeper
from thoughtgate.orchestration.runtime import RunRequest, Runtime, TaskSpec
from thoughtgate.store.leases import LOST_LEASE, Owner, close_run_interrupted
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider


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
    assert set(stored.to_view()) == set(RunView.model_fields)
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

    async def renew_leases(self, owner: str, ttl_s: float) -> list[str]:
        self.renewals += 1
        if self.renewals >= 2:
            self.renewed_twice.set()
        return await super().renew_leases(owner, ttl_s)


async def test_the_keeper_renews_on_its_own_and_stops_when_it_holds_nothing() -> None:
    store = CountingStore()
    run = await Runtime(store).create_run(RunRequest("x", model="fake:echo"))
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
