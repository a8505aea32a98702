"""The Anthropic Messages format for the emulator: validation with the real 400s, and rendering.

``handle`` records the request, validates it as the real API does (answering with its error body
``{"type": "error", "error": {"type", "message"}, "request_id"}`` and a ``request-id`` header),
then renders the scripted turn either as an SSE stream in the real byte shape (``event:`` lines,
padded JSON, ``ping``, an empty ``thinking_delta`` then ``signature_delta`` before a thinking
block's stop) or as a message JSON when ``stream`` is absent or false.

The request is honoured as the API would: without ``thinking`` no thinking blocks come back,
except on Fable and Mythos, which think unasked (and refuse ``{"type": "disabled"}`` on Fable 5 /
Mythos 5); ``display: "omitted"`` (the default on Opus 4.7+, Fable and Mythos) gives empty thinking
text with a signature. A :class:`~thoughtgate.testing.emulator.scenario.Pause` step ends a response
with ``stop_reason: "pause_turn"``; the request that sends that response back as the final
assistant message gets the steps after it, as the API continues a paused turn. Signatures (:func:`thinking_signature`) cover the model, the block's place among the
message's thinking blocks and the returned text, so a replayed block that was edited, re-signed,
moved, dropped or replayed to another model is caught like the real API catches it.

Control steps: ``Fail`` answers with an HTTP error for its first ``times`` attempts; ``StreamError``
sends an in-stream ``error`` event and ends the stream; ``Cut`` aborts the connection mid-body;
``Sleep`` pauses. ``StreamError`` and ``Cut`` interrupt the block right before them: it gets no
``content_block_stop`` (a thinking block gets no signature), as when a real stream breaks mid-block.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from thoughtgate.testing.emulator.scenario import (
    Call,
    Cut,
    Fail,
    Redacted,
    Say,
    ScriptedTurn,
    Sleep,
    StreamError,
    Summary,
    Think,
    opaque_blob,
    sign,
    split_text,
    verify,
)
from thoughtgate.testing.emulator.server import Emulator, RecordedRequest

__all__ = ["ADAPTIVE_ONLY", "ERROR_STATUS", "handle", "thinking_signature", "validate"]

DOCS: Final = "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"

#: Models that reject the budget form with a 400 (opencode#22863, openclaw#87801, §1.1 table).
ADAPTIVE_ONLY: Final = re.compile(r"claude-(?:opus-4-[78]|fable-5|mythos-5)")
#: Models whose thinking display defaults to "omitted" (litellm#25965, claude-code#49268).
OMITTED_BY_DEFAULT: Final = re.compile(r"claude-(?:opus-4-[789]|fable|mythos)")
#: Models that think (adaptively) when the request has no ``thinking`` at all (§1.1 table).
THINKS_UNASKED: Final = re.compile(r"claude-(?:fable|mythos)")
#: Models that answer ``thinking: {"type": "disabled"}`` with a 400 (§1.1: Fable 5, Mythos 5).
NO_DISABLE: Final = re.compile(r"claude-(?:fable|mythos)-5")

#: HTTP status the API uses for each error type (A-SDK types/shared/*_error.py).
ERROR_STATUS: Final[Mapping[str, int]] = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

_THINKING_TYPES: Final = ("thinking", "redacted_thinking")
_EFFORTS: Final = ("low", "medium", "high", "xhigh", "max")


class ScriptedCut(Exception):
    """Raised inside the response body to drop the connection mid-stream (a ``Cut`` step)."""


class _HideScriptedCuts(logging.Filter):
    """A scripted cut is the emulator working as asked, not a server error worth a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, ScriptedCut)


logging.getLogger("uvicorn.error").addFilter(_HideScriptedCuts())


# --------------------------------------------------------------------------- entry point


