"""The one conformance suite every ``EventStore`` backend must pass, unchanged.

A backend's test module subclasses :class:`StoreConformance` and overrides the ``store`` fixture
(an open, empty store, closed afterwards). Nothing here knows which backend it is talking to.
"""

from __future__ import annotations

import asyncio
import copy
import math
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thoughtgate.access.keys import authenticate, create_key
from thoughtgate.errors import AuthenticationError, RunClosedError, RunNotFoundError, UsageError
from thoughtgate.events.schema import EVENT_VERSION, Event, EventType, NewEvent
from thoughtgate.store.base import EventStore, KeyStore, RunEnding
from thoughtgate.store.leases import Owner, close_orphaned_runs
from thoughtgate.store.projection import check_run_index
from thoughtgate.store.records import ApiKeyRecord, RunRecord, TaskRecord, new_id

__all__ = [
    "EventLogConformance",
    "KeyStoreConformance",
    "RunIndexConformance",
    "StoreConformance",
    "assert_same_events",
    "collect",
    "dead_pid",
    "deltas",
    "make_run",
]


def _column_text(*, max_size: int) -> st.SearchStrategy[str]:
    """Any text a program may name a task or a type with: every code point. What a column
    keeps on every backend is what UTF-8 carries, but NUL (PostgreSQL's ``text`` refuses it);
    a task id or a type holding NUL or a surrogate is refused by every store alike
    (``UsageError``, nothing of the batch stored: ADRs 0114, 0120)."""
    return st.text(st.characters(), max_size=max_size)


def _payload_text(*, max_size: int) -> st.SearchStrategy[str]:
    """Any text a payload's key or value may hold: every code point, NUL and lone surrogates
    included (a provider's text cut inside an emoji; Python's ``json`` reads ``"\\ud800"``),
    which every store keeps exactly (ADR 0114)."""
    return st.text(st.characters(), max_size=max_size)


def _no_column_keeps(text: str) -> bool:
    """``text`` holds NUL or a surrogate: no store keeps it in a column (ADRs 0114, 0120)."""
    return any(c == "\x00" or "\ud800" <= c <= "\udfff" for c in text)


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _payload_text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(_payload_text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
"""JSON values a payload may hold: integers past 64 bits, any text, nulls at any depth."""


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def make_run(*, created_at: float = 1_700_000_000.0, tasks: int = 0, **kw: Any) -> RunRecord:
    run_id = new_id("run")
    return RunRecord(
        run_id,
        f"prompt of {run_id}",
        created_at=created_at,
        updated_at=created_at,
        tasks=[TaskRecord(new_id("task"), run_id, i, f"task {i}") for i in range(tasks)],
        **kw,
    )


def deltas(n: int, *, start: int = 0, task_id: str | None = None) -> list[NewEvent]:
    return [
        NewEvent(
            EventType.MESSAGE_DELTA, {"i": start + i, "text": f"chunk {start + i}"}, task_id=task_id
        )
        for i in range(n)
    ]


async def collect(it: AsyncIterator[Event], *, within: float = 10.0) -> list[Event]:
    """Drain a tail, failing (rather than hanging) if it does not end."""
    out: list[Event] = []

    async def drain() -> None:
        async for event in it:
            out.append(event)

    await asyncio.wait_for(drain(), within)
    return out


async def a_run_of_tool_failures(store: EventStore) -> str:
    """A run of 600 tool failures (camelCase ``callId``, as the old vocabulary wrote them, which
    the current one stores as is) and its end; a test then marks its first 300 rows as the old
    vocabulary (``v`` 0) in its database, for :func:`assert_old_rows_replay_upgraded`."""
    run = make_run()
    await store.create_run(run)
    failed = [
        NewEvent(EventType.TOOL_FAILED, {"callId": f"c{i}", "error": "boom"}, ts=1.5 + i)
        for i in range(600)
    ]
    await store.append(run.run_id, [*failed, NewEvent(EventType.RUN_ERROR)])
    return run.run_id


ENDED_UNCLOSED_RUNS: list[
    tuple[str, str, float, int, int, str | None, float | None, float | None]
] = [
    ("run_a", "pending", 1.0, 0, 1, None, None, None),
    ("run_b", "running", 9.0, 2, 2, "gone", 1.0, None),  # its lease ran out
    ("run_c", "completed", 9.0, 2, 3, None, None, None),  # a terminal event at 7.0
    ("run_d", "failed", 8.0, 0, 4, "gone", 1.0, None),  # no event: its updated_at
    ("run_e", "interrupted", 9.0, 1, 5, None, None, 3.0),  # closed: kept
]
"""Runs as a store from before ADR 0134 could hold them, for the upgrade tests of both SQL
backends: ``(run_id, status, updated_at, last_seq, change_seq, owner, lease_expires_at,
closed_at)``, each created at 1.0; two ended without a ``closed_at``."""
ENDED_UNCLOSED_EVENTS: list[tuple[str, int, str, float]] = [
    ("run_b", 1, "run.started", 2.0),
    ("run_b", 2, "message.delta", 3.0),
    ("run_c", 1, "run.started", 2.0),
    ("run_c", 2, "run.settlement.completed", 7.0),
    ("run_e", 1, "run.interrupted", 2.5),
]
"""Their events: ``(run_id, seq, type, ts)``, payload ``{}``."""
ENDED_UNCLOSED_CLOSED_AT = {"run_a": None, "run_b": None, "run_c": 7.0, "run_d": 8.0, "run_e": 3.0}
"""Each run's ``closed_at`` once the upgrade closed them: at the last terminal event's time,
else ``updated_at``; a run already closed keeps its time."""


async def assert_ended_runs_closed(store: EventStore) -> None:
    """After the upgrade of :data:`ENDED_UNCLOSED_RUNS`: only the pending and running runs are
    open, every run, status and event is kept, an ended run takes no more events and the running
    one takes its next with the next number."""
    assert [r.run_id for r in (await store.open_runs()).runs] == ["run_a", "run_b"]
    assert [r.run_id for r in (await store.open_runs(expired=True)).runs] == ["run_b"]
    assert sorted((r.run_id, r.status) for r in await store.list_runs()) == [
        (run[0], run[1]) for run in ENDED_UNCLOSED_RUNS
    ]
    assert [e.type for e in await store.read("run_c")] == [
        "run.started",
        "run.settlement.completed",
    ]
    with pytest.raises(RunClosedError):
        await store.append("run_d", deltas(1))
    assert [e.seq for e in await store.append("run_b", deltas(1))] == [3]


async def assert_old_rows_replay_upgraded(store: EventStore, run_id: str) -> None:
    """Rows of the old vocabulary come back upgraded whether their page is all old (read as
    columns) or mixed (read row by row), by every read: whole, tailed, in small batches.
    (Their stamps a second apart, moved onto PostgreSQL's clock as stored: ADR 0074.)"""
    first = await store.read(run_id)
    for got in (
        first,
        await collect(store.tail(run_id)),
        await collect(store.tail(run_id, batch=100)),
    ):
        assert [e.seq for e in got] == list(range(1, 602))
        assert all(e.v == EVENT_VERSION for e in got)
        assert [e.payload.get("call_id") for e in got[:300]] == [f"c{i}" for i in range(300)]
        assert not any("callId" in e.payload for e in got[:300])
        assert all("callId" in e.payload for e in got[300:600])  # already current: as is
        assert [e.ts for e in got] == [e.ts for e in first]
        assert [e.ts - got[0].ts for e in got[:600]] == pytest.approx(list(range(600)))


GAP_RUN_EVENTS = 2500
"""The events of :func:`a_run_to_hole`'s run: three pages of 1000, the last short."""
GAP_AT = 500
"""The sequence number a test deletes from that run's first page, in its database."""


async def a_run_to_hole(store: EventStore) -> tuple[str, list[Event]]:
    """A run of :data:`GAP_RUN_EVENTS` events (task ids, some ``None``); a test then deletes the
    row numbered :data:`GAP_AT` in its database, for :func:`assert_a_gap_is_never_renumbered`."""
    run = make_run()
    await store.create_run(run)
    batch = [
        NewEvent(EventType.MESSAGE_DELTA, {"i": i}, task_id=None if i % 7 == 0 else f"t{i % 3}")
        for i in range(GAP_RUN_EVENTS - 1)
    ]
    return run.run_id, await store.append(run.run_id, [*batch, NewEvent(EventType.RUN_FAILED)])


async def assert_a_gap_is_never_renumbered(
    store: EventStore, run_id: str, written: list[Event]
) -> None:
    """A page with a gap (a row missing, which no append leaves: it was deleted) is not taken as
    columns, whose numbers the backend sends as a count and the largest (ADR 0127): every event
    handed out is the row stored under its number, and the first page is every row of its range
    but the missing one, by every read."""
    stored = {e.seq: e.to_dict() for e in written if e.seq != GAP_AT}
    first_page = [s for s in range(1, 1001) if s != GAP_AT]
    for got in (
        await store.read(run_id),
        await store.read(run_id, limit=1000),
        await collect(store.tail(run_id)),
    ):
        seqs = [e.seq for e in got]
        assert seqs[: len(first_page)] == first_page
        assert seqs == sorted(set(seqs))
        assert all(e.to_dict() == stored[e.seq] for e in got)


def assert_same_events(got: list[Event], expected: list[Event]) -> None:
    assert [e.to_dict() for e in got] == [e.to_dict() for e in expected]


class _Collecting:
    """A live reader that keeps what the store publishes to it, in order."""

    def __init__(self, into: list[Event]) -> None:
        self.into = into

    def published(self, events: Sequence[Event]) -> None:
        self.into.extend(events)

    def notified(self, last_seq: int | None) -> None:
        pass


_EVERY_BACKEND = settings(
    max_examples=25,
    deadline=None,
    # The fixture store is reused across examples on purpose (each example uses a fresh run),
    # and these properties are deliberately run by every backend's subclass: an example that
    # breaks one backend is a valid example for all of them.
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.differing_executors,
        HealthCheck.too_slow,
    ],
)


