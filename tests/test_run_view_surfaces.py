"""One run, read through every surface as the same role, is one view (ADR 0015).

A real daemon on loopback over a SQLite file; the same run read as each role through HTTP
(``GET /v1/runs/{id}`` and ``/host-metadata``), the Python client, the CLI (``status --json``
against the daemon and against the file) and the MCP tools gives the same document, and a reader
below developer never finds the run's reasoning in it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from support.daemon import REPO, Daemon, cli_env, markers, running_daemon

from thoughtgate.access.roles import ROLE_NAMES, Role, parse_role
from thoughtgate.client import SyncThoughtgateClient
from thoughtgate.config import Config
from thoughtgate.mcp_server import McpTools
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.store.urls import open_store

HOST_ONLY = ("version", "role", "reasoning_visible")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(sqlite_dir=tmp_path_factory.mktemp("views")) as d:
        yield d


@pytest.fixture(scope="module")
def canary(daemon: Daemon) -> tuple[str, str]:
    """A finished surface run whose reasoning carries a marker, and that marker."""
    token = uuid.uuid4().hex[:10]
    body = {
        "prompt": f"canary {token}",
        "model": "fake:canary",
        "chain_of_thought": "surface",
        "tools": ["lookup"],
    }
    run_id = daemon.start_run(body, role="developer")
    assert daemon.wait_done(run_id)["status"] == "completed"
    return run_id, markers(token)["reasoning"]


def _db(daemon: Daemon) -> str:
    return f"sqlite:///{daemon.store.path}"  # type: ignore[attr-defined]


def _cli(*args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "thoughtgate", *args],
        env=cli_env(),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _mcp(db: str, run_id: str, role: str) -> dict[str, Any]:
    async def read() -> dict[str, Any]:
        store = await open_store(db)
        try:
            view = await McpTools(Runtime(store, Config()), parse_role(role)).status(run_id)
            return view.to_json()
        finally:
            await store.close()

    return asyncio.run(read())


def _in_process_views(daemon: Daemon, run_id: str, role: str) -> dict[str, dict[str, Any]]:
    http = daemon.get(f"/v1/runs/{run_id}", role).json()
    host = daemon.get(f"/v1/runs/{run_id}/host-metadata", role).json()
    assert host["role"] == role and host["version"] == 1
    with SyncThoughtgateClient(daemon.base_url, daemon.keys[role]) as tg:
        client = tg.get_run(run_id).to_json()
        listed = next(v for v in tg.list_runs() if v.run_id == run_id).to_json()
    return {
        "http": http,
        "host metadata": {k: v for k, v in host.items() if k not in HOST_ONLY},
        "client": client,
        "client list": listed,
        "mcp": _mcp(_db(daemon), run_id, role),
    }


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_in_process_surface_gives_the_same_view(
    daemon: Daemon, canary: tuple[str, str], role: str
) -> None:
    run_id, reasoning = canary
    views = _in_process_views(daemon, run_id, role)
    http = views["http"]
    for surface, view in views.items():
        assert view == http, surface
    readable = parse_role(role) >= Role.DEVELOPER
    assert (reasoning in json.dumps(views)) is readable
    assert ("reasoning" in http["tasks"][0]) is readable, "withheld means absent"
    assert ("reasoning_tokens" in http["usage"]) is readable


@pytest.mark.parametrize("role", ["viewer", "developer"])
def test_the_cli_prints_that_view_locally_and_through_the_daemon(
    daemon: Daemon, canary: tuple[str, str], role: str
) -> None:
    run_id, reasoning = canary
    http = daemon.get(f"/v1/runs/{run_id}", role).json()
    remote = _cli("status", run_id, "--json", "--url", daemon.base_url, "--key", daemon.keys[role])
    local = _cli("status", run_id, "--json", "--db", _db(daemon), "--view-as", role)
    listed = _cli("runs", "--json", "--db", _db(daemon), "--view-as", role)
    assert remote == http
    assert local == http
    assert next(v for v in listed if v["run_id"] == run_id) == http
    assert (reasoning in json.dumps([remote, local, listed])) is (role == "developer")


def test_a_views_json_names_only_what_the_http_api_always_had(
    daemon: Daemon, canary: tuple[str, str]
) -> None:
    """Backward compatibility: every field the HTTP API returned before the one view is there."""
    run_id, _ = canary
    view = daemon.get(f"/v1/runs/{run_id}", "viewer").json()
    before = {
        "run_id", "status", "prompt", "model", "chain_of_thought", "worker_backend",
        "created_at", "updated_at", "usage", "error", "metadata", "tasks",
    }  # fmt: skip
    assert before <= set(view)
    task = {"task_id", "index", "prompt", "status", "output", "usage", "error", "model", "backend"}
    assert set(view["tasks"][0]) == task
    host = daemon.get(f"/v1/runs/{run_id}/host-metadata", "viewer").json()
    assert {"version", "reasoning_visible", "role", "tasks"} <= set(host)
    assert host["reasoning_visible"] is False
