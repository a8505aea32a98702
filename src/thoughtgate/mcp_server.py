"""MCP tools over stdio: ``orchestration_run``, ``orchestration_status`` and
``orchestration_approve``, through the one filter.

An MCP host (a desktop assistant, an IDE agent) starts ``thoughtgate mcp`` as a subprocess and talks
to it over stdin/stdout with the official ``mcp`` SDK (its low-level ``Server``: thoughtgate declares
exactly what it serves). The tools only convert inputs and outputs: runs go through
:class:`~thoughtgate.orchestration.runtime.Runtime`, answers through
:func:`~thoughtgate.access.filter.filter_run` for the role configured for MCP (``mcp.role``, default
``member``; ``--role`` overrides it, never above ``access.local_role``). So a task's ``reasoning``
comes back only on a ``surface`` run read by ``developer`` or above; a ``telemetry_only`` run never
returns reasoning, whatever the role.

What a host can rely on:

* ``serverInfo`` names thoughtgate and its version; the only capability advertised is ``tools``
  (no empty prompts or resources);
* every tool has a typed input schema (``chain_of_thought`` is an enum) and an output schema (the
  run view as a reader receives it: only public fields required);
* a call whose request carries a progress token gets ``notifications/progress`` while the run works:
  one per task, visible step and tool card, each message built from public fields of the filtered
  events (a step's summary, a tool's label and status), never from tool data or reasoning;
* bad arguments come back as a tool error (``isError: true``) naming each field and what it takes,
  with no library links; a run that did not complete (failed, partial, interrupted) is an error too,
  with the run's view kept as the structured content;
* when the host cancels a call (``notifications/cancelled``), the run is closed ``interrupted``
  (its tasks first) before the call ends;
* nothing but the protocol is written to stdout; log lines on stderr are plain text. A message
  holding a lone surrogate (a provider's text cut inside an emoji, kept exactly in a payload: ADR
  0114), which UTF-8 cannot carry and the SDK's writer would stop the stream on, is written with
  U+FFFD in its place, as the run index keeps it (ADR 0128).

On a SQLite or PostgreSQL store the server's runs are durable (ADR 0013), and
``orchestration_approve`` answers a pending approval of any run on the store -- executing here, on a
daemon replica, or between processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import anyio
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    ListToolsResult,
    PaginatedRequestParams,
    TextContent,
    Tool,
    ToolAnnotations,
    jsonrpc_message_adapter,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticSerializationError

from thoughtgate import __version__, log_records
from thoughtgate.access.filter import (
    event_filter,
    filter_run,
    reads_apart,
    reads_task_apart,
    require_role,
)
from thoughtgate.access.roles import Role, parse_role
from thoughtgate.config import Config
from thoughtgate.disclosure import ChainOfThought
from thoughtgate.engine.approvals import ApprovalBroker, Decision
from thoughtgate.engine.tools import ToolRegistry
from thoughtgate.errors import (
    AccessDeniedError,
    ProviderNotConfiguredError,
    RunTakenOverError,
    ThoughtgateError,
    UsageError,
    failure_text,
)
from thoughtgate.events.catalogue import view_schema
from thoughtgate.events.schema import Event, EventType, is_run_terminal
from thoughtgate.events.views import RunView
from thoughtgate.orchestration.durability import make_durable
from thoughtgate.orchestration.runtime import RunRequest, Runtime, TaskSpec
from thoughtgate.store.base import EventStore
from thoughtgate.store.records import RunRecord
from thoughtgate.store.urls import open_store
from thoughtgate.telemetry import telemetry_sinks

if TYPE_CHECKING:  # the SDK's own protocol of a write stream (a private module: types only)
    from mcp.shared._stream_protocols import WriteStream

__all__ = [
    "CANCELLED_BY_HOST",
    "McpTools",
    "Progress",
    "RunArguments",
    "StatusArguments",
    "build_mcp_server",
    "progress_message",
    "resolve_mcp_role",
    "run_result",
    "serve_stdio",
]

log = logging.getLogger("thoughtgate.mcp")

CANCELLED_BY_HOST = "the MCP client cancelled the call"

INSTRUCTIONS = (
    "thoughtgate runs LLM agent work and governs who may see the model's reasoning. "
    "Call orchestration_run to run a prompt (optionally split into tasks) and get each task's "
    "output; orchestration_status reads a run again by its id; orchestration_approve answers a "
    "tool call that waits for a person's approval. Reasoning is returned only for "
    "chain_of_thought='surface' runs when this server's role is developer or above."
)

Progress = Callable[[float, str], Awaitable[None]]
"""``(progress, message)``: reports that a run moved on (the count only ever grows)."""


class RunArguments(BaseModel):
    """``orchestration_run``'s arguments."""

    model_config = ConfigDict(extra="forbid", title="orchestration_run arguments")

    prompt: str = Field(description="What to ask the model (may be empty when tasks are given).")
    model: str | None = Field(
        default=None,
        description="PROVIDER:MODEL, e.g. anthropic:claude-sonnet-4-5 (default: the server's "
        "orchestration.default_model).",
    )
    chain_of_thought: ChainOfThought | None = Field(
        default=None,
        description="Disclosure mode: hidden asks for no reasoning; surface shows it to developer "
        "and above; telemetry_only keeps it for traces (default: the server's config, else hidden).",
    )
    tasks: list[str] | None = Field(
        default=None, description="Split the work into these task prompts, run in order."
    )


