"""Chat Completions in nine flavours: OpenRouter and the OpenAI-compatible reasoning servers.

The flavour is chosen by the ``x-emulator-flavor`` header (``openrouter``, ``deepseek``, ``vllm``,
``think-tags``, ``ollama``, ``groq``, ``cerebras``, ``moonshot``, ``dashscope``); else by a path
segment naming one (base URL ``{emulator}/groq/v1``); else by the model name: ``deepseek*`` →
deepseek, ``kimi*`` → moonshot, a name with ``:`` (``qwen3:8b``) → ollama, ``vllm/*`` → vllm,
``think/*`` → think-tags, any other name with a ``/`` (``anthropic/claude-sonnet-4.5``) →
openrouter, else deepseek.

How each flavour renders a scripted turn (``docs/providers/openrouter.md``, ``docs/providers/openai-compatible.md``):

* ``openrouter``: ``: OPENROUTER PROCESSING`` comments (first, and during ``Sleep``), ``provider``
  and ``native_finish_reason``, ``delta.reasoning`` mirroring ``reasoning_details``.
  ``Think`` → ``reasoning.text`` details; for ``anthropic/*`` models an opening detail
  ``{"text": "", "signature": ""}`` and a closing signature-only detail, as recorded.
  ``Summary`` → ``reasoning.summary``; ``Redacted`` → ``reasoning.encrypted``. Each reasoning step
  is its own detail ``index``. The usage chunk carries an empty delta (as recorded), then
  ``[DONE]``. Reasoning is returned when ``reasoning`` asks for it (``enabled``, ``effort`` other
  than ``none``, ``max_tokens``), never with ``exclude: true``; with no ``reasoning`` (or ``{}``, a
  no-op) models reason by default except ``anthropic/*``, whose thinking is opt-in.
* ``deepseek``: ``reasoning_content`` (``content: null`` while thinking), a first delta
  ``{"role": "assistant", "content": null, "reasoning_content": ""}``; thinking is on unless
  ``thinking: {"type": "disabled"}``.
* ``vllm``: ``reasoning`` (the name after vLLM PR #27752); off with
  ``chat_template_kwargs: {"enable_thinking": false}``.
* ``ollama``: ``reasoning``; tool calls arrive whole in one fragment; off with
  ``reasoning_effort: "none"``.
* ``think-tags``: reasoning inline in ``content`` as ``<think>\\n…\\n</think>\\n\\n``, the whole
  content cut into deltas regardless of tags, so tags straddle chunks.
* ``groq``: ``reasoning`` (gpt-oss always, unless ``include_reasoning: false``; Qwen3 with
  ``reasoning_format: "parsed"``), else inline ``<think>`` as Qwen3's default ``raw`` format;
  Qwen3 off with ``reasoning_effort: "none"``; ``x_groq`` on the first chunk, usage in the finish
  chunk (top level and ``x_groq.usage``), as recorded (PAI cassette
  ``test_groq_model_thinking_part_iter.yaml``).
* ``cerebras``: ``reasoning``.
* ``moonshot``: ``reasoning_content`` as DeepSeek's; ``kimi-k2-thinking`` / ``kimi-k2.6`` always
  think, other Kimi models never do.
* ``dashscope``: Qwen on Model Studio's compatible mode: ``reasoning_content`` as DeepSeek's,
  ``system_fingerprint: null``; ``enable_thinking`` decides, on by default for open-weight Qwen3
  (``qwen3-32b``) and Qwen3.5 and later, off for the rest; ``qwq*`` / ``*thinking*`` always think
  (AI SDK fixture ``alibaba-reasoning.chunks.txt``; Model Studio deep-thinking docs).

Every flavour: ``chat.completion.chunk`` objects, ``tool_calls`` fragments with ``index`` (the
first with ``id``, ``type`` and ``function.name``), a usage chunk (with ``choices: []`` except on
OpenRouter) when ``stream_options.include_usage`` is set (always on OpenRouter), ``data: [DONE]``.
Non-streamed requests get the ``chat.completion`` with the same content.

Validation, with the real error bodies:

* a ``tool`` message must answer a ``tool_calls`` id of an earlier assistant message;
* groq: ``reasoning_content`` on an assistant message → ``400 'messages.N' : for 'role:assistant'
  the following must be satisfied[('messages.N' : property 'reasoning_content' is unsupported)]``
  (janhq/jan#8136, NousResearch/hermes-agent#11089), and any top-level field Groq does not know
  (DeepSeek's ``thinking``) → ``400 property 'thinking' is unsupported`` (the same validator's
  wording, inferred);
* cerebras: ``reasoning_content`` on an assistant message → ``400 messages.N.assistant.
  reasoning_content: property 'messages.N.assistant.reasoning_content' is unsupported``
  (NousResearch/hermes-agent#34716), in Cerebras's flat error body;
* dashscope: a request that is not streamed may not think → ``400 parameter.enable_thinking must
  be set to false for non-streaming calls`` (``enable_thinking`` true or left on by default),
  and a thinking-only model answers only streams → ``400 This model only support stream mode,
  please enable the stream parameter to access the model.``, in DashScope's body with
  ``code: invalid_parameter_error``, ``id`` and ``request_id`` (infiniflow/ragflow#8972);
* moonshot, thinking model: an assistant message with ``tool_calls`` and no
  ``reasoning_content`` → ``400 thinking is enabled but reasoning_content is missing in assistant
  tool call message at index N``;
* openrouter: ``reasoning: {"effort": "none"}`` on ``openai/o*`` → OpenAI's 400 wrapped by
  OpenRouter (PAI cassette ``test_openrouter_thinking_false_on_always_on_route.yaml``), and on
  Claude Fable / Mythos 5 → Anthropic's refusal of ``disabled``; Claude Fable / Mythos think
  unasked when no ``reasoning`` is sent;
* deepseek, thinking on: every assistant message with ``tool_calls`` must carry
  ``reasoning_content`` (an empty string is fine) → ``400 The `reasoning_content` in the thinking
  mode must be passed back to the API.``;
* openrouter: replayed ``reasoning_details`` must verify (signature / encrypted data edited, or made
  for another model → 400, with the upstream's own error inside OpenRouter's wrapper: Anthropic's
  "Invalid `signature`", or OpenAI's "could not be verified" for ``openai-responses-v1``
  encrypted details); for ``anthropic/*`` with reasoning on, the last assistant message, when
  it has ``tool_calls`` answered by the trailing tool messages, must carry its details → 400 with
  Anthropic's "Expected `thinking` or `redacted_thinking`" text wrapped the way OpenRouter
  wraps provider errors.

``Fail`` → that HTTP error (``retry-after`` when set; only the first ``times`` attempts);
``StreamError`` → an in-stream ``{"error": {...}}`` payload, then the stream ends (on OpenRouter
the payload carries ``finish_reason: "error"`` and the usage so far, in the same chunk); ``Cut`` → the
connection is aborted; ``Sleep`` → a pause. The turn index is the number of assistant messages.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.testing.emulator.openai_wire import (
    StreamCut,
    check_fail,
    cut_json_response,
    decode_blob,
    encode_blob,
    error_body,
    error_response,
    estimate_tokens,
    fail_headers,
    hex_id,
    json_response,
    read_json,
    record,
    sse_response,
)
from thoughtgate.testing.emulator.scenario import (
    Call,
    Cut,
    Redacted,
    Say,
    Scenario,
    ScriptedTurn,
    Sleep,
    StreamError,
    Summary,
    Think,
    sign,
    split_text,
    verify,
)
from thoughtgate.testing.emulator.server import Emulator, RecordedRequest

__all__ = ["FLAVORS", "handle", "pick_flavor"]

FLAVORS = (
    "openrouter",
    "deepseek",
    "vllm",
    "think-tags",
    "ollama",
    "groq",
    "cerebras",
    "moonshot",
    "dashscope",
)
CREATED = 1765226419
DEEPSEEK_MISSING = "The `reasoning_content` in the thinking mode must be passed back to the API."
ANTHROPIC_MISSING = (
    "messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`tool_use`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
    "recommend you include thinking blocks from previous turns. To avoid this requirement, "
    "disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)
ANTHROPIC_BAD_SIGNATURE = "messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
OPENAI_UNVERIFIED = "The encrypted content for item {id} could not be verified."
GROQ_UNSUPPORTED = (
    "'messages.{i}' : for 'role:assistant' the following must be satisfied"
    "[('messages.{i}' : property 'reasoning_content' is unsupported)]"
)
CEREBRAS_UNSUPPORTED = (
    "messages.{i}.assistant.reasoning_content: property "
    "'messages.{i}.assistant.reasoning_content' is unsupported"
)
MOONSHOT_MISSING = (
    "thinking is enabled but reasoning_content is missing in assistant tool call message at "
    "index {i}"
)
OPENAI_NO_NONE = (
    "Unsupported value: 'none' is not supported with the '{model}' model. Supported values are: "
    "'low', 'medium', and 'high'."
)
DASHSCOPE_NO_THINKING = "parameter.enable_thinking must be set to false for non-streaming calls"
DASHSCOPE_STREAM_ONLY = (
    "This model only support stream mode, please enable the stream parameter to access the model."
)
#: Qwen models that think unless ``enable_thinking`` is false: open-weight Qwen3, Qwen3.5 and later.
_QWEN_THINKS_BY_DEFAULT = re.compile(r"qwen3-\d+(?:\.\d+)?b|qwen3\.\d+")
ANTHROPIC_NO_DISABLE = (
    '"thinking.type.disabled" is not supported for this model. This model always uses adaptive '
    'thinking; use "output_config.effort" to control thinking behavior.'
)
#: Top-level request fields Groq knows (console.groq.com/docs/api-reference); others are a 400.
GROQ_FIELDS = frozenset(
    {
        "model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
        "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", "reasoning_effort",
        "reasoning_format", "include_reasoning", "n", "stop", "seed", "response_format", "user",
        "frequency_penalty", "presence_penalty", "logprobs", "top_logprobs", "service_tier",
        "metadata", "search_settings", "citation_options", "documents", "logit_bias",
    }
)  # fmt: skip
#: Flavours whose reasoning arrives as DeepSeek's ``reasoning_content``.
_RC_FLAVORS = ("deepseek", "moonshot", "dashscope")
_CLAUDE_THINKS_UNASKED = ("anthropic/claude-fable", "anthropic/claude-mythos")
_KIMI_THINKING = ("kimi-k2-thinking", "kimi-k2.6", "kimi-k2.7")


def pick_flavor(headers: Mapping[str, str], model: str, path: str = "") -> str | None:
    """The flavour for a request; ``None`` when the header names an unknown one."""
    wanted = headers.get("x-emulator-flavor")
    if wanted is not None:
        return wanted if wanted in FLAVORS else None
    named = [part for part in path.split("/") if part in FLAVORS]
    if named:
        return named[0]
    name = model.lower()
    if name.startswith("deepseek"):
        return "deepseek"
    if name.startswith("kimi"):
        return "moonshot"
    if ":" in name:
        return "ollama"
    if name.startswith("vllm/"):
        return "vllm"
    if name.startswith("think/"):
        return "think-tags"
    return "openrouter" if "/" in name else "deepseek"


def reasoning_wanted(flavor: str, body: Mapping[str, Any]) -> bool:
    """Whether this request gets reasoning back, as the real server decides."""
    model = str(body.get("model", ""))
    if flavor == "openrouter":
        param = body.get("reasoning")
        if not isinstance(param, Mapping) or not param:
            if model.startswith(_CLAUDE_THINKS_UNASKED):
                return True  # adaptive thinking is their default
            return not model.startswith("anthropic/")  # {} is a no-op: the model's default
        if param.get("exclude") is True or param.get("enabled") is False:
            return False
        return param.get("effort") != "none"
    if flavor == "deepseek":
        thinking = body.get("thinking")
        return not (isinstance(thinking, Mapping) and thinking.get("type") == "disabled")
    if flavor == "vllm":
        kwargs = body.get("chat_template_kwargs")
        return not (isinstance(kwargs, Mapping) and kwargs.get("enable_thinking") is False)
    if flavor == "ollama":
        return body.get("reasoning_effort") != "none"
    if flavor == "groq":
        if "gpt-oss" in model:
            return body.get("include_reasoning") is not False
        if "qwen3" in model:
            return body.get("reasoning_effort") != "none"
    if flavor == "moonshot":
        return model.startswith(_KIMI_THINKING)
    if flavor == "dashscope":
        if _qwen_thinking_only(model):
            return True
        switch = body.get("enable_thinking")
        if isinstance(switch, bool):
            return switch
        name = model.lower()
        return _QWEN_THINKS_BY_DEFAULT.match(name) is not None and "instruct" not in name
    return True


def _qwen_thinking_only(model: str) -> bool:
    name = model.lower()
    return name.startswith(("qwq", "qvq")) or "thinking" in name


# --------------------------------------------------------------------------- validation


def _openrouter_error(raw: Mapping[str, Any], provider: str, status: int = 400) -> dict[str, Any]:
    """How OpenRouter wraps an upstream provider's 4xx (see e.g. endolith/open-interpreter#215):
    the upstream body, serialized, under ``metadata.raw``."""
    return {
        "error": {
            "message": "Provider returned error",
            "code": status,
            "metadata": {"raw": json.dumps(raw), "provider_name": provider},
        },
        "user_id": "user_emulator",
    }


def _anthropic_rejects(message: str) -> Response:
    raw = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return error_response(400, message, "", body=_openrouter_error(raw, "Anthropic"))


def _detail_rejected(i: int, j: int, detail: Any) -> Response:
    """The upstream's own error for a detail that fails verification: OpenAI's for its encrypted
    reasoning items (format ``openai-responses-v1``), Anthropic's signature error otherwise."""
    if isinstance(detail, Mapping) and detail.get("format") == "openai-responses-v1":
        message = OPENAI_UNVERIFIED.format(id=detail.get("id"))
        raw = error_body(message, "invalid_request_error", code="invalid_encrypted_content")
        return error_response(400, message, "", body=_openrouter_error(raw, "OpenAI"))
    return _anthropic_rejects(ANTHROPIC_BAD_SIGNATURE.format(i=i, j=j))


