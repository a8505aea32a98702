"""A daemon's run starts executing once its admission is decided, while that admission commits
(ADR 0040) -- and still: nobody is told of a run before it is durable, a run whose admission
does not commit leaves nothing a reader could see and no execution behind, and a run the
quota refuses costs no provider call."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.commits import admitting, held_admission_commits, idle

from thoughtgate.config import Config
from thoughtgate.errors import QuotaExceededError, RunNotFoundError, StoreError
from thoughtgate.events.schema import EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.server.manager import RunManager
from thoughtgate.store import sqlite_thread
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text

pytestmark = [pytest.mark.inprocess, pytest.mark.timeout(60)]


class _Opened:
    """A provider script that notes each stream it opens, then answers after ``release``."""

    def __init__(self) -> None:
        self.opened = 0
        self.first = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    def script(self, request: Any, turn: int) -> AsyncIterator[Any]:
        self.opened += 1
        self.first.set()

        async def gen() -> AsyncIterator[Any]:
            await self.release.wait()
            yield reasoning("thinking ")
            yield text("done")

        return gen()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = await SQLiteStore.open(tmp_path / "t.db")
    yield opened
    await opened.close()


def _manager(store: SQLiteStore, provider: _Opened, config: Config | None = None) -> RunManager:
    runtime = Runtime(store, config, provider_factory=lambda m: FakeProvider(provider.script))
    return RunManager(runtime, grace_s=0)


@pytest.fixture
def held_commits(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The writer thread's ``COMMIT`` of a group holding an admission waits for this event
    (``go.holding`` is set once one waits)."""
    yield from held_admission_commits(monkeypatch)


async def _start_together(manager: RunManager, n: int) -> list[Any]:
    """``n`` starts queued in one loop turn: their admissions share a group the loop runs."""
    return await asyncio.gather(
        *(manager.start(RunRequest(f"run {i}", model="fake:x"), early=True) for i in range(n)),
        return_exceptions=True,
    )


async def test_a_runs_provider_opens_while_its_admission_commits(
    store: SQLiteStore, held_commits: threading.Event
) -> None:
    provider = _Opened()
    manager = _manager(store, provider)
    starting = asyncio.ensure_future(_start_together(manager, 3))
    await asyncio.wait_for(provider.first.wait(), 10)
    assert not starting.done(), "the client is told of its run only once that is durable"
    assert await store.list_runs() == [], "a reader sees no run before its commit"
    held_commits.set()
    runs = await starting
    await idle(manager)
    for run in runs:
        assert not isinstance(run, BaseException), run
        types = [e.type for e in await store.read(run.run_id)]
        assert types[:3] == [
            EventType.RUN_STARTED,
            EventType.CAPABILITY_RESOLVED,
            EventType.TASK_STARTED,
        ]
        assert types[-1] == EventType.RUN_SETTLEMENT_COMPLETED
        assert (await store.get_run(run.run_id)).status == "completed"
    assert provider.opened == 3


async def test_runs_admitted_in_a_large_group_start_after_its_commit(
    store: SQLiteStore, held_commits: threading.Event
) -> None:
    """16 admissions or more in one group: a loop with many runs to serve (ADR 0036), where a
    provider opened early only has its first delta wait for the loop (ADR 0040)."""
    provider = _Opened()
    manager = _manager(store, provider)
    starting = asyncio.ensure_future(_start_together(manager, 20))
    assert await asyncio.to_thread(held_commits.holding.wait, 10)  # type: ignore[attr-defined]
    for _ in range(100):  # turns of the loop in which an early start would reach its provider
        await asyncio.sleep(0)
    assert provider.opened == 0, "a run of a large admission group started before its commit"
    held_commits.set()
    runs = await starting
    await idle(manager)
    assert all(not isinstance(r, BaseException) for r in runs), runs
    assert provider.opened == 20


async def test_a_run_whose_admission_does_not_commit_leaves_nothing_and_stops(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit = sqlite_thread.SQLiteThread._commit

    def failing(self: Any, conn: sqlite3.Connection, failed: list[Any], done: list[Any]) -> Any:
        if not admitting(done):
            return commit(self, conn, failed, done)
        conn.execute("ROLLBACK")  # as a COMMIT that failed (disk I/O error) leaves it
        error = sqlite3.OperationalError("disk I/O error")
        return failed + [
            sqlite_thread._Outcome(o.job, self._translate(error, o.job.action), None) for o in done
        ]

    monkeypatch.setattr(sqlite_thread.SQLiteThread, "_commit", failing)
    provider = _Opened()
    provider.release.clear()  # its provider answers only once the admission has failed
    manager = _manager(store, provider)
    began: list[str] = []
    execute = manager._execute

    async def noted(run_id: str) -> None:
        began.append(run_id)
        await execute(run_id)

    monkeypatch.setattr(manager, "_execute", noted)
    outcomes = await _start_together(manager, 3)
    assert all(isinstance(o, StoreError) for o in outcomes), outcomes
    assert began, "(their executions began before the commit failed)"
    provider.release.set()
    await idle(manager)  # no execution outlives its admission's failed commit
    monkeypatch.setattr(sqlite_thread.SQLiteThread, "_commit", commit)
    assert await store.list_runs() == [], "nothing of these runs was stored"
    for run_id in began:
        with pytest.raises(RunNotFoundError):
            await store.get_run(run_id)
        with pytest.raises(RunNotFoundError):
            await store.read(run_id)
    # the store still works: the next run commits and runs to its end
    run = await manager.start(RunRequest("after", model="fake:x"), early=True)
    await idle(manager)
    assert (await store.get_run(run.run_id)).status == "completed"


async def test_a_run_the_quota_refuses_costs_no_provider_call(store: SQLiteStore) -> None:
    config = Config.from_mapping({"quotas": {"max_open_runs_per_key": 1}})
    provider = _Opened()
    provider.release.clear()  # the first run stays open
    manager = _manager(store, provider, config)
    first = await manager.start(RunRequest("one", model="fake:x"), key_id="k1", early=True)
    await asyncio.wait_for(provider.first.wait(), 10)
    refused = await asyncio.gather(
        *(
            manager.start(RunRequest("two", model="fake:x"), key_id="k1", early=True)
            for _ in range(2)
        ),
        return_exceptions=True,
    )
    assert all(isinstance(r, QuotaExceededError) for r in refused), refused
    provider.release.set()
    await idle(manager)
    assert provider.opened == 1, "a refused run opened a provider stream"
    assert [r.run_id for r in await store.list_runs()] == [first.run_id]
