"""Reasoning kept apart in the SQL stores (ADR 0160): a read for a reader who may not see it never
loads it, so what such a read costs does not grow with the reasoning it would withhold.

The mechanism is shown, not timed: the bytes of stored payload text handed to the decoder are
counted (the seam every SQL read goes through, ``codec.decode_payload_array`` and
``codec.decode_payloads``), and the store's own answer for such a reader lacks the fields the
filter withholds. The filter still runs after every read; the property holds that the hinted
read and the filter give exactly what the whole read and the filter give, for every role, mode
and surface.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.daemon import running_daemon, sse_events, stream_all
from support.pg import pg_admin, pg_schema
from support.store_backends import Postgres, SQLite
from support.store_conformance import make_run

from thoughtgate.access.filter import (
    filter_events,
    filter_run,
    reads_apart,
    reads_task_apart,
    stored_apart,
)
from thoughtgate.access.roles import Role
from thoughtgate.cli.readers import StoreReader
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.server.routes.run_list import run_list_frames
from thoughtgate.store import codec
from thoughtgate.store.base import EventStore
from thoughtgate.store.listing import RunChanges, RunPage, RunQuery
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord
from thoughtgate.store.sqlite import SQLiteStore

__all__ = ["pg_admin", "pg_schema"]

BIG = 1_000_000
"""Characters of reasoning in the run whose reads are counted: far above everything else."""
MODES = ("hidden", "surface", "telemetry_only", "no-such-mode")


def _usage() -> dict[str, int]:
    return {"input_tokens": 3, "output_tokens": 40, "reasoning_tokens": 30, "total_tokens": 43}


def thinking_block(reasoning: str) -> dict[str, Any]:
    """An Anthropic signed thinking block as the turn's continuity carrier: the thinking text
    and its signature, sent back to the provider on the next turn of a tool loop."""
    data = {"type": "thinking", "thinking": reasoning, "signature": "s" * (len(reasoning) // 2)}
    return {
        "kind": "continuity",
        "carrier": "anthropic.thinking",
        "data": data,
        "provider": "anthropic",
        "model": "anthropic:claude",
    }


def agent_response(reasoning: str, *, trace: bool = False, detail: str | None = None) -> NewEvent:
    payload: dict[str, Any] = {
        "turn": 1,
        "answer": "the answer",
        "complete": True,
        "finish_reason": "stop",
        "raw_finish_reason": "stop",
        "provider": "fake",
        "model": "fake:m",
        "usage": _usage(),
        "tool_calls": [],
        "continuity": [thinking_block(reasoning)],
    }
    if reasoning:
        payload |= {
            "reasoning": reasoning,
            "reasoning_chars": len(reasoning),
            "reasoning_bytes": len(reasoning.encode()),
            "reasoning_parts": [
                {
                    "kind": "reasoning",
                    "text": reasoning,
                    "reasoning_kind": "raw",
                    "provider": "fake",
                    "model": "fake:m",
                    "signature": "sig",
                    "redacted": False,
                    "index": 0,
                }
            ],
        }
    if trace:
        payload["trace"] = {
            "reasoning": reasoning,
            "reasoning_chars": len(reasoning),
            "reasoning_bytes": len(reasoning.encode()),
            "continuity": [],
        }
    if detail is not None:
        payload["error_detail"] = detail
    return NewEvent(EventType.AGENT_RESPONSE, payload, task_id="task_1")


def reasoning_delta(text: str) -> NewEvent:
    payload = {"text": text, "reasoning_kind": "raw", "index": 0, "turn": 1}
    return NewEvent(EventType.REASONING_DELTA, payload, task_id="task_1")


def a_turn(reasoning: str) -> list[NewEvent]:
    """A turn as a ``surface`` run records it: its reasoning live, the answer, the turn whole."""
    return [
        reasoning_delta(reasoning),
        NewEvent(EventType.MESSAGE_DELTA, {"text": "the answer"}, task_id="task_1"),
        agent_response(reasoning),
    ]


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The length of every stored payload text the codec decodes, in order."""
    seen: list[int] = []
    array, texts = codec.decode_payload_array, codec.decode_payloads

    def count_array(joined: bytes) -> list[dict[str, Any]]:
        seen.append(len(joined))
        return array(joined)

    def count_texts(rows: Any) -> list[dict[str, Any]]:
        seen.append(sum(len(t) for t in rows))
        return texts(rows)

    monkeypatch.setattr(codec, "decode_payload_array", count_array)
    monkeypatch.setattr(codec, "decode_payloads", count_texts)
    yield seen