def _validate(flavor: str, body: Mapping[str, Any]) -> Response | None:
    messages = body.get("messages")
    if not isinstance(body.get("model"), str) or not isinstance(messages, list):
        return error_response(
            400,
            "you must provide a model parameter and a messages array",
            "invalid_request_error",
            param="messages",
        )
    seen_calls: set[str] = set()
    for m in messages:
        if not isinstance(m, Mapping):
            return error_response(400, "Invalid type for 'messages'", "invalid_request_error")
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                if isinstance(call, Mapping):
                    seen_calls.add(str(call.get("id")))
        if m.get("role") == "tool" and m.get("tool_call_id") not in seen_calls:
            return error_response(
                400,
                "Invalid parameter: messages with role 'tool' must be a response to a "
                "preceeding message with 'tool_calls'.",
                "invalid_request_error",
                param="messages.[].role",
            )
    thinking = reasoning_wanted(flavor, body)
    refused = _server_refuses(flavor, body, messages, thinking)
    if refused is not None:
        return refused
    if flavor == "deepseek" and thinking:
        for m in messages:
            if (
                m.get("role") == "assistant"
                and m.get("tool_calls")
                and (not isinstance(m.get("reasoning_content"), str))
            ):
                return error_response(
                    400, DEEPSEEK_MISSING, "invalid_request_error", code="invalid_request_error"
                )
    if flavor == "openrouter":
        return _validate_details(str(body["model"]), messages, thinking)
    return None


