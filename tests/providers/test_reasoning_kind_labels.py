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
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from support.replay import ReplayServer, Reply
from support.viewer import role_reads

from thoughtgate.config import Config
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.orchestration.runtime import provider_settings_from_config
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.providers.rules import WireFormat, known_servers, resolve_rule
from thoughtgate.types import Message, Turn

TAG = "Weighing the rawchainofthought figures"
SUMMARIES = Config.from_mapping(
    {"visible_reasoning": {"summarizers": ["provider_summaries", "phases"]}}
)
"""The operator's explicit opt-in: end users may read the provider's summaries."""


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def thinking_stream(model: str, thought: str) -> Reply:
    """``/v1/messages`` events of a thinking block, then a text block, as an Anthropic-compatible
    server sends them: without a signature (such servers have no key to sign with, so nothing of
    the block is kept to send back: only its label decides whether a step may show it)."""
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


async def served_turn(reply: Reply, make: Callable[[str], Any]) -> tuple[Turn, Any]:
    """One streamed turn, reasoning wanted, from the adapter ``make(url)`` builds for a loopback
    server that answers ``reply``; and that adapter."""
    async with ReplayServer([reply]) as replay:
        provider = make(replay.url)
        try:
            request = TurnRequest([Message.user("Why?")], reasoning=ReasoningRequest(True))
            return await stream_llm_turn(provider, request), provider
        finally:
            await provider.aclose()


def reads_with_summaries(reply: Reply, make: Callable[[str], Any], model: str) -> dict[str, str]:
    """What a viewer and a developer read of a ``surface`` run on ``model`` whose adapter
    ``make(url)`` builds, the operator having named ``provider_summaries``."""

    async def main() -> dict[str, str]:
        async with ReplayServer([reply]) as replay:
            return await role_reads(lambda _: make(replay.url), model, "surface", config=SUMMARIES)

    return asyncio.run(main())


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
    turn, provider = await served_turn(
        thinking_stream(model, TAG), lambda url: messages_adapter(model, url, server)
    )
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
    turn, _ = await served_turn(
        thinking_stream(model, TAG), lambda url: messages_adapter(model, url, server)
    )
    assert {p.reasoning_kind for p in turn.reasoning_parts} == {kind}


@pytest.mark.inprocess
@pytest.mark.parametrize(("model", "server"), [("deepseek-chat", "deepseek"), ("glm-4.6", None)])
def test_an_opted_in_viewer_reads_no_step_made_of_raw_reasoning(
    model: str, server: str | None
) -> None:
    reads = reads_with_summaries(
        thinking_stream(model, TAG),
        lambda url: messages_adapter(model, url, server),
        f"anthropic:{model}",
    )
    assert "The answer." in reads["viewer"]
    assert TAG not in reads["viewer"]
    assert TAG in reads["developer"]


@pytest.mark.inprocess
def test_an_opted_in_viewer_reads_claudes_summary_on_anthropics_api() -> None:
    """The other side of the line: the opt-in still works where the label is true."""
    model = "claude-sonnet-4-5"

    reads = reads_with_summaries(
        thinking_stream(model, TAG),
        lambda url: messages_adapter(model, url, "anthropic"),
        f"anthropic:{model}",
    )
    assert TAG in reads["viewer"]


# --------------------------------------------------------------------------- the rules


