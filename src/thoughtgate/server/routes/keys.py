"""API keys over HTTP, for admins and owners (the same rules as ``thoughtgate keys``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.access.keys import Principal, create_key, key_view, revoke_key
from thoughtgate.access.roles import Role
from thoughtgate.server.api import Endpoint, parse_body
from thoughtgate.server.errors import ApiError
from thoughtgate.server.models import CreatedKeyView, CreateKeyBody, KeyList, RevokeResult
from thoughtgate.server.responses import JSONResponse
from thoughtgate.server.state import state_of

__all__ = ["ENDPOINTS"]


async def create_api_key(request: Request, principal: Principal | None) -> Response:
    assert principal is not None
    body = await parse_body(request, CreateKeyBody)
    created = await create_key(
        state_of(request).store, name=body.name, role=body.role, by=principal.role
    )
    return JSONResponse(created.to_dict(), status_code=201, headers={"Cache-Control": "no-store"})


async def list_api_keys(request: Request, principal: Principal | None) -> Response:
    keys = await state_of(request).store.list_api_keys()
    return JSONResponse({"keys": [key_view(k) for k in keys]})


async def revoke_api_key(request: Request, principal: Principal | None) -> Response:
    assert principal is not None
    target = request.path_params["key"]
    revoked = await revoke_key(state_of(request).store, target, by=principal.role)
    if revoked is None:
        raise ApiError(404, f"no active key with id or name {target!r}")
    return JSONResponse({"revoked": True, "key_id": revoked.key_id, "name": revoked.name})


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        "/v1/keys",
        create_api_key,
        "create an API key (shown once)",
        role=Role.ADMIN,
        body=CreateKeyBody,
        response=CreatedKeyView,
        status=201,
        errors=(400, 413, 422),
    ),
    Endpoint("GET", "/v1/keys", list_api_keys, "list API keys", role=Role.ADMIN, response=KeyList),
    Endpoint(
        "DELETE",
        "/v1/keys/{key}",
        revoke_api_key,
        "revoke an API key by id or name",
        role=Role.ADMIN,
        response=RevokeResult,
        errors=(400, 404),
        description="By exact id (key_...), or by a name exactly one active key holds; a name "
        "held by several active keys is 400 with their ids. Live streams opened with tickets of "
        "the key end within a few seconds.",
    ),
)
