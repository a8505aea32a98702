"""A run whose workflow ends while the run is open is put back on a queue with its checkpoints,
and a stalled execution that lost its workflow hands its run back (ADR 0065).

* A replica takes a queued run's workflow and its claim fails -- the store briefly unavailable:
  the workflow ends ``ERROR``, the run open and queued. DBOS's ``resume_workflow`` leaves an
  ended workflow as it is, so the sweep now puts it back on a queue itself, at its next pass --
  not once the run has been queued for a lease (and its workflow deleted, checkpoints and all).
* A run whose end the store refused ends its workflow too (the execution is over): once its
  lease runs out the lease sweep puts it back, and it resumes from its checkpoints -- a
  checkpointed model turn is not asked again; the sweep does not delete that workflow meanwhile.
* A replica stalled between taking a run's workflow and claiming it has its run put back on a
  queue (ADR 0063). DBOS fences each taking of a workflow with its own token: the stalled
  execution can neither checkpoint a step nor record the workflow's outcome once it was put back.
  When its claim loses, it records nothing anywhere; when its claim wins, its first checkpoint is
  refused and it hands the run back at once -- it does not end it -- and the workflow's current
  execution resumes it.

The replicas are simulated in this process: DBOS's own dequeue statement, run with a token of the
test's, takes a workflow from a queue this daemon does not listen to, and DBOS's own entry point
for a dequeued workflow executes it (the stalled replica), later.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS
from dbos._core import execute_dequeued_workflow
from support.durable import until
from support.durable_engine import SweepingDaemon, launched_by
from support.pg import PG_URL, pg_admin, pg_schema

from thoughtgate.config import Config
from thoughtgate.errors import StoreUnavailableError, WorkflowFailed
from thoughtgate.events.schema import RUN_TERMINAL_TYPES, Event, EventType, NewEvent
from thoughtgate.orchestration import dbos_private
from thoughtgate.orchestration.durable import APP_VERSION
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore, RunEnding
from thoughtgate.store.durable import RunSpecRecord
from thoughtgate.store.leases import WORKFLOW_TAKEN_OVER, close_orphaned_runs
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, text

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name

pytestmark = [pytest.mark.timeout(90)]

TTL_S = 1.0
NOBODYS_QUEUE = "thoughtgate-runs-nobody-listens-c1"
"""A queue no replica takes runs from: a workflow put there stays until the test takes it."""
OTHER_REPLICA = "0123456789abcdef.4242.otherreplica"


class Refusing:
    """A store that refuses the next claim of the runs in ``claims`` and every end of the runs
    in ``ends``, as a store unavailable for longer than the retries would; anything else is
    recorded."""

    claims: set[str]
    ends: set[str]

    async def claim_run(
        self, run_id: str, owner: str, ttl_s: float, *, attempt: int | None = None
    ) -> int | None:
        if run_id in self.claims:
            self.claims.discard(run_id)
            raise StoreUnavailableError("database is locked")
        return await super().claim_run(  # type: ignore[misc, no-any-return]
            run_id, owner, ttl_s, attempt=attempt
        )

    async def finish_run(
        self, run_id: str, events: Sequence[NewEvent], ending: RunEnding
    ) -> list[Event]:
        if run_id in self.ends:
            raise StoreUnavailableError("database is locked")
        return await super().finish_run(run_id, events, ending)  # type: ignore[misc, no-any-return]


class RefusingSQLite(Refusing, SQLiteStore):
    pass


class RefusingPostgres(Refusing, PostgresStore):
    pass


@pytest.fixture
def asked() -> Iterator[list[str]]:
    """``fake:counted`` answers each prompt with itself and notes each prompt it is asked."""
    prompts: list[str] = []

    def counted(request: TurnRequest, _: int) -> AsyncIterator[Any]:
        prompt = request.messages[-1].text if request.messages else ""
        prompts.append(prompt)

        async def gen() -> AsyncIterator[Any]:
            yield text(f"done: {prompt}")

        return gen()

    FAKE_SCRIPTS["counted"] = counted
    yield prompts
    del FAKE_SCRIPTS["counted"]


class _Daemon(SweepingDaemon[Any]):
    def __init__(self, store: Refusing) -> None:
        assert isinstance(store, EventStore)
        store.claims, store.ends = set(), set()
        super().__init__(
            store,
            Config.from_mapping(
                {"orchestration": {"lease_ttl_s": TTL_S}, "durability": {"poll_interval_s": 0.1}}
            ),
        )
        self.events: EventStore = store

    async def queued(self, *prompts: str, on: str) -> str:
        """A run of one task per prompt, queued for another replica, its workflow put on
        ``on``."""
        request = RunRequest(prompts[0], model="fake:counted", tasks=[TaskSpec(p) for p in prompts])
        run, rank = await self.runtime.admit(request, queue=NOBODYS_QUEUE)
        assert run.owner is None
        await self.engine.enqueue(run.run_id, on, priority=rank)
        return run.run_id

    async def status(self, run_id: str) -> str | None:
        found = await DBOS.get_workflow_status_async(run_id)
        return None if found is None else found.status


async def _launched(store: Refusing) -> _Daemon:
    daemon = _Daemon(store)
    await daemon.launch()
    await DBOS.register_queue_async(NOBODYS_QUEUE, worker_concurrency=1, polling_interval_sec=60)
    return daemon


@pytest.fixture
async def sqlite_daemon(tmp_path: Path) -> AsyncIterator[_Daemon]:
    async with launched_by(await RefusingSQLite.open(tmp_path / "runs.db"), _launched) as daemon:
        yield daemon


@pytest.fixture
async def postgres_daemon(pg_schema: str) -> AsyncIterator[_Daemon]:
    async with launched_by(
        await RefusingPostgres.open(PG_URL, schema=pg_schema), _launched
    ) as daemon:
        yield daemon


def _endings(types: list[EventType]) -> int:
    return sum(t in RUN_TERMINAL_TYPES for t in types)


# ---------------------------------------------------------------------- a claim that failed
async def _a_run_whose_claim_failed_is_put_back_at_the_next_sweep(daemon: _Daemon) -> None:
    run_id = await daemon.queued("one", on=NOBODYS_QUEUE)
    daemon.store.claims.add(run_id)
    await daemon.engine.resume(run_id, daemon.queue)  # onto this daemon's queue: it takes it

    async def workflow_ended() -> bool:
        return await daemon.status(run_id) == "ERROR"

    await until(workflow_ended)
    run = await daemon.events.get_run(run_id)
    assert (run.status, run.owner) == ("pending", None), "its claim failed: open, queued"

    requeued: list[str] = []

    async def requeue(run_id: str, spec: RunSpecRecord) -> None:
        requeued.append(run_id)
        await daemon.manager._requeue(run_id, spec)

    # A sweep that would put back a run lost on no queue only after an hour puts this one back
    # now: its workflow ended, so nothing executes it.
    await close_orphaned_runs(
        daemon.events,
        me=daemon.runtime.leases.owner,
        requeue=requeue,
        executing=daemon.runtime.leases,
        on_queue=daemon.engine.on_queue,
        lost_after_s=3600,
    )
    assert requeued == [run_id]
    await until(lambda: daemon.ended(run_id))
    assert (await daemon.events.get_run(run_id)).status == "completed"
    types = await daemon.types(run_id)
    assert _endings(types) == 1
    assert EventType.RUN_RESUMED not in types, "nothing of it ran before"


@pytest.mark.inprocess
async def test_a_run_whose_claim_failed_is_put_back_at_the_next_sweep_sqlite(
    sqlite_daemon: _Daemon, asked: list[str]
) -> None:
    await _a_run_whose_claim_failed_is_put_back_at_the_next_sweep(sqlite_daemon)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_run_whose_claim_failed_is_put_back_at_the_next_sweep_postgres(
    postgres_daemon: _Daemon, asked: list[str]
) -> None:
    await _a_run_whose_claim_failed_is_put_back_at_the_next_sweep(postgres_daemon)


@pytest.mark.inprocess
async def test_a_workflows_own_error_is_read_back_typed_and_quoting_nothing(
    sqlite_daemon: _Daemon, asked: list[str]
) -> None:
    """The workflow whose claim failed ended ``ERROR``; its outcome, read back from the workflows
    database, is a ``WorkflowFailed`` naming the class of the claim's error, never its words
    (ADR 0082; it was ``RuntimeError("StoreUnavailableError: ...")``)."""
    daemon = sqlite_daemon
    run_id = await daemon.queued("one", on=NOBODYS_QUEUE)
    daemon.store.claims.add(run_id)
    await daemon.engine.resume(run_id, daemon.queue)

    async def workflow_ended() -> bool:
        return await daemon.status(run_id) == "ERROR"

    await until(workflow_ended)
    handle = await DBOS.retrieve_workflow_async(run_id)
    with pytest.raises(WorkflowFailed) as raised:
        await handle.get_result()
    assert raised.value.kind == "StoreUnavailableError"
    assert str(raised.value) == "the run's workflow ended with an error (StoreUnavailableError)"
    assert "locked" not in str(raised.value)


# ---------------------------------------------------------------------- more than a page of them
@pytest.mark.inprocess
async def test_every_finished_workflow_is_looked_at_beyond_a_page_kept_for_open_runs(
    sqlite_daemon: _Daemon, asked: list[str]
) -> None:
    """The sweep deletes the finished workflows of ended runs and keeps those of open runs
    (ADR 0065), a page at a time, oldest first. A first page all kept -- open runs whose claim
    failed -- no longer hides the later ones: each sweep lists the next page (ADR 0074)."""
    daemon = sqlite_daemon

    async def finished(run_id: str, status: str, *, claim_fails: bool) -> str:
        if claim_fails:
            daemon.store.claims.add(run_id)
        await daemon.engine.resume(run_id, daemon.queue)

        async def done() -> bool:
            return await daemon.status(run_id) == status

        await until(done)
        return run_id

    kept = [
        await finished(await daemon.queued("k", on=NOBODYS_QUEUE), "ERROR", claim_fails=True)
        for _ in range(3)
    ]
    for run_id in kept:
        assert (await daemon.events.get_run(run_id)).status == "pending", "open, queued"
    ended = [
        await finished(await daemon.queued("e", on=NOBODYS_QUEUE), "SUCCESS", claim_fails=False)
        for _ in range(3)
    ]

    async def all_ended() -> bool:
        return all([await daemon.ended(run_id) for run_id in ended])

    await until(all_ended)
    daemon.manager.finished_page = 2  # the first page: two workflows of open runs
    for _ in range(6):  # two a sweep: more than a walk through the six of them
        await daemon.manager._forget_ended()
    assert [await daemon.status(run_id) for run_id in kept] == ["ERROR"] * 3
    assert [await daemon.status(run_id) for run_id in ended] == [None] * 3


# ---------------------------------------------------------------------- an end that was refused
async def _a_run_whose_end_was_refused_resumes_from_its_checkpoints(
    daemon: _Daemon, asked: list[str]
) -> None:
    run_id = await daemon.queued("one", "two", on=NOBODYS_QUEUE)
    daemon.store.ends.add(run_id)
    daemon.manager.start_sweeping()  # deletes ended workflows, every two thirds of a lease
    await daemon.engine.resume(run_id, daemon.queue)

    async def workflow_ended() -> bool:
        return await daemon.status(run_id) == "SUCCESS"

    await until(workflow_ended)  # its execution is over, its end refused throughout
    assert asked == ["one", "two"]
    assert (await daemon.events.get_run(run_id)).status == "running"
    daemon.store.ends.clear()  # the store recovers; the lease sweep takes the run
    await until(lambda: daemon.ended(run_id))
    run = await daemon.events.get_run(run_id)
    assert run.status == "completed"
    assert [t.output for t in run.tasks] == ["done: one", "done: two"]
    events = await daemon.events.read(run_id)
    (resumed,) = [e for e in events if e.type == EventType.RUN_RESUMED]
    assert resumed.payload["attempt"] == 2
    assert _endings([e.type for e in events]) == 1
    # Task one's model turn came back from its checkpoint; task two's ended the run's first
    # execution, whose ending commit was refused, so it was asked again.
    assert asked == ["one", "two", "two"]


@pytest.mark.inprocess
async def test_a_run_whose_end_was_refused_resumes_from_its_checkpoints_sqlite(
    sqlite_daemon: _Daemon, asked: list[str]
) -> None:
    await _a_run_whose_end_was_refused_resumes_from_its_checkpoints(sqlite_daemon, asked)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_run_whose_end_was_refused_resumes_from_its_checkpoints_postgres(
    postgres_daemon: _Daemon, asked: list[str]
) -> None:
    await _a_run_whose_end_was_refused_resumes_from_its_checkpoints(postgres_daemon, asked)


# ---------------------------------------------------------------------- a stalled replica
class _Stalled:
    """A replica that took a run's workflow from its queue and stalled before executing it."""

    def __init__(self, daemon: _Daemon, run_id: str) -> None:
        self.daemon = daemon
        self.run_id = run_id
        self.status: Any = None

    async def take(self, token: str, executor: str) -> Any:
        dbos = dbos_private.instance()
        queue = await DBOS.retrieve_queue_async(NOBODYS_QUEUE)
        assert queue is not None
        taken, _ = await asyncio.to_thread(
            dbos._sys_db.start_queued_workflows,
            queue,
            executor,
            APP_VERSION,
            None,
            owner_xid=token,
        )
        assert taken == [self.run_id]
        return await asyncio.to_thread(dbos._sys_db.get_workflow_status, self.run_id)

    async def put_back_by_a_sweep(self) -> None:
        """ADR 0063's sweep, for a run taken a lease ago and still unclaimed."""
        spec = await self.daemon.store.get_run_spec(self.run_id)  # type: ignore[attr-defined]
        assert spec is not None and spec.queued_at is not None
        assert await self.daemon.store.requeue_run(  # type: ignore[attr-defined]
            self.run_id, queued_at=spec.queued_at
        )
        await DBOS.resume_workflow_async(self.run_id, queue_name=NOBODYS_QUEUE)

    async def wake(self, status: Any, token: str) -> None:
        """Execute the workflow as DBOS's queue thread does once it took it."""
        await asyncio.to_thread(execute_dequeued_workflow, dbos_private.instance(), status, token)


