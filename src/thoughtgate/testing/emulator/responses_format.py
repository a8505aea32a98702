"""The OpenAI Responses API (``POST /v1/responses``), streamed and not, with its pairing rules.

Rendering (``docs/providers/openai.md``, O-SDK ``types/responses``): ``event: <type>`` +
``data: {... "type", "sequence_number"}`` frames, no ``[DONE]``. ``response.created`` and
``response.in_progress`` first, ``response.completed`` (with ``output`` and ``usage``) last.

* consecutive ``Think`` / ``Summary`` / ``Redacted`` steps form one reasoning item. Its summary
  parts (``reasoning_summary_part.added`` → ``reasoning_summary_text.delta``… → ``.done`` →
  ``part.done``) are sent only when the request set ``reasoning.summary``; a ``Summary`` step is
  one part, and so is a ``Think`` step — except on ``gpt-oss*`` models, which expose raw reasoning
  as ``content`` (``response.reasoning_text.delta``). ``Redacted`` adds nothing readable. The item
  always carries ``encrypted_content`` (populated by default per the O-SDK docstring); the copy in
  ``output_item.added`` is truncated ("may be incomplete"), only ``output_item.done`` has it whole;
* ``Say`` steps form a message item (``content_part.added`` → ``output_text.delta``… → ``.done``);
  each ``Call`` is a ``function_call`` item with ``function_call_arguments.delta`` events;
* delta events carry an ``obfuscation`` padding field, as recorded.

Pairing, checked on ``input`` as the real API does: the item right after a reasoning item gets an
id made from the reasoning item's id (``fc_<rs hex>f1`` / ``msg_<rs hex>f1``), and a reasoning id
ends in a MAC of its start, so the emulator recognises both sides without keeping state. Errors
(bodies as reported in openai-node#1567, continue#8933, openai-agents-python#1611 era threads):

* ``Item 'rs_…' of type 'reasoning' was provided without its required following item.``
* ``Item 'fc_…' of type 'function_call' was provided without its required 'reasoning' item:
  'rs_…'.`` (likewise ``message``);
* ``The encrypted content for item rs_… could not be verified.`` for an edited blob;
* ``Missing required parameter: 'input[i].summary'.``; ``No tool call found for function call
  output with call_id …``.

Per model, as the live API answers (the live wording is quoted in each error):

* models that do not reason (``gpt-4*``, ``gpt-3.5*``, ``chatgpt-*``, ``gpt-5*-chat*``) produce
  no reasoning item and refuse reasoning parameters: ``reasoning.effort`` → ``Unsupported
  parameter: 'reasoning.effort' is not supported with this model.`` (RageAgainstThePixel/
  OpenAI-DotNet#500), ``reasoning.summary`` → the same sentence for ``'reasoning.summary'`` (the
  emulator's wording, UNCONFIRMED), ``include: ["reasoning.encrypted_content"]`` → ``Encrypted
  content is not supported with this model.`` (microsoft/agent-framework#7483);
* o-series and gpt-5 (before 5.1) refuse ``reasoning.effort: "none"`` (``Unsupported value:
  'none' is not supported with the 'o3' model. ...``, PAI cassette
  ``test_openrouter_thinking_false_on_always_on_route.yaml``).

The turn index is the number of runs of consecutive model-output items (reasoning, function_call,
assistant message) in ``input``: ``user, rs, fc, fco, rs, fc, fco`` is turn 2. ``Fail`` → HTTP
error; ``StreamError`` → an ``error`` event with its fields nested under ``error`` (as the live API
sends it: SwiftedMind/SwiftAgent's recorded ``insufficient_quota`` stream), then
``response.failed``, then the stream ends; ``Cut`` aborts; ``Sleep`` pauses.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.testing.emulator.openai_wire import (
    StreamCut,
    check_fail,
    cut_json_response,
    decode_blob,
    encode_blob,
    error_response,
    estimate_tokens,
    fail_headers,
    hex_id,
    json_response,
    read_json,
    record,
    sse_response,
)
from thoughtgate.testing.emulator.scenario import (
    Call,
    Cut,
    Redacted,
    Say,
    Scenario,
    ScriptedTurn,
    Sleep,
    Step,
    StreamError,
    Summary,
    Think,
    split_text,
)
from thoughtgate.testing.emulator.server import Emulator, RecordedRequest

__all__ = ["handle", "turn_index"]

CREATED = 1765226420
BLOB_KIND = "responses.reasoning"
_FOLLOW = "f1"
_OUTPUT_TYPES = ("reasoning", "function_call")
#: Models that do not reason: reasoning parameters are a 400 there.
NOT_REASONING: Final = re.compile(r"gpt-4.*|gpt-3\.5.*|chatgpt-.*|gpt-5(?:\.\d+)?-chat.*")
#: Reasoning models that always reason: ``effort: "none"`` is a 400 there.
NO_EFFORT_NONE: Final = re.compile(r"o\d.*|gpt-5(?:-(?!chat).*)?")


def _rs_hex(seed: str, ordinal: int) -> str:
    base = hex_id("rs", seed, ordinal, length=30)
    return base + hex_id("mac", base, length=18)


def _is_rs_hex(value: str) -> bool:
    return len(value) == 48 and value[30:] == hex_id("mac", value[:30], length=18)


def _required_reasoning(item_id: str) -> str | None:
    """The reasoning id an item id was paired with when the emulator produced it, if any."""
    _, _, tail = item_id.partition("_")
    if len(tail) == 50 and tail.endswith(_FOLLOW) and _is_rs_hex(tail[:48]):
        return "rs_" + tail[:48]
    return None


def _item_type(item: Mapping[str, Any]) -> str:
    return str(item.get("type") or ("message" if "role" in item else ""))


def _is_output(item: Any) -> bool:
    if not isinstance(item, Mapping):
        return False
    kind = _item_type(item)
    return kind in _OUTPUT_TYPES or (kind == "message" and item.get("role") == "assistant")


def turn_index(items: Any) -> int:
    """Runs of consecutive model-output items in ``input``."""
    if not isinstance(items, list):
        return 0
    runs, inside = 0, False
    for item in items:
        out = _is_output(item)
        if out and not inside:
            runs += 1
        inside = out
    return runs


# --------------------------------------------------------------------------- validation


def _invalid(message: str, *, param: str | None = "input", code: str | None = None) -> Response:
    return error_response(400, message, "invalid_request_error", param=param, code=code)


def _model_refuses(body: Mapping[str, Any]) -> Response | None:
    """What a model refuses among the reasoning parameters, with the live API's 400."""
    model = str(body["model"]).lower()
    param = body.get("reasoning")
    param = param if isinstance(param, Mapping) else {}
    include = body.get("include")
    if NOT_REASONING.fullmatch(model):
        for name in ("effort", "summary", "generate_summary"):
            if param.get(name) is not None:
                return _invalid(
                    f"Unsupported parameter: 'reasoning.{name}' is not supported with this model.",
                    param=f"reasoning.{name}",
                    code="unsupported_parameter",
                )
        if isinstance(include, list) and "reasoning.encrypted_content" in include:
            return _invalid("Encrypted content is not supported with this model.", param="include")
    if param.get("effort") == "none" and NO_EFFORT_NONE.fullmatch(model):
        return _invalid(
            f"Unsupported value: 'none' is not supported with the '{model}' model. Supported "
            "values are: 'low', 'medium', and 'high'.",
            param="reasoning.effort",
            code="unsupported_value",
        )
    return None


