"""Every HTTP adapter passes the one conformance suite (``support/provider_conformance.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from support.provider_conformance import ProviderConformance

from thoughtgate.providers.registry import ENDPOINTS


def test_every_http_endpoint_has_a_conformance_class() -> None:
    proven = {cls.model.partition(":")[0] for cls in ProviderConformance.__subclasses__()}
    http = {name for name, e in ENDPOINTS.items() if e.wire != "in_process"}
    assert proven == http


class TestAnthropic(ProviderConformance):
    model = "anthropic:claude-sonnet-4-5"

    def asks_for_reasoning(self, body: Mapping[str, Any]) -> bool:
        return body.get("thinking", {}).get("type") in ("enabled", "adaptive")


class TestOpenRouter(ProviderConformance):
    model = "openrouter:anthropic/claude-sonnet-4.5"

    def asks_for_reasoning(self, body: Mapping[str, Any]) -> bool:
        reasoning = body.get("reasoning")
        if not isinstance(reasoning, Mapping) or reasoning.get("exclude"):
            return False
        return reasoning.get("effort") != "none" and reasoning.get("enabled", True) is not False


class TestOpenAIResponses(ProviderConformance):
    model = "openai:gpt-5"

    def asks_for_reasoning(self, body: Mapping[str, Any]) -> bool:
        include = body.get("include") or []
        return "reasoning.encrypted_content" in include or "summary" in body.get("reasoning", {})


class TestOpenAICompatible(ProviderConformance):
    model = "openai-compatible:deepseek-reasoner"
    extra: ClassVar[Mapping[str, Any]] = {
        "thoughtgate": {"server": "deepseek"}
    }  # the emulator's host names no server

    def asks_for_reasoning(self, body: Mapping[str, Any]) -> bool:
        # DeepSeek thinks unless switched off: not switching it off is asking
        return body.get("thinking") != {"type": "disabled"}
