"""The run and task views, declared like event payloads: every field with its visibility class.

A run view is what HTTP (``GET /v1/runs/{id}``), ``status --json``, MCP, host metadata and the
Python client return. It passes through the same one output filter as the events, by these
declarations, so a fact has the same visibility in both places: a task's answer is public here
as in ``task.completed``; its reasoning and the reasoning token counts are ``reasoning`` class in
both; the daemon that executes a run (host, process id) is ``operator`` detail.

Withheld fields are absent from a reader's copy, never null.
"""

from __future__ import annotations

from typing import Annotated, Literal, NotRequired

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

from thoughtgate.disclosure import ChainOfThought
from thoughtgate.events.payloads import RunStatus, TaskStatus, TokenUsage
from thoughtgate.events.visibility import Vis

__all__ = [
    "DaemonInfo",
    "HostMetadataView",
    "HostTaskView",
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


@with_config(_STRICT)
class TaskView(TypedDict):
    task_id: Annotated[str, Vis.PUBLIC]
    index: Annotated[int, Vis.PUBLIC]
    prompt: Annotated[str, Vis.PUBLIC]
    status: Annotated[TaskStatus, Vis.PUBLIC]
    output: Annotated[str | None, Vis.PUBLIC]
    """The task's answer."""
    reasoning: Annotated[str | None, Vis.REASONING]
    """Raw reasoning: recorded only on ``surface`` runs."""
    usage: Annotated[TokenUsage, Vis.PUBLIC]
    error: Annotated[str | None, Vis.PUBLIC]
    model: Annotated[str | None, Vis.PUBLIC]
    backend: Annotated[str | None, Vis.PUBLIC]


@with_config(_STRICT)
class RunView(TypedDict):
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
    started_by: NotRequired[Annotated[str | None, Vis.OPERATOR]]
    """The id of the API key that started the run through the daemon (``null``: started by the
    command line or the Python API). Who started what is operator detail: admin and above; any
    reader can still list their own runs (``GET /v1/runs?key=me``)."""


@with_config(_STRICT)
class HostTaskView(TypedDict):
    task_id: Annotated[str, Vis.PUBLIC]
    index: Annotated[int, Vis.PUBLIC]
    status: Annotated[TaskStatus, Vis.PUBLIC]
    model: Annotated[str | None, Vis.PUBLIC]
    output: Annotated[str | None, Vis.PUBLIC]
    usage: Annotated[TokenUsage, Vis.PUBLIC]
    error: Annotated[str | None, Vis.PUBLIC]
    reasoning: NotRequired[Annotated[str | None, Vis.REASONING]]


@with_config(_STRICT)
class HostMetadataView(TypedDict):
    """What a host integration shows for a run; built from the filtered :class:`RunView`."""

    version: Annotated[Literal[1], Vis.PUBLIC]
    run_id: Annotated[str, Vis.PUBLIC]
    status: Annotated[RunStatus, Vis.PUBLIC]
    chain_of_thought: Annotated[ChainOfThought, Vis.PUBLIC]
    reasoning_visible: Annotated[bool, Vis.PUBLIC]
    """Whether this reader may read reasoning on this run."""
    model: Annotated[str | None, Vis.PUBLIC]
    created_at: Annotated[float, Vis.PUBLIC]
    updated_at: Annotated[float, Vis.PUBLIC]
    usage: Annotated[TokenUsage, Vis.PUBLIC]
    error: Annotated[str | None, Vis.PUBLIC]
    role: Annotated[str, Vis.PUBLIC]
    tasks: Annotated[list[HostTaskView], Vis.PUBLIC]
