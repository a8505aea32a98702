"""The thread: tool cards, statuses, and reload == live."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thoughtgate.access.filter import filter_events
from thoughtgate.config import Config
from thoughtgate.events.pipeline import VisibleReasoningPipeline
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.events.thread import (
    NoticeItem,
    PhaseItem,
    StepItem,
    ThreadBuilder,
    ToolCard,
    rebuild,
)
from thoughtgate.events.visible import (
    VISIBLE_MARKER,
    VisibleStep,
    build_receipt,
    cot_completed_event,
    cot_phase_event,
    cot_step_event,
    cot_tool_reasoning_event,
)
from thoughtgate.store.memory import MemoryStore
from thoughtgate.store.records import RunRecord
from thoughtgate.types import ReasoningPart, TextPart, ToolCallPart, Turn


def sequenced(news: list[NewEvent], run_id: str = "run_1") -> list[Event]:
    return [
        Event(i, run_id, n.type, n.payload, task_id=n.task_id, ts=n.ts)
        for i, n in enumerate(news, start=1)
    ]


def step(step_id: str, summary: str = "Comparing fares", **kw: Any) -> VisibleStep:
    return VisibleStep(step_id, summary, kw.pop("phase", "thinking"), 1.0, **kw)


def tool(
    etype: str, call_id: str = "c1", *, task_id: str | None = None, **payload: Any
) -> NewEvent:
    card = {"call_id": call_id, "tool_key": "search_fares", "turn": 0, "label": "Search fares"}
    return NewEvent(etype, {**card, **payload}, task_id=task_id)


# --------------------------------------------------------------------------- tool cards


def test_cards_read_the_declared_keys_and_no_aliases() -> None:
    """No producer writes ``callId``, ``toolKey``, ``args`` or ``data``: they mean nothing."""
    news = [
        NewEvent(EventType.TOOL_STARTED, {"callId": "x", "toolKey": "k", "args": {"q": 1}}),
        tool(EventType.TOOL_STARTED, "c2", input={"q": 2}),
        tool(EventType.TOOL_COMPLETED, "c2", output="two", data="ignored"),
    ]
    anonymous, card = rebuild(sequenced(news)).cards
    assert (anonymous.call_id, anonymous.tool_key, anonymous.input) == ("anonymous-1", None, None)
    assert (card.call_id, card.tool_key, card.label) == ("c2", "search_fares", "Search fares")
    assert (card.input, card.output, card.status) == ({"q": 2}, "two", "completed")


@pytest.mark.parametrize("role", ["viewer", "member"])
def test_a_failed_card_shows_a_viewer_its_error_kind_only(role: str) -> None:
    leak = "ToolArgumentsError: input_value='SECRET-ARG'"
    news = [
        tool(EventType.TOOL_STARTED, input={"q": "SECRET-ARG"}),
        tool(EventType.TOOL_FAILED, error=leak, error_kind="invalid_arguments"),
    ]
    shown = filter_events(sequenced(news), role, mode="surface")
    (card,) = rebuild(shown).cards
    assert (card.status, card.error_kind) == ("failed", "invalid_arguments")
    assert card.error == (leak if role == "member" else None)
    assert ("SECRET-ARG" in json.dumps(rebuild(shown).to_dict())) == (role == "member")


# --------------------------------------------------------------------------- statuses


@pytest.mark.parametrize(
    ("events", "status"),
    [
        ([EventType.TOOL_APPROVAL_REQUIRED], "pending"),
        ([EventType.TOOL_STARTED], "executing"),
        ([EventType.TOOL_STARTED, EventType.TOOL_PROGRESS], "executing"),
        ([EventType.TOOL_STARTED, EventType.TOOL_COMPLETED], "completed"),
        ([EventType.TOOL_STARTED, EventType.TOOL_FAILED], "failed"),
        ([EventType.TOOL_STARTED, EventType.TOOL_DEGRADED], "degraded"),
        ([EventType.TOOL_APPROVAL_REQUIRED, EventType.TOOL_APPROVAL_TIMEOUT], "skipped"),
        ([EventType.TOOL_STARTED, EventType.TOOL_COMPLETED, EventType.TOOL_PROGRESS], "completed"),
    ],
)
def test_card_status_follows_tool_events(events: list[str], status: str) -> None:
    view = rebuild(sequenced([tool(t) for t in events]))
    assert [c.status for c in view.cards] == [status]
    assert [c.to_dict()["status"] for c in view.message.tool_calls] == [status]


@pytest.mark.parametrize(
    ("answer", "status"),
    [
        ({"decision": "reject"}, "rejected"),
        ({"decision": "approve"}, "pending"),
    ],
)
def test_approval_answers(answer: dict[str, Any], status: str) -> None:
    news = [
        tool(EventType.TOOL_APPROVAL_REQUIRED),
        tool(EventType.TOOL_APPROVAL_RESPONSE, **answer),
    ]
    assert rebuild(sequenced(news)).cards[0].status == status
    news.append(tool(EventType.TOOL_STARTED))
    if status == "pending":
        assert rebuild(sequenced(news)).cards[0].status == "executing"


def test_tool_failed_is_not_terminal_but_message_completed_is() -> None:
    news = [
        tool(EventType.TOOL_STARTED),
        tool(EventType.TOOL_FAILED, error="timeout", error_kind="tool_error"),
        NewEvent(EventType.MESSAGE_DELTA, {"text": "Sorry, "}),
        NewEvent(EventType.MESSAGE_DELTA, {"text": "no fares."}),
    ]
    view = rebuild(sequenced(news))
    assert view.status == "running"
    assert view.terminal is None
    assert (view.cards[0].error, view.cards[0].error_kind) == ("timeout", "tool_error")
    assert view.message.text == "Sorry, no fares."
    assert not view.message.final
    news.append(NewEvent(EventType.MESSAGE_COMPLETED, {"text": "Sorry, no fares today."}))
    news.append(NewEvent(EventType.RUN_SETTLEMENT_COMPLETED, {}))
    view = rebuild(sequenced(news))
    assert (view.status, view.terminal) == ("completed", EventType.RUN_SETTLEMENT_COMPLETED)
    assert view.message.text == "Sorry, no fares today."
    assert view.message.final


@pytest.mark.parametrize(
    ("etype", "status"),
    [
        (EventType.MESSAGE_PARTIALLY_COMPLETED, "partial"),
        (EventType.RUN_FAILED, "failed"),
        (EventType.RUN_ERROR, "failed"),
        (EventType.RUN_SETTLEMENT_COMPLETED, "completed"),
    ],
)
def test_terminal_events(etype: str, status: str) -> None:
    view = rebuild(sequenced([NewEvent(EventType.MESSAGE_DELTA, {"text": "Hi"}), NewEvent(etype)]))
    assert (view.status, view.terminal, view.message.text) == (status, etype, "Hi")


@pytest.mark.parametrize(
    ("events", "status"),
    [
        (
            [
                (EventType.MESSAGE_COMPLETED, {}),
                (EventType.RUN_SETTLEMENT_COMPLETED, {"status": "partial"}),
            ],
            "partial",
        ),
        (
            [(EventType.MESSAGE_COMPLETED, {}), (EventType.RUN_FAILED, {"status": "failed"})],
            "failed",
        ),
        (
            [
                (EventType.MESSAGE_PARTIALLY_COMPLETED, {}),
                (EventType.RUN_ERROR, {"status": "error"}),
            ],
            "failed",
        ),
        (
            [
                (EventType.MESSAGE_COMPLETED, {}),
                (EventType.RUN_SETTLEMENT_COMPLETED, {"status": "bogus"}),
            ],
            "completed",
        ),
        ([(EventType.MESSAGE_PARTIALLY_COMPLETED, {"status": "completed"})], "partial"),
    ],
)
def test_the_runs_own_verdict_wins_over_its_last_tasks(
    events: list[tuple[str, dict[str, str]]], status: str
) -> None:
    """Task 1 cut, task 2 answered: the run is partial, and so is the thread that shows it."""
    view = rebuild(sequenced([NewEvent(t, p) for t, p in events]))
    assert view.status == status


# --------------------------------------------------------------------------- visible steps


def test_steps_update_in_place_and_keep_think_tool_think_order() -> None:
    news = [
        cot_step_event(step("s1", "Comparing fares")),
        tool(EventType.TOOL_STARTED, "c1"),
        cot_tool_reasoning_event(step("t1", "Fares are needed to compare", tool_call_id="c1")),
        cot_step_event(step("s2", "Weighing arrival times")),
        cot_step_event(step("s1", "Comparing fares and comfort")),
        cot_phase_event(step("p1", "Writing the answer", phase="writing")),
    ]
    view = rebuild(sequenced(news))
    kinds = [type(i).__name__ for i in view.items]
    assert kinds == ["StepItem", "ToolCard", "StepItem", "PhaseItem"]
    assert [s.summary for s in view.steps] == [
        "Comparing fares and comfort",
        "Weighing arrival times",
    ]
    assert [s.summary for s in view.cards[0].reasoning] == ["Fares are needed to compare"]
    assert view.discarded == 0


def test_unmarked_malformed_and_orphan_cot_payloads_are_discarded() -> None:
    good = step("s1").to_payload()
    news = [
        NewEvent(EventType.COT_STEP, {**good, "marker": "something_else"}),
        NewEvent(EventType.COT_STEP, {k: v for k, v in good.items() if k != "marker"}),
        NewEvent(EventType.COT_PHASE, {**good, "phase": "daydreaming"}),
        NewEvent(EventType.COT_TOOL_REASONING, {**good, "tool_call_id": "nobody"}),
        NewEvent(EventType.COT_COMPLETED, {"marker": VISIBLE_MARKER, "receipt": {"x": 1}}),
        NewEvent("cot.unknown", good),
        NewEvent(EventType.COT_STEP, "not a mapping"),  # type: ignore[arg-type]
        NewEvent(EventType.MESSAGE_COMPLETED, {"text": "The answer."}),
    ]
    view = rebuild(sequenced(news))
    assert view.items == ()
    assert view.discarded == 7
    assert view.message.text == "The answer."  # nothing blocks the message


def test_reasoning_is_never_taken_from_tools_or_provider_fields() -> None:
    leak = "I secretly think the cheap fare is a trap"
    news = [
        tool(
            EventType.TOOL_STARTED,
            input={"reasoning": leak, "summary": leak, "marker": VISIBLE_MARKER},
            reasoning=leak,
        ),
        tool(EventType.TOOL_COMPLETED, data={"thinking": leak}, summary=leak),
        NewEvent(EventType.AGENT_RESPONSE, {"reasoning": leak, "reasoning_parts": [leak]}),
        NewEvent(EventType.WORKER_COMPLETED, {"trace": {"reasoning": leak}}),
    ]
    view = rebuild(sequenced(news))
    assert view.steps == ()
    assert view.raw_reasoning is None
    assert all(not isinstance(i, StepItem | PhaseItem) for i in view.items)


def test_raw_reasoning_comes_only_from_reasoning_delta() -> None:
    news = [
        NewEvent(EventType.REASONING_DELTA, {"text": "Rail or "}),
        NewEvent(EventType.REASONING_DELTA, {"text": "air?"}),
    ]
    assert rebuild(sequenced(news)).raw_reasoning == "Rail or air?"


def test_the_capability_notice_is_one_item_updated_in_place() -> None:
    news = [
        NewEvent(EventType.CAPABILITY_RESOLVED, {"chain_of_thought": "hidden"}),
        NewEvent(EventType.CAPABILITY_RESOLVED, {"chain_of_thought": "surface"}),
        NewEvent("plan.step_added", {"title": "an event type nobody writes"}),
        NewEvent("artifact.created", {"name": "fares.csv"}),
    ]
    view = rebuild(sequenced(news))
    [notice] = view.items
    assert isinstance(notice, NoticeItem) and (notice.kind, notice.label) == (
        "capability",
        "Mode: surface",
    )


def test_to_dict_is_json_and_carries_message_tool_calls() -> None:
    news = [
        cot_step_event(step("s1")),
        tool(EventType.TOOL_STARTED, input={"q": "x"}),
        cot_completed_event(build_receipt("surface", raw_reasoning_exists=True, steps_shown=1)),
        NewEvent(EventType.MESSAGE_COMPLETED, {"text": "Done"}),
    ]
    data = json.loads(json.dumps(rebuild(sequenced(news)).to_dict()))
    assert data["message"]["tool_calls"] == [
        {"call_id": "c1", "tool_key": "search_fares", "status": "executing"}
    ]
    assert data["receipt"]["raw_reasoning_visible_to"] == "developer"
    assert [i["kind"] for i in data["items"]] == ["step", "tool"]


def test_wire_dicts_and_events_build_the_same_view() -> None:
    events = sequenced([cot_step_event(step("s1")), tool(EventType.TOOL_STARTED)])
    assert rebuild([e.to_dict() for e in events]) == rebuild(events)


# --------------------------------------------------------------------------- reload == live

CALLS = ["c1", "c2", "c3"]
STEP_IDS = ["s1", "s2", "s3"]


def _cot(kind: str, step_id: str, summary: str, call: str) -> NewEvent:
    if kind == "step":
        return cot_step_event(step(step_id, summary))
    if kind == "phase":
        return cot_phase_event(step(step_id, summary, phase="acting"))
    if kind == "tool_reasoning":
        return cot_tool_reasoning_event(step(step_id, summary, tool_call_id=call))
    if kind == "completed":
        return cot_completed_event(
            build_receipt(
                "surface",
                raw_reasoning_exists=True,
                steps_shown=1,
                summarizers=("provider_summaries", "narration", "phases"),
                step_sources={"narration": 1, summary: 0},
            )
        )
    return NewEvent(EventType.COT_STEP, {"summary": summary})  # unmarked


def _tool(etype: str, call: str, value: str, turn: Any = 0, task: str | None = None) -> NewEvent:
    payload: dict[str, Any] = {"call_id": call, "tool_key": "search_fares", "turn": turn}
    payload["label"] = f"Searching {value}"
    if etype in (EventType.TOOL_STARTED, EventType.TOOL_APPROVAL_REQUIRED):
        payload["input"] = {"q": value}
    if etype in (EventType.TOOL_COMPLETED, EventType.TOOL_DEGRADED):
        payload["output"] = value
    if etype in (EventType.TOOL_FAILED, EventType.TOOL_DEGRADED):
        payload.update(error=f"ValueError: {value}", error_kind="tool_error")
    if etype == EventType.TOOL_APPROVAL_RESPONSE:
        payload.update(decision="reject" if value == "no" else "approve", by="alice")
    if etype == EventType.TOOL_PROGRESS:
        payload["message"] = value
    return NewEvent(etype, payload, task_id=task)


def _response(turn: Any, task: str | None, usage: Any, timing: Any, error: Any) -> NewEvent:
    """An ``agent.response`` with well- and ill-typed fields (a reader keeps only the typed)."""
    payload: dict[str, Any] = {"turn": turn, "model": "m", "provider": "p", "usage": usage}
    payload["call"] = (
        {"started_at": 10.5, "first_chunk_at": timing, "ended_at": 12}
        if turn != 2
        else "not a call"
    )
    payload["finish_reason"] = "stop"
    payload["tool_calls"] = [{"call_id": "c1", "name": "t", "input": {}}] if turn == 1 else "x"
    if error is not None:
        payload.update(error=error, error_type=error.split(":")[0])
    return NewEvent(EventType.AGENT_RESPONSE, payload, task_id=task)


TOOL_TYPES = [
    EventType.TOOL_STARTED,
    EventType.TOOL_PROGRESS,
    EventType.TOOL_APPROVAL_REQUIRED,
    EventType.TOOL_APPROVAL_RESPONSE,
    EventType.TOOL_APPROVAL_TIMEOUT,
    EventType.TOOL_COMPLETED,
    EventType.TOOL_FAILED,
    EventType.TOOL_DEGRADED,
]
WORDS = st.sampled_from(["fares", "rail", "no", "Milan", "comfort"])

cot_events = st.builds(
    _cot,
    st.sampled_from(["step", "phase", "tool_reasoning", "completed", "bad"]),
    st.sampled_from(STEP_IDS),
    WORDS,
    st.sampled_from(CALLS),
)
TURNS = st.sampled_from([0, 1, 2, None, "1", True])
TASKS = st.sampled_from(["t1", "t2", None])
tool_events = st.builds(
    _tool, st.sampled_from(TOOL_TYPES), st.sampled_from(CALLS), WORDS, TURNS, TASKS
)
turn_events = st.one_of(
    st.builds(
        lambda w, turn, task: NewEvent(
            EventType.MESSAGE_DELTA, {"text": w + " ", "turn": turn}, task_id=task
        ),
        WORDS,
        TURNS,
        TASKS,
    ),
    st.builds(
        _response,
        TURNS,
        TASKS,
        st.sampled_from(
            [
                {"input_tokens": 3, "output_tokens": 5},
                {"input_tokens": 2, "output_tokens": 7, "reasoning_tokens": 4},
                {"input_tokens": True, "output_tokens": "9", "reasoning_tokens": 1.5},
                "not usage",
                None,
            ]
        ),
        st.sampled_from([10.75, 11, None, "1.5", False]),
        st.sampled_from([None, "ProviderHTTPError: Overloaded", "x"]),
    ),
    st.builds(lambda w: NewEvent(EventType.RUN_STARTED, {"prompt": w}), WORDS),
    st.builds(
        lambda etype, status, error: NewEvent(
            etype,
            {"status": status, "error": error, "error_type": "overloaded_error", "reason": 7},
        ),
        st.sampled_from(
            [EventType.RUN_FAILED, EventType.RUN_INTERRUPTED, "run.settlement.completed"]
        ),
        st.sampled_from(["failed", "interrupted", "partial", None]),
        st.sampled_from(["Overloaded", None, 3]),
    ),
)
other_events = st.one_of(
    st.builds(lambda w: NewEvent(EventType.MESSAGE_DELTA, {"text": w + " "}), WORDS),
    st.builds(lambda w: NewEvent(EventType.REASONING_DELTA, {"text": w}), WORDS),
    st.builds(
        lambda w, turn, kind, index, task: NewEvent(
            EventType.REASONING_DELTA,
            {"text": w, "turn": turn, "reasoning_kind": kind, "index": index},
            task_id=task,
        ),
        WORDS,
        st.sampled_from([0, 1, None, "1"]),
        st.sampled_from(["raw", "summary", None, "encrypted"]),
        st.sampled_from([0, 1, None]),
        st.sampled_from(["t1", "t2", None]),
    ),
    st.builds(lambda w: NewEvent(EventType.MESSAGE_COMPLETED, {"text": w}), WORDS),
    st.just(NewEvent(EventType.MESSAGE_PARTIALLY_COMPLETED, {})),
    st.just(NewEvent(EventType.RUN_FAILED, {"error": "x"})),
    st.builds(lambda w: NewEvent(EventType.CAPABILITY_RESOLVED, {"chain_of_thought": w}), WORDS),
    st.builds(lambda w: NewEvent("artifact.updated", {"name": w}), WORDS),
    st.builds(lambda w: NewEvent(EventType.AGENT_RESPONSE, {"reasoning": w}), WORDS),
)
event_lists = st.lists(
    st.one_of(cot_events, tool_events, turn_events, other_events), max_size=30
).map(sequenced)


@settings(max_examples=150, deadline=None)
@given(events=event_lists)
def test_live_build_equals_reload_at_every_point(events: list[Event]) -> None:
    live = ThreadBuilder()  # live: the SSE JSON frames, one at a time
    for i, event in enumerate(events):
        live.feed(json.loads(json.dumps(event.to_dict())))
        assert live.view() == rebuild(events[: i + 1])  # reload: persisted Event objects
    assert live.view() == rebuild(events)


@settings(max_examples=150, deadline=None)
@given(events=event_lists, data=st.data())
def test_resuming_at_any_point_with_overlap_equals_reload(events: list[Event], data: Any) -> None:
    cut = data.draw(st.integers(0, len(events)))
    overlap = data.draw(st.integers(0, cut))
    resumed = ThreadBuilder().feed_all(events[:cut])  # reload of what was persisted so far ...
    resumed.feed_all(events[overlap:])  # ... then live from an earlier Last-Event-ID
    assert resumed.view() == rebuild(events)
    assert resumed.last_seq == (events[-1].seq if events else 0)


@settings(max_examples=150, deadline=None)
@given(
    noise=st.lists(st.one_of(tool_events, other_events), max_size=12),
    where=st.lists(st.integers(0, 12), min_size=3, max_size=3).map(sorted),
)
def test_think_tool_think_order_survives_any_interleaving(
    noise: list[NewEvent], where: list[int]
) -> None:
    skeleton = [
        cot_step_event(step("think-1", "Comparing fares")),
        NewEvent(EventType.TOOL_STARTED, {"call_id": "X", "tool_key": "search_fares"}),
        cot_step_event(step("think-2", "Weighing the results")),
    ]
    news = list(noise)
    for offset, (at, event) in enumerate(zip(where, skeleton, strict=True)):
        news.insert(min(at + offset, len(news)), event)
    view = rebuild(sequenced(news))
    keys = [
        i.step.step_id if isinstance(i, StepItem) else i.call_id
        for i in view.items
        if isinstance(i, StepItem | ToolCard)
    ]
    assert [k for k in keys if k in ("think-1", "X", "think-2")] == ["think-1", "X", "think-2"]


# --------------------------------------------------------------------------- end to end


async def _scripted_run(mode: str) -> list[Event]:
    """What the runtime and tool loop will do: append tool events and the pipeline's output."""
    store = MemoryStore()
    await store.create_run(RunRecord("run_1", "Lyon to Milan?", chain_of_thought=mode))
    narrating = Config.from_mapping({"visible_reasoning": {"summarizers": ["narration", "phases"]}})
    p = VisibleReasoningPipeline.for_run(narrating, mode)
    assert p is not None
    args = '{"origin": "Lyon Part-Dieu", "destination": "Milano Centrale"}'
    first = Turn(
        (
            ReasoningPart("The user wants comfort; compare rail and air."),
            ReasoningPart("**Comparing rail and air**", reasoning_kind="summary", index=1),
            ToolCallPart("call_0", "visible_step", '{"summary": "Comparing rail and air"}'),
            ToolCallPart("call_1", "search_fares", args),
        )
    )
    final = Turn((ReasoningPart("Rail wins."), TextPart("Take the 13:25 train.")))

    async def put(*events: NewEvent) -> None:
        await store.append("run_1", list(events))

    await put(NewEvent(EventType.TASK_STARTED, {}, task_id="t1"))
    await put(*await p.task_started("t1"))
    for part in first.reasoning_parts:
        delta = {"text": part.text, "reasoning_kind": part.reasoning_kind, "index": part.index}
        await put(NewEvent(EventType.REASONING_DELTA, {**delta, "turn": 0}, task_id="t1"))
    await put(*await p.turn_finished(first), *await p.narrated("Comparing rail and air"))
    await put(tool(EventType.TOOL_STARTED, "call_1", input=json.loads(args)))
    await put(*await p.tool_started("call_1", "search_fares", arguments_json=args))
    await put(tool(EventType.TOOL_COMPLETED, "call_1", output='{"offers": 3}'))
    await put(*await p.tool_finished("call_1", "search_fares", "completed", result_text="3"))
    await put(*await p.answer_started())
    await put(NewEvent(EventType.MESSAGE_DELTA, {"text": "Take the 13:25 train."}))
    await put(
        NewEvent(
            EventType.REASONING_DELTA,
            {"text": final.reasoning_text, "reasoning_kind": "raw", "index": 0, "turn": 1},
            task_id="t1",
        )
    )
    await put(*await p.turn_finished(final))
    await put(*await p.task_completed())
    await put(p.completed())
    await put(NewEvent(EventType.MESSAGE_COMPLETED, {"text": "Take the 13:25 train."}))
    return await store.read("run_1")