#: (format, model, server, the kind of its reasoning, whether a part the format marks as a summary
#: may be one)
RULE_CASES = [
    ("anthropic", "claude-sonnet-4-5", "anthropic", "summary", True),
    ("anthropic", "claude-opus-4-6", "anthropic", "summary", True),
    ("anthropic", "claude-opus-4.7", "anthropic", "summary", True),
    ("anthropic", "claude-fable-5", "anthropic", "summary", True),
    ("anthropic", "claude-3-7-sonnet-20250219", "anthropic", "raw", False),
    ("anthropic", "claude-opus-5", "anthropic", "raw", False),
    ("anthropic", "claude-sonnet-4-5", "generic", "raw", False),
    ("anthropic", "claude-sonnet-4-5", "deepseek", "raw", False),
    ("anthropic", "deepseek-chat", "deepseek", "raw", False),
    ("anthropic", "kimi-k2-thinking", "moonshot", "raw", False),
    ("anthropic", "glm-4.6", "generic", "raw", False),
    ("openai-responses", "gpt-5", "openai", "summary", True),
    ("openai-responses", "gpt-5.1", "azure", "summary", True),
    ("openai-responses", "gpt-5", "generic", "raw", False),
    ("openai-responses", "o3", "ollama", "raw", False),
    ("openai-responses", "gpt-oss-20b", "generic", "raw", False),
    ("openai-responses", "gpt-oss-20b", "openai", "raw", False),
    ("openai-responses", "deepseek-r1", "ollama", "raw", False),
    ("openrouter", "anthropic/claude-sonnet-4.5", "openrouter", "summary", True),
    ("openrouter", "anthropic/claude-sonnet-4.5", "generic", "raw", False),
    ("openrouter", "anthropic/claude-opus-5", "openrouter", "raw", True),
    ("openrouter", "openai/gpt-5-mini", "openrouter", "summary", True),
    ("openrouter", "openai/gpt-5-mini", "generic", "raw", False),
    ("openrouter", "deepseek/deepseek-r1", "openrouter", "raw", True),
    ("openrouter", "deepseek/deepseek-r1", "generic", "raw", False),
    ("openai-compatible", "deepseek-reasoner", "deepseek", "raw", False),
    ("openai-compatible", "gpt-5", "generic", "raw", False),
]


@pytest.mark.unit
@pytest.mark.parametrize(("fmt", "model", "server", "kind", "marks"), RULE_CASES)
def test_a_summary_only_where_the_server_vouches_for_it(
    fmt: WireFormat, model: str, server: str, kind: str, marks: bool
) -> None:
    rule = resolve_rule(fmt, model, server=server)
    assert (rule.reasoning_kind, rule.marks_summaries) == (kind, marks)


@pytest.mark.unit
@pytest.mark.parametrize(
    "fmt", ["anthropic", "openai-responses", "openrouter", "openai-compatible"]
)
def test_no_server_but_the_ones_a_row_names_ever_gets_a_summary(fmt: WireFormat) -> None:
    models = {m for _, m, *_ in RULE_CASES} | {"some-model", "vendor/some-model"}
    for model in models:
        for server in known_servers():
            rule = resolve_rule(fmt, model, server=server)
            if rule.reasoning_kind == "summary" or rule.marks_summaries:
                assert server in rule.summary_servers, (model, server)


@pytest.mark.unit
def test_the_operator_may_vouch_for_a_server_the_tables_do_not_know() -> None:
    """``reasoning_kind = "summary"`` in ``thoughtgate.toml`` is the operator's word for their
    gateway; naming the ``server`` behind it is the other way."""
    rule = resolve_rule("anthropic", "claude-sonnet-4-5", overrides={"reasoning_kind": "summary"})
    assert (rule.reasoning_kind, rule.marks_summaries) == ("summary", True)
    assert resolve_rule("anthropic", "claude-sonnet-4-5", server="anthropic").marks_summaries


# --------------------------------------------------------------------------- the other formats


def _data(payload: dict[str, Any] | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def responses_summary_stream(model: str, thought: str) -> Reply:
    """``/v1/responses`` events of a reasoning item whose summary text is ``thought`` (as Ollama
    sends a thinking model's raw reasoning), then a message."""
    reasoning = {"type": "reasoning", "id": "rs_1"}
    summary = [{"type": "summary_text", "text": thought}]
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed"}
    part = {"type": "output_text", "text": "The answer.", "annotations": []}
    usage = {"input_tokens": 5, "output_tokens": 9}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {"id": "resp_1", "model": model, "output": []}},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**reasoning, "summary": []},
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "delta": thought,
        },
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**reasoning, "summary": summary},
        },
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {**message, "content": []},
        },
        {
            "type": "response.output_text.delta",
            "output_index": 1,
            "content_index": 0,
            "delta": "The answer.",
        },
        {
            "type": "response.output_item.done",
            "output_index": 1,
            "item": {**message, "content": [part]},
        },
        {
            "type": "response.completed",
            "response": {"id": "resp_1", "model": model, "status": "completed", "usage": usage},
        },
    ]
    return Reply([_data(e) for e in events])


