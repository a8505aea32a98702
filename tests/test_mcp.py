"""MCP tools: role × mode rules on what comes back, tool errors, and the real stdio transport."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.client import Client
from mcp_types import CallToolResult, TextContent
from support.daemon import markers, server_tools
from support.durable import until
from support.node import node_json
from support.scripts import CUT_EMOJI, cut, outage, slow

from thoughtgate import __version__
from thoughtgate.access.roles import Role
from thoughtgate.config import Config
from thoughtgate.engine.approvals import ApprovalBroker
from thoughtgate.errors import AccessDeniedError
from thoughtgate.events.schema import Event
from thoughtgate.mcp_server import CANCELLED_BY_HOST, McpTools, build_mcp_server, resolve_mcp_role
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.pg_errors import translate_error
from thoughtgate.store.sqlite import SQLiteStore
from thoughtgate.store.urls import open_store
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
    view = (await tools.run("What is it?", model="fake:reasoner", chain_of_thought=mode)).to_json()
    (task,) = view["tasks"]
    assert task["output"] == "The answer is 42."
    assert view["chain_of_thought"] == mode
    readable = mode == "surface" and role >= Role.DEVELOPER
    assert _shows_marker(view) is readable
    assert ("reasoning" in task) is readable
    assert ("reasoning_tokens" in task["usage"]) is readable
    assert _shows_marker((await tools.status(view["run_id"])).to_json()) is readable


async def test_tasks_run_in_order_and_status_reads_them_back() -> None:
    tools = McpTools(Runtime(MemoryStore()), Role.MEMBER)
    view = await tools.run("", model="fake:echo", tasks=["one", "two"])
    assert [t.output for t in view.tasks] == ["Echo: one", "Echo: two"]
    assert (await tools.status(view.run_id)).tasks == view.tasks


async def test_orchestration_approve_answers_a_pending_approval_for_members_only() -> None:
    from support.daemon import server_tools

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
        await _approved_once(client, job, args)
        await _recorded_once(store, run_id)


async def _approved_once(client: Client, job: asyncio.Task[Any], args: dict[str, str]) -> None:
    """The answer is taken, and the run it was waiting for then ends well."""
    answered = await client.call_tool("orchestration_approve", args)
    assert not answered.is_error, _text(answered)
    result = await job
    assert not result.is_error, _text(result)


async def _recorded_once(store: Any, run_id: str) -> None:
    """The log has the one answer, by the MCP host."""
    log = await store.read(run_id)
    decided = [e.payload for e in log if e.type == "tool.approval_response"]
    assert [(d["decision"], d["by"]) for d in decided] == [("approve", "mcp")]


@pytest.mark.inprocess
async def test_orchestration_approve_is_refused_while_the_store_refuses_writes(
    tmp_path: Path,
) -> None:
    """ADR 0165: as over HTTP, an answer given while the store refuses writes (here its
    directory moved away) would be lost with the run's next write; it is refused, the run keeps
    waiting, and the same answer is taken once the store is back (the directory moved back)."""
    from support.daemon import server_tools

    directory, away = tmp_path / "store", tmp_path / "away"
    directory.mkdir()
    store = await SQLiteStore.open(directory / "s.db")
    waiting = asyncio.Event()

    async def noticed(call_id: str, tool: str, arguments: Any) -> None:
        waiting.set()
        return None

    runtime = Runtime(store, tools=server_tools(), approvals=ApprovalBroker(decider=noticed))
    try:
        async with Client(build_mcp_server(McpTools(runtime, Role.MEMBER))) as client:
            job = asyncio.create_task(
                client.call_tool("orchestration_run", {"prompt": "go", "model": "fake:approval"})
            )
            await asyncio.wait_for(waiting.wait(), 10)
            run_id = (await store.list_runs())[0].run_id
            args = {"run_id": run_id, "call_id": "call_danger", "decision": "approve"}
            directory.rename(away)
            try:
                refused = await client.call_tool("orchestration_approve", args)
            finally:
                away.rename(directory)
            assert refused.is_error
            assert "store_removed" in _text(refused) and "still pending" in _text(refused)

            async def back() -> bool:
                return store.write_refusal() is None

            await until(back)
            await _approved_once(client, job, args)
        await _recorded_once(store, run_id)
    finally:
        await store.close()


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
        assert bad_mode.is_error
        assert _text(bad_mode) == (
            "invalid arguments for orchestration_run: chain_of_thought: Input should be "
            "'hidden', 'surface' or 'telemetry_only'"
        )
        wrong_types = await client.call_tool(
            "orchestration_run", {"prompt": 5, "model": ["x"], "colour": "red"}
        )
        assert wrong_types.is_error
        text = _text(wrong_types)
        assert "prompt: Input should be a valid string" in text
        assert "model: Input should be a valid string" in text
        assert "colour: is not an argument of this tool" in text
        assert "http" not in text, "no library links in an argument error"

        bad_model = await client.call_tool("orchestration_run", {"prompt": "x", "model": "nope"})
        assert bad_model.is_error and "PROVIDER:MODEL" in _text(bad_model)

        no_model = await client.call_tool("orchestration_run", {"prompt": "x"})
        assert no_model.is_error and "needs a model" in _text(no_model)
        assert "--" not in _text(no_model), "no command-line flags in an MCP error"

        missing = await client.call_tool("orchestration_status", {"run_id": "run_missing"})
        assert missing.is_error and "run 'run_missing' not found" in _text(missing)

        empty = await client.call_tool("orchestration_run", {"prompt": " ", "model": "fake:echo"})
        assert empty.is_error and "prompt must not be empty" in _text(empty)


async def test_a_provider_without_a_key_is_named_to_the_host_in_neutral_words(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A run asking for a provider this server has no key for: the tool error says what the
    daemon tells its callers and what the host can do, never which secret to set (the host's
    model reads it first; ADR 0128, ADR 0136); no run is created; the server's log on stderr
    tells whoever set it up what to set, and where a host takes it from."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    store = MemoryStore()
    server = build_mcp_server(McpTools(Runtime(store, Config()), Role.DEVELOPER))
    with caplog.at_level(logging.WARNING, logger="thoughtgate.mcp"):
        async with Client(server) as client:
            result = await client.call_tool(
                "orchestration_run", {"prompt": "hi", "model": "anthropic:claude-sonnet-4-5"}
            )
    assert result.is_error
    assert _text(result) == (
        "this server is not configured for provider 'anthropic': no run was started (choose "
        "another model, or ask whoever set up this MCP server to configure the provider; its "
        "log says what to set)"
    )
    assert await store.list_runs() == []
    (line,) = [r.getMessage() for r in caplog.records if r.name == "thoughtgate.mcp"]
    assert "orchestration_run asked for provider 'anthropic'" in line
    assert "ANTHROPIC_API_KEY" in line and "server entry" in line


class _QuotingStore(MemoryStore):
    """A store whose reads fail as PostgreSQL's do when its first line quotes a value: the
    ``StoreError`` keeps the driver's words for the developer, its public text their code."""

    async def get_run(self, run_id: str, *, apart: bool = True) -> Any:
        said = psycopg.errors.InvalidTextRepresentation(
            'invalid input syntax for type integer: "REASONING-mcp-error-words"'
        )
        raise translate_error(said, "read the run", "PostgreSQL database test") from said


