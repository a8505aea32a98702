"""Visible steps: the display model, the receipt, the summarizers and the pipeline."""

from __future__ import annotations

import json
import math
import string
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from thoughtgate.access.filter import filter_event
from thoughtgate.config import Config, VisibleReasoningConfig
from thoughtgate.errors import ConfigError
from thoughtgate.events.pipeline import (
    VisibleReasoningPipeline,
    build_summarizers,
    effective_summarizers,
    is_eligible,
    observer_factory,
)
from thoughtgate.events.policy import PolicyContext, StepPolicy
from thoughtgate.events.schema import Event, EventType, NewEvent
from thoughtgate.events.summarizers import (
    CONDENSED_CHARS,
    ModelSummarizer,
    PhasesSummarizer,
    ProviderSummariesSummarizer,
    TaskStarted,
    ToolFinished,
    ToolStarted,
    TurnFinished,
    condense,
    shorten,
)
from thoughtgate.events.visible import (
    MAX_SUMMARY_CHARS,
    SOURCE_NOTES,
    VISIBLE_MARKER,
    VisibleStep,
    build_receipt,
    cot_completed_event,
    cot_phase_event,
    cot_step_event,
    cot_tool_reasoning_event,
    describe_receipt,
    parse_receipt,
    parse_visible_payload,
)
from thoughtgate.providers.base import TurnRequest
from thoughtgate.testing.fake import FakeProvider
from thoughtgate.types import (
    ContinuityBlock,
    ReasoningPart,
    TextDelta,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    Turn,
)

STEP = VisibleStep("vr-1", "Comparing three options", "thinking", 1767000000.0)


def _clock() -> Iterator[float]:
    t = 1767000000.0
    while True:
        t += 1.0
        yield t


def ticking() -> Any:
    it = _clock()
    return lambda: next(it)


def turn(*parts: Any) -> Turn:
    return Turn(tuple(parts), provider="fake", model="m")


# --------------------------------------------------------------------------- display model


def test_step_payload_round_trips_and_carries_the_marker() -> None:
    payload = STEP.to_payload()
    assert payload["marker"] == VISIBLE_MARKER
    assert parse_visible_payload(payload) == STEP
    assert parse_visible_payload(json.loads(json.dumps(payload))) == STEP


@pytest.mark.parametrize(
    "change",
    [
        {"marker": None},
        {"marker": "visible_reasoning_v2"},
        {"step_id": ""},
        {"step_id": 7},
        {"summary": "   "},
        {"summary": "x" * (MAX_SUMMARY_CHARS + 1)},
        {"phase": "pondering"},
        {"ts": "yesterday"},
        {"ts": True},
        {"ts": math.nan},
        {"tool_call_id": 12},
        {"tool_call_id": ""},
        {"source": "raw"},
    ],
)
def test_malformed_or_unmarked_payloads_are_discarded(change: dict[str, Any]) -> None:
    payload = {**STEP.to_payload(), **change}
    if change.get("marker") is None and "marker" in change:
        del payload["marker"]
    assert parse_visible_payload(payload) is None


def test_non_mapping_payloads_are_discarded() -> None:
    for payload in (None, "cot", ["marker", VISIBLE_MARKER], 3):
        assert parse_visible_payload(payload) is None


def test_tool_reasoning_requires_a_card() -> None:
    assert parse_visible_payload(STEP.to_payload(), event_type=EventType.COT_TOOL_REASONING) is None
    with pytest.raises(ValueError, match="tool_call_id"):
        cot_tool_reasoning_event(STEP)
    attached = VisibleStep("vr-2", "Checking fares", "acting", 1.0, tool_call_id="call_1")
    event = cot_tool_reasoning_event(attached, task_id="t1")
    assert event.type == EventType.COT_TOOL_REASONING
    assert event.task_id == "t1"
    assert parse_visible_payload(event.payload, event_type=event.type) == attached


def test_constructors_build_the_four_event_types() -> None:
    assert cot_step_event(STEP).type == EventType.COT_STEP
    assert cot_phase_event(STEP).type == EventType.COT_PHASE
    assert cot_step_event(STEP).ts == STEP.ts
    receipt = build_receipt("surface", raw_reasoning_exists=True, steps_shown=2)
    done = cot_completed_event(receipt, ts=5.0)
    assert done.type == EventType.COT_COMPLETED
    assert done.payload["marker"] == VISIBLE_MARKER
    assert parse_receipt(done.payload) == receipt


