"""A run's end is recorded only by the execution that still holds it; a cancel before a run's
execution began ends the run honestly (ADR 0072).

1. A process that stalls past its lease (a long GC pause, ``SIGSTOP``) while executing a run can
   have the run taken over: a sweep releases it and another process claims it and resumes it.
   When the stalled process wakes with no write between -- nothing that would have fenced it --
   its end must not be recorded over the run the other process now executes, and nobody may be
   told it ended. The stall is modelled by the first process's keeper not renewing (a lease of
   a minute, so no renewal falls in the test) and the sweep's own store call, as a sweep makes
   it once that lease has expired.
2. A cancel (Ctrl-C, an MCP host's cancel) that lands after ``create_run`` returned and before
   the task executing the run first ran ends nothing by itself: a task cancelled before its
   first step never runs. The cancel is injected at exactly that point: the wrapped
   ``create_run`` cancels its caller just before returning the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.pg import pg_admin, pg_schema
from support.store_backends import Postgres, SQLite

from thoughtgate.access.roles import Role
from thoughtgate.cli.runs import INTERRUPTED_BY_USER, execute_and_follow
from thoughtgate.config import Config, OrchestrationConfig
from thoughtgate.engine.steps import DirectSteps
from thoughtgate.errors import RunTakenOverError
from thoughtgate.events.schema import EventType, is_run_terminal
from thoughtgate.mcp_server import CANCELLED_BY_HOST, McpTools
from thoughtgate.orchestration.leases import LeaseKeeper
from thoughtgate.orchestration.resume import begin_execution
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.orchestration.specs import TaskSpec
from thoughtgate.store.base import EventStore
from thoughtgate.store.durable import DurableRunStore
from thoughtgate.store.leases import Owner

__all__ = ["pg_admin", "pg_schema"]  # fixtures, used by name

A = Owner("hosta", 101, "a")
B = Owner("hostb", 202, "b")
LEASE_S = 60.0
"""Long enough that no renewal falls inside a test: the first process is stalled."""


class Gate:
    """An inline worker that answers ``answer`` once let through."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.entered = asyncio.Event()
        self.through = asyncio.Event()

    async def __call__(self, prompt: str) -> str:
        self.entered.set()
        await self.through.wait()
        return self.answer


class Keeper(LeaseKeeper):
    """A lease keeper whose renewals can be waited for.

    A keeper renews as soon as it holds a run, then every ``LEASE_S / 3``. The stall a test
    models begins once that first renewal is done: one still in flight while the run is taken
    over can read the run between its release and its claim, find it gone and cancel the
    execution (an honest end too, but not the one the test is about)."""

    def __init__(self, store: EventStore, owner: Owner) -> None:
        super().__init__(store, owner, ttl_s=LEASE_S)
        self.renewed = asyncio.Event()

    async def renew(self) -> None:
        await super().renew()
        self.renewed.set()


def process(store: EventStore, owner: Owner, worker: Callable[[str], Awaitable[str]]) -> Runtime:
    """A thoughtgate process on ``store``: its own owner id and an inline worker."""
    # Inline by default: the MCP tool's runs take the configured backend.
    config = Config(orchestration=OrchestrationConfig(lease_ttl_s=LEASE_S, worker_backend="inline"))
    runtime = Runtime(store, config, inline_workers={"default": worker})
    runtime.leases = Keeper(store, owner)
    return runtime


async def stalls(runtime: Runtime) -> None:
    """``runtime``'s process stalls from here: no renewal of its is under way (its first is done;
    the next falls after the test)."""
    keeper = runtime.leases
    assert isinstance(keeper, Keeper)
    await keeper.renewed.wait()


def inline(prompt: str = "p") -> RunRequest:
    return RunRequest(prompt, worker_backend="inline")


async def take_over(store: EventStore, run_id: str, by: Owner | None) -> None:
    """What happens while the first process stalls: a sweep releases the run (its lease has
    expired) and, with ``by``, another process claims it."""
    assert isinstance(store, DurableRunStore)
    run = await store.get_run(run_id)
    assert await store.release_run(run_id, owner=run.owner, queue=True)
    if by is not None:
        assert await store.claim_run(run_id, by.owner_id, LEASE_S) is not None


async def terminal_events(store: EventStore, run_id: str) -> list[str]:
    return [e.type for e in await store.read(run_id) if is_run_terminal(e.type)]


