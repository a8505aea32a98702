"""Run leases: which process executes each open run, and closing runs whose process is gone.

The decision and its trade-offs are in ADR 0009. In short:

* A process that executes runs is an **owner**, named ``<host>.<pid>.<nonce>``: ``host`` is a
  digest of the host name, boot id and pid namespace (so two containers, or one machine before
  and after a reboot, never look like the same host), ``nonce`` is new for every process start
  (so a restarted container that gets the same pid is still told apart from its predecessor).
* While a run is open its row names its owner and a **lease expiry**; the owner renews the
  leases of all its open runs in one statement every third of the lease's length
  (``orchestration.leases.LeaseKeeper``).
* A run is **orphaned** when its lease has expired on the store's clock, or, sooner, when its
  owner ran on this host and that process is gone (its pid is dead, or it is this process's pid
  but an earlier start). A run with no owner is executed by nobody and is left alone.
* :func:`close_orphaned_runs` closes each orphan in one transaction: every unfinished task gets
  ``task.completed`` with status ``interrupted``, then the run gets ``run.interrupted``. It uses
  ``finish_run(lease_expired_by=...)``, so a run whose owner renewed in the meantime is left
  alone and two processes sweeping at once never both close it. Every process sweeps when it
  opens the store (``open_store``); a daemon also sweeps periodically.

Durable runs (resuming a run on another replica instead of closing it) will take over an
orphan's lease instead of closing it; the owner column and lease expiry are what such a claim
compares and sets.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from thoughtgate.events.catalogue import check_new_events
from thoughtgate.events.payloads import (
    RunInterruptedPayload,
    RunStatus,
    TaskCompletedPayload,
    TaskStatus,
    TokenUsage,
)
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.store.base import EventStore, OpenRun
from thoughtgate.store.records import OPEN_RUN_STATUSES, TERMINAL_TASK_STATUSES, TaskRecord

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "Owner",
    "close_orphaned_runs",
    "close_run_interrupted",
    "end_run",
    "orphan_reason",
]

log = logging.getLogger("thoughtgate.leases")

DEFAULT_LEASE_TTL_S = 15.0
"""A run whose owner has not renewed its lease for this long is closed (``lease_ttl_s``)."""

LOST_LEASE = "its lease expired and another thoughtgate process closed it"
GONE = "the process executing it stopped (crash, kill or power loss)"
RESTARTED = "the process executing it was restarted"
EXPIRED = "the process executing it stopped renewing its lease"


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


def orphan_reason(run: OpenRun, now: float, me: Owner) -> str | None:
    """Why ``run`` has nobody executing it any more, or ``None`` when it may still be executed."""
    if run.owner is None or run.owner == me.owner_id:
        return None
    if run.lease_expires_at is not None and run.lease_expires_at <= now:
        return EXPIRED
    other = Owner.parse(run.owner)
    if other is None or other.host != me.host:
        return None  # another machine: only its lease can tell
    if other.pid == me.pid:
        return RESTARTED
    return None if _pid_alive(other.pid) else GONE


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
) -> list[Event]:
    """End an open run with ``terminal``, first ending every unfinished task with
    ``task.completed`` (``task_status``, ``task_error``); ``[]`` if the run had already ended."""
    run = await store.get_run(run_id)
    if run.status not in OPEN_RUN_STATUSES:
        return []
    closed: list[TaskRecord] = []
    events: list[NewEvent] = []
    for task in run.tasks:
        if task.status in TERMINAL_TASK_STATUSES:
            continue
        task.status = task_status
        task.error = task_error
        closed.append(task)
        done: TaskCompletedPayload = {
            "status": task_status,
            "output": task.output,
            "error": task_error,
        }
        events.append(NewEvent(EventType.TASK_COMPLETED, done, task_id=task.task_id))
    events.append(terminal)
    check_new_events(events)
    return await store.finish_run(
        run_id,
        events,
        status=status,
        usage=dict(usage) if usage is not None else None,
        error=error,
        tasks=closed,
        lease_expired_by=lease_expired_by,
    )


async def close_run_interrupted(
    store: EventStore,
    run_id: str,
    reason: str,
    *,
    usage: Mapping[str, int] | None = None,
    lease_expired_by: float | None = None,
) -> list[Event]:
    """Close an open run as interrupted, its unfinished tasks first; ``[]`` if it had ended."""
    payload: RunInterruptedPayload = {"status": "interrupted", "reason": reason}
    if usage is not None:
        payload["usage"] = cast(TokenUsage, dict(usage))
    return await end_run(
        store,
        run_id,
        NewEvent(EventType.RUN_INTERRUPTED, payload),
        status="interrupted",
        usage=usage,
        error=f"interrupted: {reason}",
        task_status="interrupted",
        task_error=f"interrupted: {reason}",
        lease_expired_by=lease_expired_by,
    )


async def close_orphaned_runs(store: EventStore, *, me: Owner | None = None) -> list[str]:
    """Close every open run whose owner is gone (see the module docstring); their ids."""
    me = me or Owner.current()
    found = await store.open_runs()
    closed: list[str] = []
    for run in found.runs:
        reason = orphan_reason(run, found.now, me)
        if reason is None:
            continue
        # A lease-based verdict holds only while the lease stays expired; a dead pid is final.
        expired_by = found.now if reason == EXPIRED else None
        if await close_run_interrupted(store, run.run_id, reason, lease_expired_by=expired_by):
            log.warning("run %s closed as interrupted: %s", run.run_id, reason)
            closed.append(run.run_id)
    return closed