def test_receipt_says_what_was_withheld() -> None:
    surface = build_receipt(
        "surface",
        raw_reasoning_exists=True,
        steps_shown=3,
        dropped_by_reason={"credential": 2, "raw_reasoning": 1, "tool_data": 0},
    )
    assert surface.raw_reasoning_visible_to == "developer"
    assert surface.raw_reasoning_surface == "display"
    assert surface.steps_dropped_by_policy == 3
    assert dict(surface.dropped_by_reason) == {"credential": 2, "raw_reasoning": 1}
    telemetry = build_receipt("telemetry_only", raw_reasoning_exists=True, steps_shown=0)
    assert telemetry.raw_reasoning_surface == "trace"
    nothing = build_receipt("surface", raw_reasoning_exists=False, steps_shown=0)
    assert nothing.raw_reasoning_visible_to is None
    assert nothing.raw_reasoning_surface is None


def test_tampered_or_unmarked_receipts_are_discarded() -> None:
    receipt = build_receipt("surface", raw_reasoning_exists=True, steps_shown=1)
    good = cot_completed_event(receipt, ts=1.0).payload
    assert parse_receipt(good) == receipt
    assert parse_receipt({**good, "marker": "nope"}) is None
    body = dict(good["receipt"])
    for change in (
        {"steps_dropped_by_policy": 9},
        {"steps_shown": -1},
        {"raw_reasoning_visible_to": None},
        {"raw_reasoning_exists": "yes"},
        {"summarizers": "phases"},
        {"dropped_by_reason": {"credential": "two"}},
    ):
        assert parse_receipt({**good, "receipt": {**body, **change}}) is None, change
    assert parse_receipt({**good, "receipt": {**body, "future_field": 1}}) == receipt


def test_receipt_names_the_sources_and_the_operators_opt_ins() -> None:
    receipt = build_receipt(
        "surface",
        raw_reasoning_exists=True,
        steps_shown=3,
        phases_shown=4,
        summarizers=("provider_summaries", "narration", "model", "phases"),
        step_sources={"narration": 2, "provider_summary": 1, "phases": 4, "model": 0},
        dropped_by_reason={"credential": 1},
    )
    payload = receipt.to_payload()
    assert payload["step_sources"] == {"narration": 2, "phases": 4, "provider_summary": 1}
    assert payload["notes"] == [SOURCE_NOTES["provider_summaries"], SOURCE_NOTES["model"]]
    assert "The operator chose to show you summaries" in payload["notes"][0]
    assert "never the model's reasoning" in payload["notes"][1]
    good = cot_completed_event(receipt, ts=1.0).payload
    assert parse_receipt(good) == receipt
    body = dict(good["receipt"])
    for change in (
        {"notes": []},  # an opt-in nobody is told about
        {"notes": [*body["notes"], "made up"]},
        {"step_sources": {"narration": -1}},
        {"step_sources": None},
    ):
        assert parse_receipt({**good, "receipt": {**body, **change}}) is None, change
    legacy = {k: v for k, v in body.items() if k not in ("step_sources", "notes")}
    assert parse_receipt({**good, "receipt": legacy}) is not None  # recorded before the keys
    assert describe_receipt(receipt) == [
        "Steps shown came from notes the agent wrote for you (2), the run's progress (4), the "
        "provider's summaries of the model's reasoning (1), checked by policy.",
        SOURCE_NOTES["provider_summaries"],
        SOURCE_NOTES["model"],
        "The model's reasoning exists; only developers and above can read it.",
        "1 step(s) were withheld by policy (credential ×1).",
    ]
    phases_only = build_receipt("surface", raw_reasoning_exists=False, steps_shown=0)
    assert phases_only.notes == () and describe_receipt(phases_only) == ["No steps were shown."]