def noting_created(runtime: Runtime) -> list[str]:
    """The ids of the runs ``runtime.create_run`` creates from now on, in the list returned."""
    created: list[str] = []
    create = runtime.create_run

    async def noted(*args: Any, **kw: Any) -> Any:
        run = await create(*args, **kw)
        created.append(run.run_id)
        return run

    runtime.create_run = noted  # type: ignore[method-assign]
    return created


class CancelAt:
    """Cancels the caller -- the MCP tool call, or ``thoughtgate run``'s main task -- at one
    point of a run's start, deterministically: ``admission``, as the run's admission has
    committed but before its reply reached the runtime (a store call cancelled mid-way may
    still commit); ``execution``, once the run was created and its execution has begun but
    does not hold the run yet (as when it reads the run back). The run's own task is then
    waiting there, and the caller's cancel reaches it there, with the caller's reason."""

    def __init__(self, runtime: Runtime, where: str) -> None:
        self.caller: asyncio.Task[Any] | None = None
        self.run_ids: list[str] = []
        if where == "admission":
            store = runtime.store
            assert isinstance(store, DurableRunStore)
            admit = store.admit_run

            async def admitted(run: Any, *args: Any, **kw: Any) -> Any:
                answer = await admit(run, *args, **kw)
                self.run_ids.append(run.run_id)
                await self._cancelled_here()
                return answer

            store.admit_run = admitted  # type: ignore[method-assign]
        else:
            execute = runtime._execute_admitted

            async def executing(run_id: str) -> None:
                self.run_ids.append(run_id)
                await self._cancelled_here()
                await execute(run_id)

            runtime._execute_admitted = executing  # type: ignore[method-assign]

    async def _cancelled_here(self) -> None:
        assert self.caller is not None
        self.caller.cancel()
        await asyncio.Event().wait()  # until the caller's cancel of the run reaches it


def call(surface: str, runtime: Runtime, tasks: list[str] | None = None) -> Awaitable[Any]:
    """A run executed by an MCP tool call or by ``thoughtgate run`` (without its terminal)."""
    if surface == "mcp":
        return McpTools(runtime, Role.MEMBER).run("p", tasks=tasks)
    request = RunRequest("p", tasks=[TaskSpec(t) for t in tasks or ()])
    return execute_and_follow(runtime, request, role=Role.MEMBER, chain_of_thought=None, live=False)


async def _assert_interrupted_once(store: EventStore, run_id: str, reason: str) -> None:
    run = await store.get_run(run_id)
    assert (run.status, run.error) == ("interrupted", f"interrupted: {reason}")
    assert {t.status for t in run.tasks} == {"interrupted"}
    assert await terminal_events(store, run_id) == [EventType.RUN_INTERRUPTED]
    (ended,) = [e for e in await store.read(run_id) if e.type == EventType.RUN_INTERRUPTED]
    assert ended.payload["reason"] == reason


