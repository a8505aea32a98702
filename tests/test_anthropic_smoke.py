"""``smoke()`` against the emulator: every capability proven, and honest reasons when not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from thoughtgate.engine.smoke import CAPABILITIES, CapabilityResult, smoke
from thoughtgate.errors import UnknownProviderError
from thoughtgate.providers.base import ProviderSettings
from thoughtgate.testing.emulator import (
    Call,
    Emulator,
    EmulatorServer,
    Fail,
    Redacted,
    Say,
    Scenario,
    ScriptedTurn,
    Think,
    serve_emulator,
)

SCENARIOS = [
    Scenario(
        "claude-smoke",
        (
            ScriptedTurn(
                (
                    Think("Short answer; and I was offered a tool."),
                    Say("Rayleigh scattering."),
                    Call("get_secret_number", {}),
                )
            ),
            ScriptedTurn((Think("The tool said 4817."), Say("Your secret number is 4817."))),
        ),
    ),
    Scenario("claude-plain", (ScriptedTurn((Say("Blue light scatters most."),)),)),
    Scenario("claude-redacted-only", (ScriptedTurn((Redacted("x"), Say("Scattering."))),)),
    Scenario(
        "claude-down",
        (ScriptedTurn((Fail(401, "authentication_error", "invalid x-api-key", times=99),)),),
    ),
]


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator()
    for scenario in SCENARIOS:
        emulator.add(scenario)
    with serve_emulator(emulator) as running:
        yield running


async def run(server: EmulatorServer, model: str) -> dict[str, CapabilityResult]:
    settings = ProviderSettings(base_url=server.url, api_key="k", max_retries=0)
    results = await smoke(f"anthropic:{model}", settings)
    assert [r.name for r in results] == list(CAPABILITIES)
    return {r.name: r for r in results}


async def test_everything_is_proven_on_a_thinking_tool_calling_model(
    server: EmulatorServer,
) -> None:
    results = await run(server, "claude-smoke")
    assert all(r.proven for r in results.values()), results
    assert all(r.claimed for r in results.values())
    assert "summary reasoning" in results["reasoning_summary"].detail
    assert results["continuity"].detail.startswith("1 continuity block(s) sent back")
    assert "used the tool result" in results["continuity"].detail
    # the second tool turn really carried the signed block back, first in the assistant message
    second = [r.body for r in server.emulator.requests if r.body["model"] == "claude-smoke"][-1]
    assert second["messages"][1]["content"][0]["type"] == "thinking"


async def test_a_model_that_does_not_reason_or_call_tools_says_so(server: EmulatorServer) -> None:
    results = await run(server, "claude-plain")
    assert results["streaming"].proven
    assert not results["reasoning_text"].proven
    assert results["reasoning_text"].detail.startswith("no reasoning came back")
    assert (
        not results["tools"].proven
        and "without calling get_secret_number" in results["tools"].detail
    )
    assert not results["continuity"].proven and "needs a tool call" in results["continuity"].detail


async def test_unreadable_reasoning_is_not_counted_as_reasoning_text(
    server: EmulatorServer,
) -> None:
    results = await run(server, "claude-redacted-only")
    assert not results["reasoning_text"].proven
    assert "without readable text" in results["reasoning_text"].detail


async def test_failing_calls_become_reasons_not_exceptions(server: EmulatorServer) -> None:
    results = await run(server, "claude-down")
    assert not any(r.proven for r in results.values())
    assert (
        "401" in results["streaming"].detail and "invalid x-api-key" in results["streaming"].detail
    )
    assert "the tool request failed" in results["tools"].detail


async def test_a_bad_model_string_still_raises() -> None:
    with pytest.raises(UnknownProviderError):
        await smoke("nonsense")


@pytest.mark.parametrize("provider", ["openai", "openai-compatible"])
async def test_the_same_check_runs_on_the_openai_family_adapters(
    server: EmulatorServer, provider: str
) -> None:
    settings = ProviderSettings(base_url=server.v1, api_key="k", max_retries=0)
    results = {r.name: r for r in await smoke(f"{provider}:claude-smoke", settings)}
    assert results["streaming"].proven and results["reasoning_text"].proven
    assert results["tools"].proven and results["continuity"].proven, results
