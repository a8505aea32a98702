"""OpenAI Responses API adapter (``POST {base}/responses``): summaries, raw text, encrypted items.

Request shaping (``docs/providers/openai.md``; O-SDK ``types/shared/reasoning.py``), from the
model's row in :data:`thoughtgate.providers.rules.RESPONSES_RULES`:

* reasoning wanted, on a reasoning model: ``reasoning: {"summary": "auto", "effort"?: E}`` and
  ``include: ["reasoning.encrypted_content"]``. Models that do not reason (gpt-4o, gpt-4.1, …)
  and unknown models get no reasoning parameter at all: the live API rejects them there;
* ``hidden``: no ``summary`` and no ``include``; the row's switch (``reasoning: {"effort":
  "none"}`` from gpt-5.1) where the model has one, else ``reasoning: {"effort": E}`` only when an
  effort was set; whatever reasoning still arrives is dropped;
* always ``store: false`` (the encrypted item carries the state, nothing is kept at OpenAI) and
  function tools with ``strict: false`` (the API defaults to strict schemas).

Capture (``docs/providers/openai.md``):

* ``response.reasoning_summary_text.delta`` → reasoning of kind ``summary`` where the row vouches
  for it (OpenAI's and Azure's API, ``summary_servers``), else ``raw`` -- Ollama, for one, sends a
  thinking model's raw reasoning as summary text (ADR 0078) --, index = ``summary_index`` (offset
  past the parts of earlier reasoning items of the same response);
* ``response.reasoning_text.delta`` → kind ``raw`` (index = ``content_index``, offset likewise);
* ``response.output_text.delta`` → answer text; ``function_call`` items with
  ``response.function_call_arguments.delta`` → tool calls;
* inline ``<think>…</think>`` in ``output_text`` (a model served without a reasoning parser, as
  vLLM or llama.cpp serve ``/v1/responses``) → reasoning of kind ``raw``, split per content part
  by :mod:`thoughtgate.providers.think_tags` however the deltas are cut: option ``think_tags``,
  ``off`` by default on OpenAI's own API, ``leading`` on any other server (ADR 0077). Each
  message item's tag reasoning is one part, indexed after the raw parts of earlier reasoning
  items; it is recorded as reasoning and never sent back as the assistant's text;
* ``response.output_item.done`` of a reasoning item with ``encrypted_content`` → an ``encrypted``
  reasoning part and a :class:`ContinuityChunk` ``openai.reasoning_item`` whose data is
  ``{"item": <the exact item from output_item.done>, "next_item": {type, id, call_id?} | None}``.
  The block is emitted when the next output item starts (or at the end), because the API pairs a
  reasoning item with the item that followed it, by that item's id;
* ``response.completed`` → usage (``output_tokens_details.reasoning_tokens``) and the finish;
  ``response.incomplete`` → finish ``length`` (``max_output_tokens``) or ``content_filter``;
  ``error`` events (nested ``{"error": {"type", "code", "message"}}`` as the live API sends them,
  or flat as documented) and ``response.failed`` → :class:`ProviderStreamError` with the
  provider's message, type and code, raised once the stream has been read to its end (the
  ``response.failed`` that follows an ``error`` adds its usage, never a vaguer message); a
  stream that ends before any of them → :class:`ProviderStreamError` (the caller keeps the
  partial turn);
* each ``.done`` event carries the full text: when no delta was seen for a part, the ``.done`` text
  is emitted instead, which is also how a non-streamed response is parsed (as ``added`` + ``done``
  per output item), so both paths build identical turns. Unknown event types are skipped.

Multi-turn input: messages become ``input`` items; tool results become ``function_call_output``.
Inside the running tool loop each reasoning block goes back as its exact item immediately before
the item that followed it, and that item is sent with its original ``id``; anywhere else items are
sent without ids, so no pairing is demanded. Reasoning text is never rehydrated from parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from thoughtgate.errors import (
    MalformedResponseError,
    ProviderError,
    ProviderStreamError,
)
from thoughtgate.providers.base import Capabilities, ToolSpec, TurnRequest
from thoughtgate.providers.described import shape_of
from thoughtgate.providers.endpoints import apply_extra, merge_body
from thoughtgate.providers.history import current_loop_start, tool_results
from thoughtgate.providers.http import stream_error
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.providers.think_tags import (
    Delimiters,
    Piece,
    ThinkTags,
    ThinkTagSplitter,
    splitter_for,
)
from thoughtgate.providers.wire import JSONEventParser, VendorFormatProvider
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
    UsageChunk,
)

__all__ = [
    "CARRIER",
    "DEFAULT_BASE_URL",
    "EVENT_TYPES",
    "RESPONSES_PATH",
    "OpenAIResponsesProvider",
    "ResponsesEventParser",
    "build_input",
    "responses_tools",
]

_ENDPOINT: Final = ENDPOINTS["openai"]
DEFAULT_BASE_URL = _ENDPOINT.default_base_url
RESPONSES_PATH = "responses"

EVENT_TYPES: Final = frozenset(
    {
        "error",
        "response.audio.delta",
        "response.audio.done",
        "response.audio.transcript.delta",
        "response.audio.transcript.done",
        "response.code_interpreter_call.completed",
        "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.done",
        "response.compaction.compacting",
        "response.completed",
        "response.content_part.added",
        "response.content_part.done",
        "response.created",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.failed",
        "response.file_search_call.completed",
        "response.file_search_call.in_progress",
        "response.file_search_call.searching",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.image_generation_call.completed",
        "response.image_generation_call.generating",
        "response.image_generation_call.in_progress",
        "response.image_generation_call.partial_image",
        "response.in_progress",
        "response.incomplete",
        "response.mcp_call.completed",
        "response.mcp_call.failed",
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done",
        "response.mcp_list_tools.completed",
        "response.mcp_list_tools.failed",
        "response.mcp_list_tools.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.output_text.annotation.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.queued",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.refusal.delta",
        "response.refusal.done",
        "response.shell_call_command.added",
        "response.shell_call_command.delta",
        "response.shell_call_command.done",
        "response.shell_call_output_content.delta",
        "response.shell_call_output_content.done",
        "response.web_search_call.completed",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
    }
)
"""The stream's event types, as the SDK's ``ResponseStreamEvent`` lists them: reading one is
progress, whether this parser reads it or skips it (a hosted tool's ``searching``); a type not
listed is not (ADR 0161)."""
CARRIER = "openai.reasoning_item"

_INCOMPLETE: dict[str, FinishReason] = {
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parts(value: Any) -> list[Any]:
    """An item's ``summary`` or ``content`` parts: a value that is not a list holds none (as a
    part that is not an object is skipped), instead of failing the turn with a ``TypeError``."""
    return value if isinstance(value, list) else []


def responses_usage(usage: Mapping[str, Any]) -> UsageChunk:
    out_details = usage.get("output_tokens_details")
    in_details = usage.get("input_tokens_details")
    return UsageChunk(
        input_tokens=_int(usage.get("input_tokens")),
        output_tokens=_int(usage.get("output_tokens")),
        reasoning_tokens=(
            _int(out_details.get("reasoning_tokens")) if isinstance(out_details, Mapping) else None
        ),
        cache_read_tokens=(
            _int(in_details.get("cached_tokens")) if isinstance(in_details, Mapping) else None
        ),
    )


@dataclass(slots=True)
class _Item:
    """An output item while its events arrive."""

    type: str
    id: str
    call_id: str = ""
    name: str = ""
    ordinal: int = 0
    seen: set[tuple[str, int]] = field(default_factory=set)
    """(channel, part index) pairs that received at least one delta."""


class ResponsesEventParser(JSONEventParser):
    """Responses stream events in, normalized chunks out. One instance per turn."""

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        capture: bool,
        think_tags: ThinkTags = "off",
        think_delimiters: Delimiters | None = None,
        summaries: bool = False,
    ) -> None:
        self.provider = provider
        self.model = model
        self.capture = capture
        self.summaries = summaries
        """Summary text is a provider-written summary (the server vouches for it); else it is
        labelled ``raw``, and never reaches end users as a provider summary."""
        self.done = False
        self.progress = 0
        self.response_id: str | None = None
        self._model_seen = False
        self._items: dict[int, _Item] = {}
        self._reasoning_count = 0
        self._summary_base = 0
        self._raw_base = 0
        self._pending: dict[str, Any] | None = None
        self._has_calls = False
        self._refusal = False
        self.error: ProviderStreamError | None = None
        """The stream's error, raised at its end (nothing after it is lost)."""
        self.failure: ProviderError | None = None
        self.think_tags: ThinkTags = think_tags
        self.think_delimiters = think_delimiters
        self._splitters: dict[tuple[int, int], ThinkTagSplitter | None] = {}
        """Per ``(output_index, content_index)`` of ``output_text``: its splitter, or ``None``
        once it has settled (the rest of that part is answer as it comes)."""
        self._plain_index = self._plain_k = -1
        """The part whose splitter settled last: its deltas skip the table (the hot path)."""
        self._tag_index: dict[int, int] = {}
        """Per ``output_index``: the raw reasoning index of the tags found in that item."""

    @property
    def finished(self) -> bool:
        return self.done and self.error is None

    # ------------------------------------------------------------------ helpers

    def _malformed(self, what: str) -> MalformedResponseError:
        return MalformedResponseError(what, provider=self.provider)

    def _item(self, event: Mapping[str, Any]) -> _Item | None:
        index = _int(event.get("output_index"))
        return None if index is None else self._items.get(index)

    def _flush_pending(self, follower: Mapping[str, Any] | None) -> list[Chunk]:
        if self._pending is None:
            return []
        next_item: dict[str, Any] | None = None
        if follower is not None and isinstance(follower.get("id"), str):
            next_item = {"type": follower.get("type"), "id": follower["id"]}
            if isinstance(follower.get("call_id"), str):
                next_item["call_id"] = follower["call_id"]
        block = ContinuityBlock(
            CARRIER,
            {"item": self._pending, "next_item": next_item},
            provider=self.provider,
            model=self.model,
        )
        self._pending = None
        return [ContinuityChunk(block)]

    def _reasoning(self, text: str, kind: str, index: int) -> list[Chunk]:
        if not self.capture or not text:
            return []
        rkind: ReasoningKind = "summary" if kind == "summary" and self.summaries else "raw"
        return [ReasoningDelta(text, reasoning_kind=rkind, index=index)]

    # ------------------------------------------------------------------ events

    def done_marker(self) -> list[Chunk]:
        return []  # Responses sends no [DONE]; one is tolerated

    def feed_event(self, event: Mapping[str, Any]) -> list[Chunk]:
        etype = event.get("type")
        if not isinstance(etype, str):
            said = "without a type" if etype is None else "whose type is not a string"
            raise self._malformed(f"stream event {said}: it is {shape_of(event)}")
        if etype in EVENT_TYPES:
            self.progress += 1
        handler = _HANDLERS.get(etype)
        return handler(self, event) if handler is not None else []  # unknown events: skipped

    def whole(self, data: Mapping[str, Any]) -> list[Chunk]:
        """Chunks of a non-streamed Response: each output item as ``added`` then ``done``."""
        status = data.get("status")
        if status == "failed" or data.get("error"):
            chunks = self.feed_event({"type": "response.failed", "response": data})
            self.error = self.error or ProviderStreamError(
                "the response failed", provider=self.provider
            )
            return chunks
        output = data.get("output")
        if not isinstance(output, list):
            raise MalformedResponseError("response without an output list", provider=self.provider)
        chunks = self.feed_event({"type": "response.created", "response": data})
        for index, item in enumerate(output):
            event = {"output_index": index, "item": item}
            chunks += self.feed_event({"type": "response.output_item.added", **event})
            chunks += self.feed_event({"type": "response.output_item.done", **event})
        terminal = "response.incomplete" if status == "incomplete" else "response.completed"
        return chunks + self.feed_event({"type": terminal, "response": data})

    def _lifecycle(self, event: Mapping[str, Any]) -> list[Chunk]:
        """``response.created`` / ``in_progress`` / ``queued``: the response's id and model (the
        first time they are seen, as a :class:`ResponseInfoChunk`)."""
        response = event.get("response")
        if not isinstance(response, Mapping):
            return []
        rid, model = response.get("id"), response.get("model")
        rid = rid if isinstance(rid, str) and rid else None
        model = model if isinstance(model, str) and model else None
        if (rid is None and model is None) or (rid == self.response_id and self._model_seen):
            return []
        self.response_id = rid or self.response_id
        self._model_seen = self._model_seen or model is not None
        return [ResponseInfoChunk(response_id=rid, model=model)]

    def _item_added(self, event: Mapping[str, Any]) -> list[Chunk]:
        item = event.get("item")
        index = _int(event.get("output_index"))
        if not isinstance(item, Mapping) or index is None:
            raise self._malformed("response.output_item.added without item or output_index")
        out = self._flush_pending(item)
        kind = str(item.get("type"))
        entry = _Item(kind, str(item.get("id") or ""))
        self._items[index] = entry
        if kind == "function_call":
            entry.call_id = str(item.get("call_id") or entry.id or f"call_{index}")
            entry.name = str(item.get("name") or "")
            self._has_calls = True
            out.append(ToolCallStart(entry.call_id, entry.name, index=index))
        elif kind == "reasoning":
            entry.ordinal = self._reasoning_count
            self._reasoning_count += 1
        return out

    def _summary_delta(self, event: Mapping[str, Any]) -> list[Chunk]:
        item = self._item(event)
        k = _int(event.get("summary_index")) or 0
        if item is not None:
            item.seen.add(("summary", k))
        return self._reasoning(str(event.get("delta") or ""), "summary", self._summary_base + k)

    def _raw_delta(self, event: Mapping[str, Any]) -> list[Chunk]:
        item = self._item(event)
        k = _int(event.get("content_index")) or 0
        if item is not None:
            item.seen.add(("raw", k))
        return self._reasoning(str(event.get("delta") or ""), "raw", self._raw_base + k)

    def _text_delta(self, event: Mapping[str, Any]) -> list[Chunk]:
        index = _int(event.get("output_index")) or 0
        k = _int(event.get("content_index")) or 0
        item = self._items.get(index)
        if item is not None:
            item.seen.add(("text", k))
        delta = str(event.get("delta") or "")
        if not delta:
            return []
        if self.think_tags == "off" or (index == self._plain_index and k == self._plain_k):
            return [TextDelta(delta, index=index)]  # no splitter, or it has settled
        return self._answer(index, k, delta, last=False)

    def _refusal_delta(self, event: Mapping[str, Any]) -> list[Chunk]:
        self._refusal = True
        index = _int(event.get("output_index")) or 0
        item = self._items.get(index)
        if item is not None:
            item.seen.add(("text", _int(event.get("content_index")) or 0))
        delta = str(event.get("delta") or "")
        return [TextDelta(delta, index=index)] if delta else []  # the server's words: not split

    # -- inline <think> tags in output_text

    def _answer(self, index: int, k: int, text: str, *, last: bool) -> list[Chunk]:
        """Chunks of ``output_text`` of part ``k`` of item ``index``: answer text, and the
        reasoning its ``<think>`` tags hold (``last``: the part is complete, flush what is held)."""
        key = (index, k)
        if key in self._splitters:
            splitter = self._splitters[key]
        else:
            # the turn's first part, after no reasoning item and no call: the one a template opens
            first = not self._splitters and all(e.type == "message" for e in self._items.values())
            splitter = self._splitters[key] = splitter_for(
                self.think_tags, first=first, delimiters=self.think_delimiters
            )
        if splitter is None:
            return [TextDelta(text, index=index)] if text else []
        pieces = splitter.feed(text) if text else []
        if last:
            pieces += splitter.flush()
        if last or splitter.settled:
            self._splitters[key] = None
            self._plain_index, self._plain_k = index, k
        return self._pieces(index, pieces)

    def _pieces(self, index: int, pieces: Sequence[Piece]) -> list[Chunk]:
        out: list[Chunk] = []
        for piece in pieces:
            if not piece.text:
                continue
            if piece.channel == "text":
                out.append(TextDelta(piece.text, index=index))
            elif self.capture:  # hidden: dropped here, before anyone sees it
                if index not in self._tag_index:
                    self._tag_index[index] = self._raw_base
                    self._raw_base += 1
                out.append(
                    ReasoningDelta(piece.text, reasoning_kind="raw", index=self._tag_index[index])
                )
        return out

    def _flush_splitters(self, index: int | None = None) -> list[Chunk]:
        """What the open splitters hold (of item ``index``, or all): an unclosed ``<think>`` is
        reasoning to its end, never answer."""
        out: list[Chunk] = []
        for key, splitter in list(self._splitters.items()):
            if splitter is not None and (index is None or key[0] == index):
                out += self._answer(key[0], key[1], "", last=True)
        return out

    def interrupted(self) -> list[Chunk]:
        """The stream broke: what the splitters hold goes to its channel (reasoning if a
        ``<think>`` is open), so the partial turn keeps it, and on the right side."""
        return self._flush_splitters()

    def _args_delta(self, event: Mapping[str, Any]) -> list[Chunk]:
        item = self._item(event)
        if item is None or item.type != "function_call":
            raise self._malformed("function_call_arguments.delta for an unknown output item")
        item.seen.add(("args", 0))
        delta = str(event.get("delta") or "")
        return [ToolCallDelta(item.call_id, delta)] if delta else []

    def _item_done(self, event: Mapping[str, Any]) -> list[Chunk]:
        item = event.get("item")
        index = _int(event.get("output_index"))
        if not isinstance(item, Mapping) or index is None:
            raise self._malformed("response.output_item.done without item or output_index")
        entry = self._items.get(index)
        if entry is None:  # no .added seen: treat .done as both
            out = self._item_added(event)
            entry = self._items[index]
        else:
            out = []
        kind = entry.type
        if kind == "reasoning":
            out += self._reasoning_done(item, entry)
        elif kind == "function_call":
            args = item.get("arguments")
            if ("args", 0) not in entry.seen and isinstance(args, str) and args:
                out.append(ToolCallDelta(entry.call_id, args))
            out.append(ToolCallEnd(entry.call_id))
        elif kind == "message":
            for k, part in enumerate(_parts(item.get("content"))):
                if not isinstance(part, Mapping) or ("text", k) in entry.seen:
                    continue
                if part.get("type") == "refusal":
                    self._refusal = True
                    refusal = part.get("refusal")
                    if isinstance(refusal, str) and refusal:
                        out.append(TextDelta(refusal, index=index))
                    continue
                text = part.get("text")
                if isinstance(text, str) and text:
                    out += self._answer(index, k, text, last=True)
            out += self._flush_splitters(index)
        return out

    def _reasoning_done(self, item: Mapping[str, Any], entry: _Item) -> list[Chunk]:
        out: list[Chunk] = []
        summary = _parts(item.get("summary"))
        content = _parts(item.get("content"))
        for k, part in enumerate(summary):
            if ("summary", k) not in entry.seen and isinstance(part, Mapping):
                out += self._reasoning(
                    str(part.get("text") or ""), "summary", self._summary_base + k
                )
        for k, part in enumerate(content):
            if ("raw", k) not in entry.seen and isinstance(part, Mapping):
                out += self._reasoning(str(part.get("text") or ""), "raw", self._raw_base + k)
        seen_summary = [k for channel, k in entry.seen if channel == "summary"]
        seen_raw = [k for channel, k in entry.seen if channel == "raw"]
        self._summary_base += max([len(summary), *(k + 1 for k in seen_summary)])
        self._raw_base += max([len(content), *(k + 1 for k in seen_raw)])
        encrypted = item.get("encrypted_content")
        if self.capture and isinstance(encrypted, str) and encrypted:
            out.append(ReasoningDelta("", reasoning_kind="encrypted", index=entry.ordinal))
            self._pending = dict(item)
        return out

    def _finish(self, event: Mapping[str, Any], reason: FinishReason, raw: str) -> list[Chunk]:
        out = self._flush_splitters() + self._flush_pending(None)
        response = event.get("response")
        if isinstance(response, Mapping) and isinstance(response.get("usage"), Mapping):
            out.append(responses_usage(response["usage"]))
        out.append(FinishChunk(reason, raw_reason=raw))
        self.done = True
        return out

    def _completed(self, event: Mapping[str, Any]) -> list[Chunk]:
        self._lifecycle(event)
        reason: FinishReason = "tool_calls" if self._has_calls else "stop"
        if self._refusal and not self._has_calls:
            reason = "refusal"
        response = event.get("response")
        status = response.get("status") if isinstance(response, Mapping) else None
        return self._finish(event, reason, str(status or "completed"))

    def _incomplete(self, event: Mapping[str, Any]) -> list[Chunk]:
        response = event.get("response")
        details = response.get("incomplete_details") if isinstance(response, Mapping) else None
        why = details.get("reason") if isinstance(details, Mapping) else None
        why = str(why or "incomplete")
        return self._finish(event, _INCOMPLETE.get(why, "other"), why)

    def _failed(self, event: Mapping[str, Any]) -> list[Chunk]:
        response = event.get("response")
        response = response if isinstance(response, Mapping) else {}
        error = response.get("error")
        if self.error is None:
            if isinstance(error, Mapping) and error.get("message"):
                code = error.get("code")
                self.error = ProviderStreamError(
                    str(error["message"]),
                    provider=self.provider,
                    error_type=str(error.get("type") or code or "response.failed"),
                    code=str(code) if code else None,
                    by_provider=True,
                )
            else:
                self.error = ProviderStreamError(
                    "the response failed", provider=self.provider, error_type="response.failed"
                )
        self.done = True
        usage = response.get("usage")
        return [responses_usage(usage)] if isinstance(usage, Mapping) else []

    def _error(self, event: Mapping[str, Any]) -> list[Chunk]:
        if self.error is None:
            self.error = stream_error(self.provider, event)
        return []

    def end(self) -> list[Chunk]:
        if self.error is not None:
            raise self.error
        if self.done:
            return []
        raise ProviderStreamError(
            "the stream ended before response.completed", provider=self.provider
        )


