"""Endpoint rules as data: what each server and model family takes and gives around reasoning.

One table per wire format says, for a server (found from the base URL's host, or named with the
``server`` option) and a model family (a pattern over the normalized model id):

* which reasoning parameters a request may carry: ``surface`` (sent when reasoning is wanted),
  ``hidden`` (sent in ``hidden`` mode to switch thinking off where the model would think unasked;
  ``None`` when the server has no switch) and ``effort`` (the name of the effort parameter, or
  ``None`` when the model refuses one);
* which fields reasoning comes back in (``fields``) and what kind it is (``reasoning_kind``), and
  on which servers a ``summary`` is one (``summary_servers``: anywhere else the same format carries
  the model's raw reasoning, so the kind is ``raw``);
* what goes back inside a tool loop and under which name (``send_back``), whether the API rejects
  a loop without it (``send_back_required``: then it is kept in memory for that loop in every
  mode, ``hidden`` included, and never recorded), and, for unknown servers, ``echo_only`` (send it
  back -- kept like a required one -- only to a server that sent it under that same name: such a
  server speaks DeepSeek's convention, whose tool loops fail without it);
* whether ``completion_tokens`` already counts the reasoning (``reasoning_in_output``);
* whether the server takes thinking only on a streamed request (``thinking_streams_only``: a
  request that is not streamed then carries the ``hidden`` switch, whatever the mode).

The first row whose server and pattern match wins; every table ends with a conservative row for
unknown servers and models: send nothing reasoning-specific that could be refused, send back
nothing a server could reject. ``thoughtgate.toml`` overrides any column for one endpoint
(``[providers.openai_compatible.rules]``; see ``docs/providers/endpoints.md``), and
:func:`endpoint_table` renders the tables that page shows, so the page cannot drift from the data.

Adapters only read these rows; they never hard-code a server's quirk. Sources are kept per row.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field, fields, replace
from typing import Any, Final, Literal, TypeAlias
from urllib.parse import urlparse

from thoughtgate.errors import ConfigError
from thoughtgate.types import ReasoningKind

__all__ = [
    "ANTHROPIC_RULES",
    "COMPAT_RULES",
    "OPENROUTER_RULES",
    "OVERRIDABLE",
    "RESPONSES_RULES",
    "SERVERS",
    "EndpointRule",
    "ThinkingForm",
    "WireFormat",
    "anthropic_rule",
    "apply_overrides",
    "detect_server",
    "endpoint_table",
    "known_servers",
    "normalize_anthropic_model",
    "overrides_problem",
    "resolve_rule",
    "rule_columns",
]

WireFormat: TypeAlias = Literal["anthropic", "openai-responses", "openrouter", "openai-compatible"]
ThinkingForm: TypeAlias = Literal["none", "budget", "adaptive"]


@dataclass(frozen=True, slots=True)
class EndpointRule:
    """One row: a server and model family of one wire format (see the module docstring)."""

    format: WireFormat
    server: str
    family: str
    pattern: str
    """Regular expression, ``fullmatch``-ed against the normalized model id."""
    _: KW_ONLY
    surface: Mapping[str, Any] | None = None
    hidden: Mapping[str, Any] | None = None
    effort: str | None = None
    fields: tuple[str, ...] = ()
    reasoning_kind: ReasoningKind = "raw"
    summary_servers: tuple[str, ...] = ()
    """The servers known to send provider-written summaries here: only on them is a part
    ``summary`` -- this row's kind, or a part the format itself marks as a summary (Responses
    ``summary_text``, OpenRouter ``reasoning.summary``). Anthropic-compatible endpoints, vLLM,
    llama.cpp, Ollama and gateways send the model's raw reasoning in those same places, so on any
    other server the kind is ``raw``: only a summary may reach end users through
    ``provider_summaries``, and a label that cannot be vouched for is not one (ADR 0078)."""
    send_back: str | None = None
    send_back_required: bool = False
    echo_only: bool = False
    thinks_unasked: bool = False
    reasoning_in_output: bool = True
    thinking_streams_only: bool = False
    """Thinking is refused on a request that is not streamed (DashScope's Qwen): such a request
    sends the ``hidden`` switch instead, in every mode."""
    thinking: ThinkingForm = "none"
    """Anthropic only: the ``thinking`` form the family takes (``budget`` or ``adaptive``)."""
    source: str = ""
    overridden: tuple[str, ...] = field(default=(), compare=False)
    """Columns set from ``thoughtgate.toml`` rather than from this table."""

    def matches(self, server: str, model: str) -> bool:
        return self.server in ("*", server) and re.fullmatch(self.pattern, model) is not None

    @property
    def reasons(self) -> bool:
        """The family returns reasoning at all (the adapter may ask for it)."""
        return bool(self.fields)

    @property
    def marks_summaries(self) -> bool:
        """A part the format marks as a summary may be labelled ``summary``: the server is known
        to mean it, or the row's kind is ``summary`` (only on such a server, or when set in
        ``thoughtgate.toml``: the operator's word)."""
        return self.reasoning_kind == "summary" or self.server in self.summary_servers

    @property
    def keeps_carriers(self) -> bool:
        """Its loop reasoning must go back even in ``hidden`` mode (in memory, never recorded)."""
        return self.send_back is not None and (self.send_back_required or self.echo_only)


#: Columns ``thoughtgate.toml`` may override, with the type each takes.
OVERRIDABLE: Final[Mapping[str, type | tuple[type, ...]]] = {
    "surface": (dict, type(None)),
    "hidden": (dict, type(None)),
    "effort": (str, type(None)),
    "fields": (list, tuple),
    "reasoning_kind": str,
    "send_back": (str, type(None)),
    "send_back_required": bool,
    "echo_only": bool,
    "thinks_unasked": bool,
    "reasoning_in_output": bool,
    "thinking_streams_only": bool,
}

_DISABLED: Final = {"thinking": {"type": "disabled"}}
_THINKING_BLOCKS: Final = "thinking blocks"
#: What every thinking Claude family shares: thinking blocks back, required in a tool loop.
_CLAUDE: Final[dict[str, Any]] = {
    "fields": ("thinking",),
    "send_back": _THINKING_BLOCKS,
    "send_back_required": True,
}
#: Adaptive Claude families: the effort parameter too.
_ADAPTIVE: Final[dict[str, Any]] = {
    **_CLAUDE,
    "thinking": "adaptive",
    "effort": "output_config.effort",
}
#: Claude families whose thinking Anthropic's own API returns summarized. Other servers that speak
#: the Messages format (DeepSeek, Moonshot, MiniMax, Z.ai, vLLM, llama.cpp, a gateway) answer to any
#: model name -- DeepSeek's maps names it does not know to its own model -- with raw reasoning.
_SUMMARIZED: Final[dict[str, Any]] = {
    "reasoning_kind": "summary",
    "summary_servers": ("anthropic",),
}

# --------------------------------------------------------------------------- Anthropic Messages

ANTHROPIC_RULES: Final[tuple[EndpointRule, ...]] = (
    EndpointRule(
        "anthropic",
        "*",
        "Claude Sonnet 3.7",
        r"claude-3-7-sonnet|claude-sonnet-3-7",
        thinking="budget",
        hidden=_DISABLED,
        reasoning_kind="raw",
        **_CLAUDE,
        source="budget only; returns full thinking (extended-thinking docs; PAI cassettes)",
    ),
    EndpointRule(
        "anthropic",
        "*",
        "Claude 2 / 3 / 3.5",
        r"claude-(?:instant|2|3)(?:-.*)?",
        source="no extended thinking: a `thinking` parameter is rejected",
    ),
    EndpointRule(
        "anthropic",
        "*",
        "Claude Opus/Sonnet/Haiku 4, 4.1, 4.5",
        r"claude-(?:opus|sonnet|haiku)-4(?:-[015])?",
        thinking="budget",
        hidden=_DISABLED,
        **_SUMMARIZED,
        **_CLAUDE,
        source="budget only (A-SDK thinking_config_enabled_param.py; PAI cassette "
        "test_anthropic_tool_with_thinking.yaml); Claude 4 returns summarized thinking",
    ),
    EndpointRule(
        "anthropic",
        "*",
        "Claude Opus/Sonnet 4.6",
        r"claude-(?:opus|sonnet|haiku)-4-6",
        hidden=_DISABLED,
        **_ADAPTIVE,
        **_SUMMARIZED,
        source="adaptive recommended, budget_tokens deprecated (platform.claude.com "
        "adaptive-thinking; AAswordman/Operit#568)",
    ),
    EndpointRule(
        "anthropic",
        "*",
        "Claude Opus 4.7 / 4.8",
        r"claude-(?:opus|sonnet|haiku)-4-[789]",
        hidden=_DISABLED,
        **_ADAPTIVE,
        **_SUMMARIZED,
        source='budget form is a 400 "thinking.type.enabled is not supported for this model" '
        "(anomalyco/opencode#22863, openclaw/openclaw#87801); display defaults to omitted, so "
        "summarized is sent explicitly (BerriAI/litellm#25965)",
    ),
    EndpointRule(
        "anthropic",
        "*",
        "Claude Fable / Mythos",
        r"claude-(?:fable|mythos)(?:-.*)?",
        thinks_unasked=True,
        **_ADAPTIVE,
        **_SUMMARIZED,
        source="adaptive only and the default when `thinking` is unset; `disabled` is a 400 "
        "on Fable 5 / Mythos 5, so there is no switch (platform.claude.com adaptive-thinking; "
        "docker/docker-agent#2451)",
    ),
    EndpointRule(
        "anthropic",
        "*",
        "newer or unknown Claude models",
        r".*",
        thinks_unasked=True,
        **_ADAPTIVE,
        source="every model since 4.6 takes adaptive thinking; whether `disabled` is accepted is "
        "not known, so hidden mode sends no switch and keeps the blocks the loop needs; whether "
        "its thinking is a summary is not known either (the format is served by others, who send "
        "raw reasoning under any model name), so it is `raw` until a row says otherwise",
    ),
)

_DATE_SUFFIX = re.compile(r"(?:[-@]\d{8}|-v\d+(?::\d+)?|:\d+|-latest)+$")
_DOTTED_VERSION = re.compile(r"(?<=\d)\.(?=\d)")


def normalize_anthropic_model(model: str) -> str:
    """``"us.anthropic.claude-sonnet-4-5-20250929-v1:0"`` -> ``"claude-sonnet-4-5"``.

    Drops router and cloud prefixes (Bedrock, Vertex, OpenRouter-style ``anthropic/``), dated and
    ``-latest`` suffixes, and writes ``4.7`` as ``4-7``.
    """
    name = model.strip().lower()
    start = name.find("claude")
    if start > 0:
        name = name[start:]
    name = _DOTTED_VERSION.sub("-", name)
    return _DATE_SUFFIX.sub("", name)


def anthropic_rule(model: str) -> EndpointRule:
    """The Anthropic family row of a model, whatever route it is reached by."""
    name = normalize_anthropic_model(model)
    return next(r for r in ANTHROPIC_RULES if r.matches("anthropic", name))


# --------------------------------------------------------------------------- OpenAI Responses

_NOT_REASONING = "gpt-4.*|gpt-3\\.5.*|chatgpt-.*|gpt-5(?:\\.\\d+)?-chat.*"
_SUMMARY = {"reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"]}
_ITEMS = "reasoning items (encrypted_content)"
#: OpenAI's own API and Azure's: their ``summary_text`` is a summary. vLLM, llama.cpp and Ollama
#: serve ``/v1/responses`` too, and Ollama sends a thinking model's raw reasoning as summary text.
_OPENAI: Final = ("openai", "azure")
#: What every OpenAI reasoning family shares.
_REASONING: Final[dict[str, Any]] = {
    "surface": _SUMMARY,
    "effort": "reasoning.effort",
    "send_back": _ITEMS,
}

