"""The sweep's expired-lease read beside 10,000 open runs, and what an index for it costs a lease
renewal (ADR 0082).

Not a test, and not part of ``make bench``. Every store is filled alike: 10,000 open runs -- 200
held by this process with live leases (renewed each round), 9,790 queued or suspended (no owner,
no lease, as a backlog of runs waiting for a resume or an approval), 10 held by a gone process
whose lease expired -- beside 40,000 ended ones.

* ``PYTHONPATH=src python -m bench.expired_bench api [postgres] [sqlite]``: one store of the
  version on the path, 40 rounds of ``open_runs(expired=True)`` and one ``renew_leases`` of the
  200 held runs through the store; median ms of each, and this process's CPU a round. Run it
  alternately against ``main`` (``PYTHONPATH=<base>/src:.``) and this branch.
* ``EXPIRED_BENCH_VARIANT=lease|leased python -m bench.expired_bench [postgres] [sqlite]``: two
  stores of this version alternating each round in one process, A and B (:func:`_index`): the
  expired statement (its lease comparison written so that an index on the lease can serve it)
  and a renewal; per-round ratio B / A, median and quartiles, and each side's median in ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.environment import PG_URL, throwaway_schema
from thoughtgate.store import codec
from thoughtgate.store.base import EventStore

ROUNDS = 40
OPEN, HELD, EXPIRED, ENDED = 10_000, 200, 10, 40_000
OWNER = "bench.1.here"
LEASE_INDEX = (
    f"CREATE INDEX open_runs_by_lease ON runs (lease_expires_at) WHERE {codec.OPEN_RUN_PREDICATE}"
)
VARIANT = os.environ.get("EXPIRED_BENCH_VARIANT", "lease")
"""``lease``: store B has ``open_runs_by_lease`` too; ``leased``: store A lacks
``leased_runs_by_id`` (the open runs that have an owner, in id order: a renewal changes none of
its columns; migration 10)."""


def _rows(now: float) -> list[tuple[Any, ...]]:
    """(run_id, status, owner, lease, closed_at, change_seq) of every run, ids in a shuffled
    order."""
    out: list[tuple[Any, ...]] = []
    for g in range(OPEN + ENDED):
        run_id = f"run_{uuid.UUID(int=g * 7919 % (1 << 64)).hex}"
        if g >= OPEN:
            out.append((run_id, "completed", None, None, now - 100, g + 1))
        elif g < HELD:
            out.append((run_id, "running", OWNER, now + 3600, None, g + 1))
        elif g < HELD + EXPIRED:
            out.append((run_id, "running", "gone.2.x", now - 60, None, g + 1))
        else:
            out.append((run_id, "pending", None, None, None, g + 1))
    return out


_INSERT = (
    "INSERT INTO runs (run_id, prompt, chain_of_thought, worker_backend, status, created_at, "
    "updated_at, usage, metadata, last_seq, owner, lease_expires_at, closed_at, change_seq) "
    "VALUES (%s, 'p', 'hidden', 'provider', %s, 1.0, 1.0, '{}', '{}', 0, %s, %s, %s, %s)"
)


async def _insert_pg(admin: psycopg.AsyncConnection[Any], now: float) -> None:
    """Every run of :func:`_rows` into ``runs`` of the connection's search path."""
    async with admin.cursor() as cur:
        await cur.executemany(_INSERT, _rows(now))


def _expired_query(param: str) -> str:
    owned = " AND owner IS NOT NULL" if VARIANT == "leased" else ""
    return (
        "SELECT run_id, owner, lease_expires_at FROM runs "
        f"WHERE {codec.OPEN_RUN_PREDICATE}{owned} AND lease_expires_at < {param} "
        "ORDER BY run_id LIMIT 1000"
    )


def _index(with_index: bool) -> str | None:
    """The statement that makes a store of this version side A or B of :data:`VARIANT`: B gets
    ``open_runs_by_lease``; for ``leased``, A loses ``leased_runs_by_id`` (migration 10)."""
    if VARIANT == "leased":
        return None if with_index else "DROP INDEX leased_runs_by_id"
    return LEASE_INDEX if with_index else None


@contextlib.asynccontextmanager
async def _postgres() -> AsyncIterator[tuple[Callable[[bool], Awaitable[int]], list[EventStore]]]:
    from thoughtgate.store.postgres import PostgresStore

    schemas = [throwaway_schema(f"expired_{side}") for side in "ab"]
    stores: list[EventStore] = [await PostgresStore.open(PG_URL, schema=s) for s in schemas]
    admin = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
    try:
        now = time.time()
        for schema, with_index in zip(schemas, (False, True), strict=True):
            await admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            await _insert_pg(admin, now)
            if (change := _index(with_index)) is not None:
                await admin.execute(change)
            await admin.execute("VACUUM ANALYZE runs")
        await admin.execute("RESET search_path")
        query = _expired_query("extract(epoch FROM statement_timestamp())")

        async def expired(with_index: bool) -> int:
            schema = schemas[with_index]
            await admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            rows = await (await admin.execute(query)).fetchall()
            return len(rows)

        yield expired, stores
    finally:
        for store in stores:
            await store.close()
        for schema in schemas:
            await admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
        await admin.close()


