"""The shared, provider-neutral vocabulary: message parts, stream chunks, usage and finished turns.

Every adapter translates its vendor's wire format into these types and nothing else, and every
consumer (the runtime, the tool loop, the event log, the filters) reads only these. Parts and chunks
are frozen dataclasses tagged by a literal ``kind`` so that a ``match`` over them is exhaustive and a
JSON round trip is unambiguous. Optional fields are keyword-only so adding one never breaks a caller.

The one :class:`TurnAccumulator` builds a finished :class:`Turn` from a chunk stream; streamed and
non-streamed responses both go through it, which is what makes their records identical.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Final, Literal, TypeAlias, assert_never

__all__ = [
    "BAD_TOOL_NAME",
    "Chunk",
    "ChunkOrderError",
    "ContinuityBlock",
    "ContinuityChunk",
    "FinishChunk",
    "FinishReason",
    "Message",
    "Part",
    "ReasoningDelta",
    "ReasoningKind",
    "ReasoningPart",
    "ResponseInfoChunk",
    "Role",
    "TextDelta",
    "TextPart",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallPart",
    "ToolCallStart",
    "ToolResultPart",
    "Turn",
    "TurnAccumulator",
    "Usage",
    "UsageChunk",
    "part_from_dict",
    "part_to_dict",
    "provider_id",
]

ReasoningKind: TypeAlias = Literal["raw", "summary", "encrypted"]
"""``raw``: the model's own chain-of-thought text (Anthropic ``thinking``, ``reasoning_content``,
``<think>``); ``summary``: a provider-written summary of it (OpenAI summaries, OpenRouter
``reasoning.summary``, Anthropic summarized thinking); ``encrypted``: opaque bytes only."""

FinishReason: TypeAlias = Literal[
    "stop", "length", "tool_calls", "content_filter", "refusal", "pause", "error", "other"
]
"""Normalized stop reason; the provider's own word is kept beside it in ``Turn.raw_finish_reason``."""

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]


# --------------------------------------------------------------------------- message parts


@dataclass(frozen=True, slots=True)
class TextPart:
    """Answer text (Anthropic ``text`` block, OpenAI ``content`` / ``output_text``)."""

    text: str
    _: KW_ONLY
    kind: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """Reasoning the provider returned.

    ``signature`` is Anthropic's ``signature`` (or an OpenRouter detail's); ``redacted`` marks
    Anthropic ``redacted_thinking`` whose text is opaque (then ``text`` is empty and the bytes live
    in the matching :class:`ContinuityBlock`). ``index`` is the provider's block or summary index.
    """

    text: str
    _: KW_ONLY
    kind: Literal["reasoning"] = "reasoning"
    reasoning_kind: ReasoningKind = "raw"
    provider: str = ""
    model: str = ""
    signature: str | None = None
    redacted: bool = False
    index: int = 0


@dataclass(frozen=True, slots=True)
class ContinuityBlock:
    """An opaque block the provider demands back, byte-identical, inside the same tool loop.

    ``carrier`` names the shape (``anthropic.thinking``, ``anthropic.redacted_thinking``,
    ``openrouter.reasoning_details``, ``openai.reasoning_item``, ``compat.reasoning_content``);
    ``data`` is the exact JSON object the provider sent, so sending it back cannot alter it.
    These never leave the server: readers only learn that one existed.
    """

    carrier: str
    data: Mapping[str, Any]
    _: KW_ONLY
    kind: Literal["continuity"] = "continuity"
    provider: str = ""
    model: str = ""


@dataclass(frozen=True, slots=True)
class ToolCallPart:
    """A tool call the model asked for; ``arguments_json`` is the raw text the model produced."""

    call_id: str
    name: str
    arguments_json: str = "{}"
    _: KW_ONLY
    kind: Literal["tool_call"] = "tool_call"

    @property
    def arguments(self) -> dict[str, Any]:
        """Parsed arguments; an empty or invalid string parses as ``{}`` (the loop reports it)."""
        try:
            value = json.loads(self.arguments_json or "{}")
        except (json.JSONDecodeError, RecursionError):  # broken, or nested past the stack
            return {}
        return value if isinstance(value, dict) else {"value": value}


