"""A durable runtime in the test's own process, as a daemon holds one: the runtime, the DBOS
engine attached to it, and runs started the way the daemon starts them (admitted for its queue,
then submitted), so a test can stop between the steps a daemon takes in one go.

The runtime and engine are put together as the product does it (``make_durable``, the call of
``thoughtgate serve``, ``run`` and the MCP server), and launched as the daemon's start-up does
(listening for the runs of its tools): a test that builds them by hand would go on testing its own
wiring after the product's changed. The tests' daemons differ only in what they are given -- the
config, the tools, the store (a wrapper that refuses some writes, on SQLite or PostgreSQL) --
and, for the sweeps' tests, a :class:`SweepingDaemon`'s run manager; one class each, so a change
to how a daemon puts these together is made once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, Literal, TypeVar

from thoughtgate.config import Config
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.orchestration.durability import make_durable
from thoughtgate.orchestration.durable import DurableEngine
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.server.manager import RunManager
from thoughtgate.store.base import EventStore

StoreT = TypeVar("StoreT", bound=EventStore)
DaemonT = TypeVar("DaemonT", bound="InProcessDaemon[EventStore]")
SweepingT = TypeVar("SweepingT", bound="SweepingDaemon[Any]")
Like = Literal["serve", "run"]
"""How a process launches its engine: ``serve`` listens for the queue of its tools (a daemon's
start-up); ``run`` takes nothing from any queue and executes its own runs only."""


class InProcessDaemon(Generic[StoreT]):
    """The runtime and engine of a daemon on ``store``; ``tools`` are the runs' tools (none by
    default). The engine is launched by the test (:meth:`launch`), or by :meth:`launched`
    around a block."""

    def __init__(self, store: StoreT, config: Config, *, tools: ToolRegistry | None = None) -> None:
        self.store = store
        self.runtime = Runtime(store, config, tools=tools)
        engine = make_durable(self.runtime)
        assert engine is not None, "durable runs are off in this config, or the store keeps none"
        self.engine: DurableEngine = engine

    async def launch(self, *, like: Like = "serve") -> None:
        """Launch the engine as ``thoughtgate serve``'s start-up does (listening for the queue of
        the runtime's tools), or as ``thoughtgate run`` does (``like="run"``)."""
        listen = [t.name for t in self.runtime.tools] if like == "serve" else None
        await self.engine.launch(listen=listen)

    @classmethod
    @contextlib.asynccontextmanager
    async def launched(
        cls: type[DaemonT],
        store: EventStore,
        config: Config,
        *,
        tools: ToolRegistry | None = None,
        like: Like = "serve",
    ) -> AsyncIterator[DaemonT]:
        """A daemon on ``store``, launched (:meth:`launch`) for the block, closed after it with
        its store (:meth:`close`)."""
        daemon = cls(store, config, tools=tools)
        try:
            await daemon.launch(like=like)
            yield daemon
        finally:
            await daemon.close()

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

    async def close(self) -> None:
        """Shut the manager down, close the engine, then the store."""
        await self.stop()
        await self.store.close()


@contextlib.asynccontextmanager
async def launched_by(
    store: StoreT, launch: Callable[[StoreT], Awaitable[SweepingT]]
) -> AsyncIterator[SweepingT]:
    """The sweeping daemon ``launch`` makes on ``store`` (a test's own subclass, launched its
    way), closed with the store afterwards -- the sweep tests' fixtures, one per backend. The
    engine and the store are closed even when ``launch`` fails, so the next test of this
    process can attach its own (one engine a process)."""
    try:
        daemon = await launch(store)
    except BaseException:
        engine = DurableEngine.current
        if engine is not None and engine.runtime.store is store:
            await engine.close()
        await store.close()
        raise
    try:
        yield daemon
    finally:
        await daemon.close()