_HANDLERS: dict[str, Any] = {
    "response.created": ResponsesEventParser._lifecycle,
    "response.in_progress": ResponsesEventParser._lifecycle,
    "response.queued": ResponsesEventParser._lifecycle,
    "response.output_item.added": ResponsesEventParser._item_added,
    "response.output_item.done": ResponsesEventParser._item_done,
    "response.reasoning_summary_text.delta": ResponsesEventParser._summary_delta,
    "response.reasoning_text.delta": ResponsesEventParser._raw_delta,
    "response.output_text.delta": ResponsesEventParser._text_delta,
    "response.refusal.delta": ResponsesEventParser._refusal_delta,
    "response.function_call_arguments.delta": ResponsesEventParser._args_delta,
    "response.completed": ResponsesEventParser._completed,
    "response.incomplete": ResponsesEventParser._incomplete,
    "response.failed": ResponsesEventParser._failed,
    "error": ResponsesEventParser._error,
}


# --------------------------------------------------------------------------- request side


def _replayed_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """A reasoning item as it goes back: its ``summary`` emptied and its ``content`` left out.

    The API needs the item (its id and ``encrypted_content``) and the field ``summary``
    (``Missing required parameter: 'input[i].summary'`` without it), not the text: OpenAI's
    model does not read a replayed summary, while a server that decodes the item itself (vLLM
    reads ``content`` or ``summary`` back as the model's reasoning) would put the text into the
    prompt. Reasoning text goes back only where an API demands it, and none demands this
    (ADR 0156)."""
    kept = {key: value for key, value in item.items() if key not in ("summary", "content")}
    kept["summary"] = []
    return kept


