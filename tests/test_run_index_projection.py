"""The run index agrees with the projection of the event log (ADR 0020), on every backend.

The index is written beside the log; ``store.projection`` rebuilds what the log alone says the
index is. Whatever mix of tasks (answered, cut, refused by the provider, interrupted) and endings
(finished, cancelled, closed by another process before it ran) a run has, once it has ended the
index row and the log's projection agree field for field -- on memory, SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql
from support.pg import PG_URL, schema_name
from support.scripts import cut, outage

from thoughtgate.errors import RunClosedError, ThoughtgateError
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.orchestration.runtime import RunRequest, Runtime, TaskSpec
from thoughtgate.providers.base import TurnRequest
from thoughtgate.store.base import EventStore, RunEnding
from thoughtgate.store.leases import close_run_interrupted
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.projection import (
    PROJECTED_EVENT_TYPES,
    IndexCheck,
    check_index,
    check_run_index,
    differences,
    disagreements,
    project,
    rebuilt,
    reproject,
)
from thoughtgate.store.records import OPEN_RUN_STATUSES, RunRecord, TaskRecord
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.testing.fake import FakeProvider, reasoning, text
from thoughtgate.types import Chunk, UsageChunk

# -- runs to make ------------------------------------------------------------------------------


def _answer(request: TurnRequest, turn: int) -> Iterator[Chunk]:
    yield reasoning("Thinking it over.")
    yield text("An answer.")
    yield UsageChunk(input_tokens=7, output_tokens=5, reasoning_tokens=2)


@dataclass(frozen=True)
class Plan:
    """One run: its tasks' outcomes, its disclosure mode and how it ends."""

    tasks: tuple[str, ...]
    """Each ``answer``, ``cut``, ``outage`` or ``stall`` (answers nothing until cancelled)."""
    mode: str
    ending: str
    """``execute`` (to its end; a ``stall`` task is cancelled) or ``abandon`` (closed by another
    process before it executed)."""


PLANS = st.builds(
    Plan,
    st.lists(st.sampled_from(["answer", "cut", "outage", "stall"]), min_size=1, max_size=4).map(
        tuple
    ),
    st.sampled_from(["hidden", "surface", "telemetry_only"]),
    st.sampled_from(["execute", "execute", "abandon"]),
)


class Providers:
    """Fake providers by model name; ``stalled`` is set when a ``stall`` task is answering."""

    def __init__(self) -> None:
        self.stalled = asyncio.Event()

    def __call__(self, model: str) -> FakeProvider:
        name = model.partition(":")[2]
        scripts: dict[str, Callable[[TurnRequest, int], Any]] = {
            "answer": _answer,
            "cut": cut,
            "outage": outage,
            "stall": self._stall,
        }
        return FakeProvider(scripts[name], model=model)

    def _stall(self, request: TurnRequest, turn: int) -> AsyncIterator[Chunk]:
        async def gen() -> AsyncIterator[Chunk]:
            yield text("Starting")
            self.stalled.set()
            await asyncio.Event().wait()  # until cancelled
            yield text("never")  # pragma: no cover

        return gen()


