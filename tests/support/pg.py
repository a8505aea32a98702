"""Shared PostgreSQL fixtures for the store tests (import them into a test module to use them).

The server is ``THOUGHTGATE_TEST_PG_URL`` (default: the local test server over TCP), and over a
Unix socket ``THOUGHTGATE_TEST_PG_SOCKET_URL``. When it cannot be reached, every test that needs
it FAILS and says why; these tests never skip.

Every schema a test makes is named by :func:`schema_name`, which records the test process that
owns it: ``tg_test_o<owner>_<random>`` (and DBOS's ``..._workflows`` beside it). The owner is
alive while its *keeper* is: a connection the process opens before it names its first schema
and holds until it exits, its ``application_name`` ``tg_test_owner:<owner>``. A process killed
mid-test (Ctrl-C twice, a timeout, an OOM kill) cannot drop its schemas, but its keeper ends with
it (the server sees the socket close), so the first :func:`schema_name` of every later process
sweeps them (:func:`sweep_abandoned_schemas`): it drops a schema only when no session of the
server is its owner's keeper. A live xdist worker's schemas, another concurrent run's (on this
machine or any other using the same server) and any schema named otherwise are left alone.
"""

from __future__ import annotations

import atexit
import os
import re
import secrets
import threading
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from thoughtgate.store.pg_errors import describe_target

__all__ = [
    "KEEPER_PREFIX",
    "PG_SOCKET_URL",
    "PG_URL",
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

KEEPER_PREFIX = "tg_test_owner:"
"""The ``application_name`` of an owner's keeper, before the owner's tag."""
_OWNED: re.Pattern[str] = re.compile(r"tg_test_o([0-9a-z]+)_[0-9a-f]{8}(?:_[a-z_]+)?")
"""A schema :func:`schema_name` made (and DBOS's beside it): the owner's tag is group 1."""

_lock = threading.Lock()
_keeper: psycopg.Connection[Any] | None = None
_tag = ""


def owner_of(schema: str) -> str | None:
    """The tag of the process that owns ``schema``; ``None`` when its name records none (a
    schema named before owners were recorded, or not by the tests)."""
    found = _OWNED.fullmatch(schema)
    return found.group(1) if found else None


def _owner() -> str:
    """This process's tag, its keeper opened (and the abandoned schemas swept) the first time."""
    global _keeper, _tag
    with _lock:
        if _keeper is None or _keeper.closed:
            tag = f"{os.getpid()}r{secrets.token_hex(3)}"
            keeper = psycopg.connect(
                PG_URL, autocommit=True, connect_timeout=5, application_name=KEEPER_PREFIX + tag
            )
            _keeper, _tag = keeper, tag
            atexit.register(keeper.close)  # it would end with the process anyway
            sweep_abandoned_schemas(keeper)
        return _tag


def schema_name(suffix: str = "") -> str:
    """A new schema name owned by this process (not created: whoever uses it creates it).
    ``suffix`` (``_workflows``, lower case and ``_`` only) is kept at the end."""
    return f"tg_test_o{_owner()}_{uuid.uuid4().hex[:8]}{suffix}"


def sweep_abandoned_schemas(admin: psycopg.Connection[Any]) -> list[str]:
    """Drop every schema :func:`schema_name` made whose owner's keeper is gone, and return their
    names. The schemas are listed before the live keepers: a schema is made after its owner's
    keeper connected, so an owner alive when the schemas were listed is among the keepers."""
    schemas = [
        name
        for (name,) in admin.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'tg\\_test\\_o%'"
        ).fetchall()
        if owner_of(name) is not None
    ]
    live = {
        name.removeprefix(KEEPER_PREFIX)
        for (name,) in admin.execute(
            "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE %s",
            (KEEPER_PREFIX + "%",),
        ).fetchall()
    }
    gone = []
    admin.execute("SET lock_timeout = '2s'")
    for name in schemas:
        if owner_of(name) in live:
            continue
        try:  # a schema still in use (by an orphaned daemon of its owner) is left for later
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        except psycopg.errors.LockNotAvailable:
            continue
        gone.append(name)
    admin.execute("RESET lock_timeout")
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
        for made in (name, f"{name}_workflows"):
            await pg_admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(made))
            )
