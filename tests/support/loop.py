"""Helpers for the tool-loop tests over the four adapters: cases, scenarios, tools, wire readers.

Kept free of pytest so the CLI subprocess can import the tools from here (``--tools
support.loop:CLI_TOOLS``).

* :data:`CASES` names each adapter configuration the loop is proven on, with what its API demands
  back (``carrier``) and what its server reports (``reasoning_tokens``).
* :class:`TeeTransport` keeps every response body exactly as the emulator sent it, so a test can
  compare what went back to the model with what the model emitted, byte for byte.
* ``emitted_*`` read carriers out of those raw bodies, independently of the adapters' parsers.
* :func:`marker_paths` finds every place a reasoning marker sits in a request body.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx

from support.sse import json_frames
from thoughtgate.engine.tools import Tool, ToolRegistry, tool
from thoughtgate.providers.anthropic import AnthropicProvider
from thoughtgate.providers.base import Provider, ProviderSettings, split_model
from thoughtgate.providers.openai_compatible import OpenAICompatibleProvider
from thoughtgate.providers.openai_responses import OpenAIResponsesProvider
from thoughtgate.providers.openrouter import OpenRouterProvider
from thoughtgate.testing.emulator import (
    Call,
    Cut,
    Fail,
    Redacted,
    Say,
    Scenario,
    ScriptedTurn,
    StreamError,
    Summary,
    Think,
)

CarrierKind = Literal["anthropic", "openrouter", "responses", "compat"]

MARK = "TG-MARK-"
"""Every Think step's text starts with this; no request may carry it outside a carrier."""


def mark(label: str) -> str:
    # Non-ASCII on purpose: reasoning size in chars and in bytes must differ.
    return f"{MARK}{label} Ünïcode 🤔 reasoning for step {label}."


ANSWER = "The largest city in your country is Mexico City."
LOOP_MARKS = (mark("T0"), mark("T1"), mark("T2"))


@dataclass(frozen=True, slots=True)
class Case:
    """One adapter configuration. ``carrier`` is the shape the API demands back on tool turns."""

    id: str
    model: str
    carrier: CarrierKind
    demands_carrier: bool = True
    """The emulated API rejects a tool loop whose carrier is missing."""
    reasoning_tokens: bool = True
    """The server reports reasoning tokens in its usage."""
    summaries: bool = False
    """The model returns summaries rather than raw reasoning (OpenAI via OpenRouter)."""
    switch_to: str = ""
    """Another model of the same provider, for the model-switch test."""
    sends_carrier: bool = True
    """The server's endpoint rule sends the carrier back (vLLM's ``reasoning`` field and inline
    ``<think>`` tags are not DeepSeek's ``reasoning_content``: nothing goes back there)."""

    @property
    def prefix(self) -> str:
        return split_model(self.model)[0]

    @property
    def bare(self) -> str:
        return split_model(self.model)[1]


CASES = (
    Case(
        "anthropic-budget",
        "anthropic:claude-sonnet-4-5",
        "anthropic",
        switch_to="anthropic:claude-opus-4-7",
    ),
    Case(
        "anthropic-adaptive",
        "anthropic:claude-opus-4-7",
        "anthropic",
        switch_to="anthropic:claude-sonnet-4-5",
    ),
    Case(
        "openrouter-anthropic",
        "openrouter:anthropic/claude-sonnet-4.5",
        "openrouter",
        switch_to="openrouter:openai/gpt-5-mini",
    ),
    Case(
        "openrouter-openai",
        "openrouter:openai/gpt-5-mini",
        "openrouter",
        demands_carrier=False,
        summaries=True,
        switch_to="openrouter:anthropic/claude-sonnet-4.5",
    ),
    Case("responses", "openai:gpt-5", "responses", switch_to="openai:o3"),
    Case(
        "deepseek",
        "openai-compatible:deepseek-reasoner",
        "compat",
        switch_to="openai-compatible:deepseek-chat",
    ),
    Case(
        "vllm",
        "openai-compatible:vllm/qwen3-32b",
        "compat",
        demands_carrier=False,
        reasoning_tokens=False,
        switch_to="openai-compatible:vllm/qwen3-8b",
        sends_carrier=False,
    ),
    Case(
        "think-tags",
        "openai-compatible:think/qwq-32b",
        "compat",
        demands_carrier=False,
        reasoning_tokens=False,
        switch_to="openai-compatible:think/qwq-7b",
        sends_carrier=False,
    ),
)
CASE_BY_ID = {c.id: c for c in CASES}


