"""The three OpenAI-style adapters inside the real runtime and agent loop, against the emulator."""

from __future__ import annotations

import json

import httpx
import pytest

from thoughtgate.access.filter import filter_events
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.events.schema import EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import Provider, ProviderSettings, split_model
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.emulator import EmulatorServer

CLASSES = {
    "openrouter": OpenRouterProvider,
    "openai": OpenAIResponsesProvider,
    "openai-compatible": OpenAICompatibleProvider,
}


@tool
def get_country() -> str:
    """The user's country."""
    return "Mexico"


@tool
def largest_city(country: str) -> str:
    """The largest city of a country."""
    return "Mexico City"


@pytest.mark.parametrize(
    ("model", "flavor"),
    [
        ("openrouter:anthropic/claude-sonnet-4.5", "openrouter"),
        ("openai:gpt-5", None),
        ("openai-compatible:deepseek-chat", "deepseek"),
        ("openai-compatible:qwq-32b", "think-tags"),
    ],
)
@pytest.mark.parametrize("mode", ["surface", "hidden", "telemetry_only"])
async def test_tool_loop_run_per_mode(
    server: EmulatorServer, model: str, flavor: str | None, mode: str
) -> None:
    made: list[Provider] = []

    def factory(name: str) -> Provider:
        prefix, bare = split_model(name)
        headers = {"x-emulator-scenario": "tool-loop"}
        if flavor:
            headers["x-emulator-flavor"] = flavor
        settings = ProviderSettings(base_url=server.v1, api_key="k", max_retries=0)
        made.append(CLASSES[prefix](bare, settings, client=httpx.AsyncClient(headers=headers)))
        return made[-1]

    runtime = Runtime(
        MemoryStore(), provider_factory=factory, tools=ToolRegistry([get_country, largest_city])
    )
    run = await runtime.run(
        RunRequest("Largest city in my country?", model=model), chain_of_thought=mode
    )
    for provider in made:
        await provider.aclose()
    assert run.status == "completed"
    events = await runtime.store.read(run.run_id)
    types = [e.type for e in events]
    # raw reasoning is recorded as live deltas only in surface mode (telemetry_only keeps it for
    # the trace; hidden never asked for it)
    assert (EventType.REASONING_DELTA in types) == (mode == "surface")
    completed = [e for e in events if e.type == EventType.MESSAGE_COMPLETED]
    assert completed[-1].payload["text"] == "The largest city in your country is Mexico City."
    # the provider's opaque blocks never leave through the output filter, even for an owner
    shown = filter_events(events, "owner", mode=mode)
    log = json.dumps([e.payload for e in shown], default=str)
    assert "gAAAA" not in log and "encrypted_content" not in log
    signatures = [
        part.get("signature")
        for e in shown
        for part in e.payload.get("reasoning_parts", [])
        if part.get("signature") is not None
    ]
    assert all(s == {"carrier": "signature", "present": True} for s in signatures), signatures