@dataclass(frozen=True, slots=True)
class ToolResultPart:
    """The result of a tool call, fed back to the model."""

    call_id: str
    content: str
    is_error: bool = False
    _: KW_ONLY
    kind: Literal["tool_result"] = "tool_result"
    name: str = ""


Part: TypeAlias = TextPart | ReasoningPart | ContinuityBlock | ToolCallPart | ToolResultPart


@dataclass(frozen=True, slots=True)
class Message:
    """One conversation message: a role and its ordered parts."""

    role: Role
    parts: tuple[Part, ...]

    @classmethod
    def user(cls, text: str) -> Message:
        return cls("user", (TextPart(text),))

    @classmethod
    def system(cls, text: str) -> Message:
        return cls("system", (TextPart(text),))

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


# --------------------------------------------------------------------------- usage


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts; ``reasoning_tokens`` is included in ``output_tokens`` as providers bill it."""

    _: KW_ONLY
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        names = (
            "input_tokens",
            "output_tokens",
            "reasoning_tokens",
            "cache_read_tokens",
            "cache_write_tokens",
        )
        return cls(**{k: int(data.get(k) or 0) for k in names})


# --------------------------------------------------------------------------- stream chunks


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text to append to the reasoning part ``(reasoning_kind, index)``.

    A non-``None`` ``signature`` *replaces* the part's signature (Anthropic ``signature_delta``
    semantics). ``redacted`` marks the part as opaque redacted thinking.
    """

    text: str
    _: KW_ONLY
    kind: Literal["reasoning_delta"] = "reasoning_delta"
    reasoning_kind: ReasoningKind = "raw"
    index: int = 0
    signature: str | None = None
    redacted: bool = False


@dataclass(frozen=True, slots=True)
class TextDelta:
    """Answer text to append to the text part ``index``."""

    text: str
    _: KW_ONLY
    kind: Literal["text_delta"] = "text_delta"
    index: int = 0


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins; ``index`` orders it among the turn's parts."""

    call_id: str
    name: str
    _: KW_ONLY
    kind: Literal["tool_call_start"] = "tool_call_start"
    index: int = 0


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a tool call's JSON arguments."""

    call_id: str
    arguments_delta: str
    _: KW_ONLY
    kind: Literal["tool_call_delta"] = "tool_call_delta"


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """A tool call is complete."""

    call_id: str
    _: KW_ONLY
    kind: Literal["tool_call_end"] = "tool_call_end"


@dataclass(frozen=True, slots=True)
class ContinuityChunk:
    """A complete continuity block (it is never streamed in pieces to consumers)."""

    block: ContinuityBlock
    _: KW_ONLY
    kind: Literal["continuity_chunk"] = "continuity_chunk"
    index: int = 0


@dataclass(frozen=True, slots=True)
class UsageChunk:
    """Usage so far; fields that are not ``None`` replace the running value (cumulative)."""

    _: KW_ONLY
    kind: Literal["usage"] = "usage"
    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ResponseInfoChunk:
    """What the provider said about the response itself: its id (Anthropic ``msg_…``, Chat
    Completions ``chatcmpl-…``, Responses ``resp_…``) and the model that actually answered
    (a dated snapshot of the one asked for). Fields that are not ``None`` replace earlier ones."""

    _: KW_ONLY
    kind: Literal["response_info"] = "response_info"
    response_id: str | None = None
    model: str | None = None


@dataclass(frozen=True, slots=True)
class FinishChunk:
    """The turn is over; ``raw_reason`` is the provider's own stop reason."""

    reason: FinishReason
    _: KW_ONLY
    kind: Literal["finish"] = "finish"
    raw_reason: str = ""


