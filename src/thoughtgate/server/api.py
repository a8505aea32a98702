"""What every route shares: the declared endpoint, authentication, role checks and input parsing.

A route module declares :class:`Endpoint` objects; :func:`starlette_route` wraps each handler so
that authentication (``Authorization: Bearer KEY``) and the minimum role are checked before the
handler runs, in that order (401, then 403), and the OpenAPI document is generated from the same
declarations, so the two cannot drift apart.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from thoughtgate.access.filter import require_role
from thoughtgate.access.keys import Principal, authenticate
from thoughtgate.access.roles import Role
from thoughtgate.access.tickets import require_ticket_key
from thoughtgate.server.errors import ApiError
from thoughtgate.server.middleware import AUTHENTICATED, READ_BODY, READER_ROLE
from thoughtgate.server.state import state_of
from thoughtgate.server.stream_slots import admitted

__all__ = [
    "MAX_INT",
    "MAX_JSON_DEPTH",
    "Auth",
    "Endpoint",
    "Handler",
    "Prefetch",
    "QueryParam",
    "parse_body",
    "query_int",
    "starlette_route",
]

M = TypeVar("M", bound=BaseModel)

MAX_INT = 2**63 - 1
"""The largest integer any parameter takes: what SQLite and PostgreSQL (BIGINT) can hold."""
MAX_JSON_DEPTH = 64
"""Objects and arrays nested deeper than this are refused (no request body needs more)."""
_INTEGER = re.compile(r"-?[0-9]+")  # ASCII only: int() also takes "１２", "1_000" and " 7 "
Auth = Literal["bearer", "ticket", "none"]


@runtime_checkable
class Prefetch(Protocol):
    """A read an endpoint's ``prefetch`` queued (e.g. a live stream's ``FirstPage``)."""

    def close(self) -> None:
        """Drop it: the request was refused, or the handler has no use for it."""


Handler = Callable[[Request, Principal | None], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class QueryParam:
    name: str
    description: str
    type: Literal["integer", "string"] = "integer"
    minimum: int | None = None
    maximum: int | None = None
    """``None``: ``MAX_INT`` for integers."""
    required: bool = False
    location: Literal["query", "header"] = "query"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One route: where, who may call it, what goes in and what comes out."""

    method: Literal["GET", "POST", "DELETE"]
    path: str
    handler: Handler
    summary: str
    _: KW_ONLY
    role: Role | None = None
    """Minimum role with ``auth="bearer"``."""
    auth: Auth = "bearer"
    body: type[BaseModel] | None = None
    response: type | None = None
    """A pydantic model or a declared ``TypedDict`` view."""
    status: int = 200
    params: tuple[QueryParam, ...] = ()
    errors: tuple[int, ...] = ()
    answers: tuple[int, ...] = ()
    """Statuses other than ``status`` answered with the ``response`` model, not the error body
    (``/readyz``'s 503)."""
    media_type: str = "application/json"
    description: str = ""
    prefetch: Callable[[Request], Prefetch | None] | None = None
    """With ``auth="ticket"``: called as soon as the ticket's signature is verified, just
    before its key check reaches the store; it queues a read for the loop's next step (not
    this one: the key check goes first, and a refused request waits for nothing it read),
    which the store answers alongside the key check (ADR 0028, amended). The handler takes it
    with ``prefetched``; nothing is sent before the key check passed. (Where the key check is
    answered on the loop, SQLite's, the handler takes it before the loop turns, and it is read
    then, on the loop too: ADR 0038.)"""

    @property
    def operation_id(self) -> str:
        return self.handler.__name__


def starlette_route(endpoint: Endpoint) -> Route:
    known = frozenset(p.name for p in endpoint.params if p.location == "query")

    async def call(request: Request) -> Response:
        principal = await _authorize(request, endpoint)
        try:
            # No query string, no parameter to check (and none to parse: most requests).
            unknown = (
                sorted(set(request.query_params) - known) if request.scope["query_string"] else ()
            )
            if unknown:
                allowed = ", ".join(sorted(known)) or "none"
                raise ApiError(422, f"unknown query parameter {unknown[0]!r}; allowed: {allowed}")
            if endpoint.media_type == "text/event-stream" and principal is not None:
                state = state_of(request)  # a live stream: it holds one of its key's slots
                return await admitted(
                    state.stream_slots,
                    principal.key_id,
                    state.runtime.config.quotas.max_live_streams_per_key,
                    lambda: endpoint.handler(request, principal),
                )
            return await endpoint.handler(request, principal)
        finally:
            _drop_prefetched(request)

    return Route(endpoint.path, call, methods=[endpoint.method], name=endpoint.operation_id)