class EventLogConformance:
    """The event log (``store.log.EventLog``): appends, reads, tails, a run's end, and the
    hand-off of committed batches to listeners and observers. Runs come from the run index."""

    stamps_as_given = True
    """Whether an event is stored with the ``ts`` it was made with; PostgreSQL moves it onto the
    server's clock (ADR 0074)."""

    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        raise NotImplementedError("a backend's test class must override the `store` fixture")
        yield  # pragma: no cover

    @pytest.mark.parametrize(
        "missing",
        ["run_does_not_exist", "run_\x00", "run_\ud800"],
        ids=["plain", "nul", "surrogate"],
    )
    async def test_unknown_run_raises_run_not_found_everywhere(
        self, store: EventStore, missing: str
    ) -> None:
        """Also for a run id no store can hold (NUL, a surrogate: refused at creation, ADR
        0120), which PostgreSQL answered with a ``StoreError`` (a daemon's 503 for a URL
        holding ``%00``) and the SQL stores with a raw ``UnicodeEncodeError``."""
        await store.create_run(make_run())  # a store with something in it
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.get_run(missing),
            lambda: store.update_run(missing, status="failed"),
            lambda: store.append(missing, deltas(2)),
            lambda: store.append(missing, []),
            lambda: store.append_one(missing, NewEvent("x")),
            lambda: store.read(missing),
            lambda: store.read(missing, after=5, limit=1),
            lambda: store.read_types(missing, [EventType.RUN_STARTED]),
            lambda: collect(store.tail(missing)),
            lambda: store.rebuild_run_index(missing),
            lambda: store.finish_run(
                missing, [NewEvent(EventType.RUN_FAILED)], RunEnding("failed")
            ),
        ]
        if missing == "run_does_not_exist":  # a record's odd id is refused (UsageError)
            calls.append(lambda: store.save_task(TaskRecord("task_x", missing, 0, "p")))
        for call in calls:
            with pytest.raises(RunNotFoundError) as info:
                await call()
            assert info.value.run_id == missing
        assert await store.find_run_ids(missing) == []

    async def test_append_assigns_seq_from_one_without_gaps(self, store: EventStore) -> None:
        run = make_run()
        await store.create_run(run)
        one = await store.append_one(run.run_id, NewEvent(EventType.RUN_STARTED, {"p": 1}))
        many = await store.append(run.run_id, deltas(4))
        assert one.seq == 1
        assert [e.seq for e in many] == [2, 3, 4, 5]
        assert all(e.run_id == run.run_id for e in [one, *many])
        assert await store.append(run.run_id, []) == []
        assert_same_events(await store.read(run.run_id), [one, *many])

    async def test_each_run_has_its_own_sequence(self, store: EventStore) -> None:
        a, b = make_run(), make_run()
        await store.create_run(a)
        await store.create_run(b)
        await store.append(a.run_id, deltas(3))
        got = await store.append(b.run_id, deltas(2))
        assert [e.seq for e in got] == [1, 2]
        assert [e.seq for e in await store.read(a.run_id)] == [1, 2, 3]

    async def test_read_after_and_limit(self, store: EventStore) -> None:
        run = make_run()
        await store.create_run(run)
        assert await store.read(run.run_id) == []
        await store.append(run.run_id, deltas(10))
        assert [e.seq for e in await store.read(run.run_id, after=7)] == [8, 9, 10]
        assert [e.seq for e in await store.read(run.run_id, limit=3)] == [1, 2, 3]
        assert [e.seq for e in await store.read(run.run_id, after=4, limit=2)] == [5, 6]
        assert [e.seq for e in await store.read(run.run_id, after=8, limit=5)] == [9, 10]
        assert await store.read(run.run_id, after=10) == []
        assert await store.read(run.run_id, after=99) == []
        assert await store.read(run.run_id, after=2, limit=0) == []

    async def test_read_types_returns_those_events_only_as_read_does(
        self, store: EventStore
    ) -> None:
        run = make_run(tasks=1)
        await store.create_run(run)
        task = run.tasks[0].task_id
        started = {"index": 0, "prompt": "task 0", "backend": "provider", "model": "m"}
        await store.append(
            run.run_id,
            [
                NewEvent(EventType.RUN_STARTED, {"prompt": "p", "tasks": 1}, ts=1.25),
                NewEvent(EventType.TASK_STARTED, started, task_id=task, ts=2.5),
                *deltas(1200, task_id=task),  # more than a page of the databases' reads
                NewEvent(EventType.WORKER_COMPLETED, {"usage": {"input_tokens": 3}}, task_id=task),
                NewEvent(EventType.TASK_COMPLETED, {"status": "completed"}, task_id=task),
                *deltas(3),
                NewEvent(EventType.RUN_SETTLEMENT_COMPLETED, {"status": "completed"}),
            ],
        )
        everything = await store.read(run.run_id)
        wanted = {EventType.RUN_STARTED, EventType.TASK_STARTED, EventType.TASK_COMPLETED}
        wanted |= {EventType.RUN_SETTLEMENT_COMPLETED}
        expected = [e for e in everything if e.type in wanted]
        got = await store.read_types(run.run_id, wanted)
        assert_same_events(got, expected)
        assert [e.seq for e in got] == [1, 2, 1204, 1208]
        assert all(e.type != EventType.MESSAGE_DELTA for e in got)
        assert_same_events(await store.read_types(run.run_id, wanted, limit=2), expected[:2])
        assert_same_events(await store.read_types(run.run_id, wanted, after=2), expected[2:])
        assert_same_events(
            await store.read_types(run.run_id, wanted, after=1, limit=2), expected[1:3]
        )
        assert await store.read_types(run.run_id, wanted, after=1208) == []
        assert await store.read_types(run.run_id, wanted, limit=0) == []
        assert await store.read_types(run.run_id, []) == []
        assert await store.read_types(run.run_id, ["no.such.type"]) == []
        empty = make_run()
        await store.create_run(empty)
        assert await store.read_types(empty.run_id, wanted) == []

    async def test_payload_json_round_trip_is_exact(self, store: EventStore) -> None:
        run = make_run()
        await store.create_run(run)
        reasoning = ("Let me think about this carefully — ünïcödé, 中文, עברית, 🧠. " * 20_000)[
            :1_048_576
        ]
        payloads: list[dict[str, Any]] = [
            {
                "text": "plain",
                "unicode": "é ß 中文 עברית 😀 \u200b zero-width",
                "controls": 'tab\tnewline\nnul\x00bell\x07quote"backslash\\',
                "nested": {
                    "list": [1, -2, 3.25, None, True, False, [], {}],
                    "deep": {"a": {"b": "c"}},
                },
                "numbers": {"big": 2**62, "neg": -(2**53), "small": 1e-300, "pi": math.pi},
                "empty": "",
                "lone_surrogates": "a\ud800b\udfffc",  # e.g. text cut inside an emoji
            },
            {"reasoning": reasoning, "reasoning_size": len(reasoning.encode("utf-8"))},
            {},
        ]
        new = [
            NewEvent(EventType.AGENT_RESPONSE, p, task_id="task_1", ts=1_700_000_000.123456789 + i)
            for i, p in enumerate(payloads)
        ]
        appended = await store.append(run.run_id, new)
        # as made, on the store's clock (PostgreSQL moves them onto the server's: ADR 0074)
        assert [e.ts for e in appended] == pytest.approx([n.ts for n in new], abs=60)
        for got in (appended, await store.read(run.run_id)):
            assert [dict(e.payload) for e in got] == payloads
            assert [e.ts for e in got] == [e.ts for e in appended]
            assert [e.task_id for e in got] == ["task_1"] * 3
            assert [e.type for e in got] == [EventType.AGENT_RESPONSE] * 3
            stored = got[1].payload["reasoning"]
            assert stored == reasoning
            assert len(stored.encode("utf-8")) == got[1].payload["reasoning_size"] >= 1_048_576

    async def test_nul_and_lone_surrogates_in_payloads_are_kept_and_in_columns_refused_alike(
        self, store: EventStore
    ) -> None:
        """A payload's keys and values may hold lone surrogates (a provider's text cut inside an
        emoji) and NUL: the log replays them exactly, in a batch of one task and type and in a
        mixed one. A task id or a type holding one is refused by every store with a
        ``UsageError`` that stores nothing of its batch; the run goes on. A task's prompt and
        output and the run's error holding one are kept exactly in the log and as U+FFFD in the
        run index, on PostgreSQL too, whose ``text`` refuses NUL (ADRs 0114, 0120)."""
        run = make_run(tasks=1)
        await store.create_run(run)
        task = run.tasks[0].task_id
        odd = [
            *["\ud800", "\udfff", "a\ud83db", "\ude00\ud83d", "x\ud800\x00\udc00"],
            *["\x00", "a\x00b", "\x00\x00"],  # NUL: PostgreSQL's text refuses it (ADR 0120)
        ]
        payloads: list[dict[str, Any]] = [
            {"value": s, "nested": [s, {s: s}], s: len(s)} for s in odd
        ]
        uniform = [NewEvent(EventType.MESSAGE_DELTA, p, task_id=task) for p in payloads]
        mixed = [
            NewEvent(EventType.MESSAGE_DELTA if i % 2 else "custom", p, task_id=[None, task][i % 2])
            for i, p in enumerate(payloads)
        ]
        kept = [*await store.append(run.run_id, uniform), *await store.append(run.run_id, mixed)]
        for column in odd:
            for refused in (
                [NewEvent(EventType.MESSAGE_DELTA, {}, task_id=column)],
                [NewEvent(column, {"i": 1})],
                [NewEvent(EventType.MESSAGE_DELTA, {}), NewEvent(column, {})],
                [NewEvent(EventType.MESSAGE_DELTA, {}), NewEvent("x", {}, task_id=column)],
            ):
                with pytest.raises(UsageError, match=r"surrogate|NUL \(U\+0000\)"):
                    await store.append(run.run_id, refused)
        ending = [
            NewEvent(EventType.TASK_STARTED, {"index": 0, "prompt": "p\ud800q\x00"}, task_id=task),
            NewEvent(
                EventType.TASK_COMPLETED,
                {"status": "completed", "output": "o\x00\udfff"},
                task_id=task,
            ),
        ]
        kept += await store.append(run.run_id, ending)
        kept.append(
            await store.append_one(
                run.run_id, NewEvent(EventType.RUN_FAILED, {"status": "failed", "error": "e\x00"})
            )
        )
        sent = [*uniform, *mixed, *ending]
        assert [(e.task_id, e.type, e.payload) for e in kept[:-1]] == [
            (n.task_id, n.type, n.payload) for n in sent
        ]
        assert [e.seq for e in kept] == list(range(1, len(sent) + 2))
        for replay in (await store.read(run.run_id), await collect(store.tail(run.run_id))):
            assert_same_events(replay, kept)
        indexed = await store.get_run(run.run_id)
        assert indexed is not None
        assert (indexed.status, indexed.error) == ("failed", "e\ufffd")
        assert [(t.prompt, t.output) for t in indexed.tasks] == [
            ("p\ufffdq\ufffd", "o\ufffd\ufffd")
        ]
        assert await check_run_index(store, run.run_id) == []

    async def test_batches_of_one_task_and_type_or_of_several_read_back_exactly(
        self, store: EventStore
    ) -> None:
        """A batch whose events share their task and type (a model turn's deltas; SQLite and
        PostgreSQL send those once, ADR 0096) and batches that mix tasks, types or no task
        store every field of every event, numbered on without a gap, at every size across the
        backends' chunks of rows."""
        run = make_run()
        await store.create_run(run)
        shapes = {
            "one": lambda i: ("task_a", EventType.MESSAGE_DELTA),
            "no task": lambda i: (None, EventType.REASONING_DELTA),
            "types": lambda i: ("task_a", (EventType.MESSAGE_DELTA, EventType.TOOL_FAILED)[i % 2]),
            "tasks": lambda i: (("task_a", None)[i % 2], EventType.MESSAGE_DELTA),
            "last differs": lambda i: ("task_b" if i == 9 else "task_a", EventType.MESSAGE_DELTA),
        }
        appended: list[Event] = []
        made: list[NewEvent] = []
        for size in (1, 2, 3, 10, 127, 128, 129, 256, 257, 600):
            for name, shape in shapes.items():
                batch = [
                    NewEvent(shape(i)[1], {"shape": name, "i": i}, task_id=shape(i)[0], ts=1.5 + i)
                    for i in range(size)
                ]
                made += batch
                appended += await store.append(run.run_id, batch)
        assert [e.seq for e in appended] == list(range(1, len(made) + 1))
        for got in (appended, await store.read(run.run_id)):
            assert [(e.task_id, e.type, dict(e.payload)) for e in got] == [
                (n.task_id, n.type, dict(n.payload)) for n in made
            ]
            assert [e.ts for e in got] == [e.ts for e in appended]
        if self.stamps_as_given:
            assert [e.ts for e in appended] == [n.ts for n in made]

    async def test_every_stamp_reads_back_exactly_whatever_page_it_is_in(
        self, store: EventStore
    ) -> None:
        """Stamps a page of columns cannot carry exactly (SQLite's crosses as multiples of
        2**-22) are read row by row: a replay never rounds one. Each read gives the stamps the
        append stored (PostgreSQL's moved onto its clock, ADR 0074; the others' as given)."""
        odd = [0.1, 1e-300, -5.5, 2.0**40 + 0.5, 1_700_000_000.0 + 2.0**-30, 1e300, 0.0]
        stamps = [1_700_000_000.123456789 + i for i in range(20)]
        stamps[3:3] = odd
        run = make_run()
        await store.create_run(run)
        news = [NewEvent(EventType.MESSAGE_DELTA, {"i": i}, ts=ts) for i, ts in enumerate(stamps)]
        appended = await store.append(run.run_id, [*news, NewEvent(EventType.RUN_ERROR, ts=2.5)])
        stored = [e.ts for e in appended]
        if self.stamps_as_given:
            assert stored == [*stamps, 2.5]
        assert [e.ts for e in await store.read(run.run_id)] == stored
        assert [e.ts for e in await store.read(run.run_id, after=10)] == stored[10:]
        replayed = await collect(store.tail(run.run_id, batch=4))
        assert [e.ts for e in replayed] == stored
        assert [e.payload for e in replayed[:-1]] == [{"i": i} for i in range(len(stamps))]

    async def test_reads_longer_than_a_page_of_the_database_are_whole_and_in_order(
        self, store: EventStore
    ) -> None:
        """A read of a whole run, or of any stretch of it, is every event once in order, however
        many queries the backend splits it into."""
        run = make_run()
        await store.create_run(run)
        for start in range(0, 2_400, 800):
            await store.append(run.run_id, deltas(800, start=start))
        await store.append(run.run_id, [NewEvent(EventType.RUN_FAILED)])
        everything = await store.read(run.run_id)
        assert [e.seq for e in everything] == list(range(1, 2_402))
        assert [e.payload["i"] for e in everything[:-1]] == list(range(2_400))
        stretch = await store.read(run.run_id, after=990, limit=1_020)
        assert [e.seq for e in stretch] == list(range(991, 2_011))
        assert stretch == everything[990:2_010]
        assert await collect(store.tail(run.run_id)) == everything
        assert await collect(store.tail(run.run_id, after=1_234, batch=300)) == everything[1_234:]

    async def test_a_read_after_the_largest_sequence_number_is_empty(
        self, store: EventStore
    ) -> None:
        """A client may resume from any number a 64-bit sequence can hold: reading after the
        largest, or just before it, gives nothing rather than an overflow error."""
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, deltas(3))
        largest = 2**63 - 1
        for after in (largest, largest - 1, largest - 500):
            assert await store.read(run.run_id, after=after) == []
            assert await store.read(run.run_id, after=after, limit=2_000) == []
        assert [e.seq for e in await store.read(run.run_id, after=1)] == [2, 3]

    async def test_task_ids_and_types_replay_exactly_in_pages_of_one_value_and_of_many(
        self, store: EventStore
    ) -> None:
        """The SQL backends send a replay page's task ids and types as joined texts and a column
        of one value as that value (ADR 0039, 0095): pages all of one task and type, all without
        a task, all of ``''``, of ``''`` but one without, of types of one length but one, and of
        values holding the separator come back as stored, in pages of every size read."""
        run = make_run()
        await store.create_run(run)
        groups: list[list[tuple[str | None, str]]] = [
            [("task-1", EventType.MESSAGE_DELTA)] * 100,
            [(None, EventType.MESSAGE_DELTA)] * 100,
            [("", EventType.REASONING_DELTA)] * 100,
            [("", EventType.MESSAGE_DELTA)] * 37
            + [(None, EventType.MESSAGE_DELTA)]
            + [("", EventType.MESSAGE_DELTA)] * 62,
            [("t", "custom.a")] * 50 + [("t", "custom.b")] + [("t", "custom.a")] * 49,
            [("t", "custom.a")] * 20 + [("t\x1ft", "custom\x1fa")] + [("t", "custom.a")] * 79,
            [("x\x1f", "custom.a")] * 100,
        ]
        news = [
            NewEvent(type_, {"i": i}, task_id=task_id)
            for i, (task_id, type_) in enumerate(kind for group in groups for kind in group)
        ]
        written = await store.append(run.run_id, news)
        last = await store.append_one(run.run_id, NewEvent(EventType.RUN_FAILED))
        expected = [*written, last]
        assert [(e.task_id, e.type) for e in written] == [(n.task_id, n.type) for n in news]
        assert_same_events(await store.read(run.run_id), expected)
        assert_same_events(await collect(store.tail(run.run_id)), expected)
        assert_same_events(await collect(store.tail(run.run_id, batch=100)), expected)
        assert_same_events(await collect(store.tail(run.run_id, batch=30)), expected)

    @settings(
        max_examples=20,
        deadline=None,
        # The fixture store is reused across examples (each example appends to a fresh run).
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
            HealthCheck.too_slow,
        ],
    )
    @given(
        kinds=st.lists(
            st.tuples(
                st.none() | st.sampled_from(["", "task_1", "t\x1f"]) | _column_text(max_size=4),
                st.sampled_from([EventType.MESSAGE_DELTA, "custom\x1f"]) | _column_text(max_size=6),
                st.dictionaries(_payload_text(max_size=6), _JSON_VALUES, max_size=4),
            ),
            min_size=1,
            max_size=40,
        ),
        repeats=st.integers(min_value=1, max_value=30),
        batch=st.integers(min_value=1, max_value=60),
    )
    async def test_property_a_replay_gives_back_exactly_what_was_appended(
        self,
        store: EventStore,
        kinds: list[tuple[str | None, str, dict[str, Any]]],
        repeats: int,
        batch: int,
    ) -> None:
        """Whatever the task ids (none, empty, holding the separator), types and payloads (big
        integers, any code point, nested nulls), and however pages fall (a column of one value
        or many: ``repeats`` copies of each kind in a row), a read and a tail give back events
        equal to those appended, in order and without a gap (ADR 0026, 0039, 0095); a batch
        with a task id or a type holding NUL or a surrogate is refused whole by every store
        alike, and the run goes on (ADRs 0114, 0120)."""
        run = make_run()
        await store.create_run(run)
        news = [
            NewEvent(type_, payload, task_id=task_id)
            for task_id, type_, payload in kinds
            for _ in range(repeats)
        ]
        columns = [n.type for n in news] + [n.task_id for n in news if n.task_id is not None]
        if any(_no_column_keeps(c) for c in columns):
            with pytest.raises(UsageError, match="which no store can keep in a column"):
                await store.append(run.run_id, news)
            news = []
        written = await store.append(run.run_id, news)
        last = await store.append_one(run.run_id, NewEvent(EventType.RUN_FAILED))
        expected = [*written, last]
        assert [(e.task_id, e.type, e.payload) for e in written] == [
            (n.task_id, n.type, n.payload) for n in news
        ]
        for replay in (
            await store.read(run.run_id),
            await collect(store.tail(run.run_id)),
            await collect(store.tail(run.run_id, batch=batch)),
        ):
            assert replay == expected
            assert [type(e) for e in replay] == [Event] * len(expected)
            assert_same_events(replay, expected)

    async def test_a_replay_passes_the_filter_which_withholds_reasoning_below_developer(
        self, store: EventStore
    ) -> None:
        """Replayed events are plain events the one output filter decides on, every one of
        them: reasoning never reaches a viewer or a member, and a developer of a ``surface``
        run sees it."""
        from thoughtgate.access.filter import filter_events

        mark = "REASONING-CANARY-3e1"
        run = make_run()
        await store.create_run(run)
        news: list[NewEvent] = []
        for i in range(600):  # several pages of every size a backend reads
            if i % 7 == 0:
                payload = {"text": mark, "reasoning_kind": "raw", "index": i, "turn": 0}
                news.append(NewEvent(EventType.REASONING_DELTA, payload, task_id="task_1"))
            else:
                news.append(NewEvent(EventType.MESSAGE_DELTA, {"text": f"a{i}", "turn": 0}))
        await store.append(run.run_id, [*news, NewEvent(EventType.RUN_ERROR, {"error": "x"})])
        for replay in (await store.read(run.run_id), await collect(store.tail(run.run_id))):
            assert len(replay) == 601
            for role in ("viewer", "member"):
                for mode in ("hidden", "surface", "telemetry_only"):
                    shown = filter_events(replay, role, mode=mode)
                    assert mark not in repr([e.to_dict() for e in shown])
                    assert [e.seq for e in shown] == sorted({e.seq for e in shown})
            seen = filter_events(replay, "developer", mode="surface")
            assert sum(mark in repr(e.payload) for e in seen) == len(range(0, 600, 7))

    async def test_appended_payload_is_decoupled_from_the_caller(self, store: EventStore) -> None:
        run = make_run()
        await store.create_run(run)
        payload: dict[str, Any] = {"items": [1, 2]}
        await store.append_one(run.run_id, NewEvent("x", payload))
        payload["items"].append(3)
        assert (await store.read(run.run_id))[0].payload == {"items": [1, 2]}

    async def test_concurrent_appends_have_no_gaps_and_no_duplicates(
        self, store: EventStore
    ) -> None:
        run = make_run()
        await store.create_run(run)
        writers, rounds = 16, 10

        async def writer(w: int) -> list[Event]:
            out: list[Event] = []
            for r in range(rounds):
                out += await store.append(
                    run.run_id, [NewEvent("w", {"w": w, "r": r, "k": k}) for k in range(r % 3 + 1)]
                )
            return out

        results = await asyncio.gather(*(writer(w) for w in range(writers)))
        total = sum(len(r) for r in results)
        stored = await store.read(run.run_id)
        assert [e.seq for e in stored] == list(range(1, total + 1))
        assert sorted(e.seq for r in results for e in r) == list(range(1, total + 1))
        for w, mine in enumerate(results):  # each writer's own events keep its order
            keys = [(e.payload["r"], e.payload["k"]) for e in stored if e.payload["w"] == w]
            assert keys == sorted(keys)
            assert [e.seq for e in mine] == sorted(e.seq for e in mine)

    async def test_tail_yields_stored_then_live_events_and_stops_at_terminal(
        self, store: EventStore
    ) -> None:
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, deltas(3))
        got: list[Event] = []
        three_seen = asyncio.Event()

        async def reader() -> None:
            async for event in store.tail(run.run_id):
                got.append(event)
                if event.seq == 3:
                    three_seen.set()

        task = asyncio.create_task(reader())
        await asyncio.wait_for(three_seen.wait(), 5)
        await store.append(run.run_id, deltas(2, start=3))
        await store.append_one(
            run.run_id, NewEvent(EventType.TOOL_FAILED, {"x": 1})
        )  # not terminal
        await store.append_one(run.run_id, NewEvent(EventType.RUN_SETTLEMENT_COMPLETED))
        await asyncio.wait_for(task, 5)  # ended by the terminal event, not cancelled
        await store.append(run.run_id, deltas(1))  # after terminal: not delivered
        assert [e.seq for e in got] == [1, 2, 3, 4, 5, 6, 7]
        assert got[-1].type == EventType.RUN_SETTLEMENT_COMPLETED

    async def test_tail_of_a_finished_run_replays_and_ends(self, store: EventStore) -> None:
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, [*deltas(4), NewEvent(EventType.RUN_FAILED, {"why": "x"})])
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = await collect(store.tail(run.run_id))
        assert [e.seq for e in got] == [1, 2, 3, 4, 5]
        assert loop.time() - started < 1.0  # at once: no waiting for a poll
        resumed = await collect(store.tail(run.run_id, after=3))
        assert [e.seq for e in resumed] == [4, 5]

    async def test_tail_resumes_after_a_given_seq_in_small_batches(self, store: EventStore) -> None:
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, [*deltas(9), NewEvent(EventType.RUN_ERROR)])
        got = await collect(store.tail(run.run_id, after=2, batch=3))
        assert [e.seq for e in got] == list(range(3, 11))

    async def test_tail_over_full_pages_yields_each_event_once_in_order(
        self, store: EventStore
    ) -> None:
        """Full pages are read ahead while the previous one is handed out: still every event
        once, in order, ending at the terminal event whether it ends a page or sits inside one,
        and a terminal event appended mid-log stops the tail there."""
        for total in (9, 10, 11):  # the terminal event: ending a page, first of one, inside one
            run = make_run()
            await store.create_run(run)
            await store.append(run.run_id, [*deltas(total - 1), NewEvent(EventType.RUN_ERROR)])
            got = await collect(store.tail(run.run_id, batch=3))
            assert [e.seq for e in got] == list(range(1, total + 1))
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, [*deltas(4), NewEvent(EventType.RUN_FAILED), *deltas(5)])
        got = await collect(store.tail(run.run_id, batch=2))
        assert [e.seq for e in got] == [1, 2, 3, 4, 5]

    async def test_tail_of_full_pages_then_live_events(self, store: EventStore) -> None:
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, deltas(6))

        async def later() -> None:
            await asyncio.sleep(0.05)
            await store.append(run.run_id, [*deltas(2), NewEvent(EventType.RUN_FAILED)])

        writer = asyncio.create_task(later())
        got = await collect(store.tail(run.run_id, batch=3))
        await writer
        assert [e.seq for e in got] == list(range(1, 10))

    async def test_tail_left_in_the_middle_of_a_page_leaves_no_read_behind(
        self, store: EventStore
    ) -> None:
        run = make_run()
        await store.create_run(run)
        await store.append(run.run_id, deltas(20))
        before = asyncio.all_tasks()
        tail = store.tail(run.run_id, batch=4)
        seen = [(await anext(tail)).seq for _ in range(5)]  # into the second page
        await tail.aclose()
        assert seen == [1, 2, 3, 4, 5]
        # No task the tail started is left (one already running may have ended since: the
        # PostgreSQL notifier's send for the append above, ADR 0132).
        assert asyncio.all_tasks() <= before, "the read-ahead was cancelled and awaited"
        assert [e.seq for e in await store.read(run.run_id)] == list(range(1, 21))

    async def test_committed_events_are_published_to_listeners_as_stored(
        self, store: EventStore
    ) -> None:
        """Live readers in this process take events from the publish instead of reading them
        back: what they get must be exactly what the log holds, in order, after the commit."""
        run = make_run()
        await store.create_run(run)
        published: list[Event] = []

        unlisten = store.wakeups.listen(run.run_id, _Collecting(published))
        try:
            await store.append(run.run_id, deltas(3))
            await store.append(run.run_id, [NewEvent("x", {"nested": {"a": [1, 2.5, None]}})])
            await store.finish_run(
                run.run_id,
                [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED, {"status": "completed"})],
                RunEnding("completed"),
            )
        finally:
            unlisten()
        assert published == await store.read(run.run_id)
        assert [e.seq for e in published] == [1, 2, 3, 4, 5]

    async def test_a_raising_live_reader_keeps_neither_another_reader_nor_the_appender_waiting(
        self, store: EventStore
    ) -> None:
        """A live reader that raises on published events is skipped: another reader of the run
        still gets every event, and each append (and the run's end) returns what it stored."""
        run = make_run()
        await store.create_run(run)
        published: list[Event] = []

        class Broken:
            def published(self, events: Sequence[Event]) -> None:
                raise RuntimeError("a broken live reader")

            def notified(self, last_seq: int | None) -> None:
                pass

        unlisten_broken = store.wakeups.listen(run.run_id, Broken())
        unlisten = store.wakeups.listen(run.run_id, _Collecting(published))
        try:
            appended = await store.append(run.run_id, deltas(3))
            ended = await store.finish_run(
                run.run_id,
                [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED, {"status": "completed"})],
                RunEnding("completed"),
            )
        finally:
            unlisten()
            unlisten_broken()
        assert [e.seq for e in appended] == [1, 2, 3]
        assert [e.seq for e in ended] == [4]
        assert published == await store.read(run.run_id)

    async def test_observers_see_every_committed_batch_once_whoever_appends_it(
        self, store: EventStore
    ) -> None:
        seen: list[list[Event]] = []
        broken_calls = 0

        async def observer(events: Sequence[Event]) -> None:
            seen.append(list(events))

        async def broken(events: Sequence[Event]) -> None:
            nonlocal broken_calls
            broken_calls += 1
            raise RuntimeError("an observer that fails")

        stop = store.observe(observer)
        store.observe(observer)  # registering twice still hands each batch over once
        stop_broken = store.observe(broken)
        run = make_run(tasks=1, status="running", owner=f"{Owner.current().host}.{dead_pid()}.x")
        await store.create_run(run)
        appended = await store.append(run.run_id, deltas(2))  # a failing observer fails nothing
        assert await store.append(run.run_id, []) == []
        ended = await close_orphaned_runs(store)  # a sweep ends the run: observed too
        assert ended == [run.run_id]
        assert seen == [appended, (await store.read(run.run_id))[2:]]
        assert [e.type for e in seen[1]] == [EventType.TASK_COMPLETED, EventType.RUN_INTERRUPTED]
        assert broken_calls == 2

        stop()
        stop_broken()
        other = make_run()
        await store.create_run(other)
        await store.append(other.run_id, deltas(1))
        assert len(seen) == 2 and broken_calls == 2, "stopped observers see nothing more"

    async def test_tail_wakes_several_readers(self, store: EventStore) -> None:
        run = make_run()
        await store.create_run(run)
        waited: set[asyncio.Task[Any] | None] = set()
        wait = store.wakeups.wait

        async def noted_wait(run_id: str, timeout: float | None, **kw: Any) -> None:  # noqa: ASYNC109
            waited.add(asyncio.current_task())
            await wait(run_id, timeout, **kw)

        store.wakeups.wait = noted_wait  # type: ignore[method-assign]
        try:
            readers = [asyncio.create_task(collect(store.tail(run.run_id))) for _ in range(3)]
            # every reader has read the (empty) run and waits to be woken: none replays below
            for _ in range(10_000):
                if len(waited) == len(readers):
                    break
                await asyncio.sleep(0.001)
            assert len(waited) == len(readers), "the readers never waited"
        finally:
            store.wakeups.wait = wait  # type: ignore[method-assign]
        for i in range(5):
            await store.append(run.run_id, deltas(1, start=i))
        await store.append_one(run.run_id, NewEvent(EventType.RUN_INTERRUPTED))
        for got in await asyncio.wait_for(asyncio.gather(*readers), 10):
            assert [e.seq for e in got] == [1, 2, 3, 4, 5, 6]

    @pytest.mark.parametrize("odd", ["\ud800", "\x00"], ids=["surrogate", "nul"])
    async def test_a_run_whose_texts_hold_nul_or_lone_surrogates_is_created_and_ended_alike(
        self, store: EventStore, odd: str
    ) -> None:
        """A prompt, a task's output, reasoning and error, a run's error holding lone surrogates
        (a model's answer cut inside an emoji) or NUL (which PostgreSQL's ``text`` refuses) do
        not stop a run being created, updated and ended: the log keeps them exactly, the run
        index as U+FFFD on every store, and the index check finds the index agreeing with the
        log (ADRs 0114, 0120)."""
        run = make_run(tasks=1, status="running", owner="o", lease_expires_at=2e9)
        run.prompt = f"p{odd}"
        run.tasks[0].prompt = f"t{odd}"
        await store.create_run(run)
        task = run.tasks[0].task_id
        started = {"prompt": run.prompt, "model": None, "tasks": 1}
        await store.append(run.run_id, [NewEvent(EventType.RUN_STARTED, started)])
        await store.update_run(run.run_id, error=f"u{odd}")
        done = copy.deepcopy(run.tasks[0])
        done.status, done.output, done.reasoning, done.error = (
            "failed",
            f"o{odd}",
            f"r{odd}",
            f"x{odd}",
        )
        closing = [
            NewEvent(
                EventType.TASK_COMPLETED,
                {"status": "failed", "output": done.output, "error": done.error},
                task_id=task,
            ),
            NewEvent(EventType.RUN_FAILED, {"status": "failed", "error": f"e{odd}"}),
        ]
        out = await store.finish_run(
            run.run_id, closing, RunEnding("failed", error=f"e{odd}", tasks=[done])
        )
        assert [e.payload for e in out] == [e.payload for e in closing]
        assert [e.payload for e in (await store.read(run.run_id))[1:]] == [
            e.payload for e in closing
        ]
        got = await store.get_run(run.run_id)
        assert (got.prompt, got.status, got.error) == ("p\ufffd", "failed", "e\ufffd")
        assert [(t.prompt, t.output, t.reasoning, t.error) for t in got.tasks] == [
            ("t\ufffd", "o\ufffd", "r\ufffd", "x\ufffd")
        ]
        assert await check_run_index(store, run.run_id) == []

    @pytest.mark.parametrize("odd", ["\ud800", "\x00"], ids=["surrogate", "nul"])
    async def test_run_and_task_ids_holding_nul_or_a_surrogate_are_refused_alike(
        self, store: EventStore, odd: str
    ) -> None:
        """A run id or a task id is a column the program names and reads back exactly: one
        holding NUL or a lone surrogate is a ``UsageError`` on every store, nothing stored,
        where PostgreSQL refused NUL (``StoreError``) and SQLite and memory kept it (ADR
        0120)."""
        refused = make_run(tasks=1)
        refused.run_id = f"run_{odd}"
        with pytest.raises(UsageError, match="run id"):
            await store.create_run(refused)
        assert await store.list_runs() == []
        a_task = make_run(tasks=2, status="running", owner="o", lease_expires_at=2e9)
        a_task.tasks[1].task_id = f"task_{odd}"
        with pytest.raises(UsageError, match="task id"):
            await store.create_run(a_task)
        assert await store.list_runs() == []
        run = make_run(tasks=1, status="running", owner="o", lease_expires_at=2e9)
        await store.create_run(run)
        with pytest.raises(UsageError, match="task id"):
            await store.save_task(TaskRecord(f"t{odd}", run.run_id, 1, "p"))
        done = copy.deepcopy(run.tasks[0])
        done.status = "completed"
        other = TaskRecord(f"t{odd}", run.run_id, 1, "p", status="completed")
        ending = RunEnding("completed", tasks=[done, other])
        with pytest.raises(UsageError, match="task id"):
            await store.finish_run(run.run_id, [NewEvent(EventType.RUN_FAILED)], ending)
        got = await store.get_run(run.run_id)
        assert (got.status, [t.task_id for t in got.tasks]) == ("running", [done.task_id])
        assert [t.status for t in got.tasks] == ["pending"]
        assert await store.read(run.run_id) == []

    async def test_finish_run_ends_a_run_once_and_nothing_is_appended_after(
        self, store: EventStore
    ) -> None:
        run = make_run(tasks=2, status="running", owner="o", lease_expires_at=2e9)
        await store.create_run(run)
        await store.append(run.run_id, deltas(2))
        done = TaskRecord(run.tasks[0].task_id, run.run_id, 0, "task 0", status="interrupted")
        closing = [
            NewEvent(EventType.TASK_COMPLETED, {"status": "interrupted"}, task_id=done.task_id),
            NewEvent(EventType.RUN_INTERRUPTED, {"status": "interrupted", "reason": "r"}),
        ]
        out = await store.finish_run(
            run.run_id, closing, RunEnding("interrupted", error="interrupted: r", tasks=[done])
        )
        assert [(e.seq, e.type) for e in out] == [
            (3, EventType.TASK_COMPLETED),
            (4, EventType.RUN_INTERRUPTED),
        ]
        got = await store.get_run(run.run_id)
        assert (got.status, got.error, got.lease_expires_at) == (
            "interrupted",
            "interrupted: r",
            None,
        )
        assert [t.status for t in got.tasks] == ["interrupted", "pending"]
        again = [NewEvent(EventType.RUN_SETTLEMENT_COMPLETED, {"status": "completed"})]
        assert await store.finish_run(run.run_id, again, RunEnding("completed")) == []
        assert (await store.get_run(run.run_id)).status == "interrupted", "never reopened"
        with pytest.raises(RunClosedError):
            await store.append(run.run_id, deltas(1))
        assert [e.seq for e in await store.read(run.run_id)] == [1, 2, 3, 4]
        with pytest.raises(RunNotFoundError):
            await store.finish_run("run_missing", again, RunEnding("completed"))

    async def test_finish_run_leaves_a_run_whose_lease_was_renewed(self, store: EventStore) -> None:
        run = make_run(status="running", owner="o", lease_expires_at=1.0)
        await store.create_run(run)
        now = (await store.open_runs()).now
        assert (await store.renew_leases("o", 60.0, [run.run_id])) == [run.run_id]
        end = [NewEvent(EventType.RUN_INTERRUPTED, {"status": "interrupted"})]
        assert (
            await store.finish_run(run.run_id, end, RunEnding("interrupted", lease_expired_by=now))
            == []
        ), "its owner proved alive after the sweeper looked"
        assert (await store.get_run(run.run_id)).status == "running"
        assert await store.read(run.run_id) == []

    @_EVERY_BACKEND
    @given(
        schedule=st.lists(
            st.tuples(
                st.integers(min_value=0, max_value=3),  # writer
                st.lists(  # one batch: payload texts
                    st.text(max_size=20), min_size=0, max_size=6
                ),
            ),
            min_size=1,
            max_size=12,
        )
    )
    async def test_property_interleaved_batches_read_back_exactly(
        self, store: EventStore, schedule: list[tuple[int, list[str]]]
    ) -> None:
        """Any mix of concurrent batch appends reads back as exactly those events, seq 1..N,
        with every batch contiguous and every writer's batches in its own order."""
        run = make_run()
        await store.create_run(run)
        queues: dict[int, list[list[NewEvent]]] = {}
        for b, (w, texts) in enumerate(schedule):
            queues.setdefault(w, []).append(
                [NewEvent("p", {"w": w, "b": b, "i": i, "t": t}) for i, t in enumerate(texts)]
            )

        async def writer(batches: list[list[NewEvent]]) -> list[list[Event]]:
            out = []
            for batch in batches:
                out.append(await store.append(run.run_id, batch))
                await asyncio.sleep(0)
            return out

        results = await asyncio.gather(*(writer(q) for q in queues.values()))
        stored = await store.read(run.run_id)
        total = sum(len(texts) for _, texts in schedule)
        assert [e.seq for e in stored] == list(range(1, total + 1))
        by_seq = {e.seq: e for e in stored}
        for batches, returned in zip(queues.values(), results, strict=True):
            last = 0
            for batch, got in zip(batches, returned, strict=True):
                assert [dict(e.payload) for e in got] == [dict(n.payload) for n in batch]
                assert_same_events([by_seq[e.seq] for e in got], got)
                if got:  # contiguous, and after this writer's previous batch
                    assert [e.seq for e in got] == list(range(got[0].seq, got[-1].seq + 1))
                    assert got[0].seq > last
                    last = got[-1].seq

    @_EVERY_BACKEND
    @given(
        batches=st.lists(
            st.tuples(
                st.booleans(),  # every event of the batch takes the first one's task and type
                st.lists(
                    st.tuples(
                        st.sampled_from([None, "task_a", "task_b"]),
                        st.sampled_from([EventType.MESSAGE_DELTA, EventType.REASONING_DELTA]),
                        st.recursive(
                            st.none()
                            | st.booleans()
                            | st.integers(min_value=-(2**70), max_value=2**70)
                            | st.floats(allow_nan=False, allow_infinity=False)
                            | st.text(),
                            lambda inner: (
                                st.lists(inner, max_size=3)
                                | st.dictionaries(st.text(max_size=5), inner, max_size=3)
                            ),
                            max_leaves=6,
                        ),
                    ),
                    min_size=1,
                    max_size=40,
                ),
            ),
            min_size=1,
            max_size=4,
        )
    )
    async def test_property_appended_events_replay_as_appended(
        self, store: EventStore, batches: list[tuple[bool, list[tuple[str | None, str, Any]]]]
    ) -> None:
        """Any batch -- its events of one task and type or not; payloads with integers past 64
        bits, any text, nulls nested anywhere -- is handed back and replayed as it was made:
        the same payloads, tasks and types, numbered on without a gap."""
        run = make_run()
        await store.create_run(run)
        made = [
            [
                NewEvent(type_, {"value": value}, task_id=task_id)
                for task_id, type_, value in (
                    [(*rows[0][:2], row[2]) for row in rows] if shared else rows
                )
            ]
            for shared, rows in batches
        ]
        appended = [e for batch in made for e in await store.append(run.run_id, batch)]
        expected = [(n.task_id, n.type, n.payload) for batch in made for n in batch]
        assert [e.seq for e in appended] == list(range(1, len(expected) + 1))
        for got in (appended, await store.read(run.run_id)):
            assert [(e.task_id, e.type, e.payload) for e in got] == expected


