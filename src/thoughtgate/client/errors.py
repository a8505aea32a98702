"""How the client reports a daemon's answer that is not a success, translated once, here.

::

    ThoughtgateError                      (thoughtgate.errors)
    ├── UsageError
    │   ├── AuthenticationError           401: a live-channel ticket was not accepted
    │   │   └── KeyRefusedError           401: the daemon does not accept this key
    │   ├── AccessDeniedError             403: the key's role may not do this
    │   ├── RunNotFoundError              404 naming the run: no run with that id
    │   └── RequestRejectedError          any other 4xx (400, 404, 409, 413, 422): fix the request
    └── RuntimeFailure
        └── DaemonError                   5xx, an unreadable answer, or a live channel that
            │                             brought nothing new within the reconnect budget
            └── DaemonUnreachableError    the connection failed or dropped

Every error keeps the daemon's ``{"error": {"code", "message"}}`` text in its message but two,
whose words are for an HTTP caller: a refused key (the daemon's "authentication required: a
valid API key (Authorization: Bearer KEY) or live ticket") says it is this client's key, and a
provider the daemon is not configured for (``503 provider_not_configured``) adds that no run
was started. The rejected and daemon errors also carry ``status`` and ``code``.
"""

from __future__ import annotations

from typing import Any

import httpx

from thoughtgate.errors import (
    AccessDeniedError,
    AuthenticationError,
    RunNotFoundError,
    RuntimeFailure,
    UsageError,
)

__all__ = [
    "KEY_REFUSED",
    "DaemonError",
    "DaemonUnreachableError",
    "KeyRefusedError",
    "RequestRejectedError",
    "raise_for_response",
]

KEY_REFUSED = "it is unknown or revoked; ask the daemon's operator for one"
"""Why a daemon refuses a key, and what to do."""


class KeyRefusedError(AuthenticationError):
    """The daemon refused the client's API key (a ``401`` that is not about a ticket)."""

    def __init__(self) -> None:
        super().__init__(f"the daemon refused this key: {KEY_REFUSED}")


class RequestRejectedError(UsageError):
    """The daemon refused the request as invalid (400, 404 other than a run, 409, 413, 422)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        super().__init__(f"[{status} {code}] {message}")


class DaemonError(RuntimeFailure):
    """The daemon failed (5xx), answered something unreadable, or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None, code: str = "") -> None:
        self.status = status
        self.code = code
        self.message = message
        bits = " ".join(b for b in (str(status) if status else "", code) if b)
        super().__init__(f"[{bits}] {message}" if bits else message)


class DaemonUnreachableError(DaemonError):
    """The connection to the daemon could not be made, or dropped before the answer was read."""


def _error_body(response: httpx.Response) -> tuple[str, str]:
    try:
        body: Any = response.json()
    except ValueError:
        return "", response.text[:200] or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("code") or ""), str(error.get("message") or "")
    return "", response.reason_phrase


def raise_for_response(response: httpx.Response, *, run_id: str | None = None) -> None:
    """Raise the typed error for a non-2xx answer (the body must already be read)."""
    status = response.status_code
    if status < 400:
        return
    code, message = _error_body(response)
    if status == 401:
        if code.startswith("ticket_"):
            raise AuthenticationError(message or "the daemon did not accept the ticket")
        raise KeyRefusedError
    if status == 403:
        raise AccessDeniedError(message or "the key's role does not allow this")
    if status == 404 and run_id is not None and message == str(RunNotFoundError(run_id)):
        raise RunNotFoundError(run_id)  # (a 404 for something else, e.g. no pending approval)
    if status < 500:
        raise RequestRejectedError(status, code or "error", message)
    if code == "provider_not_configured":
        message += (
            ": no run was started (choose another model, or ask the daemon's operator to set "
            "this provider up)"
        )
    raise DaemonError(message or "the daemon failed", status=status, code=code)