Chunk: TypeAlias = (
    ReasoningDelta
    | TextDelta
    | ToolCallStart
    | ToolCallDelta
    | ToolCallEnd
    | ContinuityChunk
    | UsageChunk
    | ResponseInfoChunk
    | FinishChunk
)


# --------------------------------------------------------------------------- finished turn


@dataclass(frozen=True, slots=True)
class Turn:
    """One finished (or, when ``complete`` is false, cut) model turn."""

    parts: tuple[Part, ...]
    _: KW_ONLY
    usage: Usage = Usage()
    finish_reason: FinishReason | None = None
    raw_finish_reason: str = ""
    provider: str = ""
    model: str = ""
    """The adapter's model (what carriers are stamped with and go back to)."""
    complete: bool = True
    response_id: str | None = field(default=None, compare=False)
    """The provider's id for this response, when it sent one (not compared: two requests for the
    same turn get two ids)."""
    response_model: str | None = field(default=None, compare=False)
    """The model the provider says answered (often a dated snapshot of ``model``)."""

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def reasoning_parts(self) -> tuple[ReasoningPart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ReasoningPart))

    @property
    def reasoning_text(self) -> str:
        """All readable reasoning, parts joined by a blank line (redacted parts have no text)."""
        return "\n\n".join(p.text for p in self.reasoning_parts if p.text)

    @property
    def tool_calls(self) -> tuple[ToolCallPart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ToolCallPart))

    @property
    def continuity(self) -> tuple[ContinuityBlock, ...]:
        return tuple(p for p in self.parts if isinstance(p, ContinuityBlock))

    def as_message(self) -> Message:
        return Message("assistant", self.parts)


_PROVIDER_ID: Final = re.compile(r"[A-Za-z0-9_.:/@+=-]{1,128}")
"""What a provider-chosen id or name may be, in a recorded turn: a tool call's id and name, a
response id, the answering model's name, a raw stop reason. Every vendor's ids and names have
this form (``toolu_01…``, ``call_…``, ``chatcmpl-…``, ``resp_…``, ``claude-sonnet-4-5-20250929``,
``@cf/meta/llama``, ``end_turn``); without the bound a hostile provider, or a proxy in between,
could put kilobytes of anything -- the turn's reasoning -- into a field every reader is shown
(ADR 0168)."""

BAD_TOOL_NAME: Final = "invalid_tool_name"
"""What a recorded turn calls a tool whose name is no :data:`_PROVIDER_ID`: it is no tool's, so
the call fails as an unknown tool's, and the model is told so under this name."""


def provider_id(value: str | None) -> str | None:
    """``value`` when it is fit to record as a provider-chosen id or name (at most 128 letters,
    digits and ``_.:/@+=-``), else ``None``."""
    return value if value is not None and _PROVIDER_ID.fullmatch(value) else None


def _call_id(value: str) -> str:
    """A tool call's id as recorded: the provider's, or one derived from it when it is no
    :data:`_PROVIDER_ID`. Derived, not numbered: the same id in every turn, every replay and
    every process, so a call's card, its result and its resumed step keep one name; the next
    request sends the recorded id with both the call and its result."""
    if _PROVIDER_ID.fullmatch(value):
        return value
    return "call_tg_" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class _Slot:
    """Mutable builder for one part while its chunks arrive."""

    __slots__ = ("buf", "name", "redacted", "rkind", "signature", "tag", "value")

    def __init__(self, tag: str, *, rkind: ReasoningKind = "raw", name: str = "") -> None:
        self.tag = tag
        self.buf: list[str] = []
        self.rkind: ReasoningKind = rkind
        self.signature: str | None = None
        self.redacted = False
        self.name = name
        self.value: ContinuityBlock | None = None


class ChunkOrderError(ValueError):
    """A chunk that cannot follow the ones before it (a delta for a tool call that never
    started): the adapter that produced it has a bug. ``stream_llm_turn`` reports it as a
    provider stream error, with the partial turn."""