RESPONSES_RULES: Final[tuple[EndpointRule, ...]] = (
    EndpointRule(
        "openai-responses",
        "*",
        "non-reasoning models (gpt-4o, gpt-4.1, gpt-3.5, chatgpt-4o, gpt-5-chat)",
        _NOT_REASONING,
        summary_servers=_OPENAI,
        source="reasoning parameters are a 400 \"Unsupported parameter: 'reasoning.effort' is "
        'not supported with this model." and include is a 400 "Encrypted content is not '
        'supported with this model." (RageAgainstThePixel/OpenAI-DotNet#500, '
        "microsoft/agent-framework#7483)",
    ),
    EndpointRule(
        "openai-responses",
        "*",
        "gpt-oss",
        r"gpt-oss.*",
        thinks_unasked=True,
        fields=("reasoning_text", "summary_text"),
        reasoning_kind="raw",
        **_REASONING,
        source="raw chain of thought as reasoning_text content (O-SDK "
        "response_reasoning_text_delta_event.py)",
    ),
    EndpointRule(
        "openai-responses",
        "*",
        "gpt-5.1 and later",
        r"gpt-5\.\d+.*",
        hidden={"reasoning": {"effort": "none"}},
        fields=("summary_text",),
        reasoning_kind="summary",
        summary_servers=_OPENAI,
        **_REASONING,
        source="effort none switches reasoning off from gpt-5.1 (PAI cassette "
        "test_openai_responses_gpt_5_6_reasoning_off_keeps_sampling_params.yaml)",
    ),
    EndpointRule(
        "openai-responses",
        "*",
        "gpt-5, o-series, codex",
        r"gpt-5(?:-.*)?|o\d.*|codex-.*",
        thinks_unasked=True,
        fields=("summary_text",),
        reasoning_kind="summary",
        summary_servers=_OPENAI,
        **_REASONING,
        source="always reason; o3 refuses effort none (\"Unsupported value: 'none' is not "
        "supported with the 'o3-2025-04-16' model\", PAI cassette "
        "test_openrouter_thinking_false_on_always_on_route.yaml)",
    ),
    EndpointRule(
        "openai-responses",
        "*",
        "unknown models",
        r".*",
        summary_servers=_OPENAI,
        source="conservative: a model that does not reason rejects reasoning parameters, so "
        "none are sent; override in thoughtgate.toml for a new reasoning model",
    ),
)