@contextlib.asynccontextmanager
async def _sqlite() -> AsyncIterator[tuple[Callable[[bool], Awaitable[int]], list[EventStore]]]:
    import sqlite3

    from thoughtgate.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory() as tmp:
        paths = [Path(tmp) / f"{side}.db" for side in "ab"]
        stores: list[EventStore] = [await SQLiteStore.open(p) for p in paths]
        now = time.time()
        readers = []
        for path, with_index in zip(paths, (False, True), strict=True):
            conn = sqlite3.connect(path, isolation_level=None)
            conn.execute("BEGIN")
            conn.executemany(_INSERT.replace("%s", "?"), _rows(now))
            if (change := _index(with_index)) is not None:
                conn.execute(change)
            conn.execute("COMMIT")
            readers.append(conn)
        try:
            query_a = _expired_query("?").replace(
                "FROM runs", "FROM runs INDEXED BY open_runs_by_id"
            )
            query_b = _expired_query("?").replace(
                "FROM runs",
                "FROM runs INDEXED BY "
                + ("leased_runs_by_id" if VARIANT == "leased" else "open_runs_by_lease"),
            )

            async def expired(with_index: bool) -> int:
                conn = readers[with_index]
                query = query_b if with_index else query_a
                return len(conn.execute(query, (time.time(),)).fetchall())

            yield expired, stores
        finally:
            for conn in readers:
                conn.close()
            for store in stores:
                await store.close()


async def _rounds(
    expired: Callable[[bool], Awaitable[int]], stores: list[EventStore]
) -> dict[str, list[float]]:
    held = [r.run_id for r in (await stores[0].open_runs(limit=OPEN)).runs if r.owner == OWNER]
    assert len(held) == HELD, len(held)
    out: dict[str, list[float]] = {"read_a": [], "read_b": [], "renew_a": [], "renew_b": []}
    for round_ in range(ROUNDS):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        for with_index in order:
            side = "b" if with_index else "a"
            started = time.perf_counter()
            found = await expired(with_index)
            out[f"read_{side}"].append(time.perf_counter() - started)
            assert found == EXPIRED, found
            started = time.perf_counter()
            renewed = await stores[with_index].renew_leases(OWNER, 3600, held)
            out[f"renew_{side}"].append(time.perf_counter() - started)
            assert len(renewed) == HELD
    return out


def _report(backend: str, out: dict[str, list[float]]) -> None:
    for what in ("read", "renew"):
        a, b = out[f"{what}_a"], out[f"{what}_b"]
        ratios = sorted(y / x for x, y in zip(a, b, strict=True))
        q = statistics.quantiles(ratios, n=4)
        print(
            f"{backend} {what}: B/A median {statistics.median(ratios):.2f} "
            f"({q[0]:.2f}-{q[2]:.2f}); A {statistics.median(a) * 1000:.2f} ms, "
            f"B {statistics.median(b) * 1000:.2f} ms"
        )


async def main() -> None:
    if sys.argv[1:2] == ["api"]:
        for backend in sys.argv[2:] or ["postgres", "sqlite"]:
            await api(backend)
        return
    backends = sys.argv[1:] or ["postgres", "sqlite"]
    for backend in backends:
        opener = _postgres if backend == "postgres" else _sqlite
        async with opener() as (expired, stores):
            # Store A's and B's renewals go to their own schema/file: the stores do that.
            _report(backend, await _rounds(expired, stores))


# ---------------------------------------------------------------------- base against branch
async def _filled(backend: str, tmp: Path) -> EventStore:
    """One store of the version on the path, filled as above (no extra index)."""
    now = time.time()
    if backend == "sqlite":
        import sqlite3

        from thoughtgate.store.sqlite import SQLiteStore

        path = tmp / "runs.db"
        store: EventStore = await SQLiteStore.open(path)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("BEGIN")
        conn.executemany(_INSERT.replace("%s", "?"), _rows(now))
        conn.execute("COMMIT")
        conn.close()
        return store
    from thoughtgate.store.postgres import PostgresStore

    schema = throwaway_schema("expired")
    store = await PostgresStore.open(PG_URL, schema=schema)
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as admin:
        await admin.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        await _insert_pg(admin, now)
        await admin.execute("VACUUM ANALYZE runs")
    store.bench_schema = schema  # type: ignore[attr-defined]
    return store


async def api(backend: str) -> None:
    """The sweep's expired read and a renewal of 200 leases through the store, as the version
    on ``PYTHONPATH`` has them: median ms of :data:`ROUNDS` each, and this process's CPU."""
    with tempfile.TemporaryDirectory() as tmp:
        store = await _filled(backend, Path(tmp))
        try:
            held = [r.run_id for r in (await store.open_runs(limit=OPEN)).runs if r.owner == OWNER]
            reads: list[float] = []
            renews: list[float] = []
            cpu = time.process_time()
            for _ in range(ROUNDS):
                started = time.perf_counter()
                found = await store.open_runs(limit=1000, expired=True)
                reads.append(time.perf_counter() - started)
                assert len(found.runs) == EXPIRED, len(found.runs)
                started = time.perf_counter()
                await store.renew_leases(OWNER, 3600, held)
                renews.append(time.perf_counter() - started)
            cpu = time.process_time() - cpu
            print(
                f"{backend} expired read {statistics.median(reads) * 1000:.2f} ms, "
                f"renew {statistics.median(renews) * 1000:.2f} ms, "
                f"process cpu {cpu * 1000 / ROUNDS:.2f} ms a round"
            )
        finally:
            await store.close()
            schema = getattr(store, "bench_schema", None)
            if schema is not None:
                async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as a:
                    await a.execute(
                        sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema))
                    )


if __name__ == "__main__":
    asyncio.run(main())
