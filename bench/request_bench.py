"""CPU of one adapter request: open, a two-event body, close, one request at a time. Not a test.

An adapter's request (``HTTPTransport.open`` through the shared clients, httpx, httpcore and h11)
is a per-run cost the daemon bench cannot see apart from the rest of a run. This measures it
alone: ``BATCHES`` batches of ``PER_BATCH`` requests, each through a new ``HTTPTransport`` as a
run's adapter makes one, against a server that answers at once with a short chunked SSE body;
each batch's ``time.thread_time()`` per request, the median over the batches.

* on loopback (default): the server runs in a process of its own, so the figure is the client's
  CPU with its system calls and loop wake-ups;
* ``--memory``: no socket at all (the shared transport's network backend answers from memory),
  so the figure is the Python of the layers alone, with less noise.

``--src DIR`` (repeatable) measures another checkout's ``src`` in the same run, the processes
alternating ``--rounds`` times, so a change is compared with its base under the same load:
``python -m bench.request_bench --src /tmp/base/src --src src``. On a loaded machine compare
medians over several rounds; a few per cent is within one process's drift.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.emulator_process import stop
from bench.environment import LOOPBACK, REPO, child_env

BATCHES = 15
PER_BATCH = 40
ROUNDS = 3


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


_DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
_LAST = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"date: Wed, 02 Dec 2026 10:00:00 GMT\r\nserver: bench\r\nx-request-id: req_bench\r\n"
    b"transfer-encoding: chunked\r\n\r\n" + _chunk(_DELTA) + _chunk(_LAST) + b"0\r\n\r\n"
)
"""Every request's answer: a Chat Completions stream of two events, in two HTTP chunks."""
BODY = {
    "model": "bench",
    "stream": True,
    "messages": [{"role": "user", "content": "bench"}],
    "stream_options": {"include_usage": True},
}


class _Answering(asyncio.Protocol):
    """The loopback server: each complete request (head and ``Content-Length`` body) gets
    :data:`ANSWER` at once."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n")[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(ANSWER)


def serve() -> None:
    """The loopback server's process: prints its port, then answers until terminated."""

    async def main() -> None:
        listener = socket.socket()
        listener.bind((LOOPBACK, 0))
        listener.listen(128)
        server = await asyncio.get_running_loop().create_server(_Answering, sock=listener)
        print(listener.getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())


def memory_backend(answer: Callable[[], list[bytes]]) -> Any:
    """A network backend whose every connection answers each request with the reads
    ``answer()`` gives when the request is written, one a read, from memory (no socket, no loop
    wake-up)."""
    import httpcore

    class Stream(httpcore.AsyncNetworkStream):
        def __init__(self) -> None:
            self.unread: list[bytes] = []

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self.unread.pop() if self.unread else b""

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            if buffer and not self.unread:  # the request's first write: the answer is ready
                self.unread = answer()[::-1]

        async def aclose(self) -> None:
            return None

        def get_extra_info(self, info: str) -> Any:
            return False if info == "is_readable" else None

    class Backend(httpcore.AsyncNetworkBackend):
        async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
            return Stream()

        async def sleep(self, seconds: float) -> None:
            await asyncio.sleep(seconds)

    return Backend


async def _measure(base_url: str, memory: bool, batches: int, per_batch: int) -> list[float]:
    """Microseconds of this thread's CPU per request, one figure per batch."""
    from thoughtgate.providers import clients
    from thoughtgate.providers.base import ProviderSettings
    from thoughtgate.providers.http import HTTPTransport

    if memory:
        # every new pool connects in memory (patched where clients looks it up: not exported)
        clients.AsyncioBackend = memory_backend(lambda: [ANSWER])  # type: ignore[attr-defined]
    settings = ProviderSettings(base_url=base_url, api_key="bench", max_retries=0)
    headers = {"authorization": "Bearer bench", "content-type": "application/json"}

    async def one() -> None:
        transport = HTTPTransport("openai", base_url, headers, settings)
        async with transport.open("chat/completions", BODY, stream=True) as response:
            async for _ in transport.event_batches(response):
                pass

    figures = []
    async with clients.shared_clients().lease():
        for _ in range(per_batch * 2):  # warm: the connection, imports, caches
            await one()
        for _ in range(batches):
            began = time.thread_time()
            for _ in range(per_batch):
                await one()
            figures.append((time.thread_time() - began) / per_batch * 1e6)
    return figures


def consumer(base_url: str, memory: bool, batches: int, per_batch: int) -> list[float]:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - the daemon's loop where installed, as it runs
        return asyncio.run(_measure(base_url, memory, batches, per_batch))
    return uvloop.run(_measure(base_url, memory, batches, per_batch))


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], help="a checkout's src directory")
    parser.add_argument("--memory", action="store_true", help="no socket: the layers alone")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--batches", type=int, default=BATCHES)
    parser.add_argument("--per-batch", type=int, default=PER_BATCH)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--consume", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return {}
    if args.consume:
        print(json.dumps(consumer(args.consume, args.memory, args.batches, args.per_batch)))
        return {}
    sources = [str(Path(s).resolve()) for s in args.src] or [str(REPO / "src")]
    figures: dict[str, list[float]] = {s: [] for s in sources}
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.request_bench", "--serve"],
        cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = f"http://{LOOPBACK}:{int(server.stdout.readline())}/v1"
        for _ in range(args.rounds):
            for src in sources:
                env = child_env(src)
                command = [sys.executable, "-m", "bench.request_bench", "--consume", url]
                command += ["--batches", str(args.batches), "--per-batch", str(args.per_batch)]
                out = subprocess.run(
                    [*command, *(["--memory"] if args.memory else [])],
                    env=env,
                    cwd=str(REPO),
                    capture_output=True,
                    text=True,
                )
                if out.returncode:
                    raise SystemExit(f"consumer on {src} failed:\n{out.stderr}")
                figures[src] += json.loads(out.stdout)
    finally:
        stop(server)
    medians = {src: statistics.median(values) for src, values in figures.items()}
    first = medians[sources[0]]
    where = "in memory" if args.memory else "on loopback"
    for src, value in medians.items():
        low, high = min(figures[src]), max(figures[src])
        print(
            f"{src}: {value:7.1f} µs per request {where} (batches {low:.0f}-{high:.0f}), "
            f"{value / first:4.2f}x the first"
        )
    return medians


if __name__ == "__main__":
    main()
