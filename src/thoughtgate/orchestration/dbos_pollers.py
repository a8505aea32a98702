"""DBOS's pollers that serve nothing thoughtgate uses, slowed down (ADR 0057, 0067, 0075).

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
keeps its documented configuration. The two settings are DBOS internals, read and written
through ``dbos_private`` (ADR 0136, amendment 2): a DBOS that renames one fails the launch with a
``RuntimeFailure`` naming its version, rather than quietly losing the saving. Where a patch
depends on the *code* of what it replaces (the jobs' lock, the queue manager, the dequeue), a
DBOS whose code differs is left as it is (``tests/test_dbos_pollers.py`` fails on it). Call
between ``DBOS(config=...)`` and ``DBOS.launch()``: both are read when the threads start.

On PostgreSQL the background jobs also take a lock, so that one process of the application runs
them per interval: a transaction-scoped advisory lock that the holder keeps, *in an idle
transaction*, for the whole interval, and takes again at once. That transaction holds a snapshot
while it idles, and every ``CREATE INDEX CONCURRENTLY`` of the database (DBOS's migrations of
another schema, an operator's index) waits for it; DBOS has PostgreSQL end such a session after
5 s, so the jobs could run no less often than every 4 s. thoughtgate has the jobs run without that
lock, as DBOS itself runs them on SQLite and CockroachDB: every process runs the two statements
once a minute, which are safe side by side (a row's update waits for another's, the timeout
sweep skips locked rows), and no process holds a transaction between them (ADR 0075).

Also on PostgreSQL, DBOS's **notification listener** blocks in psycopg's ``notifies()`` on its
``LISTEN`` connection, which psycopg's blocking wait leaves every 0.1 s (``_WAIT_INTERVAL``: a
chance to handle a signal, which in DBOS's thread is never delivered) and enters again: ten
wake-ups a second of a thread that has nothing to do until a notification arrives, which wakes
it at once whatever the interval. ``wake_rarely`` has the connections of DBOS's engine wait in
steps of :data:`PSYCOPG_WAIT_STEP_S` instead (ADR 0075).

A third poller, the **queue manager** (``queue_thread``), reads the list of every queue from
the system database each second (a local interval, not configurable) to start a worker for a
queue registered since it last looked. thoughtgate needs that once: a daemon listens to one
queue, which it registers right after the launch, and ``thoughtgate run`` to none, so once the
list holds every queue this process listens to, each later read finds the same list.
``reuse_queue_list`` (called after ``DBOS.launch()``) has the manager reuse that list for
``QUEUE_LIST_REUSE_S`` instead (ADR 0067): it still checks its workers every second and
restarts one that died, and any other caller of ``list_queues`` still reads the database.

The daemon's **queue worker** asks, at every poll, whether this process's application version is
the latest one registered (a read of the versions table, a third of the poll's CPU): the answer
decides only whether it may also take workflows that carry *no* version, which thoughtgate never
creates (every workflow it starts or resumes carries ``APP_VERSION``). ``reuse_latest_version``
(called after ``DBOS.launch()``) has the system database keep that answer for
``LATEST_VERSION_REUSE_S`` (ADR 0075): a newer version registered meanwhile is seen that much
later, which changes nothing for thoughtgate's workflows.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import time
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any, Final

from thoughtgate.orchestration import dbos_private

__all__ = [
    "INTERNAL_QUEUE_POLL_S",
    "JOBS_INTERVAL_LOCKED_S",
    "JOBS_INTERVAL_S",
    "LATEST_VERSION_REUSE_S",
    "PSYCOPG_WAIT_STEP_S",
    "QUEUE_LIST_REUSE_S",
    "WORKFLOWS_APPLICATION_NAME",
    "reuse_latest_version",
    "reuse_queue_list",
    "slow_unused_pollers",
    "wake_rarely",
]

INTERNAL_QUEUE_POLL_S: Final = 60.0
"""The internal queue's poll interval (DBOS: 1 s)."""

JOBS_INTERVAL_S: Final = 60.0
"""The background jobs' interval (DBOS: 1 s), on SQLite, and on PostgreSQL once they run without
their lock."""

JOBS_INTERVAL_LOCKED_S: Final = 4.0
"""On PostgreSQL, should the jobs keep their lock (a DBOS whose lock is not recognised): the
process that runs them holds it in an idle transaction for the whole interval, and DBOS lets
PostgreSQL end that session after 5 s idle (``BACKGROUND_JOB_LOCK_IDLE_TIMEOUT_MS``), so a longer
interval would have every holder's session killed. 4 s stays under it."""

