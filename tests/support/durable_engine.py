"""A durable runtime in the test's own process, as a daemon holds one: the runtime, the DBOS
engine attached to it, and runs started the way the daemon starts them (admitted for its queue,
then submitted), so a test can stop between the steps a daemon takes in one go."""

from __future__ import annotations

from thoughtgate.config import Config
from thoughtgate.orchestration.durable import DurableEngine
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.sqlite import SQLiteStore


class InProcessDaemon:
    def __init__(self, store: SQLiteStore, config: Config) -> None:
        self.store = store
        self.runtime = Runtime(store, config)
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
