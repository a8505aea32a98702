"""Who am I, is the daemon alive, and the OpenAPI document."""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version

from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.access.filter import can_read_reasoning
from thoughtgate.access.keys import Principal
from thoughtgate.access.roles import Role
from thoughtgate.server.api import Endpoint
from thoughtgate.server.models import Health, Me
from thoughtgate.server.responses import JSONResponse

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


async def openapi(request: Request, principal: Principal | None) -> Response:
    return JSONResponse(request.app.state.openapi)


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/v1/me", whoami, "who am I", role=Role.VIEWER, response=Me),
    Endpoint("GET", "/healthz", healthz, "liveness", auth="none", response=Health),
    Endpoint(
        "GET",
        "/openapi.json",
        openapi,
        "this OpenAPI document",
        auth="none",
        description="OpenAPI 3.1, generated from the route declarations and pydantic models.",
    ),
)
