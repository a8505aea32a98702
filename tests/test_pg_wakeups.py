"""Live fan-out across PostgreSQL replicas with the wake-up sent after the commit (ADR 0132).

The store is the source and the NOTIFY only a wake-up: a reader on any replica gets every
committed event once, in order, whether the wake-up came, came for several appends at once, or
never came (the appending process died between its commit and the send: then the reader's safety
poll finds them)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
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
from thoughtgate.store import pg_listener, pg_notifier
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


@contextlib.asynccontextmanager
async def listening_raw(schema: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A plain ``LISTEN`` connection on the schema's channel: what it receives was sent."""
    conn = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
    try:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel_name(schema))))
        yield conn
    finally:
        await conn.close()


async def received(listener: psycopg.AsyncConnection[Any], *payloads: str) -> None:
    """Wait until every one of ``payloads`` has arrived (the run list's wake-ups come too)."""
    wanted, seen = set(payloads), set[str]()
    async with asyncio.timeout(20):
        async for note in listener.notifies():
            seen.add(note.payload)
            if wanted <= seen:
                return


@dataclass
class Followed:
    """A run appended to by ``writer`` and followed by a tail on ``reader``, another replica,
    with a plain ``LISTEN`` connection beside it (what ``listener`` receives was sent)."""

    writer: PostgresStore
    reader: PostgresStore
    listener: psycopg.AsyncConnection[Any]
    run_id: str
    got: list[Event]
    tail: asyncio.Task[None]


@contextlib.asynccontextmanager
async def followed(schema: str, *, reader_poll: float = NOTIFY_ONLY) -> AsyncIterator[Followed]:
    async with (
        replica(schema) as writer,
        replica(schema, safety_poll=reader_poll) as reader,
        listening_raw(schema) as listener,
    ):
        run = make_run()
        await writer.create_run(run)
        await writer._notifier.idle()  # the run list's wake-up for it (ADR 0140) is sent:
        writer._notifier.sends = 0  # the sends counted from here are the appends'
        got: list[Event] = []
        tail = tail_into(reader, run.run_id, got)
        await listening(reader)
        yield Followed(writer, reader, listener, run.run_id, got, tail)


def attempts_of(notifier: Any, first: Callable[[], Awaitable[object]]) -> list[list[str]]:
    """Each send attempt's payloads, from now on; ``first`` is awaited before the first goes."""
    send, attempts = notifier._send, list[list[str]]()

    async def attempt(payloads: list[str]) -> None:
        attempts.append(payloads)
        if len(attempts) == 1:
            await first()
        await send(payloads)

    notifier._send = attempt
    return attempts


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
            await notifier.idle()  # the run list's wake-ups for them (ADR 0140) are sent
            notifier.sends = 0
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
        await notifier.idle()  # the run list's wake-up for the run (ADR 0140) is sent
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


async def terminate_notifier(admin: Admin, schema: str) -> list[int]:
    """End the notifier's server session as a server restart would, and wait for it to be gone
    (``pg_terminate_backend``'s timeout): the notifier's next statement finds it dropped."""
    return await terminate(admin, f"thoughtgate-notify:{schema}")


async def terminate_listener(admin: Admin, schema: str) -> list[int]:
    """End the listener's server session, as :func:`terminate_notifier` the notifier's."""
    return await terminate(admin, f"thoughtgate-listen:{schema}")


async def terminate(admin: Admin, application_name: str) -> list[int]:
    cur = await admin.execute(
        "SELECT pid, pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
        "WHERE application_name = %s",
        (application_name,),
    )
    rows = await cur.fetchall()
    assert all(ended for _, ended in rows)
    return [pid for pid, _ in rows]


async def test_a_dropped_notifier_connection_is_opened_again_for_the_same_wake_up(
    pg_admin: Admin, pg_schema: str
) -> None:
    """The server ends the notifier's idle session: the next wake-up is sent on a new one."""
    async with followed(pg_schema) as f:
        writer, listener, run_id, got = f.writer, f.listener, f.run_id, f.got
        await writer.append(run_id, deltas(1))
        await until(lambda: len(got) == 1, "the first event")
        # The reader may have read event 1 before its wake-up was sent (a tail whose first read
        # was late): the notifier's connection is open once that send is done, not before.
        await writer._notifier.idle()
        assert writer._notifier.sends == 1
        assert len(await terminate_notifier(pg_admin, pg_schema)) == 1
        await writer.append(run_id, deltas(2, start=1))
        # Sent, not only read: a tail whose read came after the commit needs no wake-up.
        await received(listener, f"{run_id} 3")
        await until(lambda: len(got) == 3, "events 2 and 3")
        assert writer._notifier.given_up == 0
        await writer.append_one(run_id, NewEvent(EventType.RUN_FAILED))
        await asyncio.wait_for(f.tail, 20)
    assert [e.seq for e in got] == [1, 2, 3, 4]