def _assistant_items(message: Message, *, replay: bool, provider: str, model: str) -> list[Any]:
    """Input items for one assistant message, in the order its parts were produced."""
    items: list[dict[str, Any]] = []
    follower: Mapping[str, Any] | None = None
    for part in message.parts:
        if isinstance(part, ContinuityBlock):
            ours = (part.carrier, part.provider, part.model) == (CARRIER, provider, model)
            if replay and ours and isinstance(part.data.get("item"), Mapping):
                items.append(_replayed_item(part.data["item"]))
                next_item = part.data.get("next_item")
                follower = next_item if isinstance(next_item, Mapping) else None
            continue
        if isinstance(part, TextPart) and part.text:
            if follower is not None and follower.get("type") == "message":
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "id": follower["id"],
                        "status": "completed",
                        "content": [{"type": "output_text", "text": part.text, "annotations": []}],
                    }
                )
            else:
                items.append({"role": "assistant", "content": part.text})
            follower = None
        elif isinstance(part, ToolCallPart):
            call: dict[str, Any] = {
                "type": "function_call",
                "call_id": part.call_id,
                "name": part.name,
                "arguments": part.arguments_json,
            }
            if (
                follower is not None
                and follower.get("type") == "function_call"
                and follower.get("call_id") == part.call_id
            ):
                call["id"] = follower["id"]
            items.append(call)
            follower = None
    return _paired(items)


