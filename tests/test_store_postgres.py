"""The PostgreSQL backend: the shared conformance suite, plus ordering, fan-out and failures."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

import psycopg
import pytest
from psycopg import errors as pgerr
from psycopg import sql
from support.durable_store_conformance import DurableStoreConformance
from support.listing_conformance import RunListingConformance
from support.pg import PG_URL, pg_admin, pg_schema
from support.pg_replicas import changes_settled, run_store_script, tail_into
from support.store_backends import Postgres
from support.store_conformance import (
    ENDED_UNCLOSED_CLOSED_AT,
    ENDED_UNCLOSED_EVENTS,
    ENDED_UNCLOSED_RUNS,
    GAP_AT,
    EventLogConformance,
    KeyStoreConformance,
    RunIndexConformance,
    a_run_of_tool_failures,
    a_run_to_hole,
    assert_a_gap_is_never_renumbered,
    assert_ended_runs_closed,
    assert_old_rows_replay_upgraded,
    assert_same_events,
    collect,
    deltas,
    make_run,
)

from thoughtgate.errors import (
    NotOurDatabaseError,
    RunClosedError,
    StoreError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.store.base import EventStore, RunEnding
from thoughtgate.store.listing import RunQuery
from thoughtgate.store.migrations import load_migrations
from thoughtgate.store.pg_errors import translate_error
from thoughtgate.store.pg_schema import applied_versions, migrate
from thoughtgate.store.postgres import (
    PostgresStore,
    channel_name,
    open_runs_query,
    read_types_query,
    split_schema_param,
)
from thoughtgate.store.projection import PROJECTED_EVENT_TYPES
from thoughtgate.store.urls import open_store

__all__ = ["pg_admin", "pg_schema"]  # fixtures used by this module

pytestmark = pytest.mark.postgres

Admin = psycopg.AsyncConnection[Any]


class TestPostgresEventLog(Postgres, EventLogConformance):
    stamps_as_given = False


class TestPostgresRunIndex(Postgres, RunIndexConformance, RunListingConformance):
    dense_change_numbers = False

    async def settled(self, store: EventStore) -> None:
        assert isinstance(store, PostgresStore)
        await changes_settled(store)


class TestPostgresKeyStore(Postgres, KeyStoreConformance):
    pass


class TestPostgresDurableRuns(Postgres, DurableStoreConformance):
    pass


@contextlib.asynccontextmanager
async def opened(schema: str, **kw: Any) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(PG_URL, schema=schema, **kw)
    try:
        yield store
    finally:
        await store.close()


async def fetch(admin: Admin, query: sql.Composable | str, *params: Any) -> list[tuple[Any, ...]]:
    cur = await admin.execute(query, params or None)  # type: ignore[arg-type]
    return await cur.fetchall()


def ident(schema: str, table: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


# -- opening and migrations ----------------------------------------------------------------
async def test_migrations_are_recorded_once(pg_admin: Admin, pg_schema: str) -> None:
    async with opened(pg_schema):
        pass
    query = sql.SQL("SELECT version, name, applied_at FROM {} ORDER BY version").format(
        ident(pg_schema, "thoughtgate_migrations")
    )
    rows = await fetch(pg_admin, query)
    assert [(v, n) for v, n, _ in rows] == [
        (m.version, m.name) for m in load_migrations("postgres")
    ]
    async with opened(pg_schema):  # reopening applies nothing again
        pass
    assert await fetch(pg_admin, query) == rows


async def test_upgrade_to_run_leases_gives_open_runs_a_lease_that_runs_out(
    pg_admin: Admin, pg_schema: str
) -> None:
    before_leases = load_migrations("postgres")[:3]  # the schema a pre-lease thoughtgate wrote
    assert load_migrations("postgres")[3].name == "run_leases"
    await migrate(pg_admin, pg_schema, before_leases, "test")
    for run_id, status in (("run_open", "running"), ("run_done", "completed")):
        await pg_admin.execute(
            sql.SQL(
                "INSERT INTO {} (run_id, prompt, chain_of_thought, worker_backend, status, "
                "created_at, updated_at, usage, error, metadata) VALUES "
                "(%s, 'p', 'hidden', 'provider', %s, 1.0, 1.0, '{{}}', NULL, '{{}}')"
            ).format(ident(pg_schema, "runs")),
            (run_id, status),
        )
    async with opened(pg_schema) as store:
        now = (await store.open_runs()).now
        opened_run = await store.get_run("run_open")
        assert opened_run.status == "running" and opened_run.owner == "legacy"
        assert opened_run.lease_expires_at is not None
        assert now + 50 < opened_run.lease_expires_at < now + 61
        done = await store.get_run("run_done")
        assert (done.status, done.owner, done.lease_expires_at) == ("completed", None, None)
        assert [r.run_id for r in (await store.open_runs()).runs] == ["run_open"]
    indexes = await fetch(
        pg_admin, "SELECT indexname FROM pg_indexes WHERE schemaname = %s", pg_schema
    )
    names = {r[0] for r in indexes}  # the open runs indexed by id since version 9 (ADR 0079)
    assert "open_runs_by_id" in names and "open_runs_by_owner" not in names


async def test_upgrade_to_the_lifecycle_index_keeps_the_events_and_a_check_reads_through_it(
    pg_admin: Admin, pg_schema: str
) -> None:
    """A schema with runs and events from before ``lifecycle_events`` (ADR 0066) gets the index
    built over its rows at the next start; ``read_types`` then finds those rows, and the planner
    reads a check's through the index rather than walking the run's every event in the primary
    key -- on a table without statistics as after ``ANALYZE``. Types the index does not hold are
    still read, by that walk."""
    before = load_migrations("postgres")[:7]
    assert load_migrations("postgres")[7].name == "lifecycle_events"
    await migrate(pg_admin, pg_schema, before, "test")
    runs, events = ident(pg_schema, "runs"), ident(pg_schema, "events")
    for change, run_id in enumerate(("run_a", "run_b", "run_c"), 1):
        await pg_admin.execute(
            sql.SQL(
                "INSERT INTO {} (run_id, prompt, chain_of_thought, worker_backend, status, "
                "created_at, updated_at, usage, error, metadata, last_seq, change_seq) VALUES "
                "(%s, 'p', 'hidden', 'provider', 'completed', 1.0, 1.0, '{{}}', NULL, '{{}}', "
                "3002, %s)"
            ).format(runs),
            (run_id, change),
        )
        await pg_admin.execute(
            sql.SQL(
                "INSERT INTO {} (run_id, seq, task_id, type, ts, payload, v) "
                'SELECT %(r)s, 1, NULL, \'run.started\', 1.5, \'{{"prompt":"p","tasks":0}}\', 1 '
                "UNION ALL SELECT %(r)s, g, NULL, 'message.delta', 2.0, "
                "json_build_object('i', g), 1 FROM generate_series(2, 3001) AS g "
                "UNION ALL SELECT %(r)s, 3002, NULL, 'run.settlement.completed', 3.0, "
                '\'{{"status":"completed"}}\', 1'
            ).format(events),
            {"r": run_id},
        )
    wanted = [EventType.RUN_STARTED, EventType.RUN_SETTLEMENT_COMPLETED]
    async with opened(pg_schema) as store:
        got = await store.read_types("run_b", wanted)
        assert [(e.seq, e.type) for e in got] == [(1, "run.started"), (3002, wanted[1])]
        assert [e.seq for e in await store.read_types("run_b", wanted, after=1)] == [3002]
        deltas_read = await store.read_types("run_b", [EventType.MESSAGE_DELTA], limit=3)
        assert [e.seq for e in deltas_read] == [2, 3, 4]
        assert len(await store.read("run_b")) == 3002, "every event kept"
    assert await applied_versions(pg_admin, pg_schema) == {
        m.version for m in load_migrations("postgres")
    }
    query, params = read_types_query("run_b", PROJECTED_EVENT_TYPES, after=0, limit=1000)
    await pg_admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
    try:
        for analyzed in (False, True):
            if analyzed:
                await pg_admin.execute(sql.SQL("ANALYZE {}").format(events))
            rows = await fetch(pg_admin, f"EXPLAIN {query}", *params)
            plan = "\n".join(str(r[0]) for r in rows)
            assert "Index Scan using lifecycle_events" in plan, (analyzed, plan)
            assert "events_pkey" not in plan and "Sort" not in plan, (analyzed, plan)
    finally:
        await pg_admin.execute("RESET search_path")


async def test_upgrade_to_the_open_runs_index_pages_open_runs_by_a_range_read(
    pg_admin: Admin, pg_schema: str
) -> None:
    """A schema from before ``open_runs_by_id`` (ADR 0079), holding 50,000 ended runs and 200
    open ones (each with its spec), gets the index at its next start; ``open_runs`` then pages
    every open run once, in run id order, and a page -- the first, and one after a cursor -- is
    a range read of that index that stops at the page's size: 64 entries read for a page of 64,
    where the planner read all 200 open runs and sorted them before (through
    ``open_runs_by_owner``). Straight after the upgrade: the migration gives the planner the
    statistics it needs (without them it takes the table to hold a handful of open runs)."""
    before = load_migrations("postgres")[:8]
    assert load_migrations("postgres")[8].name == "open_runs_by_id"
    await migrate(pg_admin, pg_schema, before, "test")
    runs, specs = ident(pg_schema, "runs"), ident(pg_schema, "run_specs")
    await pg_admin.execute(
        sql.SQL(
            "INSERT INTO {} (run_id, prompt, chain_of_thought, worker_backend, status, "
            "created_at, updated_at, usage, error, metadata, last_seq, change_seq, owner, "
            "lease_expires_at, closed_at) "
            "SELECT 'run_' || lpad(g::text, 6, '0'), 'p', 'hidden', 'provider', "
            "CASE WHEN g % 250 = 0 THEN 'running' ELSE 'completed' END, 1.0, 1.0, '{{}}', "
            "NULL, '{{}}', 0, g, CASE WHEN g % 250 = 0 THEN 'elsewhere' END, "
            "CASE WHEN g % 250 = 0 THEN 4e9 END, CASE WHEN g % 250 = 0 THEN NULL ELSE 2.0 END "
            "FROM generate_series(1, 50200) AS g"
        ).format(runs)
    )
    await pg_admin.execute(
        sql.SQL(
            "INSERT INTO {} (run_id, spec, durable, resume, created_at) "
            "SELECT run_id, '{{}}', true, 'queue', 1.0 FROM {}"
        ).format(specs, runs)
    )
    opened_runs = [f"run_{g:06d}" for g in range(250, 50201, 250)]
    async with opened(pg_schema) as store:
        seen: list[str] = []
        after: str | None = None
        while page := (await store.open_runs(limit=64, after=after)).runs:
            seen += [r.run_id for r in page]
            after = page[-1].run_id
        assert seen == opened_runs, "every open run once, in run id order"
        named = await store.open_runs(run_ids=[opened_runs[3], "run_000001"], limit=10)
        assert [r.run_id for r in named.runs] == [opened_runs[3]]
    assert await applied_versions(pg_admin, pg_schema) == {
        m.version for m in load_migrations("postgres")
    }
    await pg_admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
    try:
        for after in (None, opened_runs[99]):
            query, params = open_runs_query(limit=64, after=after, expired=False, run_ids=None)
            explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)"
            rows = await (await pg_admin.execute(f"{explain} {query}", params)).fetchall()
            plan = "\n".join(str(r[0]) for r in rows)
            read = "Index Scan using open_runs_by_id on runs (actual rows=64 loops=1)"
            assert read in plan, (after, plan)
            assert "Sort" not in plan and "Bitmap" not in plan, (after, plan)
            if after is not None:
                assert f"Index Cond: (run_id > '{after}'::text)" in plan, plan
    finally:
        await pg_admin.execute("RESET search_path")


async def test_upgrade_to_the_run_list_numbers_old_runs_and_pages_them(
    pg_admin: Admin, pg_schema: str
) -> None:
    before_list = load_migrations("postgres")[:4]
    assert load_migrations("postgres")[4].name == "run_list"
    await migrate(pg_admin, pg_schema, before_list, "test")
    for run_id, status, at in (("run_b", "failed", 2.0), ("run_a", "completed", 1.0)):
        await pg_admin.execute(
            sql.SQL(
                "INSERT INTO {} (run_id, prompt, chain_of_thought, worker_backend, status, "
                "created_at, updated_at, usage, error, metadata) VALUES "
                "(%s, %s, 'hidden', 'provider', %s, %s, %s, '{{}}', NULL, '{{}}')"
            ).format(ident(pg_schema, "runs")),
            (run_id, f"old {run_id}", status, at, at),
        )
    async with opened(pg_schema) as store:
        changes = (await store.run_changes(after=0)).changes
        assert [r.run_id for _, r in changes] == ["run_b", "run_a"]
        assert [n for n, _ in changes][-1] == await store.latest_run_change()
        page = await store.query_runs(RunQuery(statuses=("failed",)))
        assert [r.run_id for r in page.runs] == ["run_b"]
        assert [r.run_id for r in (await store.query_runs(RunQuery(text="OLD RUN_A"))).runs] == [
            "run_a"
        ]
        latest = await store.latest_run_change()
        await store.update_run("run_a", status="failed")
        await changes_settled(store)
        (number, changed), *more = (await store.run_changes(after=latest)).changes
        assert more == [] and changed.run_id == "run_a" and number > latest


async def test_replicas_starting_together_migrate_once(pg_admin: Admin, pg_schema: str) -> None:
    stores = await asyncio.gather(*(PostgresStore.open(PG_URL, schema=pg_schema) for _ in range(4)))
    for store in stores:
        await store.close()
    rows = await fetch(
        pg_admin,
        sql.SQL("SELECT version FROM {}").format(ident(pg_schema, "thoughtgate_migrations")),
    )
    assert sorted(r[0] for r in rows) == [m.version for m in load_migrations("postgres")]


async def test_upgrade_from_version_one_keeps_data(pg_admin: Admin, pg_schema: str) -> None:
    first = load_migrations("postgres")[:1]
    await migrate(pg_admin, pg_schema, first, "test")
    assert await applied_versions(pg_admin, pg_schema) == {1}
    await pg_admin.execute(
        sql.SQL(
            "INSERT INTO {} (run_id, prompt, chain_of_thought, worker_backend, status, created_at, "
            "updated_at, usage, error, metadata, last_seq) VALUES ('run_old', 'old prompt', "
            "'surface', 'provider', 'completed', 1.5, 2.5, '{{\"input_tokens\":3}}', NULL, "
            '\'{{"k":"v"}}\', 2)'
        ).format(ident(pg_schema, "runs"))
    )
    await pg_admin.execute(
        sql.SQL(
            "INSERT INTO {} (run_id, seq, task_id, type, ts, payload) VALUES "
            "('run_old', 1, NULL, 'run.started', 1.5, '{{\"a\":1}}'), "
            "('run_old', 2, NULL, 'message.delta', 1.75, '{{\"text\":\"hé\"}}')"
        ).format(ident(pg_schema, "events"))
    )
    async with opened(pg_schema) as store:
        run = await store.get_run("run_old")
        assert (run.prompt, run.usage, run.metadata) == (
            "old prompt",
            {"input_tokens": 3},
            {"k": "v"},
        )
        assert [(e.seq, e.type, dict(e.payload), e.ts) for e in await store.read("run_old")] == [
            (1, "run.started", {"a": 1}, 1.5),
            (2, "message.delta", {"text": "hé"}, 1.75),
        ]
        # Ended (its status) without a closed_at before it: closed by the upgrade (ADR 0134).
        with pytest.raises(RunClosedError):
            await store.append_one("run_old", NewEvent("x"))
    assert await applied_versions(pg_admin, pg_schema) == {
        m.version for m in load_migrations("postgres")
    }
    indexes = await fetch(
        pg_admin, "SELECT indexname FROM pg_indexes WHERE schemaname = %s", pg_schema
    )
    assert {"runs_by_created_at", "active_api_keys_by_hash"} <= {r[0] for r in indexes}


async def test_schema_from_a_newer_version_is_refused(pg_admin: Admin, pg_schema: str) -> None:
    async with opened(pg_schema):
        pass
    await pg_admin.execute(
        sql.SQL("INSERT INTO {} (version, name) VALUES (99, 'future')").format(
            ident(pg_schema, "thoughtgate_migrations")
        )
    )
    with pytest.raises(StoreError, match=r"schema version 99.*newer thoughtgate") as info:
        await PostgresStore.open(PG_URL, schema=pg_schema)
    assert pg_schema in str(info.value)


async def test_a_schema_with_foreign_tables_is_refused_untouched(
    pg_admin: Admin, pg_schema: str
) -> None:
    await pg_admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(pg_schema)))
    await pg_admin.execute(
        sql.SQL("CREATE TABLE {} (id int PRIMARY KEY)").format(ident(pg_schema, "customers"))
    )
    with pytest.raises(NotOurDatabaseError, match="customers") as info:
        await PostgresStore.open(PG_URL, schema=pg_schema)
    assert "left untouched" in str(info.value)
    tables = await fetch(
        pg_admin, "SELECT tablename FROM pg_tables WHERE schemaname = %s", pg_schema
    )
    assert tables == [("customers",)]


async def test_schema_from_the_url_and_open_store(pg_admin: Admin, pg_schema: str) -> None:
    sep = "&" if "?" in PG_URL else "?"
    store = await open_store(f"{PG_URL}{sep}schema={pg_schema}&connect_timeout=5")
    try:
        assert isinstance(store, PostgresStore)
        assert store.schema == pg_schema
        run = make_run()
        await store.create_run(run)
    finally:
        await store.close()
    rows = await fetch(pg_admin, sql.SQL("SELECT run_id FROM {}").format(ident(pg_schema, "runs")))
    assert rows == [(run.run_id,)]
    assert split_schema_param(
        "postgresql://h/db?sslmode=disable&schema=s%20x&options=-c+a%3Db"
    ) == (
        "postgresql://h/db?sslmode=disable&options=-c+a%3Db",
        "s x",
    )
    assert split_schema_param("postgresql://h/db") == ("postgresql://h/db", None)


@pytest.mark.parametrize("password", ["X?Y", "X#Y", "X?Y#Z&schema=no"])
async def test_a_password_with_a_bare_question_mark_or_hash_keeps_the_urls_schema(
    pg_schema: str, caplog: pytest.LogCaptureFixture, password: str
) -> None:
    """libpq reads a URL's user info up to its first ``@``, so a password may hold a bare ``?``
    or ``#``; ``urlsplit`` cut the URL there, ``?schema=`` stayed in what libpq was given, and
    libpq refused it ("invalid URI query parameter"). The server trusts the login, so the
    password is read and ignored; the store opens in the URL's schema, and no log line says
    the password (ADR 0135, amendment 6)."""
    assert PG_URL.startswith("postgresql://postgres@"), "the URL this test rewrites"
    url = PG_URL.replace("postgres@", f"postgres:{password}@", 1)
    sep = "&" if "?" in PG_URL.split("@", 1)[1] else "?"
    caplog.set_level("DEBUG")
    store = await open_store(f"{url}{sep}schema={pg_schema}&connect_timeout=5")
    try:
        assert isinstance(store, PostgresStore)
        assert store.schema == pg_schema
    finally:
        await store.close()
    assert not [r for r in caplog.records if password in r.getMessage()]


async def test_without_a_schema_the_search_path_decides(pg_admin: Admin, pg_schema: str) -> None:
    await pg_admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(pg_schema)))
    sep = "&" if "?" in PG_URL else "?"
    store = await PostgresStore.open(f"{PG_URL}{sep}options=-csearch_path%3D{pg_schema}")
    try:
        assert store.schema == pg_schema
    finally:
        await store.close()


async def test_unreachable_server_is_reported_with_the_reason() -> None:
    with pytest.raises(StoreUnavailableError, match=r"127\.0\.0\.1:1.*unreachable") as info:
        await PostgresStore.open("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")
    assert "password" not in str(info.value)


async def test_writes_to_a_read_only_database_say_read_only(pg_schema: str) -> None:
    async with opened(pg_schema) as store:
        run = make_run()
        await store.create_run(run)
        appended = await store.append(run.run_id, deltas(3))
    sep = "&" if "?" in PG_URL else "?"
    ro_url = f"{PG_URL}{sep}options=-cdefault_transaction_read_only%3Don"
    store = await PostgresStore.open(ro_url, schema=pg_schema)
    try:
        assert_same_events(await store.read(run.run_id), appended)
        with pytest.raises(StoreReadOnlyError, match="read-only"):
            await store.append(run.run_id, deltas(1))
        with pytest.raises(StoreReadOnlyError, match="read-only"):
            await store.update_run(run.run_id, status="failed")
        assert_same_events(await store.read(run.run_id), appended)
    finally:
        await store.close()


async def test_a_batch_the_server_rejects_stores_nothing(pg_schema: str, pg_admin: Admin) -> None:
    async with opened(pg_schema) as store:
        run = make_run()
        await store.create_run(run)
        # The server refuses the batch's last row (a NUL in a type, which this test used, is
        # refused before the statement now: ADR 0120).
        await pg_admin.execute(
            sql.SQL(
                "CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN IF NEW.type = 'refused' THEN RAISE EXCEPTION 'refused'; END IF; "
                "RETURN NEW; END $$; "
                "CREATE TRIGGER refuse BEFORE INSERT ON {schema}.events "
                "FOR EACH ROW EXECUTE FUNCTION {schema}.refuse()"
            ).format(schema=sql.Identifier(pg_schema))
        )
        bad = [*deltas(3), NewEvent("refused", {})]
        with pytest.raises(StoreError, match=r"append 4 events") as info:
            await store.append(run.run_id, bad)
        assert pg_schema in str(info.value)
        assert await store.read(run.run_id) == []
        assert [e.seq for e in await store.append(run.run_id, deltas(2))] == [1, 2]


def test_driver_errors_map_into_the_store_tree() -> None:
    where = "PostgreSQL database test at h:5432, schema s"
    full = translate_error(pgerr.DiskFull("could not extend file"), "append 3 events", where)
    assert type(full) is StoreError
    assert "database or disk is full" in str(full)
    assert isinstance(
        translate_error(pgerr.ReadOnlySqlTransaction("ro"), "append", where), StoreReadOnlyError
    )
    assert isinstance(
        translate_error(pgerr.AdminShutdown("terminating"), "read", where), StoreUnavailableError
    )
    assert where in str(translate_error(pgerr.UniqueViolation("dup"), "create run", where))


def test_a_refused_login_is_named_as_one_not_as_an_unreachable_server() -> None:
    """A wrong password or a role that does not exist said "is unreachable or the connection was
    lost", the cause only in the quoted detail. SQLSTATE class 28 with a code, or libpq's text
    of a refused login (a failed connection has no SQLSTATE in psycopg), says authentication."""
    where = "PostgreSQL database test at h:5432"
    said = "check the user and password in the store URL"
    refused = [
        pgerr.InvalidPassword('password authentication failed for user "bob"'),
        pgerr.InvalidAuthorizationSpecification('role "bob" does not exist'),
        psycopg.OperationalError(
            'connection failed: connection to server at "h", port 5432 failed: FATAL:  '
            'password authentication failed for user "bob"'
        ),
        psycopg.OperationalError('... failed: FATAL:  role "bob" does not exist'),
        psycopg.OperationalError('... failed: FATAL:  no pg_hba.conf entry for host "10.0.0.9"'),
        psycopg.OperationalError("... failed: fe_sendauth: no password supplied"),
    ]
    for exc in refused:
        error = translate_error(exc, "open the store", where)
        assert isinstance(error, StoreUnavailableError)
        assert str(error).startswith(f"cannot open the store: authentication to {where} failed")
        assert said in str(error) and "unreachable" not in str(error)
    for exc in (
        psycopg.OperationalError("... port 5432 failed: Connection refused"),
        pgerr.AdminShutdown("terminating connection due to administrator command"),
    ):
        assert "is unreachable" in str(translate_error(exc, "read", where)), exc
    # (an undefined role in a statement is not a login: GRANT ... TO nobody)
    assert said not in str(
        translate_error(pgerr.UndefinedObject('role "x" does not exist'), "r", where)
    )


def test_a_database_that_does_not_exist_is_named_as_such_not_as_an_unreachable_server() -> None:
    """SQLSTATE 3D000, or libpq's text of it on connecting (no SQLSTATE there), says the
    database does not exist and what to do; it said "is unreachable or the connection was lost"."""
    where = "PostgreSQL database tset at h:5432"
    for exc in (
        pgerr.InvalidCatalogName('database "tset" does not exist'),
        psycopg.OperationalError(
            'connection failed: connection to server at "h", port 5432 failed: FATAL:  '
            'database "tset" does not exist'
        ),
    ):
        error = translate_error(exc, "open the store", where)
        assert isinstance(error, StoreUnavailableError)
        assert str(error).startswith(
            f"cannot open the store: the database does not exist ({where}); create it, or fix "
            "the database name in the store URL ("
        ), str(error)
        assert "unreachable" not in str(error) and "authentication" not in str(error)
    # a role that does not exist is still a refused login, not a missing database
    refused = psycopg.OperationalError('... failed: FATAL:  role "tset" does not exist')
    assert "authentication" in str(translate_error(refused, "open the store", where))


def test_channel_names_fit_postgres_identifiers() -> None:
    assert channel_name("s") == "thoughtgate_events:s"
    assert len(channel_name("x" * 200).encode()) <= 63
    assert channel_name("x" * 200) != channel_name("y" * 200)


async def test_a_killed_pool_connection_costs_at_most_one_call(
    pg_admin: Admin, pg_schema: str
) -> None:
    async with opened(pg_schema, pool_size=1) as store:
        run = make_run()
        await store.create_run(run)
        await pg_admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"thoughtgate:{pg_schema}",),
        )
        with contextlib.suppress(StoreUnavailableError):
            await store.read(run.run_id)
        assert (await store.append_one(run.run_id, NewEvent("x"))).seq == 1


async def test_the_pool_opens_connections_when_asked_and_never_more_than_its_size(
    pg_admin: Admin, pg_schema: str
) -> None:
    async def held() -> int:
        rows = await fetch(
            pg_admin,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            f"thoughtgate:{pg_schema}",
        )
        return int(rows[0][0])

    async with opened(pg_schema, pool_size=2) as store:
        assert await held() == 0, "nothing is opened before a call needs it"
        run = make_run()
        await store.create_run(run)
        await asyncio.gather(*(store.append(run.run_id, deltas(5)) for _ in range(40)))
        assert 1 <= await held() <= 2
        assert [e.seq for e in await store.read(run.run_id)] == list(range(1, 201))
    # The client has said goodbye on each connection; the server ends each backend (and drops it
    # from pg_stat_activity) a moment later, on a busy machine only after the next query here.
    for _ in range(1000):  # 10 s at most
        if await held() == 0:
            break
        await asyncio.sleep(0.01)
    assert await held() == 0, "closing the store closes its connections"


async def test_a_call_cancelled_mid_query_leaves_no_broken_connection_behind(
    pg_admin: Admin, pg_schema: str
) -> None:
    async with opened(pg_schema, pool_size=1) as store:
        run = make_run()
        await store.create_run(run)
        async with pg_admin.transaction():
            await pg_admin.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                    ident(pg_schema, "secrets")
                )
            )
            stuck = asyncio.create_task(store.get_or_create_secret("ticket_key", "v"))
            for _ in range(1000):  # until the store's one connection waits on the lock
                waiting = await fetch(
                    pg_admin,
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND wait_event_type = 'Lock'",
                    f"thoughtgate:{pg_schema}",
                )
                if waiting[0][0] == 1:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the call never reached the server")
            stuck.cancel()
            with contextlib.suppress(asyncio.CancelledError, StoreUnavailableError):
                await stuck
        # the pool's one connection was cancelled mid-query: the next call still works
        assert (await store.append_one(run.run_id, NewEvent("x"))).seq == 1
        assert await store.get_or_create_secret("ticket_key", "w") == "w"


# -- ordering ------------------------------------------------------------------------------
async def test_sequence_order_is_commit_order(pg_admin: Admin, pg_schema: str) -> None:
    """Writers on several connections; a reader resuming from its last seq never skips one.

    A trigger makes every append linger (randomly) after its rows are numbered and before it
    commits, which is exactly the window in which a badly numbered append would let a later
    number become visible first."""
    async with contextlib.AsyncExitStack() as stack:
        writers = [
            await stack.enter_async_context(opened(pg_schema, pool_size=3)) for _ in range(3)
        ]
        reader = await stack.enter_async_context(opened(pg_schema))
        run = make_run()
        await writers[0].create_run(run)
        await pg_admin.execute(
            sql.SQL(
                "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep(random() * 0.004); RETURN NULL; END $$"
            ).format(ident(pg_schema, "linger"))
        )
        await pg_admin.execute(
            sql.SQL(
                "CREATE TRIGGER linger AFTER INSERT ON {} FOR EACH STATEMENT EXECUTE FUNCTION {}()"
            ).format(ident(pg_schema, "events"), ident(pg_schema, "linger"))
        )
        rng = random.Random(7)
        plan = [[rng.randint(1, 4) for _ in range(12)] for _ in range(9)]  # 9 tasks x 12 batches
        total = sum(map(sum, plan))

        async def write(store: PostgresStore, sizes: list[int]) -> None:
            for size in sizes:
                await store.append(run.run_id, deltas(size))

        reads: list[list[int]] = []

        async def poll() -> None:
            cursor = 0
            while cursor < total:
                seqs = [e.seq for e in await reader.read(run.run_id, after=cursor)]
                reads.append(seqs)
                assert seqs == list(range(cursor + 1, cursor + 1 + len(seqs))), (cursor, seqs)
                cursor = seqs[-1] if seqs else cursor

        tail = asyncio.create_task(collect(reader.tail(run.run_id), within=60))
        await asyncio.wait_for(
            asyncio.gather(poll(), *(write(writers[i % 3], sizes) for i, sizes in enumerate(plan))),
            60,
        )
        await writers[0].append_one(run.run_id, NewEvent(EventType.RUN_SETTLEMENT_COMPLETED))
        tailed = await tail
    assert [e.seq for e in tailed] == list(range(1, total + 2))
    assert sum(1 for r in reads if r) > 5, "the reader never overlapped the writers"


# -- live fan-out --------------------------------------------------------------------------
async def listener_pid(admin: Admin, schema: str) -> int:
    for _ in range(100):
        rows = await fetch(
            admin,
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
            f"thoughtgate-listen:{schema}",
        )
        if rows:
            assert len(rows) == 1
            return int(rows[0][0])
        await asyncio.sleep(0.05)
    raise AssertionError("no LISTEN connection appeared")


async def wait_until(condition: Any, what: str, within: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def test_listen_notify_wakes_tails_and_survives_a_dropped_listener(
    pg_admin: Admin, pg_schema: str
) -> None:
    async with opened(pg_schema) as writer, opened(pg_schema) as reader:
        # No polling can deliver within this test: only NOTIFY, or a listener reconnect.
        reader.safety_poll = reader.poll_interval = 60.0
        run = make_run()
        await writer.create_run(run)
        got: list[Event] = []
        tail = tail_into(reader, run.run_id, got)
        first_pid = await listener_pid(pg_admin, pg_schema)
        await writer.append(run.run_id, deltas(3))
        await wait_until(lambda: len(got) == 3, "events delivered by NOTIFY")

        await pg_admin.execute("SELECT pg_terminate_backend(%s)", (first_pid,))
        await writer.append(run.run_id, deltas(3, start=3))  # likely while nobody listens
        await wait_until(lambda: len(got) == 6, "events re-read after the listener reconnected")
        second_pid = await listener_pid(pg_admin, pg_schema)
        assert second_pid != first_pid

        await writer.append_one(run.run_id, NewEvent(EventType.RUN_ERROR))
        await asyncio.wait_for(tail, 5)
    assert [e.seq for e in got] == list(range(1, 8))


class _BrokenLiveReader:
    """A live feed whose wake-up handler has a bug."""

    def published(self, events: Sequence[Event]) -> None:
        pass

    def notified(self, last_seq: int | None) -> None:
        raise RuntimeError("a live reader's bug")


async def test_a_failing_wake_up_callback_does_not_stop_later_notifications(
    pg_admin: Admin, pg_schema: str
) -> None:
    """A callback of the LISTEN connection that raises (on connecting, on a notification, or a
    live reader's) is logged and the listener carries on: tails keep being woken by NOTIFY, not
    left to their 60 s safety poll. A listener task that ended anyway is started again."""
    async with opened(pg_schema) as writer, opened(pg_schema) as reader:
        reader.safety_poll = reader.poll_interval = 60.0  # NOTIFY or nothing
        listener = reader._listener
        woken = listener._on_notify
        failed: list[str] = []

        def fail_once(payload: str) -> None:
            if "notify" not in failed:
                failed.append("notify")
                raise RuntimeError("a wake-up callback's bug")
            woken(payload)

        def fail_on_connect() -> None:
            failed.append("connected")
            raise RuntimeError("an on-connect callback's bug")

        listener._on_notify = fail_once
        listener._on_connected = fail_on_connect
        run = make_run()
        await writer.create_run(run)
        await writer._notifier.idle()  # its run-list wake-up (ADR 0140) sent before anyone listens
        reader.wakeups.listen(run.run_id, _BrokenLiveReader())
        got: list[Event] = []
        tail = tail_into(reader, run.run_id, got)
        first_pid = await listener_pid(pg_admin, pg_schema)
        await wait_until(lambda: failed == ["connected"], "the on-connect callback failed")
        assert listener.healthy and listener.connections == 1
        await writer.append(run.run_id, deltas(2))  # its NOTIFY hits the failing callback
        await wait_until(lambda: "notify" in failed, "the notify callback failed")
        await writer.append(run.run_id, deltas(2, start=2))
        await wait_until(lambda: len(got) == 4, "later events delivered by NOTIFY")
        assert await listener_pid(pg_admin, pg_schema) == first_pid  # the same LISTEN session

        listener._on_connected = reader.wakeups.notify_all  # as the store has it
        task = listener._task  # a listener task that ended without stop(): start() restarts it
        assert task is not None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await writer.append(run.run_id, deltas(1, start=4))  # nobody listens: only a restart,
        # which wakes every tail once it listens again, delivers it
        listener.start()
        await wait_until(lambda: len(got) == 5, "the event appended while nobody listened")
        await writer.append_one(run.run_id, NewEvent(EventType.RUN_ERROR))
        await asyncio.wait_for(tail, 5)
    assert [e.seq for e in got] == list(range(1, 7))
    assert listener.connections == 2


async def test_a_run_changed_by_another_replica_wakes_list_readers_by_notify(
    pg_schema: str,
) -> None:
    async with opened(pg_schema) as writer, opened(pg_schema) as reader:
        reader.safety_poll = reader.poll_interval = reader.list_poll_interval = 60.0
        await writer.create_run(make_run())
        await changes_settled(reader)  # else another test's transaction holds `after` back
        after = await reader.latest_run_change()
        await reader.wait_for_run_changes(after - 1)  # starts the listener, which wakes
        # everyone once as it starts listening (in the same step as it turns healthy)
        await wait_until(lambda: reader._listener.healthy, "the listener listens")
        parked = asyncio.Event()
        wait = reader.wakeups.wait

        async def parking_wait(*args: Any, **kw: Any) -> None:
            parked.set()
            await wait(*args, **kw)

        reader.wakeups.wait = parking_wait  # type: ignore[method-assign]
        for change in ("create", "update", "finish"):
            parked.clear()
            waiting = asyncio.create_task(reader.wait_for_run_changes(after))
            await asyncio.wait_for(parked.wait(), 5)  # it found nothing new and waits
            assert not waiting.done(), "nothing changed yet"
            if change == "create":
                run = make_run()
                await writer.create_run(run)
            elif change == "update":
                await writer.update_run(run.run_id, status="running")
            else:
                end = [NewEvent(EventType.RUN_FAILED, {"status": "failed"})]
                await writer.finish_run(run.run_id, end, RunEnding("failed"))
            await asyncio.wait_for(waiting, 5)  # NOTIFY, not the 60 s poll
            await changes_settled(reader)
            after = await reader.latest_run_change()
        assert [r.status for _, r in (await reader.run_changes(after=after - 1)).changes] == [
            "failed"
        ]


async def test_a_tail_sees_events_appended_by_another_process(pg_schema: str) -> None:
    code = (
        "import asyncio, sys\n"
        "from thoughtgate.events.schema import NewEvent\n"
        "from thoughtgate.store.postgres import PostgresStore\n"
        "async def main(url, schema, run_id):\n"
        "    store = await PostgresStore.open(url, schema=schema)\n"
        "    for i in range(5):\n"
        "        await store.append_one(run_id, NewEvent('w', {'i': i}))\n"
        "        await asyncio.sleep(0.01)\n"
        "    await store.append_one(run_id, NewEvent('run.failed'))\n"
        "    await store.close()\n"
        "asyncio.run(main(*sys.argv[1:]))\n"
    )
    async with opened(pg_schema) as store:
        store.safety_poll = store.poll_interval = 60.0  # NOTIFY or nothing
        run = make_run()
        await store.create_run(run)
        tail = asyncio.create_task(collect(store.tail(run.run_id), within=30))
        await run_store_script(code, PG_URL, pg_schema, run.run_id)
        got = await tail
    assert [e.seq for e in got] == [1, 2, 3, 4, 5, 6]
    assert [e.payload.get("i") for e in got[:5]] == [0, 1, 2, 3, 4]
    assert got[5].type == EventType.RUN_FAILED


async def test_events_of_an_older_vocabulary_replay_upgraded_in_every_page(
    pg_admin: Admin, pg_schema: str
) -> None:
    """Rows written before the current vocabulary (``v`` 0: camelCase tool keys) come back
    upgraded whether their page is all old (read as columns) or mixed (read row by row)."""
    async with opened(pg_schema) as store:
        run_id = await a_run_of_tool_failures(store)
        await pg_admin.execute(
            sql.SQL("UPDATE {} SET v = 0 WHERE seq <= 300").format(ident(pg_schema, "events"))
        )
        await assert_old_rows_replay_upgraded(store, run_id)


async def test_a_page_with_a_gap_is_read_as_its_rows(pg_admin: Admin, pg_schema: str) -> None:
    """``events_page_counted`` sends a page's count and largest number, not its numbers (ADR
    0127): a page missing a row is recognised and read row by row, never renumbered."""
    async with opened(pg_schema) as store:
        run_id, written = await a_run_to_hole(store)
        await pg_admin.execute(
            sql.SQL("DELETE FROM {} WHERE run_id = %s AND seq = %s").format(
                ident(pg_schema, "events")
            ),
            (run_id, GAP_AT),
        )
        await assert_a_gap_is_never_renumbered(store, run_id, written)


async def test_upgrade_closes_every_ended_run_at_its_end_and_keeps_the_open_ones_open(
    pg_admin: Admin, pg_schema: str
) -> None:
    """Migration 13 (ADR 0134) closes the runs that ended without a ``closed_at`` (before
    migration 4, or by a status written without ``finish_run``): at their last terminal event's
    time, else their ``updated_at``. The open runs stay open, a closed run keeps its
    ``closed_at``, every run, status and event is kept, and an ended run takes no more events."""
    before = load_migrations("postgres")[:12]
    assert load_migrations("postgres")[12].name == "ended_runs_closed"
    await migrate(pg_admin, pg_schema, before, "test")
    async with pg_admin.cursor() as cur:
        await cur.executemany(
            sql.SQL(
                "INSERT INTO {} (run_id, prompt, chain_of_thought, worker_backend, status, "
                "created_at, updated_at, usage, error, metadata, last_seq, change_seq, owner, "
                "lease_expires_at, closed_at) VALUES (%s, 'p', 'hidden', 'provider', %s, 1.0, "
                "%s, '{{}}', NULL, '{{}}', %s, %s, %s, %s, %s)"
            ).format(ident(pg_schema, "runs")),
            ENDED_UNCLOSED_RUNS,
        )
        await cur.executemany(
            sql.SQL(
                "INSERT INTO {} (run_id, seq, task_id, type, ts, payload) "
                "VALUES (%s, %s, NULL, %s, %s, '{{}}')"
            ).format(ident(pg_schema, "events")),
            ENDED_UNCLOSED_EVENTS,
        )
    async with opened(pg_schema) as store:
        await assert_ended_runs_closed(store)
    closed = await fetch(
        pg_admin, sql.SQL("SELECT run_id, closed_at FROM {}").format(ident(pg_schema, "runs"))
    )
    assert dict(closed) == ENDED_UNCLOSED_CLOSED_AT
    assert await applied_versions(pg_admin, pg_schema) == {
        m.version for m in load_migrations("postgres")
    }


async def test_upgrade_to_the_counted_page_reads_old_events_through_the_primary_key_in_order(
    pg_admin: Admin, pg_schema: str
) -> None:
    """A schema of version 11 with a run's events gets ``events_page_counted`` at its next start
    (ADR 0127) and keeps ``events_page`` for a replica still running the version before; the run
    reads back whole. The new function's body, under its own settings, is one plan whose order
    the aggregates take as the page's: the primary key's index read in order, no sort, no
    parallel workers -- on a table never analyzed and on an analyzed one."""
    before = load_migrations("postgres")[:11]
    assert load_migrations("postgres")[11].name == "events_page_counted"
    await migrate(pg_admin, pg_schema, before, "test")
    await pg_admin.execute(
        sql.SQL(
            "INSERT INTO {} (run_id, prompt, chain_of_thought, worker_backend, status, "
            "created_at, updated_at, usage, error, metadata, last_seq, change_seq) VALUES "
            "('run_old', 'p', 'hidden', 'provider', 'completed', 1.0, 1.0, '{{}}', NULL, '{{}}', "
            "2500, 1)"
        ).format(ident(pg_schema, "runs"))
    )
    await pg_admin.execute(
        sql.SQL(
            "INSERT INTO {} (run_id, seq, task_id, type, ts, payload, v) "
            "SELECT 'run_old', g, CASE WHEN g % 3 = 0 THEN NULL ELSE 't' || g % 5 END, "
            "'message.delta', 2.0 + g, json_build_object('i', g), 1 "
            "FROM generate_series(2500, 1, -1) AS g"  # inserted backwards: heap order is not seq
        ).format(ident(pg_schema, "events"))
    )
    async with opened(pg_schema) as store:
        got = await store.read("run_old")
        assert [e.seq for e in got] == list(range(1, 2501))
        assert [e.payload["i"] for e in got] == list(range(1, 2501))
        assert [e.task_id for e in got[:6]] == ["t1", "t2", None, "t4", "t0", None]
    functions = await fetch(
        pg_admin,
        "SELECT p.proname, p.prosrc, p.proconfig FROM pg_catalog.pg_proc p "
        "JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s "
        "AND p.proname LIKE 'events_page%%'",
        pg_schema,
    )
    by_name = {name: (body, config) for name, body, config in functions}
    assert set(by_name) == {
        "events_page",
        "events_page_counted",
        "events_page_shown",
        "events_page_parts",
    }
    # (the last two: ADR 0160, its amendment 3)
    for name in ("events_page_counted", "events_page_shown", "events_page_parts"):
        await assert_one_ordered_plan(pg_admin, pg_schema, *by_name[name])


async def assert_one_ordered_plan(
    pg_admin: Admin, pg_schema: str, body: str, config: list[str]
) -> None:
    """A page function's body, under its own settings, is one plan whose order the aggregates
    take as the page's: the primary key's index read in order, no sort, no parallel workers."""
    query = body.split("RETURN QUERY", 1)[1].rsplit(";", 1)[0]
    query = query.replace("p_run_id", "'run_old'").replace("p_after", "1000")
    query = query.replace("p_last", "2000")
    async with pg_admin.transaction():
        await pg_admin.execute(
            sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(pg_schema))
        )
        for setting in config:
            name, value = setting.split("=", 1)
            await pg_admin.execute(
                sql.SQL("SET LOCAL {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )
        for analyzed in (False, True):
            if analyzed:
                await pg_admin.execute("ANALYZE events")
            rows = await fetch(pg_admin, f"EXPLAIN (COSTS OFF) {query}")
            plan = [str(r[0]).strip().lstrip("-> ").strip() for r in rows]
            assert plan[0] == "Aggregate", (analyzed, plan)
            assert plan[1].startswith("Index Scan using events_pkey on events e"), (analyzed, plan)
            assert not any(
                step.startswith(("Sort", "Gather", "Bitmap", "Seq Scan", "Incremental"))
                for step in plan
            ), (analyzed, plan)
    assert sorted(config) == [
        "enable_bitmapscan=off",
        "enable_sort=off",
        "max_parallel_workers_per_gather=0",
    ]


async def test_task_ids_and_types_replay_exactly_in_every_page(pg_schema: str) -> None:
    """A page's task ids and types travel as joined texts (``events_page``): no task id, an
    empty one and ordinary ones come back as stored, and a task id or a type holding the
    separator sends its page to the row-by-row read, still exact."""
    async with opened(pg_schema) as store:
        run = make_run()
        await store.create_run(run)
        kinds: list[tuple[str | None, str]] = [
            (None, EventType.MESSAGE_DELTA),
            ("", EventType.MESSAGE_DELTA),
            ("task-1", EventType.REASONING_DELTA),
            ("task-2", EventType.MESSAGE_DELTA),
        ]
        batch = [
            NewEvent(type_, {"i": i}, task_id=task_id)
            for i, (task_id, type_) in enumerate(kinds * 600)
        ]
        batch[1500] = NewEvent(EventType.MESSAGE_DELTA, {"i": 1500}, task_id="a\x1fb")
        batch[2100] = NewEvent("custom\x1ftype", {"i": 2100}, task_id=None)
        written = await store.append(run.run_id, batch)
        last = await store.append_one(run.run_id, NewEvent(EventType.RUN_FAILED))
        assert_same_events(await store.read(run.run_id), [*written, last])
        assert_same_events(await collect(store.tail(run.run_id)), [*written, last])
        assert [(e.task_id, e.type) for e in written[:4]] == kinds


def test_a_store_urls_password_is_in_no_error_even_when_the_url_is_misparsed() -> None:
    """A password with ``@``, ``/`` or a bad ``%`` escape in it, not percent-encoded, is parsed
    into the host, port or database, or quoted by libpq's parser: the store's errors (where, and
    the driver's words) showed pieces of it, ``r3t@127.0.0.1`` or ``at u:Sek`` (red team, ADR
    0135). Each piece is now masked, wherever the driver put it."""
    from thoughtgate.store.pg_errors import describe_target

    def parse_error(url: str) -> psycopg.Error:
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            return exc
        raise AssertionError(url)

    cases = [
        (
            "postgresql://u:Sek@r3t@127.0.0.1:5432/db",
            psycopg.OperationalError("failed to resolve host 'r3t@127.0.0.1': Name not known"),
        ),
        (
            "postgresql://u:Sek/r3t@127.0.0.1:5432/db",
            psycopg.OperationalError("failed to resolve host 'u': Servname not supported"),
        ),
        ("postgresql://u:Sek%zzr3t@127.0.0.1:5432/db", parse_error("postgresql://u:Sek%zzr3t@h/d")),
        (
            "postgresql://u:Sekr3t@127.0.0.1:5432/db",
            psycopg.OperationalError('... failed: FATAL:  role "u" does not exist'),
        ),
    ]
    for url, exc in cases:
        where = describe_target(url, "s")
        said = str(translate_error(exc, "open the store", where, conninfo=url))
        for piece in ("Sek", "r3t"):
            assert piece not in said, (url, said)
        assert "127.0.0.1" in said or "unparseable" in said or "'u'" in said, said