async def test_each_reader_sees_the_same_steps_and_only_what_their_role_allows() -> None:
    events = await _scripted_run("surface")
    developer = rebuild(filter_events(events, "developer", mode="surface"))
    viewer = rebuild(filter_events(events, "viewer", mode="surface"))
    assert developer.steps == viewer.steps
    assert [s.summary for s in viewer.steps] == ["Comparing rail and air"]
    assert [type(i).__name__ for i in viewer.items] == [
        "PhaseItem",  # Planning
        "StepItem",  # think
        "ToolCard",  # tool
        "PhaseItem",  # Calling search_fares
        "PhaseItem",  # Reviewing the result
        "PhaseItem",  # Writing the answer
        "TextItem",  # what the model said
        "PhaseItem",  # Done
    ]
    assert developer.raw_reasoning is not None and "compare rail and air" in developer.raw_reasoning
    assert viewer.raw_reasoning is None and viewer.reasoning_turns == ()
    # one section per model turn, next to that turn's tool call, each part named for what it is
    kinds = [type(i).__name__ for i in developer.items]
    assert kinds.index("ReasoningItem") < kinds.index("ToolCard")
    first, final = developer.reasoning_turns
    assert [(s.label, s.text) for s in first.segments] == [
        ("Raw reasoning", "The user wants comfort; compare rail and air."),
        ("Reasoning (provider summary)", "**Comparing rail and air**"),
    ]
    assert (first.key, first.turn, final.turn) == ("t1:0", 0, 1)
    assert [s.label for s in final.segments] == ["Raw reasoning"]
    assert developer.cards[0].input == {
        "origin": "Lyon Part-Dieu",
        "destination": "Milano Centrale",
    }
    assert (viewer.cards[0].input, viewer.cards[0].output) == (None, None)
    assert viewer.cards[0].status == "completed"
    assert viewer.message.text == "Take the 13:25 train." and viewer.status == "completed"
    assert viewer.receipt is not None and viewer.receipt.raw_reasoning_visible_to == "developer"
    assert viewer.discarded == 0