def _server_refuses(
    flavor: str, body: Mapping[str, Any], messages: list[Any], thinking: bool
) -> Response | None:
    """The per-server rejections: what one server demands, another refuses."""
    if flavor == "groq":
        for key in body:
            if key not in GROQ_FIELDS:
                return error_response(
                    400, f"property '{key}' is unsupported", "invalid_request_error"
                )
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        if flavor == "groq" and "reasoning_content" in m:
            message = GROQ_UNSUPPORTED.format(i=i)
            return error_response(400, message, "invalid_request_error", body=_groq_error(message))
        if flavor == "cerebras" and "reasoning_content" in m:
            message = CEREBRAS_UNSUPPORTED.format(i=i)
            flat = {
                "message": message,
                "type": "invalid_request_error",
                "param": "body",
                "code": "wrong_api_format",
            }
            return error_response(400, message, "invalid_request_error", body=flat)
        if (
            flavor == "moonshot"
            and thinking
            and m.get("tool_calls")
            and not isinstance(m.get("reasoning_content"), str)
        ):
            return error_response(400, MOONSHOT_MISSING.format(i=i), "invalid_request_error")
    if flavor == "openrouter":
        return _openrouter_refuses(body)
    if flavor == "dashscope" and not body.get("stream"):
        if _qwen_thinking_only(str(body.get("model", ""))):
            return _dashscope_error(DASHSCOPE_STREAM_ONLY)
        if thinking:
            return _dashscope_error(DASHSCOPE_NO_THINKING)
    return None


