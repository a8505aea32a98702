"""OpenAI-compatible Chat Completions servers that return raw reasoning (DeepSeek, vLLM, Ollama, …).

Capture (PROVIDER_WIRE_FORMATS §4):

* field discovery: ``reasoning_content`` (DeepSeek, vLLM before the rename) is checked first, then
  ``reasoning`` (vLLM after PR #27752, Ollama's ``/v1`` endpoint, OpenRouter-style servers). The
  first field that carries text in a turn is the one read for the rest of that turn, so a server
  that sends both names with the same text (vLLM during its deprecation window) is never counted
  twice;
* inline ``<think>…</think>`` in ``content`` is split out by
  :mod:`thoughtgate.providers.think_tags`, whatever the chunking; an unclosed ``<think>`` at the
  end is reasoning, never answer text;
* ``usage.completion_tokens_details.reasoning_tokens`` where the server reports it.

Request shaping: nothing reasoning-specific is sent by default (DeepSeek thinks by default; vLLM
and Ollama decide per server or model). ``settings.extra`` fields go into the body as they are,
e.g. ``{"thinking": {"type": "enabled"}}`` or ``{"reasoning_effort": "high"}``; a request effort
is sent as ``reasoning_effort``. Adapter options live under ``settings.extra["thoughtgate"]``:

* ``dialect``: ``"deepseek"`` (default for api.deepseek.com and ``deepseek*`` models) sends
  ``thinking: {"type": "disabled"}`` in ``hidden`` mode; ``"qwen3"`` sends
  ``chat_template_kwargs: {"enable_thinking": false}`` (vLLM/SGLang serving Qwen3); ``"generic"``
  (default otherwise) sends nothing, because unknown fields are rejected by some servers. In every
  dialect ``hidden`` mode captures nothing: reasoning fields and think-tag text are dropped;
* ``think_tags`` (default true), ``starts_in_think`` (default false) for templates that inject
  ``<think>`` into the prompt;
* ``send_back`` (default true): see below; ``lenient_end`` (default true): accept a stream that
  ends after a ``finish_reason`` without ``data: [DONE]``.

Multi-turn: DeepSeek's thinking mode rejects a history whose tool-call turns lack
``reasoning_content`` (``400 The `reasoning_content` in the thinking mode must be passed back to the
API.``, also when it was empty; api-docs.deepseek.com/guides/thinking_mode: between two user
messages with a tool call, the reasoning "must be passed back ... in all subsequent requests").
So at the end of a tool-call turn (reasoning wanted) the adapter emits a :class:`ContinuityChunk`
``compat.reasoning_content`` holding ``{"reasoning_content": "<the turn's reasoning, maybe
empty>"}`` and sends it back on that assistant message, only to the same provider and model.
This is the one place reasoning text goes back to a model, because the API demands it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal
from urllib.parse import urlparse

import httpx

from thoughtgate.errors import ConfigError
from thoughtgate.providers.base import Capabilities, ProviderSettings, TurnRequest
from thoughtgate.providers.chat_completions import (
    CHAT_PATH,
    ChatChunkParser,
    build_chat_messages,
    chat_body,
    parse_chat_completion,
    stream_chat_completion,
)
from thoughtgate.providers.http import HTTPTransport
from thoughtgate.providers.openai_common import (
    adapter_options,
    apply_extra,
    matching_block,
    resolve_api_key,
    resolve_base_url,
)
from thoughtgate.providers.think_tags import ThinkTagSplitter
from thoughtgate.types import (
    Chunk,
    ContinuityBlock,
    ContinuityChunk,
    Message,
    ReasoningDelta,
    TextDelta,
    ToolCallPart,
    Turn,
    TurnAccumulator,
)

__all__ = ["CARRIER", "REASONING_FIELDS", "CompatParser", "OpenAICompatibleProvider"]

CARRIER = "compat.reasoning_content"
REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Discovery order of the reasoning field on ``delta`` / ``message``."""

Dialect = Literal["deepseek", "qwen3", "generic"]
_DIALECTS = ("deepseek", "qwen3", "generic")


class CompatParser(ChatChunkParser):
    """Reads one reasoning field, splits think tags, emits ``compat.reasoning_content``."""

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        capture: bool,
        think_tags: bool = True,
        starts_in_think: bool = False,
        send_back: bool = True,
        lenient_end: bool = True,
    ) -> None:
        super().__init__(provider=provider, model=model, capture=capture, lenient_end=lenient_end)
        self.field: str | None = None
        self.splitter = ThinkTagSplitter(starts_in_think=starts_in_think) if think_tags else None
        self.send_back = send_back
        self._reasoning: list[str] = []

    def _reason(self, text: str) -> list[Chunk]:
        if not text or not self.capture:
            return []  # hidden: dropped before anyone sees it
        self._reasoning.append(text)
        return [ReasoningDelta(text, reasoning_kind="raw", index=0)]

    def reasoning_chunks(self, delta: Mapping[str, Any]) -> list[Chunk]:
        if self.field is None:
            for name in REASONING_FIELDS:
                value = delta.get(name)
                if isinstance(value, str) and value:
                    self.field = name
                    break
        if self.field is None:
            return []
        value = delta.get(self.field)
        return self._reason(value) if isinstance(value, str) else []

    def content_chunks(self, content: str) -> list[Chunk]:
        if self.splitter is None:
            return [TextDelta(content)] if content else []
        return self._pieces(self.splitter.feed(content))

    def flush_content(self) -> list[Chunk]:
        return [] if self.splitter is None else self._pieces(self.splitter.flush())

    def _pieces(self, pieces: Any) -> list[Chunk]:
        out: list[Chunk] = []
        for piece in pieces:
            if piece.channel == "reasoning":
                out += self._reason(piece.text)
            elif piece.text:
                out.append(TextDelta(piece.text))
        return out

    def continuity_chunks(self) -> list[Chunk]:
        if not (self.capture and self.send_back and self.has_tool_calls):
            return []
        block = ContinuityBlock(
            CARRIER,
            {"reasoning_content": "".join(self._reasoning)},
            provider=self.provider,
            model=self.model,
        )
        return [ContinuityChunk(block)]