async def test_telemetry_only_shows_phases_and_no_reasoning_even_to_owners() -> None:
    events = await _scripted_run("telemetry_only")
    owner = rebuild(filter_events(events, "owner", mode="telemetry_only"))
    assert owner.raw_reasoning is None and owner.reasoning_turns == ()
    # narration is written for the reader, not reasoning: it stays; nothing else is a step
    assert [(s.source, s.summary) for s in owner.steps] == [("narration", "Comparing rail and air")]
    assert any(isinstance(i, PhaseItem) for i in owner.items)
    assert owner.receipt is not None and owner.receipt.raw_reasoning_surface == "trace"


def test_text_before_a_tool_call_stays_where_it_was_said() -> None:
    """A turn that says something and then calls a tool keeps its words before the card; the
    answer of the last turn is the message (it no longer swallows the earlier text)."""
    news = [
        NewEvent(EventType.MESSAGE_DELTA, {"text": "Let me ", "turn": 0}, task_id="t1"),
        NewEvent(EventType.MESSAGE_DELTA, {"text": "check.", "turn": 0}, task_id="t1"),
        tool(EventType.TOOL_STARTED, task_id="t1"),
        tool(EventType.TOOL_COMPLETED, output="sunny", task_id="t1"),
        NewEvent(EventType.MESSAGE_DELTA, {"text": "It is sunny.", "turn": 1}, task_id="t1"),
        NewEvent(EventType.MESSAGE_COMPLETED, {"text": "It is sunny."}, task_id="t1"),
    ]
    view = rebuild(sequenced(news))
    assert [(type(i).__name__, getattr(i, "text", None)) for i in view.items] == [
        ("TextItem", "Let me check."),
        ("ToolCard", None),
        ("TextItem", "It is sunny."),
    ]
    assert [(t.key, t.turn) for t in view.said] == [("t1:0", 0), ("t1:1", 1)]
    assert view.message.text == "It is sunny." and view.message.final


