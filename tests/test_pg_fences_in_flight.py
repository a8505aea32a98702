"""PostgreSQL's fences hold against a claim in flight by the same process (ADRs 0090, 0093, 0094, 0112).

A stalled execution (attempt 1) writes to its run -- an append, a task's or the run's record, a
hand-back -- while its own process claims the run again (attempt 2: the owner stays the same, so
the owner alone tells nothing). Each write either commits before the claim (it still holds the
run) or waits for the claim's row locks and then sees the rows as the claim left them: refused.
Under READ COMMITTED that holds only where the write reads the fencing token on a row it locks
(``runs.claim``, or ``run_specs`` locked with ``runs``); a plain read, or a lock the claim's
update does not conflict with, reads the rows from before the claim and lets the write through.

The claim is held open between its updates of ``runs``/``run_specs`` and its commit by the table
it reads last, ``run_changes`` (its change number, ADR 0140), which the test locks first; the
write is let go once the server says it waits for the claim (``pg_blocking_pids``), never after a
timed sleep.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.durable_store_conformance import admitted, delta, waiting_in_line
from support.pg import PG_URL, pg_admin, pg_schema

from thoughtgate.errors import RunTakenOverError
from thoughtgate.store.base import Holder
from thoughtgate.store.postgres import PostgresStore

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name

OWNER = "a.1.x"
STALE = Holder(OWNER, 1)

Write = Callable[[PostgresStore, str], Awaitable[Any]]


async def _release(store: PostgresStore, run_id: str) -> Any:
    return await store.release_run(run_id, owner=OWNER, queue=True, attempt=1)


async def _append(store: PostgresStore, run_id: str) -> Any:
    return await store.append(run_id, [delta("stale")], held_by=STALE)


async def _update_run(store: PostgresStore, run_id: str) -> Any:
    return await store.update_run(run_id, metadata={"stale": True}, held_by=STALE)


async def _save_task(store: PostgresStore, run_id: str) -> Any:
    task = (await store.get_run(run_id)).tasks[0]
    stale = dataclasses.replace(task, status="completed", output="stale", reasoning="stale")
    # the read above is done before the claim: what is timed is the write
    return await store.save_task(stale, held_by=STALE)


@pytest.fixture
async def store(pg_schema: str) -> AsyncIterator[PostgresStore]:
    made = await PostgresStore.open(PG_URL, schema=pg_schema)
    yield made
    await made.close()


async def _blocked_by(admin: psycopg.AsyncConnection[Any], pid: int) -> list[int]:
    """The server processes waiting for a row ``pid`` locked (ADR 0112): a transaction's or a
    tuple's lock, which a write waiting for a row waits on -- or for a table it locked (the
    claim held by ``run_changes``, ADR 0140). Not any process that waits for
    ``pid`` at all: a store opened meanwhile anywhere in the database -- another test's,
    another checkout's -- builds its indexes ``CONCURRENTLY``, which waits (``virtualxid``) for
    every transaction open before it, these tests' held ones too; counted, it made two waiters
    where one was expected, or the wrong one (this file's flakiness beside other tests)."""
    cur = await admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid)) "
        "AND wait_event_type = 'Lock' AND wait_event IN ('relation', 'transactionid', 'tuple')",
        (pid,),
    )
    return [int(r[0]) for r in await cur.fetchall()]


async def _one_waiting_for(
    admin: psycopg.AsyncConnection[Any], pid: int, unless: asyncio.Future[Any] | None = None
) -> int | None:
    """The process that waits for ``pid``'s lock, once one does (the server's own state);
    ``None`` if ``unless`` is done first (a write that waited for nothing)."""
    while not (waiting := await _blocked_by(admin, pid)):
        if unless is not None and unless.done():
            return None
        await asyncio.sleep(0.01)  # a poll of the server's lock table, not a timed wait
    (one,) = waiting
    return one


