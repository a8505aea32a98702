"""Plumbing shared by the emulator's OpenAI-style formats (chat completions and Responses).

Request logging, OpenAI-shaped error bodies (``{"error": {"message", "type", "param", "code"}}``),
``Fail`` handling, deterministic ids and opaque blobs, and the streaming response that can
``Sleep`` and ``Cut`` (abort the connection mid-body, so the client sees an incomplete chunked
body exactly as when a server dies).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from thoughtgate.testing.emulator.scenario import (
    Fail,
    Scenario,
    ScriptedTurn,
    sign,
    verify,
)
from thoughtgate.testing.emulator.server import Emulator, RecordedRequest

__all__ = [
    "SSE_HEADERS",
    "StreamCut",
    "check_fail",
    "decode_blob",
    "encode_blob",
    "error_body",
    "error_response",
    "hex_id",
    "read_json",
    "record",
    "request_id",
    "sse_response",
]

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class StreamCut(Exception):
    """Raised inside a streaming body to abort the connection (the ``Cut`` step)."""


class _DropCutLogs(logging.Filter):
    """uvicorn logs an aborted body as an application error; for a scripted cut that is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        while exc is not None:
            if isinstance(exc, StreamCut):
                return False
            exc = exc.__cause__ or exc.__context__
            if isinstance(exc, BaseExceptionGroup) and any(
                isinstance(e, StreamCut) for e in exc.exceptions
            ):
                return False
        return True


logging.getLogger("uvicorn.error").addFilter(_DropCutLogs())


def hex_id(*parts: object, length: int = 48) -> str:
    """Deterministic lowercase hex (ids look like the real opaque ones)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()
    while len(digest) < length:
        digest += hashlib.sha256(digest.encode()).hexdigest()
    return digest[:length]


def request_id(*parts: object) -> str:
    return "req_" + hex_id("request", *parts, length=32)


def encode_blob(kind: str, **fields: str) -> str:
    """An opaque, signed stand-in for encrypted reasoning: ``gAAAAA`` + base64 of signed JSON.

    The signature covers ``kind`` and every field, so any edit is detected by :func:`decode_blob`.
    """
    payload = dict(fields, kind=kind, sig=sign(kind, *(f"{k}={fields[k]}" for k in sorted(fields))))
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    return "gAAAAA" + base64.urlsafe_b64encode(raw).decode()


def decode_blob(blob: Any, kind: str) -> dict[str, str] | None:
    """The fields of a blob made by :func:`encode_blob`, or ``None`` if it is foreign or edited."""
    if not isinstance(blob, str) or not blob.startswith("gAAAAA"):
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(blob[6:].encode()))
    except (ValueError, json.JSONDecodeError):
        return None
    if not isinstance(payload, dict) or payload.get("kind") != kind:
        return None
    sig = payload.pop("sig", "")
    payload.pop("kind")
    fields = {k: str(v) for k, v in payload.items()}
    ok = verify(str(sig), kind, *(f"{k}={fields[k]}" for k in sorted(fields)))
    return fields if ok else None


async def read_json(request: Request) -> tuple[Any, Response | None]:
    """The JSON body, or a 400 in OpenAI's shape when it is not JSON."""
    raw = await request.body()
    try:
        return json.loads(raw or b"null"), None
    except json.JSONDecodeError as exc:
        return None, error_response(
            400,
            f"We could not parse the JSON body of your request. ({exc.msg})",
            "invalid_request_error",
        )


def record(request: Request, emulator: Emulator, body: Any) -> RecordedRequest:
    entry = RecordedRequest(request.url.path, dict(request.headers), body)
    emulator.requests.append(entry)
    return entry


def error_body(
    message: str, error_type: str, *, param: str | None = None, code: Any = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    error_type: str,
    *,
    param: str | None = None,
    code: Any = None,
    body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    entry: RecordedRequest | None = None,
) -> JSONResponse:
    """An error answer; ``body`` replaces the default OpenAI-shaped body (OpenRouter's differs)."""
    if body is None:
        body = error_body(message, error_type, param=param, code=code)
    all_headers = {"x-request-id": request_id(status, message)}
    all_headers.update(headers or {})
    if entry is not None:
        entry.status = status
    return JSONResponse(dict(body), status_code=status, headers=all_headers)


def check_fail(
    emulator: Emulator, scenario: Scenario, turn_index: int, turn: ScriptedTurn
) -> Fail | None:
    """The turn's ``Fail`` step if this attempt should fail (``Fail.times`` attempts fail)."""
    fail = next((s for s in turn.steps if isinstance(s, Fail)), None)
    if fail is None:
        return None
    attempt = emulator.attempt(scenario.name, turn_index)
    return fail if attempt <= fail.times else None


def fail_headers(fail: Fail) -> dict[str, str]:
    if fail.retry_after is None:
        return {}
    return {
        "retry-after-ms": str(int(fail.retry_after * 1000)),
        "retry-after": f"{fail.retry_after:g}",
    }


def sse_response(
    body: AsyncIterator[str], *, rid: str, entry: RecordedRequest | None = None
) -> StreamingResponse:
    """``text/event-stream`` from an async iterator of already-framed SSE text."""
    if entry is not None:
        entry.status = 200
    headers = dict(SSE_HEADERS, **{"x-request-id": rid})
    return StreamingResponse(body, media_type="text/event-stream; charset=utf-8", headers=headers)


def json_response(
    content: Mapping[str, Any], *, rid: str, entry: RecordedRequest | None = None
) -> JSONResponse:
    if entry is not None:
        entry.status = 200
    return JSONResponse(dict(content), headers={"x-request-id": rid})


async def cut_json(content: Mapping[str, Any]) -> AsyncIterator[bytes]:
    """Half of a JSON body, then an aborted connection (a ``Cut`` on a non-streamed answer)."""
    raw = json.dumps(content).encode()
    yield raw[: len(raw) // 2]
    raise StreamCut("scripted cut")


def cut_json_response(content: Mapping[str, Any], *, rid: str) -> StreamingResponse:
    return StreamingResponse(
        cut_json(content), media_type="application/json", headers={"x-request-id": rid}
    )


def estimate_tokens(text: str) -> int:
    """The emulator's token count: one per four characters, at least one for non-empty text."""
    return (len(text) + 3) // 4