def _dashscope_error(message: str) -> Response:
    rid = hex_id("dashscope", message, length=32)
    rid = f"{rid[:8]}-{rid[8:12]}-{rid[12:16]}-{rid[16:20]}-{rid[20:]}"
    body = {
        "error": {
            "code": "invalid_parameter_error",
            "param": None,
            "message": message,
            "type": "invalid_request_error",
        },
        "id": f"chatcmpl-{rid}",
        "request_id": rid,
    }
    return error_response(400, message, "invalid_request_error", body=body)


def _groq_error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


def _openrouter_refuses(body: Mapping[str, Any]) -> Response | None:
    param = body.get("reasoning")
    if not isinstance(param, Mapping) or param.get("effort") != "none":
        return None
    model = str(body.get("model", ""))
    bare = model.partition("/")[2]
    if model.startswith("openai/o"):
        message = OPENAI_NO_NONE.format(model=bare)
        raw = error_body(message, "invalid_request_error", param="reasoning.effort")
        raw["error"]["code"] = "unsupported_value"
        return error_response(400, message, "", body=_openrouter_error(raw, "OpenAI"))
    if model.startswith(tuple(f"{p}-5" for p in _CLAUDE_THINKS_UNASKED)):
        return _anthropic_rejects(ANTHROPIC_NO_DISABLE)
    return None


