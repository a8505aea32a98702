"""``bench.first_delta_bench`` (ADR 0139): what each wire format sends before its first reasoning
delta is read with the response head, and the write holding that delta is the one the daemon
bench's added first byte counts from, for every format the daemon bench runs."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
from support.bench_modules import bench_package_module

from thoughtgate.types import ReasoningDelta

pytestmark = pytest.mark.unit

BEFORE = {
    "anthropic": ["message_start", "content_block_start", "ping"],
    "chat": ["message"],  # the role chunk
    "openrouter": [],  # a comment only: the role comes with the first reasoning delta
    "responses": [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
    ],
}


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with bench_package_module("first_delta_bench") as module:
        yield module


@pytest.mark.parametrize("fmt", sorted(BEFORE))
def test_the_events_before_the_first_reasoning_delta_go_with_the_head_and_hold_no_reasoning_text(
    bench: ModuleType, fmt: str
) -> None:
    found = bench.answer(fmt)
    before = found.payloads(found.before)
    assert [m.event for m in bench.events(before)] == BEFORE[fmt]
    decoder, parser = bench.SSEDecoder(), found.parser()
    for data in before:  # Anthropic's content_block_start opens its part with an empty delta
        chunks = parser.feed(decoder.feed(data))
        assert not [c for c in chunks if isinstance(c, ReasoningDelta) and c.text]
    first = parser.feed(decoder.feed(found.payloads(found.paced[:1])[0]))
    reasoning = [c for c in first if isinstance(c, ReasoningDelta)]
    assert [c.text for c in reasoning] == ["T00.0000"]  # the stamp the emulator fills in


def test_the_figures_count_each_formats_events_and_bytes(bench: ModuleType) -> None:
    found = bench.answer("responses")
    row = bench.figures(found, per_batch=2, repeats=1)
    assert row["before_events"] == 4
    assert row["first_events"] == 1
    assert row["before_bytes"] == sum(map(len, found.before))
    assert row["first_bytes"] == len(found.paced[0])
    assert row["stream_writes"] == len(found.before) + len(found.paced)
