"""The canary: unique markers planted in the reasoning, in a continuity carrier, in a tool's
arguments, and in tool detail texts (a validation error quoting the model's arguments, a tool's
exception quoting its input, a progress message) appear only where "Who sees what, where" allows:
on every HTTP route and every SSE frame, in the CLI and over MCP, for every role and every mode.
The web page gets the same check in chromium (test_web_page.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.daemon import (
    MODES,
    ROLES,
    TOOL_CANARY_TOOLS,
    Daemon,
    billed_canaries,
    cli,
    markers,
    running_daemon,
    server_tools,
    sse_events,
    stream_all,
    tool_markers,
)

from thoughtgate.access.roles import Role, parse_role
from thoughtgate.events.schema import is_run_terminal
from thoughtgate.mcp_server import McpTools
from thoughtgate.orchestration.runtime import Runtime
from thoughtgate.store.memory import MemoryStore


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


@pytest.fixture(scope="module")
def runs(daemon: Daemon) -> dict[str, tuple[str, dict[str, str]]]:
    """mode -> (run_id, markers), each run with its own token."""
    out = {}
    for mode in MODES:
        token = uuid.uuid4().hex[:12]
        run_id = daemon.start_run(
            {
                "prompt": f"canary {token}",
                "model": "fake:canary",
                "chain_of_thought": mode,
                "tools": ["lookup"],
            }
        )
        out[mode] = (run_id, markers(token))
    for run_id, _ in out.values():
        assert daemon.wait_done(run_id)["status"] == "completed"
    return out


def _bodies(daemon: Daemon, run_id: str, role: str) -> dict[str, tuple[int, str]]:
    """Every route's (status, body) for this reader."""
    out: dict[str, tuple[int, str]] = {}
    with daemon.client(role) as c:
        for name, path in (
            ("runs", "/v1/runs?limit=500"),
            ("run", f"/v1/runs/{run_id}"),
            ("events", f"/v1/runs/{run_id}/events"),
            ("trace", f"/v1/runs/{run_id}/trace"),
            ("host-metadata", f"/v1/runs/{run_id}/host-metadata"),
            ("me", "/v1/me"),
            ("keys", "/v1/keys"),
            ("healthz", "/healthz"),
            ("openapi", "/openapi.json"),
        ):
            r = c.get(path)
            out[name] = (r.status_code, r.text)
        r = c.post("/v1/tickets", json={"run_id": run_id})
        out["ticket"] = (r.status_code, r.text)
    response, body = stream_all(daemon, run_id, role)
    out["stream"] = (response.status_code, body)
    out["agui"] = _agui_body(daemon, run_id, role)
    return out


def _agui_body(daemon: Daemon, run_id: str, role: str) -> tuple[int, str]:
    """The whole AG-UI answer (``POST /v1/agui`` following the run) for this reader."""
    body = {
        "threadId": "canary",
        "runId": "canary",
        "messages": [],
        "forwardedProps": {"thoughtgate": {"run": run_id}},
    }
    with daemon.client(role) as c, c.stream("POST", "/v1/agui", json=body) as r:
        text = r.read().decode("utf-8")
    assert r.status_code != 200 or text.rstrip().endswith("}"), text[-200:]
    assert "REASONING_ENCRYPTED_VALUE" not in text
    return r.status_code, text


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("role", ROLES)
def test_markers_appear_only_where_allowed(
    daemon: Daemon, runs: dict[str, tuple[str, dict[str, str]]], role: str, mode: str
) -> None:
    run_id, mark = runs[mode]
    level = parse_role(role)
    bodies = _bodies(daemon, run_id, role)
    display_reasoning = mode == "surface" and level >= Role.DEVELOPER
    trace_reasoning = level >= Role.DEVELOPER and mode != "hidden"
    for route, (status, body) in bodies.items():
        where = f"{route} as {role} on a {mode} run"
        assert mark["carrier"] not in body, where
        if route == "trace":
            assert status == (200 if level >= Role.DEVELOPER else 403), where
            assert (mark["reasoning"] in body) == trace_reasoning, where
            continue
        if route == "keys":
            assert status == (200 if level >= Role.ADMIN else 403), where
        else:
            assert status == 200, where
        if route in ("runs", "run", "events", "stream", "host-metadata", "agui"):
            assert (mark["reasoning"] in body) == display_reasoning, where
        else:
            assert mark["reasoning"] not in body, where
        if route == "agui":  # reasoning events only where the filter shows reasoning
            assert ('"type":"REASONING_' in body) == display_reasoning, where
        if route in ("events", "stream", "agui"):
            assert (mark["tool"] in body) == (level >= Role.MEMBER), where
        elif level < Role.MEMBER:
            assert mark["tool"] not in body, where