# --------------------------------------------------------------------------- OpenRouter

_DETAILS = "reasoning_details"
_OR_FIELDS = ("reasoning_details", "reasoning")
#: OpenRouter's ``reasoning.summary`` details, and Claude's thinking it routes to Anthropic's
#: models, are summaries on OpenRouter itself; a gateway that only speaks its format vouches for
#: nothing.
_OR: Final = ("openrouter",)

OPENROUTER_RULES: Final[tuple[EndpointRule, ...]] = (
    EndpointRule(
        "openrouter",
        "*",
        "anthropic/* (as the Anthropic family table)",
        r"anthropic/.*",
        fields=_OR_FIELDS,
        summary_servers=_OR,
        send_back=_DETAILS,
        send_back_required=True,
        source="derived per model from the Anthropic rows: same reasoning kind; hidden sends "
        "effort none where the family accepts `disabled` (PAI cassette "
        "test_openrouter_thinking_false_supports_thinking_model.yaml), else nothing and the "
        "details the loop needs are kept in memory",
    ),
    EndpointRule(
        "openrouter",
        "*",
        "openai/o*, openai/gpt-5*",
        r"openai/(?:o\d|gpt-5|gpt-oss).*",
        hidden={"reasoning": {"exclude": True}},
        effort="reasoning.effort",
        thinks_unasked=True,
        fields=_OR_FIELDS,
        reasoning_kind="summary",
        summary_servers=_OR,
        send_back=_DETAILS,
        source="effort none is a 400 on o3 (PAI cassette "
        "test_openrouter_thinking_false_on_always_on_route.yaml); exclude hides what cannot "
        "be switched off",
    ),
    EndpointRule(
        "openrouter",
        "*",
        "z-ai/* (GLM)",
        r"z-ai/.*",
        hidden={"reasoning": {"enabled": False}},
        effort="reasoning.effort",
        thinks_unasked=True,
        fields=_OR_FIELDS,
        summary_servers=_OR,
        send_back=_DETAILS,
        source="enabled false switches GLM thinking off (PAI cassette "
        "test_openrouter_thinking_false_profile_gated_model.yaml)",
    ),
    EndpointRule(
        "openrouter",
        "*",
        "other models",
        r".*",
        hidden={"reasoning": {"exclude": True}},
        effort="reasoning.effort",
        fields=_OR_FIELDS,
        summary_servers=_OR,
        send_back=_DETAILS,
        source="conservative: `exclude` is accepted by every model "
        "(openrouter.ai/docs/use-cases/reasoning-tokens)",
    ),
)