_JOBS_LOCK_SQL: Final = "pg_try_advisory_xact_lock"
"""What dbos 3.4's ``PostgresSystemDatabase.background_job_lock`` runs (how it is recognised)."""


@contextlib.contextmanager
def _every_process_runs_the_jobs(_sys_db: object, _job_name: str) -> Iterator[bool]:
    """``background_job_lock`` as DBOS has it on SQLite and CockroachDB: always granted, holding
    nothing (see the module docstring)."""
    yield True


def _jobs_run_without_their_lock() -> bool:
    """Have PostgreSQL's background jobs run without their lock; whether they now do (``False``
    when this DBOS's lock is not the one 3.4 takes, which is then left as it is)."""
    system = dbos_private.postgres_system_database_class()
    lock = vars(system).get("background_job_lock")
    if lock is None:
        dbos_private.missing("PostgresSystemDatabase", "background_job_lock")
    if lock is _every_process_runs_the_jobs:
        return True  # an earlier launch of this process
    code = getattr(getattr(lock, "__wrapped__", None), "__code__", None)
    texts = code.co_consts if isinstance(code, CodeType) else ()
    if not any(isinstance(text, str) and _JOBS_LOCK_SQL in text for text in texts):
        return False
    system.background_job_lock = _every_process_runs_the_jobs
    return True


PSYCOPG_WAIT_STEP_S: Final = 5.0
"""How long a blocking wait of a DBOS connection sleeps before it looks up (psycopg: 0.1 s). Data
on the socket ends the wait at once, whatever this is."""


def _waits_in_steps(wait: object) -> bool:
    """Whether psycopg's ``Connection.wait`` takes the step of its blocking waits as 3.3's does
    (an ``interval`` argument), and ``notifies`` waits through it."""
    import psycopg

    try:
        parameters = inspect.signature(wait).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    notifies = getattr(getattr(psycopg.Connection, "notifies", None), "__code__", None)
    return (
        "interval" in parameters and isinstance(notifies, CodeType) and "wait" in notifies.co_names
    )


WORKFLOWS_APPLICATION_NAME: Final = "thoughtgate:workflows"
"""The ``application_name`` of the connections of DBOS's engine on PostgreSQL (thoughtgate's
engine settings give it, ``durable.database_settings``): how :func:`wake_rarely` tells them
apart from any other SQLAlchemy connection of the process -- an application that embeds
thoughtgate may have its own, whose blocking waits keep psycopg's step (a Ctrl-C in a thread
that waits is seen within 0.1 s, not 5 s)."""


def _step_rarely(dbapi_connection: Any, _record: Any) -> None:
    """SQLAlchemy's ``connect`` event: a new connection of DBOS's engine (named
    :data:`WORKFLOWS_APPLICATION_NAME`) waits in long steps; any other is left as it is."""
    import psycopg

    if (
        isinstance(dbapi_connection, psycopg.Connection)
        and dbapi_connection.info.get_parameters().get("application_name")
        == WORKFLOWS_APPLICATION_NAME
    ):
        dbapi_connection.wait = functools.partial(  # type: ignore[method-assign]
            psycopg.Connection.wait, dbapi_connection, interval=PSYCOPG_WAIT_STEP_S
        )


def wake_rarely() -> bool:
    """Have every connection of DBOS's engine (:data:`WORKFLOWS_APPLICATION_NAME`) that
    SQLAlchemy opens from now on in this process wait in steps of :data:`PSYCOPG_WAIT_STEP_S`;
    whether it will (``False`` when this psycopg's waits are not as 3.3's, left as they are).
    Call before ``DBOS.launch()``, which opens the listener's connection."""
    import psycopg
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    if not _waits_in_steps(psycopg.Connection.wait):
        return False
    if not event.contains(Pool, "connect", _step_rarely):
        event.listen(Pool, "connect", _step_rarely)
    return True


def slow_unused_pollers(*, postgres: bool) -> list[str]:
    """Slow the internal queue's worker and the background jobs of the DBOS instance just
    constructed, and on PostgreSQL have the jobs run without their lock; returns the names of the
    settings changed. A DBOS without one of the settings raises a ``RuntimeFailure`` naming its
    version (``dbos_private``)."""
    changed: list[str] = []
    unlocked = postgres and _jobs_run_without_their_lock()
    if unlocked:
        changed.append("background jobs' lock")
    if postgres and wake_rarely():
        changed.append("notification listener")
    jobs_interval = JOBS_INTERVAL_LOCKED_S if postgres and not unlocked else JOBS_INTERVAL_S
    dbos_private.set_background_jobs_interval(jobs_interval)
    changed.append("background jobs")
    dbos_private.set_polling_interval(dbos_private.internal_queue(), INTERNAL_QUEUE_POLL_S)
    changed.append("internal queue")
    return changed


