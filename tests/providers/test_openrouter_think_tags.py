"""OpenRouter: a model that writes ``<think>`` into ``content`` has it read as reasoning (ADR 0071).

OpenRouter normally splits reasoning out itself (``reasoning``, ``reasoning_details``), but a
model served through a provider without a reasoning parser writes its thoughts inline. By default
(``think_tags = "leading"``) blocks before any answer text are reasoning -- an unclosed one too --,
so they reach only those who may read reasoning; tags inside an answer stay answer.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.viewer import role_reads

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ConfigError
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.types import Message, TextPart, Turn

pytestmark = pytest.mark.unit

MODEL = "deepseek/deepseek-r1"
TAG = "SECRETREASONING"


def _body(pieces: list[str]) -> str:
    events = [
        {"id": "gen-1", "model": MODEL, "choices": [{"index": 0, "delta": {"content": p}}]}
        for p in pieces
    ]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def _provider(pieces: list[str], think_tags: Any = None) -> OpenRouterProvider:
    answer = _body(pieces)
    transport = httpx.MockTransport(
        lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, text=answer
        )
    )
    extra = {} if think_tags is None else {"thoughtgate": {"think_tags": think_tags}}
    settings_ = ProviderSettings(
        base_url="http://replay.invalid", api_key="k", max_retries=0, extra=extra
    )
    return OpenRouterProvider(MODEL, settings_, client=httpx.AsyncClient(transport=transport))


def _turn(pieces: list[str], *, capture: bool = True, think_tags: Any = None) -> Turn:
    request = TurnRequest(
        [Message("user", (TextPart("Why?"),))], reasoning=ReasoningRequest(enabled=capture)
    )

    async def main() -> Turn:
        provider = _provider(pieces, think_tags)
        try:
            return await stream_llm_turn(provider, request)
        finally:
            await provider.aclose()

    return asyncio.run(main())


def _cut(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(text)}), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(0, 80), max_size=12), capture=st.booleans())
def test_a_leading_think_block_is_reasoning_however_the_deltas_are_cut(
    cuts: list[int], capture: bool
) -> None:
    content = f"\n<think>\n{TAG} so the answer is 4\n</think>\n\nIt is 4."
    turn = _turn(_cut(content, cuts), capture=capture)
    assert TAG not in turn.text and turn.text.strip() == "It is 4."
    assert (TAG in turn.reasoning_text) == capture, "hidden: dropped, never in the answer"


def test_an_unclosed_leading_block_is_reasoning_never_answer() -> None:
    turn = _turn(["<think>", f"{TAG} still thinking"])
    assert turn.text == "" and TAG in turn.reasoning_text


def test_tags_inside_an_answer_stay_answer_by_default() -> None:
    turn = _turn(["Write ", "<think>x</think>", " to mark reasoning."])
    assert turn.text == "Write <think>x</think> to mark reasoning." and turn.reasoning_text == ""


def test_the_option_per_provider_and_per_model() -> None:
    inline = ["A <think>", f"{TAG}</think> B"]
    assert TAG in _turn(inline, think_tags="anywhere").reasoning_text
    assert TAG in _turn(inline, think_tags={MODEL: "anywhere", "*": "off"}).reasoning_text
    leading = [f"<think>{TAG}</think>OK"]
    assert TAG in _turn(leading, think_tags="off").text, "off: content is all answer"
    assert TAG in _turn(leading, think_tags={"other/model": "off"}).reasoning_text
    with pytest.raises(ConfigError):
        _provider([], think_tags="sometimes")


@pytest.mark.parametrize("mode", ["hidden", "surface", "telemetry_only"])
def test_a_viewer_never_reads_the_tag_content(mode: str) -> None:
    content = f"<think>{TAG}</think>The answer."
    reads = asyncio.run(
        role_reads(lambda model: _provider(_cut(content, [3, 9, 17])), f"openrouter:{MODEL}", mode)
    )
    assert "The answer." in reads["viewer"]
    assert TAG not in reads["viewer"]
    assert (TAG in reads["developer"]) == (mode == "surface")
