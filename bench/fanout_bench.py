"""Live fan-out: how long an appended event takes to reach 1, 100 and 1,000 SSE readers of one run.

Not a test. Run ``PYTHONPATH=src python -m bench.fanout_bench`` (``--quick`` for fewer events,
``--store sqlite|postgres`` for one backend); ``main()`` returns ``{name, value, unit, target, ok}``
rows plus a plot series for ``bench.run``.

Set-up: ``thoughtgate`` serves in a subprocess (uvicorn, one worker) over a SQLite file or a
throwaway PostgreSQL schema. The fake provider ``fake:fanout`` waits until every reader is
connected, then says ``EVENTS`` words, one every ``GAP_S``. That gap is longer than the recorder's
batching window, so each word is appended on its own as soon as it is said: its ``ts`` is its
append time (to within the store's commit). The readers are plain asyncio sockets in this process
(httpx would cost more CPU than the server at 1,000 readers on two cores); each notes when
its socket reads arrive and keeps their bytes, and parses them after the level, so that its
parsing does not compete with the server while the latency is measured. Latency = arrival of the
read that completed a frame - ``ts`` for every (reader, word) pair, so it covers commit, the
hand-off to the feed, the output filter, encoding, the socket and this client's own event loop.
Both processes share the machine's cores.

Target (issue 7): p99 ≤ 50 ms at 1,000 readers.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from bench.atomic import write_json
from bench.emulator_process import stop
from bench.environment import LOOPBACK, PG_URL, REPO, child_env, drop_schemas, throwaway_schema

__all__ = ["main"]

LEVELS = (1, 100, 1000)
EVENTS = 60
GAP_S = 0.05
TARGET_P99_MS = 50.0
NOTES = [
    "latency is from an event's append (its `ts`; each word is appended alone) to the socket read "
    "that completed its frame at a raw-socket reader in the bench process; server and readers "
    "share the 2 cores. The readers only stamp and keep each read while the run streams and "
    "parse afterwards (ADR 0022). The server writes each delivery to every waiting reader "
    "straight from the commit's hand-off (one socket write per reader per batch, no task "
    "wake-up per reader); at 1,000 readers those writes are most of its delivery CPU."
]


# ----------------------------------------------------------------------------- server side


def _fanout_script(request: Any, turn: int) -> AsyncIterator[Any]:
    """``fanout GO_FILE COUNT GAP_S``: wait for ``GO_FILE`` to exist, then ``COUNT`` words."""
    from thoughtgate.testing.fake import text

    _, go_file, count, gap = request.messages[0].text.split()

    async def gen() -> AsyncIterator[Any]:
        for _ in range(12_000):  # a cross-process signal: at most two minutes
            if _exists(go_file):
                break
            await asyncio.sleep(0.01)
        for i in range(int(count)):
            yield text(f"w{i} ")
            await asyncio.sleep(float(gap))

    return gen()


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _serve(port_file: Path, db_url: str) -> None:
    import logging

    from thoughtgate.access.keys import create_key
    from thoughtgate.config import Config
    from thoughtgate.orchestration.runtime import Runtime
    from thoughtgate.server.app import create_app
    from thoughtgate.server.serve import daemon_runner, serve_app
    from thoughtgate.store.urls import open_store
    from thoughtgate.testing.fake import FAKE_SCRIPTS

    FAKE_SCRIPTS["fanout"] = _fanout_script
    logging.basicConfig(level=logging.WARNING)

    async def run() -> None:
        store = await open_store(db_url)
        key = (await create_key(store, name="bench", role="owner")).key
        # One key holds all 1,000 readers: the per-key stream limit (ADR 0155) is a policy,
        # not a cost, and would answer the readers past it 429.
        config = Config.from_mapping({"quotas": {"max_live_streams_per_key": max(LEVELS)}})
        app = create_app(Runtime(store, config), config)

        def ready(host: str, port: int) -> None:
            write_json(port_file, {"url": f"http://{host}:{port}", "key": key})

        try:
            await serve_app(app, host=LOOPBACK, port=0, log_level="warning", on_ready=ready)
        finally:
            await store.close()

    daemon_runner()(run())  # the daemon's own event loop (uvloop where installed)


def _started(proc: subprocess.Popen[bytes], port_file: Path) -> dict[str, Any]:
    """What the bench server ``proc`` wrote to ``port_file`` once listening; an error if it
    exits or 30 s pass first."""
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("the bench server did not start")
        time.sleep(0.05)
    time.sleep(0.05)  # the file is written in one call, but be safe
    info: dict[str, Any] = json.loads(port_file.read_text())
    return info


@contextlib.contextmanager
def _server(db_url: str) -> Iterator[dict[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port.json"
        env = child_env()
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fanout_bench", "--serve", str(port_file), db_url],
            env=env,
            cwd=str(REPO),
        )
        try:
            yield _started(proc, port_file)
        finally:
            stop(proc)  # SIGTERM, then SIGKILL: a server left running would load later benches


@contextlib.contextmanager
def _postgres_url() -> Iterator[str]:
    schema = throwaway_schema()
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        drop_schemas(schema)


# ----------------------------------------------------------------------------- client side


async def _request(base: str, key: str, method: str, path: str, body: Any) -> Any:
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(body).encode()
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + data
    )
    raw = await reader.read()
    writer.close()
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


class _Reader(asyncio.Protocol):
    """One SSE reader: note when each read's bytes arrive, and nothing else until the end.

    A thousand of these share the cores with the server, so while the run streams a reader only
    stamps and keeps what it reads (one callback per socket read, no streams, no parsing): its
    cost would otherwise be part of the latency it measures. ``latencies`` parses it afterwards:
    each ``message.delta`` frame's arrival is that of the read that completed it, minus its
    ``ts``.
    """

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.reads: list[tuple[float, bytes]] = []
        self.connected = asyncio.Event()
        self.done = asyncio.get_running_loop().create_future()
        self._tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.reads.append((time.time(), data))
        self.connected.set()  # the response's head comes first: the stream is open
        tail = (self._tail + data)[-7:]
        self._tail = tail
        if tail == b"0\r\n\r\n" and not self.done.done():  # the last chunk: the stream ended
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def latencies(self) -> list[float]:
        """(arrival - ts) of every ``message.delta`` frame, parsed from what was read."""
        return [arrived - ts for ts, arrived in self.deliveries()]

    def deliveries(self) -> list[tuple[float, float]]:
        """(ts, arrival) of every ``message.delta`` frame, parsed from what was read."""
        stream = b"".join(data for _, data in self.reads)
        ends, total = [], 0
        for _, data in self.reads:
            total += len(data)
            ends.append(total)
        pos = stream.index(b"\r\n\r\n") + 4  # past the response's head
        out: list[tuple[float, float]] = []
        buffer = b""
        while True:
            line_end = stream.index(b"\r\n", pos)
            size = int(stream[pos:line_end], 16)
            if size == 0:
                return out
            start = line_end + 2
            end = start + size
            arrived = self.reads[bisect.bisect_left(ends, end + 2)][0]
            buffer += stream[start:end]
            pos = end + 2
            *blocks, buffer = buffer.split(b"\r\n\r\n")
            for block in blocks:
                at = block.find(b"data: ")
                if at >= 0 and b'"message.delta"' in block:
                    out.append((float(json.loads(block[at + 6 :])["ts"]), arrived))


async def _level(base: str, key: str, readers: int, events: int, go_dir: Path) -> list[float]:
    go_file = go_dir / f"go-{uuid.uuid4().hex}"
    prompt = f"fanout {go_file} {events} {GAP_S}"
    created = await _request(
        base, key, "POST", "/v1/runs", {"prompt": prompt, "model": "fake:fanout"}
    )
    run_id = created["run_id"]
    ticket = (await _request(base, key, "POST", "/v1/tickets", {"run_id": run_id}))["ticket"]
    host, port = base.removeprefix("http://").split(":")
    request = f"GET /v1/runs/{run_id}/stream?ticket={ticket} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    loop = asyncio.get_running_loop()
    subs: list[_Reader] = []
    try:
        for i in range(readers):
            sub = _Reader(request.encode())
            subs.append(sub)
            await loop.create_connection(lambda sub=sub: sub, host, int(port))  # type: ignore[misc]
            if i % 50 == 49:
                await asyncio.sleep(0)  # let the accepted ones send their requests
        await asyncio.wait_for(asyncio.gather(*(s.connected.wait() for s in subs)), 120)
        await asyncio.sleep(0.3)  # replay of the opening events is done
        go_file.write_text("go")
        await asyncio.wait_for(asyncio.gather(*(s.done for s in subs)), 300)
    finally:
        for sub in subs:
            sub.close()
    latencies = sorted(x for s in subs for x in s.latencies())
    if len(latencies) != readers * events:
        raise RuntimeError(f"expected {readers * events} deliveries, got {len(latencies)}")
    return latencies


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def _bench_store(label: str, db_url: str, events: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with _server(db_url) as info, tempfile.TemporaryDirectory() as go_dir:
        for readers in LEVELS:
            latencies = asyncio.run(_level(info["url"], info["key"], readers, events, Path(go_dir)))
            p50, p99 = _pct(latencies, 0.5) * 1000, _pct(latencies, 0.99) * 1000
            target = TARGET_P99_MS if readers == max(LEVELS) else None
            rows += [
                {
                    "name": f"fanout_p50_{label}_{readers}",
                    "value": round(p50, 2),
                    "unit": "ms",
                    "target": None,
                    "ok": None,
                },
                {
                    "name": f"fanout_p99_{label}_{readers}",
                    "value": round(p99, 2),
                    "unit": "ms",
                    "target": target,
                    "ok": None if target is None else p99 <= target,
                },
            ]
            print(
                f"{label:<9} {readers:>5} readers  p50 {p50:8.2f} ms  p99 {p99:8.2f} ms", flush=True
            )
    return rows


def _series(rows: list[dict[str, Any]], labels: list[str]) -> list[dict[str, Any]]:
    by_name = {r["name"]: r["value"] for r in rows}
    out = []
    for label in labels:
        for q in ("p50", "p99"):
            points = [
                [n, by_name[f"fanout_{q}_{label}_{n}"]]
                for n in LEVELS
                if f"fanout_{q}_{label}_{n}" in by_name
            ]
            out.append(
                {
                    "series": "fanout-latency",
                    "label": f"{label} {q}",
                    "points": points,
                    "xlabel": "SSE readers on one run",
                    "ylabel": "append to delivery (ms)",
                    "title": "Live fan-out latency (target p99 ≤ 50 ms at 1,000 readers)",
                    "logx": True,
                    "logy": True,
                }
            )
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events per level")
    parser.add_argument("--store", choices=("both", "sqlite", "postgres"), default="both")
    parser.add_argument("--serve", nargs=2, metavar=("PORT_FILE", "DB_URL"), help=argparse.SUPPRESS)
    args = parser.parse_args([] if argv is None else argv)
    if args.serve:
        _serve(Path(args.serve[0]), args.serve[1])
        return []
    events = 20 if args.quick else EVENTS
    rows: list[dict[str, Any]] = []
    labels: list[str] = []
    if args.store in ("both", "sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            rows += _bench_store("sqlite", f"sqlite:///{Path(tmp) / 'fanout.db'}", events)
            labels.append("sqlite")
    if args.store in ("both", "postgres"):
        try:
            with _postgres_url() as url:
                rows += _bench_store("postgres", url, events)
                labels.append("postgres")
        except Exception as exc:  # a backend that cannot run is a result, not a crash
            print(f"postgres: not measured ({type(exc).__name__}: {exc})")
            rows.append(
                {
                    "name": f"fanout_p99_postgres_{max(LEVELS)}",
                    "value": f"not measured: {type(exc).__name__}",
                    "unit": "",
                    "target": TARGET_P99_MS,
                    "ok": False,
                }
            )
    for r in rows:
        if r["target"] is not None:
            verdict = "ok" if r["ok"] else "MISS"
            print(f"{r['name']}: {r['value']} {r['unit']} (target ≤ {r['target']:g} ms) {verdict}")
    return rows + _series(rows, labels)


if __name__ == "__main__":
    main(sys.argv[1:])