# --------------------------------------------------------------------------- scenarios


def loop_scenario(name: str, *, summaries: bool = False) -> Scenario:
    """Two tool calls then the answer; every turn reasons with its own marker.

    Turn 0 has a second, redacted reasoning block (Anthropic ``redacted_thinking``, an encrypted
    OpenRouter detail, part of the one Responses reasoning item), so order is checked too.
    """
    step = Summary if summaries else Think
    return Scenario(
        name,
        (
            ScriptedTurn(
                (
                    step(LOOP_MARKS[0]),
                    Redacted("safety"),
                    Say("Let me look up your country."),
                    Call("get_country", {}),
                ),
                chunk_chars=9,
            ),
            ScriptedTurn((step(LOOP_MARKS[1]), Call("largest_city", {"country": "Mexico"}))),
            ScriptedTurn((step(LOOP_MARKS[2]), Say(ANSWER))),
        ),
    )


CONTINUE_MARK = mark("C0")


def answer_scenario(name: str, *, summaries: bool = False) -> Scenario:
    step = Summary if summaries else Think
    return Scenario(name, (ScriptedTurn((step(CONTINUE_MARK), Say("Still Mexico City."))),) * 3)


def empty_reasoning_scenario(name: str) -> Scenario:
    """A tool-call turn with no reasoning at all, then an answer (DeepSeek's empty carrier)."""
    return Scenario(
        name,
        (
            ScriptedTurn((Call("get_country", {}),)),
            ScriptedTurn((Think(mark("E1")), Say("Mexico."))),
        ),
    )


CUT_MARK = mark("X")
PARTIAL_TEXT = "Partial ans"


@dataclass(frozen=True, slots=True)
class CutPoint:
    """Where a stream breaks, and what the recorded partial turn must hold."""

    id: str
    turns: tuple[ScriptedTurn, ...]
    reasoning: str
    text: str
    tools_run: tuple[str, ...] = ()
    error_type: str | None = None
    cut_calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    """Tool calls that arrived in the cut turn: recorded, never run."""
    status: int | None = None
    """The HTTP status when the provider refused the turn outright (nothing streamed)."""

    def scenario(self, name: str, *, summaries: bool = False) -> Scenario:
        if not summaries:
            return Scenario(name, self.turns)
        turns = tuple(
            ScriptedTurn(
                tuple(Summary(s.text) if isinstance(s, Think) else s for s in t.steps),
                chunk_chars=t.chunk_chars,
            )
            for t in self.turns
        )
        return Scenario(name, turns)


CUT_POINTS = (
    CutPoint("after-reasoning", (ScriptedTurn((Think(CUT_MARK), Cut())),), CUT_MARK, ""),
    CutPoint(
        "after-text",
        (ScriptedTurn((Think(CUT_MARK), Say(PARTIAL_TEXT), Cut()), chunk_chars=5),),
        CUT_MARK,
        PARTIAL_TEXT,
    ),
    CutPoint(
        "mid-tool-call",
        (
            ScriptedTurn(
                (
                    Think(CUT_MARK),
                    Say(PARTIAL_TEXT),
                    Call("largest_city", {"country": "Mexico"}),
                    Cut(),
                ),
                chunk_chars=4,
            ),
        ),
        CUT_MARK,
        PARTIAL_TEXT,
        cut_calls=(("largest_city", {"country": "Mexico"}),),
    ),
    CutPoint(
        "stream-error",
        (
            ScriptedTurn(
                (Think(CUT_MARK), Say(PARTIAL_TEXT), StreamError("overloaded_error", "Overloaded"))
            ),
        ),
        CUT_MARK,
        PARTIAL_TEXT,
        error_type="overloaded_error",
    ),
    CutPoint(
        "http-error-second-turn",
        (
            ScriptedTurn((Think(LOOP_MARKS[0]), Call("get_country", {}))),
            ScriptedTurn((Fail(529, "overloaded_error", "Overloaded", times=9),)),
        ),
        "",
        "",
        tools_run=("get_country",),
        error_type="overloaded_error",
        status=529,
    ),
    CutPoint(
        "second-turn",
        (
            ScriptedTurn((Think(LOOP_MARKS[0]), Call("get_country", {}))),
            ScriptedTurn((Think(CUT_MARK), Say(PARTIAL_TEXT), Cut())),
        ),
        CUT_MARK,
        PARTIAL_TEXT,
        tools_run=("get_country",),
    ),
)


