"""The endpoint rules as data: resolution, the conservative fallback, overrides from
``thoughtgate.toml``, one reasoning kind per model family whatever the route, and the docs table
rendered from the same rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from thoughtgate.config import Config
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ConfigError
from thoughtgate.orchestration.runtime import provider_settings_from_config
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import ProviderSettings, ReasoningRequest, TurnRequest
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.providers.rules import (
    ANTHROPIC_RULES,
    COMPAT_RULES,
    OPENROUTER_RULES,
    RESPONSES_RULES,
    anthropic_rule,
    apply_overrides,
    detect_server,
    endpoint_table,
    resolve_rule,
)
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator
from thoughtgate.testing.emulator.scenarios import builtin_scenarios
from thoughtgate.types import Message

DOCS = Path(__file__).resolve().parents[1] / "docs" / "providers" / "endpoints.md"
TABLES = (ANTHROPIC_RULES, RESPONSES_RULES, OPENROUTER_RULES, COMPAT_RULES)


@pytest.mark.parametrize("rules", TABLES, ids=["anthropic", "responses", "openrouter", "compat"])
def test_every_table_ends_with_a_conservative_row_and_cites_its_sources(rules: tuple) -> None:  # type: ignore[type-arg]
    last = rules[-1]
    assert (last.server, last.pattern) == ("*", r".*")
    assert all(r.source for r in rules), "every row says where its facts come from"


def test_unknown_models_and_servers_get_the_conservative_choice() -> None:
    unknown = resolve_rule("openai-responses", "gpt-9-turbo")
    assert unknown.surface is None and unknown.hidden is None and unknown.effort is None
    compat = resolve_rule("openai-compatible", "some/model", server="generic")
    assert compat.hidden is None and compat.surface is None and compat.echo_only
    router = resolve_rule("openrouter", "mistralai/magistral-medium")
    assert router.hidden == {"reasoning": {"exclude": True}}
    claude = resolve_rule("anthropic", "claude-nova-9")
    assert claude.hidden is None and claude.thinks_unasked  # no parameter that could be refused


@pytest.mark.parametrize(
    ("url", "server"),
    [
        ("https://api.deepseek.com/v1", "deepseek"),
        ("https://api.groq.com/openai/v1", "groq"),
        ("https://api.cerebras.ai/v1", "cerebras"),
        ("https://api.together.xyz/v1", "together"),
        ("https://api.x.ai/v1", "xai"),
        ("https://dashscope-intl.aliyuncs.com/compatible-mode/v1", "dashscope"),
        ("https://api.moonshot.ai/v1", "moonshot"),
        ("https://my-resource.openai.azure.com/openai/v1", "azure"),
        ("http://localhost:11434/v1", "ollama"),
        ("http://localhost:8000/v1", "generic"),
        ("https://evil-api.groq.com.example.org/v1", "generic"),
    ],
)
def test_servers_are_found_from_the_host(url: str, server: str) -> None:
    assert detect_server(url) == server


def test_the_row_per_server() -> None:
    groq = resolve_rule("openai-compatible", "openai/gpt-oss-120b", server="groq")
    assert groq.send_back is None and groq.fields == ("reasoning",)
    cerebras = resolve_rule("openai-compatible", "gpt-oss-120b", server="cerebras")
    assert cerebras.send_back is None
    deepseek = resolve_rule("openai-compatible", "deepseek-chat", server="deepseek")
    assert deepseek.send_back == "reasoning_content" and deepseek.send_back_required
    assert deepseek.hidden == {"thinking": {"type": "disabled"}}
    xai = resolve_rule("openai-compatible", "grok-3-mini", server="xai")
    assert not xai.reasoning_in_output
    gpt4o = resolve_rule("openai-responses", "gpt-4o-2024-08-06")
    assert gpt4o.surface is None and not gpt4o.reasons
    assert resolve_rule("openai-responses", "gpt-5-chat-latest").surface is None
    assert resolve_rule("openai-responses", "o3").surface is not None


_SAMPLES = {
    "Claude Sonnet 3.7": "claude-3-7-sonnet-20250219",
    "Claude 2 / 3 / 3.5": "claude-3-5-sonnet-20241022",
    "Claude Opus/Sonnet/Haiku 4, 4.1, 4.5": "claude-sonnet-4-5",
    "Claude Opus/Sonnet 4.6": "claude-opus-4-6",
    "Claude Opus 4.7 / 4.8": "claude-opus-4-7",
    "Claude Fable / Mythos": "claude-fable-5",
    "newer or unknown Claude models": "claude-opus-5",
}


@pytest.mark.parametrize("family", [r.family for r in ANTHROPIC_RULES])
def test_one_family_one_kind_and_one_switch_whatever_the_route(family: str) -> None:
    model = _SAMPLES[family]
    direct = resolve_rule("anthropic", model, server="anthropic")
    assert direct.family == family
    dotted = model.replace("-4-5", "-4.5").replace("-4-6", "-4.6").replace("-4-7", "-4.7")
    routed = resolve_rule("openrouter", f"anthropic/{dotted}", server="openrouter")
    assert routed.reasoning_kind == direct.reasoning_kind
    assert routed.thinks_unasked == direct.thinks_unasked
    assert (routed.hidden is None) == (direct.hidden is None)
    assert anthropic_rule(f"us.anthropic.{model}-v1:0").family == family


def test_overrides_apply_and_are_checked() -> None:
    base = resolve_rule("openai-compatible", "m", server="groq")
    forced = apply_overrides(base, {"send_back": "reasoning_content", "fields": ["reasoning"]})
    assert forced.send_back == "reasoning_content" and forced.fields == ("reasoning",)
    assert forced.overridden == ("fields", "send_back")
    with pytest.raises(ConfigError, match=r"rules\.send_bak"):
        apply_overrides(base, {"send_bak": "x"})
    with pytest.raises(ConfigError, match="true or false"):
        apply_overrides(base, {"send_back_required": "yes"})
    with pytest.raises(ConfigError, match="raw, summary or encrypted"):
        apply_overrides(base, {"reasoning_kind": "thoughts"})


def test_thoughtgate_toml_reaches_the_adapter() -> None:
    config = Config.from_mapping(
        {
            "providers": {
                "openai_compatible": {
                    "base_url": "https://llm.internal.example/v1",
                    "server": "deepseek",
                    "rules": {"hidden": {"thinking": {"type": "disabled"}, "x": 1}},
                }
            }
        }
    )
    settings = provider_settings_from_config(config, "openai-compatible:my-reasoner")
    adapter = OpenAICompatibleProvider("my-reasoner", settings)
    assert adapter.rule.server == "deepseek" and adapter.rule.send_back_required
    assert adapter.rule.overridden == ("hidden",)
    body = adapter.build_body(
        TurnRequest([Message.user("hi")], reasoning=ReasoningRequest(False)), stream=True
    )
    assert body["thinking"] == {"type": "disabled"} and body["x"] == 1
    with pytest.raises(ConfigError, match=r"providers\.openai_compatible\.server"):
        Config.from_mapping({"providers": {"openai_compatible": {"server": "grok"}}})
    with pytest.raises(ConfigError, match="no column 'sendback'"):
        Config.from_mapping({"providers": {"openai_compatible": {"rules": {"sendback": "x"}}}})


def test_the_docs_show_the_table_the_code_uses() -> None:
    assert endpoint_table() in DOCS.read_text(encoding="utf-8"), (
        "docs/providers/endpoints.md is out of date: paste endpoint_table() into it"
    )


# --------------------------------------------------------------------------- live labels


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator()
    for scenario in builtin_scenarios().values():
        emulator.add(scenario, default=scenario.name == "think-and-answer")
    with serve_emulator(emulator) as running:
        yield running


@pytest.mark.parametrize(
    ("direct", "routed", "kind"),
    [
        ("claude-sonnet-4-5", "anthropic/claude-sonnet-4.5", "summary"),
        ("claude-opus-4-7", "anthropic/claude-opus-4.7", "summary"),
        ("claude-3-7-sonnet-20250219", "anthropic/claude-3.7-sonnet", "raw"),
    ],
)
async def test_claude_thinking_has_one_label_on_both_routes(
    server: EmulatorServer, direct: str, routed: str, kind: str
) -> None:
    request = TurnRequest([Message.user("Why is the sky blue?")], reasoning=ReasoningRequest(True))
    # the emulator plays each vendor's own server: named, as behind a gateway (ADR 0078)
    vendor = {"thoughtgate": {"server": "anthropic"}}
    anthropic = AnthropicProvider(
        direct, ProviderSettings(base_url=server.url, api_key="k", extra=vendor)
    )
    via = {"thoughtgate": {"server": "openrouter"}}
    router = OpenRouterProvider(
        routed, ProviderSettings(base_url=server.v1, api_key="k", extra=via)
    )
    try:
        turns = [await stream_llm_turn(p, request) for p in (anthropic, router)]
    finally:
        await anthropic.aclose()
        await router.aclose()
    for turn in turns:
        readable = [p for p in turn.reasoning_parts if p.text]
        assert readable and {p.reasoning_kind for p in readable} == {kind}, turn.provider
