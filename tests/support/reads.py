"""Every read path of a recorded run, as the text one role gets from each: the Python surfaces
(run view, events, host metadata, the rebuilt thread, the MCP status tool), the CLI, and the
daemon's HTTP routes and SSE stream. The tests that look for a canary on every path use these."""

from __future__ import annotations

import asyncio
import json

from typer.testing import CliRunner

from support.daemon import Daemon, stream_all
from thoughtgate.access.filter import filter_events, filter_run
from thoughtgate.access.roles import Role
from thoughtgate.cli import app as cli_app
from thoughtgate.config import Config
from thoughtgate.events.thread import rebuild
from thoughtgate.host_metadata import host_metadata
from thoughtgate.mcp_server import McpTools
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.store.urls import open_store

__all__ = ["cli_reads", "http_reads", "python_reads", "readings"]


async def python_reads(db: str, run_id: str, role: str) -> str:
    """What the Python surfaces give this reader: run view, events, host metadata, the rebuilt
    thread, and the MCP status tool."""
    store = await open_store(db)
    try:
        record = await store.get_run(run_id)
        events = filter_events(await store.read(run_id), role, mode=record.chain_of_thought)
        mcp = await McpTools(Runtime(store, Config()), Role[role.upper()]).status(run_id)
        return json.dumps(
            [
                filter_run(record, role).to_json(),
                [e.to_dict() for e in events],
                host_metadata(record, role).to_json(),
                rebuild(events).to_dict(),
                mcp.to_json(),
            ],
            default=str,
        )
    finally:
        await store.close()


def cli_reads(db: str, run_id: str, role: str) -> str:
    runner = CliRunner()
    out = []
    for args in (
        ["status", run_id],
        ["status", run_id, "--json"],
        ["events", run_id],
        ["events", run_id, "--json"],
        ["runs", "--json"],
    ):
        result = runner.invoke(cli_app, [*args, "--db", db, "--view-as", role])
        assert result.exit_code == 0, result.output
        out.append(result.output)
    return "\n".join(out)


def http_reads(daemon: Daemon, run_id: str, role: str) -> str:
    out = []
    with daemon.client(role) as c:
        for path in (
            "/v1/runs?limit=100",
            f"/v1/runs/{run_id}",
            f"/v1/runs/{run_id}/events",
            f"/v1/runs/{run_id}/host-metadata",
            f"/v1/runs/{run_id}/trace",
        ):
            out.append(c.get(path).text)
    _, body = stream_all(daemon, run_id, role)
    return "\n".join([*out, body])


def readings(db: str, daemon: Daemon, run_id: str, role: str) -> dict[str, str]:
    """Each read path's text for ``role``: ``python``, ``cli`` and ``http`` (routes and stream);
    ``daemon`` serves the SQLite database ``db``."""
    return {
        "python": asyncio.run(python_reads(db, run_id, role)),
        "cli": cli_reads(db, run_id, role),
        "http": http_reads(daemon, run_id, role),
    }
