"""Daemon overhead between a zero-latency fake provider and HTTP clients. Not a test.

Run ``PYTHONPATH=src python -m bench.daemon_bench`` (``--quick`` for a short pass, ``--store
memory`` to leave durability out, ``--flush-interval S`` for a what-if on the recorder's delta
batching window). ``main()`` returns ``{name, value, unit, target, ok}`` dicts for a bench runner
(plus plot series for ``bench.run``).

Set-up: ``thoughtgate`` serves in a subprocess (uvicorn, one worker) with durable recording (a
SQLite file when ``thoughtgate.store.sqlite`` exists, else the memory store; the choice is
printed) and the output filter on (clients read as ``developer`` on ``surface`` runs, so every
reasoning delta goes through the filter and out). The fake provider ``fake:bench`` answers at
once: 20 reasoning deltas then 20 text deltas per turn, with no sleeps, so whatever time passes is
the daemon's. The first reasoning delta carries the provider's ``time.monotonic()`` (a
system-wide clock, CLOCK_MONOTONIC, so client and server processes compare it directly).

Each run is what a client does: ``POST /v1/runs``, ``POST /v1/tickets``, then
``GET /v1/runs/{id}/stream`` until the terminal event. At 1, 10 and 100 concurrent runs:

* ``ttfb_added``: first reasoning delta received by the client minus its emission by the provider
  (record, batch, tail, filter, encode, send): the daemon's added time to first reasoning byte.
* ``ttfb_client``: from the client's ``POST /v1/runs`` to that first reasoning byte (three HTTP
  round trips on loopback plus the above).
* ``runs_per_s``: completed runs per second (a run is one created-and-fully-streamed request,
  what LiteLLM's ~40 requests/s counts); ``http_per_s`` counts every HTTP request.
* ``cpu_per_event``: server CPU time (user+sys from /proc) per event delivered to clients.

LiteLLM, live (issues 5 and 9): its proxy (``litellm[proxy]==1.79.*``) pins uvicorn<0.30 and
cannot share thoughtgate's venv, so the bench creates ``bench/.litellm-venv`` on first use and
runs ``litellm --config`` there (one worker, loopback, no DB, telemetry or callbacks) in front of
thoughtgate's provider emulator (``--emulate``: a Chat Completions stream of 20 reasoning + 20
text deltas after a 10 ms first byte). At each concurrency, streamed completions go straight to
the emulator, then through the proxy: ``litellm_ttfb_added_p50/p99`` is the first content byte
through the proxy minus the first byte direct (percentile minus percentile), and
``litellm_requests_per_s`` counts completed streamed requests through the proxy. Targets: ≤ 1/20
of LiteLLM's added TTFB, ≥ 10× its requests/s, from these measured figures; when the proxy cannot
be installed or started (or ``--no-litellm``), from its published reference (~10/66/960 ms added
p50 TTFB at 1/10/100 streams, ~40 requests/s), and the bench says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from thoughtgate.providers.sse import SSEDecoder

__all__ = ["main"]

REPO = Path(__file__).resolve().parents[1]
LITELLM_TTFB_MS = {1: 10.0, 10: 66.0, 100: 960.0}
LITELLM_RPS = 40.0
NOTES: list[str] = []  # filled by main(): measured or reference LiteLLM figures
DELTAS = 20
PROVIDER_TTFB_S = 0.010
GAP_S = 0.0005


# ----------------------------------------------------------------------------- server side


def _bench_script(request: Any, turn: int) -> AsyncIterator[Any]:
    """Emulator-like: the first byte after ``PROVIDER_TTFB_S``, then a delta every ``GAP_S``."""
    from thoughtgate.testing.fake import reasoning, text

    async def gen() -> AsyncIterator[Any]:
        await asyncio.sleep(PROVIDER_TTFB_S)
        yield reasoning(f"T{time.monotonic():.6f} ")
        for i in range(1, DELTAS):
            await asyncio.sleep(GAP_S)
            yield reasoning(f"step {i} ")
        for i in range(DELTAS):
            await asyncio.sleep(GAP_S)
            yield text(f"word{i} ")

    return gen()


def _serve(port_file: Path, db_url: str, flush_interval: float | None) -> None:
    """The server process: register ``fake:bench``, open the store, serve on a free port."""
    import logging

    from thoughtgate.access.keys import create_key
    from thoughtgate.config import Config
    from thoughtgate.orchestration.runtime import Runtime
    from thoughtgate.server.app import create_app
    from thoughtgate.server.serve import serve_app
    from thoughtgate.store.urls import open_store
    from thoughtgate.testing.fake import FAKE_SCRIPTS

    FAKE_SCRIPTS["bench"] = _bench_script
    logging.basicConfig(level=logging.WARNING)
    if flush_interval is not None:  # what-if: a shorter delta batching window in the recorder
        from thoughtgate.orchestration.recorder import EventRecorder

        defaults = EventRecorder.__init__.__kwdefaults__
        assert defaults is not None
        defaults["flush_interval"] = flush_interval

    async def run() -> None:
        store = await open_store(db_url)
        key = (await create_key(store, name="bench", role="developer")).key
        app = create_app(Runtime(store, Config()), Config())

        def ready(host: str, port: int) -> None:
            port_file.write_text(json.dumps({"url": f"http://{host}:{port}", "key": key}))

        try:
            await serve_app(app, host="127.0.0.1", port=0, log_level="warning", on_ready=ready)
        finally:
            await store.close()

    asyncio.run(run())


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------- client side


class _Connection:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams.

    httpx costs more CPU per request than the daemon does on this kind of machine, and client and
    server share the cores, so a heavy client would measure itself. This one only writes requests
    and reads ``Content-Length`` or chunked bodies.
    """

    def __init__(self, host: str, port: int, key: str) -> None:
        self.host, self.port, self.key = host, port, key
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> _Connection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()

    async def request(
        self, method: str, path: str, body: Any = None, on_chunk: Any = None
    ) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        data = json.dumps(body).encode() if body is not None else b""
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        status = int((await self.reader.readline()).split()[1])
        length = None
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
        if length is not None:
            return status, await self.reader.readexactly(length)
        parts = []
        while size := int((await self.reader.readline()).strip(), 16):
            chunk = await self.reader.readexactly(size)
            await self.reader.readline()
            if on_chunk is not None:
                on_chunk(chunk)
            parts.append(chunk)
        await self.reader.readline()
        return status, b"".join(parts)


