"""Runs the daemon executes in the background: start, shut down, and recover after a crash.

* ``start`` validates and records a run (the caller gets its id at once), then executes it in an
  asyncio task. Each run gets exactly the tools it named, from the daemon's registry.
* ``shutdown`` (SIGTERM, lifespan end) gives in-flight runs ``grace_s`` to finish, then cancels
  them; a cancelled run's recorder flushes what it buffered, and the run is closed with one
  ``run.interrupted`` event and status ``interrupted``. Appends are atomic in every store, so no
  event is ever half-written.
* ``recover`` (startup) closes runs that a previous daemon process on this host left ``pending``
  or ``running`` (it died with ``kill -9``, a crash or a power cut). A run carries the host and pid
  of the daemon that executes it, so a daemon never touches runs of another live process (another
  daemon on the same store, or a ``thoughtgate run`` in a terminal).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import logging
import os
import socket
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.errors import UsageError
from thoughtgate.events.catalogue import check_new_events
from thoughtgate.events.payloads import RunInterruptedPayload
from thoughtgate.events.schema import Event, EventType, NewEvent, is_run_terminal
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.records import RunRecord

__all__ = ["DAEMON_METADATA_KEY", "RunManager"]

log = logging.getLogger("thoughtgate.server")

DAEMON_METADATA_KEY = "daemon"
"""Run metadata ``{"daemon": {"host", "pid", "instance"}}``: who executes the run."""

_OPEN_STATUSES = frozenset({"pending", "running"})
_LIVE_INSTANCES: set[str] = set()
"""Managers alive in this process (several apps may share one store inside one process)."""


class RunManager:
    """Owns the background tasks of the runs this daemon process executes."""

    def __init__(self, runtime: Runtime, *, grace_s: float = 3.0) -> None:
        self.runtime = runtime
        self.grace_s = grace_s
        # A digest, not the name: run metadata is readable by every reader of the run.
        self.host = hashlib.sha256(socket.gethostname().encode("utf-8")).hexdigest()[:16]
        self.pid = os.getpid()
        self.instance = uuid.uuid4().hex
        _LIVE_INSTANCES.add(self.instance)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._last_seq: dict[str, int] = {}
        self._closing = False

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
        runtime.sinks = [*base.sinks, self._note_appended]
        return runtime

    async def _note_appended(self, events: Sequence[Event]) -> None:
        if events:
            self._last_seq[events[-1].run_id] = events[-1].seq

    async def check_models(self, models: Iterable[str | None]) -> None:
        """Build (and close) each model's provider once, so an unknown model is a 400 now
        instead of a failed run later. Only caller mistakes are reported here."""
        for model in {m for m in models if m}:
            try:
                provider = self.runtime.provider_factory(model)
            except UsageError:
                raise
            except Exception as exc:  # not the caller's fault; the run will say
                log.warning("cannot build a provider for %s yet: %s", model, exc)
                continue
            with contextlib.suppress(Exception):
                await provider.aclose()

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
        default = self.runtime.config.orchestration.default_model
        await self.check_models([request.model or default, *(t.model for t in request.tasks)])
        metadata: dict[str, Any] = {
            **request.metadata,
            DAEMON_METADATA_KEY: {"host": self.host, "pid": self.pid, "instance": self.instance},
        }
        request = RunRequest(
            request.prompt,
            model=request.model,
            chain_of_thought=request.chain_of_thought,
            worker_backend=request.worker_backend,
            tasks=request.tasks,
            system=request.system,
            metadata=metadata,
        )
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
        _LIVE_INSTANCES.discard(self.instance)
        grace = self.grace_s if grace_s is None else grace_s
        tasks = dict(self._tasks)
        if not tasks:
            return []
        if grace > 0:
            await asyncio.wait(tasks.values(), timeout=grace)
        pending = {rid: t for rid, t in tasks.items() if not t.done()}
        for task in pending.values():
            task.cancel()
        await asyncio.gather(*pending.values(), return_exceptions=True)
        interrupted = []
        for run_id in pending:
            if await self._mark_interrupted(run_id, "the daemon shut down", after=self._last_seq):
                interrupted.append(run_id)
        return interrupted

    async def _mark_interrupted(
        self, run_id: str, reason: str, *, after: dict[str, int] | None = None
    ) -> bool:
        """Append ``run.interrupted`` unless the run already ended; ``True`` when appended."""
        store = self.runtime.store
        cursor = (after or {}).get(run_id, 0)
        tail = await store.read(run_id, after=cursor)
        if any(is_run_terminal(e.type) for e in tail):
            return False
        run = await store.get_run(run_id)
        if run.status not in _OPEN_STATUSES:
            return False
        closing: RunInterruptedPayload = {"status": "interrupted", "reason": reason}
        events = [NewEvent(EventType.RUN_INTERRUPTED, closing)]
        check_new_events(events)
        await store.append(run_id, events)
        await store.update_run(run_id, status="interrupted", error=f"interrupted: {reason}")
        log.warning("run %s interrupted: %s", run_id, reason)
        return True

    # ------------------------------------------------------------------ recover
    def _left_by_dead_daemon(self, run: RunRecord) -> bool:
        owner = run.metadata.get(DAEMON_METADATA_KEY)
        if run.status not in _OPEN_STATUSES or not isinstance(owner, dict):
            return False
        if owner.get("host") != self.host or run.run_id in self._tasks:
            return False
        pid = owner.get("pid")
        if not isinstance(pid, int):
            return False
        if pid == self.pid:  # an earlier incarnation with our pid (a container restart)
            return owner.get("instance") not in _LIVE_INSTANCES
        return not _pid_alive(pid)

    async def recover(self, *, page: int = 200) -> list[str]:
        """Mark runs left open by a dead daemon process on this host as interrupted."""
        store = self.runtime.store
        recovered: list[str] = []
        offset = 0
        while True:
            runs = await store.list_runs(limit=page, offset=offset)
            for run in runs:
                if self._left_by_dead_daemon(run) and await self._mark_interrupted(
                    run.run_id, "the daemon executing it stopped unexpectedly"
                ):
                    recovered.append(run.run_id)
            if len(runs) < page:
                return recovered
            offset += page


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
