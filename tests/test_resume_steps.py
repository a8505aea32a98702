"""A run resumed after its process stopped, at every kind of step, without a real engine.

The engine is played by :class:`Checkpoints`: it records each step's JSON result like DBOS does,
and a "crash" (a ``BaseException`` nothing catches) stops an execution before or after any step,
or inside a tool or a model turn. A second execution, as another process (another owner), then
replays the recorded steps and runs the rest live with the log as it stood. What must hold:

* a completed tool call is never run again (its recorded result is used);
* a tool cut mid-call is not run again either: it is recorded ``interrupted`` and the model told;
* a model turn cut mid-stream is recorded as cut and asked again under the next turn number;
* carriers of earlier turns reach the provider again, byte for byte;
* events written before the stop are unchanged, the log has no gaps, ``run.resumed`` says where;
* viewers never see reasoning, and no reader sees a carrier or the executor's identity.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pytest

from thoughtgate.access.filter import filter_events
from thoughtgate.access.roles import Role
from thoughtgate.config import Config
from thoughtgate.engine.loop import TURN_CUT
from thoughtgate.engine.steps import ResumeLog, StepCodec
from thoughtgate.engine.tools import ToolRegistry, tool
from thoughtgate.errors import UsageError
from thoughtgate.events.schema import Event, EventType
from thoughtgate.events.thread import rebuild
from thoughtgate.orchestration.leases import LeaseKeeper
from thoughtgate.orchestration.resume import begin_execution
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.leases import Owner
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text, tool_call
from thoughtgate.types import ContinuityBlock, ContinuityChunk

T = TypeVar("T")
CARRIER = {"type": "thinking", "thinking": "t", "signature": "SIG-ONE"}


class Crash(BaseException):
    """The process dies here: nothing after this point is recorded."""


class Checkpoints:
    """Step results as the engine keeps them, across executions of one run."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, Any]] = []
        self.live: list[str] = []

    def steps(
        self, resumed: ResumeLog | None, *, crash: Callable[[str, str], bool] = lambda *_: False
    ) -> _Steps:
        return _Steps(self, resumed, crash)