# --------------------------------------------------------------------------- OpenAI-compatible

_RC = "reasoning_content"
_R = "reasoning"

COMPAT_RULES: Final[tuple[EndpointRule, ...]] = (
    EndpointRule(
        "openai-compatible",
        "deepseek",
        "DeepSeek API",
        r".*",
        hidden={"thinking": {"type": "disabled"}},
        effort="reasoning_effort",
        thinks_unasked=True,
        fields=(_RC,),
        send_back=_RC,
        send_back_required=True,
        source="thinking on by default, switched with thinking.type (api-docs.deepseek.com/"
        "guides/thinking_mode); tool turns need reasoning_content back, also when empty "
        "(warpdotdev/warp#11587, deepseek-ai/deepseek-harness#739)",
    ),
    EndpointRule(
        "openai-compatible",
        "moonshot",
        "Kimi thinking models",
        r"kimi-k2-thinking.*|kimi-k2\.[5-9].*|kimi-k[3-9].*",
        thinks_unasked=True,
        fields=(_RC,),
        send_back=_RC,
        send_back_required=True,
        source='always thinks; 400 "thinking is enabled but reasoning_content is missing in '
        'assistant tool call message at index N" without it (Moonshot; seen in several '
        "client fixes); no switch",
    ),
    EndpointRule(
        "openai-compatible",
        "moonshot",
        "other Kimi models",
        r".*",
        source="no reasoning returned",
    ),
    EndpointRule(
        "openai-compatible",
        "groq",
        "Qwen3 on Groq",
        r"qwen/qwen3.*",
        surface={"reasoning_format": "parsed"},
        hidden={"reasoning_effort": "none"},
        thinks_unasked=True,
        fields=(_R, "<think>"),
        source="raw <think> in content unless reasoning_format parsed (PAI cassette "
        "test_groq_model_thinking_part_iter.yaml); reasoning_effort none turns it off "
        "(console.groq.com/docs/reasoning); sending reasoning_content back is a 400 "
        "\"property 'reasoning_content' is unsupported\" (janhq/jan#8136)",
    ),
    EndpointRule(
        "openai-compatible",
        "groq",
        "gpt-oss on Groq",
        r"openai/gpt-oss.*",
        hidden={"include_reasoning": False},
        effort="reasoning_effort",
        thinks_unasked=True,
        fields=(_R,),
        source="`reasoning` on the message (PAI cassette "
        "test_groq_native_with_tools_falls_back_gpt_oss.yaml); always reasons, include_reasoning "
        "false keeps it off the wire; nothing may go back",
    ),
    EndpointRule(
        "openai-compatible",
        "groq",
        "other Groq models",
        r".*",
        fields=(_R, "<think>"),
        source="reasoning_format decides <think> or `reasoning`; nothing may go back",
    ),
    EndpointRule(
        "openai-compatible",
        "cerebras",
        "Cerebras",
        r".*",
        effort="reasoning_effort",
        fields=(_R,),
        source="`reasoning` on the message (PAI cassette "
        "test_openai_model_cerebras_provider_harmony.yaml); reasoning_content sent back is a "
        "400 \"property 'messages.N.assistant.reasoning_content' is unsupported\" "
        "(Kilo-Org/kilocode#10375, NousResearch/hermes-agent#34716)",
    ),
    EndpointRule(
        "openai-compatible",
        "together",
        "Together",
        r".*",
        fields=(_R, "<think>"),
        source="the `reasoning` field (docs.together.ai hybrid thinking); usage in a `choices: []` "
        "chunk even without stream_options, `reasoning_tokens` at the top of `usage` (Mirascope "
        "cassette together_meta_llama_Llama_4_Maverick_17B_128E_Instruct_FP8/stream.yaml); a "
        "stray `<think>` as the first content delta before the `reasoning` deltas "
        "(ryanto/deepseek-v31-extra-think-tag); does not take DeepSeek's thinking switch; "
        "whether reasoning sent back is rejected is UNCONFIRMED, so nothing is sent",
    ),
    EndpointRule(
        "openai-compatible",
        "xai",
        "grok-3-mini",
        r"grok-3-mini.*",
        effort="reasoning_effort",
        thinks_unasked=True,
        fields=(_RC,),
        reasoning_in_output=False,
        source="reasoning_content; completion_tokens excludes reasoning_tokens (e.g. 2 vs "
        "340), so output is their sum (docs.x.ai reasoning)",
    ),
    EndpointRule(
        "openai-compatible",
        "xai",
        "other Grok models",
        r".*",
        thinks_unasked=True,
        reasoning_in_output=False,
        source="no reasoning text; reasoning_tokens reported apart from completion_tokens",
    ),
    EndpointRule(
        "openai-compatible",
        "dashscope",
        "Qwen thinking-only models (qwq, qvq, *-thinking)",
        r"qwq.*|qvq.*|.*thinking.*",
        thinks_unasked=True,
        fields=(_RC,),
        source='always think and answer only streamed requests (400 "This model only support '
        'stream mode, please enable the stream parameter to access the model.", Model Studio '
        "error codes); reasoning is not needed back",
    ),
    EndpointRule(
        "openai-compatible",
        "dashscope",
        "Qwen3 open-weight, Qwen3.5 and later (hybrid, thinking on by default)",
        r"(?!.*(?:instruct|coder))(?:qwen3-\d+(?:\.\d+)?b.*|qwen3\.\d+.*)",
        surface={"enable_thinking": True},
        hidden={"enable_thinking": False},
        thinks_unasked=True,
        thinking_streams_only=True,
        fields=(_RC,),
        source="enable_thinking switches thinking, on by default for open-weight Qwen3 and "
        'Qwen3.5+; a request that is not streamed must send it false (400 "parameter.'
        'enable_thinking must be set to false for non-streaming calls", infiniflow/ragflow#8972, '
        "OpenBMB/UltraRAG#287); reasoning_content, usage with reasoning_tokens in a `choices: "
        "[]` chunk (AI SDK fixture alibaba-reasoning.chunks.txt); reasoning is not needed back",
    ),
    EndpointRule(
        "openai-compatible",
        "dashscope",
        "Qwen hybrid thinking, off by default (qwen3-max, qwen-plus, qwen-flash, qwen-turbo)",
        r"qwen3-max.*|qwen-plus.*|qwen-flash.*|qwen-turbo.*",
        surface={"enable_thinking": True},
        hidden={"enable_thinking": False},
        thinking_streams_only=True,
        fields=(_RC,),
        source="enable_thinking switches thinking (Model Studio deep-thinking docs; AI SDK "
        "fixture alibaba-reasoning.chunks.txt, qwen3-max); thinking only on streamed requests, "
        "as above; reasoning is not needed back",
    ),
    EndpointRule(
        "openai-compatible",
        "dashscope",
        "other Qwen models (instruct, coder, qwen-max)",
        r".*",
        fields=(_RC,),
        source="no thinking switch is sent (not every model takes enable_thinking); "
        "reasoning_content is read if it comes",
    ),
    EndpointRule(
        "openai-compatible",
        "ollama",
        "Ollama /v1",
        r".*",
        hidden={"reasoning_effort": "none"},
        effort="reasoning_effort",
        fields=(_R, "<think>"),
        source="`reasoning` field, reasoning_effort accepted (ollama/ollama openai/openai.go)",
    ),
    EndpointRule(
        "openai-compatible",
        "vllm",
        "Qwen3 on vLLM / SGLang",
        r"(?:.*/)?qwen3.*",
        hidden={"chat_template_kwargs": {"enable_thinking": False}},
        effort="reasoning_effort",
        fields=(_R, _RC, "<think>"),
        send_back=_RC,
        echo_only=True,
        source="Qwen3 thinks by default, off with chat_template_kwargs (vLLM reasoning docs)",
    ),
    EndpointRule(
        "openai-compatible",
        "*",
        "unknown servers",
        r".*",
        effort="reasoning_effort",
        fields=(_RC, _R, "<think>"),
        send_back=_RC,
        echo_only=True,
        source="conservative: no switch (unknown fields are refused by some servers); "
        "reasoning_content goes back only to a server that sent that field, as DeepSeek-style "
        "servers need it and servers that send `reasoning` (Groq, Cerebras) refuse it",
    ),
)