async def _no_workflow_executing(daemon: _Daemon) -> bool:
    return not daemon.runtime.executing


async def _a_stalled_replica_whose_claim_loses_records_nothing(
    daemon: _Daemon, asked: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    system = dbos_private.system_database()
    outcomes: list[tuple[str, str, bool]] = []
    write_outcome = system.update_workflow_outcome

    def recording(workflow_id: str, status: str, **rest: Any) -> bool:
        written = write_outcome(workflow_id, status, **rest)
        outcomes.append((workflow_id, status, written))
        return bool(written)

    monkeypatch.setattr(system, "update_workflow_outcome", recording)
    run_id = await daemon.queued("one", "two", on=NOBODYS_QUEUE)
    stalled = _Stalled(daemon, run_id)
    taken = await stalled.take("stalled-token", daemon.runtime.leases.owner.owner_id)
    await stalled.put_back_by_a_sweep()
    # Another replica takes it and claims the run; it executes there.
    await stalled.take("live-token", OTHER_REPLICA)
    assert await daemon.store.claim_run(run_id, OTHER_REPLICA, 60.0) == 1  # type: ignore[attr-defined]
    before = await daemon.types(run_id)
    await stalled.wake(taken, "stalled-token")

    async def outcome_tried() -> bool:  # the stalled execution is over: it found the run held
        return bool(outcomes)

    await until(outcome_tried)
    assert outcomes == [(run_id, "SUCCESS", False)], "its outcome was refused"
    found = await DBOS.get_workflow_status_async(run_id)
    assert found is not None and (found.status, found.executor_id) == ("PENDING", OTHER_REPLICA)
    run = await daemon.events.get_run(run_id)
    assert (run.status, run.owner) == ("running", OTHER_REPLICA)
    assert await daemon.types(run_id) == before, "the stalled execution wrote nothing"
    assert asked == []


@pytest.mark.inprocess
async def test_a_stalled_replica_whose_claim_loses_records_nothing_sqlite(
    sqlite_daemon: _Daemon, asked: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await _a_stalled_replica_whose_claim_loses_records_nothing(sqlite_daemon, asked, monkeypatch)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_stalled_replica_whose_claim_loses_records_nothing_postgres(
    postgres_daemon: _Daemon, asked: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    await _a_stalled_replica_whose_claim_loses_records_nothing(postgres_daemon, asked, monkeypatch)


async def _a_stalled_replica_whose_claim_wins_hands_the_run_back(
    daemon: _Daemon, asked: list[str]
) -> None:
    run_id = await daemon.queued("one", "two", on=NOBODYS_QUEUE)
    stalled = _Stalled(daemon, run_id)
    me = daemon.runtime.leases.owner.owner_id
    taken = await stalled.take("stalled-token", me)
    await stalled.put_back_by_a_sweep()
    await stalled.wake(taken, "stalled-token")  # it claims the run before anyone takes it

    async def handed_back() -> bool:
        run = await daemon.events.get_run(run_id)
        return run.owner is None and "suspended" in run.metadata

    await until(handed_back)
    await until(lambda: _no_workflow_executing(daemon))
    run = await daemon.events.get_run(run_id)
    assert run.status == "running", "not ended: nothing went wrong with it"
    assert run.metadata["suspended"]["reason"] == WORKFLOW_TAKEN_OVER
    spec = await daemon.store.get_run_spec(run_id)  # type: ignore[attr-defined]
    assert spec is not None and spec.queued_at is not None and spec.attempts == 1
    assert _endings(await daemon.types(run_id)) == 0
    assert asked == ["one"], "its first model turn ran; its checkpoint was refused"
    assert await daemon.status(run_id) == "ENQUEUED", "the put-back workflow still waits"

    # The replica that takes the workflow now executes the run: it resumes it.
    live = await stalled.take("live-token", me)
    await stalled.wake(live, "live-token")
    await until(lambda: daemon.ended(run_id))
    run = await daemon.events.get_run(run_id)
    assert run.status == "completed"
    events = await daemon.events.read(run_id)
    (resumed,) = [e for e in events if e.type == EventType.RUN_RESUMED]
    assert resumed.payload["reason"] == WORKFLOW_TAKEN_OVER and resumed.payload["attempt"] == 2
    assert _endings([e.type for e in events]) == 1


@pytest.mark.inprocess
async def test_a_stalled_replica_whose_claim_wins_hands_the_run_back_sqlite(
    sqlite_daemon: _Daemon, asked: list[str]
) -> None:
    await _a_stalled_replica_whose_claim_wins_hands_the_run_back(sqlite_daemon, asked)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_stalled_replica_whose_claim_wins_hands_the_run_back_postgres(
    postgres_daemon: _Daemon, asked: list[str]
) -> None:
    await _a_stalled_replica_whose_claim_wins_hands_the_run_back(postgres_daemon, asked)