@pytest.mark.parametrize("role", ["viewer", "member", "developer", "owner"])
@pytest.mark.parametrize("mode", ["surface", "telemetry_only"])
def test_the_one_output_filter_passes_cot_payloads_unchanged(role: str, mode: str) -> None:
    receipt = build_receipt(mode, raw_reasoning_exists=True, steps_shown=1)
    attached = VisibleStep("vr-2", "Checking fares", "acting", 1.0, tool_call_id="call_1")
    for new in (
        cot_step_event(STEP),
        cot_phase_event(STEP),
        cot_tool_reasoning_event(attached),
        cot_completed_event(receipt, ts=1.0),
    ):
        event = Event(1, "run_1", new.type, new.payload, ts=new.ts)
        seen = filter_event(event, role, mode=mode)
        assert seen is not None
        assert seen.payload == dict(new.payload)


# --------------------------------------------------------------------------- eligibility


def test_eligibility() -> None:
    assert is_eligible(True, "surface")
    assert is_eligible(True, "telemetry_only")
    assert not is_eligible(True, "hidden")
    assert not is_eligible(False, "surface")


def test_phases_alone_by_default_and_telemetry_only_never_shows_provider_summaries() -> None:
    every = ("provider_summaries", "model", "narration", "phases")
    config = VisibleReasoningConfig(summarizers=every)
    assert effective_summarizers(config, "surface") == every
    assert effective_summarizers(config, "telemetry_only") == ("model", "narration", "phases")
    assert effective_summarizers(VisibleReasoningConfig(), "surface") == ("phases",)


def test_for_run_returns_none_when_not_eligible() -> None:
    assert VisibleReasoningPipeline.for_run(Config(), "hidden") is None
    off = Config.from_mapping({"visible_reasoning": {"enabled": False}})
    assert VisibleReasoningPipeline.for_run(off, "surface") is None
    pipeline = VisibleReasoningPipeline.for_run(Config(), "surface")
    assert pipeline is not None
    assert [s.name for s in pipeline.summarizers] == ["phases"]
    assert not pipeline.narrates
    with pytest.raises(ValueError, match="surface or telemetry_only"):
        VisibleReasoningPipeline("hidden", [])


def test_model_summarizer_needs_a_model() -> None:
    with pytest.raises(ConfigError, match="summarizer_model"):
        build_summarizers(["model"])
    built = build_summarizers(["model"], summarizer_model="fake:echo")
    assert isinstance(built[0], ModelSummarizer)
    with pytest.raises(ConfigError):
        build_summarizers(["guess"])


# --------------------------------------------------------------------------- summarizers


def test_condense_prefers_a_bold_title_then_the_first_sentence() -> None:
    assert condense("**Planning the search**\n\nI need to look up fares.") == "Planning the search"
    assert condense("Comparing fares. Then more text.") == "Comparing fares."
    assert condense("  Using `search_fares`  now ") == "Using search_fares now"
    # emphasis that ends inside a word is no title: the first sentence, marks removed
    assert condense("**Comparing com**paring fares. More.") == "Comparing comparing fares."
    assert condense("**Comparing com**`paring` fares.") == "Comparing comparing fares."
    long = "word " * 100
    short = shorten(long.strip())
    assert len(short) <= CONDENSED_CHARS
    assert short.endswith("…")


async def test_provider_summaries_never_read_raw_or_redacted_reasoning() -> None:
    t = turn(
        ReasoningPart("RAW: the user probably wants the cheap fare.", reasoning_kind="raw"),
        ReasoningPart("", reasoning_kind="raw", redacted=True),
        ReasoningPart("opaque", reasoning_kind="encrypted"),
        ReasoningPart(
            "**Weighing fares**\n\nThe cheap fare arrives late.", reasoning_kind="summary"
        ),
        TextPart("Take the 13:25 train."),
    )
    drafts = await ProviderSummariesSummarizer().summarize(TurnFinished(t))
    assert [d.summary for d in drafts] == ["Weighing fares"]
    assert all(d.source == "provider_summary" for d in drafts)
    assert await ProviderSummariesSummarizer().summarize(TaskStarted()) == []


async def test_phases_use_the_tool_name_only() -> None:
    phases = PhasesSummarizer()
    [acting] = await phases.summarize(ToolStarted("call_1", "search_fares"))
    assert acting.summary == "Calling search_fares"
    assert acting.tool_call_id == "call_1"
    [odd] = await phases.summarize(ToolStarted("call_2", "rm -rf /home/alice"))
    assert odd.summary == "Calling a tool"
    [after] = await phases.summarize(ToolFinished("call_1", "search_fares", "failed"))
    assert after.summary == "Handling a problem with search_fares"
    answer = turn(TextPart("Here it is."))
    assert [d.phase for d in await phases.summarize(TurnFinished(answer))] == ["writing"]
    asks_tool = turn(TextPart("Let me check."), ToolCallPart("c", "search_fares", '{"a": 1}'))
    assert await phases.summarize(TurnFinished(asks_tool)) == []


