"""The conformance suite of ``DurableRunStore`` (run specs, claims, releases, queues, quotas).

A backend's test module subclasses :class:`DurableStoreConformance` beside its
``StoreConformance`` class and overrides the same ``store`` fixture.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from support.store_conformance import make_run
from thoughtgate.errors import RunClosedError, RunTakenOverError
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.store.base import UNCLAIMED, EventStore, Holder, OpenRuns, RunEnding
from thoughtgate.store.durable import DurableRunStore, Quota, RunQueueRecord, RunSpecRecord
from thoughtgate.store.leases import EXPIRED, Owner, SweepCursor, close_orphaned_runs
from thoughtgate.store.records import RunRecord

__all__ = ["DurableStoreConformance"]

SPEC: dict[str, Any] = {
    "version": 1,
    "tasks": [{"prompt": "p", "model": "fake:echo", "system": "sys", "history": []}],
    "tools": ["lookup"],
}


def delta(text: str) -> NewEvent:
    return NewEvent(EventType.MESSAGE_DELTA, {"text": text})


def durable(store: EventStore) -> DurableRunStore:
    assert isinstance(store, DurableRunStore)
    return store


async def admitted(store: EventStore, **spec: Any) -> str:
    run = make_run(tasks=1)
    answer = await durable(store).admit_run(run, RunSpecRecord(run.run_id, dict(SPEC), **spec))
    assert answer.admitted
    return run.run_id


async def waiting_in_line(store: EventStore, owner: str = "a.1.x") -> str:
    """A run waiting in its daemon's line: held by ``owner``'s process, unclaimed (attempt 0,
    ADR 0099)."""
    run = make_run(tasks=1, owner=owner, lease_expires_at=time.time() + 30)
    assert (await durable(store).admit_run(run, RunSpecRecord(run.run_id, dict(SPEC)))).admitted
    return run.run_id


async def assert_held_as(store: EventStore, run_id: str, held: RunRecord, attempts: int) -> None:
    """``run_id`` is still held as ``held`` found it -- its owner, running, the same lease --
    claimed ``attempts`` times and not queued: a refused move changed nothing."""
    run = await store.get_run(run_id)
    assert (run.owner, run.status, run.lease_expires_at) == (
        held.owner,
        "running",
        held.lease_expires_at,
    )
    spec = await durable(store).get_run_spec(run_id)
    assert spec is not None and spec.queued_at is None and spec.attempts == attempts


async def taken_over(store: EventStore, n: int) -> list[str]:
    """``n`` durable runs claimed by process A (attempt 1), released, then claimed by B
    (attempt 2): each as a stalled A finds it when it wakes."""
    ds = durable(store)
    runs = [await admitted(store, durable=True) for _ in range(n)]
    for run_id in runs:
        assert await ds.claim_run(run_id, "a.1.x", 30) == 1
        assert await ds.release_run(run_id, owner="a.1.x", queue=True)
        assert await ds.claim_run(run_id, "b.2.y", 30) == 2
    return runs


async def queued_since(store: EventStore, run_id: str) -> float:
    """The run's ``queued_at`` as the store keeps it."""
    spec = await durable(store).get_run_spec(run_id)
    assert spec is not None and spec.queued_at is not None
    return spec.queued_at


