"""Connections a client opens and never uses cannot make ``thoughtgate serve`` unreachable: a
request head must arrive within ``server.header_timeout_s``, an idle keep-alive connection closes
after ``server.idle_timeout_s``, and at ``server.max_connections`` (kept below the open-file
limit) the oldest connection that is not in a request makes room, or a newcomer gets a 503."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.daemon import ServeProcess, auth

pytestmark = pytest.mark.timeout(120)


def write_config(folder: Path, **server: object) -> Path:
    path = folder / "thoughtgate.toml"
    lines = ["[server]", *(f"{k} = {v!r}" for k, v in server.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def serving(*args: str, open_files: int | None = None) -> Iterator[ServeProcess]:
    server = ServeProcess("--db", "memory://", *args, open_files=open_files).start(expect_key=True)
    try:
        yield server
    finally:
        server.stop()


def address(server: ServeProcess) -> tuple[str, int]:
    host, port = server.base_url.removeprefix("http://").split(":")
    return host, int(port)


def half_open(server: ServeProcess, count: int) -> list[socket.socket]:
    """Connections that never send a byte (the kernel completes them; the daemon must cope)."""
    return [socket.create_connection(address(server), timeout=10) for _ in range(count)]


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` seconds (what it sends is skipped)."""
    deadline = time.monotonic() + within
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if sock.recv(65536) == b"":
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return False


def test_half_open_connections_do_not_lock_out_honest_clients() -> None:
    """The attack: 1,100 connections that never send a request, against a daemon whose open-file
    limit is 1,024, made it unreachable (every descriptor held, accept failing forever)."""
    with serving(open_files=1024) as server:
        flood = half_open(server, 1100)
        try:
            started = time.monotonic()
            with httpx.Client(base_url=server.base_url, timeout=20) as honest:
                me = honest.get("/v1/me", headers=auth(str(server.bootstrap_key)))
            assert me.status_code == 200 and me.json()["role"] == "owner"
            assert time.monotonic() - started < 10
        finally:
            for sock in flood:
                sock.close()
        assert server.proc is not None and server.proc.poll() is None  # still serving
        with httpx.Client(base_url=server.base_url, timeout=10) as later:
            assert later.get("/healthz").status_code == 200


def test_a_request_head_must_arrive_within_the_header_timeout(tmp_path: Path) -> None:
    config = write_config(tmp_path, header_timeout_s=1.0, idle_timeout_s=30)
    with serving("--config", str(config)) as server:
        silent = socket.create_connection(address(server))
        trickle = socket.create_connection(address(server))
        started = time.monotonic()
        trickle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        for i in range(20):  # one header line every 0.2 s, never the blank line that ends them
            try:
                trickle.sendall(f"X-Slow-{i}: y\r\n".encode())
            except OSError:
                closed = True
                break
            if closed_by_server(trickle, 0.2):
                closed = True
                break
        assert closed and time.monotonic() - started < 3.0
        assert closed_by_server(silent, 2.0)
        silent.close()
        trickle.close()


def test_an_idle_keep_alive_connection_closes_after_the_idle_timeout(tmp_path: Path) -> None:
    config = write_config(tmp_path, header_timeout_s=30.0, idle_timeout_s=1)
    with serving("--config", str(config)) as server:
        sock = socket.create_connection(address(server))
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert closed_by_server(sock, 4.0)
        assert 0.5 < time.monotonic() - started < 3.0
        sock.close()


def test_at_the_connection_limit_idle_ones_make_room_and_busy_ones_are_kept(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, max_connections=8, header_timeout_s=60.0)
    with serving("--config", str(config), "--tools", "support.served:SERVER_TOOLS") as server:
        key = str(server.bootstrap_key)
        with httpx.Client(base_url=server.base_url, headers=auth(key), timeout=10) as c:
            made = c.post("/v1/runs", json={"prompt": "slow", "model": "fake:slow"})
            run_id = made.json()["run_id"]
            ticket = c.post("/v1/tickets", json={"run_id": run_id}).json()["ticket"]
        idle = half_open(server, 8)
        # a request still gets through: the oldest idle connection made room
        with httpx.Client(base_url=server.base_url, timeout=10) as honest:
            assert honest.get("/healthz").status_code == 200
        assert closed_by_server(idle[0], 2.0)
        for sock in idle:
            sock.close()
        # connections busy in a request (live streams, here) are never dropped to make room
        streams = []
        for _ in range(8):
            sock = socket.create_connection(address(server), timeout=10)
            sock.sendall(
                f"GET /v1/runs/{run_id}/stream?ticket={ticket} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
            )
            assert sock.recv(12) == b"HTTP/1.1 200"  # the stream is open: a request in progress
            streams.append(sock)
        with httpx.Client(base_url=server.base_url, timeout=10) as extra:
            refused = extra.get("/healthz")
        assert refused.status_code == 503
        assert "too many connections" in refused.json()["error"]["message"]
        for sock in streams:
            sock.close()
