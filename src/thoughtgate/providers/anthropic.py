"""The Anthropic Messages adapter: request shaping per model family, and capture of its wire format.

Request shaping (``build_body``)
    The ``thinking`` form depends on the model family (the Anthropic rows of
    :mod:`thoughtgate.providers.rules`): budget models get ``{"type": "enabled", "budget_tokens":
    N}`` with ``max_tokens`` raised by ``N`` (the budget comes on top of the answer's room);
    adaptive models get ``{"type": "adaptive", "display": "summarized"}`` plus
    ``output_config.effort``; ``hidden`` mode (``ReasoningRequest.enabled`` false) sends the
    family's switch ``{"type": "disabled"}`` where the family accepts it, and nothing where it
    does not (Fable / Mythos think unasked and refuse ``disabled``: their blocks are then kept in
    memory for the loop, never recorded). Assistant history is sent back with its continuity
    blocks (the exact ``thinking`` / ``redacted_thinking`` dicts the API returned) first, then text
    and ``tool_use``; reasoning *text* is never sent back.

``pause_turn``
    A response that stops with ``pause_turn`` is not the end of the turn: the adapter sends the
    same request again with everything the turn produced so far as the final assistant message,
    as Anthropic documents, and the continuation's blocks join the same turn (usage summed).

Capture (:class:`AnthropicCapture`)
    Stream events and non-streamed message JSON both go through one capture object that emits
    normalized chunks, which the shared :class:`~thoughtgate.types.TurnAccumulator` builds into a
    turn, so streamed and non-streamed records are identical. Blocks are keyed by the ``index`` the
    event carries (block 0 is not assumed to be thinking); ``thinking_delta`` appends,
    ``signature_delta`` replaces, and at ``content_block_stop`` of a thinking block the exact block
    dict is emitted as a continuity chunk. Unknown event, delta and block types are skipped, as the
    official SDK does; malformed JSON and missing fields raise :class:`MalformedResponseError`.

Inline ``<think>`` tags
    Servers other than Anthropic's speak this format too (vLLM, llama.cpp, Ollama, the
    Anthropic-compatible endpoints of DeepSeek, Moonshot, MiniMax, Z.ai), and a model served
    without a reasoning parser writes ``<think>…</think>`` into a ``text`` block. Option
    ``think_tags`` (``off`` by default on ``api.anthropic.com``, ``leading`` on any other server;
    ADR 0077) splits each text block by :mod:`thoughtgate.providers.think_tags`, however the deltas
    are cut: the tag content is reasoning of kind ``raw`` at that block's index, dropped in
    ``hidden`` mode, never sent back as text (a ``pause_turn`` continuation included). Signed
    ``thinking`` blocks are not touched.

Errors: HTTP failures come from :class:`~thoughtgate.providers.http.HTTPTransport`; an in-stream
``error`` event or a stream that ends before ``message_stop`` raises :class:`ProviderStreamError`.
``stream_llm_turn`` attaches the partial turn to either.

Sources: ``docs/providers/anthropic.md``.
"""

from __future__ import annotations

import contextlib
import json
import json.decoder
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Final, TypeAlias

from thoughtgate.errors import (
    MalformedResponseError,
    ProviderError,
    ProviderStreamError,
    exception_line,
)
from thoughtgate.providers.base import (
    Capabilities,
    Effort,
    ReasoningRequest,
    ToolSpec,
    TurnRequest,
)
from thoughtgate.providers.described import is_field_name, shape_of
from thoughtgate.providers.endpoints import apply_extra
from thoughtgate.providers.http import parse_json_event
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.providers.rules import (
    ANTHROPIC_RULES,
    EndpointRule,
    ThinkingForm,
    anthropic_rule,
    normalize_anthropic_model,
)
from thoughtgate.providers.sse import SSEMessage
from thoughtgate.providers.think_tags import (
    Delimiters,
    Piece,
    ThinkTags,
    ThinkTagSplitter,
    splitter_for,
)
from thoughtgate.providers.wire import FollowUp, VendorFormatProvider, WireParser
from thoughtgate.types import (
    Chunk,
    ContinuityBlock,
    ContinuityChunk,
    FinishChunk,
    FinishReason,
    Message,
    ReasoningDelta,
    ReasoningKind,
    ResponseInfoChunk,
    TextDelta,
    TextPart,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallPart,
    ToolCallStart,
    ToolResultPart,
    UsageChunk,
)

