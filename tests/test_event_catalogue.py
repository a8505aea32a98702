"""The event catalogue: every event type has a declared payload, real producers write every one of
them in that shape, the daemon publishes it in ``/openapi.json``, and ``docs/events.md`` is the
generated page (a stale page fails here)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.scripts import outage

from thoughtgate.config import Config
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.events.catalogue import catalogue_schema, render_markdown, validate_event
from thoughtgate.events.payloads import EVENT_SPECS
from thoughtgate.events.schema import EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import Provider, TurnRequest
from thoughtgate.server.manager import RunManager
from thoughtgate.server.openapi import build_openapi
from thoughtgate.server.routes import all_endpoints
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text, tool_call
from thoughtgate.types import Chunk, ContinuityBlock, Message, TextPart

DOC = Path(__file__).resolve().parents[1] / "docs" / "events.md"


def test_every_event_type_name_has_a_declared_payload() -> None:
    names = {v for k, v in vars(EventType).items() if k.isupper()}
    assert names == set(EVENT_SPECS)


def test_docs_events_md_is_generated_from_the_declarations() -> None:
    assert DOC.read_text(encoding="utf-8") == render_markdown(), (
        "docs/events.md is stale: run `make events-doc` "
        "(python -m thoughtgate.events.catalogue docs/events.md)"
    )


def test_openapi_publishes_the_catalogue_and_the_declared_views() -> None:
    doc = build_openapi(all_endpoints(), version="test")
    schemas = doc["components"]["schemas"]
    event = schemas["Event"]
    assert {v.split("/")[-1] for v in event["discriminator"]["mapping"].values()} == {
        s.name.title().replace(".", "").replace("_", "") + "Event" for s in EVENT_SPECS.values()
    }
    page = schemas["EventPage"]["properties"]["events"]["items"]
    assert page == {"$ref": "#/components/schemas/Event"}
    tool_failed = schemas["ToolFailedPayload"]["properties"]
    assert tool_failed["error"]["x-visibility"] == "tool_detail"
    assert tool_failed["error_kind"]["x-visibility"] == "public"
    assert "error" not in schemas["ToolFailedPayload"]["required"], "a viewer's copy lacks it"
    task = schemas["TaskView"]
    assert task["properties"]["reasoning"]["x-visibility"] == "reasoning"
    assert "reasoning" not in task["required"] and "output" in task["required"]
    carrier = schemas["AgentResponsePayload"]["properties"]["continuity"]
    assert carrier["items"]["properties"]["present"] == {"const": True}
    ops = {op["operationId"]: op for path in doc["paths"].values() for op in path.values()}
    ok = ops["get_run"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/RunView"}


def test_catalogue_schema_is_the_one_in_the_document() -> None:
    schema = catalogue_schema()
    assert schema["x-event-version"] == 1
    assert len(schema["oneOf"]) == len(EVENT_SPECS)


# --------------------------------------------------------------------------- real producers


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}"


@tool
async def slow_lookup(query: str, progress: Any = None) -> str:
    """Look something up, reporting progress."""
    if progress is not None:
        await progress(f"searching {query}")
    return "found"


def _broken(query: str) -> str:
    raise RuntimeError(f"backend down for {query}")


@tool(fallback=lambda query: f"cached {query}")
def flaky(query: str) -> str:
    """A tool with a fallback."""
    return _broken(query)


@tool(requires_approval=True)
def guarded(target: str) -> str:
    """Needs a person."""
    return f"changed {target}"


TOOLS = [lookup, slow_lookup, flaky, guarded]


def _loop_script(request: TurnRequest, turn: int) -> Iterator[Chunk | list[Chunk]]:
    yield reasoning(f"**Step {turn}**\n\nthinking about turn {turn}", kind="summary")
    calls = [
        ("lookup", {"query": "q"}),
        ("lookup", {"query": 7}),  # invalid arguments
        ("slow_lookup", {"query": "q"}),
        ("flaky", {"query": "q"}),
        ("guarded", {"target": "a"}),
        ("guarded", {"target": "b"}),
        ("nope", {}),
    ]
    if turn < len(calls):
        name, args = calls[turn]
        yield tool_call(name, args, call_id=f"call_{turn}")
    else:
        yield text("done")


async def _produced() -> set[str]:
    """Run real producers until every kind of event has been written; validate each one."""
    seen: list[Any] = []
    decisions = iter(["approve", "reject"])

    async def decide(call_id: str, name: str, args: Any) -> Any:
        return next(decisions)

    store = MemoryStore()
    config = Config.from_mapping(
        {
            "orchestration": {"approval_timeout_s": 0.05},
            # the operator's summarizer model explains tool calls: cot.tool.reasoning
            "visible_reasoning": {"summarizers": ["phases", "model"], "summarizer_model": "fake:s"},
        }
    )

    def factory(model: str) -> Provider:
        if model == "fake:down":
            return FakeProvider(outage)
        if model == "fake:boom":
            raise RuntimeError("internal")
        if model == "fake:other":
            return FakeProvider(lambda r, t: iter([text("ok")]), model="other")
        if model == "fake:s":
            return FakeProvider(lambda r, t: iter([text("The agent checks a source first.")]))
        return FakeProvider(_loop_script)

    def runtime(approvals: ApprovalBroker) -> Runtime:
        return Runtime(
            store, config, provider_factory=factory, tools=ToolRegistry(TOOLS), approvals=approvals
        )

    tool_run = await runtime(ApprovalBroker(decider=decide)).run(
        RunRequest("go", model="fake:x"), chain_of_thought="surface"
    )
    seen += await store.read(tool_run.run_id)
    timeout_run = await runtime(ApprovalBroker()).run(
        RunRequest("go", model="fake:x"), chain_of_thought="surface"
    )
    seen += await store.read(timeout_run.run_id)
    limited = Runtime(
        store,
        Config.from_mapping({"orchestration": {"max_turns": 1}}),
        provider_factory=factory,
        tools=ToolRegistry(TOOLS),
    )
    seen += await store.read((await limited.run(RunRequest("go", model="fake:x"))).run_id)
    foreign = ContinuityBlock("anthropic.thinking", {"signature": "s"}, provider="a", model="m")
    history = [Message.user("q"), Message("assistant", (foreign, TextPart("a")))]
    other = await runtime(ApprovalBroker()).run(
        RunRequest("next", model="fake:other", history=history)
    )
    seen += await store.read(other.run_id)
    down = await runtime(ApprovalBroker()).run(RunRequest("x", model="fake:down"))
    assert down.status == "failed"  # no answer: run.failed
    seen += await store.read(down.run_id)
    boom = await runtime(ApprovalBroker()).create_run(RunRequest("x", model="fake:boom"))
    with pytest.raises(RuntimeError):  # not ours: run.error
        await runtime(ApprovalBroker()).execute(boom.run_id)
    seen += await store.read(boom.run_id)

    # a run whose process stopped, resumed by another: run.resumed, written by the claim that
    # begins its execution there (orchestration.resume)
    from thoughtgate.orchestration.resume import begin_execution

    first = runtime(ApprovalBroker())
    resumable = await first.create_run(RunRequest("x", model="fake:other"))
    owner = first.leases.owner.owner_id
    assert await store.claim_run(resumable.run_id, owner, 30) == 1
    assert await store.release_run(resumable.run_id, owner=owner, queue=True)
    begun = await begin_execution(runtime(ApprovalBroker()), resumable.run_id)
    assert begun is not None and begun[3] is not None, "it resumes"
    seen += await store.read(resumable.run_id)

    asked = asyncio.Event()

    async def slow(request: TurnRequest, turn: int) -> Any:
        asked.set()
        await asyncio.sleep(30)
        yield text("never")

    manager = RunManager(Runtime(store, provider_factory=lambda m: FakeProvider(slow)), grace_s=0)
    run = await manager.start(RunRequest("wait", model="fake:slow"))
    await asyncio.wait_for(asked.wait(), 10)  # its task runs: the model turn was asked
    await manager.shutdown()
    ended = await store.read(run.run_id)
    assert [(e.type, e.payload["status"]) for e in ended[-2:]] == [
        ("task.completed", "interrupted"),  # tasks close first ...
        ("run.interrupted", "interrupted"),  # ... then the run, with what it used
    ]
    assert "usage" in ended[-1].payload
    seen += ended
    for event in seen:
        validate_event(event)
    return {e.type for e in seen}


async def test_real_producers_write_every_declared_event_type_in_its_declared_shape() -> None:
    produced = await _produced()
    assert produced == set(EVENT_SPECS), set(EVENT_SPECS) - produced
