"""Preparing a PostgreSQL schema: recognise our own tables, apply numbered migrations once.

Several replicas may start at the same moment against one database. Each takes a session
advisory lock keyed by the schema name before looking at the migrations table, so exactly one of
them applies a missing version while the others wait and then find nothing to do. A waiter asks
again every few tenths of a second rather than waiting inside a statement
(``pg_pool.poll_advisory_lock``): a statement waiting for a lock keeps its snapshot, which the
holder's ``CREATE INDEX CONCURRENTLY`` would wait for (ADR 0082).

DDL is transactional in PostgreSQL: a migration and the row recording it commit together or not
at all, one transaction a version. A migration marked ``concurrently`` (``Migration.concurrent``)
runs outside a transaction, a statement at a time, then its row: each statement completes what a
try that crashed began (``IF NOT EXISTS``, ``IF EXISTS``), and an index such a try left INVALID
-- a ``CREATE INDEX CONCURRENTLY`` that failed, was cancelled or lost its session -- is dropped
and built again rather than kept (``IF NOT EXISTS`` alone would keep it, unused and maintained).
A database that is already up to date is recognised without taking the lock.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from thoughtgate.errors import NotOurDatabaseError, StoreError
from thoughtgate.store.migrations import MIGRATIONS_TABLE, Migration, pending_migrations
from thoughtgate.store.pg_pool import poll_advisory_lock

__all__ = [
    "applied_versions",
    "migrate",
    "migration_lock_key",
    "resolve_schema",
    "schema_tables",
]

log = logging.getLogger("thoughtgate.store")

_BUILDS_INDEX = re.compile(
    r"CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I
)


async def resolve_schema(conn: psycopg.AsyncConnection[Any], schema: str | None, where: str) -> str:
    """The explicit schema, else the connection's current one (first existing on search_path)."""
    if schema:
        return schema
    row = await (await conn.execute("SELECT current_schema()")).fetchone()
    if row is None or row[0] is None:
        raise StoreError(
            f"{where}: no schema on the search_path exists; pass a schema "
            "(postgresql://...?schema=NAME) or create one"
        )
    return str(row[0])


async def schema_tables(conn: psycopg.AsyncConnection[Any], schema: str) -> set[str]:
    """The tables in ``schema`` (none when it does not exist)."""
    cur = await conn.execute(
        "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s", (schema,)
    )
    return {str(r[0]) for r in await cur.fetchall()}


def _check_ours(tables: set[str], where: str) -> None:
    if tables and MIGRATIONS_TABLE not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise NotOurDatabaseError(
            f"{where} holds tables thoughtgate did not create ({shown}) and no {MIGRATIONS_TABLE} "
            "table; it was left untouched. Give thoughtgate its own schema "
            "(postgresql://...?schema=thoughtgate) or database."
        )


async def applied_versions(conn: psycopg.AsyncConnection[Any], schema: str) -> set[int]:
    query = sql.SQL("SELECT version FROM {}.{}").format(
        sql.Identifier(schema), sql.Identifier(MIGRATIONS_TABLE)
    )
    return {int(r[0]) for r in await (await conn.execute(query)).fetchall()}


def migration_lock_key(schema: str) -> str:
    """The text whose ``hashtext`` keys a schema's migration lock."""
    return f"thoughtgate migrate {schema}"


async def migrate(
    conn: psycopg.AsyncConnection[Any], schema: str, known: Sequence[Migration], where: str
) -> list[Migration]:
    """Create the schema if needed and apply missing migrations; returns what was applied.
    ``conn`` is in autocommit mode (``pg_pool.connect``)."""
    tables = await schema_tables(conn, schema)
    _check_ours(tables, where)
    if MIGRATIONS_TABLE in tables and not pending_migrations(
        await applied_versions(conn, schema), known, where=where
    ):
        return []
    key = migration_lock_key(schema)

    def waiting() -> None:
        log.info("waiting for another process migrating %s", where)

    await poll_advisory_lock(conn, key, waiting=waiting)
    try:
        return await _migrate_locked(conn, schema, known, where)
    finally:
        with contextlib.suppress(psycopg.Error):  # a lost session has let it go already
            await conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (key,))


async def _migrate_locked(
    conn: psycopg.AsyncConnection[Any], schema: str, known: Sequence[Migration], where: str
) -> list[Migration]:
    async with conn.transaction():
        found = await conn.execute(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", (schema,)
        )
        if await found.fetchone() is None:
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        tables = await schema_tables(conn, schema)
        _check_ours(tables, where)
        if MIGRATIONS_TABLE not in tables:
            await conn.execute(
                sql.SQL(
                    "CREATE TABLE {}.{} (version integer PRIMARY KEY, name text NOT NULL, "
                    "applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(sql.Identifier(schema), sql.Identifier(MIGRATIONS_TABLE))
            )
    todo = pending_migrations(await applied_versions(conn, schema), known, where=where)
    for migration in todo:
        if migration.concurrent:
            await _apply_concurrently(conn, schema, migration)
            continue
        async with conn.transaction():
            await conn.execute(
                sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema))
            )
            await conn.execute(sql.SQL(migration.sql))
            await _record(conn, schema, migration)
    return todo


async def _record(conn: psycopg.AsyncConnection[Any], schema: str, migration: Migration) -> None:
    await conn.execute(
        sql.SQL("INSERT INTO {}.{} (version, name) VALUES (%s, %s)").format(
            sql.Identifier(schema), sql.Identifier(MIGRATIONS_TABLE)
        ),
        (migration.version, migration.name),
    )


async def _apply_concurrently(
    conn: psycopg.AsyncConnection[Any], schema: str, migration: Migration
) -> None:
    """A ``concurrently`` migration: its statements one at a time, each in a transaction of its
    own (``CREATE INDEX CONCURRENTLY`` in none), then the row recording it."""
    await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    try:
        for statement in migration.statements():
            builds = _BUILDS_INDEX.match(statement)
            if builds is not None:
                await _drop_if_invalid(conn, schema, builds.group(1))
            await conn.execute(sql.SQL(statement))
        await _record(conn, schema, migration)
    finally:
        with contextlib.suppress(psycopg.Error):
            await conn.execute("RESET search_path")


async def _drop_if_invalid(conn: psycopg.AsyncConnection[Any], schema: str, index: str) -> None:
    """Drop ``index`` if a build of it that did not finish left it INVALID: no reader uses it,
    every write still maintains it, and ``CREATE INDEX CONCURRENTLY IF NOT EXISTS`` would keep
    it. The migration lock is held, so no other build of it is under way."""
    cur = await conn.execute(
        "SELECT i.indisvalid FROM pg_catalog.pg_index i "
        "JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid "
        "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, index),
    )
    row = await cur.fetchone()
    if row is None or row[0]:
        return
    log.warning(
        "index %s.%s was left INVALID by a build that did not finish; building it again",
        schema,
        index,
    )
    await conn.execute(
        sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}.{}").format(
            sql.Identifier(schema), sql.Identifier(index)
        )
    )