def _filtered(events: list[Event], role: Role, mode: str, surface: Any) -> list[Event]:
    return filter_events(events, role, mode=mode, surface=surface)


# --------------------------------------------------------------------------- generated runs

_texts = st.text(max_size=40) | st.integers(0, 5000).map(lambda n: "é" * n)
_events = st.one_of(
    _texts.map(reasoning_delta),
    st.builds(
        agent_response,
        _texts,
        trace=st.booleans(),
        detail=st.none() | _texts,
    ),
    _texts.map(lambda t: NewEvent(EventType.MESSAGE_DELTA, {"text": t})),
    st.builds(
        lambda t, traced: NewEvent(
            EventType.WORKER_COMPLETED,
            {"backend": "provider", "ok": True}
            | ({"trace": {"reasoning": t, "reasoning_chars": len(t)}} if traced else {}),
        ),
        _texts,
        st.booleans(),
    ),
    st.builds(
        lambda t: NewEvent(
            EventType.TASK_STARTED,
            {"task_id": "task_1", "prompt": "p", "system": t, "history": [t], "tools": []},
        ),
        _texts,
    ),
    # undeclared: a type no declaration names, and a declared one with undeclared keys
    _texts.map(lambda t: NewEvent("x.unknown", {"reasoning": t, "text": t})),
    _texts.map(lambda t: NewEvent(EventType.MESSAGE_DELTA, {"text": "a", "reasoning": t})),
    # carriers of any shape: the presence left in the row must show what the bytes show
    st.builds(
        lambda t, n: NewEvent(
            EventType.AGENT_RESPONSE,
            {"answer": "a", "continuity": [t, {"data": t}, {"carrier": n, "data": t}]},
        ),
        _texts,
        st.none() | st.integers() | _texts,
    ),
    st.sampled_from([None, [], [{"carrier": "x", "present": True}], "opaque"]).map(
        lambda c: NewEvent(EventType.AGENT_RESPONSE, {"answer": "a", "continuity": c})
    ),
    st.just(NewEvent(EventType.REASONING_DELTA, {})),
)
_READERS = [
    (role, mode, surface)
    for role in Role
    for mode in MODES
    for surface in ("display", "trace")
    if surface == "display" or role >= Role.DEVELOPER
]


