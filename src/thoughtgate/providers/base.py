"""The small provider surface: what a turn request holds, what an adapter declares, and the registry.

An adapter turns one :class:`TurnRequest` into a stream of normalized chunks (``stream``) or a
finished turn (``request``); it never builds turns itself beyond feeding the shared
:class:`~thoughtgate.types.TurnAccumulator`. Adapters are found lazily from ``"provider:model"``
strings so importing thoughtgate never imports every vendor module.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable
from urllib.parse import urlsplit

from thoughtgate.errors import UnknownProviderError
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.providers.sse import DEFAULT_MAX_EVENT_BYTES
from thoughtgate.types import Chunk, Message, Turn, TurnAccumulator

__all__ = [
    "CACHE_OUTSIDE_INPUT",
    "DEFAULT_MAX_TURN_OUTPUT_CHARS",
    "DEFAULT_TURN_TIMEOUT_S",
    "PROVIDER_MODULES",
    "Capabilities",
    "Effort",
    "Provider",
    "ProviderSettings",
    "ReasoningRequest",
    "ServerInfo",
    "ToolSpec",
    "TurnRequest",
    "collect_turn",
    "create_provider",
    "server_info",
    "split_model",
    "total_input_tokens",
]

Effort: TypeAlias = Literal["minimal", "low", "medium", "high", "xhigh", "max"]

DEFAULT_TURN_TIMEOUT_S = 4 * 3600.0
"""4 hours: a 128k-token answer (the most any model streams today) at 10 tokens a second, a
slow local or overloaded server, takes 3.6 hours; a turn of a healthy API lasts minutes
(ADR 0155)."""
DEFAULT_MAX_TURN_OUTPUT_CHARS = 4_000_000
"""4 million characters: eight times a 128k-token answer at about 4 characters a token, which is
what English prose and code average; the most one turn holds in memory and writes to the log."""


@dataclass(frozen=True, slots=True)
class ReasoningRequest:
    """Whether to ask the provider for reasoning, derived from the disclosure mode.

    ``enabled`` is false in ``hidden`` mode: adapters then ask for no reasoning at all (no
    Anthropic ``thinking``, OpenRouter ``exclude``, no OpenAI summary).
    """

    enabled: bool = False
    _: KW_ONLY
    effort: Effort | None = None
    budget_tokens: int | None = None

    @classmethod
    def for_mode(cls, mode: str, **kw: Any) -> ReasoningRequest:
        return cls(mode in ("surface", "telemetry_only"), **kw)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call: name, description and a JSON schema for its arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """Everything one model turn needs. Assistant messages may carry continuity blocks."""

    messages: Sequence[Message]
    _: KW_ONLY
    system: str | None = None
    tools: Sequence[ToolSpec] = ()
    reasoning: ReasoningRequest = ReasoningRequest()
    max_tokens: int = 4096
    temperature: float | None = None


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What an adapter has been *proven* to do (a conformance test backs each true flag)."""

    reasoning_text: bool = False
    reasoning_summary: bool = False
    continuity: bool = False
    tools: bool = False
    streaming: bool = True
    notes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ProviderSettings:
    """Where and how to reach a provider; filled from CLI flags, environment and config."""

    _: KW_ONLY
    base_url: str | None = None
    api_key: str | None = None
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    max_retries: int = 2
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    """The largest streamed event read (bytes); a stream holding more of one unfinished event
    fails the turn (:class:`~thoughtgate.errors.MalformedResponseError`, ADR 0147)."""
    turn_timeout_s: float = DEFAULT_TURN_TIMEOUT_S
    """The longest a turn lasts, streamed or not, its follow-up requests included; past it the
    turn fails (:class:`~thoughtgate.errors.ProviderTimeoutError`). ``0``: no bound (ADR 0155,
    ADR 0161)."""
    max_turn_output_chars: int = DEFAULT_MAX_TURN_OUTPUT_CHARS
    """The most characters of text, reasoning and tool-call arguments one turn holds, streamed or
    not; past them the turn fails (:class:`~thoughtgate.errors.ProviderStreamError`). ``0``: no
    bound (ADR 0155, ADR 0161)."""
    extra: Mapping[str, Any] = field(default_factory=dict)


