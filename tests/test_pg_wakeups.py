"""Live fan-out across PostgreSQL replicas with the wake-up sent after the commit (ADR 0132).

The store is the source and the NOTIFY only a wake-up: a reader on any replica gets every
committed event once, in order, whether the wake-up came, came for several appends at once, or
never came (the appending process died between its commit and the send: then the reader's safety
poll finds them)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql
from support.pg import PG_URL, pg_admin, pg_schema
from support.pg_replicas import run_store_script, tail_into
from support.store_conformance import collect, deltas, make_run

from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.store.postgres import PostgresStore, channel_name

__all__ = ["pg_admin", "pg_schema"]  # fixtures used by this module

pytestmark = pytest.mark.postgres

Admin = psycopg.AsyncConnection[Any]
NOTIFY_ONLY = 60.0
"""A poll interval no test here waits for: what arrives, a NOTIFY delivered."""


@contextlib.asynccontextmanager
async def replica(schema: str, *, safety_poll: float = NOTIFY_ONLY) -> AsyncIterator[PostgresStore]:
    store = await PostgresStore.open(PG_URL, schema=schema, pool_size=4)
    store.safety_poll = safety_poll
    store.poll_interval = NOTIFY_ONLY
    try:
        yield store
    finally:
        await store.close()


async def until(check: Callable[[], bool], what: str, within: float = 20.0) -> None:
    for _ in range(int(within * 100)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no {what} within {within} s")


async def listening(store: PostgresStore) -> None:
    store._listener.start()
    await until(lambda: store._listener.healthy, "LISTEN in force")


async def test_two_replicas_appending_to_one_run_each_deliver_every_event_once_in_order(
    pg_schema: str,
) -> None:
    """Both replicas append to the same run at once and a third only reads; the tails on all
    three get 1..N, though each replica's appends reach the others only by its wake-ups."""
    async with replica(pg_schema) as a, replica(pg_schema) as b, replica(pg_schema) as c:
        run = make_run()
        await a.create_run(run)
        tails = [asyncio.create_task(collect(s.tail(run.run_id), within=60)) for s in (a, b, c)]
        for store in (a, b, c):
            await listening(store)

        async def write(store: PostgresStore, sizes: list[int], start: int) -> None:
            for i, size in enumerate(sizes):
                await store.append(run.run_id, deltas(size, start=start + 100 * i))

        await asyncio.gather(
            *(write(s, [1, 3, 2, 1] * 5, k * 10_000) for k, s in enumerate((a, b)))
        )
        total = 2 * 5 * 7
        await b.append_one(run.run_id, NewEvent(EventType.RUN_FAILED))
        got = await asyncio.gather(*tails)
    for events in got:
        assert [e.seq for e in events] == list(range(1, total + 2))
    assert got[0] == got[1] == got[2]


async def test_appends_that_commit_during_a_send_share_the_next_notifying_transaction(
    pg_schema: str,
) -> None:
    """While one wake-up is being sent, the appends that commit are noted, not sent: the next
    transaction carries one wake-up per run, with its last sequence number."""
    async with replica(pg_schema) as writer:
        listener = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
        try:
            await listener.execute(
                sql.SQL("LISTEN {}").format(sql.Identifier(channel_name(pg_schema)))
            )
            runs = [make_run() for _ in range(3)]
            for run in runs:
                await writer.create_run(run)
            notifier = writer._notifier
            send, gate, held = notifier._send, asyncio.Event(), asyncio.Event()
            carried: list[list[str]] = []

            async def held_send(payloads: list[str]) -> None:
                carried.append(payloads)
                if len(carried) == 1:
                    held.set()
                    await gate.wait()  # the first send is in flight until the appends are done
                await send(payloads)

            notifier._send = held_send  # type: ignore[method-assign]
            await writer.append(runs[0].run_id, deltas(1))
            await held.wait()
            for run in runs:
                for size in (2, 1):
                    await writer.append(run.run_id, deltas(size))
            gate.set()
            expected = {
                f"{runs[0].run_id} 1",
                *(f"{r.run_id} {4 if r is runs[0] else 3}" for r in runs),
            }
            received: set[str] = set()
            async with asyncio.timeout(10):
                async for note in listener.notifies():
                    received.add(note.payload)
                    if expected <= received:  # the run list's wake-ups come too
                        break
        finally:
            await listener.close()
    assert carried == [
        [f"{runs[0].run_id} 1"],
        [f"{runs[0].run_id} 4", *(f"{r.run_id} 3" for r in runs[1:])],
    ]
    assert notifier.sends == 2