async def _authorize(request: Request, endpoint: Endpoint) -> Principal | None:
    """Who is calling, before anything else is looked at (401, then 403).

    ``bearer``: an API key with at least the endpoint's role. ``ticket``: a live-channel ticket
    for the run in the path (for the run list when the path names no run), whose key is still active and still holds the ticket's role; the
    principal then carries the ticket's key id and role.
    """
    state = state_of(request)
    if endpoint.auth == "bearer":
        # checked already by the body's reader when the body is large
        principal: Principal | None = request.scope.pop(AUTHENTICATED, None)
        if principal is None:
            principal = await authenticate(state.store, request.headers.get("authorization"))
        request.scope[READER_ROLE] = principal.role
        require_role(principal.role, endpoint.role or Role.VIEWER, endpoint.summary)
        return principal
    if endpoint.auth == "ticket":
        signer = await state.signer()
        # A route without a run in its path is the run list's (``GET /v1/runs/stream``).
        grant = signer.verify(request.query_params.get("ticket"), request.path_params.get("run_id"))
        request.scope[READER_ROLE] = grant.role
        if endpoint.prefetch is not None:  # the signature holds: read alongside the key check
            early = endpoint.prefetch(request)
            if early is not None:
                request.scope[_PREFETCHED] = early
        try:
            await require_ticket_key(state.store, grant)
        except BaseException:
            _drop_prefetched(request)  # moot: the request is refused
            raise
        return Principal(grant.key_id, "ticket", grant.role)
    return None


_PREFETCHED = "thoughtgate.prefetched"


def _drop_prefetched(request: Request) -> None:
    """A prefetch the handler did not take: stopped, its outcome moot."""
    early = request.scope.pop(_PREFETCHED, None)
    if early is not None:
        early.close()


def prefetched(request: Request) -> Prefetch | None:
    """What the endpoint's ``prefetch`` queued, or ``None``; the handler owns it from here
    (it closes it if it does not use it)."""
    early = request.scope.pop(_PREFETCHED, None)
    assert early is None or isinstance(early, Prefetch)
    return early


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body validated against ``model``: 400 for bad or over-deep JSON, 422 for a bad
    shape."""
    raw = request.scope.pop(READ_BODY, None)  # read whole by the body limit's middleware
    if raw is None:
        raw = await request.body()
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        data = json.loads(raw, object_pairs_hook=_unique_keys)
    except RecursionError:  # the parser recurses once per level: a deep body exhausts the stack
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(
            400,
            f"the request body is not valid JSON{_sent_as(request)}: {_why_not_json(exc)}",
            code="invalid_json",
        ) from None
    if _depth_over(data, MAX_JSON_DEPTH):
        raise _too_deep()
    if not isinstance(data, dict):
        raise ApiError(422, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        details = [
            {"loc": list(e["loc"]), "message": e["msg"], "type": e["type"]} for e in exc.errors()
        ]
        first = details[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ApiError(
            422, f"invalid request: {where}: {first['message']}", details=details
        ) from None


class _RepeatedKey(ValueError):
    """One key twice in one JSON object."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: JSON leaves a repeated key's meaning open
    (Python's reader keeps the last value, others the first), so a proxy or an audit log could
    read another body than the daemon acts on (ADR 0122)."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return found


def _sent_as(request: Request) -> str:
    """What a body that is not JSON was declared as, when that is not JSON either (a form, as
    ``curl -d`` sends one): the fix is then the header as much as the body."""
    declared = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if not declared or declared == "application/json" or declared.endswith("+json"):
        return ""
    shown = declared if len(declared) <= 60 else declared[:57] + "..."
    return f" (it was sent as {shown}; send Content-Type: application/json)"


def _why_not_json(exc: ValueError) -> str:
    """Why a body is not JSON, in the daemon's words (the caller's own input at most)."""
    if isinstance(exc, _RepeatedKey):
        key = str(exc.args[0])
        shown = key if len(key) <= 40 else key[:37] + "..."
        return f"the key {shown!r} appears twice in one object; send each key once"
    if isinstance(exc, UnicodeDecodeError):
        return f"it is not UTF-8 text (byte {exc.start} cannot be read)"
    if isinstance(exc, json.JSONDecodeError):
        return str(exc)
    if str(exc).startswith("Exceeds the limit"):  # int() of more digits than Python reads
        return f"it holds a number of more than {sys.get_int_max_str_digits()} digits"
    return "it cannot be read as JSON"


def _too_deep() -> ApiError:
    return ApiError(
        400,
        f"the request body is JSON nested deeper than {MAX_JSON_DEPTH} levels",
        code="invalid_json",
    )


def _depth_over(value: object, limit: int) -> bool:
    """Whether objects and arrays in ``value`` nest more than ``limit`` deep (no recursion)."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[object] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def query_int(
    request: Request,
    name: str,
    default: int,
    *,
    minimum: int = 0,
    maximum: int | None = None,
    header: str | None = None,
    query: bool = True,
) -> int:
    """An integer query parameter (or header) within bounds, else 422 naming it.

    Bounded above by ``maximum`` or ``MAX_INT``: a larger value would overflow the database's
    64-bit integers (a 500), so it is refused here with the range instead.
    """
    raw = request.query_params.get(name) if query else None
    if raw is None and header is not None:
        raw = request.headers.get(header)
    if raw is None:
        return default
    upper = MAX_INT if maximum is None else maximum
    shown = raw if len(raw) <= 40 else raw[:37] + "..."
    if not _INTEGER.fullmatch(raw):
        raise ApiError(422, f"{name} must be an integer, got {shown!r}")
    value = int(raw) if len(raw) <= 40 else None  # no 4,300-digit conversions
    if value is None or value < minimum or value > upper:
        raise ApiError(422, f"{name} must be between {minimum} and {upper}, got {shown}")
    return value