# --------------------------------------------------------------------------- tools


@dataclass
class ToolLog:
    """Typed tools for the loop, and the calls they actually ran."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def registry(self) -> ToolRegistry:
        log = self.calls

        @tool
        def get_country() -> str:
            """The user's country."""
            log.append(("get_country", {}))
            return "Mexico"

        @tool
        def largest_city(country: str) -> str:
            """The largest city of a country."""
            log.append(("largest_city", {"country": country}))
            return "Mexico City"

        return ToolRegistry([get_country, largest_city])


CLI_MARK = mark("CLI")
CLI_ANSWER = "Your table in Paris is booked."


@tool(requires_approval=True)
def book_table(city: str) -> str:
    """Book a table at a restaurant in a city (needs the user's approval)."""
    return f"BOOKED-{city}"


CLI_TOOLS: list[Tool] = [book_table]


def cli_scenario(name: str) -> Scenario:
    return Scenario(
        name,
        (
            ScriptedTurn((Think(CLI_MARK), Call("book_table", {"city": "Paris"}))),
            ScriptedTurn((Think(mark("CLI2")), Say(CLI_ANSWER))),
        ),
    )


# --------------------------------------------------------------------------- providers


@dataclass
class Exchange:
    """One HTTP exchange as it crossed the wire."""

    request: dict[str, Any]
    response: bytearray = field(default_factory=bytearray)


