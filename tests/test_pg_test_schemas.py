"""The PostgreSQL test fixtures' schemas: each records the process that owns it, and a sweep drops
those whose owner is gone, never another live process's (``support.pg``)."""

from __future__ import annotations

import datetime
import re
import secrets
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.bench_modules import bench_module
from support.pg import KEEPER_PREFIX, PG_URL, owner_of, schema_name, sweep_abandoned_schemas

OWNERS = bench_module("pg_owners")
KEEPER_PREFIXES: dict[str, str] = OWNERS.KEEPER_PREFIXES
STAMP: re.Pattern[str] = OWNERS._STAMP
"""The comment a sweep leaves on a name that records no owner."""


def _tag() -> str:
    return f"{secrets.randbelow(10**6)}r{secrets.token_hex(3)}"


def _schemas(conn: psycopg.Connection[Any]) -> set[str]:
    return {n for (n,) in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


def _create(conn: psycopg.Connection[Any], *names: str) -> None:
    for name in names:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))


def _drop(conn: psycopg.Connection[Any], *names: str) -> None:
    for name in names:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.mark.unit
def test_a_schema_name_records_its_owner_and_only_such_names_have_one() -> None:
    assert owner_of("tg_test_o4242r0a1b2c_0123abcd") == "4242r0a1b2c"
    assert owner_of("tg_test_o4242r0a1b2c_0123abcd_workflows") == "4242r0a1b2c"
    assert owner_of("tg_bench_o4242r0a1b2c_0123abcd") == "4242r0a1b2c"
    assert owner_of("tg_bench_o4242r0a1b2c_0123abcd_notify_workflows") == "4242r0a1b2c"
    for unowned in (
        "tg_test_0123456789ab",  # named before owners were recorded: nobody can tell whose
        "tg_test_0123456789ab_workflows",
        "tg_bench_0123456789ab",  # the bench's, named before owners were recorded
        "tg_other_o4242r0a1b2c_0123abcd",
        "public",
        "tg_test_o4242_0123abcd; DROP",
        "tg_test_o_0123abcd",
    ):
        assert owner_of(unowned) is None, unowned


@pytest.mark.external
@pytest.mark.postgres
def test_the_sweep_drops_only_the_schemas_of_owners_that_are_gone() -> None:
    """A schema (and DBOS's beside it) whose owner's keeper is gone is dropped; one whose
    owner's keeper is connected (another xdist worker, another run on any machine) is kept,
    until that keeper goes; one that records no owner (an older run's) is not dropped the day it
    is seen (see the next tests), and any other schema is never touched; this process's own,
    named by ``schema_name``, stay."""
    alive, dead = _tag(), _tag()
    mine = schema_name()  # this process's keeper is connected from here on
    live_schemas = [f"tg_test_o{alive}_{uuid.uuid4().hex[:8]}"]
    live_schemas.append(f"{live_schemas[0]}_workflows")
    dead_schemas = [f"tg_test_o{dead}_{uuid.uuid4().hex[:8]}"]
    dead_schemas.append(f"{dead_schemas[0]}_workflows")
    unowned = [f"tg_test_{uuid.uuid4().hex[:12]}", f"tg_sweep_{uuid.uuid4().hex[:8]}"]
    everything = [mine, *live_schemas, *dead_schemas, *unowned]
    # The other owner's keeper connects before its schemas exist, as a real owner's does: a sweep
    # by another process meanwhile (an xdist worker starting) must see it alive too.
    keeper = psycopg.connect(
        PG_URL, autocommit=True, connect_timeout=5, application_name=KEEPER_PREFIX + alive
    )
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
        try:
            _create(admin, *everything)
            with keeper:
                dropped = sweep_abandoned_schemas(admin)  # another process's may come first
                assert not {mine, *live_schemas, *unowned} & set(dropped)
                left = _schemas(admin)
                assert not set(dead_schemas) & left
                assert {mine, *live_schemas, *unowned} <= left
            # the other owner is gone now: its keeper ended with it
            _await_gone(admin, live_schemas)
            assert {mine, *unowned} <= _schemas(admin)
        finally:
            keeper.close()
            _drop(admin, *everything)


def _databases(conn: psycopg.Connection[Any]) -> set[str]:
    return {n for (n,) in conn.execute("SELECT datname FROM pg_database").fetchall()}