def _validate_details(model: str, messages: list[Any], thinking: bool) -> Response | None:
    convo = [m for m in messages if m.get("role") != "system"]
    for i, m in enumerate(convo):
        details = m.get("reasoning_details") if m.get("role") == "assistant" else None
        for j, detail in enumerate(details or []):
            if not _detail_ok(model, detail):
                return _detail_rejected(i, j, detail)
    if not (thinking and model.startswith("anthropic/")):
        return None
    # Anthropic: the assistant turn that opened the trailing tool results must start with thinking
    tail = len(convo)
    while tail > 0 and convo[tail - 1].get("role") == "tool":
        tail -= 1
    if tail == len(convo) or tail == 0:
        return None
    last = convo[tail - 1]
    if (
        last.get("role") == "assistant"
        and last.get("tool_calls")
        and not last.get("reasoning_details")
    ):
        return _anthropic_rejects(ANTHROPIC_MISSING.format(i=tail - 1))
    return None


def _detail_ok(model: str, detail: Any) -> bool:
    if not isinstance(detail, Mapping):
        return False
    kind = detail.get("type")
    if kind == "reasoning.encrypted":
        fields = decode_blob(detail.get("data"), "openrouter.encrypted")
        return fields is not None and fields.get("model") == model
    if kind == "reasoning.text" and detail.get("format") == "anthropic-claude-v1":
        signature = detail.get("signature")
        text = detail.get("text")
        return isinstance(signature, str) and verify(signature, "openrouter", model, str(text))
    return True


# --------------------------------------------------------------------------- rendering