def openrouter_summary_stream(model: str, thought: str) -> Reply:
    """Chat Completions chunks whose ``reasoning_details`` carry a ``reasoning.summary``."""
    detail = {"type": "reasoning.summary", "summary": thought, "index": 0, "format": "unknown"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _data({"id": "gen-1", "model": model, "choices": [choice]})

    return Reply(
        [
            chunk({"role": "assistant", "content": "", "reasoning_details": [detail]}),
            chunk({"content": "The answer."}),
            chunk({}, "stop"),
            _data("[DONE]"),
        ]
    )


def other_adapter(fmt: str, model: str, base: str, server: str | None) -> Any:
    extra = {"thoughtgate": {"server": server}} if server else {}
    settings = ProviderSettings(base_url=f"{base}/v1", api_key="k", max_retries=0, extra=extra)
    cls = OpenAIResponsesProvider if fmt == "responses" else OpenRouterProvider
    return cls(model, settings, client=httpx.AsyncClient())


def summary_stream(fmt: str, model: str, thought: str) -> Reply:
    if fmt == "responses":
        return responses_summary_stream(model, thought)
    return openrouter_summary_stream(model, thought)


#: (format, model, server named or None for the loopback host, the kind its summary text gets)
SUMMARY_CASES = [
    ("responses", "deepseek-r1:8b", "ollama", "raw"),
    ("responses", "Qwen/Qwen3-8B", None, "raw"),  # vLLM, llama.cpp
    ("responses", "gpt-5", None, "raw"),  # an OpenAI name on a server that is not OpenAI's
    ("responses", "gpt-5", "openai", "summary"),
    ("responses", "gpt-5", "azure", "summary"),
    ("openrouter", "openai/gpt-5-mini", None, "raw"),  # a gateway that speaks OpenRouter's format
    ("openrouter", "openai/gpt-5-mini", "openrouter", "summary"),
    ("openrouter", "deepseek/deepseek-r1", "openrouter", "summary"),  # the type says so there
]


@pytest.mark.inprocess
@pytest.mark.parametrize(("fmt", "model", "server", "kind"), SUMMARY_CASES)
async def test_summary_text_is_a_summary_only_on_a_server_that_means_it(
    fmt: str, model: str, server: str | None, kind: str
) -> None:
    turn, provider = await served_turn(
        summary_stream(fmt, model, TAG), lambda url: other_adapter(fmt, model, url, server)
    )
    assert turn.reasoning_text == TAG and turn.text == "The answer."
    assert {p.reasoning_kind for p in turn.reasoning_parts if p.text} == {kind}
    assert provider.capabilities.reasoning_summary == (kind == "summary")


@pytest.mark.inprocess
@pytest.mark.parametrize(
    ("fmt", "model", "server"),
    [("responses", "deepseek-r1:8b", "ollama"), ("openrouter", "openai/gpt-5-mini", None)],
)
def test_an_opted_in_viewer_reads_no_step_made_of_summary_text_nobody_vouches_for(
    fmt: str, model: str, server: str | None
) -> None:
    prefix = "openai" if fmt == "responses" else "openrouter"

    reads = reads_with_summaries(
        summary_stream(fmt, model, TAG),
        lambda url: other_adapter(fmt, model, url, server),
        f"{prefix}:{model}",
    )
    assert "The answer." in reads["viewer"]
    assert TAG not in reads["viewer"]
    assert TAG in reads["developer"]


@pytest.mark.unit
@pytest.mark.parametrize(("server", "kind"), [(None, "raw"), ("anthropic", "summary")])
def test_behind_a_gateway_naming_anthropics_server_in_thoughtgate_toml_vouches(
    server: str | None, kind: str
) -> None:
    section: dict[str, Any] = {"base_url": "https://llm-gateway.internal", "api_key": "k"}
    if server:
        section["server"] = server
    config = Config.from_mapping({"providers": {"anthropic": section}})
    settings = provider_settings_from_config(config, "anthropic:claude-sonnet-4-5")
    assert AnthropicProvider("claude-sonnet-4-5", settings).rule.reasoning_kind == kind
