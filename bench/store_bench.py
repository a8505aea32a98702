"""Event-store throughput: durable appends (one per call and batched) and replay, per backend.

Not a test. Run ``PYTHONPATH=src python -m bench.store_bench``; ``main()`` also returns the figures
as ``{name, value, unit, target, ok}`` dicts for a bench runner (``target``/``ok`` are ``None``
where there is no target, and ``value`` is ``None`` with an ``error`` when a backend could not run),
with ``spread`` and ``rounds`` (:mod:`bench.repetitions`).

What is measured:

* ``*_append_single``: ``append_one`` in a loop, each call durably committed (SQLite: WAL with
  ``synchronous=FULL``; PostgreSQL: default ``synchronous_commit=on``).
* ``*_append_batch{100,1000}``: ``append`` of 100 / 1000 events per call.
* ``*_replay``: ``tail()`` of a finished run from the start to its terminal event, i.e. what an
  SSE client that reconnects with ``Last-Event-ID: 0`` costs the server, down to ``Event`` objects.
  A replay that does not yield every event of the run, ending with its terminal event, fails.

Rounds (ADR 0049, 0080): the machine is shared, and one sample of a figure moved 2x between
minutes. Each figure is measured in :data:`ROUNDS` rounds and published as the median of the
rounds' rates with their least and greatest (``spread``), as ``daemon_bench`` does. A round opens
each backend on a fresh database (a new SQLite file, a new PostgreSQL schema), so every round
appends to tables that start empty and replays a run it wrote itself; the backends take turns
going first, so neither always measures right after the other's burst of disk writes.

Each figure also says how much CPU it cost per event (``cpu_us_per_event``: this process, plus
for PostgreSQL the server processes of the store's connections, ``server_us_per_event``, where
``/proc`` shows them: a loopback server), the median of the rounds; they are printed, not
judged.

PostgreSQL comes from ``THOUGHTGATE_BENCH_PG_URL`` (else ``THOUGHTGATE_TEST_PG_URL``, else the
local test server) and uses throwaway schemas that are dropped afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.environment import PG_URL, drop_schemas_async, throwaway_schema
from bench.repetitions import median_rows
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

ROUNDS = 5
SINGLE_EVENTS = 500
"""``append_one`` calls a round."""
BATCHED_EVENTS = {100: 30_000, 1000: 50_000}
"""Events a round appends in batches of each size; the round then replays the last run."""
REPLAYS = 3
"""Replays of that run a round: its figure is their events over their time."""

Opener = Callable[[], contextlib.AbstractAsyncContextManager[tuple[EventStore, "CpuMeter"]]]


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


def _process_cpu(pid: int) -> float | None:
    """CPU seconds of process ``pid`` (user + system), ``None`` where ``/proc`` does not show it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds of this process and of the database server processes serving the store."""

    def __init__(self, server_pids: Callable[[], list[int]] | None = None) -> None:
        self.server_pids = server_pids

    def read(self) -> tuple[float, float | None]:
        server = None
        if self.server_pids is not None:
            times = [_process_cpu(pid) for pid in self.server_pids()]
            server = None if not times or None in times else sum(t for t in times if t)
        return time.process_time(), server


async def _timed(meter: CpuMeter, body: Callable[[], Awaitable[int]]) -> dict[str, float | None]:
    """The rate of ``body`` (which returns how many events it appended or read), and its CPU
    per event."""
    cpu0, server0 = meter.read()
    started = time.perf_counter()
    n = await body()
    wall = time.perf_counter() - started
    cpu1, server1 = meter.read()
    return {
        "rate": n / wall,
        "cpu": 1e6 * (cpu1 - cpu0) / n,
        "server": None if server0 is None or server1 is None else 1e6 * (server1 - server0) / n,
    }


async def bench_round(prefix: str, store: EventStore, meter: CpuMeter) -> list[dict[str, Any]]:
    """One round of every figure on ``store`` (fresh): single appends, batches, then replays of
    the run of the largest batches."""
    figures: list[tuple[str, dict[str, float | None]]] = []

    run_id = await new_run(store)
    one = events(SINGLE_EVENTS)

    async def singles() -> int:
        for new in one:
            await store.append_one(run_id, new)
        return len(one)

    figures.append((f"{prefix}_append_single", await _timed(meter, singles)))

    replay_run, replay_events = "", 0
    for size, total in BATCHED_EVENTS.items():
        batch_run = await new_run(store)
        batch = events(size)
        calls = total // size

        async def batches(
            run: str = batch_run, batch: list[NewEvent] = batch, calls: int = calls
        ) -> int:
            for _ in range(calls):
                await store.append(run, batch)
            return calls * len(batch)

        figures.append((f"{prefix}_append_batch{size}", await _timed(meter, batches)))
        replay_run, replay_events = batch_run, calls * size

    last = await store.append_one(replay_run, NewEvent(EventType.RUN_SETTLEMENT_COMPLETED))

    async def replays() -> int:
        count = 0
        for _ in range(REPLAYS):
            n = 0
            async for event in store.tail(replay_run):  # noqa: B007 (the last one is checked)
                n += 1
            # A replay that is not the whole run, ending at its terminal event, measures nothing.
            if n != replay_events + 1 or event != last:
                raise RuntimeError(f"replay gave {n} events ending at {event!r}, not {last!r}")
            count += n
        return count

    figures.append((f"{prefix}_replay", await _timed(meter, replays)))
    return [
        {
            **result(name, timed["rate"]),
            "higher": True,  # (for ``median_rows``' verdict; dropped with the medians)
            "cpu_us_per_event": timed["cpu"],
            "server_us_per_event": timed["server"],
        }
        for name, timed in figures
    ]


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


@contextlib.asynccontextmanager
async def _metered_sqlite() -> AsyncIterator[tuple[EventStore, CpuMeter]]:
    async with sqlite_store() as store:
        yield store, CpuMeter()


@contextlib.asynccontextmanager
async def _metered_postgres() -> AsyncIterator[tuple[EventStore, CpuMeter]]:
    from thoughtgate.store.postgres import PostgresStore

    async with postgres_store() as store:
        assert isinstance(store, PostgresStore)
        async with store._conn("find the server processes") as conn:  # pyright: ignore[reportPrivateUsage]
            cur = await conn.execute(
                "SELECT array_agg(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
                (f"thoughtgate%:{store.schema}",),
            )
            row = await cur.fetchone()
        pids: list[int] = list(row[0] or []) if row else []
        # The pool may open more connections while measuring; those it has now do the work.
        yield store, CpuMeter(lambda: pids)


BACKENDS: list[tuple[str, Opener]] = [
    ("sqlite", _metered_sqlite),
    ("postgres", _metered_postgres),
]


async def run_rounds(rounds: int = ROUNDS) -> list[dict[str, Any]]:
    """Every backend's figures in ``rounds`` rounds, a fresh database each, the backends taking
    turns going first; each figure the median of its rounds. A backend that fails in a round
    reports its error once and is not run again."""
    per_backend: dict[str, list[list[dict[str, Any]]]] = {prefix: [] for prefix, _ in BACKENDS}
    failed: dict[str, dict[str, Any]] = {}
    for number in range(rounds):
        order = BACKENDS if number % 2 == 0 else BACKENDS[::-1]
        for prefix, opener in order:
            if prefix in failed:
                continue
            try:
                async with opener() as (store, meter):
                    per_backend[prefix].append(await bench_round(prefix, store, meter))
            except Exception as exc:  # a backend that cannot run is a result, not a crash
                failed[prefix] = result(
                    f"{prefix}_append_single", None, error=f"{type(exc).__name__}: {exc}"
                )
    results: list[dict[str, Any]] = []
    for prefix, _ in BACKENDS:
        if prefix in failed:
            results.append(failed[prefix])
            continue
        results += _medians(per_backend[prefix])
    return results


def _medians(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rounds' rows as one row per figure (:func:`bench.repetitions.median_rows`), rates to
    whole events a second, CPU figures the median of the rounds' (``None`` if one is missing)."""
    out = []
    for k, row in enumerate(median_rows(rounds)):
        row = {**row, "value": round(row["value"]), "spread": [round(v) for v in row["spread"]]}
        for key in ("cpu_us_per_event", "server_us_per_event"):
            seen = [r[k][key] for r in rounds]
            row[key] = None if None in seen else round(statistics.median(seen), 2)
        row.pop("higher", None)
        out.append(row)
    return out


def render(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'benchmark':26} {'events/s':>9} {'min–max of rounds':>18} {'target':>8}  ok "
        f"{'µs CPU/event':>13} {'server':>7}"
    ]
    for r in results:
        value = "-" if r["value"] is None else f"{r['value']:,}"
        target = "-" if r["target"] is None else f"{r['target']:,.0f}"
        ok = {True: "yes", False: "NO", None: ""}[r["ok"]]
        cpu, server = r.get("cpu_us_per_event"), r.get("server_us_per_event")
        spread = "" if r.get("rounds", 1) < 2 else "{:,}–{:,}".format(*r["spread"])
        lines.append(
            f"{r['name']:26} {value:>9} {spread:>18} {target:>8}  {ok:3} "
            f"{_us(cpu):>13} {_us(server):>7}"
        )
        if "error" in r:
            lines.append(f"    error: {r['error']}")
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> list[dict[str, Any]]:
    results = asyncio.run(run_rounds())
    print(render(results))
    return results


if __name__ == "__main__":
    main()