_TABLES: Final[Mapping[WireFormat, tuple[EndpointRule, ...]]] = {
    "anthropic": ANTHROPIC_RULES,
    "openai-responses": RESPONSES_RULES,
    "openrouter": OPENROUTER_RULES,
    "openai-compatible": COMPAT_RULES,
}

#: Host (suffix, or ``:port``) -> server name. First match wins.
SERVERS: Final[tuple[tuple[str, str], ...]] = (
    ("api.anthropic.com", "anthropic"),
    ("openrouter.ai", "openrouter"),
    ("api.openai.com", "openai"),
    ("openai.azure.com", "azure"),
    ("api.deepseek.com", "deepseek"),
    ("api.moonshot.ai", "moonshot"),
    ("api.moonshot.cn", "moonshot"),
    ("api.groq.com", "groq"),
    ("api.cerebras.ai", "cerebras"),
    ("api.together.xyz", "together"),
    ("api.together.ai", "together"),
    ("api.x.ai", "xai"),
    ("aliyuncs.com", "dashscope"),
    (":11434", "ollama"),
)


@functools.lru_cache(maxsize=256)
def detect_server(base_url: str) -> str:
    """The server a base URL points at (``"generic"`` when the host names none).

    Cached, as :func:`resolve_rule`'s table walk is: an adapter is built per run (twice in the
    daemon), and the answer depends on nothing but the arguments."""
    parsed = urlparse(base_url)
    host = (parsed.hostname or "").lower()
    port = f":{parsed.port}" if parsed.port else ""
    for suffix, name in SERVERS:
        if suffix.startswith(":"):
            if port == suffix:
                return name
        elif host == suffix or host.endswith("." + suffix):
            return name
    return "generic"


