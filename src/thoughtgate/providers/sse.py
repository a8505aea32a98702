"""An incremental Server-Sent Events decoder for provider streams.

Bytes arrive in arbitrary network chunks (an event may be split at any byte, several may share a
chunk); this decoder handles ``\\n``, ``\\r\\n`` and ``\\r`` line ends, ``:`` comment lines (such as
OpenRouter's ``: OPENROUTER PROCESSING``), multi-line ``data:`` and a final event without a trailing
blank line, as the SSE specification and the official SDKs do.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import NamedTuple

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "SSEDecoder", "SSEEventTooLarge", "SSEMessage", "aiter_sse"]

DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024
"""16 MiB: far above any event a provider streams (a delta is bytes to kilobytes; the largest, a
Responses stream's ``response.completed``, repeats the turn's output), far below what a daemon
running dozens of turns can hold per stream."""


class SSEEventTooLarge(ValueError):
    """An event still unfinished past the decoder's ``max_event_bytes`` (a line that never ends,
    or a block with no blank line after it): reading on would hold a stream's bytes without
    bound (ADR 0147)."""

    def __init__(self, held: int, limit: int) -> None:
        super().__init__(f"an SSE event still unfinished after {held} bytes (the limit is {limit})")
        self.held = held
        self.limit = limit


class SSEMessage(NamedTuple):
    """One dispatched event (a tuple: cheap to build on the per-event hot path)."""

    event: str
    data: str
    id: str | None = None


_message = SSEMessage._make  # builds the tuple in C, without the Python-level __new__


class SSEDecoder:
    """Feed bytes, get complete messages; ``flush()`` at end of stream.

    Work is done per chunk and per event, never per byte or rescanning old bytes: line ends are
    normalized as chunks arrive, complete events (up to the last blank line) are decoded in one
    pass, and the usual ``event:`` + one ``data:`` event is read without a per-line loop. The
    cost stays linear however the bytes are split.
    """

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self.max_event_bytes = max_event_bytes
        """The most bytes of one unfinished event held (``None``: no limit); past them,
        :meth:`feed` raises :class:`SSEEventTooLarge`."""
        self._buf = bytearray()  # the unfinished event, line ends already normalized to \n
        self._cr = False  # the last chunk ended in \r, which may be the first half of \r\n
        self._id: str | None = None
        self.comments = 0

    def feed(self, chunk: bytes) -> list[SSEMessage]:
        if self._cr:
            chunk, self._cr = b"\r" + chunk, False
        # find, not ``in``: bytes' ``in`` first tries its operand as an integer, raising and
        # clearing a TypeError on every call (about twice find's cost)
        if chunk.find(b"\r") >= 0:
            if chunk.endswith(b"\r"):
                chunk, self._cr = chunk[:-1], True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf = self._buf
        if not buf and chunk.endswith(b"\n\n"):  # whole events, the common case: no copying
            return self._events(chunk[:-2].decode("utf-8", errors="replace").split("\n\n"))
        start = max(0, len(buf) - 1)  # the kept bytes hold no blank line: search only the new ones
        buf += chunk
        end = buf.rfind(b"\n\n", start)
        if end < 0:
            self._bounded(len(buf))
            return []
        # "\n\n" never sits inside a UTF-8 sequence, so the complete events decode safely
        text = buf[:end].decode("utf-8", errors="replace")
        del buf[: end + 2]
        self._bounded(len(buf))
        return self._events(text.split("\n\n"))

    def _bounded(self, held: int) -> None:
        limit = self.max_event_bytes
        if limit is not None and held > limit:
            self._buf = bytearray()  # what it held is no event: not kept past the error
            raise SSEEventTooLarge(held, limit)

    def flush(self) -> list[SSEMessage]:
        """The last event, if the stream ended without a blank line after it."""
        tail = bytes(self._buf) + (b"\n" if self._cr else b"")
        self._buf, self._cr = bytearray(), False
        if not tail:
            return []
        return self._events(tail.decode("utf-8", errors="replace").split("\n\n"))

    def _events(self, blocks: list[str]) -> list[SSEMessage]:
        out: list[SSEMessage] = []
        for block in blocks:
            if block.startswith("event: "):
                nl = block.find("\n")
                if nl > 0 and block.startswith("data: ", nl + 1) and block.find("\n", nl + 1) < 0:
                    # an empty event name is "message", as the field-by-field reading has it
                    out.append(_message((block[7:nl] or "message", block[nl + 7 :], self._id)))
                    continue
            elif block.startswith("data: ") and "\n" not in block:
                # one data line and nothing else: the event of every Chat Completions chunk
                out.append(_message(("message", block[6:], self._id)))
                continue
            message = self._event(block)
            if message is not None:
                out.append(message)
        return out

    def _event(self, block: str) -> SSEMessage | None:
        """One event's lines, field by field, as the SSE specification reads them."""
        event = ""
        data: list[str] = []
        for line in block.split("\n"):
            if not line:
                continue
            if line[0] == ":":
                self.comments += 1
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
            elif name == "id":
                self._id = value
        if not data and not event:
            return None
        return SSEMessage(event or "message", "\n".join(data), self._id)


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[SSEMessage]:
    decoder = SSEDecoder()
    async for chunk in chunks:
        for message in decoder.feed(chunk):
            yield message
    for message in decoder.flush():
        yield message
