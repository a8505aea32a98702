"""The backfill of ADR 0167: rows written before ADR 0160 (their reasoning inline, in the row)
are stored as the store writes an event now, on SQLite and PostgreSQL.

Old rows are written here as the version before wrote them: the payload encoded whole
(``codec.dumps``) into the row, no part apart. After the backfill each is stored exactly as an
append of the same event stores it now (the same two texts), every reader's filtered read is
what it was, the whole read is the payload as appended, and a read for a reader who may not see
the reasoning decodes none of it. A failure mid-walk rolls back its transaction and loses
nothing; the walk run again completes; a row is never moved twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from support.pg import PG_URL, pg_admin, pg_schema
from support.store_backends import Postgres, SQLite
from support.store_conformance import deltas, make_run
from test_reasoning_apart import (
    _READERS,
    BIG,
    MODES,
    _events,
    a_turn,
    agent_response,
    decoded,
)
from typer.testing import CliRunner

from thoughtgate.access.filter import (
    carrier_presence,
    filter_events,
    reads_apart,
    stored_apart,
    stored_presence,
)
from thoughtgate.access.roles import Role
from thoughtgate.cli import app
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.store import apart_backfill, codec
from thoughtgate.store.apart_backfill import move_all_apart
from thoughtgate.store.base import EventStore
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.store.urls import open_store

__all__ = ["decoded", "pg_admin", "pg_schema"]

Stored = tuple[str, str | None]
"""A row as stored: its payload text, and its part kept apart (``None``: none)."""


class Boom(Exception):
    """A failure in the middle of a batch."""


def _hidden_from_viewers(events: list[Event]) -> None:
    """What a read with the hint of a reader who may not see reasoning returns holds none of
    it: nothing of a type kept apart whole, no field kept apart, a carrier as its presence."""
    for e in events:
        apart = stored_apart(e.type)
        if apart is None:
            assert e.payload == {}, e
            continue
        assert apart.isdisjoint(e.payload), e
        for name in stored_presence(e.type) & set(e.payload):
            assert e.payload[name] == carrier_presence(name, e.payload[name]), e


_interleaved = st.builds(
    lambda t: NewEvent(
        EventType.AGENT_RESPONSE,
        {"turn": 1, "reasoning": t, "answer": "a", "error_detail": t, "complete": True},
    ),
    st.text(max_size=20),
)
"""A turn whose reasoning fields come before its public ones in the object (``_events`` put
them last): a whole read after the backfill lists them last, as for a turn appended now."""


class _Backend:
    """How a backend's rows are written the old way and looked at as stored."""

    async def write_old(
        self, store: EventStore, run_id: str, events: list[NewEvent], v: int = 1
    ) -> None:
        raise NotImplementedError

    async def stored(self, store: EventStore, run_id: str) -> list[Stored]:
        raise NotImplementedError

    async def old_run(
        self, store: EventStore, events: list[NewEvent], mode: str, v: int = 1
    ) -> str:
        run = make_run(chain_of_thought=mode)
        await store.create_run(run)
        await self.write_old(store, run.run_id, events, v)
        return run.run_id