def _normalize(fmt: WireFormat, model: str) -> str:
    name = model.strip().lower()
    if fmt == "anthropic":
        return normalize_anthropic_model(name)
    if fmt == "openai-responses":
        return re.sub(r"-\d{4}-\d{2}-\d{2}$", "", name)
    return name


def resolve_rule(
    fmt: WireFormat,
    model: str,
    *,
    server: str = "generic",
    overrides: Mapping[str, Any] | None = None,
) -> EndpointRule:
    """The row for ``model`` on ``server`` (first match), with config ``overrides`` applied."""
    return apply_overrides(_row(fmt, model, server), overrides or {})


@functools.lru_cache(maxsize=512)
def _row(fmt: WireFormat, model: str, server: str) -> EndpointRule:
    """The row :func:`resolve_rule` starts from (the tables are constants; rules are frozen)."""
    name = _normalize(fmt, model)
    rule = next(r for r in _TABLES[fmt] if r.matches(server, name))
    if fmt == "openrouter" and name.startswith("anthropic/"):
        rule = _openrouter_anthropic(rule, name)
    if server != "generic" and rule.server == "*":
        rule = replace(rule, server=server)
    if rule.reasoning_kind == "summary" and rule.server not in rule.summary_servers:
        rule = replace(rule, reasoning_kind="raw")  # fail closed: nobody vouches for a summary
    return rule


