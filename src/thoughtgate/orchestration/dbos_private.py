"""Every use thoughtgate makes of DBOS's private names, in one place (ADR 0136, amendment 2).

DBOS offers no public way to do a few things thoughtgate needs: ask whether the process has
built its instance (``durable.prebuilt_dbos``), put an ended workflow back on its queue with its
checkpoints (``durable._enqueue_finished``), count the workflows its queue worker is running
(``durable_starts``), slow the pollers that serve nothing thoughtgate uses
(``dbos_pollers``). Each of those reads a name DBOS keeps private, and a DBOS release may rename
any of them. Before, most of those reads were ``getattr(..., None)`` that quietly skipped the
saving when the name was gone, so a DBOS upgrade could change what a daemon does with nobody
told. Here every such name is read through :func:`_attribute`, which raises a
:class:`~thoughtgate.errors.RuntimeFailure` naming the name, the installed dbos version and what
to do; :data:`PRIVATE_NAMES` lists them all, and ``tests/test_dbos_private.py`` checks each
against the installed dbos, so an upgrade that moves one fails the suite first.

Nothing else under ``src/`` may name a private DBOS module or attribute (the same test greps for
it). The pollers still check the *shape* of what they patch (the SQL a lock runs, the names a
function calls), and leave a DBOS whose code differs as it is; ``tests/test_dbos_pollers.py``
fails on such a DBOS.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final, NoReturn

from dbos import error as dbos_error  # public (dbos.__all__): the module dbos._error

from thoughtgate.errors import RuntimeFailure

if TYPE_CHECKING:
    from dbos import DBOS

__all__ = [
    "PRIVATE_NAMES",
    "DBOSWorkflowConflictIDError",
    "active_workflows",
    "background_jobs_interval",
    "built_instance",
    "dbos_version",
    "instance",
    "internal_queue",
    "is_latest_version",
    "listening_queues",
    "missing",
    "now_ms_sql",
    "postgres_system_database_class",
    "queue_manager_code",
    "set_background_jobs_interval",
    "set_is_latest_version",
    "set_polling_interval",
    "set_workflow_step",
    "start_queued_workflows",
    "system_database",
    "system_database_class",
    "workflow_filter",
    "workflow_step",
]

PRIVATE_NAMES: Final[tuple[tuple[str, str], ...]] = (
    ("dbos.error", "DBOSWorkflowConflictIDError"),
    ("dbos._dbos", "_dbos_global_instance"),
    ("dbos._dbos", "_get_dbos_instance"),
    ("DBOS", "_sys_db"),
    ("DBOS", "_registry"),
    ("DBOS", "_active_workflows_set"),
    ("DBOS", "_listening_queues"),
    ("dbos._dbos.DBOSRegistry", "get_internal_queue"),
    ("dbos.Queue", "_polling_interval_sec"),
    ("dbos._workflow_commands", "_BACKGROUND_JOBS_INTERVAL_SEC"),
    ("dbos._sys_db", "SystemDatabase"),
    ("dbos._sys_db.SystemDatabase", "_wf"),
    ("dbos._sys_db.SystemDatabase", "_now_ms_sql"),
    ("dbos._sys_db.SystemDatabase", "_is_latest_version"),
    ("dbos._sys_db.SystemDatabase", "start_queued_workflows"),
    ("dbos._sys_db.SystemDatabase", "list_queues"),
    ("dbos._sys_db.SystemDatabase", "tables"),
    ("dbos._sys_db_postgres", "PostgresSystemDatabase"),
    ("dbos._sys_db_postgres.PostgresSystemDatabase", "background_job_lock"),
    ("dbos._queue", "queue_thread"),
    ("dbos._context", "get_local_dbos_context"),
)
"""Each private name thoughtgate reads, as (where, name): a module, a class of one, or ``DBOS``
(and ``dbos.Queue``) for an attribute of their instances. (``dbos.error`` is public, but DBOS
documents none of its exception classes: the one thoughtgate catches is read here too.)"""

_MISSING = object()


def dbos_version() -> str:
    """The installed dbos's version, for messages."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dbos")
    except PackageNotFoundError:  # imported from a path, not installed
        return "(version unknown)"


def missing(where: str, name: str) -> NoReturn:
    """Raise the ``RuntimeFailure`` that says this dbos has no private ``where.name``."""
    raise RuntimeFailure(
        f"dbos {dbos_version()} has no {where}.{name}, which thoughtgate uses (it is private to "
        "dbos; ADR 0136, amendment 2). Install the dbos version thoughtgate was released with, "
        "or set durability.enabled = false"
    )


def _attribute(owner: object, name: str, where: str) -> Any:
    """``owner.name``, or a ``RuntimeFailure`` saying that this dbos has no such private name."""
    found = getattr(owner, name, _MISSING)
    if found is _MISSING:
        missing(where, name)
    return found


DBOSWorkflowConflictIDError: Final[type[BaseException]] = _attribute(
    dbos_error, "DBOSWorkflowConflictIDError", "dbos.error"
)
"""What DBOS raises when an execution no longer owns its workflow (``durable`` catches it).
Read when this module is imported, which is the durable launch (never with durability off):
a dbos without it fails that import with :func:`missing`'s ``RuntimeFailure``."""


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise RuntimeFailure(
            f"dbos {dbos_version()} has no module {name}, which thoughtgate reads (it is "
            "private to dbos; ADR 0136). Install the dbos version thoughtgate was released "
            "with, or set durability.enabled = false"
        ) from exc


