"""DBOS's pollers that serve nothing thoughtgate uses, slowed down (ADR 0057).

An idle daemon's CPU is mostly DBOS's background threads reading the system database once a
second or more. Two of them do work thoughtgate never gives them, at an interval DBOS's
configuration does not expose (``dbos`` 3.4):

* the **internal queue's worker** (``_dbos_internal_queue``, every 1 s): DBOS puts on it scheduled
  workflows, Kafka consumers, debounced workflows, ``resume_workflow``/``fork_workflow`` calls
  without a queue name, and its own start-up recovery of *this executor id's* pending
  workflows. thoughtgate schedules nothing, consumes no Kafka, always names its queue when it
  resumes (``DurableEngine.resume``), and gives every process a new executor id (its lease owner,
  ``<host>.<pid>.<nonce>``), so start-up recovery never finds a workflow of it: runs whose process
  died are resumed by the lease sweep on the daemon's own queue (ADR 0009, 0013);
* the **background jobs** (``dbos-background-jobs``, every 1 s): they enqueue *delayed* workflows
  and cancel workflows past their *timeout*. thoughtgate enqueues nothing with a delay and sets no
  workflow timeout (an approval's timeout is a ``recv`` deadline, which the notification listener
  serves).

Both are slowed, never stopped, so a DBOS feature used by mistake still works, only late; every
poller thoughtgate relies on (its queue's worker, the notification listener, the queue manager)
keeps its documented configuration. The two settings are DBOS internals, so each is changed only
when the installed DBOS has it as 3.4 does (``slow_unused_pollers`` reports what it changed, and
``tests/test_dbos_pollers.py`` fails on a DBOS without them): a DBOS that renames them costs the
saving, never a run. Call between ``DBOS(config=...)`` and ``DBOS.launch()``: both are read when
the threads start.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "INTERNAL_QUEUE_POLL_S",
    "JOBS_INTERVAL_POSTGRES_S",
    "JOBS_INTERVAL_SQLITE_S",
    "slow_unused_pollers",
]

INTERNAL_QUEUE_POLL_S: Final = 60.0
"""The internal queue's poll interval (DBOS: 1 s)."""

JOBS_INTERVAL_SQLITE_S: Final = 60.0
"""The background jobs' interval on a SQLite system database (DBOS: 1 s)."""

JOBS_INTERVAL_POSTGRES_S: Final = 4.0
"""On PostgreSQL the process that runs the jobs holds an advisory lock in an idle transaction for
the whole interval, and DBOS lets PostgreSQL end that session after 5 s idle
(``BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS``): a longer interval would have every holder's session
killed. 4 s stays under it."""


def slow_unused_pollers(*, postgres: bool) -> list[str]:
    """Slow the internal queue's worker and the background jobs of the DBOS instance just
    constructed; returns the names of the settings changed (empty when this DBOS has neither)."""
    from dbos import _workflow_commands
    from dbos._dbos import _get_dbos_instance

    changed: list[str] = []
    jobs_interval = JOBS_INTERVAL_POSTGRES_S if postgres else JOBS_INTERVAL_SQLITE_S
    if isinstance(getattr(_workflow_commands, "_BACKGROUND_JOBS_INTERVAL_SEC", None), float):
        _workflow_commands._BACKGROUND_JOBS_INTERVAL_SEC = jobs_interval
        changed.append("background jobs")
    registry = getattr(_get_dbos_instance(), "_registry", None)
    internal = getattr(registry, "get_internal_queue", None)
    if callable(internal):
        queue = internal()
        if isinstance(getattr(queue, "_polling_interval_sec", None), float):
            queue._polling_interval_sec = INTERNAL_QUEUE_POLL_S
            changed.append("internal queue")
    return changed