class DurableStoreConformance:
    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        raise NotImplementedError("a backend's test class must override the `store` fixture")
        yield  # pragma: no cover

    async def test_admitted_run_keeps_its_spec_and_its_tasks(self, store: EventStore) -> None:
        run_id = await admitted(store, key_id="k1", durable=True, resume="queue", queue="q1")
        spec = await durable(store).get_run_spec(run_id)
        assert spec is not None
        assert spec.spec == SPEC
        assert (spec.key_id, spec.durable, spec.resume, spec.queue) == ("k1", True, "queue", "q1")
        assert spec.attempts == 0 and abs(spec.created_at - time.time()) < 60
        assert len((await store.get_run(run_id)).tasks) == 1
        assert await durable(store).get_run_spec("run_unknown") is None

    async def test_the_specs_of_many_runs_come_in_one_read_as_each_alone(
        self, store: EventStore
    ) -> None:
        ds = durable(store)
        queued = await admitted(store, key_id="k1", durable=True, resume="queue", queue="q1")
        suspended = await admitted(store, durable=True, queued_at=None)
        others = [await admitted(store) for _ in range(20)]
        without = make_run()
        await store.create_run(without)  # recorded without a spec (before ADR 0013)
        unknown = [f"run_unknown_{i}" for i in range(1500)]  # past SQLite's 999 parameters
        asked = [queued, without.run_id, *unknown, suspended, queued, *others]
        got = await ds.get_run_specs(asked)
        assert set(got) == {queued, suspended, *others}, "a run without a spec is left out"
        for run_id, spec in got.items():
            assert spec == await ds.get_run_spec(run_id)
        assert (got[queued].key_id, got[queued].queue, got[queued].resume) == ("k1", "q1", "queue")
        assert await ds.get_run_specs([]) == {}
        assert await ds.get_run_specs(["run_unknown"]) == {}
        got[suspended].spec["tools"] = ["changed"]
        assert (await ds.get_run_specs([suspended]))[suspended].spec == SPEC, "copies"

    async def test_admission_stores_the_opening_events_with_the_run(
        self, store: EventStore
    ) -> None:
        ds = durable(store)
        opening = [
            NewEvent(EventType.RUN_STARTED, {"prompt": "p", "model": "fake:echo", "tasks": 1}),
            NewEvent(EventType.CAPABILITY_RESOLVED, {"chain_of_thought": "surface"}),
        ]
        run = make_run(tasks=1)
        assert (await ds.admit_run(run, RunSpecRecord(run.run_id, SPEC), events=opening)).admitted
        stored = await store.read(run.run_id)
        assert [(e.seq, e.type) for e in stored] == [
            (1, EventType.RUN_STARTED),
            (2, EventType.CAPABILITY_RESOLVED),
        ]
        after = await store.append(run.run_id, [NewEvent(EventType.MESSAGE_DELTA, {"text": "x"})])
        assert after[0].seq == 3, "later appends number on from the opening events"
        refused = make_run()
        quota = Quota("k1", max_open=0, max_per_minute=100)
        spec = RunSpecRecord(refused.run_id, SPEC, key_id="k1")
        assert not (await ds.admit_run(refused, spec, quota=quota, events=opening)).admitted
        with pytest.raises(Exception, match="run"):
            await store.read(refused.run_id)  # a refused run stores no events either

    async def test_claim_counts_attempts_and_excludes_other_owners(self, store: EventStore) -> None:
        run_id = await admitted(store, durable=True, queued_at=time.time())
        assert (await durable(store).get_run_spec(run_id)).queued_at is not None  # type: ignore[union-attr]
        assert await durable(store).claim_run(run_id, "a.1.x", 30) == 1
        run = await store.get_run(run_id)
        assert (run.owner, run.status) == ("a.1.x", "running")
        assert run.lease_expires_at is not None and run.lease_expires_at > time.time()
        assert await durable(store).claim_run(run_id, "b.2.y", 30) is None, "held by another"
        assert await durable(store).claim_run(run_id, "a.1.x", 30) == 2, "its owner re-enters"
        spec = await durable(store).get_run_spec(run_id)
        assert spec is not None and spec.queued_at is None and spec.attempts == 2

    async def test_release_is_a_compare_and_set_on_owner_and_lease(self, store: EventStore) -> None:
        ds = durable(store)
        run_id = await admitted(store, durable=True)
        assert await ds.claim_run(run_id, "a.1.x", 30) == 1
        assert not await ds.release_run(run_id, owner="b.2.y", queue=True), "not its owner"
        # the lease runs 30 s more: a verdict taken before it expired does not apply
        assert not await ds.release_run(run_id, owner="a.1.x", lease_expired_by=0.0, queue=True)
        assert await ds.release_run(run_id, owner="a.1.x", lease_expired_by=None, queue=True)
        run = await store.get_run(run_id)
        assert run.owner is None and run.lease_expires_at is None
        spec = await ds.get_run_spec(run_id)
        assert spec is not None and spec.queued_at is not None
        assert not await ds.release_run(run_id, owner="a.1.x", queue=True), "moved once"
        assert not await ds.release_run(run_id, owner=None, queue=True), "queued, not suspended"
        assert await ds.claim_run(run_id, "b.2.y", 30) == 2, "another process takes it"

    async def test_a_release_by_an_earlier_attempt_of_its_owner_moves_nothing(
        self, store: EventStore
    ) -> None:
        """ADR 0093: a stalled execution (attempt 1) hands its run back after its process took
        the run again (attempt 2, same owner): the release names its attempt and is refused,
        so the run stays the second execution's -- held, leased, not queued. The holder's own
        release, and a release naming no attempt, still apply."""
        ds = durable(store)
        run_id = await admitted(store, durable=True)
        assert await ds.claim_run(run_id, "a.1.x", 30) == 1
        assert await ds.release_run(run_id, owner="a.1.x", queue=True)
        assert await ds.claim_run(run_id, "a.1.x", 30) == 2
        held = await store.get_run(run_id)
        stale = ds.release_run(run_id, owner="a.1.x", attempt=1, queue=True)
        assert not await stale, "a release by the superseded execution moves nothing"
        await assert_held_as(store, run_id, held, attempts=2)
        await store.append(run_id, [delta("b")], held_by=Holder("a.1.x", 2))  # still holds it
        assert not await ds.release_run(run_id, owner="b.2.y", attempt=2, queue=True)
        assert not await ds.release_run(run_id, owner="a.1.x", attempt=3, queue=True)
        assert await ds.release_run(run_id, owner="a.1.x", attempt=2, queue=True), "its holder"
        assert await ds.claim_run(run_id, "a.1.x", 30) == 3
        assert await ds.release_run(run_id, owner="a.1.x", queue=False), "no attempt: any"
        # A run waiting in its daemon is held unclaimed (attempt 0) until it starts there.
        waiting = await waiting_in_line(store)
        assert not await ds.release_run(waiting, owner="a.1.x", attempt=1, queue=True)
        assert await ds.release_run(waiting, owner="a.1.x", attempt=0, queue=True)

    async def test_a_claim_from_the_lines_hold_takes_only_a_run_still_unclaimed(
        self, store: EventStore
    ) -> None:
        """ADR 0099: a daemon starts a run that waited in its line (held, attempt 0) by a claim
        naming attempt 0. Once its own queue took the run back and claimed it (attempt 1, the
        same owner), or a sweep released it (nobody's), or another process holds it, that claim
        takes nothing and changes nothing; a claim naming no attempt is as before."""
        ds = durable(store)
        line = await waiting_in_line(store)
        assert await ds.claim_run(line, "b.2.y", 30, attempt=0) is None, "another's hold"
        assert await ds.claim_run(line, "a.1.x", 30, attempt=1) is None, "not at attempt 1"
        assert await ds.claim_run(line, "a.1.x", 30, attempt=0) == 1, "the line's own start"
        run = await store.get_run(line)
        assert (run.owner, run.status) == ("a.1.x", "running")

        took_back = await waiting_in_line(store)
        assert await ds.release_run(took_back, owner="a.1.x", queue=True)  # a sweep
        assert await ds.claim_run(took_back, "a.1.x", 30, attempt=0) is None, "nobody's now"
        assert await ds.claim_run(took_back, "a.1.x", 30) == 1  # its own queue took it back
        held = await store.get_run(took_back)
        assert await ds.claim_run(took_back, "a.1.x", 30, attempt=0) is None, "claimed since"
        await assert_held_as(store, took_back, held, attempts=1)
        await store.append(took_back, [delta("b")], held_by=Holder("a.1.x", 1))  # still its
        assert await ds.claim_run(took_back, "a.1.x", 30, attempt=1) == 2, "from attempt 1"

    async def test_a_suspended_run_is_queued_again_once(self, store: EventStore) -> None:
        ds = durable(store)
        run_id = await admitted(store, durable=True)
        assert await ds.claim_run(run_id, "a.1.x", 30) == 1
        assert await ds.release_run(run_id, owner="a.1.x", queue=False)
        spec = await ds.get_run_spec(run_id)
        assert spec is not None and spec.queued_at is None
        results = await asyncio.gather(
            *(ds.release_run(run_id, owner=None, queue=True) for _ in range(4))
        )
        assert sorted(results) == [False, False, False, True], "exactly one resume request wins"

    async def test_a_lost_queued_run_is_queued_again_by_one_caller(self, store: EventStore) -> None:
        ds = durable(store)
        run_id = await admitted(store, durable=True, resume="queue", queue="q1", queued_at=1.0)
        # As a sweep does: the time as the store keeps it (PostgreSQL: on its clock, ADR 0066).
        was = await queued_since(store, run_id)
        assert was < 60, "queued long ago"
        results = await asyncio.gather(*(ds.requeue_run(run_id, queued_at=was) for _ in range(4)))
        assert sorted(results) == [False, False, False, True], "exactly one sweep puts it back"
        spec = await ds.get_run_spec(run_id)
        assert spec is not None and spec.queued_at is not None
        assert abs(spec.queued_at - time.time()) < 60, "queued again from now"
        assert not await ds.requeue_run(run_id, queued_at=was), "no longer queued since then"
        assert await ds.requeue_run(run_id, queued_at=spec.queued_at)
        assert await ds.claim_run(run_id, "a.1.x", 30) == 1
        spec = await ds.get_run_spec(run_id)
        assert spec is not None
        assert not await ds.requeue_run(run_id, queued_at=spec.queued_at or 0.0), "held"
        assert await ds.release_run(run_id, owner="a.1.x", queue=False)
        assert not await ds.requeue_run(run_id, queued_at=0.0), "suspended, not queued"
        ended = await admitted(store, durable=True, resume="queue", queue="q1", queued_at=1.0)
        was = await queued_since(store, ended)
        await store.finish_run(ended, [], RunEnding("completed"))
        assert not await ds.requeue_run(ended, queued_at=was), "ended"

    async def test_open_runs_say_since_when_each_waits_on_a_queue(self, store: EventStore) -> None:
        """What a sweep decides with, without reading any spec (ADR 0066): a queued run's
        ``queued_at``, and none for a suspended, a held or a spec-less run; not an ended one."""
        ds = durable(store)
        queued = await admitted(store, durable=True, resume="queue", queue="q1", queued_at=1.5)
        was = await queued_since(store, queued)
        suspended = await admitted(store, durable=True, queued_at=None)
        held = await admitted(store, durable=True, resume="queue", queue="q1", queued_at=2.5)
        assert await ds.claim_run(held, "a.1.x", 30) == 1
        plain = make_run()
        await store.create_run(plain)
        ended = await admitted(store, durable=True, resume="queue", queue="q1", queued_at=3.5)
        await store.finish_run(ended, [], RunEnding("completed"))
        found = {run.run_id: run for run in (await store.open_runs()).runs}
        assert set(found) == {queued, suspended, held, plain.run_id}
        assert found[queued].queued_at == was and found[queued].owner is None
        assert found[suspended].queued_at is None
        assert found[held].queued_at is None and found[held].owner == "a.1.x"
        assert found[plain.run_id].queued_at is None

    async def test_an_end_by_an_execution_whose_run_was_taken_over_is_refused(
        self, store: EventStore
    ) -> None:
        """ADR 0072: A claims, A's lease expires, a sweep releases the run and B claims it
        (resumes it); A, which stalled past its lease, then records its end: refused, nothing
        stored; B's end is recorded."""
        ds = durable(store)
        run_id = await admitted(store, durable=True, resume="queue", queue="q1")
        assert await ds.claim_run(run_id, "a.1.x", 0.0) == 1  # its lease expires at once
        expired_by = (await store.open_runs()).now  # as a sweep reads it, on the store's clock
        assert await ds.release_run(run_id, owner="a.1.x", lease_expired_by=expired_by, queue=True)
        assert await ds.claim_run(run_id, "b.2.y", 30) == 2
        before = await store.read(run_id)
        a_end = NewEvent(EventType.RUN_INTERRUPTED, {"status": "interrupted", "reason": "a"})
        with pytest.raises(RunTakenOverError):
            await store.finish_run(
                run_id, [a_end], RunEnding("completed", held_by=Holder("a.1.x", 1))
            )
        run = await store.get_run(run_id)
        assert (run.status, run.owner) == ("running", "b.2.y"), "B still executes it"
        assert await store.read(run_id) == before, "nothing of A's end is stored"
        await store.append(run_id, [NewEvent(EventType.MESSAGE_DELTA, {"text": "b"})])
        b_end = NewEvent(EventType.RUN_INTERRUPTED, {"status": "interrupted", "reason": "b"})
        out = await store.finish_run(
            run_id, [b_end], RunEnding("completed", held_by=Holder("b.2.y", 2))
        )
        assert [e.type for e in out] == [EventType.RUN_INTERRUPTED]
        assert (await store.get_run(run_id)).status == "completed"
        assert (
            await store.finish_run(run_id, [], RunEnding("failed", held_by=Holder("a.1.x", 1)))
            == []
        ), "an ended run: nothing to refuse, as before"

    async def test_a_later_claim_of_the_same_process_fences_its_earlier_execution(
        self, store: EventStore
    ) -> None:
        ds = durable(store)
        run_id = await admitted(store, durable=True)
        assert await ds.claim_run(run_id, "a.1.x", 30) == 1
        assert await ds.release_run(run_id, owner="a.1.x", queue=True)
        with pytest.raises(RunTakenOverError):  # released, not claimed yet: nobody's to end
            await store.finish_run(run_id, [], RunEnding("completed", held_by=Holder("a.1.x", 1)))
        assert await ds.claim_run(run_id, "a.1.x", 30) == 2
        with pytest.raises(RunTakenOverError):
            await store.finish_run(run_id, [], RunEnding("completed", held_by=Holder("a.1.x", 1)))
        await store.finish_run(run_id, [], RunEnding("completed", held_by=Holder("a.1.x", 2)))
        assert (await store.get_run(run_id)).status == "completed"

    async def test_ends_that_name_no_attempt_or_no_execution(self, store: EventStore) -> None:
        """A run executed without a claim (no spec, or a plain run) is fenced by its owner; a
        sweep's end names no execution and is fenced by the lease alone, as before."""
        plain = make_run(owner="a.1.x", lease_expires_at=time.time() + 30)
        await store.create_run(plain)
        with pytest.raises(RunTakenOverError):
            await store.finish_run(plain.run_id, [], RunEnding("completed", held_by=Holder("b")))
        await store.finish_run(plain.run_id, [], RunEnding("completed", held_by=Holder("a.1.x")))
        assert (await store.get_run(plain.run_id)).status == "completed"
        ds = durable(store)
        run_id = await admitted(store, durable=True)
        assert await ds.claim_run(run_id, "a.1.x", 0.0) == 1
        swept = RunEnding("interrupted", lease_expired_by=(await store.open_runs()).now)
        await store.finish_run(run_id, [], swept)
        assert (await store.get_run(run_id)).status == "interrupted"

    async def test_an_unclaimed_queued_run_is_ended_as_nobodys_until_a_claim(
        self, store: EventStore
    ) -> None:
        """ADR 0082: the process that admitted a queued run ends it as nobody's
        (``UNCLAIMED``) when its start is cancelled -- unless a replica claimed it first, or
        claimed it once (a run released again has been executed, and is not its to end)."""
        ds = durable(store)
        queued = await admitted(store, durable=True, resume="queue", queue="q1", queued_at=1.0)
        end = NewEvent(EventType.RUN_INTERRUPTED, {"status": "interrupted", "reason": "x"})
        out = await store.finish_run(queued, [end], RunEnding("interrupted", held_by=UNCLAIMED))
        assert [e.type for e in out] == [EventType.RUN_INTERRUPTED]
        assert (await store.get_run(queued)).status == "interrupted"
        assert await ds.claim_run(queued, "b.2.y", 30) is None, "a claim after it finds it ended"
        claimed = await admitted(store, durable=True, resume="queue", queue="q1", queued_at=1.0)
        assert await ds.claim_run(claimed, "b.2.y", 30) == 1
        with pytest.raises(RunTakenOverError):
            await store.finish_run(claimed, [end], RunEnding("interrupted", held_by=UNCLAIMED))
        assert (await store.get_run(claimed)).owner == "b.2.y", "it executes there"
        assert await ds.release_run(claimed, owner="b.2.y", queue=True)
        with pytest.raises(RunTakenOverError):  # nobody's now, but it was claimed once
            await store.finish_run(claimed, [end], RunEnding("interrupted", held_by=UNCLAIMED))
        assert (await store.get_run(claimed)).status == "running"

    async def test_of_two_executions_ending_at_once_only_the_holder_ends_the_run(
        self, store: EventStore
    ) -> None:
        """Both ends in flight together (SQLite merges them into one write, ADR 0033)."""
        runs = await taken_over(store, 3)
        ends = [
            store.finish_run(run_id, [], RunEnding(status, held_by=Holder(owner, attempt)))
            for run_id in runs
            for status, owner, attempt in (("failed", "a.1.x", 1), ("completed", "b.2.y", 2))
        ]
        results = await asyncio.gather(*ends, return_exceptions=True)
        # A's end is refused, or finds the run ended when B's committed first (PostgreSQL runs
        # them at once); B's is recorded either way.
        assert all(isinstance(r, RunTakenOverError) or r == [] for r in results[0::2])
        assert results[1::2] == [[], [], []]
        for run_id in runs:
            assert (await store.get_run(run_id)).status == "completed"

    async def test_an_append_by_an_execution_whose_run_was_taken_over_is_refused(
        self, store: EventStore
    ) -> None:
        """ADR 0090: A claims, a sweep releases the run and B claims it (attempt 2); A, which
        stalled past its lease, then appends -- deltas alone, or events the run index takes
        too: refused, nothing stored; B's appends are numbered on from B's own."""
        ds = durable(store)
        run_id = await admitted(store, durable=True, resume="queue", queue="q1")
        task_id = (await store.get_run(run_id)).tasks[0].task_id
        a, b = Holder("a.1.x", 1), Holder("b.2.y", 2)
        assert await ds.claim_run(run_id, "a.1.x", 30) == 1
        await store.append(run_id, [delta("a before")], held_by=a)
        assert await ds.release_run(run_id, owner="a.1.x", queue=True)
        assert await ds.claim_run(run_id, "b.2.y", 30) == 2
        await store.append(run_id, [delta("b first")], held_by=b)
        before = await store.read(run_id)
        started = NewEvent(EventType.TASK_STARTED, {"index": 0}, task_id=task_id)
        for batch in ([delta("a after")], [started, delta("a after")]):
            with pytest.raises(RunTakenOverError) as refused:
                await store.append(run_id, batch, held_by=a)
            assert refused.value.holder == "b.2.y" and "events" in str(refused.value)
        assert await store.read(run_id) == before, "nothing of A's appends is stored"
        assert (await store.get_run(run_id)).tasks[0].status == "pending", "nor indexed"
        out = await store.append(run_id, [delta("b second")], held_by=b)
        assert [e.seq for e in out] == [before[-1].seq + 1]
        await store.finish_run(run_id, [], RunEnding("completed", held_by=b))
        with pytest.raises(RunClosedError):  # an ended run refuses everyone, as before
            await store.append(run_id, [delta("a late")], held_by=a)

    async def test_appends_are_fenced_by_the_attempt_and_by_the_owner_alone_without_one(
        self, store: EventStore
    ) -> None:
        """The same process's later claim fences its earlier execution's appends; a run
        released and not claimed yet is nobody's to append to; a run admitted as its claim is
        held at attempt 1; a plain run (no attempt) is fenced by its owner."""
        ds = durable(store)
        run_id = await admitted(store, durable=True)
        assert await ds.claim_run(run_id, "a.1.x", 30) == 1
        assert await ds.release_run(run_id, owner="a.1.x", queue=True)
        with pytest.raises(RunTakenOverError):
            await store.append(run_id, [delta("x")], held_by=Holder("a.1.x", 1))
        assert await ds.claim_run(run_id, "a.1.x", 30) == 2
        with pytest.raises(RunTakenOverError):
            await store.append(run_id, [delta("x")], held_by=Holder("a.1.x", 1))
        await store.append(run_id, [delta("y")], held_by=Holder("a.1.x", 2))
        assert [e.payload["text"] for e in await store.read(run_id)] == ["y"]

        mine = make_run(tasks=1, owner="a.1.x", lease_expires_at=time.time() + 30)
        spec = RunSpecRecord(mine.run_id, dict(SPEC), durable=True, attempts=1)
        assert (await ds.admit_run(mine, spec)).admitted
        await store.append(mine.run_id, [delta("z")], held_by=Holder("a.1.x", 1))
        with pytest.raises(RunTakenOverError):
            await store.append(mine.run_id, [delta("z")], held_by=Holder("a.1.x", 2))

        plain = make_run(owner="a.1.x", lease_expires_at=time.time() + 30)
        await store.create_run(plain)
        with pytest.raises(RunTakenOverError):
            await store.append(plain.run_id, [delta("p")], held_by=Holder("b.2.y"))
        await store.append(plain.run_id, [delta("p")], held_by=Holder("a.1.x"))
        await store.append(plain.run_id, [delta("q")])  # no holder: not fenced (its creator)
        assert [e.payload["text"] for e in await store.read(plain.run_id)] == ["p", "q"]

    async def test_task_and_run_writes_of_a_superseded_execution_are_refused(
        self, store: EventStore
    ) -> None:
        """ADR 0094: an execution's writes to its run's rows outside ``append`` -- a task's
        record (its readable reasoning), the run's metadata -- are fenced as its appends are:
        A's, after a sweep released the run and B claimed it, raise ``RunTakenOverError``
        naming B and change nothing; B's apply; an ended run refuses them as an append; a write
        naming no execution is not fenced."""
        ds = durable(store)
        run_id = await admitted(store, durable=True, resume="queue", queue="q1")
        a, b = Holder("a.1.x", 1), Holder("b.2.y", 2)
        assert await ds.claim_run(run_id, "a.1.x", 30) == 1
        task = (await store.get_run(run_id)).tasks[0]
        task.status, task.output, task.reasoning = "completed", "A's", "A thinks"
        await store.save_task(task, held_by=a)
        await store.update_run(run_id, metadata={"by": "a"}, held_by=a)
        assert await ds.release_run(run_id, owner="a.1.x", queue=False)
        await store.update_run(run_id, metadata={"suspended": {"reason": "lost"}})  # the sweep's
        for holder in (a, b):  # released: nobody's
            with pytest.raises(RunTakenOverError):
                await store.update_run(run_id, metadata={"suspended": None}, held_by=holder)
        assert await ds.claim_run(run_id, "b.2.y", 30) == 2
        before = await store.get_run(run_id)
        stale = dataclasses.replace(task, output="A's again", reasoning="A thinks again")
        with pytest.raises(RunTakenOverError) as refused:
            await store.save_task(stale, held_by=a)
        assert refused.value.holder == "b.2.y"
        with pytest.raises(RunTakenOverError):
            await store.update_run(run_id, metadata={"suspended": None}, held_by=a)
        with pytest.raises(RunTakenOverError):  # the same owner's earlier attempt
            await store.update_run(run_id, metadata={"x": 1}, held_by=Holder("b.2.y", 1))
        after = await store.get_run(run_id)
        assert after.tasks == before.tasks and after.metadata == before.metadata
        assert after.metadata["suspended"] == {"reason": "lost"}, "the sweep's, not cleared"
        await store.update_run(run_id, metadata={"suspended": None}, held_by=b)
        mine = dataclasses.replace(task, output="B's", reasoning="B thinks")
        await store.save_task(mine, held_by=b)
        now = await store.get_run(run_id)
        assert now.metadata["suspended"] is None and now.tasks[0].reasoning == "B thinks"
        await store.finish_run(run_id, [], RunEnding("completed", held_by=b))
        with pytest.raises(RunClosedError):
            await store.save_task(mine, held_by=b)
        with pytest.raises(RunClosedError):
            await store.update_run(run_id, metadata={"late": 1}, held_by=b)
        await store.update_run(run_id, metadata={"note": 1})  # no holder: not fenced (an admin)
        plain = make_run(tasks=1, owner="a.1.x", lease_expires_at=time.time() + 30)
        await store.create_run(plain)
        with pytest.raises(RunTakenOverError):  # a plain run: fenced by its owner
            await store.save_task(plain.tasks[0], held_by=Holder("b.2.y"))
        await store.save_task(plain.tasks[0], held_by=Holder("a.1.x"))

    async def test_of_appends_in_flight_together_only_the_holders_are_stored(
        self, store: EventStore
    ) -> None:
        """Both executions' appends in flight at once, on several runs (SQLite merges them into
        one write, ADR 0030): each of A's is refused alone, B's are stored, gap-free."""
        runs = await taken_over(store, 3)
        writes = [
            store.append(run_id, [delta(f"{who} {k}")], held_by=holder)
            for k in range(2)
            for run_id in runs
            for who, holder in (("a", Holder("a.1.x", 1)), ("b", Holder("b.2.y", 2)))
        ]
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert all(isinstance(r, RunTakenOverError) for r in results[0::2])
        assert not any(isinstance(r, BaseException) for r in results[1::2])
        for run_id in runs:
            events = await store.read(run_id)
            # (in either order where they commit at once: PostgreSQL)
            assert sorted(e.payload["text"] for e in events) == ["b 0", "b 1"]
            assert [e.seq for e in events] == [1, 2]

    async def test_a_sweep_beside_more_leased_runs_than_a_page_sees_every_other_run(
        self, store: EventStore
    ) -> None:
        """A daemon's sweep reads a page of open runs a pass (ADR 0074): beside more runs
        leased elsewhere than a page, an expired run is released on the first pass and a
        queued run on no queue put back within one walk through the open runs, while the
        suspended run is looked at and left alone. (Before, a sweep read the 1000 open runs
        with the oldest leases: beyond 1000 leased runs it never saw a run without a lease.)"""
        far = Owner("another-host", 4242, "n").owner_id
        for _ in range(5):
            await store.create_run(make_run(status="running", owner=far, lease_expires_at=4e9))
        lost = await admitted(store, durable=True, resume="queue", queue="q", queued_at=1.0)
        suspended = await admitted(store, durable=True)
        orphan = make_run(tasks=1, status="running", owner=far, lease_expires_at=1.0)
        await durable(store).admit_run(
            orphan, RunSpecRecord(orphan.run_id, dict(SPEC), durable=True)
        )
        requeued: list[str] = []
        asked: set[str] = set()
        seen: set[str] = set()
        reads = store.open_runs

        async def spied(**kw: Any) -> OpenRuns:
            found = await reads(**kw)
            seen.update(run.run_id for run in found.runs)
            return found

        async def requeue(run_id: str, spec: RunSpecRecord) -> None:
            requeued.append(run_id)

        async def on_queue(run_ids: Sequence[str]) -> dict[str, float | None]:
            asked.update(run_ids)
            return {}  # on no queue

        cursor = SweepCursor()
        passes = 0
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(store, "open_runs", spied)
            while passes == 0 or cursor.after is not None:  # one walk through the open runs
                passes += 1
                assert passes <= 5, "8 open runs, 2 a page, then the wrap"
                await close_orphaned_runs(
                    store, requeue=requeue, on_queue=on_queue, cursor=cursor, page=2
                )
                if passes == 1:
                    released = await store.get_run(orphan.run_id)
                    assert released.owner is None, "an expired lease does not wait its page"
                    assert released.metadata["suspended"]["resume"] == "manual"
        assert requeued == [lost] and asked == {lost}
        assert suspended in seen
        run = await store.get_run(suspended)
        assert run.status in ("pending", "running") and "suspended" not in run.metadata

    async def test_a_sweep_that_dies_after_its_release_leaves_the_run_saying_why_it_waits(
        self, store: EventStore
    ) -> None:
        """ADR 0112: a sweep releases an orphaned durable run and records why it waits
        (``metadata.suspended``) in one transaction. Its process dying right after the release
        committed leaves a run that says why it waits and how it resumes -- never an ownerless
        run that says ``running`` and nothing more, which no later sweep looks at again (it has
        no owner, no lease, and is on no queue). A run to resume on a queue is put back there by
        the next sweep. (Before: two transactions, the record lost with the process.)"""
        far = Owner("another-host", 4242, "n").owner_id
        runs: dict[str, str] = {}
        for resume in ("manual", "queue"):
            orphan = make_run(tasks=1, status="running", owner=far, lease_expires_at=1.0)
            spec = RunSpecRecord(
                orphan.run_id,
                dict(SPEC),
                durable=True,
                resume=resume,  # type: ignore[arg-type]
                queue="q" if resume == "queue" else None,
            )
            assert (await durable(store).admit_run(orphan, spec)).admitted
            runs[resume] = orphan.run_id
        released = durable(store).release_run

        class Died(Exception):
            """The sweeping process, gone right after its release committed."""

        async def dies_after(run_id: str, **kw: Any) -> bool:
            assert await released(run_id, **kw)
            raise Died(run_id)

        requeued: list[str] = []

        async def requeue(run_id: str, spec: RunSpecRecord) -> None:
            requeued.append(run_id)

        async def on_no_queue(run_ids: Sequence[str]) -> dict[str, float | None]:
            return {}

        for _ in runs:  # each sweep dies at its first release
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(store, "release_run", dies_after)
                with pytest.raises(Died):
                    await close_orphaned_runs(store, requeue=requeue)
        assert requeued == []
        for resume, run_id in runs.items():
            run = await store.get_run(run_id)
            assert run.owner is None and run.status == "running"
            suspended = run.metadata.get("suspended")
            assert suspended is not None, f"a released {resume} run says nothing of why it waits"
            assert (suspended["reason"], suspended["resume"]) == (EXPIRED, resume)
            assert run.metadata["previous_executor"] == far
        # The next sweep (another process's) finishes what is left: the queue's run goes back
        # on its queue; the manual run waits for ``thoughtgate resume``, as it says.
        await close_orphaned_runs(store, requeue=requeue, on_queue=on_no_queue, lost_after_s=0)
        assert requeued == [runs["queue"]]
        manual = await store.get_run(runs["manual"])
        assert manual.owner is None and manual.metadata["suspended"]["resume"] == "manual"

    async def test_nothing_moves_an_ended_run(self, store: EventStore) -> None:
        ds = durable(store)
        run_id = await admitted(store, durable=True)
        await store.finish_run(run_id, [], RunEnding("completed"))
        assert await ds.claim_run(run_id, "a.1.x", 30) is None
        assert not await ds.release_run(run_id, owner=None, queue=True)

    async def test_quota_counts_open_runs_of_one_key_only(self, store: EventStore) -> None:
        ds = durable(store)
        quota = Quota("k1", max_open=3, max_per_minute=100)
        ids = []
        for rank in (1, 2, 3):
            run = make_run()
            answer = await ds.admit_run(
                run, RunSpecRecord(run.run_id, SPEC, key_id="k1"), quota=quota
            )
            assert answer.admitted
            assert answer.rank == rank, "a key's Nth open run queues with priority N"
            ids.append(run.run_id)
        refused = make_run()
        answer = await ds.admit_run(
            refused, RunSpecRecord(refused.run_id, SPEC, key_id="k1"), quota=quota
        )
        assert not answer.admitted and answer.retry_after > 0 and "3" in answer.reason
        with pytest.raises(Exception, match="run"):
            await store.get_run(refused.run_id)  # a refused run is not stored
        other = make_run()
        assert (
            await ds.admit_run(
                other, RunSpecRecord(other.run_id, SPEC, key_id="k2"), quota=Quota("k2", 3, 100)
            )
        ).admitted, "another key still starts runs"
        await store.finish_run(ids[0], [], RunEnding("completed"))
        again = make_run()
        assert (
            await ds.admit_run(again, RunSpecRecord(again.run_id, SPEC, key_id="k1"), quota=quota)
        ).admitted, "an ended run frees its place"

    async def test_quota_counts_starts_per_minute(self, store: EventStore) -> None:
        ds = durable(store)
        quota = Quota("k1", max_open=100, max_per_minute=2)
        for _ in range(2):
            run = make_run()
            assert (
                await ds.admit_run(run, RunSpecRecord(run.run_id, SPEC, key_id="k1"), quota=quota)
            ).admitted
            await store.finish_run(run.run_id, [], RunEnding("completed"))
        run = make_run()
        answer = await ds.admit_run(run, RunSpecRecord(run.run_id, SPEC, key_id="k1"), quota=quota)
        assert not answer.admitted
        assert 1 <= answer.retry_after <= 60

    async def test_concurrent_admissions_never_exceed_the_quota(self, store: EventStore) -> None:
        ds = durable(store)
        quota = Quota("k1", max_open=5, max_per_minute=100)

        async def one() -> bool:
            run = make_run()
            spec = RunSpecRecord(run.run_id, SPEC, key_id="k1")
            return (await ds.admit_run(run, spec, quota=quota)).admitted

        results = await asyncio.gather(*(one() for _ in range(12)))
        assert sum(results) == 5

    async def test_run_queues_with_their_tools(self, store: EventStore) -> None:
        ds = durable(store)
        await ds.save_run_queue(RunQueueRecord("q-a", ("lookup", "dangerous"), 8))
        await ds.save_run_queue(RunQueueRecord("q-b", (), 4))
        await ds.save_run_queue(RunQueueRecord("q-b", ("lookup",), 2))
        found = {q.name: q for q in await ds.list_run_queues(seen_within_s=60)}
        assert found["q-a"].tools == ("lookup", "dangerous") and found["q-a"].concurrency == 8
        assert found["q-b"].tools == ("lookup",) and found["q-b"].concurrency == 2
