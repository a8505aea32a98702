"""A run started for a client that comes back for it (``POST /v1/runs``) starts executing once
its admission committed, in the step that learns it (the commit's hand-off, ADR 0091) -- and
still only then: never while its admission commits (ADR 0040), and a start cancelled once the
admission committed leaves its run ended once and nothing executing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.commits import held_admission_commits, idle

from thoughtgate.events.schema import RUN_TERMINAL_TYPES, EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.server.manager import RunManager
from thoughtgate.store.leases import billed_usage
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text
from thoughtgate.types import Usage

pytestmark = [pytest.mark.inprocess, pytest.mark.timeout(60)]


class _Asked:
    """A provider script that counts the streams it is asked for."""

    def __init__(self) -> None:
        self.asked = 0

    def script(self, request: Any, turn: int) -> AsyncIterator[Any]:
        self.asked += 1

        async def gen() -> AsyncIterator[Any]:
            yield reasoning("thinking ")
            yield text("done")

        return gen()


class _GatedStore(SQLiteStore):
    """Once ``gate`` is set, an admission that committed waits on it before it returns (where a
    test cancels the start); ``entered`` tells that it waits."""

    gate: asyncio.Event | None = None
    entered: asyncio.Event

    async def admit_run(self, *args: Any, **kwargs: Any) -> Any:
        out = await super().admit_run(*args, **kwargs)
        if self.gate is not None:
            self.entered.set()
            await self.gate.wait()
        return out


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[_GatedStore]:
    opened = await _GatedStore.open(tmp_path / "t.db")
    assert isinstance(opened, _GatedStore)
    opened.entered = asyncio.Event()
    yield opened
    await opened.close()


def _manager(store: SQLiteStore, provider: _Asked) -> tuple[RunManager, list[str]]:
    """A daemon's run manager, and the runs whose execution began, in order."""
    runtime = Runtime(store, provider_factory=lambda m: FakeProvider(provider.script))
    manager = RunManager(runtime, grace_s=0)
    began: list[str] = []
    execute = manager._execute

    async def noted(run_id: str) -> None:
        began.append(run_id)
        await execute(run_id)

    manager._execute = noted  # type: ignore[method-assign]
    return manager, began


@pytest.fixture
def held_commits(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The writer's ``COMMIT`` of a group holding an admission waits for this event (``holding``
    is set once one waits)."""
    yield from held_admission_commits(monkeypatch)


async def test_a_created_run_executes_only_once_its_admission_committed(
    store: _GatedStore, held_commits: threading.Event
) -> None:
    provider = _Asked()
    manager, began = _manager(store, provider)
    starting = asyncio.ensure_future(
        asyncio.gather(*(manager.start(RunRequest(f"run {i}", model="fake:x")) for i in range(3)))
    )
    assert await asyncio.to_thread(held_commits.holding.wait, 10)  # type: ignore[attr-defined]
    for _ in range(100):  # turns of the loop in which an execution started early would begin
        await asyncio.sleep(0)
    assert began == [] and provider.asked == 0, "a run executed before its admission committed"
    held_commits.set()
    runs = await starting
    await idle(manager)
    assert sorted(began) == sorted(r.run_id for r in runs), "each run executed once"
    for run in runs:
        assert (await store.get_run(run.run_id)).status == "completed"
    assert provider.asked == 3


async def test_a_created_runs_execution_begins_before_its_start_returns(
    store: _GatedStore,
) -> None:
    """Its execution's first step runs in the turn the starter resumes in, ahead of it (the
    commit's hand-off started it), not a turn of the loop after the start returned."""
    provider = _Asked()
    manager, began = _manager(store, provider)
    for i in range(3):  # alone, and each after a run that is still under way
        run = await manager.start(RunRequest(f"run {i}", model="fake:x"))
        assert began[-1:] == [run.run_id]
    await idle(manager)
    assert provider.asked == 3


async def test_runs_admitted_in_a_large_group_begin_after_their_starts_return(
    store: _GatedStore,
) -> None:
    """16 admissions or more in one group: a loop with many runs to serve, where a run started
    a turn sooner only has its first delta wait for it (ADR 0040, 0091): each run's execution
    begins after its start returned, as before. A small group's, before."""
    provider = _Asked()
    manager, began = _manager(store, provider)

    async def begun_at_return(i: int) -> bool:
        run = await manager.start(RunRequest(f"run {i}", model="fake:x"))
        return run.run_id in began

    for n, expected in ((20, False), (3, True)):
        # ``n`` starts queued in one turn of the loop: their admissions share a group
        seen = await asyncio.gather(*(begun_at_return(i) for i in range(n)))
        assert seen == [expected] * n, (n, seen)
        await idle(manager)
    assert provider.asked == 23


async def test_a_start_cancelled_once_its_admission_committed_ends_its_run_once(
    store: _GatedStore,
) -> None:
    provider = _Asked()
    manager, began = _manager(store, provider)
    store.gate = asyncio.Event()
    starting = asyncio.ensure_future(manager.start(RunRequest("cancelled", model="fake:x")))
    await asyncio.wait_for(store.entered.wait(), 10)
    starting.cancel()
    await asyncio.sleep(0)  # the cancel lands where the start waits
    store.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await idle(manager)
    (run,) = await store.list_runs()
    assert began == [run.run_id], "(its execution began in the commit's hand-off)"
    ended = await store.get_run(run.run_id)
    assert ended.status == "interrupted", ended
    types = [e.type for e in await store.read(run.run_id)]
    assert sum(t in RUN_TERMINAL_TYPES for t in types) == 1, types
    assert types[-1] in RUN_TERMINAL_TYPES and EventType.RUN_SETTLEMENT_COMPLETED not in types
    # Its usage reads as every other ending's that billed nothing (ADR 0165, a pin): a zero
    # record on the run, in its list row and its terminal event, none on its task (absent when
    # zero, ADR 0131), and the log's billed turns agree
    zero = Usage().to_dict()
    (listed,) = await store.list_runs()
    terminal = (await store.read(run.run_id))[-1]
    assert ended.usage == listed.usage == terminal.payload["usage"] == zero
    assert [t.usage for t in ended.tasks] == [{}]
    assert await billed_usage(store, run.run_id) == zero
    assert manager.executing_mode(run.run_id) is None
    assert run.run_id not in manager.runtime.executing
    # the store still serves the next start, which runs to its end
    store.gate = None
    after = await manager.start(RunRequest("after", model="fake:x"))
    await idle(manager)
    assert (await store.get_run(after.run_id)).status == "completed"
