"""Runs that end outside their own execution still reach the observers (telemetry).

A run can be ended by code other than the task executing it: a daemon shutting down closes runs
whose execution never began, and a lease sweep (ADR 0009) closes runs whose process is gone. The
log hands every committed batch to its observers, so telemetry ends those runs' spans too; a
side door that appended past them would leave each such run's trace open forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from support.store_conformance import dead_pid

from thoughtgate.events.schema import Event, EventType
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.providers.base import TurnRequest
from thoughtgate.server.manager import SHUTDOWN_REASON, RunManager
from thoughtgate.store.base import EventStore
from thoughtgate.store.leases import EXPIRED, GONE, Owner
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.telemetry import TelemetrySink
from thoughtgate.testing.fake import FakeProvider, text


async def _never(request: TurnRequest, turn: int) -> AsyncIterator[Any]:
    await asyncio.sleep(30)
    yield text("never")


class Watch:
    """An observer that keeps every event it is handed."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.seen: dict[str, asyncio.Event] = {}

    async def __call__(self, events: Sequence[Event]) -> None:
        self.events.extend(events)
        for event in events:
            self.seen.setdefault(event.type, asyncio.Event()).set()

    async def wait_for(self, event_type: str) -> None:
        await asyncio.wait_for(self.seen.setdefault(event_type, asyncio.Event()).wait(), 10)

    def types(self, run_id: str) -> list[str]:
        return [e.type for e in self.events if e.run_id == run_id]


class Traced:
    """A runtime whose sinks are telemetry (into memory) and a watch."""

    def __init__(self, store: EventStore) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.watch = Watch()
        self.runtime = Runtime(
            store,
            provider_factory=lambda m: FakeProvider(_never, model=m),
            sinks=[TelemetrySink(provider), self.watch],
        )

    def root_span(self, run_id: str) -> ReadableSpan:
        """The run's finished root span (``thoughtgate.run.status`` is set when the run ends)."""
        roots = [
            s
            for s in self.exporter.get_finished_spans()
            if s.attributes is not None
            and s.attributes.get("thoughtgate.run.id") == run_id
            and "thoughtgate.run.status" in s.attributes
        ]
        assert len(roots) == 1, f"the run's trace was never ended: {roots}"
        return roots[0]


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[EventStore]:
    opened: EventStore = (
        MemoryStore() if request.param == "memory" else await SQLiteStore.open(tmp_path / "t.db")
    )
    yield opened
    await opened.close()


@pytest.mark.parametrize("when", ["before it began", "while it executed"])
async def test_a_run_interrupted_at_shutdown_ends_its_trace(store: EventStore, when: str) -> None:
    traced = Traced(store)
    manager = RunManager(traced.runtime, grace_s=0)
    run = await manager.start(RunRequest("wait", model="fake:slow"))
    if when == "while it executed":  # the runtime closes the run as its task is cancelled
        await traced.watch.wait_for(EventType.TASK_STARTED)
    # else: shut down before the run's task got to execute; the manager itself closes the run
    assert await manager.shutdown() == [run.run_id]
    assert traced.watch.types(run.run_id)[-2:] == [
        EventType.TASK_COMPLETED,
        EventType.RUN_INTERRUPTED,
    ]
    assert traced.watch.events[-1].payload["reason"] == SHUTDOWN_REASON
    span = traced.root_span(run.run_id)
    assert span.attributes is not None
    assert span.attributes["thoughtgate.run.status"] == "interrupted"
    assert span.status.status_code is StatusCode.ERROR


@pytest.mark.parametrize("lost", ["process gone", "lease expired"])
async def test_a_run_closed_by_the_lease_sweep_ends_its_trace(store: EventStore, lost: str) -> None:
    traced = Traced(store)
    runtime = traced.runtime
    me = runtime.leases.owner
    # The run was started by an executor that is gone: a dead process on this host, or one on
    # another host that stopped renewing its lease.
    if lost == "process gone":
        runtime.leases.owner = Owner(me.host, dead_pid(), "gone")
    else:
        runtime.leases.owner = Owner("elsewhere", 1, "far")
    run = await runtime.create_run(RunRequest("orphan", model="fake:slow"))
    if lost == "lease expired":
        await store.renew_leases(runtime.leases.owner.owner_id, -1.0, [run.run_id])
    runtime.leases.owner = me
    manager = RunManager(runtime, grace_s=0)

    assert await manager.recover() == [run.run_id]
    assert traced.watch.types(run.run_id) == [
        EventType.RUN_STARTED,
        EventType.CAPABILITY_RESOLVED,
        EventType.TASK_COMPLETED,
        EventType.RUN_INTERRUPTED,
    ]
    assert traced.watch.events[-1].payload["reason"] == (
        GONE if lost == "process gone" else EXPIRED
    )
    span = traced.root_span(run.run_id)
    assert span.attributes is not None
    assert span.attributes["thoughtgate.run.status"] == "interrupted"