async def handle(request: Request, emulator: Emulator) -> Response:
    """Answer one ``POST /v1/messages`` as the Anthropic API would."""
    headers = {k.lower(): v for k, v in request.headers.items()}
    record = RecordedRequest(request.url.path, headers, None)
    emulator.requests.append(record)
    request_id = "req_011Emu" + secrets.token_hex(10)
    raw = await request.body()
    problem: str | None = None
    try:
        body: Any = json.loads(raw)
        record.body = body
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        body, problem = None, _json_message(exc)
    # credentials and version are checked before the body, as the API does
    if not (headers.get("x-api-key") or headers.get("authorization")):
        return _error(
            record, request_id, 401, "authentication_error", "x-api-key header is required"
        )
    if not headers.get("anthropic-version"):
        return _error(
            record,
            request_id,
            400,
            "invalid_request_error",
            "anthropic-version: header is required",
        )
    problem = problem or validate(body)
    if problem is not None:
        return _error(record, request_id, 400, "invalid_request_error", problem)

    scenario = emulator.pick(headers, body["model"])
    messages = body["messages"]
    turn_index = sum(1 for m in messages if m.get("role") == "assistant")
    continued: list[Any] | None = None
    if (
        messages[-1].get("role") == "assistant"
        and len(scenario.turn(turn_index - 1).segments()) > 1
    ):
        turn_index -= 1  # the final assistant message is the paused turn, sent back to continue
        continued = _blocks(messages[-1])
    scripted = scenario.turn(turn_index)
    failure = _failure(emulator.attempt(scenario.name, turn_index), scripted)
    if failure is not None:
        return _error(
            record,
            request_id,
            failure.status,
            failure.error_type,
            failure.message,
            retry_after=failure.retry_after,
        )
    plan = _pick_plan(scripted, body, turn_index, continued)
    if plan is None:
        return _error(
            record,
            request_id,
            400,
            "invalid_request_error",
            "emulator: the final assistant message is not the paused response of this turn",
        )
    if body.get("stream"):
        record.status = 200
        return StreamingResponse(
            _sse_body(plan, request_id),
            media_type="text/event-stream; charset=utf-8",
            headers={"request-id": request_id, "cache-control": "no-cache"},
        )
    return await _json_response(record, plan, request_id)


def _json_message(exc: Exception) -> str:
    return f"The request body is not valid JSON: {exc}"


def _error(
    record: RecordedRequest,
    request_id: str,
    status: int,
    etype: str,
    message: str,
    *,
    retry_after: float | None = None,
) -> JSONResponse:
    record.status = status
    headers = {"request-id": request_id}
    if retry_after is not None:
        headers["retry-after"] = f"{retry_after:g}"
    if status == 529 or status >= 500:
        headers["x-should-retry"] = "true"
    body = {"type": "error", "error": {"type": etype, "message": message}, "request_id": request_id}
    return JSONResponse(body, status_code=status, headers=headers)


def _failure(attempt: int, turn: ScriptedTurn) -> Fail | None:
    """The ``Fail`` step this attempt hits: each fails its first ``times`` attempts in order."""
    for step in turn.steps:
        if isinstance(step, Fail):
            if attempt <= step.times:
                return step
            attempt -= step.times
    return None


# --------------------------------------------------------------------------- validation


def validate(body: Any) -> str | None:
    """The API's 400 message for ``body``, or ``None`` when the request is acceptable."""
    if not isinstance(body, dict):
        return "The request body is not valid JSON: expected an object"
    for name in ("model", "max_tokens", "messages"):
        if name not in body:
            return f"{name}: Field required"
    if not isinstance(body["model"], str):
        return "model: Input should be a valid string"
    max_tokens = body["max_tokens"]
    if type(max_tokens) is not int:
        return "max_tokens: Input should be a valid integer"
    if max_tokens < 1:
        return "max_tokens: Input should be greater than or equal to 1"
    messages = body["messages"]
    if not isinstance(messages, list):
        return "messages: Input should be a valid list"
    if not messages:
        return "messages: at least one message is required"
    thinking_on, problem = _validate_thinking(body)
    if problem is None:
        problem = _validate_shapes(messages)
    if problem is None:
        problem = _validate_tool_pairs(messages)
    if problem is None:
        problem = _validate_thinking_history(messages, thinking_on, str(body["model"]))
    return problem