CACHE_OUTSIDE_INPUT: frozenset[str] = frozenset({"anthropic"})
"""Adapters whose ``input_tokens`` leave out cache reads and writes (Anthropic reports them beside
it); everywhere else the prompt count already includes cached tokens. Readers that want the
whole input (OpenTelemetry, AG-UI) add them back for these."""


def total_input_tokens(usage: Mapping[str, Any], adapter: str | None) -> int:
    """All input tokens of a recorded usage, cached ones included, whatever the adapter."""

    def count(key: str) -> int:
        value = usage.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    total = count("input_tokens")
    if adapter in CACHE_OUTSIDE_INPUT:
        total += count("cache_read_tokens") + count("cache_write_tokens")
    return total


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """Where an HTTP adapter sends its requests (telemetry's ``server.*`` and provider name).

    Adapters that reach a server over HTTP expose one as ``server``; the loop records it with each
    model turn. ``name`` is the server the endpoint rules recognise at that address
    (``anthropic``, ``deepseek``, ``ollama``, ...; ``generic`` when they know none)."""

    address: str
    port: int | None
    name: str = "generic"


def server_info(base_url: str, name: str = "generic") -> ServerInfo:
    """The host and port of ``base_url`` (the scheme's default port when it names none)."""
    parts = urlsplit(base_url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"https": 443, "http": 80}.get(parts.scheme.lower())
    return ServerInfo(parts.hostname or "", port, name if name and name != "*" else "generic")


@runtime_checkable
class Provider(Protocol):
    """One wire format bound to one model."""

    name: str
    model: str
    capabilities: Capabilities

    def stream(self, request: TurnRequest) -> AsyncIterator[Chunk]:
        """Normalized chunks for one streamed turn; raises ``ProviderError`` on failure."""
        ...

    async def request(self, request: TurnRequest) -> Turn:
        """One non-streamed turn, built by the same accumulator as ``stream``."""
        ...

    async def aclose(self) -> None:
        """Release HTTP connections."""
        ...


async def collect_turn(provider: Provider, request: TurnRequest) -> Turn:
    """Consume ``provider.stream`` into a turn (a default ``request`` for simple adapters)."""
    acc = TurnAccumulator(provider=provider.name, model=provider.model)
    async for chunk in provider.stream(request):
        acc.feed(chunk)
    return acc.finish()


#: provider prefix -> "module:factory"; factories take ``(model, settings)`` (from the registry).
PROVIDER_MODULES: dict[str, str] = {name: e.adapter for name, e in ENDPOINTS.items()}


def split_model(model: str) -> tuple[str, str]:
    """``"anthropic:claude-sonnet-4-5"`` -> ``("anthropic", "claude-sonnet-4-5")``."""
    provider, sep, name = model.partition(":")
    if not sep or not provider or not name:
        raise UnknownProviderError(
            f"model {model!r} must look like PROVIDER:MODEL; providers: "
            + ", ".join(sorted(PROVIDER_MODULES))
        )
    if provider not in PROVIDER_MODULES:
        raise UnknownProviderError(
            f"unknown provider {provider!r} in {model!r}; allowed: "
            + ", ".join(sorted(PROVIDER_MODULES))
        )
    return provider, name


def create_provider(model: str, settings: ProviderSettings | None = None) -> Provider:
    """Build the adapter for ``"provider:model"``, importing its module only now."""
    prefix, name = split_model(model)
    module_name, _, attr = PROVIDER_MODULES[prefix].partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    provider: Provider = target(name, settings or ProviderSettings())
    return provider