class _Cases:
    store: EventStore

    async def _run(self, store: EventStore, events: list[NewEvent], mode: str) -> str:
        run = make_run(chain_of_thought=mode)
        await store.create_run(run)
        if events:
            await store.append(run.run_id, events)
        return run.run_id

    async def test_a_viewers_read_decodes_none_of_the_reasoning(
        self, store: EventStore, decoded: list[int]
    ) -> None:
        """A megabyte of reasoning in a ``surface`` run: a viewer's or member's whole replay,
        and a read of the one ``agent.response``, decode a few hundred bytes; the same reads
        for a developer decode the reasoning (three copies: the delta, the text, its part)."""
        run_id = await self._run(store, a_turn("r" * BIG), "surface")
        for role in (Role.VIEWER, Role.MEMBER):
            apart = reads_apart(role, mode="surface")
            assert apart is False
            for after, limit in ((0, None), (2, 1)):
                decoded.clear()
                raw = await store.read(run_id, after=after, limit=limit, apart=apart)
                assert sum(decoded) < 2_000, (role, after, decoded)
                whole = await store.read(run_id, after=after, limit=limit)
                assert [e.seq for e in raw] == [e.seq for e in whole]
                assert [e.type for e in raw] == [e.type for e in whole]
                assert _filtered(raw, role, "surface", "display") == _filtered(
                    whole, role, "surface", "display"
                )
        decoded.clear()
        raw = await store.read(run_id, apart=False)
        assert raw[0].payload == {}  # the delta: nothing of it is in its row
        response = raw[2].payload
        assert response["answer"] == "the answer"
        assert not set(response) & {"reasoning", "reasoning_parts", "reasoning_chars"}
        # a carrier: only what the filter shows of it is in the row (ADR 0160, amendment 2)
        assert response["continuity"] == [{"carrier": "anthropic.thinking", "present": True}]
        assert reads_apart(Role.DEVELOPER, mode="surface") is True
        decoded.clear()
        whole = await store.read(run_id, apart=True)
        assert sum(decoded) > 4 * BIG
        assert whole[0].payload["text"] == "r" * BIG
        assert whole[2].payload["reasoning_parts"][0]["text"] == "r" * BIG
        # what sends the carrier back (a whole read) gets it byte for byte
        assert whole[2].payload == a_turn("r" * BIG)[2].payload

    async def test_the_live_streams_first_page_leaves_it_unread_too(
        self, store: EventStore, decoded: list[int]
    ) -> None:
        """``read_now`` and ``read_ahead`` (a live stream's first page, a tail's pages ahead)
        take the same hint."""
        run_id = await self._run(store, a_turn("r" * BIG), "surface")
        decoded.clear()
        now = store.read_now(run_id, after=0, limit=10, apart=False)
        ahead = await store.read_ahead(run_id, after=0, limit=10, apart=False)
        assert sum(decoded) < 3_000, decoded
        assert now is None or [e.payload for e in now] == [e.payload for e in ahead]
        assert ahead[0].payload == {}

    async def test_a_viewers_run_view_reads_no_tasks_reasoning(self, store: EventStore) -> None:
        """The run view's task rows (``surface`` runs keep a task's reasoning there): read for
        a reader who may not see it, the column is not read; for every role and mode the
        filtered view is what the whole read gives."""
        for mode in MODES[:3]:  # (a run view holds a known mode)
            run = make_run(chain_of_thought=mode, tasks=1)
            await store.create_run(run)
            task = run.tasks[0]
            task.reasoning = "r" * BIG
            await store.save_task(task)
            whole = await store.get_run(run.run_id)
            assert whole.tasks[0].reasoning == "r" * BIG
            for role in Role:
                apart = reads_task_apart(role, mode=None)
                read = await store.get_run(run.run_id, apart=apart)
                assert filter_run(read, role) == filter_run(whole, role), (role, mode)
                if not apart:
                    assert read.tasks[0].reasoning is None
            assert reads_task_apart(Role.VIEWER, mode=None) is False
            assert reads_task_apart(Role.DEVELOPER, mode=None) is True

    async def test_a_viewers_run_list_reads_no_tasks_reasoning(self, store: EventStore) -> None:
        """The run list (``GET /v1/runs``: a page, an offset, the live stream's changes) reads
        its runs' tasks as the run view does (ADR 0160, amendment 1): for a reader who may not
        see a task's reasoning it is left unread, and for every role the filtered list is the
        one the whole read gives."""
        for mode in MODES[:3]:
            run = make_run(chain_of_thought=mode, tasks=2)
            await store.create_run(run)
            for task in run.tasks:
                task.reasoning = "r" * BIG
                await store.save_task(task)
        for role in Role:
            apart = reads_task_apart(role, mode=None)
            lists = [
                (
                    (await store.query_runs(RunQuery(), apart=apart)).runs,
                    (await store.query_runs(RunQuery())).runs,
                ),
                (
                    await store.list_runs(offset=1, apart=apart),
                    await store.list_runs(offset=1),
                ),
                (
                    [r for _, r in (await store.run_changes(after=0, apart=apart)).changes],
                    [r for _, r in (await store.run_changes(after=0)).changes],
                ),
            ]
            for read, whole in lists:
                assert [r.run_id for r in read] == [r.run_id for r in whole]
                assert {t.reasoning for r in whole for t in r.tasks} == {"r" * BIG}
                assert [filter_run(r, role) for r in read] == [filter_run(r, role) for r in whole]
                if not apart:
                    assert {t.reasoning for r in read for t in r.tasks} == {None}, role

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.differing_executors,  # (one property, a class per backend)
        ],
    )
    @given(events=st.lists(_events, max_size=12), mode=st.sampled_from(MODES))
    async def test_property_the_hinted_read_shows_what_the_whole_read_shows(
        self, store: EventStore, events: list[NewEvent], mode: str
    ) -> None:
        """For any events and every reader (role, the run's mode, surface): the read with the
        filter's own hint, then the filter, equals the whole read, then the filter -- no leak,
        no loss, the same events in the same order; and the raw reads have the same numbers
        (a withheld event leaves the same gap it always did)."""
        run_id = await self._run(store, events, mode)
        whole = await store.read(run_id)
        assert [e.seq for e in whole] == list(range(1, len(events) + 1))
        assert [e.payload for e in whole] == [dict(e.payload) for e in events]  # (byte for byte)
        for role, run_mode, surface in _READERS:
            if run_mode != mode:
                continue
            apart = reads_apart(role, mode=mode, surface=surface)
            hinted = await store.read(run_id, apart=apart)
            assert [e.seq for e in hinted] == [e.seq for e in whole]
            assert _filtered(hinted, role, mode, surface) == _filtered(
                whole, role, mode, surface
            ), (role, mode, surface)
        if events:
            paged = await store.read(run_id, after=len(events) - 1, limit=1, apart=False)
            assert [e.seq for e in paged] == [len(events)]


