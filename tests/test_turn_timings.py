"""Each model turn records when it started, its time to first token and its duration; a failure
records its class on the turn that failed and on the run's end. A reader debugging a run reads
these from ``agent.response`` and the terminal event, live and after a reload."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from script_support import cut, outage

from thoughtgate.config import Config
from thoughtgate.events.schema import Event, EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FAKE_SCRIPTS, reasoning, text, tool_call

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


def _silent(request: TurnRequest, turn: int) -> list[Any]:
    return []  # no token at all: the turn ends empty


def _loops(request: TurnRequest, turn: int) -> list[Any]:
    return [tool_call("missing_tool", {}, call_id=f"c{turn}")]


FAKE_SCRIPTS.update(
    {
        "timing-slow": _slow_start,
        "timing-silent": _silent,
        "timing-outage": outage,
        "timing-cut": cut,
        "timing-loops": _loops,
    }
)


async def _run(model: str, **config: Any) -> tuple[list[Event], str]:
    store = MemoryStore()
    runtime = Runtime(store, Config.from_mapping({"orchestration": config} if config else {}))
    run = await runtime.create_run(RunRequest("go", model=model, chain_of_thought="surface"))
    await runtime.execute(run.run_id)
    return await store.read(run.run_id), run.run_id


def _responses(events: list[Event]) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in events if e.type == EventType.AGENT_RESPONSE]


async def test_each_turn_records_its_start_time_to_first_token_and_duration() -> None:
    before = time.time()
    events, _ = await _run("fake:timing-slow")
    after = time.time()
    first, second = _responses(events)
    for turn in (first, second):
        assert before <= turn["started_at"] <= after
        assert WAIT * 0.9 <= turn["ttft_s"] <= turn["duration_s"]
    assert second["duration_s"] >= 2 * WAIT * 0.9  # the pause after the first token counts
    assert first["started_at"] + first["duration_s"] <= second["started_at"]
    # the turn's own event is recorded after its stream ended
    by_turn = {e.payload["turn"]: e.ts for e in events if e.type == EventType.AGENT_RESPONSE}
    assert by_turn[0] >= first["started_at"] + first["duration_s"] - 0.01


async def test_a_turn_with_no_token_has_no_time_to_first_token() -> None:
    events, _ = await _run("fake:timing-silent")
    (turn,) = _responses(events)
    assert turn["ttft_s"] is None and turn["duration_s"] >= 0


@pytest.mark.parametrize(
    ("model", "status", "error_class"),
    [
        ("fake:timing-outage", "failed", "ProviderHTTPError"),
        ("fake:timing-cut", "partial", "ProviderStreamError"),
    ],
)
async def test_a_provider_failure_names_its_class_on_the_turn_and_the_runs_end(
    model: str, status: str, error_class: str
) -> None:
    events, _ = await _run(model)
    (turn,) = _responses(events)
    assert turn["error_class"] == error_class and turn["error"]
    end = events[-1]
    assert end.payload["status"] == status
    assert end.payload["error_class"] == error_class
    assert end.payload["error"] == turn["error"]


async def test_the_turn_limit_is_named_as_the_kind_of_failure() -> None:
    events, _ = await _run("fake:timing-loops", max_turns=2)
    end = events[-1]
    assert (end.type, end.payload["status"]) == (EventType.RUN_SETTLEMENT_COMPLETED, "partial")
    assert end.payload["error_class"] == "max_turns"
    assert all("error_class" not in t for t in _responses(events))  # no turn failed


async def test_a_completed_run_names_no_error_class() -> None:
    events, _ = await _run("fake:timing-slow")
    assert "error_class" not in events[-1].payload and "error" not in events[-1].payload
