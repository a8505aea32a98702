"""The run index as a projection of the event log (ADR 0020): one pure definition of what each
event changes in a run's index row, applied by every backend in the append that stores it.

:func:`index_update` says what one event changes -- task fields by task id, whether a ``pending``
run becomes ``running``, the run's status, usage and error -- and :func:`batch_update` merges a
batch's updates. Backends apply that in the append's own transaction, so index and log cannot
disagree; a batch without lifecycle events (``INDEX_EVENT_TYPES``) changes nothing and costs one
set lookup an event.

Projected (the log decides them): a task's ``index``, ``prompt``, ``backend``, ``model``
(``task.started``), ``status`` (``running`` on ``task.started``, then ``task.completed``'s),
``output`` and ``error`` (``task.completed``), ``usage`` (``worker.completed``, or
``task.completed`` for a task that failed or was cut); the run's
``status`` (``running`` once a task starts or it resumes, then the terminal event's), ``usage``
and ``error`` (the terminal event; ``run.interrupted`` says ``interrupted: <reason>``). The fold
(:func:`project`, :func:`reproject`) adds the fields ``create_run`` stores and ``run.started`` /
``capability.resolved`` repeat: prompt, model, modes, number of tasks.

Not projected (index-only columns; ADR 0020 says why): ``created_at``/``updated_at``,
``metadata``, ``started_by``, ``owner`` and lease, the run spec, a task's ``reasoning`` (kept only
in ``surface`` mode). One transition is the runtime's: a run is marked ``running`` when its
execution begins, before its first task starts.

:func:`rebuilt` recomputes a stored row's projected fields from its log (the backends'
``rebuild_run_index``); :func:`differences` (:func:`disagreements`, one line each) and
:func:`check_index` (:func:`check_run_index`) compare a row with the projection of its log --
``thoughtgate check-index`` over many runs, with ``--repair`` to rebuild the rows that differ.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, get_args

from thoughtgate.errors import UsageError
from thoughtgate.events.payloads import RunStatus, TaskStatus
from thoughtgate.events.schema import RUN_TERMINAL_TYPES, Event, EventType
from thoughtgate.store.records import OPEN_RUN_STATUSES, RunRecord, TaskRecord

__all__ = [
    "CHECK_PAGE",
    "INDEX_EVENT_TYPES",
    "PROJECTED_EVENT_TYPES",
    "Difference",
    "IndexCheck",
    "IndexUpdate",
    "RunProjection",
    "TaskProjection",
    "apply_to_record",
    "batch_update",
    "check_index",
    "check_run_index",
    "column_storable",
    "differences",
    "disagreements",
    "encodes_utf8",
    "index_update",
    "project",
    "rebuilt",
    "refuse_unstorable_columns",
    "reproject",
    "storable_run",
    "storable_task",
    "storable_text",
    "unstorable",
]


@dataclass(frozen=True, slots=True)
class TaskProjection:
    """A task's index fields as its events give them (``None``: no event has said yet)."""

    task_id: str
    index: int | None = None
    prompt: str | None = None
    backend: str | None = None
    model: str | None = None
    status: TaskStatus = "pending"
    output: str | None = None
    error: str | None = None
    usage: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class RunProjection:
    """A run's index fields as its events give them."""

    run_id: str
    prompt: str | None = None
    model: str | None = None
    chain_of_thought: str | None = None
    worker_backend: str | None = None
    task_count: int | None = None
    status: RunStatus = "pending"
    usage: Mapping[str, int] | None = None
    error: str | None = None
    tasks: Mapping[str, TaskProjection] = field(default_factory=dict)
    """By task id, in the order the log first names them."""

    @property
    def ended(self) -> bool:
        return self.status not in OPEN_RUN_STATUSES


_RUN_STATUSES: frozenset[str] = frozenset(get_args(RunStatus))
_TASK_STATUSES: frozenset[str] = frozenset(get_args(TaskStatus))

INDEX_EVENT_TYPES: frozenset[str] = frozenset(
    {
        EventType.TASK_STARTED,
        EventType.TASK_COMPLETED,
        EventType.WORKER_COMPLETED,
        EventType.RUN_RESUMED,
        *RUN_TERMINAL_TYPES,
    }
)
"""The events that change a stored index row (``run.started`` and ``capability.resolved``
repeat what ``create_run`` stored, so a backend need not write them again)."""

PROJECTED_EVENT_TYPES: frozenset[str] = INDEX_EVENT_TYPES | {
    EventType.RUN_STARTED,
    EventType.CAPABILITY_RESOLVED,
}
"""The events :func:`project` reads; it leaves its projection as it is for every other one, so
a check reads only these of a log (``read_types``), never its deltas (ADR 0064)."""


