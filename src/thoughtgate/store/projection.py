"""The run index as a projection of the event log: what a run's events alone say its index row is.

The run index (``store.run_index``) is written beside the log, not derived from it (ADR 0020).
This module is the other half of that decision: one pure fold, :func:`project`, from a run's
events to the index fields the log is the authority for, and :func:`disagreements`, which
compares a stored index row with that projection. ``check_run_index`` reads both from a store and
says where they differ, so a backend bug, a hand-edited database or a failed migration that made
the index and the log disagree is found instead of silently shown to readers.

Projected (the log decides them):

* the run's ``prompt`` and ``model`` (``run.started``), ``chain_of_thought`` and
  ``worker_backend`` (``capability.resolved``), its number of tasks (``run.started``);
* its ``status``: ``pending`` after ``run.started``, ``running`` once a task starts or the run
  resumes, then the terminal event's status; its ``usage`` and ``error`` from the terminal event
  (``run.interrupted`` says ``interrupted: <reason>``; without ``usage`` the usage stays);
* each task the log names: ``index``, ``prompt``, ``backend``, ``model`` (``task.started``),
  ``status`` (``running`` on ``task.started``, then ``task.completed``'s), ``output`` and
  ``error`` (``task.completed``), ``usage`` (``worker.completed``).

Not projected (the index alone holds them; see ADR 0020 for why each stays there): the run's
``created_at``/``updated_at``, ``metadata``, ``started_by``, ``owner`` and lease, its spec, a
task's ``reasoning`` (kept only in ``surface`` mode), and the rows of tasks that have not started
while the run is open. One transition is the runtime's, not the log's: a run is marked
``running`` when its execution begins, before its first event says so, so an open run the log
still calls ``pending`` may be ``running`` in the index.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from thoughtgate.events.payloads import RunStatus, TaskStatus
from thoughtgate.events.schema import Event, EventType, is_run_terminal
from thoughtgate.store.records import OPEN_RUN_STATUSES, RunRecord

__all__ = [
    "RunProjection",
    "TaskProjection",
    "check_run_index",
    "disagreements",
    "project",
    "reproject",
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


def _usage(value: Any) -> Mapping[str, int] | None:
    return None if value is None else {str(k): int(v) for k, v in dict(value).items()}


def _project_task(task: TaskProjection, event: Event) -> TaskProjection:
    p = event.payload
    if event.type == EventType.TASK_STARTED:
        return replace(
            task,
            index=p.get("index"),
            prompt=p.get("prompt"),
            backend=p.get("backend"),
            model=p.get("model"),
            status="running",
        )
    if event.type == EventType.TASK_COMPLETED:
        return replace(task, status=p["status"], output=p.get("output"), error=p.get("error"))
    if event.type == EventType.WORKER_COMPLETED:
        return replace(task, usage=_usage(p.get("usage")))
    return task


_TASK_TYPES = frozenset(
    {EventType.TASK_STARTED, EventType.TASK_COMPLETED, EventType.WORKER_COMPLETED}
)


def project(current: RunProjection | None, event: Event) -> RunProjection:
    """``current`` (``None`` before the run's first event) after ``event``.

    Pure, and cheap for the events that do not concern the index (deltas, tool and visible
    steps): they return ``current`` itself, so a fold over a long log allocates per lifecycle
    event only.
    """
    run = current if current is not None else RunProjection(event.run_id)
    p = event.payload
    kind = event.type
    if kind in _TASK_TYPES and event.task_id is not None:
        before = run.tasks.get(event.task_id) or TaskProjection(event.task_id)
        after = _project_task(before, event)
        status = "running" if kind == EventType.TASK_STARTED and not run.ended else run.status
        return replace(run, status=status, tasks={**run.tasks, event.task_id: after})
    if kind == EventType.RUN_STARTED:
        return replace(run, prompt=p.get("prompt"), model=p.get("model"), task_count=p.get("tasks"))
    if kind == EventType.CAPABILITY_RESOLVED:
        return replace(
            run, chain_of_thought=p.get("chain_of_thought"), worker_backend=p.get("worker_backend")
        )
    if kind == EventType.RUN_RESUMED and not run.ended:
        return replace(run, status="running")
    if is_run_terminal(kind):
        usage = _usage(p.get("usage"))
        if kind == EventType.RUN_INTERRUPTED:
            error: str | None = f"interrupted: {p.get('reason', '')}"
        else:
            error = p.get("error")
        return replace(
            run,
            status=p["status"],
            usage=run.usage if usage is None else usage,
            error=run.error if error is None else error,
        )
    return run


def reproject(events: Iterable[Event]) -> RunProjection | None:
    """The projection of a whole log (``None`` for a run with no events yet)."""
    run: RunProjection | None = None
    for event in events:
        run = project(run, event)
    return run


def disagreements(record: RunRecord, projection: RunProjection | None) -> list[str]:
    """Where the index row ``record`` differs from the projection of its run's log, one line a
    field (empty: they agree). Fields the log has not yet spoken about are not compared."""
    if projection is None:
        return []
    out: list[str] = []

    def differ(what: str, stored: object, projected: object) -> None:
        if projected is not None and stored != projected:
            out.append(f"{what}: index {stored!r}, log {projected!r}")

    differ("prompt", record.prompt, projection.prompt)
    differ("model", record.model, projection.model)
    differ("chain_of_thought", record.chain_of_thought, projection.chain_of_thought)
    differ("worker_backend", record.worker_backend, projection.worker_backend)
    differ("task count", len(record.tasks), projection.task_count)
    # The runtime marks a run running when its execution begins, before an event says so.
    runtime_only = record.status == "running" and projection.status == "pending"
    if not runtime_only:
        differ("status", record.status, projection.status)
    differ("usage", record.usage, None if projection.usage is None else dict(projection.usage))
    if projection.ended and record.error != projection.error:  # the terminal event decides
        out.append(f"error: index {record.error!r}, log {projection.error!r}")
    stored_tasks = {t.task_id: t for t in record.tasks}
    for task_id, task in projection.tasks.items():
        stored = stored_tasks.get(task_id)
        if stored is None:
            out.append(f"task {task_id}: in the log, not in the index")
            continue
        differ(f"task {task_id} index", stored.index, task.index)
        differ(f"task {task_id} prompt", stored.prompt, task.prompt)
        differ(f"task {task_id} backend", stored.backend, task.backend)
        # task.started names the model, None included.
        if task.index is not None and stored.model != task.model:
            out.append(f"task {task_id} model: index {stored.model!r}, log {task.model!r}")
        differ(f"task {task_id} status", stored.status, task.status)
        if task.status != "running" and task.status != "pending":
            if stored.output != task.output:
                out.append(f"task {task_id} output: index {stored.output!r}, log {task.output!r}")
            if stored.error != task.error:
                out.append(f"task {task_id} error: index {stored.error!r}, log {task.error!r}")
        usage = None if task.usage is None else dict(task.usage)
        differ(f"task {task_id} usage", stored.usage, usage)
    for task_id, stored in stored_tasks.items():
        if task_id in projection.tasks:
            continue
        if projection.ended or stored.status != "pending":
            out.append(f"task {task_id}: {stored.status} in the index, not in the log")
    return out


class _Readable(Protocol):
    async def get_run(self, run_id: str) -> RunRecord: ...

    async def read(
        self, run_id: str, *, after: int = 0, limit: int | None = None
    ) -> list[Event]: ...


async def check_run_index(store: _Readable, run_id: str) -> list[str]:
    """Rebuild ``run_id``'s projection from its log and compare it with its index row: where
    they differ (empty: the index is what the log says). Raises ``RunNotFoundError``.

    The row is read first: a run that moves on between the two reads is then ahead in the log,
    never behind, so a live run may show a transient difference but a settled one never does.
    """
    record = await store.get_run(run_id)
    return disagreements(record, reproject(await store.read(run_id)))