class StatusArguments(BaseModel):
    """``orchestration_status``'s arguments."""

    model_config = ConfigDict(extra="forbid", title="orchestration_status arguments")

    run_id: str = Field(description="The run id orchestration_run returned.")


class ApproveArguments(BaseModel):
    """``orchestration_approve``'s arguments."""

    model_config = ConfigDict(extra="forbid", title="orchestration_approve arguments")

    run_id: str = Field(description="The run whose tool call waits for approval.")
    call_id: str = Field(description="The tool call's id (from tool.approval_required).")
    decision: Decision = Field(description="approve or reject.")


class ApprovalAnswer(BaseModel):
    """``orchestration_approve``'s result."""

    run_id: str
    call_id: str
    decision: Decision


def resolve_mcp_role(config: Config, explicit: str | None = None) -> Role:
    """``--role`` > ``mcp.role``; refused above ``access.local_role`` (who starts the server)."""
    role = parse_role(explicit or config.mcp.role)
    local = parse_role(config.access.local_role)
    if role > local:
        raise AccessDeniedError(
            f"MCP role {role.label} is above your local role {local.label}; "
            "the MCP server can only act as that role or a lower one"
        )
    return role


def progress_message(event: Event, tasks: int) -> str | None:
    """A progress line for one *filtered* event, from public fields only (``None``: no news)."""
    payload = event.payload
    kind = event.type
    if kind == EventType.TASK_STARTED and isinstance(payload.get("index"), int):
        return f"task {payload['index'] + 1} of {tasks} started"
    if kind == EventType.TASK_COMPLETED:
        return f"task {payload.get('status') or 'ended'}"
    if kind in (EventType.COT_STEP, EventType.COT_PHASE, EventType.COT_TOOL_REASONING):
        summary = payload.get("summary")
        return summary if isinstance(summary, str) and summary else None
    label = payload.get("label") or payload.get("tool_key")
    if not isinstance(label, str):
        return None
    if kind == EventType.TOOL_APPROVAL_REQUIRED:
        return f"{label}: waiting for approval"
    if kind == EventType.TOOL_STARTED:
        return f"{label}: running"
    if kind in (EventType.TOOL_COMPLETED, EventType.TOOL_DEGRADED):
        return f"{label}: {kind.removeprefix('tool.')}"
    if kind == EventType.TOOL_FAILED:
        return f"{label}: failed ({payload.get('error_kind') or 'error'})"
    return None


