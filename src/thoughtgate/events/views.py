"""The run and task views, declared like event payloads: every field with its visibility class.

A run view is what HTTP (``GET /v1/runs/{id}``), ``status --json``, MCP, host metadata and the
Python client return: one pydantic model, :class:`RunView`, that only the one output filter
builds (``thoughtgate.access.filter.filter_run``), by these declarations, so a fact has the same visibility in both places: a task's answer is public here
as in ``task.completed``; its reasoning and the reasoning token counts are ``reasoning`` class in
both; the daemon that executes a run (host, process id) is ``operator`` detail.

Withheld fields are absent from a reader's copy, never null: they are left unset on the model,
and :meth:`RunView.to_json` leaves unset fields out.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, with_config
from typing_extensions import TypedDict

from thoughtgate.disclosure import ChainOfThought
from thoughtgate.events.payloads import RunStatus, TaskStatus, TokenUsage
from thoughtgate.events.visibility import Vis

__all__ = [
    "DaemonInfo",
    "HostMetadataView",
    "RunMetadata",
    "RunView",
    "SuspendedInfo",
    "TaskView",
]

_STRICT = ConfigDict(extra="forbid", use_attribute_docstrings=True)


@with_config(_STRICT)
class DaemonInfo(TypedDict):
    """Which daemon process executed the run, as thoughtgate recorded it before run leases (ADR
    0009). Runs recorded since name their process only in the run row's ``owner``, which no view
    shows; this declaration keeps older runs' metadata operator-only."""

    host: Annotated[str, Vis.OPERATOR]
    """A digest of the host name."""
    pid: Annotated[int, Vis.OPERATOR]
    instance: Annotated[str, Vis.OPERATOR]


@with_config(_STRICT)
class SuspendedInfo(TypedDict):
    """A durable run that nobody executes right now (ADR 0013)."""

    reason: Annotated[str, Vis.PUBLIC]
    """Why its process stopped."""
    since: Annotated[float, Vis.PUBLIC]
    resume: Annotated[Literal["queue", "manual"], Vis.PUBLIC]
    """``queue``: a replica takes it up by itself; ``manual``: ``thoughtgate resume RUN_ID`` or
    the web page's Resume continues it."""


@with_config(_STRICT)
class RunMetadata(TypedDict, total=False):
    """What thoughtgate records about a run beyond its request. A key declared nowhere here (set
    through the Python API) is kept in the log but shown to no reader."""

    daemon: Annotated[DaemonInfo, Vis.OPERATOR]
    continues: Annotated[str, Vis.PUBLIC]
    """The run whose conversation this one continues."""
    suspended: Annotated[SuspendedInfo | None, Vis.PUBLIC]
    """Set while the run waits to resume after its process stopped; ``None`` once it resumed."""
    previous_executor: Annotated[str | None, Vis.OPERATOR]
    """The process that executed the run before it stopped (host digest, pid, start nonce)."""


class _View(BaseModel):
    """A reader's copy: built by the one output filter, never from a record directly."""

    model_config = ConfigDict(extra="ignore", frozen=True, use_attribute_docstrings=True)
    """Unknown keys are dropped: an older client reads a newer daemon's view (the filter itself
    never produces a key its declaration does not name)."""

    def to_json(self) -> dict[str, Any]:
        """The wire form every surface sends: a withheld field is absent, never null."""
        return self.model_dump(mode="json", exclude_unset=True)

    def to_json_text(self) -> str:
        """:meth:`to_json` as compact JSON text (the run list's live frames)."""
        return self.model_dump_json(exclude_unset=True)


class TaskView(_View):
    task_id: Annotated[str, Vis.PUBLIC]
    index: Annotated[int, Vis.PUBLIC]
    prompt: Annotated[str, Vis.PUBLIC]
    status: Annotated[TaskStatus, Vis.PUBLIC]
    output: Annotated[str | None, Vis.PUBLIC]
    """The task's answer."""
    reasoning: Annotated[str | None, Vis.REASONING] = None
    """Raw reasoning: recorded only on ``surface`` runs; absent from a reader's copy unless the
    reader may read it (``reasoning_visible``)."""
    usage: Annotated[TokenUsage, Vis.PUBLIC]
    error: Annotated[str | None, Vis.PUBLIC]
    model: Annotated[str | None, Vis.PUBLIC]
    backend: Annotated[str | None, Vis.PUBLIC]


class RunView(_View):
    """A run with its tasks as one reader may see it: what ``GET /v1/runs/{id}``, ``status
    --json``, ``run --json``, the MCP tools and the Python client return (ADR 0015)."""

    run_id: Annotated[str, Vis.PUBLIC]
    status: Annotated[RunStatus, Vis.PUBLIC]
    prompt: Annotated[str, Vis.PUBLIC]
    model: Annotated[str | None, Vis.PUBLIC]
    chain_of_thought: Annotated[ChainOfThought, Vis.PUBLIC]
    worker_backend: Annotated[str, Vis.PUBLIC]
    created_at: Annotated[float, Vis.PUBLIC]
    updated_at: Annotated[float, Vis.PUBLIC]
    usage: Annotated[TokenUsage, Vis.PUBLIC]
    error: Annotated[str | None, Vis.PUBLIC]
    metadata: Annotated[RunMetadata, Vis.PUBLIC]
    tasks: Annotated[list[TaskView], Vis.PUBLIC]
    started_by: Annotated[str | None, Vis.OPERATOR] = None
    """The id of the API key that started the run through the daemon (``null``: started by the
    command line or the Python API). Who started what is operator detail: admin and above; any
    reader can still list their own runs (``GET /v1/runs?key=me``)."""
    record_out_of_date: Annotated[str | None, Vis.PUBLIC] = None
    """Set only in a daemon's run list, on an open run whose execution there stopped on a
    write the store refused, while it still refuses writes: the refusal's word
    (``store_removed``, ``store_refuses_writes``, ...). Its ``status`` is what the store last
    recorded and is out of date: the run is not under way, and its end will be recorded once the
    store takes writes (ADR 0151, amendment 2)."""


class HostMetadataView(RunView):
    """What a host integration shows for a run: the reader's :class:`RunView`, plus who reads it
    and whether they may read its reasoning."""

    version: Annotated[Literal[1], Vis.PUBLIC]
    role: Annotated[str, Vis.PUBLIC]
    """The reader's role."""
    reasoning_visible: Annotated[bool, Vis.PUBLIC]
    """Whether this reader may read reasoning on this run."""