class TestOnSQLite(SQLite, _Cases):
    pass


@pytest.mark.postgres
class TestOnPostgres(Postgres, _Cases):
    pass


async def test_events_recorded_before_keep_their_payload_whole_and_read_as_before(
    tmp_path: Path,
) -> None:
    """A row written before migration 14 (its reasoning in its payload, no part apart) is read
    whole by every reader, hinted or not, and the filter withholds the reasoning as before."""
    store = await SQLiteStore.open(tmp_path / "old.db")
    try:
        run = make_run(chain_of_thought="surface")
        await store.create_run(run)
        await store.append(run.run_id, [NewEvent(EventType.MESSAGE_DELTA, {"text": "a"})])
        old = agent_response("r" * 1000).payload
        with sqlite3.connect(tmp_path / "old.db") as conn:  # as the version before wrote it
            conn.execute(
                "INSERT INTO events (run_id, seq, task_id, type, ts, payload, v) "
                "VALUES (?, 2, NULL, ?, 1.7e9, ?, 1)",
                (run.run_id, EventType.AGENT_RESPONSE, json.dumps(old)),
            )
            conn.execute("UPDATE runs SET last_seq = 2 WHERE run_id = ?", (run.run_id,))
        hinted = await store.read(run.run_id, apart=False)
        whole = await store.read(run.run_id)
        assert hinted == whole and whole[1].payload == old
        for role in Role:
            assert _filtered(hinted, role, "surface", "display") == _filtered(
                whole, role, "surface", "display"
            )
        (shown,) = _filtered(hinted[1:], Role.VIEWER, "surface", "display")
        assert "reasoning" not in shown.payload
    finally:
        await store.close()


def test_what_is_kept_apart_is_what_the_declarations_class_as_reasoning_or_trace() -> None:
    """The store's split is the filter's: whole ``reasoning.delta``, the reasoning fields of an
    otherwise public turn, a ``telemetry_only`` turn's ``trace``; nothing of a delta of the
    answer or of a type no declaration names. A viewer and a member read none of it on any
    run; a developer on a ``surface`` run, or on the trace surface, does."""
    assert stored_apart(EventType.REASONING_DELTA) is None
    assert stored_apart(EventType.AGENT_RESPONSE) == {
        "reasoning",
        "reasoning_chars",
        "reasoning_bytes",
        "reasoning_parts",
        "error_detail",
        "trace",
    }
    assert stored_apart(EventType.MESSAGE_DELTA) == frozenset()
    assert stored_apart("x.unknown") == frozenset()
    for mode in (*MODES, None):
        assert not reads_apart(Role.VIEWER, mode=mode)
        assert not reads_apart(Role.MEMBER, mode=mode)
    assert reads_apart(Role.DEVELOPER, mode="surface")
    assert not reads_apart(Role.DEVELOPER, mode="hidden")
    assert reads_apart(Role.DEVELOPER, mode="hidden", surface="trace")
    assert reads_apart(Role.DEVELOPER, mode=None)