@pytest.mark.parametrize("role", [Role.VIEWER, Role.MEMBER])
async def test_a_tool_error_gives_a_store_failure_s_public_text_never_its_driver_s_words(
    role: Role,
) -> None:
    """A tool error is every role's to read, like a run's public ``error``: a thoughtgate error
    that quoted another exception (ADR 0104) is shown by the text it declared public."""
    async with Client(build_mcp_server(McpTools(Runtime(_QuotingStore()), role))) as client:
        failed = await client.call_tool("orchestration_status", {"run_id": "run_x"})
    assert failed.is_error
    assert "REASONING-mcp-error-words" not in _text(failed)
    assert _text(failed) == (
        "cannot read the run: InvalidTextRepresentation (SQLSTATE 22P02) (PostgreSQL database test)"
    )


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


# --------------------------------------------------------------------------- as hosts expect


async def test_server_info_capabilities_and_typed_schemas() -> None:
    server = build_mcp_server(McpTools(Runtime(MemoryStore()), Role.MEMBER))
    async with Client(server) as client:
        info = client.server_info
        assert info is not None and (info.name, info.version) == ("thoughtgate", __version__)
        caps = client.server_capabilities
        assert caps is not None and caps.tools is not None
        dumped = caps.model_dump(exclude_none=True)
        assert set(dumped) == {"tools"}, "no empty prompts or resources capabilities"
        tools = {t.name: t for t in (await client.list_tools()).tools}
    run = tools["orchestration_run"]
    modes = run.input_schema["properties"]["chain_of_thought"]["anyOf"][0]
    assert modes["enum"] == ["hidden", "surface", "telemetry_only"]
    assert run.input_schema["required"] == ["prompt"]
    assert run.input_schema["additionalProperties"] is False
    for name in ("orchestration_run", "orchestration_status"):
        schema = tools[name].output_schema
        assert schema is not None and schema["type"] == "object"
        assert {"run_id", "status", "tasks", "usage"} <= set(schema["properties"])
        assert "reasoning" not in schema.get("required", []), "withheld fields are optional"
    approve = tools["orchestration_approve"]
    assert approve.input_schema["properties"]["decision"]["enum"] == ["approve", "reject"]
    assert approve.input_schema["additionalProperties"] is False
    assert set((approve.output_schema or {})["properties"]) == {"run_id", "call_id", "decision"}
    assert tools["orchestration_status"].annotations.read_only_hint is True  # type: ignore[union-attr]