async def _one_run(conn: _Connection) -> tuple[float, float, int]:
    """(client TTFB s, added TTFB s, events received) for one run, streamed to the end."""
    started = time.monotonic()
    _, created = await conn.request(
        "POST",
        "/v1/runs",
        {"prompt": "bench", "model": "fake:bench", "chain_of_thought": "surface"},
    )
    run_id = json.loads(created)["run_id"]
    _, ticket = await conn.request("POST", "/v1/tickets", {"run_id": run_id})
    first = {"client": -1.0, "added": -1.0}
    count = 0
    decoder = SSEDecoder()

    def on_chunk(chunk: bytes) -> None:
        nonlocal count
        now = time.monotonic()
        for message in decoder.feed(chunk):
            count += 1
            if first["client"] < 0 and '"reasoning.delta"' in message.data:
                emitted = float(json.loads(message.data)["payload"]["text"].split()[0][1:])
                first["client"], first["added"] = now - started, now - emitted

    path = f"/v1/runs/{run_id}/stream?ticket={json.loads(ticket)['ticket']}"
    status, _ = await conn.request("GET", path, on_chunk=on_chunk)
    assert status == 200, status
    return first["client"], first["added"], count


async def _phase(base_url: str, key: str, concurrency: int, total: int) -> dict[str, Any]:
    host, port = base_url.removeprefix("http://").split(":")
    conns = [await _Connection(host, int(port), key).open() for _ in range(concurrency)]
    try:
        for conn in conns[:3]:  # warm-up
            await _one_run(conn)
        remaining = [total]
        results: list[tuple[float, float, int]] = []

        async def worker(conn: _Connection) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                results.append(await _one_run(conn))

        started = time.monotonic()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.monotonic() - started
    finally:
        for conn in conns:
            await conn.close()
    return {
        "elapsed": elapsed,
        "client": sorted(r[0] for r in results),
        "added": sorted(r[1] for r in results),
        "events": sum(r[2] for r in results),
        "runs": len(results),
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def _result(
    name: str, value: float, unit: str, target: float | None, higher: bool
) -> dict[str, Any]:
    ok = None if target is None else (value >= target if higher else value <= target)
    return {"name": name, "value": round(value, 3), "unit": unit, "target": target, "ok": ok}


def _series(
    rows: list[dict[str, Any]], litellm: dict[int, dict[str, float]] | None
) -> list[dict[str, Any]]:
    """Plot rows for ``bench.run``: ours against LiteLLM's (measured, else reference) figures."""
    by_name = {r["name"]: r["value"] for r in rows}
    levels = sorted(LITELLM_TTFB_MS)
    how = "measured" if litellm else "reference"
    ll_ttfb = {c: litellm[c]["ttfb_p50"] if litellm else LITELLM_TTFB_MS[c] for c in levels}
    ll_rps = {c: litellm[c]["rps"] if litellm else LITELLM_RPS for c in levels}
    common = {"xlabel": "concurrent runs", "logx": True}
    return [
        {
            "series": "daemon-ttfb",
            "label": "thoughtgate added TTFB p50",
            "points": [[c, by_name[f"ttfb_added_p50_c{c}"]] for c in levels],
            "ylabel": "ms",
            "title": "Added time to first reasoning byte",
            "logy": True,
            **common,
        },
        {
            "series": "daemon-ttfb",
            "label": f"LiteLLM added TTFB p50 ({how})",
            "points": [[c, ll_ttfb[c]] for c in levels],
            "ylabel": "ms",
            **common,
        },
        {
            "series": "daemon-throughput",
            "label": "thoughtgate runs/s",
            "points": [[c, by_name[f"runs_per_s_c{c}"]] for c in levels],
            "ylabel": "streamed runs per second",
            "title": "Throughput",
            **common,
        },
        {
            "series": "daemon-throughput",
            "label": f"LiteLLM requests/s ({how})",
            "points": [[c, ll_rps[c]] for c in levels],
            "ylabel": "per second",
            **common,
        },
    ]


# ----------------------------------------------------------------------------- LiteLLM, live

LITELLM_SPEC = "litellm[proxy]==1.79.*"
LITELLM_VENV = REPO / "bench" / ".litellm-venv"
CHAT_BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "bench"}],
    "stream": True,
}


