"""An incremental Server-Sent Events decoder for provider streams.

Bytes arrive in arbitrary network chunks (an event may be split at any byte, several may share a
chunk); this decoder handles ``\\n``, ``\\r\\n`` and ``\\r`` line ends, ``:`` comment lines (such as
OpenRouter's ``: OPENROUTER PROCESSING``), multi-line ``data:`` and a final event without a trailing
blank line, as the SSE specification and the official SDKs do.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterator
from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEMessage", "aiter_sse"]


@dataclass(frozen=True, slots=True)
class SSEMessage:
    event: str
    data: str
    id: str | None = None


class SSEDecoder:
    """Feed bytes, get complete messages; ``flush()`` at end of stream."""

    def __init__(self) -> None:
        self._buf = b""
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self.comments = 0

    def feed(self, chunk: bytes) -> Iterator[SSEMessage]:
        self._buf += chunk
        while True:
            cut = _line_end(self._buf)
            if cut is None:
                return
            end, width = cut
            # a lone \r at the very end may be the first half of \r\n: wait for more bytes
            if width == 1 and self._buf[end : end + 1] == b"\r" and end + 1 == len(self._buf):
                return
            line = self._buf[:end].decode("utf-8", errors="replace")
            self._buf = self._buf[end + width :]
            message = self._line(line)
            if message is not None:
                yield message

    def flush(self) -> Iterator[SSEMessage]:
        if self._buf:
            line = self._buf.decode("utf-8", errors="replace").rstrip("\r\n")
            self._buf = b""
            message = self._line(line)
            if message is not None:
                yield message
        message = self._line("")
        if message is not None:
            yield message

    def _line(self, line: str) -> SSEMessage | None:
        if not line:
            if not self._data and not self._event:
                return None
            message = SSEMessage(self._event or "message", "\n".join(self._data), self._id)
            self._event, self._data = "", []
            return message
        if line.startswith(":"):
            self.comments += 1
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None


def _line_end(buf: bytes) -> tuple[int, int] | None:
    """Position and width of the first line terminator (``\\r\\n``, ``\\n`` or ``\\r``)."""
    n = buf.find(b"\n")
    r = buf.find(b"\r")
    if r == -1 and n == -1:
        return None
    if r != -1 and (n == -1 or r < n):
        if r + 1 < len(buf) and buf[r + 1 : r + 2] == b"\n":
            return r, 2
        return r, 1
    return n, 1


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncIterator[SSEMessage]:
    decoder = SSEDecoder()
    async for chunk in chunks:
        for message in decoder.feed(chunk):
            yield message
    for message in decoder.flush():
        yield message