@pytest.mark.external
@pytest.mark.postgres
def test_the_sweep_drops_the_databases_and_bench_schemas_of_owners_that_are_gone() -> None:
    """A database a test made (``test_durable_setup``'s) and a schema the bench made, whose
    owner's keeper is gone, are dropped by the next sweep, whichever kind of process sweeps;
    a live owner's (a test process's or a bench's keeper connected) are kept until it goes; a
    database someone is still connected to is left for a later sweep, not forced."""
    alive, dead, busy = _tag(), _tag(), _tag()
    schema_name()  # this process's keeper is connected from here on
    live = [f"tg_test_o{alive}_{uuid.uuid4().hex[:8]}", f"tg_bench_o{alive}_{uuid.uuid4().hex[:8]}"]
    dead_db = f"tg_test_o{dead}_{uuid.uuid4().hex[:8]}"
    dead_bench = [f"tg_bench_o{dead}_{uuid.uuid4().hex[:8]}_notify"]
    dead_bench.append(f"{dead_bench[0]}_workflows")
    busy_db = f"tg_test_o{busy}_{uuid.uuid4().hex[:8]}"
    unowned_db = f"tg_test_{uuid.uuid4().hex[:12]}"
    databases = [*live, dead_db, busy_db, unowned_db]
    base = PG_URL.partition("?")[0].rsplit("/", 1)[0]

    def keeper(tag: str) -> psycopg.Connection[Any]:
        return psycopg.connect(
            PG_URL,
            autocommit=True,
            connect_timeout=5,
            application_name=KEEPER_PREFIXES["bench"] + tag,
        )

    # Each owner's keeper connects before its names exist, as ``Owner`` does: a sweep by another
    # process running meanwhile (an xdist worker starting) must not take them for abandoned yet.
    live_keeper, busy_keeper = keeper(alive), keeper(busy)
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
        try:
            for name in databases:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            _create(admin, *live, *dead_bench)
            with live_keeper, psycopg.connect(f"{base}/{busy_db}", connect_timeout=5):
                busy_keeper.close()  # its owner is gone; a session is still in its database
                dropped = sweep_abandoned_schemas(admin)  # another process may sweep first
                assert not {*live, busy_db, unowned_db} & set(dropped)
                # gone, unless another process's sweep is still dropping it (a DROP DATABASE
                # waits for a checkpoint: this sweep's, finding it locked, went on)
                _await_gone(admin, [dead_db, *dead_bench])
                assert {*live, busy_db, unowned_db} <= _databases(admin)
                assert set(live) <= _schemas(admin)
            # the bench owner is gone now, and nobody is connected to the busy database
            _await_gone(admin, [*live, busy_db])
            assert unowned_db in _databases(admin), "a name recording no owner is kept a day"
        finally:
            live_keeper.close()
            busy_keeper.close()
            _drop(admin, *live, *dead_bench)
            for name in databases:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def _await_gone(admin: psycopg.Connection[Any], names: list[str]) -> None:
    """Sweep until none of ``names`` is a schema or a database any more (this sweep or another
    process's dropped it): the server lists a closed session until its backend has exited."""
    for _ in range(200):
        sweep_abandoned_schemas(admin)
        if not set(names) & (_schemas(admin) | _databases(admin)):
            return
        admin.execute("SELECT pg_sleep(0.05)")
    raise AssertionError(f"{names} outlived their owner's keeper")


def _comment(admin: psycopg.Connection[Any], name: str) -> str | None:
    """The comment on the schema or database ``name`` (``None``: none, or no such name)."""
    row = admin.execute(
        "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = %s "
        "UNION ALL SELECT shobj_description(oid, 'pg_database') FROM pg_database "
        "WHERE datname = %s",
        (name, name),
    ).fetchone()
    return None if row is None else row[0]


def _sweep_later(
    admin: psycopg.Connection[Any], hours: float, until: Callable[[], bool] = lambda: True
) -> None:
    """Sweeps that judge the unowned names ``hours`` later than the server's clock (a day passes
    for this test's sweeps only, not for another process's sweeping meanwhile), until ``until``
    holds: another process's sweep may hold the turn to judge them (``_UNOWNED_LOCK``), or have
    stamped them a moment after this one did."""
    for _ in range(200):
        OWNERS.sweep_abandoned(admin, later=datetime.timedelta(hours=hours))
        if until():
            return
        admin.execute("SELECT pg_sleep(0.05)")
    raise AssertionError(f"what the sweep {hours} h later should have done was not done")


def _stamped_since(admin: psycopg.Connection[Any], name: str) -> datetime.datetime:
    stamp = STAMP.fullmatch(_comment(admin, name) or "")
    assert stamp, name
    return datetime.datetime.fromisoformat(stamp.group(1))


