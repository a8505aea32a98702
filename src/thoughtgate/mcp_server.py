"""MCP tools over stdio: ``orchestration_run``, ``orchestration_status`` and
``orchestration_approve``, through the one filter.

An MCP host (a desktop assistant, an IDE agent) starts ``thoughtgate mcp`` as a subprocess and talks
to it over stdin/stdout with the official ``mcp`` SDK. The tools only convert inputs and outputs:
runs go through :class:`~thoughtgate.orchestration.runtime.Runtime`, answers through
:func:`~thoughtgate.access.filter.filter_run` for the role configured for MCP (``mcp.role``, default
``member``; ``--role`` overrides it, never above ``access.local_role``). So a task's ``reasoning``
comes back only on a ``surface`` run read by ``developer`` or above; a ``telemetry_only`` run never
returns reasoning, whatever the role.

Failures come back as MCP tool errors (``isError: true``) whose text says what went wrong, never as
a crashed server. A run that did not complete (failed, partial, interrupted) is an error too, with
the run's view kept as the structured content, so the host still gets whatever was answered. When
the host cancels a call (``notifications/cancelled``), the run is closed ``interrupted`` (its tasks
first) before the call ends. Nothing but the protocol is written to stdout.

On a SQLite or PostgreSQL store the server's runs are durable (ADR 0010), and
``orchestration_approve`` answers a pending approval of any run on the store -- executing here, on a
daemon replica, or between processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from pydantic import Field

from thoughtgate.access.filter import filter_run, require_role
from thoughtgate.access.roles import Role, parse_role
from thoughtgate.config import Config
from thoughtgate.engine.approvals import Decision
from thoughtgate.errors import AccessDeniedError, ThoughtgateError, UsageError
from thoughtgate.events.views import RunView
from thoughtgate.orchestration.durability import make_durable
from thoughtgate.orchestration.runtime import RunRequest, Runtime, TaskSpec
from thoughtgate.store.base import EventStore
from thoughtgate.store.urls import open_store
from thoughtgate.telemetry import telemetry_sinks

__all__ = [
    "CANCELLED_BY_HOST",
    "McpTools",
    "build_mcp_server",
    "resolve_mcp_role",
    "run_result",
    "serve_stdio",
]

CANCELLED_BY_HOST = "the MCP client cancelled the call"

INSTRUCTIONS = (
    "thoughtgate runs LLM agent work and governs who may see the model's reasoning. "
    "Call orchestration_run to run a prompt (optionally split into tasks) and get each task's "
    "output; orchestration_status reads a run again by its id; orchestration_approve answers a "
    "tool call that waits for a person's approval. Reasoning is returned only for "
    "chain_of_thought='surface' runs when this server's role is developer or above."
)


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


class McpTools:
    """What the MCP tools do, free of MCP: call the runtime, filter the result for ``role``.

    Every error is a :class:`ThoughtgateError` whose message is fit to show the caller.
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
    ) -> RunView:
        specs = [TaskSpec(t) for t in tasks or () if t.strip()]
        if not prompt.strip() and not specs:
            raise UsageError("prompt must not be empty (or give at least one task)")
        run = await self.runtime.create_run(
            RunRequest(prompt, model=model, tasks=specs), chain_of_thought=chain_of_thought
        )
        # The run executes in its own asyncio task: a cancelled call (the host's
        # notifications/cancelled cancels this handler's anyio scope, again at every await)
        # cancels that task once, and then waits, shielded, until the run is closed.
        job = asyncio.get_running_loop().create_task(self.runtime.execute(run.run_id))
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            job.cancel(CANCELLED_BY_HOST)
            with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
                await job
            raise
        except Exception:  # recorded as run.failed / run.error; the view below says so
            pass
        return filter_run(await self.runtime.store.get_run(run.run_id), self.role)

    async def approve(self, run_id: str, call_id: str, decision: str) -> dict[str, str]:
        """Answer a pending tool approval (member and above), wherever the run executes."""
        require_role(self.role, Role.MEMBER, "answering tool approvals")
        if decision not in ("approve", "reject"):
            raise UsageError("decision must be approve or reject")
        verdict: Decision = "approve" if decision == "approve" else "reject"
        run_id, call_id = run_id.strip(), call_id.strip()
        if not await self.runtime.approvals.answer(run_id, call_id, verdict, by="mcp"):
            await self.runtime.store.get_run(run_id)  # an unknown run says so
            raise UsageError(f"no approval is pending for call {call_id!r} in run {run_id!r}")
        return {"run_id": run_id, "call_id": call_id, "decision": verdict}

    async def status(self, run_id: str) -> RunView:
        if not run_id.strip():
            raise UsageError("run_id must not be empty")
        return filter_run(await self.runtime.store.get_run(run_id.strip()), self.role)


