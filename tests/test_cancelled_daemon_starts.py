"""A cancel of the daemon's start of a durable run ends the run at once, wherever the start had
put it (ADR 0082).

``RunManager.start`` admits a run, then hands it to the durable engine (``submit``): started here
(a DBOS workflow), waiting here for a slot, or put on a work queue. A cancel of the request that
lands while the engine does that -- the daemon's shutdown cancelling a request past its grace,
an embedding caller's own cancel -- left the run to the sweep: ``running`` or ``queued`` for up
to several leases, then put back on a queue and executed after all. Here the cancel is injected
deterministically (the engine's step waits on a gate the test opens after cancelling), and the
run ends ``interrupted`` once with the cancel's reason before the start returns; the model is
never asked. The end is fenced like every other (ADR 0072): a run a replica claimed first is
that replica's, and executes there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS
from support.durable_engine import SweepingDaemon, launched_by
from support.pg import PG_URL, pg_admin, pg_schema

from thoughtgate.config import Config
from thoughtgate.events.schema import RUN_TERMINAL_TYPES, EventType
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.server.manager import SHUTDOWN_REASON, START_CANCELLED
from thoughtgate.store.base import EventStore
from thoughtgate.store.durable import RunQueueRecord
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, text

__all__ = ["pg_admin", "pg_schema"]

pytestmark = pytest.mark.timeout(120)

TTL_S = 1.0
ELSEWHERE = "thoughtgate-runs-elsewhere-c1"
"""A queue of another replica (with a tool this daemon lacks) that nobody takes runs from."""
OTHER_REPLICA = "0123456789abcdef.4242.otherreplica"


class Gated:
    """A store that, when ``admissions`` is set, commits an admission and then waits on
    ``gate`` (where a test cancels the caller), and notes every prompt a model is asked."""

    admissions: asyncio.Event | None = None
    entered: asyncio.Event

    async def admit_run(self, *args: Any, **kwargs: Any) -> Any:
        out = await super().admit_run(*args, **kwargs)  # type: ignore[misc]
        if self.admissions is not None:
            self.entered.set()
            await self.admissions.wait()
        return out


class GatedSQLite(Gated, SQLiteStore):
    pass


class GatedPostgres(Gated, PostgresStore):
    pass


class _Daemon(SweepingDaemon[Any]):
    def __init__(self, store: Gated) -> None:
        assert isinstance(store, EventStore)
        store.entered = asyncio.Event()
        super().__init__(
            store,
            Config.from_mapping(
                {"orchestration": {"lease_ttl_s": TTL_S}, "durability": {"poll_interval_s": 0.1}}
            ),
        )
        self.gated = store
        self.events: EventStore = store

    def hold(self, name: str) -> tuple[asyncio.Event, asyncio.Event]:
        """Make the engine's step ``name`` wait on a gate once entered: (entered, gate)."""
        entered, gate = asyncio.Event(), asyncio.Event()
        real: Callable[..., Awaitable[Any]] = getattr(self.engine, name)

        async def held(*args: Any, **kwargs: Any) -> Any:
            entered.set()
            await gate.wait()
            return await real(*args, **kwargs)

        setattr(self.engine, name, held)
        return entered, gate

    async def cancelled_start(
        self, entered: asyncio.Event, gate: asyncio.Event, request: RunRequest, **start: Any
    ) -> str:
        """Start ``request`` as the daemon does, cancel the start once ``entered``, then open
        ``gate``; the start raises ``CancelledError``. Returns the run's id."""
        starting = asyncio.create_task(self.manager.start(request, **start))
        await entered.wait()
        starting.cancel()
        await asyncio.sleep(0)  # the cancel lands where the start waits
        gate.set()
        with pytest.raises(asyncio.CancelledError):
            await starting
        (run_id,) = [r.run_id for r in await self.events.list_runs()]
        return run_id

    async def types(self, run_id: str) -> list[str]:
        return [str(e.type) for e in await self.events.read(run_id)]


@pytest.fixture
def asked() -> Iterator[list[str]]:
    prompts: list[str] = []

    def counted(request: TurnRequest, _: int) -> Any:
        prompts.append(request.messages[-1].text if request.messages else "")

        async def gen() -> AsyncIterator[Any]:
            yield text("done")

        return gen()

    FAKE_SCRIPTS["counted"] = counted
    yield prompts
    del FAKE_SCRIPTS["counted"]


