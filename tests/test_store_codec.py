"""Stored rows to events: the column-wise builder gives what one ``Event(...)`` per row gives."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thoughtgate.errors import UsageError
from thoughtgate.events.payloads import upgrade_payload
from thoughtgate.events.schema import EVENT_VERSION, Event, EventType, NewEvent
from thoughtgate.store import codec
from thoughtgate.store.migrations import load_migrations
from thoughtgate.store.postgres import open_runs_query as pg_open_runs_query
from thoughtgate.store.projection import PROJECTED_EVENT_TYPES
from thoughtgate.store.sqlite import open_runs_query as sqlite_open_runs_query

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
    payloads, task_ids, types, ts, _ = columns
    rows: list[Row] = [
        (7 + i, task_ids[i], types[i], ts[i], payloads[i], EVENT_VERSION) for i in range(size)
    ]
    assert appended == codec.events_from_rows("run_x", rows) == one_by_one("run_x", rows)
    assert [e.seq for e in appended] == list(range(7, 7 + size))
    assert [e.payload["i"] for e in appended] == [[i] for i in range(size)]  # as JSON reads back


_stored_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # past 64 bits too: orjson would make those floats
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec="utf-8") | st.sampled_from(["\ud800", "\udfff", "é", "\x00"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(st.lists(st.dictionaries(st.text(max_size=4), _stored_json, max_size=4), max_size=20))
def test_a_page_of_stored_payloads_decodes_to_what_json_reads(
    payloads: list[dict[str, Any]],
) -> None:
    """The page decoder (orjson where it reads as ``json`` does) gives ``json``'s values and
    types: integers past 64 bits stay integers, lone surrogates (stored as escapes) come back."""
    joined = ",".join(codec.dumps(p) for p in payloads).encode("utf-8")
    got = codec.decode_payload_array(joined)
    assert repr(got) == repr([json.loads(codec.dumps(p)) for p in payloads])


@given(
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=2**64, max_value=10**40) | st.integers(max_value=-(2**63) - 1),
    st.integers(min_value=0, max_value=5),
)
def test_a_long_integer_anywhere_in_a_page_is_read_by_json(
    offset: int, big: int, before: int
) -> None:
    """An integer orjson would read as a float is found wherever it starts in the page (the
    decoder looks at every ninth byte first, ADR 0087), and read as ``json`` reads it."""
    payloads = [{"text": "chunk"} for _ in range(before)] + [{"t": "x" * offset, "n": big}]
    joined = ",".join(codec.dumps(p) for p in payloads).encode()
    got = codec.decode_payload_array(joined)
    assert got[-1]["n"] == big and type(got[-1]["n"]) is int


def test_numbers_orjson_reads_differently_are_read_by_json() -> None:
    joined = b'{"big":123456789012345678901234567890},{"neg":-9223372036854775809},{"s":"\\ud800"}'
    got = codec.decode_payload_array(joined)
    assert got == [
        {"big": 123456789012345678901234567890},
        {"neg": -9223372036854775809},
        {"s": "\ud800"},
    ]
    assert type(got[0]["big"]) is int and type(got[1]["neg"]) is int


@given(
    st.lists(
        st.tuples(
            st.none() | st.text(max_size=5),
            _types,
            st.floats(allow_nan=False, allow_infinity=False),
            st.dictionaries(st.sampled_from(["text", "callId", "error", "k"]), _json, max_size=4),
        ),
        min_size=1,
        max_size=40,
    ),
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from([0, EVENT_VERSION]),
)
def test_a_page_of_columns_becomes_the_events_its_rows_give(
    columns: list[tuple[str | None, str, float, dict[str, Any]]], first: int, version: int
) -> None:
    """The aggregate read (one value per column) builds exactly what one ``Event(...)`` per row
    gives, an older vocabulary upgraded."""
    rows: list[Row] = [
        (first + i, task_id, type_, ts, codec.dumps(payload), version)
        for i, (task_id, type_, ts, payload) in enumerate(columns)
    ]
    got = codec.events_from_columns(
        "run_x",
        first,
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
        ",".join(r[4] for r in rows).encode("utf-8"),
        version,
    )
    assert got == one_by_one("run_x", rows)
    assert got is not None and all(type(e) is Event for e in got)


@pytest.mark.parametrize(
    ("seqs", "first", "types"),
    [
        ([1, 3, 2], 1, ["a"] * 3),  # out of order
        ([1, 2, 4], 1, ["a"] * 3),  # a gap
        ([2, 3, 4], 1, ["a"] * 3),  # not from the page's start
        ([1, 2, 3], 1, ["a"] * 2),  # a column short of a value
        (range(2, 5), 1, ["a"] * 3),  # checked by the backend, but from elsewhere
        (range(1, 4), 1, ["a"] * 2),  # ... or short of a value
    ],
)
def test_columns_that_are_not_a_whole_page_in_order_are_refused(
    seqs: list[int] | range, first: int, types: list[str]
) -> None:
    """The caller then reads the page row by row: nothing is handed out out of order."""
    n = len(seqs)
    payloads = ",".join(["{}"] * n).encode()
    got = codec.events_from_columns("run_x", first, seqs, [None] * n, types, [1.0] * n, payloads, 1)
    assert got is None


def test_a_page_whose_numbers_the_backend_checked_is_taken_as_a_range() -> None:
    """SQLite hands over its numbers as a ``range`` (a count and the largest number checked):
    the same events as the numbers listed."""
    n = 5
    payloads = ",".join(codec.dumps({"i": i}) for i in range(n)).encode()
    columns = (["t"] * n, ["a"] * n, [1.5] * n, payloads, EVENT_VERSION)
    listed = codec.events_from_columns("run_x", 3, list(range(3, 3 + n)), *columns)
    ranged = codec.events_from_columns("run_x", 3, range(3, 3 + n), *columns)
    assert ranged is not None and ranged == listed
    assert [e.seq for e in ranged] == [3, 4, 5, 6, 7]


@given(
    st.integers(min_value=0, max_value=2**40),
    st.sets(st.integers(min_value=1, max_value=40), max_size=40),
)
def test_a_page_counted_is_taken_only_when_it_holds_every_number_of_its_range(
    after: int, offsets: set[int]
) -> None:
    """A backend sends a page's count and largest number (ADR 0037, 0127), the numbers being
    unique and after ``after``: the page is taken as ``after + 1 ..`` exactly when no number is
    missing, and a page with a gap is left to the row-by-row read."""
    seqs = sorted(after + k for k in offsets)
    got = codec.page_range(after, len(seqs), seqs[-1] if seqs else None)
    if seqs == list(range(after + 1, after + 1 + len(seqs))) and seqs:
        assert got == range(after + 1, after + 1 + len(seqs))
    else:
        assert got is None


@given(st.lists(st.dictionaries(st.text(max_size=4), _stored_json, max_size=4), max_size=20))
def test_appended_events_carry_what_json_reads_back(payloads: list[dict[str, Any]]) -> None:
    """A live reader gets an appended payload as a replay will read it: ``json``'s values and
    types (integers past 64 bits, lone surrogates), though orjson decodes it."""
    news = [NewEvent(EventType.MESSAGE_DELTA, p) for p in payloads]
    appended = codec.appended_events("run_x", 1, codec.encode_events(news))
    assert repr([e.payload for e in appended]) == repr(
        [json.loads(codec.dumps(p)) for p in payloads]
    )


@pytest.mark.parametrize("bad", [float("nan"), {1, 2}, object()], ids=["nan", "set", "object"])
def test_a_batch_with_a_payload_json_cannot_carry_names_its_event(bad: object) -> None:
    news = [
        NewEvent(EventType.MESSAGE_DELTA, {"text": "fine"}),
        NewEvent(EventType.TOOL_FAILED, {"error": bad}),
    ]
    with pytest.raises(UsageError, match=r"payload of 'tool\.failed' event"):
        codec.encode_events(news)


def test_a_batch_with_a_payload_that_holds_itself_is_refused() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(UsageError, match="not JSON-serializable"):
        codec.encode_events([NewEvent(EventType.MESSAGE_DELTA, loop)])


def test_the_lifecycle_index_holds_every_type_a_check_reads_and_both_migrations_spell_it() -> None:
    """A check reads ``PROJECTED_EVENT_TYPES`` through ``lifecycle_events`` only if the index
    holds all of them; a type added to the projection needs a new migration (ADR 0066). And the
    query repeats the migrations' predicate word for word, or neither planner uses the index."""
    assert set(PROJECTED_EVENT_TYPES) <= set(codec.LIFECYCLE_INDEX_TYPES)
    assert list(codec.LIFECYCLE_INDEX_TYPES) == sorted(codec.LIFECYCLE_INDEX_TYPES)
    for dialect in ("sqlite", "postgres"):
        (migration,) = [m for m in load_migrations(dialect) if m.name == "lifecycle_events"]
        assert f"WHERE {codec.LIFECYCLE_INDEX_PREDICATE};" in migration.sql, dialect
    query, _ = codec.typed_read_sql("?", "run_x", PROJECTED_EVENT_TYPES, after=0, limit=None)
    assert codec.LIFECYCLE_INDEX_PREDICATE in query
    delta_query, _ = codec.typed_read_sql(
        "?", "run_x", [EventType.MESSAGE_DELTA], after=0, limit=None, hint=" INDEXED BY x"
    )
    assert codec.LIFECYCLE_INDEX_PREDICATE not in delta_query and "INDEXED BY" not in delta_query


