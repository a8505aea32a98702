"""Property: for any event sequence, role and mode, what the daemon sends (events and SSE frames)
keeps the recorded order, drops only whole ``reasoning.delta`` events, holds no reasoning below
developer (nor outside ``surface``), and never holds a continuity carrier's bytes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thoughtgate.access.filter import filter_event
from thoughtgate.access.roles import ROLE_NAMES, Role, parse_role
from thoughtgate.events.schema import Event, EventType
from thoughtgate.server.sse import encode_event

REASONING = "RSN-MARK"
CARRIER = "CARRIER-MARK"
TOOL = "TOOL-MARK"
MODES = ("hidden", "surface", "telemetry_only", None)
TYPES = [v for k, v in vars(EventType).items() if k.isupper() and isinstance(v, str)]

# where each kind of secret may be planted (any depth, any event type)
REASONING_KEYS = ["reasoning", "reasoning_parts", "reasoning_chars", "trace"]
CARRIER_KEYS = ["signature", "encrypted_content", "encrypted", "redacted_data"]
TOOL_KEYS = ["input", "args", "arguments", "output", "result", "data", "tool_calls"]
PLAIN_KEYS = ["text", "label", "status", "turn", "callId", "answer", "items"]

leaves = st.one_of(st.integers(-3, 3), st.none(), st.sampled_from(["", "ok", "x y"]))


def _holding(mark: str) -> st.SearchStrategy[Any]:
    """A small JSON value that contains ``mark``: bare, in a list, or under a plain key."""
    return st.one_of(
        st.just(mark),
        st.builds(lambda v: [v, "other"], st.just(mark)),
        st.builds(lambda k: {k: mark, "n": 1}, st.sampled_from(PLAIN_KEYS)),
        st.builds(lambda k: [{k: [mark]}], st.sampled_from(PLAIN_KEYS)),
    )


def _secrets(keys: list[str], mark: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(keys), _holding(mark), max_size=2)


continuity = st.lists(
    st.fixed_dictionaries(
        {
            "carrier": st.sampled_from(["anthropic.thinking", "openai.reasoning_item"]),
            "data": _holding(CARRIER),
        }
    ),
    min_size=1,
    max_size=2,
).map(lambda blocks: {"continuity": blocks})

flat_payloads = st.builds(
    lambda plain, rsn, car, cont, tool: {**plain, **rsn, **car, **cont, **tool},
    st.dictionaries(st.sampled_from(PLAIN_KEYS), leaves, max_size=3),
    _secrets(REASONING_KEYS, REASONING),
    _secrets(CARRIER_KEYS, CARRIER),
    st.one_of(st.just({}), continuity),
    _secrets(TOOL_KEYS, TOOL),
)
# secrets may also sit one level down, under a plain key
payload_strategy = st.one_of(
    flat_payloads,
    st.builds(
        lambda k, inner: {k: inner, "status": "ok"}, st.sampled_from(PLAIN_KEYS), flat_payloads
    ),
)


@st.composite
def event_lists(draw: st.DrawFn) -> list[Event]:
    types = draw(st.lists(st.sampled_from(TYPES), max_size=15))
    bodies = draw(st.lists(payload_strategy, min_size=len(types), max_size=len(types)))
    events = []
    for seq, (type_, payload) in enumerate(zip(types, bodies, strict=True), start=1):
        if type_ == EventType.REASONING_DELTA:
            payload = {**payload, "text": REASONING}
        events.append(Event(seq, "run_p", type_, payload, task_id="t" if seq % 2 else None))
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event_lists(), st.sampled_from(ROLE_NAMES), st.sampled_from(MODES))
def test_filtered_stream_keeps_order_and_withholds_what_it_must(
    events: list[Event], role: str, mode: str | None
) -> None:
    kept = [filter_event(e, role, mode=mode) for e in events]
    shown = [e for e in kept if e is not None]
    # order: a subsequence, in recorded order; only whole reasoning.delta events are dropped
    assert [e.seq for e in shown] == sorted(e.seq for e in shown)
    for original, result in zip(events, kept, strict=True):
        if result is None:
            assert original.type == EventType.REASONING_DELTA
        else:
            assert (result.seq, result.type, result.task_id) == (
                original.seq,
                original.type,
                original.task_id,
            )
    frames = [encode_event(e) for e in shown]
    assert [int(f["id"]) for f in frames] == [e.seq for e in shown]
    wire = "\n".join(f["data"] for f in frames)
    assert [json.loads(f["data"]) for f in frames] == [e.to_dict() for e in shown]
    level = parse_role(role)
    if level < Role.DEVELOPER or mode not in ("surface", None):
        assert REASONING not in wire
        assert all(e.type != EventType.REASONING_DELTA for e in shown)
    assert CARRIER not in wire  # never, for any role
    assert '"trace"' not in wire  # trace metadata is for the trace surface only
    if level < Role.MEMBER:
        assert TOOL not in wire


@settings(max_examples=60, deadline=None)
@given(event_lists(), st.sampled_from(["developer", "admin", "owner"]), st.sampled_from(MODES))
def test_trace_surface_never_leaks_carriers(
    events: list[Event], role: str, mode: str | None
) -> None:
    shown = [filter_event(e, role, mode=mode, surface="trace") for e in events]
    wire = json.dumps([e.to_dict() for e in shown if e is not None])
    assert CARRIER not in wire
    assert [e.seq for e in shown if e is not None] == [e.seq for e in events]
