"""Durable execution on DBOS Transact (ADR 0013): a run is a workflow, its steps are checkpoints.

DBOS runs inside this process and keeps its checkpoints in a *system database* beside the store:
a file ``<store>.workflows`` next to a SQLite store, a schema ``<schema>_workflows`` in the
PostgreSQL database of a PostgreSQL store. Each process is one DBOS *executor*, named by its
run-lease owner id (``store.leases.Owner``), so an executor id is never reused.

What DBOS does for us:

* the workflow ``thoughtgate.run`` (one per run, its id is the run id) calls the runtime, whose
  every step (``engine.steps``) goes through :class:`DbosSteps` -- its JSON result is recorded, and
  a resumed workflow gets it back instead of running the step again;
* queues: a daemon listens to one queue, named after its tools and its concurrency, and takes at
  most ``durability.concurrency`` runs from it at once; a run goes to a queue whose replicas have
  all of its tools; a key's Nth open run gets priority N, so one key's backlog never starves
  another key's first run;
* durable messages and timers: an approval waits with ``recv`` (its timeout is recorded when it
  starts, and a resumed wait gets only what is left counted from the request's event, so it runs
  from the request across restarts), and any process answers it with ``send``;
* recovery: ``resume_workflow`` puts a run whose executor died back on its queue (a workflow that
  ended while its run is open goes back the same way, :func:`_enqueue_finished`, ADR 0065);
  replay does the rest;
* fencing: each taking of a workflow carries its own token, and an execution that lost its
  workflow to another has its checkpoints refused -- it hands its run back (ADR 0065).

A run of one model task without tools has nothing to checkpoint in its first execution, so that
execution writes no workflow (:class:`UnwrittenSteps`; a daemon's, ADR 0031, and one a process
executes itself, as ``thoughtgate run`` does, ADR 0046): the run's lease says who executes it,
and its workflow is written by :meth:`DurableEngine.resume` if it has to resume.

What stays ours: detecting that an executor died (run leases, ADR 0009), deciding which runs
resume (``orchestration.resume``), and the event log, which steps keep exactly-once by checking it
on resume (``engine.steps.ResumeLog``). Step results are JSON (:class:`_Json`), never pickles.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import hashlib
import heapq
import json
import logging
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeAlias, TypeVar, cast

import psycopg
from dbos import DBOS, Serializer, SetEnqueueOptions, SetWorkflowID, WorkflowStatus

from thoughtgate.config import DurabilityConfig
from thoughtgate.disclosure import kept_detail
from thoughtgate.engine.steps import ResumeLog, StepCodec
from thoughtgate.errors import (
    SAID,
    ReplayedFailure,
    RunTakenOverError,
    RuntimeFailure,
    ThoughtgateError,
    UsageError,
    WorkflowFailed,
    chained,
    exception_line,
    failure_detail,
    failure_kind,
    failure_text,
    quoting,
    store_outage,
)
from thoughtgate.orchestration import dbos_logs, dbos_private
from thoughtgate.orchestration.dbos_pollers import (
    WORKFLOWS_APPLICATION_NAME,
    reuse_latest_version,
    reuse_queue_list,
    slow_unused_pollers,
)
from thoughtgate.orchestration.durable_setup import setting_up
from thoughtgate.orchestration.durable_starts import BACKLOG_POLL_DIVISOR, Slot, Starts
from thoughtgate.orchestration.leases import LeaseKeeper
from thoughtgate.orchestration.outages import STORE_BACK
from thoughtgate.store.base import UNCLAIMED, EventStore, Holder
from thoughtgate.store.durable import DurableRunStore
from thoughtgate.store.leases import (
    UNWRITTEN,
    WORKFLOW_ENDED,
    WORKFLOW_TAKEN_OVER,
    close_run_interrupted,
    suspend,
    suspended_record,
)
from thoughtgate.store.pg_errors import describe_target
from thoughtgate.store.pg_errors import translate_error as translate_pg_error
from thoughtgate.store.records import OPEN_RUN_STATUSES
from thoughtgate.store.sqlite_thread import translate_error as translate_sqlite_error


class DurableRuntime(Protocol):
    """What the engine needs of the runtime it executes runs for
    (``orchestration.runtime.Runtime``)."""

    store: EventStore
    leases: LeaseKeeper

    def attach_durable(self, engine: DurableEngine) -> None: ...

    def forget_admitted(self, run_id: str) -> object: ...

    def claimed_from_line(self, run_id: str, lease_until: float) -> None: ...

    async def close_unbegun(self) -> None: ...

    async def execute_workflow(
        self,
        run_id: str,
        *,
        unwritten: bool = False,
        holding: Callable[[Holder], None] | None = None,
    ) -> str: ...

    async def stop_started(self, run_id: str, reason: str, done: asyncio.Future[Any]) -> None: ...

    @property
    def executing(self) -> frozenset[str]: ...


__all__ = ["APP_VERSION", "DbosSteps", "DurableEngine", "DurableRuntime", "queue_name"]

log = logging.getLogger("thoughtgate.durable")
T = TypeVar("T")

APP_VERSION = "thoughtgate-run-2"
"""The workflow's version: runs resume only in processes whose workflow takes the same steps in
the same order. Bump it when the sequence of steps changes. A run whose workflow another version
recorded is closed when it would resume (:meth:`DurableEngine.resume`), never left waiting for a
process that will not come. 2: recording a turn and starting or ending a task are effects, not
checkpoints (``engine.steps``)."""
WORKFLOW = "thoughtgate.run"

Place: TypeAlias = Literal["start", "wait", "queue"]
"""Where a new run goes (:meth:`DurableEngine.reserve`)."""


class _Json(Serializer):
    """Checkpoints, workflow inputs and messages as JSON: readable, and nothing is unpickled.

    A workflow that raised is recorded ``ERROR`` with its exception as ``{"$exception": {"type":
    ..., "message": ...}}`` (the message as ``errors.failure_text`` gives it: never a driver's
    details), read back as a :class:`~thoughtgate.errors.WorkflowFailed` naming the class only
    (ADR 0082: the recorded words are data read from a database). Without it DBOS could
    not record the error (an exception is no JSON, nor is its fallback), and the workflow stayed
    ``PENDING`` under a live executor -- taken, as far as any sweep could tell, until a lease
    had passed (ADR 0065)."""

    def serialize(self, data: Any) -> str:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=_exception)

    def deserialize(self, serialized_data: str) -> Any:
        value = json.loads(serialized_data)
        if isinstance(value, dict) and value.keys() == {_EXCEPTION}:
            return _workflow_failed(value[_EXCEPTION])
        return value

    def name(self) -> str:
        return "thoughtgate_json"


_EXCEPTION = "$exception"


def _exception(value: object) -> dict[str, Any]:
    """JSON for what ``json`` cannot encode itself: an exception (a workflow's error)."""
    if isinstance(value, BaseException):  # described as readers see it (ADR 0069)
        return {_EXCEPTION: {"type": type(value).__name__, "message": failure_text(value)}}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _workflow_failed(raised: object) -> WorkflowFailed:
    """The error a workflow recorded (:func:`_exception`), as it is raised again; a record of
    another shape (another version's, a hand edit) is an ``Exception`` with no words."""
    fields = cast("dict[str, object]", raised) if isinstance(raised, dict) else {}
    kind, said = fields.get("type"), fields.get("message")
    return WorkflowFailed(
        kind if isinstance(kind, str) else "Exception", said if isinstance(said, str) else None
    )


def queue_name(tools: Sequence[str], concurrency: int) -> str:
    """The queue of replicas with exactly these tools and this concurrency."""
    digest = hashlib.sha256("\x1f".join(sorted(set(tools))).encode("utf-8")).hexdigest()[:12]
    return f"thoughtgate-runs-{digest}-c{concurrency}"


@dataclass(frozen=True, slots=True)
class _Location:
    url: str
    schema: str | None


def _system_database(store: EventStore) -> _Location:
    """Where the workflows of ``store``'s runs are kept (beside it, never inside it)."""
    from thoughtgate.store.private_files import create_private_file

    path = getattr(store, "path", None)
    if isinstance(path, Path) and str(path) != ":memory:":
        target = path.with_name(f"{path.name}.workflows")
        with contextlib.suppress(OSError):
            create_private_file(target)  # 0600 before SQLite creates it
        with contextlib.suppress(sqlite3.Error):  # DBOS says what is wrong with the file
            _write_ahead(target)
        return _Location(f"sqlite:///{target}", None)
    conninfo = getattr(store, "conninfo", None)
    schema = getattr(store, "schema", None)
    if isinstance(conninfo, str) and isinstance(schema, str):
        return _Location(conninfo, f"{schema}_workflows")
    raise UsageError(
        "durable runs need a SQLite or PostgreSQL store; this one keeps nothing across processes"
    )


_WAL_SWITCH_WAIT_S = 30.0
"""How long the switch waits for another process opening the same new file (the store's own
busy timeout): without the wait, the loser of that race left the file in rollback-journal mode."""


def _write_ahead(target: Path) -> None:
    """Put the workflows file in WAL mode (a property of the file; DBOS leaves SQLite's rollback
    journal): a checkpoint then costs one append and one fsync of the log instead of a journal
    file written, synced and deleted, readers do not wait for a writer, and each commit is as
    durable as before (``synchronous`` stays ``FULL``, as for the store)."""
    from thoughtgate.store.sqlite_schema import ensure_wal

    with contextlib.closing(sqlite3.connect(target)) as conn:
        ensure_wal(conn, busy_timeout=_WAL_SWITCH_WAIT_S)


_ENGINE: dict[str, Any] = {"hide_parameters": True}
"""For DBOS's engine on any database: a failed statement's error never carries its parameters
(SQLAlchemy appends them by default), which are a checkpoint's inputs and outputs -- a model
turn's reasoning and carriers among them -- and an error's text can reach a run's public
``error`` (``errors.failure_text`` keeps only its first line too)."""

_SQLITE_ENGINE: dict[str, Any] = {
    # One connection, which DBOS's threads take in turn: SQLite has one writer at a time, and
    # DBOS begins each transaction with the write lock (BEGIN IMMEDIATE), so more connections
    # only wait for it inside SQLite's busy handler, which sleeps with a back-off of up to
    # 100 ms before trying again; the pool hands its one connection on as soon as it is free
    # (ADR 0029). Other processes on the file still wait in the busy handler, as before.
    "sys_db_pool_size": 1,
    # A file's connection cannot drop as a server's can: no ``SELECT 1`` before each transaction
    # (DBOS pings every connection it takes from the pool by default).
    "db_engine_kwargs": {"pool_pre_ping": False, **_ENGINE},
}


def database_settings(location: _Location) -> dict[str, Any]:
    """DBOS's settings for where its workflows are kept: the schema on PostgreSQL, and its
    SQLAlchemy engine's arguments (:data:`_ENGINE` on any database; on SQLite one connection,
    no pings)."""
    if location.schema is not None:
        # Named, so that ``dbos_pollers.wake_rarely`` finds these connections and no other's.
        named = {"connect_args": {"application_name": WORKFLOWS_APPLICATION_NAME}}
        return {"dbos_system_schema": location.schema, "db_engine_kwargs": {**_ENGINE, **named}}
    return {
        key: dict(value) if isinstance(value, dict) else value
        for key, value in _SQLITE_ENGINE.items()
    }


def workflows_database(location: _Location) -> str:
    """The workflows database of ``location`` as an error names it: a SQLite file's path, or a
    PostgreSQL database's host, port, name and schema (never its user's password)."""
    if location.schema is not None:
        return describe_target(location.url, location.schema)
    return f"SQLite database {location.url.removeprefix('sqlite:///')}"


def launch_failed(exc: Exception, location: _Location, step: str) -> ThoughtgateError:
    """The error of a launch that failed at ``step`` (ADR 0125): what failed, and where.

    A driver's error (found where SQLAlchemy or DBOS wrapped it) is translated as the store
    translates its own (``StoreUnavailableError`` for a file that cannot be opened or a server
    that refuses, ...); thoughtgate's own errors (the set-up lock's) keep their words; any other
    is a ``RuntimeFailure`` quoting the first line of its text (:func:`~thoughtgate.errors.quoting`:
    a log shows its class and code instead)."""
    if isinstance(exc, ThoughtgateError):
        return exc
    action = f"launch durable runs ({step})"
    where = workflows_database(location)
    for cause in chained(exc):
        if isinstance(cause, ThoughtgateError):
            return RuntimeFailure(f"cannot {action}: {failure_text(cause)}")
        if isinstance(cause, psycopg.Error):
            return translate_pg_error(cause, action, where)
        if isinstance(cause, sqlite3.Error):
            return translate_sqlite_error(cause, where.removeprefix("SQLite database "), action)
    first = next(iter(str(exc).strip().splitlines()), "") or type(exc).__name__
    return quoting(RuntimeFailure, f"cannot {action} on {where}: {SAID}", exc, _unsecret(first))


def prebuilt_dbos() -> DBOS | None:
    """The DBOS instance this process has already built, if any (DBOS keeps one per process).

    A read of DBOS's private ``_dbos_global_instance`` (``dbos_private.built_instance``, ADR 0136
    amendments 1 and 2). Should a DBOS release move it, this raises a ``RuntimeFailure`` saying
    so instead of answering "none": the launch would otherwise run thoughtgate's workflows on an
    application's instance unchecked. ``test_durable_launch`` and ``test_dbos_private`` fail on
    such a release before anyone runs it."""
    return dbos_private.built_instance()


def foreign_dbos(location: _Location) -> UsageError:
    """The error of a launch in a process that already has a DBOS instance it did not build
    (ADR 0136): DBOS would hand that instance back, configured by whoever built it -- its
    database, its serializer, its executor, its queues -- and thoughtgate's runs would be
    checkpointed where the user never said, in a form thoughtgate cannot read back."""
    return UsageError(
        "cannot launch durable runs: this process already has a DBOS instance, built before "
        "this launch and not by thoughtgate (DBOS allows one per process, and thoughtgate's "
        "durable runs need one it configured: its workflows database is "
        f"{workflows_database(location)}). Run thoughtgate's durable runs in a process that "
        "builds no DBOS of its own (a thoughtgate daemon the application calls), destroy that "
        "instance before this launch (DBOS.destroy()), or set durability.enabled = false"
    )


def _unsecret(text: str) -> str:
    """``text`` with any password a URL in it carries replaced by ``…`` (a library may quote
    the URL it was given)."""
    return re.sub(r"(\w+://[^/\s:@]*:)[^@\s/]*@", r"\1…@", text)


class DbosSteps:
    """:class:`~thoughtgate.engine.steps.Steps` whose steps DBOS checkpoints.

    A step's exception is recorded as a result too (``{"raised": ...}``) and raised again on
    replay -- as the same exception object when it happened in this process, else as an equivalent
    ``RuntimeFailure`` (a thoughtgate error, its public text) or a ``ReplayedFailure`` naming
    the class, with its first line where the run's ``mode`` records a failure's words
    (``disclosure.kept_detail``): a ``hidden`` run's checkpoints keep none (ADR 0073). A
    replayed failure is described to readers by the original class (ADR 0079), as the first
    execution described it.
    """

    def __init__(
        self, resumed: ResumeLog | None, *, mode: str = "hidden", last_task: bool = False
    ) -> None:
        self.resumed = resumed
        self.mode = mode
        self.in_last_task = last_task
        self._raised: dict[str, BaseException] = {}

    def last_task(self) -> DbosSteps:
        steps = type(self)(self.resumed, mode=self.mode, last_task=True)
        steps._raised = self._raised
        return steps

    def checkpoints(self, *, ending: bool) -> bool:
        return not (ending and self._ends_unrecorded())

    def _ends_unrecorded(self) -> bool:
        """A result that ends the last task of a first execution is not checkpointed."""
        return self.in_last_task and self.resumed is None

    async def run(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        codec: StepCodec,
        *,
        ends: Callable[[T], bool] | None = None,
    ) -> T:
        if ends is not None and self._ends_unrecorded():
            return await self._run_last(name, fn, codec, ends)

        async def step() -> dict[str, Any]:
            return await self._attempt(name, fn, codec)

        try:
            recorded: dict[str, Any] = await DBOS.run_step_async({"name": name}, step)
        except _Unrecorded as unrecorded:  # DBOS recorded nothing: a resume runs it again
            raise unrecorded.error from None
        value: T = self._result(name, recorded, codec)
        return value

    async def _run_last(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        codec: StepCodec,
        ends: Callable[[T], bool],
    ) -> T:
        """A step of the run's last task in its first execution: nothing is recorded for it
        yet (a first execution's steps all run), so ``fn`` runs before the checkpoint is
        decided. A result that ends the task ends the run's execution: the run's ending commit
        records it in the log, and no checkpoint follows that a resume would have to line up
        with, so it is not checkpointed (ADR 0029). A resume of an execution stopped before
        that commit finds the turn unrecorded and asks again, as for a turn under way. Any
        other result, or an exception, is checkpointed as :meth:`run` would."""
        done: list[T] = []

        async def once() -> T:
            done.append(await fn())
            return done[0]

        try:
            outcome = await self._attempt(name, once, codec)
        except _Unrecorded as unrecorded:
            raise unrecorded.error from None
        if done and ends(done[0]):
            return done[0]  # as a direct run's step returns it

        async def step() -> dict[str, Any]:
            return outcome

        recorded: dict[str, Any] = await DBOS.run_step_async({"name": name}, step)
        value: T = self._result(name, recorded, codec)
        return value

    async def _attempt(
        self, name: str, fn: Callable[[], Awaitable[T]], codec: StepCodec
    ) -> dict[str, Any]:
        try:
            value = await fn()
        except Exception as exc:
            if store_outage(exc) is not None:
                # Not a result: the execution waits for the store and runs the step again
                # (ADR 0152). A checkpoint of it would fail every resume the same way.
                raise _Unrecorded(exc) from exc
            self._raised[name] = exc
            ours = isinstance(exc, ThoughtgateError)
            # Ours: replayed as a RuntimeFailure whose text is public, so a provider's words
            # never go into it (ADR 0071). Another's: its first line, where the run records a
            # failure's words -- never on a hidden run, never the lines after (ADR 0073).
            if ours:
                message = failure_text(exc)
            else:
                said = kept_detail(self.mode, exception_line(exc))  # "Type: first line"
                message = said.partition(": ")[2] if said else ""
            return {"raised": {"message": message, "type": failure_kind(exc), "ours": ours}}
        return {"ok": codec.encode(value)}

    def _result(self, name: str, recorded: dict[str, Any], codec: StepCodec) -> Any:
        raised = recorded.get("raised")
        if raised is not None:
            original = self._raised.pop(name, None)
            if original is not None:
                raise original
            if raised.get("ours"):
                raise RuntimeFailure(str(raised.get("message", "")))
            raise ReplayedFailure(str(raised.get("type")), raised.get("message"))
        return codec.decode(recorded.get("ok"))

    async def effect(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        """No checkpoint: ``fn`` finds its own events in the log on a resume (``Steps``)."""
        await fn()


class _Unrecorded(BaseException):
    """A step that failed because its store was unavailable, carried out of the step as what
    DBOS does not checkpoint (it records an ``Exception``'s outcome, not a ``BaseException``'s)
    and raised again as ``error`` once past it."""

    def __init__(self, error: Exception) -> None:
        super().__init__(type(error).__name__)
        self.error = error


class UnwrittenSteps(DbosSteps):
    """The steps of a run's first execution without a workflow (ADR 0031): a run of one model
    task without tools, whose first execution keeps no checkpoint -- its effects are recorded by
    the event log, and its one step with a result, the model turn that ends it, by the run's
    ending commit (ADR 0029). Should a step need a checkpoint after all (a turn with tool calls
    nobody offered, which the model may still send), the execution stops there with the run
    open (``UNWRITTEN``) and the engine (``DurableEngine._execute_unwritten``) hands the run
    over to a workflow in this process, which resumes it from the log like any resume."""

    async def run(
        self,
        name: str,
        fn: Callable[[], Awaitable[T]],
        codec: StepCodec,
        *,
        ends: Callable[[T], bool] | None = None,
    ) -> T:
        if ends is not None and self._ends_unrecorded():
            value = await fn()  # an exception ends the run, as for a direct run
            if ends(value):
                return value
        raise asyncio.CancelledError(UNWRITTEN)


class DurableEngine:
    """This process's DBOS executor. One per process (DBOS is a process-wide singleton)."""

    current: ClassVar[DurableEngine | None] = None

    def __init__(
        self, runtime: DurableRuntime, location: _Location, config: DurabilityConfig
    ) -> None:
        self.runtime = runtime
        self.location = location
        self.config = config
        self.owner = runtime.leases.owner
        self.queue: str | None = None
        """The queue this process takes runs from (``listen``), if any."""
        self.starts: Starts | None = None
        """Whether a new run of that queue starts here at once (``submit``)."""
        self._reserved: dict[str, tuple[Slot, bool]] = {}
        """New runs of that queue given a slot before their admission (``reserve``), not yet
        started (``submit``); whether each starts without a workflow."""
        self._holding: dict[str, bool] = {}
        """New runs :meth:`reserve` let wait here, not yet submitted."""
        self._line: list[tuple[int, int, str, bool]] = []
        """Runs waiting here for a slot: a heap of (priority, arrival, run id, unwritten)."""
        self._line_seq = 0
        self._line_since: dict[str, float] = {}
        self._spiller: asyncio.TimerHandle | None = None
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        """Executions without a workflow and starts of waiting runs, under way."""
        self._started: dict[str, asyncio.Future[Any]] = {}
        """New runs :meth:`submit` started here, until their execution is over: the future of
        each one's end (:meth:`withdraw`)."""
        self.launched = False
        self.failure: ThoughtgateError | None = None
        """Why the last launch failed (``None`` before one, and once one succeeded)."""

    @property
    def waiting_here(self) -> list[str]:
        """The runs waiting in this process for a slot, in the order they are to start."""
        return [run_id for _, _, run_id, _ in sorted(self._line)]

    @property
    def busy(self) -> bool:
        """Whether an execution without a workflow, or a start of a waiting run, is under way."""
        return bool(self._tasks)

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def attach(cls, runtime: DurableRuntime, config: DurabilityConfig) -> DurableEngine:
        """Make ``runtime`` durable (its store must be SQLite or PostgreSQL); call ``launch`` on
        the event loop that will run the workflows before the first run."""
        if cls.current is not None:
            raise UsageError("this process already executes durable runs for another runtime")
        engine = cls(runtime, _system_database(runtime.store), config)
        runtime.attach_durable(engine)
        runtime.leases.on_lost(engine._lost)
        cls.current = engine
        return engine

    async def launch(self, *, listen: Sequence[str] | None = None) -> None:
        """Start DBOS in this process. Must run in the event loop's thread (DBOS adopts the
        running loop for the workflows it dequeues). ``listen``: the tools of this process when
        it takes queued runs (a daemon); ``None`` for a process that only executes its own runs
        (``thoughtgate run``) -- it then takes nothing from any queue.

        A launch that fails at any step -- constructing DBOS, opening or setting up its
        workflows database (which recovers this executor's workflows), registering its queue --
        or is cancelled leaves the process as if it had never launched (ADR 0125): DBOS
        destroyed, no engine :attr:`current`, so this engine may launch again or another
        attach; the error (a ``ThoughtgateError`` unless the launch was cancelled) names the
        step and the workflows database, never a password. Until a launch succeeds the runtime
        admits no run (``Runtime.admit``): nothing is stored for a run that could not execute.

        A process that already has a DBOS instance this launch did not build (an application's
        own) is refused with a ``UsageError`` saying what to do, and that instance is left as it
        was (ADR 0136): thoughtgate never runs on a DBOS configured by someone else."""
        if self.launched:
            return
        asyncio.get_running_loop()  # fail early outside a loop
        engine = DurableEngine.current
        if engine is not None and engine is not self:
            raise UsageError("this process already executes durable runs for another runtime")
        try:
            refused: ThoughtgateError | None = (
                None if prebuilt_dbos() is None else foreign_dbos(self.location)
            )
        except RuntimeFailure as exc:  # a DBOS release that moved its instance
            refused = exc
        if refused is not None:  # built before this launch, not by it (ADR 0136)
            if DurableEngine.current is self:
                DurableEngine.current = None
            self.failure = refused
            raise refused
        DurableEngine.current = self
        self.failure = None
        settings: dict[str, Any] = {
            "name": "thoughtgate",
            "system_database_url": self.location.url,
            "executor_id": self.owner.owner_id,
            "application_version": APP_VERSION,
            "serializer": _Json(),
            "log_level": dbos_logs.dbos_level(),
            "notification_listener_polling_interval_sec": min(self.config.poll_interval_s, 0.2),
            "scheduler_polling_interval_sec": 3600.0,
            # On PostgreSQL DBOS pushes workflow events' and streams' notifications from a thread
            # that wakes every this often whether or not any are pending (100 times a second by
            # default). thoughtgate uses neither (approval messages are ``send``/``recv``, which
            # a trigger notifies), so it wakes once a second instead (ADR 0057).
            "notification_coalesce_sec": 1.0,
        }
        settings.update(database_settings(self.location))
        step = "start DBOS"
        try:
            dbos_logs.install()  # before DBOS adds a handler bound to today's stderr
            DBOS(config=settings)  # type: ignore[arg-type]
            slowed = slow_unused_pollers(postgres=self.location.schema is not None)
            log.debug("DBOS pollers thoughtgate does not use, slowed: %s", slowed or "none")
            if listen is not None:
                self.queue = queue_name(listen, self.config.concurrency)
                DBOS.listen_queues([self.queue])
            else:
                DBOS.listen_queues([])
            step = "open its workflows database"
            if self.location.schema is None:
                DBOS.launch()
            else:  # one replica at a time creates or migrates the schema (ADR 0062)
                async with setting_up(self.location.url, self.location.schema):
                    DBOS.launch()
            if not reuse_queue_list():
                log.debug("DBOS's queue manager reads the list of queues every second")
            if not reuse_latest_version():
                log.debug("DBOS's queue worker reads the latest application version at every poll")
            if self.queue is not None:
                step = f"register the queue {self.queue}"
                await DBOS.register_queue_async(
                    self.queue,
                    worker_concurrency=self.config.concurrency,
                    polling_interval_sec=self.config.poll_interval_s,
                    on_conflict="always_update",
                )
                self.starts = Starts(
                    self.queue,
                    self.config.concurrency,
                    self.config.poll_interval_s,
                    self.config.idle_poll_interval_s,
                )
                self.starts.pace()  # idle once nothing has run here for a linger
        except BaseException as exc:
            await self._unlaunch()
            if not isinstance(exc, Exception):
                raise  # a cancel (or an interrupt) stays what it is
            self.failure = launch_failed(exc, self.location, step)
            if self.failure is exc:
                raise
            raise self.failure from exc
        self.launched = True

    def not_launched(self) -> ThoughtgateError:
        """Why no run can start here while this engine is not launched."""
        if self.failure is not None:
            said = "durable runs cannot start in this process: "
            error = RuntimeFailure(f"{said}{self.failure}")
            error.public = f"{said}{failure_text(self.failure)}"  # (its driver's words: ADR 0104)
            return error
        return UsageError(
            "durable runs cannot start in this process before its durable engine is launched "
            "(DurableEngine.launch), nor after it is closed"
        )

    async def _unlaunch(self) -> None:
        """Undo a launch that failed: as if this process had never launched DBOS."""
        starts, self.starts, self.queue = self.starts, None, None
        if starts is not None:
            with contextlib.suppress(Exception):
                await starts.close()
        with contextlib.suppress(Exception):
            DBOS.destroy()  # (no instance: nothing to do)
        if DurableEngine.current is self:
            DurableEngine.current = None

    async def close(self) -> None:
        """Stop DBOS (its queue threads first, so nothing new starts here). The runs waiting
        here go back on the queue; those this process admitted to execute itself that have not
        begun end ``interrupted`` (``Runtime.close_unbegun``, ADR 0131): nothing here would
        ever execute them."""
        if DurableEngine.current is self:
            DurableEngine.current = None
        if self.launched:
            with contextlib.suppress(Exception):  # else the lease sweep puts them there
                await self.stop_starting()
            with contextlib.suppress(Exception):  # a store that fails: the lease sweep's
                await self.runtime.close_unbegun()
        if self.starts is not None:
            await self.starts.close()
        if self.launched:
            self.launched = False
            await asyncio.to_thread(DBOS.destroy)

    async def stop_starting(self) -> None:
        """Start no more runs from those waiting here, and put them on the queue for another
        replica (or this daemon's restart): the daemon is shutting down."""
        self._closing = True
        if self._spiller is not None:
            self._spiller.cancel()
            self._spiller = None
        if self._line:
            await self._spill()

    # ------------------------------------------------------------------ runs
    async def start(self, run_id: str, *, unwritten: bool = False) -> asyncio.Future[Any]:
        """Execute ``run_id`` here, now (a run this process created); a future of its end (to
        cancel the run, cancel its task: ``Runtime.cancel``). ``unwritten``: a run its
        admission claimed whose first execution can take no checkpoint, executed without a
        workflow (:meth:`_unwritten_task`; ``thoughtgate run``'s, ADR 0046)."""
        if unwritten:
            return self._unwritten_task(run_id)
        with SetWorkflowID(run_id):
            handle = await DBOS.start_workflow_async(_run_workflow, run_id)
        done = getattr(handle, "task", None)
        if not isinstance(done, asyncio.Future):
            raise RuntimeFailure(f"run {run_id!r} did not start in this process")
        return done

    async def reserve(self, run_id: str, queue: str, *, unwritten: bool = False) -> Place:
        """Before a new run for ``queue`` is admitted, where it goes (ADR 0031):

        * ``start``: this daemon's queue has room (``orchestration.durable_starts``); its slot is
          taken now, so the admission stores the run as claimed by this process, and
          :meth:`submit` starts it;
        * ``wait``: this daemon's queue is full and none of its runs waits on the queue: the run
          waits here, held by this process (its admission stores it so), and starts as soon as
          a slot frees -- or goes on the queue with every run waiting here once the first of
          them has waited ten poll intervals, so other replicas share a backlog that lasts;
        * ``queue``: it goes on the queue, unheld (another queue's run, or this daemon's runs
          already wait there: a new run never overtakes them).

        A run whose admission fails calls :meth:`unreserve`. ``unwritten``: the run's first
        execution can take no checkpoint (:class:`UnwrittenSteps`), so it starts without a
        workflow."""
        starts = self.starts if queue == self.queue else None
        if starts is None or self._closing:
            return "queue"
        await starts.look_again()
        slot = starts.reserve(run_id)
        if slot is not None:
            self._reserved[run_id] = (slot, unwritten)
            return "start"
        if starts.waiting:
            return "queue"
        self._holding[run_id] = unwritten
        return "wait"

    def unreserve(self, run_id: str) -> None:
        """Give back what :meth:`reserve` set aside for a run whose admission failed."""
        self._holding.pop(run_id, None)
        reserved = self._reserved.pop(run_id, None)
        if reserved is not None:
            self._released(reserved[0])

    async def submit(self, run_id: str, queue: str, *, priority: int) -> asyncio.Future[Any] | None:
        """A new run for ``queue``, as :meth:`reserve` placed it: started here at once, waiting
        here, or put on the queue (``enqueue``). Returns the future of its execution when it
        started here at once (done once that execution is over: the run's end, when it ends
        here, is the last thing it stores), else ``None``: what the daemon needs to answer a
        ticket or a stream of the run without reading it back (ADR 0086)."""
        starts = self.starts if queue == self.queue else None
        if starts is not None:
            slot: Slot | None
            slot, unwritten = self._reserved.pop(run_id, (None, False))
            if slot is not None:
                return await self._begin(run_id, slot, unwritten)
            if run_id in self._holding:
                self._wait_here(run_id, priority, self._holding.pop(run_id))
                return None
            await starts.look_again()  # a run admitted without ``reserve``
            slot = starts.reserve(run_id)
            if slot is not None:
                return await self._begin(run_id, slot, False)
            starts.queued(run_id)
        self.runtime.forget_admitted(run_id)  # it may execute anywhere: it is read back there
        try:
            await self.enqueue(run_id, queue, priority=priority)
        except BaseException:
            if starts is not None:
                starts.began(run_id)  # it waits nowhere
            raise
        return None

    async def _begin(self, run_id: str, slot: Slot, unwritten: bool) -> asyncio.Future[Any]:
        """Execute a run here in ``slot`` (released when its execution ends); the future of
        that execution."""
        if unwritten:
            done: asyncio.Future[Any] = self._begin_unwritten(run_id, slot)
        else:
            try:
                done = await self.start(run_id)
            except BaseException:
                self._released(slot)
                self.runtime.forget_admitted(run_id)
                raise
            done.add_done_callback(lambda _: self._released(slot))
        self._track(run_id, done)
        return done

    def _track(self, run_id: str, done: asyncio.Future[Any]) -> None:
        """``done`` is where a new run's start here stands until it is over (:meth:`withdraw`):
        its start from the waiting line, then its execution."""
        self._started[run_id] = done

        def over(_: object) -> None:
            if self._started.get(run_id) is done:
                del self._started[run_id]

        done.add_done_callback(over)

    def _released(self, slot: Slot) -> None:
        """A slot of this daemon's queue is free: the next run waiting here takes it."""
        slot.release()
        if self.starts is not None:
            self.starts.used()
        self._start_next()

    # ------------------------------------------------------------------ runs waiting here
    def _wait_here(self, run_id: str, priority: int, unwritten: bool) -> None:
        """Hold a new run this daemon's admission stored as its own until a slot frees (its
        lease is renewed meanwhile: a process that stops leaves it to the lease sweep, which
        puts it on the queue)."""
        self.runtime.leases.hold(run_id)
        self._line_seq += 1
        heapq.heappush(self._line, (priority, self._line_seq, run_id, unwritten))
        self._line_since.setdefault(run_id, time.monotonic())
        self._start_next()
        if self._line and self._spiller is None:
            self._spiller = asyncio.get_running_loop().call_later(
                self._spill_after_s, self._spill_soon
            )

    @property
    def _spill_after_s(self) -> float:
        """How long a run waits here before the runs waiting here go on the queue: the queue's
        linger (``durable_starts``, ten poll intervals). Sooner, a daemon alone on its queue
        whose runs take a little longer than usual would send its backlog through the queue,
        whose every run then costs three DBOS transactions more and waits for a poll, and the
        backlog would then outlast itself there (ADR 0031)."""
        return self.config.poll_interval_s * BACKLOG_POLL_DIVISOR

    def _start_next(self) -> None:
        """Start runs waiting here, best priority first, while the queue has room."""
        starts = self.starts
        while self._line and starts is not None and not self._closing:
            _, _, run_id, unwritten = self._line[0]
            slot = starts.reserve(run_id)
            if slot is None:
                return
            heapq.heappop(self._line)
            self._line_since.pop(run_id, None)
            # An empty context: this may run in a callback of a workflow's, whose DBOS context
            # must not follow the start.
            task = asyncio.get_running_loop().create_task(
                self._begin_waited(run_id, slot, unwritten),
                name=f"start {run_id}",
                context=contextvars.Context(),
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            self._track(run_id, task)

    def _lost(self, run_id: str) -> None:
        """A run held here is no longer ours (this process stalled past its lease, and another
        process's sweep put it on a queue or closed it): if it waits here, it leaves the line
        and never starts here (ADR 0065)."""
        if self._leave_line(run_id):
            log.warning("run %s left this daemon's waiting line: another process took it", run_id)

    def _leave_line(self, run_id: str) -> bool:
        """Take a run out of the line of runs waiting here; whether it was in it."""
        if run_id not in self._line_since:
            return False
        self._line = [entry for entry in self._line if entry[2] != run_id]
        heapq.heapify(self._line)
        self._line_since.pop(run_id, None)
        self.runtime.forget_admitted(run_id)
        return True

    async def withdraw(self, run_id: str, reason: str) -> None:
        """End ``interrupted``, with ``reason``, a new run whose start was cancelled while
        :meth:`submit` placed it (the daemon's start, ``RunManager.start``; ADR 0082), wherever
        that put it:

        * started here: its execution is cancelled -- before it began, or while it runs -- and
          records the end itself, as a cancelled execution does;
        * waiting here: it leaves the line and is closed as this process's (held, unclaimed);
        * on a queue: closed as a run nobody claimed (:data:`UNCLAIMED`). A replica whose claim
          came first holds it: the end is refused (``RunTakenOverError``, logged) and the run
          executes there -- the one case a cancel does not stop, as for any run already under
          way on another replica.

        Returns once the end is recorded, or refused, or the store gave up (then a sweep closes
        it, as before). A workflow the start left behind for a run it ended -- ``PENDING`` under
        this process (its execution was cancelled before or as it began) or ``ENQUEUED`` -- is
        cancelled (:meth:`_cancel_workflow`), so that no replica takes it and a sweep deletes
        it with the ended runs' (ADR 0090)."""
        if run_id in self._started:
            # Its start from the line, then its execution: each is stopped in turn.
            while (done := self._started.get(run_id)) is not None and not done.done():
                await self.runtime.stop_started(run_id, reason, done)
            await self.cancel_ended_workflow(run_id)
            return
        waited = self._leave_line(run_id)
        if waited:  # (not an execution's hold: its own queue may have taken it back, ADR 0094)
            self.runtime.leases.release_waiting(run_id)
        holder = Holder(self.owner.owner_id, 0) if waited else UNCLAIMED
        try:
            with self.runtime.leases.ending(run_id):
                await close_run_interrupted(self.runtime.store, run_id, reason, held_by=holder)
        except RunTakenOverError:
            pass  # logged: a replica claimed it first; it executes there
        except Exception as exc:  # the store is down: left to the sweep
            log.warning("could not close run %s: %s", run_id, exc)
        else:
            if not waited:  # (a run waiting here has no workflow yet)
                await self._cancel_workflow(run_id)

    async def cancel_ended_workflow(self, run_id: str) -> None:
        """Cancel the workflow of a run started here whose execution was stopped -- a
        withdrawn start, the cancelled task of ``thoughtgate run`` or MCP (ADR 0093) -- once
        the run has ended: its workflow's row would otherwise stay (:meth:`_cancel_workflow`).
        A run still open keeps it: it resumes from there (suspended, or executing elsewhere
        since its end here was refused). A store that cannot tell leaves the row, as before."""
        with contextlib.suppress(Exception):
            if (await self.runtime.store.get_run(run_id)).status not in OPEN_RUN_STATUSES:
                await self._cancel_workflow(run_id)

    @staticmethod
    async def _cancel_workflow(run_id: str) -> None:
        """Mark ended the workflow of a run whose start was withdrawn and which has ended: a
        ``PENDING`` one under this process would stay so for good (no later process recovers
        another executor's), an ``ENQUEUED`` one would be taken by a replica only to find the
        run ended, or stay on a queue no replica serves. ``CANCELLED``, DBOS's queue workers
        skip it, and the sweep deletes it with the workflows of ended runs (``_forget_ended``).
        A failure leaves it as before (logged)."""
        try:
            await DBOS.cancel_workflow_async(run_id)
        except Exception as exc:
            log.warning("could not cancel the workflow of ended run %s: %s", run_id, exc)

    async def _claim_waited(self, run_id: str) -> int | None:
        """Claim a run that waited here from this process's hold of it as the line's (attempt
        0): the claim's attempt (1), or ``None`` when the run is not the line's to start --
        another process took it while it waited (its lease expired while this process stalled,
        and a sweep put it back on a queue or closed it, ADR 0065), or this process's own
        queue then took it back and claimed it (attempt 1, this process's owner id): its
        workflow executes here already, and a start from the line would be a second execution
        of the run, or find its workflow written and fail (ADR 0099). Claimed, its execution
        takes it as a run its admission claimed, without a claim of its own: this claim
        replaces that one, and the renewal that asked before whether the run was still this
        process's (by owner alone)."""
        runtime = self.runtime
        keeper = runtime.leases
        until = keeper.lease_until()
        store = runtime.store
        assert isinstance(store, DurableRunStore)
        attempt = await store.claim_run(run_id, keeper.owner.owner_id, keeper.ttl_s, attempt=0)
        if attempt is not None:
            runtime.claimed_from_line(run_id, until)
        return attempt

    async def _begin_waited(self, run_id: str, slot: Slot, unwritten: bool) -> None:
        keeper = self.runtime.leases
        try:
            attempt = await self._claim_waited(run_id)
        except Exception as exc:  # the store is unavailable: the lease sweep decides
            log.warning("could not start run %s, left to the lease sweep: %s", run_id, exc)
            attempt = None
        except BaseException:
            self._released(slot)
            raise
        if attempt is None:
            log.warning("run %s is no longer this daemon's to start; not starting it here", run_id)
            keeper.release_waiting(run_id)  # not an execution's hold (ADR 0094)
            self.runtime.forget_admitted(run_id)
            self._released(slot)
            return
        try:
            # Its claim renewed its lease, and its execution holds it from there.
            keeper.release_waiting(run_id)
            await self._begin(run_id, slot, unwritten)
        except Exception as exc:  # as a run that could not be started when it arrived
            log.warning("run %s could not start: %s", run_id, exc)
            await self._close(run_id, "it could not be started", exc, attempt=attempt)

    def _spill_soon(self) -> None:
        self._spiller = None
        if not self._line:
            return
        oldest = min(self._line_since.values(), default=time.monotonic())
        left = oldest + self._spill_after_s - time.monotonic()
        if left > 0:
            self._spiller = asyncio.get_running_loop().call_later(left, self._spill_soon)
            return
        task = asyncio.get_running_loop().create_task(self._spill(), name="queue waiting runs")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spill(self) -> None:
        """Put every run waiting here on the queue, in order (its oldest waited ten poll
        intervals, or this process stops): any replica with room takes them from there."""
        line, self._line = sorted(self._line), []
        self._line_since.clear()
        store = self.runtime.store
        queue = self.queue
        assert isinstance(store, DurableRunStore) and queue is not None
        owner = self.owner.owner_id
        starts = self.starts
        if starts is not None:  # at once: a run arriving meanwhile queues behind them
            for _, _, run_id, _ in line:
                starts.queued(run_id)
        keeper = self.runtime.leases
        for priority, _, run_id, _ in line:
            try:
                # Unclaimed (attempt 0): not once this process's own queue took it back and
                # claimed it while it stalled here (ADR 0094), nor its execution's hold.
                if not await store.release_run(run_id, owner=owner, queue=True, attempt=0):
                    if starts is not None:
                        starts.began(run_id)  # no longer ours (closed meanwhile): waits nowhere
                    keeper.release_waiting(run_id)
                    self.runtime.forget_admitted(run_id)
                    continue
                keeper.release_waiting(run_id)
                self.runtime.forget_admitted(run_id)
                await self.enqueue(run_id, queue, priority=priority)
            except Exception as exc:  # as a run that could not be queued when it arrived
                log.warning("run %s could not be put on the queue: %s", run_id, exc)
                if starts is not None:
                    starts.began(run_id)  # it waits nowhere
                await self._close(run_id, "it could not be put on the queue", exc, attempt=0)

    def _begin_unwritten(self, run_id: str, slot: Slot) -> asyncio.Task[None]:
        """A run of this daemon's queue without a workflow (:meth:`_unwritten_task`): its slot
        counts it among the queue's running workflows as for any other."""
        task = self._unwritten_task(run_id)
        task.add_done_callback(lambda _: self._released(slot))
        return task

    def _unwritten_task(self, run_id: str) -> asyncio.Task[None]:
        """Execute a run its admission claimed, which can take no checkpoint, without writing a
        workflow (ADR 0031): its lease (held from its admission) tells every process who
        executes it, and a process that stops mid-way leaves it to the lease sweep, which puts
        it on the queue, or suspends it for ``thoughtgate resume`` (:meth:`resume` writes its
        workflow then)."""
        task = asyncio.get_running_loop().create_task(
            self._execute_unwritten(run_id), name=f"run {run_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _execute_unwritten(self, run_id: str) -> None:
        held: list[Holder] = []
        try:
            await self.runtime.execute_workflow(run_id, unwritten=True, holding=held.append)
        except asyncio.CancelledError as exc:
            if exc.args[:1] not in ((UNWRITTEN,), (STORE_BACK,)) or _cancelling():
                raise
            why = str(exc.args[0])
        else:
            return
        # A step needed a checkpoint, or the store came back after an outage (ADR 0152): the
        # run continues here as a workflow, which resumes it from its log (the slot stays
        # taken until that workflow ends). Only while the execution that stopped still holds
        # it: this process may have stalled since, and the run be another execution's, which
        # the record would misreport (ADR 0094).
        store = self.runtime.store
        stopped = held[0] if held else None
        try:
            await suspend(
                store,
                run_id,
                why,
                queued=False,
                previous=self.owner.owner_id,
                held_by=stopped,
            )
            done = await self.start(run_id)
        except RunTakenOverError:
            return  # logged: the run is another execution's, not to continue or close here
        except Exception as exc:  # still the stopped execution's, unless a claim came since
            await self._not_continued(run_id, exc, None if stopped is None else stopped.attempt)
            return
        try:
            await done
        except RunTakenOverError:
            return
        except Exception as exc:  # its workflow's claim, if it committed, holds it now
            attempt = await self._continued_attempt(run_id, stopped)
            if attempt is not None:
                await self._not_continued(run_id, exc, attempt)

    async def _continued_attempt(self, run_id: str, stopped: Holder | None) -> int | None:
        """The claim this process holds a run at whose workflow, started here to continue the
        execution ``stopped`` (ADR 0031), failed before its execution could end it: the
        attempt the close of the run names (ADR 0112), or ``None`` when the close is not this
        workflow's to make.

        The workflow's claim is not known here: it committed (``stopped``'s attempt and one),
        or not (``stopped``'s). Any later claim is another execution's -- this process's own
        queue took the run back after it stalled past a lease and a sweep released it -- and
        so is a claim of those two that an execution under way here holds (the workflow's
        claim failed, and the later one took its number). The close names the attempt read
        here, so a claim committing after this read makes it refused. ``None`` too when the
        store cannot tell: the run's lease then runs out, and a sweep puts it back."""
        store = self.runtime.store
        assert isinstance(store, DurableRunStore)
        try:
            spec = await store.get_run_spec(run_id)
        except Exception as exc:
            log.warning("could not close run %s, left to the lease sweep: %s", run_id, exc)
            return None
        if spec is None:
            return None
        first = 1 if stopped is None or stopped.attempt is None else stopped.attempt
        if spec.attempts > first + 1 or run_id in self.runtime.executing:
            log.warning("run %s is held by a later execution; not closing it", run_id)
            return None
        return spec.attempts

    async def _not_continued(self, run_id: str, failure: Exception, attempt: int | None) -> None:
        log.warning("run %s could not continue as a workflow: %s", run_id, failure)
        await self._close(run_id, "it could not continue as a workflow", failure, attempt=attempt)

    async def _close(
        self, run_id: str, what: str, failure: Exception, *, attempt: int | None
    ) -> None:
        """End ``interrupted`` a run this daemon holds but cannot execute: ``what`` it could not
        do and ``failure``'s public text are its reason, ``failure``'s own words its
        developer-only ``error_detail`` (ADR 0073). It is held no more either way: should the
        close fail, its lease expires and a sweep (this daemon's too, ADR 0060) puts it back on
        the queue. A run another execution took over meanwhile is left to it (ADR 0072).

        ``attempt``: this daemon's hold of the run, as the caller knows it (ADR 0099) -- 0 for a
        run of its line it could not queue, 1 for one the line claimed and could not start, the
        claim of an execution without a workflow whose workflow could not be started, or the
        one such a workflow that failed left the run at (:meth:`_continued_attempt`, ADR
        0112) -- so that a later claim of the same process (its own queue took the run back
        after it stalled) is left to that execution. ``None`` (any attempt of this process's)
        only where no execution of the run is known at all."""
        reason = f"{what}: {failure_text(failure)}"
        mine = Holder(self.runtime.leases.owner.owner_id, attempt)
        try:
            with self.runtime.leases.ending(run_id):
                await close_run_interrupted(
                    self.runtime.store,
                    run_id,
                    reason,
                    held_by=mine,
                    detail=failure_detail(failure),
                )
        except Exception as exc:  # the store is down: left to the lease sweep
            log.warning("could not close run %s: %s", run_id, exc)

    async def enqueue(self, run_id: str, queue: str, *, priority: int) -> None:
        """Put a new run on ``queue``: a replica listening to it takes it when it has room."""
        found = await DBOS.retrieve_queue_async(queue)
        if found is None:
            raise RuntimeFailure(f"no work queue {queue!r} is registered")
        with SetWorkflowID(run_id), SetEnqueueOptions(priority=max(1, min(priority, 2**31 - 1))):
            await found.enqueue_async(_run_workflow, run_id)

    async def resume(self, run_id: str, queue: str) -> None:
        """Put a run whose process stopped back on ``queue`` (its checkpoints are kept; a run
        that stopped before its workflow was written gets one there).

        ``RuntimeFailure`` when its workflow is of another ``APP_VERSION``: no process of this
        version would take it from the queue, so the caller closes the run instead (its
        checkpoints, which nothing will replay, are deleted first)."""
        found = await DBOS.get_workflow_status_async(run_id)
        if found is not None and found.app_version not in (None, APP_VERSION):
            await self.forget([run_id])
            raise RuntimeFailure(
                f"its steps were recorded by another thoughtgate ({found.app_version}), whose "
                f"workflow this one ({APP_VERSION}) does not replay"
            )
        starts = self.starts if queue == self.queue else None
        if starts is not None:
            starts.queued(run_id)  # before DBOS may dequeue it
        try:
            if found is None:
                # Its process stopped between the admission that claimed it and its workflow's
                # start (ADR 0031): no step of it ran; it starts on the queue, as a resume.
                await self.enqueue(run_id, queue, priority=1)
            elif found.status in _FINISHED:
                # Its workflow ended without ending the run (ADR 0065), which DBOS does not
                # resume: back on the queue with its checkpoints.
                await asyncio.to_thread(_enqueue_finished, run_id, queue)
            else:
                await DBOS.resume_workflow_async(run_id, queue_name=queue)
        except BaseException:
            if starts is not None:
                starts.began(run_id)  # it waits nowhere
            raise

    async def on_queue(self, run_ids: Sequence[str]) -> dict[str, float | None]:
        """Which of ``run_ids`` have a workflow waiting on a queue (``None``), taken from one
        (when, in seconds since the epoch on the system database's clock -- the store's) or
        ended (``WORKFLOW_ENDED``): the sweep puts back a queued run that is on none
        (ADR 0062), that a replica took and has not claimed for a lease (ADR 0063), or whose
        workflow ended without ending it (ADR 0065)."""
        found = await DBOS.list_workflows_async(
            workflow_ids=list(run_ids),
            status=[*_ON_QUEUE, *_FINISHED],
            load_input=False,
            load_output=False,
        )
        return {w.workflow_id: _taken_at(w) for w in found}

    async def hand_back(self, run_id: str, holder: Holder) -> None:
        """The execution ``holder`` lost ``run_id``'s workflow: DBOS refuses its checkpoints,
        for the sweep put the workflow back on a queue while this process stalled -- between
        taking it and claiming the run, its claim coming first all the same (ADR 0065), or
        while it executed the run. The run is not ended here -- nothing went wrong with it --,
        but released at once to whoever executes the workflow now (or, should that execution
        have found the run held and ended the workflow, to the sweep, which puts it back on a
        queue). Only while ``holder`` still holds it: a later claim by this same process (its
        own queue took the workflow back) is the run's execution now, and a release by owner
        alone would take the run from it too (ADR 0093). A release that fails leaves the run
        to its lease, as before."""
        store = self.runtime.store
        assert isinstance(store, DurableRunStore)
        owner = self.owner.owner_id
        try:
            why = suspended_record(
                WORKFLOW_TAKEN_OVER, await store.clock(), queued=True, previous=owner
            )
            if await store.release_run(
                run_id, owner=holder.owner, attempt=holder.attempt, queue=True, metadata=why
            ):
                log.warning("run %s handed back: %s", run_id, WORKFLOW_TAKEN_OVER)
        except Exception as exc:
            log.warning("could not hand run %s back (its lease runs out): %s", run_id, exc)

    @staticmethod
    def step_mark() -> int:
        """Where the workflow executing in this task stands in its steps: what
        :meth:`replay_from` takes it back to."""
        return dbos_private.workflow_step()

    @staticmethod
    def replay_from(mark: int) -> None:
        """Take the workflow executing in this task back to ``mark`` (:meth:`step_mark`), so
        that it executes again from there in this same execution, each step it checkpointed
        since replayed instead of run (a model turn is not billed again) and each one it did
        not (the one the store's outage stopped) run: what a recovery does from the top, with
        no other process or queue involved (ADR 0152)."""
        dbos_private.set_workflow_step(mark)

    async def tidy(self) -> None:
        """Forget runs this daemon queued that it no longer needs to wait for (the sweep)."""
        if self.starts is not None:
            await self.starts.look_again(always=True)

    async def send(self, run_id: str, topic: str, message: dict[str, Any]) -> None:
        """A durable message to a run's workflow, from any process (approval answers)."""
        await DBOS.send_async(run_id, message, topic)

    async def receive(self, topic: str, timeout_s: float) -> dict[str, Any] | None:
        """Inside a run's workflow: wait for a message; the deadline is recorded the first time,
        so a resumed run waits only for what is left of it (a resume before it was recorded
        passes only what is left of the timeout counted from the request)."""
        message = await DBOS.recv_async(topic, timeout_seconds=timeout_s)
        return message if isinstance(message, dict) else None

    async def forget(self, run_ids: Sequence[str]) -> None:
        """Delete the workflows (and checkpoints, which may hold carriers) of ended runs."""
        if run_ids:
            await DBOS.delete_workflows_async(list(run_ids))

    async def finished_workflows(
        self, *, after: FinishedCursor | None = None, limit: int = 500
    ) -> FinishedWorkflows:
        """A page of the workflows DBOS has finished, oldest first: up to ``limit`` of those
        listed after ``after``, with where the next page begins (ADR 0074)."""
        seen = frozenset() if after is None else after.seen
        wanted = limit + len(seen)
        found = await DBOS.list_workflows_async(
            status=["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"],
            start_time=None if after is None else _iso_ms(after.since_ms),
            limit=wanted,
            sort_desc=False,
            load_input=False,
            load_output=False,
        )
        ids = [w.workflow_id for w in found if w.workflow_id not in seen]
        if len(found) < wanted:
            return FinishedWorkflows(ids, None)
        last = found[-1].created_at or 0
        at_last = {w.workflow_id for w in found if (w.created_at or 0) == last}
        if after is not None and after.since_ms == last:
            at_last |= seen
        return FinishedWorkflows(ids, FinishedCursor(last, frozenset(at_last)))


@dataclass(frozen=True, slots=True)
class FinishedCursor:
    """Where a listing of finished workflows goes on: a keyset cursor on DBOS's creation time,
    the one order it lists in. Several workflows can share a creation time (on SQLite DBOS keeps
    whole seconds), so the next page begins *at* that time, less the workflows already listed
    at it: it asks for that many more, and never stands still nor skips one."""

    since_ms: int
    seen: frozenset[str]


@dataclass(frozen=True, slots=True)
class FinishedWorkflows:
    """A page of ``DurableEngine.finished_workflows``."""

    ids: list[str]
    next: FinishedCursor | None
    """Where the next page begins, ``None`` after the last one (the next begins again from the
    oldest)."""


def _iso_ms(ms: int) -> str:
    """``ms`` as DBOS's ``start_time`` reads it (``fromisoformat(...).timestamp() * 1000``, cut
    to an integer): half a millisecond on, so the float's rounding cannot make it one less."""
    moment = datetime.datetime.fromtimestamp(0, datetime.UTC)
    return (moment + datetime.timedelta(milliseconds=ms, microseconds=500)).isoformat()


_ON_QUEUE = ("ENQUEUED", "PENDING", "DELAYED")
"""DBOS's statuses of a workflow on a queue or being executed (taken from one, or started at
once; ``DELAYED``: enqueued to start later)."""
_FINISHED = ("SUCCESS", "ERROR")
"""DBOS's statuses of a workflow that ended, which ``resume_workflow`` leaves as they are."""


def _taken_at(workflow: WorkflowStatus) -> float | None:
    """When a workflow on a queue was taken from it (``PENDING``: DBOS stamps the dequeue with
    its database's clock; a workflow started without a queue, when it last changed),
    ``WORKFLOW_ENDED`` for one that ended, or ``None`` while it waits there."""
    if workflow.status in _FINISHED:
        return WORKFLOW_ENDED
    if workflow.status != "PENDING":
        return None
    stamp = workflow.dequeued_at or workflow.updated_at or workflow.created_at
    return None if stamp is None else stamp / 1000


def _enqueue_finished(run_id: str, queue: str) -> bool:
    """Put a workflow that ended (``SUCCESS`` or ``ERROR``) back on ``queue``, its checkpoints
    kept; whether it was one. What ``resume_workflow`` does to a workflow that has not ended --
    its statement, with the ended statuses instead of the others -- for DBOS offers no call that
    does it: ``resume_workflow`` leaves an ended workflow as it is, ``fork_workflow`` gives the
    copy a new id (a run's workflow id is its run id: approvals are sent to it), and deleting
    the workflow to enqueue it afresh loses its checkpoints, so its steps would run again
    (ADR 0065). Conditional on the status, so of two sweeps putting it back, one does."""
    import sqlalchemy as sa

    system = dbos_private.system_database()
    status = system.tables.workflow_status
    with system.engine.begin() as conn:
        moved = conn.execute(
            sa.update(status)
            .where(*dbos_private.workflow_filter(system, status, run_id))
            .where(status.c.status.in_(_FINISHED))
            .values(
                status="ENQUEUED",
                owner_xid=None,
                queue_name=queue,
                recovery_attempts=0,
                workflow_deadline_epoch_ms=None,
                deduplication_id=None,
                started_at_epoch_ms=None,
                updated_at=dbos_private.now_ms_sql(system),
                completed_at=None,
            )
        )
    return bool(moved.rowcount)


def _cancelling() -> bool:
    """Whether the current task is being cancelled (by someone else than its own steps)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@DBOS.workflow(name=WORKFLOW, max_recovery_attempts=None)
async def _run_workflow(run_id: str) -> str:
    """One run, from the top. On a resume every checkpointed step returns its recorded result."""
    engine = DurableEngine.current
    if engine is None:  # DBOS dequeued a run before this process attached a runtime
        raise RuntimeFailure("no durable runtime in this process")
    starts = engine.starts
    if starts is not None:
        starts.began(run_id)
    held: list[Holder] = []
    try:
        return await engine.runtime.execute_workflow(run_id, holding=held.append)
    except dbos_private.DBOSWorkflowConflictIDError:
        # DBOS refused a checkpoint: another execution owns the workflow now (ADR 0065). What
        # this one claimed, if anything, goes back -- only while it still holds it (ADR 0093).
        if held:  # its latest claim (it claims again after waiting out an outage, ADR 0152)
            await engine.hand_back(run_id, held[-1])
        raise
    finally:
        if starts is not None:
            starts.used()