class _SQLiteRows(_Backend):
    async def write_old(
        self, store: EventStore, run_id: str, events: list[NewEvent], v: int = 1
    ) -> None:
        assert isinstance(store, SQLiteStore)
        with sqlite3.connect(store.path) as conn:  # as the version before ADR 0160 wrote them
            (last,) = conn.execute(
                "SELECT last_seq FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            conn.executemany(
                "INSERT INTO events (run_id, seq, task_id, type, ts, payload, v) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (run_id, last + k, e.task_id, e.type, e.ts, codec.dumps(e.payload), v)
                    for k, e in enumerate(events, 1)
                ],
            )
            conn.execute(
                "UPDATE runs SET last_seq = ? WHERE run_id = ?", (last + len(events), run_id)
            )
        conn.close()

    async def stored(self, store: EventStore, run_id: str) -> list[Stored]:
        assert isinstance(store, SQLiteStore)
        conn = sqlite3.connect(store.path)
        try:
            rows = conn.execute(
                "SELECT e.payload, a.apart, e.apart FROM events e LEFT JOIN events_apart a "
                "USING (run_id, seq) WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()
        finally:
            conn.close()
        assert all((r[1] is None) == (r[2] is None) for r in rows)  # marker and part agree
        return [(r[0], r[1]) for r in rows]


class _PostgresRows(_Backend):
    @staticmethod
    async def _connect(store: EventStore) -> psycopg.AsyncConnection[Any]:
        assert isinstance(store, PostgresStore)
        conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(store.schema)))
        return conn

    async def write_old(
        self, store: EventStore, run_id: str, events: list[NewEvent], v: int = 1
    ) -> None:
        conn = await self._connect(store)
        try:
            async with conn.transaction():
                cur = await conn.execute("SELECT last_seq FROM runs WHERE run_id = %s", (run_id,))
                row = await cur.fetchone()
                assert row is not None
                last = int(row[0])
                async with conn.cursor() as cur:
                    await cur.executemany(
                        "INSERT INTO events (run_id, seq, task_id, type, ts, payload, v) "
                        "VALUES (%s, %s, %s, %s, %s, %s::json, %s)",
                        [
                            (run_id, last + k, e.task_id, e.type, e.ts, codec.dumps(e.payload), v)
                            for k, e in enumerate(events, 1)
                        ],
                    )
                await conn.execute(
                    "UPDATE runs SET last_seq = %s WHERE run_id = %s", (last + len(events), run_id)
                )
        finally:
            await conn.close()

    async def stored(self, store: EventStore, run_id: str) -> list[Stored]:
        conn = await self._connect(store)
        try:
            cur = await conn.execute(
                "SELECT CAST(payload AS TEXT), CAST(apart AS TEXT) FROM events "
                "WHERE run_id = %s ORDER BY seq",
                (run_id,),
            )
            return [(str(r[0]), None if r[1] is None else str(r[1])) for r in await cur.fetchall()]
        finally:
            await conn.close()


def _as_appended(events: list[NewEvent]) -> list[Stored]:
    """The texts an append of ``events`` stores now (ADR 0160)."""
    payloads, _, _, _, aparts = codec.encode_events(events)
    return list(zip(payloads, aparts, strict=True))


