"""Request and response bodies of the HTTP API; the OpenAPI document is generated from these.

Request bodies forbid unknown fields: a caller cannot smuggle ``base_url`` or ``api_key`` into a
run (provider endpoints and keys come only from the daemon's config and environment).
Responses are built as plain dicts by the routes (through the output filter) and documented here;
run views and events are the declared vocabulary itself (``thoughtgate.events.views``, the event
catalogue), so the document and the filter read the same declaration.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from ag_ui.core import RunAgentInput
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from thoughtgate.disclosure import ChainOfThought
from thoughtgate.events.views import HostMetadataView, RunView

__all__ = [
    "EVENT_SCHEMA_REF",
    "REQUEST_MODELS",
    "RESPONSE_MODELS",
    "ApprovalBody",
    "ApprovalResult",
    "CreateKeyBody",
    "CreateRunBody",
    "CreatedKeyView",
    "ErrorBody",
    "ErrorDetail",
    "EventJson",
    "EventPage",
    "Health",
    "KeyList",
    "KeyView",
    "Me",
    "Permissions",
    "Readiness",
    "RevokeResult",
    "RunCreated",
    "RunList",
    "TaskBody",
    "TicketBody",
    "TicketView",
    "ToolList",
    "ToolView",
]

RoleName = Literal["viewer", "member", "developer", "admin", "owner"]

EVENT_SCHEMA_REF: Final = "#/components/schemas/Event"


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskBody(_Body):
    """One task of a multi-task run; ``model`` falls back to the run's."""

    prompt: str = Field(min_length=1, max_length=200_000)
    model: str | None = Field(default=None, min_length=3, max_length=200)
    system: str | None = Field(default=None, max_length=200_000)


class CreateRunBody(_Body):
    """``POST /v1/runs``. ``tools`` names tools registered on the daemon (none when omitted)."""

    prompt: str = Field(min_length=1, max_length=200_000)
    model: str | None = Field(
        default=None,
        min_length=3,
        max_length=200,
        description="PROVIDER:MODEL; defaults to orchestration.default_model of the daemon",
    )
    chain_of_thought: ChainOfThought | None = None
    tools: list[str] = Field(default_factory=list, max_length=64)
    tasks: list[TaskBody] = Field(default_factory=list, max_length=100)
    system: str | None = Field(default=None, max_length=200_000)


class TicketBody(_Body):
    """A ticket for one run's live stream (``run_id``), or for the live run list
    (``{"scope": "runs"}``, no ``run_id``)."""

    run_id: str | None = Field(default=None, min_length=1, max_length=200)
    scope: Literal["run", "runs"] = "run"

    @model_validator(mode="after")
    def _one_target(self) -> TicketBody:
        if self.scope == "run" and self.run_id is None:
            raise ValueError('name the run (run_id), or ask for the run list with "scope": "runs"')
        if self.scope == "runs" and self.run_id is not None:
            raise ValueError('a run-list ticket ("scope": "runs") names no run_id')
        return self


class ApprovalBody(_Body):
    decision: Literal["approve", "reject"]


class CreateKeyBody(_Body):
    name: str = Field(
        min_length=1, max_length=64, description="unique among active keys; not starting key_"
    )
    role: RoleName


# ----------------------------------------------------------------------------- responses


class ErrorDetail(BaseModel):
    code: str = Field(description="machine-readable, e.g. not_found, forbidden, invalid_request")
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer. 401/403 bodies are generic and name no resource."""

    error: ErrorDetail


class RunCreated(BaseModel):
    run_id: str
    status: str
    chain_of_thought: ChainOfThought


class RunList(BaseModel):
    runs: list[RunView]
    next: str | None = Field(
        default=None,
        description="pass as ?before= for the next page (null: this is the last page)",
    )
    changes: int = Field(
        default=0,
        description="the run list's change number when this page was read: follow "
        "GET /v1/runs/stream from it (last_event_id) to keep the list live",
    )


EventJson = Annotated[dict[str, Any], WithJsonSchema({"$ref": EVENT_SCHEMA_REF})]
"""An event as readers receive it: one of the catalogue's envelopes (``Event`` in the document)."""


class EventPage(BaseModel):
    events: list[EventJson]
    next_after: int = Field(
        description="pass as ?after= to continue (counts events you may not see, too)"
    )


class TicketView(BaseModel):
    ticket: str
    expires_at: float
    run_id: str | None = Field(description="null for a run-list ticket")
    scope: Literal["run", "runs"] = "run"
    role: RoleName
    stream_url: str


class ToolView(BaseModel):
    name: str
    label: str
    description: str
    requires_approval: bool


class ToolList(BaseModel):
    """The tools a run started on this daemon may name (``tools`` of ``POST /v1/runs``)."""

    tools: list[ToolView]


class ApprovalResult(BaseModel):
    run_id: str
    call_id: str
    decision: Literal["approve", "reject"]


class Permissions(BaseModel):
    read_runs: bool
    start_runs: bool
    answer_approvals: bool
    read_reasoning: bool
    read_trace: bool
    manage_keys: bool


class Me(BaseModel):
    key_id: str
    name: str
    role: RoleName
    permissions: Permissions


class Health(BaseModel):
    """``GET /healthz``, answered without a key: that the daemon is up, nothing of its runs."""

    status: Literal["ok"]
    version: str


class Readiness(BaseModel):
    """``GET /readyz``, answered without a key: whether this daemon takes runs now (its store
    takes writes, it is not shutting down), with one fixed word of why not; nothing of its runs,
    no path, no error text (ADR 0151)."""

    status: Literal["ready", "unready"]
    reason: (
        Literal[
            "shutting_down",
            "store_removed",
            "store_replaced",
            "store_refuses_writes",
            "store_unreachable",
            "store_read_only",
            "store_unavailable",
            "store_closed",
        ]
        | None
    ) = Field(default=None, description="why not ready; absent when ready")


class KeyView(BaseModel):
    key_id: str
    name: str
    role: RoleName
    created_at: float
    revoked_at: float | None


class KeyList(BaseModel):
    keys: list[KeyView]


class CreatedKeyView(BaseModel):
    """The only response that ever holds a key; store it now."""

    key_id: str
    name: str
    role: RoleName
    key: str


class RevokeResult(BaseModel):
    revoked: bool
    key_id: str
    name: str


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    CreateRunBody,
    TicketBody,
    ApprovalBody,
    CreateKeyBody,
    RunAgentInput,
)
RESPONSE_MODELS: tuple[type, ...] = (
    ErrorBody,
    RunCreated,
    RunView,
    RunList,
    HostMetadataView,
    EventPage,
    TicketView,
    ApprovalResult,
    Me,
    Health,
    Readiness,
    KeyList,
    CreatedKeyView,
    RevokeResult,
    ToolList,
)
