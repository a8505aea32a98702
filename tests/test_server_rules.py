"""Endpoint rules against the emulator's per-server behaviour: tool loops complete where the
production servers would let them, and fail the way production would when a rule is broken.

Every run goes through the real runtime, tool loop and adapters; the emulator plays the server
(DeepSeek, Groq, Cerebras, Moonshot, OpenRouter, OpenAI Responses, Anthropic) with that server's
own rejections switched on. The server each adapter talks to is named with the ``server`` option,
as a user does for a proxy: the emulator's host is 127.0.0.1.

Hidden mode (issue 14, "carriers in hidden mode"): where an API demands the reasoning back inside
a tool loop and the model thinks although nothing was asked for, the carrier rides the loop in
memory -- it is in the next request -- and is never recorded or shown anywhere.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from support.loop import ADAPTERS, ANSWER, LOOP_MARKS, MARK, ToolLog, mark

from thoughtgate.access.filter import filter_events
from thoughtgate.engine.turn import stream_llm_turn
from thoughtgate.errors import ProviderError, ProviderStreamError
from thoughtgate.events.schema import Event, EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.anthropic import MAX_PAUSE_CONTINUATIONS
from thoughtgate.providers.base import (
    Provider,
    ProviderSettings,
    ReasoningRequest,
    TurnRequest,
    split_model,
)
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord
from thoughtgate.testing.emulator import (
    Call,
    Emulator,
    EmulatorServer,
    Pause,
    Say,
    Scenario,
    ScriptedTurn,
    StreamError,
    Think,
    serve_emulator,
)
from thoughtgate.types import Chunk, Message

PROMPT = "What is the largest city in my country?"


def loop(name: str) -> Scenario:
    return Scenario(
        name,
        (
            ScriptedTurn((Think(LOOP_MARKS[0]), Say("Let me look."), Call("get_country", {}))),
            ScriptedTurn((Think(LOOP_MARKS[1]), Call("largest_city", {"country": "Mexico"}))),
            ScriptedTurn((Think(LOOP_MARKS[2]), Say(ANSWER))),
        ),
    )


PAUSED = Scenario(
    "paused",
    (
        ScriptedTurn(
            (
                Think(mark("P0")),
                Say("Searching the web for it."),
                Pause(),
                Think(mark("P1")),
                Say("Found it:"),
                Pause(),
                Say(" Mexico City."),
            )
        ),
    ),
)
PAUSED_LOOP = Scenario(
    "paused-loop",
    (
        ScriptedTurn(
            (Think(mark("Q0")), Say("Looking."), Pause(), Think(mark("Q1")), Call("get_country"))
        ),
        ScriptedTurn((Think(mark("Q2")), Say(ANSWER))),
    ),
)
FOREVER = Scenario("forever", (ScriptedTurn((Say("Still going."), Pause()) * 12),))
QUOTA = Scenario(
    "quota",
    (
        ScriptedTurn(
            (
                StreamError(
                    "insufficient_quota",
                    "You exceeded your current quota, please check your plan and billing details.",
                ),
            )
        ),
    ),
)
HALFWAY = Scenario(
    "halfway",
    (
        ScriptedTurn(
            (Think(mark("H")), Say("Partial"), StreamError("502", "Provider disconnected"))
        ),
    ),
)


@pytest.fixture(scope="module")
def server() -> Iterator[EmulatorServer]:
    emulator = Emulator()
    for scenario in (loop("loop"), PAUSED, PAUSED_LOOP, FOREVER, QUOTA, HALFWAY):
        emulator.add(scenario)
    with serve_emulator(emulator) as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(server: EmulatorServer) -> None:
    server.emulator.requests.clear()
    server.emulator.attempts.clear()


def make(
    server: EmulatorServer,
    model: str,
    *,
    scenario: str = "loop",
    path: str = "",
    as_server: str | None = None,
    **options: Any,
) -> Provider:
    """An adapter pointed at the emulator; ``path`` picks a chat flavour (``/groq``) and
    ``as_server`` names the server it plays (the ``server`` option)."""
    if as_server is not None:
        options["server"] = as_server
    prefix, bare = split_model(model)
    base = server.url if prefix == "anthropic" else f"{server.url}{path}/v1"
    headers = {"x-emulator-scenario": scenario}
    settings = ProviderSettings(
        base_url=base, api_key="k", max_retries=0, extra={"thoughtgate": options}
    )
    client = httpx.AsyncClient(headers=headers)
    provider: Provider = ADAPTERS[prefix](bare, settings, client=client)
    return provider


@dataclass
class Outcome:
    run: RunRecord
    events: list[Event]
    bodies: list[Any]
    statuses: list[int]
    tools: ToolLog = field(default_factory=ToolLog)
    said: list[str] = field(default_factory=list)
    """What the adapters' errors said, as raised (``str``): the provider's own words, which a
    recorded error keeps only in ``error_detail``, and on a ``hidden`` run nowhere (ADR 0071)."""

    @property
    def provider_said(self) -> str:
        return " ".join(self.said)

    def recorded(self) -> str:
        """Everything the run recorded, as JSON (trace included)."""
        return json.dumps([e.payload for e in self.events], ensure_ascii=False, default=str)


async def run_loop(
    server: EmulatorServer, model: str, mode: str, *, scenario: str = "loop", **kw: Any
) -> Outcome:
    made: list[Provider] = []
    tools = ToolLog()
    server.emulator.requests.clear()

    said: list[str] = []

    def factory(name: str) -> Provider:
        provider = make(server, name, scenario=scenario, **kw)
        stream = provider.stream

        async def watched(request: TurnRequest) -> AsyncIterator[Chunk]:
            try:
                async for chunk in stream(request):
                    yield chunk
            except ProviderError as exc:
                said.append(str(exc))
                raise

        provider.stream = watched  # type: ignore[method-assign]
        made.append(provider)
        return provider

    runtime = Runtime(MemoryStore(), provider_factory=factory, tools=tools.registry())
    run = await runtime.run(RunRequest(PROMPT, model=model), chain_of_thought=mode)
    for provider in made:
        await provider.aclose()
    requests = server.emulator.requests
    return Outcome(
        run,
        await runtime.store.read(run.run_id),
        [r.body for r in requests],
        [r.status for r in requests],
        tools,
        said,
    )


def assistants(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "assistant"]


def assert_completed(out: Outcome) -> None:
    assert out.run.status == "completed", (out.run.tasks[0].error, out.statuses)
    assert out.run.tasks[0].output == ANSWER
    assert out.statuses == [200, 200, 200]


def assert_nothing_recorded(out: Outcome) -> None:
    """Hidden mode: no reasoning and no carrier on any surface, the trace included."""
    assert MARK not in out.recorded()
    assert not [e for e in out.events if e.type == EventType.REASONING_DELTA]
    for event in out.events:
        assert "continuity" not in event.payload and "reasoning" not in event.payload
        assert "trace" not in event.payload
    shown = json.dumps([e.payload for e in filter_events(out.events, "owner", mode="hidden")])
    assert MARK not in shown and "signature" not in shown


# --------------------------------------------------------------------------- DeepSeek


@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_deepseek_loop_with_its_rules(server: EmulatorServer, mode: str) -> None:
    out = await run_loop(
        server, "openai-compatible:deepseek-reasoner", mode, path="/deepseek", as_server="deepseek"
    )
    assert_completed(out)
    if mode == "hidden":
        # DeepSeek's API takes its switch: no thinking, nothing to carry, nothing recorded
        assert all(b["thinking"] == {"type": "disabled"} for b in out.bodies)
        assert all("reasoning_content" not in m for b in out.bodies for m in assistants(b))
        assert_nothing_recorded(out)
    else:
        assert all("thinking" not in b for b in out.bodies)
        sent = [m["reasoning_content"] for m in assistants(out.bodies[2])]
        assert sent == list(LOOP_MARKS[:2]), "each tool turn's reasoning goes back, as demanded"


# --------------------------------------------------------------------------- Groq-style servers


@pytest.mark.parametrize("model", ["openai/gpt-oss-120b", "qwen/qwen3-32b"])
@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_groq_loop_sends_nothing_back(server: EmulatorServer, model: str, mode: str) -> None:
    out = await run_loop(server, f"openai-compatible:{model}", mode, path="/groq", as_server="groq")
    assert_completed(out)
    assert all("reasoning_content" not in m for b in out.bodies for m in assistants(b))
    assert MARK not in json.dumps(out.bodies), "no reasoning of any kind goes back to Groq"
    if mode == "surface":
        assert out.run.tasks[0].reasoning == "\n\n".join(LOOP_MARKS)
        if "qwen3" in model:
            assert out.bodies[0]["reasoning_format"] == "parsed"
    else:
        assert_nothing_recorded(out)
        switch = {"reasoning_effort": "none"} if "qwen3" in model else {"include_reasoning": False}
        assert all(b.items() >= switch.items() for b in out.bodies)


async def test_groq_refuses_reasoning_content_as_production_does(server: EmulatorServer) -> None:
    """The old behaviour -- reasoning_content back to every compatible server -- fails on the
    second request of the loop, with Groq's own 400."""
    out = await run_loop(
        server,
        "openai-compatible:openai/gpt-oss-120b",
        "surface",
        path="/groq",
        as_server="groq",
        rules={"send_back": "reasoning_content", "send_back_required": True},
    )
    assert out.run.status != "completed" and out.statuses == [200, 400]
    assert (
        "'messages.1' : for 'role:assistant' the following must be satisfied" in out.provider_said
    )
    assert "property 'reasoning_content' is unsupported" in out.provider_said