def _validate_thinking(body: Mapping[str, Any]) -> tuple[bool, str | None]:
    thinking = body.get("thinking")
    model = str(body["model"]).lower()
    on = thinking is None and THINKS_UNASKED.search(model) is not None
    if thinking is not None:
        if not isinstance(thinking, dict):
            return False, "thinking: Input should be a valid dictionary or object"
        ttype = thinking.get("type")
        if ttype not in ("enabled", "adaptive", "disabled"):
            return False, (
                f"thinking: Input tag '{ttype}' found using 'type' does not match any of the "
                "expected tags: 'adaptive', 'disabled', 'enabled'"
            )
        display = thinking.get("display")
        if display not in (None, "summarized", "omitted"):
            return False, f"thinking.{ttype}.display: Input should be 'summarized' or 'omitted'"
        on = ttype != "disabled"
        if ttype == "disabled" and NO_DISABLE.search(model):
            return False, (
                '"thinking.type.disabled" is not supported for this model. This model always '
                'uses adaptive thinking; use "output_config.effort" to control thinking behavior.'
            )
        if ttype == "enabled":
            problem = _validate_budget(thinking, body)
            if problem is not None:
                return on, problem
    output_config = body.get("output_config")
    if isinstance(output_config, dict) and output_config.get("effort") not in (None, *_EFFORTS):
        return on, (
            "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"
        )
    temperature = body.get("temperature")
    if on and temperature is not None and temperature != 1:
        return on, (
            "`temperature` may only be set to 1 when thinking is enabled. Please consult our "
            f"documentation at {DOCS}#important-considerations-when-using-extended-thinking"
        )
    return on, None


def _validate_budget(thinking: Mapping[str, Any], body: Mapping[str, Any]) -> str | None:
    budget = thinking.get("budget_tokens")
    if budget is None:
        return "thinking.enabled.budget_tokens: Field required"
    if type(budget) is not int:
        return "thinking.enabled.budget_tokens: Input should be a valid integer"
    if budget < 1024:
        return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
    if ADAPTIVE_ONLY.search(str(body["model"]).lower()):
        return (
            '"thinking.type.enabled" is not supported for this model. Use '
            '"thinking.type.adaptive" and "output_config.effort" to control thinking behavior.'
        )
    if body["max_tokens"] <= budget:
        return (
            "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
            f"documentation at {DOCS}#max-tokens-and-context-window-size"
        )
    return None


def _blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _validate_shapes(messages: Sequence[Any]) -> str | None:
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        content = message.get("content")
        if not isinstance(content, str | list):
            return f"messages.{i}.content: Field required"
        blocks = _blocks(message)
        if not content and not (message["role"] == "assistant" and i == len(messages) - 1):
            return (
                f"messages.{i}: all messages must have non-empty content except for the optional "
                "final assistant message"
            )
        for j, block in enumerate(blocks):
            if block.get("type") == "text":
                text = block.get("text")
                if not isinstance(text, str) or not text:
                    return "messages: text content blocks must be non-empty"
                if not text.strip():
                    return "messages: text content blocks must contain non-whitespace text"
            if block.get("type") in _THINKING_TYPES and message["role"] != "assistant":
                return f"messages.{i}.content.{j}: thinking blocks are only allowed in `assistant`"
        types = [b.get("type") for b in blocks]
        thinking_inside = any(t in _THINKING_TYPES for t in types)
        if message["role"] == "assistant" and thinking_inside and types[0] not in _THINKING_TYPES:
            return (
                f"messages.{i}.content.0: If an assistant message contains any thinking "
                f"blocks, the first block must be thinking or redacted_thinking. "
                f"Found {types[0]}."
            )
    last = messages[-1]
    if (
        last["role"] == "assistant"
        and _blocks(last)
        and _blocks(last)[-1].get("type") == "thinking"
    ):
        n = len(messages) - 1
        return f"messages.{n}: The final block in an assistant message cannot be `thinking`."
    return None


def _validate_tool_pairs(messages: Sequence[Mapping[str, Any]]) -> str | None:
    for i, message in enumerate(messages):
        blocks = _blocks(message)
        if message["role"] == "assistant":
            ids = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
            if not ids or i == len(messages) - 1:
                continue
            answered = {
                str(b.get("tool_use_id"))
                for b in _blocks(messages[i + 1])
                if b.get("type") == "tool_result"
            }
            missing = [x for x in ids if x not in answered]
            if missing or messages[i + 1]["role"] != "user":
                return (
                    f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing or ids)}. Each `tool_use` block must "
                    "have a corresponding `tool_result` block in the next message."
                )
        else:
            previous = _blocks(messages[i - 1]) if i > 0 else []
            known = {str(b.get("id")) for b in previous if b.get("type") == "tool_use"}
            for j, block in enumerate(blocks):
                if (
                    block.get("type") == "tool_result"
                    and str(block.get("tool_use_id")) not in known
                ):
                    return (
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                        "block must have a corresponding `tool_use` block in the previous message."
                    )
    return None


