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


_ENDINGS = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def _streams(draw: st.DrawFn) -> tuple[str, bytes, list[int]]:
    """A stream of blocks (as above) each ended by a blank line, the last one maybe not; the
    same stream with each line end drawn from LF, CRLF and CR; and cut points into it."""
    blocks = draw(st.lists(st.lists(_LINE, min_size=1, max_size=4), max_size=6))
    lines = [line for block in blocks for line in [*block, ""]]
    if lines and draw(st.booleans()):
        lines.pop()  # the last event without its blank line: flush dispatches it
    mixed: list[str] = []
    after_cr = False
    for line in lines:
        ending = draw(_ENDINGS)
        if after_cr and not line and ending == "\n":
            ending = "\r\n"  # CR then a lone LF would be one CRLF line end, not two
        mixed.append(line + ending)
        after_cr = ending == "\r"
    lf = "".join(line + "\n" for line in lines)
    stream = "".join(mixed).encode()
    return lf, stream, draw(st.lists(st.integers(0, len(stream)), max_size=20))


@given(_streams())
def test_any_line_ends_and_any_split_give_the_messages_of_the_lf_stream(
    case: tuple[str, bytes, list[int]],
) -> None:
    """LF, CRLF and CR are one line end each wherever they fall, a CRLF split between two reads
    included: a valid stream cut anywhere decodes as the same stream with LF ends, whole."""
    lf, stream, cuts = case
    points = sorted(set(cuts))
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert decode(chunks) == decode([lf.encode()])
