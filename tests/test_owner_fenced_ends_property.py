"""Any interleaving of claims, sweeps and ends by two processes: a run's end is recorded only by
the execution holding the run at that moment, at most once, and a refused end stores nothing
(ADR 0072). On the memory store and on a real SQLite file."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.durable_store_conformance import admitted
from support.store_backends import fresh_sqlite

from thoughtgate.errors import RunTakenOverError
from thoughtgate.events.schema import EventType, NewEvent, is_run_terminal
from thoughtgate.store.base import EventStore, Holder, RunEnding
from thoughtgate.store.durable import DurableRunStore
from thoughtgate.store.memory import MemoryStore

OWNERS = ("a.1.x", "b.2.y")
Step = tuple[str, str]
STEPS = st.lists(
    st.tuples(st.sampled_from(["claim", "sweep", "end"]), st.sampled_from(OWNERS)), max_size=12
)


async def check_interleaving(store: EventStore, steps: Sequence[Step]) -> None:
    """Play ``steps`` on a fresh run; each end is checked against the run as it stood."""
    assert isinstance(store, DurableRunStore)
    run_id = await admitted(store, durable=True)
    attempt: dict[str, int] = {}  # each process's last claim, as claim_run answered it
    for op, who in steps:
        if op == "claim":
            got = await store.claim_run(run_id, who, 30)
            if got is not None:
                attempt[who] = got
        elif op == "sweep":  # its lease expired: released to resume elsewhere
            holder = (await store.get_run(run_id)).owner
            if holder is not None:
                await store.release_run(run_id, owner=holder, queue=True)
        elif who in attempt:  # only a process that executed the run records its end
            run = await store.get_run(run_id)
            spec = await store.get_run_spec(run_id)
            assert spec is not None
            open_ = run.status in ("pending", "running")
            holds = run.owner == who and spec.attempts == attempt[who]
            end = NewEvent(EventType.RUN_INTERRUPTED, {"status": "interrupted", "reason": who})
            ending = RunEnding("interrupted", error=who, held_by=Holder(who, attempt[who]))
            try:
                out = await store.finish_run(run_id, [end], ending)
            except RunTakenOverError:
                assert open_ and not holds, "refused only an open run held by another"
                assert (await store.get_run(run_id)).status == run.status, "nothing stored"
            else:
                assert bool(out) == (open_ and holds), "ended exactly by its holder"
    terminal = [e for e in await store.read(run_id) if is_run_terminal(e.type)]
    assert len(terminal) <= 1
    if terminal:
        assert (await store.get_run(run_id)).error == terminal[0].payload["reason"]


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
