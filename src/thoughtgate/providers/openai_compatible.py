"""OpenAI-compatible Chat Completions servers that return raw reasoning (DeepSeek, Groq, vLLM, …).

What a server takes and gives is not guessed here: it is the server's row in
:data:`thoughtgate.providers.rules.COMPAT_RULES`, found from the base URL's host
(``api.deepseek.com``, ``api.groq.com``, ``api.cerebras.ai``, …) or named with the adapter option
``server``, with columns overridable from ``thoughtgate.toml``. Unknown servers get the
conservative row. See ``docs/providers/openai-compatible.md`` and ``docs/providers/endpoints.md``.

Capture (``docs/providers/openai-compatible.md``):

* field discovery in the row's order (``reasoning_content`` before ``reasoning`` by default); the
  first field that carries text in a turn is the one read for the rest of that turn, so a server
  that sends both names with the same text (vLLM during its deprecation window) is never counted
  twice;
* inline ``<think>…</think>`` in ``content`` is split out by
  :mod:`thoughtgate.providers.think_tags`, whatever the chunking (option ``think_tags``:
  ``anywhere`` by default, or ``leading`` / ``off``, per model as on every adapter, ADR 0077;
  ``true`` / ``false`` still mean ``anywhere`` / ``off``; another spelling per model with
  ``think_delimiters``, ADR 0157); an unclosed ``<think>`` at the
  end is reasoning, never answer text -- unless the reasoning then came in a field while that
  block was still empty (Together sends a bare ``<think>`` before its ``reasoning`` deltas), when
  the tag was a stray and what follows is the answer;
* ``usage.completion_tokens_details.reasoning_tokens`` where the server reports it (added to the
  output where the server leaves it out of ``completion_tokens``, as xAI does).

Request shaping from the row: its ``surface`` fields when reasoning is wanted, its effort parameter
when the request has an effort, and in ``hidden`` mode its switch (DeepSeek's
``thinking: {"type": "disabled"}`` only on DeepSeek's API, Qwen3's ``chat_template_kwargs`` on
vLLM, ...). Where the row says thinking only streams (DashScope's Qwen refuses
``enable_thinking`` on a request that is not streamed), a non-streamed request carries the switch
in every mode. ``settings.extra`` fields go into the body last. In every mode ``hidden`` captures no
reasoning: fields and think-tag text are dropped before any consumer sees them.

Multi-turn: what goes back on an assistant tool-call message is the row's ``send_back``:
``reasoning_content`` for DeepSeek and Kimi, whose thinking mode rejects a tool loop without it
(``400 The `reasoning_content` in the thinking mode must be passed back to the API.``), nothing
for Groq and Cerebras, which reject it (``property 'reasoning_content' is unsupported``). Where the
API requires it, the turn's reasoning is kept in memory as a :class:`ContinuityChunk`
``compat.reasoning_content`` in every mode, ``hidden`` included, and goes back only to the same
provider and model, inside the running loop; it is never recorded or displayed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from thoughtgate.providers.base import Capabilities, TurnRequest
from thoughtgate.providers.chat_completions import (
    AssistantExtra,
    ChatChunkParser,
    ChatCompletionsProvider,
)
from thoughtgate.providers.endpoints import merge_body
from thoughtgate.providers.history import matching_block
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.providers.think_tags import (
    Delimiters,
    ThinkTags,
    ThinkTagSplitter,
    check_think_delimiters,
    check_think_tags,
    make_splitter,
    think_delimiters_for,
    think_tags_for,
)
from thoughtgate.types import (
    Chunk,
    ContinuityBlock,
    ContinuityChunk,
    Message,
    ReasoningDelta,
    ToolCallPart,
)

__all__ = ["CARRIER", "REASONING_FIELDS", "CompatParser", "OpenAICompatibleProvider"]

CARRIER = "compat.reasoning_content"
REASONING_FIELDS = ("reasoning_content", "reasoning")
"""Discovery order of the reasoning field on ``delta`` / ``message`` (when the row names none)."""


def _splitter(
    mode: ThinkTags, starts_in_think: bool, delimiters: Delimiters | None
) -> ThinkTagSplitter | None:
    if mode == "off":
        return None
    opened = starts_in_think or mode == "opened"
    return make_splitter(
        starts_in_think=opened, leading_only=mode == "leading", delimiters=delimiters
    )


class CompatParser(ChatChunkParser):
    """Reads one reasoning field, splits think tags, emits ``compat.reasoning_content``.

    ``capture`` (surface / telemetry_only) emits reasoning chunks. ``carrier`` names the field the
    turn's reasoning goes back under (``None``: nothing goes back); ``carrier_required`` keeps it
    even when nothing is captured (``hidden``: in memory, for the loop); ``echo_only`` keeps it
    only when the server sent that same field.
    """

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        capture: bool,
        think_tags: bool | ThinkTags = True,
        starts_in_think: bool = False,
        think_delimiters: Delimiters | None = None,
        carrier: str | None = "reasoning_content",
        carrier_required: bool = False,
        echo_only: bool = False,
        fields: Sequence[str] = REASONING_FIELDS,
        lenient_end: bool = True,
        reasoning_in_output: bool = True,
    ) -> None:
        super().__init__(
            provider=provider,
            model=model,
            capture=capture,
            lenient_end=lenient_end,
            reasoning_in_output=reasoning_in_output,
            splitter=_splitter(
                think_tags_for(think_tags, model, "anywhere"), starts_in_think, think_delimiters
            ),
        )
        self.field: str | None = None
        self.fields = tuple(f for f in fields if f in REASONING_FIELDS) or REASONING_FIELDS
        self.carrier = carrier if (capture or carrier_required) else None
        self.echo_only = echo_only
        self.seen_fields: set[str] = set()
        self._reasoning: list[str] = []

    def tag_reasoning(self, text: str) -> list[Chunk]:
        return self._reason(text)

    def _reason(self, text: str) -> list[Chunk]:
        if not text:
            return []
        if self.carrier is not None:
            self._reasoning.append(text)  # kept in memory for the loop, hidden mode included
        if not self.capture:
            return []  # hidden: dropped before anyone sees it
        return [ReasoningDelta(text, reasoning_kind="raw", index=0)]

    def reasoning_chunks(self, delta: Mapping[str, Any]) -> list[Chunk]:
        for name in self.fields:
            if isinstance(delta.get(name), str):
                self.seen_fields.add(name)
        if self.field is None:
            for name in self.fields:
                value = delta.get(name)
                if isinstance(value, str) and value:
                    self.field = name
                    break
            if self.field is not None:
                # the reasoning has a field of its own: a bare <think> sent before it or beside
                # it is a stray
                self.leave_stray_think(delta)
        if self.field is None:
            return []
        value = delta.get(self.field)
        return self._reason(value) if isinstance(value, str) else []

    def continuity_chunks(self) -> list[Chunk]:
        if self.carrier is None or not self.has_tool_calls:
            return []
        if self.echo_only and self.carrier not in self.seen_fields:
            return []  # the server never sent that field: it may well refuse it back
        if not self.capture and not self.seen_fields and not self._reasoning:
            return []  # hidden, and the switch worked: no thinking, nothing to carry
        block = ContinuityBlock(
            CARRIER,
            {"reasoning_content": "".join(self._reasoning)},
            provider=self.provider,
            model=self.model,
        )
        return [ContinuityChunk(block)]


class OpenAICompatibleProvider(ChatCompletionsProvider):
    """``openai-compatible:MODEL`` over ``POST {base}/chat/completions`` of a compatible server."""

    endpoint = ENDPOINTS["openai-compatible"]

    def read_options(self, options: Mapping[str, Any]) -> None:
        check_think_tags(options.get("think_tags"))
        self.think_tags = think_tags_for(options.get("think_tags"), self.model, "anywhere")
        self.starts_in_think = bool(options.get("starts_in_think", False))
        check_think_delimiters(options.get("think_delimiters"))
        self.think_delimiters = think_delimiters_for(options.get("think_delimiters"), self.model)
        self.lenient_end = bool(options.get("lenient_end", True))
        self._send_back_option = bool(options.get("send_back", True))

    @property
    def send_back(self) -> bool:
        """Whether carriers go back at all (the old switch ``send_back = false`` sends nothing
        back whatever the row says)."""
        return self._send_back_option and self.rule.send_back is not None

    def wire_capabilities(self) -> Capabilities:
        return Capabilities(
            reasoning_text=True,
            reasoning_summary=False,
            continuity=self.send_back,
            tools=True,
            notes={
                "reasoning_text": "reasoning_content | reasoning field, or inline <think> tags",
                "continuity": f"{CARRIER} on tool-call turns ({self.rule.family})",
                "server": self.rule.server,
            },
        )

    def _assistant_extra(self, index: int, message: Message) -> dict[str, Any]:
        if not any(isinstance(p, ToolCallPart) for p in message.parts):
            return {}
        block = matching_block(message, CARRIER, provider=self.name, model=self.model)
        if block is None or self.rule.send_back is None:
            return {}
        return {self.rule.send_back: block.data.get("reasoning_content", "")}

    def assistant_extra(self, request: TurnRequest) -> AssistantExtra | None:
        return self._assistant_extra if self.send_back else None

    def shape_reasoning(self, body: dict[str, Any], request: TurnRequest, *, stream: bool) -> None:
        reasoning = request.reasoning
        # a server that thinks only on streamed requests (DashScope) gets the switch off otherwise
        if reasoning.enabled and (stream or not self.rule.thinking_streams_only):
            merge_body(body, self.rule.surface)
            if reasoning.effort is not None and self.rule.effort == "reasoning_effort":
                body["reasoning_effort"] = reasoning.effort
        else:
            merge_body(body, self.rule.hidden)

    def parser(self, request: TurnRequest) -> CompatParser:
        rule = self.rule
        return CompatParser(
            provider=self.name,
            model=self.model,
            capture=request.reasoning.enabled,
            think_tags=self.think_tags,
            starts_in_think=self.starts_in_think,
            think_delimiters=self.think_delimiters,
            carrier=rule.send_back if self.send_back else None,
            carrier_required=rule.keeps_carriers,
            echo_only=rule.echo_only,
            fields=rule.fields,
            lenient_end=self.lenient_end,
            reasoning_in_output=rule.reasoning_in_output,
        )
