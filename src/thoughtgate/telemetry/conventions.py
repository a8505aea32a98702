"""The OpenTelemetry names thoughtgate emits: GenAI semantic-convention attributes and metrics.

Spelled out here (rather than imported from ``opentelemetry.semconv._incubating``) so an
incubating rename there cannot silently change what we emit; ``tests/test_telemetry_otlp.py``
checks every name against the installed conventions package and against the registry table in
``docs/telemetry.md``.

Which conventions: the GenAI semantic conventions (``open-telemetry/semantic-conventions-genai``:
registry attributes, inference spans, agent and workflow spans, client metrics), with
``server.*`` and ``error.type`` from the general registry. :data:`SCHEMA_URL` is stamped on the
instrumentation scope of every span and metric.
"""

from __future__ import annotations

from typing import Final

from thoughtgate.providers.registry import ENDPOINTS

__all__ = [
    "AGENT_ID",
    "AGENT_NAME",
    "AGENT_VERSION",
    "CACHE_READ_TOKENS",
    "CACHE_WRITE_TOKENS",
    "CONVERSATION_ID",
    "DURATION_BUCKETS",
    "ERROR_TYPE",
    "FINISH_REASONS",
    "INPUT_MESSAGES",
    "INPUT_TOKENS",
    "OPERATION",
    "OPERATION_DURATION",
    "OUTPUT_MESSAGES",
    "OUTPUT_TOKENS",
    "PROVIDER",
    "REASONING_TOKENS",
    "REQUEST_MAX_TOKENS",
    "REQUEST_MODEL",
    "REQUEST_STREAM",
    "REQUEST_TEMPERATURE",
    "RESPONSE_ID",
    "RESPONSE_MODEL",
    "SCHEMA_URL",
    "SCOPE",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "SYSTEM_INSTRUCTIONS",
    "TIME_TO_FIRST_CHUNK",
    "TOKEN_BUCKETS",
    "TOKEN_TYPE",
    "TOKEN_USAGE",
    "TOOL_ARGUMENTS",
    "TOOL_CALL_ID",
    "TOOL_DEFINITIONS",
    "TOOL_NAME",
    "TOOL_RESULT",
    "TOOL_TYPE",
    "WORKFLOW_NAME",
    "provider_name",
]

SCOPE: Final = "thoughtgate"
"""The instrumentation scope name (its version is thoughtgate's)."""
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.42.0"
"""The semantic-conventions release the GenAI conventions build on (``server.*``, ``error.type``)."""

# --------------------------------------------------------------------------- attributes
OPERATION: Final = "gen_ai.operation.name"
PROVIDER: Final = "gen_ai.provider.name"
AGENT_NAME: Final = "gen_ai.agent.name"
AGENT_ID: Final = "gen_ai.agent.id"
AGENT_VERSION: Final = "gen_ai.agent.version"
WORKFLOW_NAME: Final = "gen_ai.workflow.name"
CONVERSATION_ID: Final = "gen_ai.conversation.id"
REQUEST_MODEL: Final = "gen_ai.request.model"
REQUEST_STREAM: Final = "gen_ai.request.stream"
REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
RESPONSE_ID: Final = "gen_ai.response.id"
RESPONSE_MODEL: Final = "gen_ai.response.model"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
REASONING_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
CACHE_READ_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
INPUT_MESSAGES: Final = "gen_ai.input.messages"
OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOOL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
TOOL_RESULT: Final = "gen_ai.tool.call.result"
TOKEN_TYPE: Final = "gen_ai.token.type"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"

# --------------------------------------------------------------------------- metrics
TOKEN_USAGE: Final = "gen_ai.client.token.usage"
OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
TOKEN_BUCKETS: Final = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
"""The explicit bucket boundaries the conventions give ``gen_ai.client.token.usage``."""
DURATION_BUCKETS: Final = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
"""The explicit bucket boundaries the conventions give ``gen_ai.client.operation.duration``."""

# --------------------------------------------------------------------------- provider names


_SERVER_PROVIDERS: Final = {
    "anthropic": "anthropic",
    "openai": "openai",
    "azure": "azure.ai.openai",
    "deepseek": "deepseek",
    "moonshot": "moonshot_ai",
    "groq": "groq",
    "xai": "x_ai",
    "openrouter": "openrouter",
    "cerebras": "cerebras",
    "together": "together_ai",
    "dashscope": "dashscope",
    "ollama": "ollama",
}
"""Servers the endpoint rules recognise -> the conventions' well-known provider names (the rest
are custom values, as the conventions allow)."""


def provider_name(adapter: str | None, server: str | None = None) -> str | None:
    """``gen_ai.provider.name`` for a model turn: the real provider behind an
    ``openai-compatible`` endpoint when the endpoint rules know its server (``deepseek``,
    ``groq``, ``vllm``, ...: the conventions' well-known name where there is one, else the server's
    own), ``openai`` (the wire format's flavour) when they do not."""
    if adapter is None:
        return None  # no model (an inline worker): no GenAI provider to name
    endpoint = ENDPOINTS.get(adapter)
    if endpoint is None:
        return adapter
    if endpoint.telemetry_name is None:  # decided by the server behind the endpoint
        if not server or server in ("generic", "*"):
            return "openai"
        return _SERVER_PROVIDERS.get(server, server)
    return endpoint.telemetry_name