def _validate(body: Mapping[str, Any]) -> Response | None:
    if not isinstance(body.get("model"), str):
        return _invalid(
            "Missing required parameter: 'model'.", param="model", code="missing_required_parameter"
        )
    refused = _model_refuses(body)
    if refused is not None:
        return refused
    items = body.get("input")
    if isinstance(items, str) or items is None:
        return None
    if not isinstance(items, list):
        return _invalid("Invalid type for 'input': expected a string or an array.")
    calls: set[str] = set()
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            return _invalid(f"Invalid type for 'input[{i}]': expected an object.")
        problem = _check_item(body, items, i, item, calls)
        if problem is not None:
            return problem
    return None


def _check_item(
    body: Mapping[str, Any], items: list[Any], i: int, item: Mapping[str, Any], calls: set[str]
) -> Response | None:
    kind = _item_type(item)
    item_id = item.get("id")
    if kind == "reasoning":
        return _check_reasoning(body, items, i, item)
    if kind == "function_call":
        calls.add(str(item.get("call_id")))
    if kind == "function_call_output" and str(item.get("call_id")) not in calls:
        return _invalid(
            f"No tool call found for function call output with call_id {item.get('call_id')}."
        )
    if isinstance(item_id, str):
        required = _required_reasoning(item_id)
        prev = items[i - 1] if i > 0 else None
        if required is not None and not (
            isinstance(prev, Mapping)
            and prev.get("type") == "reasoning"
            and prev.get("id") == required
        ):
            return _invalid(
                f"Item '{item_id}' of type '{kind}' was provided without its required "
                f"'reasoning' item: '{required}'."
            )
    return None


