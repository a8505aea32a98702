"""The one output filter on the read path: events per second for each reader, and a whole replay.

Not a test. Run ``PYTHONPATH=src python -m bench.filter_bench``. A real run (the fake provider,
a tool loop of three turns, ``surface`` mode, visible reasoning on) is recorded into the memory
store; its events, repeated to ``EVENTS`` with fresh sequence numbers, are then passed through
``filter_event`` for a viewer, a member and a developer on a ``surface`` run and for an owner on a
``telemetry_only`` run (display surface), and through ``filter_event`` + ``Event.to_dict`` +
``json.dumps`` (what an HTTP page or an SSE frame costs). The mix is what a streamed run records:
mostly ``message.delta`` and ``reasoning.delta``.

Target (issue 16): replay ≥ 500k events/s — that figure is for the store read; the filter is one
part of it, so its own rate must sit well above it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

from thoughtgate.access.filter import filter_event
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.events.schema import Event
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, reasoning, text, tool_call

__all__ = ["main"]

EVENTS = 200_000
REPEATS = 3
READERS = (
    ("viewer", "surface"),
    ("member", "surface"),
    ("developer", "surface"),
    ("owner", "telemetry_only"),
)


def _script(request: TurnRequest, turn: int) -> Iterator[Any]:
    for i in range(60):
        yield reasoning(f"step {i} of the plan ")
    if turn < 2:
        yield tool_call("lookup", {"query": f"q{turn}"}, call_id=f"call_{turn}")
        return
    for i in range(60):
        yield text(f"word{i} ")


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}"


async def _recorded() -> list[Event]:
    FAKE_SCRIPTS["filterbench"] = _script
    store = MemoryStore()
    runtime = Runtime(store, tools=ToolRegistry([lookup]))
    run = await runtime.run(RunRequest("go", model="fake:filterbench"), chain_of_thought="surface")
    return list(await store.read(run.run_id))


def _repeat(events: list[Event], total: int) -> list[Event]:
    out: list[Event] = []
    seq = 0
    while len(out) < total:
        for e in events:
            seq += 1
            out.append(Event(seq, e.run_id, e.type, e.payload, task_id=e.task_id, ts=e.ts))
            if len(out) == total:
                break
    return out


def _best(fn: Any) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure() -> list[dict[str, Any]]:
    events = _repeat(asyncio.run(_recorded()), EVENTS)
    rows: list[dict[str, Any]] = []
    for role, mode in READERS:

        def only_filter(role: str = role, mode: str = mode) -> None:
            for e in events:
                filter_event(e, role, mode=mode)

        def replay(role: str = role, mode: str = mode) -> None:
            for e in events:
                shown = filter_event(e, role, mode=mode)
                if shown is not None:
                    json.dumps(shown.to_dict(), ensure_ascii=False, separators=(",", ":"))

        for name, fn in (("filter", only_filter), ("filter+encode", replay)):
            seconds = _best(fn)
            rows.append(
                {
                    "name": f"{name} {role} {mode}",
                    "value": round(len(events) / seconds),
                    "unit": "events/s",
                    "target": None,
                    "ok": None,
                }
            )
    return rows


def main() -> list[dict[str, Any]]:
    rows = measure()
    for row in rows:
        print(f"{row['name']:<40} {row['value']:>12,} {row['unit']}")
    return rows


if __name__ == "__main__":
    main()