class RunIndexConformance:
    """The run index (``store.run_index.RunIndex``): run and task records, leases, the sweep."""

    @pytest.fixture
    async def store(self) -> AsyncIterator[EventStore]:
        raise NotImplementedError("a backend's test class must override the `store` fixture")
        yield  # pragma: no cover

    async def test_create_and_get_run_round_trips_every_field(self, store: EventStore) -> None:
        run = make_run(
            tasks=0,
            model="anthropic:claude-x",
            chain_of_thought="surface",
            worker_backend="inline",
            status="running",
            usage={"input_tokens": 12, "output_tokens": 34},
            error=None,
            metadata={"labels": ["a", "ü"], "nested": {"k": [1, 2.5, None, True]}},
        )
        run.tasks = [
            TaskRecord(
                new_id("task"),
                run.run_id,
                i,
                f"task {i}",
                status="completed",
                output=f"out {i}",
                reasoning=f"thought {i} 🤔",
                usage={"output_tokens": i},
                model="m",
                backend="provider",
            )
            for i in (2, 0, 1)  # stored out of order on purpose
        ]
        await store.create_run(run)
        got = await store.get_run(run.run_id)
        expected = copy.deepcopy(run)
        expected.tasks.sort(key=lambda t: t.index)
        assert got == expected

    async def test_list_runs_newest_first_with_limit_and_offset(self, store: EventStore) -> None:
        runs = [make_run(created_at=1_700_000_000.0 + i) for i in range(7)]
        for run in (runs[3], runs[0], runs[6], runs[1], runs[5], runs[2], runs[4]):
            await store.create_run(run)
        newest_first = [r.run_id for r in reversed(runs)]
        assert [r.run_id for r in await store.list_runs()] == newest_first
        assert [r.run_id for r in await store.list_runs(limit=3)] == newest_first[:3]
        assert [r.run_id for r in await store.list_runs(limit=3, offset=3)] == newest_first[3:6]
        assert [r.run_id for r in await store.list_runs(limit=3, offset=6)] == newest_first[6:]
        assert await store.list_runs(offset=7) == []

    async def test_list_runs_of_an_empty_store(self, store: EventStore) -> None:
        assert await store.list_runs() == []

    async def test_update_run_changes_only_the_given_fields(self, store: EventStore) -> None:
        run = make_run(usage={"input_tokens": 1}, metadata={"a": 1, "b": {"x": 1}})
        await store.create_run(run)

        await store.update_run(run.run_id, status="running")
        got = await store.get_run(run.run_id)
        assert (got.status, got.usage, got.error, got.metadata) == (
            "running",
            {"input_tokens": 1},
            None,
            {"a": 1, "b": {"x": 1}},
        )
        assert got.updated_at >= run.updated_at
        assert got.created_at == run.created_at

        await store.update_run(run.run_id, usage={"output_tokens": 9}, error="boom")
        got = await store.get_run(run.run_id)
        assert (got.status, got.usage, got.error) == ("running", {"output_tokens": 9}, "boom")

        await store.update_run(run.run_id, metadata={"b": {"y": 2}, "c": "new"})
        got = await store.get_run(run.run_id)
        assert got.metadata == {"a": 1, "b": {"y": 2}, "c": "new"}  # top-level merge
        assert (got.prompt, got.model, got.chain_of_thought) == (
            run.prompt,
            run.model,
            run.chain_of_thought,
        )

    async def test_save_task_inserts_and_replaces_and_orders_by_index(
        self, store: EventStore
    ) -> None:
        run = make_run()
        await store.create_run(run)
        second = TaskRecord("task_b", run.run_id, 1, "second")
        first = TaskRecord("task_a", run.run_id, 0, "first")
        await store.save_task(second)
        await store.save_task(first)
        assert [t.task_id for t in (await store.get_run(run.run_id)).tasks] == ["task_a", "task_b"]

        done = TaskRecord(
            "task_b", run.run_id, 1, "second", status="completed", output="ok", usage={"n": 1}
        )
        await store.save_task(done)
        tasks = (await store.get_run(run.run_id)).tasks
        assert tasks == [first, done]

    async def test_records_are_copies(self, store: EventStore) -> None:
        run = make_run(tasks=1, metadata={"k": [1]})
        await store.create_run(run)
        run.metadata["k"].append(2)
        run.tasks[0].prompt = "changed after create"
        got = await store.get_run(run.run_id)
        assert got.metadata == {"k": [1]}
        assert got.tasks[0].prompt == "task 0"
        got.metadata["k"].append(3)
        assert (await store.get_run(run.run_id)).metadata == {"k": [1]}

    async def test_every_write_of_an_ended_status_closes_the_run(self, store: EventStore) -> None:
        """A run given an ended status by anything but ``finish_run`` -- created ended, an
        ``update_run`` of its status, an appended terminal event -- is closed as ``finish_run``
        closes one (ADR 0134): no sweep, renewal or expired read finds it open, it takes no
        more events, and a later ``finish_run`` leaves it as it is."""
        created = make_run(status="completed", owner="o", lease_expires_at=1.0)
        updated = make_run(status="running", owner="o", lease_expires_at=1.0)
        appended = make_run(status="running", owner="o", lease_expires_at=1.0)
        still = make_run(status="running", owner="o", lease_expires_at=1.0)
        runs = (created, updated, appended, still)
        for run in runs:
            await store.create_run(run)
        await store.update_run(updated.run_id, status="failed", error="boom")
        failed = {"status": "failed", "error": "it broke"}
        await store.append(appended.run_id, [NewEvent(EventType.RUN_FAILED, failed)])
        ids = [r.run_id for r in runs]
        assert [r.run_id for r in (await store.open_runs()).runs] == [still.run_id]
        assert [r.run_id for r in (await store.open_runs(run_ids=ids)).runs] == [still.run_id]
        assert [r.run_id for r in (await store.open_runs(expired=True)).runs] == [still.run_id]
        assert await store.renew_leases("o", 100.0, ids) == [still.run_id]
        for run in (created, updated, appended):
            with pytest.raises(RunClosedError):
                await store.append(run.run_id, deltas(1))
            again = [NewEvent(EventType.RUN_ERROR, {"status": "error"})]
            assert await store.finish_run(run.run_id, again, RunEnding("error")) == []
        assert [(await store.get_run(r.run_id)).status for r in runs] == [
            "completed",
            "failed",
            "failed",
            "running",
        ]
        assert [e.seq for e in await store.append(still.run_id, deltas(1))] == [1]

    async def test_renew_leases_and_open_runs(self, store: EventStore) -> None:
        mine = make_run(status="running", owner="o", lease_expires_at=1.0)
        pending = make_run(status="pending", owner="o", lease_expires_at=1.0)
        ended = make_run(status="running", owner="o", lease_expires_at=1.0)
        other = make_run(status="running", owner="p", lease_expires_at=5.0)
        nobody = make_run(status="running")
        finished = make_run(status="completed", owner="o", lease_expires_at=1.0)
        given_up = make_run(status="running", owner="o", lease_expires_at=2.0)
        for run in (mine, pending, ended, other, nobody, finished, given_up):
            await store.create_run(run)
        await store.finish_run(
            ended.run_id, [NewEvent(EventType.RUN_ERROR, {})], RunEnding("error")
        )
        # Only the runs named, and of those only the open ones "o" holds: a run "o" no longer
        # executes (``given_up``) keeps its lease, which expires (ADR 0060).
        named = [mine.run_id, pending.run_id, ended.run_id, other.run_id, nobody.run_id]
        renewed = await store.renew_leases("o", 100.0, [*named, finished.run_id, "run_unknown"])
        assert sorted(renewed) == sorted([mine.run_id, pending.run_id])
        assert await store.renew_leases("o", 100.0, []) == []
        found = await store.open_runs()
        leases = {r.run_id: (r.owner, r.lease_expires_at) for r in found.runs}
        assert set(leases) == {
            mine.run_id,
            pending.run_id,
            other.run_id,
            nobody.run_id,
            given_up.run_id,
        }
        assert leases[other.run_id] == ("p", 5.0) and leases[nobody.run_id] == (None, None)
        assert leases[given_up.run_id] == ("o", 2.0)
        lease = leases[mine.run_id][1]
        assert lease is not None and found.now + 90 < lease <= found.now + 101
        assert [r.run_id for r in found.runs] == sorted(leases), "in run id order"

    async def test_open_runs_come_in_pages_whatever_their_number(self, store: EventStore) -> None:
        """A sweep pages through the open runs by run id (ADR 0074): each page holds at most
        its limit, the pages hold every open run once -- leased or not, however many leased
        ones come first --, and a read of the expired leases or of named runs holds those."""
        live = [make_run(status="running", owner="p", lease_expires_at=4e9) for _ in range(5)]
        expired = [make_run(status="running", owner="p", lease_expires_at=1.0) for _ in range(3)]
        nobody = make_run(status="pending")
        ended = make_run(status="running", owner="p", lease_expires_at=1.0)
        for run in (*live, *expired, nobody, ended):
            await store.create_run(run)
        await store.finish_run(ended.run_id, [], RunEnding("completed"))
        open_ids = sorted(r.run_id for r in (*live, *expired, nobody))

        async def pages(**only: Any) -> list[list[str]]:
            out: list[list[str]] = []
            after: str | None = None
            while True:
                found = await store.open_runs(limit=2, after=after, **only)
                out.append([r.run_id for r in found.runs])
                if len(found.runs) < 2:
                    return out
                after = found.runs[-1].run_id

        walked = await pages()
        assert all(len(p) <= 2 for p in walked) and len(walked) == 5
        assert [run_id for p in walked for run_id in p] == open_ids
        assert [run_id for p in await pages(expired=True) for run_id in p] == sorted(
            r.run_id for r in expired
        )
        named = [nobody.run_id, ended.run_id, live[0].run_id, "run_unknown"]
        found = await store.open_runs(run_ids=named)
        assert [r.run_id for r in found.runs] == sorted([nobody.run_id, live[0].run_id])
        assert (await store.open_runs(run_ids=[])).runs == []

    async def test_find_run_ids_by_prefix(self, store: EventStore) -> None:
        for run_id in ("run_aa1", "run_aa2", "run_ab1", "run_a_1", "run_a%1", "run_b"):
            await store.create_run(RunRecord(run_id, "p"))
        assert await store.find_run_ids("run_aa") == ["run_aa1", "run_aa2"]
        assert await store.find_run_ids("run_ab1") == ["run_ab1"]
        assert await store.find_run_ids("run_a_") == ["run_a_1"], "'_' is not a wildcard"
        assert await store.find_run_ids("run_a%") == ["run_a%1"], "'%' is not a wildcard"
        assert await store.find_run_ids("run_a", limit=2) == ["run_a%1", "run_a_1"]
        assert await store.find_run_ids("run_c") == []

    async def test_the_sweep_closes_each_orphan_once_tasks_first(self, store: EventStore) -> None:
        me = Owner.current()
        far = Owner("another-host", 4242, "n")
        expired = make_run(tasks=2, status="running", owner=far.owner_id, lease_expires_at=1.0)
        expired.tasks[0].status = "completed"
        expired.tasks[1].status = "running"
        alive_elsewhere = make_run(status="running", owner=far.owner_id, lease_expires_at=4e9)
        dead_here = make_run(
            status="pending", owner=Owner(me.host, dead_pid(), "x").owner_id, lease_expires_at=4e9
        )
        restarted = make_run(
            status="running", owner=Owner(me.host, me.pid, "earlier").owner_id, lease_expires_at=4e9
        )
        ours = make_run(status="running", owner=me.owner_id, lease_expires_at=1.0)
        nobody = make_run(status="running")
        runs = (expired, alive_elsewhere, dead_here, restarted, ours, nobody)
        for run in runs:
            await store.create_run(run)
            await store.append(run.run_id, [NewEvent(EventType.RUN_STARTED, {})])
        first, second = await asyncio.gather(
            close_orphaned_runs(store, me=me), close_orphaned_runs(store, me=me)
        )
        closed = {expired.run_id, dead_here.run_id, restarted.run_id}
        assert set(first) | set(second) == closed and not set(first) & set(second)
        for run in runs:
            got = await store.get_run(run.run_id)
            types = [e.type for e in await store.read(run.run_id)]
            if run.run_id in closed:
                assert got.status == "interrupted" and got.error
                assert types.count(EventType.RUN_INTERRUPTED) == 1 and types[-1] == (
                    EventType.RUN_INTERRUPTED
                )
                assert all(t.status in ("completed", "interrupted") for t in got.tasks)
            else:
                assert got.status == "running" and types == [EventType.RUN_STARTED]
        got = await store.get_run(expired.run_id)
        assert [t.status for t in got.tasks] == ["completed", "interrupted"]
        events = await store.read(expired.run_id)
        assert [e.type for e in events][-2:] == [
            EventType.TASK_COMPLETED,
            EventType.RUN_INTERRUPTED,
        ]
        assert events[-2].task_id == expired.tasks[1].task_id
        assert await close_orphaned_runs(store, me=me) == []