def _check_reasoning(
    body: Mapping[str, Any], items: list[Any], i: int, item: Mapping[str, Any]
) -> Response | None:
    rs = str(item.get("id"))
    if "summary" not in item:
        return _invalid(
            f"Missing required parameter: 'input[{i}].summary'.",
            param=f"input[{i}].summary",
            code="missing_required_parameter",
        )
    encrypted = item.get("encrypted_content")
    if encrypted is None:
        if body.get("store") is False:
            return _invalid(
                f"Item with id '{rs}' not found. Items are not persisted when `store` is set to "
                "false. Try again with `store` set to true, or remove this item from your input."
            )
    else:
        fields = decode_blob(encrypted, BLOB_KIND)
        if fields is None or fields.get("id") != rs or fields.get("model") != body.get("model"):
            return _invalid(
                f"The encrypted content for item {rs} could not be verified.",
                param=None,
                code="invalid_encrypted_content",
            )
    nxt = items[i + 1] if i + 1 < len(items) else None
    nxt_id = nxt.get("id") if isinstance(nxt, Mapping) else None
    if not (isinstance(nxt_id, str) and _required_reasoning(nxt_id) == rs):
        return _invalid(
            f"Item '{rs}' of type 'reasoning' was provided without its required following item."
        )
    return None


# --------------------------------------------------------------------------- rendering


