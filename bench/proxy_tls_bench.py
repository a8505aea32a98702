"""CPU of a new connection through an ``https://`` proxy. Not a test.

Each request goes through ``HTTP_PROXY=https://127.0.0.1:PORT`` (TLS to the proxy) and the proxy
answers it with ``connection: close``, so every request opens a new TLS connection to the proxy:
the cost a run pays when it opens a connection through an ``https://`` proxy (ADR 0107). The proxy
runs in a process of its own (its certificate made with ``openssl``, trusted through
``SSL_CERT_FILE``); the figure is the client process's ``time.process_time()`` per connection,
the median over ``--batches`` batches of ``--connections``.

``--src DIR`` (repeatable) measures another checkout's ``src``; the processes alternate
``--rounds`` times under the same load:
``python -m bench.proxy_tls_bench --src /tmp/base/src --src src``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
    b"content-length: 11\r\n\r\ndata: one\n\n"
)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(ANSWER)
        await writer.drain()
    writer.close()


async def _serve(folder: Path) -> None:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    server = await asyncio.start_server(_answer, "127.0.0.1", 0, ssl=tls)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def _certificate(folder: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-subj", "/CN=thoughtgate bench", "-addext", "subjectAltName=IP:127.0.0.1",
         "-days", "1", "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip


async def _measure(connections: int, batches: int) -> float:
    from thoughtgate.providers.clients import ProviderClients

    clients = ProviderClients()
    url = "http://provider.invalid/v1/messages"
    per_batch: list[float] = []
    async with clients.lease():
        client = clients.client(url)
        for batch in range(batches + 1):
            start = time.process_time()
            for _ in range(connections):
                response = await client.get(url)
                await response.aread()
                assert response.status_code == 200
            if batch:  # the first warms up
                per_batch.append((time.process_time() - start) / connections)
    return statistics.median(per_batch)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--src", action="append", default=[])
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(Path(args.serve)))
        return
    if args.child:
        print(json.dumps(asyncio.run(_measure(args.connections, args.batches))))
        return
    with tempfile.TemporaryDirectory() as folder:
        _certificate(Path(folder))
        server = subprocess.Popen(
            [sys.executable, "-m", "bench.proxy_tls_bench", "--serve", folder],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
            env |= {"HTTP_PROXY": f"https://127.0.0.1:{port}"}
            env |= {"SSL_CERT_FILE": str(Path(folder) / "cert.pem")}
            results: dict[str, list[float]] = {src: [] for src in args.src or ["src"]}
            for _ in range(args.rounds):
                for src in results:
                    child = subprocess.run(
                        [sys.executable, "-m", "bench.proxy_tls_bench", "--child",
                         "--connections", str(args.connections), "--batches", str(args.batches)],
                        env=env | {"PYTHONPATH": f"{src}:."}, check=True, capture_output=True,
                        text=True,
                    )  # fmt: skip
                    results[src].append(json.loads(child.stdout))
            for src, figures in results.items():
                shown = " ".join(f"{f * 1000:.2f}" for f in figures)
                print(f"{src}: ms CPU per new proxied connection, by round: {shown}")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