class HintRecordingStore(MemoryStore):
    """Records the ``apart`` of every event read (this store keeps payloads whole anyway)."""

    def __init__(self) -> None:
        super().__init__()
        self.hints: list[bool] = []
        self.run_hints: list[bool] = []

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None, apart: bool = True
    ) -> list[Event]:
        self.hints.append(apart)
        return await super().read(run_id, after=after, limit=limit, apart=apart)

    def read_now(
        self, run_id: str, *, after: int, limit: int, apart: bool = True
    ) -> list[Event] | None:
        self.hints.append(apart)
        return None

    async def get_run(self, run_id: str, *, apart: bool = True) -> RunRecord:
        self.run_hints.append(apart)
        return await super().get_run(run_id, apart=apart)

    async def query_runs(self, query: RunQuery, *, apart: bool = True) -> RunPage:
        self.run_hints.append(apart)
        return await super().query_runs(query, apart=apart)

    async def list_runs(
        self, *, limit: int = 50, offset: int = 0, apart: bool = True
    ) -> list[RunRecord]:
        self.run_hints.append(apart)
        return await super().list_runs(limit=limit, offset=offset, apart=apart)

    async def run_changes(self, *, after: int, limit: int = 100, apart: bool = True) -> RunChanges:
        self.run_hints.append(apart)
        return await super().run_changes(after=after, limit=limit, apart=apart)


def test_every_read_path_passes_the_readers_hint() -> None:
    """The events page, the live stream's replay (its first page read alongside the ticket's
    check), the run view and the host's metadata read with ``apart=False`` for a viewer and a
    member of a ``surface`` run, and whole for a developer: the hint is the filter's, per
    reader."""
    store = HintRecordingStore()
    with running_daemon(store=store) as daemon:
        run_id = daemon.start_run(
            {"prompt": "hint", "model": "fake:canary", "chain_of_thought": "surface"}
        )
        assert daemon.wait_done(run_id)["status"] == "completed"
        for role, expected in (("viewer", False), ("member", False), ("developer", True)):
            store.hints.clear()
            page = daemon.get(f"/v1/runs/{run_id}/events", role)
            assert page.status_code == 200
            assert store.hints == [expected], ("events page", role, store.hints)
            store.run_hints.clear()
            for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/host-metadata"):
                assert daemon.get(path, role).status_code == 200
            assert store.run_hints == [expected, expected], ("run view", role, store.run_hints)
            store.run_hints.clear()
            for path in ("/v1/runs", "/v1/runs?offset=1", "/v1/runs?status=completed"):
                assert daemon.get(path, role).status_code == 200
            assert store.run_hints == [expected] * 3, ("run list", role, store.run_hints)
            store.hints.clear()
            response, body = stream_all(daemon, run_id, role)
            assert response.status_code == 200 and sse_events(body)
            assert store.hints and set(store.hints) == {expected}, ("stream", role, store.hints)


async def test_the_cli_store_reader_passes_the_readers_hint() -> None:
    """``thoughtgate events``, ``--follow`` and the run's view on the local store: the same
    hint (the view's: whether the reader may see a task's reasoning in a run of any mode)."""
    store = HintRecordingStore()
    run = make_run(chain_of_thought="surface")
    await store.create_run(run)
    ended = NewEvent(EventType.RUN_SETTLEMENT_COMPLETED, {"status": "completed"})
    await store.append(run.run_id, [*a_turn("r"), ended])
    for role, expected in ((Role.VIEWER, False), (Role.MEMBER, False), (Role.DEVELOPER, True)):
        reader = StoreReader(store, role)
        store.hints.clear()
        store.run_hints.clear()
        await reader.events(run.run_id)
        assert [e async for e in reader.follow(run.run_id)]
        await reader.view(run.run_id)
        assert set(store.hints) == {expected}, (role, store.hints)
        assert store.run_hints[-1] is expected, (role, store.run_hints)


async def test_the_live_run_list_passes_the_readers_hint() -> None:
    """The run list's live stream reads each change's tasks with the reader's hint."""
    store = HintRecordingStore()
    await store.create_run(make_run(chain_of_thought="surface"))
    for role, expected in ((Role.VIEWER, False), (Role.MEMBER, False), (Role.DEVELOPER, True)):
        store.run_hints.clear()
        frames = run_list_frames(store, role=role, after=0)
        assert b"run_id" in await anext(frames)
        await frames.aclose()
        assert store.run_hints == [expected], (role, store.run_hints)
    store.run_hints.clear()
    reader = StoreReader(store, Role.VIEWER)
    assert await reader.runs(10)
    assert store.run_hints == [False]