class _TeeStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, sink: bytearray) -> None:
        self._inner = inner
        self._sink = sink

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._sink += chunk
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class TeeTransport(httpx.AsyncBaseTransport):
    """A real HTTP transport that also keeps each request body and raw response body."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        exchange = Exchange(json.loads(request.content or b"null"))
        self.exchanges.append(exchange)
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _TeeStream(response.stream, exchange.response)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


ADAPTERS: dict[str, Any] = {
    "anthropic": AnthropicProvider,
    "openrouter": OpenRouterProvider,
    "openai": OpenAIResponsesProvider,
    "openai-compatible": OpenAICompatibleProvider,
}


#: The vendor's server each prefix's emulator route plays.
_VENDORS = {"anthropic": "anthropic", "openai": "openai", "openrouter": "openrouter"}


def make_provider(
    model: str, *, url: str, scenario: str, tee: TeeTransport | None = None
) -> Provider:
    """An adapter for ``model`` pointed at the emulator, playing ``scenario``.

    The scenario rides on the client's default headers (the adapter adds its own key and version
    headers per request); the chat flavour follows from the model name (``deepseek*``, ``vllm/*``,
    ``think/*``, ``vendor/model`` = OpenRouter). ``tee`` keeps the raw bytes of every exchange.
    """
    headers = {"x-emulator-scenario": scenario}
    prefix, bare = split_model(model)
    base = url if prefix == "anthropic" else f"{url}/v1"
    extra: dict[str, Any] = {}
    # the emulator's host is 127.0.0.1, so the server it plays is named, as for a proxy (a vendor's
    # summaries are labelled summaries only on that vendor's server, ADR 0078)
    if prefix == "openai-compatible" and bare.startswith("deepseek"):
        extra["thoughtgate"] = {"server": "deepseek"}
    elif prefix in _VENDORS:
        extra["thoughtgate"] = {"server": _VENDORS[prefix]}
    settings = ProviderSettings(base_url=base, api_key="test-key", max_retries=0, extra=extra)
    client = httpx.AsyncClient(headers=headers, transport=tee or httpx.AsyncHTTPTransport())
    provider: Provider = ADAPTERS[prefix](bare, settings, client=client)
    return provider


# --------------------------------------------------------------------------- wire readers


def emitted_anthropic(raw: bytes) -> list[dict[str, Any]]:
    """The thinking and redacted_thinking blocks of one response, as complete blocks."""
    blocks: dict[int, dict[str, Any]] = {}
    for _, data in json_frames(raw):
        if data.get("type") == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif data.get("type") == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
    return [
        blocks[i] for i in sorted(blocks) if blocks[i]["type"] in ("thinking", "redacted_thinking")
    ]


def emitted_openrouter(raw: bytes) -> list[dict[str, Any]]:
    """``reasoning_details`` of one response, pieces joined per ``(type, index)``."""
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for _, data in json_frames(raw):
        for choice in data.get("choices") or []:
            for detail in (choice.get("delta") or {}).get("reasoning_details") or []:
                key = (detail["type"], detail.get("index", 0))
                into = merged.setdefault(key, {})
                for name, value in detail.items():
                    if name in ("text", "summary", "data"):
                        into[name] = into.get(name, "") + value
                    elif name == "signature":
                        if value or name not in into:
                            into[name] = value
                    else:
                        into[name] = value
    return list(merged.values())


def emitted_responses(raw: bytes) -> list[tuple[dict[str, Any], str]]:
    """Each reasoning item exactly as ``output_item.done`` gave it, with the id of the item that
    followed it."""
    items: dict[int, dict[str, Any]] = {}
    for _, data in json_frames(raw):
        if data.get("type") == "response.output_item.done":
            items[data["output_index"]] = data["item"]
    ordered = [items[i] for i in sorted(items)]
    return [
        (item, ordered[n + 1]["id"])
        for n, item in enumerate(ordered)
        if item["type"] == "reasoning" and n + 1 < len(ordered)
    ]


_THINK = re.compile(r"<think>\n(.*?)\n</think>", re.S)


def emitted_compat(raw: bytes) -> str:
    """The reasoning text of one response, from whichever field (or tag) the flavour used."""
    pieces: list[str] = []
    content: list[str] = []
    for _, data in json_frames(raw):
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            for name in ("reasoning_content", "reasoning"):
                if isinstance(delta.get(name), str):
                    pieces.append(delta[name])
            if isinstance(delta.get("content"), str):
                content.append(delta["content"])
    pieces += _THINK.findall("".join(content))
    return "".join(pieces)


# --------------------------------------------------------------------------- request bodies


def walk(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Every string leaf of a JSON value with its path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from walk(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from walk(item, (*path, i))


def marker_paths(body: Any, marker: str = MARK) -> list[tuple[Any, ...]]:
    return [path for path, text in walk(body) if marker in text]


def at(body: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        body = body[key]
    return body


def inside_carrier(kind: CarrierKind, body: Any, path: tuple[Any, ...]) -> bool:
    """Whether ``path`` is inside the one field this provider demands reasoning back in."""
    match kind, path:
        case "anthropic", ("messages", int(), "content", int(), "thinking"):
            return bool(at(body, path[:4]).get("type") == "thinking")
        case "openrouter", ("messages", int(), "reasoning_details", int(), "text" | "summary"):
            return bool(at(body, path[:2]).get("role") == "assistant")
        case "compat", ("messages", int(), "reasoning_content"):
            return bool(at(body, path[:2]).get("role") == "assistant")
        case "responses", ("input", int(), "summary" | "content", int(), "text"):
            # The reasoning item goes back exactly as the API returned it; its own ``summary``
            # field (required on input) is part of that item, next to the encrypted state.
            item = at(body, path[:2])
            return bool(item.get("type") == "reasoning" and item.get("encrypted_content"))
    return False


def has_carrier(kind: CarrierKind, body: Any) -> bool:
    """Whether any continuity carrier sits in a request body."""
    if kind == "anthropic":
        return any(
            isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
            for m in body["messages"]
            if isinstance(m.get("content"), list)
            for b in m["content"]
        )
    if kind == "openrouter":
        return any("reasoning_details" in m for m in body["messages"])
    if kind == "compat":
        return any("reasoning_content" in m or "reasoning" in m for m in body["messages"])
    return any(isinstance(i, dict) and i.get("type") == "reasoning" for i in body["input"])