@dataclass(frozen=True, slots=True)
class IndexUpdate:
    """What one event, or a batch, changes in its run's index: task fields by task id (names of
    ``TaskRecord`` fields), whether a ``pending`` run becomes ``running``, and run fields
    (``status``, ``usage``, ``error``) -- applied in that order."""

    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    starts: bool = False
    run: Mapping[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.tasks or self.starts or self.run)


def _usage(value: Any) -> dict[str, int] | None:
    if not isinstance(value, Mapping):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
        return None
    return {str(k): int(v) for k, v in value.items()}


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""What no database text column takes: NUL (PostgreSQL's ``text`` refuses it) and a lone
surrogate (UTF-8 cannot carry one)."""


def encodes_utf8(value: str) -> bool:
    """Whether UTF-8 can carry ``value``: every string but one holding a lone surrogate (what
    ``codec.dumps`` escapes in a payload; :func:`column_storable` adds NUL for a column)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def column_storable(value: str) -> bool:
    """Whether every store can keep ``value`` in a text column: it holds neither NUL, which
    PostgreSQL's ``text`` refuses (SQLite keeps it), nor a lone surrogate, which UTF-8 cannot
    carry (ADRs 0114, 0120). A payload keeps both: JSON writes them as ``\\u`` escapes."""
    return "\x00" not in value and encodes_utf8(value)


def storable_text(value: str) -> str:
    """``value`` for a text column of the run index: as is, or with each NUL and each lone
    surrogate (a provider's text cut inside an emoji; Python's ``json`` reads ``"\\ud800"``)
    replaced by U+FFFD, which every store keeps. The event log keeps the exact string in the
    payload (ADRs 0114, 0120); the index is a summary of it, and the replacement is what any
    UTF-8 reader would show for a surrogate anyway."""
    return value if column_storable(value) else _UNSTORABLE.sub("\ufffd", value)


_RUN_TEXTS = ("prompt", "model", "chain_of_thought", "worker_backend", "error")
_TASK_TEXTS = ("prompt", "output", "reasoning", "error", "model", "backend")


def _storable_texts(record: object, names: tuple[str, ...]) -> dict[str, Any]:
    return {
        name: storable_text(value)
        for name in names
        if isinstance(value := getattr(record, name), str) and not column_storable(value)
    }


def unstorable(value: str) -> str | None:
    """What of ``value`` no column keeps, in words (``"NUL (U+0000)"``, ``"a surrogate (U+D800
    to U+DFFF)"``), for an error to say; ``None`` when it is :func:`column_storable`."""
    if column_storable(value):
        return None
    return "NUL (U+0000)" if "\x00" in value else "a surrogate (U+D800 to U+DFFF)"


def _refuse_unstorable_id(what: str, value: str) -> None:
    held = unstorable(value)
    if held is not None:
        raise UsageError(
            f"{what} {value!r} holds {held}, which no store can keep in a column; nothing was "
            "stored"
        )


def storable_task(task: TaskRecord) -> TaskRecord:
    """``task`` as the run index keeps it: its texts through :func:`storable_text` (a copy
    when one changes; ``task`` itself, the usual case, when none does). ``UsageError`` when
    its task id or run id holds what no column keeps (:func:`column_storable`): ids are the
    program's, looked up exactly, so they are refused alike by every store, not replaced."""
    _refuse_unstorable_id("task id", task.task_id)
    _refuse_unstorable_id("run id", task.run_id)
    texts = _storable_texts(task, _TASK_TEXTS)
    return replace(task, **texts) if texts else task


def storable_run(run: RunRecord) -> RunRecord:
    """``run`` (and its tasks) as the run index keeps it, as :func:`storable_task`."""
    _refuse_unstorable_id("run id", run.run_id)
    texts: dict[str, Any] = _storable_texts(run, _RUN_TEXTS)
    tasks = [storable_task(t) for t in run.tasks]
    if any(new is not old for new, old in zip(tasks, run.tasks, strict=True)):
        texts["tasks"] = tasks
    return replace(run, **texts) if texts else run


def _column_storable(column: Sequence[str | None]) -> bool:
    """Whether every value of ``column`` is :func:`column_storable`: one look at the first
    when all are the same (a model turn's deltas; ``list.count`` compares by identity first),
    else one at the values joined. (A set of them would hash each ``EventType`` in Python, and
    joining those costs tens of nanoseconds each.)"""
    if not column:
        return True
    first = column[0]
    if column.count(first) == len(column):
        return first is None or column_storable(first)
    joined = "".join(filter(None, column))
    return column_storable(joined)


def refuse_unstorable_columns(task_ids: Sequence[str | None], types: Sequence[str]) -> None:
    """Raise ``UsageError`` when a task id or a type holds NUL or a surrogate, before anything
    is stored: they are columns of their own, which PostgreSQL cannot hold NUL in and no SQL
    backend a surrogate in, and the program names them (a payload's strings, a provider's, are
    stored exactly). Every backend, memory included, refuses the batch the same way (ADRs
    0114, 0120).

    On every append, so cheap: a few nanoseconds an event (:func:`_column_storable`)."""
    if _column_storable(types) and _column_storable(task_ids):
        return
    for what, column in (("type", types), ("task id", task_ids)):
        for value in column:
            held = None if value is None else unstorable(value)
            if held is not None:
                raise UsageError(
                    f"event {what} {value!r} holds {held}, which no store can keep in a column; "
                    "nothing of the batch was stored"
                )


def _text(payload: Mapping[str, Any], key: str, into: dict[str, Any]) -> None:
    """``payload[key]`` into ``into`` when it is a string or ``None`` (else it says nothing);
    a string as the index can keep it (:func:`storable_text`)."""
    if key in payload:
        value = payload[key]
        if value is None:
            into[key] = None
        elif isinstance(value, str):
            into[key] = storable_text(value)


def _task_fields(kind: str, p: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if kind == EventType.TASK_STARTED:
        if isinstance(p.get("index"), int):
            out["index"] = p["index"]
        if isinstance(p.get("prompt"), str):
            out["prompt"] = storable_text(p["prompt"])
        _text(p, "backend", out)
        _text(p, "model", out)
        out["status"] = "running"
    elif kind == EventType.TASK_COMPLETED:
        if p.get("status") in _TASK_STATUSES:
            out["status"] = p["status"]
        _text(p, "output", out)
        _text(p, "error", out)
        usage = _usage(p.get("usage"))  # a failed or cut task's (ADR 0131)
        if usage is not None:
            out["usage"] = usage
    elif kind == EventType.WORKER_COMPLETED:
        usage = _usage(p.get("usage"))
        if usage is not None:
            out["usage"] = usage
    return out


def index_update(kind: str, payload: Mapping[str, Any], task_id: str | None) -> IndexUpdate:
    """What one event changes in the index (empty for the events that change nothing).

    Pure, and takes the event's parts rather than an ``Event``, so a backend computes it from
    the ``NewEvent`` s of an append before its transaction. Fields whose payload value has the
    wrong type are left out: the index never takes what the log's typing would refuse.
    """
    if kind not in INDEX_EVENT_TYPES:
        return _NOTHING
    if kind in _TASK_EVENT_TYPES:
        if task_id is None:
            return _NOTHING
        fields = _task_fields(kind, payload)
        return IndexUpdate(
            tasks={task_id: fields} if fields else {}, starts=kind == EventType.TASK_STARTED
        )
    if kind == EventType.RUN_RESUMED:
        return IndexUpdate(starts=True)
    run: dict[str, Any] = {}
    if payload.get("status") in _RUN_STATUSES:
        run["status"] = payload["status"]
    usage = _usage(payload.get("usage"))
    if usage is not None:
        run["usage"] = usage
    if kind == EventType.RUN_INTERRUPTED:
        run["error"] = storable_text(f"interrupted: {payload.get('reason', '')}")
    elif isinstance(payload.get("error"), str):
        run["error"] = storable_text(payload["error"])
    return IndexUpdate(run=run)


_NOTHING = IndexUpdate()
_TASK_EVENT_TYPES = frozenset(
    {EventType.TASK_STARTED, EventType.TASK_COMPLETED, EventType.WORKER_COMPLETED}
)


class _EventParts(Protocol):
    """What :func:`batch_update` reads of an event: an ``Event`` or a ``NewEvent``."""

    @property
    def type(self) -> str: ...
    @property
    def payload(self) -> Mapping[str, Any]: ...
    @property
    def task_id(self) -> str | None: ...


def batch_update(events: Iterable[_EventParts]) -> IndexUpdate:
    """The updates of a batch of events merged into one, as if applied one after another; empty
    (and cheap: one set lookup an event) for a batch of deltas."""
    tasks: dict[str, dict[str, Any]] = {}
    starts = False
    run: dict[str, Any] = {}
    for event in events:
        if event.type not in INDEX_EVENT_TYPES:
            continue
        update = index_update(event.type, event.payload, event.task_id)
        for tid, fields in update.tasks.items():
            tasks.setdefault(tid, {}).update(fields)
        # A run that a terminal event of this batch ended is not started again by a later one.
        starts = starts or (update.starts and "status" not in run)
        run.update(update.run)
    return IndexUpdate(tasks, starts, run) if tasks or starts or run else _NOTHING


def apply_to_record(run: RunRecord, update: IndexUpdate) -> bool:
    """Apply ``update`` to a run record in place (the memory store's index); whether the run row
    itself changed (its status, usage or error: a change the run list reports)."""
    by_id = {t.task_id: t for t in run.tasks}
    for task_id, fields in update.tasks.items():
        task = by_id.get(task_id)
        if task is None:
            continue  # a task the index does not hold: nothing to project it onto
        for name, value in fields.items():
            setattr(task, name, dict(value) if name == "usage" else value)
    changed = False
    if update.starts and run.status == "pending":
        run.status = "running"
        changed = True
    for name, value in update.run.items():
        setattr(run, name, dict(value) if name == "usage" else value)
        changed = True
    return changed


def rebuilt(stored: RunRecord, events: Iterable[Event]) -> RunRecord:
    """``stored`` with every projected field recomputed from its run's ``events`` alone: the
    index row a backend's ``rebuild_run_index`` writes back. Non-projected fields are kept, and
    so is ``running`` on a run the runtime marked so before any event said it (ADR 0020)."""
    run = copy.deepcopy(stored)
    for task in run.tasks:
        task.status, task.output, task.error, task.usage = "pending", None, None, {}
    runtime_running = stored.status == "running"
    run.status, run.usage, run.error = "pending", {}, None
    apply_to_record(run, batch_update(events))
    if runtime_running and run.status == "pending":
        run.status = "running"
    return run


def project(current: RunProjection | None, event: Event) -> RunProjection:
    """``current`` (``None`` before the run's first event) after ``event``: the same
    :func:`index_update` a backend applies, plus the fields ``create_run`` stores.

    Cheap for the events that do not concern the index (deltas, tool and visible steps): they
    return ``current`` itself, so a fold over a long log allocates per lifecycle event only.
    """
    run = current if current is not None else RunProjection(event.run_id)
    p = event.payload
    kind = event.type
    if kind == EventType.RUN_STARTED:
        tasks = p.get("tasks")
        return replace(run, prompt=p.get("prompt"), model=p.get("model"), task_count=tasks)
    if kind == EventType.CAPABILITY_RESOLVED:
        return replace(
            run, chain_of_thought=p.get("chain_of_thought"), worker_backend=p.get("worker_backend")
        )
    update = index_update(kind, p, event.task_id)
    if not update:
        return run
    tasks = dict(run.tasks)
    for task_id, fields in update.tasks.items():
        tasks[task_id] = replace(tasks.get(task_id) or TaskProjection(task_id), **fields)
    status = "running" if update.starts and run.status == "pending" else run.status
    return replace(
        run,
        tasks=tasks,
        status=update.run.get("status", status),
        usage=update.run.get("usage", run.usage),
        error=update.run.get("error", run.error),
    )


def reproject(events: Iterable[Event]) -> RunProjection | None:
    """The projection of a whole log (``None`` for a run with no events yet)."""
    run: RunProjection | None = None
    for event in events:
        run = project(run, event)
    return run


@dataclass(frozen=True, slots=True)
class Difference:
    """One field where an index row and the projection of its log differ.

    ``field`` names a ``RunRecord`` field (``task_id`` unset) or a ``TaskRecord`` field of task
    ``task_id``; two names are not fields: ``task_count`` (the number of tasks), and ``task`` (a
    task one side lacks: ``index`` is its status in the index, ``log`` its status in the log,
    ``None`` on the side that lacks it). The values are the raw ones, prompts and answers
    included: a caller that shows them to anyone decides what it may show (``thoughtgate
    check-index`` shows no text)."""

    field: str
    index: object
    log: object
    task_id: str | None = None

    def __str__(self) -> str:
        if self.field == "task":
            if self.index is None:
                return f"task {self.task_id}: in the log, not in the index"
            return f"task {self.task_id}: {self.index} in the index, not in the log"
        name = "task count" if self.field == "task_count" else self.field
        what = name if self.task_id is None else f"task {self.task_id} {name}"
        return f"{what}: index {self.index!r}, log {self.log!r}"


def _as_indexed(value: object) -> object:
    """A value of the log's projection as the index keeps it (a text: :func:`storable_text`)."""
    return storable_text(value) if isinstance(value, str) else value


def differences(record: RunRecord, projection: RunProjection | None) -> list[Difference]:
    """Where the index row ``record`` differs from the projection of its run's log, one entry a
    field (empty: they agree). Fields the log has not yet spoken about are not compared."""
    if projection is None:
        return []
    out: list[Difference] = []

    def differ(what: str, stored: object, projected: object, task: str | None = None) -> None:
        if projected is not None and stored != _as_indexed(projected):
            out.append(Difference(what, stored, projected, task))

    differ("prompt", record.prompt, projection.prompt)
    differ("model", record.model, projection.model)
    differ("chain_of_thought", record.chain_of_thought, projection.chain_of_thought)
    differ("worker_backend", record.worker_backend, projection.worker_backend)
    differ("task_count", len(record.tasks), projection.task_count)
    # The runtime marks a run running when its execution begins, before an event says so.
    runtime_only = record.status == "running" and projection.status == "pending"
    if not runtime_only:
        differ("status", record.status, projection.status)
    differ("usage", record.usage, None if projection.usage is None else dict(projection.usage))
    # the terminal event decides
    if projection.ended and record.error != _as_indexed(projection.error):
        out.append(Difference("error", record.error, projection.error))
    stored_tasks = {t.task_id: t for t in record.tasks}
    for task_id, task in projection.tasks.items():
        stored = stored_tasks.get(task_id)
        if stored is None:
            out.append(Difference("task", None, task.status, task_id))
            continue
        differ("index", stored.index, task.index, task_id)
        differ("prompt", stored.prompt, task.prompt, task_id)
        differ("backend", stored.backend, task.backend, task_id)
        # task.started names the model, None included.
        if task.index is not None and stored.model != _as_indexed(task.model):
            out.append(Difference("model", stored.model, task.model, task_id))
        differ("status", stored.status, task.status, task_id)
        if task.status != "running" and task.status != "pending":
            if stored.output != _as_indexed(task.output):
                out.append(Difference("output", stored.output, task.output, task_id))
            if stored.error != _as_indexed(task.error):
                out.append(Difference("error", stored.error, task.error, task_id))
        usage = None if task.usage is None else dict(task.usage)
        differ("usage", stored.usage, usage, task_id)
    for task_id, stored in stored_tasks.items():
        if task_id in projection.tasks:
            continue
        if projection.ended or stored.status != "pending":
            out.append(Difference("task", stored.status, None, task_id))
    return out


def disagreements(record: RunRecord, projection: RunProjection | None) -> list[str]:
    """:func:`differences` as one line each (``status: index 'failed', log 'completed'``)."""
    return [str(d) for d in differences(record, projection)]


class _Readable(Protocol):
    async def get_run(self, run_id: str) -> RunRecord: ...

    async def read_types(
        self,
        run_id: str,
        types: Collection[str],
        *,
        after: int = 0,
        limit: int | None = None,
    ) -> list[Event]: ...


@dataclass(frozen=True, slots=True)
class IndexCheck:
    """A run's index row, the projection of its log, and where they differ."""

    record: RunRecord
    projection: RunProjection | None
    differences: list[Difference]

    @property
    def log_ended(self) -> bool:
        """Whether the log holds the run's terminal event: no process executes it any more,
        and the projection of its log is final."""
        return self.projection is not None and self.projection.ended


CHECK_PAGE = 1000
"""Events an index check reads at a time: a run's lifecycle events are folded page by page, so
a check's memory does not grow with the length of the log."""


async def check_index(store: _Readable, run_id: str) -> IndexCheck:
    """Rebuild ``run_id``'s projection from its log and compare it with its index row. Raises
    ``RunNotFoundError``. Only the events the projection reads (:data:`PROJECTED_EVENT_TYPES`)
    come from the store, filtered there: a run's deltas are never read.

    The row is read first: a run that moves on between the two reads is then ahead in the log,
    never behind, so a live run may show a transient difference but a settled one never does.
    """
    record = await store.get_run(run_id)
    projection: RunProjection | None = None
    after = 0
    while True:
        page = await store.read_types(run_id, PROJECTED_EVENT_TYPES, after=after, limit=CHECK_PAGE)
        for event in page:
            projection = project(projection, event)
        if len(page) < CHECK_PAGE:
            break
        after = page[-1].seq
    return IndexCheck(record, projection, differences(record, projection))


async def check_run_index(store: _Readable, run_id: str) -> list[str]:
    """:func:`check_index`'s differences, one line each (empty: the index is what the log
    says). Raises ``RunNotFoundError``."""
    return [str(d) for d in (await check_index(store, run_id)).differences]