def _openrouter_anthropic(rule: EndpointRule, model: str) -> EndpointRule:
    """Claude behind OpenRouter: the family's reasoning kind and switch, OpenRouter's names."""
    family = anthropic_rule(model)
    if not family.reasons:
        return replace(rule, family=family.family, fields=(), send_back=None, source=family.source)
    hidden = {"reasoning": {"effort": "none"}} if family.hidden is not None else None
    return replace(
        rule,
        family=f"{family.family} via OpenRouter",
        hidden=hidden,
        reasoning_kind=family.reasoning_kind,
        thinks_unasked=family.thinks_unasked,
        thinking=family.thinking,
        effort="reasoning.effort" if family.thinking == "adaptive" else None,
    )


def apply_overrides(rule: EndpointRule, overrides: Mapping[str, Any]) -> EndpointRule:
    """``rule`` with the columns ``overrides`` sets; an unknown column or a wrong type is a
    :class:`~thoughtgate.errors.ConfigError` naming the key and what it takes."""
    if not overrides:
        return rule
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        allowed = OVERRIDABLE.get(key)
        if allowed is None:
            raise ConfigError(f"rules.{key}", value, "one of " + ", ".join(sorted(OVERRIDABLE)))
        if not isinstance(value, allowed) or (allowed is not bool and isinstance(value, bool)):
            raise ConfigError(f"rules.{key}", value, _type_text(allowed))
        if key == "reasoning_kind" and value not in ("raw", "summary", "encrypted"):
            raise ConfigError(f"rules.{key}", value, "raw, summary or encrypted")
        if key == "fields":
            items = list(value) if isinstance(value, list | tuple) else []
            if not all(isinstance(v, str) for v in items):
                raise ConfigError(f"rules.{key}", value, "a list of strings")
            changes[key] = tuple(items)
        else:
            changes[key] = value
    return replace(rule, **changes, overridden=tuple(sorted(changes)))


def known_servers() -> tuple[str, ...]:
    """Every server name a row or the host table knows, plus ``generic``."""
    names = {name for _, name in SERVERS} | {"generic"}
    names |= {r.server for rules in _TABLES.values() for r in rules if r.server != "*"}
    return tuple(sorted(names))


def overrides_problem(overrides: Mapping[str, Any]) -> str | None:
    """Why ``overrides`` cannot apply to a rule, or ``None`` (for config validation)."""
    try:
        apply_overrides(COMPAT_RULES[-1], overrides)
    except ConfigError as exc:
        name = exc.key.removeprefix("rules.")
        if name not in OVERRIDABLE:
            return f"no column {name!r}; columns: {', '.join(sorted(OVERRIDABLE))}"
        return f"{name} takes {exc.allowed}"
    return None


def _type_text(allowed: type | tuple[type, ...]) -> str:
    kinds = allowed if isinstance(allowed, tuple) else (allowed,)
    names = {
        dict: "a table",
        list: "a list of strings",
        tuple: "a list of strings",
        str: "a string",
        bool: "true or false",
        type(None): "nothing",
    }
    return " or ".join(dict.fromkeys(names[k] for k in kinds if k is not type(None)))


