"""Test-class mixins giving each test a fresh, empty store of one backend as its ``store``
fixture: a conformance suite, or any scenario written once for both SQL backends."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from support.pg import PG_URL
from thoughtgate.store.base import EventStore
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore

__all__ = ["Postgres", "SQLite", "fresh_sqlite"]


@contextlib.asynccontextmanager
async def fresh_sqlite() -> AsyncIterator[SQLiteStore]:
    """A fresh, empty SQLite store in a directory of its own, for one example of a property
    (Hypothesis runs many in one test, so a test's ``tmp_path`` would be shared)."""
    with tempfile.TemporaryDirectory() as where:
        store = await SQLiteStore.open(Path(where) / "tg.db")
        try:
            yield store
        finally:
            await store.close()


class SQLite:
    """Each case on a fresh, empty SQLite store."""

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[EventStore]:
        store = await SQLiteStore.open(tmp_path / "store.db")
        yield store
        await store.close()


class Postgres:
    """Each case on a fresh, empty PostgreSQL store, in a schema of its own (``pg_schema``: the
    test module imports that fixture)."""

    @pytest.fixture
    async def store(self, pg_schema: str) -> AsyncIterator[EventStore]:
        store = await PostgresStore.open(PG_URL, schema=pg_schema)
        yield store
        await store.close()