def scripted(reply: str, seen: list[TurnRequest]) -> FakeProvider:
    def script(request: TurnRequest, n: int) -> Iterator[Any]:
        seen.append(request)
        yield TextDelta(reply)

    return FakeProvider(script)


async def test_model_summarizer_reads_what_the_reader_sees_and_never_reasoning() -> None:
    seen: list[TurnRequest] = []
    summarizer = ModelSummarizer(scripted("The agent is recommending the train.", seen))
    t = turn(
        ReasoningPart("I think rail is better because of the transfers."),
        ReasoningPart("**Weighing rail against air**", reasoning_kind="summary"),
        TextPart("Take the train: it avoids two transfers."),
    )
    [draft] = await summarizer.summarize(TurnFinished(t))
    assert draft.summary == "The agent is recommending the train."
    assert draft.source == "model"
    [request] = seen
    assert request.reasoning.enabled is False
    assert request.system and "ONE new sentence" in request.system
    asked = request.messages[0].text
    assert "it avoids two transfers" in asked  # the answer text the reader sees anyway
    assert "rail is better" not in asked and "Weighing" not in asked  # no reasoning of any kind
    call = ToolCallPart("call_9", "search_fares", '{"origin": "Lyon Part-Dieu"}')
    narration = ToolCallPart("call_8", "visible_step", '{"summary": "Fetching fares"}')
    asks = turn(ReasoningPart("Need fares from Lyon Part-Dieu."), narration, call)
    [why] = await summarizer.summarize(ToolStarted("call_9", "search_fares", turn=asks))
    assert why.kind == "tool_reasoning"
    assert why.tool_call_id == "call_9"
    asked = seen[-1].messages[0].text
    assert "Lyon Part-Dieu" not in asked  # never tool arguments, never reasoning
    assert asked.endswith("Tools requested: search_fares")
    assert "visible_step" not in asked


# --------------------------------------------------------------------------- the pipeline


RAW = (
    "The user wants to get from Lyon to Milan next Friday and cares mostly about comfort, so I "
    "will compare rail and air including the transfer costs before recommending one."
)
ARGS = '{"origin": "Lyon Part-Dieu", "destination": "Milano Centrale", "date": "2026-06-12"}'


def pipeline(*, mode: str = "surface", hidden: tuple[str, ...] = (), **kw: Any) -> Any:
    config = VisibleReasoningConfig(**kw)
    built = VisibleReasoningPipeline.for_run(config, mode, hidden_texts=hidden, clock=ticking())
    assert built is not None
    return built


def payloads(events: list[NewEvent]) -> list[tuple[str, str]]:
    return [(e.type, e.payload["summary"]) for e in events]


async def test_a_whole_task_produces_ordered_marked_events_and_a_receipt() -> None:
    p = pipeline(summarizers=("provider_summaries", "phases"))
    out: list[NewEvent] = []
    out += await p.task_started("task_1")
    first = turn(
        ReasoningPart(RAW, signature="sig-" + "A" * 40),
        ReasoningPart("**Comparing rail and air**", reasoning_kind="summary"),
        ToolCallPart("call_1", "search_fares", ARGS),
    )
    out += await p.turn_finished(first)
    out += await p.tool_started("call_1", "search_fares", arguments_json=ARGS)
    out += await p.tool_finished("call_1", "search_fares", "completed", result_text='{"n": 3}')
    out += await p.answer_started()
    final = turn(
        ReasoningPart("**Recommending the afternoon train**", reasoning_kind="summary"),
        TextPart("Take the 13:25."),
    )
    out += await p.turn_finished(final)
    out += await p.task_completed()
    out.append(p.completed())
    assert payloads(out[:-1]) == [
        (EventType.COT_PHASE, "Planning"),
        (EventType.COT_STEP, "Comparing rail and air"),
        (EventType.COT_PHASE, "Calling search_fares"),
        (EventType.COT_PHASE, "Reviewing the result of search_fares"),
        (EventType.COT_PHASE, "Writing the answer"),
        (EventType.COT_STEP, "Recommending the afternoon train"),
        (EventType.COT_PHASE, "Done"),
    ]
    assert all(e.payload["marker"] == VISIBLE_MARKER for e in out)
    assert all(e.task_id == "task_1" for e in out)
    ids = [e.payload["step_id"] for e in out[:-1]]
    assert len(set(ids)) == len(ids)
    assert [e.ts for e in out] == sorted(e.ts for e in out)
    receipt = parse_receipt(out[-1].payload)
    assert receipt is not None
    assert receipt.raw_reasoning_exists
    assert receipt.steps_shown == 2
    assert receipt.phases_shown == 5
    assert receipt.steps_dropped_by_policy == 0
    assert dict(receipt.step_sources) == {"phases": 5, "provider_summary": 2}
    assert receipt.notes == (SOURCE_NOTES["provider_summaries"],)


