"""The one output filter on a sample run, for every role and mode (the property over the whole
vocabulary is in test_visibility_property.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from thoughtgate.access.filter import event_filter, filter_event, filter_events, filter_run
from thoughtgate.access.roles import ROLE_NAMES, Role, parse_role
from thoughtgate.errors import AccessDeniedError, UnknownRoleError
from thoughtgate.events.schema import Event
from thoughtgate.store.records import RunRecord, TaskRecord

MARK = "CANARY-7f3a"
SIG = "SIGNATURE-BYTES-91"
TOOL_IN = "TOOL-INPUT-55"
TOOL_OUT = "TOOL-OUTPUT-66"
MODES = ("hidden", "surface", "telemetry_only")


def ev(seq: int, type_: str, payload: dict[str, Any]) -> Event:
    return Event(seq, "run_1", type_, payload, task_id="task_1", ts=1.0)


_CARD = {"call_id": "c1", "tool_key": "f", "turn": 0, "label": "f"}
_USAGE = {"input_tokens": 1, "output_tokens": 2, "reasoning_tokens": 1, "total_tokens": 3}
SAMPLE = [
    ev(1, "run.started", {"prompt": "p", "model": "fake:x", "tasks": 1}),
    ev(2, "reasoning.delta", {"text": MARK, "reasoning_kind": "raw", "index": 0, "turn": 0}),
    ev(3, "message.delta", {"text": "answer", "turn": 0}),
    ev(
        4,
        "agent.response",
        {
            "turn": 0,
            "answer": "answer",
            "complete": True,
            "finish_reason": "tool_calls",
            "raw_finish_reason": "tool_use",
            "provider": "anthropic",
            "model": "m",
            "usage": _USAGE,
            "reasoning": MARK,
            "reasoning_chars": 11,
            "reasoning_bytes": 11,
            "reasoning_parts": [
                {
                    "kind": "reasoning",
                    "text": MARK,
                    "reasoning_kind": "raw",
                    "provider": "anthropic",
                    "model": "m",
                    "signature": SIG,
                    "redacted": False,
                    "index": 0,
                }
            ],
            "continuity": [
                {
                    "kind": "continuity",
                    "carrier": "anthropic.thinking",
                    "data": {"thinking": MARK, "signature": SIG},
                    "provider": "anthropic",
                    "model": "m",
                }
            ],
            "tool_calls": [{"call_id": "c1", "name": "f", "input": {"q": TOOL_IN}}],
        },
    ),
    ev(5, "tool.started", {**_CARD, "input": {"q": TOOL_IN}}),
    ev(6, "tool.completed", {**_CARD, "output": TOOL_OUT}),
    ev(
        7,
        "worker.completed",
        {
            "mode": "surface",
            "backend": "provider",
            "model": "fake:x",
            "status": "completed",
            "usage": _USAGE,
            "turns": 1,
            "duration_s": 0.1,
            "finish_reason": "stop",
            "trace": {
                "reasoning": MARK,
                "reasoning_chars": 11,
                "reasoning_bytes": 11,
                "continuity": [{"carrier": "anthropic.thinking", "provider": "a", "model": "m"}],
            },
        },
    ),
    ev(8, "message.completed", {"text": "answer", "finish_reason": "stop"}),
]


def blob(events: list[Event]) -> str:
    return json.dumps([e.to_dict() for e in events])


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_display_matrix(role: str, mode: str) -> None:
    shown = blob(filter_events(SAMPLE, role, mode=mode))
    may_see = parse_role(role) >= Role.DEVELOPER and mode == "surface"
    assert (MARK in shown) == may_see
    assert SIG not in shown, "continuity bytes never leave, for any role"
    assert '"present": true' in shown, "readers learn a carrier existed"
    assert "trace" not in shown, "trace metadata is not on display surfaces"
    member_plus = parse_role(role) >= Role.MEMBER
    assert (TOOL_IN in shown) == member_plus
    assert (TOOL_OUT in shown) == member_plus
    assert '"label": "f"' in shown, "a viewer still sees the tool card label"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_trace_surface_is_developer_and_above(role: str) -> None:
    worker = SAMPLE[6]
    if parse_role(role) < Role.DEVELOPER:
        with pytest.raises(AccessDeniedError):
            filter_event(worker, role, mode="telemetry_only", surface="trace")
    else:
        shown = filter_event(worker, role, mode="telemetry_only", surface="trace")
        assert shown is not None and shown.payload["trace"]["reasoning"] == MARK


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", [*MODES, "unknown"])
def test_a_readers_filter_resolved_once_shows_what_filter_event_shows(role: str, mode: str) -> None:
    """A live stream resolves its reader's filter once (``event_filter``), then applies it to
    every event: the same events, the same payloads, the very same objects when seen whole."""
    surfaces = ["display", "trace"] if parse_role(role) >= Role.DEVELOPER else ["display"]
    for surface in surfaces:
        show = event_filter(role, mode=mode, surface=surface)  # type: ignore[arg-type]
        for event in SAMPLE:
            once = show(event)
            each = filter_event(event, role, mode=mode, surface=surface)  # type: ignore[arg-type]
            assert (once is None) == (each is None)
            if once is not None and each is not None:
                assert once.to_dict() == each.to_dict()
                assert (once is event) == (each is event)


def test_filter_does_not_modify_its_input() -> None:
    before = blob(SAMPLE)
    filter_events(SAMPLE, "viewer", mode="surface")
    assert blob(SAMPLE) == before


def test_unknown_role_is_an_error() -> None:
    with pytest.raises(UnknownRoleError, match="viewer, member, developer, admin, owner"):
        filter_events(SAMPLE, "superuser", mode="surface")


def test_mode_is_a_required_argument() -> None:
    with pytest.raises(TypeError, match="mode"):
        filter_event(SAMPLE[1], "owner")  # type: ignore[call-arg]


def test_a_payload_the_reader_sees_whole_is_not_copied() -> None:
    """The hot path: a ``message.delta`` comes back as the very same event for every reader."""
    for role in ROLE_NAMES:
        assert filter_event(SAMPLE[2], role, mode="surface") is SAMPLE[2]
    assert filter_event(SAMPLE[1], "developer", mode="surface") is SAMPLE[1]


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_run_view(role: str, mode: str) -> None:
    run = RunRecord("run_1", "p", chain_of_thought=mode, metadata={"continues": "run_0"})
    run.tasks = [TaskRecord("t", "run_1", 0, "p", output="out", reasoning=MARK)]
    view = filter_run(run, role).to_json()
    may_see = parse_role(role) >= Role.DEVELOPER and mode == "surface"
    assert (view["tasks"][0].get("reasoning") == MARK) == may_see
    assert ("reasoning" in view["tasks"][0]) == may_see, "withheld means absent, never null"
    assert view["tasks"][0]["output"] == "out"
    assert view["metadata"] == {"continues": "run_0"}