@pytest.mark.parametrize("role", ROLES)
def test_stream_and_events_agree_and_carriers_only_announce_themselves(
    daemon: Daemon, runs: dict[str, tuple[str, dict[str, str]]], role: str
) -> None:
    run_id, _ = runs["surface"]
    with daemon.client(role) as c:
        events = c.get(f"/v1/runs/{run_id}/events").json()["events"]
    _, body = stream_all(daemon, run_id, role)
    assert sse_events(body) == events
    types = [e["type"] for e in events]
    assert ("reasoning.delta" in types) == (parse_role(role) >= Role.DEVELOPER)
    responses = [e for e in events if e["type"] == "agent.response"]
    assert responses
    for e in responses:
        assert ("reasoning" in e["payload"]) == (parse_role(role) >= Role.DEVELOPER)
    first = responses[0]["payload"]
    assert first["continuity"] == [{"carrier": "anthropic.thinking", "present": True}]
    cards = [e for e in events if e["type"] in ("tool.started", "tool.completed")]
    assert cards and all(e["payload"]["label"] == "lookup" for e in cards)
    assert all(
        ("input" in e["payload"] or "output" in e["payload"]) == (parse_role(role) >= Role.MEMBER)
        for e in cards
    )


# --------------------------------------------------------------------------- tool detail texts


@pytest.fixture(scope="module")
def tool_run(daemon: Daemon) -> tuple[str, dict[str, str]]:
    """A surface run whose tool inputs come back in a validation error (``input_value=...``), in a
    tool's exception and in a progress message: texts that are tool detail, not tool input."""
    token = uuid.uuid4().hex[:12]
    run_id = daemon.start_run(
        {
            "prompt": f"toolcanary {token}",
            "model": "fake:toolcanary",
            "chain_of_thought": "surface",
            "tools": TOOL_CANARY_TOOLS,
        }
    )
    assert daemon.wait_done(run_id)["status"] == "completed"
    return run_id, tool_markers(token)


@pytest.mark.parametrize("role", ROLES)
def test_tool_data_in_errors_and_progress_reaches_members_only(
    daemon: Daemon, tool_run: tuple[str, dict[str, str]], role: str
) -> None:
    run_id, marks = tool_run
    member = parse_role(role) >= Role.MEMBER
    bodies = _bodies(daemon, run_id, role)
    for route, (_, body) in bodies.items():
        for name, mark in marks.items():
            where = f"{name} marker on {route} as {role}"
            if route in ("events", "stream", "agui"):
                assert (mark in body) == member, where
            else:  # run views, host metadata, the trace: no tool detail at all
                assert mark not in body, where
    events = sse_events(bodies["stream"][1])
    with daemon.client(role) as c:
        assert events == c.get(f"/v1/runs/{run_id}/events").json()["events"]
    failed = [e["payload"] for e in events if e["type"] == "tool.failed"]
    assert [p["error_kind"] for p in failed] == ["invalid_arguments", "tool_error"]
    assert all(("error" in p) == member for p in failed)
    assert "input_value=" in failed[0].get("error", "input_value=")  # pydantic quotes the input
    progress = [e["payload"] for e in events if e["type"] == "tool.progress"]
    assert progress and all(("message" in p) == member for p in progress)
    assert all(p["label"] == "progressive" for p in progress)


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_cli_reads_show_tool_detail_texts_to_members_only(tmp_path: Path, role: str) -> None:
    token = uuid.uuid4().hex[:12]
    marks = tool_markers(token)
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    tools = ("--tools", "support.served:SERVER_TOOLS")
    ran = cli("run", f"toolcanary {token}", "--model", "fake:toolcanary", "--cot", "surface",
              *tools, "--db", db, "--json")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    outputs = {
        " ".join(args): cli(*args, run_id, "--db", db, "--view-as", role)
        for args in (["events"], ["events", "--json"], ["status"], ["status", "--json"])
    }
    for command, done in outputs.items():
        assert done.returncode == 0, (command, done.stderr)
        for mark in marks.values():
            expected = role == "member" and command.startswith("events")
            assert (mark in done.stdout) == expected, (command, role, mark)
    viewer_events = json.loads(outputs["events --json"].stdout)
    kinds = [e["payload"]["error_kind"] for e in viewer_events if e["type"] == "tool.failed"]
    assert kinds == ["invalid_arguments", "tool_error"]


@pytest.mark.parametrize("role", list(Role))
async def test_mcp_answers_carry_no_tool_detail(role: Role) -> None:
    token = uuid.uuid4().hex[:12]
    tools = McpTools(Runtime(MemoryStore(), tools=server_tools()), role)
    view = await tools.run(
        f"toolcanary {token}", model="fake:toolcanary", chain_of_thought="surface"
    )
    text = json.dumps(view.to_json())
    assert view.tasks[0].output == "The tools have spoken."
    assert not any(mark in text for mark in tool_markers(token).values())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("role", list(Role))
