"""What the three OpenAI-style adapters share: endpoints and keys, history walking, body extras.

* Base URLs follow the SDK convention: they include ``/v1``; adapters append ``chat/completions``
  or ``responses``. ``settings.base_url`` wins over the environment variable, which wins over the
  adapter's default.
* ``settings.extra`` holds request-body fields merged last into every request (so a user can
  add ``{"thinking": {"type": "enabled"}}`` or ``reasoning_effort``; a ``None`` value removes a
  field the adapter would send). The one reserved key, ``"thoughtgate"``, holds adapter options
  and is never sent (see each adapter's docs).
* Continuity goes back only where the provider's API demands it; :func:`current_loop_start` finds
  where the running tool loop begins (after the last user message that carries text).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from thoughtgate.errors import ConfigError
from thoughtgate.providers.base import ProviderSettings, ToolSpec
from thoughtgate.providers.rules import EndpointRule, WireFormat, detect_server, resolve_rule
from thoughtgate.types import ContinuityBlock, Message, TextPart, ToolResultPart

__all__ = [
    "OPTIONS_KEY",
    "adapter_options",
    "apply_extra",
    "chat_tools",
    "current_loop_start",
    "matching_block",
    "merge_body",
    "resolve_api_key",
    "resolve_base_url",
    "resolve_endpoint_rule",
    "responses_tools",
    "tool_results",
]

OPTIONS_KEY = "thoughtgate"


def resolve_base_url(
    settings: ProviderSettings, env_var: str, default: str | None, *, provider: str
) -> str:
    """``settings.base_url`` > ``$env_var`` > ``default``; a clear error when none is set."""
    url = settings.base_url or os.environ.get(env_var) or default
    if not url:
        raise ConfigError(
            f"providers.{provider.replace('-', '_')}.base_url",
            None,
            f"a base URL ending in /v1 (or set {env_var}), e.g. http://localhost:8000/v1",
        )
    return url.rstrip("/")


def resolve_api_key(settings: ProviderSettings, env_var: str) -> str | None:
    return settings.api_key or os.environ.get(env_var) or None


def adapter_options(settings: ProviderSettings) -> Mapping[str, Any]:
    """The reserved ``extra["thoughtgate"]`` mapping of adapter options (empty when absent)."""
    options = settings.extra.get(OPTIONS_KEY, {})
    if not isinstance(options, Mapping):
        raise ConfigError(f"extra.{OPTIONS_KEY}", options, "a mapping of adapter options")
    return options


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


def current_loop_start(messages: Sequence[Message]) -> int:
    """Index of the first message of the running tool loop.

    The loop starts after the last ``user`` message that carries text; a user message that only
    carries tool results belongs to the loop.
    """
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.role == "user" and any(isinstance(p, TextPart) for p in msg.parts):
            return i + 1
    return 0


def matching_block(
    message: Message, carrier: str, *, provider: str, model: str
) -> ContinuityBlock | None:
    """The message's continuity block of ``carrier`` made by this provider and model, if any.

    Blocks from another provider or model are never sent: the provider could not read them and
    would reject the request (signatures are bound to the model that made them).
    """
    for part in message.parts:
        if (
            isinstance(part, ContinuityBlock)
            and part.carrier == carrier
            and part.provider == provider
            and part.model == model
        ):
            return part
    return None


def tool_results(message: Message) -> list[ToolResultPart]:
    return [p for p in message.parts if isinstance(p, ToolResultPart)]


def chat_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Chat Completions ``tools`` (nested ``function`` object)."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": dict(t.parameters),
            },
        }
        for t in tools
    ]


def responses_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Responses ``tools`` (flat). ``strict`` defaults to true there, which rejects ordinary JSON
    schemas without ``additionalProperties: false``; we send ``false`` explicitly."""
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": dict(t.parameters),
            "strict": False,
        }
        for t in tools
    ]