class _Steps:
    def __init__(
        self, book: Checkpoints, resumed: ResumeLog | None, crash: Callable[[str, str], bool]
    ) -> None:
        self.book = book
        self.resumed = resumed
        self.crash = crash
        self.i = 0
        self.in_last_task = False

    def last_task(self) -> _Steps:
        """Like the engine: in the last task of a first execution, a result that ends the task
        is not checkpointed (the run's ending commit records it)."""
        self.in_last_task = True
        return self

    def checkpoints(self, *, ending: bool) -> bool:
        return not (ending and self.in_last_task and self.resumed is None)

    async def run(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        codec: StepCodec,
        *,
        ends: Callable[[T], bool] | None = None,
    ) -> T:
        i = self.i
        if i < len(self.book.recorded):
            self.i += 1
            recorded_name, value = self.book.recorded[i]
            assert recorded_name == name, "the workflow took another path on replay"
            decoded: T = codec.decode(json.loads(value))
            return decoded
        if self.crash(name, "before"):
            raise Crash(name)
        self.book.live.append(name)
        result = await fn()
        if self.crash(name, "after"):
            raise Crash(name)
        if ends is not None and ends(result) and not self.checkpoints(ending=True):
            return result
        self.i += 1
        encoded = json.dumps(codec.encode(result))  # JSON, as the engine stores it
        self.book.recorded.append((name, encoded))
        out: T = codec.decode(json.loads(encoded))
        return out

    async def effect(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Not checkpointed (like the engine): it runs again on every replay."""
        if self.crash(name, "before"):
            raise Crash(name)
        self.book.live.append(name)
        await fn()
        if self.crash(name, "after"):
            raise Crash(name)


class World:
    """One store, the tool's side effects, what the provider was sent."""

    def __init__(self) -> None:
        self.store = MemoryStore()
        self.effects: list[str] = []
        self.requests: list[TurnRequest] = []
        self.cut_stream = False
        self.cut_tool = False
        self.half_logged = asyncio.Event()
        self.store.observe(self._watch_for_half_answer)
        effects = self.effects
        world = self

        @tool
        async def act(label: str) -> str:
            """Do something once."""
            effects.append(label)
            if world.cut_tool:
                raise Crash("inside the tool")
            return f"did {label}"

        self.tools = ToolRegistry([act])

    async def _watch_for_half_answer(self, events: Sequence[Event]) -> None:
        """Set ``half_logged`` once the half answer of a cut stream is in the log."""
        for event in events:
            if event.type == EventType.MESSAGE_DELTA and "half" in str(event.payload):
                self.half_logged.set()

    def script(self, request: TurnRequest, _: int) -> AsyncIterator[Any]:
        self.requests.append(request)
        turn = sum(1 for m in request.messages if m.role == "assistant")

        async def gen() -> AsyncIterator[Any]:
            if turn == 0:
                yield reasoning("REASONING-ZERO")
                yield ContinuityChunk(
                    ContinuityBlock("anthropic.thinking", CARRIER, provider="fake", model="m")
                )
                yield tool_call("act", {"label": "once"}, call_id="call_1")
                return
            yield reasoning("REASONING-ONE")
            yield text("half ")
            if self.cut_stream:
                await asyncio.wait_for(self.half_logged.wait(), 10)  # half answer logged first
                raise Crash("mid-stream")
            yield text("and whole")

        return gen()

    def runtime(self, pid: int) -> Runtime:
        runtime = Runtime(
            self.store,
            Config(),
            provider_factory=lambda model: _Fake(self.script, model),
            tools=self.tools,
        )
        runtime.leases = LeaseKeeper(self.store, Owner("host", pid, f"n{pid}"))
        return runtime


def _Fake(script: Any, model: str) -> FakeProvider:
    provider = FakeProvider(script, model=model)
    provider.name = "fake"  # type: ignore[misc]
    provider.model = "m"
    return provider


async def execute(runtime: Runtime, run_id: str, book: Checkpoints, **crash: Any) -> bool:
    """One execution in one "process"; ``True`` when it crashed."""
    begun = await begin_execution(runtime, run_id)
    assert begun is not None
    run, spec, tools, resumed, _ = begun
    try:
        await runtime._run_held(run, spec.tasks, tools, book.steps(resumed, **crash))
    except Crash:
        await asyncio.sleep(0.1)  # let stray flushes land, as they could not after a real kill
        owner = runtime.leases.owner.owner_id
        assert await runtime.store.release_run(run_id, owner=owner, queue=True)  # the sweeper
        return True
    return False


async def started(world: World, mode: str = "surface") -> str:
    runtime = world.runtime(1)
    run = await runtime.create_run(RunRequest("go", model="fake:m"), chain_of_thought=mode)
    return run.run_id


def crash_at(step: str, when: str) -> Callable[[str, str], bool]:
    return lambda name, moment: step in name and moment == when


async def assert_kept_history(world: World, run_id: str, before: list[Event]) -> list[Event]:
    after = await world.store.read(run_id)
    assert [e.seq for e in after] == list(range(1, len(after) + 1)), "gap-free"
    assert [e.to_dict() for e in after[: len(before)]] == [e.to_dict() for e in before]
    resumed = [e for e in after if e.type == EventType.RUN_RESUMED]
    assert len(resumed) == 1 and resumed[0].payload["after_seq"] == len(before)
    assert resumed[0].payload["attempt"] == 2
    assert after[-1].type == EventType.RUN_SETTLEMENT_COMPLETED
    return after


async def test_a_completed_tool_is_not_run_again_and_its_result_is_used() -> None:
    world = World()
    run_id = await started(world)
    book = Checkpoints()
    # the tool ran and its end was recorded, but the process died before its checkpoint
    assert await execute(world.runtime(1), run_id, book, crash=crash_at("tool call_1", "after"))
    before = await world.store.read(run_id)
    assert world.effects == ["once"]
    assert not await execute(world.runtime(2), run_id, book)
    assert world.effects == ["once"], "the tool ran exactly once"
    await assert_kept_history(world, run_id, before)
    last = world.requests[-1]
    result = last.messages[-1].parts[0]
    assert getattr(result, "content", None) == "did once", "the recorded result went back"
    carriers = [p for m in last.messages for p in m.parts if isinstance(p, ContinuityBlock)]
    assert [c.data for c in carriers] == [CARRIER], "the first turn's carrier went back intact"
    run = await world.store.get_run(run_id)
    assert run.status == "completed" and run.tasks[0].output == "half and whole"


async def test_a_tool_cut_mid_call_is_not_run_again_and_the_model_is_told() -> None:
    world = World()
    run_id = await started(world)
    book = Checkpoints()
    world.cut_tool = True
    assert await execute(world.runtime(1), run_id, book)
    before = await world.store.read(run_id)
    world.cut_tool = False
    assert not await execute(world.runtime(2), run_id, book)
    assert world.effects == ["once"], "a tool that may have had its effect is not repeated"
    after = await assert_kept_history(world, run_id, before)
    failed = [e for e in after if e.type == EventType.TOOL_FAILED]
    assert [e.payload["error_kind"] for e in failed] == ["interrupted"]
    told = world.requests[-1].messages[-1].parts[0]
    assert getattr(told, "is_error", False) and "stopped" in getattr(told, "content", "")
    assert (await world.store.get_run(run_id)).status == "completed"


async def test_a_turn_cut_mid_stream_is_recorded_as_cut_and_asked_again() -> None:
    world = World()
    run_id = await started(world)
    book = Checkpoints()
    world.cut_stream = True
    assert await execute(world.runtime(1), run_id, book)
    before = await world.store.read(run_id)
    assert any(e.type == EventType.MESSAGE_DELTA and e.payload["turn"] == 1 for e in before)
    world.cut_stream = False
    assert not await execute(world.runtime(2), run_id, book)
    after = await assert_kept_history(world, run_id, before)
    responses = [e.payload for e in after if e.type == EventType.AGENT_RESPONSE]
    assert [(r["turn"], r["complete"], r.get("error")) for r in responses] == [
        (0, True, None),
        (1, False, TURN_CUT),
        (2, True, None),
    ]
    assert responses[1]["answer"] == "half ", "what streamed before the stop is kept"
    assert world.effects == ["once"]
    run = await world.store.get_run(run_id)
    assert run.status == "completed" and run.tasks[0].output == "half and whole"
    # a reader reloading the run sees the final answer once, not the cut attempt glued to it
    thread = rebuild(filter_events(after, Role.MEMBER, mode="surface"))
    assert (thread.message.text, thread.status) == ("half and whole", "completed")


@pytest.mark.parametrize(
    "step", ["model turn 0", "record turn 0", "model turn 1", "record turn 1", "start", "end"]
)
@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_stop_at_any_step_resumes_to_the_same_answer(step: str, when: str) -> None:
    world = World()
    run_id = await started(world)
    book = Checkpoints()
    assert await execute(world.runtime(1), run_id, book, crash=crash_at(step, when))
    before = await world.store.read(run_id)
    assert not await execute(world.runtime(2), run_id, book)
    after = await assert_kept_history(world, run_id, before)
    assert world.effects == ["once"]
    run = await world.store.get_run(run_id)
    assert run.status == "completed" and run.tasks[0].output.endswith("and whole")
    for etype in (EventType.TASK_STARTED, EventType.TASK_COMPLETED, EventType.WORKER_COMPLETED):
        assert sum(e.type == etype for e in after) == 1, f"one {etype}"


@pytest.mark.parametrize("mode", ["hidden", "surface", "telemetry_only"])
async def test_readers_of_a_resumed_run_see_no_carrier_no_executor_and_viewers_no_reasoning(
    mode: str,
) -> None:
    world = World()
    run_id = await started(world, mode)
    book = Checkpoints()
    assert await execute(world.runtime(1), run_id, book, crash=crash_at("tool call_1", "after"))
    assert not await execute(world.runtime(2), run_id, book)
    log = await world.store.read(run_id)
    for role in (Role.VIEWER, Role.MEMBER, Role.DEVELOPER, Role.OWNER):
        shown = json.dumps([e.to_dict() for e in filter_events(log, role, mode=mode)])
        assert "SIG-ONE" not in shown, "a carrier never reaches a reader"
        if role < Role.ADMIN:
            assert "host.2.n2" not in shown and "host.1.n1" not in shown
        if role < Role.DEVELOPER or mode != "surface":
            assert "REASONING" not in shown
    resumed = next(
        e for e in filter_events(log, Role.VIEWER, mode=mode) if e.type == EventType.RUN_RESUMED
    )
    assert set(resumed.payload) == {"reason", "attempt", "after_seq"}


async def test_a_run_that_cannot_resume_says_why_without_the_words_of_a_foreign_exception() -> None:
    """The reason a run cannot resume is public (every reader sees ``run.interrupted``'s
    ``reason`` and the run's ``error``): thoughtgate's own words pass, the text of an exception
    it was raised from does not (``errors.failure_text``; the whole text is developer-only
    ``error_detail``, and a ``hidden`` run keeps none)."""
    store = MemoryStore()
    first = Runtime(store)
    run = await first.create_run(RunRequest("x", model="fake:echo"))
    owner = first.leases.owner.owner_id
    assert await store.claim_run(run.run_id, owner, 30) == 1
    assert await store.release_run(run.run_id, owner=owner, queue=True)
    secret = "SECRET-REASONING-0123456789 from a plug-in's registry"

    def tools_for(names: Sequence[str]) -> ToolRegistry:
        try:
            raise ValueError(secret)
        except ValueError as exc:
            raise UsageError(f"cannot load the run's tools: {exc}") from exc

    second = Runtime(store)
    second.tools_for = tools_for  # type: ignore[method-assign]
    assert await begin_execution(second, run.run_id) is None
    ended = await store.get_run(run.run_id)
    interrupted = (await store.read(run.run_id))[-1]
    assert interrupted.type == EventType.RUN_INTERRUPTED
    reason = interrupted.payload["reason"]
    assert reason.startswith("it cannot resume: cannot load the run's tools: ")
    assert secret not in reason and ended.error is not None and secret not in ended.error
    assert secret not in json.dumps([e.to_dict() for e in await store.read(run.run_id)])
