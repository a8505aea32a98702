"""What durability costs per run: the same tool-loop run with and without durable execution.

A run of three model turns and two tool calls (the fake provider, no network), recorded into the
same kind of store, executed by a :class:`~thoughtgate.orchestration.runtime.Runtime` without a
durable engine (the baseline: the run's spec is still stored) and by one with DBOS attached
(``orchestration.durable``: a workflow whose 4 steps with a result a later step builds on -- two
model turns that call tools, two tool calls -- are checkpointed; recording a turn, a task's start
and end, and the last turn, which the run's ending records, are not: ADR 0025, ADR 0029). Runs
alternate between the two so the
shared machine's noise hits both alike. Figures: wall time and CPU time per run, and the ratio of
durable to baseline, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench.environment import PG_URL, drop_schemas_async, throwaway_schema
from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.orchestration.durable import DurableEngine
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, reasoning, text, tool_call

Row = dict[str, Any]
RUNS = int(os.environ.get("TG_BENCH_DURABLE_RUNS", "40"))
NOTES = [
    "Durability: each run is 3 model turns and 2 tool calls (4 checkpointed steps); the "
    "baseline is the same runtime without the engine, measured alternately in the same process.",
]


@tool
def lookup(query: str) -> str:
    """A cheap tool."""
    return f"found {query}"


def _script(request: TurnRequest, _: int) -> AsyncIterator[Any]:
    turn = sum(1 for m in request.messages if m.role == "assistant")

    async def gen() -> AsyncIterator[Any]:
        yield reasoning(f"turn {turn}: thinking about the next step")
        if turn < 2:
            yield tool_call("lookup", {"query": f"q{turn}"}, call_id=f"call_{turn}")
        else:
            yield text("Here is the answer after two lookups.")

    return gen()


FAKE_SCRIPTS["bench-loop"] = _script


async def _measure(store: EventStore, backend: str) -> list[Row]:
    config = Config()
    plain = Runtime(store, config, tools=ToolRegistry([lookup]))
    durable = Runtime(store, config, tools=ToolRegistry([lookup]))
    engine = DurableEngine.attach(durable, config.durability)
    await engine.launch()
    request = RunRequest("look it up", model="fake:bench-loop")
    timings: dict[str, list[tuple[float, float]]] = {"baseline": [], "durable": []}
    try:
        for i in range(RUNS + 2):  # two warm-ups each
            for name, runtime in (("baseline", plain), ("durable", durable)):
                wall, cpu = time.perf_counter(), time.process_time()
                run = await runtime.run(request, chain_of_thought="surface")
                took = (time.perf_counter() - wall, time.process_time() - cpu)
                assert run.status == "completed", run.error
                if i >= 2:
                    timings[name].append(took)
    finally:
        await engine.close()
    rows: list[Row] = []
    means = {
        name: (sum(w for w, _ in t) / len(t), sum(c for _, c in t) / len(t))
        for name, t in timings.items()
    }
    for name, (wall, cpu) in means.items():
        rows.append(_row(f"{backend}: {name} run, wall", wall * 1000, "ms/run"))
        rows.append(_row(f"{backend}: {name} run, CPU", cpu * 1000, "ms/run"))
    rows.append(
        _row(
            f"{backend}: durable / baseline, wall", means["durable"][0] / means["baseline"][0], "x"
        )
    )
    rows.append(
        _row(f"{backend}: durable / baseline, CPU", means["durable"][1] / means["baseline"][1], "x")
    )
    return rows


def _row(name: str, value: float, unit: str) -> Row:
    return {"name": name, "value": value, "unit": unit, "target": None, "ok": None}


async def _sqlite() -> list[Row]:
    from thoughtgate.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory() as tmp:
        store = await SQLiteStore.open(Path(tmp) / "bench.db")
        try:
            return await _measure(store, "SQLite")
        finally:
            await store.close()


async def _postgres() -> list[Row]:
    from thoughtgate.store.postgres import PostgresStore

    schema = throwaway_schema()
    store = await PostgresStore.open(PG_URL, schema=schema)
    try:
        return await _measure(store, "PostgreSQL")
    finally:
        await store.close()
        await drop_schemas_async(schema)


def main() -> list[Row]:
    rows = asyncio.run(_sqlite())
    try:
        rows += asyncio.run(_postgres())
    except Exception as exc:  # no server: say so, keep the SQLite figures
        print(f"durable bench: PostgreSQL skipped: {exc}")
    return rows


if __name__ == "__main__":
    for row in main():
        print(f"{row['name']}: {row['value']:.3g} {row['unit']}")
