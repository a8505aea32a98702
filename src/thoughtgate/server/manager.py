"""Runs the daemon executes: start, resume, shut down, and pick up runs whose process is gone.

* ``start`` validates and records a run (the caller gets its id at once; a key over its quota
  gets ``QuotaExceededError``, a 429). Each run gets exactly the tools it named.
  - With durable runs (``orchestration.durable``, ADR 0013) the run goes on a work queue: the one
    this daemon listens to when it has the run's tools, else one whose replicas have them; any
    replica on that queue executes it, at most ``durability.concurrency`` at a time each.
  - Without, this daemon executes it in an asyncio task.
* ``shutdown`` (SIGTERM, lifespan end) gives in-flight runs ``grace_s`` to finish. Durable runs
  still executing then stop here and stay open: their leases are given up at once, so another
  replica (or this one, restarted) resumes them from their last completed step. Other runs are
  cancelled and closed ``interrupted``, their unfinished tasks first.
* ``recover`` (startup) and a periodic sweep handle runs whose executing process is gone -- a
  daemon or a ``thoughtgate run`` that died with ``kill -9``, a crash or a power cut, on this host
  or (once its lease expired) on any other (``store.leases``, ADR 0009): durable runs go back on
  their queue (or wait for ``resume``), others are closed. The sweep also refreshes this daemon's
  queue and deletes the checkpoints of ended runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.errors import StoreError, UsageError, chained, failure_detail, failure_text
from thoughtgate.orchestration.resume import check_resumable
from thoughtgate.orchestration.runtime import SUSPENDED, RunRequest, Runtime
from thoughtgate.store.durable import DurableRunStore, Quota, RunQueueRecord, RunSpecRecord
from thoughtgate.store.leases import SweepCursor, close_orphaned_runs, close_run_interrupted
from thoughtgate.store.records import OPEN_RUN_STATUSES, RunRecord

if TYPE_CHECKING:  # the engine imports DBOS: only a durable daemon loads it
    from thoughtgate.orchestration.durable import FinishedCursor

__all__ = ["SHUTDOWN_REASON", "START_CANCELLED", "RunManager"]

log = logging.getLogger("thoughtgate.server")

_ENDED = 4096
"""Runs whose mode ``RunManager.executed_mode`` remembers after their task here is over: the
streams and tickets that come for a run right after it ended find it without a read."""

SHUTDOWN_REASON = "the daemon shut down before it finished"

START_CANCELLED = "the request that started it was cancelled while it was being started"
"""The reason a run ends with when the request starting it is cancelled before the run is under
way (ADR 0082); a cancel during the daemon's shutdown says :data:`SHUTDOWN_REASON`."""

_NOT_STARTED = "it could not be started or queued: "

CLOSING_AT_SHUTDOWN_S = 5.0
"""How long after its grace a shutdown starts new tries to record the interruptions of the runs
it cancelled, while the store is unavailable (``close_run_interrupted`` retries; each run's own
retries overlap them). With the default 3 s grace and tries that fail fast (a lost PostgreSQL
connection), the daemon exits before a 10 s stop timeout (``docker stop``'s) kills it; a try
under way is not cut short (SQLite waits up to its busy timeout for another process's lock). A
run it could not close is left to the next sweep."""


