"""The provider emulator the daemon bench talks to over HTTP, in a process of its own.

One scenario, ``bench``, like ``fake:bench``: after ``PROVIDER_TTFB_S`` the model thinks in
``DELTAS`` reasoning deltas of 8 characters, then answers in ``DELTAS`` text deltas, in whichever
of the four wire formats the request asks for. Like a real provider (and like ``fake:bench``), it
paces its stream, so each delta reaches the client in its own read instead of all of them in one
buffer.

What is paced is the deltas, as a model's tokens are, and nothing else (ADR 0150): a format's
framing events (Anthropic's ``content_block_stop`` / ``content_block_start``, ``message_delta``
and ``message_stop``; Responses' ``.done`` and ``.added`` events and ``response.completed``;
the Chat formats' finish and usage chunks and ``[DONE]``) have no slot of their own.
:func:`paced_writes` says which write each goes out in: those before the first delta with the
response head, as before; those between two deltas with the later one (a provider knows a
part has ended when the next part's first token comes); those after the last delta with it.
So every format's stream has the same ``2 × DELTAS`` paced writes, each holding one delta, on
the same schedule, and lasts as long (until ADR 0150 each framing event took a slot: the
formats' last writes were due 52-58 ms after the request, so a format's runs/s and the daemon's
load differed with its count of framing events, ADR 0139).

It stands in for a remote provider, whose CPU is not the daemon's machine's, so it serves from a
lean HTTP/1.1 server (:mod:`bench.lean_emulator`, ADR 0133) that writes
:mod:`thoughtgate.testing.emulator`'s answers byte for byte, each distinct request rendered once
through that emulator's ASGI application; ``BENCH_EMULATOR=asgi`` serves that application through
uvicorn and :func:`_paced` instead, as before (2.5-5x the CPU a request at 10 and 100 streams).

The pace is an absolute schedule (:class:`Pace`): counted from the request's arrival, the first
delta is due after ``PROVIDER_TTFB_S`` and the k-th after ``PROVIDER_TTFB_S + k × GAP_S``; a
write that is late (the machine was busy) goes out as soon as it can and the next one keeps its
own slot, none is skipped. A remote provider's clock does not slow down when the proxy in front
of it is busy; relative sleeps would (each one overshoots under load, and the overshoots add up,
so the provider would seem to slow down with our own load and hide our per-run cost).

Under ``daemon_bench --trace`` (``BENCH_TRACE``) each request's schedule is written down too: when
the app got the request (``e_start``, the schedule's start), when its first delta was due, when
the write holding it returned (``e_first_written``: the stamp's bytes are in the kernel), its
last write before the terminal event, the terminal event's write and the body's end (see
:func:`trace_write`).

The first reasoning delta carries the time it was sent: the scenario's thought starts with the
placeholder ``STAMP``, which the pacing layer replaces in the first body write that holds it with
:func:`stamp` (``T`` and ``time.monotonic()`` modulo 100 s, 8 characters like the placeholder;
CLOCK_MONOTONIC is system-wide, so the bench client reads it directly). :func:`added_s` turns a
stamp and a receive time back into seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.atomic import write_json
from bench.emulator_pace import (
    ANSWER,
    CHUNK_CHARS,
    GAP_S,
    PROVIDER_TTFB_S,
    STAMP,
    TERMINAL,
    THOUGHT,
    Pace,
    holds_delta,
    stamp,
    trace_write,
)
from bench.environment import LOOPBACK, REPO, child_env, free_port

__all__ = ["ASGI", "bench_emulator", "emulator_process", "serve", "stop"]


def _paced(app: Any) -> Any:
    """ASGI wrapper: the body messages from the first delta's (the one holding ``STAMP``) on go
    out in :func:`paced_writes`' writes, each on its slot of the request's :class:`Pace` (a
    framing message is held until the next delta's slot, or sent with the body's end); that
    ``STAMP`` becomes the send time."""
    placeholder = STAMP.encode()

    async def paced(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        pace = Pace(PROVIDER_TTFB_S, GAP_S)
        started = stamped = False
        held: list[Any] = []  # framing since the last delta: out with the next one
        traced: dict[str, Any] | None = {"e_start": time.monotonic()} if _TRACE else None

        async def send_paced(message: Any) -> None:
            nonlocal started, stamped
            body = message.get("body", b"") if message["type"] == "http.response.body" else None
            started = started or bool(body and placeholder in body)
            if not started:  # the head and the framing before the first delta: at once
                await send(message)
                return
            assert body is not None  # the head came before the stamped body
            ends = not message.get("more_body", False)
            if stamped and not holds_delta(body) and not ends:
                held.append(message)
                return
            if not stamped or holds_delta(body):  # a delta: its slot
                due = pace.due
                await pace.next()
            if not stamped:
                stamped = True
                # every copy in this write (OpenRouter mirrors reasoning in two fields)
                sent = stamp()
                message = {**message, "body": body.replace(placeholder, sent.encode())}
                if traced is not None:
                    traced.update(key=sent[1:], e_due_first=due)
            write = [*held, message]
            held.clear()
            if traced is not None:
                now = time.monotonic()
                traced["e_last_write"] = now
                if any(t in m.get("body", b"") for m in write for t in TERMINAL):
                    traced.setdefault("e_terminal", now)
                else:
                    traced["e_last_nonterminal"] = now
            for each in write:  # back to back: one slot
                await send(each)
            if traced is not None:
                traced.setdefault("e_first_written", time.monotonic())
                if ends:
                    traced["e_end"] = time.monotonic()
                    trace_write(traced, _TRACE)

        await app(scope, receive, send_paced)

    return paced


_TRACE = os.environ.get("BENCH_TRACE")
"""``daemon_bench --trace DIR``: where :func:`trace_write` puts this server's pacing stamps."""


