"""The start of every execution of a durable run: claim it, and say so when it resumes.

A run's workflow may start several times: once when it is first taken, and once more each time
its process stopped and another (or a restarted one) took it over. Each start claims the run
(``DurableRunStore.claim_run``, which counts the attempt); a second or later attempt is a
*resume*: it records ``run.resumed`` -- why, which attempt, and after which event it continues --
and hands the steps the log as it stood (``engine.steps.ResumeLog``).

A run that cannot resume is closed ``interrupted``, with the reason:

* it was started more than ``durability.max_attempts`` times (it takes every process down);
* this process lacks one of its tools (a queue routes runs only to replicas that have them, so
  this means the tools changed since);
* it was recorded by a thoughtgate whose run spec this one cannot read.

(A run with no checkpoints at all -- executed by a process without durable runs -- is closed by
the sweep, ``store.leases.close_orphaned_runs``, as before.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Protocol

from thoughtgate.config import Config
from thoughtgate.engine.steps import ResumeLog
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.errors import UsageError, failure_detail, failure_text
from thoughtgate.events.payloads import RunResumedPayload
from thoughtgate.orchestration.leases import LeaseKeeper
from thoughtgate.orchestration.specs import RunSpec
from thoughtgate.store.base import EventStore, Holder
from thoughtgate.store.durable import DurableRunStore
from thoughtgate.store.leases import GONE, close_run_interrupted
from thoughtgate.store.records import OPEN_RUN_STATUSES, RunRecord

__all__ = ["Executor", "begin_execution", "check_resumable", "read_resume_log"]

log = logging.getLogger("thoughtgate.durable")


class Executor(Protocol):
    """What starting an execution needs of the runtime (``orchestration.runtime.Runtime``)."""

    store: EventStore
    config: Config
    leases: LeaseKeeper

    def tools_for(self, tool_names: Sequence[str]) -> ToolRegistry: ...

    async def resumed_event(
        self, run_id: str, payload: RunResumedPayload, holder: Holder | None = None
    ) -> None: ...


async def read_resume_log(store: EventStore, run_id: str) -> ResumeLog:
    """A resuming run's log, with how far its stamps' clock -- the store's, PostgreSQL's server
    (ADR 0074) -- is from this process's, so an approval's time left is counted from when the
    store recorded the request, whichever replica's clock is off."""
    events, store_now = await asyncio.gather(store.read(run_id), store.clock())
    return ResumeLog(events, clock_offset=store_now - time.time())