def test_sqlite_open_run_indexes_name_no_status_and_every_open_run_query_holds_them() -> None:
    """Schema version 12 (ADR 0127) builds SQLite's two open-run indexes on predicates without
    ``status``, spelled as the codec's constants; each of their terms is a term of the predicate
    every open-run query holds, so SQLite keeps using the indexes for those queries (a partial
    index serves a query whose ``WHERE`` holds each term of the index's, word for word)."""
    (migration,) = [m for m in load_migrations("sqlite") if m.version == 12]
    for index, built, queried in (
        (codec.OPEN_RUNS_BY_ID, codec.OPEN_RUN_INDEX_PREDICATE, codec.OPEN_RUN_PREDICATE),
        (codec.LEASED_RUNS_BY_ID, codec.LEASED_RUN_INDEX_PREDICATE, codec.LEASED_RUN_PREDICATE),
    ):
        assert f"CREATE INDEX {index} ON runs (run_id) WHERE {built};" in migration.sql
        assert "status" not in built
        assert set(built.split(" AND ")) <= set(queried.split(" AND ")), index


@pytest.mark.parametrize("expired", [False, True])
def test_both_backends_ask_for_open_runs_as_the_open_run_indexes_are_built(expired: bool) -> None:
    """A planner uses a partial index only for a query whose ``WHERE`` holds its predicate
    (SQLite only word for word, and its ``INDEXED BY`` fails without it): both backends'
    migrations of ``open_runs_by_id`` spell ``OPEN_RUN_PREDICATE``, and both backends'
    ``open_runs`` statements hold it -- a page, a page after a cursor, the expired ones and named
    ones (ADR 0079)."""
    for dialect in ("sqlite", "postgres"):
        (migration,) = [m for m in load_migrations(dialect) if m.name == codec.OPEN_RUNS_BY_ID]
        assert f"WHERE {codec.OPEN_RUN_PREDICATE};" in migration.sql, dialect
    for after in (None, "run_x"):
        for ids in (None, ["run_x"]):
            pg, _ = pg_open_runs_query(limit=5, after=after, expired=expired, run_ids=ids)
            listed = None if ids is None else '["run_x"]'
            lite, _ = sqlite_open_runs_query(
                limit=5, after=after, expired=expired, run_ids=listed, now=1.0
            )
            # The expired read holds leased_runs_by_id's predicate, which begins with the open
            # runs' (ADR 0082): either index serves it.
            predicate = codec.LEASED_RUN_PREDICATE if expired else codec.OPEN_RUN_PREDICATE
            index = codec.LEASED_RUNS_BY_ID if expired else codec.OPEN_RUNS_BY_ID
            assert f"WHERE {predicate} " in pg
            assert f"INDEXED BY {index} " in lite
            assert f"WHERE {predicate} " in lite


