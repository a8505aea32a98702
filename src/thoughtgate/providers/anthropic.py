"""The Anthropic Messages adapter: request shaping per model family, and capture of its wire format.

Request shaping (``build_body``)
    The ``thinking`` form depends on the model family (:data:`MODEL_FAMILIES`): budget models get
    ``{"type": "enabled", "budget_tokens": N}`` with ``max_tokens`` raised by ``N``; adaptive models
    get ``{"type": "adaptive", "display": "summarized"}`` plus ``output_config.effort``; ``hidden``
    mode (``ReasoningRequest.enabled`` false) sends no ``thinking`` at all. Assistant history is
    sent back with its continuity blocks (the exact ``thinking`` / ``redacted_thinking`` dicts the
    API returned) first, then text and ``tool_use``; reasoning *text* is never sent back.

Capture (:class:`AnthropicCapture`)
    Stream events and non-streamed message JSON both go through one capture object that emits
    normalized chunks, which the shared :class:`~thoughtgate.types.TurnAccumulator` builds into a
    turn, so streamed and non-streamed records are identical. Blocks are keyed by the ``index`` the
    event carries (block 0 is not assumed to be thinking); ``thinking_delta`` appends,
    ``signature_delta`` replaces, and at ``content_block_stop`` of a thinking block the exact block
    dict is emitted as a continuity chunk. Unknown event, delta and block types are skipped, as the
    official SDK does; malformed JSON and missing fields raise :class:`MalformedResponseError`.

Errors: HTTP failures come from :class:`~thoughtgate.providers.http.HTTPTransport`; an in-stream
``error`` event or a stream that ends before ``message_stop`` raises :class:`ProviderStreamError`.
``stream_llm_turn`` attaches the partial turn to either.

Sources: ``docs/providers/anthropic.md`` and ``PROVIDER_WIRE_FORMATS.md`` §1.
"""

from __future__ import annotations

import json
import json.decoder
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

import httpx

from thoughtgate.errors import (
    ConfigError,
    MalformedResponseError,
    ProviderError,
    ProviderStreamError,
)
from thoughtgate.providers.base import (
    Capabilities,
    Effort,
    ProviderSettings,
    ReasoningRequest,
    ToolSpec,
    TurnRequest,
)
from thoughtgate.providers.http import HTTPTransport, parse_json_event
from thoughtgate.providers.openai_common import (
    adapter_options,
    apply_extra,
    resolve_api_key,
    resolve_base_url,
)
from thoughtgate.providers.sse import SSEMessage
from thoughtgate.types import (
    Chunk,
    ContinuityBlock,
    ContinuityChunk,
    FinishChunk,
    FinishReason,
    Message,
    ReasoningDelta,
    ReasoningKind,
    TextDelta,
    TextPart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallPart,
    ToolCallStart,
    ToolResultPart,
    Turn,
    TurnAccumulator,
    UsageChunk,
)

__all__ = [
    "ANTHROPIC_VERSION",
    "API_KEY_ENV",
    "BASE_URL_ENV",
    "DEFAULT_BASE_URL",
    "MODEL_FAMILIES",
    "STOP_REASONS",
    "THINKING_CARRIER",
    "AnthropicCapture",
    "AnthropicProvider",
    "ModelFamily",
    "ThinkingForm",
    "budget_for",
    "model_family",
    "normalize_model",
    "to_anthropic_messages",
]

PROVIDER: Final = "anthropic"
ANTHROPIC_VERSION: Final = "2023-06-01"
DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
API_KEY_ENV: Final = "ANTHROPIC_API_KEY"
BASE_URL_ENV: Final = "ANTHROPIC_BASE_URL"

THINKING_CARRIER: Final = "anthropic.thinking"
REDACTED_CARRIER: Final = "anthropic.redacted_thinking"
_CARRIERS: Final = frozenset({THINKING_CARRIER, REDACTED_CARRIER})

ThinkingForm: TypeAlias = Literal["none", "budget", "adaptive"]


# --------------------------------------------------------------------------- model families


