"""A replica whose clock is off: on PostgreSQL every time the store keeps is the server's (ADR 0066,
0074).

The test process plays the replica: ``time.time`` is moved an hour behind or ahead, the
database's clock (``clock_timestamp()``, read on another connection) is the truth. Each time a
run's life stamps -- created, updated, claimed, closed, suspended, a key revoked -- must fall
between two readings of the server's clock; the lease and queue time an admission brings, an
event's stamp and a new key's creation keep their lengths on the server's clock; and a key's
quota counts the starts of replicas an hour apart in one minute.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from support.pg import PG_URL, pg_admin, pg_schema
from support.store_conformance import make_run

from thoughtgate.access.keys import create_key
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.orchestration.resume import read_resume_log
from thoughtgate.store.base import RunEnding
from thoughtgate.store.durable import Quota, RunSpecRecord
from thoughtgate.store.leases import Owner, orphan_reason, suspend
from thoughtgate.store.postgres import PostgresStore
from thoughtgate.store.records import ApiKeyRecord, RunRecord

__all__ = ["pg_admin", "pg_schema"]  # fixtures used by this module

pytestmark = pytest.mark.postgres

HOUR = 3600.0
EPS = 1e-3
"""Float slack when comparing a stored time with the server's clock read around it."""
CARRIED = 1.0
"""How far a time carried from the replica's clock may land from the exact one: the clocks'
difference is measured across one round trip on a loopback connection."""


class Replica:
    """This process as a replica whose ``time.time`` is ``skew`` seconds off."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.real = time.time

    def skewed(self, skew: float) -> None:
        real = self.real
        self.monkeypatch.setattr(time, "time", lambda: real() + skew)

    def fixed(self) -> None:
        self.monkeypatch.setattr(time, "time", self.real)


@pytest.fixture
def replica(monkeypatch: pytest.MonkeyPatch) -> Iterator[Replica]:
    yield Replica(monkeypatch)


@pytest.fixture
async def store(pg_schema: str) -> AsyncIterator[PostgresStore]:
    opened = await PostgresStore.open(PG_URL, schema=pg_schema)
    yield opened
    await opened.close()


async def server_now(admin: psycopg.AsyncConnection[Any]) -> float:
    row = await (await admin.execute("SELECT extract(epoch FROM clock_timestamp())")).fetchone()
    assert row is not None
    return float(row[0])


def between(value: float | None, low: float, high: float) -> bool:
    return value is not None and low - EPS <= value <= high + EPS


def admission(
    *, owner: str | None, lease_s: float | None, queued: bool, key_id: str = "k1"
) -> tuple[RunRecord, RunSpecRecord]:
    """A run and spec as the runtime builds them: times from this process's ``time.time``."""
    run = make_run(
        created_at=time.time(),
        tasks=1,
        owner=owner,
        lease_expires_at=None if lease_s is None else time.time() + lease_s,
    )
    spec = RunSpecRecord(
        run.run_id,
        {"version": 1, "tasks": [], "tools": []},
        key_id=key_id,
        durable=True,
        resume="queue" if queued else "manual",
        queue="q" if queued else None,
        queued_at=time.time() if queued else None,
    )
    return run, spec


