"""The pipeline plugged into the runtime's agent loop through ``observer_factory``.

These tests need the runtime and agent loop (``thoughtgate.orchestration.runtime``); on a tree
without them they are skipped, not faked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from thoughtgate.access.filter import filter_events
from thoughtgate.config import Config
from thoughtgate.events.pipeline import VisibleReasoningObserver, observer_factory
from thoughtgate.events.schema import EventType
from thoughtgate.events.thread import PhaseItem, StepItem, ToolCard, rebuild
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text, tool_call
from thoughtgate.types import Chunk

runtime_mod = pytest.importorskip("thoughtgate.orchestration.runtime")
tools_mod = pytest.importorskip("thoughtgate.engine.tools")

SYSTEM = "You are Atlas. Never reveal the partner commission table or the escalation roster."


def weather_script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
    if turn == 0:
        yield reasoning("SECRET-THOUGHT the user wants Paris weather, call the tool.")
        yield reasoning("**Looking up the weather**", kind="summary", index=1)
        yield tool_call("get_weather", {"city": "Paris"}, call_id="call_1")
    else:
        yield reasoning("SECRET-THOUGHT sunny, answer briefly.")
        yield reasoning("**Writing a short answer**", kind="summary", index=1)
        yield text("Sunny in Paris.")


SUMMARIES = Config.from_mapping(
    {"visible_reasoning": {"summarizers": ["provider_summaries", "phases"]}}
)
"""The operator's explicit opt-in: end users may read the provider's summaries."""


async def run(mode: str, config: Config | None = None) -> tuple[Any, list[Any]]:
    config = config or SUMMARIES

    @tools_mod.tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"Sunny, 24C in {city}"

    store = MemoryStore()
    runtime = runtime_mod.Runtime(
        store,
        config,
        provider_factory=lambda model: FakeProvider(weather_script),
        tools=tools_mod.ToolRegistry([get_weather]),
        observer_factory=observer_factory(config, hidden_texts=lambda run: [SYSTEM]),
    )
    request = runtime_mod.RunRequest("Weather in Paris?", model="fake:x", system=SYSTEM)
    record = await runtime.run(request, chain_of_thought=mode)
    return record, await store.read(record.run_id)


async def test_surface_run_gets_ordered_steps_cards_and_a_receipt_before_the_answer() -> None:
    record, events = await run("surface")
    types = [e.type for e in events]
    assert types.index(EventType.COT_COMPLETED) < types.index(EventType.MESSAGE_COMPLETED)
    for e in events:
        if e.type.startswith("cot."):
            assert "SECRET-THOUGHT" not in str(e.payload)
            assert e.payload["marker"] == "visible_reasoning_v1"
    viewer = rebuild(filter_events(events, "viewer", mode=record.chain_of_thought))
    developer = rebuild(filter_events(events, "developer", mode=record.chain_of_thought))
    order = [
        i.step.summary if isinstance(i, StepItem | PhaseItem) else f"card:{i.call_id}"
        for i in viewer.items
        if isinstance(i, StepItem | PhaseItem | ToolCard)
    ]
    think, tool, think_again = (
        order.index("Looking up the weather"),
        order.index("card:call_1"),
        order.index("Writing a short answer"),
    )
    assert think < tool < think_again
    [card] = viewer.cards
    assert (card.status, card.input, card.output) == ("completed", None, None)
    assert developer.cards[0].input == {"city": "Paris"}
    assert viewer.raw_reasoning is None
    assert developer.raw_reasoning is not None and "SECRET-THOUGHT" in developer.raw_reasoning
    assert viewer.message.text == "Sunny in Paris." and viewer.status == "completed"
    assert viewer.receipt is not None and viewer.receipt.raw_reasoning_exists
    assert viewer.discarded == 0


async def test_telemetry_only_run_shows_only_phases() -> None:
    record, events = await run("telemetry_only")
    owner = rebuild(filter_events(events, "owner", mode=record.chain_of_thought))
    assert owner.steps == ()
    assert any(isinstance(i, PhaseItem) for i in owner.items)
    assert owner.raw_reasoning is None
    assert owner.receipt is not None and owner.receipt.raw_reasoning_surface == "trace"


async def test_hidden_or_disabled_runs_get_no_cot_events() -> None:
    _, hidden = await run("hidden")
    off = Config.from_mapping({"visible_reasoning": {"enabled": False}})
    _, disabled = await run("surface", off)
    assert not [e for e in hidden + disabled if e.type.startswith("cot.")]


def test_the_observer_matches_the_loop_hooks() -> None:
    factory = observer_factory(Config())
    disclosure = pytest.importorskip("thoughtgate.disclosure").Disclosure
    assert isinstance(factory(None, disclosure.of("surface")), VisibleReasoningObserver)
    assert factory(None, disclosure.of("hidden")) is None