@dataclass(frozen=True, slots=True)
class ModelFamily:
    """How one family of Claude models takes the ``thinking`` parameter.

    ``pattern`` is matched (``fullmatch``) against :func:`normalize_model` of the model id.
    ``thinking``: ``none`` (the family has no extended thinking: never send it), ``budget``
    (``enabled`` + ``budget_tokens`` is the only form), ``adaptive`` (``adaptive`` is required or
    recommended). ``reasoning_kind`` is what the returned thinking text is: ``raw`` for Sonnet 3.7,
    which returned its full thinking, ``summary`` for Claude 4 and later, which return summarized
    thinking (``display: "summarized"``) while billing the full thinking tokens.
    """

    label: str
    pattern: re.Pattern[str]
    thinking: ThinkingForm
    reasoning_kind: ReasoningKind
    source: str


def _family(
    label: str, pattern: str, thinking: ThinkingForm, kind: ReasoningKind, source: str
) -> ModelFamily:
    return ModelFamily(label, re.compile(pattern), thinking, kind, source)


#: First match wins; anything unmatched (new models) is :data:`NEWER_MODELS`.
MODEL_FAMILIES: Final[tuple[ModelFamily, ...]] = (
    _family(
        "Claude Sonnet 3.7",
        r"claude-3-7-sonnet|claude-sonnet-3-7",
        "budget",
        "raw",
        "budget only; returns full thinking (mintlify extended-thinking page; PAI cassettes)",
    ),
    _family(
        "Claude 2 / 3 / 3.5",
        r"claude-(?:instant|2|3)(?:-.*)?",
        "none",
        "raw",
        "no extended thinking: a `thinking` parameter is rejected",
    ),
    _family(
        "Claude Opus/Sonnet/Haiku 4, 4.1, 4.5",
        r"claude-(?:opus|sonnet|haiku)-4(?:-[015])?",
        "budget",
        "summary",
        "budget only (A-SDK thinking_config_enabled_param.py; PAI cassette "
        "test_anthropic_tool_with_thinking.yaml); Claude 4 returns summarized thinking",
    ),
    _family(
        "Claude Opus/Sonnet 4.6",
        r"claude-(?:opus|sonnet|haiku)-4-6",
        "adaptive",
        "summary",
        "adaptive recommended, budget_tokens deprecated (platform.claude.com adaptive-thinking; "
        "AAswordman/Operit#568)",
    ),
    _family(
        "Claude Opus 4.7 / 4.8",
        r"claude-(?:opus|sonnet|haiku)-4-[789]",
        "adaptive",
        "summary",
        'budget form is a 400 "thinking.type.enabled is not supported for this model" '
        "(anomalyco/opencode#22863, openclaw/openclaw#87801); display defaults to omitted, so "
        "summarized is sent explicitly (BerriAI/litellm#25965)",
    ),
    _family(
        "Claude Fable / Mythos",
        r"claude-(?:fable|mythos)(?:-.*)?",
        "adaptive",
        "summary",
        "adaptive only, display defaults to omitted (PROVIDER_WIRE_FORMATS.md §1.1; "
        "docker/docker-agent#2451)",
    ),
)

NEWER_MODELS: Final = _family(
    "newer or unknown Claude models",
    r".*",
    "adaptive",
    "summary",
    "every model since 4.6 recommends or requires adaptive thinking (Opus 4.8, Sonnet 5, Opus 5)",
)

_DATE_SUFFIX = re.compile(r"(?:[-@]\d{8}|-v\d+(?::\d+)?|:\d+|-latest)+$")
_DOTTED_VERSION = re.compile(r"(?<=\d)\.(?=\d)")


def normalize_model(model: str) -> str:
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


def model_family(model: str) -> ModelFamily:
    name = normalize_model(model)
    for family in MODEL_FAMILIES:
        if family.pattern.fullmatch(name):
            return family
    return NEWER_MODELS


# --------------------------------------------------------------------------- request shaping

#: Budget form: tokens of thinking per requested effort (``None`` means medium).
_BUDGET_FOR_EFFORT: Final[Mapping[str, int]] = {
    "minimal": 1024,
    "low": 2048,
    "medium": 4096,
    "high": 8192,
    "xhigh": 16384,
    "max": 32000,
}
MIN_BUDGET: Final = 1024

#: Adaptive form: ``output_config.effort`` is low|medium|high|xhigh|max (A-SDK output_config_param).
_ADAPTIVE_EFFORT: Final[Mapping[Effort, str]] = {
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "xhigh",
    "max": "max",
}


