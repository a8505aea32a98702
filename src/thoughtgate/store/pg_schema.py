"""Preparing a PostgreSQL schema: recognise our own tables, apply numbered migrations once.

Several replicas may start at the same moment against one database. Each takes a transaction-scoped
advisory lock keyed by the schema name before looking at the migrations table, so exactly one of
them applies a missing version while the others wait and then find nothing to do. DDL is
transactional in PostgreSQL: a migration and the row recording it commit together or not at all.
A database that is already up to date is recognised without taking the lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from thoughtgate.errors import NotOurDatabaseError, StoreError
from thoughtgate.store.migrations import MIGRATIONS_TABLE, Migration, pending_migrations

__all__ = ["applied_versions", "migrate", "resolve_schema"]


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


async def _tables(conn: psycopg.AsyncConnection[Any], schema: str) -> set[str]:
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


async def migrate(
    conn: psycopg.AsyncConnection[Any], schema: str, known: Sequence[Migration], where: str
) -> list[Migration]:
    """Create the schema if needed and apply missing migrations; returns what was applied."""
    tables = await _tables(conn, schema)
    _check_ours(tables, where)
    if MIGRATIONS_TABLE in tables and not pending_migrations(
        await applied_versions(conn, schema), known, where=where
    ):
        return []
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"thoughtgate migrate {schema}",)
        )
        found = await conn.execute(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s", (schema,)
        )
        if await found.fetchone() is None:
            await conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        tables = await _tables(conn, schema)
        _check_ours(tables, where)
        await conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(schema)))
        if MIGRATIONS_TABLE not in tables:
            await conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (version integer PRIMARY KEY, name text NOT NULL, "
                    "applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(sql.Identifier(MIGRATIONS_TABLE))
            )
        todo = pending_migrations(await applied_versions(conn, schema), known, where=where)
        for migration in todo:
            await conn.execute(sql.SQL(migration.sql))
            await conn.execute(
                sql.SQL("INSERT INTO {} (version, name) VALUES (%s, %s)").format(
                    sql.Identifier(MIGRATIONS_TABLE)
                ),
                (migration.version, migration.name),
            )
    return todo