async def test_progress_notifications_come_from_public_fields_while_the_run_works() -> None:
    runtime = Runtime(MemoryStore(), tools=server_tools())
    server = build_mcp_server(McpTools(runtime, Role.VIEWER))
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    token = "progress01"
    async with Client(server) as client:
        result = await client.call_tool(
            "orchestration_run",
            {"prompt": f"canary {token}", "model": "fake:canary", "chain_of_thought": "surface"},
            progress_callback=on_progress,
        )
        assert not result.is_error
        quiet = await client.call_tool(
            "orchestration_run", {"prompt": "x", "model": "fake:echo"}
        )  # no progress token: no notifications, and no trouble
        assert not quiet.is_error
    messages = [m for _, _, m in seen]
    assert messages[0] == "task 1 of 1 started" and messages[-1] == "task completed"
    assert "lookup: running" in messages and "lookup: completed" in messages
    assert [p for p, _, _ in seen] == list(range(1, len(seen) + 1)), "progress only grows"
    for secret in markers(token).values():
        assert secret not in json.dumps(seen), "progress never carries reasoning or tool data"


# --------------------------------------------------------------------------- end to end over stdio


def _server(
    role: str, *extra: str, db: str = "memory://", **env_extra: str
) -> StdioServerParameters:
    env = {"PYTHONPATH": os.pathsep.join([str(SRC), str(SRC.parent / "tests")])}
    env.update({k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "TMPDIR")})
    env.update(env_extra)
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "thoughtgate", "mcp", "--db", db, "--role", role, *extra],
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


