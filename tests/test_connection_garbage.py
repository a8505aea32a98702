"""A live SSE reader that connects and leaves is freed by reference counting: its connection, its
request's objects and the stream's coroutines and closures form no reference cycle (ADR 0166).

Why it matters: a thousand readers of a run connecting or leaving at once are ~200,000 objects.
Freed by reference counting, they go as each reader leaves; left in cycles, they would wait for
a collector pass to find them, and the daemon's thresholds (a middle pass every 100 young ones,
``server.gc_policy``) hold back such garbage the longer, while every pass that walks it stops
every stream. The test turns the collector off while readers connect and leave a real daemon on
loopback, then has one pass keep (``DEBUG_SAVEALL``) what it finds: none of it is the server's.
"""

from __future__ import annotations

import contextlib
import gc
import socket
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from support.daemon import Daemon, running_daemon

from thoughtgate.config import Config

pytestmark = pytest.mark.inprocess

READERS = 20
SERVER_MODULES = ("thoughtgate.", "uvicorn.", "starlette.", "httptools", "h11")


def _module(o: object) -> str:
    """The module of an object's class, or for code (functions, methods, coroutines, async
    generators) of the code itself: the server's closures are ``builtins.function``."""
    if isinstance(o, types.MethodType):
        o = o.__func__
    if isinstance(o, types.CoroutineType):
        return str(o.cr_frame.f_globals.get("__name__", "")) if o.cr_frame else ""
    if isinstance(o, types.AsyncGeneratorType):
        return str(o.ag_frame.f_globals.get("__name__", "")) if o.ag_frame else ""
    if isinstance(o, types.FunctionType):
        return str(o.__module__)
    return type(o).__module__


def _server_garbage(garbage: list[object]) -> list[str]:
    """What of ``garbage`` belongs to the server's code (its classes, and its code's frames)."""
    return sorted(
        f"{type(o).__qualname__} {getattr(o, '__qualname__', '')}".strip()
        for o in garbage
        if _module(o).startswith(SERVER_MODULES)
    )


@contextlib.contextmanager
def _what_a_pass_would_free() -> Iterator[list[object]]:
    """The collector off in the block; after it, what one pass finds (kept, not freed)."""
    gc.collect()  # what earlier tests left is not counted
    was = gc.isenabled()
    gc.disable()
    found: list[object] = []
    try:
        yield found
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()


def _wait_until(check: object, timeout: float = 30) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the daemon did not settle"
        time.sleep(0.02)


def _open_reader(daemon: Daemon, run_id: str, ticket: str) -> socket.socket:
    host, port = daemon.base_url.removeprefix("http://").split(":")
    reader = socket.create_connection((host, int(port)), timeout=10)
    reader.sendall(
        f"GET /v1/runs/{run_id}/stream?ticket={ticket} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    )
    head = b""
    while b"id: 1\r\n" not in head:  # the head, and the run's first event: the stream is live
        chunk = reader.recv(65536)
        assert chunk, "the daemon closed the stream"
        head += chunk
    assert head.startswith(b"HTTP/1.1 200")
    return reader


@contextlib.contextmanager
def _quiet_run() -> Iterator[tuple[Daemon, str, str, Callable[[], bool]]]:
    """A daemon, a live run that says nothing for 30 s, a viewer's ticket to it (one reader has
    connected and left: first-use caches are no reader's), and whether no stream or connection
    is open."""
    config = Config.from_mapping({"server": {"keepalive_s": 30}})
    with running_daemon(config=config, shutdown_grace_s=0.1) as daemon:
        state = daemon.app.state.thoughtgate
        connections = daemon.server.server_state.connections
        run_id = daemon.start_run({"prompt": "slow", "model": "fake:slow"})
        ticket = daemon.ticket(run_id, "viewer")

        def settled() -> bool:
            return len(state.streams) == 0 and not connections

        _open_reader(daemon, run_id, ticket).close()
        _wait_until(settled)
        yield daemon, run_id, ticket, settled


def test_readers_that_connect_to_a_live_run_and_leave_leave_no_cycle_behind() -> None:
    with _quiet_run() as (daemon, run_id, ticket, settled):
        state = daemon.app.state.thoughtgate
        with _what_a_pass_would_free() as garbage:
            readers: list[socket.socket] = []
            try:
                readers += (_open_reader(daemon, run_id, ticket) for _ in range(READERS))
                assert len(state.streams) >= READERS  # all of them live at once
            finally:
                for reader in readers:
                    reader.close()
            _wait_until(settled)
        assert _server_garbage(garbage) == []


def _own(objects: list[object]) -> Counter[str]:
    """The daemon's own objects among ``objects`` (its classes' instances and its code's
    functions, methods, coroutines and generators), by kind and name."""
    return Counter(
        f"{type(o).__qualname__} {getattr(o, '__qualname__', '')}".strip()
        for o in objects
        if str(_module(o)).startswith("thoughtgate.")
    )


def test_a_connected_reader_holds_no_closure_of_the_daemons_code() -> None:
    """Every object a connected reader holds is walked by each collector pass that finds it in
    its generation; a thousand readers connecting at once made those passes 33-56 ms long. The
    stream's callbacks (the feed's sink, the ticker's, the access watch's, the response's end)
    are methods of one object each, not closures with a cell per variable (ADR 0171)."""
    with _quiet_run() as (daemon, run_id, ticket, settled):
        state = daemon.app.state.thoughtgate
        gc.collect()
        before = _own(gc.get_objects())
        readers: list[socket.socket] = []
        try:
            readers += (_open_reader(daemon, run_id, ticket) for _ in range(READERS))
            assert len(state.streams) >= READERS  # all of them live at once
            held = _own(gc.get_objects()) - before
        finally:
            for reader in readers:
                reader.close()
        _wait_until(settled)
    # (A closure or two per run, its feed's, is not a reader's.)
    closures = {n: k for n, k in held.items() if n.startswith("function ") and k >= READERS}
    assert closures == {}  # before ADR 0171: 15 a reader (live_frames' 4, the response's 4, ...)
    # 37 a reader: its connection's and request's objects, the stream's and the coroutines of
    # its request's layers of middleware that are the daemon's own
    assert sum(held.values()) <= 40 * READERS
