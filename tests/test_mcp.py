"""MCP tools: role × mode rules on what comes back, tool errors, and the real stdio transport."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.client import Client
from mcp_types import CallToolResult, TextContent
from script_support import cut, outage, slow

from thoughtgate.access.roles import Role
from thoughtgate.config import Config
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.errors import AccessDeniedError
from thoughtgate.events.schema import Event
from thoughtgate.mcp_server import CANCELLED_BY_HOST, McpTools, build_mcp_server, resolve_mcp_role
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.store.memory import MemoryStore
from thoughtgate.testing.fake import REASONER_MARKER, FakeProvider

SRC = Path(__file__).resolve().parents[1] / "src"
MODES = ("hidden", "surface", "telemetry_only")


def _shows_marker(value: Any) -> bool:
    return REASONER_MARKER in json.dumps(value, default=str)


def _text(result: CallToolResult) -> str:
    return "".join(c.text for c in result.content if isinstance(c, TextContent))


# --------------------------------------------------------------------------- the core, per role


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("mode", MODES)
async def test_reasoning_only_for_surface_and_developer_or_above(role: Role, mode: str) -> None:
    tools = McpTools(Runtime(MemoryStore()), role)
    view = await tools.run("What is it?", model="fake:reasoner", chain_of_thought=mode)
    (task,) = view["tasks"]
    assert task["output"] == "The answer is 42."
    assert view["chain_of_thought"] == mode
    readable = mode == "surface" and role >= Role.DEVELOPER
    assert _shows_marker(view) is readable
    assert ("reasoning" in task) is readable
    assert ("reasoning_tokens" in task["usage"]) is readable
    assert _shows_marker(await tools.status(view["run_id"])) is readable


async def test_tasks_run_in_order_and_status_reads_them_back() -> None:
    tools = McpTools(Runtime(MemoryStore()), Role.MEMBER)
    view = await tools.run("", model="fake:echo", tasks=["one", "two"])
    assert [t["output"] for t in view["tasks"]] == ["Echo: one", "Echo: two"]
    assert (await tools.status(view["run_id"]))["tasks"] == view["tasks"]


async def test_orchestration_approve_answers_a_pending_approval_for_members_only() -> None:
    from daemon_support import server_tools

    store = MemoryStore()
    waiting = asyncio.Event()

    async def noticed(call_id: str, tool: str, arguments: Any) -> None:
        waiting.set()  # a call now waits; the answer is left to the MCP tool
        return None

    runtime = Runtime(store, tools=server_tools(), approvals=ApprovalBroker(decider=noticed))
    server = build_mcp_server(McpTools(runtime, Role.MEMBER))
    viewer = build_mcp_server(McpTools(runtime, Role.VIEWER))
    async with Client(server) as client, Client(viewer) as reader:
        job = asyncio.create_task(
            client.call_tool("orchestration_run", {"prompt": "go", "model": "fake:approval"})
        )
        await asyncio.wait_for(waiting.wait(), 10)
        run_id = (await store.list_runs())[0].run_id
        args = {"run_id": run_id, "call_id": "call_danger", "decision": "approve"}
        denied = await reader.call_tool("orchestration_approve", args)
        assert denied.is_error and "answering tool approvals" in _text(denied)
        wrong = await client.call_tool("orchestration_approve", {**args, "call_id": "call_nope"})
        assert wrong.is_error and "no approval is pending" in _text(wrong)
        answered = await client.call_tool("orchestration_approve", args)
        assert not answered.is_error, _text(answered)
        result = await job
        assert not result.is_error, _text(result)
        log = await store.read(run_id)
        decided = [e.payload for e in log if e.type == "tool.approval_response"]
        assert [(d["decision"], d["by"]) for d in decided] == [("approve", "mcp")]


def test_role_comes_from_flag_then_config_and_never_exceeds_the_local_role() -> None:
    assert resolve_mcp_role(Config()) == Role.MEMBER
    cfg = Config.from_mapping({"mcp": {"role": "developer"}})
    assert resolve_mcp_role(cfg) == Role.DEVELOPER
    assert resolve_mcp_role(cfg, "viewer") == Role.VIEWER
    capped = Config.from_mapping({"access": {"local_role": "member"}})
    with pytest.raises(AccessDeniedError, match="above your local role member"):
        resolve_mcp_role(capped, "admin")


# --------------------------------------------------------------------------- over MCP, in process


async def test_tool_errors_are_mcp_errors_with_clear_text() -> None:
    server = build_mcp_server(McpTools(Runtime(MemoryStore()), Role.DEVELOPER))
    async with Client(server) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert names == {"orchestration_run", "orchestration_status", "orchestration_approve"}

        bad_mode = await client.call_tool(
            "orchestration_run", {"prompt": "x", "model": "fake:reasoner", "chain_of_thought": "x"}
        )
        assert bad_mode.is_error and "unknown chain_of_thought mode 'x'" in _text(bad_mode)

        bad_model = await client.call_tool("orchestration_run", {"prompt": "x", "model": "nope"})
        assert bad_model.is_error and "PROVIDER:MODEL" in _text(bad_model)

        no_model = await client.call_tool("orchestration_run", {"prompt": "x"})
        assert no_model.is_error and "needs a model" in _text(no_model)
        assert "--" not in _text(no_model), "no command-line flags in an MCP error"

        missing = await client.call_tool("orchestration_status", {"run_id": "run_missing"})
        assert missing.is_error and "run 'run_missing' not found" in _text(missing)

        empty = await client.call_tool("orchestration_run", {"prompt": " ", "model": "fake:echo"})
        assert empty.is_error and "prompt must not be empty" in _text(empty)


def _runtime_with(script: Any) -> tuple[Runtime, MemoryStore]:
    store = MemoryStore()
    return Runtime(store, provider_factory=lambda m: FakeProvider(script, model=m)), store


@pytest.mark.parametrize(
    ("script", "status"), [(outage, "failed"), (cut, "partial")], ids=["outage", "cut"]
)
async def test_a_run_that_did_not_complete_is_an_error_that_keeps_the_run(
    script: Any, status: str
) -> None:
    runtime, store = _runtime_with(script)
    async with Client(build_mcp_server(McpTools(runtime, Role.MEMBER))) as client:
        result = await client.call_tool("orchestration_run", {"prompt": "x", "model": "fake:x"})
    assert result.is_error, "a script or host must tell an outage from an answer"
    (run,) = await store.list_runs()
    view = result.structured_content
    assert view is not None and view["run_id"] == run.run_id and view["status"] == status
    assert run.status == status and run.error and view["error"] == run.error
    assert _text(result).startswith(f"run {run.run_id} {status}: ")
    assert view["tasks"][0]["output"] == ("Half an ans" if status == "partial" else "")


async def test_a_cancelled_call_closes_the_run_and_its_tasks_interrupted() -> None:
    runtime, store = _runtime_with(slow)
    answering, ended = anyio.Event(), anyio.Event()

    async def watch(events: Sequence[Event]) -> None:
        if any(e.type == "message.delta" for e in events):
            answering.set()
        if any(e.type == "run.interrupted" for e in events):
            ended.set()

    runtime.sinks.append(watch)
    server = build_mcp_server(McpTools(runtime, Role.MEMBER))
    async with Client(server) as client:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(
                    client.call_tool,
                    "orchestration_run",
                    {"prompt": "x", "model": "fake:x", "tasks": ["one", "two"]},
                )
                await answering.wait()
                group.cancel_scope.cancel()  # the client abandons the call: notifications/cancelled
            await ended.wait()
    (closed,) = await store.list_runs()
    assert closed.status == "interrupted"
    assert [t.status for t in closed.tasks] == ["interrupted", "interrupted"]
    assert closed.error == f"interrupted: {CANCELLED_BY_HOST}"
    types = [e.type for e in await store.read(closed.run_id)]
    assert types[-3:] == ["task.completed", "task.completed", "run.interrupted"]
    assert types.count("run.interrupted") == 1


# --------------------------------------------------------------------------- end to end over stdio


def _server(role: str) -> StdioServerParameters:
    env = {"PYTHONPATH": str(SRC)}
    env.update({k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "TMPDIR")})
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "thoughtgate", "mcp", "--db", "memory://", "--role", role],
        env=env,
        cwd=str(SRC.parent),
    )


async def _call(session: ClientSession, name: str, args: dict[str, Any]) -> CallToolResult:
    result = await session.call_tool(name, args)
    assert isinstance(result, CallToolResult)
    return result


@pytest.mark.parametrize("role", ["member", "developer"])
async def test_stdio_end_to_end_role_by_mode(role: str) -> None:
    async with stdio_client(_server(role)) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        assert {t.name for t in tools.tools} == {
            "orchestration_run",
            "orchestration_status",
            "orchestration_approve",
        }
        for mode in MODES:
            result = await _call(
                session,
                "orchestration_run",
                {"prompt": "What is it?", "model": "fake:reasoner", "chain_of_thought": mode},
            )
            assert not result.is_error, _text(result)
            view = result.structured_content
            assert view is not None and view["tasks"][0]["output"] == "The answer is 42."
            expected = role == "developer" and mode == "surface"
            # reasoning token counts are reasoning: shown only where the reasoning is
            assert view["tasks"][0]["usage"].get("reasoning_tokens") == (8 if expected else None)
            assert (REASONER_MARKER in _text(result)) is expected, (role, mode)
            assert _shows_marker(view) is expected, (role, mode)

            status = await _call(session, "orchestration_status", {"run_id": view["run_id"]})
            assert not status.is_error and status.structured_content is not None
            assert status.structured_content["status"] == "completed"
            assert (REASONER_MARKER in _text(status)) is expected

        missing = await _call(session, "orchestration_status", {"run_id": "run_nope"})
        assert missing.is_error and "not found" in _text(missing)