def run_result(view: RunView) -> CallToolResult:
    """A run view (already filtered) as a tool result: ``isError`` unless the run completed, the
    view kept as the structured content either way, and the text leading with what went wrong."""
    text = json.dumps(view, ensure_ascii=False, indent=2, default=str)
    failed = view.get("status") != "completed"
    if failed:
        why = f": {view['error']}" if view.get("error") else ""
        text = f"run {view.get('run_id')} {view.get('status')}{why}\n{text}"
    return CallToolResult(
        content=[TextContent(type="text", text=text)],
        structured_content=dict(view),
        is_error=failed,
    )


def build_mcp_server(tools: McpTools) -> MCPServer[Any]:
    """The MCP server with its two tools; any :class:`ThoughtgateError` becomes a tool error."""
    server: MCPServer[Any] = MCPServer("thoughtgate", instructions=INSTRUCTIONS)

    async def orchestration_run(
        prompt: Annotated[str, Field(description="What to ask the model.")],
        model: Annotated[
            str | None,
            Field(description="PROVIDER:MODEL, e.g. anthropic:claude-sonnet-4-5 (default: config)"),
        ] = None,
        chain_of_thought: Annotated[
            str | None,
            Field(description="hidden | surface | telemetry_only (default: config, else hidden)"),
        ] = None,
        tasks: Annotated[
            list[str] | None,
            Field(description="Split the work into these task prompts, run in order."),
        ] = None,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        """Run a prompt through a model and return the run with each task's output (and, only for
        a surface run read by developer or above, its reasoning). A run that did not complete is
        an error result that still carries the run."""
        try:
            view = await tools.run(
                prompt, model=model, chain_of_thought=chain_of_thought, tasks=tasks
            )
        except ThoughtgateError as exc:
            raise ToolError(str(exc)) from exc
        return run_result(view)

    async def orchestration_status(
        run_id: Annotated[str, Field(description="The run id orchestration_run returned.")],
    ) -> dict[str, Any]:
        """Read a run by id: its status, tasks, outputs and usage, as this server's role may see."""
        try:
            return dict(await tools.status(run_id))
        except ThoughtgateError as exc:
            raise ToolError(str(exc)) from exc

    async def orchestration_approve(
        run_id: Annotated[str, Field(description="The run that waits for the approval.")],
        call_id: Annotated[str, Field(description="The tool call's id (tool.approval_required).")],
        decision: Annotated[str, Field(description="approve | reject")],
    ) -> dict[str, Any]:
        """Answer a tool call that waits for a person's approval, in any run this service
        executes (on any replica, even while the run is between processes)."""
        try:
            return dict(await tools.approve(run_id, call_id, decision))
        except ThoughtgateError as exc:
            raise ToolError(str(exc)) from exc

    server.add_tool(orchestration_run, name="orchestration_run", structured_output=True)
    server.add_tool(orchestration_status, name="orchestration_status")
    server.add_tool(orchestration_approve, name="orchestration_approve")
    return server


async def serve_stdio(config: Config, *, db_url: str, role: Role) -> None:
    """Open the store, serve the tools over stdin/stdout until the host closes them."""
    store: EventStore = await open_store(db_url)
    try:
        # ``async with``: the server's runs share provider connections, closed when it stops.
        async with Runtime(store, config, sinks=telemetry_sinks(config)) as runtime:
            engine = make_durable(runtime)
            try:
                if engine is not None:
                    await engine.launch()
                await build_mcp_server(McpTools(runtime, role)).run_stdio_async()
            finally:
                if engine is not None:
                    await engine.close()
    finally:
        await store.close()