class McpTools:
    """What the MCP tools do, free of MCP: call the runtime, filter the result for ``role``.

    Every error is a :class:`ThoughtgateError`: a :class:`UsageError`'s message is fit to show
    the caller; any other is shown by its public text (``failure_text``), never words it quoted.
    """

    def __init__(self, runtime: Runtime, role: Role) -> None:
        self.runtime = runtime
        self.role = role

    async def run(
        self,
        prompt: str,
        *,
        model: str | None = None,
        chain_of_thought: str | None = None,
        tasks: Sequence[str] | None = None,
        progress: Progress | None = None,
    ) -> RunView:
        specs = [TaskSpec(t) for t in tasks or () if t.strip()]
        if not prompt.strip() and not specs:
            raise UsageError("prompt must not be empty (or give at least one task)")
        loop = asyncio.get_running_loop()
        created: list[RunRecord] = []
        reporters: list[asyncio.Task[None]] = []

        def follow(run: RunRecord) -> None:
            created.append(run)
            if progress is not None:
                reporters.append(
                    loop.create_task(
                        self._report(run.run_id, run.chain_of_thought, len(run.tasks), progress)
                    )
                )

        # The run is created and executed in one asyncio task of its own: a cancelled call
        # (the host's notifications/cancelled cancels this handler's anyio scope, again at
        # every await) cancels that task once, and then waits, shielded, until the run is
        # closed -- also when the cancel lands while the run is admitted, or before its
        # execution began (ADR 0072).
        request = RunRequest(prompt, model=model, tasks=specs)
        job = loop.create_task(
            self.runtime.run(request, chain_of_thought=chain_of_thought, created=follow)
        )
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            job.cancel(CANCELLED_BY_HOST)
            with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
                await job
            raise
        except RunTakenOverError:
            raise  # its end is another execution's, not this call's result (ADR 0072)
        except Exception:  # recorded as run.failed / run.error; the view below says so
            if not created:
                raise  # no run: the request was refused (a UsageError says why)
        finally:
            for reporter in reporters:
                await _finish(reporter)
        return filter_run(await self.runtime.store.get_run(created[0].run_id), self.role)

    async def _report(self, run_id: str, mode: str, tasks: int, progress: Progress) -> None:
        """Progress from the run's events, as this server's role may see them, until its end."""
        count = 0
        show = event_filter(self.role, mode=mode)  # this server's role and the run's mode: once
        apart = reads_apart(self.role, mode=mode)
        async for event in self.runtime.store.tail(run_id, apart=apart):
            if is_run_terminal(event.type):
                return
            shown = show(event)
            message = progress_message(shown, tasks) if shown is not None else None
            if message is None:
                continue
            count += 1
            try:
                await progress(count, message)
            except Exception as exc:  # a host that cannot take progress still gets its answer
                log.warning("could not send progress: %s", exc)
                return

    async def approve(self, run_id: str, call_id: str, decision: Decision) -> ApprovalAnswer:
        """Answer a pending tool approval (member and above), wherever the run executes."""
        require_role(self.role, Role.MEMBER, "answering tool approvals")
        run_id, call_id = run_id.strip(), call_id.strip()
        await self.runtime.answer_approval(run_id, call_id, decision, by="mcp")
        return ApprovalAnswer(run_id=run_id, call_id=call_id, decision=decision)

    async def status(self, run_id: str) -> RunView:
        if not run_id.strip():
            raise UsageError("run_id must not be empty")
        apart = reads_task_apart(self.role, mode=None)  # (ADR 0160)
        return filter_run(await self.runtime.store.get_run(run_id.strip(), apart=apart), self.role)


async def _finish(reporter: asyncio.Task[None]) -> None:
    """Let the reporter send what the run recorded (it stops at the terminal event), but never
    after the call's result: a stuck reporter is cancelled."""
    with contextlib.suppress(BaseException):
        with anyio.CancelScope(shield=True):
            done, _ = await asyncio.wait({reporter}, timeout=2.0)
        if not done:
            reporter.cancel()
            await reporter