@pytest.mark.external
@pytest.mark.postgres
def test_unowned_leftovers_are_dropped_once_unused_for_a_day_never_while_in_use() -> None:
    """Schemas and databases named before owners were recorded (``tg_test_<12 hex>``,
    ``tg_bench_<12 hex>_<label>``): the first sweep stamps them, dropping nothing; once the stamp
    is older than ``UNOWNED_AFTER`` (a day) the next sweep drops those unused since -- but not
    one whose tables another session has locked, a database a session is connected to, or a
    schema whose tables were read after its stamp (stamped again from then), until they too go
    unused for a day. A name with someone else's comment, and any other name, are never
    touched."""
    schema_name()  # this process's keeper is connected from here on
    hexes = [uuid.uuid4().hex[:12] for _ in range(7)]
    old, workflows = f"tg_test_{hexes[0]}", f"tg_bench_{hexes[1]}_notify_workflows"
    locked, used = f"tg_test_{hexes[2]}_locked", f"tg_test_{hexes[3]}"
    annotated, other = f"tg_test_{hexes[4]}", f"tg_sweep_{hexes[5][:8]}"
    old_db, busy_db = f"tg_test_{hexes[6]}", f"tg_bench_{hexes[5]}"
    schemas = [old, workflows, locked, used, annotated, other]
    databases = [old_db, busy_db]
    base = PG_URL.partition("?")[0].rsplit("/", 1)[0]
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
        try:
            _create(admin, *schemas)
            for name in (old, locked, used):
                admin.execute(sql.SQL("CREATE TABLE {}.t (x int)").format(sql.Identifier(name)))
            admin.execute(
                sql.SQL("COMMENT ON SCHEMA {} IS 'kept by hand'").format(sql.Identifier(annotated))
            )
            for name in databases:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            admin.execute("SELECT pg_stat_force_next_flush()")  # nothing pending: counts settle

            ours = [old, workflows, locked, used, old_db, busy_db]
            _sweep_later(
                admin, 0, lambda: all(STAMP.fullmatch(_comment(admin, n) or "") for n in ours)
            )
            assert {*schemas} <= _schemas(admin) and {*databases} <= _databases(admin)
            assert _comment(admin, annotated) == "kept by hand" and _comment(admin, other) is None
            _sweep_later(admin, 23)
            assert {*schemas} <= _schemas(admin) and {*databases} <= _databases(admin)

            stamped = _stamped_since(admin, used)
            with (
                psycopg.connect(PG_URL, connect_timeout=5) as holder,
                psycopg.connect(f"{base}/{busy_db}", connect_timeout=5),
            ):
                holder.execute(
                    sql.SQL("LOCK TABLE {}.t IN ACCESS SHARE MODE").format(sql.Identifier(locked))
                )  # a transaction open on it until the end of the block
                with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as reader:
                    reader.execute(sql.SQL("SELECT * FROM {}.t").format(sql.Identifier(used)))
                    reader.execute("SELECT pg_stat_force_next_flush()")
                    reader.execute("SELECT 1")  # the read's counts are flushed by now
                _sweep_later(admin, 25, lambda: old_db not in _databases(admin))
                left = _schemas(admin)
                assert old not in left and workflows not in left
                assert old_db not in _databases(admin)
                assert {locked, used, annotated, other} <= left
                assert busy_db in _databases(admin)
                assert _stamped_since(admin, used) > stamped  # used since: unused from then on
            assert _comment(admin, annotated) == "kept by hand" and _comment(admin, other) is None
            # the lock released and the session gone: a day later they go too
            _await_gone_a_day_later(admin, [locked, used, busy_db])
            assert {annotated, other} <= _schemas(admin)
        finally:
            _drop(admin, *schemas)
            for name in databases:
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


def _await_gone_a_day_later(admin: psycopg.Connection[Any], names: list[str]) -> None:
    """Sweep, each time a day or more later than the last, until none of ``names`` is left (a
    closed session's backend takes a moment to exit, and what it did to be counted)."""
    for day in range(2, 202):
        OWNERS.sweep_abandoned(admin, later=datetime.timedelta(hours=25 * day))
        if not set(names) & (_schemas(admin) | _databases(admin)):
            return
        admin.execute("SELECT pg_sleep(0.05)")
    raise AssertionError(f"{names} were kept though unused for a day")


def _dead_schema(admin: psycopg.Connection[Any]) -> str:
    """A new schema whose owner is gone (its keeper never connected): any sweep drops it."""
    name = f"tg_test_o{_tag()}_{uuid.uuid4().hex[:8]}"
    _create(admin, name)
    return name