__all__ = [
    "ANTHROPIC_VERSION",
    "API_KEY_ENV",
    "BASE_URL_ENV",
    "DEFAULT_BASE_URL",
    "DELTA_TYPES",
    "EVENT_TYPES",
    "MAX_PAUSE_CONTINUATIONS",
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
_ENDPOINT: Final = ENDPOINTS[PROVIDER]
DEFAULT_BASE_URL: Final = _ENDPOINT.default_base_url
API_KEY_ENV: Final = _ENDPOINT.api_key_env
BASE_URL_ENV: Final = _ENDPOINT.base_url_env

THINKING_CARRIER: Final = "anthropic.thinking"
REDACTED_CARRIER: Final = "anthropic.redacted_thinking"
_CARRIERS: Final = frozenset({THINKING_CARRIER, REDACTED_CARRIER})

EVENT_TYPES: Final = frozenset(
    {
        "message_start",
        "message_delta",
        "message_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    }
)
"""The stream's event types (the SDK's ``RawMessageStreamEvent``, ``error`` and ``ping`` aside):
reading one is progress, a ``ping`` or another type is not (ADR 0161)."""
DELTA_TYPES: Final = frozenset(
    {"text_delta", "input_json_delta", "citations_delta", "thinking_delta", "signature_delta"}
)
"""The deltas of a ``content_block_delta`` (the SDK's ``RawContentBlockDelta``): a signature
is the model's output as much as its text is; a delta of another type is no progress."""


# --------------------------------------------------------------------------- model families

#: One row per Claude family; the table itself lives in :mod:`thoughtgate.providers.rules`.
ModelFamily: TypeAlias = EndpointRule
MODEL_FAMILIES: Final[tuple[EndpointRule, ...]] = ANTHROPIC_RULES
normalize_model = normalize_anthropic_model
model_family = anthropic_rule


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

    __slots__ = ("call_id", "input", "json", "open", "signature", "splitter", "thinking", "type")

    def __init__(self, btype: str) -> None:
        self.type = btype
        self.splitter: ThinkTagSplitter | None = None
        """A text block's ``<think>`` splitter, until it has settled (``think_tags``)."""
        self.open = True
        self.thinking: list[str] = []
        self.signature = ""
        self.call_id = ""
        self.json: list[str] = []
        self.input: Any = None


class _WrongField(TypeError):
    """A field of the wrong JSON type, in this module's words (the field's name and the type
    it had, never its value): a public error may say them (:func:`_what_was_wrong`)."""


def _str(mapping: Mapping[str, Any], key: str) -> str:
    value = mapping[key]
    if type(value) is not str:
        raise _WrongField(f"field {key!r} must be a string, got {type(value).__name__}")
    return value


def _int(mapping: Mapping[str, Any], key: str) -> int:
    value = mapping[key]
    if type(value) is not int:
        raise _WrongField(f"field {key!r} must be an integer, got {type(value).__name__}")
    return value


def _what_was_wrong(exc: Exception) -> str:
    """What a run's public ``error`` says of the exception an event's check caught: this
    module's own words, the name of a missing field (as :func:`shape_of` names keys), else the
    exception's class. A library's words (``string indices must be integers``) may quote what
    it was given, which may be the event's reasoning: they go to the developer-only detail only
    (fail closed, ADR 0111)."""
    if isinstance(exc, _WrongField):
        return str(exc)
    if isinstance(exc, KeyError) and len(exc.args) == 1 and is_field_name(exc.args[0]):
        return f"no field {exc.args[0]!r}"
    return type(exc).__name__


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
        "_run_kind",
        "emit_reasoning",
        "failure",
        "finished",
        "kind",
        "model",
        "next_index",
        "offset",
        "other_blocks",
        "paused",
        "progress",
        "segment",
        "started",
        "stop_reason",
        "think_delimiters",
        "think_tags",
    )

    def __init__(
        self,
        model: str,
        *,
        kind: ReasoningKind,
        emit_reasoning: bool = True,
        paused: _PausedTurn | None = None,
        think_tags: ThinkTags = "off",
        think_delimiters: Delimiters | None = None,
    ) -> None:
        self.model = model
        self.think_tags: ThinkTags = think_tags
        self.think_delimiters = think_delimiters
        self.paused = paused or _PausedTurn()
        """What earlier responses of this turn produced (``pause_turn`` continuations)."""
        self.segment = _SegmentBlocks()
        """This response's blocks, as a continuation would send them back."""
        self.offset = offset = self.paused.offset
        """Added to every block index this capture emits: a ``pause_turn`` continuation's
        blocks follow the paused response's blocks in the same turn."""
        self.next_index = offset
        self.failure: ProviderError | None = None
        self.stop_reason: str | None = None
        self.kind: ReasoningKind = kind
        self.emit_reasoning = emit_reasoning
        self._blocks: dict[int, _Block] = {}
        self.other_blocks: dict[int, dict[str, Any]] = {}
        """Blocks of types this capture does not read (server tools, future types), exactly as
        they came, by index: a ``pause_turn`` continuation must send them back unchanged."""
        self.started = False
        self.finished = False
        self.progress = 0
        self._out: list[Chunk] = []
        self._run: list[str] = []  # pieces of the open text or thinking run
        self._run_index = -1
        self._run_kind: ReasoningKind | None = None
        """The reasoning kind of the open run, ``None`` for text."""

    # -- output: runs of text pieces are merged into one chunk

    def _piece(self, index: int, kind: ReasoningKind | None, text: str) -> None:
        if index != self._run_index or kind != self._run_kind:
            self._close_run()
            self._run_index, self._run_kind = index, kind
        self._run.append(text)

    def _close_run(self) -> None:
        if self._run_index < 0:
            return
        text = "".join(self._run)
        index = self._run_index
        if self._run_kind is not None:
            self._out.append(ReasoningDelta(text, reasoning_kind=self._run_kind, index=index))
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
        them. Reasoning and text were emitted as they arrived, but for what a text block's
        ``<think>`` splitter held: it goes to its channel (reasoning if a tag is open)."""
        for index, slot in self._blocks.items():
            if slot.open and slot.type == "tool_use" and (slot.json or slot.input is not None):
                slot.open = False
                self._emit(ToolCallDelta(slot.call_id, _arguments(slot)))
            elif slot.open and slot.splitter is not None:
                self._split(slot, index, "", last=True)
        return self.take()

    def take(self) -> list[Chunk]:
        """The chunks produced since the last call, as the turn records them: after a
        ``pause_turn`` continuation, block indexes follow the earlier responses' and usage adds
        theirs; a ``pause_turn`` finish is not the end of the turn and is left out."""
        self._close_run()
        out, self._out = self._out, []
        if self.offset:
            out = [_shifted(chunk, self.offset) for chunk in out]
        self.segment.chunks.extend(out)
        before = self.paused.usage
        if before:
            out = [_add_usage(c, before) if isinstance(c, UsageChunk) else c for c in out]
        if self.stop_reason == "pause_turn":
            out = [c for c in out if not isinstance(c, FinishChunk)]
        return out

    def end(self) -> list[Chunk]:
        """The body ended: nothing more, or the error of a stream cut before ``message_stop``."""
        if not self.finished:
            raise ProviderStreamError("stream ended before message_stop", provider=PROVIDER)
        return []

    # -- streaming

    def feed(self, events: Sequence[SSEMessage]) -> list[Chunk]:
        """Chunks for the events of one network read. An ``error`` event or a malformed one is
        left in :attr:`failure`, and the chunks before it are returned."""
        blocks = self._blocks
        for message in events:
            event, data, _ = message
            if event == "ping" or self.finished:
                continue  # nothing after message_stop belongs to the turn
            if event == "content_block_delta" and (match := _FAST_DELTA(data)) is not None:
                # The hot path: a text or thinking delta of the one exact shape, read without
                # json.loads and handed to the same rules as every other delta.
                digits, kind, text = match.groups()
                index = int(digits)
                slot = blocks.get(index)
                if slot is not None and ("\\" not in text or (text := _unescape(text)) is not None):
                    self.progress += 1
                    self._text_piece(slot, index, kind is not None, text)
                    continue
            try:
                decoded = parse_json_event(PROVIDER, message)
                etype = decoded.get("type") or event
                if etype == "error" or event == "error":
                    self.failure = _stream_error(decoded)
                    break
                self.event(etype, decoded)
            except ProviderError as exc:
                self.failure = exc
                break
        return self.take()

    def event(self, etype: str, data: dict[str, Any]) -> None:
        """Handle one decoded stream event; raises ``MalformedResponseError`` on bad shapes."""
        if etype in EVENT_TYPES and etype != "content_block_delta":
            self.progress += 1  # a delta counts once its type is known (``_delta``)
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
                f"{etype} event is missing a field or has a wrong type ({_what_was_wrong(exc)}); "
                f"it is {shape_of(data)}",
                provider=PROVIDER,
                detail=exception_line(exc),
            ) from exc

    def _need_start(self, etype: str) -> None:
        if not self.started:
            raise MalformedResponseError(f"{etype} event before message_start", provider=PROVIDER)

    def _message_start(self, message: Mapping[str, Any]) -> None:
        self.started = True
        self._response_info(message)
        usage = message.get("usage")
        if isinstance(usage, Mapping):
            self._emit(_usage(usage, output_required=False))

    def _response_info(self, message: Mapping[str, Any]) -> None:
        """The message's ``id`` and the ``model`` that answered, when the API sent them."""
        rid, model = message.get("id"), message.get("model")
        if isinstance(rid, str) or isinstance(model, str):
            self._emit(
                ResponseInfoChunk(
                    response_id=rid if isinstance(rid, str) and rid else None,
                    model=model if isinstance(model, str) and model else None,
                )
            )

    def _message_delta(self, delta: Mapping[str, Any], usage: Mapping[str, Any]) -> None:
        self._emit(_usage(usage, output_required=True))
        reason = delta.get("stop_reason")
        if reason is None:
            return
        if type(reason) is not str:
            raise TypeError("stop_reason must be a string")
        self.stop_reason = reason
        self._emit(FinishChunk(STOP_REASONS.get(reason, "other"), raw_reason=reason))

    def _start(self, index: int, block: Mapping[str, Any]) -> None:
        btype = _str(block, "type")
        first = not self._blocks and self.offset == 0  # the turn's first block
        slot = self._blocks[index] = _Block(btype)
        self.next_index = max(self.next_index, index + self.offset + 1)
        if btype == "text":
            slot.splitter = splitter_for(
                self.think_tags, first=first, delimiters=self.think_delimiters
            )
            self._text_piece(slot, index, False, _str(block, "text"))
        elif btype == "thinking":
            text = _str(block, "thinking")
            # the stream's start block says "signature": ""; a signature_delta brings the value
            signature = str(block.get("signature") or "")
            self._text_piece(slot, index, True, text)
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
        else:
            # server tool blocks and future block types are not ours to read, but a paused turn
            # must send them back as they came
            slot.input = dict(block)

    def _text_piece(self, slot: _Block, index: int, thinking: bool, text: str) -> None:
        """The rules of a text or thinking delta (the one implementation, for both paths):
        a delta of the other kind than its block is skipped; thinking text is kept for the
        continuity block; an empty thinking delta after text (the one before the signature)
        adds nothing; reasoning is emitted only when it is captured."""
        if thinking:
            if slot.type != "thinking":
                return
            if text:
                slot.thinking.append(text)
            elif slot.thinking:
                return  # the empty delta before the signature
            if not self.emit_reasoning:
                return
            kind: ReasoningKind | None = self.kind
        elif slot.type != "text":
            return
        elif slot.splitter is not None:
            self._split(slot, index, text)
            return
        else:
            kind = None
        if index == self._run_index and kind == self._run_kind:
            self._run.append(text)
        else:
            self._piece(index, kind, text)

    def _split(self, slot: _Block, index: int, text: str, *, last: bool = False) -> None:
        """A text block's text through its ``<think>`` splitter (``last``: the block ended, what
        is held goes to its channel): answer text, and reasoning of kind ``raw`` when captured."""
        splitter = slot.splitter
        assert splitter is not None
        pieces: list[Piece] = splitter.feed(text) if text else []
        if last:
            pieces += splitter.flush()
        if last or splitter.settled:
            slot.splitter = None  # the rest of the block is answer as it comes
        for piece in pieces:
            if piece.channel == "text":
                self._piece(index, None, piece.text)
            elif self.emit_reasoning:  # hidden: dropped here, before anyone sees it
                self._piece(index, "raw", piece.text)

    def _signature(self, slot: _Block, index: int, signature: str) -> None:
        slot.signature = signature  # replaces, as the SDK does
        if self.emit_reasoning:
            self._emit(
                ReasoningDelta("", reasoning_kind=self.kind, index=index, signature=signature)
            )

    def _delta(self, index: int, delta: Mapping[str, Any]) -> None:
        dtype = delta["type"]
        if dtype in DELTA_TYPES:
            self.progress += 1
        slot = self._blocks.get(index)
        if slot is None:
            raise _never_started("content_block_delta", index)
        if dtype == "text_delta":
            self._text_piece(slot, index, False, _str(delta, "text"))
        elif dtype == "thinking_delta":
            self._text_piece(slot, index, True, _str(delta, "thinking"))
        elif dtype == "signature_delta":
            signature = _str(delta, "signature")
            if slot.type == "thinking":
                self._signature(slot, index, signature)
        elif dtype == "input_json_delta":
            partial = _str(delta, "partial_json")
            if slot.type not in ("text", "thinking", "redacted_thinking"):
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
        elif slot.type == "text":
            if slot.splitter is not None:
                self._split(slot, index, "", last=True)
        elif slot.type == "tool_use":
            self._emit(ToolCallDelta(slot.call_id, _arguments(slot)))
            self._emit(ToolCallEnd(slot.call_id))
        elif isinstance(slot.input, dict):
            block = dict(slot.input)
            if slot.json:
                # broken JSON keeps the block as it started; the API will say what it makes of it
                with contextlib.suppress(json.JSONDecodeError, RecursionError):
                    block["input"] = json.loads("".join(slot.json) or "{}")
            self.other_blocks[index + self.offset] = block

    def _continuity(self, carrier: str, data: dict[str, Any], index: int) -> ContinuityChunk:
        block = ContinuityBlock(carrier, data, provider=PROVIDER, model=self.model)
        return ContinuityChunk(block, index=index)

    # -- non-streaming

    def whole(self, body: Mapping[str, Any]) -> list[Chunk]:
        """Chunks for a whole non-streamed message, in the order a stream would give them."""
        content = body.get("content")
        if not isinstance(content, list):
            raise MalformedResponseError(
                f"message has no content list: its body is {shape_of(body)}", provider=PROVIDER
            )
        self.started = True
        self._response_info(body)
        for index, block in enumerate(content):
            self.event("content_block_start", {"index": index, "content_block": block})
            self.event("content_block_stop", {"index": index})
        delta = {"stop_reason": body.get("stop_reason")}
        self.event("message_delta", {"delta": delta, "usage": body.get("usage")})
        self.finished = True
        return self.take()


def _shifted(chunk: Chunk, offset: int) -> Chunk:
    """``chunk`` with its block index moved by ``offset`` (chunks without an index unchanged)."""
    if isinstance(chunk, ReasoningDelta | TextDelta | ToolCallStart | ContinuityChunk):
        return replace(chunk, index=chunk.index + offset)
    return chunk


def _never_started(etype: str, index: int) -> MalformedResponseError:
    """The block's index is the developer-only detail: it counts the blocks before it, thinking
    ones included (a reasoning part's ``index`` is ``reasoning``, ADR 0169)."""
    return MalformedResponseError(
        f"{etype} for a block that never started", provider=PROVIDER, detail=f"block {index}"
    )


def _arguments(slot: _Block) -> str:
    """Tool arguments as compact JSON, the same whether streamed in pieces or sent whole."""
    if slot.json:
        raw = "".join(slot.json)
        try:
            value = json.loads(raw) if raw else {}
        except (json.JSONDecodeError, RecursionError):  # RecursionError: nested past the stack
            return raw  # the model's own broken JSON; ToolCallPart.arguments reports it as {}
    else:
        value = slot.input if slot.input is not None else {}
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------- the provider


class _PausedTurn:
    """What a ``pause_turn`` continuation must send back: every block of the paused response(s),
    rebuilt from the chunks and captures, in index order, plus the usage so far."""

    def __init__(self) -> None:
        self.content: list[dict[str, Any]] = []
        self.usage: dict[str, int] = {}
        self.offset = 0
        self.continuations = 0


class _SegmentBlocks:
    """The blocks of one response, rebuilt from the chunks the capture emitted.

    Only a ``pause_turn`` continuation reads them, and most responses never pause: until one
    asks, the chunks are only kept (one ``extend`` per read), and the blocks are built once.
    """

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []

    def _read(self) -> tuple[dict[int, dict[str, Any]], dict[str, int]]:
        blocks: dict[int, dict[str, Any]] = {}
        texts: dict[int, list[str]] = {}
        tool_index: dict[str, int] = {}
        usage: dict[str, int] = {}
        for chunk in self.chunks:
            if isinstance(chunk, TextDelta):
                if chunk.index not in texts:
                    texts[chunk.index] = []
                    blocks[chunk.index] = {"type": "text"}
                texts[chunk.index].append(chunk.text)
            elif isinstance(chunk, ContinuityChunk):
                blocks[chunk.index] = dict(chunk.block.data)
            elif isinstance(chunk, ToolCallStart):
                tool_index[chunk.call_id] = chunk.index
                blocks[chunk.index] = {"type": "tool_use", "id": chunk.call_id, "name": chunk.name}
            elif isinstance(chunk, ToolCallDelta) and chunk.call_id in tool_index:
                block = blocks[tool_index[chunk.call_id]]
                try:
                    block["input"] = json.loads(chunk.arguments_delta or "{}")
                except (json.JSONDecodeError, RecursionError):
                    block["input"] = {}
            elif isinstance(chunk, UsageChunk):
                for name in ("input_tokens", "output_tokens", "reasoning_tokens"):
                    value = getattr(chunk, name)
                    if value is not None:
                        usage[name] = value
        for index, pieces in texts.items():
            if blocks[index].get("type") == "text":
                blocks[index]["text"] = "".join(pieces)
        return blocks, usage

    @property
    def usage(self) -> dict[str, int]:
        return self._read()[1]

    def content(self, other: Mapping[int, dict[str, Any]]) -> list[dict[str, Any]]:
        merged = {**self._read()[0], **other}
        out = [merged[i] for i in sorted(merged)]
        return [b for b in out if b.get("type") != "text" or str(b.get("text", "")).strip()]


#: How many times one turn is continued after ``pause_turn`` before it counts as failed.
MAX_PAUSE_CONTINUATIONS: Final = 8


class AnthropicProvider(VendorFormatProvider):
    """``anthropic:MODEL`` -- the Messages API over httpx, streaming and not."""

    endpoint = _ENDPOINT
    version_headers: ClassVar[Mapping[str, str]] = {"anthropic-version": ANTHROPIC_VERSION}

    @property
    def family(self) -> EndpointRule:
        return self.rule

    def wire_path(self, base_url: str) -> str:
        # The SDKs take the host root; a base URL that already ends in /v1 is accepted too.
        return "/messages" if base_url.endswith("/v1") else "/v1/messages"

    def wire_capabilities(self) -> Capabilities:
        return Capabilities(
            reasoning_text=True,
            reasoning_summary=self.rule.reasoning_kind == "summary",
            continuity=True,
            tools=True,
            streaming=True,
            notes={"thinking": f"{self.rule.thinking} ({self.rule.family})"},
        )

    # -- request shaping

    def _thinking(
        self, reasoning: ReasoningRequest
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, int]:
        """``(thinking, output_config, extra max_tokens)`` for this family and request.

        In ``hidden`` mode the family's switch (``{"type": "disabled"}``) is sent where the rules
        say the model accepts it, so nobody pays for thinking that would not be recorded.
        """
        if not reasoning.enabled:
            hidden = self.rule.hidden or {}
            switch = hidden.get("thinking")
            return (dict(switch) if isinstance(switch, Mapping) else None), None, 0
        form = self.rule.thinking
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
        thinking_on = thinking is not None and thinking.get("type") != "disabled"
        if thinking_on and _tool_loop_lacks_thinking(messages):
            thinking, extra, thinking_on = None, 0, False
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
        # A model that thinks unasked thinks without the parameter too.
        unasked = thinking is None and self.rule.thinks_unasked
        if request.temperature is not None and not (thinking_on or unasked):
            body["temperature"] = request.temperature
        if stream:
            body["stream"] = True
        return apply_extra(body, self.settings)  # settings.extra: body fields the user adds

    def parser(self, request: TurnRequest, paused: _PausedTurn | None = None) -> AnthropicCapture:
        return AnthropicCapture(
            self.model,
            kind=self.rule.reasoning_kind,
            emit_reasoning=request.reasoning.enabled,
            paused=paused,
            think_tags=self.think_tags,
            think_delimiters=self.think_delimiters,
        )

    def follow_up(
        self, request: TurnRequest, body: Mapping[str, Any], parser: WireParser
    ) -> FollowUp | None:
        """A ``pause_turn`` answer is not the end of the turn: as Anthropic documents, the same
        request goes again with the paused content as the final assistant message, and the
        continuation's blocks join the same turn (usage summed)."""
        assert isinstance(parser, AnthropicCapture)
        if parser.stop_reason != "pause_turn":
            return None
        paused = parser.paused
        if paused.continuations == MAX_PAUSE_CONTINUATIONS:
            raise ProviderStreamError(
                f"the turn was still paused (stop_reason pause_turn) after "
                f"{MAX_PAUSE_CONTINUATIONS} continuations",
                provider=PROVIDER,
                error_type="pause_turn",
            )
        paused.continuations += 1
        next_body = _continue_paused(body, paused, parser.segment, parser)
        return next_body, self.parser(request, paused)


def _add_usage(chunk: UsageChunk, before: Mapping[str, int]) -> UsageChunk:
    """Usage of a continued turn: the paused responses' tokens plus this response's."""

    def plus(name: str) -> int | None:
        value = getattr(chunk, name)
        return None if value is None else value + before.get(name, 0)

    return UsageChunk(
        input_tokens=plus("input_tokens"),
        output_tokens=plus("output_tokens"),
        reasoning_tokens=plus("reasoning_tokens"),
        cache_read_tokens=chunk.cache_read_tokens,
        cache_write_tokens=chunk.cache_write_tokens,
    )


def _continue_paused(
    body: Mapping[str, Any],
    paused: _PausedTurn,
    segment: _SegmentBlocks,
    capture: AnthropicCapture,
) -> dict[str, Any]:
    """The next request of a paused turn: the same body, with everything the turn produced so
    far as the final assistant message (Anthropic: "pass the paused response back as-is")."""
    paused.content += segment.content(capture.other_blocks)
    for name, value in segment.usage.items():
        paused.usage[name] = paused.usage.get(name, 0) + value
    paused.offset = capture.next_index
    messages = list(body["messages"])
    if messages and messages[-1].get("role") == "assistant":
        messages = messages[:-1]
    messages.append({"role": "assistant", "content": list(paused.content)})
    return {**body, "messages": messages}


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
        by_provider=True,
    )