class TurnAccumulator:
    """Builds a :class:`Turn` from normalized chunks.

    Parts keep the order in which their first chunk arrived, so a text block that precedes a
    thinking block (seen on adaptive Anthropic models) stays first. Reasoning is keyed by
    ``(reasoning_kind, index)``, text by ``index``, tool calls by ``call_id``. ``partial()`` returns
    what arrived so far, which is how a cut stream is recorded without losing anything.
    """

    def __init__(self, *, provider: str = "", model: str = "") -> None:
        self.provider = provider
        self.model = model
        self._slots: dict[tuple[str, Any], _Slot] = {}
        self._order: list[tuple[str, Any]] = []
        self._usage: dict[str, int] = {}
        self._finish: FinishReason | None = None
        self._raw_finish = ""
        self._continuity_seq = 0
        self._response_id: str | None = None
        self._response_model: str | None = None

    def _slot(self, key: tuple[str, Any], make: _Slot) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = make
            self._order.append(key)
        return slot

    def feed(self, chunk: Chunk) -> None:
        match chunk:
            case ReasoningDelta():
                key: tuple[str, Any] = ("reasoning", (chunk.reasoning_kind, chunk.index))
                # the slot is looked up first: most deltas continue a part that has one
                slot = self._slots.get(key) or self._slot(
                    key, _Slot("reasoning", rkind=chunk.reasoning_kind)
                )
                if chunk.text:
                    slot.buf.append(chunk.text)
                if chunk.signature is not None:
                    slot.signature = chunk.signature
                if chunk.redacted:
                    slot.redacted = True
            case TextDelta():
                key = ("text", chunk.index)
                slot = self._slots.get(key) or self._slot(key, _Slot("text"))
                if chunk.text:
                    slot.buf.append(chunk.text)
            case ToolCallStart():
                self._slot(("tool", chunk.call_id), _Slot("tool", name=chunk.name))
            case ToolCallDelta():
                self._started_call(chunk).buf.append(chunk.arguments_delta)
            case ToolCallEnd():
                self._started_call(chunk)
            case ContinuityChunk():
                self._continuity_seq += 1
                slot = self._slot(("continuity", self._continuity_seq), _Slot("continuity"))
                slot.value = chunk.block
            case UsageChunk():
                for name in (
                    "input_tokens",
                    "output_tokens",
                    "reasoning_tokens",
                    "cache_read_tokens",
                    "cache_write_tokens",
                ):
                    value = getattr(chunk, name)
                    if value is not None:
                        self._usage[name] = value
            case ResponseInfoChunk():
                # bounded and plain, or not kept: a provider chooses them (ADR 0168)
                self._response_id = provider_id(chunk.response_id) or self._response_id
                self._response_model = provider_id(chunk.model) or self._response_model
            case FinishChunk():
                self._finish = chunk.reason
                self._raw_finish = provider_id(chunk.raw_reason) or ""
            case _:
                assert_never(chunk)

    def _started_call(self, chunk: ToolCallDelta | ToolCallEnd) -> _Slot:
        """The slot of a tool call that started; a chunk for any other is an adapter bug, which
        must not invent a call the model never made."""
        slot = self._slots.get(("tool", chunk.call_id))
        if slot is None:
            raise ChunkOrderError(
                f"{chunk.kind} for tool call {chunk.call_id!r}, which never started"
            )
        return slot

    def feed_all(self, chunks: Iterable[Chunk]) -> TurnAccumulator:
        for chunk in chunks:
            self.feed(chunk)
        return self

    def _parts(self) -> tuple[Part, ...]:
        parts: list[Part] = []
        for key in self._order:
            slot = self._slots[key]
            if slot.tag == "reasoning":
                parts.append(
                    ReasoningPart(
                        "".join(slot.buf),
                        reasoning_kind=slot.rkind,
                        provider=self.provider,
                        model=self.model,
                        signature=slot.signature,
                        redacted=slot.redacted,
                        index=key[1][1],
                    )
                )
            elif slot.tag == "text":
                parts.append(TextPart("".join(slot.buf)))
            elif slot.tag == "tool":
                name = provider_id(slot.name) or BAD_TOOL_NAME  # every reader sees both
                arguments = "".join(slot.buf) or "{}"
                parts.append(ToolCallPart(_call_id(key[1]), name, arguments_json=arguments))
            elif slot.value is not None:
                # Stamp the producing adapter's identity: carriers only go back to it.
                parts.append(replace(slot.value, provider=self.provider, model=self.model))
        return tuple(parts)

    @property
    def usage(self) -> Usage:
        return Usage(**self._usage)

    def _turn(self, *, complete: bool, finish_reason: FinishReason | None) -> Turn:
        return Turn(
            self._parts(),
            usage=self.usage,
            finish_reason=finish_reason,
            raw_finish_reason=self._raw_finish,
            provider=self.provider,
            model=self.model,
            complete=complete,
            response_id=self._response_id,
            response_model=self._response_model,
        )

    def partial(self) -> Turn:
        """What has arrived so far, marked incomplete."""
        return self._turn(complete=False, finish_reason=self._finish)

    def finish(self) -> Turn:
        """The finished turn; a stream that never said why it stopped counts as ``stop``."""
        return self._turn(complete=True, finish_reason=self._finish or "stop")