def _validate_thinking_history(
    messages: Sequence[Mapping[str, Any]], on: bool, model: str
) -> str | None:
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistants:
        return None
    final = assistants[-1]
    final_blocks = _blocks(messages[final])
    if not on:
        for j, block in enumerate(final_blocks):
            if block.get("type") in _THINKING_TYPES:
                return (
                    f"messages.{final}.content.{j}: When thinking is disabled, an `assistant` "
                    "message in the final position cannot contain `thinking`. To use thinking "
                    "blocks, enable `thinking` in your request."
                )
        return None
    last = messages[-1]
    in_tool_loop = (
        final == len(messages) - 2
        and any(b.get("type") == "tool_result" for b in _blocks(last))
        and final_blocks
    )
    if in_tool_loop and final_blocks[0].get("type") not in _THINKING_TYPES:
        return (
            f"messages.{final}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
            f"found `{final_blocks[0].get('type')}`. When `thinking` is enabled, a final "
            "`assistant` message must start with a thinking block (preceeding the lastmost set of "
            "`tool_use` and `tool_result` blocks). We recommend you include thinking blocks from "
            "previous turns. To avoid this requirement, disable `thinking`. Please consult our "
            f"documentation at {DOCS}"
        )
    for i in assistants:
        ordinal = 0  # the block's place among the message's thinking blocks
        for j, block in enumerate(_blocks(messages[i])):
            intact = _intact(block, model, ordinal)
            ordinal += block.get("type") in _THINKING_TYPES
            if not intact:
                if i == final and _well_formed(block):
                    return (
                        f"messages.{i}.content.{j}: `thinking` or `redacted_thinking` blocks in "
                        "the latest assistant message cannot be modified. These blocks must "
                        "remain as they were in the original response."
                    )
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
    return None


def thinking_signature(model: str, text: str, ordinal: int = 0) -> str:
    """The emulator's signature for a thinking block: bound to the model that wrote it, to the
    block's place among the message's thinking blocks, and to its exact text. So a block replayed
    edited, moved, merged or to another model fails the check, as on the real API (the maintainer
    in anthropics/anthropic-sdk-python#1598 lists those causes)."""
    return sign(model, str(ordinal), text)


def _intact(block: Mapping[str, Any], model: str, ordinal: int) -> bool:
    """A thinking block whose signature matches its model, place and text, or an untouched
    redacted blob."""
    btype = block.get("type")
    if btype == "thinking":
        text, signature = block.get("thinking"), block.get("signature")
        return (
            isinstance(text, str)
            and isinstance(signature, str)
            and verify(signature, model, str(ordinal), text)
        )
    if btype == "redacted_thinking":
        raw = _b64(str(block.get("data", "")).removeprefix("gAAAAA"))
        return raw is not None and len(raw) == 128 and raw == raw[:32] * 4
    return True


def _well_formed(block: Mapping[str, Any]) -> bool:
    """The signature has the emulator's shape (so the text, not the signature, was changed)."""
    if block.get("type") != "thinking":
        return True
    raw = _b64(str(block.get("signature", "")).removeprefix("Eq"))
    return raw is not None and len(raw) == 34 and raw.startswith(b"\x12\x08")


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


# --------------------------------------------------------------------------- rendering


Control: TypeAlias = StreamError | Cut | Sleep


