"""The whole ``thoughtgate run`` per streamed event (capture + recording), against the raw read.

Same stream and same out-of-process loopback server as ``bench.capture_bench``; the consumer here
is a full :class:`~thoughtgate.orchestration.runtime.Runtime` run through the Anthropic adapter,
recording into a durable SQLite file (WAL, ``synchronous=FULL``) with the visible-reasoning
pipeline on, in ``telemetry_only`` and in ``surface`` mode. ``surface`` records every reasoning
and text delta as an event; ``telemetry_only`` records only the text deltas and the trace.
Figures are CPU time per streamed SSE event and the ratio to the raw read of the same bytes.
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


async def measure(url: str, db: Path) -> list[Row]:
    store = await SQLiteStore.open(db)
    raw, raw_close = raw_consumer(url)
    try:
        runs = {
            "raw": (raw, "event-1"),
            "run telemetry_only": (run_consumer(url, store, "telemetry_only")[0], "event-1"),
            "run surface": (run_consumer(url, store, "surface")[0], "event-1"),
        }
        seconds = await cpu_seconds(runs)
    finally:
        await raw_close()
        await store.close()
    rows: list[Row] = []
    for name, cpu in seconds.items():
        rows.append(
            {
                "name": f"{name} cpu per event",
                "value": round(cpu / EVENTS * 1e6, 2),
                "unit": "µs",
                "target": None,
                "ok": None,
            }
        )
        if name != "raw":
            rows.append(
                {
                    "name": f"{name} / raw",
                    "value": round(cpu / seconds["raw"], 2),
                    "unit": "x",
                    "target": "(measured, no target)",
                    "ok": None,
                }
            )
    return rows


async def _sharing_connections(url: str, db: Path) -> list[Row]:
    """Runs keep the provider connections between them, as the raw client keeps its own."""
    async with shared_clients().lease():
        return await measure(url, db)


def main() -> list[Row]:
    with server_process() as url, tempfile.TemporaryDirectory() as tmp:
        rows = asyncio.run(_sharing_connections(url, Path(tmp) / "bench.db"))
    for row in rows:
        print(f"{row['name']:<40} {row['value']:>10} {row['unit']}")
    return rows


if __name__ == "__main__":
    main()
