"""``smoke()`` against the emulator: every capability proven, and honest reasons when not."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from thoughtgate.engine.smoke import CAPABILITIES, RULES, CapabilityResult, smoke, verdict
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


async def run(
    server: EmulatorServer, model: str, scenario: str | None = None
) -> dict[str, CapabilityResult]:
    # the emulator plays Anthropic's API; its host is 127.0.0.1, so that is named (ADR 0078)
    options: dict[str, object] = {"server": "anthropic"}
    if scenario:
        options["headers"] = {"x-emulator-scenario": scenario}
    extra = {"thoughtgate": options}
    settings = ProviderSettings(base_url=server.url, api_key="k", max_retries=0, extra=extra)
    results = await smoke(f"anthropic:{model}", settings)
    assert [r.name for r in results] == [*CAPABILITIES, *RULES]
    return {r.name: r for r in results}


async def test_everything_is_proven_on_a_thinking_tool_calling_model(
    server: EmulatorServer,
) -> None:
    results = await run(server, "claude-opus-4-7", scenario="claude-smoke")
    assert all(results[name].proven for name in CAPABILITIES), results
    assert all(results[name].claimed for name in CAPABILITIES)
    assert "summary reasoning" in results["reasoning_summary"].detail
    assert results["continuity"].detail.startswith("1 continuity block(s) sent back")
    assert "used the tool result" in results["continuity"].detail
    # the second tool turn really carried the signed block back, first in the assistant message
    bodies = [r.body for r in server.emulator.requests if r.body["model"] == "claude-opus-4-7"]
    second = [b for b in bodies if len(b["messages"]) == 3][-1]
    assert second["messages"][1]["content"][0]["type"] == "thinking"


async def test_the_rules_proven_live_for_a_known_family(server: EmulatorServer) -> None:
    """Claude Sonnet 4.5's row: budget thinking accepted, the ``disabled`` switch accepted with no
    thinking billed, the signed blocks accepted back, the thinking labelled a summary."""
    results = await run(server, "claude-sonnet-4-5", scenario="claude-smoke")
    assert all(results[name].proven for name in RULES), results
    assert "thinking (budget)" in results["rule.reasoning_params"].detail
    assert results["rule.hidden_switch"].detail.startswith('{"thinking": {"type": "disabled"}}')
    assert "thinking blocks sent back" in results["rule.send_back"].detail
    assert results["rule.reasoning_kind"].detail.startswith("summary")
    hidden = [r.body for r in server.emulator.requests if "disabled" in json.dumps(r.body)]
    assert hidden, "the hidden-mode request really carried the switch"


async def test_a_row_without_a_switch_says_so(server: EmulatorServer) -> None:
    """An unknown Claude model gets the conservative row: no switch, so hidden mode is not
    proven to stop thinking, and the check says why."""
    results = await run(server, "claude-smoke")
    hidden = results["rule.hidden_switch"]
    assert not hidden.proven and "no switch" in hidden.detail and "thinks unasked" in hidden.detail
    # nor is its thinking known to be a summary: it is raw, and no summary is claimed (ADR 0078)
    assert not results["reasoning_summary"].claimed
    assert results["rule.reasoning_kind"].detail.startswith("raw")


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
    extra: dict[str, object] = {}
    if provider == "openai":
        # "claude-smoke" is no OpenAI model: the conservative row asks for no reasoning, so the
        # check names the row a new reasoning model would get from thoughtgate.toml
        rules = {
            "surface": {
                "reasoning": {"summary": "auto"},
                "include": ["reasoning.encrypted_content"],
            },
            "fields": ["summary_text"],
            "send_back": "reasoning items (encrypted_content)",
        }
        extra["thoughtgate"] = {"rules": rules}
    settings = ProviderSettings(base_url=server.v1, api_key="k", max_retries=0, extra=extra)
    results = {r.name: r for r in await smoke(f"{provider}:claude-smoke", settings)}
    assert results["streaming"].proven and results["reasoning_text"].proven
    assert results["tools"].proven and results["continuity"].proven, results


async def test_an_adapter_without_endpoint_rules_is_not_told_a_request_failed() -> None:
    """The fake provider has no endpoint rows: its rule checks are named as not claimed, not as
    checks a failed request kept from being made (which would say the provider was down)."""
    results = {r.name: r for r in await smoke("fake:echo")}
    for name in RULES:
        assert results[name].claimed is False and not results[name].unreached, results[name]
    line = verdict(list(results.values()))
    assert not line.unreached and "could not be made" not in line.summary, line
    assert "not claimed for this model: " in line.summary and "rule.send_back" in line.summary
