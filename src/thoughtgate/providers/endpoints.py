"""Reaching an endpoint: its base URL, key, headers and rule, and the body fields a user adds.

What every adapter resolves the same way, whatever its wire format, from its
:class:`~thoughtgate.providers.registry.Endpoint` profile:

* the base URL: ``settings.base_url`` wins over the endpoint's environment variable, which wins
  over its default. OpenAI-style URLs include ``/v1`` (the SDK convention); Anthropic's is the
  host root (``/v1`` is accepted too);
* the key (``settings.api_key`` > the environment variable) and the headers it travels in
  (``authorization: Bearer`` or Anthropic's ``x-api-key``), plus the ``headers`` adapter option;
* the endpoint rule of the model on the server behind the URL (:func:`resolve_endpoint_rule`);
* ``settings.extra``: request-body fields merged last into every request (so a user can add
  ``{"thinking": {"type": "enabled"}}`` or ``reasoning_effort``; a ``None`` value removes a
  field the adapter would send). The one reserved key, ``"thoughtgate"``, holds adapter options
  and is never sent (see each adapter's docs).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import httpx

from thoughtgate.errors import ConfigError, ProviderNotConfiguredError, public_url
from thoughtgate.providers.base import ProviderSettings
from thoughtgate.providers.registry import Endpoint
from thoughtgate.providers.rules import EndpointRule, WireFormat, detect_server, resolve_rule

__all__ = [
    "OPTIONS_KEY",
    "adapter_options",
    "apply_extra",
    "endpoint_headers",
    "merge_body",
    "resolve_api_key",
    "resolve_base_url",
    "resolve_endpoint_rule",
]

OPTIONS_KEY = "thoughtgate"


def _env(name: str | None) -> str | None:
    return os.environ.get(name) if name else None


def resolve_base_url(settings: ProviderSettings, endpoint: Endpoint) -> str:
    """``settings.base_url`` > the endpoint's variable > its default; a clear error when none
    (:class:`ProviderNotConfiguredError`: the operator's setting)."""
    # the environment is read only when the settings have no URL (os.environ encodes the name
    # and decodes the value on every read, and an adapter is built per run)
    url = settings.base_url or _env(endpoint.base_url_env) or endpoint.default_base_url
    key = f"providers.{endpoint.config_section or endpoint.name}.base_url"
    if not url:
        raise ProviderNotConfiguredError(
            endpoint.name,
            key,
            None,
            f"a base URL ending in /v1 (or set {endpoint.base_url_env}), "
            "e.g. http://localhost:8000/v1",
        )
    _check_base_url(url, key, endpoint)
    return url.rstrip("/")


def _check_base_url(url: str, key: str, endpoint: Endpoint) -> None:
    """A base URL no request could be sent to (``ftp://...``, ``localhost:8000`` without its
    scheme, a port that is not a number) is a usage error before any run is created, not a
    failed run that says ``UnsupportedProtocol``. The URL is shown as :func:`public_url` shows
    it."""
    if _usable_base_url(url) if type(url) is str else _usable(url):
        return
    variable = f"{endpoint.base_url_env} " if endpoint.base_url_env else ""
    raise ProviderNotConfiguredError(
        endpoint.name,
        key,
        public_url(url),
        f"an http:// or https:// URL (from --base-url, {variable}or the config file)",
    )


def _usable(url: Any) -> bool:
    """Whether httpx reads ``url`` as an ``http://`` or ``https://`` URL with a host."""
    try:
        parsed = httpx.URL(url)
        return parsed.scheme in ("http", "https") and bool(parsed.host)
    except (httpx.InvalidURL, TypeError):
        return False


_usable_base_url = functools.lru_cache(maxsize=256)(_usable)
""":func:`_usable` of a string, remembered: an adapter is built per run (twice in a daemon: to
check the request, then to run it), and parsing the same base URL again cost ~12 µs a build
(ADR 0129)."""


def resolve_api_key(settings: ProviderSettings, endpoint: Endpoint) -> str | None:
    """``settings.api_key`` > the endpoint's variable; an error when the endpoint needs one
    (:class:`ProviderNotConfiguredError`: the operator's setting)."""
    key = settings.api_key or _env(endpoint.api_key_env) or None
    if key is None and endpoint.key_required:
        raise ProviderNotConfiguredError(
            endpoint.name,
            f"providers.{endpoint.config_section or endpoint.name}.api_key",
            None,
            endpoint.key_hint or f"an API key (or set {endpoint.api_key_env})",
        )
    return key


def adapter_options(settings: ProviderSettings) -> Mapping[str, Any]:
    """The reserved ``extra["thoughtgate"]`` mapping of adapter options (empty when absent)."""
    options = settings.extra.get(OPTIONS_KEY, {})
    if not isinstance(options, Mapping):
        raise ConfigError(f"extra.{OPTIONS_KEY}", options, "a mapping of adapter options")
    return options


def endpoint_headers(
    endpoint: Endpoint, api_key: str | None, settings: ProviderSettings, **fixed: str
) -> dict[str, str]:
    """The headers of every request: the ``headers`` adapter option (``anthropic-beta``, the
    emulator's ``x-emulator-scenario``), then the endpoint's own, which always win: the key in the
    endpoint's form and ``fixed`` (the wire format's version header)."""
    extra = adapter_options(settings).get("headers") or {}
    headers = {str(k): str(v) for k, v in dict(extra).items()}
    if endpoint.auth == "x-api-key":
        if api_key:
            headers["x-api-key"] = api_key
    else:
        headers["accept"] = "application/json"
        if api_key:  # local servers (vLLM, Ollama) often need none
            headers["authorization"] = f"Bearer {api_key}"
    return headers | fixed


#: The old ``dialect`` option of the compatible adapter, as the server it meant.
_DIALECT_SERVERS = {"deepseek": "deepseek", "qwen3": "vllm", "generic": "generic"}


def resolve_endpoint_rule(
    settings: ProviderSettings, fmt: WireFormat, model: str, base_url: str
) -> EndpointRule:
    """The endpoint rule for this adapter: the server from the ``server`` option (or the old
    ``dialect``), else from the base URL's host; columns overridden by the ``rules`` option
    (``[providers.<name>.rules]`` in ``thoughtgate.toml``)."""
    options = adapter_options(settings)
    server = options.get("server")
    if server is None and "dialect" in options:
        dialect = options["dialect"]
        if dialect not in _DIALECT_SERVERS:
            raise ConfigError("extra.thoughtgate.dialect", dialect, ", ".join(_DIALECT_SERVERS))
        server = _DIALECT_SERVERS[dialect]
    if server is None:
        server = detect_server(base_url)
    if not isinstance(server, str) or not server:
        raise ConfigError("server", server, "a server name such as deepseek, groq or generic")
    overrides = options.get("rules") or {}
    if not isinstance(overrides, Mapping):
        raise ConfigError("rules", overrides, "a table of rule columns")
    return resolve_rule(fmt, model, server=server, overrides=overrides)


def apply_extra(body: dict[str, Any], settings: ProviderSettings) -> dict[str, Any]:
    """Merge ``settings.extra`` into ``body`` (top level; ``None`` deletes; options skipped)."""
    for key, value in settings.extra.items():
        if key == OPTIONS_KEY:
            continue
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def merge_body(body: dict[str, Any], fragment: Mapping[str, Any] | None) -> dict[str, Any]:
    """Merge a rule's body fragment: nested tables merge, other values replace."""
    for key, value in (fragment or {}).items():
        old = body.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            body[key] = merge_body(dict(old), value)
        else:
            body[key] = dict(value) if isinstance(value, Mapping) else value
    return body
