"""Two small ASGI middlewares: the overhead header and the request body limit.

``x-thoughtgate-overhead-ms``: the time this server spent between receiving a request and starting
its response (the daemon never waits on a provider inside a request: runs execute in the
background, so this is all our own processing). On an SSE stream it is the time to the headers.

The body limit (``server.max_body_bytes``) is enforced before any route reads the body: by
``Content-Length`` when given, else while reading a chunked body; both end in ``413`` with JSON.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from thoughtgate.server.errors import error_response

__all__ = ["OVERHEAD_HEADER", "READ_BODY", "BodyLimitMiddleware", "OverheadHeaderMiddleware"]

OVERHEAD_HEADER = "x-thoughtgate-overhead-ms"
_OVERHEAD_KEY = OVERHEAD_HEADER.encode("ascii")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
READ_BODY = "thoughtgate.body"
"""The scope's key for a request's whole body, read by :class:`BodyLimitMiddleware`, until a
route takes it (``server.api.parse_body``) or the app's ``receive`` hands it over."""


class OverheadHeaderMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                elapsed = f"{(time.perf_counter() - start) * 1000:.3f}".encode("ascii")
                headers = [*message.get("headers", ()), (_OVERHEAD_KEY, elapsed)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, timed_send)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

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
