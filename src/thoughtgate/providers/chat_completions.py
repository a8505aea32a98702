"""The Chat Completions wire format shared by OpenRouter and OpenAI-compatible servers.

:class:`ChatChunkParser` turns ``chat.completion.chunk`` objects into normalized chunks. Adapters
subclass it to capture their reasoning fields (``reasoning_details``, ``reasoning``,
``reasoning_content``, inline ``<think>``) and to emit their continuity block at the end of a turn.
A non-streamed ``chat.completion`` is parsed by feeding its ``message`` as one delta, so streamed
and non-streamed turns go through the same code and give identical records.

Wire facts encoded here (``docs/providers/openrouter.md``, ``docs/providers/openai-compatible.md``):

* ``tool_calls`` deltas are keyed by ``index``; the first fragment carries ``id`` and
  ``function.name``, later ones only ``function.arguments`` pieces;
* usage arrives in a late chunk (``choices: []`` on OpenAI/DeepSeek/vLLM/DashScope/Together/
  Azure, an empty delta on OpenRouter) with ``completion_tokens_details.reasoning_tokens`` where
  the server counts them, or ``usage.reasoning_tokens`` on SGLang-served APIs (Together);
* Azure OpenAI opens a stream with a chunk that has ``choices: []``, an empty ``id`` and
  ``prompt_filter_results``, and adds ``content_filter_results`` to every choice: read past;
* a payload with a top-level ``error`` (or an ``error`` on its choice, or ``finish_reason:
  "error"``) is an in-stream error (the HTTP status already said 200). Whatever else that payload
  carries -- usage above all, which OpenRouter sends in the same chunk -- is read first, so the
  partial turn keeps the tokens the failed request cost;
* ``data: [DONE]`` ends the stream; bytes after it are read and ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from thoughtgate.errors import (
    MalformedResponseError,
    ProviderError,
    ProviderStreamError,
    identifier,
)
from thoughtgate.providers.base import ToolSpec, TurnRequest
from thoughtgate.providers.described import measure_of, shape_of
from thoughtgate.providers.endpoints import apply_extra
from thoughtgate.providers.history import tool_results
from thoughtgate.providers.http import stream_error
from thoughtgate.providers.think_tags import Piece, ThinkTagSplitter
from thoughtgate.providers.wire import HTTPProvider, JSONEventParser
from thoughtgate.types import (
    Chunk,
    FinishChunk,
    FinishReason,
    Message,
    ReasoningDelta,
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
    "CHAT_PATH",
    "AssistantExtra",
    "ChatChunkParser",
    "ChatCompletionsProvider",
    "build_chat_messages",
    "chat_body",
    "chat_finish_reason",
    "chat_tools",
    "chat_usage",
]

CHAT_PATH = "chat/completions"

_OUTPUT_KEYS = (
    "reasoning_content",
    "reasoning",
    "reasoning_details",
    "refusal",
    "function_call",
    "audio",
)
"""A delta's fields besides ``content`` and ``tool_calls`` whose value is the model's output
(the SDK's ``ChoiceDelta``, and the reasoning fields servers add): a chunk with one of them, or
a ``finish_reason``, or ``usage``, is progress; a chunk of empty deltas, of ``role`` alone or of
fields no one defines is not (ADR 0161)."""

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
    "error": "error",
}


def chat_finish_reason(raw: str | None, *, has_tool_calls: bool) -> FinishReason:
    """Normalize ``finish_reason``. Some servers (older Ollama, some vLLM parsers) say ``stop`` on
    a turn that made tool calls; the normalized reason is then ``tool_calls`` (the raw word is
    kept beside it)."""
    if raw is None:
        return "tool_calls" if has_tool_calls else "stop"
    reason = _FINISH.get(raw, "other")
    if reason == "stop" and has_tool_calls:
        return "tool_calls"
    return reason


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def chat_usage(usage: Mapping[str, Any], *, reasoning_in_output: bool = True) -> UsageChunk:
    """``usage`` of a chat completion (OpenAI, OpenRouter, DeepSeek, vLLM, Ollama shapes).

    ``reasoning_in_output`` false (xAI) means ``completion_tokens`` does not count the reasoning
    tokens, so the output total is their sum, as it is billed.
    """
    details = usage.get("completion_tokens_details")
    prompt_details = usage.get("prompt_tokens_details")
    reasoning = _int(details.get("reasoning_tokens")) if isinstance(details, Mapping) else None
    if reasoning is None:  # SGLang-served APIs (Together) count it at the top of ``usage``
        reasoning = _int(usage.get("reasoning_tokens"))
    cached = (
        _int(prompt_details.get("cached_tokens")) if isinstance(prompt_details, Mapping) else None
    )
    if cached is None:
        cached = _int(usage.get("prompt_cache_hit_tokens"))  # DeepSeek's own field
    output = _int(usage.get("completion_tokens"))
    if not reasoning_in_output and output is not None and reasoning:
        output += reasoning
    return UsageChunk(
        input_tokens=_int(usage.get("prompt_tokens")),
        output_tokens=output,
        reasoning_tokens=reasoning,
        cache_read_tokens=cached,
    )


@dataclass(slots=True)
class _ToolCall:
    """One tool call being assembled from ``tool_calls[index]`` fragments."""

    index: int
    call_id: str = ""
    name: str = ""
    pending_args: list[str] = field(default_factory=list)
    started: bool = False


class ChatChunkParser(JSONEventParser):
    """Chat completion chunks in, normalized chunks out. One instance per turn.

    Subclasses override the hooks :meth:`reasoning_chunks`, :meth:`content_chunks`,
    :meth:`flush_content` and :meth:`continuity_chunks`. ``capture`` is false in ``hidden`` mode:
    then hooks must drop every piece of reasoning (nothing is captured, nothing goes back).
    """

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        capture: bool,
        lenient_end: bool = False,
        reasoning_in_output: bool = True,
        splitter: ThinkTagSplitter | None = None,
    ) -> None:
        self.splitter = splitter
        """Splits inline ``<think>`` reasoning out of ``content`` (``None``: content is answer)."""
        self.provider = provider
        self.model = model
        self.capture = capture
        self.lenient_end = lenient_end
        self.reasoning_in_output = reasoning_in_output
        self.done = False
        """``[DONE]`` (or the end of a whole body) was read, or the stream reported an error:
        what follows is read and ignored."""
        self.failure: ProviderError | None = None
        self.finish_raw: str | None = None
        self.native_finish: str | None = None
        self.error: ProviderStreamError | None = None
        """An in-stream error: raised by the caller once the chunks of its payload are out."""
        self.progress = 0
        self._calls: dict[int, _ToolCall] = {}
        self._info_seen = False
        self._stray_beside: Mapping[str, Any] | None = None
        """The delta whose reasoning came in a field of its own (see :meth:`leave_stray_think`)."""

    # ------------------------------------------------------------------ hooks

    def reasoning_chunks(self, delta: Mapping[str, Any]) -> list[Chunk]:
        return []

    def content_chunks(self, content: str) -> list[Chunk]:
        if self.splitter is None:
            return [TextDelta(content)] if content else []
        return self._pieces(self.splitter.feed(content))

    def flush_content(self) -> list[Chunk]:
        return [] if self.splitter is None else self._pieces(self.splitter.flush())

    def interrupted(self) -> list[Chunk]:
        """The stream broke: the characters the think-tag splitter holds back (a suffix that
        could still have become a tag) go to its current channel -- reasoning inside an open
        ``<think>`` -- so the partial turn keeps them, on the right side."""
        return self.flush_content()

    def tag_reasoning(self, text: str) -> list[Chunk]:
        """Reasoning the splitter found in ``content``: a raw reasoning delta when captured;
        ``hidden``: dropped here, before anyone sees it."""
        return [ReasoningDelta(text, reasoning_kind="raw", index=0)] if self.capture else []

    def _pieces(self, pieces: Sequence[Piece]) -> list[Chunk]:
        out: list[Chunk] = []
        for piece in pieces:
            if piece.channel == "reasoning":
                if piece.text:
                    out += self.tag_reasoning(piece.text)
            elif piece.text:
                out.append(TextDelta(piece.text))
        return out

    def continuity_chunks(self) -> list[Chunk]:
        return []

    def leave_stray_think(self, delta: Mapping[str, Any]) -> None:
        """``delta`` brings reasoning in a field of its own: a bare ``<think>`` in ``content``
        opened nothing. Left now for one that came in an earlier delta (Together sends it
        first), and again once this delta's ``content`` is read, for one that came beside the
        field: either way the block is left only if it holds no text, so reasoning written
        inline after the tag stays reasoning (ADR 0161)."""
        if self.splitter is not None:
            self.splitter.leave_empty_block()
            self._stray_beside = delta

    # ------------------------------------------------------------------ parsing

    def _response_info(self, data: Mapping[str, Any]) -> list[Chunk]:
        """The completion's ``id`` and answering ``model``, from the first chunk that has them
        (every chunk of a stream repeats them)."""
        if self._info_seen:
            return []
        rid, model = data.get("id"), data.get("model")
        rid = rid if isinstance(rid, str) and rid else None
        model = model if isinstance(model, str) and model else None
        if rid is None and model is None:
            return []
        self._info_seen = True
        return [ResponseInfoChunk(response_id=rid, model=model)]

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._calls)

    def _malformed(self, what: str, value: Any) -> MalformedResponseError:
        return MalformedResponseError(
            f"{what}: it is {shape_of(value)}",
            provider=self.provider,
            detail=f"it is {measure_of(value)}",  # a length for developers only (ADR 0169)
        )

    @property
    def finished(self) -> bool:
        return self.done and self.error is None

    def done_marker(self) -> list[Chunk]:
        return self._done()

    def feed_event(self, data: Mapping[str, Any]) -> list[Chunk]:
        """One ``chat.completion.chunk`` object. An error it reports is left in :attr:`error`
        after its other contents (usage) have been read; what follows it is read and ignored."""
        if data.get("error"):
            self.error = stream_error(self.provider, data)
        out: list[Chunk] = [] if self._info_seen else self._response_info(data)
        choices = data.get("choices") or []
        if not isinstance(choices, list):
            raise self._malformed("choices is not a list", choices)
        for choice in choices:
            # type() first: a decoded event holds dicts, and an ABC's isinstance is slow
            if type(choice) is not dict and not isinstance(choice, Mapping):
                raise self._malformed("choice is not an object", choice)
            if (_int(choice.get("index")) or 0) != 0:
                continue  # we always ask for one choice
            delta = choice.get("delta") or {}
            if type(delta) is not dict and not isinstance(delta, Mapping):
                raise self._malformed("delta is not an object", delta)
            out += self.reasoning_chunks(delta)
            content = delta.get("content")
            if isinstance(content, str):
                out += self.content_chunks(content)
                if self._stray_beside is delta and self.splitter is not None:
                    # a bare <think> in the same delta as the reasoning's own field opened
                    # nothing either: the answer after it is answer (ADR 0161)
                    self.splitter.leave_empty_block()
            elif content is not None:
                raise self._malformed("delta.content is not a string", content)
            calls = delta.get("tool_calls")
            out += self._tool_call_chunks(calls)
            if content or calls or any(delta.get(key) for key in _OUTPUT_KEYS):
                self.progress += 1
            if isinstance(choice.get("finish_reason"), str):
                self.progress += 1
                self.finish_raw = choice["finish_reason"]
            if isinstance(choice.get("native_finish_reason"), str):
                self.native_finish = choice["native_finish_reason"]
            if self.error is None and choice.get("error"):
                self.error = stream_error(self.provider, {"error": choice["error"]})
        usage = data.get("usage")
        if usage is not None and isinstance(usage, Mapping):
            self.progress += 1
            out.append(chat_usage(usage, reasoning_in_output=self.reasoning_in_output))
        if self.error is None and self.finish_raw == "error":
            named = identifier(self.native_finish)  # the provider's word: an identifier only
            native = f" (native_finish_reason {named})" if named else ""
            self.error = ProviderStreamError(
                f"the provider ended the response with finish_reason error{native}",
                provider=self.provider,
                error_type=self.native_finish or "error",
            )
        if self.error is not None:
            self.done = True  # read what follows; the error is raised at the end
        return out

    def _tool_call_chunks(self, fragments: Any) -> list[Chunk]:
        if fragments is None:
            return []
        if not isinstance(fragments, list):
            raise self._malformed("tool_calls is not a list", fragments)
        out: list[Chunk] = []
        for frag in fragments:
            if not isinstance(frag, Mapping):
                raise self._malformed("tool call fragment is not an object", frag)
            index = _int(frag.get("index"))
            if index is None:
                index = len(self._calls)
            call = self._calls.setdefault(index, _ToolCall(index))
            if isinstance(frag.get("id"), str) and frag["id"] and not call.call_id:
                call.call_id = frag["id"]
            function = frag.get("function") or {}
            if not isinstance(function, Mapping):
                raise self._malformed("tool call function is not an object", function)
            if isinstance(function.get("name"), str) and function["name"] and not call.name:
                call.name = function["name"]
            args = function.get("arguments")
            if isinstance(args, str) and args:
                call.pending_args.append(args)
            elif isinstance(args, Mapping):  # a few servers send parsed objects
                call.pending_args.append(json.dumps(args))
            if call.name:
                out += self._release(call)
        return out

    def _release(self, call: _ToolCall) -> list[Chunk]:
        out: list[Chunk] = []
        if not call.started:
            call.started = True
            call.call_id = call.call_id or f"call_{call.index}"
            out.append(ToolCallStart(call.call_id, call.name, index=call.index + 1))
        if call.pending_args:
            out.append(ToolCallDelta(call.call_id, "".join(call.pending_args)))
            call.pending_args.clear()
        return out

    def _done(self) -> list[Chunk]:
        """The turn is over (``[DONE]``, or the end of a non-streamed body)."""
        self.done = True
        out = self.flush_content()
        for index in sorted(self._calls):
            call = self._calls[index]
            out += self._release(call)
            out.append(ToolCallEnd(call.call_id))
        out += self.continuity_chunks()
        out.append(
            FinishChunk(
                chat_finish_reason(self.finish_raw, has_tool_calls=self.has_tool_calls),
                raw_reason=self.finish_raw or "",
            )
        )
        return out

    def end(self) -> list[Chunk]:
        """The body ended: the error it reported, if any; without ``[DONE]`` a cut stream, unless
        the server is known to omit it (``lenient_end``) and already said why the turn finished."""
        if self.error is not None:
            raise self.error
        if self.done:
            return []
        if self.lenient_end and self.finish_raw is not None:
            return self._done()
        raise ProviderStreamError(
            "the stream ended before `data: [DONE]`"
            + ("" if self.finish_raw else " and before any finish_reason"),
            provider=self.provider,
        )

    def whole(self, data: Mapping[str, Any]) -> list[Chunk]:
        """Normalized chunks of a non-streamed ``chat.completion`` (its message fed as one
        delta). An error the body reports is left for :meth:`end`, with the usage it carried."""
        if data.get("error") and not isinstance(data.get("choices"), list):
            return self.feed_event({"usage": data.get("usage"), "error": data["error"]})
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise MalformedResponseError(
                f"chat completion without choices: it is {shape_of(data)}",
                provider=self.provider,
            )
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, Mapping):
            raise MalformedResponseError(
                "choices[0].message is not an object", provider=self.provider
            )
        delta = dict(message)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            delta["tool_calls"] = [
                {"index": i, **c} if isinstance(c, Mapping) else c for i, c in enumerate(calls)
            ]
        fed: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "finish_reason": choice.get("finish_reason"),
        }
        for key in ("native_finish_reason", "error"):
            if key in choice:
                fed[key] = choice[key]
        chunks = self.feed_event(
            {
                "id": data.get("id"),
                "model": data.get("model"),
                "choices": [fed],
                "usage": data.get("usage"),
                "error": data.get("error"),
            }
        )
        if self.error is not None:
            return chunks
        return chunks + self._done()


# --------------------------------------------------------------------------- request side


def _assistant_message(message: Message) -> dict[str, Any]:
    calls = [p for p in message.parts if isinstance(p, ToolCallPart)]
    out: dict[str, Any] = {"role": "assistant", "content": message.text}
    if calls:
        out["tool_calls"] = [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments_json},
            }
            for c in calls
        ]
    return out


AssistantExtra = Callable[[int, Message], Mapping[str, Any]]
"""``(index in request.messages, message) -> fields`` added to an assistant message."""


def build_chat_messages(
    request: TurnRequest, assistant_extra: AssistantExtra | None = None
) -> list[dict[str, Any]]:
    """``messages`` for a chat completion.

    ``assistant_extra(index, message) -> dict`` adds adapter fields to an assistant message (its
    continuity block's fields); reasoning parts themselves are never sent, and reasoning text never
    goes into ``content``. Tool results become ``role: tool`` messages right after the call.
    """
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for i, msg in enumerate(request.messages):
        if msg.role == "assistant":
            entry = _assistant_message(msg)
            if assistant_extra is not None:
                entry.update(assistant_extra(i, msg))
            out.append(entry)
            continue
        for result in tool_results(msg):
            out.append({"role": "tool", "tool_call_id": result.call_id, "content": result.content})
        if any(isinstance(p, TextPart) for p in msg.parts):
            role = "system" if msg.role == "system" else "user"
            out.append({"role": role, "content": msg.text})
    return out


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


def chat_body(
    model: str, request: TurnRequest, messages: Sequence[Mapping[str, Any]], *, stream: bool
) -> dict[str, Any]:
    """The fields every chat adapter sends; adapters add their reasoning fields."""
    body: dict[str, Any] = {"model": model, "messages": list(messages), "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    body["max_tokens"] = request.max_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.tools:
        body["tools"] = chat_tools(request.tools)
    return body


class ChatCompletionsProvider(HTTPProvider):
    """``POST {base}/chat/completions``: the wire format of OpenRouter and OpenAI-compatible
    servers. An endpoint's subclass adds its reasoning fields (:meth:`shape_reasoning`), what
    goes back on assistant messages (:meth:`assistant_extra`) and its parser."""

    def wire_path(self, base_url: str) -> str:
        return CHAT_PATH

    def assistant_extra(self, request: TurnRequest) -> AssistantExtra | None:
        return None

    def shape_reasoning(self, body: dict[str, Any], request: TurnRequest, *, stream: bool) -> None:
        """Add the endpoint's reasoning fields to ``body``."""

    def build_body(self, request: TurnRequest, *, stream: bool) -> dict[str, Any]:
        messages = build_chat_messages(request, self.assistant_extra(request))
        body = chat_body(self.model, request, messages, stream=stream)
        self.shape_reasoning(body, request, stream=stream)
        return apply_extra(body, self.settings)  # settings.extra: body fields the user adds
