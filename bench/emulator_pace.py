"""The bench scenario's pacing, shared by the emulator's two servers (:mod:`bench.emulator_process`'s
ASGI wrapper and :mod:`bench.lean_emulator`): what a delta is, which write each body message goes
out in, the absolute schedule the writes keep, and the stamp the first reasoning delta carries.
:mod:`bench.emulator_process`'s docstring says why the pace is what it is (ADR 0133, ADR 0150)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

__all__ = [
    "ANSWER",
    "CHUNK_CHARS",
    "DELTAS",
    "GAP_S",
    "PROVIDER_TTFB_S",
    "STAMP",
    "TERMINAL",
    "THOUGHT",
    "Pace",
    "added_s",
    "holds_delta",
    "paced_writes",
    "stamp",
    "trace_write",
    "written",
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


TERMINAL = (b"[DONE]", b"message_stop", b"response.completed")


def trace_write(traced: dict[str, Any], directory: str | None) -> None:
    """``daemon_bench --trace DIR`` (``BENCH_TRACE``, which each server reads): a request's
    pacing stamps go to ``DIR/emulator-<pid>.jsonl``, keyed by the first delta's send stamp
    (``bench.first_byte_trace`` joins them to the runs)."""
    if directory and "key" in traced:
        with open(Path(directory) / f"emulator-{os.getpid()}.jsonl", "a") as out:
            out.write(json.dumps(traced) + "\n")