async def test_deepseek_switch_is_not_sent_to_a_deepseek_model_on_groq(
    server: EmulatorServer,
) -> None:
    model = "openai-compatible:deepseek-r1-distill-llama-70b"
    out = await run_loop(server, model, "hidden", path="/groq", as_server="groq")
    assert out.statuses[0] == 200 and "thinking" not in out.bodies[0]
    # sent anyway (the old per-model guess), Groq refuses the field
    forced = await run_loop(
        server, model, "hidden", path="/groq", as_server="groq", rules={"hidden": _DISABLED}
    )
    assert forced.statuses == [400]
    assert "property 'thinking' is unsupported" in forced.provider_said


_DISABLED = {"thinking": {"type": "disabled"}}


async def test_cerebras_loop_and_its_refusal(server: EmulatorServer) -> None:
    out = await run_loop(
        server, "openai-compatible:gpt-oss-120b", "surface", path="/cerebras", as_server="cerebras"
    )
    assert_completed(out)
    assert all("reasoning_content" not in m for b in out.bodies for m in assistants(b))
    broken = await run_loop(
        server,
        "openai-compatible:gpt-oss-120b",
        "surface",
        path="/cerebras",
        as_server="cerebras",
        rules={"send_back": "reasoning_content"},
    )
    assert broken.statuses == [200, 400]
    assert (
        "property 'messages.1.assistant.reasoning_content' is unsupported" in broken.provider_said
    )