async def test_cli_follow_shows_reasoning_and_tool_data_only_where_allowed(
    role: Role, mode: str
) -> None:
    """``thoughtgate events RUN --follow`` on a local store (``StoreReader.follow``): the only
    CLI read no other test follows as every role. It filters each event through the reader's
    one filter, resolved once per run (ADR 0143), as the live stream does."""
    from thoughtgate.cli.readers import StoreReader

    token = uuid.uuid4().hex[:12]
    runtime = Runtime(MemoryStore(), tools=server_tools())
    view = await McpTools(runtime, Role.OWNER).run(
        f"canary {token}", model="fake:canary", chain_of_thought=mode
    )
    assert view.status == "completed", view
    mark = markers(token)
    followed = [e async for e in StoreReader(runtime.store, role).follow(view.run_id)]
    text = json.dumps([e.payload for e in followed])
    assert followed and is_run_terminal(followed[-1].type)  # followed to its end
    assert (mark["reasoning"] in text) == (mode == "surface" and role >= Role.DEVELOPER)
    assert (mark["tool"] in text) == (role >= Role.MEMBER)
    assert mark["carrier"] not in text


# --------------------------------------------------------------------------- billed token counts

RUN_OUTPUT = "16300007"
"""The ``tokencanary`` run's output tokens (both turns): every developer's route shows it."""


@pytest.fixture(scope="module")
def billed_runs(daemon: Daemon) -> dict[str, str]:
    """mode -> a finished ``tokencanary`` run (a tool loop billed as reasoning is)."""
    out = {
        mode: daemon.start_run(
            {
                "prompt": "tokens",
                "model": "fake:tokencanary",
                "chain_of_thought": mode,
                "tools": ["lookup"],
            }
        )
        for mode in MODES
    }
    for run_id in out.values():
        assert daemon.wait_done(run_id)["status"] == "completed"
    return out


def _run_finished(body: str) -> dict[str, Any]:
    (finished,) = [e for e in sse_events(body) if e.get("type") == "RUN_FINISHED"]
    return finished


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("role", ROLES)
def test_billed_token_counts_reach_developers_only_on_every_route(
    daemon: Daemon, billed_runs: dict[str, str], role: str, mode: str
) -> None:
    """Output tokens include the reasoning's, input tokens the signed thinking sent back: no
    billed count of a run reaches a viewer or member on any route -- the run list, the run view,
    its events and live stream, host metadata, AG-UI's ``RUN_FINISHED`` -- in any mode, and every
    one reaches a developer (ADR 0163)."""
    run_id = billed_runs[mode]
    developer = parse_role(role) >= Role.DEVELOPER
    bodies = _bodies(daemon, run_id, role)
    for route in ("runs", "run", "events", "stream", "host-metadata", "agui"):
        status, body = bodies[route]
        where = f"{route} as {role} on a {mode} run"
        assert status == 200, where
        if developer:
            assert RUN_OUTPUT in body, where
        else:
            assert not {c for c in billed_canaries() if c in body}, where
    finished = _run_finished(bodies["agui"][1])
    if developer:
        assert finished["usage"][0]["outputTokens"] == int(RUN_OUTPUT)
    else:
        assert not finished.get("usage"), finished


@pytest.mark.parametrize("role", ["viewer", "member", "developer"])
def test_the_cli_with_a_remote_key_says_billed_counts_are_withheld(
    daemon: Daemon, billed_runs: dict[str, str], role: str
) -> None:
    """``thoughtgate status RUN`` against the daemon: a developer reads ``in … · out …``; a
    viewer or member reads that the counts are withheld, never a zero, ``None`` or a count."""
    run_id = billed_runs["surface"]
    done = cli("status", run_id, "--url", daemon.base_url, "--key", daemon.keys[role])
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.strip("│ ").startswith("usage ")]
    if role == "developer":
        assert f"out {RUN_OUTPUT}" in line and "in 14300003" in line, line
    else:
        assert "withheld" in line, line
        assert "None" not in line and " 0" not in line, line
        assert not {c for c in billed_canaries() if c in done.stdout}


@pytest.mark.parametrize("role", list(Role))
async def test_mcp_run_views_carry_billed_counts_to_developers_only(role: Role) -> None:
    tools = McpTools(Runtime(MemoryStore(), tools=server_tools()), role)
    view = await tools.run("tokens", model="fake:tokencanary", chain_of_thought="surface")
    assert view.status == "completed", view
    text = json.dumps(view.to_json())
    seen = {c for c in billed_canaries() if c in text}
    assert (RUN_OUTPUT in seen) if role >= Role.DEVELOPER else not seen, text
