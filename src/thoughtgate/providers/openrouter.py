"""OpenRouter adapter: Chat Completions plus OpenRouter's ``reasoning`` and ``reasoning_details``.

Request shaping (``docs/providers/openrouter.md``; openrouter.ai/docs/use-cases/reasoning-tokens),
from the model's row in :data:`thoughtgate.providers.rules.OPENROUTER_RULES` (Claude models take
their Anthropic family's row, so they are labelled and switched as they are directly):

* reasoning wanted (``surface``, ``telemetry_only``): ``reasoning: {"max_tokens": N}`` when a
  budget is set -- and for Claude families that only take a budget, N from the effort as the
  Anthropic adapter computes it --, else ``{"effort": E}`` when an effort is set (``max`` becomes
  ``xhigh``), else ``{"enabled": true}``. OpenRouter counts reasoning inside ``max_tokens``, so a
  budget is added on top of the turn's ``max_tokens``, exactly as the Anthropic adapter does: the
  answer keeps its own room on both routes. An empty ``reasoning: {}`` is a no-op and never sent;
* ``hidden``: the row's switch -- ``{"effort": "none"}`` for Claude families that accept
  ``disabled``, ``{"enabled": false}`` for GLM, ``{"exclude": true}`` where thinking cannot be
  switched off (o-series refuse ``none``) --, or nothing for models that think unasked and need
  their details back in a tool loop (those are then kept in memory, never recorded). Reasoning
  that still arrives is dropped.

Capture (``docs/providers/openrouter.md``):

* ``reasoning_details`` parts are keyed by ``(type, index)`` (Gemini can send a text and an
  encrypted detail under one index): ``reasoning.text`` → reasoning of kind ``raw`` (a Claude
  family's own kind for ``anthropic/*``), ``reasoning.summary`` → ``summary`` on OpenRouter itself
  and ``raw`` on a server that only speaks its format (``summary_servers``, ADR 0078),
  ``reasoning.encrypted`` → an ``encrypted`` part without text. A detail that carries only a
  ``signature`` replaces that part's signature.
* ``delta.reasoning`` mirrors the text of the details. It is used only while the turn has not
  carried a textual detail, so the same text is never counted twice; details win when present.
* At the end of a turn that had details, one :class:`ContinuityChunk` with carrier
  ``openrouter.reasoning_details`` holds ``{"reasoning_details": [...]}``, the details merged by
  ``(type, index)`` in arrival order (for a non-streamed answer: the list exactly as sent).

Multi-turn: an assistant message with tool calls in the running tool loop goes back with that
block's ``reasoning_details`` unmodified, when the block came from this provider and model.
Reasoning text is never put into ``content``. An error chunk's usage is kept in the partial turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from thoughtgate.providers.anthropic import budget_for
from thoughtgate.providers.base import Capabilities, ReasoningRequest, TurnRequest
from thoughtgate.providers.chat_completions import (
    AssistantExtra,
    ChatChunkParser,
    ChatCompletionsProvider,
)
from thoughtgate.providers.history import current_loop_start, matching_block
from thoughtgate.providers.registry import ENDPOINTS
from thoughtgate.providers.rules import EndpointRule
from thoughtgate.providers.think_tags import (
    Delimiters,
    ThinkTags,
    check_think_delimiters,
    check_think_tags,
    splitter_for,
    think_delimiters_for,
    think_tags_for,
)
from thoughtgate.types import (
    Chunk,
    ContinuityBlock,
    ContinuityChunk,
    Message,
    ReasoningDelta,
    ReasoningKind,
    ToolCallPart,
)

__all__ = [
    "CARRIER",
    "DEFAULT_BASE_URL",
    "OpenRouterParser",
    "OpenRouterProvider",
    "reasoning_param",
]

_ENDPOINT: Final = ENDPOINTS["openrouter"]
DEFAULT_BASE_URL = _ENDPOINT.default_base_url
CARRIER = "openrouter.reasoning_details"

_TEXT_FIELD = {
    "reasoning.text": "text",
    "reasoning.summary": "summary",
    "reasoning.encrypted": "data",
}


def reasoning_param(
    reasoning: ReasoningRequest, rule: EndpointRule | None = None
) -> tuple[dict[str, Any] | None, int]:
    """``(reasoning object or None, tokens added on top of max_tokens)`` for one request.

    Never ``{}``. ``None`` means send no ``reasoning`` at all (hidden mode on a model that thinks
    unasked and has no switch, or a model without reasoning).
    """
    if rule is not None and not rule.reasons:
        return None, 0
    if not reasoning.enabled:
        if rule is None:
            return {"exclude": True}, 0
        hidden = (rule.hidden or {}).get("reasoning")
        return (dict(hidden) if isinstance(hidden, Mapping) else None), 0
    budget = reasoning.budget_tokens
    if budget is None and rule is not None and rule.thinking == "budget":
        budget = budget_for(reasoning)  # the Anthropic adapter's budget for this effort
    if budget is not None:
        return {"max_tokens": budget}, budget
    if reasoning.effort is not None:
        return {"effort": "xhigh" if reasoning.effort == "max" else reasoning.effort}, 0
    return {"enabled": True}, 0


def _index(detail: Mapping[str, Any]) -> int:
    value = detail.get("index", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def merge_detail(merged: dict[tuple[str, int], dict[str, Any]], detail: Mapping[str, Any]) -> None:
    """Fold one streamed detail into the merged list: texts append, a non-empty signature
    replaces, other fields keep their latest non-null value."""
    key = (str(detail.get("type")), _index(detail))
    current = merged.get(key)
    if current is None:
        merged[key] = dict(detail)
        return
    for name, value in detail.items():
        if name in ("type", "index"):
            continue
        old = current.get(name)
        if name in ("text", "summary", "data") and isinstance(value, str) and isinstance(old, str):
            current[name] = old + value
        elif name == "signature":
            if value or name not in current:
                current[name] = value
        elif value is not None or name not in current:
            current[name] = value


class OpenRouterParser(ChatChunkParser):
    """Captures ``reasoning_details`` / ``reasoning`` and emits the continuity block."""

    def __init__(
        self,
        *,
        provider: str,
        model: str,
        capture: bool,
        keep_carriers: bool = False,
        text_kind: ReasoningKind = "raw",
        think_tags: ThinkTags = "leading",
        think_delimiters: Delimiters | None = None,
        summaries: bool = False,
    ) -> None:
        super().__init__(
            provider=provider,
            model=model,
            capture=capture,
            splitter=splitter_for(think_tags, delimiters=think_delimiters),
        )
        self.keep_carriers = capture or keep_carriers
        """Merge details for the continuity block (in ``hidden`` mode only when the API
        requires them back in a tool loop: then they stay in memory, never shown)."""
        self.text_kind: ReasoningKind = text_kind
        """What ``reasoning.text`` is: a Claude 4+ model's summarized thinking is ``summary``
        here as it is on the Anthropic route."""
        self.summary_kind: ReasoningKind = "summary" if summaries else "raw"
        """What ``reasoning.summary`` is: a summary where the server vouches for the type."""
        self.details: dict[tuple[str, int], dict[str, Any]] = {}
        self._textual_details = False
        self._encrypted_seen: set[tuple[str, int]] = set()

    def reasoning_chunks(self, delta: Mapping[str, Any]) -> list[Chunk]:
        if delta.get("reasoning") or delta.get("reasoning_details"):
            # the reasoning has a field of its own: a bare <think> sent before it or beside it
            # opened nothing
            self.leave_stray_think(delta)
        if not self.keep_carriers:
            return []  # hidden: nothing is captured, nothing is kept to send back
        details = delta.get("reasoning_details")
        out: list[Chunk] = []
        if isinstance(details, list):
            for detail in details:
                if isinstance(detail, Mapping):
                    merge_detail(self.details, detail)
                    out += self._detail_chunks(detail)
        if not self.capture:
            return []  # hidden: the details are kept for the loop, nothing is shown
        mirror = delta.get("reasoning")
        if isinstance(mirror, str) and mirror and not self._textual_details:
            out.append(ReasoningDelta(mirror, reasoning_kind=self.text_kind, index=0))
        return out

    def _detail_chunks(self, detail: Mapping[str, Any]) -> list[Chunk]:
        kind = detail.get("type")
        index = _index(detail)
        if kind == "reasoning.encrypted":
            key = (kind, index)
            if key in self._encrypted_seen:
                return []
            self._encrypted_seen.add(key)
            redacted = detail.get("format") == "anthropic-claude-v1"
            return [ReasoningDelta("", reasoning_kind="encrypted", index=index, redacted=redacted)]
        if kind not in ("reasoning.text", "reasoning.summary"):
            return []  # e.g. server tool-call details: kept in the continuity list only
        text = detail.get(_TEXT_FIELD[kind])
        text = text if isinstance(text, str) else ""
        signature = detail.get("signature")
        signature = signature if isinstance(signature, str) and signature else None
        if text:
            self._textual_details = True
        if not text and signature is None:
            return []
        rkind = self.text_kind if kind == "reasoning.text" else self.summary_kind
        return [ReasoningDelta(text, reasoning_kind=rkind, index=index, signature=signature)]

    def continuity_chunks(self) -> list[Chunk]:
        if not self.details:
            return []
        block = ContinuityBlock(
            CARRIER,
            {"reasoning_details": list(self.details.values())},
            provider=self.provider,
            model=self.model,
        )
        return [ContinuityChunk(block)]


class OpenRouterProvider(ChatCompletionsProvider):
    """``openrouter:VENDOR/MODEL`` over ``POST {base}/chat/completions``."""

    endpoint = _ENDPOINT

    def read_options(self, options: Mapping[str, Any]) -> None:
        check_think_tags(options.get("think_tags"))
        self.think_tags = think_tags_for(options.get("think_tags"), self.model, "leading")
        check_think_delimiters(options.get("think_delimiters"))
        self.think_delimiters = think_delimiters_for(options.get("think_delimiters"), self.model)

    def wire_capabilities(self) -> Capabilities:
        return Capabilities(
            reasoning_text=True,
            reasoning_summary=self.rule.marks_summaries,
            continuity=True,
            tools=True,
            notes={
                "reasoning_text": "reasoning.text details (and delta.reasoning)",
                "reasoning_summary": "reasoning.summary details (OpenAI models)",
                "continuity": f"{CARRIER}: details merged by (type, index)",
            },
        )

    def assistant_extra(self, request: TurnRequest) -> AssistantExtra:
        loop_start = current_loop_start(request.messages)

        def extra(index: int, message: Message) -> dict[str, Any]:
            if index < loop_start or not any(isinstance(p, ToolCallPart) for p in message.parts):
                return {}
            block = matching_block(message, CARRIER, provider=self.name, model=self.model)
            if block is None:
                return {}
            return {"reasoning_details": block.data["reasoning_details"]}

        return extra

    def shape_reasoning(self, body: dict[str, Any], request: TurnRequest, *, stream: bool) -> None:
        param, on_top = reasoning_param(request.reasoning, self.rule)
        if param is not None:
            body["reasoning"] = param
        body["max_tokens"] = request.max_tokens + on_top

    def parser(self, request: TurnRequest) -> OpenRouterParser:
        anthropic = self.model.lower().startswith("anthropic/")
        return OpenRouterParser(
            provider=self.name,
            model=self.model,
            capture=request.reasoning.enabled,
            keep_carriers=self.rule.keeps_carriers,
            text_kind=self.rule.reasoning_kind if anthropic else "raw",
            think_tags=self.think_tags,
            think_delimiters=self.think_delimiters,
            summaries=self.rule.marks_summaries,
        )
