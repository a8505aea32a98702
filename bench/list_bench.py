"""The run list with 100,000 runs in the store: keyset pages, filters, search and the change feed.

Not a test. Run ``PYTHONPATH=src python -m bench.list_bench``; ``main()`` also returns the figures
as ``{name, value, unit, target, ok}`` dicts for ``bench/run.py`` (``value`` is ``None`` with an
``error`` when a backend could not run).

The store is filled with :data:`RUNS` runs (one task each) written straight into its tables in one
transaction -- a benchmark of the list, not of creating runs -- spread over 90 days, with the
status, mode, model and key mix of a busy installation (:func:`_runs`). Each figure is the median
time of ``query_runs`` (or ``list_runs``, ``run_changes``) over :data:`REPEATS` calls, in ms, as
the daemon's ``GET /v1/runs`` pays it (the page with its tasks, decoded into records):

* ``first_page``: the newest 50; ``keyset_page_100`` / ``keyset_last_page``: the page after 5,000
  runs and the very last page, reached with the cursor (what "Load more" does);
  ``offset_page_100`` / ``offset_last_page``: the same pages by ``OFFSET``, for comparison -- an
  offset page costs the rows it skips;
* ``status_failed`` (5 % of runs), ``status_failed_page_20`` (deep into them),
  ``model``, ``key``, ``mode_telemetry_only``, ``one_day``: filtered first pages;
* ``search_common`` (a word in a third of the prompts) and ``search_rare`` (10 runs in 100,000:
  the whole table is read, so this is the slowest figure, and it grows with the store);
* ``changes``: the run list stream's read of the last 100 changes.

PostgreSQL comes from ``THOUGHTGATE_BENCH_PG_URL`` (else the test server) and uses a throwaway
schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.environment import PG_URL
from thoughtgate.store.base import EventStore
from thoughtgate.store.listing import RunCursor, RunQuery

__all__ = ["main"]

RUNS = 100_000
REPEATS = 15
PAGE = 50

TARGETS_MS: dict[str, float] = {
    "first_page": 25,
    "keyset_page_100": 25,
    "keyset_last_page": 25,
    "status_failed": 25,
    "status_failed_page_20": 25,
    "model": 25,
    "key": 25,
    "mode_telemetry_only": 25,
    "one_day": 25,
    "search_common": 50,
    "changes": 25,
}
"""What a page of the list may cost (ms, median) with 100,000 runs; ``search_rare`` and the offset
pages have none (they read the table, by design or by the method measured)."""

NOTES = [
    f"list: {RUNS:,} runs in the store; each figure is the median of {REPEATS} calls in ms "
    "(a page of 50 with its tasks, decoded), lower is better. Keyset pages cost the same at "
    "any depth; offset pages grow with the depth; a rare search reads every prompt.",
]

_WORDS = [
    "summarize",
    "the",
    "incident",
    "report",
    "plan",
    "a",
    "trip",
    "compare",
    "fares",
    "draft",
    "release",
    "notes",
    "review",
    "pull",
    "request",
    "translate",
    "answer",
    "question",
    "check",
    "weather",
    "find",
    "trains",
    "write",
    "tests",
    "refactor",
    "module",
]
_MODELS = [f"anthropic:claude-{n}" for n in ("a", "b", "c")] + [
    f"openai:gpt-{n}" for n in ("d", "e", "f", "g", "h")
]
_STATUSES = ["completed"] * 90 + ["failed"] * 5 + ["partial"] * 3 + ["interrupted", "running"]
_MODES = ["hidden"] * 6 + ["surface"] * 3 + ["telemetry_only"]
_DAY = 86_400.0


def _runs(now: float) -> list[tuple[Any, ...]]:
    """Rows of ``(run_id, prompt, model, mode, status, created_at, key, usage)``, oldest first."""
    rng = random.Random(19)
    rows = []
    needles = set(rng.sample(range(RUNS), 10))
    for i in range(RUNS):
        words = rng.sample(_WORDS, 6)
        if i % 3 == 0:
            words.append("walrus")  # the common search word
        if i in needles:
            words.append("xylophone")  # the rare one
        created = now - 90 * _DAY + i * (90 * _DAY / RUNS)
        rows.append(
            (
                f"run_{uuid.UUID(int=rng.getrandbits(128)).hex}",
                " ".join(words),
                rng.choice(_MODELS),
                rng.choice(_MODES),
                rng.choice(_STATUSES),
                created,
                f"key_{rng.randrange(20):032d}",
                json.dumps({"input_tokens": rng.randrange(9999), "output_tokens": 99}),
            )
        )
    return rows


def _fill_sqlite(path: Path, rows: list[tuple[Any, ...]]) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.executemany(
            "INSERT INTO runs (run_id, prompt, model, chain_of_thought, worker_backend, status, "
            "created_at, updated_at, usage, error, metadata, started_by, change_seq) "
            "VALUES (?, ?, ?, ?, 'provider', ?, ?, ?, ?, NULL, '{}', ?, ?)",
            (
                (r[0], r[1], r[2], r[3], r[4], r[5], r[5], r[7], r[6], n + 1)
                for n, r in enumerate(rows)
            ),
        )
        conn.executemany(
            "INSERT INTO tasks (run_id, task_id, idx, prompt, status, output, reasoning, usage, "
            "error, model, backend) VALUES (?, ?, 0, ?, ?, 'done', NULL, ?, NULL, ?, 'provider')",
            ((r[0], f"task_{r[0][4:]}", r[1], r[4], r[7], r[2]) for r in rows),
        )
        conn.execute("UPDATE run_changes SET last_change = ?", (len(rows),))
        conn.execute("ANALYZE")


async def _fill_postgres(schema: str, rows: list[tuple[Any, ...]]) -> None:
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        async with conn.cursor() as cur:
            copy_runs = (
                "COPY runs (run_id, prompt, model, chain_of_thought, worker_backend, status, "
                "created_at, updated_at, usage, metadata, started_by, change_seq) FROM STDIN"
            )
            async with cur.copy(copy_runs) as copy:
                for n, r in enumerate(rows):
                    await copy.write_row(
                        (
                            r[0],
                            r[1],
                            r[2],
                            r[3],
                            "provider",
                            r[4],
                            r[5],
                            r[5],
                            r[7],
                            "{}",
                            r[6],
                            n + 1,
                        )
                    )
            copy_tasks = (
                "COPY tasks (run_id, task_id, idx, prompt, status, output, usage, model, backend) "
                "FROM STDIN"
            )
            async with cur.copy(copy_tasks) as copy:
                for r in rows:
                    await copy.write_row(
                        (r[0], f"task_{r[0][4:]}", 0, r[1], r[4], "done", r[7], r[2], "provider")
                    )
        # the rows' numbers are the past: new changes are numbered after them (ADR 0140)
        await conn.execute(
            "UPDATE run_changes SET base = %s + 1 - "
            "pg_snapshot_xmin(pg_current_snapshot())::text::bigint",
            (len(rows),),
        )
        await conn.execute("ANALYZE runs")
        await conn.execute("ANALYZE tasks")


async def _median_ms(call: Callable[[], Awaitable[Any]]) -> float:
    await call()  # warm: caches, prepared statements
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def _cursor_at(store: EventStore, query: RunQuery, pages: int) -> RunCursor | None:
    """The cursor after ``pages`` pages of ``query`` (walked once, like a reader would)."""
    cursor = None
    for _ in range(pages):
        page = await store.query_runs(RunQuery(**{**_fields(query), "before": cursor}))
        cursor = page.next
    return cursor


def _fields(query: RunQuery) -> dict[str, Any]:
    return {f: getattr(query, f) for f in query.__dataclass_fields__}


async def bench_store(
    prefix: str, store: EventStore, rows: list[tuple[Any, ...]]
) -> list[dict[str, Any]]:
    now = rows[-1][5]
    key = rows[-1][6]
    model = rows[-1][2]
    plain = RunQuery(limit=PAGE)
    failed = RunQuery(limit=PAGE, statuses=("failed", "error"))
    deep = await _cursor_at(store, plain, 100)
    last = await _cursor_at(store, plain, RUNS // PAGE - 1)
    deep_failed = await _cursor_at(store, failed, 20)
    latest = await store.latest_run_change()

    def page(**over: Any) -> Callable[[], Awaitable[Any]]:
        query = RunQuery(**{**_fields(plain), **over})
        return lambda: store.query_runs(query)

    cases: dict[str, Callable[[], Awaitable[Any]]] = {
        "first_page": page(),
        "keyset_page_100": page(before=deep),
        "offset_page_100": lambda: store.list_runs(limit=PAGE, offset=100 * PAGE),
        "keyset_last_page": page(before=last),
        "offset_last_page": lambda: store.list_runs(limit=PAGE, offset=RUNS - PAGE),
        "status_failed": page(statuses=("failed", "error")),
        "status_failed_page_20": page(statuses=("failed", "error"), before=deep_failed),
        "model": page(model=model),
        "key": page(started_by=key),
        "mode_telemetry_only": page(modes=("telemetry_only",)),
        "one_day": page(since=now - 45 * _DAY, until=now - 44 * _DAY),
        "search_common": page(text="walrus"),
        "search_rare": page(text="xylophone"),
        "changes": lambda: store.run_changes(after=latest - 100, limit=100),
    }
    out = []
    for name, call in cases.items():
        value = await _median_ms(call)
        target = TARGETS_MS.get(name)
        out.append(
            {
                "name": f"{prefix}_{name}",
                "value": round(value, 2),
                "unit": "ms",
                "target": target,
                "ok": None if target is None else value <= target,
            }
        )
    found = await store.query_runs(RunQuery(limit=PAGE, text="xylophone"))
    assert len(found.runs) == 10, "the rare search finds its 10 runs"
    return out


@contextlib.asynccontextmanager
async def sqlite_filled(rows: list[tuple[Any, ...]]) -> AsyncIterator[EventStore]:
    from thoughtgate.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory(prefix="tg-bench-list-") as folder:
        path = Path(folder) / "list.db"
        await (await SQLiteStore.open(path)).close()  # create the schema
        _fill_sqlite(path, rows)
        store = await SQLiteStore.open(path)
        try:
            yield store
        finally:
            await store.close()


@contextlib.asynccontextmanager
async def postgres_filled(rows: list[tuple[Any, ...]]) -> AsyncIterator[EventStore]:
    from bench.store_bench import postgres_store
    from thoughtgate.store.postgres import PostgresStore

    async with postgres_store() as store:
        assert isinstance(store, PostgresStore)
        await _fill_postgres(store.schema, rows)
        yield store


async def run_all() -> list[dict[str, Any]]:
    rows = _runs(time.time())
    results: list[dict[str, Any]] = []
    backends = (("sqlite", sqlite_filled), ("postgres", postgres_filled))
    for prefix, opener in backends:
        try:
            async with opener(rows) as store:
                results += await bench_store(f"list_{prefix}", store, rows)
        except Exception as exc:  # a backend that cannot run is a result, not a crash
            results.append(
                {
                    "name": f"list_{prefix}_first_page",
                    "value": None,
                    "unit": "ms",
                    "target": TARGETS_MS["first_page"],
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            )
    return results


def main() -> list[dict[str, Any]]:
    results = asyncio.run(run_all())
    print(f"{'benchmark':36} {'ms':>9} {'target':>7}  ok")
    for r in results:
        value = "-" if r["value"] is None else f"{r['value']:.2f}"
        target = "-" if r["target"] is None else f"{r['target']:g}"
        ok = {True: "yes", False: "NO", None: ""}[r["ok"]]
        print(f"{r['name']:36} {value:>9} {target:>7}  {ok}")
        if "error" in r:
            print(f"    error: {r['error']}")
    return results


if __name__ == "__main__":
    main()