async def test_steps_that_break_the_policy_are_dropped_alone() -> None:
    p = pipeline(
        hidden=("Never mention the partner commission rates or the escalation roster.",),
        summarizers=("provider_summaries", "phases"),
    )
    leaky = turn(
        ReasoningPart(RAW),
        ReasoningPart("Using key sk-ant-api03-" + "x" * 40, reasoning_kind="summary"),
        ReasoningPart(RAW[:90], reasoning_kind="summary"),  # verbatim raw reasoning
        ReasoningPart(
            "Avoid the partner commission rates or the escalation roster", reasoning_kind="summary"
        ),
        ReasoningPart(
            "Fetching https://b.s3.amazonaws.com/k?X-Amz-Signature=ab12", reasoning_kind="summary"
        ),
        ReasoningPart(
            "Searching for Lyon Part-Dieu to Milano Centrale, 2026-06-12", reasoning_kind="summary"
        ),
        ReasoningPart("Comparing rail and air for comfort", reasoning_kind="summary"),
        ToolCallPart("call_1", "search_fares", ARGS),
    )
    events = await p.turn_finished(leaky)
    assert payloads(events) == [(EventType.COT_STEP, "Comparing rail and air for comfort")]
    assert dict(p.receipt.dropped_by_reason) == {
        "credential": 1,
        "raw_reasoning": 1,
        "hidden_prompt": 1,
        "signed_link": 1,
        "tool_data": 1,
    }
    assert p.receipt.steps_dropped_by_policy == 5


async def test_tool_results_and_provider_markers_join_the_policy_context() -> None:
    p = pipeline()
    signature = "EqQBCkYIBRgCKkBz7m4Yx2Qe9Wk3Hn8Rt5Lp1Vc6Jd0"
    block = ContinuityBlock("anthropic.thinking", {"type": "thinking", "signature": signature})
    await p.turn_finished(turn(ReasoningPart("thinking"), block))
    assert p.receipt.opaque_reasoning_exists is False
    result = "The AltaVelocita Express fare includes a seat reservation in the advertised price"
    await p.tool_started("call_1", "search_fares")
    await p.tool_finished("call_1", "search_fares", "completed", result_text=result)
    assert not p.policy.check("Noted: " + result[4:60]).allowed
    assert not p.policy.check(f"the block was {signature}").allowed
    redacted = ContinuityBlock("anthropic.redacted_thinking", {"data": "opaque-bytes-here"})
    await p.turn_finished(turn(ReasoningPart("", redacted=True), redacted))
    assert p.receipt.opaque_reasoning_exists is True


async def test_tool_reasoning_only_for_a_card_that_exists() -> None:
    seen: list[TurnRequest] = []
    provider = scripted("The agent needs live fares to compare prices.", seen)
    p = VisibleReasoningPipeline(
        "surface",
        build_summarizers(["phases", "model"], summarizer_provider=provider),
        clock=ticking(),
    )
    asks = turn(ReasoningPart("I need fares."), ToolCallPart("call_1", "search_fares", ARGS))
    assert await p.turn_finished(asks) == []  # the model explains at the tool, not twice
    events = await p.tool_started("call_1", "search_fares", arguments_json=ARGS)
    assert [e.type for e in events] == [EventType.COT_PHASE, EventType.COT_TOOL_REASONING]
    assert events[1].payload["tool_call_id"] == "call_1"
    assert events[1].payload["source"] == "model"


