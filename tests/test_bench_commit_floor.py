"""``bench.commit_floor``: the floor the daemon bench sets beside the first byte at one run is the
append of a reasoning delta to an open run through the daemon's store, and the lesser
measurement is the one kept."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.bench_modules import bench_module

from thoughtgate.events.schema import EventType
from thoughtgate.store.records import RunRecord, new_id
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.store.urls import open_store

commit_floor = bench_module("commit_floor")


@pytest.mark.inprocess
async def test_each_timed_append_is_one_reasoning_delta_committed_to_the_run(
    tmp_path: Path,
) -> None:
    store = await SQLiteStore.open(tmp_path / "floor.db")
    try:
        run = RunRecord(new_id("run"), "floor", status="running")
        await store.create_run(run)
        spent = await commit_floor.appends(store, run.run_id, 3, 0.001)
        events = await store.read(run.run_id)
    finally:
        await store.close()
    assert len(spent) == 3
    assert [(e.seq, e.type, e.payload["text"]) for e in events] == [
        (1, EventType.REASONING_DELTA, "step 0 "),
        (2, EventType.REASONING_DELTA, "step 1 "),
        (3, EventType.REASONING_DELTA, "step 2 "),
    ]


@pytest.mark.inprocess
def test_the_floor_is_measured_on_one_open_run_of_a_durable_store_file(tmp_path: Path) -> None:
    floor = commit_floor.append_floor(tmp_path, "measured.db", count=4, idle_s=0.001)
    assert floor.after_idle_p50 <= floor.after_idle_p99

    async def recorded() -> list[tuple[str, int]]:
        store = await open_store(f"sqlite:///{tmp_path / 'measured.db'}")
        try:
            runs = await store.list_runs()
            return [(r.status, len(await store.read(r.run_id))) for r in runs]
        finally:
            await store.close()

    # one open run: the warm-up appends, then the back-to-back ones, then those after the gap
    assert asyncio.run(recorded()) == [("running", commit_floor.WARM_UP + 4 + 4)]


@pytest.mark.unit
def test_least_keeps_the_measurement_with_the_lesser_after_idle_median() -> None:
    busy = commit_floor.AppendFloor(after_idle_p50=1.9, after_idle_p99=10.5, tight_p50=0.4)
    quiet = commit_floor.AppendFloor(after_idle_p50=0.6, after_idle_p99=12.0, tight_p50=0.5)
    assert commit_floor.least(busy, quiet) is quiet
    assert commit_floor.least(quiet, busy) is quiet