@dataclass
class _Render:
    """One scripted turn rendered in one flavour: stream frames and the non-streamed message."""

    flavor: str
    model: str
    reasoning_on: bool
    turn: ScriptedTurn
    seed: str
    frames: list[tuple[str, Any]] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    details: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    tag_buffer: list[str] = field(default_factory=list)
    error: StreamError | None = None
    cut: bool = False
    request: Mapping[str, Any] = field(default_factory=dict)

    @property
    def cid(self) -> str:
        prefix = "gen-" if self.flavor == "openrouter" else "chatcmpl-"
        return prefix + hex_id("chat", self.seed, length=24)

    @property
    def anthropic(self) -> bool:
        return self.model.startswith("anthropic/")

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        data: dict[str, Any] = {"id": self.cid}
        if self.flavor == "openrouter":
            data["provider"] = "Anthropic" if self.anthropic else "Emulator"
            choice["native_finish_reason"] = finish
            choice["logprobs"] = None
            delta.setdefault("role", "assistant")
        elif self.flavor in ("deepseek", "groq", "moonshot"):
            data["system_fingerprint"] = "fp_emulator"
            choice["logprobs"] = None
        elif self.flavor == "dashscope":
            data["system_fingerprint"] = None
            choice["logprobs"] = None
        data.update(
            {
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": self.model,
                "choices": [choice],
            }
        )
        return data

    def _emit(self, delta: dict[str, Any], finish: str | None = None) -> None:
        self.frames.append(("chunk", self._chunk(delta, finish)))

    def _pieces(self, text: str) -> list[str]:
        return split_text(text, self.turn.chunk_chars)

    # ---------------------------------------------------------------- steps

    def render(self) -> _Render:
        if self.flavor in ("deepseek", "dashscope"):
            first: dict[str, Any] = {"role": "assistant", "content": None}
            if self.reasoning_on:
                first["reasoning_content"] = ""
            self._emit(first)
        elif self.flavor == "moonshot":
            self._emit({"role": "assistant", "content": None})
        elif self.flavor != "openrouter":
            self._emit({"role": "assistant", "content": ""})
            if self.flavor == "groq":  # Groq names its request on the first chunk
                self.frames[-1][1]["x_groq"] = {"id": "req_" + hex_id("groq", self.seed)[:26]}
        for step in self.turn.steps:
            if isinstance(step, Think | Summary | Redacted):
                if self.reasoning_on:
                    self._reasoning_step(step)
            elif isinstance(step, Say):
                self._say(step.text)
            elif isinstance(step, Call):
                self._flush_tags()
                self._call(step)
            elif isinstance(step, Sleep):
                self._flush_tags()
                self.frames.append(("sleep", step.seconds))
            elif isinstance(step, StreamError):
                self._flush_tags()
                self.error = step
                self.frames.append(("error", self._error_payload(step)))
                return self
            elif isinstance(step, Cut):
                self._flush_tags()
                self.cut = True
                self.frames.append(("cut", None))
                return self
        self._flush_tags()
        finish = "tool_calls" if self.calls else "stop"
        last: dict[str, Any] = {}
        if self.flavor == "openrouter":
            last = {"role": "assistant", "content": "", "reasoning": None, "reasoning_details": []}
        self._emit(last, finish)
        if self.flavor == "groq":
            # Groq puts usage into the finish chunk, also under x_groq, whatever stream_options say
            usage = self.usage(self.turn.input_tokens)
            self.frames[-1][1].update(usage=usage, x_groq={"id": "req_emulator", "usage": usage})
            return self
        self.frames.append(("usage", None))
        return self

    def _reasoning_step(self, step: Think | Summary | Redacted) -> None:
        if self.flavor == "openrouter":
            self._openrouter_reasoning(step)
        elif isinstance(step, Think):
            if self.flavor == "think-tags":
                self.tag_buffer.append(f"<think>\n{step.text}\n</think>\n\n")
                self.reasoning.append(step.text)
                return
            if self.groq_raw:
                self.tag_buffer.append(f"<think>\n{step.text}\n</think>\n\n")
                self.reasoning.append(step.text)
                return
            name = "reasoning_content" if self.flavor in _RC_FLAVORS else "reasoning"
            for piece in self._pieces(step.text):
                delta: dict[str, Any] = {name: piece}
                if self.flavor in _RC_FLAVORS:
                    delta = {"content": None, "reasoning_content": piece}
                elif self.flavor == "ollama":
                    delta = {"role": "assistant", "content": "", "reasoning": piece}
                self._emit(delta)
            self.reasoning.append(step.text)
        # raw-reasoning servers have no summaries and no encrypted reasoning

    def _openrouter_reasoning(self, step: Think | Summary | Redacted) -> None:
        index = len(self.details)
        if isinstance(step, Redacted):
            fmt = "anthropic-claude-v1" if self.anthropic else "openai-responses-v1"
            data = encode_blob("openrouter.encrypted", model=self.model, label=step.label)
            detail = {"type": "reasoning.encrypted", "data": data, "format": fmt, "index": index}
            if not self.anthropic:
                detail["id"] = "rs_" + hex_id("rs", self.seed, index)
            self.details.append(detail)
            self._emit({"content": "", "reasoning": None, "reasoning_details": [dict(detail)]})
            return
        if isinstance(step, Summary):
            kind, key, fmt = "reasoning.summary", "summary", "openai-responses-v1"
        else:
            kind, key = "reasoning.text", "text"
            fmt = "anthropic-claude-v1" if self.anthropic else "unknown"
        merged: dict[str, Any] = {"type": kind, key: step.text, "format": fmt, "index": index}
        signed = kind == "reasoning.text" and self.anthropic
        if signed:
            opener = {"type": kind, "text": "", "signature": "", "format": fmt, "index": index}
            self._emit({"content": "", "reasoning": None, "reasoning_details": [opener]})
        for piece in self._pieces(step.text):
            detail = {"type": kind, key: piece, "format": fmt, "index": index}
            self._emit({"content": "", "reasoning": piece, "reasoning_details": [detail]})
        if signed:
            signature = sign("openrouter", self.model, step.text)
            merged["signature"] = signature
            closer = {"type": kind, "signature": signature, "format": fmt, "index": index}
            self._emit({"content": "", "reasoning": None, "reasoning_details": [closer]})
        self.details.append(merged)
        self.reasoning.append(step.text)

    @property
    def groq_raw(self) -> bool:
        """Groq's default ``raw`` reasoning format for Qwen3: ``<think>`` inside ``content``."""
        return (
            self.flavor == "groq"
            and "qwen3" in self.model
            and self.request.get("reasoning_format") != "parsed"
        )

    def _say(self, text: str) -> None:
        if self.flavor == "think-tags" or (self.groq_raw and self.reasoning):
            self.tag_buffer.append(text)
            self.content.append(text)
            return
        for piece in self._pieces(text):
            if not piece:
                continue
            delta: dict[str, Any] = {"content": piece}
            if self.flavor == "openrouter":
                delta = {"content": piece, "reasoning": None, "reasoning_details": []}
            elif self.flavor in _RC_FLAVORS:
                delta = {"content": piece, "reasoning_content": None}
            self._emit(delta)
        self.content.append(text)

    def _flush_tags(self) -> None:
        if not self.tag_buffer:
            return
        whole = "".join(self.tag_buffer)
        self.tag_buffer.clear()
        for piece in self._pieces(whole):
            self._emit({"content": piece})

    def _call(self, step: Call) -> None:
        index = len(self.calls)
        call_id = step.call_id or "call_" + hex_id("call", self.seed, index, length=24)
        args = json.dumps(step.arguments)
        self.calls.append(
            {"id": call_id, "type": "function", "function": {"name": step.name, "arguments": args}}
        )
        head = {"index": index, "id": call_id, "type": "function"}
        if self.flavor == "ollama":
            fragment = dict(head, function={"name": step.name, "arguments": args})
            self._emit({"role": "assistant", "content": "", "tool_calls": [fragment]})
            return
        first = dict(head, function={"name": step.name, "arguments": ""})
        self._emit({"tool_calls": [first]})
        for piece in self._pieces(args):
            self._emit({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})

    def _error_payload(self, step: StreamError) -> dict[str, Any]:
        if self.flavor == "openrouter":
            # as live: the error, finish_reason "error" and the usage so far in one chunk
            data = self._chunk({"content": ""}, "error")
            data["error"] = {"code": step.error_type, "message": step.message}
            data["usage"] = self.usage(self.turn.input_tokens)
            return data
        return {
            "error": {"message": step.message, "type": step.error_type, "param": None, "code": None}
        }

    # ---------------------------------------------------------------- outputs

    def usage(self, input_tokens: int) -> dict[str, Any]:
        reasoning = estimate_tokens("".join(self.reasoning))
        output = reasoning + estimate_tokens("".join(self.content))
        output += sum(estimate_tokens(c["function"]["arguments"]) for c in self.calls)
        usage: dict[str, Any] = {
            "prompt_tokens": input_tokens,
            "completion_tokens": output,
            "total_tokens": input_tokens + output,
        }
        if self.flavor in ("openrouter", "deepseek", "groq", "moonshot", "dashscope"):
            usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    def usage_chunk(self, input_tokens: int) -> dict[str, Any]:
        data = self._chunk({"role": "assistant", "content": ""})
        if self.flavor != "openrouter":
            data["choices"] = []
        data["usage"] = self.usage(input_tokens)
        return data

    def message(self) -> dict[str, Any]:
        content = "".join(self.content)
        reasoning = "".join(self.reasoning) if self.reasoning else None
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if self.flavor == "think-tags" or (self.groq_raw and self.reasoning):
            msg["content"] = (
                "".join(f"<think>\n{r}\n</think>\n\n" for r in self.reasoning) + content
            )
        elif self.flavor == "openrouter":
            msg.update(refusal=None, reasoning=reasoning)
            if self.details:
                msg["reasoning_details"] = self.details
        elif self.flavor in _RC_FLAVORS:
            msg["reasoning_content"] = reasoning if self.reasoning_on else None
        elif reasoning is not None:
            msg["reasoning"] = reasoning
        if self.flavor == "vllm" and not content:
            msg["content"] = None
        if self.calls:
            msg["tool_calls"] = self.calls
        return msg

    def completion(self, input_tokens: int) -> dict[str, Any]:
        finish = "tool_calls" if self.calls else "stop"
        choice: dict[str, Any] = {"index": 0, "message": self.message(), "finish_reason": finish}
        if self.flavor == "openrouter":
            choice["native_finish_reason"] = finish
        return {
            "id": self.cid,
            "object": "chat.completion",
            "created": CREATED,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(input_tokens),
        }