def test_both_backends_build_the_leased_runs_index_as_the_expired_read_asks() -> None:
    """Schema version 10 (ADR 0082): ``leased_runs_by_id`` spells ``LEASED_RUN_PREDICATE`` on
    both backends, and PostgreSQL builds it CONCURRENTLY, outside a transaction."""
    for dialect in ("sqlite", "postgres"):
        (migration,) = [m for m in load_migrations(dialect) if m.name == codec.LEASED_RUNS_BY_ID]
        assert migration.version == 10
        assert f"WHERE {codec.LEASED_RUN_PREDICATE};" in migration.sql, dialect
        assert migration.concurrent == (dialect == "postgres")


class _Text(str):
    pass


@given(_stored_json)
def test_a_stored_value_reads_back_as_json_wrote_it(value: Any) -> None:
    """Whoever writes a payload (orjson, or ``json`` where orjson would write it differently),
    reading it back gives what ``json`` wrote: the same values and types, the same key order
    (integers past 64 bits, lone surrogates, ``null`` beside a value)."""
    text = codec.dumps({"v": value, "n": None})
    expected = json.dumps({"v": value, "n": None}, ensure_ascii=False)
    assert repr(json.loads(text)) == repr(json.loads(expected))


def test_values_orjson_would_write_differently_are_written_as_json_writes_them() -> None:
    """Keys that are not strings, subclasses of ``dict`` and ``str``, an integer enum: stored as
    ``json`` stores them, not refused and not changed."""
    import collections
    import enum

    class Level(enum.IntEnum):
        HIGH = 3

    payload = {
        "keys": {1: "a", 2.5: "b", None: "c"},
        "ordered": collections.OrderedDict(b=1, a=2),
        "sub": _Text("x"),
        "level": Level.HIGH,
        "big": 2**70,
    }
    assert json.loads(codec.dumps(payload)) == json.loads(json.dumps(payload))