def _paired(items: list[dict[str, Any]]) -> list[Any]:
    """Drop any reasoning item whose recorded follower is not right after it (the API would
    reject it: "provided without its required following item")."""
    out: list[Any] = []
    for i, item in enumerate(items):
        if item.get("type") == "reasoning":
            nxt = items[i + 1] if i + 1 < len(items) else None
            if nxt is None or "id" not in nxt or nxt.get("type") == "reasoning":
                continue
        out.append(item)
    return out


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


def build_input(request: TurnRequest, *, provider: str, model: str) -> list[Any]:
    """``input`` items for a Responses request."""
    items: list[Any] = []
    loop_start = current_loop_start(request.messages)
    for i, msg in enumerate(request.messages):
        if msg.role == "assistant":
            items += _assistant_items(msg, replay=i >= loop_start, provider=provider, model=model)
            continue
        for result in tool_results(msg):
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": result.call_id,
                    "output": result.content,
                }
            )
        if any(isinstance(p, TextPart) for p in msg.parts):
            role = "system" if msg.role == "system" else "user"
            items.append({"role": role, "content": msg.text})
    return items


class OpenAIResponsesProvider(VendorFormatProvider):
    """``openai:MODEL`` over ``POST {base}/responses``."""

    endpoint = _ENDPOINT

    def wire_path(self, base_url: str) -> str:
        return RESPONSES_PATH

    def wire_capabilities(self) -> Capabilities:
        return Capabilities(
            reasoning_text=self.rule.reasons,
            reasoning_summary=self.rule.reasons and self.rule.marks_summaries,
            continuity=self.rule.reasons,
            tools=True,
            notes={
                "reasoning_summary": "response.reasoning_summary_text.delta",
                "reasoning_text": "response.reasoning_text.delta (models exposing raw CoT)",
                "continuity": f"{CARRIER}: encrypted reasoning item + its follower id",
            },
        )

    def build_body(self, request: TurnRequest, *, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "input": build_input(request, provider=self.name, model=self.model),
            "stream": stream,
            "store": False,
            "max_output_tokens": request.max_tokens,
        }
        if request.system:
            body["instructions"] = request.system
        if request.tools:
            body["tools"] = responses_tools(request.tools)
        if request.temperature is not None:
            body["temperature"] = request.temperature
        reasoning = request.reasoning
        effort = reasoning.effort if self.rule.effort == "reasoning.effort" else None
        if reasoning.enabled:
            merge_body(body, self.rule.surface)
            if effort is not None:
                merge_body(body, {"reasoning": {"effort": effort}})
        elif self.rule.hidden is not None:
            merge_body(body, self.rule.hidden)
        elif effort is not None:
            body["reasoning"] = {"effort": effort}
        return apply_extra(body, self.settings)

    def parser(self, request: TurnRequest) -> ResponsesEventParser:
        return ResponsesEventParser(
            provider=self.name,
            model=self.model,
            capture=request.reasoning.enabled,
            think_tags=self.think_tags,
            think_delimiters=self.think_delimiters,
            summaries=self.rule.marks_summaries,
        )