@pytest.mark.parametrize("skew", [-HOUR, HOUR], ids=["an-hour-behind", "an-hour-ahead"])
async def test_a_runs_times_follow_the_servers_clock_not_the_replicas(
    store: PostgresStore,
    pg_admin: psycopg.AsyncConnection[Any],
    replica: Replica,
    skew: float,
) -> None:
    replica.skewed(skew)
    me = Owner.current()

    # Admitted, held by this replica: created now on the server, its lease 15 s from there.
    before = await server_now(pg_admin)
    run, spec = admission(owner=me.owner_id, lease_s=15.0, queued=False)
    assert (await store.admit_run(run, spec)).admitted
    after = await server_now(pg_admin)
    stored = await store.get_run(run.run_id)
    assert between(stored.created_at, before, after), (stored.created_at, before)
    assert between(stored.updated_at, before, after)
    assert stored.lease_expires_at is not None
    assert abs(stored.lease_expires_at - (before + 15.0)) < CARRIED + (after - before)
    assert (run.created_at, run.lease_expires_at) == (stored.created_at, stored.lease_expires_at)
    # So another replica's sweep (the server's clock) finds its lease running, not an hour gone.
    found = await store.open_runs()
    mine = next(r for r in found.runs if r.run_id == run.run_id)
    other = Owner("another-host", 1, "n")
    assert orphan_reason(mine, found.now, other) is None

    # Queued by this replica: queued now on the server.
    before = await server_now(pg_admin)
    queued, queued_spec = admission(owner=None, lease_s=None, queued=True)
    assert (await store.admit_run(queued, queued_spec)).admitted
    after = await server_now(pg_admin)
    got = await store.get_run_spec(queued.run_id)
    assert got is not None and got.queued_at is not None
    assert before - CARRIED <= got.queued_at <= after + CARRIED, (got.queued_at, before)
    assert between(got.created_at, before, after)

    # Changed: by an update, by an append that changes the index, by a claim.
    for change in (
        lambda: store.update_run(run.run_id, metadata={"k": "v"}),
        lambda: store.append(
            run.run_id,
            [NewEvent(EventType.TASK_STARTED, {"index": 0}, task_id=run.tasks[0].task_id)],
        ),
        lambda: store.claim_run(queued.run_id, me.owner_id, 15.0),
    ):
        before = await server_now(pg_admin)
        await change()
        after = await server_now(pg_admin)
        updated = max([(await store.get_run(r)).updated_at for r in (run.run_id, queued.run_id)])
        assert between(updated, before, after), (updated, before, after)

    # Closed.
    before = await server_now(pg_admin)
    await store.finish_run(run.run_id, [], RunEnding("completed"))
    after = await server_now(pg_admin)
    assert between((await store.get_run(run.run_id)).updated_at, before, after)

    # A key revoked.
    await store.save_api_key(ApiKeyRecord("key_1", "ci", "member", "hash-1"))
    before = await server_now(pg_admin)
    assert await store.revoke_api_key("key_1")
    after = await server_now(pg_admin)
    key = await store.get_api_key("key_1")
    assert key is not None and between(key.revoked_at, before, after)


async def test_a_keys_minute_counts_the_starts_of_replicas_an_hour_apart(
    store: PostgresStore, replica: Replica
) -> None:
    """Three starts a minute: one from a replica on time, one an hour behind, one an hour ahead;
    the fourth is refused whichever replica asks, and told to wait less than the minute -- the
    window is the server's minute, not any replica's."""
    quota = Quota("k1", max_open=100, max_per_minute=3)
    for skew in (0.0, -HOUR, HOUR):
        replica.skewed(skew)
        run, spec = admission(owner=None, lease_s=None, queued=False)
        assert (await store.admit_run(run, spec, quota=quota)).admitted, skew
    for skew in (0.0, -HOUR, HOUR):
        replica.skewed(skew)
        run, spec = admission(owner=None, lease_s=None, queued=False)
        refused = await store.admit_run(run, spec, quota=quota)
        assert not refused.admitted, skew
        assert 1.0 <= refused.retry_after <= 60.0, (skew, refused.retry_after)
        assert "3 runs in the last minute" in refused.reason
    replica.fixed()
    other, other_spec = admission(owner=None, lease_s=None, queued=False, key_id="k2")
    assert (await store.admit_run(other, other_spec, quota=Quota("k2", 100, 3))).admitted


