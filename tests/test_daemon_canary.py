"""The canary: unique markers planted in the reasoning, in a continuity carrier and in a tool's
arguments appear only where "Who sees what, where" allows, on every route and every SSE frame,
for every role and every disclosure mode."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from daemon_support import MODES, ROLES, Daemon, markers, running_daemon, sse_events, stream_all

from thoughtgate.access.roles import Role, parse_role


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
    return out


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
        if route in ("runs", "run", "events", "stream", "host-metadata"):
            assert (mark["reasoning"] in body) == display_reasoning, where
        else:
            assert mark["reasoning"] not in body, where
        if route in ("events", "stream"):
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