# --------------------------------------------------------------------------- hidden-mode carriers


async def test_hidden_kimi_keeps_its_reasoning_for_the_loop_only(server: EmulatorServer) -> None:
    """Kimi's thinking models think whatever the request says and demand ``reasoning_content``
    back on tool-call turns. Hidden mode: the next request carries it, no surface shows it."""
    out = await run_loop(
        server,
        "openai-compatible:kimi-k2-thinking",
        "hidden",
        path="/moonshot",
        as_server="moonshot",
    )
    assert_completed(out)
    sent = [m["reasoning_content"] for m in assistants(out.bodies[2])]
    assert sent == list(LOOP_MARKS[:2]), "in memory, for the loop: the API demands it"
    assert_nothing_recorded(out)
    worker = next(e for e in out.events if e.type == EventType.WORKER_COMPLETED)
    assert worker.payload["mode"] == "hidden" and "trace" not in worker.payload


async def test_kimi_without_its_carrier_fails_as_production_does(server: EmulatorServer) -> None:
    out = await run_loop(
        server,
        "openai-compatible:kimi-k2-thinking",
        "hidden",
        path="/moonshot",
        as_server="moonshot",
        send_back=False,
    )
    assert out.statuses == [200, 400]
    assert (
        "reasoning_content is missing in assistant tool call message at index 1"
        in out.provider_said
    )


