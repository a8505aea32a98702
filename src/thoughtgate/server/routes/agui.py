"""``POST /v1/agui``: the AG-UI protocol, one request per run, through the one output filter.

The body is AG-UI's ``RunAgentInput``; the answer is AG-UI events over SSE on the same response,
translated (:mod:`thoughtgate.server.agui`) from the run's events *after* they passed the one
output filter for the key's role and the run's mode. Two uses:

* start a run (member and above): the last message is the prompt (a user message), earlier user
  and assistant messages (with their tool calls and results) are the conversation, system and
  developer messages and ``context`` become the system prompt. Reasoning messages a client sends
  back are dropped: reasoning is never fed to a model. ``forwardedProps.thoughtgate`` may name
  ``model``, ``chain_of_thought`` and daemon ``tools``.
* follow a run (viewer and above): ``forwardedProps.thoughtgate.run`` names a run; it is replayed
  from its first event and followed live to its end.

Frontend tools (``tools``) and ``resume`` entries are refused (422): tools run on the daemon, and
approvals are answered through ``POST /v1/runs/{id}/approvals/{call_id}`` (the
``thoughtgate.approval_required`` custom event says where). A key revoked or demoted while its
stream is open ends the stream with ``RUN_ERROR`` (``code: access_revoked``); so does a store
read that fails (``store_unavailable``) or a store that refuses writes (``store_refuses_writes``,
ADR 0151): codes that are no run status, so a client does not read them as the run's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ag_ui.core import (
    AssistantMessage,
    BaseEvent,
    DeveloperMessage,
    RunAgentInput,
    RunErrorEvent,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from ag_ui.encoder import EventEncoder
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticSerializationError
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response

from thoughtgate.access.filter import event_filter, reads_apart, require_role
from thoughtgate.access.keys import Principal
from thoughtgate.access.roles import Role
from thoughtgate.disclosure import ChainOfThought
from thoughtgate.events.schema import Event
from thoughtgate.orchestration.runtime import RunRequest
from thoughtgate.server.agui import AguiTranslator
from thoughtgate.server.api import Endpoint, parse_body
from thoughtgate.server.errors import ApiError
from thoughtgate.server.fanout import LiveReader, replay
from thoughtgate.server.responses import NOT_KEPT
from thoughtgate.server.state import ServerState, state_of
from thoughtgate.store.records import TERMINAL_RUN_STATUSES, RunRecord
from thoughtgate.types import Message, Part, TextPart, ToolCallPart, ToolResultPart

__all__ = ["ENDPOINTS", "AguiOptions"]

_REVOKED = "access_revoked"
_UNREADABLE = "store_unavailable"
_LET_GO = "store_refuses_writes"
_STOPPING = "server_stopping"
_ENDINGS = {
    _UNREADABLE: "the run's events cannot be read now: the event store is unavailable; "
    "follow the run again later",
    _LET_GO: "the run's events cannot be followed now: the event store refuses writes; "
    "follow the run again later",
    _STOPPING: "the daemon is shutting down: this stream ends, not the run; follow the run "
    "again later",
}
"""How a stream that cannot go on ends (``RUN_ERROR``'s ``code`` and ``message``): the same
words whatever the store said, so no path or driver text reaches a client; never the run's end.
"""

log = logging.getLogger("thoughtgate.server")


def _idle(now: float) -> None:
    """An AG-UI stream's tick: sse-starlette sends its keep-alives."""


class AguiOptions(BaseModel):
    """``forwardedProps.thoughtgate``: what AG-UI's ``RunAgentInput`` has no field for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(default=None, min_length=3, max_length=200)
    """PROVIDER:MODEL (default: the daemon's ``orchestration.default_model``)."""
    chain_of_thought: ChainOfThought | None = None
    tools: list[str] = Field(default_factory=list, max_length=64)
    """Tools registered on the daemon that the run may use."""
    run: str | None = Field(default=None, min_length=1, max_length=200)
    """Follow this existing run instead of starting one."""


def _options(body: RunAgentInput) -> AguiOptions:
    props = body.forwarded_props
    raw = props.get("thoughtgate") if isinstance(props, dict) else None
    if raw is None:
        return AguiOptions()
    try:
        return AguiOptions.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "thoughtgate"
        raise ApiError(422, f"invalid forwardedProps.thoughtgate.{where}: {first['msg']}") from None


def _text(content: Any, where: str) -> str:
    """A message's text: a string, or text parts only (other media are refused)."""
    if isinstance(content, str):
        return content
    pieces = []
    for part in content or ():
        text = getattr(part, "text", None)
        if getattr(part, "type", None) != "text" or not isinstance(text, str):
            kind = getattr(part, "type", "?")
            raise ApiError(422, f"{where}: only text content is supported, not {kind!r} parts")
        pieces.append(text)
    return "".join(pieces)


def _conversation(body: RunAgentInput) -> tuple[str, list[Message], str | None]:
    """``(prompt, history, system)`` from the input's messages and context."""
    messages = list(body.messages)
    if not messages or not isinstance(messages[-1], UserMessage):
        raise ApiError(422, "messages must end with a user message: the prompt")
    prompt = _text(messages[-1].content, "the prompt")
    if not prompt.strip():
        raise ApiError(422, "the prompt (the last user message) is empty")
    system: list[str] = []
    history: list[Message] = []
    for i, message in enumerate(messages[:-1]):
        where = f"messages[{i}]"
        if isinstance(message, SystemMessage | DeveloperMessage):
            system.append(message.content)
        elif isinstance(message, UserMessage):
            history.append(Message.user(_text(message.content, where)))
        elif isinstance(message, AssistantMessage):
            parts: list[Part] = [TextPart(message.content)] if message.content else []
            parts += [
                ToolCallPart(c.id, c.function.name, arguments_json=c.function.arguments or "{}")
                for c in message.tool_calls or ()
            ]
            if parts:
                history.append(Message("assistant", tuple(parts)))
        elif isinstance(message, ToolMessage):
            result = ToolResultPart(
                message.tool_call_id,
                _text(message.content, where),
                is_error=bool(message.error),
            )
            history.append(Message("tool", (result,)))
        # reasoning messages are dropped: reasoning text is never fed back to a model;
        # activity messages are a client's display state
    for item in body.context or ():
        system.append(f"{item.description}: {item.value}")
    return prompt, history, "\n\n".join(system) if system else None


async def agui_run(request: Request, principal: Principal | None) -> Response:
    assert principal is not None
    body = await parse_body(request, RunAgentInput)
    options = _options(body)
    state = state_of(request)
    if options.run is not None:
        run = await state.store.get_run(options.run)
    else:
        require_role(principal.role, Role.MEMBER, "starting a run")
        if body.tools:
            raise ApiError(
                422,
                "frontend tools are not supported: tools run on the daemon; name them in "
                "forwardedProps.thoughtgate.tools",
            )
        if body.resume:
            raise ApiError(
                422,
                "resume is not supported: answer approvals with "
                "POST /v1/runs/{run_id}/approvals/{call_id}",
            )
        prompt, history, system = _conversation(body)
        if state.manager.closing:
            raise ApiError(503, "the daemon is shutting down; start the run again in a moment")
        run = await state.manager.start(
            RunRequest(
                prompt,
                model=options.model,
                system=system,
                history=history,
                metadata={"agui": {"thread_id": body.thread_id, "run_id": body.run_id}},
            ),
            chain_of_thought=options.chain_of_thought,
            tools=options.tools,
            key_id=principal.key_id,  # the same per-key quotas as POST /v1/runs
        )
    translator = AguiTranslator(
        thread_id=body.thread_id,
        run_id=body.run_id,
        tg_run_id=run.run_id,
        mode=run.chain_of_thought,
        member=principal.role >= Role.MEMBER,
        model=run.model,
    )
    encoder = EventEncoder(accept=request.headers.get("accept") or "text/event-stream")
    return EventSourceResponse(
        _frames(state, run, principal, translator, encoder),
        ping=state.server.keepalive_s,
        send_timeout=state.sse_send_timeout_s,
        headers={
            **NOT_KEPT,
            "X-Accel-Buffering": "no",
            "X-Thoughtgate-Run-Id": run.run_id,
        },
    )


def _frame(encoder: EventEncoder, event: BaseEvent) -> str:
    """One AG-UI frame. An event holding a lone surrogate (a payload keeps one exactly,
    ADR 0114; a client's ``threadId`` may hold one), which UTF-8 cannot carry, is written with
    ``\\u`` escapes, as the daemon's other streams write it: the same JSON to a reader."""
    try:
        return encoder.encode(event)
    except PydanticSerializationError:
        data = event.model_dump(mode="json", by_alias=True)
        return f"data: {json.dumps(data, ensure_ascii=True, separators=(',', ':'))}\n\n"


async def _frames(
    state: ServerState,
    run: RunRecord,
    principal: Principal,
    translator: AguiTranslator,
    encoder: EventEncoder,
) -> AsyncIterator[bytes]:
    """The run's filtered events as AG-UI frames, from its first event to its end; a lost key
    ends the stream at once with ``RUN_ERROR``, and so does a read that fails or, once what is
    stored went, a store that refuses writes (ADR 0151): AG-UI has no resume frame, and a
    stream left open would wait for an end that may never be recorded. So does the daemon's
    shutdown (``LiveStreams.stop_all``, ADR 0162), with ``code`` ``server_stopping``: never
    ``RUN_FINISHED``, which would say the run completed."""

    def encode(events: Sequence[BaseEvent]) -> bytes:
        return "".join(_frame(encoder, e) for e in events).encode("utf-8")

    yield encode(translator.started())
    queue: asyncio.Queue[Event | str | None] = asyncio.Queue(maxsize=256)
    lost: list[str] = []
    refused: list[bool] = []
    reader: LiveReader | None = None
    # What the filter withholds from this reader is not read (ADR 0160).
    apart = reads_apart(principal.role, mode=run.chain_of_thought)
    if run.status not in TERMINAL_RUN_STATUSES and state.feeds is not None:
        reader = state.feeds.reader(run.run_id, after=0, apart=apart)
        if state.streams.refusing() is not None:
            refused.append(True)  # what is stored, then let go

    async def forward() -> str | None:
        """Put the run's events on the queue; ``_LET_GO`` once the store refuses writes and
        what is stored went (ADR 0151), else ``None`` at the run's end."""
        if reader is not None:
            while (batch := await reader.next()) is not None:
                for event in batch:
                    await queue.put(event)
                if refused and reader.following:
                    return _LET_GO
            return None
        source = (
            replay(state.store, run.run_id, 0, apart=apart)
            if run.status in TERMINAL_RUN_STATUSES
            else state.store.tail(run.run_id, after=0, apart=apart)
        )
        try:
            async for event in source:
                await queue.put(event)
        finally:
            close = getattr(source, "aclose", None)
            if close is not None:
                await close()
        return None

    async def pump() -> None:
        try:
            end = await forward()
        except Exception:  # a failed read: the stream ends saying so, rather than hang
            log.exception("AG-UI stream of run %s failed", run.run_id)
            end = _UNREADABLE
        await queue.put(end)

    task = asyncio.create_task(pump(), name=f"agui pump {run.run_id}")

    def store_refused() -> None:
        if not refused and reader is not None:
            refused.append(True)
            reader.wake()

    def end_now(why: str) -> None:
        """End the stream with ``why`` at once, before whatever waits on the queue."""
        task.cancel()
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(why)

    def access_lost(message: str) -> None:
        if not lost:
            lost.append(message)
            end_now(_REVOKED)

    def server_stopping() -> None:
        # ``LiveStreams.stop_all`` at shutdown, as for the daemon's own streams (ADR 0162): the
        # runs executed here have ended by then (interrupted, their end sent); a run this stream
        # follows goes on elsewhere, or resumes, so the stream says it ends, not the run.
        if not lost:
            lost.append(_ENDINGS[_STOPPING])
            end_now(_STOPPING)

    unwatch = (
        state.access.watch(principal.key_id, principal.role, access_lost)
        if state.access is not None
        else None
    )
    untick = state.streams.add(
        _idle, server_stopping, store_refused if reader is not None else None
    )
    try:
        show = event_filter(principal.role, mode=run.chain_of_thought)  # once (ADR 0143)
        while not translator.finished:
            item = await queue.get()
            if item == _REVOKED:
                yield encode([RunErrorEvent(message=lost[0], code=_REVOKED)])
                return
            if isinstance(item, str):  # the run goes on, or may: it cannot be followed now
                meta = {"thoughtgate": {"run_id": run.run_id}}
                yield encode([RunErrorEvent(message=_ENDINGS[item], code=item, metadata=meta)])
                return
            if item is None:
                break
            shown = show(item)
            if shown is not None:
                out = translator.feed(shown)
                if out:
                    yield encode(out)
        if not translator.finished:  # the log ended without the run's end (never expected)
            yield encode([RunErrorEvent(message="the run's events ended early", code="incomplete")])
    finally:
        if unwatch is not None:
            unwatch()
        untick()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if reader is not None:
            reader.close()


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "POST",
        "/v1/agui",
        agui_run,
        "run (or follow) a run with the AG-UI protocol",
        role=Role.VIEWER,
        body=RunAgentInput,
        media_type="text/event-stream",
        errors=(400, 404, 413, 422, 429, 503),
        description="Takes AG-UI's RunAgentInput and answers with AG-UI events over SSE, made "
        "from the run's events after the one output filter (the key's role, the run's mode). "
        "Starting a run needs role member; forwardedProps.thoughtgate.run follows an existing "
        "run (viewer). 429 with Retry-After when the key holds "
        "quotas.max_live_streams_per_key live streams already. See docs/agui.md.",
    ),
)