# --------------------------------------------------------------------------- the docs table


def _cell(value: Any) -> str:
    if value is None or value == () or value == {}:
        return "–"
    if isinstance(value, Mapping):
        import json

        return f"`{json.dumps(value, separators=(', ', ': '))}`"
    if isinstance(value, tuple):
        return ", ".join(f"`{v}`" for v in value)
    return f"`{value}`" if isinstance(value, str) else str(value)


def _send_back(rule: EndpointRule) -> str:
    if rule.send_back is None:
        return "nothing"
    text = f"`{rule.send_back}`"
    if rule.send_back_required:
        return text + " (required: kept in every mode)"
    if rule.echo_only:
        return text + " (only if it came back under that name; then in every mode)"
    return text + " (surface / telemetry_only)"


def _rows(rules: Iterable[EndpointRule]) -> list[str]:
    head = (
        "| server | model family | sent when reasoning is wanted | effort | hidden switch "
        "| thinks unasked | reasoning comes back in | kind | sent back in a tool loop |"
    )
    out = [head, "|" + "---|" * 9]
    for r in rules:
        out.append(
            "| "
            + " | ".join(
                (
                    f"`{r.server}`",
                    r.family,
                    _surface_cell(r),
                    _AS_FAMILY if _derived(r) else _cell(r.effort),
                    _DERIVED_SWITCH if _derived(r) else _hidden_cell(r),
                    _AS_FAMILY if _derived(r) else ("yes" if r.thinks_unasked else "no"),
                    _cell(r.fields),
                    _kind_cell(r),
                    _send_back(r),
                )
            )
            + " |"
        )
    return out


_AS_FAMILY: Final = "as the Claude family"
_DERIVED_SWITCH: Final = (
    '`{"reasoning": {"effort": "none"}}` where the Claude family takes `disabled`, else nothing'
)
_OPENROUTER_SURFACE: Final = (
    '`{"reasoning": {"max_tokens": N}}` with N on top of `max_tokens` when a budget is set (and '
    'for budget-only Claude families), else `{"reasoning": {"effort": E}}`, else '
    '`{"reasoning": {"enabled": true}}`'
)


def _kind_cell(rule: EndpointRule) -> str:
    """The kind, and the servers on which a summary is one (``raw`` anywhere else)."""
    if not rule.reasons:
        return "–"
    servers = ", ".join(f"`{s}`" for s in rule.summary_servers)
    if _derived(rule):
        return f"{_AS_FAMILY} on {servers}, else `raw`"
    if rule.reasoning_kind == "summary":
        return f"`summary` on {servers}, else `raw`"
    kind = f"`{rule.reasoning_kind}`"
    return (
        f"{kind}; a part the format marks as a summary is `summary` on {servers}"
        if servers
        else kind
    )


def _hidden_cell(rule: EndpointRule) -> str:
    cell = _cell(rule.hidden)
    if rule.thinking_streams_only:
        cell += ", also on every request that is not streamed (thinking only streams)"
    return cell


def _derived(rule: EndpointRule) -> bool:
    return rule.format == "openrouter" and rule.pattern.startswith("anthropic/")


def _surface_cell(rule: EndpointRule) -> str:
    if rule.format == "openrouter":
        return _OPENROUTER_SURFACE if rule.reasons else "–"
    if rule.format != "anthropic":
        return _cell(rule.surface)
    if rule.thinking == "budget":
        return '`{"thinking": {"type": "enabled", "budget_tokens": N}}`, N on top of `max_tokens`'
    if rule.thinking == "adaptive":
        return '`{"thinking": {"type": "adaptive", "display": "summarized"}}`'
    return "–"


_TITLES: Final[Mapping[WireFormat, str]] = {
    "anthropic": "Anthropic Messages (`anthropic:`)",
    "openai-responses": "OpenAI Responses (`openai:`)",
    "openrouter": "OpenRouter (`openrouter:`)",
    "openai-compatible": "OpenAI-compatible servers (`openai-compatible:`)",
}


def endpoint_table() -> str:
    """The Markdown tables of every wire format, as ``docs/providers/endpoints.md`` shows them."""
    out: list[str] = []
    for fmt, rules in _TABLES.items():
        out += [f"### {_TITLES[fmt]}", "", *_rows(rules), ""]
    return "\n".join(out).rstrip() + "\n"


def rule_columns() -> tuple[str, ...]:
    """Every column name of a row (for the docs test)."""
    return tuple(f.name for f in fields(EndpointRule))