async def test_hidden_claude_fable_sends_its_thinking_blocks_back(server: EmulatorServer) -> None:
    """Fable thinks unasked and refuses ``disabled``: no switch is sent, and its signed blocks
    (display omitted, so empty text) ride the loop in memory."""
    out = await run_loop(server, "anthropic:claude-fable-5", "hidden")
    assert_completed(out)
    assert all("thinking" not in b for b in out.bodies)
    head = assistants(out.bodies[2])[0]["content"][0]
    assert head["type"] == "thinking" and head["signature"] and head["thinking"] == ""
    assert_nothing_recorded(out)
    # the switch the other families take is refused here, as production refuses it
    forced = await run_loop(
        server, "anthropic:claude-fable-5", "hidden", rules={"hidden": _DISABLED}
    )
    assert forced.statuses == [400]
    assert '"thinking.type.disabled" is not supported' in forced.provider_said


async def test_hidden_claude_sonnet_switches_thinking_off(server: EmulatorServer) -> None:
    out = await run_loop(server, "anthropic:claude-sonnet-4-5", "hidden")
    assert_completed(out)
    assert all(b["thinking"] == {"type": "disabled"} for b in out.bodies)
    assert all(
        blk.get("type") != "thinking"
        for b in out.bodies
        for m in assistants(b)
        for blk in m["content"]
    )


# --------------------------------------------------------------------------- OpenRouter


@pytest.mark.parametrize(
    ("model", "hidden"),
    [
        ("anthropic/claude-sonnet-4.5", {"effort": "none"}),
        ("anthropic/claude-fable-5", None),
        ("openai/o3", {"exclude": True}),
        ("z-ai/glm-4.6", {"enabled": False}),
    ],
)
@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_openrouter_loops_with_its_rules(
    server: EmulatorServer, model: str, hidden: Any, mode: str
) -> None:
    out = await run_loop(server, f"openrouter:{model}", mode)
    assert_completed(out)
    if mode == "surface":
        assert out.run.tasks[0].reasoning == "\n\n".join(LOOP_MARKS)
        return
    assert [b.get("reasoning") for b in out.bodies] == [hidden] * 3
    assert_nothing_recorded(out)
    carried = [m.get("reasoning_details") for m in assistants(out.bodies[2])]
    if hidden is None:
        # Fable thinks unasked and Anthropic demands its thinking back: kept for the loop
        assert all(carried) and MARK in json.dumps(carried)
    else:
        assert not any(carried)


async def test_openrouter_o3_refuses_effort_none_as_recorded(server: EmulatorServer) -> None:
    out = await run_loop(
        server,
        "openrouter:openai/o3",
        "hidden",
        rules={"hidden": {"reasoning": {"effort": "none"}}},
    )
    assert out.statuses == [400]
    error = out.provider_said
    assert "Provider returned error" in error
    assert "Unsupported value: 'none' is not supported with the 'o3' model." in error


async def test_openrouter_error_chunk_keeps_its_usage(server: EmulatorServer) -> None:
    err = await failed_turn(server, "openrouter:anthropic/claude-sonnet-4.5", "halfway")
    assert (err.message, err.code) == ("Provider disconnected", "502")
    assert err.partial is not None and err.partial.text == "Partial"
    usage = err.partial.usage
    assert usage.input_tokens == 40 and usage.output_tokens > 0 and usage.reasoning_tokens > 0


# --------------------------------------------------------------------------- Responses


@pytest.mark.parametrize("model", ["gpt-5", "gpt-5.2", "gpt-4o"])
@pytest.mark.parametrize("mode", ["surface", "hidden"])
async def test_responses_loops_with_their_rules(
    server: EmulatorServer, model: str, mode: str
) -> None:
    out = await run_loop(server, f"openai:{model}", mode)
    assert_completed(out)
    first = out.bodies[0]
    if model == "gpt-4o":
        # a model that does not reason gets no reasoning parameter in any mode
        assert "reasoning" not in first and "include" not in first
        assert out.run.tasks[0].reasoning in (None, "")
    elif mode == "surface":
        assert first["reasoning"] == {"summary": "auto"}
        assert first["include"] == ["reasoning.encrypted_content"]
    elif model == "gpt-5.2":
        assert first["reasoning"] == {"effort": "none"} and "include" not in first
    else:
        assert "reasoning" not in first and "include" not in first
    if mode == "hidden":
        assert_nothing_recorded(out)


