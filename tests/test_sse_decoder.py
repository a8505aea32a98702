"""The SSE decoder must give the same messages for any split of the byte stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.providers.sse import SSEDecoder, SSEMessage

STREAM = (
    b": OPENROUTER PROCESSING\n\n"
    b'event: message_start\r\ndata: {"a": 1}\r\n\r\n'
    b"data: line one\ndata: line two\n\n"
    b'event: ping\rdata: {"type": "ping"}\r\r'
    b"id: 7\ndata: caf\xc3\xa9\n\n"
    b"data: [DONE]"
)
EXPECTED = [
    SSEMessage("message_start", '{"a": 1}'),
    SSEMessage("message", "line one\nline two"),
    SSEMessage("ping", '{"type": "ping"}'),
    SSEMessage("message", "café", "7"),
    SSEMessage("message", "[DONE]", "7"),
]


def decode(chunks: list[bytes]) -> list[SSEMessage]:
    dec = SSEDecoder()
    out: list[SSEMessage] = []
    for chunk in chunks:
        out.extend(dec.feed(chunk))
    out.extend(dec.flush())
    return out


def test_whole_stream() -> None:
    assert decode([STREAM]) == EXPECTED


@given(st.lists(st.integers(0, len(STREAM)), max_size=30))
def test_any_chunking_gives_the_same_messages(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert decode(chunks) == EXPECTED


def test_comments_are_counted_not_emitted() -> None:
    dec = SSEDecoder()
    assert list(dec.feed(b": keep-alive\n\n")) == []
    assert dec.comments == 1
