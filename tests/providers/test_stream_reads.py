"""A streamed body is read as sent, or decoded first when the provider compressed it."""

from __future__ import annotations

import gzip

import pytest
from support.replay import Replay, provider_with, streamed, transcript, turn_request

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("chunking", ["whole", "random"])
async def test_a_compressed_stream_gives_the_turn_the_plain_one_gives(chunking: str) -> None:
    body = transcript("thinking_text.sse")
    turns = []
    for data, headers in ((body, {}), (gzip.compress(body), {"content-encoding": "gzip"})):
        replay = Replay(data, chunking=chunking, headers=headers)
        provider = provider_with(replay.transport)
        turns.append(await streamed(provider, turn_request()))
        replay.assert_fully_read()
        await provider.aclose()
    plain, compressed = turns
    assert compressed == plain
    assert plain.complete and plain.text and plain.reasoning_parts
