"""A stalled execution's hand-back of its run moves nothing once its own process took the run
again (ADR 0093).

A durable execution that stalls inside a checkpointed step -- a model turn -- loses its run: a
sweep releases it and puts its workflow back on a queue, and this same process's queue worker
may be the one that takes it again (a new execution, attempt 2, the same owner id). When the
stalled execution wakes, its next append is refused (ADR 0090), the step records the refusal, and
DBOS refuses that checkpoint (the workflow carries the new execution's token): the stalled
execution hands its run back (ADR 0065, ``WORKFLOW_TAKEN_OVER``). Before, that release named the
owner only, so it took the run from the execution that held it now; the run waited for its
lease and resumed once more (attempt 3), its turn asked of the model again. And the stalled
execution's own ending, in this process, stopped renewing the run's lease and forgot its
workflow task, both kept by run id: the second execution ran on unrenewed, and a shutdown would
not have suspended it.

The replicas are simulated as in ``test_workflows_that_end_before_their_runs``: DBOS's own
dequeue statement, run with a token of the test's, takes the workflow from a queue this daemon
does not listen to, and DBOS's own entry point for a dequeued workflow executes it. The stall is
the model's stream waiting on a gate; the lease is a minute, so no renewal or sweep falls inside
the test, and the take-over is the sweep's own calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS
from dbos._core import execute_dequeued_workflow
from support.durable import until
from support.durable_engine import SweepingDaemon, launched_by
from support.pg import PG_URL, pg_admin, pg_schema

from thoughtgate.config import Config
from thoughtgate.events.schema import RUN_TERMINAL_TYPES, EventType
from thoughtgate.orchestration import dbos_private
from thoughtgate.orchestration.durable import APP_VERSION
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.store.durable import DurableRunStore
from thoughtgate.store.leases import WORKFLOW_TAKEN_OVER
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, reasoning, text

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name

pytestmark = [pytest.mark.timeout(90)]

LEASE_S = 60.0
NOBODYS_QUEUE = "thoughtgate-runs-nobody-listens-c2"


class Model:
    """``fake:stalls-twice``: the first turn (the stalled execution's, of the first task) says
    its answer, then waits on a gate before its stream ends; the second (the second execution's
    turn of the same task) waits on a gate before it says anything; every later turn answers at
    once. Notes every prompt it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.entered = [asyncio.Event(), asyncio.Event()]
        self.through = [asyncio.Event(), asyncio.Event()]

    def __call__(self, request: TurnRequest, _: int) -> AsyncIterator[Any]:
        prompt = request.messages[-1].text if request.messages else ""
        self.asked.append(prompt)
        return self._turn(len(self.asked) - 1, prompt)

    async def _turn(self, call: int, prompt: str) -> AsyncIterator[Any]:
        if call == 0:
            yield reasoning("the stalled execution thinks")
            yield text(f"done: {prompt} (stalled)")
        if call < 2:
            self.entered[call].set()
            await self.through[call].wait()
        if call > 0:
            yield text(f"done: {prompt} ({call})")


@pytest.fixture
def model() -> Iterator[Model]:
    model = Model()
    FAKE_SCRIPTS["stalls-twice"] = model
    yield model
    del FAKE_SCRIPTS["stalls-twice"]


class _Daemon(SweepingDaemon[Any]):
    """A daemon with a lease of a minute whose hand-backs the test can wait for."""

    def __init__(self, store: EventStore) -> None:
        super().__init__(
            store,
            Config.from_mapping(
                {"orchestration": {"lease_ttl_s": LEASE_S}, "durability": {"poll_interval_s": 0.1}}
            ),
        )
        assert isinstance(store, DurableRunStore)
        self.specs: DurableRunStore = store
        self.handed_back = asyncio.Event()
        hand_back = self.engine.hand_back

        async def noted(*args: Any) -> None:
            await hand_back(*args)
            self.handed_back.set()

        self.engine.hand_back = noted  # type: ignore[method-assign]

    @property
    def me(self) -> str:
        return self.runtime.leases.owner.owner_id

    async def take_and_execute(self, run_id: str, token: str) -> None:
        """Take the run's workflow from the queue with ``token`` and execute it, as DBOS's
        queue worker of this process does."""
        dbos = dbos_private.instance()
        queue = await DBOS.retrieve_queue_async(NOBODYS_QUEUE)
        assert queue is not None
        taken, _ = await asyncio.to_thread(
            dbos._sys_db.start_queued_workflows, queue, self.me, APP_VERSION, None, owner_xid=token
        )
        assert taken == [run_id]
        status = await asyncio.to_thread(dbos._sys_db.get_workflow_status, run_id)
        await asyncio.to_thread(execute_dequeued_workflow, dbos, status, token)


async def _launched(store: EventStore) -> _Daemon:
    daemon = _Daemon(store)
    await daemon.launch()
    await DBOS.register_queue_async(NOBODYS_QUEUE, worker_concurrency=2, polling_interval_sec=60)
    return daemon


@pytest.fixture
async def sqlite_daemon(tmp_path: Path) -> AsyncIterator[_Daemon]:
    async with launched_by(await SQLiteStore.open(tmp_path / "runs.db"), _launched) as daemon:
        yield daemon


@pytest.fixture
async def postgres_daemon(pg_schema: str) -> AsyncIterator[_Daemon]:
    async with launched_by(await PostgresStore.open(PG_URL, schema=pg_schema), _launched) as d:
        yield d


async def _a_stalled_hand_back_leaves_the_run_to_its_processs_later_claim(
    daemon: _Daemon, model: Model
) -> None:
    store, specs = daemon.store, daemon.specs
    request = RunRequest("one", model="fake:stalls-twice", tasks=[TaskSpec("one"), TaskSpec("two")])
    run, rank = await daemon.runtime.admit(request, queue=NOBODYS_QUEUE)
    run_id = run.run_id
    await daemon.engine.enqueue(run_id, NOBODYS_QUEUE, priority=rank)

    # The first execution claims the run (attempt 1), streams task one's answer, and stalls
    # before the stream ends, its deltas stored: the next write it makes is the turn's
    # checkpoint.
    await daemon.take_and_execute(run_id, "first-token")
    await model.entered[0].wait()

    async def streamed() -> bool:
        return any("(stalled)" in str(e.payload) for e in await store.read(run_id))

    await until(streamed)

    # A sweep takes the run from it -- as if its lease had run out -- and puts its workflow
    # back on the queue; this process's queue worker takes it again: attempt 2, same owner.
    assert await specs.release_run(run_id, owner=daemon.me, queue=True)
    await DBOS.resume_workflow_async(run_id, queue_name=NOBODYS_QUEUE)
    await daemon.take_and_execute(run_id, "second-token")
    await model.entered[1].wait()  # the second execution is in task one's turn now
    spec = await specs.get_run_spec(run_id)
    assert spec is not None and spec.attempts == 2

    # The first execution wakes: its stream ends, DBOS refuses its turn's checkpoint (the
    # workflow is the second execution's), and it hands the run back -- which must not take
    # the run from the second execution.
    model.through[0].set()
    await asyncio.wait_for(daemon.handed_back.wait(), 30)
    held = await store.get_run(run_id)
    assert (held.status, held.owner) == ("running", daemon.me), "still the second execution's"
    assert "suspended" not in held.metadata, "not handed back"
    spec = await specs.get_run_spec(run_id)
    assert spec is not None and (spec.attempts, spec.queued_at) == (2, None), "not queued again"
    assert run_id in daemon.runtime.leases.held, "its lease is still renewed"
    assert run_id in daemon.runtime.executing, "a shutdown would still suspend it"

    # The second execution goes on and ends the run: attempt 2 is the last.
    model.through[1].set()
    await until(lambda: daemon.ended(run_id))
    ended = await store.get_run(run_id)
    assert ended.status == "completed"
    events = await store.read(run_id)
    (resumed,) = [e for e in events if e.type == EventType.RUN_RESUMED]
    assert resumed.payload["attempt"] == 2
    after = [e for e in events if e.seq > resumed.seq]
    # Of the first execution's turn, only the resume's record of it as cut.
    quoting = [e for e in after if "(stalled)" in str(e.payload)]
    assert [(e.type, e.payload["complete"]) for e in quoting] == [
        (EventType.AGENT_RESPONSE, False)
    ], "nothing of the first execution lands after the claim"
    assert model.asked == ["one", "one", "two"], "each turn asked once per execution, no more"
    assert sum(e.type in RUN_TERMINAL_TYPES for e in events) == 1
    spec = await specs.get_run_spec(run_id)
    assert spec is not None and spec.attempts == 2, "no third execution"
    assert [t.output for t in ended.tasks] == ["done: one (1)", "done: two (2)"]
    assert all(e.payload.get("reason") != WORKFLOW_TAKEN_OVER for e in events)


@pytest.mark.inprocess
async def test_a_stalled_hand_back_leaves_the_run_to_its_processs_later_claim_sqlite(
    sqlite_daemon: _Daemon, model: Model
) -> None:
    await _a_stalled_hand_back_leaves_the_run_to_its_processs_later_claim(sqlite_daemon, model)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_stalled_hand_back_leaves_the_run_to_its_processs_later_claim_postgres(
    postgres_daemon: _Daemon, model: Model
) -> None:
    await _a_stalled_hand_back_leaves_the_run_to_its_processs_later_claim(postgres_daemon, model)
