"""Runs: start one, list them, read one, page through its events, read its trace, answer an
approval, resume a suspended one. Every read goes through the one output filter with the
caller's role."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.access.filter import (
    filter_events,
    filter_run,
    reads_apart,
    reads_task_apart,
    require_role,
)
from thoughtgate.access.keys import Principal
from thoughtgate.access.roles import Role
from thoughtgate.errors import (
    ProviderNotConfiguredError,
    RunNotFoundError,
    StoreRefusesWritesError,
    UsageError,
    approval_refused,
)
from thoughtgate.events.schema import EventType
from thoughtgate.events.views import HostMetadataView, RunView
from thoughtgate.host_metadata import host_metadata
from thoughtgate.orchestration.runtime import RunRequest, TaskSpec
from thoughtgate.server.api import Endpoint, QueryParam, parse_body, query_int
from thoughtgate.server.errors import STORE_REFUSES_WRITES, ApiError
from thoughtgate.server.models import (
    ApprovalBody,
    ApprovalResult,
    CreateRunBody,
    EventPage,
    RunCreated,
    ToolList,
)
from thoughtgate.server.responses import JSONResponse
from thoughtgate.server.state import state_of
from thoughtgate.store.records import OPEN_RUN_STATUSES, RunRecord

__all__ = ["ENDPOINTS", "start_run"]

_EVENT_PAGE_MAX = 5000


def _principal(principal: Principal | None) -> Principal:
    assert principal is not None
    return principal


async def start_run(
    request: Request, principal: Principal | None, *, early: bool = False
) -> RunRecord:
    """Record the run the body describes, as started by ``principal``'s key, and start executing
    it (``POST /v1/runs`` and, with ``early``, ``POST /v1/runs/follow``: ``RunManager.start``)."""
    body = await parse_body(request, CreateRunBody)
    manager = state_of(request).manager
    if manager.closing:
        raise ApiError(503, "the daemon is shutting down; start the run again in a moment")
    run_request = RunRequest(
        body.prompt,
        model=body.model,
        tasks=[TaskSpec(t.prompt, model=t.model, system=t.system) for t in body.tasks],
        system=body.system,
        started_by=_principal(principal).key_id,
    )
    return await manager.start(
        run_request,
        chain_of_thought=body.chain_of_thought,
        tools=body.tools,
        key_id=_principal(principal).key_id,
        early=early,
    )


async def create_run(request: Request, principal: Principal | None) -> Response:
    run = await start_run(request, principal)
    return JSONResponse(
        {"run_id": run.run_id, "status": run.status, "chain_of_thought": run.chain_of_thought},
        status_code=202,
        headers={"Location": f"/v1/runs/{run.run_id}"},
    )


async def list_tools(request: Request, principal: Principal | None) -> Response:
    tools = state_of(request).manager.tools
    return JSONResponse(
        {
            "tools": [
                {
                    "name": t.name,
                    "label": t.label or t.name,
                    "description": t.description,
                    "requires_approval": t.requires_approval,
                }
                for t in tools
            ]
        }
    )


def _task_hint(principal: Principal | None) -> bool:
    """``get_run``'s ``apart`` for this reader, before the run's mode is known (ADR 0160)."""
    return reads_task_apart(_principal(principal).role, mode=None)


async def get_run(request: Request, principal: Principal | None) -> Response:
    state = state_of(request)
    run = await state.store.get_run(request.path_params["run_id"], apart=_task_hint(principal))
    # Its execution here stopped on a write the store refused: while it still refuses them,
    # the open status it holds is no longer true, and nothing can correct it yet (ADR 0151).
    # Once it takes writes, the sweep closes the run (ADR 0149).
    refusal = state.manager.out_of_date(run)
    if refusal is not None:
        raise ApiError(
            503,
            f"run {run.run_id} stopped executing on this daemon: the event store refuses "
            f"writes ({refusal}), so its end could not be recorded and the store's record "
            "of it is out of date; read it again once the store takes writes (GET /readyz)",
            code=STORE_REFUSES_WRITES,
        )
    return JSONResponse(filter_run(run, _principal(principal).role).to_json())


async def get_host_metadata(request: Request, principal: Principal | None) -> Response:
    store = state_of(request).store
    run = await store.get_run(request.path_params["run_id"], apart=_task_hint(principal))
    return JSONResponse(host_metadata(run, _principal(principal).role).to_json())


async def list_events(request: Request, principal: Principal | None) -> Response:
    role = _principal(principal).role
    run_id = request.path_params["run_id"]
    after = query_int(request, "after", 0, minimum=0)
    limit = query_int(request, "limit", 500, minimum=1, maximum=_EVENT_PAGE_MAX)
    store = state_of(request).store
    run = await store.get_run(run_id)
    mode = run.chain_of_thought
    raw = await store.read(run_id, after=after, limit=limit, apart=reads_apart(role, mode=mode))
    shown = filter_events(raw, role, mode=mode)
    return JSONResponse(
        {"events": [e.to_dict() for e in shown], "next_after": raw[-1].seq if raw else after}
    )


async def get_trace(request: Request, principal: Principal | None) -> Response:
    role = require_role(_principal(principal).role, Role.DEVELOPER, "the trace")
    run_id = request.path_params["run_id"]
    store = state_of(request).store
    run = await store.get_run(run_id)
    log = await store.read(run_id)
    raw = [e for e in log if e.type == EventType.WORKER_COMPLETED]
    shown = filter_events(raw, role, mode=run.chain_of_thought, surface="trace")
    return JSONResponse(
        {"events": [e.to_dict() for e in shown], "next_after": log[-1].seq if log else 0}
    )


async def answer_approval(request: Request, principal: Principal | None) -> Response:
    who = _principal(principal)
    run_id = request.path_params["run_id"]
    call_id = request.path_params["call_id"]
    body = await parse_body(request, ApprovalBody)
    state = state_of(request)
    # The run first (the key and its role were checked before the route): an unknown run is a
    # 404 and an ended one a 409 whether or not the store takes writes, as reads work while
    # writes are refused (ADR 0170). Then, for a run that waits, refused while the store
    # refuses writes, before the answer reaches the waiting execution: recording it is the
    # run's next write, and a 200 for an answer then lost is a lie (ADR 0165). The readiness
    # check, not only what the store knows without asking: it also finds a PostgreSQL server
    # gone or read-only before any write failed (at most a round trip a second, shared with
    # /readyz). ``answer_approval`` asks the store's own word again.
    run = await state.store.get_run(run_id)
    if run.status in OPEN_RUN_STATUSES:
        refusal = await state.readiness.refusal()
        if refusal is not None:
            raise StoreRefusesWritesError(approval_refused(refusal), reason=refusal)
    await state.runtime.answer_approval(run_id, call_id, body.decision, by=who.name)
    return JSONResponse({"run_id": run_id, "call_id": call_id, "decision": body.decision})


async def resume_run(request: Request, principal: Principal | None) -> Response:
    run_id = request.path_params["run_id"]
    manager = state_of(request).manager
    if manager.closing:
        raise ApiError(503, "the daemon is shutting down; resume the run again in a moment")
    try:
        run = await manager.resume(run_id)
    except (RunNotFoundError, ProviderNotConfiguredError):
        raise  # a 404; the server's 503 (ADR 0128)
    except UsageError as exc:
        raise ApiError(409, str(exc)) from None
    return JSONResponse(
        {"run_id": run.run_id, "status": run.status, "chain_of_thought": run.chain_of_thought},
        status_code=202,
        headers={"Location": f"/v1/runs/{run.run_id}"},
    )


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        "/v1/runs",
        create_run,
        "start a run",
        role=Role.MEMBER,
        body=CreateRunBody,
        response=RunCreated,
        status=202,
        errors=(400, 413, 422, 429, 503),
        description="Records the run and executes it in the background (with durable runs: "
        "queues it for a replica that has its tools). Provider endpoints and keys come from the "
        "daemon's config; unknown fields (base_url, api_key, ...) are 422. A key over its quota "
        "(quotas in thoughtgate.toml) gets 429 with Retry-After.",
    ),
    Endpoint(
        "GET",
        "/v1/tools",
        list_tools,
        "the tools a run may use",
        role=Role.MEMBER,
        response=ToolList,
        description="The tools registered on this daemon; name them in `tools` of POST /v1/runs.",
    ),
    Endpoint(
        "GET",
        "/v1/runs/{run_id}",
        get_run,
        "read a run with its tasks",
        role=Role.VIEWER,
        response=RunView,
        errors=(404, 503),
        description="503 `store_refuses_writes` for a run whose execution on this daemon "
        "stopped because the store refused its writes, while it still refuses them: the "
        "store's record of it (under way) is out of date until they are taken again.",
    ),
    Endpoint(
        "GET",
        "/v1/runs/{run_id}/host-metadata",
        get_host_metadata,
        "what a host integration shows for a run",
        role=Role.VIEWER,
        response=HostMetadataView,
        errors=(404,),
        description="Mode, tasks, statuses and usage; reasoning only on surface runs for "
        "developer and above, through the one output filter.",
    ),
    Endpoint(
        "GET",
        "/v1/runs/{run_id}/events",
        list_events,
        "page through a run's events",
        role=Role.VIEWER,
        response=EventPage,
        params=(
            QueryParam("after", "only events with seq > after", minimum=0),
            QueryParam("limit", "at most this many raw events", minimum=1, maximum=5000),
        ),
        errors=(404, 422),
    ),
    Endpoint(
        "GET",
        "/v1/runs/{run_id}/trace",
        get_trace,
        "read a run's trace metadata",
        role=Role.DEVELOPER,
        response=EventPage,
        errors=(404,),
    ),
    Endpoint(
        "POST",
        "/v1/runs/{run_id}/approvals/{call_id}",
        answer_approval,
        "answer a tool approval",
        role=Role.MEMBER,
        body=ApprovalBody,
        response=ApprovalResult,
        errors=(400, 404, 409, 413, 422, 503),
        description="Answers a pending approval wherever the run executes (with durable runs, "
        "through any replica; the answer waits for a run that is between processes). 503 "
        "`store_refuses_writes` while the store refuses writes (GET /readyz): the answer is not "
        "given, as it could not be recorded, and the approval stays pending to be answered again.",
    ),
    Endpoint(
        "POST",
        "/v1/runs/{run_id}/resume",
        resume_run,
        "resume a suspended run",
        role=Role.MEMBER,
        response=RunCreated,
        status=202,
        errors=(404, 409, 503),
        description="Continues a durable run whose process stopped (a killed `thoughtgate run`) "
        "from its last completed step, on this daemon's queue. 409 when it is not waiting to "
        "resume, or uses tools this daemon lacks.",
    ),
)