def _sse(data: Any) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def _stream(render: _Render, input_tokens: int, include_usage: bool) -> AsyncIterator[str]:
    keepalive = render.flavor == "openrouter"
    if keepalive:
        yield ": OPENROUTER PROCESSING\n\n"
    for kind, value in render.frames:
        if kind == "chunk":
            yield _sse(value)
        elif kind == "sleep":
            if keepalive:
                yield ": OPENROUTER PROCESSING\n\n"
            await asyncio.sleep(value)
        elif kind == "error":
            yield _sse(value)
            return
        elif kind == "cut":
            raise StreamCut("scripted cut")
        elif kind == "usage" and (include_usage or render.flavor == "openrouter"):
            yield _sse(render.usage_chunk(input_tokens))
    yield "data: [DONE]\n\n"


def _turn_index(messages: list[Any]) -> int:
    return sum(1 for m in messages if isinstance(m, Mapping) and m.get("role") == "assistant")


async def handle(request: Request, emulator: Emulator) -> Response:
    body, bad = await read_json(request)
    entry = record(request, emulator, body)
    if bad is not None:
        entry.status = 400
        return bad
    if not isinstance(body, Mapping):
        return error_response(400, "the body must be a JSON object", "invalid_request_error")
    flavor = pick_flavor(request.headers, str(body.get("model", "")), request.url.path)
    if flavor is None:
        return error_response(
            400,
            f"x-emulator-flavor must be one of {', '.join(FLAVORS)}",
            "invalid_request_error",
            entry=entry,
        )
    invalid = _validate(flavor, body)
    if invalid is not None:
        entry.status = invalid.status_code
        return invalid
    scenario = emulator.pick(request.headers, str(body["model"]))
    index = _turn_index(body["messages"])
    return await _answer(emulator, entry, flavor, body, scenario, index)


