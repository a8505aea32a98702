"""A reasoning part is a provider ``summary`` only where the server is known to send one (ADR 0078).

The ``provider_summaries`` summarizer shows end users parts of kind ``summary``, so that label is a
promise that the text is a provider-written summary and not the model's chain of thought. The
Messages, Responses and OpenRouter formats are served by more than their vendors: DeepSeek,
Moonshot, MiniMax and Z.ai run Anthropic-compatible endpoints, vLLM and llama.cpp serve
``/v1/messages`` and ``/v1/responses``, and a gateway may speak any of them. Those servers put the
model's raw reasoning where the vendor puts its summary, so the label is fail-closed: ``summary``
only on the vendor's own server for a model the tables know (or a format field that says so on a
server known to mean it), ``raw`` everywhere else -- and a viewer of an operator who opted into
``provider_summaries`` reads nothing of it.

The wire tests speak to a real HTTP server on loopback (:class:`ReplayServer`).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from support.replay import ReplayServer, Reply
from support.viewer import role_reads

from thoughtgate.config import Config
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.types import Message

TAG = "Weighing the rawchainofthought figures"
SUMMARIES = Config.from_mapping(
    {"visible_reasoning": {"summarizers": ["provider_summaries", "phases"]}}
)
"""The operator's explicit opt-in: end users may read the provider's summaries."""


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def thinking_stream(model: str, thought: str) -> Reply:
    """``/v1/messages`` events of a thinking block, then a text block, as an Anthropic-compatible
    server sends them: without a signature (such servers have no key to sign with; a signed
    block's text is also kept to send back, and the step policy drops any step quoting that)."""
    start = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }

    def block(index: int, body: dict[str, Any]) -> bytes:
        return _sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": body},
        )

    def delta(index: int, body: dict[str, Any]) -> bytes:
        return _sse(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": body}
        )

    def stop(index: int) -> bytes:
        return _sse("content_block_stop", {"type": "content_block_stop", "index": index})

    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}
    return Reply(
        [
            _sse("message_start", {"type": "message_start", "message": start}),
            block(0, {"type": "thinking", "thinking": "", "signature": ""}),
            delta(0, {"type": "thinking_delta", "thinking": thought}),
            stop(0),
            block(1, {"type": "text", "text": ""}),
            delta(1, {"type": "text_delta", "text": "The answer."}),
            stop(1),
            _sse("message_delta", {**end, "usage": {"output_tokens": 9}}),
            _sse("message_stop", {"type": "message_stop"}),
        ]
    )


def messages_adapter(model: str, base: str, server: str | None) -> AnthropicProvider:
    extra = {"thoughtgate": {"server": server}} if server else {}
    settings = ProviderSettings(base_url=base, api_key="k", max_retries=0, extra=extra)
    return AnthropicProvider(model, settings, client=httpx.AsyncClient())


#: (model, server named, or None for the loopback host itself) -> the kind its thinking is.
MESSAGES_CASES = [
    ("deepseek-chat", "deepseek"),  # DeepSeek's Anthropic-compatible endpoint
    ("kimi-k2-thinking", "moonshot"),  # Moonshot's
    ("MiniMax-M2", None),  # MiniMax's, reached through a gateway
    ("glm-4.6", None),  # Z.ai's
    ("Qwen/Qwen3-8B", None),  # vLLM / llama.cpp serving /v1/messages
    ("claude-sonnet-4-5", None),  # a Claude name on a server that is not Anthropic's
    ("claude-sonnet-4-5", "deepseek"),  # DeepSeek maps unknown names to its own model
]


@pytest.mark.inprocess
@pytest.mark.parametrize(("model", "server"), MESSAGES_CASES)
async def test_thinking_blocks_from_a_server_that_is_not_anthropics_are_raw(
    model: str, server: str | None
) -> None:
    async with ReplayServer([thinking_stream(model, TAG)]) as replay:
        provider = messages_adapter(model, replay.url, server)
        try:
            turn = await stream_llm_turn(
                provider, TurnRequest([Message.user("Why?")], reasoning=ReasoningRequest(True))
            )
        finally:
            await provider.aclose()
    assert turn.reasoning_text == TAG
    assert {p.reasoning_kind for p in turn.reasoning_parts} == {"raw"}
    assert not provider.capabilities.reasoning_summary


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("model", "server", "kind"),
    [
        ("claude-sonnet-4-5", "anthropic", "summary"),
        ("claude-opus-4-7", "anthropic", "summary"),
        ("claude-3-7-sonnet-20250219", "anthropic", "raw"),  # 3.7 returns its full thinking
        ("claude-opus-5", "anthropic", "raw"),  # a model the table does not know yet
    ],
)
async def test_on_anthropics_own_api_the_claude_table_decides(
    model: str, server: str, kind: str
) -> None:
    async with ReplayServer([thinking_stream(model, TAG)]) as replay:
        provider = messages_adapter(model, replay.url, server)
        try:
            turn = await stream_llm_turn(
                provider, TurnRequest([Message.user("Why?")], reasoning=ReasoningRequest(True))
            )
        finally:
            await provider.aclose()
    assert {p.reasoning_kind for p in turn.reasoning_parts} == {kind}


@pytest.mark.inprocess
@pytest.mark.parametrize(("model", "server"), [("deepseek-chat", "deepseek"), ("glm-4.6", None)])
def test_an_opted_in_viewer_reads_no_step_made_of_raw_reasoning(
    model: str, server: str | None
) -> None:
    async def main() -> dict[str, str]:
        async with ReplayServer([thinking_stream(model, TAG)]) as replay:

            def factory(_: str) -> Any:
                return messages_adapter(model, replay.url, server)

            return await role_reads(factory, f"anthropic:{model}", "surface", config=SUMMARIES)

    reads = asyncio.run(main())
    assert "The answer." in reads["viewer"]
    assert TAG not in reads["viewer"]
    assert TAG in reads["developer"]


@pytest.mark.inprocess
def test_an_opted_in_viewer_reads_claudes_summary_on_anthropics_api() -> None:
    """The other side of the line: the opt-in still works where the label is true."""
    model = "claude-sonnet-4-5"

    async def main() -> dict[str, str]:
        async with ReplayServer([thinking_stream(model, TAG)]) as replay:

            def factory(_: str) -> Any:
                return messages_adapter(model, replay.url, "anthropic")

            return await role_reads(factory, f"anthropic:{model}", "surface", config=SUMMARIES)

    assert TAG in asyncio.run(main())["viewer"]