class _Cases(_Backend):
    async def test_an_old_runs_reasoning_is_no_longer_loaded_for_a_viewer(
        self, store: EventStore, decoded: list[int]
    ) -> None:
        """A run recorded before ADR 0160 with a megabyte of reasoning: a viewer's read loads
        it before the backfill, and none of it after; a developer's whole read returns the
        events as recorded, before and after."""
        events = a_turn("r" * BIG)
        run_id = await self.old_run(store, events, "surface")
        viewer = reads_apart(Role.VIEWER, mode="surface")
        decoded.clear()
        before = await store.read(run_id, apart=viewer)
        assert sum(decoded) > BIG  # the channel ADR 0160 left open for old rows
        whole = await store.read(run_id)
        assert await store.inline_candidates() == 2  # the delta of reasoning, the turn

        totals = await move_all_apart(store)

        assert (totals.moved, totals.refused) == (2, [])
        decoded.clear()
        after = await store.read(run_id, apart=viewer)
        assert sum(decoded) < 2_000, decoded
        _hidden_from_viewers(after)
        assert filter_events(after, Role.VIEWER, mode="surface") == filter_events(
            before, Role.VIEWER, mode="surface"
        )
        assert await store.read(run_id) == whole
        assert [e.payload for e in whole] == [e.payload for e in events]
        assert await self.stored(store, run_id) == _as_appended(events)
        assert await store.inline_candidates() == 0

    async def test_a_turn_of_vocabulary_version_0_reads_the_same_after(
        self, store: EventStore
    ) -> None:
        """A turn recorded in version 0 of the vocabulary (tool calls' keys in camelCase,
        upgraded as they are read): moved apart, it is still read, upgraded, as it was, whole
        and for every reader (the upgrade of a hinted read sees the row's part only)."""
        turn = agent_response("why " * 100)
        turn.payload["tool_calls"] = [{"callId": "c1", "toolKey": "t", "name": "search"}]
        run_id = await self.old_run(store, [turn], "surface", v=0)
        whole = await store.read(run_id)
        assert whole[0].payload["tool_calls"][0]["call_id"] == "c1"  # (upgraded)
        assert (await move_all_apart(store)).moved == 1
        assert await store.read(run_id) == whole
        for role in Role:
            hinted = await store.read(run_id, apart=reads_apart(role, mode="surface"))
            assert filter_events(hinted, role, mode="surface") == filter_events(
                whole, role, mode="surface"
            )

    async def test_a_dry_run_counts_and_writes_nothing(self, store: EventStore) -> None:
        """``dry_run`` reads and splits each row as the move would, counts the two that would
        move (the delta of answer keeps nothing apart: not looked at), and writes nothing."""
        events = [*a_turn("why"), NewEvent(EventType.MESSAGE_DELTA, {"text": "a"})]
        run_id = await self.old_run(store, events, "hidden")
        stored = await self.stored(store, run_id)
        totals = await move_all_apart(store, dry_run=True)
        assert (totals.looked_at, totals.moved) == (2, 2)
        assert await self.stored(store, run_id) == stored
        assert all(apart is None for _, apart in stored)

    async def test_a_failure_mid_batch_rolls_its_batch_back_and_a_rerun_completes(
        self, store: EventStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Six old turns, moved two a transaction; the fourth row fails: the first
        transaction's two rows stay moved, the failing one's two stay whole (rolled back, none
        half-moved), the rest untouched. Run again, the walk moves the four left and passes
        over the two moved before; the events read whole are the recorded ones throughout."""
        events = [agent_response(f"reasoning {k} " * 50) for k in range(6)]
        run_id = await self.old_run(store, events, "surface")
        whole = await store.read(run_id)
        real, calls = codec.moved_apart, 0

        def failing(event_type: str, payload: str) -> tuple[str, str] | None:
            nonlocal calls
            calls += 1
            if calls == 4:
                raise Boom("the disk is gone")
            return real(event_type, payload)

        monkeypatch.setattr(codec, "moved_apart", failing)
        with pytest.raises(Boom):
            await move_all_apart(store, batch=2)
        stored = await self.stored(store, run_id)
        assert [apart is not None for _, apart in stored] == [True, True] + [False] * 4
        assert stored[:2] == _as_appended(events[:2])
        assert await store.read(run_id) == whole
        monkeypatch.setattr(codec, "moved_apart", real)

        totals = await move_all_apart(store, batch=2)

        assert (totals.looked_at, totals.moved) == (4, 4)
        assert await self.stored(store, run_id) == _as_appended(events)
        assert await store.read(run_id) == whole
        again = await move_all_apart(store)
        assert (again.looked_at, again.moved) == (0, 0)

    async def test_appends_go_on_while_the_backfill_walks(
        self, store: EventStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A daemon (a second store on the same database: its own connections, its own
        writer) appends turns to a run while the walk moves an old run's rows one a
        transaction, across windows of seven rows: every append and every move is stored, and
        the rows the daemon appends (stored apart already) are not touched."""
        monkeypatch.setattr(apart_backfill, "WINDOW", 7)
        events = [agent_response(f"r{k}") for k in range(40)]
        old = await self.old_run(store, events, "surface")
        daemon = await self.second(store)
        try:
            live = make_run(chain_of_thought="surface")
            await daemon.create_run(live)
            appended: list[NewEvent] = []

            async def appends() -> None:
                for k in range(40):
                    batch = [*deltas(2, start=2 * k), agent_response(f"live {k}")]
                    await daemon.append(live.run_id, batch)
                    appended.extend(batch)
                    await asyncio.sleep(0)

            pages: list[apart_backfill.ApartPage] = []
            walk = move_all_apart(store, batch=1, each=pages.append)
            totals, _ = await asyncio.gather(walk, appends())
        finally:
            await daemon.close()
        assert totals.moved == 40 and len(pages) > 5
        assert await self.stored(store, old) == _as_appended(events)
        assert await self.stored(store, live.run_id) == _as_appended(appended)

    async def second(self, store: EventStore) -> EventStore:
        raise NotImplementedError

    async def test_a_row_the_codec_did_not_write_is_left_and_named(self, store: EventStore) -> None:
        """A payload that is not a JSON object (written by hand) is left as it is, the walk goes
        on past it and names it."""
        run_id = await self.old_run(store, [agent_response("ok")], "hidden")
        bad = await self.old_run(store, [], "hidden")
        await self.write_old(store, bad, [NewEvent(EventType.AGENT_RESPONSE, {})])
        await self._overwrite(store, bad, "[1, 2]")
        totals = await move_all_apart(store)
        assert (totals.moved, totals.refused) == (1, [(bad, 1)])
        assert (await self.stored(store, bad)) == [("[1, 2]", None)]
        assert (await self.stored(store, run_id))[0][1] is not None

    async def _overwrite(self, store: EventStore, run_id: str, payload: str) -> None:
        raise NotImplementedError

    @settings(
        max_examples=25,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.differing_executors,
        ],
    )
    @given(
        old=st.lists(_events | _interleaved, max_size=10),
        new=st.lists(_events, max_size=4),
        mode=st.sampled_from(MODES),
        batch=st.integers(1, 4),
    )
    async def test_property_the_backfill_changes_where_bytes_sit_not_what_anyone_reads(
        self,
        store: EventStore,
        old: list[NewEvent],
        new: list[NewEvent],
        mode: str,
        batch: int,
    ) -> None:
        """For any events recorded before ADR 0160 (reasoning of any size, traces, carriers of
        any shape, undeclared types and keys), followed by events appended since: after the
        backfill every row is stored as an append stores it now (an undeclared type whole, as
        it was); the whole read is the events as recorded; for every reader (role, mode,
        surface) the filtered read with the reader's hint equals the filtered whole read before;
        and a hinted read for a reader who may not see reasoning holds none of it."""
        run_id = await self.old_run(store, old, mode)
        if new:
            await store.append(run_id, new)
        events = [*old, *new]
        whole = await store.read(run_id)
        shown = {
            (role, surface): filter_events(whole, role, mode=mode, surface=surface)
            for role, run_mode, surface in _READERS
            if run_mode == mode
        }

        await move_all_apart(store, batch=batch)

        assert await self.stored(store, run_id) == _as_appended(events)
        after = await store.read(run_id)
        assert after == whole
        assert [e.payload for e in after] == [dict(e.payload) for e in events]
        for (role, surface), before in shown.items():
            apart = reads_apart(role, mode=mode, surface=surface)
            hinted = filter_events(
                await store.read(run_id, apart=apart), role, mode=mode, surface=surface
            )
            assert hinted == before, (role, mode, surface)
            if not apart:
                # what such a reader is sent is the same JSON text, byte for byte (a
                # developer's may list the keys kept apart last: _as_appended above)
                assert [json.dumps(e.to_dict()) for e in hinted] == [
                    json.dumps(e.to_dict()) for e in before
                ]
                _hidden_from_viewers(await store.read(run_id, apart=apart))
        again = await move_all_apart(store)
        assert again.moved == 0