def _litellm_venv() -> Path | None:
    """The proxy's own venv (``bench/.litellm-venv``), created on first use; ``None`` if not."""
    stamp = LITELLM_VENV / ".installed"
    exe = LITELLM_VENV / "bin" / "litellm"
    if stamp.exists() and stamp.read_text().strip() == LITELLM_SPEC and exe.exists():
        return LITELLM_VENV
    print(f"litellm: creating {LITELLM_VENV.relative_to(REPO)} and installing {LITELLM_SPEC} …")
    started = time.monotonic()
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", "--clear", str(LITELLM_VENV)],
            check=True,
            timeout=120,
        )
        with (LITELLM_VENV / "pip.log").open("wb") as log:  # pip's warnings, off the console
            subprocess.run(
                [str(LITELLM_VENV / "bin" / "pip"), "install", "-q", LITELLM_SPEC],
                check=True,
                timeout=900,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        print(
            f"litellm: install failed ({exc}; see {LITELLM_VENV / 'pip.log'}); "
            "falling back to the reference figures"
        )
        return None
    stamp.write_text(LITELLM_SPEC + "\n")
    print(f"litellm: installed in {time.monotonic() - started:.0f} s")
    return LITELLM_VENV


def _emulate(port_file: Path) -> None:
    """The emulator process: one scenario like ``fake:bench`` (20 reasoning + 20 text deltas)."""
    import threading

    from thoughtgate.testing.emulator import (
        Emulator,
        EmulatorServer,
        Say,
        Scenario,
        ScriptedTurn,
        Sleep,
        Think,
    )

    chunk = 8
    thought = "".join(f"step {i:02d} " for i in range(DELTAS))  # 8 characters a delta
    answer = "".join(f"word{i:03d} " for i in range(DELTAS))
    turn = ScriptedTurn((Sleep(PROVIDER_TTFB_S), Think(thought), Say(answer)), chunk_chars=chunk)
    server = EmulatorServer(Emulator().add(Scenario("bench", (turn,)), default=True)).start()
    port_file.write_text(json.dumps({"url": server.url}))
    threading.Event().wait()  # until the bench terminates this process


def _start_litellm(venv: Path, emulator_url: str, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``litellm --config`` on loopback, one worker, no DB, telemetry or callbacks."""
    import socket

    config = tmp / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: bench\n"
        "    litellm_params:\n"
        "      model: openai/bench\n"
        f"      api_base: {emulator_url}/v1\n"
        "      api_key: dummy\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  callbacks: []\n"
        "  success_callback: []\n"
        "  failure_callback: []\n"
        "  set_verbose: false\n"
        "general_settings:\n"
        "  disable_spend_logs: true\n"
        "  disable_error_logs: true\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "LITELLM_"))}
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",  # no fetch of the cost map from GitHub
        LITELLM_TELEMETRY="False",
        LITELLM_LOG="ERROR",
        NO_DOCS="True",
        PYTHONPATH="",
    )
    log = (tmp / "litellm.log").open("wb")
    proc = subprocess.Popen(
        [
            *(str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1"),
            *("--port", str(port), "--num_workers", "1", "--telemetry", "False"),
        ],
        env=env,
        cwd=str(tmp),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(OSError, ValueError, IndexError):
            status, _ = asyncio.run(_get(url, "/health/liveliness"))
            if status == 200:
                return proc, url
        time.sleep(0.25)
    proc.terminate()
    tail = (tmp / "litellm.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"litellm proxy did not start:\n{tail}")


async def _get(url: str, path: str) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = await _Connection(host, int(port), "dummy").open()
    try:
        return await asyncio.wait_for(conn.request("GET", path), 5)
    finally:
        await conn.close()


async def _one_chat(conn: _Connection) -> tuple[float, int]:
    """(TTFB s to the first reasoning or text content, chunks) for one streamed completion."""
    started = time.monotonic()
    first = -1.0
    count = 0
    decoder = SSEDecoder()

    def on_chunk(chunk: bytes) -> None:
        nonlocal first, count
        now = time.monotonic()
        for message in decoder.feed(chunk):
            count += 1
            if first < 0 and message.data != "[DONE]":
                for choice in json.loads(message.data).get("choices") or ():
                    delta = choice.get("delta") or {}
                    if delta.get("reasoning_content") or delta.get("content"):
                        first = now - started
                        break

    status, _ = await conn.request("POST", "/v1/chat/completions", CHAT_BODY, on_chunk=on_chunk)
    assert status == 200 and first >= 0, (status, first)
    return first, count


async def _chat_phase(url: str, concurrency: int, total: int) -> dict[str, Any]:
    host, port = url.removeprefix("http://").split(":")
    conns = [await _Connection(host, int(port), "dummy").open() for _ in range(concurrency)]
    try:
        for conn in conns[:3]:  # warm-up
            await _one_chat(conn)
        remaining = [total]
        results: list[tuple[float, int]] = []

        async def worker(conn: _Connection) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                results.append(await _one_chat(conn))

        started = time.monotonic()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.monotonic() - started
    finally:
        for conn in conns:
            await conn.close()
    return {"elapsed": elapsed, "ttfb": sorted(r[0] for r in results), "runs": len(results)}


def _measure_litellm(levels: dict[int, int], tmp: Path) -> dict[int, dict[str, float]] | None:
    """LiteLLM's proxy against the emulator, per concurrency: added TTFB p50/p99 and requests/s.

    Added TTFB is the first content byte through the proxy minus the first byte straight from
    the emulator, at the same concurrency, in the same run.
    """
    venv = _litellm_venv()
    if venv is None:
        return None
    port_file = tmp / "emulator.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    emulator = subprocess.Popen(
        [sys.executable, "-m", "bench.daemon_bench", "--emulate", str(port_file)],
        env=env,
        cwd=str(REPO),
    )
    proxy = None
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        emulator_url = json.loads(port_file.read_text())["url"]
        print("litellm: starting the proxy against the emulator …")
        proxy, proxy_url = _start_litellm(venv, emulator_url, tmp)
        version = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "from importlib.metadata import version; print(version('litellm'), end='')",
            ],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        print(f"litellm: proxy {version or '1.79.x'} up at {proxy_url}")
        measured: dict[int, dict[str, float]] = {}
        for concurrency, total in levels.items():
            direct = asyncio.run(_chat_phase(emulator_url, concurrency, total))
            via = asyncio.run(_chat_phase(proxy_url, concurrency, total))
            measured[concurrency] = {
                "ttfb_p50": (_pct(via["ttfb"], 0.5) - _pct(direct["ttfb"], 0.5)) * 1000,
                "ttfb_p99": (_pct(via["ttfb"], 0.99) - _pct(direct["ttfb"], 0.99)) * 1000,
                "rps": via["runs"] / via["elapsed"],
                "direct_rps": direct["runs"] / direct["elapsed"],
            }
            print(f"litellm: c{concurrency} {measured[concurrency]}")
        return measured
    except (OSError, RuntimeError, AssertionError, ValueError) as exc:
        print(f"litellm: live measurement failed ({exc}); falling back to the reference figures")
        return None
    finally:
        for proc in (proxy, emulator):
            if proc is not None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=15)


def _litellm_note(measured: dict[int, dict[str, float]] | None, why: str) -> str:
    if measured:
        figures = ", ".join(
            f"c{c}: +{m['ttfb_p50']:.1f} ms p50 TTFB, {m['rps']:.0f} requests/s"
            for c, m in sorted(measured.items())
        )
        return (
            f"LiteLLM figures are measured live in the same run: its proxy ({LITELLM_SPEC}, own "
            "venv bench/.litellm-venv, one worker, no DB/telemetry/callbacks) in front of "
            "thoughtgate's emulator, added TTFB = first content byte via the proxy minus direct "
            f"from the emulator ({figures}). Targets derive from these. Server and client share "
            "the machine's cores."
        )
    return (
        f"LiteLLM figures are the issue's published reference (TTFB added ~10/66/960 ms at "
        f"1/10/100 streams, ~40 requests/s): no live proxy run ({why}). Server and client share "
        "the machine's cores."
    )


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs per level")
    parser.add_argument(
        "--flush-interval",
        type=float,
        default=None,
        help="what-if: the recorder's delta batching window in seconds (default: the shipped one)",
    )
    parser.add_argument(
        "--store",
        choices=("auto", "memory", "sqlite"),
        default="auto",
        help="auto: a SQLite file when thoughtgate.store.sqlite exists, else memory",
    )
    parser.add_argument(
        "--no-litellm",
        action="store_true",
        help="skip the live LiteLLM proxy run; compare with its published reference figures",
    )
    parser.add_argument("--serve", nargs=2, metavar=("PORT_FILE", "DB_URL"), help=argparse.SUPPRESS)
    parser.add_argument("--emulate", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args([] if argv is None else argv)
    if args.serve:
        _serve(Path(args.serve[0]), args.serve[1], args.flush_interval)
        return []
    if args.emulate:
        _emulate(Path(args.emulate))
        return []

    have_sqlite = importlib.util.find_spec("thoughtgate.store.sqlite") is not None
    durable = args.store == "sqlite" or (args.store == "auto" and have_sqlite)
    levels = {1: 20, 10: 100, 100: 300} if not args.quick else {1: 10, 10: 40, 100: 100}
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        db_url = f"sqlite:///{Path(tmp) / 'bench.db'}" if durable else "memory://"
        why = "asked for" if args.store != "auto" else "no SQLite store here"
        print(f"store: {'SQLite file (durable)' if durable else f'memory ({why})'}")
        litellm = None if args.no_litellm else _measure_litellm(levels, Path(tmp))
        why = "--no-litellm" if args.no_litellm else "the proxy could not be installed or run"
        NOTES[:] = [_litellm_note(litellm, why)]
        print(NOTES[0])
        if litellm:
            for concurrency, m in sorted(litellm.items()):
                tag = f"c{concurrency}"
                results += [
                    _result(f"litellm_ttfb_added_p50_{tag}", m["ttfb_p50"], "ms", None, False),
                    _result(f"litellm_ttfb_added_p99_{tag}", m["ttfb_p99"], "ms", None, False),
                    _result(f"litellm_requests_per_s_{tag}", m["rps"], "requests/s", None, True),
                    _result(
                        f"emulator_requests_per_s_{tag}", m["direct_rps"], "requests/s", None, True
                    ),
                ]
        port_file = Path(tmp) / "port.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.daemon_bench",
                "--serve",
                str(port_file),
                db_url,
                *(["--flush-interval", str(args.flush_interval)] if args.flush_interval else []),
            ],
            env=env,
            cwd=str(REPO),
        )
        try:
            deadline = time.monotonic() + 30
            while not port_file.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            info = json.loads(port_file.read_text())
            for concurrency, total in levels.items():
                cpu_before = _cpu_seconds(proc.pid)
                stats = asyncio.run(_phase(info["url"], info["key"], concurrency, total))
                cpu = _cpu_seconds(proc.pid) - cpu_before
                rps = stats["runs"] / stats["elapsed"]
                ll_ttfb = litellm[concurrency]["ttfb_p50"] if litellm else None
                ll_rps = litellm[concurrency]["rps"] if litellm else LITELLM_RPS
                ttfb_target = round((ll_ttfb or LITELLM_TTFB_MS[concurrency]) / 20, 3)
                tag = f"c{concurrency}"
                results += [
                    _result(
                        f"ttfb_added_p50_{tag}",
                        _pct(stats["added"], 0.5) * 1000,
                        "ms",
                        ttfb_target,
                        higher=False,
                    ),
                    _result(
                        f"ttfb_added_p99_{tag}",
                        _pct(stats["added"], 0.99) * 1000,
                        "ms",
                        None,
                        higher=False,
                    ),
                    _result(
                        f"ttfb_client_p50_{tag}",
                        _pct(stats["client"], 0.5) * 1000,
                        "ms",
                        None,
                        higher=False,
                    ),
                    _result(
                        f"ttfb_client_p99_{tag}",
                        _pct(stats["client"], 0.99) * 1000,
                        "ms",
                        None,
                        higher=False,
                    ),
                    _result(f"runs_per_s_{tag}", rps, "runs/s", round(ll_rps * 10, 1), higher=True),
                    _result(f"http_per_s_{tag}", rps * 3, "requests/s", None, higher=True),
                    _result(
                        f"cpu_per_event_{tag}",
                        cpu / max(1, stats["events"]) * 1e6,
                        "µs/event",
                        None,
                        higher=False,
                    ),
                ]
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
    results += _series(results, litellm)
    rows = [r for r in results if "series" not in r]
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        verdict = "" if r["ok"] is None else ("ok" if r["ok"] else "MISS")
        target = "" if r["target"] is None else f"target {r['target']:g}"
        print(f"{r['name']:<{width}}  {r['value']:>10.3f} {r['unit']:<11} {target:<16} {verdict}")
    source = "measured LiteLLM proxy figures above" if litellm else "LiteLLM's reference"
    print(
        f"targets: ≤ 1/20 of LiteLLM's added TTFB and ≥ 10× its requests/s ({source}; reference: "
        "~10/66/960 ms at 1/10/100 streams, ~40 requests/s)"
    )
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