@dataclass
class _Render:
    """A scripted turn as Responses events plus the final response object."""

    body: Mapping[str, Any]
    turn: ScriptedTurn
    seed: str
    frames: list[tuple[str, Any]] = field(default_factory=list)
    output: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0
    reasoning_chars: int = 0
    error: StreamError | None = None
    cut: bool = False

    @property
    def model(self) -> str:
        return str(self.body["model"])

    @property
    def summaries(self) -> bool:
        param = self.body.get("reasoning")
        if not isinstance(param, Mapping):
            return False
        wanted = param.get("summary") or param.get("generate_summary")
        return wanted in ("auto", "concise", "detailed")

    @property
    def raw_model(self) -> bool:
        return self.model.startswith("gpt-oss")

    @property
    def response_id(self) -> str:
        return "resp_" + hex_id("resp", self.seed, length=50)

    def _event(self, etype: str, **fields: Any) -> None:
        self.frames.append(("event", {"type": etype, **fields, "sequence_number": self.seq}))
        self.seq += 1

    def _pieces(self, text: str) -> list[str]:
        return split_text(text, self.turn.chunk_chars)

    def _obfuscation(self, piece: str) -> str:
        return hex_id("obf", piece, self.seq, length=max(2, 16 - len(piece) % 16))

    def _next_id(self, prefix: str) -> str:
        prev = self.output[-1] if self.output else None
        if prev is not None and prev["type"] == "reasoning":
            return f"{prefix}_{prev['id'][3:]}{_FOLLOW}"
        return f"{prefix}_" + hex_id(prefix, self.seed, len(self.output), length=50)

    # ---------------------------------------------------------------- items

    def render(self) -> _Render:
        self._event("response.created", response=self.response("in_progress"))
        self._event("response.in_progress", response=self.response("in_progress"))
        steps = list(self.turn.steps)
        i = 0
        while i < len(steps):
            step = steps[i]
            if isinstance(step, Think | Summary | Redacted):
                group: list[Step] = []
                while i < len(steps) and isinstance(steps[i], Think | Summary | Redacted):
                    group.append(steps[i])
                    i += 1
                if not NOT_REASONING.fullmatch(self.model.lower()):
                    self._reasoning_item(group)
                continue
            if isinstance(step, Say):
                group = []
                while i < len(steps) and isinstance(steps[i], Say):
                    group.append(steps[i])
                    i += 1
                self._message_item("".join(s.text for s in group if isinstance(s, Say)))
                continue
            i += 1
            if isinstance(step, Call):
                self._call_item(step)
            elif isinstance(step, Sleep):
                self.frames.append(("sleep", step.seconds))
            elif isinstance(step, StreamError):
                self.error = step
                error = {
                    "type": step.error_type,
                    "code": step.error_type,
                    "message": step.message,
                    "param": None,
                }
                self._event("error", error=error)
                failed = self.response("failed")
                failed["error"] = {"code": step.error_type, "message": step.message}
                self._event("response.failed", response=failed)
                return self
            elif isinstance(step, Cut):
                self.cut = True
                self.frames.append(("cut", None))
                return self
        self._event("response.completed", response=self.response("completed"))
        return self

    def _reasoning_item(self, group: list[Step]) -> None:
        ordinal = sum(1 for item in self.output if item["type"] == "reasoning")
        rs = "rs_" + _rs_hex(self.seed, ordinal)
        blob = encode_blob(BLOB_KIND, id=rs, model=self.model)
        index = len(self.output)
        added = {
            "id": rs,
            "type": "reasoning",
            "encrypted_content": blob[: len(blob) // 2],
            "summary": [],
        }
        self._event("response.output_item.added", output_index=index, item=added)
        summary: list[dict[str, Any]] = []
        content: list[dict[str, Any]] = []
        for step in group:
            if isinstance(step, Redacted):
                continue
            assert isinstance(step, Think | Summary)
            self.reasoning_chars += len(step.text)
            if not self.summaries:
                continue
            if isinstance(step, Think) and self.raw_model:
                self._raw_part(rs, index, len(content), step.text)
                content.append({"type": "reasoning_text", "text": step.text})
            else:
                self._summary_part(rs, index, len(summary), step.text)
                summary.append({"type": "summary_text", "text": step.text})
        item: dict[str, Any] = {"id": rs, "type": "reasoning", "summary": summary}
        if content:
            item["content"] = content
        item["encrypted_content"] = blob
        self._event("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def _summary_part(self, rs: str, index: int, k: int, text: str) -> None:
        where = {"item_id": rs, "output_index": index, "summary_index": k}
        empty = {"type": "summary_text", "text": ""}
        self._event("response.reasoning_summary_part.added", **where, part=empty)
        for piece in self._pieces(text):
            self._event(
                "response.reasoning_summary_text.delta",
                **where,
                delta=piece,
                obfuscation=self._obfuscation(piece),
            )
        self._event("response.reasoning_summary_text.done", **where, text=text)
        full = {"type": "summary_text", "text": text}
        self._event("response.reasoning_summary_part.done", **where, part=full)

    def _raw_part(self, rs: str, index: int, c: int, text: str) -> None:
        where = {"item_id": rs, "output_index": index, "content_index": c}
        self._event(
            "response.content_part.added", **where, part={"type": "reasoning_text", "text": ""}
        )
        for piece in self._pieces(text):
            self._event(
                "response.reasoning_text.delta",
                **where,
                delta=piece,
                obfuscation=self._obfuscation(piece),
            )
        self._event("response.reasoning_text.done", **where, text=text)
        self._event(
            "response.content_part.done", **where, part={"type": "reasoning_text", "text": text}
        )

    def _message_item(self, text: str) -> None:
        msg_id = self._next_id("msg")
        index = len(self.output)
        base = {"id": msg_id, "type": "message", "role": "assistant"}
        self._event(
            "response.output_item.added",
            output_index=index,
            item={**base, "status": "in_progress", "content": []},
        )
        where = {"item_id": msg_id, "output_index": index, "content_index": 0}
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        self._event("response.content_part.added", **where, part=part)
        for piece in self._pieces(text):
            self._event(
                "response.output_text.delta",
                **where,
                delta=piece,
                logprobs=[],
                obfuscation=self._obfuscation(piece),
            )
        self._event("response.output_text.done", **where, text=text, logprobs=[])
        full = {**part, "text": text}
        self._event("response.content_part.done", **where, part=full)
        item = {**base, "status": "completed", "content": [full]}
        self._event("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def _call_item(self, step: Call) -> None:
        fc = self._next_id("fc")
        index = len(self.output)
        call_id = step.call_id or "call_" + hex_id("call", self.seed, index, length=24)
        args = json.dumps(step.arguments)
        base = {"id": fc, "type": "function_call", "call_id": call_id, "name": step.name}
        self._event(
            "response.output_item.added",
            output_index=index,
            item={**base, "status": "in_progress", "arguments": ""},
        )
        for piece in self._pieces(args):
            self._event(
                "response.function_call_arguments.delta",
                item_id=fc,
                output_index=index,
                delta=piece,
                obfuscation=self._obfuscation(piece),
            )
        self._event(
            "response.function_call_arguments.done", item_id=fc, output_index=index, arguments=args
        )
        item = {**base, "status": "completed", "arguments": args}
        self._event("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    # ---------------------------------------------------------------- response object

    def usage(self) -> dict[str, Any]:
        reasoning = estimate_tokens("x" * self.reasoning_chars)
        output = reasoning
        for item in self.output:
            if item["type"] == "message":
                output += estimate_tokens(item["content"][0]["text"])
            elif item["type"] == "function_call":
                output += estimate_tokens(item["arguments"])
        inputs = self.turn.input_tokens
        return {
            "input_tokens": inputs,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": inputs + output,
        }

    def response(self, status: str) -> dict[str, Any]:
        body = self.body
        done = status not in ("in_progress", "failed")  # failed: no output, usage null (recorded)
        param = body.get("reasoning")
        reasoning: Mapping[str, Any] = param if isinstance(param, Mapping) else {}
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": CREATED,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": self.model,
            "output": list(self.output) if done else [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {
                "effort": reasoning.get("effort", "medium"),
                "summary": reasoning.get("summary"),
            },
            "store": body.get("store", True),
            "temperature": 1.0,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": list(body.get("tools") or []),
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": self.usage() if done else None,
            "metadata": {},
        }


async def _stream(render: _Render) -> AsyncIterator[str]:
    for kind, value in render.frames:
        if kind == "event":
            yield f"event: {value['type']}\ndata: {json.dumps(value)}\n\n"
        elif kind == "sleep":
            await asyncio.sleep(value)
        elif kind == "cut":
            raise StreamCut("scripted cut")


async def handle(request: Request, emulator: Emulator) -> Response:
    body, bad = await read_json(request)
    entry = record(request, emulator, body)
    if bad is not None:
        entry.status = 400
        return bad
    if not isinstance(body, Mapping):
        return error_response(
            400, "the body must be a JSON object", "invalid_request_error", entry=entry
        )
    invalid = _validate(body)
    if invalid is not None:
        entry.status = invalid.status_code
        return invalid
    scenario = emulator.pick(request.headers, str(body["model"]))
    return await _answer(emulator, entry, body, scenario, turn_index(body.get("input")))


async def _answer(
    emulator: Emulator,
    entry: RecordedRequest,
    body: Mapping[str, Any],
    scenario: Scenario,
    index: int,
) -> Response:
    turn = scenario.turn(index)
    fail = check_fail(emulator, scenario, index, turn)
    if fail is not None:
        return error_response(
            fail.status, fail.message, fail.error_type, headers=fail_headers(fail), entry=entry
        )
    seed = f"{scenario.name}:{index}"
    render = _Render(body, turn, seed).render()
    rid = "req_" + hex_id("rid", seed, len(emulator.requests), length=24)
    if body.get("stream"):
        return sse_response(_stream(render), rid=rid, entry=entry)
    pause = sum(s.seconds for s in turn.steps if isinstance(s, Sleep))
    if pause:
        await asyncio.sleep(pause)
    if render.error is not None:
        status = 429 if render.error.error_type == "rate_limit_error" else 500
        return error_response(status, render.error.message, render.error.error_type, entry=entry)
    if render.cut:
        return cut_json_response(render.response("in_progress"), rid=rid)
    return json_response(render.response("completed"), rid=rid, entry=entry)
