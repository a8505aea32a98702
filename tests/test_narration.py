"""Narration: the model writes steps for the reader through the built-in ``visible_step`` tool.

Through the real runtime and agent loop with a scripted model: the tool is offered only when the
operator names ``narration``; its calls never reach the tool registry, never become tool cards or
tool details, go back to the model only as a plain acknowledgement answered together with the
turn's real calls (no extra model turn), and become policy-checked ``cot.step`` /
``cot.tool.reasoning`` events -- the only place their text is kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.loop import CASES, Case, make_provider

from thoughtgate.access.filter import filter_events
from thoughtgate.config import Config
from thoughtgate.demo import demo_tools
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.errors import UsageError
from thoughtgate.events.narration import NARRATION_ACK, NARRATION_DESCRIPTION, NARRATION_TOOL
from thoughtgate.events.schema import Event, EventType
from thoughtgate.events.thread import StepItem, ThreadBuilder, ToolCard, rebuild
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.telemetry import TelemetrySink
from thoughtgate.testing.emulator import Emulator, EmulatorServer, serve_emulator
from thoughtgate.testing.emulator.scenarios import builtin_scenarios
from thoughtgate.testing.fake import FakeProvider, reasoning, text, tool_call
from thoughtgate.types import ToolResultPart

NARRATING = {"visible_reasoning": {"summarizers": ["narration", "phases"]}}
THOUGHT = "SECRET-THOUGHT the user wants a day trip, weather first then trains"
SUMMARY = "SECRET-SUMMARY **Planning the day trip** weather first, then the morning trains"
ANSWER = "Take the 09:12 train; Porto is sunny all day."


def narrate(summary: Any, call_id: str) -> list[Any]:
    return tool_call(NARRATION_TOOL, {"summary": summary}, call_id=call_id)


def story(request: TurnRequest, turn: int) -> Iterator[Any]:
    """think -> tool -> think -> tool -> answer, narrating beside each real call."""
    if turn == 0:
        yield reasoning(THOUGHT)
        yield reasoning(SUMMARY, kind="summary", index=1)
        yield narrate("Checking the forecast for Porto first", "n1")
        yield tool_call("check_weather", {"city": "Porto"}, call_id="c1")
    elif turn == 1:
        yield reasoning("SECRET-THOUGHT sunny; trains next")
        yield narrate("The weather is good, so the trip is on.", "n2")
        yield narrate("Finding a morning train", "n3")
        yield tool_call("find_trains", {"origin": "Lisbon"}, call_id="c2")
    else:
        yield text(ANSWER)


CALLS: list[str] = []


@tool
def check_weather(city: str) -> str:
    """The weather today."""
    CALLS.append("check_weather")
    return f"{city}: sunny, 24 C"


@tool
def find_trains(origin: str) -> str:
    """Morning trains."""
    CALLS.append("find_trains")
    return f"{origin}: 07:05, 09:12"


async def run(
    script: Any,
    *,
    config: dict[str, Any] | None = NARRATING,
    mode: str = "surface",
    tools: ToolRegistry | None = None,
    exporter: InMemorySpanExporter | None = None,
) -> tuple[FakeProvider, Any, list[Event]]:
    settings = Config.from_mapping(config or {})
    provider = FakeProvider(script)
    sinks = []
    if exporter is not None:
        traces = TracerProvider(shutdown_on_exit=False)
        traces.add_span_processor(SimpleSpanProcessor(exporter))
        sinks.append(TelemetrySink(traces, capture_content=True))
    store = MemoryStore()
    runtime = Runtime(
        store,
        settings,
        provider_factory=lambda model: provider,
        tools=tools or ToolRegistry([check_weather, find_trains]),
        sinks=sinks,
    )
    created = await runtime.create_run(
        RunRequest("Plan a day trip to Porto", model="fake:x"), chain_of_thought=mode
    )
    try:
        record = await runtime.execute(created.run_id)
    except UsageError:
        record = None
    return provider, record, await store.read(created.run_id)


def offered(request: TurnRequest) -> list[str]:
    return [spec.name for spec in request.tools]


def dumps(events: list[Event]) -> str:
    return json.dumps([e.to_dict() for e in events])


def outside_cot(events: list[Event]) -> str:
    """Every event but the visible steps, without the tool definitions the model was offered
    (``task.started`` ``tools``, the trace surface only: ``visible_step`` is listed there)."""
    kept = []
    for e in events:
        if e.type.startswith("cot."):
            continue
        if e.type == EventType.TASK_STARTED:
            e = Event(e.seq, e.run_id, e.type, {k: v for k, v in e.payload.items() if k != "tools"})
        kept.append(e)
    return dumps(kept)


# --------------------------------------------------------------------------- offered or not


@pytest.mark.parametrize(
    ("config", "mode", "expected"),
    [
        (None, "surface", False),  # the default: phases only
        (NARRATING, "surface", True),
        (NARRATING, "telemetry_only", True),  # narration is not reasoning
        (NARRATING, "hidden", False),  # no visible steps at all in hidden mode
        ({"visible_reasoning": {"summarizers": ["narration"], "enabled": False}}, "surface", False),
    ],
)
async def test_visible_step_is_offered_only_when_the_operator_names_narration(
    config: dict[str, Any] | None, mode: str, expected: bool
) -> None:
    provider, _, _ = await run(story, config=config, mode=mode)
    assert (NARRATION_TOOL in offered(provider.requests[0])) is expected
    if expected:
        [spec] = [s for s in provider.requests[0].tools if s.name == NARRATION_TOOL]
        assert spec.description == NARRATION_DESCRIPTION
        assert NARRATION_DESCRIPTION == (
            "One short sentence for the person watching: what you are about to do or what you "
            "found, with no secrets, links, paths or data."
        )
        assert spec.parameters["required"] == ["summary"]
        assert list(spec.parameters["properties"]) == ["summary"]
        assert spec.parameters["properties"]["summary"]["type"] == "string"


# --------------------------------------------------------------------------- the loop


async def test_narration_beside_tool_calls_adds_no_turn_and_never_becomes_a_card() -> None:
    CALLS.clear()
    provider, record, events = await run(story)
    assert record.status == "completed"
    assert provider.turns == 3, "narrating beside real calls costs no model turn"
    assert CALLS == ["check_weather", "find_trains"], "visible_step never reaches the registry"
    # answered together: one tool message with the acknowledgement and the real result, in order
    history = provider.requests[-1].messages
    answered = [
        [(p.call_id, p.content) for p in m.parts if isinstance(p, ToolResultPart)]
        for m in history
        if m.role == "tool"
    ]
    assert answered == [
        [("n1", NARRATION_ACK), ("c1", "Porto: sunny, 24 C")],
        [("n2", NARRATION_ACK), ("n3", NARRATION_ACK), ("c2", "Lisbon: 07:05, 09:12")],
    ]
    # no card, no tool detail, no tool call record: the narration lives only in cot.* events
    assert not [e for e in events if e.type.startswith("tool.") and "n" in e.payload["call_id"]]
    for e in events:
        if e.type == EventType.AGENT_RESPONSE:
            assert NARRATION_TOOL not in {c["name"] for c in e.payload["tool_calls"]}
    for sentence in ("Checking the forecast", "The weather is good", "Finding a morning train"):
        assert sentence not in outside_cot(events)
        assert sentence in dumps(events)


async def test_a_viewer_follows_think_tool_think_live_and_after_reload() -> None:
    _, record, events = await run(story)
    for role in ("viewer", "member", "developer"):
        shown = filter_events(events, role, mode=record.chain_of_thought)
        live = ThreadBuilder()
        for event in shown:  # live: one SSE JSON frame at a time
            live.feed(json.loads(json.dumps(event.to_dict())))
        reloaded = rebuild(shown)
        assert live.view() == reloaded, role
        order = [
            f"card:{i.call_id}" if isinstance(i, ToolCard) else i.step.summary
            for i in reloaded.items
            if isinstance(i, StepItem | ToolCard)
        ]
        assert order == ["card:c1", "The weather is good, so the trip is on.", "card:c2"], role
        why = {card.call_id: [s.summary for s in card.reasoning] for card in reloaded.cards}
        assert why == {
            "c1": ["Checking the forecast for Porto first"],
            "c2": ["Finding a morning train"],
        }
        assert all(s.source == "narration" for s in reloaded.steps)
        assert [c.call_id for c in reloaded.cards] == ["c1", "c2"]  # no card for visible_step
        assert reloaded.message.text == ANSWER
        receipt = reloaded.receipt
        assert receipt is not None and receipt.step_sources["narration"] == 3
        assert receipt.notes == ()  # nothing the operator had to opt into
    viewer = dumps(filter_events(events, "viewer", mode="surface"))
    assert "SECRET-THOUGHT" not in viewer and "SECRET-SUMMARY" not in viewer


async def test_a_turn_that_only_narrates_costs_one_more_turn_and_becomes_a_step() -> None:
    def script(request: TurnRequest, turn: int) -> Iterator[Any]:
        if turn == 0:
            yield narrate("Reading the question first", "n1")
        else:
            yield text("Done.")

    provider, record, events = await run(script)
    assert record.status == "completed" and provider.turns == 2
    steps = [e.payload for e in events if e.type == EventType.COT_STEP]
    assert [(s["summary"], s["source"]) for s in steps] == [
        ("Reading the question first", "narration")
    ]
    assert [e.payload["summary"] for e in events if e.type == EventType.COT_PHASE][-2:] == [
        "Writing the answer",
        "Done",
    ]


async def test_a_narration_the_policy_drops_is_stored_nowhere_and_the_model_learns_nothing() -> (
    None
):
    password = "Tr0ub4dor&3x"

    def script(request: TurnRequest, turn: int) -> Iterator[Any]:
        if turn == 0:
            yield narrate(f"Signing in with {password} now", "n1")
            yield narrate({"not": "a string"}, "n2")
            yield narrate(THOUGHT, "n3")  # the model's own thinking, verbatim
            yield narrate("Looking for the trip details", "n4")
            yield reasoning(THOUGHT)
            yield tool_call("check_weather", {"city": "Porto"}, call_id="c1")
        else:
            yield text("Done.")

    provider, _, events = await run(script)
    assert password not in dumps(events), "not even an owner's read holds a dropped step"
    assert "a string" not in dumps(events)
    [answered] = [m for m in provider.requests[-1].messages if m.role == "tool"]
    acks = [p.content for p in answered.parts if isinstance(p, ToolResultPart)]
    assert acks[:4] == [NARRATION_ACK] * 4  # the same plain answer each time
    [receipt] = [e.payload["receipt"] for e in events if e.type == EventType.COT_COMPLETED]
    assert receipt["dropped_by_reason"] == {"credential": 1, "raw_reasoning": 1}
    why = [e.payload["summary"] for e in events if e.type == EventType.COT_TOOL_REASONING]
    assert why == ["Looking for the trip details"]


async def test_narration_that_repeats_a_provider_summary_is_reasoning_and_dropped() -> None:
    summary = "I'm weighing the morning trains against the afternoon ones for the day trip"

    def script(request: TurnRequest, turn: int) -> Iterator[Any]:
        if turn == 0:
            yield reasoning(summary, kind="summary")
            yield narrate(summary, "n1")
            yield narrate("Comparing train times", "n2")
        else:
            yield text("Done.")

    _, _, events = await run(script)
    steps = [e.payload["summary"] for e in events if e.type == EventType.COT_STEP]
    assert steps == ["Comparing train times"]
    [receipt] = [e.payload["receipt"] for e in events if e.type == EventType.COT_COMPLETED]
    assert receipt["dropped_by_reason"] == {"raw_reasoning": 1}


async def test_narration_never_reaches_telemetry_even_with_content_capture() -> None:
    exporter = InMemorySpanExporter()
    await run(story, exporter=exporter)
    spans = exporter.get_finished_spans()
    assert spans
    attributes = json.dumps([dict(s.attributes or {}) for s in spans], default=str)
    assert "Porto: sunny" in attributes  # content capture is on: tool results are there
    assert "Checking the forecast" not in attributes
    # the model was offered visible_step (the tool definitions say so), but its calls are steps
    # for the reader, never tool calls or messages in the trace
    offered = [
        json.loads(str(s.attributes["gen_ai.tool.definitions"]))
        for s in spans
        if s.attributes and "gen_ai.tool.definitions" in s.attributes
    ]
    assert offered and all({"type": "function", "name": NARRATION_TOOL} in d for d in offered)
    without = [
        {k: v for k, v in (s.attributes or {}).items() if k != "gen_ai.tool.definitions"}
        for s in spans
    ]
    assert NARRATION_TOOL not in json.dumps(without, default=str)


async def test_a_tool_named_visible_step_is_refused_while_narrating() -> None:
    @tool(name=NARRATION_TOOL)
    def impostor(summary: str) -> str:
        """Pretends to be the narration tool."""
        return summary

    _, record, events = await run(story, tools=ToolRegistry([impostor]))
    assert record is None
    [failed] = [e for e in events if e.type == EventType.RUN_FAILED]
    assert "built-in narration tool" in failed.payload["error"]
    _, fine, _ = await run(story, config=None, tools=ToolRegistry([impostor]))
    assert fine is not None, "without narration the name is the user's"


# --------------------------------------------------------------------------- the four formats


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorServer]:
    emulated = Emulator().add(builtin_scenarios()["narrated-tool-loop"], default=True)
    with serve_emulator(emulated) as server:
        yield server


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_each_wire_format_takes_narration_beside_its_tool_calls(
    emulator: EmulatorServer, case: Case
) -> None:
    """The real adapters send the acknowledgement in the same tool message as the real result
    (the emulator validates tool-result pairing as each API does), in three model turns."""
    emulator.emulator.requests.clear()
    store = MemoryStore()
    runtime = Runtime(
        store,
        Config.from_mapping(NARRATING),
        provider_factory=lambda model: make_provider(
            model, url=emulator.url, scenario="narrated-tool-loop"
        ),
        tools=demo_tools(),
    )
    record = await runtime.run(
        RunRequest("Largest city?", model=case.model), chain_of_thought="surface"
    )
    assert record.status == "completed", record.error
    assert [r.status for r in emulator.emulator.requests] == [200, 200, 200]
    events = await store.read(record.run_id)
    viewer = rebuild(filter_events(events, "viewer", mode="surface"))
    assert [c.tool_key for c in viewer.cards] == ["get_country", "largest_city"]
    assert [s.summary for s in viewer.steps] == ["Found your country in your profile."]
    assert [[s.summary for s in c.reasoning] for c in viewer.cards] == [
        ["Checking your profile for your country"],
        ["Looking up its largest city"],
    ]
    assert "visible_step" not in outside_cot(events)
    offered_names = json.dumps(emulator.emulator.requests[0].body.get("tools"))
    assert "visible_step" in offered_names and NARRATION_DESCRIPTION in offered_names