def notifier_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("notify ")]


async def test_a_connection_dropped_as_its_notify_is_sent_is_sent_again_on_a_new_one(
    pg_admin: Admin, pg_schema: str
) -> None:
    """The server ends the notifier's session just as a wake-up goes out on it (a restart, a
    failover): the same wake-up is sent on a new connection and reaches the other replica's
    reader (which has no poll to fall back on)."""
    async with followed(pg_schema) as f:
        writer, listener, run_id, got = f.writer, f.listener, f.run_id, f.got
        await writer.append(run_id, deltas(1))
        await writer._notifier.idle()
        notifier = writer._notifier
        attempts = attempts_of(notifier, lambda: terminate_notifier(pg_admin, pg_schema))
        await writer.append(run_id, deltas(2, start=1))
        await received(listener, f"{run_id} 3")
        await notifier.idle()
        await until(lambda: len(got) == 3, "events 2 and 3")
        assert attempts == [[f"{run_id} 3"]] * 2
        assert notifier.sends == 2 and notifier.given_up == 0
        del notifier._send
        await writer.append_one(run_id, NewEvent(EventType.RUN_FAILED))
        await asyncio.wait_for(f.tail, 20)
    assert [e.seq for e in got] == [1, 2, 3, 4]


async def test_a_server_refusing_the_notifier_costs_one_warning_the_readers_poll_meanwhile(
    pg_admin: Admin,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A restart that takes a while: the notifier's session is ended and new ones are refused.
    Every wake-up meanwhile is given up (the other replica's reader gets the events by its
    safety poll), with one warning for the whole outage, not one per send; the first wake-up
    after it is sent again."""
    caplog.set_level(logging.DEBUG, pg_notifier.__name__)
    async with followed(pg_schema, reader_poll=0.2) as f:
        writer, listener, run_id, got = f.writer, f.listener, f.run_id, f.got
        notifier = writer._notifier
        await writer.append(run_id, deltas(1))
        await notifier.idle()

        async def refused(*_: Any, **__: Any) -> psycopg.AsyncConnection[Any]:
            raise psycopg.OperationalError("the database system is starting up")

        monkeypatch.setattr(pg_notifier, "connect", refused)
        await terminate_notifier(pg_admin, pg_schema)
        for i in range(3):
            await writer.append(run_id, deltas(1, start=1 + i))
            await notifier.idle()
        await until(lambda: len(got) == 4, "the events read by the safety poll")
        assert notifier.given_up == 3
        failed = [r for r in caplog.records if "failed (" in r.getMessage()]
        assert [r.levelno for r in failed] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
        assert all("starting up" in r.getMessage() for r in failed)
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert warned == failed[:1]
        monkeypatch.undo()  # the server is back
        await writer.append_one(run_id, NewEvent(EventType.RUN_FAILED))
        await received(listener, f"{run_id} 5")
        await notifier.idle()  # a listener can have it before the sender has the answer
        assert any(r.getMessage() == f"NOTIFY {writer.channel} sent again" for r in caplog.records)
        await asyncio.wait_for(f.tail, 20)
    assert [e.seq for e in got] == [1, 2, 3, 4, 5]
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


async def test_a_connection_gone_silent_costs_one_send_timeout_not_the_wake_ups_after_it(
    pg_schema: str,
) -> None:
    """The notifier's send never gets an answer (a connection dropped without a reset): the
    attempt is given up after ``send_timeout_s`` and the wake-up is sent on a new connection,
    instead of every later wake-up of the process waiting behind it."""
    async with followed(pg_schema) as f:
        writer, listener, run_id, got = f.writer, f.listener, f.run_id, f.got
        notifier = writer._notifier
        notifier.send_timeout_s = 0.2
        attempts = attempts_of(notifier, asyncio.Event().wait)  # never set: no answer
        await writer.append(run_id, deltas(2))
        await received(listener, f"{run_id} 2")
        await notifier.idle()
        await until(lambda: len(got) == 2, "events 1 and 2")
        assert attempts == [[f"{run_id} 2"]] * 2
        assert notifier.given_up == 0
        await writer.append_one(run_id, NewEvent(EventType.RUN_FAILED))
        await asyncio.wait_for(f.tail, 20)
    assert [e.seq for e in got] == [1, 2, 3]


async def test_a_failed_send_waits_before_its_retry_and_close_ends_that_wait(
    pg_admin: Admin, pg_schema: str
) -> None:
    """The server ends the notifier's session as a wake-up goes out: the second attempt waits
    ``retry_backoff_s`` rather than follow at once (into a server that may still be restarting);
    ``close`` ends that wait and the same wake-up is sent on a new connection before the store
    closes, within ``close``'s bound, not cancelled with the wait."""
    async with followed(pg_schema) as f:
        writer, listener, run_id = f.writer, f.listener, f.run_id
        notifier = writer._notifier
        await writer.append(run_id, deltas(1))
        await notifier.idle()
        notifier.retry_backoff_s = 120.0  # no test waits this: only ``close`` ends the wait
        attempts = attempts_of(notifier, lambda: terminate_notifier(pg_admin, pg_schema))
        await writer.append(run_id, deltas(1, start=1))
        await until(lambda: notifier._pause is not None and len(attempts) == 1, "a retry waiting")
        for _ in range(10):  # a retry at once would have gone by now
            await asyncio.sleep(0)
        assert len(attempts) == 1 and notifier.sends == 1
        await notifier.close(within=20)
        await received(listener, f"{run_id} 2")
        assert attempts == [[f"{run_id} 2"]] * 2
        assert notifier.sends == 2 and notifier.given_up == 0
    assert notifier_tasks() == []


async def test_a_retry_waits_between_half_and_all_of_its_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wait before a retry is jittered within ``[retry_backoff_s / 2, retry_backoff_s]``,
    so the replicas of one server that all failed together do not retry in the same instant."""
    notifier = pg_notifier.PgNotifier("", "ch", application_name="t")
    notifier.window_s = 0
    waits: list[float] = []
    wait = notifier._wait

    async def recorded(seconds: float) -> None:
        waits.append(seconds)
        await wait(0)

    async def refused(payloads: list[str]) -> None:
        raise psycopg.OperationalError("the database system is starting up")

    monkeypatch.setattr(notifier, "_wait", recorded)
    monkeypatch.setattr(notifier, "_send", refused)
    for i in range(50):
        notifier.committed("run", i + 1)
        await notifier.idle()
    retries = waits[1::2]  # each send: its window, then its retry's wait
    assert len(retries) == 50 and notifier.given_up == 50
    assert all(0.05 <= w <= 0.1 for w in retries)
    assert len(set(retries)) > 1


async def test_a_lost_listener_warns_once_an_outage_and_says_once_it_is_back(
    pg_admin: Admin,
    pg_schema: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server ends the listener's session and refuses its next three connections (a restart
    that takes a while): one warning for the loss, each failed attempt at debug level, one line
    when it listens again -- and each later outage the same. Wake-ups reach the reader again
    after each (its safety poll is 60 s: only a NOTIFY delivers)."""
    caplog.set_level(logging.DEBUG, pg_listener.__name__)
    async with followed(pg_schema) as f:
        writer, reader, run_id, got = f.writer, f.reader, f.run_id, f.got
        listener = reader._listener
        listener.backoff = (0.01, 0.04)
        await writer.append(run_id, deltas(1))
        await until(lambda: len(got) == 1, "event 1, woken by its NOTIFY")
        connect, refusals = pg_listener.connect, [3]

        async def restarting(*args: Any, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
            if refusals[0]:
                refusals[0] -= 1
                raise psycopg.OperationalError("the database system is starting up")
            return await connect(*args, **kwargs)

        monkeypatch.setattr(pg_listener, "connect", restarting)
        for outage in (1, 2):
            assert await terminate_listener(pg_admin, pg_schema)
            await until(lambda n=1 + outage: listener.connections == n, "LISTEN in force again")
            await writer.append(run_id, deltas(1, start=outage))
            await until(lambda n=1 + outage: len(got) == n, f"event {1 + outage} by NOTIFY")
        await writer.append_one(run_id, NewEvent(EventType.RUN_FAILED))
        await asyncio.wait_for(f.tail, 20)
    assert [e.seq for e in got] == [1, 2, 3, 4]
    mine = [r for r in caplog.records if r.name == pg_listener.__name__]
    warned = [r.getMessage() for r in mine if r.levelno >= logging.WARNING]
    failed = [r.getMessage() for r in mine if r.levelno == logging.DEBUG]
    back = [r.getMessage() for r in mine if r.levelno == logging.INFO]
    assert len(warned) == 2 and all(" lost (" in m for m in warned), warned
    assert len(failed) == 3 and all("starting up" in m for m in failed), failed
    assert [m.rpartition(" (")[2] for m in back] == [
        "3 attempt(s) failed before)",
        "0 attempt(s) failed before)",
    ]


def test_the_listeners_reconnect_waits_double_to_their_bound_with_jitter() -> None:
    """Each wait is between half and all of its step; the steps double from the first bound
    to the second and stay there, however many attempts fail."""
    listener = pg_listener.PgListener(
        "", "ch", application_name="t", on_notify=lambda _: None, on_connected=lambda: None
    )
    listener.backoff = (0.05, 2.0)
    steps = {1: 0.05, 2: 0.1, 3: 0.2, 6: 1.6, 7: 2.0, 100: 2.0, 10_000: 2.0}
    for n, step in steps.items():
        delays = [listener.reconnect_delay(n) for _ in range(200)]
        assert all(step / 2 <= d <= step for d in delays), (n, min(delays), max(delays))
        assert len(set(delays)) > 1


async def test_wake_ups_are_sent_while_the_stores_pool_is_exhausted(pg_schema: str) -> None:
    """Every pooled connection is busy (long reads, a burst of appends): the wake-ups of the
    appends that already committed still go out, on the notifier's own connection."""
    async with replica(pg_schema) as writer, listening_raw(pg_schema) as listener:
        run = make_run()
        await writer.create_run(run)
        notifier = writer._notifier
        await notifier.idle()  # the run list's wake-up for the run (ADR 0140) is sent
        notifier.sends = 0
        send, gate, held = notifier._send, asyncio.Event(), asyncio.Event()

        async def held_send(payloads: list[str]) -> None:
            held.set()
            await gate.wait()
            await send(payloads)

        notifier._send = held_send  # type: ignore[method-assign]
        await writer.append(run.run_id, deltas(3))
        await held.wait()
        pool = writer._pool
        assert pool is not None
        busy = [await pool.getconn() for _ in range(pool.max_size)]
        try:
            gate.set()
            await received(listener, f"{run.run_id} 3")
            await notifier.idle()
            assert notifier.sends == 1 and notifier.given_up == 0
        finally:
            for conn in busy:
                await pool.putconn(conn)


async def test_a_store_closed_with_a_wake_up_pending_sends_it_and_leaves_nothing_running(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``close`` right after an append, inside the notifier's window: the wake-up is sent at
    once, before the store closes (not after the window, nor cancelled with it), and no task or
    warning is left behind."""
    caplog.set_level(logging.WARNING)
    async with listening_raw(pg_schema) as listener:
        async with replica(pg_schema) as writer:
            run = make_run()
            await writer.create_run(run)
            writer._notifier.window_s = 60.0  # the close, not the window, ends the wait
            await writer.append(run.run_id, deltas(2))
            await asyncio.sleep(0)  # the notifier's task is in its window
            assert notifier_tasks() and writer._notifier.sends == 0
        await received(listener, f"{run.run_id} 2")
    assert writer._notifier.sends == 1
    assert notifier_tasks() == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_store_closed_while_the_server_does_not_answer_its_wake_up_stops_anyway(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A wake-up whose send hangs when the store closes: ``close`` gives it ``within`` and
    cancels it (the readers elsewhere have their poll); nothing is left running and no error is
    logged, and a commit told after the close starts nothing."""
    caplog.set_level(logging.WARNING)
    writer = await PostgresStore.open(PG_URL, schema=pg_schema, pool_size=2)
    run = make_run()
    await writer.create_run(run)
    notifier = writer._notifier
    hung = asyncio.Event()

    async def never_answered(payloads: list[str]) -> None:
        hung.set()
        await asyncio.Event().wait()

    notifier._send = never_answered  # type: ignore[method-assign]
    await writer.append(run.run_id, deltas(1))
    await hung.wait()
    await notifier.close(within=0.05)
    await writer.close()
    notifier.committed(run.run_id, 2)
    assert notifier_tasks() == []
    assert notifier.sends == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


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
