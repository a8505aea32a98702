"""Request bodies the Anthropic adapter sends, per disclosure mode and model family.

Bodies are captured by the emulator, which validates them as the real API does, so every body
asserted here was also accepted by the emulator's checks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import UsageError
from thoughtgate.providers.anthropic import (
    AnthropicProvider,
    model_family,
    normalize_model,
    to_anthropic_messages,
)
from thoughtgate.providers.base import (
    ProviderSettings,
    ReasoningRequest,
    ToolSpec,
    TurnRequest,
    create_provider,
)
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator
from thoughtgate.testing.emulator.scenarios import builtin_scenarios
from thoughtgate.types import (
    ContinuityBlock,
    Message,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator()
    for scenario in builtin_scenarios().values():
        emulator.add(scenario)
    emulator.default = "think-and-answer"
    with serve_emulator(emulator) as running:
        yield running


def provider(server: EmulatorServer, model: str) -> AnthropicProvider:
    return AnthropicProvider(model, ProviderSettings(base_url=server.url, api_key="k"))


async def sent_body(server: EmulatorServer, model: str, request: TurnRequest) -> dict[str, Any]:
    before = len(server.emulator.requests)
    adapter = provider(server, model)
    await stream_llm_turn(adapter, request)
    await adapter.aclose()
    record = server.emulator.requests[before]
    assert record.status == 200, record
    body: dict[str, Any] = record.body
    return body


def ask(mode: str, **kw: Any) -> TurnRequest:
    effort = kw.pop("effort", None)
    budget = kw.pop("budget_tokens", None)
    reasoning = ReasoningRequest.for_mode(mode, effort=effort, budget_tokens=budget)
    return TurnRequest([Message.user("Why is the sky blue?")], reasoning=reasoning, **kw)


BUDGET_MODELS = [
    "claude-3-7-sonnet-20250219",
    "claude-sonnet-4-20250514",
    "claude-sonnet-4-0",
    "claude-opus-4-1-20250805",
    "claude-sonnet-4-5",
    "claude-haiku-4-5-20251001",
    "claude-opus-4-5",
]
ADAPTIVE_MODELS = [
    "claude-opus-4-6",
    "claude-sonnet-4-6",
    "claude-opus-4-7",
    "claude-opus-4-8",
    "claude-sonnet-5",
    "claude-opus-5",
    "claude-fable-5",
    "claude-mythos-5",
    "claude-mythos-preview",
    "claude-nova-9-20300101",  # an unknown future model
]


@pytest.mark.parametrize("model", BUDGET_MODELS)
@pytest.mark.parametrize("mode", ["surface", "telemetry_only"])
async def test_budget_family_gets_enabled_thinking_and_raised_max_tokens(
    server: EmulatorServer, model: str, mode: str
) -> None:
    body = await sent_body(server, model, ask(mode, max_tokens=2000))
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert body["max_tokens"] == 2000 + 4096
    assert "output_config" not in body
    assert body["stream"] is True


@pytest.mark.parametrize("model", ADAPTIVE_MODELS)
async def test_adaptive_family_gets_summarized_adaptive_thinking(
    server: EmulatorServer, model: str
) -> None:
    body = await sent_body(server, model, ask("surface", max_tokens=2000, effort="xhigh"))
    assert body["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert body["output_config"] == {"effort": "xhigh"}
    assert body["max_tokens"] == 2000


SWITCHABLE = [*BUDGET_MODELS, *ADAPTIVE_MODELS[:4]]
"""Families whose rule has the switch: hidden mode turns their thinking off explicitly."""


@pytest.mark.parametrize("model", SWITCHABLE)
async def test_hidden_mode_switches_thinking_off(server: EmulatorServer, model: str) -> None:
    body = await sent_body(server, model, ask("hidden", max_tokens=700, temperature=0.2))
    assert body["thinking"] == {"type": "disabled"} and "output_config" not in body
    assert body["max_tokens"] == 700
    assert body["temperature"] == 0.2, "a temperature is allowed with thinking disabled"


@pytest.mark.parametrize(
    "model", [*[m for m in ADAPTIVE_MODELS if m not in SWITCHABLE], "claude-3-5-sonnet-20241022"]
)
async def test_hidden_mode_sends_no_switch_where_the_family_has_none(
    server: EmulatorServer, model: str
) -> None:
    """Claude 3.5 has no thinking to switch off; Fable / Mythos refuse ``disabled``; unknown
    models get the conservative choice (no parameter that could be refused)."""
    body = await sent_body(server, model, ask("hidden", max_tokens=700, temperature=0.2))
    assert "thinking" not in body and "output_config" not in body
    assert body["max_tokens"] == 700
    # a model that may think unasked refuses a temperature other than 1, as with thinking on
    assert ("temperature" in body) == (model == "claude-3-5-sonnet-20241022")


async def test_models_without_extended_thinking_are_never_sent_thinking(
    server: EmulatorServer,
) -> None:
    body = await sent_body(server, "claude-3-5-sonnet-20241022", ask("surface"))
    assert "thinking" not in body


@pytest.mark.parametrize(
    ("effort", "budget", "expected"),
    [
        ("low", None, 2048),
        ("high", None, 8192),
        ("max", None, 32000),
        (None, 500, 1024),
        (None, 9000, 9000),
    ],
)
async def test_budget_follows_effort_or_explicit_budget_and_never_goes_below_1024(
    server: EmulatorServer, effort: str | None, budget: int | None, expected: int
) -> None:
    request = ask("surface", max_tokens=1000, effort=effort, budget_tokens=budget)
    body = await sent_body(server, "claude-sonnet-4-5", request)
    assert body["thinking"]["budget_tokens"] == expected
    assert body["max_tokens"] == 1000 + expected


async def test_minimal_effort_maps_to_low_on_adaptive_models(server: EmulatorServer) -> None:
    body = await sent_body(server, "claude-opus-4-7", ask("surface", effort="minimal"))
    assert body["output_config"] == {"effort": "low"}
    body = await sent_body(server, "claude-opus-4-7", ask("surface"))
    assert "output_config" not in body  # the API's default effort applies


async def test_temperature_is_dropped_when_thinking_is_on(server: EmulatorServer) -> None:
    body = await sent_body(server, "claude-sonnet-4-5", ask("surface", temperature=0.3))
    assert "temperature" not in body


def test_family_table_reads_dated_cloud_and_dotted_names() -> None:
    assert normalize_model("us.anthropic.claude-sonnet-4-5-20250929-v1:0") == "claude-sonnet-4-5"
    assert normalize_model("claude-opus-4-1@20250805") == "claude-opus-4-1"
    assert normalize_model("anthropic/claude-opus-4.7") == "claude-opus-4-7"
    assert normalize_model("claude-3-7-sonnet-latest") == "claude-3-7-sonnet"
    assert model_family("claude-3-7-sonnet-20250219").reasoning_kind == "raw"
    assert model_family("claude-sonnet-4-20250514").thinking == "budget"
    assert model_family("claude-sonnet-4-6").thinking == "adaptive"
    assert model_family("claude-3-haiku-20240307").thinking == "none"
    assert model_family("us.anthropic.claude-opus-4-7").thinking == "adaptive"


def test_reasoning_summary_capability_follows_the_family() -> None:
    settings = ProviderSettings(api_key="k")
    assert AnthropicProvider("claude-sonnet-4-5", settings).capabilities.reasoning_summary
    old = AnthropicProvider("claude-3-7-sonnet-latest", settings).capabilities
    assert old.reasoning_text and not old.reasoning_summary and old.continuity and old.tools


# --------------------------------------------------------------------------- messages


MODEL = "claude-sonnet-4-5"
SIGNED = {"type": "thinking", "thinking": "Plan: call the tool.", "signature": "EqSig=="}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3"}


def _assistant(model: str = MODEL, provider: str = "anthropic") -> Message:
    return Message(
        "assistant",
        (
            TextPart("\n\n"),
            ReasoningPart("Plan: call the tool.", provider=provider, model=model, signature="x"),
            ContinuityBlock(
                "anthropic.redacted_thinking", REDACTED, provider=provider, model=model
            ),
            ContinuityBlock("anthropic.thinking", SIGNED, provider=provider, model=model),
            TextPart("Checking."),
            ToolCallPart("toolu_1", "lookup", arguments_json='{"q": "x"}'),
        ),
    )


def test_continuity_blocks_go_first_unchanged_and_reasoning_text_never() -> None:
    history = [
        Message.system("Be brief."),
        Message.user("Find x."),
        _assistant(),
        Message("tool", (ToolResultPart("toolu_1", "42"),)),
        Message.user("And then?"),
    ]
    system, messages = to_anthropic_messages(history, model=MODEL, system="You are careful.")
    assert system == "You are careful.\n\nBe brief."
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "Find x."}]},
        {
            "role": "assistant",
            "content": [
                REDACTED,
                SIGNED,
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": "x"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
                {"type": "text", "text": "And then?"},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("model", "provider_name"), [("claude-opus-4-7", "anthropic"), (MODEL, "openrouter")]
)
def test_blocks_from_another_model_or_provider_are_not_sent(model: str, provider_name: str) -> None:
    _, messages = to_anthropic_messages(
        [Message.user("Find x."), _assistant(model, provider_name)], model=MODEL
    )
    types = [b["type"] for b in messages[1]["content"]]
    assert types == ["text", "tool_use"]
    assert "Plan: call the tool." not in json.dumps(messages)


def test_error_results_and_tools_are_shaped_for_the_api() -> None:
    adapter = AnthropicProvider(MODEL, ProviderSettings(api_key="k"))
    tool = ToolSpec("lookup", "Look a thing up.", {"type": "object", "properties": {}})
    request = TurnRequest(
        [
            Message.user("Find x."),
            _assistant(),
            Message("tool", (ToolResultPart("toolu_1", "boom", is_error=True),)),
        ],
        tools=[tool],
        reasoning=ReasoningRequest(True),
    )
    body = adapter.build_body(request, stream=False)
    assert body["tools"] == [
        {
            "name": "lookup",
            "description": "Look a thing up.",
            "input_schema": {"type": "object", "properties": {}},
        }
    ]
    assert body["messages"][-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom", "is_error": True}
    ]
    assert body["thinking"]["type"] == "enabled" and "stream" not in body


def test_tool_loop_without_a_replayable_block_goes_without_thinking() -> None:
    adapter = AnthropicProvider(MODEL, ProviderSettings(api_key="k"))
    request = TurnRequest(
        [
            Message.user("Find x."),
            _assistant("claude-opus-4-7"),  # another model's blocks cannot be replayed
            Message("tool", (ToolResultPart("toolu_1", "42"),)),
        ],
        reasoning=ReasoningRequest(True),
        max_tokens=1000,
    )
    body = adapter.build_body(request, stream=True)
    assert "thinking" not in body and body["max_tokens"] == 1000


# --------------------------------------------------------------------------- key, URL, headers


def test_missing_key_is_a_usage_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(UsageError, match="ANTHROPIC_API_KEY"):
        create_provider("anthropic:claude-sonnet-4-5")


async def test_key_and_base_url_come_from_the_environment(
    server: EmulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url + "/v1")  # a /v1 suffix is tolerated
    adapter = create_provider("anthropic:claude-sonnet-4-5")
    turn = await adapter.request(ask("surface"))
    await adapter.aclose()
    assert turn.text.startswith("The sky looks blue")
    record = server.emulator.requests[-1]
    assert record.path == "/v1/messages"
    assert record.headers["x-api-key"] == "env-key"
    assert record.headers["anthropic-version"] == "2023-06-01"


def test_default_base_url_is_the_api_host_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    adapter = AnthropicProvider(MODEL, ProviderSettings(api_key="k"))
    assert adapter.transport.url(adapter.path) == "https://api.anthropic.com/v1/messages"


# --------------------------------------------------------------------------- the tool loop


@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "claude-opus-4-7"])
async def test_three_turn_tool_loop_replays_continuity_the_emulator_verifies(
    server: EmulatorServer, model: str
) -> None:
    adapter = AnthropicProvider(
        model,
        ProviderSettings(
            base_url=server.url,
            api_key="k",
            extra={"thoughtgate": {"headers": {"x-emulator-scenario": "tool-loop"}}},
        ),
    )
    history: list[Message] = [Message.user("What is the largest city in my country?")]
    before = len(server.emulator.requests)
    texts = []
    for _ in range(3):
        request = TurnRequest(history, reasoning=ReasoningRequest(True), tools=[])
        turn = await stream_llm_turn(adapter, request)
        texts.append(turn.text)
        history.append(turn.as_message())
        history += [
            Message("tool", (ToolResultPart(c.call_id, "Mexico"),)) for c in turn.tool_calls
        ]
    await adapter.aclose()
    records = server.emulator.requests[before:]
    assert [r.status for r in records] == [200, 200, 200]
    assert texts[-1] == "The largest city in your country is Mexico City."
    assert all(r.headers["x-emulator-scenario"] == "tool-loop" for r in records)
    # the second and third requests carried the previous turns' signed blocks, first and unchanged
    second = records[1].body["messages"][1]["content"]
    assert second[0]["type"] == "thinking" and second[0]["signature"]
    assert second[0]["thinking"].startswith("I need the user's country")


def test_settings_extra_adds_body_fields_and_none_removes_them() -> None:
    settings = ProviderSettings(
        api_key="k",
        extra={
            "metadata": {"user_id": "u1"},
            "output_config": None,
            "thoughtgate": {"headers": {"anthropic-beta": "b1"}},
        },
    )
    adapter = AnthropicProvider("claude-opus-4-7", settings)
    body = adapter.build_body(ask("surface", effort="high"), stream=False)
    assert body["metadata"] == {"user_id": "u1"}
    assert "output_config" not in body and "thoughtgate" not in body
    assert body["thinking"] == {"type": "adaptive", "display": "summarized"}
    assert adapter.transport._headers["anthropic-beta"] == "b1"
