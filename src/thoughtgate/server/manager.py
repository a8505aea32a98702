"""Runs the daemon executes in the background: start, shut down, and close runs nobody executes.

* ``start`` validates and records a run (the caller gets its id at once), then executes it in an
  asyncio task. Each run gets exactly the tools it named, from the daemon's registry.
* ``shutdown`` (SIGTERM, lifespan end) gives in-flight runs ``grace_s`` to finish, then cancels
  them; the runtime closes a cancelled run's unfinished tasks and then the run, with
  ``task.completed`` (status ``interrupted``) and one ``run.interrupted`` event. Appends are atomic
  in every store, so no event is ever half-written.
* ``recover`` (startup) and a periodic sweep close runs whose executing process is gone -- a
  daemon or a ``thoughtgate run`` that died with ``kill -9``, a crash or a power cut, on this host
  or (once its lease expired) on any other (``store.leases``, ADR 0009). Runs of live processes,
  whose leases are renewed, are never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Sequence

from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.errors import UsageError
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.leases import close_orphaned_runs, close_run_interrupted
from thoughtgate.store.records import RunRecord

__all__ = ["SHUTDOWN_REASON", "RunManager"]

log = logging.getLogger("thoughtgate.server")

SHUTDOWN_REASON = "the daemon shut down before it finished"


class RunManager:
    """Owns the background tasks of the runs this daemon process executes."""

    def __init__(
        self, runtime: Runtime, *, grace_s: float = 3.0, sweep_every_s: float | None = None
    ) -> None:
        self.runtime = runtime
        self.grace_s = grace_s
        # An expired lease is seen within one sweep: a dead process's runs close within
        # lease + sweep (25 s with the default 15 s lease).
        self.sweep_every_s = sweep_every_s or runtime.leases.ttl_s * 2 / 3
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closing = False
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def active(self) -> int:
        return len(self._tasks)

    @property
    def closing(self) -> bool:
        """True once shutdown began: no new runs are started."""
        return self._closing

    @property
    def tools(self) -> ToolRegistry:
        return self.runtime.tools

    # ------------------------------------------------------------------ start
    def _runtime_for(self, tool_names: Sequence[str]) -> Runtime:
        """A runtime sharing everything with the daemon's, but holding only the named tools."""
        base = self.runtime
        chosen = ToolRegistry()
        for name in tool_names:
            found = base.tools.get(name)
            if found is None:
                known = ", ".join(t.name for t in base.tools) or "none registered"
                raise UsageError(f"unknown tool {name!r}; tools on this daemon: {known}")
            if chosen.get(name) is None:
                chosen.add(found)
        # A shallow copy keeps everything else the daemon's runtime was built with (provider
        # factory, approvals broker, observers, sinks, whatever it grows later).
        runtime = copy.copy(base)
        runtime.tools = chosen
        return runtime

    async def start(
        self,
        request: RunRequest,
        *,
        chain_of_thought: str | None = None,
        tools: Sequence[str] = (),
    ) -> RunRecord:
        """Record the run and start executing it; raises ``UsageError`` for bad requests."""
        if self._closing:
            raise UsageError("the daemon is shutting down; start the run elsewhere or later")
        runtime = self._runtime_for(tools)
        run = await runtime.create_run(request, chain_of_thought=chain_of_thought)
        task = asyncio.create_task(self._execute(runtime, run.run_id), name=f"run {run.run_id}")
        self._tasks[run.run_id] = task
        task.add_done_callback(self._forget)
        return run

    def _forget(self, task: asyncio.Task[None]) -> None:
        for run_id, known in list(self._tasks.items()):
            if known is task:
                del self._tasks[run_id]

    async def _execute(self, runtime: Runtime, run_id: str) -> None:
        try:
            await runtime.execute(run_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # already recorded as run.failed / run.error
            log.warning("run %s ended with %s: %s", run_id, type(exc).__name__, exc)

    # ------------------------------------------------------------------ stop
    async def shutdown(self, grace_s: float | None = None) -> list[str]:
        """Let in-flight runs finish for ``grace_s``, then interrupt the rest; returns their ids."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        grace = self.grace_s if grace_s is None else grace_s
        tasks = dict(self._tasks)
        if not tasks:
            return []
        if grace > 0:
            await asyncio.wait(tasks.values(), timeout=grace)
        pending = {rid: t for rid, t in tasks.items() if not t.done()}
        for task in pending.values():
            task.cancel(SHUTDOWN_REASON)
        await asyncio.gather(*pending.values(), return_exceptions=True)
        interrupted = []
        for run_id in pending:
            # The runtime closed each cancelled run; this only catches a run cancelled before
            # its execution began (closing twice is a no-op).
            try:
                await close_run_interrupted(self.runtime.store, run_id, SHUTDOWN_REASON)
                status = (await self.runtime.store.get_run(run_id)).status
            except Exception as exc:  # the store is down: the next process's sweep closes it
                log.warning("could not close run %s: %s", run_id, exc)
                continue
            if status == "interrupted":
                log.warning("run %s interrupted: %s", run_id, SHUTDOWN_REASON)
                interrupted.append(run_id)
        return interrupted

    # ------------------------------------------------------------------ recover
    async def recover(self) -> list[str]:
        """Close runs whose executing process is gone (startup, then every ``sweep_every_s``)."""
        return await close_orphaned_runs(self.runtime.store, me=self.runtime.leases.owner)

    def start_sweeping(self) -> None:
        """Sweep periodically while the daemon runs, so a dead process's runs close in time."""
        if self._sweeper is None and not self._closing:
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep_forever(), name="thoughtgate orphaned-run sweep"
            )

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_every_s)
            try:
                await self.recover()
            except Exception as exc:  # the store is down: try again next time
                log.warning("could not close runs left open by a stopped process: %s", exc)
