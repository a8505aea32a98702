"""Who am I, is the daemon alive, can it take runs, and the OpenAPI document."""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.access.filter import can_read_reasoning
from thoughtgate.access.keys import Principal
from thoughtgate.access.roles import Role
from thoughtgate.server.api import Endpoint
from thoughtgate.server.models import Health, Me, Readiness
from thoughtgate.server.readiness import SHUTTING_DOWN
from thoughtgate.server.responses import JSONResponse
from thoughtgate.server.state import state_of

__all__ = ["ENDPOINTS", "package_version"]


@functools.cache
def package_version() -> str:
    """The installed version (read once: a metadata lookup costs more than the probe it serves)."""
    try:
        return version("thoughtgate")
    except PackageNotFoundError:
        return "0+unknown"


async def whoami(request: Request, principal: Principal | None) -> Response:
    assert principal is not None
    role = principal.role
    return JSONResponse(
        {
            "key_id": principal.key_id,
            "name": principal.name,
            "role": role.label,
            "permissions": {
                "read_runs": True,
                "start_runs": role >= Role.MEMBER,
                "answer_approvals": role >= Role.MEMBER,
                "read_reasoning": can_read_reasoning(role, "surface"),
                "read_trace": role >= Role.DEVELOPER,
                "manage_keys": role >= Role.ADMIN,
            },
        }
    )


async def healthz(request: Request, principal: Principal | None) -> Response:
    # Anyone may ask (no key): nothing of the runs, not even how many are under way.
    return JSONResponse({"status": "ok", "version": package_version()})


async def readyz(request: Request, principal: Principal | None) -> Response:
    # Anyone may ask (no key), as /healthz: one fixed word of why not, never a path, an
    # error's text or anything of the runs.
    state = state_of(request)
    reason = SHUTTING_DOWN if state.manager.closing else await state.readiness.refusal()
    if reason is None:
        return JSONResponse({"status": "ready"}, headers=_NOT_KEPT)
    return JSONResponse({"status": "unready", "reason": reason}, status_code=503, headers=_NOT_KEPT)


_NOT_KEPT = {"Cache-Control": "no-store"}
"""A readiness answer is true now only: no cache between a probe and the daemon keeps it."""


async def openapi(request: Request, principal: Principal | None) -> Response:
    return JSONResponse(request.app.state.openapi)


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/v1/me", whoami, "who am I", role=Role.VIEWER, response=Me),
    Endpoint(
        "GET",
        "/healthz",
        healthz,
        "liveness",
        auth="none",
        response=Health,
        description="The process answers; it reads nothing, so it stays ok while the store "
        "refuses writes: ask `/readyz` whether the daemon takes runs.",
    ),
    Endpoint(
        "GET",
        "/readyz",
        readyz,
        "readiness: the store takes writes",
        auth="none",
        response=Readiness,
        answers=(503,),
        description='200 `{"status": "ready"}` while the store takes writes; 503 '
        '`{"status": "unready", "reason": ...}` while it refuses them (its SQLite file removed '
        "or replaced, writes failing, PostgreSQL unreachable or read-only) or the daemon is "
        "shutting down. Asks the database at most once a second, waiting at most 2 s; nothing "
        "of the runs.",
    ),
    Endpoint(
        "GET",
        "/openapi.json",
        openapi,
        "this OpenAPI document",
        auth="none",
        description="OpenAPI 3.1, generated from the route declarations and pydantic models.",
    ),
)
