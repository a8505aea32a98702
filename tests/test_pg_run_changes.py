"""The run list's change feed on PostgreSQL under concurrent writers (ADR 0140).

Run-list writes are numbered without one row every writer locks: a transaction that commits after
later-numbered ones must still reach every reader resuming by its cursor. Readers here follow the
feed as the route does (``run_changes(after=cursor)``, another replica), while writers change runs
concurrently, one of them held open -- after it took its number -- until later ones committed.
Each reader must see strictly increasing numbers (nothing twice, nothing reordered behind its
cursor) and end with every run in its final state (nothing skipped). A reader that loads a page
after ``latest_run_change()`` and follows from there (``GET /v1/runs``, then the stream) too."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import make_conninfo
from support.pg import PG_URL, pg_admin, pg_schema, schema_name
from support.pg_private import private_admin, private_pg, private_schema
from support.pg_replicas import changes_settled
from support.store_conformance import make_run

from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.store.base import RunEnding
from thoughtgate.store.listing import RunQuery
from thoughtgate.store.migrations import load_migrations
from thoughtgate.store.pg_schema import migrate
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.records import RunRecord

__all__ = [  # fixtures used by this module
    "pg_admin",
    "pg_schema",
    "private_admin",
    "private_pg",
    "private_schema",
]

pytestmark = pytest.mark.postgres

Admin = psycopg.AsyncConnection[Any]
State = tuple[str, dict[str, Any], dict[str, Any]]
KINDS = ("create", "usage", "metadata", "status", "finish")
Op = tuple[str, int]
Batch = tuple[list[Op], bool, bool]
"""Writes in flight together; whether one more (a run created with a task) is held open after
taking its number until the others are done; whether a page-then-follow reader starts then."""


@contextlib.asynccontextmanager
async def opened(schema: str, url: str = PG_URL) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(url, schema=schema)
    try:
        yield store
    finally:
        await store.close()


def state(run: RunRecord) -> State:
    return (run.status, run.usage, run.metadata)


@dataclass
class Reader:
    """Follows the feed from ``cursor`` as ``run_list_frames`` does, in small pages."""

    store: PostgresStore
    cursor: int
    view: dict[str, State] = field(default_factory=dict)
    numbers: list[int] = field(default_factory=list)

    async def follow(self) -> None:
        while True:
            changes = (await self.store.run_changes(after=self.cursor, limit=3)).changes
            for number, run in changes:
                assert number > self.cursor, "a change at or behind the reader's cursor"
                self.numbers.append(number)
                self.cursor = number
                self.view[run.run_id] = state(run)
            if not changes:  # waits as the route does (and learns what holds it, ADR 0146)
                await self.store.wait_for_run_changes(self.cursor, poll_s=0.005)
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # Python 3.11's wait_for may turn a cancellation that meets its poll's
                    # timeout into that timeout, which the wait passes over: stop anyway
                    raise asyncio.CancelledError


async def page_then_follow(store: PostgresStore, readers: list[Reader]) -> None:
    """``GET /v1/runs`` (its ``changes`` read before the page), then the stream from there."""
    latest = await store.latest_run_change()
    page = await store.query_runs(RunQuery(limit=10_000))
    reader = Reader(store, latest, {r.run_id: state(r) for r in page.runs})
    readers.append(reader)
    await reader.follow()


@contextlib.asynccontextmanager
async def tasks_locked(schema: str) -> AsyncIterator[None]:
    """Hold every write of a task off: a run created with a task then waits, in its open
    transaction, after its row (and its change number) and before its tasks."""
    async with await psycopg.AsyncConnection.connect(PG_URL) as conn, conn.transaction():
        await conn.execute(
            sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(sql.Identifier(schema, "tasks"))
        )
        yield


async def waiting_on_tasks(admin: Admin, schema: str) -> None:
    """Until a store's transaction waits for the lock on ``tasks``."""
    for _ in range(2000):
        cur = await admin.execute(
            "SELECT 1 FROM pg_locks WHERE relation = %s::regclass AND NOT granted",
            (f'"{schema}".tasks',),
        )
        if await cur.fetchone() is not None:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the held creation never waited for the lock on tasks")


