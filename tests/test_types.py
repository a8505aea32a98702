"""The shared vocabulary and the one accumulator."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ProviderStreamError
from thoughtgate.providers.base import Capabilities, TurnRequest
from thoughtgate.types import (
    Chunk,
    ChunkOrderError,
    ContinuityBlock,
    ContinuityChunk,
    FinishChunk,
    Message,
    ReasoningDelta,
    ReasoningPart,
    TextDelta,
    TextPart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallPart,
    ToolCallStart,
    ToolResultPart,
    TurnAccumulator,
    Usage,
    UsageChunk,
    part_from_dict,
    part_to_dict,
)


def test_accumulator_builds_parts_in_first_arrival_order() -> None:
    acc = TurnAccumulator(provider="anthropic", model="m")
    acc.feed_all(
        [
            TextDelta("\n\n", index=0),
            ReasoningDelta("Let me ", index=1),
            ReasoningDelta("think.", index=1),
            ReasoningDelta("", index=1, signature="sig-1"),
            ReasoningDelta("", index=1, signature="sig-2"),
            TextDelta("Answer", index=2),
            ToolCallStart("c1", "lookup", index=3),
            ToolCallDelta("c1", '{"q": '),
            ToolCallDelta("c1", '"x"}'),
            ToolCallEnd("c1"),
            UsageChunk(input_tokens=10, output_tokens=3),
            UsageChunk(output_tokens=20, reasoning_tokens=7),
            FinishChunk("tool_calls", raw_reason="tool_use"),
        ]
    )
    turn = acc.finish()
    kinds = [p.kind for p in turn.parts]
    assert kinds == ["text", "reasoning", "text", "tool_call"]
    reasoning = turn.reasoning_parts[0]
    assert reasoning.text == "Let me think."
    assert reasoning.signature == "sig-2", "signature deltas replace, never append"
    assert reasoning.provider == "anthropic"
    assert turn.text == "\n\nAnswer"
    assert turn.tool_calls[0].arguments == {"q": "x"}
    assert turn.usage == Usage(input_tokens=10, output_tokens=20, reasoning_tokens=7)
    assert turn.finish_reason == "tool_calls" and turn.raw_finish_reason == "tool_use"
    assert turn.complete


@pytest.mark.parametrize("chunk", [ToolCallDelta("ghost", "{}"), ToolCallEnd("ghost")])
def test_a_chunk_for_a_tool_call_that_never_started_is_refused(chunk: Chunk) -> None:
    acc = TurnAccumulator().feed_all([ToolCallStart("c1", "lookup"), TextDelta("so far")])
    with pytest.raises(ChunkOrderError, match="'ghost', which never started"):
        acc.feed(chunk)
    assert [c.call_id for c in acc.partial().tool_calls] == ["c1"]  # no invented call


async def test_an_adapter_that_breaks_the_chunk_order_fails_its_turn_with_the_partial() -> None:
    class Broken:
        name, model, capabilities = "broken", "m", Capabilities()

        async def stream(self, request: TurnRequest) -> AsyncIterator[Chunk]:
            yield TextDelta("Partial")
            yield ToolCallDelta("ghost", "{}")

    with pytest.raises(ProviderStreamError, match="never started") as info:
        await stream_llm_turn(Broken(), TurnRequest([]))  # type: ignore[arg-type]
    assert info.value.partial is not None and info.value.partial.text == "Partial"


def test_partial_turn_is_marked_incomplete_and_keeps_everything() -> None:
    acc = TurnAccumulator()
    acc.feed_all([ReasoningDelta("half a tho"), TextDelta("half an ans")])
    partial = acc.partial()
    assert not partial.complete
    assert partial.reasoning_text == "half a tho"
    assert partial.text == "half an ans"
    assert partial.finish_reason is None


def test_summary_and_raw_reasoning_with_same_index_stay_apart() -> None:
    acc = TurnAccumulator()
    acc.feed(ReasoningDelta("raw", reasoning_kind="raw"))
    acc.feed(ReasoningDelta("sum", reasoning_kind="summary"))
    parts = acc.finish().reasoning_parts
    assert [(p.reasoning_kind, p.text) for p in parts] == [("raw", "raw"), ("summary", "sum")]


def test_continuity_blocks_are_kept_verbatim_and_in_order() -> None:
    a = ContinuityBlock(
        "anthropic.thinking", {"type": "thinking", "thinking": "t", "signature": "s"}
    )
    b = ContinuityBlock("anthropic.redacted_thinking", {"type": "redacted_thinking", "data": "x"})
    acc = TurnAccumulator().feed_all([ContinuityChunk(a), ContinuityChunk(b)])
    assert acc.finish().continuity == (a, b)


chunk_strategy = st.one_of(
    st.builds(ReasoningDelta, st.text(max_size=5), index=st.integers(0, 2)),
    st.builds(TextDelta, st.text(max_size=5), index=st.integers(0, 2)),
)


@given(st.lists(chunk_strategy, max_size=40))
def test_accumulated_text_is_the_concatenation_of_deltas(
    chunks: list[ReasoningDelta | TextDelta],
) -> None:
    turn = TurnAccumulator().feed_all(chunks).finish()
    for index in range(3):
        want_r = "".join(
            c.text for c in chunks if isinstance(c, ReasoningDelta) and c.index == index
        )
        assert "".join(p.text for p in turn.reasoning_parts if p.index == index) == want_r
    texts = [p for p in turn.parts if isinstance(p, TextPart)]
    assert sorted(p.text for p in texts) == sorted(
        "".join(c.text for c in chunks if isinstance(c, TextDelta) and c.index == i)
        for i in {c.index for c in chunks if isinstance(c, TextDelta)}
    )


def test_parts_round_trip_through_json_dicts() -> None:
    parts = [
        TextPart("hi"),
        ReasoningPart(
            "why",
            reasoning_kind="summary",
            provider="p",
            model="m",
            signature="s",
            redacted=False,
            index=2,
        ),
        ContinuityBlock("openai.reasoning_item", {"id": "rs_1", "encrypted_content": "e"}),
        ToolCallPart("c", "f", arguments_json='{"a": 1}'),
        ToolResultPart("c", "out", is_error=True, name="f"),
    ]
    assert [part_from_dict(part_to_dict(p)) for p in parts] == parts


def test_message_helpers() -> None:
    assert Message.user("q").text == "q"
    assert Message.system("s").role == "system"


def test_invalid_tool_arguments_parse_as_empty() -> None:
    assert ToolCallPart("c", "f", arguments_json="{not json").arguments == {}