async def test_gpt4o_refuses_reasoning_parameters_as_production_does(
    server: EmulatorServer,
) -> None:
    surface = {"reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"]}
    out = await run_loop(server, "openai:gpt-4o", "surface", rules={"surface": surface})
    assert out.statuses == [400]
    assert (
        "Unsupported parameter: 'reasoning.summary' is not supported with this model."
        in out.provider_said
    )
    out = await run_loop(
        server, "openai:gpt-4o", "surface", rules={"surface": {"include": surface["include"]}}
    )
    assert "Encrypted content is not supported with this model." in out.provider_said


async def test_responses_error_event_keeps_message_code_and_request_id(
    server: EmulatorServer,
) -> None:
    err = await failed_turn(server, "openai:gpt-5", "quota")
    assert err.message.startswith("You exceeded your current quota")
    assert (err.error_type, err.code) == ("insufficient_quota", "insufficient_quota")
    assert err.request_id and err.request_id.startswith("req_")
    assert "insufficient_quota" in str(err) and err.request_id in str(err)


# --------------------------------------------------------------------------- pause_turn


@pytest.mark.parametrize("streamed", [True, False])
async def test_pause_turn_continues_the_turn(server: EmulatorServer, streamed: bool) -> None:
    provider = make(server, "anthropic:claude-sonnet-4-5", scenario="paused")
    try:
        request = _surface()
        turn = (
            await stream_llm_turn(provider, request)
            if streamed
            else await provider.request(request)
        )
    finally:
        await provider.aclose()
    assert turn.text == "Searching the web for it.Found it: Mexico City."
    assert turn.reasoning_text == f"{mark('P0')}\n\n{mark('P1')}"
    assert (turn.finish_reason, turn.raw_finish_reason) == ("stop", "end_turn")
    bodies = [r.body for r in server.emulator.requests]
    assert [r.status for r in server.emulator.requests] == [200, 200, 200]
    # each continuation sends everything the turn produced so far as the final assistant message
    assert [len(b["messages"]) for b in bodies] == [1, 2, 2]
    assert [blk["type"] for blk in bodies[1]["messages"][-1]["content"]] == ["thinking", "text"]
    assert [blk["type"] for blk in bodies[2]["messages"][-1]["content"]] == [
        "thinking",
        "text",
        "thinking",
        "text",
    ]
    assert turn.usage.input_tokens == 3 * 40, "usage of all three responses"


async def test_a_paused_turn_with_a_tool_call_loops_on(server: EmulatorServer) -> None:
    out = await run_loop(server, "anthropic:claude-sonnet-4-5", "surface", scenario="paused-loop")
    assert out.run.status == "completed" and out.run.tasks[0].output == ANSWER
    assert out.statuses == [200, 200, 200]
    # the whole paused turn goes back with its two signed blocks first, as one message
    content = assistants(out.bodies[2])[0]["content"]
    assert [b["type"] for b in content] == ["thinking", "thinking", "text", "tool_use"]
    assert out.tools.calls == [("get_country", {})]


async def test_a_turn_paused_for_ever_fails_honestly(server: EmulatorServer) -> None:
    err = await failed_turn(server, "anthropic:claude-sonnet-4-5", "forever")
    assert "still paused" in err.message and err.error_type == "pause_turn"
    assert err.partial is not None and "Still going." in err.partial.text
    assert len(server.emulator.requests) == MAX_PAUSE_CONTINUATIONS + 1


# --------------------------------------------------------------------------- helpers


async def failed_turn(server: EmulatorServer, model: str, scenario: str) -> ProviderStreamError:
    """The error one streamed turn of ``scenario`` ends with (the test fails if it succeeds)."""
    provider = make(server, model, scenario=scenario)
    try:
        with pytest.raises(ProviderStreamError) as info:
            await stream_llm_turn(provider, _surface())
    finally:
        await provider.aclose()
    return info.value


def _surface() -> TurnRequest:
    return TurnRequest([Message.user(PROMPT)], reasoning=ReasoningRequest(True))
