"""Any interleaving of claims, sweeps and appends by two processes: an execution's events are
stored exactly while it holds the open run, so no event of a superseded attempt lands after the
claim that superseded it (ADR 0090). On the memory store and on a real SQLite file, where a
burst of appends in flight at once is merged into one write (ADR 0030)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.durable_store_conformance import admitted
from support.store_backends import fresh_sqlite

from thoughtgate.errors import RunClosedError, RunTakenOverError
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.store.base import EventStore, Holder, RunEnding
from thoughtgate.store.durable import DurableRunStore
from thoughtgate.store.memory import MemoryStore

OWNERS = ("a.1.x", "b.2.y")
Step = tuple[str, tuple[str, ...]]
STEPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["claim", "sweep", "end"]), st.tuples(st.sampled_from(OWNERS))),
        st.tuples(st.just("append"), st.lists(st.sampled_from(OWNERS), min_size=1, max_size=4)),
    ).map(lambda s: (s[0], tuple(s[1]))),
    max_size=14,
)
"""``append`` with several processes: their appends in flight together, in that order."""


async def check_interleaving(store: EventStore, steps: Sequence[Step]) -> None:
    """Play ``steps`` on a fresh run; each append is checked against the run as it stood, and
    then every stored event against the holder of the run when it was stored."""
    assert isinstance(store, DurableRunStore)
    run_id = await admitted(store, durable=True)
    attempt: dict[str, int] = {}  # each process's last claim, as claim_run answered it
    holders: list[tuple[int, Holder | None]] = [(0, None)]  # from which seq on, who held it
    for op, who in steps:
        last = (await store.get_run(run_id)).status
        if op == "claim":
            got = await store.claim_run(run_id, who[0], 30)
            if got is not None:
                attempt[who[0]] = got
                holders.append((await last_seq(store, run_id), Holder(who[0], got)))
        elif op == "sweep":  # its lease expired: released to resume elsewhere
            owner = (await store.get_run(run_id)).owner
            if owner is not None and await store.release_run(run_id, owner=owner, queue=True):
                holders.append((await last_seq(store, run_id), None))
        elif op == "end" and who[0] in attempt:
            held = Holder(who[0], attempt[who[0]])
            with contextlib.suppress(RunTakenOverError):  # ADR 0072's property: not checked
                await store.finish_run(run_id, [], RunEnding("failed", held_by=held))
        elif op == "append":
            await check_burst(
                store, run_id, last, holders[-1][1], [w for w in who if w in attempt], attempt
            )
    for event in await store.read(run_id):
        holder = next(h for since, h in reversed(holders) if since < event.seq)
        assert holder is not None, "nothing is stored while nobody holds the run"
        assert event.payload["by"] == [holder.owner, holder.attempt], "only the holder's events"


async def check_burst(
    store: EventStore,
    run_id: str,
    status: str,
    holder: Holder | None,
    who: list[str],
    attempt: dict[str, int],
) -> None:
    """The appends of ``who`` in flight at once, each as its process's last claim: stored
    exactly when that execution holds the open run, else refused and nothing of it stored."""
    mine = [Holder(w, attempt[w]) for w in who]
    batches = [
        [NewEvent(EventType.MESSAGE_DELTA, {"text": "t", "by": [h.owner, h.attempt]})] for h in mine
    ]
    results = await asyncio.gather(
        *(store.append(run_id, b, held_by=h) for b, h in zip(batches, mine, strict=True)),
        return_exceptions=True,
    )
    open_ = status in ("pending", "running")
    for h, result in zip(mine, results, strict=True):
        if not open_:
            assert isinstance(result, RunClosedError)
        elif h == holder:
            assert isinstance(result, list) and len(result) == 1
        else:
            assert isinstance(result, RunTakenOverError), "a superseded attempt is refused"


async def last_seq(store: EventStore, run_id: str) -> int:
    events = await store.read(run_id)
    return events[-1].seq if events else 0


@pytest.mark.unit
@settings(max_examples=150, deadline=None)
@given(steps=STEPS)
async def test_any_interleaving_on_the_memory_store(steps: list[Step]) -> None:
    await check_interleaving(MemoryStore(), steps)


@pytest.mark.inprocess
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
async def test_any_interleaving_on_sqlite(steps: list[Step]) -> None:
    async with fresh_sqlite() as store:
        await check_interleaving(store, steps)
