"""Run, task and API-key records as the event log keeps them."""

from __future__ import annotations

import time
import uuid
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, cast

from thoughtgate.events.payloads import RunStatus, TaskStatus, TokenUsage
from thoughtgate.events.views import RunMetadata

__all__ = [
    "OPEN_RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "TERMINAL_TASK_STATUSES",
    "ApiKeyRecord",
    "RunRecord",
    "TaskRecord",
    "new_id",
]

TERMINAL_RUN_STATUSES: frozenset[str] = frozenset(
    {"completed", "partial", "failed", "error", "interrupted"}
)
OPEN_RUN_STATUSES: frozenset[str] = frozenset({"pending", "running"})
"""A run in one of these is still owned by the process executing it (see ``store.leases``)."""
TERMINAL_TASK_STATUSES: frozenset[str] = frozenset(
    {"completed", "partial", "failed", "interrupted"}
)


def new_id(prefix: str) -> str:
    """Sortable-enough, unguessable ids such as ``run_5f0c...``."""
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(slots=True)
class TaskRecord:
    """One unit of work inside a run. ``reasoning`` is set only in ``surface`` mode."""

    task_id: str
    run_id: str
    index: int
    prompt: str
    _: KW_ONLY
    status: TaskStatus = "pending"
    output: str | None = None
    reasoning: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    model: str | None = None
    backend: str | None = None

    def to_view(self) -> dict[str, Any]:
        """Every field, unfiltered: pass it through the one output filter before showing it."""
        return {
            "task_id": self.task_id,
            "index": self.index,
            "prompt": self.prompt,
            "status": self.status,
            "output": self.output,
            "reasoning": self.reasoning,
            "usage": cast(TokenUsage, self.usage),
            "error": self.error,
            "model": self.model,
            "backend": self.backend,
        }


@dataclass(slots=True)
class RunRecord:
    """A run: its request, its resolved modes, its status and its tasks."""

    run_id: str
    prompt: str
    _: KW_ONLY
    model: str | None = None
    chain_of_thought: str = "hidden"
    worker_backend: str = "provider"
    status: RunStatus = "pending"
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    usage: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    tasks: list[TaskRecord] = field(default_factory=list)
    owner: str | None = None
    """The process executing the run (``store.leases.Owner``); ``None`` for a run nobody executes."""
    lease_expires_at: float | None = None
    """Until when ``owner`` is known to be alive; it renews the lease while the run is open."""
    started_by: str | None = None
    """The id of the API key that started the run through the daemon (``None``: started in
    this process, by the command line or the Python API). Operator detail in the run view."""

    def to_view(self) -> dict[str, Any]:
        """Every field, unfiltered (``thoughtgate.access.filter.filter_run`` makes it a view)."""
        return {
            "run_id": self.run_id,
            "status": self.status,
            "prompt": self.prompt,
            "model": self.model,
            "chain_of_thought": cast(Any, self.chain_of_thought),
            "worker_backend": self.worker_backend,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "usage": cast(TokenUsage, self.usage),
            "error": self.error,
            "metadata": cast(RunMetadata, self.metadata),
            "tasks": [t.to_view() for t in self.tasks],
            "started_by": self.started_by,
        }


@dataclass(slots=True)
class ApiKeyRecord:
    """An API key as stored: only its hash, never the key itself."""

    key_id: str
    name: str
    role: str
    key_hash: str
    _: KW_ONLY
    created_at: float = field(default_factory=lambda: time.time())
    """This process's clock, looked up when the key is made; PostgreSQL stores a new key's on
    the server's (ADR 0074)."""
    revoked_at: float | None = None
