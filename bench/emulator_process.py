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
    "ANSWER",
    "CHUNK_CHARS",
    "DELTAS",
    "GAP_S",
    "PROVIDER_TTFB_S",
    "STAMP",
    "THOUGHT",
    "Pace",
    "added_s",
    "emulator_process",
    "holds_delta",
    "paced_writes",
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
CHUNK_CHARS = 8
"""A delta's characters (the stamp's length)."""
THOUGHT = STAMP + "".join(f"step {i:02d} " for i in range(1, DELTAS))
"""The bench scenario's reasoning: ``DELTAS`` deltas, the first the stamp's placeholder."""
ANSWER = "".join(f"word{i:03d} " for i in range(DELTAS))
"""The bench scenario's answer: ``DELTAS`` deltas."""
_DELTA_RE = re.compile(
    b"|".join(
        re.escape(json.dumps(text[at : at + CHUNK_CHARS]).encode())
        for text in (THOUGHT, ANSWER)
        for at in range(0, len(text), CHUNK_CHARS)
    )
)
"""One delta's piece as a whole JSON string: in every format a delta event carries its piece
as a string of its own (``"thinking":"step 01 "``, ``"delta": "word003 "``), while the events
that repeat the whole text (Responses' ``.done`` events and ``response.completed``) hold the
pieces inside a longer string, and the others hold none."""


def holds_delta(body: bytes) -> bool:
    """Whether a body message of the bench scenario's answer holds one of its deltas (the
    stamp's placeholder counts: the first reasoning delta), in any of the four formats."""
    return _DELTA_RE.search(body) is not None


def paced_writes(bodies: list[bytes]) -> tuple[int, list[list[int]]]:
    """An answer's body messages, as a provider writes them: how many go out with the head
    (those before the first holding ``STAMP``), and the paced writes after them, each a list of
    indices into ``bodies``, in order.

    A paced write is a delta (the first one: the message holding ``STAMP``) with the framing
    events before it since the previous delta; the messages after the last delta go out with
    it. So a stream's paced writes are its deltas, one each, and its framing takes no slot. An
    answer with no delta after its stamped message (a whole JSON answer, not streamed) is one
    paced write."""
    placeholder = STAMP.encode()
    start = next((i for i, b in enumerate(bodies) if placeholder in b), len(bodies))
    writes: list[list[int]] = []
    waiting: list[int] = []
    for index in range(start, len(bodies)):
        waiting.append(index)
        if index == start or holds_delta(bodies[index]):
            writes.append(waiting)
            waiting = []
    if waiting:  # after the last delta: with it
        writes[-1] += waiting
    return start, writes


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


_TERMINAL = (b"[DONE]", b"message_stop", b"response.completed")


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
                if any(t in m.get("body", b"") for m in write for t in _TERMINAL):
                    traced.setdefault("e_terminal", now)
                else:
                    traced["e_last_nonterminal"] = now
            for each in write:  # back to back: one slot
                await send(each)
            if traced is not None:
                traced.setdefault("e_first_written", time.monotonic())
                if ends:
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
