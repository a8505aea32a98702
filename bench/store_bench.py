"""Event-store throughput: durable appends (one per call and batched) and replay, per backend.

Not a test. Run ``PYTHONPATH=src python -m bench.store_bench``; ``main()`` also returns the figures
as ``{name, value, unit, target, ok}`` dicts for a bench runner (``target``/``ok`` are ``None``
where there is no target, and ``value`` is ``None`` with an ``error`` when a backend could not run).

What is measured:

* ``*_append_single``: ``append_one`` in a loop, each call durably committed (SQLite: WAL with
  ``synchronous=FULL``; PostgreSQL: default ``synchronous_commit=on``).
* ``*_append_batch{100,1000}``: ``append`` of 100 / 1000 events per call.
* ``*_replay``: ``tail()`` of a finished run from the start to its terminal event, i.e. what an
  SSE client that reconnects with ``Last-Event-ID: 0`` costs the server, down to ``Event`` objects.
  A replay that does not yield every event of the run, ending with its terminal event, fails.

Each figure is the best of three equal rounds (the machine may be shared).

PostgreSQL comes from ``THOUGHTGATE_BENCH_PG_URL`` (else ``THOUGHTGATE_TEST_PG_URL``, else the
local test server) and uses a throwaway schema that is dropped afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bench.environment import PG_URL, drop_schemas_async, throwaway_schema
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.store.base import EventStore
from thoughtgate.store.records import RunRecord, new_id

__all__ = ["main"]

TARGETS: dict[str, float] = {
    "sqlite_append_batch100": 100_000,
    "sqlite_append_batch1000": 100_000,
    "postgres_append_batch100": 50_000,
    "postgres_append_batch1000": 50_000,
    "sqlite_replay": 500_000,
    "postgres_replay": 500_000,
}

ROUNDS = 3
SINGLE_EVENTS = 1_500
BATCHED_EVENTS = {100: 90_000, 1000: 150_000}  # replay reads the 150k-event run


def result(name: str, value: float | None, *, error: str | None = None) -> dict[str, Any]:
    target = TARGETS.get(name)
    ok = None if target is None or value is None else value >= target
    out: dict[str, Any] = {
        "name": name,
        "value": None if value is None else round(value),
        "unit": "events/s",
        "target": target,
        "ok": False if error else ok,
    }
    if error:
        out["error"] = error
    return out


def events(n: int, start: int = 0) -> list[NewEvent]:
    """Typical streamed answer deltas: a short text and an index, tagged with their task."""
    return [
        NewEvent(
            EventType.MESSAGE_DELTA,
            {"text": "The quick brown fox jumps over the lazy dog. ", "index": start + i},
            task_id="task_bench",
        )
        for i in range(n)
    ]


async def new_run(store: EventStore) -> str:
    run = RunRecord(new_id("run"), "benchmark")
    await store.create_run(run)
    return run.run_id


async def bench_backend(prefix: str, store: EventStore) -> list[dict[str, Any]]:
    """Each figure is the best of ``ROUNDS`` equal rounds, which tames noise from other load."""
    out: list[dict[str, Any]] = []

    run_id = await new_run(store)
    one = events(SINGLE_EVENTS // ROUNDS)
    rates = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for new in one:
            await store.append_one(run_id, new)
        rates.append(len(one) / (time.perf_counter() - started))
    out.append(result(f"{prefix}_append_single", max(rates)))

    replay_run, replay_events = "", 0
    for size, total in BATCHED_EVENTS.items():
        run_id = await new_run(store)
        batch = events(size)
        calls = total // size // ROUNDS
        rates = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            for _ in range(calls):
                await store.append(run_id, batch)
            rates.append(calls * size / (time.perf_counter() - started))
        out.append(result(f"{prefix}_append_batch{size}", max(rates)))
        replay_run, replay_events = run_id, calls * size * ROUNDS

    last = await store.append_one(replay_run, NewEvent(EventType.RUN_SETTLEMENT_COMPLETED))
    rates = []
    for _ in range(ROUNDS):
        count = 0
        started = time.perf_counter()
        async for event in store.tail(replay_run):  # noqa: B007 (the last one is checked)
            count += 1
        rates.append(count / (time.perf_counter() - started))
        # A replay that is not the whole run, ending at its terminal event, measures nothing.
        if count != replay_events + 1 or event != last:
            raise RuntimeError(f"replay gave {count} events ending at {event!r}, not {last!r}")
    out.append(result(f"{prefix}_replay", max(rates)))
    return out


@contextlib.asynccontextmanager
async def sqlite_store() -> AsyncIterator[EventStore]:
    from thoughtgate.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory(prefix="tg-bench-") as folder:
        store = await SQLiteStore.open(Path(folder) / "bench.db")
        try:
            yield store
        finally:
            await store.close()


@contextlib.asynccontextmanager
async def postgres_store() -> AsyncIterator[EventStore]:
    from thoughtgate.store.postgres import PostgresStore

    schema = throwaway_schema()
    store = await PostgresStore.open(PG_URL, schema=schema)
    try:
        yield store
    finally:
        await store.close()
        await drop_schemas_async(schema)


async def run_all() -> list[dict[str, Any]]:
    backends: list[tuple[str, Callable[[], contextlib.AbstractAsyncContextManager[EventStore]]]] = [
        ("sqlite", sqlite_store),
        ("postgres", postgres_store),
    ]
    results: list[dict[str, Any]] = []
    for prefix, opener in backends:
        try:
            async with opener() as store:
                results += await bench_backend(prefix, store)
        except Exception as exc:  # a backend that cannot run is a result, not a crash
            results.append(
                result(f"{prefix}_append_single", None, error=f"{type(exc).__name__}: {exc}")
            )
    return results


def render(results: list[dict[str, Any]]) -> str:
    lines = [f"{'benchmark':28} {'events/s':>12} {'target':>10}  ok"]
    for r in results:
        value = "-" if r["value"] is None else f"{r['value']:,}"
        target = "-" if r["target"] is None else f"{r['target']:,.0f}"
        ok = {True: "yes", False: "NO", None: ""}[r["ok"]]
        lines.append(f"{r['name']:28} {value:>12} {target:>10}  {ok}")
        if "error" in r:
            lines.append(f"    error: {r['error']}")
    return "\n".join(lines)


def main() -> list[dict[str, Any]]:
    results = asyncio.run(run_all())
    print(render(results))
    return results


if __name__ == "__main__":
    main()
