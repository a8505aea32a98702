"""Two small ASGI middlewares: the overhead header and the request body limit.

``x-thoughtgate-overhead-ms``: the time this server spent between receiving a request and starting
its response (the daemon never waits on a provider inside a request: runs execute in the
background, so this is all our own processing). On an SSE stream it is the time to the headers.
Reading a run reads, decodes and filters all of it, so the time grows with what the filter then
withholds -- a ``surface`` run's reasoning, by its size: an answer to a key below developer goes
without the header (``READER_ROLE``), as the sizes of reasoning do (ADR 0154).

The body limit (``server.max_body_bytes``) is enforced before any route reads the body: by
``Content-Length`` when given, else while reading a chunked body; both end in ``413`` with JSON.
A body larger than uvicorn holds of it anyway (64 KiB), or of no declared length, is read only
for a caller whose API key is valid: anyone else is answered (``401``) without it, so that
connections without a key cannot make the daemon hold ``max_body_bytes`` each (ADR 0147). The
key found is handed to the route (``AUTHENTICATED``), which does not look it up again.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from thoughtgate.access.keys import Principal, authenticate
from thoughtgate.access.roles import Role
from thoughtgate.server.errors import error_response
from thoughtgate.store.key_store import KeyStore

__all__ = [
    "AUTHENTICATED",
    "OVERHEAD_HEADER",
    "READER_ROLE",
    "READ_BODY",
    "BodyLimitMiddleware",
    "OverheadHeaderMiddleware",
]

OVERHEAD_HEADER = "x-thoughtgate-overhead-ms"
_OVERHEAD_KEY = OVERHEAD_HEADER.encode("ascii")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READ_BODY = "thoughtgate.body"
"""The scope's key for a request's whole body, read by :class:`BodyLimitMiddleware`, until a
route takes it (``server.api.parse_body``) or the app's ``receive`` hands it over."""
READER_ROLE = "thoughtgate.reader_role"
"""The scope's key for the role of the key (or ticket) a route checked: the overhead header is
not sent below developer. An answer given before any key was checked (no key, a bad one, a path
no route has, the page's files) read no run, and keeps it."""
AUTHENTICATED = "thoughtgate.principal"
"""The scope's key for the caller :class:`BodyLimitMiddleware` authenticated before it read a
large body: the route's bearer check takes it instead of looking the key up again."""
_KEY_FIRST_BYTES = 64 * 1024
"""Bodies larger than this (or of no declared length) are read only for a valid API key: up to
it, uvicorn holds a body's bytes before the app asks for them anyway."""


class OverheadHeaderMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _TimedSend(scope, send, time.perf_counter()))


class _TimedSend:
    """``OverheadHeaderMiddleware``'s ``send``: the response's head gets the time since the
    request came in. One object with slots, not a closure: a live stream holds its request's
    ``send`` for as long as it is open (ADR 0171)."""

    __slots__ = ("scope", "send", "start")

    def __init__(self, scope: Scope, send: Send, start: float) -> None:
        self.scope = scope
        self.send = send
        self.start = start

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start" and _timed_for(self.scope):
            elapsed = f"{(time.perf_counter() - self.start) * 1000:.3f}".encode("ascii")
            headers = [*message.get("headers", ()), (_OVERHEAD_KEY, elapsed)]
            message = {**message, "headers": headers}
        await self.send(message)


def _timed_for(scope: Scope) -> bool:
    role = scope.get(READER_ROLE)
    return role is None or role >= Role.DEVELOPER


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int, keys: KeyStore | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.keys = keys
        """Where API keys are checked before a large body is read (``None``: never checked
        here, every body is read)."""

    def _too_large(self) -> ASGIApp:
        return error_response(
            413,
            f"request body is larger than {self.max_body_bytes} bytes (server.max_body_bytes)",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared == -1:
            await error_response(400, "bad Content-Length header")(scope, receive, send)
            return
        if declared is not None and declared > self.max_body_bytes:
            await self._too_large()(scope, receive, send)
            return
        if self.keys is not None and (declared is None or declared > _KEY_FIRST_BYTES):
            principal = await self._caller(scope)
            if principal is None:  # the route refuses it (401) without reading its body
                await self.app(scope, receive, send)
                return
            scope[AUTHENTICATED] = principal
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        # Kept in the scope for ``parse_body`` (the route's one reader of it), which takes it
        # from there instead of through Starlette's ``Request.body`` (an async generator and
        # two ``receive`` calls a request, ADR 0103); whoever reads it first has it, once.
        scope[READ_BODY] = b"".join(chunks)

        async def replay() -> Message:
            if READ_BODY in scope:
                return {"type": "http.request", "body": scope.pop(READ_BODY), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _caller(self, scope: Scope) -> Principal | None:
        """The request's API key, if it is valid; ``None`` for anything else, which the route's
        own check then answers as it always does (a missing or revoked key, a store error)."""
        assert self.keys is not None
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        try:
            return await authenticate(self.keys, header)
        except Exception:
            return None


def _content_length(scope: Scope) -> int | None:
    """The declared length, ``None`` when absent, ``-1`` when unparseable."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                return -1
            return length if length >= 0 else -1
    return None