QUEUE_LIST_REUSE_S: Final = 30.0
"""How long DBOS's queue manager reuses a list of queues that holds every queue this process
listens to (DBOS: it reads the list every 1 s)."""


class _ManagerList:
    """``SystemDatabase.list_queues`` of one DBOS instance, answering its queue manager from the
    last list that held every listened queue while that list is younger than ``reuse_s``."""

    def __init__(
        self,
        read: Callable[..., list[Any]],
        manager: CodeType,
        listening: Callable[[], list[str] | None],
        reuse_s: float,
    ) -> None:
        self._read = read
        self._manager = manager
        self._listening = listening
        self._reuse_s = reuse_s
        self._kept: list[Any] | None = None
        self._kept_at = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> list[Any]:
        if sys._getframe(1).f_code is not self._manager:  # noqa: SLF001 - any other caller reads
            return self._read(*args, **kwargs)
        now = time.monotonic()
        if self._kept is not None and now - self._kept_at < self._reuse_s:
            return list(self._kept)
        found = self._read(*args, **kwargs)
        listening = self._listening()
        complete = listening is not None and set(listening) <= {q.name for q in found}
        # A list without a queue this process listens to is read again next time: the queue
        # may be registered in the meantime (the daemon registers its own after the launch).
        self._kept, self._kept_at = (list(found), now) if complete else (None, 0.0)
        return found


def reuse_queue_list(*, reuse_s: float = QUEUE_LIST_REUSE_S) -> bool:
    """Have the queue manager of the DBOS instance just launched reuse its list of queues (see
    the module docstring); whether it was changed (``False`` when this DBOS's manager does not
    read ``list_queues`` as 3.4's does, or listens to every queue)."""
    dbos = dbos_private.instance()
    manager = dbos_private.queue_manager_code()
    if not isinstance(manager, CodeType) or "list_queues" not in manager.co_names:
        return False
    sys_db = dbos_private.system_database()
    read = sys_db.list_queues  # public to the system database
    if isinstance(read, _ManagerList):
        return False
    if dbos_private.listening_queues(dbos) is None:
        return False  # it listens to every queue, including those registered later

    def listening() -> list[str] | None:
        return dbos_private.listening_queues(dbos)

    sys_db.list_queues = _ManagerList(read, manager, listening, reuse_s)
    return True


LATEST_VERSION_REUSE_S: Final = 30.0
"""How long the system database keeps its answer to whether this process's application version
is the latest (DBOS: it reads it at every dequeue)."""


class _KeptAnswer:
    """``SystemDatabase._is_latest_version`` of one DBOS instance, answering from its last read
    of an application version while that read is younger than ``reuse_s``."""

    def __init__(self, read: Callable[..., bool], reuse_s: float) -> None:
        self._read = read
        self._reuse_s = reuse_s
        self._kept: dict[str, tuple[bool, float]] = {}

    def __call__(self, app_version: str, c: Any = None) -> bool:
        now = time.monotonic()
        kept = self._kept.get(app_version)
        if kept is not None and now - kept[1] < self._reuse_s:
            return kept[0]
        answer = bool(self._read(app_version) if c is None else self._read(app_version, c))
        self._kept[app_version] = (answer, now)
        return answer


def reuse_latest_version(*, reuse_s: float = LATEST_VERSION_REUSE_S) -> bool:
    """Have the system database of the DBOS instance just launched keep its answer to whether
    this application version is the latest (see the module docstring); whether it was changed
    (``False`` when this DBOS's dequeue does not ask ``_is_latest_version`` as 3.4's does)."""
    dequeue = getattr(dbos_private.start_queued_workflows(), "__code__", None)
    if not isinstance(dequeue, CodeType) or "_is_latest_version" not in dequeue.co_names:
        return False
    sys_db = dbos_private.system_database()
    read = dbos_private.is_latest_version(sys_db)
    code = getattr(read, "__code__", None)
    if isinstance(read, _KeptAnswer) or not isinstance(code, CodeType):
        return False  # already kept, or not 3.4's
    if "_latest_application_version" not in code.co_names:
        return False
    dbos_private.set_is_latest_version(sys_db, _KeptAnswer(read, reuse_s))
    return True
