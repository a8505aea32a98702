"""The quota check reads a key's usage in a few rows; its verdicts are those of the first rule.

The first rule read every start of the key within the window into Python (oldest first) and
refused at ``max_per_minute`` of them, with ``Retry-After`` from the ``max_per_minute``-th newest.
The stores now fetch only that start, and count the window only to refuse. Over random histories
(ties, starts on the window's edge, starts from a clock ahead, other keys, ended runs, runs
without a spec) both give the same verdict, ``Retry-After``, message and rank, on every backend.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from support.pg import PG_URL, pg_admin, pg_schema

from thoughtgate.store import postgres, sqlite
from thoughtgate.store.durable import (
    BUSY_RETRY_S,
    WINDOW_S,
    Admission,
    KeyUsage,
    Quota,
    RunSpecRecord,
    quota_verdict,
)
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore

__all__ = ["pg_admin", "pg_schema"]  # fixtures used by this module

NOW = 1_800_000_000.0
HISTORIES = 150


def first_rule(quota: Quota, open_runs: int, recent_starts: list[float], now: float) -> Admission:
    """``quota_verdict`` as it was, on every start within the window (oldest first)."""
    if open_runs >= quota.max_open:
        return Admission(
            False,
            BUSY_RETRY_S,
            f"this key already has {open_runs} runs that have not ended (at most "
            f"{quota.max_open}); start more when some end",
        )
    if len(recent_starts) >= quota.max_per_minute:
        oldest = recent_starts[len(recent_starts) - quota.max_per_minute]
        wait = max(1.0, oldest + WINDOW_S - now)
        return Admission(
            False,
            wait,
            f"this key started {len(recent_starts)} runs in the last minute (at most "
            f"{quota.max_per_minute})",
        )
    return Admission(True, rank=open_runs + 1)


@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    key_id: str | None
    """``None``: a local run; the spec row is missing when ``has_spec`` is false."""
    created_at: float
    status: str
    closed: bool
    has_spec: bool


def history(rng: random.Random) -> list[Run]:
    """Starts bunched around the window's edge and its end, with repeated times."""
    times = [
        NOW - WINDOW_S,  # on the edge: outside (the window is open on its left)
        NOW - WINDOW_S + 0.001,
        NOW,
        NOW + 2.5,  # a replica whose clock is ahead
        *(NOW - rng.uniform(0, 2 * WINDOW_S) for _ in range(4)),
    ]
    runs = []
    for i in range(rng.randint(0, 30)):
        status = rng.choice(("pending", "running", "running", "completed", "failed"))
        runs.append(
            Run(
                f"run_{i}",
                rng.choice(("k1", "k1", "k1", "k2", None)),
                rng.choice(times) if rng.random() < 0.5 else NOW - rng.uniform(0, 2 * WINDOW_S),
                status,
                closed=status not in ("pending", "running") or rng.random() < 0.1,
                has_spec=rng.random() < 0.95,
            )
        )
    return runs


def quota(rng: random.Random) -> Quota:
    return Quota("k1", max_open=rng.randint(1, 12), max_per_minute=rng.randint(1, 12))


