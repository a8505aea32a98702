"""Shared PostgreSQL fixtures for the store tests (import them into a test module to use them).

The server is ``THOUGHTGATE_TEST_PG_URL`` (default: the local test server over TCP), and over a
Unix socket ``THOUGHTGATE_TEST_PG_SOCKET_URL``. When it cannot be reached, every test that needs
it FAILS and says why; these tests never skip.

Every schema and database a test makes is named by :func:`schema_name`, which records the test
process that owns it: ``tg_test_o<owner>_<random>`` (and DBOS's ``..._workflows`` beside it). The
owner is alive while its *keeper* is: a connection the process opens before it names its first
schema and holds until it exits, its ``application_name`` ``tg_test_owner:<owner>``. A process
killed mid-test (Ctrl-C twice, a timeout, an OOM kill) cannot drop its schemas, but its keeper
ends with it (the server sees the socket close), so the first :func:`schema_name` of every later
process sweeps them (:func:`sweep_abandoned_schemas`): it drops a schema or a database only when
no session of the server is its owner's keeper. A live xdist worker's, another concurrent run's
(on this machine or any other using the same server) and anything named otherwise are left alone.
The bench names its throwaway schemas the same way (``tg_bench_o<owner>_...``), and each sweep
drops the dead owners' of both (``bench/pg_owners.py``, ADR 0134), and those named before owners
were recorded (``tg_test_<12 hex>``) once they have gone unused for a day (ADR 0141). A sweep
passes over a name another session has at the same moment (another process's sweep) and stops
at a budget of a few seconds, leaving the rest to the next (ADR 0144): it never fails or stalls
the test that made the name.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from support.bench_modules import bench_module
from thoughtgate.store.pg_errors import describe_target

__all__ = [
    "KEEPER_PREFIX",
    "PG_SOCKET_URL",
    "PG_URL",
    "drop_schema",
    "owner_of",
    "pg_admin",
    "pg_schema",
    "schema_name",
    "sweep_abandoned_schemas",
]

PG_URL = os.environ.get("THOUGHTGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_SOCKET_URL = os.environ.get(
    "THOUGHTGATE_TEST_PG_SOCKET_URL", "postgresql://postgres@/test?host=/var/run/postgresql"
)
"""The same server over its Unix socket (``THOUGHTGATE_TEST_PG_SOCKET_URL``), for what must work
without TCP too."""

_owners = bench_module("pg_owners")
KEEPER_PREFIX: str = _owners.KEEPER_PREFIXES["test"]
"""The ``application_name`` of a test process's keeper, before the owner's tag."""
owner_of = _owners.owner_of
sweep_abandoned = _owners.sweep_abandoned
_owner = _owners.Owner(PG_URL, "test")


def schema_name(suffix: str = "") -> str:
    """A new schema (or database) name owned by this process (not created: whoever uses it
    creates it). ``suffix`` (``_workflows``, lower case and ``_`` only) is kept at the end."""
    name: str = _owner.name(suffix)
    return name


def sweep_abandoned_schemas(admin: psycopg.Connection[Any]) -> list[str]:
    """Drop every schema and database the tests or the bench made whose owner is gone
    (``bench/pg_owners.py``, ADR 0134) or, recording no owner, unused for a day (ADR 0141), and
    return their names."""
    gone: list[str] = sweep_abandoned(admin)
    return gone


@pytest.fixture
async def pg_admin() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An autocommit connection for setting up and inspecting what the store did."""
    try:
        conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        pytest.fail(
            f"{describe_target(PG_URL)} is unreachable: {exc}\n"
            "Start it (`make postgres-up`) or point THOUGHTGATE_TEST_PG_URL at a server; "
            "the PostgreSQL store tests do not skip.",
            pytrace=False,
        )
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def pg_schema(pg_admin: psycopg.AsyncConnection[Any]) -> AsyncIterator[str]:
    """A fresh schema name for one test (not created: the store creates it); dropped afterwards
    with DBOS's beside it."""
    name = schema_name()
    try:
        yield name
    finally:
        await drop_schema(pg_admin, name)


async def drop_schema(admin: psycopg.AsyncConnection[Any], name: str) -> None:
    """Drop the schema ``name`` and DBOS's beside it, if they exist."""
    for made in (name, f"{name}_workflows"):
        await admin.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(made))
        )
