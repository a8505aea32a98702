"""A function-driven fake provider: write a Python function that yields what the model "says".

>>> async def script(request, turn):
...     yield reasoning("The user wants a greeting.")
...     yield text("Hello!")
>>> provider = FakeProvider(script)

The function receives the :class:`TurnRequest` and the 0-based turn number and yields chunks
(:func:`reasoning`, :func:`text`, :func:`tool_call` build them; plain ``str`` means text). It may be
a sync or async generator. Like a real provider, the fake honours the disclosure mode: when the
request asks for no reasoning, reasoning chunks are dropped before anyone sees them.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, cast

from thoughtgate.providers.base import (
    Capabilities,
    ProviderSettings,
    TurnRequest,
    collect_turn,
)
from thoughtgate.types import (
    Chunk,
    FinishChunk,
    ReasoningDelta,
    ReasoningKind,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Turn,
    UsageChunk,
)

__all__ = [
    "FAKE_SCRIPTS",
    "REASONER_MARKER",
    "FakeProvider",
    "ScriptFn",
    "reasoning",
    "text",
    "tool_call",
]

ScriptFn = Callable[[TurnRequest, int], Any]
"""``(request, turn_number) -> (async) iterable of Chunk | str``."""


def reasoning(content: str, *, kind: ReasoningKind = "raw", index: int = 0) -> ReasoningDelta:
    return ReasoningDelta(content, reasoning_kind=kind, index=index)


def text(content: str) -> TextDelta:
    return TextDelta(content)


def tool_call(name: str, arguments: dict[str, Any], *, call_id: str | None = None) -> list[Chunk]:
    cid = call_id or f"call_{name}"
    return [
        ToolCallStart(cid, name, index=1),
        ToolCallDelta(cid, json.dumps(arguments)),
        ToolCallEnd(cid),
    ]


def _words(sentence: str) -> Iterator[str]:
    words = sentence.split(" ")
    for i, word in enumerate(words):
        yield word if i == len(words) - 1 else word + " "


def _echo_script(request: TurnRequest, turn: int) -> Iterator[Chunk]:
    prompt = request.messages[-1].text if request.messages else ""
    for word in _words(f"The user said {len(prompt)} characters; I will echo them back."):
        yield reasoning(word)
    for word in _words(f"Echo: {prompt}"):
        yield text(word)


REASONER_MARKER = "TG-REASONING-MARKER-7F3A"
"""Appears in the ``reasoner`` script's reasoning and nowhere else, so a test can look for it."""


def _reasoner_script(request: TurnRequest, turn: int) -> Iterator[Chunk]:
    """One turn: reasoning carrying :data:`REASONER_MARKER`, a short answer, usage with reasoning
    tokens (only when reasoning was asked for, as a real provider would report them)."""
    yield reasoning(f"The user wants the answer; I recall it ({REASONER_MARKER}).")
    yield text("The answer is 42.")
    thought = 8 if request.reasoning.enabled else 0
    yield UsageChunk(input_tokens=12, output_tokens=20, reasoning_tokens=thought)
    yield FinishChunk("stop", raw_reason="end_turn")


FAKE_SCRIPTS: dict[str, ScriptFn] = {"echo": _echo_script, "reasoner": _reasoner_script}
"""Scripts reachable as ``--model fake:NAME`` (tests register more)."""


class FakeProvider:
    """A provider whose every turn comes from a user function; no network, deterministic."""

    name = "fake"

    def __init__(self, script: ScriptFn, *, model: str = "scripted") -> None:
        self.script = script
        self.model = model
        self.capabilities = Capabilities(
            reasoning_text=True, reasoning_summary=True, tools=True, continuity=False
        )
        self.turns = 0
        self.requests: list[TurnRequest] = []

    @classmethod
    def from_model_name(cls, model: str, settings: ProviderSettings | None = None) -> FakeProvider:
        try:
            return cls(FAKE_SCRIPTS[model], model=model)
        except KeyError:
            from thoughtgate.errors import UnknownProviderError

            raise UnknownProviderError(
                f"no fake script {model!r}; known: {', '.join(sorted(FAKE_SCRIPTS))}"
            ) from None

    async def _raw(self, request: TurnRequest, turn: int) -> AsyncIterator[Chunk]:
        produced: Any = self.script(request, turn)
        if inspect.isasyncgen(produced):
            async for item in produced:
                for chunk in _flatten(cast(Any, item)):
                    yield chunk
        else:
            for item in produced:
                for chunk in _flatten(item):
                    yield chunk

    async def stream(self, request: TurnRequest) -> AsyncIterator[Chunk]:
        turn = self.turns
        self.turns += 1
        self.requests.append(request)
        saw_finish = False
        has_tools = False
        out_chars = 0
        async for chunk in self._raw(request, turn):
            if isinstance(chunk, ReasoningDelta) and not request.reasoning.enabled:
                continue  # like a real provider asked for no reasoning
            if isinstance(chunk, ToolCallStart):
                has_tools = True
            if isinstance(chunk, FinishChunk):
                saw_finish = True
            if isinstance(chunk, TextDelta | ReasoningDelta):
                out_chars += len(chunk.text)
            yield chunk
        if not saw_finish:
            prompt_chars = sum(len(m.text) for m in request.messages)
            yield UsageChunk(input_tokens=max(1, prompt_chars // 4), output_tokens=out_chars // 4)
            yield FinishChunk("tool_calls" if has_tools else "stop", raw_reason="fake")

    async def request(self, request: TurnRequest) -> Turn:
        return await collect_turn(self, request)

    async def aclose(self) -> None:
        return None


def _flatten(item: Chunk | str | Iterable[Chunk]) -> Iterator[Chunk]:
    if isinstance(item, str):
        yield TextDelta(item)
    elif isinstance(item, list | tuple):
        yield from item
    else:
        yield item  # type: ignore[misc]
