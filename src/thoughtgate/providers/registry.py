"""The one list of providers: each endpoint profile, and the wire format it speaks.

An *endpoint* is where a request goes and how it is signed: the prefix of ``"provider:model"``,
the default base URL, the environment variables of its URL and key, how the key is sent, the
``[providers.<section>]`` of ``thoughtgate.toml``, the name telemetry reports, and which table of
endpoint rules (:mod:`thoughtgate.providers.rules`) describes its servers. A *wire format* is what
the request and the stream look like: Anthropic Messages, Chat Completions or OpenAI Responses.
OpenRouter and OpenAI-compatible servers are two endpoints of the Chat Completions wire format,
each with its own way of carrying reasoning (a dialect of that format).

Everything that lists providers reads this table: the factory (``create_provider``), the
configuration's environment variables and sections, the runtime's settings lookup and
telemetry's provider names. It imports nothing, so any layer may read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Final, Literal, TypeAlias

__all__ = ["ENDPOINTS", "Endpoint", "Wire", "endpoint"]

Wire: TypeAlias = Literal["messages", "chat_completions", "responses", "in_process"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One provider prefix: where its requests go, how they are signed, what names it has."""

    name: str
    """The prefix of ``"provider:model"`` and the adapter's ``name`` (records, carriers)."""
    adapter: str
    """``"module:factory"``; the factory takes ``(model, settings)`` and is imported lazily."""
    wire: Wire
    _: KW_ONLY
    config_section: str | None = None
    """``[providers.<section>]`` in ``thoughtgate.toml`` (``None``: not configurable)."""
    base_url_env: str | None = None
    api_key_env: str | None = None
    default_base_url: str | None = None
    """``None``: the user must name one (a compatible server has no default)."""
    key_required: bool = True
    """A compatible server on a local port often needs no key."""
    key_hint: str = ""
    """What a missing key error asks for."""
    auth: Literal["bearer", "x-api-key"] = "bearer"
    rules: Literal["anthropic", "openai-responses", "openrouter", "openai-compatible"] | None = None
    """The table of endpoint rules this endpoint's servers and model families are read from."""
    telemetry_name: str | None = None
    """``gen_ai.provider.name``; ``None`` when it depends on the server behind the endpoint."""


_ENDPOINTS: Final = (
    Endpoint(
        "anthropic",
        "thoughtgate.providers.anthropic:AnthropicProvider",
        "messages",
        config_section="anthropic",
        base_url_env="ANTHROPIC_BASE_URL",
        api_key_env="ANTHROPIC_API_KEY",
        default_base_url="https://api.anthropic.com",
        key_hint="an Anthropic API key (or set ANTHROPIC_API_KEY; the emulator accepts any key)",
        auth="x-api-key",
        rules="anthropic",
        telemetry_name="anthropic",
    ),
    Endpoint(
        "openrouter",
        "thoughtgate.providers.openrouter:OpenRouterProvider",
        "chat_completions",
        config_section="openrouter",
        base_url_env="OPENROUTER_BASE_URL",
        api_key_env="OPENROUTER_API_KEY",
        default_base_url="https://openrouter.ai/api/v1",
        key_hint="an OpenRouter key (or set OPENROUTER_API_KEY)",
        rules="openrouter",
        telemetry_name="openrouter",
    ),
    Endpoint(
        "openai",
        "thoughtgate.providers.openai_responses:OpenAIResponsesProvider",
        "responses",
        config_section="openai",
        base_url_env="OPENAI_BASE_URL",
        api_key_env="OPENAI_API_KEY",
        default_base_url="https://api.openai.com/v1",
        key_hint="an OpenAI key (or set OPENAI_API_KEY)",
        rules="openai-responses",
        telemetry_name="openai",
    ),
    Endpoint(
        "openai-compatible",
        "thoughtgate.providers.openai_compatible:OpenAICompatibleProvider",
        "chat_completions",
        config_section="openai_compatible",
        base_url_env="OPENAI_BASE_URL",
        api_key_env="OPENAI_API_KEY",
        key_required=False,
        rules="openai-compatible",
    ),
    Endpoint(
        "fake",
        "thoughtgate.testing.fake:FakeProvider.from_model_name",
        "in_process",
        key_required=False,
        telemetry_name="fake",
    ),
)

ENDPOINTS: Final[Mapping[str, Endpoint]] = {e.name: e for e in _ENDPOINTS}
"""Every provider prefix, in the order the docs list them."""


def endpoint(name: str) -> Endpoint:
    """The profile of provider prefix ``name`` (``KeyError`` when there is none)."""
    return ENDPOINTS[name]