async def write(
    store: PostgresStore, runs: list[RunRecord], made: list[RunRecord], op: Op, k: int
) -> None:
    """One write: ``runs`` are those stored before the batch, ``made`` the batch's new ones."""
    kind, target = op
    if kind == "create" or not runs:
        run = make_run()
        made.append(run)
        await store.create_run(run)
        return
    run_id = runs[target % len(runs)].run_id
    if (await store.get_run(run_id)).status not in ("pending", "running"):
        kind = "metadata"  # an ended run takes no more status; its metadata still changes
    if kind == "usage":
        await store.update_run(run_id, usage={"input_tokens": k})
    elif kind == "metadata":
        await store.update_run(run_id, metadata={f"m{k}": k})
    elif kind == "status":
        await store.update_run(run_id, status="running")
    else:
        end = [NewEvent(EventType.RUN_FAILED, {"status": "failed"})]
        await store.finish_run(run_id, end, RunEnding("failed"))


async def play(
    admin: Admin,
    schema: str,
    batches: list[Batch],
    beside: contextlib.AbstractAsyncContextManager[None] | None = None,
) -> None:
    """The batches, written by one replica and followed by readers on another; ``beside`` is
    entered before anything is written and left after the readers' last read."""
    async with (
        contextlib.AsyncExitStack() as stack,
        asyncio.TaskGroup() as group,
    ):
        if beside is not None:
            await stack.enter_async_context(beside)
        writer = await PostgresStore.open(PG_URL, schema=schema, pool_size=8)
        stack.push_async_callback(writer.close)
        other = await PostgresStore.open(PG_URL, schema=schema, pool_size=8)  # another replica
        stack.push_async_callback(other.close)
        readers = [Reader(other, await other.latest_run_change())]
        following = [group.create_task(readers[0].follow())]
        runs: list[RunRecord] = []
        k = 0
        for ops, held, late_reader in batches:
            writes = []
            made: list[RunRecord] = []
            async with contextlib.AsyncExitStack() as lock:
                if held:
                    await lock.enter_async_context(tasks_locked(schema))
                    long = make_run(tasks=1)
                    made.append(long)
                    writes.append(asyncio.create_task(writer.create_run(long)))
                    await waiting_on_tasks(admin, schema)
                if late_reader:
                    following.append(group.create_task(page_then_follow(other, readers)))
                for op in ops:
                    k += 1
                    writes.append(asyncio.create_task(write(writer, list(runs), made, op, k)))
                # the others commit while the held one waits (where numbering would make them
                # wait for it, they are let go after a while instead)
                await asyncio.wait(writes[held:] or writes, timeout=2)
            async with asyncio.timeout(60):  # a bound for a test that would hang, not a check
                await asyncio.gather(*writes)
            runs += made
        final = {r.run_id: state(await writer.get_run(r.run_id)) for r in runs}
        # until every reader has every final state (a bound, not a check: other tests' write
        # transactions on the server hold the horizon back meanwhile; the asserts below judge)
        for _ in range(3000):
            if all(_caught_up(reader, final) for reader in readers) and len(readers) == len(
                following
            ):
                break
            await asyncio.sleep(0.01)
        for task in following:
            task.cancel()
    for reader in readers:
        assert reader.numbers == sorted(set(reader.numbers)), "numbers repeat or go back"
        missed = {r: s for r, s in final.items() if reader.view.get(r) != s}
        assert missed == {}, f"changes never read: {missed}"


def _caught_up(reader: Reader, final: dict[str, State]) -> bool:
    return all(reader.view.get(run_id) == s for run_id, s in final.items())


async def test_a_change_committed_after_later_numbered_ones_reaches_every_reader(
    pg_admin: Admin, pg_schema: str
) -> None:
    """A run created with a task waits (holding its number) while three runs are created and
    two updated and all commit; readers polling meanwhile resume past them, and still get it
    once it commits."""
    first = ([("create", 0)] * 2, False, False)
    await play(pg_admin, pg_schema, [first, ([("create", 0)] * 3 + [("usage", 0)] * 2, True, True)])