def budget_for(reasoning: ReasoningRequest) -> int:
    """The ``budget_tokens`` for the budget form: explicit, else by effort; never below 1024."""
    if reasoning.budget_tokens is not None:
        return max(MIN_BUDGET, reasoning.budget_tokens)
    return _BUDGET_FOR_EFFORT[reasoning.effort or "medium"]


def _block_type(part: ContinuityBlock) -> str:
    return str(part.data.get("type", ""))


def _assistant_content(parts: Sequence[Any], model: str) -> list[dict[str, Any]]:
    """Continuity blocks of this model first, in order and unchanged; then text and tool_use."""
    head: list[dict[str, Any]] = []
    tail: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, ContinuityBlock):
            if part.carrier in _CARRIERS and part.provider == PROVIDER and part.model == model:
                head.append(dict(part.data))
        elif isinstance(part, TextPart):
            # The API rejects empty and whitespace-only text blocks (such as the "\n\n" block an
            # adaptive model may put before its thinking), so they are not sent back.
            if part.text.strip():
                tail.append({"type": "text", "text": part.text})
        elif isinstance(part, ToolCallPart):
            tail.append(
                {"type": "tool_use", "id": part.call_id, "name": part.name, "input": part.arguments}
            )
        # ReasoningPart: reasoning text never goes back to a model.
    return head + tail


def _user_content(parts: Sequence[Any]) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, ToolResultPart):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": part.call_id,
                "content": part.content,
            }
            if part.is_error:
                block["is_error"] = True
            content.append(block)
        elif isinstance(part, TextPart) and part.text:
            content.append({"type": "text", "text": part.text})
    return content


def to_anthropic_messages(
    messages: Iterable[Message], *, model: str, system: str | None = None
) -> tuple[str | None, list[dict[str, Any]]]:
    """``(system, messages)`` in the Messages API shape.

    System messages join the top-level ``system``; ``tool`` messages become user ``tool_result``
    blocks; adjacent user-side messages are merged into one (tool results must all sit in the user
    message right after the ``tool_use``). Continuity blocks are sent only to the model that made
    them: a signature is bound to its model, and another model's blocks give a 400.
    """
    systems = [system] if system else []
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            systems.extend(p.text for p in message.parts if isinstance(p, TextPart) and p.text)
            continue
        if message.role == "assistant":
            content = _assistant_content(message.parts, model)
            if content:
                out.append({"role": "assistant", "content": content})
            continue
        content = _user_content(message.parts)
        if not content:
            continue
        if out and out[-1]["role"] == "user":
            out[-1]["content"].extend(content)
        else:
            out.append({"role": "user", "content": content})
    return ("\n\n".join(systems) or None), out


def _tool_loop_lacks_thinking(messages: Sequence[Mapping[str, Any]]) -> bool:
    """True when the API would demand a thinking block this history cannot supply.

    With thinking on, the assistant message before the last set of tool results must start with a
    thinking block. If it does not (the turn was cut before its signature, came from another model,
    or the model skipped thinking), asking for thinking would get a 400 "Expected `thinking` or
    `redacted_thinking`", so that one request goes without thinking instead, as the error advises.
    """
    if len(messages) < 2 or messages[-1]["role"] != "user":
        return False
    if not any(b.get("type") == "tool_result" for b in messages[-1]["content"]):
        return False
    previous = messages[-2]
    if previous["role"] != "assistant" or not previous["content"]:
        return False
    return previous["content"][0].get("type") not in ("thinking", "redacted_thinking")


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "description": spec.description,
        "input_schema": dict(spec.parameters),
    }


# --------------------------------------------------------------------------- capture

STOP_REASONS: Final[Mapping[str, FinishReason]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "pause_turn": "pause",
    "refusal": "refusal",
}


class _Block:
    """One open content block: its type and what its stop needs to emit."""

    __slots__ = ("call_id", "input", "json", "open", "signature", "thinking", "type")

    def __init__(self, btype: str) -> None:
        self.type = btype
        self.open = True
        self.thinking: list[str] = []
        self.signature = ""
        self.call_id = ""
        self.json: list[str] = []
        self.input: Any = None