def _rows(runs: list[Run]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rows of ``_INSERT_RUN`` and ``_INSERT_SPEC``."""
    run_rows = [
        (
            r.run_id,
            r.status,
            r.created_at,
            r.created_at,
            r.created_at + 1 if r.closed else None,
            i + 1,  # change_seq is unique
        )
        for i, r in enumerate(runs)
    ]
    spec_rows = [(r.run_id, r.key_id, r.created_at) for r in runs if r.has_spec]
    return run_rows, spec_rows


# -- the first rule's queries, as they were ----------------------------------------------------
_OPEN_JOIN = (
    "SELECT count(*) FROM run_specs s JOIN runs r USING (run_id) WHERE s.key_id = {p} AND "
    "r.status IN ('pending', 'running') AND r.closed_at IS NULL"
)
_ALL_RECENT = (
    "SELECT created_at FROM run_specs WHERE key_id = {p} AND created_at > {p} ORDER BY created_at"
)
_INSERT_RUN = (
    "INSERT INTO runs (run_id, prompt, chain_of_thought, worker_backend, status, created_at, "
    "updated_at, usage, metadata, closed_at, change_seq) "
    "VALUES ({p}, 'p', 'surface', 'provider', {p}, {p}, {p}, '{{}}', '{{}}', {p}, {p})"
)
_INSERT_SPEC = (
    "INSERT INTO run_specs (run_id, spec, key_id, durable, resume, created_at) "
    "VALUES ({p}, '{{}}', {p}, {false}, 'manual', {p})"
)


async def _compare(
    load: Callable[[list[Run]], Awaitable[None]],
    first: Callable[[Quota], Awaitable[tuple[int, list[float]]]],
    new_rule: Callable[[Quota], Awaitable[KeyUsage]],
    seed: int,
) -> None:
    rng = random.Random(seed)
    seen = {"open": 0, "starts": 0, "admitted": 0}
    for _ in range(HISTORIES):
        runs = history(rng)
        await load(runs)
        for _ in range(3):
            q = quota(rng)
            expected = first_rule(q, *await first(q), NOW)
            got = quota_verdict(q, await new_rule(q), NOW)
            assert got == expected, (q, runs)
            kind = "admitted" if got.admitted else "open" if "ended" in got.reason else "starts"
            seen[kind] += 1
    assert min(seen.values()) > 30, f"the histories reach every verdict: {seen}"


@pytest.mark.inprocess
async def test_sqlite_reads_the_same_verdicts_as_the_first_rule(tmp_path: Path) -> None:
    path = tmp_path / "quota.db"
    await (await SQLiteStore.open(path)).close()  # migrated
    conn = sqlite3.connect(path)
    try:

        async def load(runs: list[Run]) -> None:
            run_rows, spec_rows = _rows(runs)
            with conn:
                conn.execute("DELETE FROM run_specs")
                conn.execute("DELETE FROM runs")
                conn.executemany(_INSERT_RUN.format(p="?"), run_rows)
                conn.executemany(_INSERT_SPEC.format(p="?", false=0), spec_rows)

        async def first(q: Quota) -> tuple[int, list[float]]:
            (open_runs,) = conn.execute(_OPEN_JOIN.format(p="?"), (q.key_id,)).fetchone()
            rows = conn.execute(_ALL_RECENT.format(p="?"), (q.key_id, NOW - WINDOW_S))
            return int(open_runs), [float(r[0]) for r in rows]

        async def new_rule(q: Quota) -> KeyUsage:
            return sqlite._key_usage(conn, q, NOW)

        await _compare(load, first, new_rule, seed=20261202)
    finally:
        conn.close()


@pytest.fixture
async def pg_conn(pg_schema: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    await (await PostgresStore.open(PG_URL, schema=pg_schema)).close()  # migrated
    conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
    try:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(pg_schema)))
        yield conn
    finally:
        await conn.close()


@pytest.mark.postgres
async def test_postgres_reads_the_same_verdicts_as_the_first_rule(
    pg_conn: psycopg.AsyncConnection[Any],
) -> None:
    conn = pg_conn

    async def load(runs: list[Run]) -> None:
        run_rows, spec_rows = _rows(runs)
        async with conn.transaction(), conn.cursor() as cur:
            await cur.execute("DELETE FROM run_specs")
            await cur.execute("DELETE FROM runs")
            if run_rows:
                await cur.executemany(_INSERT_RUN.format(p="%s"), run_rows)
            if spec_rows:
                await cur.executemany(_INSERT_SPEC.format(p="%s", false="false"), spec_rows)

    async def first(q: Quota) -> tuple[int, list[float]]:
        row = await (await conn.execute(_OPEN_JOIN.format(p="%s"), (q.key_id,))).fetchone()
        cur = await conn.execute(_ALL_RECENT.format(p="%s"), (q.key_id, NOW - WINDOW_S))
        return int(row[0]) if row else 0, [float(r[0]) for r in await cur.fetchall()]

    async def new_rule(q: Quota) -> KeyUsage:
        return await postgres._key_usage(conn, q, NOW)

    await _compare(load, first, new_rule, seed=20261203)


@pytest.mark.unit
def test_the_memory_store_usage_gives_the_first_rules_verdicts() -> None:
    rng = random.Random(20261204)
    for _ in range(2000):
        runs = history(rng)
        q = quota(rng)
        open_runs = rng.randint(0, 14)
        recent = [r.created_at for r in runs if r.created_at > NOW - WINDOW_S]
        expected = first_rule(q, open_runs, sorted(recent), NOW)
        got = quota_verdict(q, KeyUsage.of_starts(q, open_runs, recent), NOW)
        assert got == expected, (q, open_runs, sorted(recent))


@pytest.mark.inprocess
async def test_a_merged_admission_far_under_its_quota_does_not_count_the_keys_window(
    tmp_path: Path,
) -> None:
    """A key allowed 10,000 starts a minute that made 400: a merged group's admission reads a
    page of pivot candidates (empty: the key is far under) and does not also count the 400,
    a walk over the key's every start of the minute inside the write transaction, at every
    admission (ADR 0042). At its limit it still counts them, for the refusal's message."""
    path = tmp_path / "quota.db"
    await (await SQLiteStore.open(path)).close()  # migrated
    conn = sqlite3.connect(path)
    try:
        runs = [
            Run(f"run_{i}", "k1", NOW - 30 + i / 100, "completed", True, True) for i in range(400)
        ]
        run_rows, spec_rows = _rows(runs)
        with conn:
            conn.executemany(_INSERT_RUN.format(p="?"), run_rows)
            conn.executemany(_INSERT_SPEC.format(p="?", false=0), spec_rows)
        statements: list[str] = []
        conn.set_trace_callback(statements.append)

        def admit(per_minute: int) -> Admission:
            quota = Quota("k1", max_open=10, max_per_minute=per_minute)
            spec = RunSpecRecord("new", {}, key_id="k1")
            start = sqlite._Start("new", (), [], open=True, spec=spec, quota=quota)
            return quota_verdict(quota, sqlite._KeyUsages(conn, [start], NOW).usage(quota), NOW)

        def counted() -> bool:
            return any("count(*) FROM run_specs" in s for s in statements)

        assert admit(10_000).admitted
        assert not counted()
        statements.clear()
        refused = admit(400)
        assert not refused.admitted and "started 400 runs" in refused.reason
        assert counted()
    finally:
        conn.close()