OPS = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 7)), min_size=1, max_size=6)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(batches=st.lists(st.tuples(OPS, st.booleans(), st.booleans()), min_size=1, max_size=4))
@example(batches=[([("create", 0), ("create", 0)], False, False), ([("usage", 0)] * 3, True, True)])
def test_concurrent_writers_changes_reach_a_resuming_reader_once_in_order(
    pg_schema: str, batches: list[Batch]
) -> None:
    """Any writes in flight together, some held open past later ones, read by readers that
    follow from their cursor (one from the start, others from a page taken mid-way)."""

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as admin:
            await play(admin, pg_schema, batches)

    asyncio.run(go())


# -- the upgrade, a replica of the previous version, a restored database, a horizon held back --
def _table(schema: str, name: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


async def _old_rows(admin: Admin, schema: str, numbers: dict[str, int]) -> None:
    """Runs numbered by the previous version's counter, which ends at the largest."""
    for run_id, number in numbers.items():
        await admin.execute(
            sql.SQL(
                "INSERT INTO {} (run_id, prompt, chain_of_thought, worker_backend, status, "
                "created_at, updated_at, usage, error, metadata, last_seq, change_seq) VALUES "
                "(%s, 'p', 'hidden', 'provider', 'running', 1.0, 1.0, '{{}}', NULL, '{{}}', 0, %s)"
            ).format(_table(schema, "runs")),
            (run_id, number),
        )
    await admin.execute(
        sql.SQL("UPDATE {} SET last_change = %s").format(_table(schema, "run_changes")),
        (max(numbers.values()),),
    )


async def _settled_changes(store: PostgresStore, after: int) -> list[tuple[int, str]]:
    await changes_settled(store)
    return [(n, r.run_id) for n, r in (await store.run_changes(after=after)).changes]


async def test_the_upgrade_numbers_new_changes_after_the_old_ones_and_old_replicas_alike(
    pg_admin: Admin, pg_schema: str
) -> None:
    """A schema at migration 13 whose counter stands at 500: after migration 14 the old numbers
    read back as they were, a reader's cursor among them still works, and every new change --
    this version's, and one numbered by a replica of the previous version still running (its
    ``UPDATE run_changes ... RETURNING last_change``, held open while a later change commits)
    -- is numbered above them and read once, in order, without the late one skipped."""
    before = load_migrations("postgres")[:13]
    assert load_migrations("postgres")[13].name == "run_changes_by_transaction"
    await migrate(pg_admin, pg_schema, before, "test")
    await _old_rows(pg_admin, pg_schema, {"run_a": 499, "run_b": 500})
    async with opened(pg_schema) as store:
        assert await _settled_changes(store, 0) == [(499, "run_a"), (500, "run_b")]
        assert await store.latest_run_change() == 500
        assert await _settled_changes(store, 499) == [(500, "run_b")]
        async with await psycopg.AsyncConnection.connect(PG_URL) as old, old.transaction():
            cur = await old.execute(
                sql.SQL("UPDATE {} SET last_change = last_change + 1 RETURNING last_change").format(
                    _table(pg_schema, "run_changes")
                )
            )
            row = await cur.fetchone()
            assert row is not None
            old_number = int(row[0])
            await old.execute(
                sql.SQL("UPDATE {} SET change_seq = %s WHERE run_id = 'run_a'").format(
                    _table(pg_schema, "runs")
                ),
                (old_number,),
            )
            await store.update_run("run_b", status="failed")  # commits first
            assert (await store.run_changes(after=500)).changes == []  # held behind the old one
        changes = await _settled_changes(store, 500)
        assert [r for _, r in changes] == ["run_a", "run_b"] and changes[0][0] == old_number
        assert 500 < old_number < changes[1][0]


async def test_numbers_ahead_of_the_servers_transactions_are_passed_at_the_next_start(
    pg_admin: Admin, pg_schema: str
) -> None:
    """A database dumped and restored into another cluster keeps its change numbers, but that
    cluster's transaction ids start lower: the next start moves the numbering above the stored
    numbers, so a new change is numbered and read after them (else it would be numbered below
    every reader's cursor, or collide with a stored number)."""
    async with opened(pg_schema) as store:
        run = make_run()
        await store.create_run(run)
    ahead = 10**12
    await pg_admin.execute(
        sql.SQL("UPDATE {} SET change_seq = change_seq + %s").format(_table(pg_schema, "runs")),
        (ahead,),
    )
    async with opened(pg_schema) as store:
        (stored, _), *_ = await _settled_changes(store, 0)
        assert stored > ahead and await store.latest_run_change() == stored
        late = make_run()
        await store.create_run(late)
        assert await _settled_changes(store, stored) == [
            (await _number_of(store, late.run_id), late.run_id)
        ]


async def _number_of(store: PostgresStore, run_id: str) -> int:
    async with store._conn("test") as conn:
        cur = await conn.execute("SELECT change_seq FROM runs WHERE run_id = %s", (run_id,))
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_change_held_behind_an_older_transaction_is_read_when_it_ends_not_at_the_poll(
    pg_schema: str,
) -> None:
    """A transaction older than a run-list change (any write, here not thoughtgate's) is still
    running when a reader looks: the reader finds the change waiting above the horizon and looks
    again soon, so it reads it once that transaction ends -- which sends no wake-up -- rather
    than at its 60 s poll. (The change's own wake-up is not sent here: it may as well have come
    and gone before that transaction ended.)"""
    async with opened(pg_schema) as writer, opened(pg_schema) as reader:
        reader.safety_poll = reader.poll_interval = reader.list_poll_interval = 60.0
        await writer.create_run(make_run())
        await _settled_changes(reader, 0)
        after = await reader.latest_run_change()
        writer._notifier.wake = lambda payload: None  # type: ignore[method-assign]
        async with await psycopg.AsyncConnection.connect(PG_URL) as older:
            async with older.transaction():
                await older.execute("SELECT pg_current_xact_id()")  # an id: it holds the horizon
                run = make_run()
                await writer.create_run(run)
                assert (await reader.run_changes(after=after)).changes == []
                waiting = asyncio.create_task(reader.wait_for_run_changes(after))
                await asyncio.sleep(0.1)
            async with asyncio.timeout(10):  # not the 60 s poll
                await waiting
                while not (changes := (await reader.run_changes(after=after)).changes):
                    await reader.wait_for_run_changes(after)
        assert [r.run_id for _, r in changes] == [run.run_id]


async def test_a_long_hold_behind_another_session_is_warned_once_naming_it_then_its_end(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Another application's session idle in a transaction after a write holds every live run
    list of the server still. That looks like a daemon that stopped listing runs, so a reader
    that has waited past ``warn_after`` warns once, naming the session, and says when it ends."""
    async with opened(pg_schema) as writer, opened(pg_schema) as reader:
        reader.horizon.warn_after = 0.2
        reader.safety_poll = reader.poll_interval = reader.list_poll_interval = 60.0
        await writer.create_run(make_run())
        await _settled_changes(reader, 0)
        after = await reader.latest_run_change()
        caplog.set_level("INFO", logger="thoughtgate.store")
        named = {"application_name": "batch-import", "autocommit": True}
        async with await psycopg.AsyncConnection.connect(PG_URL, **named) as older:
            async with older.transaction():
                await older.execute("SELECT pg_current_xact_id()")  # an id: it holds the horizon
                await writer.create_run(make_run())
                async with asyncio.timeout(10):
                    while not any(r.levelname == "WARNING" for r in caplog.records):
                        await reader.wait_for_run_changes(after)
                for _ in range(3):  # still held: no second warning
                    await reader.wait_for_run_changes(after)
            async with asyncio.timeout(10):
                while not (await reader.run_changes(after=after)).changes:
                    await reader.wait_for_run_changes(after)
            await reader.wait_for_run_changes(after)
            pid = older.info.backend_pid
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1, warnings
        assert f"session pid {pid} (application batch-import" in warnings[0], warnings[0]
        back = [r.getMessage() for r in caplog.records if "moving again" in r.getMessage()]
        assert len(back) == 1, back


# -- other databases' transactions (ADR 0146) ----------------------------------------------------
@contextlib.asynccontextmanager
async def another_database(admin: Admin, server: str) -> AsyncIterator[str]:
    """Another database on the server at ``server`` (another application's), with a table ``t``
    to write; its conninfo. Dropped afterwards, whatever is still connected to it."""
    name = schema_name()
    await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = make_conninfo(server, dbname=name)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("CREATE TABLE t (x int)")
        yield url
    finally:
        await admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture
async def other_database(pg_admin: Admin) -> AsyncIterator[str]:
    """Another database on the shared test server (``another_database``)."""
    async with another_database(pg_admin, PG_URL) as url:
        yield url


@pytest.fixture
async def private_other_database(private_admin: Admin, private_pg: str) -> AsyncIterator[str]:
    """Another database on this process's private cluster (``support.pg_private``)."""
    async with another_database(private_admin, private_pg) as url:
        yield url


@contextlib.asynccontextmanager
async def writing(url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A session of another database (``other_database``) in a transaction that has written (it
    has an id, older than every change made meanwhile), open until the block ends."""
    async with await psycopg.AsyncConnection.connect(url) as conn, conn.transaction():
        await conn.execute("INSERT INTO t VALUES (1)")
        yield conn


async def follow_until(reader: Reader, final: dict[str, State]) -> None:
    """Until ``reader`` has every final state (a bound for a reader that never gets them, not a
    check of speed: a transaction of this database, another test's, holds it a moment)."""
    async with asyncio.timeout(20):
        following = asyncio.create_task(reader.follow())
        try:
            for _ in itertools.count():
                if _caught_up(reader, final):
                    break
                await asyncio.sleep(0.01)
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following


async def _plain_horizon_holds(admin: Admin, xid: int) -> bool:
    """Whether the cluster-wide horizon (``pg_snapshot_xmin``, ADR 0140) counts ``xid``."""
    cur = await admin.execute(
        "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint <= %s", (xid,)
    )
    row = await cur.fetchone()
    return row is not None and bool(row[0])


async def test_another_databases_open_transaction_holds_no_run_list(
    pg_admin: Admin, pg_schema: str, other_database: str
) -> None:
    """Another application, in another database of the same server, is idle in a transaction
    after a write while runs are created and ended: a reader on another replica still reads every
    change, while that transaction is open, and another replica that has learned nothing yet
    names a latest change at least as far (a stream's ``last_event_id`` from the first is not
    refused by the second)."""
    async with opened(pg_schema) as writer, opened(pg_schema) as reader:
        await writer.create_run(make_run())
        await _settled_changes(reader, 0)
        after = await reader.latest_run_change()
        async with writing(other_database) as other:
            xid = int(await _fetch(other, "SELECT pg_current_xact_id()::text::bigint"))
            runs = [make_run() for _ in range(3)]
            for run in runs:
                await writer.create_run(run)
            end = [NewEvent(EventType.RUN_FAILED, {"status": "failed"})]
            await writer.finish_run(runs[0].run_id, end, RunEnding("failed"))
            assert await _plain_horizon_holds(pg_admin, xid)  # what held them before
            final = {r.run_id: state(await writer.get_run(r.run_id)) for r in runs}
            following = Reader(reader, after)
            await follow_until(following, final)
            assert following.numbers == sorted(set(following.numbers))
            async with opened(pg_schema) as fresh:
                assert await fresh.latest_run_change() >= following.cursor
            assert await _plain_horizon_holds(pg_admin, xid)  # and still would


async def _fetch(conn: psycopg.AsyncConnection[Any], query: str) -> Any:
    row = await (await conn.execute(query)).fetchone()
    assert row is not None
    return row[0]


async def test_a_transaction_of_this_database_still_holds_beside_another_databases(
    pg_schema: str, other_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Another session of *this* database with an id may yet write a change numbered by it, so
    it still holds the run lists (ADR 0146: nothing proves it will not) while another database's
    older transaction is passed over; the warning names no other database's session, and once
    this one commits the change is read, the other database's transaction still open."""
    async with opened(pg_schema) as writer, opened(pg_schema) as reader:
        reader.horizon.warn_after = 0.3  # past other tests' transactions of this database
        await writer.create_run(make_run())
        await _settled_changes(reader, 0)
        after = await reader.latest_run_change()
        caplog.set_level("WARNING", logger="thoughtgate.store")
        async with (
            writing(other_database) as other,
            await psycopg.AsyncConnection.connect(PG_URL) as ours,
        ):
            await ours.execute("SELECT pg_current_xact_id()")  # an id, in a transaction
            run = make_run()
            await writer.create_run(run)
            async with asyncio.timeout(10):  # each look learns what holds it: held still
                while not any(r.levelname == "WARNING" for r in caplog.records):
                    await reader.wait_for_run_changes(after)
                    assert (await reader.run_changes(after=after)).changes == []
            other_pid = other.info.backend_pid
            await ours.commit()
            following = Reader(reader, after)
            await follow_until(following, {run.run_id: state(run)})
            assert other.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        # ours, unless another test's transaction of this database was older at that moment
        assert not any(f"session pid {other_pid} " in w for w in warned), warned


async def test_another_databases_prepared_transaction_holds_no_run_list(
    private_pg: str, private_admin: Admin, private_schema: str, private_other_database: str
) -> None:
    """A prepared transaction of another database (two-phase commit, held until someone
    commits it) holds no run list either. On a private cluster (``support.pg_private``): the
    shared test server has ``max_prepared_transactions = 0``, and restarting it is not ours."""
    gid = f"{private_schema}_prepared"
    async with await psycopg.AsyncConnection.connect(
        private_other_database, autocommit=True
    ) as other:
        await other.execute("BEGIN")
        await other.execute("INSERT INTO t VALUES (2)")
        xid = int(await _fetch(other, "SELECT pg_current_xact_id()::text::bigint"))
        await other.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        try:
            async with (
                opened(private_schema, private_pg) as writer,
                opened(private_schema, private_pg) as reader,
            ):
                run = make_run()
                await writer.create_run(run)
                prepared = await _fetch(private_admin, "SELECT count(*) FROM pg_prepared_xacts")
                assert prepared == 1 and await _plain_horizon_holds(private_admin, xid)
                await follow_until(Reader(reader, 0), {run.run_id: state(run)})
        finally:
            await other.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


@contextlib.asynccontextmanager
async def churning(url: str, lengths: list[list[int]]) -> AsyncIterator[None]:
    """In the database at ``url``: a transaction that has written, open all along, and beside it
    sessions opening and ending others, each holding for the next of its lengths (ms)."""

    async def churn(ms: list[int]) -> None:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            for length in itertools.cycle(ms):
                async with conn.transaction():
                    await conn.execute("INSERT INTO t VALUES (3)")
                    await asyncio.sleep(length / 1000)

    async with writing(url), asyncio.TaskGroup() as group:
        churners = [group.create_task(churn(ms)) for ms in lengths]
        try:
            yield
        finally:
            for task in churners:
                task.cancel()


LENGTHS = st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=4), min_size=1, max_size=3)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    batches=st.lists(st.tuples(OPS, st.booleans(), st.booleans()), min_size=1, max_size=4),
    lengths=LENGTHS,
)
@example(
    batches=[([("create", 0), ("create", 0)], False, True), ([("usage", 0)] * 3, True, True)],
    lengths=[[0, 5], [20]],
)
def test_changes_reach_every_reader_once_while_other_databases_transactions_come_and_go(
    pg_schema: str, other_database: str, batches: list[Batch], lengths: list[list[int]]
) -> None:
    """The concurrent writers above (some held open past later ones: this database's, which
    must hold), while in another database one transaction stays open throughout and others open
    and end at random: every reader still gets every change once, in order, while that one is
    open (it no longer holds them; they never skip this database's)."""

    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as admin:
            await play(admin, pg_schema, batches, churning(other_database, lengths))

    asyncio.run(go())