async def _answer(
    emulator: Emulator,
    entry: RecordedRequest,
    flavor: str,
    body: Mapping[str, Any],
    scenario: Scenario,
    index: int,
) -> Response:
    turn = scenario.turn(index)
    fail = check_fail(emulator, scenario, index, turn)
    if fail is not None:
        headers = fail_headers(fail)
        if flavor == "openrouter":
            content = {
                "error": {
                    "code": fail.status,
                    "message": fail.message,
                    "metadata": {"error_type": fail.error_type},
                }
            }
            return error_response(
                fail.status,
                fail.message,
                fail.error_type,
                body=content,
                headers=headers,
                entry=entry,
            )
        return error_response(
            fail.status, fail.message, fail.error_type, headers=headers, entry=entry
        )
    seed = f"{scenario.name}:{index}:{flavor}"
    render = _Render(
        flavor, str(body["model"]), reasoning_wanted(flavor, body), turn, seed, request=body
    )
    render.render()
    rid = "req_" + hex_id("rid", seed, len(emulator.requests), length=24)
    if body.get("stream"):
        options = body.get("stream_options")
        include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
        return sse_response(_stream(render, turn.input_tokens, include_usage), rid=rid, entry=entry)
    pause = sum(s.seconds for s in turn.steps if isinstance(s, Sleep))
    if pause:
        await asyncio.sleep(pause)
    if render.error is not None:
        status = 429 if render.error.error_type == "rate_limit_error" else 500
        return error_response(status, render.error.message, render.error.error_type, entry=entry)
    completion = render.completion(turn.input_tokens)
    if render.cut:
        return cut_json_response(completion, rid=rid)
    return json_response(completion, rid=rid, entry=entry)