async def _launched(store: Gated) -> _Daemon:
    daemon = _Daemon(store)
    await daemon.launch()
    await DBOS.register_queue_async(ELSEWHERE, worker_concurrency=1, polling_interval_sec=60)
    # Another replica, with a tool this one lacks, says it takes runs from ELSEWHERE.
    await daemon.runtime.store.save_run_queue(  # type: ignore[attr-defined]
        RunQueueRecord(ELSEWHERE, ("elsewhere",), 1)
    )
    return daemon


@pytest.fixture
async def sqlite_daemon(tmp_path: Path) -> AsyncIterator[_Daemon]:
    async with launched_by(await GatedSQLite.open(tmp_path / "runs.db"), _launched) as daemon:
        yield daemon


@pytest.fixture
async def postgres_daemon(pg_schema: str) -> AsyncIterator[_Daemon]:
    async with launched_by(await GatedPostgres.open(PG_URL, schema=pg_schema), _launched) as daemon:
        yield daemon


def _two_tasks() -> RunRequest:
    """Two tasks: its first execution takes checkpoints, so it starts as a DBOS workflow."""
    return RunRequest("a", model="fake:counted", tasks=[TaskSpec("a"), TaskSpec("b")])


async def _ended_once(daemon: _Daemon, run_id: str, reason: str) -> None:
    run = await daemon.events.get_run(run_id)
    assert run.status == "interrupted", (
        f"it shows {run.status!r} {await daemon.types(run_id)} {run}"
    )
    assert run.error is not None and reason in run.error
    assert all(t.status == "interrupted" for t in run.tasks), "its tasks end first"
    types = await daemon.types(run_id)
    assert sum(t in RUN_TERMINAL_TYPES for t in types) == 1
    assert EventType.TASK_STARTED not in types, "its execution never began"
    assert run_id not in daemon.runtime.executing
    renewed = await daemon.events.renew_leases(daemon.runtime.leases.owner.owner_id, 30, [run_id])
    assert renewed == [], "ended: nobody renews it"


# ---------------------------------------------------------------------- started here
async def _a_cancel_while_its_workflow_starts_ends_it(daemon: _Daemon, asked: list[str]) -> None:
    entered, gate = daemon.hold("start")
    run_id = await daemon.cancelled_start(entered, gate, _two_tasks())
    await _ended_once(daemon, run_id, START_CANCELLED)
    assert asked == [], "the model was never asked"
    # Its workflow, cancelled before it began, is not left PENDING under this process, which no
    # later process would recover (ADR 0090): the next sweep deletes it.
    found = await DBOS.get_workflow_status_async(run_id)
    assert found is not None and found.status == "CANCELLED"
    # Nothing executes it later either: a sweep finds nothing to do with it.
    assert await daemon.manager.recover() == []
    assert await DBOS.get_workflow_status_async(run_id) is None
    await asyncio.sleep(0.3)  # two queue polls: a workflow put anywhere would be taken
    assert asked == []
    assert (await daemon.events.get_run(run_id)).status == "interrupted"


@pytest.mark.inprocess
async def test_a_cancel_while_its_workflow_starts_ends_it_sqlite(
    sqlite_daemon: _Daemon, asked: list[str]
) -> None:
    await _a_cancel_while_its_workflow_starts_ends_it(sqlite_daemon, asked)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_cancel_while_its_workflow_starts_ends_it_postgres(
    postgres_daemon: _Daemon, asked: list[str]
) -> None:
    await _a_cancel_while_its_workflow_starts_ends_it(postgres_daemon, asked)


@pytest.mark.inprocess
async def test_a_cancel_at_shutdown_says_so(sqlite_daemon: _Daemon, asked: list[str]) -> None:
    daemon = sqlite_daemon
    entered, gate = daemon.hold("start")
    starting = asyncio.create_task(daemon.manager.start(_two_tasks()))
    await entered.wait()
    daemon.manager._closing = True  # pyright: ignore[reportPrivateUsage]  # as shutdown sets it
    starting.cancel()
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await starting
    (run,) = await daemon.events.list_runs()
    await _ended_once(daemon, run.run_id, SHUTDOWN_REASON)


