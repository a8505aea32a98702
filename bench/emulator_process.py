"""The provider emulator the daemon bench talks to over HTTP, in a process of its own.

One scenario, ``bench``, like ``fake:bench``: after ``PROVIDER_TTFB_S`` the model thinks in
``DELTAS`` reasoning deltas of 8 characters, then answers in ``DELTAS`` text deltas, in whichever
of the four wire formats the request asks for. Like a real provider (and like ``fake:bench``), it
paces its stream, so each delta reaches the client in its own read instead of all of them in one
buffer.

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
:func:`_trace_write`).

The first reasoning delta carries the time it was sent: the scenario's thought starts with the
placeholder ``STAMP``, which the pacing layer replaces in the first body write that holds it with
:func:`stamp` (``T`` and ``time.monotonic()`` modulo 100 s, 8 characters like the placeholder;
CLOCK_MONOTONIC is system-wide, so the bench client reads it directly). :func:`added_s` turns a
stamp and a receive time back into seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.atomic import write_json
from bench.environment import LOOPBACK, REPO, child_env, free_port

__all__ = [
    "DELTAS",
    "GAP_S",
    "PROVIDER_TTFB_S",
    "STAMP",
    "Pace",
    "added_s",
    "emulator_process",
    "stamp",
    "stop",
]

DELTAS = 20
PROVIDER_TTFB_S = 0.010
GAP_S = 0.001
"""Between two deltas: 1 ms, the pace this bench has always had (its former 0.5 ms sleeps lasted
1 ms on asyncio, whose selector rounds a timeout up to the millisecond)."""
STAMP = "T00.0000"
_STAMP_RE = re.compile(r"T(\d\d\.\d{4})")


def written(clock: float) -> str:
    """``clock`` (a ``time.monotonic()``) modulo 100 s, as 7 characters: rounded to 0.1 ms first,
    so a time within 50 µs of the wrap reads ``00.0000``, never ``100.0000`` (8 characters that no
    reader's pattern takes: its run's figure was lost)."""
    return f"{round(clock % 100, 4) % 100:07.4f}"


def stamp() -> str:
    """``T`` and the monotonic clock modulo 100 s, as 8 characters (one delta's worth)."""
    return f"T{written(time.monotonic())}"


def added_s(text: str, received: float) -> float | None:
    """Seconds from the stamp found in ``text`` to ``received`` (a ``time.monotonic()``)."""
    found = _STAMP_RE.search(text)
    if found is None:
        return None
    return (received % 100 - float(found.group(1))) % 100


class Pace:
    """An absolute schedule: the k-th :meth:`next` (from 0) returns at ``start + first + k ×
    gap`` (``start``: when the schedule was made), or at once when that time has passed, to
    within the event loop's millisecond timers (a slot is met early or late by less than 1 ms;
    the slots themselves never drift)."""

    def __init__(self, first: float, gap: float) -> None:
        self.due = time.monotonic() + first
        self.gap = gap

    def wait_s(self) -> float:
        """Seconds to wait for the next slot (0 when it has passed), and on to the one after:
        whole milliseconds, rounded up (uvloop's timers truncate a delay to the millisecond)."""
        left = self.due - time.monotonic()
        self.due += self.gap
        return math.ceil(left * 1000) / 1000 if left > 0 else 0.0

    async def next(self) -> None:
        wait = self.wait_s()
        if wait > 0:
            await asyncio.sleep(wait)


def _paced(app: Any) -> Any:
    """ASGI wrapper: body writes from the first delta's (the one holding ``STAMP``) on go out on
    the :class:`Pace` of the request; that ``STAMP`` becomes the send time."""
    placeholder = STAMP.encode()

    async def paced(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        pace = Pace(PROVIDER_TTFB_S, GAP_S)
        started = stamped = False
        traced: dict[str, Any] | None = {"e_start": time.monotonic()} if _TRACE else None

        async def send_paced(message: Any) -> None:
            nonlocal started, stamped
            body = message.get("body") if message["type"] == "http.response.body" else None
            started = started or bool(body and placeholder in body)
            if not body or not started:  # headers and framing before the first delta
                await send(message)
                if traced is not None and started and not message.get("more_body", False):
                    traced["e_end"] = time.monotonic()
                    _trace_write(traced)
                return
            due = pace.due  # this write's slot
            await pace.next()
            if not stamped:
                stamped = True
                # every copy in this write (OpenRouter mirrors reasoning in two fields)
                sent = stamp()
                message = {**message, "body": body.replace(placeholder, sent.encode())}
                if traced is not None:
                    traced.update(key=sent[1:], e_due_first=due)
            if traced is not None:
                now = time.monotonic()
                traced["e_last_write"] = now
                if b"[DONE]" in body or b"message_stop" in body or b"response.completed" in body:
                    traced.setdefault("e_terminal", now)
                else:
                    traced["e_last_nonterminal"] = now
            await send(message)
            if traced is not None:
                traced.setdefault("e_first_written", time.monotonic())
            if traced is not None and not message.get("more_body", False):
                traced["e_end"] = time.monotonic()
                _trace_write(traced)

        await app(scope, receive, send_paced)

    return paced


_TRACE = os.environ.get("BENCH_TRACE")
"""``daemon_bench --trace DIR``: each request's pacing stamps go to ``DIR/emulator-<pid>.jsonl``,
keyed by the first delta's send stamp (``bench.first_byte_trace`` joins them to the runs)."""


def _trace_write(traced: dict[str, Any]) -> None:
    if _TRACE and "key" in traced:
        with open(Path(_TRACE) / f"emulator-{os.getpid()}.jsonl", "a") as out:
            out.write(json.dumps(traced) + "\n")


ASGI = "asgi"
"""``BENCH_EMULATOR=asgi``: serve the ASGI emulator through uvicorn and :func:`_paced`, as before
ADR 0133 (what the lean server's answers are checked against; an A/B of the two servers)."""


def bench_emulator() -> Any:
    """The ASGI emulator with the ``bench`` scenario (the default for any model)."""
    from thoughtgate.testing.emulator import Emulator, Say, Scenario, ScriptedTurn, Think

    thought = STAMP + "".join(f"step {i:02d} " for i in range(1, DELTAS))  # 8 characters a delta
    answer = "".join(f"word{i:03d} " for i in range(DELTAS))
    turn = ScriptedTurn((Think(thought), Say(answer)), chunk_chars=8)  # paced by the server
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