class Scenarios:
    async def test_a_stalled_execution_cannot_end_a_run_another_process_resumed(
        self, store: EventStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A claims, stalls past its lease; the run is released and B claims it (resumes it); A's
        end is refused and raised, nothing of it stored; B's end is the run's."""
        stalled, resumer = Gate("A's answer"), Gate("B's answer")
        a, b = process(store, A, stalled), process(store, B, resumer)
        run = await a.create_run(inline())
        begun = await begin_execution(a, run.run_id, a.forget_admitted(run.run_id))
        assert begun is not None
        a_run, a_spec, a_tools, _, a_attempt = begun
        assert a_attempt == 1
        a_job = asyncio.create_task(
            a._run_held(a_run, a_spec.tasks, a_tools, DirectSteps(), attempt=a_attempt)
        )
        await stalled.entered.wait()  # A executes the run ... and stalls
        await stalls(a)

        await take_over(store, run.run_id, by=None)
        taken = await begin_execution(b, run.run_id)  # B resumes it: attempt 2, run.resumed
        assert taken is not None
        b_run, b_spec, b_tools, b_resumed, b_attempt = taken
        assert b_attempt == 2 and b_resumed is not None

        with caplog.at_level(logging.WARNING, logger="thoughtgate.store.log"):
            stalled.through.set()  # A wakes and records its end: refused
            with pytest.raises(RunTakenOverError):
                await a_job
        assert any(
            run.run_id in r.getMessage() and "refused" in r.getMessage() for r in caplog.records
        )
        held = await store.get_run(run.run_id)
        assert (held.status, held.owner) == ("running", B.owner_id), "B still executes it"
        assert await terminal_events(store, run.run_id) == [], "nothing of A's end is stored"

        resumer.through.set()
        steps = DirectSteps()
        steps.resumed = b_resumed
        status = await b._run_held(b_run, b_spec.tasks, b_tools, steps, attempt=b_attempt)
        ended = await store.get_run(run.run_id)
        assert (status, ended.status) == ("completed", "completed")
        assert [t.output for t in ended.tasks] == ["B's answer"]
        assert await terminal_events(store, run.run_id) == [EventType.RUN_SETTLEMENT_COMPLETED]

    async def test_an_earlier_execution_of_the_same_process_is_fenced_by_its_attempt(
        self,
        store: EventStore,
    ) -> None:
        """The run released and claimed again by the *same* process (its queue took it back): the
        stalled first execution's end is refused all the same -- the owner alone would not tell."""
        stalled = Gate("first")
        a = process(store, A, stalled)
        run = await a.create_run(inline())
        begun = await begin_execution(a, run.run_id, a.forget_admitted(run.run_id))
        assert begun is not None
        first, spec, tools, _, attempt = begun
        job = asyncio.create_task(
            a._run_held(first, spec.tasks, tools, DirectSteps(), attempt=attempt)
        )
        await stalled.entered.wait()
        await stalls(a)
        await take_over(store, run.run_id, by=A)
        stalled.through.set()
        with pytest.raises(RunTakenOverError):
            await job
        assert (await store.get_run(run.run_id)).status == "running"
        assert await terminal_events(store, run.run_id) == []

    @pytest.mark.parametrize("surface", ["mcp", "cli"])
    async def test_the_mcp_tool_and_the_cli_report_no_end_they_did_not_record(
        self, store: EventStore, surface: str
    ) -> None:
        """A plain run executed by an MCP server, or by ``thoughtgate run``, taken over while
        its process stalled: the call fails with ``RunTakenOverError`` instead of answering
        with the run as if it had ended here."""
        stalled = Gate("A's answer")
        a = process(store, A, stalled)
        created = noting_created(a)
        job = asyncio.create_task(call(surface, a))
        await stalled.entered.wait()
        await stalls(a)
        (run_id,) = created
        await take_over(store, run_id, by=B)
        stalled.through.set()
        with pytest.raises(RunTakenOverError):
            await job
        run = await store.get_run(run_id)
        assert (run.status, run.owner) == ("running", B.owner_id)
        assert await terminal_events(store, run_id) == []

    @pytest.mark.parametrize("where", ["admission", "execution"])
    @pytest.mark.parametrize(
        ("surface", "reason"), [("mcp", CANCELLED_BY_HOST), ("cli", INTERRUPTED_BY_USER)]
    )
    async def test_a_cancel_before_the_execution_held_the_run_closes_it(
        self, store: EventStore, surface: str, reason: str, where: str
    ) -> None:
        """The host's cancel of an MCP call, or Ctrl-C in ``thoughtgate run``, landing while
        the run's admission commits or once it exists and before its execution holds it: the
        run ends ``interrupted`` with that reason, its tasks first, once -- not left
        ``running`` until a sweep comes (an MCP server alone on its store never sweeps)."""
        never = Gate("never")
        runtime = process(store, A, never)
        cancel = CancelAt(runtime, where)
        job = cancel.caller = asyncio.create_task(call(surface, runtime, tasks=["one", "two"]))
        if surface == "cli":  # it prints the run's view after Ctrl-C, named in its admission
            assert (await job).status == "interrupted"
        else:  # the MCP call is cancelled
            with pytest.raises(asyncio.CancelledError):
                await job
        (run_id,) = cancel.run_ids
        assert not never.entered.is_set(), "its execution never began"
        await _assert_interrupted_once(store, run_id, reason)
        assert run_id not in runtime.leases, "no longer renewed here"


@pytest.mark.inprocess
class TestOnSQLite(SQLite, Scenarios):
    pass


@pytest.mark.postgres
class TestOnPostgres(Postgres, Scenarios):
    pass
