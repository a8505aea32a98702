"""A base URL no request could go to is refused when an adapter is built (ADR 0121), and the
verdict on a URL string is remembered because a daemon builds an adapter twice a run (ADR 0129):
whatever URLs came before, each is judged as it would be the first time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.errors import ConfigError
from thoughtgate.providers import endpoints
from thoughtgate.providers.base import ProviderSettings, create_provider

URLS = [
    "http://127.0.0.1:9/v1",
    "http://127.0.0.1:9/v1/",
    "https://api.example.com",
    "HTTP://api.example.com/v1",
    "ftp://api.example.com",
    "localhost:8000",
    "http://host:port",
    "http://",
    "https://bob:hunter2@api.example.com/v1",
    "ftp://bob:hunter2@api.example.com",
]
MODELS = ["anthropic:claude-sonnet-4-5", "openai:gpt-5"]


def _outcome(model: str, url: str) -> tuple[str, str]:
    """What building the adapter gives: the base URL its requests go to, or the error's text."""
    try:
        provider = create_provider(model, ProviderSettings(base_url=url, api_key="k"))
    except ConfigError as exc:
        return "refused", str(exc)
    return "built", provider.transport.base_url  # type: ignore[attr-defined]


@pytest.mark.unit
@given(st.lists(st.tuples(st.sampled_from(MODELS), st.sampled_from(URLS)), max_size=12))
def test_each_base_url_is_judged_as_the_first_time_whatever_came_before(
    builds: list[tuple[str, str]],
) -> None:
    seen = [_outcome(model, url) for model, url in builds]
    for (model, url), outcome in zip(builds, seen, strict=True):
        endpoints._usable_base_url.cache_clear()
        assert _outcome(model, url) == outcome, (model, url)


@pytest.mark.unit
@pytest.mark.parametrize("url", ["ftp://api.example.com", "localhost:8000", "http://"])
def test_a_refused_base_url_is_refused_again(url: str) -> None:
    settings = ProviderSettings(base_url=url, api_key="k")
    for _ in range(3):
        with pytest.raises(ConfigError, match="an http:// or https:// URL"):
            create_provider("openai:gpt-5", settings)
