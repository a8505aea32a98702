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


_VALUE = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=12
)
_LINE = st.one_of(
    _VALUE.map(lambda v: f"data: {v}"),
    _VALUE.map(lambda v: f"data:{v}"),
    _VALUE.map(lambda v: f"event: {v}"),
    _VALUE.map(lambda v: f"id: {v}"),
    _VALUE.map(lambda v: f":{v}"),
    _VALUE.filter(lambda v: v != ""),  # a line that is no field: a field named as the line
)


@given(st.lists(st.lists(_LINE, min_size=1, max_size=4), max_size=6))
def test_the_short_ways_read_events_as_the_field_by_field_reading_does(
    blocks: list[list[str]],
) -> None:
    """Blocks of one ``data:`` line (and of ``event:`` then ``data:``) are read without the
    per-line loop; every block must still give what the specification's reading of its lines
    gives (``_event``, the loop every other block takes), ``id`` carried from block to block."""
    texts = ["\n".join(lines) for lines in blocks]
    reference = SSEDecoder()
    expected = [m for text in texts if (m := reference._event(text)) is not None]
    stream = "".join(text + "\n\n" for text in texts).encode()
    assert decode([stream]) == expected
