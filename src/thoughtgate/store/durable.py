"""The store's part in durable runs (ADR 0013): run specs, claims, requeues, queues and quotas.

A durable run is executed by a workflow engine (``orchestration.durable``) that checkpoints each
step; this interface keeps what the engine does not: the run's spec (so any process can execute
it), which process holds it (the run lease of ADR 0009, taken over by :meth:`claim_run`), whether
it waits for a replica (``queued_at``), and per-key admission.

The states of an open durable run, as the ``runs`` and ``run_specs`` rows tell them:

=========================  ==========  =============  ===========================================
state                      owner       queued_at      who moves it on
=========================  ==========  =============  ===========================================
queued (new or requeued)   none        set            a replica's engine dequeues it: claim_run;
                                                      lost (ADR 0062/0063/0065): requeue_run
waiting in its daemon      a process   none           the daemon starts it (claim_run from
                                                      attempt 0, ADR 0099) or queues
                                                      it (release_run); dies: release_run
executing                  a process   none           it ends, or its process dies: release_run
suspended (manual resume)  none        none           ``thoughtgate resume`` / the web page
=========================  ==========  =============  ===========================================

Every move is one conditional statement (compare-and-set), so two processes never both take a run.
A run its daemon executes at once is admitted *executing*, at attempt 1 (its admission is its
claim, ADR 0031); one that waits in its daemon is admitted *waiting*, at attempt 0.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Literal, TypeAlias

from thoughtgate.events.schema import NewEvent
from thoughtgate.store.records import RunRecord

__all__ = [
    "Admission",
    "DurableRunStore",
    "KeyUsage",
    "Quota",
    "ResumeMode",
    "RunQueueRecord",
    "RunSpecRecord",
    "quota_verdict",
]

ResumeMode: TypeAlias = Literal["queue", "manual"]
"""``queue``: any replica with the run's tools resumes it; ``manual``: only on request (a run of
``thoughtgate run`` in a terminal, whose tools may exist nowhere else)."""


@dataclass(slots=True)
class RunSpecRecord:
    """What a process needs to execute (or resume) a run, as the store keeps it."""

    run_id: str
    spec: dict[str, Any]
    """``orchestration.specs.RunSpec.to_json()``: the tasks and the tool names."""
    _: KW_ONLY
    key_id: str | None = None
    durable: bool = False
    resume: ResumeMode = "manual"
    queue: str | None = None
    attempts: int = 0
    queued_at: float | None = None
    created_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Quota:
    """Per-key limits checked when a run is admitted (``durability`` / ``quotas`` config)."""

    key_id: str
    max_open: int
    """Runs of this key not yet ended (queued, executing or suspended)."""
    max_per_minute: int
    """Runs this key started in the last 60 seconds."""


@dataclass(frozen=True, slots=True)
class Admission:
    """``admit_run``'s answer: refused runs were not stored, and say when to try again."""

    admitted: bool
    retry_after: float = 0.0
    reason: str = ""
    rank: int = 1
    """An admitted run's place among its key's open runs (1 = its only one): its queue
    priority, so a key's backlog waits behind other keys' first runs."""


@dataclass(frozen=True, slots=True)
class RunQueueRecord:
    """A work queue and the tools of the replicas that listen to it."""

    name: str
    tools: tuple[str, ...]
    concurrency: int
    seen_at: float = field(default=0.0)


WINDOW_S = 60.0
"""The window of ``Quota.max_per_minute``."""
BUSY_RETRY_S = 5.0
"""``Retry-After`` when a key has too many open runs: runs end at no predictable time."""


@dataclass(frozen=True, slots=True)
class KeyUsage:
    """What :func:`quota_verdict` needs to know of a key: a few numbers, so that a database
    answers with one row however many runs the key started (not every start of the window)."""

    open_runs: int
    """Runs of the key not yet ended."""
    pivot: float | None = None
    """The ``max_per_minute``-th newest start within the window, or ``None`` with fewer starts:
    the key may start again once this start leaves the window."""
    starts: int = 0
    """The starts within the window: the refusal names them, so only counted with a ``pivot``."""

    @classmethod
    def of_starts(cls, quota: Quota, open_runs: int, recent_starts: Sequence[float]) -> KeyUsage:
        """The usage of a key whose start times within the window are all at hand (any order)."""
        if len(recent_starts) < quota.max_per_minute:
            return cls(open_runs)
        newest = sorted(recent_starts, reverse=True)
        return cls(open_runs, newest[quota.max_per_minute - 1], len(recent_starts))


def quota_verdict(quota: Quota, usage: KeyUsage, now: float) -> Admission:
    """The one rule every backend applies to a key's usage."""
    if usage.open_runs >= quota.max_open:
        return Admission(
            False,
            BUSY_RETRY_S,
            f"this key already has {usage.open_runs} runs that have not ended (at most "
            f"{quota.max_open}); start more when some end",
        )
    if usage.pivot is not None:
        wait = max(1.0, usage.pivot + WINDOW_S - now)
        return Admission(
            False,
            wait,
            f"this key started {usage.starts} runs in the last minute (at most "
            f"{quota.max_per_minute})",
        )
    return Admission(True, rank=usage.open_runs + 1)


