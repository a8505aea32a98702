"""Each model turn records when its request was sent, when its first chunk came and when its
stream ended (``agent.response.call``: time to first token and duration); a failure records its
type on the turn that failed and on the run's end. A reader debugging a run reads these from
``agent.response`` and the terminal event, live and after a reload."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.scripts import cut, outage

from thoughtgate.config import Config
from thoughtgate.errors import ProviderStreamError
from thoughtgate.events.schema import Event, EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, ScriptFn, reasoning, text, tool_call

WAIT = 0.15


def _slow_start(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    """Turn 0 thinks for WAIT seconds, then calls a tool; turn 1 answers after WAIT more."""

    async def gen() -> AsyncIterator[Any]:
        await asyncio.sleep(WAIT)
        if turn == 0:
            yield reasoning("weighing it")
            yield tool_call("missing_tool", {"q": 1}, call_id="c0")
            return
        yield text("An")
        await asyncio.sleep(WAIT)
        yield text("swer.")

    return gen()


def _loops(request: TurnRequest, turn: int) -> list[Any]:
    return [tool_call("missing_tool", {}, call_id=f"c{turn}")]


async def _run(script: ScriptFn, **config: Any) -> tuple[list[Event], str]:
    """One run on a fake provider playing ``script`` (handed to this runtime, never registered)."""
    store = MemoryStore()
    runtime = Runtime(
        store,
        Config.from_mapping({"orchestration": config} if config else {}),
        provider_factory=lambda model: FakeProvider(script, model=model),
    )
    run = await runtime.create_run(
        RunRequest("go", model="fake:timing", chain_of_thought="surface")
    )
    await runtime.execute(run.run_id)
    return await store.read(run.run_id), run.run_id


def _responses(events: list[Event]) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in events if e.type == EventType.AGENT_RESPONSE]


async def test_each_turn_records_when_it_was_sent_first_answered_and_ended() -> None:
    before = time.time()
    events, _ = await _run(_slow_start)
    after = time.time()
    first, second = (r["call"] for r in _responses(events))
    for call in (first, second):
        assert before <= call["started_at"] < call["first_chunk_at"] <= call["ended_at"] <= after
        assert call["first_chunk_at"] - call["started_at"] >= WAIT * 0.9  # time to first token
    assert second["ended_at"] - second["started_at"] >= 2 * WAIT * 0.9  # the pause counts too
    assert first["ended_at"] <= second["started_at"]
    # the turn's own event is recorded after its stream ended
    by_turn = {e.payload["turn"]: e.ts for e in events if e.type == EventType.AGENT_RESPONSE}
    assert by_turn[0] >= first["ended_at"]


async def test_a_turn_with_no_chunk_has_no_first_chunk_time() -> None:
    def silent(request: TurnRequest, turn: int) -> list[Any]:
        raise ProviderStreamError("nothing came", provider="fake")

    events, _ = await _run(silent)
    (turn,) = _responses(events)
    assert "first_chunk_at" not in turn["call"]
    assert turn["call"]["ended_at"] >= turn["call"]["started_at"]


@pytest.mark.parametrize(
    ("script", "status", "error_type"),
    [
        (outage, "failed", "overloaded"),  # the provider's own error code
        (cut, "partial", "ProviderStreamError"),  # else the error's class
    ],
    ids=["outage", "cut"],
)
async def test_a_provider_failure_names_its_type_on_the_turn_and_the_runs_end(
    script: ScriptFn, status: str, error_type: str
) -> None:
    events, _ = await _run(script)
    (turn,) = _responses(events)
    assert turn["error_type"] == error_type and turn["error"]
    end = events[-1]
    assert end.payload["status"] == status
    assert end.payload["error_type"] == error_type
    assert end.payload["error"] == turn["error"]


async def test_the_turn_limit_is_named_as_the_kind_of_failure() -> None:
    events, _ = await _run(_loops, max_turns=2)
    end = events[-1]
    assert (end.type, end.payload["status"]) == (EventType.RUN_SETTLEMENT_COMPLETED, "partial")
    assert end.payload["error_type"] == "max_turns"
    assert all("error_type" not in t for t in _responses(events))  # no turn failed


async def test_a_completed_run_names_no_error_type() -> None:
    events, _ = await _run(_slow_start)
    assert "error_type" not in events[-1].payload and "error" not in events[-1].payload