def test_items_belong_to_the_turn_they_happened_in() -> None:
    """A step narrated after a turn's response belongs to that turn; a card to the turn that
    called it; nothing before the first turn belongs to one."""
    news = [
        cot_phase_event(step("p0", "Planning", phase="planning"), task_id="t1"),
        NewEvent(EventType.REASONING_DELTA, {"text": "hm", "turn": 0}, task_id="t1"),
        NewEvent(EventType.AGENT_RESPONSE, {"turn": 0}, task_id="t1"),
        cot_step_event(step("s1", "Checking the weather"), task_id="t1"),
        tool(EventType.TOOL_STARTED, task_id="t1"),
        NewEvent(EventType.MESSAGE_DELTA, {"text": "Done.", "turn": 1}, task_id="t1"),
        cot_step_event(step("s1", "Checked the weather"), task_id="t1"),  # updated in place
    ]
    view = rebuild(sequenced(news))
    assert [(type(i).__name__, getattr(i, "turn", "-")) for i in view.items] == [
        ("PhaseItem", None),
        ("ReasoningItem", 0),
        ("StepItem", 0),
        ("ToolCard", 0),
        ("TextItem", 1),
    ]
    assert view.steps[0].summary == "Checked the weather"


def test_turns_ending_and_totals_come_from_the_log_as_the_reader_sees_it() -> None:
    def response(turn: int, usage: dict[str, int], **extra: Any) -> NewEvent:
        payload = {"turn": turn, "model": "anthropic:claude-x", "usage": usage, **extra}
        return NewEvent(EventType.AGENT_RESPONSE, payload, task_id="t1", ts=1000.0 + turn)

    news = [
        NewEvent(EventType.RUN_STARTED, {"prompt": "p"}, ts=999.5),
        response(
            0,
            {"input_tokens": 10, "output_tokens": 20, "reasoning_tokens": 15},
            call={"started_at": 999.5, "first_chunk_at": 999.75, "ended_at": 1000.0},
            finish_reason="tool_use",
            tool_calls=[{"call_id": "c1", "name": "t", "input": {}}],
        ),
        tool(EventType.TOOL_STARTED, task_id="t1"),
        response(
            1,
            {"input_tokens": 40, "output_tokens": 2},
            error="cut",
            error_type="X",
            error_detail="upstream said: no",
        ),
        NewEvent(
            EventType.RUN_FAILED,
            {"status": "failed", "error": "cut", "error_type": "X", "error_detail": "said: no"},
            ts=1002.0,
        ),
    ]
    events = sequenced(news)
    developer = rebuild(events)
    first, second = developer.turns
    assert (first.turn, first.ttft_s, first.duration_s, first.tool_calls) == (0, 0.25, 0.5, 1)
    assert (first.finish_reason, first.ts, second.error, second.error_type) == (
        "tool_use",
        1000.0,
        "cut",
        "X",
    )
    assert (second.started_at, second.ttft_s, second.duration_s) == (None, None, None)
    assert developer.ending is not None and developer.ending.error_type == "X"
    assert developer.totals.to_dict() == {
        "turns": 2,
        "tool_calls": 1,
        "input_tokens": 50,
        "output_tokens": 22,
        "reasoning_tokens": 15,
        "duration_s": 2.5,
    }
    # the failure's own words, as the reader's copy carries them (ADR 0073)
    assert (second.error_detail, developer.ending.error_detail) == ("upstream said: no", "said: no")
    viewer = rebuild(filter_events(events, "viewer", mode="surface"))
    assert viewer.totals.reasoning_tokens is None  # reasoning-class: withheld below developer
    assert viewer.ending is not None and viewer.ending.error_detail is None
    assert all(t.error_detail is None for t in viewer.turns)
    # billed counts include the reasoning's tokens: withheld below developer (ADR 0163), and
    # the totals say so rather than summing nothing to a zero
    assert (viewer.totals.input_tokens, viewer.totals.output_tokens) == (None, None)
    member = rebuild(filter_events(events, "member", mode="surface"))
    assert (member.totals.input_tokens, member.totals.output_tokens) == (None, None)
    hidden = rebuild(filter_events(events, "developer", mode="hidden"))
    assert (hidden.totals.input_tokens, hidden.totals.output_tokens) == (50, 22)
    assert hidden.totals.reasoning_tokens is None


def test_views_are_snapshots() -> None:
    builder = ThreadBuilder()
    builder.feed(sequenced([cot_step_event(step("s1"))])[0])
    before = builder.view()
    builder.feed(Event(2, "run_1", EventType.COT_STEP, step("s2").to_payload()))
    assert len(before.items) == 1
    assert len(builder.view().items) == 2
    assert builder.feed(Event(2, "run_1", EventType.COT_STEP, step("s3").to_payload())) is False