@pytest.mark.inprocess
async def test_a_start_of_one_task_without_a_workflow_is_stopped_too(
    sqlite_daemon: _Daemon, asked: list[str]
) -> None:
    """One model task without tools starts without a workflow (ADR 0031); cancelled while the
    engine's slot is looked at, it ends the same way."""
    daemon = sqlite_daemon
    entered, gate = daemon.hold("_begin")
    run_id = await daemon.cancelled_start(entered, gate, RunRequest("a", model="fake:counted"))
    await _ended_once(daemon, run_id, START_CANCELLED)
    assert asked == []


# ---------------------------------------------------------------------- on another queue
async def _a_cancel_while_it_is_queued_ends_it(daemon: _Daemon) -> None:
    entered, gate = daemon.hold("enqueue")
    run_id = await daemon.cancelled_start(
        entered, gate, RunRequest("a", model="fake:echo"), tools=["elsewhere"]
    )
    await _ended_once(daemon, run_id, START_CANCELLED)
    # The enqueue went through: its workflow is taken off the queue (no replica would take it
    # but to find the run ended; none may serve that queue at all: ADR 0090) and deleted by
    # the next sweep, with the workflows of ended runs.
    found = await DBOS.get_workflow_status_async(run_id)
    assert found is not None and found.status == "CANCELLED"
    assert await daemon.manager.recover() == []
    assert await DBOS.get_workflow_status_async(run_id) is None


@pytest.mark.inprocess
async def test_a_cancel_while_it_is_queued_ends_it_sqlite(sqlite_daemon: _Daemon) -> None:
    await _a_cancel_while_it_is_queued_ends_it(sqlite_daemon)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_cancel_while_it_is_queued_ends_it_postgres(postgres_daemon: _Daemon) -> None:
    await _a_cancel_while_it_is_queued_ends_it(postgres_daemon)


@pytest.mark.inprocess
async def test_a_run_a_replica_claimed_first_is_left_to_it(sqlite_daemon: _Daemon) -> None:
    """The enqueue went through and a replica took the run and claimed it before the cancelled
    start could end it: the end is refused, nothing of it is stored, the run executes there."""
    daemon = sqlite_daemon
    entered, gate = asyncio.Event(), asyncio.Event()
    real = daemon.engine.enqueue

    async def taken(run_id: str, queue: str, *, priority: int) -> None:
        entered.set()
        await gate.wait()
        await real(run_id, queue, priority=priority)
        await daemon.gated.claim_run(run_id, OTHER_REPLICA, 30)  # type: ignore[attr-defined]

    daemon.engine.enqueue = taken  # type: ignore[method-assign]
    run_id = await daemon.cancelled_start(
        entered, gate, RunRequest("a", model="fake:echo"), tools=["elsewhere"]
    )
    run = await daemon.events.get_run(run_id)
    assert (run.status, run.owner) == ("running", OTHER_REPLICA)
    types = await daemon.types(run_id)
    assert not any(t in RUN_TERMINAL_TYPES for t in types), "no end of the cancel's stored"


# ---------------------------------------------------------------------- while it is admitted
async def _a_cancel_while_a_queued_run_is_admitted_ends_it(daemon: _Daemon) -> None:
    """A queued run is nobody's: before, only a held run was closed when the cancel landed as
    its admission committed (ADR 0072), and a sweep later put the queued one on a queue."""
    daemon.gated.admissions = asyncio.Event()
    run_id = await daemon.cancelled_start(
        daemon.gated.entered,
        daemon.gated.admissions,
        RunRequest("a", model="fake:echo"),
        tools=["elsewhere"],
    )
    await _ended_once(daemon, run_id, "it was cancelled")
    assert await DBOS.get_workflow_status_async(run_id) is None, "never put on a queue"


@pytest.mark.inprocess
async def test_a_cancel_while_a_queued_run_is_admitted_ends_it_sqlite(
    sqlite_daemon: _Daemon,
) -> None:
    await _a_cancel_while_a_queued_run_is_admitted_ends_it(sqlite_daemon)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_cancel_while_a_queued_run_is_admitted_ends_it_postgres(
    postgres_daemon: _Daemon,
) -> None:
    await _a_cancel_while_a_queued_run_is_admitted_ends_it(postgres_daemon)
