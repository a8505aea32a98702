"""Disclosure routing, precedence, backends and failure handling, end to end on the runtime."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from thoughtgate.access.filter import filter_events, filter_run
from thoughtgate.config import Config
from thoughtgate.errors import ProviderStreamError, UsageError
from thoughtgate.orchestration.runtime import RunRequest, Runtime, TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text
from thoughtgate.types import Chunk, ContinuityBlock, ContinuityChunk

THOUGHT = "Ünïcode thought 🤔 about the sky"
ANSWER = "It is blue."


def script(request: TurnRequest, turn: int) -> Iterator[Chunk]:
    yield reasoning(THOUGHT[:10])
    yield reasoning(THOUGHT[10:])
    yield ContinuityChunk(
        ContinuityBlock("anthropic.thinking", {"thinking": THOUGHT, "signature": "S"})
    )
    yield text("It is ")
    yield text("blue.")


class Recorder:
    def __init__(self, fn: Any = script) -> None:
        self.providers: list[FakeProvider] = []
        self.fn = fn

    def __call__(self, model: str) -> FakeProvider:
        provider = FakeProvider(self.fn, model=model)
        self.providers.append(provider)
        return provider


def make(config: Config | None = None, fn: Any = script) -> tuple[Runtime, MemoryStore, Recorder]:
    store = MemoryStore()
    factory = Recorder(fn)
    return Runtime(store, config, provider_factory=factory), store, factory


def types(events: list[Any]) -> list[str]:
    return [e.type for e in events]


async def test_surface_mode_records_reasoning_everywhere_it_belongs() -> None:
    runtime, store, factory = make()
    run = await runtime.run(RunRequest("why?", model="fake:x"), chain_of_thought="surface")
    assert factory.providers[0].requests[0].reasoning.enabled
    task = run.tasks[0]
    assert task.reasoning == THOUGHT and task.output == ANSWER
    assert THOUGHT not in (task.output or "")
    events = await store.read(run.run_id)
    deltas = [e for e in events if e.type == "reasoning.delta"]
    assert "".join(e.payload["text"] for e in deltas) == THOUGHT
    response = next(e for e in events if e.type == "agent.response")
    assert response.payload["reasoning"] == THOUGHT
    assert response.payload["reasoning_chars"] == len(THOUGHT)
    assert response.payload["reasoning_bytes"] == len(THOUGHT.encode())
    assert response.payload["answer"] == ANSWER
    for e in events:
        if e.type.startswith("message."):
            assert THOUGHT[10:] not in json.dumps(e.payload)
    worker = next(e for e in events if e.type == "worker.completed")
    assert worker.payload["trace"]["reasoning"] == THOUGHT
    assert worker.payload["mode"] == "surface"


async def test_telemetry_only_puts_reasoning_only_in_the_trace() -> None:
    runtime, store, factory = make()
    run = await runtime.run(RunRequest("why?", model="fake:x"), chain_of_thought="telemetry_only")
    assert factory.providers[0].requests[0].reasoning.enabled, "telemetry_only asks for reasoning"
    assert run.tasks[0].reasoning is None
    events = await store.read(run.run_id)
    assert "reasoning.delta" not in types(events)
    worker = next(e for e in events if e.type == "worker.completed")
    assert worker.payload["trace"]["reasoning"] == THOUGHT
    others = [e for e in events if e.type != "worker.completed"]
    assert THOUGHT not in json.dumps([e.to_dict() for e in others])
    owner_view = json.dumps(
        [e.to_dict() for e in filter_events(events, "owner", mode="telemetry_only")]
    )
    assert THOUGHT not in owner_view and "Ünïcode" not in owner_view
    assert (
        "reasoning"
        not in filter_run(await store.get_run(run.run_id), "owner").to_json()["tasks"][0]
    )


async def test_hidden_requests_and_captures_nothing() -> None:
    runtime, store, factory = make()
    run = await runtime.run(RunRequest("why?", model="fake:x"))
    assert run.chain_of_thought == "hidden"
    assert not factory.providers[0].requests[0].reasoning.enabled
    events = await store.read(run.run_id)
    blob = json.dumps([e.to_dict() for e in events])
    assert "Ünïcode" not in blob and "trace" not in blob
    assert run.tasks[0].output == ANSWER


async def test_hidden_discards_reasoning_a_provider_sends_anyway() -> None:
    from thoughtgate.types import ReasoningDelta

    class Leaky(FakeProvider):
        async def stream(self, request: TurnRequest) -> Any:  # ignores the mode
            yield ReasoningDelta("LEAKED")
            yield text("ok")

    store = MemoryStore()
    runtime = Runtime(store, provider_factory=lambda m: Leaky(script))
    run = await runtime.run(RunRequest("q", model="fake:x"))
    assert "LEAKED" not in json.dumps([e.to_dict() for e in await store.read(run.run_id)])


async def test_mode_recorded_on_run_and_in_capability_resolved() -> None:
    config = Config.from_mapping({"orchestration": {"chain_of_thought": "surface"}})
    runtime, store, _ = make(config)
    run = await runtime.run(RunRequest("q", model="fake:x", chain_of_thought="telemetry_only"))
    assert run.chain_of_thought == "telemetry_only"
    resolved = next(e for e in await store.read(run.run_id) if e.type == "capability.resolved")
    assert resolved.payload["chain_of_thought"] == "telemetry_only"
    assert resolved.payload["sources"]["chain_of_thought"] == "run"
    run2 = await runtime.run(
        RunRequest("q", model="fake:x", chain_of_thought="telemetry_only"),
        chain_of_thought="hidden",
    )
    assert run2.chain_of_thought == "hidden"
    run3 = await runtime.run(RunRequest("q", model="fake:x"))
    assert run3.chain_of_thought == "surface"


async def test_event_order_and_single_terminal_event() -> None:
    runtime, store, _ = make()
    run = await runtime.run(RunRequest("q", model="fake:x"), chain_of_thought="surface")
    seen = types(await store.read(run.run_id))
    assert seen[:3] == ["run.started", "capability.resolved", "task.started"]
    assert seen[-1] == "run.settlement.completed"
    assert (
        seen.index("agent.response")
        < seen.index("message.completed")
        < seen.index("worker.completed")
        < seen.index("task.completed")
    )
    terminals = [t for t in seen if t in ("run.settlement.completed", "run.failed", "run.error")]
    assert terminals == ["run.settlement.completed"]


async def test_inline_backend_never_calls_a_model() -> None:
    store = MemoryStore()

    def shout(prompt: str) -> str:
        return prompt.upper()

    def no_model(model: str) -> FakeProvider:
        raise AssertionError("inline must not create a provider")

    runtime = Runtime(store, provider_factory=no_model, inline_workers={"default": shout})
    run = await runtime.run(RunRequest("hi", worker_backend="inline"), chain_of_thought="surface")
    assert run.tasks[0].output == "HI" and run.tasks[0].reasoning is None
    events = await store.read(run.run_id)
    assert "agent.response" not in types(events) and "reasoning.delta" not in types(events)
    with pytest.raises(UsageError, match="no inline worker named 'nope'"):
        await runtime.create_run(
            RunRequest("x", worker_backend="inline", tasks=[TaskSpec("x", worker="nope")])
        )


async def test_several_tasks_run_in_order_with_their_own_models() -> None:
    runtime, _store, factory = make()
    run = await runtime.run(
        RunRequest(
            "both", model="fake:a", tasks=[TaskSpec("one"), TaskSpec("two", model="fake:b")]
        ),
        chain_of_thought="surface",
    )
    assert [t.prompt for t in run.tasks] == ["one", "two"]
    assert [p.model for p in factory.providers] == ["fake:a", "fake:b"]
    assert all(t.status == "completed" for t in run.tasks)
    assert run.usage["output_tokens"] == sum(t.usage["output_tokens"] for t in run.tasks)


async def test_bad_requests_fail_before_anything_is_recorded() -> None:
    runtime, store, _ = make()
    with pytest.raises(UsageError, match="PROVIDER:MODEL"):
        await runtime.create_run(RunRequest("q"))
    with pytest.raises(UsageError, match="unknown provider 'nope'"):
        await runtime.create_run(RunRequest("q", model="nope:x"))
    assert await store.list_runs() == []


def cut_script(request: TurnRequest, turn: int) -> Iterator[Chunk]:
    yield reasoning("partial thou")
    yield text("partial ans")
    raise ProviderStreamError("connection reset", provider="fake")


async def test_cut_stream_keeps_partial_reasoning_and_text() -> None:
    runtime, store, _ = make(fn=cut_script)
    run = await runtime.run(RunRequest("q", model="fake:x"), chain_of_thought="surface")
    assert run.status == "partial"
    task = run.tasks[0]
    assert task.status == "partial" and task.output == "partial ans"
    assert task.reasoning == "partial thou"
    events = await store.read(run.run_id)
    partial = next(e for e in events if e.type == "message.partially_completed")
    assert "connection reset" in partial.payload["error"]
    response = next(e for e in events if e.type == "agent.response")
    assert response.payload["complete"] is False and response.payload["reasoning"] == "partial thou"
    assert types(events)[-1] == "run.settlement.completed"


@pytest.mark.parametrize("mode", ["surface", "telemetry_only"])
async def test_reasoning_cut_inside_an_emoji_is_recorded_and_the_run_completes(mode: str) -> None:
    """A provider's reasoning cut inside an emoji (a lone surrogate, kept exactly: ADR 0114) is
    recorded whole with its size, as UTF-8 with the surrogate counts it (3 bytes), and the run
    completes; measuring it raised ``UnicodeEncodeError`` and ended the run ``error``."""
    cut = "half an emoji \ud83d, then more"

    def cut_script(request: TurnRequest, turn: int) -> Iterator[Chunk]:
        yield reasoning(cut)
        yield text("done")

    runtime, store, _ = make(fn=cut_script)
    run = await runtime.run(RunRequest("q", model="fake:x"), chain_of_thought=mode)
    assert run.status == "completed", run.error
    events = await store.read(run.run_id)
    if mode == "surface":
        sized = next(e for e in events if e.type == "agent.response").payload
    else:
        sized = next(e for e in events if e.type == "worker.completed").payload["trace"]
    assert sized["reasoning"] == cut
    assert sized["reasoning_bytes"] == len(cut.encode("utf-8", "surrogatepass")) == len(cut) + 2


async def test_large_reasoning_is_never_truncated() -> None:
    big = "x" * 300_000 + "é" * 1000

    def big_script(request: TurnRequest, turn: int) -> Iterator[Chunk]:
        for i in range(0, len(big), 4096):
            yield reasoning(big[i : i + 4096])
        yield text("done")

    runtime, store, _ = make(fn=big_script)
    run = await runtime.run(RunRequest("q", model="fake:x"), chain_of_thought="surface")
    response = next(e for e in await store.read(run.run_id) if e.type == "agent.response")
    assert response.payload["reasoning"] == big
    assert response.payload["reasoning_bytes"] == len(big.encode())