@pytest.mark.parametrize("bad", [float("inf"), -float("inf")], ids=["inf", "-inf"])
def test_an_infinite_number_is_refused_though_orjson_would_write_null(bad: float) -> None:
    with pytest.raises(UsageError, match="not JSON-serializable"):
        codec.dumps({"x": bad})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@given(value=_json, where=st.integers(min_value=0, max_value=3))
def test_a_number_json_refuses_is_refused_beside_any_none(
    bad: float, value: Any, where: int
) -> None:
    """orjson writes NaN and the infinities as ``null``, as it writes ``None``: a text holding
    ``null`` is kept only when it reads back as the value (ADR 0103), so one of them anywhere in
    a value, beside a ``None`` or not, is still refused as ``json`` refuses it."""
    holders: list[Any] = [
        {"x": bad, "n": None, "v": value},
        [None, value, [bad]],
        {"deep": [{"n": None}, {"x": [value, bad]}]},
        {"null": "null", "x": bad},
    ]
    with pytest.raises(UsageError, match="not JSON-serializable"):
        codec.dumps(holders[where])


@given(_json)
def test_a_value_holding_none_is_written_as_json_reads_it(value: Any) -> None:
    """A run's event (no task id) and most payloads hold a ``None``: their text reads back as
    the value, with ``json``'s types, whoever wrote it."""
    for holder in ({"task_id": None, "v": value}, [value, None], {"text": "null", "v": value}):
        text = codec.dumps(holder)
        assert repr(json.loads(text)) == repr(json.loads(json.dumps(holder, ensure_ascii=False)))


def test_a_tuple_beside_none_is_written_by_json_as_before() -> None:
    """orjson's text of a tuple reads back as a list, not the value: ``json`` writes it, as it
    did before (the same text either way)."""
    assert codec.dumps({"pair": (1, "a"), "n": None}) == '{"pair":[1,"a"],"n":null}'


@given(st.lists(st.floats(allow_nan=False) | st.integers(-(2**53), 2**53), max_size=20))
def test_a_batch_sends_postgresql_every_time_exactly(stamps: list[float]) -> None:
    """The times travel as text: each reads back as the very float it was (PostgreSQL reads
    the shortest digits exactly, as Python does); an infinity as ``repr`` spells it."""
    from thoughtgate.store.postgres import _batch_params  # pyright: ignore[reportPrivateUsage]

    n = len(stamps)
    text = _batch_params(["{}"] * n, [None] * n, ["t"] * n, stamps, [None] * n)
    sent = text["ts"].split(",") if stamps else []
    assert [float(t) for t in sent] == [float(t) for t in stamps]


@pytest.mark.unit
def test_an_executions_append_statements_are_the_plain_ones_with_the_fence() -> None:
    """ADR 0090: the fenced statements are derived from the plain ones by adding the holder's
    condition beside ``closed_at IS NULL``; a change to the plain statement that moved that
    clause would leave them unfenced without this check."""
    from thoughtgate.store import postgres, sqlite

    fenced = {
        "sqlite": (sqlite._BUMP_SEQ, sqlite._BUMP_HELD_SEQ, "attempts FROM run_specs"),
        **{
            f"postgres, uniform={uniform}, apart={apart}": (
                postgres._STATEMENTS[uniform, False, apart],
                postgres._STATEMENTS[uniform, True, apart],
                "COALESCE(claim, 1)",
            )
            for uniform in (False, True)
            for apart in (False, True)
        },
    }
    for plain, held, attempt in fenced.values():
        assert held.count("AND closed_at IS NULL AND owner = ") == 1
        assert attempt in held and attempt not in plain


_COLUMN_VALUE = st.sampled_from(["", "a", "ab", "t\x1f", "\x1f", "message.delta", "é"]) | st.text(
    max_size=4
)