def run_result(view: RunView) -> CallToolResult:
    """A run view (already filtered) as a tool result: ``isError`` unless the run completed, the
    view kept as the structured content either way, and the text leading with what went wrong."""
    document = view.to_json()
    text = json.dumps(document, ensure_ascii=False, indent=2)
    failed = view.status != "completed"
    if failed:
        why = f": {view.error}" if view.error else ""
        text = f"run {view.run_id} {view.status}{why}\n{text}"
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=document,
        is_error=failed,
    )


def _error(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def _provider_not_configured(tool: str, exc: ProviderNotConfiguredError) -> CallToolResult:
    """A run needs a provider this server has no key or base URL for (ADR 0128, ADR 0136). The
    tool error is read by the host's model first: it gets the daemon's neutral words and what
    it can do, never a secret's variable to set (a model told that asks for the key in the chat,
    or sets it with a shell tool). What to set goes to this server's log on stderr, which the
    host keeps for whoever configured it, with where a host takes the variable from."""
    log.warning(
        "%s asked for provider %r, which this server is not configured for: %s (an MCP host "
        "starts this server with the environment of its server entry, not of a shell)",
        tool,
        exc.provider,
        str(exc),
    )
    return _error(
        f"{exc.public}: no run was started (choose another model, or ask whoever set up this "
        "MCP server to configure the provider; its log says what to set)"
    )


def _arguments_error(tool: str, exc: ValidationError) -> CallToolResult:
    """Each wrong argument and what it takes, in plain words (no library links)."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "is not an argument of this tool"
        problems.append(f"{where}: {message}")
    return _error(f"invalid arguments for {tool}: " + "; ".join(problems))


_OUTPUT: Final = view_schema(RunView, ref_template="#/$defs/{model}")
"""The run view as this server's readers receive it (``x-visibility`` per field)."""


def _input_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    return schema


TOOLS: Final = (
    Tool(
        name="orchestration_run",
        title="Run a prompt",
        description="Run a prompt through a model and return the run with each task's output "
        "(and, only for a surface run read by developer or above, its reasoning). A run that "
        "did not complete is an error result that still carries the run. Sends progress "
        "notifications while the run works when the request asks for them.",
        input_schema=_input_schema(RunArguments),
        output_schema=_OUTPUT,
        annotations=ToolAnnotations(read_only_hint=False, open_world_hint=True),
    ),
    Tool(
        name="orchestration_status",
        title="Read a run",
        description="Read a run by id: its status, tasks, outputs and usage, as this server's "
        "role may see them.",
        input_schema=_input_schema(StatusArguments),
        output_schema=_OUTPUT,
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True),
    ),
    Tool(
        name="orchestration_approve",
        title="Answer a tool approval",
        description="Approve or reject a tool call that waits for a person, in any run this "
        "service executes (on any replica, even while the run is between processes).",
        input_schema=_input_schema(ApproveArguments),
        output_schema=ApprovalAnswer.model_json_schema(),
        annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=False),
    ),
)


