"""The durable commit every delta a reader sees has waited for, measured two ways. Not a test.

A reasoning delta is committed (WAL, ``synchronous=FULL``) before any reader gets it, so the
commit is a floor under the daemon's added first byte (``ttfb_added``). How much of a floor
depends on how it is measured (ADR 0058):

* :func:`bare_commit_ms`: one small row committed through ``sqlite3`` in a tight loop. The
  file's pages, SQLite's code and the CPU's caches stay hot and the thread never sleeps, so this
  is the least a commit costs on this disk, not what a run meets.
* :func:`append_floor`: what one run meets. The daemon's own store (``open_store``, as ``thoughtgate
  serve`` opens it) on the daemon's event loop (uvloop where installed), a created run, then one
  reasoning delta appended and awaited after an idle gap as long as the fake provider's wait
  before its first delta (10 ms), over and over. The append is the store's whole path: encoding,
  the event loop running the group's statements, the writer thread's ``COMMIT`` and its
  hand-back to the loop, which publishes the events to live readers a loop turn before the
  appender resumes (ADR 0028, 0036, 0053). The same appends back to back, without the gap, are
  measured too (``tight``), to tell the store's path from the gap. The gap's cost is the disk's:
  a raw ``fdatasync`` after 10 ms costs several times one back to back, whether the thread slept
  or spun through the gap (ADR 0058).
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.server.serve import daemon_runner
from thoughtgate.store.base import EventStore
from thoughtgate.store.records import RunRecord, new_id
from thoughtgate.store.urls import open_store

__all__ = ["AppendFloor", "append_floor", "appends", "bare_commit_ms", "least"]

IDLE_S = 0.010
"""The idle gap before each append: the fake provider's wait before its first delta (the paced
stream's ``PROVIDER_TTFB_S``), which is what a run's first delta follows at one run."""
APPENDS = 200
WARM_UP = 10
"""Appends before the measured ones, not counted: the first statements of a fresh connection
are compiled and its file's first pages read, which no delta of a running daemon pays."""


def _percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, as the daemon bench's other figures)."""
    if not values:
        return float("nan")
    ranked = sorted(values)
    return ranked[min(len(ranked) - 1, round(q * (len(ranked) - 1)))]


def bare_commit_ms(directory: Path, commits: int = 200) -> float:
    """Median ms of one bare durable SQLite commit (WAL, ``synchronous=FULL``, one small row) in
    ``directory``, in a tight loop: the least any delta a reader sees has paid."""
    conn = sqlite3.connect(directory / "commit-floor.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("CREATE TABLE t (v TEXT)")
        spent = []
        for _ in range(commits):
            start = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES ('delta')")
            conn.execute("COMMIT")
            spent.append(time.perf_counter() - start)
    finally:
        conn.close()
    return _percentile(spent, 0.5) * 1000


def _delta(i: int) -> NewEvent:
    """A reasoning delta as the agent loop records one (``engine.loop``'s payload)."""
    payload = {"text": f"step {i} ", "reasoning_kind": "raw", "index": 0, "turn": 1}
    return NewEvent(EventType.REASONING_DELTA, payload, task_id="task_floor")


async def appends(store: EventStore, run_id: str, count: int, idle_s: float) -> list[float]:
    """Seconds each of ``count`` appends of one reasoning delta to ``run_id`` took, awaited from
    the running event loop, each after the loop has idled ``idle_s`` (none: back to back)."""
    spent = []
    for i in range(count):
        if idle_s > 0:
            await asyncio.sleep(idle_s)
        start = time.perf_counter()
        await store.append(run_id, [_delta(i)])
        spent.append(time.perf_counter() - start)
    return spent


@dataclass(frozen=True)
class AppendFloor:
    """One reasoning delta's append through the daemon's store, in ms."""

    after_idle_p50: float
    after_idle_p99: float
    tight_p50: float
    """The same appends back to back: the store's path without the idle gap."""

    def text(self) -> str:
        return (
            f"one reasoning delta's append through the store after the idle gap "
            f"{self.after_idle_p50:.3f} ms p50, {self.after_idle_p99:.3f} ms p99; back to back "
            f"{self.tight_p50:.3f} ms p50"
        )


def least(*floors: AppendFloor) -> AppendFloor:
    """The measurement with the least after-idle median. A floor measured while the shared host
    is busy can exceed the whole first byte measured a minute later; as with the in-process
    baseline, the bench measures before and after its phases and keeps the lesser."""
    return min(floors, key=lambda floor: floor.after_idle_p50)


async def _measure(path: Path, count: int, idle_s: float) -> AppendFloor:
    store = await open_store(f"sqlite:///{path}")
    try:
        run = RunRecord(new_id("run"), "commit floor", model="fake:bench", status="running")
        await store.create_run(run)
        await appends(store, run.run_id, WARM_UP, 0.0)
        tight = await appends(store, run.run_id, count, 0.0)
        idle = await appends(store, run.run_id, count, idle_s)
    finally:
        await store.close()
    return AppendFloor(
        after_idle_p50=_percentile(idle, 0.5) * 1000,
        after_idle_p99=_percentile(idle, 0.99) * 1000,
        tight_p50=_percentile(tight, 0.5) * 1000,
    )


def append_floor(
    directory: Path,
    name: str = "append-floor.db",
    *,
    count: int = APPENDS,
    idle_s: float = IDLE_S,
) -> AppendFloor:
    """One run's append of a reasoning delta, in a fresh store file ``name`` in ``directory``,
    on the daemon's kind of event loop (a new one: call it with no loop running)."""
    return daemon_runner()(_measure(directory / name, count, idle_s))


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        bare = bare_commit_ms(Path(tmp))
        floor = append_floor(Path(tmp))
    print(
        f"bare commit p50 {bare:.3f} ms; store append: tight p50 {floor.tight_p50:.3f} ms, "
        f"after {IDLE_S * 1000:.0f} ms idle p50 {floor.after_idle_p50:.3f} / "
        f"p99 {floor.after_idle_p99:.3f} ms"
    )