@given(st.lists(_COLUMN_VALUE, min_size=1, max_size=30), st.integers(min_value=1, max_value=40))
def test_a_joined_column_splits_exactly_as_str_split(values: list[str], n: int) -> None:
    """ADR 0095: a replay page's joined task ids or types come back as ``str.split`` gives them,
    whether the column is one value repeated (then shared, not split) or not, and whatever ``n``
    the page claims: a column a value's separator lengthened is never taken for ``n`` values."""
    for joined in (codec.UNIT.join(values), codec.UNIT.join(values[:1] * n)):
        assert codec.split_column(joined, n) == joined.split(codec.UNIT)
        assert codec.split_column(joined, len(joined.split(codec.UNIT))) == joined.split(codec.UNIT)


@given(st.lists(st.none() | st.sampled_from(["", "task_1"]) | st.text(max_size=3), min_size=1))
def test_a_pages_task_ids_come_back_with_none_where_the_page_lists_it(
    task_ids: list[str | None],
) -> None:
    """No task id travels as ``''`` with its number listed: ``None`` comes back there and only
    there, in a page of one value repeated or not; a listed number outside the page gives a
    list the codec refuses."""
    task_ids = [t if t is None else t.replace(codec.UNIT, "") for t in task_ids]
    joined = codec.UNIT.join("" if t is None else t for t in task_ids)
    first = 41
    nulls = [first + k for k, t in enumerate(task_ids) if t is None]
    assert codec.task_id_column(joined, nulls, first, len(task_ids)) == task_ids
    assert codec.task_id_column(joined, [*nulls, first + len(task_ids)], first, len(task_ids)) == []


@given(st.lists(st.none() | st.sampled_from(["", "task_1"]) | st.text(max_size=3), min_size=1))
def test_a_pages_counted_task_ids_come_back_or_the_page_is_read_by_rows(
    task_ids: list[str | None],
) -> None:
    """SQLite sends no task id as ``''`` and how many are not missing: the ids come back exactly,
    or, when an empty one shares the page with a missing one, ``None`` (read row by row)."""
    task_ids = [t if t is None else t.replace(codec.UNIT, "") for t in task_ids]
    joined = codec.UNIT.join("" if t is None else t for t in task_ids)
    present = sum(t is not None for t in task_ids)
    got = codec.counted_task_ids(joined, len(task_ids), present)
    if "" in task_ids and None in task_ids:
        assert got is None
    else:
        assert got == task_ids


_keys = st.sampled_from(["a", "b", "continuity"])
_objects = st.dictionaries(_keys, st.integers() | st.text())
_parts = st.dictionaries(_keys, st.integers() | st.text(), min_size=1)  # (never an empty part)


@given(st.lists(st.tuples(_objects, st.none() | _parts), min_size=1, max_size=8))
def test_parts_joined_on_the_client_equal_the_parts_spliced_in_the_text(
    events: list[tuple[dict[str, Any], dict[str, Any] | None]],
) -> None:
    """PostgreSQL's page sends the parts kept apart beside the rows (ADR 0160, amendment 3):
    joined to their rows by the client they give exactly the payloads the text splice gives
    (a key both hold -- a carrier's presence and its bytes -- takes the part's value)."""
    rows = [codec.dumps(row) for row, _ in events]
    parts = [None if part is None else codec.dumps(part) for _, part in events]
    spliced = [json.loads(codec.joined_payload(r, p)) for r, p in zip(rows, parts, strict=True)]
    first = 5
    seqs = [first + k for k, p in enumerate(parts) if p is not None]
    joined = ",".join(p for p in parts if p is not None).encode()
    n = len(events)
    got = codec.events_from_columns(
        "run_x",
        first,
        range(first, first + n),
        [None] * n,
        ["t"] * n,
        [1.0] * n,
        ",".join(rows).encode(),
        1,
        (seqs, joined),
    )
    assert got is not None
    assert [e.payload for e in got] == spliced


def test_parts_that_do_not_match_the_page_are_read_row_by_row() -> None:
    """A part numbered outside the page, or parts and numbers not one for one: ``None`` (the
    store then reads the page's rows), never a part joined to another event."""
    rows = b'{"a":1},{"a":2}'

    def page(seqs: list[int], parts: bytes) -> list[Any] | None:
        return codec.events_from_columns(
            "run_x", 1, range(1, 3), [None, None], ["t", "t"], [1.0, 1.0], rows, 1, (seqs, parts)
        )

    assert page([3], b'{"r":1}') is None
    assert page([0], b'{"r":1}') is None
    assert page([1, 2], b'{"r":1}') is None
    assert page([2], b'{"r":1},{"r":2}') is None
    got = page([2], b'{"r":1}')
    assert got is not None and [e.payload for e in got] == [{"a": 1}, {"a": 2, "r": 1}]
