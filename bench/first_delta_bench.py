"""What each wire format sends before and with its first reasoning delta, and what reading it
costs an adapter (ADR 0139). Not a test.

``daemon_bench`` counts a run's added first byte from the emulator's send stamp, which is in the
first reasoning delta; so of what a wire format sends, only the network read holding that delta
is on the measured path, and what came before it (Anthropic's ``message_start``, Responses'
``response.created`` and the events after it) was read with the response head, 10 ms earlier.
This prints, per format (the daemon bench's models, :data:`bench.daemon_bench.FORMATS`), the
bench scenario's answer to the adapter's own request, rendered in process by the emulator as the
bench's lean emulator writes it (:func:`bench.lean_emulator.render`):

* ``before``: the SSE events and bytes written with the head, before the first reasoning delta
  (bytes as on the wire: HTTP chunk framing included, the head not);
* ``first write``: the events and bytes of the write that holds the first reasoning delta;
* the adapter's CPU (``time.thread_time``, µs, the best of ``--repeats`` batches of
  ``--per-batch``): a parser made and fed the events before the first delta (SSE decoding
  included); the first delta's write fed to a parser that has read those (the part of the first
  byte's path that depends on the wire format); the whole answer, per write (the load each of
  a stream's writes puts on the daemon's loop).

Everything runs in this process: no socket, no HTTP, no event loop past the emulator's
rendering, so the figures are the adapters' Python alone (``bench.turn_bench`` adds the HTTP
client and the turn; ``daemon_bench --trace`` gives the first byte's hops in the daemon).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.daemon_bench import FORMATS
from bench.emulator_process import bench_emulator
from bench.lean_emulator import render
from bench.turn_bench import _request, _settings
from thoughtgate.providers.sse import SSEDecoder, SSEMessage
from thoughtgate.types import ReasoningDelta

__all__ = ["Answer", "WireRequest", "answer", "cpu_us", "events", "figures", "main", "wire_request"]

PER_BATCH = 300
REPEATS = 7


@dataclass(frozen=True, slots=True)
class Answer:
    """One format's answer: its writes as on the wire (chunk framing included), and as the
    adapter's SSE decoder gets them (the chunks' payloads)."""

    fmt: str
    provider: Any
    request: Any
    before: list[bytes]
    """Written with the head, before the first reasoning delta."""
    paced: list[bytes]
    """One write each, the first holding the first reasoning delta."""

    def payloads(self, writes: Sequence[bytes]) -> list[bytes]:
        return [_payload(w) for w in writes]

    def parser(self) -> Any:
        return self.provider.parser(self.request)


def _payload(framed: bytes) -> bytes:
    """The data of the HTTP chunks in one write (the last chunk and its end dropped)."""
    out, at = [], 0
    while at < len(framed):
        line_end = framed.index(b"\r\n", at)
        size = int(framed[at:line_end], 16)
        if size == 0:
            break
        out.append(framed[line_end + 2 : line_end + 2 + size])
        at = line_end + 2 + size + 2
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class WireRequest:
    """``fmt``'s adapter and turn request, and the HTTP request it sends for them."""

    provider: Any
    request: Any
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


def wire_request(fmt: str) -> WireRequest:
    """The request ``fmt``'s adapter sends for the daemon bench's turn (its model's)."""
    from thoughtgate.providers.base import create_provider

    model = FORMATS[fmt][0]
    settings = _settings("http://127.0.0.1:9", model)
    provider = create_provider(model, settings)
    request = _request()
    transport = provider.transport  # type: ignore[attr-defined]  # an HTTP adapter's
    headers = [(k.lower().encode(), v.encode()) for k, v in transport._header_items]
    headers.append((b"content-type", b"application/json"))
    path: str = provider.path  # type: ignore[attr-defined]
    url = f"{transport.base_url.rstrip('/')}/{path.lstrip('/')}"  # as httpx joins them
    target = urllib.parse.urlsplit(url).path.encode()
    body = json.dumps(provider.build_body(request, stream=True)).encode()  # type: ignore[attr-defined]
    return WireRequest(provider, request, target, headers, body)


