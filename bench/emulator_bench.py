"""The bench emulator alone: its CPU per request and requests/s, per wire format. Not a test.

Run ``PYTHONPATH=src python -m bench.emulator_bench`` (``--levels 1=40,10=200,100=600``,
``--formats anthropic,chat``; ``BENCH_EMULATOR=asgi`` for the ASGI emulator under uvicorn
instead of the lean server, ADR 0133; ``--repo DIR`` to run another checkout's emulator, for an
A/B against a base worktree). The emulator process (:mod:`bench.emulator_process`) serves the
``bench`` scenario; this client sends each real adapter's own request body (the daemon's, as
``daemon_bench``'s runs send them) with the minimal keep-alive client of ``daemon_bench``,
``concurrency`` connections each making requests in turn, and reads every stream to its end.

Per format and concurrency: ``requests_per_s`` (completed streams a second, what
``daemon_bench``'s ``emulator_requests_per_s_c*`` counts for Chat Completions), ``cpu_us``: the
emulator process's CPU per request (every thread's run time from ``/proc/<pid>/task/*/schedstat``,
in ns, around the timed requests only), and ``stream_ms_p50``: from request to the stream's end,
which the pace (``PROVIDER_TTFB_S`` and a ``GAP_S`` a write) sets when the emulator keeps up.
The client shares the cores, so ``requests_per_s`` at 100 says as much about it as about the
emulator; ``cpu_us`` is the emulator's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.daemon_bench import _Connection, _warm_up
from bench.emulator_process import emulator_process
from bench.environment import REPO

_CHAT = {
    "model": "deepseek-reasoner",
    "messages": [{"role": "user", "content": "bench"}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 4096,
}
#: format -> (path, extra request headers, the adapter's request body)
REQUESTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "anthropic": (
        "/v1/messages",
        "anthropic-version: 2023-06-01\r\n",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 8192,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "bench"}]}],
            "thinking": {"type": "enabled", "budget_tokens": 4096},
            "stream": True,
        },
    ),
    "chat": ("/v1/chat/completions", "", _CHAT),
    "openrouter": (
        "/v1/chat/completions",
        "",
        {**_CHAT, "model": "qwen/qwen3-235b-a22b-thinking-2507", "reasoning": {"enabled": True}},
    ),
    "responses": (
        "/v1/responses",
        "",
        {
            "model": "gpt-5",
            "input": [{"role": "user", "content": "bench"}],
            "stream": True,
            "store": False,
            "max_output_tokens": 4096,
            "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"],
        },
    ),
}
LEVELS = {1: 40, 10: 200, 100: 600}


def cpu_ns(pid: int) -> int:
    """Every thread's run time so far (ns): finer than ``/proc/<pid>/stat``'s 10 ms ticks."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total


async def _one(conn: _Connection, fmt: str) -> float:
    path, headers, body = REQUESTS[fmt]
    started = time.monotonic()
    status, data = await conn.request("POST", path, body, headers=headers)
    assert status == 200 and len(data) > 1000, (status, data[:300])
    return time.monotonic() - started


async def phase(url: str, pid: int, fmt: str, concurrency: int, total: int) -> dict[str, float]:
    host, port = url.removeprefix("http://").split(":")
    conns = [await _Connection(host, int(port), "bench").open() for _ in range(concurrency)]
    try:
        await _warm_up(conns, lambda c: _one(c, fmt))
        remaining = [total]
        streams: list[float] = []

        async def worker(conn: _Connection) -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                streams.append(await _one(conn, fmt))

        cpu = cpu_ns(pid)
        started = time.monotonic()
        await asyncio.gather(*(worker(c) for c in conns))
        elapsed = time.monotonic() - started
        cpu = cpu_ns(pid) - cpu
    finally:
        for conn in conns:
            await conn.close()
    return {
        "requests_per_s": total / elapsed,
        "cpu_us": cpu / total / 1000,
        "stream_ms_p50": statistics.median(streams) * 1000,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default=",".join(REQUESTS))
    parser.add_argument(
        "--levels", default=",".join(f"{c}={n}" for c, n in LEVELS.items()), help="c=N,..."
    )
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose emulator runs")
    parser.add_argument("--json", action="store_true", help="print the rows as one JSON line")
    args = parser.parse_args(argv)
    levels = {int(c): int(n) for c, n in (p.split("=") for p in args.levels.split(","))}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, emulator_process(Path(tmp), args.repo) as url:
        pid = int(json.loads((Path(tmp) / "emulator.json").read_text())["pid"])
        for fmt in args.formats.split(","):
            for concurrency, total in levels.items():
                figures = asyncio.run(phase(url, pid, fmt, concurrency, total))
                rows.append({"format": fmt, "concurrency": concurrency, **figures})
                if not args.json:
                    print(
                        f"{fmt:10} c{concurrency:<3} {figures['requests_per_s']:7.1f} requests/s"
                        f"  cpu {figures['cpu_us']:7.0f} µs/request"
                        f"  stream p50 {figures['stream_ms_p50']:5.1f} ms",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