class TestOnSQLite(SQLite, _SQLiteRows, _Cases):
    async def second(self, store: EventStore) -> EventStore:
        assert isinstance(store, SQLiteStore)
        return await SQLiteStore.open(store.path)

    async def _overwrite(self, store: EventStore, run_id: str, payload: str) -> None:
        assert isinstance(store, SQLiteStore)
        with sqlite3.connect(store.path) as conn:
            conn.execute("UPDATE events SET payload = ? WHERE run_id = ?", (payload, run_id))
        conn.close()

    async def test_each_batch_is_a_transaction_of_its_own(
        self, store: EventStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The one writer's lock is held for a batch at a time: ten rows in batches of three
        are four write transactions, and a row past the batch's byte budget ends its batch
        (each megabyte row then moved alone), so the daemon's appends take turns with them."""
        assert isinstance(store, SQLiteStore)
        run_id = await self.old_run(store, [agent_response(f"r{k}") for k in range(10)], "hidden")
        writes: list[str] = []
        write = store._writer.write

        async def counted(action: str, fn: Any, **kw: Any) -> Any:
            writes.append(action)
            return await write(action, fn, **kw)

        monkeypatch.setattr(store._writer, "write", counted)
        assert (await move_all_apart(store, batch=3)).moved == 10
        assert len(writes) == 4
        big = await self.old_run(store, [agent_response("r" * BIG) for _ in range(3)], "hidden")
        monkeypatch.setattr(apart_backfill, "BATCH_BYTES", BIG)
        writes.clear()
        assert (await move_all_apart(store, batch=100)).moved == 3
        assert len(writes) == 3
        assert all(a is not None for _, a in await self.stored(store, big))
        assert all(a is not None for _, a in await self.stored(store, run_id))


@pytest.mark.postgres
class TestOnPostgres(Postgres, _PostgresRows, _Cases):
    async def second(self, store: EventStore) -> EventStore:
        assert isinstance(store, PostgresStore)
        return await PostgresStore.open(PG_URL, schema=store.schema)

    async def _overwrite(self, store: EventStore, run_id: str, payload: str) -> None:
        conn = await self._connect(store)
        try:
            await conn.execute(
                "UPDATE events SET payload = %s::json WHERE run_id = %s", (payload, run_id)
            )
        finally:
            await conn.close()


# --------------------------------------------------------------------------- the command

LOCAL = {"THOUGHTGATE_URL": None, "THOUGHTGATE_KEY": None, "COLUMNS": "200"}
CANARY = "CANARY-backfill-reasoning-77c1"


def move_apart(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["store", "move-apart", *args], env=LOCAL)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


async def _old_store(path: Path, runs: int) -> list[str]:
    store = await SQLiteStore.open(path)
    try:
        backend = _SQLiteRows()
        return [
            await backend.old_run(store, a_turn(f"{CANARY} {k}"), "surface") for k in range(runs)
        ]
    finally:
        await store.close()


def test_the_command_counts_moves_and_passes_over_what_it_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--dry-run`` counts the rows to move and writes nothing; the command moves them (exit
    0); run again it finds none; it never prints a payload."""
    monkeypatch.setenv("THOUGHTGATE_DURABILITY__ENABLED", "false")
    path = tmp_path / "old.db"
    asyncio.run(_old_store(path, 3))
    db = f"sqlite:///{path}"
    code, out, err = move_apart("--db", db, "--dry-run", "--json")
    assert (code, json.loads(out)) == (
        0,
        {"dry_run": True, "candidates": 6, "looked_at": 6, "moved": 0, "to_move": 6, "refused": []},
    )
    code, out, err = move_apart("--db", db, "--dry-run")
    assert code == 0 and "6 rows keep reasoning inline (run without --dry-run" in out
    code, out, err = move_apart("--db", db, "--json")
    assert code == 0 and json.loads(out)["moved"] == 6
    code, out, err = move_apart("--db", db)
    assert code == 0 and "nothing to move" in out
    code, out, err = move_apart("--db", db, "--dry-run")  # not "run without --dry-run" for 0
    assert code == 0 and "none keeps reasoning inline, nothing to move" in out, out
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM events_apart").fetchone() == (6,)
    conn.close()
    for printed in (out, err):
        assert CANARY not in printed


def test_the_command_refuses_a_daemon_address_and_creates_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THOUGHTGATE_DURABILITY__ENABLED", "false")
    code, out, err = move_apart("--url", "http://127.0.0.1:9")
    assert code == 2 and "no endpoint" in out + err
    missing = tmp_path / "nowhere.db"
    code, out, err = move_apart("--db", f"sqlite:///{missing}")
    assert code == 0 and not missing.exists()


# --------------------------------------------------------------------------- a walk killed midway

SRC = str(Path(__file__).resolve().parents[1] / "src")
KILLED_ROWS = 1500


async def _killed_midway(db: str, backend: _Backend, moved_so_far: Any) -> None:
    """The command run as a process over a run of old turns, one row a transaction, killed
    (``SIGKILL``: no handler runs) once it has moved a few: every row is whole or moved, none
    half; the events read whole are the recorded ones; the command run again moves the rest."""
    events = [agent_response(f"{CANARY} {k} " * 40) for k in range(KILLED_ROWS)]
    store = await open_store(db)
    try:
        run_id = await backend.old_run(store, events, "surface")
        whole = await store.read(run_id)
    finally:
        await store.close()
    env = {**os.environ, "PYTHONPATH": SRC, "THOUGHTGATE_DURABILITY__ENABLED": "false"}
    env.pop("THOUGHTGATE_URL", None)
    command = [sys.executable, "-m", "thoughtgate", "store", "move-apart", "--db", db]
    walk = await asyncio.create_subprocess_exec(
        *command, "--batch", "1", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        while await moved_so_far() < 10:
            assert walk.returncode is None, "the walk ended before it was killed"
            await asyncio.sleep(0.02)
    finally:
        if walk.returncode is None:
            walk.kill()
        await walk.wait()
    store = await open_store(db)
    try:
        stored = await backend.stored(store, run_id)
        appended, old = _as_appended(events), [(codec.dumps(e.payload), None) for e in events]
        moved = [s == a for s, a in zip(stored, appended, strict=True)]
        assert all(m or s == o for m, s, o in zip(moved, stored, old, strict=True))
        assert 10 <= sum(moved) < KILLED_ROWS
        assert await store.read(run_id) == whole
        again = await asyncio.create_subprocess_exec(
            *command, "--json", env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        out, _ = await again.communicate()
        assert again.returncode == 0
        assert json.loads(out)["moved"] == KILLED_ROWS - sum(moved)
        assert await backend.stored(store, run_id) == appended
        assert await store.read(run_id) == whole
    finally:
        await store.close()


@pytest.mark.external  # it starts processes
async def test_a_walk_killed_midway_loses_nothing_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "old.db"

    async def moved_so_far() -> int:
        conn = sqlite3.connect(path)
        try:
            return int(conn.execute("SELECT count(*) FROM events_apart").fetchone()[0])
        finally:
            conn.close()

    await _killed_midway(f"sqlite:///{path}", _SQLiteRows(), moved_so_far)


@pytest.mark.external
@pytest.mark.postgres
async def test_a_walk_killed_midway_loses_nothing_postgres(pg_schema: str) -> None:
    async def moved_so_far() -> int:
        async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
            cur = await conn.execute(
                sql.SQL("SELECT count(*) FROM {}.events WHERE apart IS NOT NULL").format(
                    sql.Identifier(pg_schema)
                )
            )
            row = await cur.fetchone()
        return 0 if row is None else int(row[0])

    await _killed_midway(f"{PG_URL}?schema={pg_schema}", _PostgresRows(), moved_so_far)
