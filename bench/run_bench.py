"""The whole ``thoughtgate run`` per streamed event (capture + recording), against the raw read.

Same stream and same out-of-process loopback server as ``bench.capture_bench``; the consumer here
is a full :class:`~thoughtgate.orchestration.runtime.Runtime` run through the Anthropic adapter,
recording into a durable SQLite file (WAL, ``synchronous=FULL``) with the visible-reasoning
pipeline on, in ``telemetry_only`` and in ``surface`` mode. ``surface`` records every reasoning
and text delta as an event; ``telemetry_only`` records only the text deltas and the trace.

Figures are CPU time per streamed SSE event. The targets (issue 16) are on the *marginal* cost:
the CPU of a stream with ten times the events (25,000) minus that of the usual one (2,500), per
extra event, over the same difference for the raw read of the same bytes; so what a run costs
once (creating it, its lifecycle events, the provider request) is left out, and what every event
costs is compared with reading it. ``telemetry_only`` ≤ 2× raw, ``surface`` (with durable
recording) ≤ 2.5× raw.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.capture_bench import (
    TEXT_DELTAS,
    THINKING_DELTAS,
    cpu_seconds,
    raw_consumer,
    server_process,
)
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import Provider, ProviderSettings
from thoughtgate.providers.clients import shared_clients
from thoughtgate.store.sqlite import SQLiteStore

Row = dict[str, Any]
EVENTS = THINKING_DELTAS + TEXT_DELTAS


def run_consumer(
    url: str, store: SQLiteStore, mode: str
) -> tuple[Callable[[str], Awaitable[None]], Callable[[], Awaitable[None]]]:
    def factory(payload: str) -> Callable[[str], Provider]:
        def make(model: str) -> Provider:
            settings = ProviderSettings(
                base_url=url,
                api_key="bench",
                extra={"thoughtgate": {"headers": {"x-bench-payload": payload}}},
            )
            return AnthropicProvider("claude-sonnet-4-5", settings)

        return make

    async def consume(payload: str) -> None:
        runtime = Runtime(store, provider_factory=factory(payload))
        run = await runtime.run(
            RunRequest("Tides?", model="anthropic:claude-sonnet-4-5"), chain_of_thought=mode
        )
        assert run.status == "completed", run.error

    async def close() -> None:
        return None

    return consume, close


TARGETS = {"run telemetry_only": 2.0, "run surface": 2.5}
"""Marginal CPU per event over the raw read's (issue 16)."""
LONG = 10
"""The long stream has this many times the events of the short one (``capture_bench`` payloads)."""


def _row(name: str, value: float, unit: str, target: float | None = None) -> Row:
    ok = None if target is None else value <= target
    shown = "(measured, no target)" if target is None and unit == "x" else target
    return {"name": name, "value": round(value, 2), "unit": unit, "target": shown, "ok": ok}


async def measure(url: str, db: Path) -> list[Row]:
    store = await SQLiteStore.open(db)
    raw, raw_close = raw_consumer(url)
    consumers = {
        "raw": raw,
        "run telemetry_only": run_consumer(url, store, "telemetry_only")[0],
        "run surface": run_consumer(url, store, "surface")[0],
    }
    try:
        runs = {}
        for name, consume in consumers.items():
            runs[name] = (consume, "event-1")
            runs[f"{name} {LONG}x"] = (consume, f"event-{LONG}")
        seconds = await cpu_seconds(runs)
    finally:
        await raw_close()
        await store.close()
    extra = EVENTS * (LONG - 1)
    marginal = {name: (seconds[f"{name} {LONG}x"] - seconds[name]) / extra for name in consumers}
    rows: list[Row] = []
    for name in consumers:
        rows.append(_row(f"{name} cpu per event", seconds[name] / EVENTS * 1e6, "µs"))
        if name != "raw":
            rows.append(_row(f"{name} / raw", seconds[name] / seconds["raw"], "x"))
    for name in consumers:
        rows.append(_row(f"{name} marginal cpu per event", marginal[name] * 1e6, "µs"))
        if name != "raw":
            ratio = marginal[name] / marginal["raw"]
            rows.append(_row(f"{name} marginal / raw", ratio, "x", TARGETS[name]))
    return rows


async def _sharing_connections(url: str, db: Path) -> list[Row]:
    """Runs keep the provider connections between them, as the raw client keeps its own."""
    async with shared_clients().lease():
        return await measure(url, db)


def main() -> list[Row]:
    with server_process() as url, tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(_sharing_connections(url, Path(tmp) / "bench.db"))
    for row in rows:
        target = "" if row["target"] is None else f"target {row['target']}"
        verdict = "" if row["ok"] is None else ("ok" if row["ok"] else "MISS")
        print(f"{row['name']:<45} {row['value']:>10} {row['unit']:<3} {target} {verdict}")
    return rows


if __name__ == "__main__":
    main()