async def test_a_wake_up_never_sent_is_made_up_by_the_readers_safety_poll(pg_schema: str) -> None:
    """The appending process dies between its commit and its wake-up: the events are in the
    store, and another replica's reader finds them at its next safety poll, then goes on."""
    async with replica(pg_schema) as writer, replica(pg_schema, safety_poll=0.2) as reader:
        run = make_run()
        await writer.create_run(run)
        got: list[Event] = []
        tail = tail_into(reader, run.run_id, got)
        await listening(reader)
        never_sent: list[tuple[str, int]] = []
        notifier = writer._notifier
        sent = notifier.sends
        notifier.committed = lambda run_id, seq: never_sent.append((run_id, seq))  # type: ignore[method-assign]
        await writer.append(run.run_id, deltas(3))
        await until(lambda: len(got) == 3, "events read by the safety poll")
        assert never_sent == [(run.run_id, 3)] and notifier.sends == sent
        del notifier.committed  # a replica that works again
        await writer.append_one(run.run_id, NewEvent(EventType.RUN_FAILED))
        await asyncio.wait_for(tail, 20)
    assert [e.seq for e in got] == [1, 2, 3, 4]


async def test_a_process_killed_right_after_its_commit_loses_no_event(pg_schema: str) -> None:
    """A real process that exits at once after its append returned (no close, nothing awaited
    after it): the other replica's reader gets its events by its poll, in order."""
    code = (
        "import asyncio, os, sys\n"
        "from thoughtgate.events.schema import NewEvent\n"
        "from thoughtgate.store.postgres import PostgresStore\n"
        "async def main(url, schema, run_id):\n"
        "    store = await PostgresStore.open(url, schema=schema)\n"
        "    await store.append(run_id, [NewEvent('w', {'i': i}) for i in range(4)])\n"
        "    os._exit(0)\n"
        "asyncio.run(main(*sys.argv[1:]))\n"
    )
    async with replica(pg_schema, safety_poll=0.2) as store:
        run = make_run()
        await store.create_run(run)
        tail = asyncio.create_task(collect(store.tail(run.run_id), within=30))
        await listening(store)
        await run_store_script(code, PG_URL, pg_schema, run.run_id)
        await store.append_one(run.run_id, NewEvent(EventType.RUN_FAILED))
        got = await tail
    assert [(e.seq, e.payload.get("i")) for e in got[:4]] == [(1, 0), (2, 1), (3, 2), (4, 3)]
    assert [e.seq for e in got] == [1, 2, 3, 4, 5]


async def test_a_dropped_notifier_connection_is_opened_again_for_the_same_wake_up(
    pg_admin: Admin, pg_schema: str
) -> None:
    async with replica(pg_schema) as writer, replica(pg_schema) as reader:
        run = make_run()
        await writer.create_run(run)
        got: list[Event] = []
        tail = tail_into(reader, run.run_id, got)
        await listening(reader)
        await writer.append(run.run_id, deltas(1))
        await until(lambda: len(got) == 1, "the first wake-up")
        cur = await pg_admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (f"thoughtgate-notify:{pg_schema}",),
        )
        assert [r[0] for r in await cur.fetchall()] == [True]
        await writer.append(run.run_id, deltas(2, start=1))  # NOTIFY or nothing delivers it
        await until(lambda: len(got) == 3, "the wake-up sent on a new connection")
        await writer.append_one(run.run_id, NewEvent(EventType.RUN_FAILED))
        await asyncio.wait_for(tail, 20)
    assert [e.seq for e in got] == [1, 2, 3, 4]


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 1), st.integers(1, 4), st.booleans()), min_size=1, max_size=14
    )
)
def test_replicas_readers_get_every_event_once_in_order_whatever_wake_ups_are_lost(
    pg_schema: str, plan: list[tuple[int, int, bool]]
) -> None:
    """Appends of any sizes from either of two replicas, some of whose wake-ups are never sent
    (as if its process died after the commit): a reader on each replica gets 1..N, once each."""

    async def go() -> None:
        async with (
            replica(pg_schema, safety_poll=0.2) as a,
            replica(pg_schema, safety_poll=0.2) as b,
        ):
            stores = (a, b)
            run = make_run()
            await a.create_run(run)
            tails = [asyncio.create_task(collect(s.tail(run.run_id), within=60)) for s in stores]
            for store in stores:
                await listening(store)
            for who, size, lost in plan:
                notifier = stores[who]._notifier
                if lost:
                    notifier.committed = lambda *_: None  # type: ignore[method-assign]
                try:
                    await stores[who].append(run.run_id, deltas(size))
                finally:
                    if lost:
                        del notifier.committed
            await a.append_one(run.run_id, NewEvent(EventType.RUN_FAILED))
            got = await asyncio.gather(*tails)
            total = sum(size for _, size, _ in plan) + 1
            for events in got:
                assert [e.seq for e in events] == list(range(1, total + 1))

    asyncio.run(go())