@pytest.mark.parametrize("skew", [-HOUR, HOUR], ids=["an-hour-behind", "an-hour-ahead"])
async def test_events_a_suspension_and_a_new_key_are_stamped_on_the_servers_clock(
    store: PostgresStore,
    pg_admin: psycopg.AsyncConnection[Any],
    replica: Replica,
    skew: float,
) -> None:
    """ADR 0066 left these on the replica's clock; an hour off, a run's events read an hour
    before (or after) its creation, and a key's list put it an hour out of place."""
    replica.skewed(skew)
    me = Owner.current()
    task_id = lambda run: run.tasks[0].task_id  # noqa: E731

    # Events made by this replica: in an admission, an append, a run's end; a second apart.
    before = await server_now(pg_admin)
    run, spec = admission(owner=me.owner_id, lease_s=15.0, queued=False)
    opening = [NewEvent(EventType.RUN_STARTED, {})]
    assert (await store.admit_run(run, spec, events=opening)).admitted
    made = time.time()
    appended = await store.append(
        run.run_id,
        [
            NewEvent(EventType.TASK_STARTED, {"index": 0}, task_id=task_id(run), ts=made - 1.0),
            NewEvent(EventType.MESSAGE_DELTA, {"text": "a"}, task_id=task_id(run), ts=made),
        ],
    )
    await store.finish_run(run.run_id, [NewEvent(EventType.RUN_FAILED, {})], RunEnding("failed"))
    after = await server_now(pg_admin)
    events = await store.read(run.run_id)
    assert [e.ts for e in appended] == [e.ts for e in events[1:3]], "handed back as stored"
    for event in events:
        assert before - 1.0 - CARRIED <= event.ts <= after + CARRIED, (event.type, event.ts)
    assert events[2].ts - events[1].ts == pytest.approx(1.0), "the time between them kept"

    # A resume on this replica counts an approval's time left from when the server stamped the
    # request, on this replica's clock: an hour ahead it does not give up at once, an hour
    # behind it does not wait an hour more.
    asker, asker_spec = admission(owner=me.owner_id, lease_s=15.0, queued=False)
    assert (await store.admit_run(asker, asker_spec)).admitted
    asking = {"call_id": "c1", "tool": "t"}
    await store.append(
        asker.run_id,
        [NewEvent(EventType.TOOL_APPROVAL_REQUIRED, asking, task_id=task_id(asker))],
    )
    resumed = await read_resume_log(store, asker.run_id)
    asked_at = resumed.approval_asked_at(task_id(asker), "c1")
    assert asked_at is not None and abs(asked_at - time.time()) < CARRIED

    # A run suspended by this replica: since the server's now.
    held, held_spec = admission(owner=me.owner_id, lease_s=15.0, queued=False)
    assert (await store.admit_run(held, held_spec)).admitted
    assert await store.release_run(held.run_id, owner=me.owner_id, queue=False)
    before = await server_now(pg_admin)
    await suspend(store, held.run_id, "a test", queued=False, previous=me.owner_id)
    after = await server_now(pg_admin)
    since = (await store.get_run(held.run_id)).metadata["suspended"]["since"]
    assert between(since, before, after), (since, before)

    # A key created by this replica: created the server's now, and its record says so.
    before = await server_now(pg_admin)
    created = await create_key(store, name="ci", role="member")
    after = await server_now(pg_admin)
    stored = await store.get_api_key(created.record.key_id)
    assert stored is not None and stored.created_at == created.record.created_at
    assert before - CARRIED <= stored.created_at <= after + CARRIED, (stored.created_at, before)
    # Saved again (its role changed): it keeps its creation time.
    stored.role = "viewer"
    await store.save_api_key(stored)
    again = await store.get_api_key(stored.key_id)
    assert again is not None and (again.role, again.created_at) == ("viewer", stored.created_at)
    # A key created on time afterwards lists after it, whichever replica was off.
    replica.fixed()
    later = await create_key(store, name="ops", role="member")
    assert [k.key_id for k in await store.list_api_keys()] == [
        created.record.key_id,
        later.record.key_id,
    ]
