"""What the fence of an execution's appends costs (ADR 0090): appends named by their execution
(``held_by``) against the same appends unnamed, per backend. Not part of ``make bench``.

Run ``PYTHONPATH=src:. python -m bench.fence_bench``. Each round opens each backend on a fresh
database, claims ``RUNS`` durable runs (attempt 1) and appends ``BATCHES`` batches of
``EVENTS`` deltas to each: the runs concurrently (one append of each run in flight at once,
which SQLite's writer merges into one write, ADR 0030), as a daemon's recorders do. The two arms
take turns within the round -- fenced first in one round, unfenced first in the next -- and a
round's figure is the ratio fenced / unfenced of this process's CPU time (``process_time``)
and of wall time per batch. Printed: each round's ratios, then their medians and quartiles.

``FENCE_BENCH_WRITE=save_task`` measures a task's record saved instead (``save_task``, fenced
by ADR 0094): one save of each run's task at once per batch, named or not.

``FENCE_BENCH_ROUNDS``, ``FENCE_BENCH_RUNS``, ``FENCE_BENCH_EVENTS`` override the defaults.
PostgreSQL as for ``store_bench`` (``THOUGHTGATE_BENCH_PG_URL``, else the local test server).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.environment import PG_URL, drop_schemas_async, throwaway_schema
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.store.base import EventStore, Holder
from thoughtgate.store.durable import DurableRunStore, RunSpecRecord
from thoughtgate.store.records import RunRecord, TaskRecord, new_id

ROUNDS = int(os.environ.get("FENCE_BENCH_ROUNDS", "6"))
RUNS = int(os.environ.get("FENCE_BENCH_RUNS", "10"))
EVENTS = int(os.environ.get("FENCE_BENCH_EVENTS", "4"))
WRITE = os.environ.get("FENCE_BENCH_WRITE", "append")
BATCHES = 200
OWNER = "0123456789abcdef.4242.fencebench"


async def _claimed_runs(store: EventStore) -> list[str]:
    assert isinstance(store, DurableRunStore)
    ids = []
    for _ in range(RUNS):
        run_id = new_id("run")
        task = TaskRecord(new_id("task"), run_id, 0, "p")
        run = RunRecord(run_id, "p", tasks=[task])
        spec = RunSpecRecord(run_id, {"version": 1, "tasks": [], "tools": []}, durable=True)
        assert (await store.admit_run(run, spec)).admitted
        assert await store.claim_run(run_id, OWNER, 600) == 1
        ids.append(run_id)
    return ids


async def _arm(store: EventStore, runs: list[str], held_by: Holder | None) -> tuple[float, float]:
    """CPU and wall seconds per batch of ``BATCHES`` rounds of one append per run at once."""
    batch = [NewEvent(EventType.MESSAGE_DELTA, {"text": "x" * 40}) for _ in range(EVENTS)]
    tasks = [(await store.get_run(r)).tasks[0] for r in runs]
    for task in tasks:
        task.status, task.output, task.reasoning = "completed", "x" * 40, "y" * 400
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(BATCHES):
        if WRITE == "save_task":
            await asyncio.gather(*(store.save_task(t, held_by=held_by) for t in tasks))
        else:
            await asyncio.gather(*(store.append(r, batch, held_by=held_by) for r in runs))
    n = BATCHES * len(runs)
    return (time.process_time() - cpu) / n, (time.perf_counter() - wall) / n


async def _round(
    open_store: Callable[[], Awaitable[EventStore]], fenced_first: bool
) -> list[float]:
    store = await open_store()
    try:
        runs = await _claimed_runs(store)
        await _arm(store, runs, None)  # warm-up: statements prepared, pages cached
        holder = Holder(OWNER, 1)
        arms = [holder, None] if fenced_first else [None, holder]
        got = {id(h): await _arm(store, runs, h) for h in arms}
        (f_cpu, f_wall), (u_cpu, u_wall) = got[id(holder)], got[id(None)]
        return [f_cpu / u_cpu, f_wall / u_wall, f_cpu * 1e6, u_cpu * 1e6]
    finally:
        await store.close()


async def _main() -> None:
    from thoughtgate.store.postgres import PostgresStore
    from thoughtgate.store.sqlite import SQLiteStore

    schemas: list[str] = []
    with tempfile.TemporaryDirectory() as where:

        async def sqlite() -> EventStore:
            return await SQLiteStore.open(Path(where) / f"{new_id('db')}.db")

        async def postgres() -> EventStore:
            schema = throwaway_schema()
            schemas.append(schema)
            return await PostgresStore.open(PG_URL, schema=schema)

        try:
            for name, opener in (("sqlite", sqlite), ("postgres", postgres)):
                rows = [await _round(opener, k % 2 == 0) for k in range(ROUNDS)]
                what = "a task saved" if WRITE == "save_task" else f"{EVENTS} events"
                print(f"{name}: {RUNS} runs x {what} a batch, {ROUNDS} rounds")
                print("  round  cpu f/u  wall f/u  cpu us/batch fenced  unfenced")
                for k, (c, w, f, u) in enumerate(rows):
                    print(f"  {k:5d}  {c:7.3f}  {w:8.3f}  {f:19.1f}  {u:8.1f}")
                for label, col in (("cpu", 0), ("wall", 1)):
                    values = sorted(r[col] for r in rows)
                    q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
                    print(
                        f"  {label} ratio median {statistics.median(values):.3f} "
                        f"(quartiles {q[0]:.3f}-{q[2]:.3f})"
                    )
        finally:
            for schema in schemas:
                await drop_schemas_async(schema)


if __name__ == "__main__":
    asyncio.run(_main())