async def _render(fmt: str) -> Answer:
    wire = wire_request(fmt)
    provider, request = wire.provider, wire.request
    rendered = await render(bench_emulator().app, "POST", wire.target, wire.headers, wire.body)
    if not rendered.paced:
        raise SystemExit(f"{fmt}: the emulator answered {rendered.status_line!r} with no stream")
    return Answer(
        fmt,
        provider,
        request,
        [part.fill() for part in rendered.pre],
        [part.fill() for part, _ in rendered.paced],
    )


def answer(fmt: str) -> Answer:
    """``fmt``'s answer to its adapter's request for the bench scenario."""
    return asyncio.run(_render(fmt))


def events(writes: Sequence[bytes]) -> list[SSEMessage]:
    """The SSE events ``writes`` (payloads) hold, in order."""
    decoder = SSEDecoder()
    return [m for w in writes for m in decoder.feed(w)] + decoder.flush()


def cpu_us(fn: Callable[[int], object], per_batch: int, repeats: int) -> float:
    """``fn(i)`` for ``i`` in ``range(per_batch)``: µs of this thread's CPU a call, best batch."""
    best = float("inf")
    for _ in range(repeats):
        began = time.thread_time()
        for i in range(per_batch):
            fn(i)
        best = min(best, time.thread_time() - began)
    return best / per_batch * 1e6


def figures(found: Answer, per_batch: int, repeats: int) -> dict[str, float]:
    """The events and bytes of ``found`` before and with its first reasoning delta, and the
    adapter's CPU for each (see the module's docstring)."""
    before, paced = found.payloads(found.before), found.payloads(found.paced)
    first = paced[0]

    def read_before(_: int = 0) -> tuple[SSEDecoder, Any]:
        decoder, parser = SSEDecoder(), found.parser()
        for data in before:
            parser.feed(decoder.feed(data))
        return decoder, parser

    decoder, parser = read_before()
    if not any(isinstance(c, ReasoningDelta) and c.text for c in parser.feed(decoder.feed(first))):
        raise SystemExit(f"{found.fmt}: no reasoning delta in the first paced write")

    def read_all(_: int) -> None:
        decoder, parser = SSEDecoder(), found.parser()
        for data in before + paced:
            parser.feed(decoder.feed(data))
        parser.end()

    def read_first(primed: list[tuple[SSEDecoder, Any]]) -> float:
        return cpu_us(lambda i: primed[i][1].feed(primed[i][0].feed(first)), per_batch, 1)

    # each batch on fresh parsers that have read only the events before
    first_us = min(read_first([read_before() for _ in range(per_batch)]) for _ in range(repeats))
    writes = len(before) + len(paced)
    return {
        "before_events": len(events(before)),
        "before_bytes": sum(map(len, found.before)),
        "first_events": len(events([*before, first])) - len(events(before)),
        "first_bytes": len(found.paced[0]),
        "stream_writes": writes,
        "stream_bytes": sum(map(len, found.before + found.paced)),
        "before_us": cpu_us(read_before, per_batch, repeats),
        "first_us": first_us,
        "stream_us_per_write": cpu_us(read_all, max(1, per_batch // 10), repeats) / writes,
    }


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--per-batch", type=int, default=PER_BATCH)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args(argv)
    rows: dict[str, dict[str, float]] = {}
    print(
        f"{'format':<11}{'before: events':>15}{'bytes':>7}{'first write: events':>21}"
        f"{'bytes':>7}{'µs before':>11}{'µs first':>10}{'writes':>8}{'µs a write':>12}"
    )
    for fmt in [f for f in args.formats.split(",") if f]:
        row = rows[fmt] = figures(answer(fmt), args.per_batch, args.repeats)
        print(
            f"{fmt:<11}{row['before_events']:>15.0f}{row['before_bytes']:>7.0f}"
            f"{row['first_events']:>21.0f}{row['first_bytes']:>7.0f}{row['before_us']:>11.1f}"
            f"{row['first_us']:>10.2f}{row['stream_writes']:>8.0f}"
            f"{row['stream_us_per_write']:>12.2f}"
        )
    return rows


if __name__ == "__main__":
    main()
