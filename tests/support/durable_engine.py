"""A durable runtime in the test's own process, as a daemon holds one: the runtime, the DBOS
engine attached to it, and runs started the way the daemon starts them (admitted for its queue,
then submitted), so a test can stop between the steps a daemon takes in one go.

The tests' daemons differ only in what they are given -- the config, the tools, the store (a
wrapper that refuses some writes, on SQLite or PostgreSQL) -- and, for the sweeps' tests, a
:class:`SweepingDaemon`'s run manager; one class each, so a change to how a daemon puts these
together is made once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.orchestration.durable import DurableEngine
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.server.manager import RunManager
from thoughtgate.store.base import EventStore

StoreT = TypeVar("StoreT", bound=EventStore)
DaemonT = TypeVar("DaemonT", bound="SweepingDaemon[Any]")


class InProcessDaemon(Generic[StoreT]):
    """The runtime and engine of a daemon on ``store``; ``tools`` are the runs' tools (none by
    default). The engine is launched by the test (``engine.launch``), which says what it
    listens to."""

    def __init__(self, store: StoreT, config: Config, *, tools: ToolRegistry | None = None) -> None:
        self.store = store
        self.runtime = Runtime(store, config, tools=tools)
        self.engine = DurableEngine.attach(self.runtime, config.durability)

    @property
    def queue(self) -> str:
        assert self.engine.queue is not None, "the engine is not launched"
        return self.engine.queue

    async def start(self, model: str) -> str:
        """A run of one prompt on ``model``, admitted and submitted as ``POST /runs`` does."""
        run, rank = await self.runtime.admit(RunRequest("hi", model=model), queue=self.queue)
        await self.engine.submit(run.run_id, self.queue, priority=rank)
        return run.run_id

    async def types(self, run_id: str) -> list[str]:
        return [str(e.type) for e in await self.store.read(run_id)]

    async def ended(self, run_id: str) -> bool:
        return (await self.store.get_run(run_id)).status not in ("pending", "running")

    async def close(self) -> None:
        """Close the engine, then the store."""
        await self.engine.close()
        await self.store.close()


class SweepingDaemon(InProcessDaemon[StoreT]):
    """An :class:`InProcessDaemon` with the daemon's run manager, whose sweeps a test starts
    (``manager.start_sweeping``) or whose requeue it calls; no grace at its shutdown."""

    def __init__(self, store: StoreT, config: Config, *, tools: ToolRegistry | None = None) -> None:
        super().__init__(store, config, tools=tools)
        self.manager = RunManager(self.runtime, grace_s=0)

    async def stop(self) -> None:
        """Shut the manager down (its sweeps too), then close the engine; not the store."""
        await self.manager.shutdown()
        await self.engine.close()


@contextlib.asynccontextmanager
async def launched(
    store: StoreT, launch: Callable[[StoreT], Awaitable[DaemonT]]
) -> AsyncIterator[DaemonT]:
    """The daemon ``launch`` makes on ``store``, stopped and the store closed afterwards (the
    sweep tests' fixtures, one per backend)."""
    try:
        daemon = await launch(store)
        try:
            yield daemon
        finally:
            await daemon.stop()
    finally:
        await store.close()
