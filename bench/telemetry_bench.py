"""What a collector that is down costs a run, against the same run with no telemetry at all.

Not a test. Run ``PYTHONPATH=src python -m bench.telemetry_bench``.

One sample is what a ``thoughtgate run`` process does besides importing: build the telemetry sinks
from the config (an OTLP/HTTP exporter and its batch processor), execute a ``fake:echo`` run
through the runtime into a SQLite file, then shut the tracer provider down, which is what the
interpreter does at exit and where a dead collector used to cost seconds of retries. Three
configurations, interleaved round by round on this shared machine:

* ``none``: ``telemetry.exporter = "none"`` (no sink at all), the baseline;
* ``down``: OTLP/HTTP to a loopback port nobody listens on (connection refused);
* ``up``: OTLP/HTTP to a loopback collector that accepts every batch (for reference).

Figures: the median wall time of each, the extra milliseconds ``down`` and ``up`` cost over
``none`` (target for ``down``: at most 100 ms), and how many log lines a down collector printed
per run (target: one warning).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.environment import LOOPBACK, free_port
from thoughtgate.config import Config
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.telemetry import TelemetrySink, telemetry_sinks

__all__ = ["main"]

ROUNDS = 25
TARGET_EXTRA_MS = 100.0
NOTES = [
    "a collector that is unreachable rather than down (packets dropped, no refusal) costs at "
    "most `telemetry.export_timeout_s` (0.5 s by default) once, when the process exits; the run "
    "itself never waits for an export."
]


class _Collector(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return


@contextmanager
def collector() -> Iterator[str]:
    server = ThreadingHTTPServer((LOOPBACK, 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> str:
    return f"http://{LOOPBACK}:{free_port()}"


class _Lines(logging.Handler):
    """Counts what reaches the root logger (what a terminal would show)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.count += 1


def config_for(endpoint: str | None) -> Config:
    telemetry: dict[str, Any] = {"exporter": "none"}
    if endpoint is not None:
        telemetry = {"exporter": "otlp_http", "endpoint": endpoint}
    return Config.from_mapping({"telemetry": telemetry})


async def one_run(store: SQLiteStore, config: Config) -> float:
    """Seconds for: build sinks, execute a run, shut telemetry down (as at process exit)."""
    started = time.perf_counter()
    sinks = telemetry_sinks(config)
    runtime = Runtime(store, config, sinks=sinks)
    run = await runtime.run(RunRequest("Tides?", model="fake:echo"))
    assert run.status == "completed", run.error
    for sink in sinks:
        if isinstance(sink, TelemetrySink):
            sink.shutdown()  # spans and metrics, as at process exit
    return time.perf_counter() - started


async def measure(endpoints: dict[str, str | None]) -> tuple[dict[str, list[float]], float]:
    lines = _Lines()
    root = logging.getLogger()
    root.addHandler(lines)
    samples: dict[str, list[float]] = {name: [] for name in endpoints}
    down_lines = 0
    try:
        with tempfile.TemporaryDirectory() as tmp:
            store = await SQLiteStore.open(Path(tmp) / "bench.db")
            try:
                for endpoint in endpoints.values():  # warm-up: imports, first connections
                    await one_run(store, config_for(endpoint))
                for _ in range(ROUNDS):
                    for name, endpoint in endpoints.items():
                        before = lines.count
                        samples[name].append(await one_run(store, config_for(endpoint)))
                        if name == "down":
                            down_lines += lines.count - before
            finally:
                await store.close()
    finally:
        root.removeHandler(lines)
    return samples, down_lines / ROUNDS


def main() -> list[dict[str, Any]]:
    with collector() as up:
        samples, lines_per_run = asyncio.run(
            measure({"none": None, "down": closed_port(), "up": up})
        )
    median = {name: statistics.median(values) * 1000 for name, values in samples.items()}
    down_extra = median["down"] - median["none"]
    rows: list[dict[str, Any]] = [
        {
            "name": f"run_{name}_median",
            "value": round(ms, 2),
            "unit": "ms",
            "target": None,
            "ok": None,
        }
        for name, ms in median.items()
    ]
    rows += [
        {
            "name": "collector_down_extra",
            "value": round(down_extra, 2),
            "unit": "ms per run",
            "target": f"<= {TARGET_EXTRA_MS:g}",
            "ok": down_extra <= TARGET_EXTRA_MS,
        },
        {
            "name": "collector_up_extra",
            "value": round(median["up"] - median["none"], 2),
            "unit": "ms per run",
            "target": None,
            "ok": None,
        },
        {
            "name": "collector_down_log_lines",
            "value": round(lines_per_run, 2),
            "unit": "lines per run",
            "target": "1",
            "ok": lines_per_run == 1,
        },
    ]
    for row in rows:
        print(row)
    return rows


if __name__ == "__main__":
    main()
