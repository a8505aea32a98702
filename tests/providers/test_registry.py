"""The one list of providers: every place that names providers reads the registry."""

from __future__ import annotations

import pytest

from thoughtgate.config import PROVIDER_ENV, ProvidersConfig
from thoughtgate.errors import ConfigError, UnknownProviderError
from thoughtgate.providers.base import PROVIDER_MODULES, ProviderSettings, create_provider
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.telemetry.conventions import provider_name


def test_the_user_facing_names_are_the_ones_users_know() -> None:
    assert list(ENDPOINTS) == ["anthropic", "openrouter", "openai", "openai-compatible", "fake"]
    assert set(PROVIDER_MODULES) == set(ENDPOINTS)
    sections = {e.config_section for e in ENDPOINTS.values() if e.config_section}
    assert sections == set(ProvidersConfig.model_fields)
    assert PROVIDER_ENV == {
        ("anthropic", "base_url"): "ANTHROPIC_BASE_URL",
        ("anthropic", "api_key"): "ANTHROPIC_API_KEY",
        ("openrouter", "base_url"): "OPENROUTER_BASE_URL",
        ("openrouter", "api_key"): "OPENROUTER_API_KEY",
        ("openai", "base_url"): "OPENAI_BASE_URL",
        ("openai", "api_key"): "OPENAI_API_KEY",
        ("openai_compatible", "base_url"): "OPENAI_BASE_URL",
        ("openai_compatible", "api_key"): "OPENAI_API_KEY",
    }


@pytest.mark.parametrize(
    ("prefix", "name"),
    [
        ("anthropic", "anthropic"),
        ("openrouter", "openrouter"),
        ("openai", "openai"),
        ("fake", "fake"),
    ],
)
def test_telemetry_names_come_from_the_registry(prefix: str, name: str) -> None:
    assert provider_name(prefix) == name == ENDPOINTS[prefix].telemetry_name


def test_a_compatible_endpoint_is_named_by_the_server_behind_it() -> None:
    assert ENDPOINTS["openai-compatible"].telemetry_name is None
    assert provider_name("openai-compatible", "deepseek") == "deepseek"
    assert provider_name("openai-compatible", "generic") == "openai"


@pytest.mark.parametrize("prefix", [p for p, e in ENDPOINTS.items() if e.key_required])
def test_a_missing_key_names_the_section_and_the_variable(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = ENDPOINTS[prefix]
    with pytest.raises(ConfigError) as info:
        create_provider(f"{prefix}:m", ProviderSettings())
    assert info.value.key == f"providers.{endpoint.config_section}.api_key"
    assert str(endpoint.api_key_env) in str(info.value)
    assert endpoint.api_key_env is not None
    monkeypatch.setenv(endpoint.api_key_env, "from-env")
    provider = create_provider(f"{prefix}:m", ProviderSettings())
    assert provider.name == prefix


def test_an_unknown_prefix_lists_the_registry() -> None:
    with pytest.raises(UnknownProviderError, match="allowed: anthropic, fake, openai, "):
        create_provider("bedrock:claude")
