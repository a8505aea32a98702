"""Run leases: which process executes each open run, and closing runs whose process is gone.

The decision and its trade-offs are in ADR 0009. In short:

* A process that executes runs is an **owner**, named ``<host>.<pid>.<nonce>``: ``host`` is a
  digest of the host name, boot id and pid namespace (so two containers, or one machine before
  and after a reboot, never look like the same host), ``nonce`` is new for every process start
  (so a restarted container that gets the same pid is still told apart from its predecessor).
* While a run is open its row names its owner and a **lease expiry**; the owner renews the
  leases of the runs it executes (not of every open run it started: ADR 0060) in one statement
  every third of the lease's length (``orchestration.leases.LeaseKeeper``).
* A run is **orphaned** when its lease has expired on the store's clock, or, sooner, when its
  owner ran on this host and that process is gone (its pid is dead, or it is this process's pid
  but an earlier start). A run with no owner is executed by nobody and is left alone. A process
  renews only the runs it executes, so a run of its own it stopped executing without recording
  its end is orphaned too once its lease expires -- for its own sweep as for any other
  (ADR 0060).
* :func:`close_orphaned_runs` closes each orphan in one transaction: every unfinished task gets
  ``task.completed`` with status ``interrupted``, then the run gets ``run.interrupted``. It ends
  it with ``RunEnding(lease_expired_by=...)``, so a run whose owner renewed in the meantime is
  left alone and two processes sweeping at once never both close it. Every process sweeps when it
  opens the store (``open_store``); a daemon also sweeps periodically.
* Every other close (a cancel, a shutdown, a run that cannot resume) tries a briefly unavailable
  store again, a few times over a few seconds (``CLOSE_RETRY``, ADR 0059): the sweep is the
  backstop, not the way a run is expected to end. A close that gives up leaves the run to it.

Durable runs (ADR 0013) are not closed: an orphan whose spec says it ran as a durable workflow
is *released* (``DurableRunStore.release_run``, the same compare-and-set on owner and lease) and
marked suspended in its metadata. A run any replica may resume (``resume = 'queue'``) goes back
on its work queue through ``requeue`` -- which only a process running the durable engine can
pass, so a process without one leaves such runs to a daemon; a run of ``thoughtgate run``
(``manual``) waits for ``thoughtgate resume`` or the web page's Resume.

A queued run has no owner, so no lease of it ever expires: should what puts it on its queue fail
(a new run's enqueue, a requeue), and then its close too (the store down past the retries), it
would stay open on no queue forever. So a sweep that can requeue also asks the engine which of the
queued runs (no owner, a ``queued_at``) are on a queue (``on_queue``), and puts back one on none
once queued for ``lost_after_s`` -- closing it when that fails, or leaving it to the next sweep
when the store still refuses (ADR 0062). Nor does a lease tell when a replica took a queued run's
workflow from its queue and stopped before claiming it: the workflow stays taken by an executor
that is gone. The sweep puts back such a run too, once it has been taken for ``lost_after_s``
without a claim (ADR 0063); ``requeue_run`` (a compare-and-set on ``queued_at``) lets one sweep
of several do it. A queued run whose workflow *ended* (its claim failed while the store was
unavailable, or found the run held by an execution that then handed it back) is put back at
once: nothing executes it, nor can anything be queueing it (``WORKFLOW_ENDED``, ADR 0065).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from thoughtgate.disclosure import kept_detail
from thoughtgate.errors import StoreUnavailableError, failure_detail, failure_text
from thoughtgate.events.catalogue import check_new_events
from thoughtgate.events.payloads import (
    RunInterruptedPayload,
    RunStatus,
    TaskCompletedPayload,
    TaskStatus,
    TokenUsage,
)
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.store.base import EventStore, Holder, OpenRun, OpenRuns, RunEnding
from thoughtgate.store.durable import DurableRunStore, RunSpecRecord
from thoughtgate.store.records import OPEN_RUN_STATUSES, TERMINAL_TASK_STATUSES, TaskRecord
from thoughtgate.types import Usage

__all__ = [
    "ABANDONED",
    "CLOSE_RETRY",
    "DEFAULT_LEASE_TTL_S",
    "ENDED_OPEN",
    "ON_NO_QUEUE",
    "OPEN_RUNS_PAGE",
    "TAKEN_UNCLAIMED",
    "UNWRITTEN",
    "WORKFLOW_ENDED",
    "WORKFLOW_TAKEN_OVER",
    "EndedTask",
    "Owner",
    "SweepCursor",
    "billed_by_task",
    "billed_usage",
    "close_orphaned_runs",
    "close_run_interrupted",
    "end_run",
    "orphan_reason",
    "retrying",
    "suspend",
    "suspended_record",
]

log = logging.getLogger("thoughtgate.leases")

_T = TypeVar("_T")

DEFAULT_LEASE_TTL_S = 15.0
"""A run whose owner has not renewed its lease for this long is closed (``lease_ttl_s``)."""

LOST_LEASE = "its lease expired and another thoughtgate process closed it"
GONE = "the process executing it stopped (crash, kill or power loss)"
RESTARTED = "the process executing it was restarted"
EXPIRED = "the process executing it stopped renewing its lease"
ON_NO_QUEUE = "it waited for a replica on no work queue (putting it there, then closing it, failed)"
"""Why a sweep puts a queued run back on its queue, or closes it (ADR 0062)."""
TAKEN_UNCLAIMED = (
    "the replica that took it from its work queue stopped before it began executing it"
)
"""Why a sweep puts back on a queue a queued run whose workflow a replica took from its queue
and that the replica has not claimed for a lease: it stopped in between (ADR 0063)."""
WORKFLOW_ENDED = float("-inf")
"""An ``OnQueue`` answer: the run's workflow has ended while the run is open -- its execution
gave up before it began (its claim failed while the store was unavailable), or found the run
held by a stalled execution that then lost the workflow. Nothing will execute it, so the sweep
puts it back on a queue at once, its checkpoints kept (ADR 0065)."""
ENDED_OPEN = (
    "its workflow ended while it was open (its execution could not begin, or handed it back)"
)
"""Why a sweep puts back on a queue a queued run whose workflow ended (ADR 0065)."""
WORKFLOW_TAKEN_OVER = (
    "its workflow was put back on a queue while the process that had taken it stalled"
)
"""Why a stalled execution hands a run it claimed back at once: DBOS refuses its checkpoints,
for another execution owns the run's workflow now (ADR 0065)."""
ABANDONED = "its process stopped executing it without recording its end"
"""Why a process's own sweep closes a run of its own that it no longer executes and whose lease
expired: its end was refused for longer than the retries, or its execution stopped without one
(ADR 0060)."""
UNWRITTEN = "its first execution, which kept no checkpoints, needed one"
"""Why a durable run's first execution without a workflow (ADR 0031) hands the run over to one
in the same process: a step of it has a result a resume would need."""