@dataclass(slots=True)
class _Plan:
    """A scripted turn resolved against the request: full content blocks and control steps."""

    items: list[dict[str, Any] | Control]
    model: str
    chunk_chars: int
    input_tokens: int
    stop_reason: str
    message_id: str
    thinking_text: dict[int, str] = field(default_factory=dict)

    @property
    def blocks(self) -> list[dict[str, Any]]:
        return [i for i in self.items if isinstance(i, dict)]

    def usage(self) -> dict[str, Any]:
        output = 1
        thinking = 0
        for n, block in enumerate(self.blocks):
            size = len(json.dumps(block.get("input"))) if block["type"] == "tool_use" else 0
            size += len(block.get("text", "")) + len(self.thinking_text.get(n, ""))
            tokens = max(1, size // 4)
            output += tokens
            if block["type"] in _THINKING_TYPES:
                thinking += tokens
        usage: dict[str, Any] = {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output,
        }
        if thinking:
            usage["output_tokens_details"] = {"thinking_tokens": thinking}
        return usage


def _display(body: Mapping[str, Any]) -> str | None:
    """``summarized`` / ``omitted`` when thinking is on, ``None`` when it is off."""
    thinking = body.get("thinking")
    model = str(body["model"]).lower()
    if thinking is None and THINKS_UNASKED.search(model):
        return "omitted" if OMITTED_BY_DEFAULT.search(model) else "summarized"
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return None
    display = thinking.get("display")
    if display:
        return str(display)
    return "omitted" if OMITTED_BY_DEFAULT.search(str(body["model"]).lower()) else "summarized"


def _plan(
    turn: ScriptedTurn,
    steps: Sequence[Any],
    body: Mapping[str, Any],
    turn_index: int,
    *,
    ordinal_base: int = 0,
    call_base: int = 0,
    paused: bool = False,
) -> _Plan:
    """One response: ``steps`` (a segment of the turn) resolved against the request."""
    display = _display(body)
    calls_here = any(isinstance(s, Call) for s in steps)
    plan = _Plan(
        [],
        str(body["model"]),
        turn.chunk_chars,
        turn.input_tokens,
        "pause_turn" if paused else ("tool_use" if calls_here else "end_turn"),
        "msg_01Emu" + secrets.token_hex(10),
    )
    calls = call_base
    for step in steps:
        if isinstance(step, Think | Summary):
            if display is not None:
                shown = step.text if display == "summarized" else ""
                plan.thinking_text[len(plan.blocks)] = step.text
                ordinal = ordinal_base + sum(1 for b in plan.blocks if b["type"] in _THINKING_TYPES)
                signature = thinking_signature(plan.model, shown, ordinal)
                plan.items.append({"type": "thinking", "thinking": shown, "signature": signature})
        elif isinstance(step, Redacted):
            if display is not None:
                plan.items.append({"type": "redacted_thinking", "data": opaque_blob(step.label)})
        elif isinstance(step, Say):
            plan.items.append({"type": "text", "text": step.text})
        elif isinstance(step, Call):
            calls += 1
            call_id = step.call_id or f"toolu_emu{turn_index:02d}{calls:02d}"
            plan.items.append(
                {"type": "tool_use", "id": call_id, "name": step.name, "input": step.arguments}
            )
        elif isinstance(step, StreamError | Cut | Sleep):
            plan.items.append(step)
    return plan


def _plans(turn: ScriptedTurn, body: Mapping[str, Any], turn_index: int) -> list[_Plan]:
    """One plan per segment of the turn (split at ``Pause``); a continued response's thinking
    signatures count the paused responses' thinking blocks before it, since they all end up in
    one assistant message."""
    segments = turn.segments()
    plans: list[_Plan] = []
    ordinals = calls = 0
    for k, steps in enumerate(segments):
        plan = _plan(
            turn,
            steps,
            body,
            turn_index,
            ordinal_base=ordinals,
            call_base=calls,
            paused=k < len(segments) - 1,
        )
        ordinals += sum(1 for b in plan.blocks if b["type"] in _THINKING_TYPES)
        calls += sum(1 for b in plan.blocks if b["type"] == "tool_use")
        plans.append(plan)
    return plans


def _pick_plan(
    turn: ScriptedTurn, body: Mapping[str, Any], turn_index: int, continued: list[Any] | None
) -> _Plan | None:
    """The plan this request gets: the first segment, or -- for a continuation, whose final
    assistant message holds the paused responses' blocks -- the segment after them."""
    plans = _plans(turn, body, turn_index)
    if continued is None:
        return plans[0]
    seen = 0
    for k, plan in enumerate(plans[:-1]):
        seen += len(plan.blocks)
        if seen == len(continued):
            return plans[k + 1]
    return None


def _message(plan: _Plan, content: list[dict[str, Any]], stop_reason: str | None) -> dict[str, Any]:
    return {
        "id": plan.message_id,
        "type": "message",
        "role": "assistant",
        "model": plan.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": plan.usage() | {"service_tier": "standard"},
    }


async def _json_response(record: RecordedRequest, plan: _Plan, request_id: str) -> Response:
    for item in plan.items:
        if isinstance(item, Sleep):
            await asyncio.sleep(item.seconds)
        elif isinstance(item, StreamError):
            status = ERROR_STATUS.get(item.error_type, 500)
            return _error(record, request_id, status, item.error_type, item.message)
        elif isinstance(item, Cut):
            record.status = 200
            data = json.dumps(_message(plan, plan.blocks, plan.stop_reason)).encode()
            return StreamingResponse(
                _cut_after(data[: len(data) // 2]),
                media_type="application/json",
                headers={"request-id": request_id},
            )
    record.status = 200
    return JSONResponse(
        _message(plan, plan.blocks, plan.stop_reason), headers={"request-id": request_id}
    )


async def _cut_after(data: bytes) -> AsyncIterator[bytes]:
    yield data
    raise ScriptedCut("emulator: scripted connection cut")


class _Encoder:
    """SSE framing with the real API's habit of padding JSON with spaces before the last brace."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, event: str, data: Mapping[str, Any]) -> bytes:
        self.count += 1
        pad = " " * ((self.count * 7) % 16)
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return f"event: {event}\ndata: {text[:-1]}{pad}}}\n\n".encode()


_INPUT_USAGE: Final = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
_PING: Final = b'event: ping\ndata: {"type": "ping"}\n\n'


def _block_events(
    encode: _Encoder, index: int, block: dict[str, Any], size: int
) -> tuple[list[bytes], list[bytes]]:
    """``(opening and deltas, closing)`` events for one block."""
    btype = block["type"]

    def delta(body: dict[str, Any]) -> bytes:
        return encode(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": body}
        )

    def start(content_block: dict[str, Any]) -> bytes:
        return encode(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": content_block},
        )

    stop = encode("content_block_stop", {"type": "content_block_stop", "index": index})
    if btype == "thinking":
        events = [start({"type": "thinking", "thinking": "", "signature": ""})]
        if block["thinking"]:
            events += [
                delta({"type": "thinking_delta", "thinking": piece})
                for piece in split_text(block["thinking"], size)
            ]
            events.append(delta({"type": "thinking_delta", "thinking": ""}))
        closing = [delta({"type": "signature_delta", "signature": block["signature"]}), stop]
        return events, closing
    if btype == "text":
        events = [start({"type": "text", "text": ""})]
        events += [
            delta({"type": "text_delta", "text": piece})
            for piece in split_text(block["text"], size)
        ]
        return events, [stop]
    if btype == "tool_use":
        events = [
            start({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}})
        ]
        arguments = json.dumps(block["input"], ensure_ascii=False)
        events.append(delta({"type": "input_json_delta", "partial_json": ""}))
        events += [
            delta({"type": "input_json_delta", "partial_json": piece})
            for piece in split_text(arguments, size)
        ]
        return events, [stop]
    return [start(block)], [stop]  # redacted_thinking arrives whole in its start event


def _stream_items(plan: _Plan, request_id: str) -> list[bytes | Control]:
    encode = _Encoder()
    usage = plan.usage()
    start_usage = {k: usage[k] for k in _INPUT_USAGE} | {"output_tokens": 1}
    start = _message(plan, [], None) | {"usage": start_usage}
    out: list[bytes | Control] = [
        encode("message_start", {"type": "message_start", "message": start})
    ]
    pending: list[bytes] = []  # the closing events of the previous block
    index = 0
    for item in plan.items:
        if isinstance(item, StreamError | Cut):
            if isinstance(item, StreamError):
                error = {"type": item.error_type, "message": item.message}
                payload = {"type": "error", "error": error, "request_id": request_id}
                out.append(f"event: error\ndata: {json.dumps(payload)}\n\n".encode())
            else:
                out.append(item)
            return out  # the interrupted block never closes
        out += pending
        pending = []
        if isinstance(item, Sleep):
            out.append(item)
            continue
        opening, pending = _block_events(encode, index, item, plan.chunk_chars)
        out.append(opening[0])
        if index == 0:
            out.append(_PING)  # the API pings right after the first block starts
        out += opening[1:]
        index += 1
    out += pending
    if index == 0:
        out.append(_PING)
    out.append(
        encode(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": plan.stop_reason, "stop_sequence": None},
                "usage": plan.usage(),
            },
        )
    )
    out.append(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    return out


async def _sse_body(plan: _Plan, request_id: str) -> AsyncIterator[bytes]:
    for item in _stream_items(plan, request_id):
        if isinstance(item, bytes):
            yield item
        elif isinstance(item, Sleep):
            await asyncio.sleep(item.seconds)
        elif isinstance(item, Cut):
            raise ScriptedCut("emulator: scripted connection cut")
