"""How the client reports a daemon's answer that is not a success, translated once, here.

::

    ThoughtgateError                      (thoughtgate.errors)
    ├── AnswerError                       made from an answer: ``status``, ``code``, ``body``
    ├── UsageError
    │   ├── AuthenticationError
    │   │   ├── TicketRefusedError        401: a live-channel ticket was not accepted
    │   │   └── KeyRefusedError           401: the daemon does not accept this key
    │   ├── AccessDeniedError
    │   │   └── ForbiddenError            403: the key's role may not do this
    │   ├── RunNotFoundError
    │   │   └── NoSuchRunError            404 naming the run: no run with that id
    │   └── RequestRejectedError          any other 4xx (400, 404, 409, 413, 422): fix the request
    └── RuntimeFailure
        └── DaemonError                   5xx, an unreadable answer, or a live channel that
            │                             brought nothing new within the reconnect budget
            └── DaemonUnreachableError    the connection failed or dropped

Every class under ``UsageError`` and ``DaemonError`` here is an ``AnswerError`` too, so
``except AnswerError as exc`` reads ``exc.body`` of whichever the daemon's answer raised; the
core classes they refine (``AuthenticationError``, ``AccessDeniedError``, ``RunNotFoundError``)
still catch them.

Every error keeps the daemon's ``{"error": {"code", "message"}}`` text in its message but two,
whose words are for an HTTP caller: a refused key (the daemon's "authentication required: a
valid API key (Authorization: Bearer KEY) or live ticket") says it is this client's key, and a
provider the daemon is not configured for (``503 provider_not_configured``) adds that no run
was started. A 4xx answer in no daemon's words (another server at that address) is
``RequestRejectedError`` with the code ``not_a_daemon``, saying so; a 5xx one keeps its own
words (its first 200 characters).

Whatever the answer says is another program's text until proven otherwise: a client pointed at
a mistyped or hostile address, or at a proxy, gets whatever that server sends. An error's text
-- what ``str(exc)`` gives a library user's log and terminal -- shows its control characters as
``\\x1b`` and the like (tab and line break stay; ``thoughtgate.inert``), keeps to 2000 characters
(then "… (N characters in all)"), and a ``code`` is one only when it is an identifier. Every
error made from an answer keeps its body, as it came, on ``body`` (ADR 0135, amendments 4 and
6). A daemon's own words are shown as they are.
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from thoughtgate.errors import (
    AccessDeniedError,
    AuthenticationError,
    RunNotFoundError,
    RuntimeFailure,
    ThoughtgateError,
    UsageError,
    identifier,
    public_url,
)
from thoughtgate.inert import bounded, inert_text

__all__ = [
    "KEY_REFUSED",
    "MESSAGE_LIMIT",
    "AnswerError",
    "DaemonError",
    "DaemonUnreachableError",
    "ForbiddenError",
    "KeyRefusedError",
    "NoSuchRunError",
    "RequestRejectedError",
    "TicketRefusedError",
    "raise_for_response",
]

KEY_REFUSED = "it is unknown or revoked; ask the daemon's operator for one"
"""Why a daemon refuses a key, and what to do."""

MESSAGE_LIMIT = 2000
"""The most characters of an answer's words an error's text shows (a daemon's are far fewer)."""

_PLAIN_LIMIT = 200
"""The most characters shown of an answer in no daemon's words (a proxy's error page)."""


def _shown(text: str) -> str:
    """An answer's words as an error's text may hold them: bounded, control characters inert."""
    return inert_text(bounded(text, MESSAGE_LIMIT))


class AnswerError(ThoughtgateError):
    """What every error made from the daemon's answer keeps of it, whichever class the status
    made it: a caller who wants the server's exact words reads them here, not in ``str(exc)``,
    which is bounded and inert."""

    status: int | None = None
    """The answer's HTTP status (``None`` when the error was not made from an answer)."""
    code: str = ""
    """The daemon's error code when it is an identifier, else ``""``."""
    body: str | None = None
    """The answer's body as it came (``None`` when the error was not made from one)."""
    retry_after: float | None = None
    """The answer's ``Retry-After`` in seconds, when it gave one as a number (``None``
    otherwise): a caller that retries (the CLI's approval while the store refuses writes, ADR
    0170) waits that long."""

    def _answered(self, status: int | None, code: str, body: str | None) -> None:
        self.status, self.code, self.body = status, code, body


class TicketRefusedError(AuthenticationError, AnswerError):
    """The daemon did not accept a live-channel ticket (a ``401`` whose code is ``ticket_*``)."""

    def __init__(self, message: str, *, code: str, body: str | None = None) -> None:
        self.message = _shown(message) or "the daemon did not accept the ticket"
        self._answered(401, code, body)
        super().__init__(self.message)


class KeyRefusedError(AuthenticationError, AnswerError):
    """The daemon refused the client's API key (a ``401`` that is not about a ticket)."""

    def __init__(self, *, code: str = "", body: str | None = None) -> None:
        self._answered(401, code, body)
        super().__init__(f"the daemon refused this key: {KEY_REFUSED}")


class ForbiddenError(AccessDeniedError, AnswerError):
    """The daemon refused what the key's role may not do (a ``403``)."""

    def __init__(self, message: str, *, code: str, body: str | None = None) -> None:
        self.message = _shown(message) or "the key's role does not allow this"
        self._answered(403, code, body)
        super().__init__(self.message)


class NoSuchRunError(RunNotFoundError, AnswerError):
    """The daemon has no run with the id asked for (a ``404`` naming it)."""

    def __init__(self, run_id: str, *, code: str, body: str | None = None) -> None:
        self._answered(404, code, body)
        super().__init__(run_id)


class RequestRejectedError(UsageError, AnswerError):
    """The daemon refused the request as invalid (400, 404 other than a run, 409, 413, 422)."""

    def __init__(self, status: int, code: str, message: str, *, body: str | None = None) -> None:
        self.message = _shown(message)
        self._answered(status, code, body)
        super().__init__(f"[{status} {code}] {self.message}")


class DaemonError(RuntimeFailure, AnswerError):
    """The daemon failed (5xx), answered something unreadable, or could not be reached."""

    def __init__(
        self, message: str, *, status: int | None = None, code: str = "", body: str | None = None
    ) -> None:
        self.message = _shown(message)
        self._answered(status, code, body)
        bits = " ".join(b for b in (str(status) if status else "", code) if b)
        super().__init__(f"[{bits}] {self.message}" if bits else self.message)


class DaemonUnreachableError(DaemonError):
    """The connection to the daemon could not be made, or dropped before the answer was read."""


def _error_body(response: httpx.Response) -> tuple[str, str] | None:
    """The daemon's ``(code, message)``; ``None`` for an answer in no daemon's words (another
    server at that address, a proxy in front of it). A code that is not an identifier is none:
    a caller compares it, and an error's text shows it."""
    try:
        body: Any = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return identifier(str(error.get("code") or "")) or "", str(error.get("message") or "")
    return None


def _plain(response: httpx.Response) -> str:
    return bounded(response.text, _PLAIN_LIMIT) or response.reason_phrase


def _not_a_daemon(response: httpx.Response) -> str:
    """What an answer in no daemon's words says: most often the address of something else (the
    emulator's port, a web server), or a proxy's own error page."""
    try:
        request = response.request
        where = f"{public_url(str(request.url.copy_with(path='/')))}"
        asked = f" {request.method} {request.url.path}"
    except RuntimeError:  # (a response built without its request)
        where, asked = "this address", ""
    return (
        f"the server at {where} answered{asked} with HTTP {response.status_code} "
        f"{response.reason_phrase}, not as a thoughtgate daemon does: is that the daemon's "
        "address?"
    )


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` as seconds (an HTTP date, or anything else, is none)."""
    try:
        seconds = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def raise_for_response(response: httpx.Response, *, run_id: str | None = None) -> None:
    """Raise the typed error for a non-2xx answer (the body must already be read)."""
    status = response.status_code
    if status < 400:
        return
    try:
        _raise_for(response, status, run_id)
    except AnswerError as exc:
        exc.retry_after = _retry_after(response)
        raise


def _raise_for(response: httpx.Response, status: int, run_id: str | None) -> None:
    said = _error_body(response)
    if said is not None:
        code, message = said
    elif status < 500:  # a client error in no daemon's words: most likely not the daemon
        code, message = "not_a_daemon", _not_a_daemon(response)
    else:  # (a daemon's own crash, or a proxy's: its words, shown inert)
        code, message = "", _plain(response)
    body = response.text
    if status == 401:
        if code.startswith("ticket_"):
            raise TicketRefusedError(message, code=code, body=body)
        raise KeyRefusedError(code=code, body=body)
    if status == 403:
        raise ForbiddenError(message, code=code, body=body)
    if status == 404 and run_id is not None and message == str(RunNotFoundError(run_id)):
        raise NoSuchRunError(run_id, code=code, body=body)  # (not a 404 for no pending approval)
    if status < 500:
        raise RequestRejectedError(status, code or "error", message, body=body)
    if code == "provider_not_configured":
        message += (
            ": no run was started (choose another model, or ask the daemon's operator to set "
            "this provider up)"
        )
    raise DaemonError(message or "the daemon failed", status=status, code=code, body=body)
