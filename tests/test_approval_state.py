"""Whether an approval can still be answered is the runtime's answer (``Runtime.answer_approval``):
the HTTP route and the MCP tool refuse the same cases with the same words.

A real daemon on loopback over a SQLite file; the MCP tools run on another runtime over the same
file, as a ``thoughtgate mcp`` process would.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.daemon import running_daemon

from thoughtgate.access.roles import Role
from thoughtgate.config import Config
from thoughtgate.errors import ApprovalNotPendingError, RunNotFoundError
from thoughtgate.events.schema import EventType, NewEvent
from thoughtgate.mcp_server import McpTools
from thoughtgate.orchestration.runtime import RunRequest, Runtime
from thoughtgate.store.urls import open_store

CARD = {"call_id": "call_a", "tool_key": "dangerous", "turn": 0, "label": "dangerous"}


async def _runs(db: str) -> tuple[str, str]:
    """An open run whose approval for ``call_a`` was answered, and an ended run that asked for
    the same call."""
    store = await open_store(db)
    try:
        runtime = Runtime(store, Config())
        open_run = await runtime.create_run(RunRequest("x", model="fake:echo"))
        asked = NewEvent(EventType.TOOL_APPROVAL_REQUIRED, {**CARD, "input": {}})
        answered = NewEvent(
            EventType.TOOL_APPROVAL_RESPONSE, {**CARD, "decision": "approve", "by": "k"}
        )
        await store.append(open_run.run_id, [asked, answered])
        ended = await runtime.create_run(RunRequest("y", model="fake:echo"))
        await store.append(ended.run_id, [asked])  # asked, never answered; then the run ended
        await runtime.execute(ended.run_id)
        return open_run.run_id, ended.run_id
    finally:
        await store.close()


async def _mcp(db: str, run_id: str, call_id: str) -> str:
    store = await open_store(db)
    try:
        tools = McpTools(Runtime(store, Config()), Role.MEMBER)
        with pytest.raises((ApprovalNotPendingError, RunNotFoundError)) as refused:
            await tools.approve(run_id, call_id, "approve")
        return str(refused.value)
    finally:
        await store.close()


def test_http_and_mcp_refuse_the_same_approvals_with_the_same_words(tmp_path: Path) -> None:
    with running_daemon(sqlite_dir=tmp_path) as daemon:
        db = f"sqlite:///{tmp_path / 'daemon.db'}"
        open_id, ended_id = asyncio.run(_runs(db))
        cases = [
            (open_id, "call_a", 409, "was already settled"),
            (open_id, "call_b", 404, "no approval is pending for call 'call_b'"),
            (ended_id, "call_a", 409, "has already ended (completed)"),
            ("run_nope", "call_a", 404, "not found"),
        ]
        with daemon.client("member") as http:
            for run_id, call_id, status, words in cases:
                answer = http.post(
                    f"/v1/runs/{run_id}/approvals/{call_id}", json={"decision": "approve"}
                )
                assert answer.status_code == status, (run_id, call_id, answer.text)
                message = answer.json()["error"]["message"]
                assert words in message
                assert asyncio.run(_mcp(db, run_id, call_id)) == message
