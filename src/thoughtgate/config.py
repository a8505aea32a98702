"""Project configuration (``thoughtgate.toml`` + ``THOUGHTGATE_*``) and the ``resolve_*`` precedence.

Where the file comes from: ``--config PATH``, else ``THOUGHTGATE_CONFIG``, else ``./thoughtgate.toml``
if it exists, else built-in defaults. Environment variables override the file:
``THOUGHTGATE_<SECTION>__<KEY>`` (for example ``THOUGHTGATE_ORCHESTRATION__CHAIN_OF_THOUGHT=surface``),
the shortcut ``THOUGHTGATE_DB`` for ``store.url``, and the providers' own variables
(``ANTHROPIC_BASE_URL``, ``OPENAI_API_KEY``, ... see :data:`PROVIDER_ENV`) for their
``providers.*`` keys. So the order users expect holds everywhere: command-line flag > environment
variable > ``thoughtgate.toml`` > default (``THOUGHTGATE_PROVIDERS__*`` beats a vendor variable,
being the more specific of the two). The layers are pydantic-settings sources (the TOML file, the
``THOUGHTGATE_`` prefix with ``__`` between nested keys, and the named variables), merged by it
over one validated :class:`Config`. Every problem found is one line of a :class:`ConfigError`
naming where the value came from (the file, or the variable), the key, the bad value and what is
expected there, raised at start, never half-way through a run.

Precedence for a run's settings is one rule, applied by :func:`resolve_chain_of_thought` and its
siblings: explicit argument > the run's own setting > project config > built-in default.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias, TypeVar, get_args
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from thoughtgate.access.roles import ROLE_NAMES
from thoughtgate.config_problems import Location, config_error
from thoughtgate.disclosure import ChainOfThought, parse_chain_of_thought
from thoughtgate.errors import ConfigError, UsageError
from thoughtgate.providers.base import DEFAULT_MAX_TURN_OUTPUT_CHARS, DEFAULT_TURN_TIMEOUT_S
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.providers.sse import DEFAULT_MAX_EVENT_BYTES

__all__ = [
    "PROVIDER_ENV",
    "WORKER_BACKENDS",
    "AccessConfig",
    "Config",
    "DurabilityConfig",
    "McpConfig",
    "OrchestrationConfig",
    "ProviderEndpoint",
    "ProvidersConfig",
    "QuotasConfig",
    "ServerConfig",
    "StoreConfig",
    "SummarizerName",
    "TelemetryConfig",
    "VisibleReasoningConfig",
    "WorkerBackend",
    "load_config",
    "resolve_chain_of_thought",
    "resolve_store",
    "resolve_worker_backend",
]

WorkerBackend: TypeAlias = Literal["inline", "provider"]
WORKER_BACKENDS: tuple[str, ...] = get_args(WorkerBackend)
DEFAULT_CHAIN_OF_THOUGHT: ChainOfThought = "hidden"
DEFAULT_WORKER_BACKEND: WorkerBackend = "provider"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OrchestrationConfig(_Section):
    chain_of_thought: ChainOfThought | None = None
    """Disclosure mode when neither the caller nor the run says; ``None`` means ``hidden``."""
    worker_backend: WorkerBackend | None = None
    max_turns: int = Field(default=14, ge=1, le=1000)
    """Model turns per task before the loop stops and says so."""
    approval_timeout_s: float = Field(default=300.0, gt=0)
    """How long a tool call that needs approval waits before ``tool.approval_timeout``."""
    lease_ttl_s: float = Field(default=15.0, ge=1, le=3600)
    """A process executing a run renews its lease every third of this; a run whose lease has
    expired is closed as interrupted by the next thoughtgate process that looks (ADR 0009)."""
    default_model: str | None = None


DEFAULT_IDLE_POLL_INTERVAL_S: Final = 2.0


class DurabilityConfig(_Section):
    """Durable runs (ADR 0013, docs/durability.md): each model turn and tool call is checkpointed,
    so a run whose process dies continues in another (or a restarted) process."""

    enabled: bool = True
    """Run as durable workflows when the store is SQLite or PostgreSQL (never on ``memory://``)."""
    concurrency: int = Field(default=32, ge=1, le=10_000)
    """Runs this daemon executes at once (it starts a new one itself while it has room); more
    wait in the queue for any replica."""
    poll_interval_s: float = Field(default=0.5, gt=0, le=60)
    """How often a daemon in use looks for queued runs it can take (ten times as often while runs
    it queued wait)."""
    idle_poll_interval_s: float = Field(default=DEFAULT_IDLE_POLL_INTERVAL_S, gt=0, le=60)
    """How often a daemon that has executed nothing for ten ``poll_interval_s`` looks for queued
    runs (ADR 0057): an idle daemon then costs a few ms of CPU a second, and a run queued by another process
    waits at most this long for it. Not below ``poll_interval_s``."""
    max_attempts: int = Field(default=5, ge=1, le=1000)
    """A run whose process stopped this many times is closed as interrupted instead of being
    resumed again (a run that crashes every process it lands on)."""
    store_outage_wait_s: float = Field(default=300.0, ge=0, le=86_400)
    """How long a durable run whose store became unavailable (PostgreSQL unreachable or refusing
    connections, a connection lost, a SQLite file locked past its busy timeout) waits for it,
    trying again with a growing pause, before it continues from its checkpoints (ADR 0152).
    Past it the run is left open, to resume once the store answers; ``0``: it does not wait."""

    @model_validator(mode="before")
    @classmethod
    def _idle_follows_a_slower_poll(cls, data: Any) -> Any:
        """Left unset, the idle interval is never below ``poll_interval_s`` (a daemon configured
        to poll every 10 s polls every 10 s when idle, too)."""
        if isinstance(data, dict) and "idle_poll_interval_s" not in data:
            poll = data.get("poll_interval_s")
            with contextlib.suppress(TypeError, ValueError):
                if poll is not None and float(poll) > DEFAULT_IDLE_POLL_INTERVAL_S:
                    return {**data, "idle_poll_interval_s": poll}
        return data

    @model_validator(mode="after")
    def _idle_not_faster(self) -> DurabilityConfig:
        if self.idle_poll_interval_s < self.poll_interval_s:
            raise ValueError(
                f"idle_poll_interval_s ({self.idle_poll_interval_s}) is below poll_interval_s "
                f"({self.poll_interval_s}): an idle daemon would poll faster than a busy one"
            )
        return self


class QuotasConfig(_Section):
    """Per-API-key limits on the daemon's ``POST /v1/runs`` and its live streams; beyond them it
    answers 429 with ``Retry-After``. Local runs (CLI, MCP over stdio) are not counted."""

    max_open_runs_per_key: int = Field(default=300, ge=1, le=1_000_000)
    """Runs of one key that have not ended (queued, executing or suspended)."""
    max_starts_per_minute_per_key: int = Field(default=600, ge=1, le=1_000_000)
    """Runs one key may start within any 60 seconds."""
    max_live_streams_per_key: int = Field(default=512, ge=1, le=1_000_000)
    """Live streams (a run's stream, ``/v1/runs/follow``, the run list's stream, AG-UI) one key
    holds at once, tickets of the key's included; beyond it a new one is answered 429. Above
    ``max_open_runs_per_key``, so a key can follow each run it may have open (ADR 0155)."""


STORE_URL_PREFIXES = ("sqlite:///", "memory:", "postgresql:", "postgres:")
"""How the URL of every store thoughtgate opens begins (``thoughtgate.store.urls``)."""


class StoreConfig(_Section):
    url: str | None = None
    """``sqlite:///PATH`` (default: a file under the user data directory), ``memory://``, or
    ``postgresql://...``."""

    @field_validator("url")
    @classmethod
    def _known_store(cls, value: str | None) -> str | None:
        """A URL no store opens is a configuration problem, named with its file or variable
        (``--db`` is checked where the store is opened)."""
        if value is not None and not value.startswith(STORE_URL_PREFIXES):
            raise ValueError("expected sqlite:///PATH, memory:// or postgresql://...")
        return value


SummarizerName: TypeAlias = Literal["phases", "narration", "provider_summaries", "model"]


class VisibleReasoningConfig(_Section):
    """Where end users' visible steps come from (docs/visible-reasoning.md).

    ``phases`` (the default) uses the run's own lifecycle and no model text; ``narration`` offers
    the model a ``visible_step`` tool to write steps for the reader. ``provider_summaries`` (the
    provider's summaries of the model's reasoning) and ``model`` (the operator's summarizer
    model) are never on unless named here: naming them is the operator's decision, and every
    receipt says so.
    """

    enabled: bool = True
    summarizers: tuple[SummarizerName, ...] = ("phases",)
    """In the environment: comma-separated (``THOUGHTGATE_VISIBLE_REASONING__SUMMARIZERS=phases,narration``)."""
    summarizer_model: str | None = None
    """``PROVIDER:MODEL`` for the ``model`` summarizer."""

    @field_validator("summarizers", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(s.strip() for s in value.split(",") if s.strip())
        return value


class AccessConfig(_Section):
    local_role: str = "owner"
    """The role of whoever runs the CLI on this machine."""

    @field_validator("local_role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value not in ROLE_NAMES:
            raise ValueError("expected one of " + ", ".join(ROLE_NAMES))
        return value


class ProviderEndpoint(_Section):
    base_url: str | None = None
    api_key: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    max_retries: int = Field(default=2, ge=0, le=10)
    max_event_bytes: int = Field(default=DEFAULT_MAX_EVENT_BYTES, ge=64 * 1024, le=2**31)
    """The largest streamed event read (bytes, default 16 MiB): a stream that holds more of one
    unfinished event (a line that never ends) fails the turn, with what came before it kept
    (ADR 0147)."""
    turn_timeout_s: float = Field(default=DEFAULT_TURN_TIMEOUT_S, ge=0)
    """The longest one model turn lasts, streamed or not (seconds, default 4 hours; ``0``: no
    bound): a provider that keeps answering past it fails the turn, with what arrived kept
    (ADR 0155, ADR 0161)."""
    max_turn_output_chars: int = Field(default=DEFAULT_MAX_TURN_OUTPUT_CHARS, ge=0, le=2**40)
    """The most characters of text, reasoning and tool-call arguments one model turn holds,
    streamed or not (default 4,000,000; ``0``: no bound): past them the turn fails, with what
    arrived kept (ADR 0155, ADR 0161)."""
    server: str | None = None
    """The server behind ``base_url`` when its host does not say (a proxy, a gateway, a local
    port): ``deepseek``, ``groq``, ``cerebras``, ``vllm``, ... (docs/providers/endpoints.md)."""
    rules: dict[str, Any] | None = None
    """Columns of this endpoint's rule to override (``send_back``, ``hidden``, ``surface``, ...)."""
    think_tags: bool | str | dict[str, bool | str] | None = None
    """Inline ``<think>`` in answer text: ``leading``, ``anywhere`` or ``off`` (``true`` /
    ``false``), or a table of them by model id with ``"*"`` for the rest; unset: the adapter's
    default (``docs/providers/``, ADR 0077). In the environment a table is ``MODEL=MODE`` pairs,
    comma-separated (``THOUGHTGATE_PROVIDERS__OPENAI__THINK_TAGS=*=leading,my-r1=anywhere``)."""
    think_delimiters: str | list[str] | dict[str, str | list[str]] | None = None
    """The spelling of a model's reasoning block when it is not ``<think>``: a preset (``think``,
    ``thinking``, ``mistral``, ``seed``, ``kimi``) or an ``[open, close]`` pair, or a table of
    them by model id with ``"*"`` for the rest; unset: ``<think>``, and the presets' spellings
    at the very start of an answer (ADR 0157). In the environment: one preset, ``MODEL=PRESET``
    pairs comma-separated, or JSON (``'{"my-model": ["<r>", "</r>"]}'``)."""

    @field_validator("server")
    @classmethod
    def _known_server(cls, value: str | None) -> str | None:
        from thoughtgate.providers.rules import known_servers

        if value is not None and value not in known_servers():
            raise ValueError("expected one of " + ", ".join(known_servers()))
        return value

    @field_validator("rules")
    @classmethod
    def _known_columns(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        from thoughtgate.providers.rules import overrides_problem

        problem = overrides_problem(value or {})
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("think_tags", mode="before")
    @classmethod
    def _think_tags_modes(cls, value: Any) -> Any:
        from thoughtgate.providers.think_tags import check_think_tags

        if isinstance(value, str) and "=" in value:
            table = _model_table(value, "MODE", "'*=leading,my-r1=anywhere'")  # environment
            value = {model: _true_or_false(mode) for model, mode in table.items()}
        elif isinstance(value, str):
            value = _true_or_false(value)
        with _per_model_problem("think_tags", ", or a table of them by model id"):
            check_think_tags(value)
        return value

    @field_validator("think_delimiters", mode="before")
    @classmethod
    def _think_delimiters_pairs(cls, value: Any) -> Any:
        from thoughtgate.providers.think_tags import check_think_delimiters

        if isinstance(value, str) and value.lstrip().startswith(("[", "{")):
            try:
                value = json.loads(value)  # from the environment
            except ValueError:
                raise ValueError("not JSON: " + value) from None
        elif isinstance(value, str) and "=" in value:
            value = _model_table(value, "PRESET", "'*=think,magistral=mistral'")
        with _per_model_problem("think_delimiters"):
            check_think_delimiters(value)
        return value

    def adapter_options(self) -> dict[str, Any]:
        """The ``ProviderSettings.extra["thoughtgate"]`` options this section sets."""
        options: dict[str, Any] = {}
        if self.server is not None:
            options["server"] = self.server
        if self.rules:
            options["rules"] = dict(self.rules)
        if self.think_tags is not None:
            options["think_tags"] = self.think_tags
        if self.think_delimiters is not None:
            options["think_delimiters"] = self.think_delimiters
        return options


@contextlib.contextmanager
def _per_model_problem(name: str, whole: str = "") -> Iterator[None]:
    """A per-model option's :class:`ConfigError` as the validator's one line: the model's entry
    at fault (``'my-r1' = 'sometimes': expected ...``), or what the whole value should be."""
    try:
        yield
    except ConfigError as exc:
        entry = exc.key.removeprefix(name).removeprefix(".")
        if entry:
            raise ValueError(f"{entry!r} = {exc.value!r}: expected {exc.allowed}") from None
        raise ValueError(f"expected {exc.allowed}{whole}") from None


def _true_or_false(value: str) -> bool | str:
    """``true`` / ``false`` as the environment writes them, any other text as it is."""
    return value.lower() == "true" if value.lower() in ("true", "false") else value


def _model_table(value: str, what: str, example: str) -> dict[str, str]:
    """A per-model table written as one variable: ``MODEL=VALUE`` pairs, comma-separated
    (``*=leading,deepseek/deepseek-r1=anywhere``), as the environment writes lists
    (``summarizers``). A nested variable cannot hold one: a variable's name has no room for
    ``*``, ``/``, ``-`` or ``.``, which model ids are made of, and is read in lower case."""
    table: dict[str, str] = {}
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        model, equals, entry = item.rpartition("=")
        model = model.strip()
        if not equals or not model:
            raise ValueError(
                f"expected MODEL={what} pairs, comma-separated ({example}); {item!r} names no model"
            )
        if model in table:
            raise ValueError(f"model {model!r} is named twice")
        table[model] = entry.strip()
    return table


class ProvidersConfig(_Section):
    anthropic: ProviderEndpoint = ProviderEndpoint()
    openai: ProviderEndpoint = ProviderEndpoint()
    openrouter: ProviderEndpoint = ProviderEndpoint()
    openai_compatible: ProviderEndpoint = ProviderEndpoint()


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    ticket_ttl_s: float = Field(default=60.0, gt=0)
    keepalive_s: float = Field(default=15.0, gt=0)
    """Seconds between SSE keep-alive comments on a quiet live stream."""
    secret: str | None = None
    """HMAC key for live-channel tickets; when unset, generated once and kept beside a SQLite
    store (a 0600 file) or in a PostgreSQL store's ``secrets`` table."""
    max_connections: int = Field(default=4096, ge=1, le=1_000_000)
    """Open client connections at most (also kept below the open-file limit). Beyond it the
    oldest connection not in a request is closed to make room, else the newcomer gets 503."""
    header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    """A connection must send a complete request head within this many seconds."""
    max_header_bytes: int = Field(default=64 * 1024, ge=4096, le=16 * 1024 * 1024)
    """The longest request head (request line and headers) read, in bytes; a longer one is
    answered ``431`` and its connection closed (ADR 0147)."""
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """A request body still arriving when ``header_timeout_s`` has passed must be complete
    within this many seconds more, else the daemon answers ``408`` and closes the connection
    (ADR 0147): a body that trickles in ("slowloris") cannot hold a connection for ever."""
    idle_timeout_s: int = Field(default=5, ge=1, le=3600)
    """An idle keep-alive connection is closed after this many (whole) seconds."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names (the ``Host`` header without its port) the daemon answers besides IP
    addresses, ``localhost`` and ``host``. On a connection to a loopback address no other name is
    answered (``400``: a page that rebinds its name to ``127.0.0.1`` reads nothing, ADR 0159);
    on other addresses, only these: the daemon refuses to listen on an address that is not
    loopback while this is empty, since it would then answer any name there (ADR 0164).
    ``"*"``: every name everywhere (unsafe: any page can rebind a name of its own to the
    daemon). In the environment: comma-separated."""
    cors_origins: tuple[str, ...] = ()
    """Origins (``scheme://host[:port]``, exactly as a browser sends ``Origin``) whose pages may
    call the API from a browser (CORS, ADR 0164). Empty: no CORS header is ever sent, and no
    preflight answered. No wildcard and no ``null``. In the environment: comma-separated."""
    gc_young_threshold: int = Field(default=10_000, ge=100, le=10_000_000)
    """Net container allocations between the cyclic garbage collector's young passes while
    serving (Python's default: 700). Higher lets a run's short-lived objects die before a pass
    walks them; cycles are still collected, at most this many allocations later (ADR 0045)."""

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_names(cls, value: Any) -> Any:
        return _each(value, _host_name)

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> Any:
        return _each(value, _origin)


def _each(value: Any, parse: Callable[[str], str]) -> Any:
    """A list setting's items, each through ``parse`` (once each, in order): one string, as
    the environment gives it, is comma-separated. Anything else is pydantic's to refuse."""
    if isinstance(value, str):
        value = [s for s in value.split(",") if s.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(i, str) for i in value):
        return value
    return tuple(dict.fromkeys(parse(item) for item in value))


def _host_name(text: str) -> str:
    name = text.strip().lower()
    if not name or any(c in name for c in "/: \t@"):
        raise ValueError(
            f"{text!r} is not a host name; give names as a Host header holds them, "
            'without scheme or port ("tg.example.com"), or "*"'
        )
    return name.rstrip(".")


def _origin(text: str) -> str:
    """``text`` as a browser's ``Origin`` header spells it (lower-case scheme and host, no
    default port), or a ``ValueError`` saying what an origin is: a wildcard or ``null`` (every
    sandboxed frame's and ``file:`` page's origin) would let pages nobody listed read the API."""
    item = text.strip()
    expected = (
        'give origins as a browser sends them, scheme, host and port only ("https://app.example", '
        '"http://127.0.0.1:3000"); no wildcard, no "null"'
    )
    try:
        parts = urlsplit(item)
        port = parts.port
    except ValueError:
        raise ValueError(f"{text!r} is not an origin; {expected}") from None
    if (
        parts.scheme.lower() not in ("http", "https")
        or not parts.hostname
        or "*" in item
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")  # a pasted "https://app.example/" is the same origin
        or parts.query
        or parts.fragment
        or item.endswith(("?", "#"))
    ):
        raise ValueError(f"{text!r} is not an origin; {expected}")
    scheme = parts.scheme.lower()
    host = parts.hostname.lower()
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    default = {"http": 80, "https": 443}[scheme]
    return f"{scheme}://{host}" + ("" if port in (None, default) else f":{port}")


class TelemetryConfig(_Section):
    exporter: Literal["none", "console", "otlp_http", "otlp_grpc"] = "none"
    endpoint: str | None = None
    capture_content: bool = False
    export_timeout_s: float = Field(default=0.5, gt=0, le=30)
    """One attempt per batch, bounded by this, on the exporter's own thread; a collector that is
    down costs a run nothing and its spans are dropped (with one warning per outage)."""
    metrics: bool = True
    """Export the GenAI client metrics (``gen_ai.client.token.usage``,
    ``gen_ai.client.operation.duration``) beside the spans."""
    metrics_endpoint: str | None = None
    """OTLP/HTTP metrics URL; default: derived from ``endpoint`` (``/v1/metrics``)."""
    metrics_interval_s: float = Field(default=60.0, gt=0, le=3600)
    """How often metrics are exported (and once more when the process exits)."""


class McpConfig(_Section):
    role: str = "member"

    @field_validator("role")
    @classmethod
    def _known_role(cls, value: str) -> str:
        if value not in ROLE_NAMES:
            raise ValueError("expected one of " + ", ".join(ROLE_NAMES))
        return value


class Config(_Section):
    """The whole validated configuration."""

    orchestration: OrchestrationConfig = OrchestrationConfig()
    durability: DurabilityConfig = DurabilityConfig()
    quotas: QuotasConfig = QuotasConfig()
    store: StoreConfig = StoreConfig()
    visible_reasoning: VisibleReasoningConfig = VisibleReasoningConfig()
    access: AccessConfig = AccessConfig()
    providers: ProvidersConfig = ProvidersConfig()
    server: ServerConfig = ServerConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    mcp: McpConfig = McpConfig()
    source: str = Field(default="", exclude=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "") -> Config:
        """Validate ``data``; its problems become one :class:`ConfigError`, a line each."""
        try:
            return cls.model_validate({**data, "source": source})
        except ValidationError as exc:
            raise config_error(exc, Config, source) from None


PROVIDER_ENV: dict[tuple[str, str], str] = {
    (e.config_section, key): env
    for e in ENDPOINTS.values()
    if e.config_section is not None
    for key, env in (("base_url", e.base_url_env), ("api_key", e.api_key_env))
    if env is not None
}
"""``providers.<section>.<key>`` -> the provider's own environment variable (as its SDK reads it)."""

_SHORTCUTS: dict[tuple[str, ...], str] = {("store", "url"): "THOUGHTGATE_DB"}
"""Variables that stand for one key and beat its ``THOUGHTGATE_<SECTION>__<KEY>`` form."""
_ENV_PREFIX = "THOUGHTGATE_"
_NESTED = "__"


@dataclass(frozen=True, slots=True)
class _Layers:
    environ: Mapping[str, str]
    file: Path | None


_LAYERS: ContextVar[_Layers] = ContextVar("thoughtgate_config_layers")
"""The environment and file of the ``load_config`` call in progress (pydantic-settings asks the
settings class, not the call, for its sources)."""


def _named(environ: Mapping[str, str], names: Mapping[tuple[str, ...], str]) -> dict[str, Any]:
    """Named variables for single keys (``ANTHROPIC_API_KEY``, ``THOUGHTGATE_DB``) as a nested
    mapping; an empty one counts as unset."""
    values: dict[str, Any] = {}
    for path, name in names.items():
        if environ.get(name):
            node = values
            for part in path[:-1]:
                node = node.setdefault(part, {})
            node[path[-1]] = environ[name]
    return values


@cache
def _layered() -> type[Config]:
    """:class:`Config` read through pydantic-settings, highest layer first: ``THOUGHTGATE_DB`` >
    ``THOUGHTGATE_<SECTION>__<KEY>`` > the providers' own variables > the TOML file > defaults.

    Built on first use: pydantic-settings is imported when a configuration is loaded, not when
    ``thoughtgate --help`` starts."""
    from pydantic.fields import FieldInfo
    from pydantic_settings import (
        BaseSettings,
        EnvSettingsSource,
        PydanticBaseSettingsSource,
        SettingsConfigDict,
        TomlConfigSettingsSource,
    )
    from pydantic_settings.sources.utils import parse_env_vars

    class Variables(PydanticBaseSettingsSource):
        def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]) -> None:
            super().__init__(settings_cls)
            self.values = values

        def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
            return self.values.get(field_name), field_name, False

        def __call__(self) -> dict[str, Any]:
            return self.values

    class Environment(EnvSettingsSource):
        """``THOUGHTGATE_<SECTION>__<KEY>`` only (a bare ``THOUGHTGATE_SERVER`` is no setting),
        from the mapping ``load_config`` was given."""

        def _load_env_vars(self) -> Mapping[str, str | None]:
            environ = _LAYERS.get().environ
            nested = {
                name: value
                for name, value in environ.items()
                if name.upper().startswith(_ENV_PREFIX) and _NESTED in name[len(_ENV_PREFIX) :]
            }
            return parse_env_vars(
                nested, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
            )

    class Layered(BaseSettings, Config):
        model_config = SettingsConfigDict(
            env_prefix=_ENV_PREFIX,
            env_nested_delimiter=_NESTED,
            case_sensitive=False,
            enable_decoding=False,  # values are plain strings, as they always were
            extra="forbid",
            frozen=True,
        )

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            layers = _LAYERS.get()
            vendors: dict[tuple[str, ...], str] = {
                ("providers", *key): name for key, name in PROVIDER_ENV.items()
            }
            file = layers.file
            return (
                init_settings,
                Variables(settings_cls, _named(layers.environ, _SHORTCUTS)),
                Environment(settings_cls),
                Variables(settings_cls, _named(layers.environ, vendors)),
                *((TomlConfigSettingsSource(settings_cls, toml_file=file),) if file else ()),
            )

    return Layered


def _overridden(environ: Mapping[str, str]) -> bool:
    """Whether any variable of the environment layers is set (the source then says so)."""
    named = {*PROVIDER_ENV.values(), *_SHORTCUTS.values()}
    return any(
        (n.upper().startswith(_ENV_PREFIX) and _NESTED in n) or (n in named and v)
        for n, v in environ.items()
    )


def _read_toml(file: Path) -> dict[str, Any]:
    """Read the file once up front, so a broken one is one clear :class:`ConfigError`."""
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        problem = f"not valid TOML: {exc}"
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text: {exc}"
    except OSError as exc:
        problem = f"cannot be read: {exc.strerror or exc}"
    raise ConfigError("", None, "", source=str(file), problem=problem) from None


def _origins(
    loc: Location,
    environ: Mapping[str, str],
    file: Path | None,
    data: Mapping[str, Any],
) -> list[str]:
    """Where the value at ``loc`` (or under it) is set, highest layer first: the variables that
    set it, then the file."""
    path = tuple(str(p) for p in itertools.takewhile(lambda p: isinstance(p, str), loc))

    def sets(key: tuple[str, ...]) -> bool:
        return key[: len(path)] == path

    found = [name for key, name in _SHORTCUTS.items() if sets(key) and environ.get(name)]
    found += sorted(
        name
        for name in environ
        if name.upper().startswith(_ENV_PREFIX)
        and _NESTED in name[len(_ENV_PREFIX) :]
        and sets(tuple(name[len(_ENV_PREFIX) :].lower().split(_NESTED)))
    )
    found += [
        name
        for (section, key), name in PROVIDER_ENV.items()
        if sets(("providers", section, key)) and environ.get(name)
    ]
    node: Any = data
    for part in path:
        node = node.get(part) if isinstance(node, Mapping) else None
    if file is not None and node is not None:
        found.append(str(file))
    return found


def _refuse_unknown_sections(environ: Mapping[str, str]) -> None:
    """``THOUGHTGATE_<SECTION>__<KEY>`` naming no section is an error, as ``[bogus]`` in the
    file is: pydantic-settings reads only the sections it knows, so a typo in one
    (``THOUGHTGATE_ORCHESTRATON__CHAIN_OF_THOUGHT``) was ignored without a word. The value is
    not repeated: it may be a secret (``THOUGHTGATE_PROVIDRES__ANTHROPIC__API_KEY``)."""
    strays = [
        ConfigError(
            section,
            None,
            "",
            source=name,
            problem="no such section (check the spelling)",
        )
        for name in sorted(environ)
        if name.upper().startswith(_ENV_PREFIX)
        and _NESTED in name[len(_ENV_PREFIX) :]
        and (section := name[len(_ENV_PREFIX) :].split(_NESTED)[0].lower())
        not in Config.model_fields
    ]
    if strays:
        first, *others = strays
        raise ConfigError(
            first.key, None, "", source=first.source, problem=first.problem, also=others
        )


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Config:
    """Find, read, overlay and validate the configuration (see the module docstring for order)."""
    env = os.environ if environ is None else environ
    explicit = path if path is not None else env.get("THOUGHTGATE_CONFIG") or None
    file: Path | None
    if explicit is not None:
        file = Path(explicit)
        if not file.is_file():  # read more than once: a pipe (``--config <(...)``) cannot be
            named = "--config" if path is not None else "THOUGHTGATE_CONFIG"
            what = (
                "no such file"
                if not file.exists()
                else "a directory, not a file"
                if file.is_dir()
                else "not a regular file"
            )
            raise ConfigError("", None, "", source=str(file), problem=f"{what} (named by {named})")
    else:
        candidate = (cwd or Path.cwd()) / "thoughtgate.toml"
        file = candidate if candidate.is_file() else None
    _refuse_unknown_sections(env)
    data = _read_toml(file) if file is not None else {}
    source = str(file) if file is not None else "defaults"
    if _overridden(env):
        source = f"{source} + environment"

    def origin(loc: Location, table: bool) -> str:
        """The variable or file the bad value came from: the top layer that sets the key (it
        won), or, for a whole table, every layer that sets part of it."""
        found = _origins(loc, env, file, data)
        return (" + ".join(found) if table else found[0]) if found else source

    token = _LAYERS.set(_Layers(env, file))
    try:
        layered = _layered()(source=source)
    except ValidationError as exc:
        raise config_error(exc, Config, source, origin) from None
    finally:
        _LAYERS.reset(token)
    return Config.model_validate(dict(layered))


# --------------------------------------------------------------------------- precedence

_T = TypeVar("_T")


def _first(*layers: _T | None, default: _T) -> _T:
    for layer in layers:
        if layer is not None:
            return layer
    return default


def resolve_chain_of_thought(
    explicit: str | None, run: str | None, config: str | None
) -> ChainOfThought:
    """explicit > the run's own setting > project config > ``hidden``. Unknown names raise."""
    return _first(
        parse_chain_of_thought(explicit),
        parse_chain_of_thought(run),
        parse_chain_of_thought(config),
        default=DEFAULT_CHAIN_OF_THOUGHT,
    )


def _parse_backend(value: str | None) -> WorkerBackend | None:
    if value is None:
        return None
    if value not in WORKER_BACKENDS:
        raise UsageError(f"unknown worker_backend {value!r}; allowed: {', '.join(WORKER_BACKENDS)}")
    return value  # type: ignore[return-value]


def resolve_worker_backend(
    explicit: str | None, run: str | None, config: str | None
) -> WorkerBackend:
    """explicit > run > config > ``provider``."""
    return _first(
        _parse_backend(explicit),
        _parse_backend(run),
        _parse_backend(config),
        default=DEFAULT_WORKER_BACKEND,
    )


def resolve_store(explicit: str | None, run: str | None, config: str | None) -> str:
    """explicit (``--db``) > run > config (``store.url`` / ``THOUGHTGATE_DB``) > the default file."""
    from thoughtgate.store.urls import default_store_url

    return _first(explicit or None, run or None, config or None, default=default_store_url())
