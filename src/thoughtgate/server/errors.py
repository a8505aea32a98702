"""Errors at the HTTP edge: every failure becomes one JSON body ``{"error": {code, message}}``.

The exception tree (``thoughtgate.errors``) is translated here and nowhere else:

==========================  ======  ==========================================================
exception                   status  body
==========================  ======  ==========================================================
``TicketError``             401/403 what is wrong with the live-channel ticket, in plain words
``AuthenticationError``     401     generic ("authentication required"), ``WWW-Authenticate``
``AccessDeniedError``       403     generic ("forbidden"): names no run, no data
``RunNotFoundError``        404     the id the caller sent
``ApprovalNotPendingError`` 409/404 409 when the run ended or the call was settled, else 404
``QuotaExceededError``      429     which limit, with ``Retry-After`` (whole seconds)
``ProviderNotConfigured..`` 503     "this server is not configured for provider 'X'" (code
                                    ``provider_not_configured``); what to set goes to the log
other ``UsageError``        400     the message (what was wrong and what is allowed)
``ApiError``                given   raised by routes for 404/409/413/422 and friends
``StoreRefusesWrites..``    503     what was refused and why, code ``store_refuses_writes`` (as a
                                    run view's while the store refuses writes, ADR 0151/0165)
other ``StoreError``        503     "the event store is unavailable"
anything else               500     "internal error" (the traceback goes to the log only)
==========================  ======  ==========================================================
"""

from __future__ import annotations

import logging
import math
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.errors import (
    STORE_REFUSES_WRITES,
    AccessDeniedError,
    ApprovalNotPendingError,
    AuthenticationError,
    ProviderNotConfiguredError,
    QuotaExceededError,
    RunNotFoundError,
    StoreError,
    StoreRefusesWritesError,
    ThoughtgateError,
    TicketError,
    UsageError,
    failure_text,
)
from thoughtgate.server.responses import JSONResponse

__all__ = [
    "STORE_REFUSES_WRITES",
    "ApiError",
    "error_response",
    "exception_handlers",
    "unexpected_failure",
]

log = logging.getLogger("thoughtgate.server")

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}


class ApiError(Exception):
    """A deliberate HTTP error with a clear message."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or _HTTP_CODES.get(status, "error")
        self.message = message
        self.details = details


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    details: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    error: dict[str, Any] = {"code": code or _HTTP_CODES.get(status, "error"), "message": message}
    if details:
        error["details"] = details
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def _unauthorized() -> JSONResponse:
    return error_response(
        401,
        "authentication required: a valid API key (Authorization: Bearer KEY) or live ticket",
        headers={"WWW-Authenticate": "Bearer"},
    )


def _forbidden() -> JSONResponse:
    return error_response(403, "forbidden: your role does not allow this")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, code=exc.code, details=exc.details)


async def _thoughtgate_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, TicketError):
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return error_response(exc.status, str(exc), code=exc.code, headers=headers)
    if isinstance(exc, AuthenticationError):
        log.info("401 %s %s: %s", request.method, request.url.path, exc)
        return _unauthorized()
    if isinstance(exc, AccessDeniedError):
        return _forbidden()
    if isinstance(exc, RunNotFoundError):
        return error_response(404, str(exc))
    if isinstance(exc, ApprovalNotPendingError):
        return error_response(404 if exc.reason == "not_pending" else 409, str(exc))
    if isinstance(exc, QuotaExceededError):
        wait = str(max(1, math.ceil(exc.retry_after)))
        return error_response(429, str(exc), headers={"Retry-After": wait})
    if isinstance(exc, ProviderNotConfiguredError):
        return _provider_not_configured(request, exc)
    if isinstance(exc, UsageError):
        return error_response(400, str(exc))
    if isinstance(exc, StoreRefusesWritesError):  # refused before trying: its words are ours
        log.warning("refused on %s %s: %s", request.method, request.url.path, exc)
        return error_response(503, str(exc), code=STORE_REFUSES_WRITES)
    if isinstance(exc, StoreError):
        log.error("store failure on %s %s: %s", request.method, request.url.path, exc)
        return error_response(503, "the event store is unavailable; try again later")
    # a provider's error quotes its own words (maybe reasoning): described, never quoted
    log.error(
        "unexpected failure on %s %s: %s", request.method, request.url.path, failure_text(exc)
    )
    return error_response(500, "internal error")


def _provider_not_configured(request: Request, exc: ProviderNotConfiguredError) -> JSONResponse:
    """A run needs a provider this daemon has no key or base URL for: the operator's setting,
    not the caller's request (ADR 0128). The caller gets a ``503`` naming the provider only; the
    log says what to set."""
    log.warning(
        "%s %s asked for provider %r, which this server is not configured for: %s",
        request.method,
        request.url.path,
        exc.provider,
        str(exc),
    )
    return error_response(503, exc.public or "", code="provider_not_configured")


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 401:
        return _unauthorized()
    if exc.status_code == 403:
        return _forbidden()
    message = exc.detail if isinstance(exc.detail, str) else "error"
    if exc.status_code == 404:
        message = f"no such route: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    headers = dict(exc.headers) if exc.headers else None
    return error_response(exc.status_code, message, headers=headers)


async def unexpected_failure(request: Request, exc: Exception) -> Response:
    """The daemon's ``500`` for a failure nothing else answered (logged with its traceback):
    ``ServerErrorMiddleware``'s handler, and ``server.cors``'s when origins are listed."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error")


def exception_handlers() -> dict[Any, Any]:
    return {
        ApiError: _api_error,
        ThoughtgateError: _thoughtgate_error,
        HTTPException: _http_exception,
        Exception: unexpected_failure,
    }