class KeyStoreConformance:
    """The key store (``store.key_store.KeyStore``): API keys and server secrets."""

    @pytest.fixture
    async def store(self) -> AsyncIterator[KeyStore]:
        raise NotImplementedError("a backend's test class must override the `store` fixture")
        yield  # pragma: no cover

    async def test_api_keys(self, store: KeyStore) -> None:
        k1 = ApiKeyRecord("key_1", "ci", "member", "hash-1", created_at=1.0)
        k2 = ApiKeyRecord("key_2", "ops", "admin", "hash-2", created_at=2.0)
        k3 = ApiKeyRecord("key_3", "bot", "viewer", "hash-3", created_at=3.0)
        # named like another key's id, as a store from before the reserved prefix may hold
        k4 = ApiKeyRecord("key_4", "key_3", "viewer", "hash-4", created_at=4.0)
        for key in (k2, k4, k3, k1):
            await store.save_api_key(key)
        assert await store.list_api_keys() == [k1, k2, k3, k4]
        assert await store.find_api_key("hash-2") == k2
        assert await store.find_api_key("no-such-hash") is None
        assert await store.find_api_key("key_2") is None  # found by hash only

        assert await store.revoke_api_key("key_2") is True
        assert await store.find_api_key("hash-2") is None
        assert await store.revoke_api_key("key_2") is False  # already revoked
        assert await store.revoke_api_key("bot") is False  # by exact id only, never by name
        assert await store.revoke_api_key("key_3") is True  # k3 only, not k4 named "key_3"
        assert await store.find_api_key("hash-3") is None
        assert await store.find_api_key("hash-4") == k4
        assert await store.revoke_api_key("nobody") is False
        assert await store.find_api_key("hash-1") == k1

        # by exact id, revoked or not (a ticket's key check tells "revoked" from "unknown")
        assert await store.get_api_key("key_1") == k1
        assert await store.get_api_key("key_4") == k4
        revoked = await store.get_api_key("key_2")
        assert revoked is not None and revoked.revoked_at is not None
        assert await store.get_api_key("ops") is None  # never by name
        assert await store.get_api_key("hash-1") is None  # nor by hash
        assert await store.get_api_key("nobody") is None

        listed = {k.key_id: k for k in await store.list_api_keys()}
        assert listed["key_1"].revoked_at is None
        assert listed["key_2"].revoked_at is not None
        assert listed["key_3"].revoked_at is not None
        assert listed["key_4"].revoked_at is None

    @pytest.mark.parametrize(
        "odd",
        ["key_\x00", "\x00", "key_\ud800", "tg_\udfff\x00"],
        ids=["nul", "nul-only", "surrogate", "both"],
    )
    async def test_a_key_looked_up_by_a_value_no_column_holds_is_an_unknown_key(
        self, store: KeyStore, odd: str
    ) -> None:
        """A key id, hash or token holding NUL (PostgreSQL's ``text`` refuses it) or a lone
        surrogate (UTF-8 cannot carry one) names no key, since none can hold it: every store
        answers as for an unknown key (``None``, ``False``; ``authenticate``'s 401) instead of a
        driver's error (``StoreError``: a 503 where an unknown key is a 401)."""
        real = await create_key(store, name="real", role="viewer")
        assert await store.get_api_key(odd) is None
        assert await store.find_api_key(odd) is None
        assert await store.revoke_api_key(odd) is False
        with pytest.raises(AuthenticationError, match="invalid or revoked API key"):
            await authenticate(store, f"Bearer {odd}")
        with pytest.raises(AuthenticationError, match="invalid or revoked API key"):
            await authenticate(store, f"Bearer {real.key}{odd}")
        assert (await authenticate(store, f"Bearer {real.key}")).key_id == real.record.key_id

    async def test_secret_first_caller_wins(self, store: KeyStore) -> None:
        assert await store.get_or_create_secret("ticket_key", "first") == "first"
        assert await store.get_or_create_secret("ticket_key", "second") == "first"
        assert await store.get_or_create_secret("other", "x") == "x"
        racing = await asyncio.gather(
            *(store.get_or_create_secret("raced", f"candidate-{i}") for i in range(8))
        )
        assert len(set(racing)) == 1
        assert racing[0].startswith("candidate-")


class StoreConformance(EventLogConformance, RunIndexConformance, KeyStoreConformance):
    """Every concern at once, for a store a test module checks as a whole."""
