"""Regression tests for the attacks on the one output filter (issue 12), each written as the
attacker tried it: a field no rule names, an unknown mode, the answer, token counts, operator
detail, tool data in error and progress texts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from thoughtgate.access.filter import filter_event, filter_run
from thoughtgate.access.roles import ROLE_NAMES, Role, parse_role
from thoughtgate.events.schema import Event
from thoughtgate.store.records import RunRecord, TaskRecord

SECRET = "CANARY-91c2"
MODES = ("hidden", "surface", "telemetry_only")


def ev(type_: str, payload: dict[str, Any], seq: int = 1) -> Event:
    return Event(seq, "run_a", type_, payload, task_id="task_a", ts=1.0)


def shown(event: Event, role: str, mode: str) -> str:
    out = filter_event(event, role, mode=mode)
    return "" if out is None else json.dumps(out.to_dict())


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_an_unknown_mode_shows_no_reasoning(role: str) -> None:
    delta = ev("reasoning.delta", {"text": SECRET, "reasoning_kind": "raw", "index": 0, "turn": 0})
    assert filter_event(delta, role, mode="surface-ish") is None
    usage = {"input_tokens": 1, "output_tokens": 2, "reasoning_tokens": 9, "total_tokens": 3}
    response = ev("agent.response", {"answer": "a", "reasoning": SECRET, "usage": usage})
    text = shown(response, role, "SURFACE")
    assert SECRET not in text
    assert '"reasoning_tokens"' not in text


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("field", ["thinking", "reasoning_summary", "thoughts"])
def test_a_field_no_declaration_names_is_withheld_on_display(
    role: str, mode: str, field: str
) -> None:
    """A new producer writing a reasoning-like field under a new name leaks to nobody."""
    for type_ in ("agent.response", "message.completed", "tool.completed", "run.started"):
        assert SECRET not in shown(ev(type_, {"text": "ok", field: SECRET}), role, mode), type_
        nested = {"usage": {"input_tokens": 1, field: SECRET}}
        assert SECRET not in shown(ev(type_, nested), role, mode), type_


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_an_unknown_event_type_is_withheld_on_display(role: str, mode: str) -> None:
    assert filter_event(ev("model.thinking", {"text": SECRET}), role, mode=mode) is None


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_the_answer_reaches_every_reader_in_task_completed_and_the_run_view(
    role: str, mode: str
) -> None:
    done = ev(
        "task.completed", {"status": "completed", "output": "The answer is 42.", "error": None}
    )
    assert "The answer is 42." in shown(done, role, mode)
    run = RunRecord("run_a", "p", chain_of_thought=mode)
    run.tasks = [TaskRecord("task_a", "run_a", 0, "p", output="The answer is 42.")]
    assert filter_run(run, role).to_json()["tasks"][0]["output"] == "The answer is 42."


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_reasoning_token_counts_only_where_reasoning_is_shown(role: str, mode: str) -> None:
    usage = {
        "input_tokens": 10,
        "output_tokens": 20,
        "reasoning_tokens": 17,
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "total_tokens": 30,
    }
    may = parse_role(role) >= Role.DEVELOPER and mode == "surface"
    for type_ in ("agent.response", "run.settlement.completed", "worker.completed"):
        out = filter_event(ev(type_, {"usage": usage}), role, mode=mode)
        assert out is not None
        assert ("reasoning_tokens" in out.payload["usage"]) == may, type_
    run = RunRecord("run_a", "p", chain_of_thought=mode, usage=usage)
    run.tasks = [TaskRecord("task_a", "run_a", 0, "p", usage=usage)]
    view = filter_run(run, role).to_json()
    assert ("reasoning_tokens" in view["usage"]) == may
    assert ("reasoning_tokens" in view["tasks"][0]["usage"]) == may


BILLED = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "total_tokens",
)


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", [*MODES, "SURFACE"])
def test_billed_token_counts_reach_developers_only(role: str, mode: str) -> None:
    """Providers bill reasoning as output, and signed thinking or encrypted reasoning sent back in
    a tool loop as input: "output less the answer's tokens" is the reasoning's size, per turn.
    Below developer no billed count is shown, on any event that carries usage and in the run view
    and its tasks; developers and above get every one, in every mode (ADR 0163)."""
    usage = {
        "input_tokens": 7100001,
        "output_tokens": 8100003,
        "reasoning_tokens": 6100005,
        "cache_read_tokens": 5100007,
        "cache_write_tokens": 4100009,
        "total_tokens": 15200004,
    }
    developer = parse_role(role) >= Role.DEVELOPER
    billed = {k: v for k, v in usage.items() if k in BILLED}
    for type_ in (
        "agent.response",
        "worker.completed",
        "task.completed",
        "run.settlement.completed",
        "run.failed",
        "run.error",
        "run.interrupted",
    ):
        out = filter_event(ev(type_, {"usage": usage}), role, mode=mode)
        assert out is not None, type_
        shown = out.payload["usage"]
        assert {k: v for k, v in shown.items() if k in BILLED} == (billed if developer else {})
        if not developer:
            assert shown == {}, type_
    if mode not in MODES:  # a run's record names a known mode
        return
    run = RunRecord("run_a", "p", chain_of_thought=mode, usage=usage)
    run.tasks = [TaskRecord("task_a", "run_a", 0, "p", usage=usage)]
    view = filter_run(run, role).to_json()
    for where in (view["usage"], view["tasks"][0]["usage"]):
        assert {k: v for k, v in where.items() if k in BILLED} == (billed if developer else {})
    if not developer:
        text = json.dumps(view)
        assert not any(str(n) in text for n in usage.values())


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_approver_names_and_daemon_process_only_for_admins(role: str) -> None:
    admin = parse_role(role) >= Role.ADMIN
    answer = ev(
        "tool.approval_response",
        {
            "call_id": "c1",
            "tool_key": "t",
            "turn": 0,
            "label": "t",
            "decision": "approve",
            "by": "alice-laptop-key",
        },
    )
    text = shown(answer, role, "surface")
    assert ("alice-laptop-key" in text) == admin
    assert '"approve"' in text, "every reader learns the decision"
    daemon = {"host": "a1b2c3", "pid": 48213, "instance": "9f0e"}
    run = RunRecord("run_a", "p", chain_of_thought="surface", metadata={"daemon": daemon})
    view = filter_run(run, role).to_json()
    assert ("48213" in json.dumps(view)) == admin


VALIDATION_ERROR = (
    "ToolArgumentsError: 1 validation error for lookup_args\nquery\n  Input should be a valid "
    f"string [type=string_type, input_value={{'nested': '{SECRET}'}}, input_type=dict]"
)


@pytest.mark.parametrize("role", ROLE_NAMES)
@pytest.mark.parametrize("mode", MODES)
def test_tool_data_in_error_and_progress_texts_is_tool_detail(role: str, mode: str) -> None:
    member = parse_role(role) >= Role.MEMBER
    base = {"call_id": "c1", "tool_key": "lookup", "turn": 0, "label": "Lookup"}
    failed = ev(
        "tool.failed", {**base, "error": VALIDATION_ERROR, "error_kind": "invalid_arguments"}
    )
    degraded = ev(
        "tool.degraded",
        {
            **base,
            "output": "cached",
            "error": f"ValueError: bad {SECRET}",
            "error_kind": "tool_error",
        },
    )
    progress = ev("tool.progress", {**base, "message": f"fetching {SECRET}"})
    for event in (failed, degraded, progress):
        text = shown(event, role, mode)
        assert (SECRET in text) == member, event.type
        assert '"Lookup"' in text, "the card's label reaches every reader"
    out = filter_event(failed, role, mode=mode)
    assert out is not None and out.payload["error_kind"] == "invalid_arguments"
