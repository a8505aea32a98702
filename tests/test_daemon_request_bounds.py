"""A request cannot hold the daemon's memory or a connection without bound (ADR 0147).

A request head longer than ``server.max_header_bytes`` is answered ``431`` and its connection
closed. A body larger than what uvicorn holds anyway (64 KiB), or of no declared length, is read only for
a valid API key: anyone else is answered ``401`` at once, the body unread, and the connection
stays usable. A body that stops arriving gets ``server.body_timeout_s`` after the head's deadline,
then ``408`` and the connection is closed. Against the daemon's app served on loopback with the
connection guard ``thoughtgate serve`` uses.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from support.daemon import ThreadServer, auth, seed_keys, server_tools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from thoughtgate.config import Config
from thoughtgate.server.app import create_app
from thoughtgate.server.connections import ConnectionLimits, guarded_protocol
from thoughtgate.store.memory import MemoryStore

pytestmark = [pytest.mark.inprocess, pytest.mark.timeout(60)]

DEADLINE_S = 0.2
"""The head's and the body's deadline: short, since the tests wait them out."""


@pytest.fixture(scope="module")
def daemon() -> Iterator[tuple[tuple[str, int], dict[str, str]]]:
    store = MemoryStore()
    keys = seed_keys(store)
    config = Config.from_mapping(
        {"server": {"header_timeout_s": DEADLINE_S, "body_timeout_s": DEADLINE_S}}
    )
    app = create_app(store, config, tools=server_tools(), shutdown_grace_s=0.1)
    limits = ConnectionLimits(100, DEADLINE_S, DEADLINE_S)
    with ThreadServer(app, http=guarded_protocol(HttpToolsProtocol, limits)) as server:
        host, port = server.base_url.removeprefix("http://").split(":")
        yield (host, int(port)), keys


def head(path: str, length: int, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(sock: socket.socket) -> tuple[str, dict[str, str], Any]:
    """One response: its status line, headers (lower-case names) and JSON body. A server that
    answers nothing fails the test at the socket's timeout (it would have waited for ever)."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, f"closed without an answer: {data!r}"
        data += more
    top, _, rest = data.partition(b"\r\n\r\n")
    status, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        more = sock.recv(65536)
        assert more, "closed mid-answer"
        rest += more
    return status, headers, json.loads(rest[:length]) if length else None


def closed(sock: socket.socket) -> bool:
    with contextlib.suppress(ConnectionResetError):
        return sock.recv(65536) == b""
    return True


def connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=20)


def test_a_large_body_without_a_valid_key_is_refused_unread(
    daemon: tuple[tuple[str, int], dict[str, str]],
) -> None:
    """The attack: 300 connections each sending 990 KB of a 1 MB body and no key made the
    daemon hold 290 MB, until the client chose to finish. Now the answer comes before the body
    is complete, and the connection serves the next request once the body has been sent."""
    address, _ = daemon
    for headers in ({}, auth("tg_not_a_key")):
        with connect(address) as sock:
            sock.sendall(head("/v1/runs", 900_000, headers) + b"x" * 100_000)
            status, _, body = answer(sock)
            assert status.startswith("HTTP/1.1 401") and body["error"]["code"] == "unauthorized"
            sock.sendall(b"x" * 800_000)  # the rest of it: read past, not kept
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert answer(sock)[0].startswith("HTTP/1.1 200")


def test_a_large_body_with_a_valid_key_is_read_and_the_role_still_checked(
    daemon: tuple[tuple[str, int], dict[str, str]],
) -> None:
    """The key the body's reader checked is the route's: a member starts a run with a prompt
    of 150 KB; a viewer's key, valid but below the route's role, is refused as before."""
    address, keys = daemon
    body = json.dumps({"prompt": "p" * 150_000, "model": "fake:echo"}).encode()
    for role, expected in (("member", "HTTP/1.1 202"), ("viewer", "HTTP/1.1 403")):
        with connect(address) as sock:
            sock.sendall(head("/v1/runs", len(body), auth(keys[role])) + body)
            status, _, _ = answer(sock)
            assert status.startswith(expected), (role, status)


@pytest.mark.parametrize("declared", [100, 900_000])
def test_a_body_that_stops_arriving_is_answered_408_and_its_connection_closed(
    daemon: tuple[tuple[str, int], dict[str, str]], declared: int
) -> None:
    """The attack: a valid key, a head, then the body a byte now and then (here: never). The
    connection was held for as long as the client liked, the bytes read of it kept."""
    address, keys = daemon
    with connect(address) as sock:
        sock.sendall(head("/v1/runs", declared, auth(keys["member"])) + b'{"prompt": ')
        status, headers, body = answer(sock)
        assert status.startswith("HTTP/1.1 408")
        assert headers["connection"] == "close"
        assert body["error"]["code"] == "request_timeout"
        assert "server.body_timeout_s" in body["error"]["message"]
        assert closed(sock)


def test_a_head_longer_than_the_limit_is_answered_431_and_its_connection_closed(
    daemon: tuple[tuple[str, int], dict[str, str]],
) -> None:
    """The attack: header lines, as fast as loopback takes them, never the blank line that ends
    them. uvicorn's httptools protocol kept every one: 1.9 GB within the head's deadline, from
    one connection without a key."""
    address, _ = daemon
    with connect(address) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.sendall(b"".join(b"X-Pad-%d: %b\r\n" % (i, b"p" * 1000) for i in range(100)))
        status, headers, body = answer(sock)
        assert status.startswith("HTTP/1.1 431") and headers["connection"] == "close"
        assert body["error"]["code"] == "header_too_large"
        assert "server.max_header_bytes" in body["error"]["message"]
        assert closed(sock)


def test_a_head_within_the_limit_is_served(
    daemon: tuple[tuple[str, int], dict[str, str]],
) -> None:
    """60 KB of headers, below the 64 KiB default, on a connection that sent a request and a
    body before: the count is per head."""
    address, keys = daemon
    pad = b"".join(b"X-Pad-%d: %b\r\n" % (i, b"p" * 1000) for i in range(60))
    with connect(address) as sock:
        body = b'{"run_id": "none"}'
        sock.sendall(head("/v1/tickets", len(body), auth(keys["member"])) + body)
        assert answer(sock)[0].startswith("HTTP/1.1 404")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + pad + b"\r\n")
        assert answer(sock)[0].startswith("HTTP/1.1 200")