class DurableRunStore(abc.ABC):
    """Run specs, claims and quotas: what a store adds so runs survive their process."""

    @abc.abstractmethod
    async def admit_run(
        self,
        run: RunRecord,
        spec: RunSpecRecord,
        *,
        quota: Quota | None = None,
        events: Sequence[NewEvent] = (),
        decided: Callable[[], None] | None = None,
        committed: Callable[[], None] | None = None,
    ) -> Admission:
        """Create ``run`` with its tasks and its spec in one transaction -- unless ``quota``
        refuses it (counted in the same transaction, so concurrent admissions of one key on any
        number of replicas never exceed it); a refused run is not stored at all. ``events``, the
        run's opening events, are appended in the same transaction (one commit per admission).

        ``decided``: called (on the caller's loop, at most once) when the store knows the run is
        admitted before it knows the commit holds -- SQLite, when the loop ran the admission's
        group (ADR 0040) -- so the caller may begin work that needs no reader to see the run
        yet. Until this returns the run may still not exist: that commit may fail (this then
        raises, nothing stored, and every later write of the run fails). Stores that cannot
        tell early never call it.

        ``committed``: called (on the caller's loop, at most once) for an admitted run once its
        commit held, where the store learns that in a step of its own before the caller resumes
        -- SQLite, in the commit's hand-off -- so the caller may start work that needs the run
        stored a turn of the loop sooner. Stores that learn it in the caller's own step never
        call it: the caller, resumed, is as soon."""

    @abc.abstractmethod
    async def get_run_spec(self, run_id: str) -> RunSpecRecord | None:
        """The run's spec, or ``None`` for a run recorded without one (before ADR 0013)."""

    @abc.abstractmethod
    async def get_run_specs(self, run_ids: Collection[str]) -> dict[str, RunSpecRecord]:
        """The specs of ``run_ids`` by run id, in one read; a run without a spec (or unknown) is
        left out. For a caller that looks at many runs at once -- a lease sweep reads the spec of
        every ownerless open run it may have to move, and suspended runs can number thousands
        (ADR 0064) -- so its cost is one query, not one per run."""

    @abc.abstractmethod
    async def claim_run(
        self, run_id: str, owner: str, ttl_s: float, *, attempt: int | None = None
    ) -> int | None:
        """Take an open run that nobody holds (or ``owner`` already holds) for ``owner``: set the
        owner and a lease of ``ttl_s``, mark it ``running``, clear ``queued_at`` and count the
        attempt. Returns the attempt number (1 for the first execution), or ``None`` when the run
        has ended or another process holds it.

        ``attempt``: take the run only from ``owner``'s own hold at that attempt (the claims
        counted so far), else ``None``. A daemon starting a run that waited in its line names 0:
        an owner id names a process, whose own queue may have taken the run back and claimed it
        meanwhile (attempt 1 or more), or a sweep released it (nobody's); either way it is not
        the line's to start (ADR 0099)."""

    @abc.abstractmethod
    async def release_run(
        self,
        run_id: str,
        *,
        owner: str | None,
        queue: bool,
        lease_expired_by: float | None = None,
        attempt: int | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        """Let go of an open run so it can resume: clear its owner and lease, and set
        ``queued_at`` when ``queue`` (the caller then hands it to the engine's queue), else leave
        it suspended. Applies only while the run is held by ``owner`` (with ``lease_expired_by``:
        only if its lease has not been renewed past that time); with ``owner=None`` only to a
        suspended run (no owner, not queued). ``True`` when this call moved the run.

        ``attempt``: the execution letting go, as its claim counted it (``Holder.attempt``):
        applies only while the run's claims counted are still ``attempt``. An owner id names a
        process, which may have claimed the run again since (its own queue took it back): a
        release by the execution that claim superseded then moves nothing (ADR 0093).

        ``metadata``: merged into the run's metadata (as ``update_run`` merges it, with a change
        for the run list) in the same transaction, only when the release applies: why the run
        waits (``leases.suspended_record``). A sweep or a hand-back that released the run and
        then wrote that in a second transaction could die in between, leaving an ownerless run
        that says ``running`` and nothing more -- no sweep looks at it again -- or write it on
        the run a claim took in between (ADR 0112)."""

    @abc.abstractmethod
    async def requeue_run(self, run_id: str, *, queued_at: float) -> bool:
        """Mark a queued run queued again, from now: only while it is open, nobody holds it and
        it is still queued since ``queued_at`` (as the caller read it). Of several sweeps that
        found the run lost at once, this lets exactly one put it back on its queue (ADR 0063).
        ``True`` when this call moved it."""

    @abc.abstractmethod
    async def save_run_queue(self, queue: RunQueueRecord) -> None:
        """Insert or refresh a work queue (``seen_at`` = now)."""

    @abc.abstractmethod
    async def list_run_queues(self, *, seen_within_s: float) -> list[RunQueueRecord]:
        """Queues a replica refreshed within the last ``seen_within_s`` seconds."""