def built_instance() -> DBOS | None:
    """The DBOS instance this process has built, if any: ``dbos._dbos._dbos_global_instance``
    (DBOS has no public way to ask without acting on it). Should a DBOS release move it, or keep
    anything there but an instance or ``None``, this raises saying so instead of answering
    "none": the launch would otherwise run thoughtgate's workflows on an application's instance
    unchecked (ADR 0136, amendment 1)."""
    from dbos import DBOS

    found = vars(_module("dbos._dbos")).get("_dbos_global_instance", _MISSING)
    if found is None or isinstance(found, DBOS):
        return found
    raise RuntimeFailure(
        f"cannot launch durable runs: dbos {dbos_version()} no longer keeps its instance in "
        "dbos._dbos._dbos_global_instance, so thoughtgate cannot tell whether this process built "
        "one before this launch (ADR 0136). Install the dbos version thoughtgate was released "
        "with, or set durability.enabled = false"
    )


def instance() -> DBOS:
    """The DBOS instance of the process (``dbos._dbos._get_dbos_instance``)."""
    get = _attribute(_module("dbos._dbos"), "_get_dbos_instance", "dbos._dbos")
    built: DBOS = get()
    return built


def system_database() -> Any:
    """The launched instance's system database (``DBOS._sys_db``)."""
    return _attribute(instance(), "_sys_db", "DBOS")


def workflow_filter(system: Any, table: Any, workflow_id: str) -> Any:
    """The system database's ``WHERE`` terms for one workflow (``SystemDatabase._wf``)."""
    return _attribute(system, "_wf", "SystemDatabase")(table, workflow_id)


def now_ms_sql(system: Any) -> Any:
    """The system database's SQL for now, in ms (``SystemDatabase._now_ms_sql``)."""
    return _attribute(system, "_now_ms_sql", "SystemDatabase")()


def active_workflows() -> Any:
    """The workflows executing in this process, with their queues: what the queue worker counts
    against ``worker_concurrency`` (``DBOS._active_workflows_set``)."""
    return _attribute(instance(), "_active_workflows_set", "DBOS")


def listening_queues(dbos: DBOS) -> list[str] | None:
    """The queues ``dbos`` listens to; ``None`` for every queue (``DBOS._listening_queues``)."""
    names: list[str] | None = _attribute(dbos, "_listening_queues", "DBOS")
    return names


def internal_queue() -> Any:
    """DBOS's internal queue (``DBOS._registry.get_internal_queue()``)."""
    registry = _attribute(instance(), "_registry", "DBOS")
    return _attribute(registry, "get_internal_queue", "DBOSRegistry")()


def set_polling_interval(queue: Any, seconds: float) -> None:
    """Have ``queue``'s worker poll every ``seconds`` (``Queue._polling_interval_sec``)."""
    _attribute(queue, "_polling_interval_sec", "Queue")
    queue._polling_interval_sec = seconds


def background_jobs_interval() -> float:
    """The background jobs' interval (``dbos._workflow_commands._BACKGROUND_JOBS_INTERVAL_SEC``)."""
    where = "dbos._workflow_commands"
    interval: float = _attribute(_module(where), "_BACKGROUND_JOBS_INTERVAL_SEC", where)
    return interval


def set_background_jobs_interval(seconds: float) -> None:
    """Have the background jobs run every ``seconds`` (read when their thread starts)."""
    background_jobs_interval()
    _module("dbos._workflow_commands")._BACKGROUND_JOBS_INTERVAL_SEC = seconds


def system_database_class() -> Any:
    """``dbos._sys_db.SystemDatabase``."""
    return _attribute(_module("dbos._sys_db"), "SystemDatabase", "dbos._sys_db")


def postgres_system_database_class() -> Any:
    """``dbos._sys_db_postgres.PostgresSystemDatabase``."""
    where = "dbos._sys_db_postgres"
    return _attribute(_module(where), "PostgresSystemDatabase", where)


def queue_manager_code() -> Any:
    """The code of DBOS's queue manager thread (``dbos._queue.queue_thread``)."""
    return _attribute(_module("dbos._queue"), "queue_thread", "dbos._queue").__code__


def start_queued_workflows() -> Any:
    """``SystemDatabase.start_queued_workflows``: the dequeue (its code is checked, not run)."""
    return _attribute(system_database_class(), "start_queued_workflows", "SystemDatabase")


def is_latest_version(system: Any) -> Any:
    """The system database's ``_is_latest_version``, bound to it."""
    return _attribute(system, "_is_latest_version", "SystemDatabase")


def set_is_latest_version(system: Any, answer: Any) -> None:
    """Have ``system`` answer ``_is_latest_version`` with ``answer``."""
    is_latest_version(system)
    system._is_latest_version = answer


def _workflow_context() -> Any:
    """The DBOS context of the workflow the current task executes
    (``dbos._context.get_local_dbos_context``)."""
    where = "dbos._context"
    context = _attribute(_module(where), "get_local_dbos_context", where)()
    if context is None or not context.is_workflow():
        raise RuntimeFailure("no DBOS workflow is executing in this task")
    return context


def workflow_step() -> int:
    """The number of the last step the workflow executing in this task took
    (``DBOSContext.function_id``; 0 before its first)."""
    step: int = _attribute(_workflow_context(), "function_id", "DBOSContext")
    return step


def set_workflow_step(step: int) -> None:
    """Have the workflow executing in this task take its next step as ``step + 1``: from
    :func:`workflow_step`'s answer, its steps from there on replay their checkpoints, as a
    recovery's do (ADR 0152)."""
    context = _workflow_context()
    _attribute(context, "function_id", "DBOSContext")
    context.function_id = step