ASGI = "asgi"
"""``BENCH_EMULATOR=asgi``: serve the ASGI emulator through uvicorn and :func:`_paced`, as before
ADR 0133 (what the lean server's answers are checked against; an A/B of the two servers)."""


def bench_emulator() -> Any:
    """The ASGI emulator with the ``bench`` scenario (the default for any model)."""
    from thoughtgate.testing.emulator import Emulator, Say, Scenario, ScriptedTurn, Think

    # paced by the server (:func:`paced_writes`), not by the scenario
    turn = ScriptedTurn((Think(THOUGHT), Say(ANSWER)), chunk_chars=CHUNK_CHARS)
    return Emulator().add(Scenario("bench", (turn,)), default=True)


def serve(port_file: Path) -> None:
    """The emulator process: the ``bench`` scenario, paced, on a free loopback port; by the lean
    server (:mod:`bench.lean_emulator`, ADR 0133) unless ``BENCH_EMULATOR=asgi``."""
    emulator = bench_emulator()
    if os.environ.get("BENCH_EMULATOR") != ASGI:
        from bench.lean_emulator import serve_forever

        def ready(port: int) -> None:
            write_json(port_file, {"url": f"http://{LOOPBACK}:{port}", "pid": os.getpid()})

        serve_forever(emulator, LOOPBACK, ready)
        return
    import uvicorn

    port = free_port()
    config = uvicorn.Config(
        _paced(emulator.app),
        host=LOOPBACK,
        port=port,
        log_level="warning",
        lifespan="off",
        loop="asyncio",  # the server's loop too: the same timer resolution as fake:bench's sleeps
    )
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    write_json(port_file, {"url": f"http://{LOOPBACK}:{port}", "pid": os.getpid()})
    threading.Event().wait()  # until the bench terminates this process


def stop(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """End a bench child: ``SIGTERM``, then ``SIGKILL`` if it is still there after ``grace_s``.

    A child that outlived its phase (a server still draining, a proxy stuck in its shutdown)
    would keep taking CPU from every later phase and module of ``make bench`` on the same two
    cores, and no figure would show why."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        print(f"bench: process {proc.pid} ({proc.args!r:.80}) ignored SIGTERM; killing it")
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def emulator_process(tmp: Path, repo: Path = REPO) -> Iterator[str]:
    """The emulator in a child process (its CPU is not the bench's); yields its base URL.
    ``repo``: the checkout whose emulator runs (another's for an A/B)."""
    port_file = tmp / "emulator.json"
    env = child_env() if repo == REPO else {**os.environ, "PYTHONPATH": f"{repo / 'src'}:{repo}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.emulator_process", str(port_file)], env=env, cwd=str(repo)
    )
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        if not port_file.exists():
            raise RuntimeError(
                f"the bench emulator did not start within 30 s (exit code {proc.poll()})"
            )
        yield str(json.loads(port_file.read_text())["url"])
    finally:
        stop(proc)


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
