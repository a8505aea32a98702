"""Stored rows to events: the column-wise builder gives what one ``Event(...)`` per row gives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.events.payloads import upgrade_payload
from thoughtgate.events.schema import EVENT_VERSION, Event, EventType, NewEvent
from thoughtgate.store import codec

pytestmark = pytest.mark.unit

Row = tuple[int, str | None, str, float, str, int]

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
_types = st.sampled_from(
    [EventType.MESSAGE_DELTA, EventType.TOOL_FAILED, EventType.AGENT_RESPONSE, "x.undeclared"]
)


def one_by_one(run_id: str, rows: list[Row]) -> list[Event]:
    """The plain construction the builder must match: decode, upgrade, ``Event(...)``."""
    out = []
    for seq, task_id, type_, ts, text, v in rows:
        payload: Any = codec.decode_object(text)
        out.append(
            Event(
                seq,
                run_id,
                type_,
                upgrade_payload(type_, v, payload),
                task_id=task_id,
                ts=ts,
                v=EVENT_VERSION,
            )
        )
    return out


@given(
    st.lists(
        st.tuples(
            st.none() | st.text(max_size=5),
            _types,
            st.floats(allow_nan=False, allow_infinity=False),
            st.dictionaries(st.sampled_from(["text", "callId", "error", "k"]), _json, max_size=4),
            st.sampled_from([0, EVENT_VERSION]),
        ),
        max_size=40,  # pages below and above the column-wise threshold
    ),
    st.integers(min_value=0, max_value=10**6),
)
def test_rows_become_the_events_one_construction_per_row_gives(
    columns: list[tuple[str | None, str, float, dict[str, Any], int]], first: int
) -> None:
    rows: list[Row] = [
        (first + i, task_id, type_, ts, codec.dumps(payload), v)
        for i, (task_id, type_, ts, payload, v) in enumerate(columns)
    ]
    got = codec.events_from_rows("run_x", rows)
    assert got == one_by_one("run_x", rows)
    assert all(type(e) is Event for e in got)


@pytest.mark.parametrize("size", [3, 40])
def test_an_older_version_inside_a_page_is_upgraded_alone(size: int) -> None:
    rows: list[Row] = [
        (i, "t", EventType.MESSAGE_DELTA, i + 0.5, f'{{"text":"{i}"}}', EVENT_VERSION)
        for i in range(1, size + 1)
    ]
    rows[1] = (2, "t", EventType.TOOL_FAILED, 2.5, '{"callId":"c1","error":"boom"}', 0)
    got = codec.events_from_rows("run_x", rows)
    assert [e.v for e in got] == [EVENT_VERSION] * size
    assert got[1].payload["call_id"] == "c1" and "callId" not in got[1].payload
    assert [dict(e.payload) for e in (got[0], got[2])] == [{"text": "1"}, {"text": "3"}]
    assert got == one_by_one("run_x", rows)


@pytest.mark.parametrize("size", [0, 1, 3, 40])
def test_appended_events_read_like_stored_ones(size: int) -> None:
    news = [
        NewEvent(EventType.MESSAGE_DELTA, {"text": "é", "i": (i,)}, task_id="t" if i % 2 else None)
        for i in range(size)
    ]
    columns = codec.encode_events(news)
    appended = codec.appended_events("run_x", 7, columns)
    payloads, task_ids, types, ts = columns
    rows: list[Row] = [
        (7 + i, task_ids[i], types[i], ts[i], payloads[i], EVENT_VERSION) for i in range(size)
    ]
    assert appended == codec.events_from_rows("run_x", rows) == one_by_one("run_x", rows)
    assert [e.seq for e in appended] == list(range(7, 7 + size))
    assert [e.payload["i"] for e in appended] == [[i] for i in range(size)]  # as JSON reads back
