"""Replicas that start together on one PostgreSQL database all come up (ADR 0062): one at a time
sets up their workflows schema, whatever else the database's other DBOS applications do."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.daemon import PG_START_S, ServeProcess
from support.pg import PG_SOCKET_URL, PG_URL, schema_name

from thoughtgate.errors import RuntimeFailure
from thoughtgate.orchestration.durable_setup import setting_up, setup_lock_key

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]

DBOS_MIGRATION_LOCK = 1234567890
"""DBOS's own migration lock (``dbos._sys_db_postgres``): one key for the whole database, which
a launch waits for 30 s at most before it migrates without it."""


@contextmanager
def fresh_schema(server: str = PG_URL) -> Iterator[tuple[str, str]]:
    """A store URL on ``server`` on a schema of its own, and the name of its workflows schema."""
    schema = schema_name()
    try:
        yield f"{server}{'&' if '?' in server else '?'}schema={schema}", f"{schema}_workflows"
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            for name in (schema, f"{schema}_workflows"):
                admin.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                )


@contextmanager
def fresh_database() -> Iterator[str]:
    """The URL of a database of its own on the test server, dropped afterwards: DBOS's migration
    lock is one for a whole database, and a test that holds it would stall the set-up of every
    other test's workflows on the shared one (seen: another worker's launch waited past its
    timeout, and the replicas here with it). Named as a schema is (``schema_name``): it records
    this process, so a later test process drops it if this one is killed first (ADR 0134)."""
    name = schema_name()
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base, _, _ = PG_URL.partition("?")
    try:
        yield f"{base.rsplit('/', 1)[0]}/{name}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _migrated(workflows: str, server: str = PG_URL) -> bool:
    with psycopg.connect(server, autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_tables WHERE schemaname = %s AND tablename = %s",
            (workflows, "dbos_migrations"),
        ).fetchone()
        if found is None:
            return False
        row = conn.execute(
            sql.SQL("SELECT version FROM {}.dbos_migrations").format(sql.Identifier(workflows))
        ).fetchone()
    return row is not None and row[0] > 0


def test_replicas_starting_together_all_come_up_while_another_application_migrates(
    tmp_path: Path,
) -> None:
    """The race seen in the replica tests, made to happen: while DBOS's database-wide migration
    lock is held (another schema's slow migration), every replica on a fresh schema waits 30 s
    and then, without our own lock, migrates at the same moment as the others and fails."""
    with (
        fresh_database() as server,
        fresh_schema(server) as (db, workflows),
        psycopg.connect(server, autocommit=True) as other,
    ):
        other.execute("SELECT pg_advisory_lock(%s)", (DBOS_MIGRATION_LOCK,))
        daemons = [
            ServeProcess("--db", db, "--no-bootstrap-key", "--shutdown-grace", "0.2")
            for _ in range(3)
        ]
        try:
            ServeProcess.start_all(*daemons, timeout=PG_START_S)
            assert all(d.proc is not None and d.proc.poll() is None for d in daemons)
            assert _migrated(workflows, server)
            # the one that set it up waited 30 s for DBOS's lock, and said so meanwhile
            said = "".join(line for d in daemons for line in d.stderr_lines)
            assert "still setting up the workflows of" in said and workflows in said
        finally:
            for daemon in daemons:
                daemon.stop()


@pytest.mark.parametrize("server", [PG_URL, PG_SOCKET_URL], ids=["tcp", "unix-socket"])
def test_a_replica_sets_up_nothing_while_another_sets_up_its_workflows_schema(
    tmp_path: Path, server: str
) -> None:
    """The mechanism: a replica that finds the schema's setup lock held waits for it before
    DBOS creates anything, then starts (and finds the schema set up); over TCP or a Unix
    socket alike."""
    with (
        fresh_schema(server) as (db, workflows),
        psycopg.connect(PG_URL, autocommit=True) as holder,
    ):
        holder.execute("SELECT pg_advisory_lock(hashtext(%s))", (setup_lock_key(workflows),))
        daemon = ServeProcess("--db", db, "--no-bootstrap-key", "--shutdown-grace", "0.2")
        try:
            daemon.spawn()
            deadline = time.monotonic() + 60
            while not _setup_clients(holder, workflows) and time.monotonic() < deadline:
                assert daemon.proc is not None and daemon.proc.poll() is None
                time.sleep(0.1)
            clients = _setup_clients(holder, workflows)
            assert len(clients) == 1, "the replica never asked for the lock"
            over_a_socket = clients[0] is None
            assert over_a_socket == (server == PG_SOCKET_URL), "it connected as its URL says"
            time.sleep(1.0)  # it asks again and again meanwhile
            assert daemon.proc is not None and daemon.proc.poll() is None
            assert not _schema_exists(workflows), "DBOS set up the schema while another held it"
            holder.execute("SELECT pg_advisory_unlock(hashtext(%s))", (setup_lock_key(workflows),))
            daemon.ready(timeout=PG_START_S)
            assert _migrated(workflows)
        finally:
            daemon.stop()


def test_a_replica_waiting_for_the_setup_says_so_and_a_start_gives_up_at_its_deadline(
    tmp_path: Path,
) -> None:
    """A daemon waiting for another process's set-up prints what it waits for, and a test's wait
    for it to listen ends at its deadline with everything it printed, though it prints nothing
    more meanwhile (a wait that blocks until the process speaks would end only at the test's
    timeout, showing nothing)."""
    with fresh_schema() as (db, workflows), psycopg.connect(PG_URL, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtext(%s))", (setup_lock_key(workflows),))
        daemon = ServeProcess("--db", db, "--no-bootstrap-key", "--shutdown-grace", "0.2")
        try:
            daemon.spawn()
            waiting = "waiting for another process setting up the workflows of"
            deadline = time.monotonic() + PG_START_S
            while not any(waiting in line and workflows in line for line in daemon.stderr_lines):
                assert time.monotonic() < deadline, "".join(daemon.stderr_lines)
                time.sleep(0.1)
            with pytest.raises(RuntimeError, match=r"not listening after 1\.0 s") as err:
                daemon.ready(timeout=1.0)
            assert waiting in str(err.value)  # all it printed
            assert "py-spy" in str(err.value)  # its stacks, or why there are none
        finally:
            daemon.stop()


def _setup_clients(conn: psycopg.Connection[Any], workflows: str) -> list[str | None]:
    """The client addresses (``None``: a Unix socket) of the set-up connections open for schema
    ``workflows``: their statement names the schema, so another test's daemon setting up another
    schema on the shared database does not count, whether the daemons reach it over TCP or a
    Unix socket (which leaves no client address or port to tell processes apart by)."""
    rows = conn.execute(
        "SELECT host(client_addr) FROM pg_stat_activity WHERE application_name = %s"
        " AND strpos(query, %s) > 0",
        ("thoughtgate:workflows-setup", setup_lock_key(workflows)),
    ).fetchall()
    return [row[0] for row in rows]


def _schema_exists(name: str) -> bool:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", (name,)
        ).fetchone()
    return found is not None


def test_a_setup_held_past_the_bound_fails_the_start_saying_what_it_waited_for() -> None:
    workflows = schema_name("_workflows")
    with psycopg.connect(PG_URL, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtext(%s))", (setup_lock_key(workflows),))

        async def start() -> None:
            async with setting_up(PG_URL, workflows, wait_s=0.3):
                raise AssertionError("the lock was taken while another process held it")

        with pytest.raises(RuntimeFailure, match=r"another process has been setting up") as err:
            asyncio.run(start())
        assert workflows in str(err.value) and "pg_stat_activity" in str(err.value)

        async def after_release() -> bool:
            async with setting_up(PG_URL, workflows, wait_s=5):
                return True

        holder.execute("SELECT pg_advisory_unlock(hashtext(%s))", (setup_lock_key(workflows),))
        assert asyncio.run(after_release())
