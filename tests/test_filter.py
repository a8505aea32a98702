"""The one output filter, for every role and mode, and as a property over any event sequence."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.access.filter import filter_event, filter_events, filter_run
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


SAMPLE = [
    ev(1, "run.started", {"prompt": "p"}),
    ev(2, "reasoning.delta", {"text": MARK}),
    ev(3, "message.delta", {"text": "answer"}),
    ev(
        4,
        "agent.response",
        {
            "answer": "answer",
            "reasoning": MARK,
            "reasoning_chars": 11,
            "reasoning_bytes": 11,
            "reasoning_parts": [{"kind": "reasoning", "text": MARK, "signature": SIG}],
            "continuity": [
                {"carrier": "anthropic.thinking", "data": {"thinking": MARK, "signature": SIG}}
            ],
            "tool_calls": [{"callId": "c1", "name": "f", "input": {"q": TOOL_IN}}],
        },
    ),
    ev(5, "tool.started", {"callId": "c1", "toolKey": "f", "label": "f", "input": {"q": TOOL_IN}}),
    ev(6, "tool.completed", {"callId": "c1", "toolKey": "f", "label": "f", "output": TOOL_OUT}),
    ev(7, "worker.completed", {"mode": "surface", "trace": {"reasoning": MARK}, "turns": 1}),
    ev(8, "message.completed", {"text": "answer"}),
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
            filter_event(worker, role, surface="trace")
    else:
        shown = filter_event(worker, role, mode="telemetry_only", surface="trace")
        assert shown is not None and shown.payload["trace"]["reasoning"] == MARK


def test_filter_does_not_modify_its_input() -> None:
    before = blob(SAMPLE)
    filter_events(SAMPLE, "viewer", mode="surface")
    assert blob(SAMPLE) == before


def test_unknown_role_is_an_error() -> None:
    with pytest.raises(UnknownRoleError, match="viewer, member, developer, admin, owner"):
        filter_events(SAMPLE, "superuser")


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_run_view(role: str, mode: str) -> None:
    run = RunRecord("run_1", "p", chain_of_thought=mode, metadata={"note": "x"})
    run.tasks = [TaskRecord("t", "run_1", 0, "p", output="out", reasoning=MARK)]
    view = filter_run(run, role)
    may_see = parse_role(role) >= Role.DEVELOPER and mode == "surface"
    assert (view["tasks"][0]["reasoning"] == MARK) == may_see
    assert view["tasks"][0]["output"] == "out"


TYPES = [
    "reasoning.delta",
    "message.delta",
    "agent.response",
    "tool.started",
    "tool.completed",
    "worker.completed",
    "cot.step",
    "run.started",
]
payload_values = st.recursive(
    st.text(max_size=8) | st.integers() | st.booleans() | st.none(),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "reasoning",
                    "text",
                    "input",
                    "signature",
                    "continuity",
                    "trace",
                    "reasoning_parts",
                    "x",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=10,
)


@st.composite
def event_lists(draw: st.DrawFn) -> list[Event]:
    n = draw(st.integers(0, 20))
    out = []
    for i in range(n):
        payload = draw(
            st.dictionaries(
                st.sampled_from(
                    [
                        "reasoning",
                        "text",
                        "reasoning_parts",
                        "trace",
                        "continuity",
                        "signature",
                        "input",
                        "output",
                        "answer",
                    ]
                ),
                payload_values,
                max_size=5,
            )
        )
        if "reasoning" in payload or draw(st.booleans()):
            payload["reasoning"] = MARK
        out.append(ev(i + 1, draw(st.sampled_from(TYPES)), payload))
    return out


@given(event_lists(), st.sampled_from(ROLE_NAMES), st.sampled_from(MODES))
def test_property_order_kept_and_no_reasoning_below_developer(
    events: list[Event], role: str, mode: str
) -> None:
    shown = filter_events(events, role, mode=mode)
    seqs = [e.seq for e in shown]
    assert seqs == sorted(seqs)
    assert set(seqs) <= {e.seq for e in events}
    dropped = {e.seq for e in events} - set(seqs)
    assert all(e.type == "reasoning.delta" for e in events if e.seq in dropped)
    if parse_role(role) < Role.DEVELOPER or mode != "surface":
        assert MARK not in blob(shown)
        assert not any(e.type == "reasoning.delta" for e in shown)
    text = blob(shown)
    assert '"signature"' not in text and '"trace"' not in text