async def begin_execution(
    runtime: Executor,
    run_id: str,
    admitted: tuple[RunRecord, RunSpec] | None = None,
    *,
    claimed: bool = False,
) -> tuple[RunRecord, RunSpec, ToolRegistry, ResumeLog | None, int] | None:
    """Claim ``run_id`` for this process. Returns the run, its stored spec, the run's tools (from
    this process's), when it resumes the log as it stood, and the claim's attempt (what the
    execution's end names, ADR 0072); ``None`` when there is nothing to execute here (it ended,
    another process holds it, or it was just closed because it cannot resume).

    ``admitted``: the run and its spec as this process admitted them. The claim alone decides
    (it takes only an open run with a spec); when it is the run's first (attempt 1, nothing of
    the run executed anywhere yet), the run is as admitted and nothing is read back (ADR 0029).
    ``claimed``: the admission was the run's claim (it stored the run held by this process, at
    attempt 1, ADR 0031): it is not claimed again while its lease surely lasts, since nothing
    else takes a run whose lease has not expired.
    """
    store = runtime.store
    assert isinstance(store, DurableRunStore)
    owner = runtime.leases.owner.owner_id
    if claimed and admitted is not None and admitted[0].owner == owner:
        attempt: int | None = 1 if await _still_held(runtime, admitted[0]) else None
    else:
        attempt = await store.claim_run(run_id, owner, runtime.leases.ttl_s)
    if attempt is None:
        if (await store.get_run(run_id)).status in OPEN_RUN_STATUSES:
            log.warning("run %s is held by another process; not executing it here", run_id)
        return None
    held = Holder(owner, attempt)  # its closes below are this claim's (ADR 0072)
    if attempt == 1 and admitted is not None:
        run, spec = admitted
        run.status, run.owner, run.lease_expires_at = "running", owner, runtime.leases.lease_until()
        try:
            return run, spec, runtime.tools_for(spec.tools), None, attempt
        except UsageError as exc:
            await _cannot_resume(store, run_id, exc, held)
            return None
    record, before = await asyncio.gather(store.get_run_spec(run_id), store.get_run(run_id))
    if record is None:  # a claim takes only a run with a spec; it was deleted since
        return None
    limit = runtime.config.durability.max_attempts
    try:
        if attempt > limit:
            raise UsageError(f"its process stopped {attempt - 1} times; it is not resumed again")
        spec = RunSpec.from_json(record.spec)
        tools = runtime.tools_for(spec.tools)
    except UsageError as exc:
        await _cannot_resume(store, run_id, exc, held)
        return None
    resumed: ResumeLog | None = None
    if attempt > 1:
        resumed = await read_resume_log(store, run_id)
        suspended = before.metadata.get("suspended") or {}
        payload: RunResumedPayload = {
            "reason": str(suspended.get("reason") or GONE),
            "attempt": attempt,
            "after_seq": resumed.last_seq,
            "executor": owner,
        }
        previous = before.metadata.get("previous_executor")
        if isinstance(previous, str) and previous:
            payload["previous_executor"] = previous
        await runtime.resumed_event(run_id, payload, held)
        log.warning("run %s resumed (attempt %d) after seq %d", run_id, attempt, resumed.last_seq)
    if before.metadata.get("suspended") is not None:
        await store.update_run(run_id, metadata={"suspended": None}, held_by=held)
    if resumed is None and before.metadata.get("suspended") is None:
        return before, spec, tools, None, attempt  # read after its claim; nothing changed since
    return await store.get_run(run_id), spec, tools, resumed, attempt


async def _cannot_resume(store: EventStore, run_id: str, exc: UsageError, held: Holder) -> None:
    """Close the run ``interrupted`` saying why it cannot resume. The reason is public: the
    error's own words (``failure_text``: the words of an exception it was raised from, a
    plug-in's or a library's, are replaced by its class, ADRs 0069, 0111); those words go to
    the developer-only ``error_detail`` where the run's mode keeps it (ADR 0120)."""
    reason = f"it cannot resume: {failure_text(exc)}"
    await close_run_interrupted(store, run_id, reason, held_by=held, detail=failure_detail(exc))


async def _still_held(runtime: Executor, run: RunRecord) -> bool:
    """Whether this process still holds ``run``, which its admission claimed. Its lease runs
    from the admission; the execution renews it within ``renew_every`` of beginning, so with
    that much left (and a second to spare) nothing else can have taken the run. Otherwise the
    renewal is the check: it extends only leases this process still holds on open runs."""
    keeper = runtime.leases
    if time.time() + keeper.renew_every + 1.0 < (run.lease_expires_at or 0.0):
        return True
    store = runtime.store
    renewed = await store.renew_leases(keeper.owner.owner_id, keeper.ttl_s, [run.run_id])
    return run.run_id in renewed


async def check_resumable(
    store: DurableRunStore, run: RunRecord, tool_names: Sequence[str], *, hint: str
) -> None:
    """``UsageError`` unless ``run`` is open, was executed durably, and uses only tools among
    ``tool_names`` (``hint`` says where to resume it otherwise)."""
    if run.status not in OPEN_RUN_STATUSES:
        raise UsageError(f"run {run.run_id} has already ended ({run.status})")
    spec = await store.get_run_spec(run.run_id)
    if spec is None or not spec.durable:
        raise UsageError(f"run {run.run_id} was not executed durably, so it cannot resume")
    missing = sorted(set(spec.spec.get("tools", ())) - set(tool_names))
    if missing:
        raise UsageError(f"run {run.run_id} uses tools missing here ({', '.join(missing)}); {hint}")