class RunManager:
    """Owns the runs this daemon process executes."""

    finished_page = 500
    """Finished workflows a sweep looks at (``_forget_ended``): one page a sweep."""

    def __init__(
        self, runtime: Runtime, *, grace_s: float = 3.0, sweep_every_s: float | None = None
    ) -> None:
        self.runtime = runtime
        self.grace_s = grace_s
        # An expired lease is seen within one sweep: a dead process's runs close within
        # lease + sweep (25 s with the default 15 s lease).
        self.sweep_every_s = sweep_every_s or runtime.leases.ttl_s * 2 / 3
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._modes: dict[str, str] = {}
        """``chain_of_thought`` of each run in ``_tasks``, and of each durable run the engine
        started here at once until its execution is over (see ``executing_mode``)."""
        self._ended: dict[str, str] = {}
        """``chain_of_thought`` of the last ``_ENDED`` runs whose task here is over (see
        ``executed_mode``), oldest first."""
        self._stopped: dict[str, str] = {}
        """Why the execution here of each of the last ``_ENDED`` runs that stopped with a
        failure stopped (its public words): what the sweep that closes such a run, left open
        because its end could not be recorded, says of it (ADR 0149)."""
        self._refused: dict[str, None] = {}
        """The last ``_ENDED`` runs whose execution here stopped because the store refused a
        write (``stopped_by_store``, ADR 0151)."""
        self._refused_watchers: list[Callable[[str], None]] = []
        """Told each run added to ``_refused``: the live run lists (ADR 0151, amendment 2)."""
        self._closing = False
        self._sweeper: asyncio.Task[None] | None = None
        self._open_runs = SweepCursor()
        """Where the sweep's walk through the open runs stopped (ADR 0074)."""
        self._finished: FinishedCursor | None = None
        """Where the next listing of finished workflows begins (``_forget_ended``)."""

    @property
    def active(self) -> int:
        return len(self._tasks) + len(self.runtime.executing)

    @property
    def closing(self) -> bool:
        """True once shutdown began: no new runs are started."""
        return self._closing

    @property
    def tools(self) -> ToolRegistry:
        return self.runtime.tools

    @property
    def tool_names(self) -> list[str]:
        return [t.name for t in self.runtime.tools]

    @property
    def queue(self) -> str | None:
        """The work queue this daemon takes runs from (durable runs only)."""
        engine = self.runtime.durable
        return engine.queue if engine is not None else None

    # ------------------------------------------------------------------ start
    async def start(
        self,
        request: RunRequest,
        *,
        chain_of_thought: str | None = None,
        tools: Sequence[str] = (),
        key_id: str | None = None,
        early: bool = False,
    ) -> RunRecord:
        """Record the run and queue or start it; ``UsageError`` for bad requests and
        ``QuotaExceededError`` for a key over its limits.

        ``early`` (a run this daemon executes without the durable engine): its execution starts
        as soon as its admission is decided, while that commits (ADR 0040), for a caller that
        reads the run on the same request (``POST /v1/runs/follow``). A caller that comes back
        for the run with further requests leaves it ``False``: the provider's first delta would
        then often be ready before that caller is, and wait for it. Its execution starts once
        the admission committed, in the step that learns it where the store has one (SQLite's
        hand-off): the turn in which this call resumes, not the one after."""
        if self._closing:
            raise UsageError("the daemon is shutting down; start the run elsewhere or later")
        names = list(dict.fromkeys(tools))
        quotas = self.runtime.config.quotas
        quota = (
            Quota(key_id, quotas.max_open_runs_per_key, quotas.max_starts_per_minute_per_key)
            if key_id is not None and isinstance(self.runtime.store, DurableRunStore)
            else None
        )
        engine = self.runtime.durable
        if engine is None:
            started: list[asyncio.Task[None]] = []

            def execute(run: RunRecord) -> None:
                # ``early``: once the admission is decided, while it commits (ADR 0040): the
                # provider's stream opens a commit and two loop turns sooner. Its writes queue
                # behind the admission's; nobody learns of the run before ``admit`` returns.
                # Else once it committed, in the commit's hand-off (ADR 0091): the task's first
                # step runs in the turn this start resumes in, not in the turn after it.
                task = asyncio.create_task(self._execute(run.run_id), name=f"run {run.run_id}")
                started.append(task)
                self._tasks[run.run_id] = task
                task.add_done_callback(functools.partial(self._forget, run.run_id))

            try:
                run, _ = await self.runtime.admit(
                    request,
                    chain_of_thought=chain_of_thought,
                    tools=names,
                    key_id=key_id,
                    quota=quota,
                    decided=execute if early else None,
                    committed=None if early else execute,
                )
            except BaseException:
                # Its admission did not commit, or this start was cancelled once it had (the run
                # is then closed, ADR 0082): stop what it began.
                for task in started:
                    task.cancel()
                raise
            if not started:  # the store could not tell before this step: once committed
                execute(run)
            if run.run_id in self._tasks:
                self._modes[run.run_id] = run.chain_of_thought
            else:  # (its execution is over already)
                self._remember_ended(run.run_id, run.chain_of_thought)
            return run
        queue = await self._queue_for(names)
        run, rank = await self.runtime.admit(
            request,
            chain_of_thought=chain_of_thought,
            tools=names,
            key_id=key_id,
            quota=quota,
            queue=queue,
        )
        # Shielded: a cancel of this start (uvicorn's, of a request still under way when a
        # shutdown outlasts its grace; an embedding caller's) waits for the submit under way, so
        # that where it put the run is known, then ends the run there. A client's disconnect
        # cancels nothing: uvicorn lets the handler finish.
        submitting = asyncio.ensure_future(engine.submit(run.run_id, queue, priority=rank))
        try:
            execution = await asyncio.shield(submitting)
        except asyncio.CancelledError:
            await self._withdraw(run.run_id, submitting)
            raise
        except Exception as exc:
            await self._close_failed(run.run_id, _NOT_STARTED + failure_text(exc), exc)
            raise
        if execution is not None:  # started here: known as a plain run is (ADR 0086)
            self._executing(run.run_id, run.chain_of_thought, execution)
        return run

    def _executing(self, run_id: str, mode: str, execution: asyncio.Future[Any]) -> None:
        """A durable run this daemon started at once is ``executing_mode`` until ``execution``
        (the engine's, without a task of ours) is over, then ``executed_mode``."""

        def over(_: object) -> None:
            if self._modes.pop(run_id, None) is not None:
                self._remember_ended(run_id, mode)

        self._modes[run_id] = mode
        execution.add_done_callback(over)

    async def _withdraw(self, run_id: str, submitting: asyncio.Future[Any]) -> None:
        """End ``interrupted`` a new run whose start was cancelled while the durable engine
        placed it (ADR 0082): once the placing is over, wherever it put the run -- started here,
        waiting here, on a queue (``DurableEngine.withdraw``) -- with the shutdown's reason or
        :data:`START_CANCELLED`. Before, the run was left to the sweep: ``running`` or
        ``queued`` for up to several leases, and then put back on a queue and executed."""
        engine = self.runtime.durable
        assert engine is not None
        reason = SHUTDOWN_REASON if self._closing else START_CANCELLED
        await asyncio.wait([submitting])
        failure = submitting.exception() if not submitting.cancelled() else None
        if isinstance(failure, Exception):  # its start failed: closed as such
            await self._close_failed(run_id, _NOT_STARTED + failure_text(failure), failure)
            return
        log.warning("start of run %s cancelled; ending it: %s", run_id, reason)
        await engine.withdraw(run_id, reason)

    async def _close_failed(self, run_id: str, reason: str, failure: Exception) -> bool:
        """Close ``interrupted`` a run whose start or resume failed with ``failure``; whether it
        closed. A close that fails too (the store down past its retries; the sweep closes the
        run later, ADR 0062) is logged and added to ``failure`` as a note: the caller raises
        ``failure`` -- what went wrong first is what the client and the log must say, not the
        close's store error (ADR 0063). ``reason`` is public; ``failure``'s own words go to the
        run's developer-only ``error_detail`` (ADR 0073)."""
        try:
            await close_run_interrupted(
                self.runtime.store, run_id, reason, detail=failure_detail(failure)
            )
        except Exception as exc:
            log.error("could not close run %s after %s: %s", run_id, failure_text(failure), exc)
            failure.add_note(f"closing run {run_id} interrupted failed too: {exc!r}")
            return False
        return True

    async def _queue_for(self, names: Sequence[str]) -> str:
        """This daemon's queue when it has every tool, else a live queue whose replicas do."""
        own = self.queue
        assert own is not None
        mine = set(self.tool_names)
        if set(names) <= mine:
            return own
        store = self.runtime.store
        assert isinstance(store, DurableRunStore)
        fitting = [
            q
            for q in await store.list_run_queues(seen_within_s=3 * self.runtime.leases.ttl_s)
            if set(names) <= set(q.tools)
        ]
        if not fitting:
            missing = sorted(set(names) - mine)
            raise UsageError(
                f"unknown tool {missing[0]!r}: no replica of this service has it; tools on this "
                f"daemon: {', '.join(sorted(mine)) or 'none registered'}"
            )
        return min(fitting, key=lambda q: (len(q.tools), q.name)).name

    def executing_mode(self, run_id: str) -> str | None:
        """The ``chain_of_thought`` mode of a run this daemon started and is executing now
        (a durable one the engine started here at once too, ADR 0086), else ``None``.

        What a ticket or a live stream needs of such a run without reading it back (ADR 0028):
        it exists, it has not ended (its end is the last thing its task stores, so a stream
        opened now reaches the terminal event), and its mode, fixed at admission.
        """
        return self._modes.get(run_id)

    def executed_mode(self, run_id: str) -> str | None:
        """The ``chain_of_thought`` mode of one of the last runs this daemon executed (its task
        here is over), else ``None``.

        A run's mode is fixed at admission and a run is never deleted, so this never goes
        stale; what it does not say is whether the run has ended (a run left open at shutdown
        has not): a live stream learns that from the run's terminal event (ADR 0028, amended).
        """
        return self._ended.get(run_id)

    def _forget(self, run_id: str, task: asyncio.Task[None]) -> None:
        """``task``, ``run_id``'s execution here, is over: the run is no longer executing (found
        by its id, not by a scan of every run in flight)."""
        if self._tasks.get(run_id) is not task:
            return
        del self._tasks[run_id]
        mode = self._modes.pop(run_id, None)
        if mode is not None:
            self._remember_ended(run_id, mode)

    def _remember_ended(self, run_id: str, mode: str) -> None:
        self._ended[run_id] = mode
        if len(self._ended) > _ENDED:
            del self._ended[next(iter(self._ended))]

    async def _execute(self, run_id: str) -> None:
        try:
            await self.runtime.run_to_end(run_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # recorded as run.failed / run.error, or the runtime said not
            # its words may be a provider's, quoting reasoning: described, never quoted
            why = failure_text(exc)
            log.warning("run %s stopped: %s", run_id, why)
            self._stopped[run_id] = why
            if len(self._stopped) > _ENDED:
                del self._stopped[next(iter(self._stopped))]
            if any(isinstance(e, StoreError) for e in chained(exc)):
                self._refused[run_id] = None
                if len(self._refused) > _ENDED:
                    del self._refused[next(iter(self._refused))]
                for watcher in list(self._refused_watchers):
                    watcher(run_id)

    def stopped_by_store(self, run_id: str) -> bool:
        """Whether this daemon's execution of the run stopped because the store refused one of
        its writes (one of the last runs it executed): what the store still says of the run
        was true before that, and may say it is under way (ADR 0151)."""
        return run_id in self._refused

    def out_of_date(self, run: RunRecord) -> str | None:
        """The store's refusal word when ``run``'s record is out of date: it is still open,
        its execution here stopped on a refused write (:meth:`stopped_by_store`), and the store
        still refuses writes, so its end could not be recorded; else ``None``. What its view
        (``503``) and the run list (``record_out_of_date``) go by (ADR 0151)."""
        if run.status not in OPEN_RUN_STATUSES or run.run_id not in self._refused:
            return None
        return self.runtime.store.write_refusal()

    def watch_stopped_by_store(self, watcher: Callable[[str], None]) -> Callable[[], None]:
        """Call ``watcher`` with each run whose execution here stops on a refused write from
        now on (a live run list sends it again, marked); returns the function that stops it."""
        self._refused_watchers.append(watcher)
        return lambda: self._refused_watchers.remove(watcher)

    # ------------------------------------------------------------------ resume
    async def resume(self, run_id: str) -> RunRecord:
        """Continue a suspended durable run here (``thoughtgate resume`` / the web page)."""
        engine = self.runtime.durable
        store = self.runtime.store
        if engine is None or not isinstance(store, DurableRunStore) or self.queue is None:
            raise UsageError("this daemon does not run durable runs, so it resumes none")
        await check_resumable(
            store,
            await store.get_run(run_id),
            self.tool_names,
            hint="resume it where they are: thoughtgate resume RUN_ID --tools ...",
        )
        if not await store.release_run(run_id, owner=None, queue=True):
            raise UsageError(
                f"run {run_id!r} is not waiting to resume (it is executing or already queued)"
            )
        try:
            await engine.resume(run_id, self.queue)
        except Exception as exc:  # no workflow to resume: its checkpoints are gone
            reason = f"it could not resume: {failure_text(exc)}"
            closed = await self._close_failed(run_id, reason, exc)
            outcome = "it was closed" if closed else "closing it failed too (a sweep takes it up)"
            raise UsageError(f"run {run_id!r} {reason}; {outcome}") from exc
        return await store.get_run(run_id)

    # ------------------------------------------------------------------ stop
    async def shutdown(self, grace_s: float | None = None) -> list[str]:
        """Let in-flight runs finish for ``grace_s``; then durable runs stop here to resume
        elsewhere and the others are interrupted. Returns the ids of the interrupted runs."""
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        grace = self.grace_s if grace_s is None else grace_s
        await self._suspend_durable(grace)
        tasks = dict(self._tasks)
        if not tasks:
            return []
        if grace > 0:
            await asyncio.wait(tasks.values(), timeout=grace)
        pending = {rid: t for rid, t in tasks.items() if not t.done()}
        for task in pending.values():
            task.cancel(SHUTDOWN_REASON)
        deadline = time.monotonic() + CLOSING_AT_SHUTDOWN_S
        await asyncio.gather(*pending.values(), return_exceptions=True)
        # The runtime closed each cancelled run; this catches a run cancelled before its
        # execution began, or one whose close the store refused until now (closing twice is a
        # no-op). Together, so that one deadline bounds them all.
        closed = await asyncio.gather(*(self._close_at_shutdown(r, deadline) for r in pending))
        return [run_id for run_id, interrupted in zip(pending, closed, strict=True) if interrupted]

    async def _close_at_shutdown(self, run_id: str, deadline: float) -> bool:
        """Close a run cancelled at shutdown, trying until ``deadline``; whether it ended
        interrupted (it may have ended otherwise just before)."""
        store = self.runtime.store
        try:
            await close_run_interrupted(store, run_id, SHUTDOWN_REASON, deadline=deadline)
            status = (await store.get_run(run_id)).status
        except Exception as exc:  # the store is down: the next process's sweep closes it
            log.warning("could not close run %s: %s", run_id, exc)
            return False
        if status != "interrupted":
            return False
        log.warning("run %s interrupted: %s", run_id, SHUTDOWN_REASON)
        return True

    async def _suspend_durable(self, grace: float) -> None:
        """Durable runs still executing after ``grace`` stop here, open; their leases end now,
        so the next sweep of any replica (or this daemon's restart) resumes them."""
        if self.runtime.durable is None:
            return
        # A workflow DBOS started a moment ago is not among the executions yet: it stops as it
        # begins, open, and is resumed elsewhere once its lease runs out (ADR 0090).
        self.runtime.refuse_executions(SUSPENDED)
        try:  # runs waiting here go on the queue (ADR 0031)
            await self.runtime.durable.stop_starting()
        except Exception as exc:  # they stay held by this process: the lease sweep takes them
            log.warning("could not put the runs waiting here on the queue: %s", exc)
        executing = self.runtime.workflow_tasks()
        if executing and grace > 0:
            await asyncio.wait(executing.values(), timeout=grace)
        stopped = [run_id for run_id, task in executing.items() if not task.done()]
        for run_id in stopped:
            self.runtime.cancel(run_id, SUSPENDED)
        if stopped:
            await asyncio.wait([executing[r] for r in stopped], timeout=5)
        if stopped:
            with contextlib.suppress(Exception):
                owner = self.runtime.leases.owner.owner_id
                await self.runtime.store.renew_leases(owner, 0.0, stopped)
            log.warning("left %d durable run(s) to resume elsewhere", len(stopped))

    # ------------------------------------------------------------------ recover
    async def recover(self) -> list[str]:
        """Resume or close runs whose executing process is gone (startup, then every
        ``sweep_every_s``); returns the ids of the runs closed."""
        engine = self.runtime.durable
        closed = await close_orphaned_runs(
            self.runtime.store,
            me=self.runtime.leases.owner,
            requeue=self._requeue if engine is not None else None,
            executing=self.runtime.leases,
            on_queue=engine.on_queue if engine is not None else None,
            lost_after_s=self.runtime.leases.ttl_s,
            cursor=self._open_runs,
            stopped=self._stopped,
        )
        if engine is not None:
            await self._heartbeat()
            with contextlib.suppress(Exception):
                await self._forget_ended()
            with contextlib.suppress(Exception):
                await engine.tidy()
        return closed

    async def _requeue(self, run_id: str, spec: RunSpecRecord) -> None:
        """Back on a queue whose replicas have the run's tools (this daemon's when it has them);
        on its old queue when no live replica has them (it waits for one)."""
        engine = self.runtime.durable
        assert engine is not None
        try:
            queue = await self._queue_for(list(spec.spec.get("tools", ())))
        except UsageError:
            queue = spec.queue or ""
        if not queue:
            raise UsageError("no work queue can take it")
        await engine.resume(run_id, queue)

    async def _heartbeat(self) -> None:
        """Tell the other replicas which queue this daemon takes runs from, with its tools."""
        store = self.runtime.store
        if self.queue is not None and isinstance(store, DurableRunStore):
            concurrency = self.runtime.config.durability.concurrency
            await store.save_run_queue(
                RunQueueRecord(self.queue, tuple(self.tool_names), concurrency)
            )

    async def _forget_ended(self) -> None:
        """Delete the workflows of runs that ended: their checkpoints may hold carriers and tool
        results, which have no use once the run is over. Not those of runs still open: a
        workflow can end before its run (its claim failed, ADR 0065), and the run resumes from
        its checkpoints once it is put back on a queue.

        One page of finished workflows a sweep, each sweep the next (ADR 0074): DBOS lists them
        oldest first, and a first page of workflows kept for open runs would otherwise hide
        every later one for good. Which of them belong to open runs is asked of the store by
        id, whatever the number of open runs."""
        engine = self.runtime.durable
        assert engine is not None
        page = await engine.finished_workflows(after=self._finished, limit=self.finished_page)
        self._finished = page.next
        if page.ids:
            found = await self.runtime.store.open_runs(run_ids=page.ids, limit=len(page.ids))
            still_open = {run.run_id for run in found.runs}
            await engine.forget([run_id for run_id in page.ids if run_id not in still_open])

    def start_sweeping(self) -> None:
        """Sweep periodically while the daemon runs, so a dead process's runs resume in time."""
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
                log.warning("could not pick up runs left by a stopped process: %s", exc)