async def test_model_output_that_repeats_raw_reasoning_is_dropped() -> None:
    seen: list[TurnRequest] = []
    p = VisibleReasoningPipeline(
        "surface",
        build_summarizers(["model"], summarizer_provider=scripted(RAW, seen)),
        clock=ticking(),
    )
    assert await p.turn_finished(turn(ReasoningPart(RAW), TextPart("Rail."))) == []
    assert dict(p.receipt.dropped_by_reason) == {"raw_reasoning": 1}


async def test_a_failing_summarizer_never_blocks_the_others() -> None:
    def broken(request: TurnRequest, n: int) -> Iterator[Any]:
        raise RuntimeError("summarizer down")
        yield  # pragma: no cover

    p = VisibleReasoningPipeline(
        "surface",
        build_summarizers(
            ["model", "provider_summaries", "phases"], summarizer_provider=FakeProvider(broken)
        ),
        clock=ticking(),
    )
    events = await p.turn_finished(
        turn(
            ReasoningPart("raw"),
            ReasoningPart("Picking the fastest train", reasoning_kind="summary"),
            TextPart("Done."),
        )
    )
    assert payloads(events) == [
        (EventType.COT_STEP, "Picking the fastest train"),
        (EventType.COT_PHASE, "Writing the answer"),
    ]
    assert p.receipt.summarizer_failures == 1


async def test_telemetry_only_runs_show_phases_but_no_summaries() -> None:
    p = pipeline(mode="telemetry_only", summarizers=("provider_summaries", "phases"))
    events = await p.turn_finished(
        turn(ReasoningPart("Secret plan summary", reasoning_kind="summary"), TextPart("Hi"))
    )
    assert payloads(events) == [(EventType.COT_PHASE, "Writing the answer")]
    assert p.receipt.raw_reasoning_surface == "trace"


async def test_repeated_phases_collapse_but_distinct_tool_calls_do_not() -> None:
    p = pipeline()
    await p.answer_started()
    assert await p.turn_finished(turn(TextPart("Hi"))) == []  # "writing" already shown
    a = await p.tool_started("call_1", "search_fares")
    b = await p.tool_started("call_2", "search_fares")
    assert len(a) == len(b) == 1


# --------------------------------------------------------------------------- policy properties

_ALNUM = string.ascii_letters + string.digits
_WORDS = st.lists(st.sampled_from(["rail", "fare", "Milan", "the", "now", "3", "to", "check"]))


def _secret_strategy() -> st.SearchStrategy[str]:
    token = st.text(alphabet=_ALNUM, min_size=40, max_size=60)
    upper = st.text(alphabet=string.ascii_uppercase + string.digits, min_size=16, max_size=16)
    return st.one_of(
        token.map(lambda t: f"sk-ant-api03-{t}"),
        token.map(lambda t: f"ghp_{t}"),
        upper.map(lambda t: f"AKIA{t}"),
        token.map(lambda t: f"Bearer {t}"),
        token.map(lambda t: f"https://x.example.com/f?token={t}"),
        token.map(lambda t: f"https://b.s3.amazonaws.com/k?X-Amz-Signature={t}"),
        st.sampled_from(["/etc/shadow", "~/.ssh/id_rsa", "C:\\Users\\bob", "10.1.2.3:5432"]),
    )


@settings(max_examples=150, deadline=None)
@given(before=_WORDS, secret=_secret_strategy(), after=_WORDS)
def test_a_secret_is_dropped_wherever_it_sits(
    before: list[str], secret: str, after: list[str]
) -> None:
    text = " ".join([*before, secret, *after])
    assert not StepPolicy().check(text).allowed


@settings(max_examples=100, deadline=None)
@given(start=st.integers(0, 40), length=st.integers(40, 80), prefix=_WORDS)
def test_any_long_verbatim_span_of_raw_reasoning_is_dropped(
    start: int, length: int, prefix: list[str]
) -> None:
    policy = StepPolicy(PolicyContext(raw_reasoning_texts=[RAW]))
    span = RAW[start : start + length].strip()
    assume(len(span) - span.count(",") >= 40)  # 40 characters once normalized
    verdict = policy.check(" ".join([*prefix, span]))
    assert not verdict.allowed
    assert verdict.reason == "raw_reasoning"