def _str(mapping: Mapping[str, Any], key: str) -> str:
    value = mapping[key]
    if type(value) is not str:
        raise TypeError(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def _int(mapping: Mapping[str, Any], key: str) -> int:
    value = mapping[key]
    if type(value) is not int:
        raise TypeError(f"field {key!r} must be an integer, got {type(value).__name__}")
    return value


def _usage(usage: Mapping[str, Any], *, output_required: bool) -> UsageChunk:
    if output_required:
        _int(usage, "output_tokens")
    details = usage.get("output_tokens_details")
    thinking = details.get("thinking_tokens") if isinstance(details, Mapping) else None
    return UsageChunk(
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
        reasoning_tokens=thinking,
        cache_read_tokens=usage.get("cache_read_input_tokens"),
        cache_write_tokens=usage.get("cache_creation_input_tokens"),
    )


# The hot path: thinking and text deltas make up nearly every event of a stream, and their data
# lines have one exact shape, so one compiled pattern reads them instead of a full json.loads.
# Anything else (other key order, extra fields, control characters) takes the general path, so
# the fast path never accepts what json.loads would reject.
_FAST_DELTA: Final = re.compile(
    r'\{"type":"content_block_delta","index":([0-9]+),"delta":\{"type":"'
    r'(?:(thinking)_delta","thinking|text_delta","text)":"((?:[^"\\\x00-\x1f]++|\\.)*+)"'
    r"\}[ \t\r\n]*\}"
).fullmatch
#: json's own string scanner (C-accelerated), which typeshed does not list.
_scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _unescape(raw: str) -> str | None:
    """The value of a JSON string body with escapes, or ``None`` if an escape is invalid."""
    try:
        return _scanstring(raw + '"', 0)[0]
    except ValueError:
        return None


class AnthropicCapture:
    """Turns one response's events (or its message JSON) into normalized chunks.

    Consecutive text or thinking deltas of one block that arrive together (one network read, or a
    whole non-streamed block) are merged into one chunk: they arrived at the same moment, and the
    turn is the same, with far fewer objects on the hot path.

    ``emit_reasoning`` is false in ``hidden`` mode: no reasoning chunks are emitted even if a model
    thinks unasked; its continuity blocks are still kept because the API demands them back.
    """

    __slots__ = (
        "_blocks",
        "_out",
        "_run",
        "_run_index",
        "_run_thinking",
        "emit_reasoning",
        "finished",
        "kind",
        "model",
        "started",
    )

    def __init__(self, model: str, *, kind: ReasoningKind, emit_reasoning: bool = True) -> None:
        self.model = model
        self.kind: ReasoningKind = kind
        self.emit_reasoning = emit_reasoning
        self._blocks: dict[int, _Block] = {}
        self.started = False
        self.finished = False
        self._out: list[Chunk] = []
        self._run: list[str] = []  # pieces of the open text or thinking run
        self._run_index = -1
        self._run_thinking = False

    # -- output: runs of text pieces are merged into one chunk

    def _piece(self, index: int, thinking: bool, text: str) -> None:
        if index != self._run_index or thinking is not self._run_thinking:
            self._close_run()
            self._run_index, self._run_thinking = index, thinking
        self._run.append(text)

    def _close_run(self) -> None:
        if self._run_index < 0:
            return
        text = "".join(self._run)
        index = self._run_index
        if self._run_thinking:
            self._out.append(ReasoningDelta(text, reasoning_kind=self.kind, index=index))
        else:
            self._out.append(TextDelta(text, index=index))
        self._run = []
        self._run_index = -1

    def _emit(self, chunk: Chunk) -> None:
        self._close_run()
        self._out.append(chunk)

    def interrupted(self) -> list[Chunk]:
        """The stream broke: what open blocks still hold. A ``tool_use`` block's arguments are only
        emitted at its ``content_block_stop``, so the fragments that arrived before the break are
        released here (compact JSON when they parse, else as they came) and the partial turn keeps
        them. Reasoning and text were emitted as they arrived already."""
        for slot in self._blocks.values():
            if slot.open and slot.type == "tool_use" and (slot.json or slot.input is not None):
                slot.open = False
                self._emit(ToolCallDelta(slot.call_id, _arguments(slot)))
        return self.take()

    def take(self) -> list[Chunk]:
        """The chunks produced since the last call."""
        self._close_run()
        out, self._out = self._out, []
        return out

    # -- streaming

    def batch(self, messages: Iterable[SSEMessage]) -> tuple[list[Chunk], ProviderError | None]:
        """Chunks for the events of one network read, and the error that ended it, if any.

        The error is returned rather than raised so the chunks before it still reach the caller
        and the partial turn.
        """
        blocks = self._blocks
        for message in messages:
            event, data, _ = message
            if event == "ping" or self.finished:
                continue  # nothing after message_stop belongs to the turn
            if event == "content_block_delta" and (match := _FAST_DELTA(data)) is not None:
                # The hot path, inlined: what _delta, _thinking_piece and _piece do for one delta.
                digits, kind, text = match.groups()
                index = int(digits)
                slot = blocks.get(index)
                if slot is not None and ("\\" not in text or (text := _unescape(text)) is not None):
                    thinking = kind is not None
                    if thinking:
                        if slot.type != "thinking" or (not text and slot.thinking):
                            continue
                        if text:
                            slot.thinking.append(text)
                        if not self.emit_reasoning:
                            continue
                    elif slot.type != "text":
                        continue
                    if index == self._run_index and thinking is self._run_thinking:
                        self._run.append(text)
                    else:
                        self._piece(index, thinking, text)
                    continue
            try:
                decoded = parse_json_event(PROVIDER, message)
                etype = decoded.get("type") or event
                if etype == "error" or event == "error":
                    return self.take(), _stream_error(decoded)
                self.event(etype, decoded)
            except ProviderError as exc:
                return self.take(), exc
        return self.take(), None

    def event(self, etype: str, data: dict[str, Any]) -> None:
        """Handle one decoded stream event; raises ``MalformedResponseError`` on bad shapes."""
        try:
            if etype == "content_block_delta":
                self._need_start(etype)
                self._delta(_int(data, "index"), data["delta"])
            elif etype == "content_block_start":
                self._need_start(etype)
                self._start(_int(data, "index"), data["content_block"])
            elif etype == "content_block_stop":
                self._need_start(etype)
                self._stop(_int(data, "index"))
            elif etype == "message_start":
                self._message_start(data["message"])
            elif etype == "message_delta":
                self._need_start(etype)
                self._message_delta(data["delta"], data["usage"])
            elif etype == "message_stop":
                self._need_start(etype)
                self.finished = True
            # ping and unknown event types: nothing (as the SDK does)
        except (KeyError, TypeError, AttributeError) as exc:
            raise MalformedResponseError(
                f"{etype} event is missing a field or has a wrong type ({exc}): "
                f"{json.dumps(data)[:200]}",
                provider=PROVIDER,
            ) from exc

    def _need_start(self, etype: str) -> None:
        if not self.started:
            raise MalformedResponseError(f"{etype} event before message_start", provider=PROVIDER)

    def _message_start(self, message: Mapping[str, Any]) -> None:
        self.started = True
        usage = message.get("usage")
        if isinstance(usage, Mapping):
            self._emit(_usage(usage, output_required=False))

    def _message_delta(self, delta: Mapping[str, Any], usage: Mapping[str, Any]) -> None:
        self._emit(_usage(usage, output_required=True))
        reason = delta.get("stop_reason")
        if reason is None:
            return
        if type(reason) is not str:
            raise TypeError("stop_reason must be a string")
        self._emit(FinishChunk(STOP_REASONS.get(reason, "other"), raw_reason=reason))

    def _start(self, index: int, block: Mapping[str, Any]) -> None:
        btype = _str(block, "type")
        slot = self._blocks[index] = _Block(btype)
        if btype == "text":
            self._piece(index, False, _str(block, "text"))
        elif btype == "thinking":
            text = _str(block, "thinking")
            # the stream's start block says "signature": ""; a signature_delta brings the value
            signature = str(block.get("signature") or "")
            self._thinking_piece(slot, index, text)
            if signature:
                self._signature(slot, index, signature)
        elif btype == "redacted_thinking":
            slot.input = {"type": "redacted_thinking", "data": _str(block, "data")}
            if self.emit_reasoning:
                opaque = ReasoningDelta("", reasoning_kind="encrypted", index=index, redacted=True)
                self._emit(opaque)
        elif btype == "tool_use":
            slot.call_id = _str(block, "id")
            slot.input = block.get("input") or None
            self._emit(ToolCallStart(slot.call_id, _str(block, "name"), index=index))
        # server tool blocks and future block types are not ours to capture

    def _thinking_piece(self, slot: _Block, index: int, text: str) -> None:
        if slot.type != "thinking":
            return
        if text:
            slot.thinking.append(text)
        elif slot.thinking:
            return  # the empty delta before the signature
        if self.emit_reasoning:
            self._piece(index, True, text)

    def _signature(self, slot: _Block, index: int, signature: str) -> None:
        slot.signature = signature  # replaces, as the SDK does
        if self.emit_reasoning:
            self._emit(
                ReasoningDelta("", reasoning_kind=self.kind, index=index, signature=signature)
            )

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        dtype = delta["type"]
        slot = self._blocks.get(index)
        if slot is None:
            raise _never_started("content_block_delta", index)
        if dtype == "text_delta":
            text = _str(delta, "text")
            if slot.type == "text":
                self._piece(index, False, text)
        elif dtype == "thinking_delta":
            self._thinking_piece(slot, index, _str(delta, "thinking"))
        elif dtype == "signature_delta":
            signature = _str(delta, "signature")
            if slot.type == "thinking":
                self._signature(slot, index, signature)
        elif dtype == "input_json_delta":
            partial = _str(delta, "partial_json")
            if slot.type == "tool_use":
                slot.json.append(partial)
        # citations_delta and future delta types are skipped

    def _stop(self, index: int) -> None:
        slot = self._blocks.get(index)
        if slot is None:
            raise _never_started("content_block_stop", index)
        slot.open = False
        if slot.type == "thinking":
            # A block without a signature cannot be replayed (the API rejects it), so it stays
            # reasoning only.
            if slot.signature:
                text = "".join(slot.thinking)
                data = {"type": "thinking", "thinking": text, "signature": slot.signature}
                self._emit(self._continuity(THINKING_CARRIER, data, index))
        elif slot.type == "redacted_thinking":
            self._emit(self._continuity(REDACTED_CARRIER, slot.input, index))
        elif slot.type == "tool_use":
            self._emit(ToolCallDelta(slot.call_id, _arguments(slot)))
            self._emit(ToolCallEnd(slot.call_id))

    def _continuity(self, carrier: str, data: dict[str, Any], index: int) -> ContinuityChunk:
        block = ContinuityBlock(carrier, data, provider=PROVIDER, model=self.model)
        return ContinuityChunk(block, index=index)

    # -- non-streaming

    def message(self, body: Mapping[str, Any]) -> list[Chunk]:
        """Chunks for a whole non-streamed message, in the order a stream would give them."""
        content = body.get("content")
        if not isinstance(content, list):
            raise MalformedResponseError(
                f"message has no content list: {json.dumps(body)[:200]}", provider=PROVIDER
            )
        self.started = True
        for index, block in enumerate(content):
            self.event("content_block_start", {"index": index, "content_block": block})
            self.event("content_block_stop", {"index": index})
        delta = {"stop_reason": body.get("stop_reason")}
        self.event("message_delta", {"delta": delta, "usage": body.get("usage")})
        self.finished = True
        return self.take()


def _never_started(etype: str, index: int) -> MalformedResponseError:
    return MalformedResponseError(
        f"{etype} for block {index}, which never started", provider=PROVIDER
    )


def _arguments(slot: _Block) -> str:
    """Tool arguments as compact JSON, the same whether streamed in pieces or sent whole."""
    if slot.json:
        raw = "".join(slot.json)
        try:
            value = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return raw  # the model's own broken JSON; ToolCallPart.arguments reports it as {}
    else:
        value = slot.input if slot.input is not None else {}
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------- the provider


class AnthropicProvider:
    """``anthropic:MODEL`` -- the Messages API over httpx, streaming and not."""

    name = PROVIDER

    def __init__(
        self,
        model: str,
        settings: ProviderSettings | None = None,
        *,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.settings = settings = settings or ProviderSettings()
        api_key = resolve_api_key(settings, API_KEY_ENV)
        if not api_key:
            raise ConfigError(
                "providers.anthropic.api_key",
                None,
                f"an Anthropic API key (or set {API_KEY_ENV}; the emulator accepts any key)",
            )
        base_url = resolve_base_url(settings, BASE_URL_ENV, DEFAULT_BASE_URL, provider=PROVIDER)
        self.model = model
        self.family = model_family(model)
        self.capabilities = Capabilities(
            reasoning_text=True,
            reasoning_summary=self.family.reasoning_kind == "summary",
            continuity=True,
            tools=True,
            streaming=True,
            notes={"thinking": f"{self.family.thinking} ({self.family.label})"},
        )
        # The SDKs take the host root; a base URL that already ends in /v1 is accepted too.
        self._path = "/messages" if base_url.endswith("/v1") else "/v1/messages"
        # Adapter option "headers" adds request headers (anthropic-beta, or the emulator's
        # x-emulator-scenario); the key and version headers always win.
        extra_headers = adapter_options(settings).get("headers") or {}
        headers = {str(k): str(v) for k, v in dict(extra_headers).items()}
        headers |= {"x-api-key": api_key, "anthropic-version": ANTHROPIC_VERSION}
        self.transport = HTTPTransport(PROVIDER, base_url, headers, settings, client=client)

    # -- request shaping

    def _thinking(
        self, reasoning: ReasoningRequest
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, int]:
        """``(thinking, output_config, extra max_tokens)`` for this family and request."""
        form = self.family.thinking if reasoning.enabled else "none"
        if form == "budget":
            budget = budget_for(reasoning)
            return {"type": "enabled", "budget_tokens": budget}, None, budget
        if form == "adaptive":
            config = {"effort": _ADAPTIVE_EFFORT[reasoning.effort]} if reasoning.effort else None
            return {"type": "adaptive", "display": "summarized"}, config, 0
        return None, None, 0

    def build_body(self, request: TurnRequest, *, stream: bool) -> dict[str, Any]:
        """The exact JSON body sent for ``request``."""
        system, messages = to_anthropic_messages(
            request.messages, model=self.model, system=request.system
        )
        thinking, output_config, extra = self._thinking(request.reasoning)
        if thinking is not None and _tool_loop_lacks_thinking(messages):
            thinking, extra = None, 0
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens + extra,
            "messages": messages,
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [_tool(t) for t in request.tools]
        if thinking is not None:
            body["thinking"] = thinking
        if output_config is not None:
            body["output_config"] = output_config
        # Thinking allows no temperature other than 1 ("`temperature` may only be set to 1 when
        # thinking is enabled"), so it is only sent without thinking.
        if request.temperature is not None and thinking is None:
            body["temperature"] = request.temperature
        if stream:
            body["stream"] = True
        return apply_extra(body, self.settings)  # settings.extra: body fields the user adds

    def _capture(self, request: TurnRequest) -> AnthropicCapture:
        return AnthropicCapture(
            self.model, kind=self.family.reasoning_kind, emit_reasoning=request.reasoning.enabled
        )

    # -- the Provider protocol

    async def stream(self, request: TurnRequest) -> AsyncIterator[Chunk]:
        body = self.build_body(request, stream=True)
        capture = self._capture(request)
        async with self.transport.open(self._path, body, stream=True) as response:
            request_id = self.transport.request_id(response)
            try:
                async for batch in self.transport.event_batches(response):
                    chunks, error = capture.batch(batch)
                    for chunk in chunks:
                        yield chunk
                    if error is not None:
                        if error.request_id is None:
                            error.request_id = request_id
                        raise error
            except ProviderError:
                if not capture.finished:
                    for chunk in capture.interrupted():
                        yield chunk
                    raise
                # a connection dropped after message_stop lost nothing
        if not capture.finished:
            for chunk in capture.interrupted():
                yield chunk
            raise ProviderStreamError(
                "stream ended before message_stop", provider=PROVIDER, request_id=request_id
            )

    async def request(self, request: TurnRequest) -> Turn:
        body = self.build_body(request, stream=False)
        acc = TurnAccumulator(provider=PROVIDER, model=self.model)
        data = await self.transport.post_json(self._path, body)
        try:
            acc.feed_all(self._capture(request).message(data))
        except ProviderError as exc:
            exc.partial = acc.partial()
            raise
        return acc.finish()

    async def aclose(self) -> None:
        await self.transport.aclose()


def _stream_error(data: Mapping[str, Any]) -> ProviderStreamError:
    error = data.get("error")
    error = error if isinstance(error, Mapping) else {}
    etype = error.get("type")
    message = error.get("message") or json.dumps(data)[:500]
    rid = data.get("request_id")
    return ProviderStreamError(
        str(message),
        provider=PROVIDER,
        error_type=str(etype) if etype else None,
        request_id=str(rid) if isinstance(rid, str) else None,
    )