def _default_dialect(base_url: str, model: str) -> Dialect:
    """DeepSeek's API, or a DeepSeek model behind another host. Servers that do not know the
    ``thinking`` field (vLLM, Ollama, llama.cpp) ignore it, so guessing DeepSeek is harmless there,
    while guessing wrong the other way breaks hidden-mode tool loops on DeepSeek."""
    host = urlparse(base_url).hostname or ""
    deepseek = host.endswith("deepseek.com") or model.lower().startswith("deepseek")
    return "deepseek" if deepseek else "generic"


class OpenAICompatibleProvider:
    """``openai-compatible:MODEL`` over ``POST {base}/chat/completions`` of a compatible server."""

    name = "openai-compatible"

    def __init__(
        self,
        model: str,
        settings: ProviderSettings | None = None,
        *,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.model = model
        self.settings = settings or ProviderSettings()
        base_url = resolve_base_url(self.settings, "OPENAI_BASE_URL", None, provider=self.name)
        options = adapter_options(self.settings)
        dialect = options.get("dialect", _default_dialect(base_url, model))
        if dialect not in _DIALECTS:
            raise ConfigError("extra.thoughtgate.dialect", dialect, ", ".join(_DIALECTS))
        self.dialect: Dialect = dialect
        self.think_tags = bool(options.get("think_tags", True))
        self.starts_in_think = bool(options.get("starts_in_think", False))
        self.send_back = bool(options.get("send_back", True))
        self.lenient_end = bool(options.get("lenient_end", True))
        headers = {"accept": "application/json"}
        api_key = resolve_api_key(self.settings, "OPENAI_API_KEY")
        if api_key:  # local servers (vLLM, Ollama) often need none
            headers["authorization"] = f"Bearer {api_key}"
        self._http = HTTPTransport(self.name, base_url, headers, self.settings, client=client)
        self.capabilities = Capabilities(
            reasoning_text=True,
            reasoning_summary=False,
            continuity=self.send_back,
            tools=True,
            notes={
                "reasoning_text": "reasoning_content | reasoning field, or inline <think> tags",
                "continuity": f"{CARRIER} on tool-call turns (DeepSeek thinking mode)",
            },
        )

    def _assistant_extra(self, index: int, message: Message) -> dict[str, Any]:
        if not any(isinstance(p, ToolCallPart) for p in message.parts):
            return {}
        block = matching_block(message, CARRIER, provider=self.name, model=self.model)
        if block is None:
            return {}
        return {"reasoning_content": block.data.get("reasoning_content", "")}

    def build_body(self, request: TurnRequest, *, stream: bool) -> dict[str, Any]:
        extra = self._assistant_extra if self.send_back else None
        body = chat_body(self.model, request, build_chat_messages(request, extra), stream=stream)
        reasoning = request.reasoning
        if reasoning.enabled and reasoning.effort is not None:
            body["reasoning_effort"] = reasoning.effort
        if not reasoning.enabled:
            if self.dialect == "deepseek":
                body["thinking"] = {"type": "disabled"}
            elif self.dialect == "qwen3":
                body["chat_template_kwargs"] = {"enable_thinking": False}
        return apply_extra(body, self.settings)

    def _parser(self, request: TurnRequest) -> CompatParser:
        return CompatParser(
            provider=self.name,
            model=self.model,
            capture=request.reasoning.enabled,
            think_tags=self.think_tags,
            starts_in_think=self.starts_in_think,
            send_back=self.send_back,
            lenient_end=self.lenient_end,
        )

    async def stream(self, request: TurnRequest) -> AsyncIterator[Chunk]:
        body = self.build_body(request, stream=True)
        async for chunk in stream_chat_completion(self._http, body, self._parser(request)):
            yield chunk

    async def request(self, request: TurnRequest) -> Turn:
        data = await self._http.post_json(CHAT_PATH, self.build_body(request, stream=False))
        chunks = parse_chat_completion(data, self._parser(request))
        return TurnAccumulator(provider=self.name, model=self.model).feed_all(chunks).finish()

    async def aclose(self) -> None:
        await self._http.aclose()