def _host_key() -> str:
    """A digest naming this machine *and* boot *and* pid namespace: pids compare only within it."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Owner:
    """A process that executes runs; ``owner_id`` is what run rows store."""

    host: str
    pid: int
    nonce: str

    @property
    def owner_id(self) -> str:
        return f"{self.host}.{self.pid}.{self.nonce}"

    @classmethod
    def parse(cls, owner_id: str) -> Owner | None:
        """The owner an id names, or ``None`` for an id of another shape (``"legacy"``)."""
        host, _, rest = owner_id.partition(".")
        pid, _, nonce = rest.partition(".")
        if not (host and nonce and pid.isdigit()):
            return None
        return cls(host, int(pid), nonce)

    @classmethod
    def current(cls) -> Owner:
        """This process (a forked child gets its own owner)."""
        global _current
        if _current is None or _current.pid != os.getpid():
            _current = cls(_host_key(), os.getpid(), uuid.uuid4().hex[:12])
        return _current


_current: Owner | None = None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but someone else's
        return True
    except OSError:
        return True  # cannot tell: rely on the lease
    return True


def orphan_reason(
    run: OpenRun, now: float, me: Owner, executing: Container[str] | None = None
) -> str | None:
    """Why ``run`` has nobody executing it any more, or ``None`` when it may still be executed.

    ``executing``: the runs this process executes (its ``LeaseKeeper``); a run of its own not
    among them whose lease has expired is one it stopped executing without recording its end.
    Without it (a process that does not know, as when the store is opened) this process's own
    runs are left alone."""
    if run.owner is None:
        return None
    if run.owner == me.owner_id:
        if executing is None or run.run_id in executing:
            return None
        expired = run.lease_expires_at is not None and run.lease_expires_at <= now
        return ABANDONED if expired else None
    if run.lease_expires_at is not None and run.lease_expires_at <= now:
        return EXPIRED
    other = Owner.parse(run.owner)
    if other is None or other.host != me.host:
        return None  # another machine: only its lease can tell
    if other.pid == me.pid:
        return RESTARTED
    return None if _pid_alive(other.pid) else GONE


@dataclass(frozen=True, slots=True)
class EndedTask:
    """A task that ended just before its run: its closing events (its last turn's record, then
    ``worker.completed``, ``task.completed``) and its row as it ended, stored with the run's
    ending in the same transaction instead of in one of their own (one commit per run end)."""

    task: TaskRecord
    events: tuple[NewEvent, ...]


async def end_run(
    store: EventStore,
    run_id: str,
    terminal: NewEvent,
    *,
    status: RunStatus,
    usage: Mapping[str, int] | None = None,
    error: str | None = None,
    task_status: TaskStatus,
    task_error: str,
    lease_expired_by: float | None = None,
    held_by: Holder | None = None,
    ended: EndedTask | None = None,
    tasks: Sequence[TaskRecord] | None = None,
    tail: Sequence[NewEvent] = (),
    retry: Sequence[float] = (),
    task_usage: Mapping[str, Mapping[str, int]] | None = None,
    begun_error: str | None = None,
) -> list[Event]:
    """End an open run with ``terminal``, first ending every unfinished task with
    ``task.completed`` (``task_status``, ``task_error``, and what its model turns were billed,
    ``task_usage`` by task id: ADR 0131); ``[]`` if the run had already ended.
    ``begun_error``: the error of a task that had begun (``running``) instead of
    ``task_error``, where the two differ (a run that failed ended its unbegun tasks "not run"; a
    task it had run was not "not run")
    ``ended``: a task that ended on its own, its events first in the batch. ``tasks``: the
    run's tasks as the process that executed them knows them, instead of reading the run back
    (``finish_run`` still ends only an open run). ``tail``: events of the run's that were held
    for its ending (a task's last turn), first in the batch.

    ``retry``: the pauses (seconds) between further tries of a store call that failed with
    :class:`StoreUnavailableError` (a connection lost or found dead; the pool drops it). Safe
    because ``finish_run`` ends only an open run: a try whose commit was lost with its reply
    makes the next one a no-op, never a second ending. The last try's error is raised.

    ``held_by``: the execution recording the end (this process, and its claim's attempt): the
    end is refused with ``RunTakenOverError``, storing nothing, when that execution no longer
    holds the open run (ADR 0072). Not retried: it would be refused again."""
    if tasks is None:
        run = await retrying(lambda: store.get_run(run_id), retry, "record the end of", run_id)
        if run.status not in OPEN_RUN_STATUSES:
            return []
        tasks = run.tasks
    closed: list[TaskRecord] = []
    events: list[NewEvent] = [*tail]
    if ended is not None:
        closed.append(ended.task)
        events += ended.events
    for task in tasks:
        if task.status in TERMINAL_TASK_STATUSES or (
            ended is not None and task.task_id == ended.task.task_id
        ):
            continue
        said = begun_error if begun_error is not None and task.status == "running" else task_error
        task.status = task_status
        task.error = said
        closed.append(task)
        done: TaskCompletedPayload = {
            "status": task_status,
            "output": task.output,
            "error": said,
        }
        billed = (task_usage or {}).get(task.task_id)
        if billed:  # what its turns were billed, as a completed task's worker.completed says
            task.usage = dict(billed)
            done["usage"] = cast(TokenUsage, dict(billed))
        events.append(NewEvent(EventType.TASK_COMPLETED, done, task_id=task.task_id))
    events.append(terminal)
    check_new_events(events)
    ending = RunEnding(
        status,
        usage=usage,
        error=error,
        tasks=closed,
        lease_expired_by=lease_expired_by,
        held_by=held_by,
    )
    return await retrying(
        lambda: store.finish_run(run_id, events, ending), retry, "record the end of", run_id
    )


async def retrying(
    call: Callable[[], Awaitable[_T]],
    pauses: Sequence[float],
    what: str,
    run_id: str,
    *,
    deadline: float | None = None,
) -> _T:
    """``call()``, tried again after each of ``pauses`` (seconds) while it fails with
    :class:`StoreUnavailableError`; the last try's error is raised, and so is any other error at
    once (it would fail again). ``what`` and ``run_id`` name the call in the log ("could not
    <what> run <run_id>"), one warning per failed try that is followed by another. ``deadline``
    (``time.monotonic()``): no pause that would end after it, the failed try's error is raised
    instead -- a try under way is never cut short. For calls that are safe to repeat."""
    tries = len(pauses) + 1
    for attempt, pause in enumerate(pauses, 1):
        try:
            return await call()
        except StoreUnavailableError as exc:
            if deadline is not None and time.monotonic() + pause > deadline:
                raise
            log.warning(
                "could not %s run %s (try %d of %d: %s); trying again in %.2fs",
                what,
                run_id,
                attempt,
                tries,
                exc,
                pause,
            )
        await asyncio.sleep(pause)
    return await call()


async def billed_usage(store: EventStore, run_id: str) -> dict[str, int]:
    """What the run's providers reported, as its log has it: the sum of the usage of its
    ``agent.response`` events, one per model turn that returned (ADR 0131). For a run closed by
    something other than its execution, which knew it as it went."""
    return (await billed_by_task(store, run_id))[0]


async def billed_by_task(
    store: EventStore, run_id: str
) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    """:func:`billed_usage`, and the same sum for each task (by task id), from one read."""
    total = Usage()
    tasks: dict[str, Usage] = {}
    for event in await store.read_types(run_id, (EventType.AGENT_RESPONSE,)):
        usage = event.payload.get("usage")
        if isinstance(usage, Mapping):
            turn = Usage.from_dict(usage)
            total = total + turn
            if event.task_id is not None:
                tasks[event.task_id] = tasks.get(event.task_id, Usage()) + turn
    return total.to_dict(), {task_id: u.to_dict() for task_id, u in tasks.items()}


CLOSE_RETRY: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
"""Pauses (seconds) before trying again to close a run interrupted when the store was briefly
unavailable (``StoreUnavailableError``: SQLite locked by another process past its busy timeout,
a PostgreSQL connection lost): 5 tries over ~3.75 s plus the tries themselves. Enough for a
connection the pool replaces or a lock another process holds for a moment; a longer outage is
left to the lease sweep (ADR 0009), which closes the run once its lease expires -- a live
process's own sweep included, since it renews only the runs it executes (ADR 0060)."""


async def close_run_interrupted(
    store: EventStore,
    run_id: str,
    reason: str,
    *,
    usage: Mapping[str, int] | None = None,
    task_usage: Mapping[str, Mapping[str, int]] | None = None,
    lease_expired_by: float | None = None,
    held_by: Holder | None = None,
    ended: EndedTask | None = None,
    tasks: Sequence[TaskRecord] | None = None,
    tail: Sequence[NewEvent] = (),
    retry: Sequence[float] = CLOSE_RETRY,
    deadline: float | None = None,
    detail: str | None = None,
) -> list[Event]:
    """Close an open run as interrupted, its unfinished tasks first (``ended``: one that ended
    on its own; ``tasks``: the run's tasks as the caller knows them, as :func:`end_run` takes
    both); ``[]`` if it had ended.

    ``reason`` is public (thoughtgate's words and identifiers: ``errors.failure_text``);
    ``detail``, the words of the failure that closed it (``errors.failure_detail``), goes to
    the developer-only ``error_detail`` -- recorded only when the run's mode records reasoning
    (``disclosure.kept_detail``: never on a ``hidden`` run; ADR 0073).

    A run left open by a failed close shows ``running`` on every surface until a lease sweep
    takes it, so a store that is briefly unavailable is tried again after each of ``retry``
    (seconds), with a warning naming the run each time, and no later than ``deadline``
    (``time.monotonic()``: a caller's shutdown budget). When it gives up, an error says the run
    stays open, and the last error is raised. ``retry=()``: one try, and the caller says what
    failed (the sweep itself, which comes back anyway). Any other error (the run does not
    exist; ``RunTakenOverError`` for an end by an execution, ``held_by``, that no longer holds
    the run) is raised at once.

    ``usage``: what the run was billed, as its execution counted it; without it (a sweep, a
    shutdown, a failed resume: the run's execution is elsewhere or gone), what its log says it
    was billed (:func:`billed_usage`), so that a run cut after billed turns never reads zero.
    ``task_usage``: the same by task id, given with ``usage``; each unfinished task's
    ``task.completed`` records its own (without ``usage``: its log's, :func:`billed_by_task`).
    """

    async def close() -> list[Event]:
        billed, by_task = (
            (usage, task_usage) if usage is not None else await billed_by_task(store, run_id)
        )
        payload: RunInterruptedPayload = {
            "status": "interrupted",
            "reason": reason,
            "usage": cast(TokenUsage, dict(billed)),
        }
        terminal, known = payload, tasks
        if detail is not None:  # whether the run's mode records it: read the run
            run = await store.get_run(run_id)
            if run.status not in OPEN_RUN_STATUSES:
                return []
            known = run.tasks
            kept = kept_detail(run.chain_of_thought, detail)
            if kept is not None:
                terminal = payload.copy()
                terminal["error_detail"] = kept
        return await end_run(
            store,
            run_id,
            NewEvent(EventType.RUN_INTERRUPTED, terminal),
            status="interrupted",
            usage=billed,
            error=f"interrupted: {reason}",
            task_status="interrupted",
            task_error=f"interrupted: {reason}",
            lease_expired_by=lease_expired_by,
            held_by=held_by,
            ended=ended,
            tasks=known,
            tail=tail,
            task_usage=by_task,
        )

    try:
        return await retrying(
            close,
            retry,
            "record the interruption of",
            run_id,
            deadline=deadline,
        )
    except StoreUnavailableError as exc:
        if retry:
            log.error(
                "gave up recording that run %s was interrupted (%s): it shows running until its "
                "lease expires and a lease sweep closes it",
                run_id,
                exc,
            )
        raise


OPEN_RUNS_PAGE = 1000
"""Open runs a sweep reads at once (``open_runs``' ``limit``)."""


@dataclass(slots=True)
class SweepCursor:
    """Where a periodic sweep's walk through the open runs stopped (ADR 0074): the last run id
    of the page it read last, ``None`` to begin again from the first."""

    after: str | None = None


Requeue = Callable[[str, RunSpecRecord], Awaitable[None]]
"""``(run_id, spec)``: put a released durable run back on a work queue (the engine's), one whose
replicas have the run's tools."""

OnQueue = Callable[[Sequence[str]], Awaitable[Mapping[str, float | None]]]
"""Which of these runs the engine has on a work queue: ``None`` for a workflow waiting there, or
when it was taken from there (seconds since the epoch, the store's clock); ``WORKFLOW_ENDED``
for a workflow that ended (ADR 0065)."""


async def close_orphaned_runs(
    store: EventStore,
    *,
    me: Owner | None = None,
    requeue: Requeue | None = None,
    executing: Container[str] | None = None,
    on_queue: OnQueue | None = None,
    lost_after_s: float = DEFAULT_LEASE_TTL_S,
    cursor: SweepCursor | None = None,
    page: int = OPEN_RUNS_PAGE,
    stopped: Mapping[str, str] | None = None,
) -> list[str]:
    """Close every open run whose owner is gone (see the module docstring) -- or, for a durable
    run, release it to resume; returns the ids of the runs closed. ``executing``: the runs this
    process executes, asked about each run as it is looked at (a process's ``LeaseKeeper``):
    this process's other runs are taken too once their leases have expired (ADR 0060).
    ``on_queue`` (with ``requeue``): queued runs on no queue for ``lost_after_s`` are put back
    (:func:`_requeue_lost`). ``cursor``: a periodic sweep's place among the open runs, which it
    reads ``page`` at a time (:func:`_runs_to_decide`, ADR 0074); without one, every open run.
    ``stopped``: why this process's execution of a run stopped, by run id; a run of its own it
    closes as :data:`ABANDONED` says that too (the store refused its end: full, locked, gone;
    ADR 0149), not only that its end was not recorded.

    A daemon sweeps every two thirds of a lease, and runs suspended for an approval can number
    thousands, so it decides from what ``open_runs`` returns (owner, lease, ``queued_at``):
    the engine is asked only about queued runs (a suspended run is on no queue, and is
    ``thoughtgate resume``'s to move), and the specs of the runs it will move --
    the orphans and the lost queued runs -- come in one ``get_run_specs`` (ADR 0064, 0066)."""
    me = me or Owner.current()
    found = await _runs_to_decide(store, cursor, page)
    orphans: list[tuple[OpenRun, str]] = []
    for run in found.runs:
        reason = orphan_reason(run, found.now, me, executing)
        if reason is not None:
            orphans.append((run, reason))
    lost: dict[str, str] = {}
    # The engine is asked about every queued run (ownerless, with a ``queued_at``; a suspended
    # run has none), however recently queued: one whose workflow ended is put back at once
    # (ADR 0065), any other once queued for ``lost_after_s`` (what queues it may be under way
    # until then; ``_requeue_lost`` checks it again on the spec it reads).
    if requeue is not None and on_queue is not None and isinstance(store, DurableRunStore):
        queued = {
            run.run_id: run.queued_at
            for run in found.runs
            if run.owner is None and run.queued_at is not None
        }
        places = await on_queue(list(queued)) if queued else {}
        for run_id, queued_at in queued.items():
            why = _lost(run_id, places, found.now, lost_after_s)
            if why is not None and (why == ENDED_OPEN or found.now - queued_at >= lost_after_s):
                lost[run_id] = why
    wanted = [run.run_id for run, _ in orphans] + list(lost)
    specs: Mapping[str, RunSpecRecord] = {}
    if wanted and isinstance(store, DurableRunStore):
        specs = await store.get_run_specs(wanted)
    closed: list[str] = []
    for run, reason in orphans:
        # A lease-based verdict holds only while the lease stays expired; a dead pid is final.
        expired_by = found.now if reason in (EXPIRED, ABANDONED) else None
        if reason == ABANDONED and stopped is not None and run.run_id in stopped:
            reason = f"{ABANDONED} ({stopped[run.run_id]})"
        spec = specs.get(run.run_id)
        if spec is not None and spec.durable:
            await _release_durable(store, run, spec, reason, expired_by, requeue)
            continue
        closed_now = await close_run_interrupted(
            store, run.run_id, reason, lease_expired_by=expired_by, retry=()
        )
        if closed_now:
            log.warning("run %s closed as interrupted: %s", run.run_id, reason)
            closed.append(run.run_id)
    if requeue is not None and lost:
        found_lost = [(specs[run_id], why) for run_id, why in lost.items() if run_id in specs]
        closed += await _requeue_lost(store, found_lost, found.now, requeue, lost_after_s)
    return closed


async def _runs_to_decide(store: EventStore, cursor: SweepCursor | None, page: int) -> OpenRuns:
    """The open runs a sweep decides on this pass, ``page`` per store read (ADR 0074).

    Without ``cursor`` (a process opening its store, once): every open run. With it (a
    daemon's sweep, every two thirds of a lease): every run whose lease has expired -- the
    orphans, which must not wait, and which the pass moves, so reading them costs what it
    does -- and the next ``page`` of all open runs after the cursor, which moves on (back to
    the first run after the last page). So a pass reads at most a page beyond the runs it
    moves, whatever the number of leases running elsewhere, and every open run -- a queued
    run on no queue, one whose owner's pid died -- comes up within ``open runs / page``
    passes; before, the 1000 open runs with the oldest leases were read and the runs without
    one (queued, suspended) came last, so beyond 1000 leased runs none of them was ever seen.

    ``now`` is the first read's: a lease expired then is expired at every later read, and
    every compare-and-set on it holds (``lease_expired_by``)."""
    if cursor is None:
        return await _every_page(store, page, expired=False)
    expired = await _every_page(store, page, expired=True)
    runs = {run.run_id: run for run in expired.runs}
    for run in (await _next_page(store, cursor, page)).runs:
        runs.setdefault(run.run_id, run)
    return OpenRuns(list(runs.values()), expired.now)


async def _every_page(store: EventStore, page: int, *, expired: bool) -> OpenRuns:
    """Every open run (``expired``: whose lease has expired), read ``page`` at a time."""
    found = await store.open_runs(limit=page, expired=expired)
    runs, now = list(found.runs), found.now
    while len(found.runs) == page:
        found = await store.open_runs(limit=page, after=found.runs[-1].run_id, expired=expired)
        runs += found.runs
    return OpenRuns(runs, now)


async def _next_page(store: EventStore, cursor: SweepCursor, page: int) -> OpenRuns:
    """The ``page`` open runs after ``cursor``, which moves past them (to the start after the
    last page)."""
    found = await store.open_runs(limit=page, after=cursor.after)
    cursor.after = found.runs[-1].run_id if len(found.runs) == page else None
    return found


async def _requeue_lost(
    store: EventStore,
    lost: Sequence[tuple[RunSpecRecord, str]],
    now: float,
    requeue: Requeue,
    lost_after_s: float,
) -> list[str]:
    """Put back on a queue each queued run of ``lost`` (its spec, and why it is lost): on no
    queue (ADR 0062), or taken from its queue by a replica that has not claimed it for
    ``lost_after_s`` (it stopped in between, ADR 0063) -- once the run has been queued for
    ``lost_after_s`` too (what queues it may be under way until then). Close it when that fails.
    Of several sweeps at once, only the one whose ``requeue_run`` moves it puts it back. A
    suspended run (``thoughtgate resume``'s to move) is not queued and is left alone. Returns
    the ids of the runs closed."""
    assert isinstance(store, DurableRunStore)
    closed: list[str] = []
    for spec, why in lost:
        run_id = spec.run_id
        if not spec.durable or spec.queued_at is None:
            continue
        if why != ENDED_OPEN and now - spec.queued_at < lost_after_s:
            continue  # what queues it may be under way; an ended workflow is not (ADR 0065)
        if not await store.requeue_run(run_id, queued_at=spec.queued_at):
            continue  # claimed, closed or put back by another sweep since it was read
        try:
            await requeue(run_id, spec)
        except Exception as exc:
            log.warning("run %s cannot be queued again (%s); closing it", run_id, exc)
            if await close_run_interrupted(
                store,
                run_id,
                f"{why}; it could not be queued again: {failure_text(exc)}",
                retry=(),
                detail=failure_detail(exc),
            ):
                closed.append(run_id)
            continue
        log.warning("run %s queued again: %s", run_id, why)
    return closed


def _lost(
    run_id: str, places: Mapping[str, float | None], now: float, lost_after_s: float
) -> str | None:
    """Why a queued run is lost, or ``None`` while its workflow waits on a queue or was taken
    from one less than ``lost_after_s`` ago (a replica that takes a run claims it at once)."""
    if run_id not in places:
        return ON_NO_QUEUE
    taken_at = places[run_id]
    if taken_at == WORKFLOW_ENDED:
        return ENDED_OPEN
    if taken_at is None or now - taken_at < lost_after_s:
        return None
    return TAKEN_UNCLAIMED


async def _release_durable(
    store: EventStore,
    run: OpenRun,
    spec: RunSpecRecord,
    reason: str,
    expired_by: float | None,
    requeue: Requeue | None,
) -> None:
    assert isinstance(store, DurableRunStore)
    queued = spec.resume == "queue" and spec.queue is not None
    if queued and requeue is None:
        return  # only a process with the durable engine can put it back on its queue
    # Why it waits is written with the release, in its transaction: a sweep that died between
    # two left an ownerless run saying ``running`` and nothing more, which no sweep looks at
    # again, or wrote it on the run a claim had taken meanwhile (ADR 0112).
    why = suspended_record(reason, await store.clock(), queued=queued, previous=run.owner)
    if not await store.release_run(
        run.run_id, owner=run.owner, lease_expired_by=expired_by, queue=queued, metadata=why
    ):
        return  # its owner renewed, or another process released it first
    if queued:
        assert requeue is not None
        try:
            await requeue(run.run_id, spec)
        except Exception as exc:  # its checkpoints are gone: it cannot resume
            log.warning("run %s cannot resume (%s); closing it", run.run_id, exc)
            await close_run_interrupted(
                store,
                run.run_id,
                f"{reason}; it could not resume: {failure_text(exc)}",
                retry=(),
                detail=failure_detail(exc),
            )
            return
    log.warning("run %s %s: %s", run.run_id, "queued to resume" if queued else "suspended", reason)


async def suspend(
    store: EventStore,
    run_id: str,
    reason: str,
    *,
    queued: bool,
    previous: str | None,
    held_by: Holder | None = None,
) -> None:
    """Record on the run (its metadata, shown to every reader) why it waits to resume, and
    since when on the store's clock (PostgreSQL's server, as every time it keeps: ADR 0074).
    ``held_by``: the execution recording it, which must still hold the run (ADR 0094). A run
    being released records it with its release instead (:func:`suspended_record`)."""
    why = suspended_record(reason, await store.clock(), queued=queued, previous=previous)
    await store.update_run(run_id, held_by=held_by, metadata=why)


def suspended_record(
    reason: str, since: float, *, queued: bool, previous: str | None
) -> dict[str, Any]:
    """The run metadata saying why a run waits to resume and how (``suspended``), since
    ``since`` (the store's clock), and which process executed it last: what :func:`suspend`
    records, and what a release passes to ``release_run(metadata=)`` to record it in the same
    transaction (ADR 0112)."""
    return {
        "suspended": {"reason": reason, "since": since, "resume": "queue" if queued else "manual"},
        "previous_executor": previous,
    }