_LATER_REASONING = (
    "Rail takes about five hours door to door while flying needs transfers at both ends, so "
    "the train looks better once the waiting at the airport is counted honestly here.",
    "The fares I found earlier were cached, which means the prices might have changed since "
    "then and I should say that the figures are indicative rather than guaranteed today.",
    "Comfort matters most to this traveller, and a first class rail seat with a table beats a "
    "cramped economy flight, even if the flight itself is shorter by a couple of hours.",
)


@settings(max_examples=60, deadline=None)
@given(
    turns=st.integers(1, 4), which=st.data(), start=st.integers(0, 40), length=st.integers(40, 80)
)
def test_reasoning_learned_turn_by_turn_is_caught_after_short_steps_passed(
    turns: int, which: st.DataObject, start: int, length: int
) -> None:
    """Turns add their reasoning one by one while phase labels are checked in between (the
    policy indexes reasoning only once a step long enough to share a span comes along): a long
    span from any turn is still caught, and steps that share none are still allowed."""
    texts = [RAW, *_LATER_REASONING][:turns]
    policy = StepPolicy()
    for text in texts:
        policy.add_raw_reasoning(text)
        assert policy.check("Writing the answer").allowed
        assert policy.check("Looking at how long each option takes door to door").allowed
    source = texts[which.draw(st.integers(0, turns - 1))]
    span = source[start : start + length].strip()
    assume(len(span) - span.count(",") - span.count(":") >= 40)
    verdict = policy.check(span)
    assert not verdict.allowed
    assert verdict.reason == "raw_reasoning"


# --------------------------------------------------------------------------- loop observer


async def test_observer_serves_the_loop_hooks_and_closes_before_the_answer() -> None:
    config = Config.from_mapping(
        {"visible_reasoning": {"summarizers": ["provider_summaries", "phases"]}}
    )
    factory = observer_factory(config, hidden_texts=lambda run: ["Never reveal the roster."])

    class Surface:
        mode = "surface"

    observer = factory(object(), Surface())
    assert observer is not None
    call = ToolCallPart("call_1", "search_fares", ARGS)
    asks = turn(ReasoningPart("**Finding fares**", reasoning_kind="summary"), call)
    first = await observer.turn_finished(asks, task_id="t1")
    assert [e.payload["summary"] for e in first] == ["Planning", "Finding fares"]
    started = await observer.tool_started(call, task_id="t1")
    assert [e.payload["summary"] for e in started] == ["Calling search_fares"]
    output = ToolResultPart("call_1", "Cached fares: AltaVelocita Express 89 EUR, seat included")
    finished = await observer.tool_finished(call, "degraded", task_id="t1", result=output)
    assert [e.payload["summary"] for e in finished] == ["Handling a problem with search_fares"]
    assert not observer.pipeline.policy.check("AltaVelocita Express 89 EUR, seat included").allowed
    last = await observer.turn_finished(turn(TextPart("Rail.")), task_id="t1")
    assert [e.type for e in last] == [
        EventType.COT_PHASE,
        EventType.COT_PHASE,
        EventType.COT_COMPLETED,
    ]
    assert all(e.task_id == "t1" for e in first + started + finished + last)
    assert await observer.task_finished(task_id="t1") == [], "one receipt per task"
    fresh = factory(object(), Surface())
    assert fresh is not None
    cut = turn(TextPart("Ra"), call)
    cut = Turn(cut.parts, complete=False)
    assert (await fresh.turn_finished(cut, task_id="t2"))[-1].type == EventType.COT_COMPLETED

    class Hidden:
        mode = "hidden"

    assert factory(object(), Hidden()) is None


@given(st.text(alphabet="*_`ab ", max_size=30))
def test_a_step_shows_no_emphasis_mark_even_one_made_by_taking_another_out(text: str) -> None:
    """``_**_x`` lost its ``**`` and showed ``__x``; raw reasoning written so was not known as
    the same words as a summary ``x``, which a viewer then read (ADR 0083's rule)."""
    shown = condense(text)
    assert "**" not in shown and "__" not in shown and "`" not in shown