async def test_stdio_with_tools_and_plain_log_lines_on_stderr(tmp_path: Path) -> None:
    """``--tools`` as for run and serve; a log line (here: the telemetry collector is down) is
    one plain line on stderr, and stdout carries only the protocol."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{sock.getsockname()[1]}"
    params = _server(
        "member",
        "--tools",
        "support.served:SERVER_TOOLS",
        db=f"sqlite:///{tmp_path / 'mcp.db'}",
        THOUGHTGATE_TELEMETRY__EXPORTER="otlp_http",
        THOUGHTGATE_TELEMETRY__ENDPOINT=down,
    )
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            init = await session.initialize()
            assert init.server_info.version == __version__
            result = await _call(
                session,
                "orchestration_run",
                {"prompt": "canary stdio1", "model": "fake:canary", "chain_of_thought": "hidden"},
            )
            assert not result.is_error, _text(result)
            assert "result for TOOLARG-stdio1" not in _text(result)  # run views hold no tool data
            assert result.structured_content is not None
            assert result.structured_content["tasks"][0]["output"] == "The answer is 42."
    store = await open_store(f"sqlite:///{tmp_path / 'mcp.db'}")
    try:
        (run,) = await store.list_runs()
        kinds = [e.type for e in await store.read(run.run_id)]
    finally:
        await store.close()
    assert "tool.completed" in kinds and "tool.failed" not in kinds, "--tools loaded lookup"
    lines = [line for line in errors.read_text().splitlines() if line.strip()]
    assert lines, "the collector outage is reported"
    for line in lines:
        assert line.startswith("thoughtgate mcp: "), line
        assert "\x1b[" not in line and "│" not in line, "plain text, no colours or boxes"
    assert any("cannot export to" in line for line in lines)


@pytest.mark.external
async def test_stdio_answers_json_rpc_for_steps_and_answers_holding_lone_surrogates(
    tmp_path: Path,
) -> None:
    """A provider's text cut inside an emoji (a lone surrogate, kept exactly in a payload: ADR
    0114) in its raw reasoning, in a visible step's summary and in the answer: the progress
    notifications, the run's result and its status are each a JSON-RPC message the host reads,
    the stream goes on after them (it was cut at the first: every later call waited), and the
    run completed. UTF-8 cannot carry the surrogate and the SDK writes every message as UTF-8:
    the host reads U+FFFD there, as the run index keeps it."""
    params = _server(
        "developer",
        "--tools",
        "support.served:NO_TOOLS",
        db=f"sqlite:///{tmp_path / 'mcp.db'}",
        THOUGHTGATE_VISIBLE_REASONING__SUMMARIZERS="phases,provider_summaries",
    )
    seen: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message)

    errors = tmp_path / "stderr.txt"
    with errors.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            args = {"prompt": "hi", "model": "fake:cut-emoji-steps", "chain_of_thought": "surface"}
            with anyio.fail_after(60):
                result = await session.call_tool(
                    "orchestration_run", args, progress_callback=on_progress
                )
            assert not result.is_error, _text(result)
            view = result.structured_content
            assert view is not None and view["status"] == "completed", view
            assert view["tasks"][0]["output"] == "Here is half an emoji \ufffd"  # the index's
            with anyio.fail_after(60):
                status = await _call(session, "orchestration_status", {"run_id": view["run_id"]})
            assert not status.is_error and status.structured_content == view
            with anyio.fail_after(60):  # the stream still carries the next call
                again = await _call(session, "orchestration_run", {**args, "model": "fake:echo"})
            assert not again.is_error, _text(again)
    shown = CUT_EMOJI.replace("\ud83d", "\ufffd")  # as the run index keeps it (ADR 0114)
    assert f"Checking the {shown}" in seen, (seen, errors.read_text())


# --------------------------------------------------------------------------- a second host's SDK


@pytest.mark.parametrize("role", ["viewer", "developer"])
def test_the_typescript_sdk_client_as_a_host_sees_what_its_role_may(role: str) -> None:
    """The official TypeScript SDK (``@modelcontextprotocol/sdk`` under node): it validates each
    structured result against the tool's output schema, and gets progress while the run works."""
    args = {"prompt": "canary ts-host", "model": "fake:canary", "chain_of_thought": "surface"}
    out = node_json(
        "mcp_client.mjs",
        sys.executable,
        "memory://",
        role,
        json.dumps(args),
        json.dumps(["--tools", "support.served:SERVER_TOOLS"]),
        env={"PYTHONPATH": os.pathsep.join([str(SRC), str(SRC.parent / "tests")])},
    )
    assert out.get("error") is None, out
    assert out["serverVersion"]["version"] == __version__
    assert out["capabilities"] == {"tools": {"listChanged": False}}
    assert [t["name"] for t in out["tools"]] == [
        "orchestration_run",
        "orchestration_status",
        "orchestration_approve",
    ]
    result = out["result"]
    assert result.get("isError") is not True, result
    assert result["structuredContent"]["tasks"][0]["output"] == "The answer is 42."
    assert out["status"]["structuredContent"]["status"] == "completed"
    bad = out["badArguments"]
    assert bad["isError"] and "chain_of_thought: Input should be" in bad["content"][0]["text"]
    # Progress: the server sends every notification, in order, before the result (what the
    # protocol asks of it); the wire record shows that in full. The TypeScript SDK 1.x drops the
    # ones it reads together with the response (modelcontextprotocol/typescript-sdk#2580), on a
    # busy machine any tail of them or all, so what it delivers is checked as a prefix of what
    # came. (test_progress_notifications_come_from_public_fields_while_the_run_works checks the
    # delivered sequence in full with the Python SDK.)
    sent, progress = out["wireProgress"], out["progress"]
    messages = [p["message"] for p in sent]
    assert messages[0] == "task 1 of 1 started" and messages[-1] == "task completed", messages
    assert [p["progress"] for p in sent] == list(range(1, len(sent) + 1))
    assert {p["progressToken"] for p in sent} == {sent[0]["progressToken"]}
    assert progress == [
        {k: v for k, v in p.items() if k != "progressToken"} for p in sent[: len(progress)]
    ]
    mark = markers("ts-host")
    readable = role == "developer"
    assert (mark["reasoning"] in json.dumps(result)) is readable
    for secret in (mark["carrier"], mark["tool"]):
        assert secret not in json.dumps(out)
    assert mark["reasoning"] not in json.dumps(sent)