def _await_waiting(admin: psycopg.Connection[Any], pid: int) -> None:
    """Until the session ``pid`` waits for a lock."""
    for _ in range(400):
        row = admin.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row is not None and row[0] == "Lock":
            return
        admin.execute("SELECT pg_sleep(0.025)")
    raise AssertionError(f"session {pid} never waited for a lock")


@pytest.mark.external
@pytest.mark.postgres
def test_a_sweep_leaves_a_name_another_session_changed_at_the_same_moment(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sweep's ``DROP SCHEMA`` that PostgreSQL fails with "tuple concurrently updated" (its
    catalog row changed by another session's transaction while the drop waited: another sweep, a
    grant) leaves the schema for a later sweep, says so at debug, and fails nobody; the next
    sweep drops it (ADR 0144)."""
    schema_name()  # this process's keeper is connected from here on
    with (
        psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin,
        psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as sweeper,
        psycopg.connect(PG_URL, connect_timeout=5) as other,
    ):
        name = _dead_schema(admin)
        try:
            # the other session's grant updates the schema's row and holds it until it commits
            other.execute(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(sql.Identifier(name))
            )
            dropped: list[str] = []
            raised: list[BaseException] = []

            def sweep_once() -> None:
                try:
                    dropped.extend(OWNERS.sweep_abandoned(sweeper))
                except BaseException as exc:  # the previous sweep: "tuple concurrently updated"
                    raised.append(exc)

            with caplog.at_level("DEBUG", logger="bench.pg_owners"):
                sweep = threading.Thread(target=sweep_once)
                sweep.start()
                try:
                    _await_waiting(admin, sweeper.info.backend_pid)
                finally:
                    other.commit()
                    sweep.join(30)
            assert not sweep.is_alive() and raised == []
            if name not in dropped:  # another process's sweep may have had the same race
                assert any(
                    name in r.getMessage() and "concurrently changed" in r.getMessage()
                    for r in caplog.records
                ) or name not in _schemas(admin), [r.getMessage() for r in caplog.records]
            _await_gone(admin, [name])
        finally:
            _drop(admin, name)


@pytest.mark.external
@pytest.mark.postgres
def test_a_sweep_raises_a_real_error() -> None:
    """A sweep that may not drop a dead owner's schema (it runs as a role that does not own it)
    raises: only another session's having the name is passed over."""
    schema_name()
    role = f"tg_sweep_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        names: list[str] = []
        try:
            for _ in range(20):  # another process's sweep may drop it first: make another
                names.append(_dead_schema(admin))
                admin.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
                try:
                    OWNERS.sweep_abandoned(admin)
                except psycopg.errors.InsufficientPrivilege:
                    break
                finally:
                    admin.execute("RESET ROLE")
            else:
                raise AssertionError("the sweep passed over a schema it may not drop")
        finally:
            _drop(admin, *names)
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.external
@pytest.mark.postgres
def test_a_sweep_stops_at_its_budget_and_leaves_the_rest_for_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every statement of a sweep is bounded by what is left of its budget: a dead owner's
    schema that another session's open transaction holds (a ``COMMENT`` on it, which the
    listing does not see as in use) is left once the budget is spent (the sweep returns, its
    session's timeouts as they were), a sweep with no budget does nothing, and a later sweep
    drops the schema once it is free (ADR 0144)."""
    schema_name()
    with (
        psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as admin,
        psycopg.connect(PG_URL, connect_timeout=5) as holder,
    ):
        name = _dead_schema(admin)
        try:
            holder.execute(sql.SQL("COMMENT ON SCHEMA {} IS 'held'").format(sql.Identifier(name)))
            assert OWNERS.sweep_abandoned(admin, budget=datetime.timedelta(0)) == []
            with caplog.at_level("DEBUG", logger="bench.pg_owners"):
                dropped = OWNERS.sweep_abandoned(admin, budget=datetime.timedelta(seconds=0.5))
            assert name not in dropped and name in _schemas(admin)
            said = [r.getMessage() for r in caplog.records if name in r.getMessage()]
            assert said and re.search(r"\((locked|out of time)\)", said[0]), said
            assert admin.execute("SHOW statement_timeout").fetchone() == ("0",)
            assert admin.execute("SHOW lock_timeout").fetchone() == ("0",)
            holder.rollback()
            _await_gone(admin, [name])
        finally:
            holder.rollback()
            _drop(admin, name)
