"""The daemon bench's provider emulator paces what a provider paces (ADR 0150): each wire format's
stream is the same deltas on the same slots, a delta a write, its framing events taking no slot
of their own, so no format's stream is longer than another's and the daemon bench's per-format
runs/s and first bytes are measured at the same provider pace.

Each format's answer is the one the adapter's own request gets (the daemon bench's models),
read back by that adapter's parser write by write: what the daemon would get in each read."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any, ClassVar

import pytest
from support.bench_modules import bench_package_module

from thoughtgate.providers.sse import SSEDecoder
from thoughtgate.types import ReasoningDelta, TextDelta

pytestmark = pytest.mark.unit

FORMATS = ["anthropic", "chat", "openrouter", "responses"]
_STAMPED = re.compile(rb"T\d\d\.\d{4}")


@pytest.fixture(scope="module")
def modules() -> Iterator[tuple[ModuleType, ModuleType, ModuleType, ModuleType]]:
    with (
        bench_package_module("emulator_process") as process,
        bench_package_module("lean_emulator") as lean,
        bench_package_module("first_delta_bench") as first_delta,
        bench_package_module("emulator_pace") as pace,
    ):
        yield process, lean, first_delta, pace


def _read(found: Any, before: list[bytes], paced: list[bytes]) -> list[list[tuple[str, str]]]:
    """Each of the ``paced`` writes (payloads) as the reasoning and text deltas (kind, text)
    ``found``'s adapter reads in it, after reading ``before`` (what came with the head)."""
    decoder, parser = SSEDecoder(), found.parser()
    for data in before:
        parser.feed(decoder.feed(data))
    writes = []
    for data in paced:
        chunks = parser.feed(decoder.feed(data))
        writes.append(
            [
                ("reasoning" if isinstance(c, ReasoningDelta) else "text", c.text)
                for c in chunks
                if isinstance(c, ReasoningDelta | TextDelta) and c.text
            ]
        )
    return writes


def _deltas_by_write(first_delta: ModuleType, fmt: str) -> list[list[tuple[str, str]]]:
    """Each paced write of ``fmt``'s answer from the lean server, as its adapter reads it."""
    found = first_delta.answer(fmt)
    return _read(found, found.payloads(found.before), found.payloads(found.paced))


def _pieces(text: str, size: int) -> list[str]:
    return [text[at : at + size] for at in range(0, len(text), size)]


def test_every_format_streams_the_same_deltas_one_a_paced_write(
    modules: tuple[ModuleType, ...],
) -> None:
    """40 paced writes in every format, write k holding delta k and nothing else the adapter
    reads as text: the same schedule (slot k = ``PROVIDER_TTFB_S + k × GAP_S``) for all four,
    so each stream's last write is due at the same time."""
    _, _, first_delta, pace = modules
    expected = [[("reasoning", p)] for p in _pieces(pace.THOUGHT, pace.CHUNK_CHARS)] + [
        [("text", p)] for p in _pieces(pace.ANSWER, pace.CHUNK_CHARS)
    ]
    assert len(expected) == 2 * pace.DELTAS
    for fmt in FORMATS:
        assert _deltas_by_write(first_delta, fmt) == expected, fmt


def test_every_event_is_written_and_the_terminal_one_with_the_last_delta(
    modules: tuple[ModuleType, ...],
) -> None:
    """No framing event is dropped by taking it off the schedule: the head's events and the
    paced writes hold the whole answer, and the stream's end is in its last delta's write
    (the turn is complete once that write is read)."""
    _, lean, first_delta, _ = modules
    for fmt in FORMATS:
        wire = first_delta.wire_request(fmt)
        app = modules[0].bench_emulator().app
        rendered = asyncio.run(lean._asgi_once(app, "POST", wire.target, wire.headers, wire.body))
        found = first_delta.answer(fmt)
        written = first_delta.events(found.payloads([*found.before, *found.paced]))
        answered = first_delta.events([b for b, _ in rendered.bodies])
        # event by event (the ids in them are fresh in each answer, of the same length)
        assert [(m.event, len(m.data)) for m in written] == [
            (m.event, len(m.data)) for m in answered
        ], fmt
        terminal = [any(t in w for t in lean.TERMINAL) for w in found.paced]
        assert terminal == [False] * (len(terminal) - 1) + [True], fmt


def test_the_paced_writes_of_an_answer_group_its_framing_with_the_next_delta(
    modules: tuple[ModuleType, ...],
) -> None:
    """:func:`paced_writes` on a made-up stream: the framing before the first delta goes with
    the head, that between two deltas with the later one, that after the last with it."""
    pace = modules[3]
    bodies = [
        b"open",
        b'{"d":"T00.0000"}',
        b'{"d":"step 01 "}',
        b"close thinking",
        b"open text",
        b'{"d":"word000 "}',
        b'{"d":"word001 "}',
        b"stop",
        b"",
    ]
    assert pace.paced_writes(bodies) == (1, [[1], [2], [3, 4, 5], [6, 7, 8]])
    # a whole JSON answer (not streamed): its text is one string, one paced write
    assert pace.paced_writes([b'{"text":"T00.0000step 01 word000 "}', b""]) == (
        0,
        [[0, 1]],
    )


class _Slots:
    """A :class:`Pace` stand-in that notes each slot taken in the sends' log, at once."""

    log: ClassVar[list[Any]] = []

    def __init__(self, first: float, gap: float) -> None:
        self.due = 0.0

    async def next(self) -> None:
        self.log.append("slot")


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_asgi_path_takes_a_slot_for_each_delta_only(
    modules: tuple[ModuleType, ...], monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """``BENCH_EMULATOR=asgi`` (uvicorn and ``_paced``) writes the same writes on the same slots
    as the lean server: its sends between two slots are one paced write of the lean answer."""
    process, lean, first_delta, pace = modules
    log: list[Any] = []
    monkeypatch.setattr(_Slots, "log", log)
    monkeypatch.setattr(process, "Pace", _Slots)
    wire = first_delta.wire_request(fmt)

    async def logged(scope: Any, receive: Any, send: Any) -> None:
        async def noting(message: Any) -> None:
            if message["type"] == "http.response.body":
                log.append(message.get("body", b""))
            await send(message)

        await process._paced(process.bench_emulator().app)(scope, receive, noting)

    asyncio.run(lean._asgi_once(logged, "POST", wire.target, wire.headers, wire.body))
    before = log[: log.index("slot")]
    writes: list[list[bytes]] = []
    for entry in log[log.index("slot") :]:
        if entry == "slot":
            writes.append([])
        else:
            writes[-1].append(entry)
    found = first_delta.answer(fmt)
    assert len(writes) == 2 * pace.DELTAS
    assert len(before) == len(found.before)
    # the stamp is the send time here; the lean answer's is still the placeholder
    joined = [_STAMPED.sub(pace.STAMP.encode(), b"".join(w)) for w in writes]
    assert _read(found, before, joined) == _deltas_by_write(first_delta, fmt)
    # the same events in each write as the lean server's
    lean_events = [len(first_delta.events([p])) for p in found.payloads(found.paced)]
    assert [len(first_delta.events(w)) for w in writes] == lean_events
