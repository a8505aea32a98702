"""A run's whole spec lives in the store, not in the memory of the process that created it.

One runtime creates a run (system prompt, earlier conversation, a tool) on a SQLite file and goes
away; another runtime, on its own connection to the same file, executes it and the model gets
exactly what the creator asked for. The creator executes its own runs from the stored spec too,
and a run's tools are those it named, whatever else the executing process has.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from thoughtgate.access.filter import filter_run
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.errors import UsageError
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import Provider, TurnRequest
from thoughtgate.store.urls import open_store
from thoughtgate.testing.fake import FakeProvider, text
from thoughtgate.types import Chunk, Message, Part, TextPart


@tool(description="Look a word up.")
def lookup(word: str) -> str:
    return f"a {word}"


@tool(description="Delete everything.")
def wipe(path: str) -> str:
    return "wiped"


class Probe:
    """A provider factory whose fake model records each request it gets."""

    def __init__(self) -> None:
        self.requests: list[TurnRequest] = []

    def __call__(self, model: str) -> Provider:
        def script(request: TurnRequest, turn: int) -> Iterator[Chunk]:
            self.requests.append(request)
            yield text("done")

        return FakeProvider(script)


def _said(message: Message) -> tuple[str, str]:
    parts: tuple[Part, ...] = message.parts
    return message.role, "".join(p.text for p in parts if isinstance(p, TextPart))


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runs.db'}"


async def test_another_runtime_executes_a_run_from_its_stored_spec(db: str) -> None:
    earlier = [Message.user("What is a tern?"), Message("assistant", (TextPart("A bird."),))]
    creator_store = await open_store(db)
    creator = Runtime(creator_store, tools=ToolRegistry([lookup, wipe]), provider_factory=Probe())
    run = await creator.create_run(
        RunRequest("And a gull?", model="fake:probe", system="SYSTEM-7Q", history=earlier),
        tools=["lookup"],
    )
    await creator_store.close()  # the creating process is gone

    store = await open_store(db)
    try:
        probe = Probe()
        executor = Runtime(store, tools=ToolRegistry([wipe, lookup]), provider_factory=probe)
        done = await executor.execute(run.run_id)
        assert done.status == "completed"
        (request,) = probe.requests
        assert request.system == "SYSTEM-7Q"
        assert [_said(m) for m in request.messages] == [
            ("user", "What is a tern?"),
            ("assistant", "A bird."),
            ("user", "And a gull?"),
        ]
        assert [t.name for t in request.tools] == ["lookup"], "only the tool the run named"
        assert filter_run(done, "viewer").tasks[0].output == "done"
    finally:
        await store.close()


async def test_a_process_lacking_a_runs_tool_refuses_to_execute_it(db: str) -> None:
    store = await open_store(db)
    try:
        creator = Runtime(store, tools=ToolRegistry([lookup]))
        run = await creator.create_run(RunRequest("x", model="fake:echo"), tools=["lookup"])
        elsewhere = Runtime(store, provider_factory=Probe())
        with pytest.raises(UsageError, match="unknown tool 'lookup'"):
            await elsewhere.execute(run.run_id)
        with pytest.raises(UsageError, match="unknown tool 'wipe'"):
            await creator.create_run(RunRequest("y", model="fake:echo"), tools=["wipe"])
    finally:
        await store.close()


async def test_the_creator_executes_its_own_run_from_the_store_too(db: str) -> None:
    store = await open_store(db)
    try:
        probe = Probe()
        runtime = Runtime(store, tools=ToolRegistry([lookup]), provider_factory=probe)
        run = await runtime.create_run(RunRequest("hi", model="fake:probe", system="S-1"))
        spec = await runtime.stored_spec(run)
        assert [t.system for t in spec.tasks] == ["S-1"] and spec.tools == ("lookup",)
        await runtime.execute(run.run_id)
        assert probe.requests[0].system == "S-1"
    finally:
        await store.close()