async def _raced_with_a_claim(
    store: PostgresStore,
    admin: psycopg.AsyncConnection[Any],
    schema: str,
    run_id: str,
    other: Callable[[], Awaitable[Any]],
) -> tuple[asyncio.Future[int | None], asyncio.Future[Any]]:
    """A claim of ``run_id`` by ``OWNER`` held open after its updates of ``runs`` and
    ``run_specs`` (by ``run_changes``, the table it reads last, locked here first), and ``other``
    started once the claim waits. ``other`` waits for the claim's locks, or gets through at once
    (which the caller's asserts then catch); the claim is let go after either."""
    blocker = await psycopg.AsyncConnection.connect(PG_URL)
    try:
        await blocker.execute(
            sql.SQL("LOCK TABLE {}.run_changes IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(schema)
            )
        )
        claim = asyncio.ensure_future(store.claim_run(run_id, OWNER, 30))
        claiming = await _one_waiting_for(admin, blocker.info.backend_pid)
        assert claiming is not None
        raced = asyncio.ensure_future(other())
        await _one_waiting_for(admin, claiming, unless=raced)
        await blocker.rollback()
    finally:
        await blocker.close()
    return claim, raced


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("write", "refused"),
    [
        pytest.param(_release, False, id="hand-back (ADR 0093)"),
        pytest.param(_append, RunTakenOverError, id="append (ADR 0090)"),
        pytest.param(_update_run, RunTakenOverError, id="run record (ADR 0094)"),
        pytest.param(_save_task, RunTakenOverError, id="task record (ADR 0094)"),
    ],
)
async def test_a_write_by_an_earlier_attempt_waiting_for_a_same_owner_claim_is_refused(
    store: PostgresStore,
    pg_admin: psycopg.AsyncConnection[Any],
    pg_schema: str,
    write: Write,
    refused: object,
) -> None:
    run_id = await admitted(store, durable=True, resume="queue", queue="q1")
    assert await store.claim_run(run_id, OWNER, 30) == 1
    before = await store.get_run(run_id)
    events = await store.read(run_id)

    # The claim has updated runs and run_specs and waits to commit; the write waits for the
    # claim's locks (a write that does not got through: caught below).
    claim, stale = await _raced_with_a_claim(
        store, pg_admin, pg_schema, run_id, lambda: write(store, run_id)
    )
    assert await claim == 2
    if refused is False:
        assert await stale is False, "the release moved nothing"
    else:
        with pytest.raises(RunTakenOverError):
            await stale
    run = await store.get_run(run_id)
    assert (run.owner, run.status) == (OWNER, "running"), "still the claim's"
    assert run.tasks == before.tasks and run.metadata == before.metadata
    assert await store.read(run_id) == events
    spec = await store.get_run_spec(run_id)
    assert spec is not None and spec.attempts == 2 and spec.queued_at is None


@pytest.mark.postgres
async def test_the_lines_claim_waiting_for_the_queues_claim_in_flight_is_refused(
    store: PostgresStore, pg_admin: psycopg.AsyncConnection[Any], pg_schema: str
) -> None:
    """ADR 0099: a run waiting in its daemon (held by the process, attempt 0) starts only
    through a claim naming attempt 0. When this process's own queue claims the run first (the
    same owner), the line's claim, having waited for the queue's row locks, must see the run
    as that claim left it -- claimed once -- and start nothing; a read of the rows from before
    the claim would let the line execute the run a second time."""
    run_id = await waiting_in_line(store, OWNER)
    # The queue's claim has updated runs and run_specs and waits to commit; the line's claim
    # waits for its locks (one that does not got through: caught below).
    queue_claim, line_claim = await _raced_with_a_claim(
        store, pg_admin, pg_schema, run_id, lambda: store.claim_run(run_id, OWNER, 30, attempt=0)
    )
    assert await queue_claim == 1
    assert await line_claim is None, "the line started a run its queue had already claimed"
    spec = await store.get_run_spec(run_id)
    assert spec is not None and spec.attempts == 1, "claimed once"
    run = await store.get_run(run_id)
    assert (run.owner, run.status) == (OWNER, "running")


@pytest.mark.postgres
async def test_a_claim_waits_for_a_task_record_saved_between_its_fence_and_its_write(
    store: PostgresStore, pg_admin: psycopg.AsyncConnection[Any], pg_schema: str
) -> None:
    """ADR 0112: a fenced ``save_task`` is two statements -- the run's holder read ``FOR SHARE``,
    then the task's upsert -- in one transaction. A claim arriving between the two must wait
    for the save's commit: the save's check and its write then both come before the claim,
    and an execution's record never lands on a run another claim took after it was checked.
    The save is held between its statements by the task's row, locked here first; the claim
    must then wait for the save (the server says so), not commit first (a lock the claim's
    update does not conflict with -- ``FOR KEY SHARE`` -- lets it through)."""
    run_id = await admitted(store, durable=True, resume="queue", queue="q1")
    assert await store.claim_run(run_id, OWNER, 30) == 1
    task = (await store.get_run(run_id)).tasks[0]
    mine = dataclasses.replace(task, status="completed", output="mine", reasoning="mine")
    blocker = await psycopg.AsyncConnection.connect(PG_URL)
    try:
        await blocker.execute(
            sql.SQL("SELECT 1 FROM {}.tasks WHERE run_id = %s FOR UPDATE").format(
                sql.Identifier(pg_schema)
            ),
            (run_id,),
        )
        save = asyncio.ensure_future(store.save_task(mine, held_by=STALE))
        saving = await _one_waiting_for(pg_admin, blocker.info.backend_pid, unless=save)
        assert saving is not None, "the save waits for the task's row, its check done"
        claim = asyncio.ensure_future(store.claim_run(run_id, OWNER, 30))
        claiming = await _one_waiting_for(pg_admin, saving, unless=claim)
        await blocker.rollback()
    finally:
        await blocker.close()
    await save  # it held the run when it checked, and it committed before the claim
    assert await claim == 2
    assert claiming is not None, "the claim committed while a checked save was in flight"
    assert (await store.get_run(run_id)).tasks[0].reasoning == "mine"
    with pytest.raises(RunTakenOverError):  # and after the claim, refused
        await store.save_task(dataclasses.replace(mine, reasoning="stale"), held_by=STALE)