async def make_run(store: EventStore, plan: Plan) -> str:
    """Create and end one run as ``plan`` says; returns its id."""
    providers = Providers()
    runtime = Runtime(store, provider_factory=providers)
    request = RunRequest(
        "Question?",
        model="fake:answer",
        tasks=[TaskSpec(f"part {i}", model=f"fake:{t}") for i, t in enumerate(plan.tasks)],
    )
    run = await runtime.create_run(request, chain_of_thought=plan.mode)
    if plan.ending == "abandon":
        await close_run_interrupted(store, run.run_id, "its process is gone")
        return run.run_id
    executing = asyncio.create_task(runtime.execute(run.run_id))
    stalled = asyncio.create_task(providers.stalled.wait())
    try:
        await asyncio.wait({executing, stalled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stalled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stalled
    if not executing.done():
        executing.cancel("stopped by the test")
    with contextlib.suppress(asyncio.CancelledError, ThoughtgateError):
        await executing
    return run.run_id


async def check_plans(store: EventStore, plans: list[Plan]) -> None:
    for plan in plans:
        run_id = await make_run(store, plan)
        run = await store.get_run(run_id)
        assert run.status not in ("pending", "running"), plan
        assert await check_run_index(store, run_id) == [], plan
        # A projection kept up event by event (as a backend applying it per append would)
        # ends where a rebuild from the whole log does.
        events = await store.read(run_id)
        kept = None
        for event in events:
            kept = project(kept, event)
        assert kept == reproject(events)


EXAMPLES = settings(max_examples=25, deadline=None)
FEWER = settings(max_examples=8, deadline=None)


@pytest.mark.unit
@EXAMPLES
@given(st.lists(PLANS, min_size=1, max_size=3))
def test_memory_index_is_the_projection_of_its_log(plans: list[Plan]) -> None:
    asyncio.run(check_plans(MemoryStore(), plans))


@pytest.mark.inprocess
@FEWER
@given(st.lists(PLANS, min_size=1, max_size=3))
def test_sqlite_index_is_the_projection_of_its_log(plans: list[Plan]) -> None:
    asyncio.run(_on_sqlite(lambda store: check_plans(store, plans)))


@pytest.mark.postgres
@FEWER
@given(st.lists(PLANS, min_size=1, max_size=3))
def test_postgres_index_is_the_projection_of_its_log(plans: list[Plan]) -> None:
    asyncio.run(_on_postgres(lambda store: check_plans(store, plans)))


async def _on_sqlite(check: Callable[[EventStore], Awaitable[None]]) -> None:
    """``check`` on a fresh SQLite store in a folder of its own, removed afterwards."""
    with tempfile.TemporaryDirectory() as folder:
        store = await SQLiteStore.open(Path(folder) / "store.db")
        try:
            await check(store)
        finally:
            await store.close()


async def _on_postgres(check: Callable[[EventStore], Awaitable[None]]) -> None:
    """``check`` on a fresh PostgreSQL store in a schema of its own, dropped afterwards."""
    schema = schema_name()
    store = await PostgresStore.open(PG_URL, schema=schema)
    try:
        await check(store)
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(
            PG_URL, autocommit=True, connect_timeout=5
        ) as admin:
            await admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )


# -- the check finds a disagreement --------------------------------------------------------------


def _event(seq: int, kind: str, payload: dict[str, Any], task_id: str | None = None) -> Event:
    return Event(seq, "run_1", kind, payload, task_id=task_id)


LOG = [
    _event(1, EventType.RUN_STARTED, {"prompt": "p", "model": "fake:x", "tasks": 1}),
    _event(
        2,
        EventType.TASK_STARTED,
        {"index": 0, "prompt": "p", "backend": "provider", "model": "fake:x"},
        "task_1",
    ),
    _event(
        3, EventType.TASK_COMPLETED, {"status": "completed", "output": "A", "error": None}, "task_1"
    ),
    _event(
        4, EventType.RUN_SETTLEMENT_COMPLETED, {"status": "completed", "usage": {"input_tokens": 1}}
    ),
]


def _index(**task: Any) -> RunRecord:
    run = RunRecord("run_1", "p", model="fake:x", status="completed", usage={"input_tokens": 1})
    fields: dict[str, Any] = {"status": "completed", "output": "A", "model": "fake:x"}
    fields.update(task)
    run.tasks = [TaskRecord("task_1", "run_1", 0, "p", backend="provider", **fields)]
    return run


@pytest.mark.unit
def test_an_index_that_matches_its_log_has_no_disagreement() -> None:
    assert disagreements(_index(), reproject(LOG)) == []


@pytest.mark.unit
def test_a_task_the_index_ended_but_the_log_did_not_is_reported() -> None:
    """A process that stops between saving a task's end in the index and appending its
    ``task.completed`` leaves exactly this: the check names it."""
    log = [e for e in LOG if e.type != EventType.TASK_COMPLETED]
    found = disagreements(_index(), reproject(log))
    assert found == ["task task_1 status: index 'completed', log 'running'"]


@pytest.mark.unit
def test_a_wrong_run_status_or_answer_is_reported() -> None:
    run = _index(output="B")
    run.status = "failed"
    found = disagreements(run, reproject(LOG))
    assert "status: index 'failed', log 'completed'" in found
    assert "task task_1 output: index 'B', log 'A'" in found


@pytest.mark.unit
def test_an_open_run_marked_running_before_its_first_task_agrees() -> None:
    run = _index(status="pending", output=None)
    run.status, run.usage = "running", {}
    assert disagreements(run, reproject(LOG[:1])) == []
    run.status = "completed"
    assert disagreements(run, reproject(LOG[:1])) == ["status: index 'completed', log 'pending'"]


@pytest.mark.unit
def test_deltas_leave_the_projection_as_it_was() -> None:
    """The fold costs nothing for the events that do not concern the index."""
    before = reproject(LOG[:2])
    delta = _event(3, EventType.MESSAGE_DELTA, {"text": "x", "turn": 0}, "task_1")
    assert project(before, delta) is before


@pytest.mark.unit
def test_check_reads_the_index_and_the_log_of_a_store() -> None:
    async def go() -> list[str]:
        store = MemoryStore()
        run = _index(status="running", output=None)
        run.status = "running"
        await store.create_run(run)
        await store.append(
            "run_1", [NewEvent(e.type, e.payload, task_id=e.task_id) for e in LOG[:2]]
        )
        await store.update_run("run_1", status="completed")  # the index says more than the log
        return await check_run_index(store, "run_1")

    assert asyncio.run(go()) == ["status: index 'completed', log 'running'"]


# -- any sequence of events: the index kept by appends is the index rebuilt from the log ------

TASK_IDS = ("task_0", "task_1", "task_2")
_TEXTS = st.one_of(st.none(), st.sampled_from(["", "An answer.", "Ünïcode 🤔"]))
_USAGE = st.fixed_dictionaries(
    {"input_tokens": st.integers(0, 50), "output_tokens": st.integers(0, 50)}
)
_TERMINALS = {
    EventType.RUN_SETTLEMENT_COMPLETED: ("completed", "partial"),
    EventType.RUN_FAILED: ("failed",),
    EventType.RUN_ERROR: ("error",),
}


@st.composite
def _events(draw: st.DrawFn) -> NewEvent:
    task = draw(st.sampled_from([*TASK_IDS, "task_unknown"]))
    kind = draw(
        st.sampled_from(
            [
                EventType.TASK_STARTED,
                EventType.TASK_COMPLETED,
                EventType.WORKER_COMPLETED,
                EventType.MESSAGE_DELTA,
                EventType.MESSAGE_DELTA,
                EventType.RUN_RESUMED,
                EventType.RUN_INTERRUPTED,
                *_TERMINALS,
            ]
        )
    )
    payload: dict[str, Any]
    if kind == EventType.TASK_STARTED:
        index = TASK_IDS.index(task) if task in TASK_IDS else 9
        model = draw(st.sampled_from([None, "fake:x"]))
        payload = {"index": index, "prompt": f"part {index}", "backend": "provider", "model": model}
    elif kind == EventType.TASK_COMPLETED:
        status = draw(st.sampled_from(["completed", "partial", "failed", "interrupted"]))
        payload = {"status": status, "output": draw(_TEXTS), "error": draw(_TEXTS)}
    elif kind == EventType.WORKER_COMPLETED:
        payload = {"status": "completed", "usage": draw(_USAGE), "turns": 1}
    elif kind == EventType.MESSAGE_DELTA:
        payload = {"text": "x", "turn": 0}
    elif kind == EventType.RUN_RESUMED:
        return NewEvent(
            kind, {"reason": "restarted", "attempt": 2, "after_seq": 1, "executor": "e"}
        )
    elif kind == EventType.RUN_INTERRUPTED:
        payload = {"status": "interrupted", "reason": draw(st.sampled_from(["Ctrl-C", "gone"]))}
        if draw(st.booleans()):
            payload["usage"] = draw(_USAGE)
        return NewEvent(kind, payload)
    else:
        payload = {"status": draw(st.sampled_from(_TERMINALS[kind])), "usage": draw(_USAGE)}
        if draw(st.booleans()):
            payload["error"] = "it broke"
        return NewEvent(kind, payload)
    return NewEvent(kind, payload, task_id=task)


LOGS = st.tuples(
    st.lists(_events(), min_size=1, max_size=25),
    st.lists(st.integers(1, 6), min_size=1, max_size=25),
    st.booleans(),
)
"""Events, the sizes of the batches they are appended in, and whether the last batch goes through
``finish_run`` (which then closes the run). A batch whose terminal event gives the run an ended
status closes it too, as ``finish_run`` would (ADR 0134): the batches after it are refused."""


def _seed() -> RunRecord:
    run = RunRecord("run_p", "Question?", model="fake:x", chain_of_thought="surface")
    run.tasks = [
        TaskRecord(t, "run_p", i, f"part {i}", model="fake:x", backend="provider")
        for i, t in enumerate(TASK_IDS)
    ]
    return run


def _projected(run: RunRecord) -> tuple[Any, ...]:
    """Everything of an index row but its timestamps (which say when, not what)."""
    tasks = tuple(tuple(sorted(t.to_view().items())) for t in run.tasks)
    return (run.status, run.usage, run.error, run.metadata, run.owner, tasks)


def _as_events(batch: list[NewEvent]) -> list[Event]:
    return [Event(0, "run_p", e.type, e.payload, task_id=e.task_id) for e in batch]


async def check_log(store: EventStore, log: tuple[list[NewEvent], list[int], bool]) -> None:
    events, sizes, finish = log
    closed = False
    await store.create_run(_seed())
    batches: list[list[NewEvent]] = []
    rest = list(events)
    for size in sizes:
        batches.append(rest[:size])
        rest = rest[size:]
        if not rest:
            break
    if rest:
        batches.append(rest)
    if finish:  # the last batch ends the run, as ``end_run`` does: with a terminal event
        batches[-1].append(
            NewEvent(EventType.RUN_INTERRUPTED, {"status": "interrupted", "reason": "x"})
        )
    for i, batch in enumerate(batches):
        if closed:  # an earlier batch's terminal event ended the run: it takes no more (ADR 0134)
            with pytest.raises(RunClosedError):
                await store.append("run_p", batch)
            break
        if finish and i == len(batches) - 1:
            # The ending says what the terminal event says (the runtime's ``RunEnding``).
            end = rebuilt(_seed(), [*await store.read("run_p"), *_as_events(batch)])
            ending = RunEnding(end.status, usage=end.usage, error=end.error)
            closed = bool(await store.finish_run("run_p", batch, ending))
            assert closed, "no earlier batch ended the run"
            continue
        await store.append("run_p", batch)
        closed = rebuilt(_seed(), await store.read("run_p")).status not in OPEN_RUN_STATUSES
    kept = await store.get_run("run_p")
    # What the appends kept is what the log alone gives, computed here and by the store.
    assert _projected(kept) == _projected(rebuilt(_seed(), await store.read("run_p")))
    assert _projected(await store.rebuild_run_index("run_p")) == _projected(kept)
    if closed:
        with pytest.raises(RunClosedError):
            await store.append(
                "run_p", [NewEvent(EventType.MESSAGE_DELTA, {"text": "x", "turn": 0})]
            )


@pytest.mark.unit
@settings(max_examples=60, deadline=None)
@given(LOGS)
def test_memory_index_kept_by_appends_is_rebuilt_from_the_log(
    log: tuple[list[NewEvent], list[int], bool],
) -> None:
    asyncio.run(check_log(MemoryStore(), log))


@pytest.mark.inprocess
@settings(max_examples=25, deadline=None)
@given(LOGS)
def test_sqlite_index_kept_by_appends_is_rebuilt_from_the_log(
    log: tuple[list[NewEvent], list[int], bool],
) -> None:
    asyncio.run(_on_sqlite(lambda store: check_log(store, log)))


@pytest.mark.postgres
@settings(max_examples=15, deadline=None)
@given(LOGS)
def test_postgres_index_kept_by_appends_is_rebuilt_from_the_log(
    log: tuple[list[NewEvent], list[int], bool],
) -> None:
    asyncio.run(_on_postgres(lambda store: check_log(store, log)))


# -- rebuild repairs what the old write order could leave ----------------------------------------


async def check_repair(store: EventStore) -> None:
    """The runtime used to save a task's end in the index before appending its events; a process
    stopping in between left a row the log contradicts. The check names it; a rebuild repairs it."""
    await store.create_run(_seed())
    started = {"index": 0, "prompt": "part 0", "backend": "provider", "model": "fake:x"}
    await store.append("run_p", [NewEvent(EventType.TASK_STARTED, started, task_id="task_0")])
    early = (await store.get_run("run_p")).tasks[0]
    early.status, early.output, early.usage = "completed", "An answer.", {"input_tokens": 3}
    await store.save_task(early)
    assert await check_run_index(store, "run_p") == [
        "task task_0 status: index 'completed', log 'running'"
    ]
    repaired = await store.rebuild_run_index("run_p")
    assert await check_run_index(store, "run_p") == []
    task = repaired.tasks[0]
    assert (task.status, task.output, task.usage) == ("running", None, {})
    assert repaired.status == "running"


@pytest.mark.unit
def test_memory_rebuild_repairs_a_task_the_index_ended_early() -> None:
    asyncio.run(check_repair(MemoryStore()))


@pytest.mark.inprocess
def test_sqlite_rebuild_repairs_a_task_the_index_ended_early() -> None:
    asyncio.run(_on_sqlite(check_repair))


@pytest.mark.postgres
def test_postgres_rebuild_repairs_a_task_the_index_ended_early() -> None:
    asyncio.run(_on_postgres(check_repair))


# -- a check reads a run's lifecycle, not its deltas (ADR 0064) ---------------------------------


class ReadRecordingStore(MemoryStore):
    """Keeps every event its log hands a reader, by ``read`` or ``read_types``."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[Event] = []

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        out = await super().read(run_id, after=after, limit=limit, apart=apart)
        self.handed += out
        return out

    async def read_types(
        self,
        run_id: str,
        types: Collection[str],
        *,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Event]:
        out = await super().read_types(run_id, types, after=after, limit=limit)
        self.handed += out
        return out


def _chatty(request: TurnRequest, turn: int) -> Iterator[Chunk]:
    for i in range(1500):
        yield reasoning(f"Step {i}. ")
        yield text(f"word {i} ")
    yield UsageChunk(input_tokens=7, output_tokens=3000, reasoning_tokens=1500)


@pytest.mark.unit
def test_a_check_reads_a_runs_lifecycle_events_and_none_of_its_deltas() -> None:
    """A run of the real runtime with thousands of deltas: the check is handed its lifecycle
    events only, and finds what a fold of the whole log finds -- nothing, then exactly what was
    changed in the index by hand."""

    async def go() -> tuple[list[Event], list[IndexCheck], list[list[Event]], RunRecord]:
        store = ReadRecordingStore()
        runtime = Runtime(store, provider_factory=lambda m: FakeProvider(_chatty, model=m))
        request = RunRequest(
            "Question?",
            model="fake:chatty",
            tasks=[
                TaskSpec("part 0", model="fake:chatty"),
                TaskSpec("part 1", model="fake:chatty"),
            ],
        )
        run = await runtime.create_run(request, chain_of_thought="surface")
        await runtime.execute(run.run_id)
        whole = await store.read(run.run_id)
        checks, handed = [], []
        for tamper in (False, True):
            if tamper:
                await store.update_run(run.run_id, status="failed", usage={"input_tokens": 1})
            store.handed.clear()
            checks.append(await check_index(store, run.run_id))
            handed.append(list(store.handed))
        return whole, checks, handed, await store.get_run(run.run_id)

    whole, (clean, tampered), handed, record = asyncio.run(go())
    kinds = [e.type for e in whole]
    assert kinds.count(EventType.MESSAGE_DELTA) + kinds.count(EventType.REASONING_DELTA) >= 1000
    lifecycle = [e.seq for e in whole if e.type in PROJECTED_EVENT_TYPES]
    for got in handed:
        assert [e.seq for e in got] == lifecycle
        assert not any(e.type.endswith(".delta") for e in got)
    assert clean.projection == reproject(whole) and clean.differences == []
    assert tampered.differences == differences(record, reproject(whole))
    assert {d.field for d in tampered.differences} == {"status", "usage"}
