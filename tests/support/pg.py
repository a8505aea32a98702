"""Shared PostgreSQL fixtures for the store tests (import them into a test module to use them).

The server is ``THOUGHTGATE_TEST_PG_URL`` (default: the local test server over TCP), and over a
Unix socket ``THOUGHTGATE_TEST_PG_SOCKET_URL``. When it cannot be reached, every test that needs
it FAILS and says why; these tests never skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from thoughtgate.store.pg_errors import describe_target

__all__ = ["PG_SOCKET_URL", "PG_URL", "pg_admin", "pg_schema"]

PG_URL = os.environ.get("THOUGHTGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_SOCKET_URL = os.environ.get(
    "THOUGHTGATE_TEST_PG_SOCKET_URL", "postgresql://postgres@/test?host=/var/run/postgresql"
)
"""The same server over its Unix socket (``THOUGHTGATE_TEST_PG_SOCKET_URL``), for what must work
without TCP too."""


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
    """A fresh schema name for one test (not created: the store creates it); dropped afterwards."""
    name = f"tg_test_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        await pg_admin.execute(
            sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
        )