# --------------------------------------------------------------------------- JSON round trip


def part_to_dict(part: Part) -> dict[str, Any]:
    """A JSON-ready dict for a part (used by the event log and history rebuilding)."""
    match part:
        case TextPart():
            return {"kind": "text", "text": part.text}
        case ReasoningPart():
            return {
                "kind": "reasoning",
                "text": part.text,
                "reasoning_kind": part.reasoning_kind,
                "provider": part.provider,
                "model": part.model,
                "signature": part.signature,
                "redacted": part.redacted,
                "index": part.index,
            }
        case ContinuityBlock():
            return {
                "kind": "continuity",
                "carrier": part.carrier,
                "data": dict(part.data),
                "provider": part.provider,
                "model": part.model,
            }
        case ToolCallPart():
            return {
                "kind": "tool_call",
                "call_id": part.call_id,
                "name": part.name,
                "arguments_json": part.arguments_json,
            }
        case ToolResultPart():
            return {
                "kind": "tool_result",
                "call_id": part.call_id,
                "content": part.content,
                "is_error": part.is_error,
                "name": part.name,
            }
        case _:
            assert_never(part)


def part_from_dict(data: Mapping[str, Any]) -> Part:
    """Inverse of :func:`part_to_dict`; an unknown kind is a ``ValueError``."""
    kind = data.get("kind")
    if kind == "text":
        return TextPart(str(data["text"]))
    if kind == "reasoning":
        return ReasoningPart(
            str(data.get("text", "")),
            reasoning_kind=data.get("reasoning_kind", "raw"),
            provider=str(data.get("provider", "")),
            model=str(data.get("model", "")),
            signature=data.get("signature"),
            redacted=bool(data.get("redacted", False)),
            index=int(data.get("index", 0)),
        )
    if kind == "continuity":
        return ContinuityBlock(
            str(data["carrier"]),
            dict(data["data"]),
            provider=str(data.get("provider", "")),
            model=str(data.get("model", "")),
        )
    if kind == "tool_call":
        return ToolCallPart(
            str(data["call_id"]),
            str(data["name"]),
            arguments_json=str(data.get("arguments_json", "{}")),
        )
    if kind == "tool_result":
        return ToolResultPart(
            str(data["call_id"]),
            str(data["content"]),
            is_error=bool(data.get("is_error", False)),
            name=str(data.get("name", "")),
        )
    raise ValueError(f"unknown part kind {kind!r}")
