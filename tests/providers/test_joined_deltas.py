"""The deltas of one network read are joined per part, and nothing else moves (``joined_deltas``)."""

from __future__ import annotations

import pytest

from thoughtgate.providers.wire import joined_deltas
from thoughtgate.types import (
    Chunk,
    FinishChunk,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    TurnAccumulator,
)

pytestmark = pytest.mark.unit


def test_consecutive_deltas_of_one_part_become_one_with_their_text_joined() -> None:
    chunks: list[Chunk] = [
        ReasoningDelta("The ", index=0),
        ReasoningDelta("moon", index=0),
        ReasoningDelta("", index=0),
        ReasoningDelta(" pulls.", index=0),
        TextDelta("Tides", index=1),
        TextDelta(" rise.", index=1),
        FinishChunk("stop"),
    ]
    assert joined_deltas(chunks) == [
        ReasoningDelta("The moon pulls.", index=0),
        TextDelta("Tides rise.", index=1),
        FinishChunk("stop"),
    ]


@pytest.mark.parametrize(
    "second",
    [
        ReasoningDelta("b", index=1),  # another part
        ReasoningDelta("b", index=0, reasoning_kind="summary"),  # another kind of reasoning
        ReasoningDelta("b", index=0, signature="sig"),  # a signature replaces the part's
        ReasoningDelta("b", index=0, redacted=True),  # opaque redacted thinking
        TextDelta("b", index=0),  # answer text, not reasoning
    ],
)
def test_a_delta_that_is_not_plain_text_of_the_same_part_is_not_joined(second: Chunk) -> None:
    chunks: list[Chunk] = [ReasoningDelta("a", index=0), second]
    assert joined_deltas(chunks) == chunks


def test_a_chunk_between_two_deltas_of_one_part_keeps_them_apart_and_in_order() -> None:
    chunks: list[Chunk] = [
        TextDelta("a", index=0),
        TextDelta("b", index=0),
        ToolCallStart("call_1", "lookup", index=1),
        ToolCallDelta("call_1", '{"q":'),
        ToolCallDelta("call_1", '"x"}'),
        TextDelta("c", index=0),
        TextDelta("d", index=0),
    ]
    joined = joined_deltas(chunks)
    assert joined == [
        TextDelta("ab", index=0),
        ToolCallStart("call_1", "lookup", index=1),
        ToolCallDelta("call_1", '{"q":'),
        ToolCallDelta("call_1", '"x"}'),
        TextDelta("cd", index=0),
    ]
    assert TurnAccumulator().feed_all(joined).partial() == (
        TurnAccumulator().feed_all(chunks).partial()
    )