def build_mcp_server(tools: McpTools) -> Server[Any]:
    """The MCP server with its tools; any :class:`ThoughtgateError` becomes a tool error."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=list(TOOLS))

    async def call_tool(
        ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        arguments: Mapping[str, Any] = params.arguments or {}
        try:
            if params.name == "orchestration_run":
                args = RunArguments.model_validate(arguments)

                async def progress(count: float, message: str) -> None:
                    await ctx.session.report_progress(count, None, message)

                view = await tools.run(
                    args.prompt,
                    model=args.model,
                    chain_of_thought=args.chain_of_thought,
                    tasks=args.tasks,
                    progress=progress,
                )
                return run_result(view)
            if params.name == "orchestration_approve":
                answer = ApproveArguments.model_validate(arguments)
                done = await tools.approve(answer.run_id, answer.call_id, answer.decision)
                return CallToolResult(
                    content=[TextContent(type="text", text=done.model_dump_json())],
                    structured_content=done.model_dump(),
                )
            if params.name == "orchestration_status":
                status = StatusArguments.model_validate(arguments)
                view = await tools.status(status.run_id)
                document = view.to_json()
                return CallToolResult(
                    content=[TextContent(type="text", text=json.dumps(document, indent=2))],
                    structured_content=document,
                )
        except ValidationError as exc:
            return _arguments_error(params.name, exc)
        except ProviderNotConfiguredError as exc:  # the server's setting, not the call's
            return _provider_not_configured(params.name, exc)
        except UsageError as exc:  # what was wrong with the call, in thoughtgate's words
            return _error(str(exc))
        except ThoughtgateError as exc:
            # a failure (the store's, a provider's) as a run's public error says it: never the
            # words it quoted, which a driver's or a provider's may hold (ADR 0104)
            return _error(failure_text(exc))
        known = ", ".join(t.name for t in TOOLS)
        return _error(f"unknown tool {params.name!r}; tools: {known}")

    return Server(
        "thoughtgate",
        version=__version__,
        title="thoughtgate",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _replaced(value: Any) -> Any:
    """``value`` (a message's JSON data) with each lone surrogate of its strings as U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_replaced(v) for v in value]
    if isinstance(value, dict):
        return {_replaced(k): _replaced(v) for k, v in value.items()}
    return value


def _utf8_message(item: SessionMessage) -> SessionMessage:
    """``item`` as the SDK's stdio writer can write it: itself, or, when its JSON holds a lone
    surrogate (UTF-8 cannot carry one: ``model_dump_json`` raises and the writer's task ends,
    cutting the stream for every later call), the same message with U+FFFD in its place."""
    try:
        item.message.model_dump_json(by_alias=True, exclude_unset=True)
    except PydanticSerializationError:
        data = item.message.model_dump(mode="json", by_alias=True, exclude_unset=True)
        message = jsonrpc_message_adapter.validate_python(_replaced(data), by_name=False)
        return SessionMessage(message, item.metadata)
    return item


class _Utf8Writes:
    """The stdio transport's write stream, handed only messages UTF-8 can carry
    (:func:`_utf8_message`)."""

    def __init__(self, inner: WriteStream[SessionMessage]) -> None:
        self._inner = inner

    async def send(self, item: SessionMessage, /) -> None:
        await self._inner.send(_utf8_message(item))

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _Utf8Writes:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc_val, exc_tb)


def _plain_stderr_logging() -> None:
    """One plain line per record on stderr (no colours, no boxes): hosts show it as is. The
    host's user is not necessarily a developer: exceptions are logged by class and code, never
    their text (ADR 0104)."""
    log_records.install()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("thoughtgate mcp: %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)


async def serve_stdio(
    config: Config,
    *,
    db_url: str,
    role: Role,
    tools: ToolRegistry | None = None,
    approve_all: bool = False,
) -> None:
    """Open the store, serve the tools over stdin/stdout until the host closes them.

    ``tools`` are the Python tools runs may call (``--tools``); a tool that asks for approval is
    approved when ``approve_all`` (else it times out after ``orchestration.approval_timeout_s``:
    the model is told it did not run).
    """
    _plain_stderr_logging()
    store: EventStore = await open_store(db_url)
    try:

        async def approve(call_id: str, tool: str, arguments: Mapping[str, Any]) -> Any:
            return "approve" if approve_all else None

        runtime = Runtime(
            store,
            config,
            tools=tools,
            approvals=ApprovalBroker(decider=approve),
            sinks=telemetry_sinks(config),
        )
        # ``async with``: the server's runs share provider connections, closed when it stops.
        async with runtime:
            engine = make_durable(runtime)
            try:
                if engine is not None:
                    await engine.launch()
                server = build_mcp_server(McpTools(runtime, role))
                async with stdio_server() as (read, write):
                    options = server.create_initialization_options()
                    await server.run(read, _Utf8Writes(write), options)
            finally:
                if engine is not None:
                    await engine.close()
    finally:
        await store.close()
