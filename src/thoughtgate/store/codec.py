"""Row and JSON codecs shared by the SQL backends, so SQLite and PostgreSQL store the same shapes.

Payloads are stored as compact JSON text exactly as encoded here and decoded with ``json``; a
string (a 1 MB reasoning trace included) comes back character for character. Column order in the
``*_COLUMNS`` tuples is the order of the ``*_row`` tuples and of every ``SELECT`` that feeds the
``*_from_row`` functions.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache
from itertools import repeat
from typing import Any, cast

import orjson

from thoughtgate.access.filter import (
    carrier_presence,
    stored_apart,
    stored_presence,
    task_fields_apart,
)
from thoughtgate.errors import RunNotFoundError, UsageError
from thoughtgate.events.payloads import EVENT_SPECS, RunStatus, TaskStatus, upgrade_payload
from thoughtgate.events.schema import EVENT_VERSION, Event, NewEvent
from thoughtgate.store.durable import RunSpecRecord
from thoughtgate.store.log import RunEnding
from thoughtgate.store.projection import (
    INDEX_EVENT_TYPES,
    IndexUpdate,
    batch_update,
    column_storable,
    encodes_utf8,
    rebuilt,
    refuse_unstorable_columns,
    storable_run,
    storable_task,
    storable_text,
)
from thoughtgate.store.records import OPEN_RUN_STATUSES, ApiKeyRecord, RunRecord, TaskRecord
from thoughtgate.store.run_index import RunChange

__all__ = [
    "EVENT_SELECT",
    "KEY_COLUMNS",
    "LEASED_RUNS_BY_ID",
    "LEASED_RUN_INDEX_PREDICATE",
    "LEASED_RUN_PREDICATE",
    "LIFECYCLE_INDEX",
    "LIFECYCLE_INDEX_PREDICATE",
    "LIFECYCLE_INDEX_TYPES",
    "OPEN_RUNS_BY_ID",
    "OPEN_RUN_INDEX_PREDICATE",
    "OPEN_RUN_PREDICATE",
    "PAYLOAD_SQL",
    "RUN_COLUMNS",
    "RUN_COLUMN_COUNT",
    "SPEC_COLUMNS",
    "SPEC_COLUMN_COUNT",
    "SQLITE_APART",
    "SQLITE_EVENT_SELECT",
    "SQLITE_PAYLOAD_SQL",
    "TASK_COLUMNS",
    "TASK_COLUMNS_SHOWN",
    "TASK_COLUMN_COUNT",
    "TASK_CONFLICT_UPDATE",
    "UNIT",
    "EncodedEvents",
    "apart_types",
    "appended_events",
    "counted_task_ids",
    "decode_object",
    "decode_payload_array",
    "decode_payloads",
    "dumps",
    "encode_events",
    "ending_columns",
    "ending_rows",
    "event_select",
    "events_from_columns",
    "events_from_rows",
    "index_columns",
    "joined_parts",
    "joined_payload",
    "key_from_row",
    "key_row",
    "lifecycle_types_sql",
    "make_event",
    "merged_metadata",
    "moved_apart",
    "no_such_key",
    "no_such_run",
    "open_runs_where",
    "page_range",
    "payload_sql",
    "projected_run_columns",
    "rebuilt_rows",
    "run_from_row",
    "run_row",
    "run_update_columns",
    "runs_from_rows",
    "spec_from_row",
    "spec_row",
    "split_column",
    "task_from_row",
    "task_id_column",
    "task_row",
    "typed_read_sql",
]

RUN_COLUMNS = (
    "run_id, prompt, model, chain_of_thought, worker_backend, status, created_at, updated_at, "
    "usage, error, metadata, owner, lease_expires_at, started_by"
)
RUN_COLUMN_COUNT = RUN_COLUMNS.count(",") + 1
TASK_COLUMNS = (
    "run_id, task_id, idx, prompt, status, output, reasoning, usage, error, model, backend"
)
TASK_COLUMN_COUNT = TASK_COLUMNS.count(",") + 1
TASK_COLUMNS_SHOWN = ", ".join(
    "NULL" if c in task_fields_apart() else c for c in TASK_COLUMNS.split(", ")
)
"""``TASK_COLUMNS`` without the ones a reader who may see none of them leaves unread
(``access.filter.task_fields_apart``: ``reasoning``), ADR 0160."""
TASK_CONFLICT_UPDATE = "ON CONFLICT (run_id, task_id) DO UPDATE SET " + ", ".join(
    f"{c} = EXCLUDED.{c}" for c in TASK_COLUMNS.split(", ")[2:]
)
"""What a task row written again does to the stored one (both stores): every column but its key
takes the new value, in place. SQLite's ``INSERT OR REPLACE`` did the same by deleting the row and
inserting it under a new rowid, which wrote two more table pages and a page of the key's index at
every task's end (ADR 0117)."""
KEY_COLUMNS = "key_id, name, role, key_hash, created_at, revoked_at"
SPEC_COLUMNS = "run_id, spec, key_id, durable, resume, queue, attempts, queued_at, created_at"
SPEC_COLUMN_COUNT = SPEC_COLUMNS.count(",") + 1

_encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _not_serializable(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _make_fast_encoder() -> Callable[[object], str]:
    """The C encoder built once instead of on every call.

    ``JSONEncoder.encode`` rebuilds its C encoder per call, which costs more than encoding a
    typical small event does; appends encode one payload per event, so we keep one. Without
    circular-reference markers, a self-containing payload ends in ``RecursionError`` (caught by
    ``dumps``). Falls back to ``JSONEncoder`` where the C speedups are missing.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return _encoder.encode
    c_encode = make(
        None,  # markers
        _not_serializable,
        json.encoder.c_encode_basestring,  # type: ignore[attr-defined]
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )

    def encode(value: object) -> str:
        return "".join(c_encode(value, 0))

    return encode


_fast_encode = _make_fast_encoder()
_orjson_dumps = orjson.dumps
_orjson_loads = orjson.loads


_ascii_encoder = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False)


_ORJSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
)
"""What orjson would write differently from ``json`` goes to ``default`` (which refuses it, so
``json`` decides): subclasses of ``str``, ``int``, ``dict`` and ``list``, dataclasses, dates."""


def _orjson_refuses(value: object) -> object:
    raise TypeError(type(value).__name__)


def dumps(value: object, *, what: str = "value") -> str:
    """Compact JSON; a value JSON cannot carry (a set, NaN, an object) is the caller's mistake.

    Non-ASCII text is kept as is (compact and readable in the database), except that a string
    holding a lone surrogate, which no database text column can take, is written with ``\\u``
    escapes instead: still valid JSON, and it decodes back to exactly the same string.

    orjson writes it (about a sixth of ``json``'s CPU, ADR 0080), unless it refuses the value or
    its text holds a ``null`` that is not a ``None`` (orjson writes a NaN or an infinity as
    ``null``): then ``json`` writes it as it always did, and so decides every value orjson would
    not write as ``json`` does -- NaN and infinities (refused), integers past 64 bits, keys that
    are not strings, subclasses, lone surrogates, a value that holds itself. Where orjson writes,
    the text reads back as ``json``'s would (a float's digits may be spelled differently:
    ``1e16`` for ``1e+16``); it also writes plain ``Enum`` members and UUIDs, as their value and
    their text, which ``json`` refused, unless their text holds a ``null``.

    A text with ``null`` in it is kept when it reads back equal to the value (ADR 0103): then
    every ``null`` in it is a ``None`` (a NaN or an infinity would read back as ``None``, which
    equals neither), and ``json`` would have written the same value. Most envelopes and payloads
    hold a ``None`` (a run's event has no task id), and reading the text back costs a fraction
    of ``json``'s writing it again.
    """
    try:
        written: str | None = _orjson_dumps(value, _orjson_refuses, _ORJSON_OPTIONS).decode()
    except orjson.JSONEncodeError:
        written = None  # refused: json decides below
    # Looked for in the text, not the bytes: ``bytes.__contains__`` first tries its operand as
    # an integer, raising and clearing a ``TypeError`` on every call, which cost more than
    # orjson's writing the payload (ADR 0087).
    if written is not None and ("null" not in written or _orjson_loads(written) == value):
        return written
    try:
        text = _fast_encode(value)
        if not encodes_utf8(text):
            text = _ascii_encoder.encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise UsageError(f"{what} is not JSON-serializable: {exc}") from exc
    return text


def decode_object(text: str) -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(text))


def decode_payloads(texts: Sequence[str]) -> list[dict[str, Any]]:
    """Decode many payloads with one parser call (several times faster than one call each)."""
    if not texts:
        return []
    return cast(list[dict[str, Any]], json.loads(f"[{','.join(texts)}]"))


_DIGITS = bytes(48 if 48 <= byte <= 57 else 32 for byte in range(256))
"""Every ASCII digit as ``0``, every other byte as a space: a run of digits is a run of zeros."""
_LONG_NUMBER = b"0" * 19
"""19 digits in a row: a number orjson may not read as ``json`` does (integers past 64 bits)."""
_SAMPLE = 9
"""Every ninth byte of a page is looked at first (:func:`_may_hold_a_long_number`)."""


def _may_hold_a_long_number(data: bytes) -> bool:
    """Whether ``data`` may hold 19 digits in a row, from every ninth byte first: any 19
    consecutive positions hold two positions nine apart, both multiples of nine, so such a run
    leaves two digits side by side among the sampled bytes. Without that (a page of text and
    small numbers), there is no such run; with it, the whole page is looked at. The common
    answer costs a quarter of looking at every byte, which cost a third as much as orjson's
    decoding of the page (ADR 0087)."""
    if data[::_SAMPLE].translate(_DIGITS).find(b"00") < 0:
        return False
    return data.translate(_DIGITS).find(_LONG_NUMBER) >= 0


def decode_payload_array(joined: bytes) -> list[dict[str, Any]]:
    """The payloads of a page from their stored JSON texts ``joined`` by ``,`` (UTF-8).

    orjson decodes them from the bytes the database hands over (about half ``json``'s CPU, no
    text decoded first), except what orjson would read differently from ``json``, which has
    always read stored payloads: a run of 19 digits or more (orjson makes integers past 64 bits
    floats) and what orjson refuses (the ``\\u`` escapes of a lone surrogate that ``dumps``
    writes, ``NaN``). Those pages go to ``json``, so the values are ``json``'s either way.
    """
    data = b"".join((b"[", joined, b"]"))  # one copy of the page, not two
    try:
        if not _may_hold_a_long_number(data):
            return cast(list[dict[str, Any]], orjson.loads(data))
    except orjson.JSONDecodeError:
        pass
    return cast(list[dict[str, Any]], json.loads(data))


UNIT = "\x1f"
"""Joins a replay page's task ids, and its types, into one text each (both SQL backends'
aggregates): one value to load instead of one per event."""


def split_column(joined: str, n: int) -> list[str]:
    """The ``n`` values joined by :data:`UNIT` in ``joined``, as ``joined.split(UNIT)`` gives
    them. A column whose values are all one (a page of deltas: one type, one task) is that one
    string ``n`` times: a comparison in C instead of ``n`` new strings to build and free (ADR
    0095). A value holding the separator splits into more than ``n``, which the codec refuses."""
    end = joined.find(UNIT)
    first = joined if end < 0 else joined[:end]
    if len(joined) == n * (len(first) + 1) - 1 and joined == (first + UNIT) * (n - 1) + first:
        return [first] * n
    return joined.split(UNIT)


def task_id_column(
    joined: str, nulls: Iterable[int] | None, first: int, n: int
) -> list[str | None] | list[str]:
    """A page's task ids from their joined text (a ``NULL`` sent as ``''``), with ``None`` back
    at the sequence numbers ``nulls`` lists (``first`` is the page's first number). The codec
    checks the lengths and the numbers; a listed number outside the page leaves it no list it
    would take."""
    ids = split_column(joined, n)
    if not nulls:
        return ids
    out: list[str | None] = list(ids)
    for seq in nulls:
        k = seq - first
        if not 0 <= k < len(out):
            return []
        out[k] = None
    return out


def counted_task_ids(joined: str, n: int, present: int) -> list[str | None] | list[str] | None:
    """A page's task ids from their joined text (a ``NULL`` sent as ``''``) when the page says
    only how many are not ``NULL`` (SQLite, ADR 0095): then every ``''`` is ``None`` if there are
    exactly as many as the ``NULL``s. ``None`` (the page is read row by row) when a task id of
    ``''`` shares a page with a ``NULL`` one."""
    ids = split_column(joined, n)
    if present == n:
        return ids
    if ids.count("") != n - present:
        return None
    out: list[str | None] = [t or None for t in ids]
    return out


def no_such_key(value: str) -> bool:
    """Whether ``value``, an API key's id or hash to look up, holds what no column can (NUL, a
    lone surrogate): no key has it (ids and hashes are thoughtgate's own ASCII), so every store
    answers as for an unknown key, where the drivers would fail on it (a ``StoreError``: a 503
    where an unknown key is a 401)."""
    return not column_storable(value)


def no_such_run(run_id: str) -> None:
    """``RunNotFoundError`` for a run id no store can hold (NUL, a lone surrogate): every store
    refuses one at creation (ADR 0120), so no such run exists, and the drivers would fail on it
    (PostgreSQL's ``text`` refuses NUL, UTF-8 a surrogate) instead of saying so. A look-up by
    id calls it first; an id made by ``new_id`` passes in two C-level scans."""
    if not column_storable(run_id):
        raise RunNotFoundError(run_id)


_Kept = tuple[frozenset[str] | None, frozenset[str], frozenset[str]]
_NOTHING_KEPT: _Kept = (frozenset(), frozenset(), frozenset())


@cache
def _kept_apart(event_type: str) -> _Kept:
    """``(stored_apart, stored_presence, both)`` of ``event_type`` (``access.filter``)."""
    apart, carriers = stored_apart(event_type), stored_presence(event_type)
    return apart, carriers, (apart or frozenset()) | carriers


def _split(event: NewEvent) -> tuple[Mapping[str, Any], Mapping[str, Any] | None]:
    """The payload's row part and its part kept apart (``access.filter.stored_apart``). A
    carrier (``stored_presence``) is kept apart whole and its presence left in the row, under
    the same key: the whole payload repeats that key, the part's value last, and a JSON decoder
    keeps the last (orjson and ``json`` do; so does PostgreSQL's ``jsonb``), ADR 0160 amendment 2."""
    payload = event.payload
    apart, carriers, moved = _kept_apart(event.type)
    if apart is None:
        return {}, (payload or None)
    if not moved or moved.isdisjoint(payload):
        return payload, None
    row: dict[str, Any] = {}
    part: dict[str, Any] = {}
    for key, value in payload.items():
        if key in carriers:
            shown = carrier_presence(key, value)
            row[key] = shown
            if shown != value:  # (a presence, or nothing, stored as is: nothing apart)
                part[key] = value
        elif key in moved:
            part[key] = value
        else:
            row[key] = value
    return row, (part or None)


def _encoded(event: NewEvent, what: str) -> tuple[str, str | None]:
    row, apart = _split(event)
    return dumps(row, what=what), None if apart is None else dumps(apart, what=what)


def encode_events(events: Sequence[NewEvent]) -> EncodedEvents:
    """Column lists ``(payloads, task_ids, types, ts, aparts)``: each payload is encoded exactly
    once, as the part of it the row keeps and the part kept apart (``None``: nothing), ADR 0160.
    A task id or a type no column can hold refuses the batch (``UsageError``, ADR 0114)."""
    task_ids = [e.task_id for e in events]
    types = [e.type for e in events]
    refuse_unstorable_columns(task_ids, types)
    try:
        if all(_kept_apart(t) == _NOTHING_KEPT for t in set(types)):
            # Most batches (answer deltas, tool and lifecycle events) keep nothing apart: each
            # payload is written as before, without the split's calls (the store bench's
            # appends measured them).
            payloads = [dumps(e.payload) for e in events]
            aparts: list[str | None] = [None] * len(events)
        else:
            parts = [_encoded(e, "value") for e in events]
            payloads = [p[0] for p in parts]
            aparts = [p[1] for p in parts]
    except UsageError:  # say which event (building that text for every event would cost)
        for e in events:
            _encoded(e, f"payload of {e.type!r} event")
        raise
    return payloads, task_ids, types, [e.ts for e in events], aparts


@cache
def apart_types() -> tuple[str, ...]:
    """The event types a store keeps something of apart (:func:`_split`: a type kept apart
    whole, fields of a class kept apart, carriers), in order: the only types a row written
    before ADR 0160 may hold reasoning inline in (an undeclared type is stored whole, then and
    now, ADR 0167)."""
    return tuple(sorted(t for t in EVENT_SPECS if _kept_apart(t) != _NOTHING_KEPT))


def moved_apart(event_type: str, payload: str) -> tuple[str, str] | None:
    """A stored payload kept whole in its row (written before ADR 0160) as the store writes it
    now: ``(row, apart)``, the texts :func:`encode_events` would have written for the same
    event, which :func:`joined_payload` (and every read that joins them) makes the same payload
    again. ``None``: nothing of it is kept apart (no reasoning in it, a carrier that is its own
    presence), the row stays as it is. A text that is not a JSON object was not written by this
    codec: ``UsageError`` (the backfill leaves that row alone and names it, ADR 0167)."""
    try:
        decoded = json.loads(payload)
    except ValueError as exc:
        raise UsageError(f"the stored payload is not JSON: {exc}") from None
    if not isinstance(decoded, dict):
        raise UsageError("the stored payload is not a JSON object")
    row, part = _split(NewEvent(event_type, decoded))
    if part is None:
        return None
    return dumps(row, what="the payload's row"), dumps(part, what="the payload's part apart")


def joined_payload(row: str, apart: str | None) -> str:
    """A stored payload whole again: the row's JSON object and the one kept apart, joined as
    :data:`PAYLOAD_SQL` joins them in the database (the keys they share are carriers', whose
    bytes, in the part, come last: :func:`_split`)."""
    if apart is None:
        return row
    if row == "{}":
        return apart
    return f"{row[:-1]},{apart[1:]}"


def joined_parts(
    decoded: Sequence[Mapping[str, Any]], first: int, seqs: Sequence[int], parts: bytes
) -> bool:
    """Each event of ``seqs`` whole again in ``decoded`` (a page's payloads from number
    ``first``, decoded dicts, replaced in place): its row's object updated with its part, as
    :func:`joined_payload` joins their texts (a key both hold is a carrier's: the part's value
    wins, as the last of a repeated key does in the text). ``False`` when the numbers and the
    parts do not match one for one inside the page: the caller reads it row by row."""
    if not seqs:
        return True
    whole = cast(list[dict[str, Any]], decoded)
    found = decode_payload_array(parts)
    if len(found) != len(seqs):
        return False
    n = len(whole)
    for seq, part in zip(seqs, found, strict=True):
        k = seq - first
        if not 0 <= k < n:
            return False
        row = whole[k]
        whole[k] = part if not row else row | part
    return True


_EVENT_FIELDS = ("seq", "run_id", "type", "payload", "task_id", "ts", "v")
if tuple(f.name for f in dataclasses.fields(Event)) != _EVENT_FIELDS or hasattr(
    Event, "__post_init__"
):  # pragma: no cover - guards make_event below against a changed envelope
    raise RuntimeError("Event changed shape; update thoughtgate.store.codec.make_event")
_new_object = object.__new__
_SETTERS = tuple(getattr(Event, name).__set__ for name in _EVENT_FIELDS)
_set_seq, _set_run_id, _set_type, _set_payload, _set_task_id, _set_ts, _set_v = _SETTERS


def make_event(
    seq: int,
    run_id: str,
    type_: str,
    payload: Mapping[str, Any],
    task_id: str | None,
    ts: float,
    v: int = EVENT_VERSION,
) -> Event:
    """``Event(...)`` for the replay hot path, about four times faster.

    A frozen dataclass's ``__init__`` goes through ``object.__setattr__`` once per field; this
    fills the slots directly. The result is indistinguishable from ``Event(...)``; the import-time
    check above keeps it honest if the envelope ever gains a field.
    """
    event: Event = _new_object(Event)
    _set_seq(event, seq)
    _set_run_id(event, run_id)
    _set_type(event, type_)
    _set_payload(event, payload)
    _set_task_id(event, task_id)
    _set_ts(event, ts)
    _set_v(event, v)
    return event


_TEXT = "CAST(payload AS TEXT)"


def payload_sql(part: str, row: str = _TEXT) -> str:
    """An event's whole payload: the row's JSON object (``row``) with ``part``, the one kept
    apart (ADR 0160), spliced in before its closing brace, as :func:`joined_payload` does.
    ``apart IS NULL`` (the row's column): nothing apart -- most events, and every row written
    before. ``row``: PostgreSQL's ``json`` column as text; SQLite's column is text already."""
    text = f"CAST({part} AS TEXT)"
    return (
        f"CASE WHEN apart IS NULL THEN {row} WHEN {row} = '{{}}' THEN {text} "
        f"ELSE substr({row}, 1, length({row}) - 1) || ',' || substr({text}, 2) END"
    )


PAYLOAD_SQL = payload_sql("apart")
"""PostgreSQL's: the part is the row's ``apart`` column, TOASTed out of the row when long (and
detoasted only by a query that reads it)."""
SQLITE_APART = (
    "(SELECT a.apart FROM events_apart a WHERE a.run_id = events.run_id AND a.seq = events.seq)"
)
SQLITE_PAYLOAD_SQL = payload_sql(SQLITE_APART, "payload")
"""SQLite's: the part is a row of ``events_apart`` (the row's ``apart`` is ``1``), looked up for
the events that have one. Not a column of ``events``: that table is clustered on its key
(``WITHOUT ROWID``), and a seek compares whole cells, overflow pages included -- a long value
in the row would be read by every seek that passes it, whoever reads."""


def event_select(*, apart: bool = True, sqlite: bool = False) -> str:
    """The columns ``events_from_rows`` reads: with the part kept apart (the whole payload), or
    without it for a reader :func:`thoughtgate.access.filter.reads_apart` says may see none of
    it, whose bytes are then never read."""
    whole = SQLITE_PAYLOAD_SQL if sqlite else PAYLOAD_SQL
    return f"SELECT seq, task_id, type, ts, {whole if apart else 'payload'}, v FROM events"


EVENT_SELECT = event_select()
SQLITE_EVENT_SELECT = event_select(sqlite=True)

SEQ_MAX = 2**63 - 1
"""The largest sequence number both databases store (a signed 64-bit integer)."""


def page_range(after: int, count: int, last: int | None) -> range | None:
    """A page's sequence numbers from its count and its largest number (SQLite's page, and
    PostgreSQL's ``events_page_counted``): ``count`` unique numbers (the primary key) read from
    ``(after, ...]`` are exactly ``after + 1 .. after + count`` when the largest is
    ``after + count``. ``None`` otherwise (a gap): the caller reads that page row by row."""
    if last is None or last != after + count:
        return None
    return range(after + 1, after + 1 + count)


def seq_page_end(after: int, want: int) -> int:
    """The last sequence number of a page of ``want`` events after ``after``: clamped, because
    a reader may resume from any stored number, up to :data:`SEQ_MAX`, and the bound must still
    bind as a 64-bit integer."""
    return min(after + want, SEQ_MAX)


"""The columns :func:`events_from_rows` reads, in its order."""


EncodedEvents = tuple[list[str], list[str | None], list[str], list[float], list[str | None]]
"""``encode_events`` output: ``(payloads, task_ids, types, ts, aparts)``."""


_COLUMNWISE = 16
"""From this many events on, :func:`_build_events` fills them column by column; below it the
set-up of its seven passes costs more than they save (one or two events: about twice as much)."""


def appended_events(run_id: str, first: int, columns: EncodedEvents) -> list[Event]:
    """Events just appended from ``columns``, numbered from ``first``, as a reader will see them:
    their payloads decoded from the stored text as a replay decodes them
    (:func:`decode_payload_array`: orjson, about half ``json``'s CPU, ADR 0037)."""
    payloads, task_ids, types, ts, aparts = columns
    n = len(payloads)
    if aparts.count(None) != n:
        payloads = list(map(joined_payload, payloads, aparts))
    decoded = decode_payload_array((payloads[0] if n == 1 else ",".join(payloads)).encode())
    if n < _COLUMNWISE:
        return [
            make_event(first + i, run_id, types[i], decoded[i], task_ids[i], ts[i])
            for i in range(n)
        ]
    return _build_events(
        run_id, range(first, first + n), types, decoded, task_ids, ts, repeat(EVENT_VERSION, n)
    )


def events_from_rows(
    run_id: str, rows: Sequence[tuple[int, str | None, str, float, str, int]]
) -> list[Event]:
    """Rows of ``(seq, task_id, type, ts, payload_json, v)`` in order. A payload written in an
    older vocabulary version comes back upgraded to the current one (and says so in ``v``)."""
    if len(rows) < _COLUMNWISE:
        out = []
        for (seq, task_id, type_, ts, _, v), decoded in zip(
            rows, decode_payloads([r[4] for r in rows]), strict=True
        ):
            payload = decoded if v == EVENT_VERSION else upgrade_payload(type_, v, decoded)
            out.append(make_event(seq, run_id, type_, payload, task_id, ts, EVENT_VERSION))
        return out
    seqs, task_ids, types, stamps, texts, versions = zip(*rows, strict=True)
    payloads: Sequence[Mapping[str, Any]] = decode_payloads(texts)
    if versions.count(EVENT_VERSION) != len(versions):
        payloads = [
            p if v == EVENT_VERSION else upgrade_payload(t, v, p)
            for t, v, p in zip(types, versions, payloads, strict=True)
        ]
        versions = (EVENT_VERSION,) * len(versions)
    return _build_events(run_id, seqs, types, payloads, task_ids, stamps, versions)


def events_from_columns(
    run_id: str,
    first: int,
    seqs: Sequence[int],
    task_ids: Sequence[str | None],
    types: Sequence[str],
    ts: Sequence[float],
    payloads: bytes,
    version: int,
    parts: tuple[Sequence[int], bytes] | None = None,
) -> list[Event] | None:
    """A page read as columns, one list per field (a backend's aggregate query), written in
    vocabulary ``version``; ``payloads`` is their stored JSON joined by ``,``
    (:func:`decode_payload_array`). ``seqs`` may be a ``range`` when the backend has checked
    the page's numbers itself (SQLite: a count and a largest number over its primary key).
    ``parts``: the numbers of the events with a part kept apart and those parts, joined the
    same way, each joined to its row's payload here (:func:`joined_parts`), not on the server.

    ``None`` unless ``seqs`` are exactly ``first, first + 1, ...`` and every column has one
    value per event: the caller then reads the page row by row, so a page whose aggregate came
    back in another order, with a gap or short of a value is never handed out as it is.
    """
    n = len(seqs)
    if len(task_ids) != n or len(types) != n or len(ts) != n:
        return None
    expected = range(first, first + n)
    if seqs != (expected if isinstance(seqs, range) else list(expected)):
        return None
    decoded: Sequence[Mapping[str, Any]] = decode_payload_array(payloads)
    if len(decoded) != n:
        return None
    if parts is not None and not joined_parts(decoded, first, *parts):
        return None
    if version != EVENT_VERSION:
        decoded = [upgrade_payload(t, version, p) for t, p in zip(types, decoded, strict=True)]
    return _build_events(run_id, seqs, types, decoded, task_ids, ts, repeat(EVENT_VERSION, n))


class _Filling:
    """An :class:`Event` being filled: the same slots in the same order, without the frozen
    dataclass's ``__setattr__``, so each field is one plain slot store (ADR 0095)."""

    __slots__ = _EVENT_FIELDS


def _build_events(
    run_id: str,
    seqs: Iterable[int],
    types: Sequence[str],
    payloads: Iterable[Mapping[str, Any]],
    task_ids: Iterable[str | None],
    ts: Iterable[float],
    versions: Iterable[int],
) -> list[Event]:
    """:func:`make_event` for whole columns, the replay hot path. Each event is made a
    :class:`_Filling`, filled by plain slot stores, then made an :class:`Event` by setting its
    class: the very object ``Event(...)`` builds (frozen from then on), for about two thirds of
    the instructions of the slot setters run column by column in C (ADR 0095). Python refuses
    the class change unless both classes have as many slots; their order is the envelope's
    (checked above), and a built event is compared with ``Event(...)`` at import (below)."""
    events: list[Event] = []
    append = events.append
    for seq, type_, payload, task_id, stamp, v in zip(
        seqs, types, payloads, task_ids, ts, versions, strict=True
    ):
        event: Any = _new_object(_Filling)
        event.seq = seq
        event.run_id = run_id
        event.type = type_
        event.payload = payload
        event.task_id = task_id
        event.ts = stamp
        event.v = v
        event.__class__ = Event
        append(event)
    return events


if _build_events("r", [7], ["t"], [{}], ["k"], [2.5], [-1]) != [
    Event(7, "r", "t", {}, task_id="k", ts=2.5, v=-1)
]:  # pragma: no cover - guards _build_events against a changed envelope (every field apart)
    raise RuntimeError("Event changed shape; update thoughtgate.store.codec._build_events")


def run_update_columns(change: RunChange, *, updated_at: float | None) -> dict[str, Any]:
    """Column -> value for ``update_run`` (both SQL backends); metadata is merged by the caller
    inside its transaction because it needs the stored value. ``updated_at=None``: left out, for
    a backend that sets it on the database's clock (PostgreSQL, ADR 0066)."""
    sets: dict[str, Any] = {} if updated_at is None else {"updated_at": updated_at}
    if change.get("status") is not None:
        sets["status"] = change["status"]
    usage = change.get("usage")
    if usage is not None:
        sets["usage"] = dumps(usage, what="run usage")
    error = change.get("error")
    if error is not None:
        sets["error"] = storable_text(error)
    return sets


def ending_rows(
    events: Sequence[NewEvent], ending: RunEnding
) -> tuple[EncodedEvents, IndexUpdate, list[tuple[Any, ...]]]:
    """What ``finish_run`` writes besides the run row, in both SQL backends: the encoded
    events, what they change in the index (``store.projection``) and the rows of the tasks the
    ending ends."""
    return encode_events(list(events)), batch_update(events), [task_row(t) for t in ending.tasks]


def ending_columns(ending: RunEnding, *, updated_at: float | None) -> dict[str, Any]:
    """Column -> value for ``finish_run`` (both SQL backends): the ending's fields, and no lease
    (an ended run is held by nobody); ``closed_at`` is the backend's to add (its own clock)."""
    usage = None if ending.usage is None else dict(ending.usage)
    change: RunChange = {"status": ending.status, "usage": usage, "error": ending.error}
    sets = run_update_columns(change, updated_at=updated_at)
    sets["lease_expires_at"] = None
    return sets


def index_columns(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Column -> value for fields of a run or task record that a projected event changes
    (``store.projection.IndexUpdate``): ``index`` is the ``idx`` column, usage is JSON."""
    return {
        "idx" if name == "index" else name: dumps(value, what=name) if name == "usage" else value
        for name, value in fields.items()
    }


def projected_run_columns(run: RunRecord) -> dict[str, Any]:
    """Column -> value for the run fields the log decides (``store.projection``)."""
    return index_columns({"status": run.status, "usage": run.usage, "error": run.error})


def rebuilt_rows(
    stored: RunRecord, event_rows: Sequence[tuple[int, str | None, str, float, str, int]]
) -> tuple[list[tuple[Any, ...]], dict[str, Any] | None]:
    """``rebuild_run_index`` in both SQL backends: from the stored row and its run's lifecycle
    event rows, the task rows to write and the run columns to set (``None``: unchanged)."""
    new = rebuilt(stored, events_from_rows(stored.run_id, event_rows))
    sets = projected_run_columns(new)
    changed = sets != projected_run_columns(stored)
    return [task_row(t) for t in new.tasks], sets if changed else None


def lifecycle_types_sql(
    placeholder: str, types: Iterable[str] = INDEX_EVENT_TYPES
) -> tuple[str, tuple[str, ...]]:
    """``type IN (...)`` over ``types`` and its parameters: by default the event types that
    change the index, what a rebuild reads of a log (never its deltas); ``read_types``' too.
    Never empty: no type at all is ``type IN (NULL)``, which matches nothing."""
    ordered = tuple(sorted(set(types)))
    if not ordered:
        return "type IN (NULL)", ()
    return f"type IN ({', '.join([placeholder] * len(ordered))})", ordered


OPEN_RUN_PREDICATE = "status IN ('pending', 'running') AND closed_at IS NULL"
"""An open run, in SQL: the predicate of the partial index ``open_runs_by_id`` (schema version 9,
ADR 0079; of ``open_runs_by_owner``, which it replaced, before), spelled in the migrations and in
every query of open runs exactly so (SQLite uses a partial index only for a query whose ``WHERE``
holds its predicate word for word)."""
OPEN_RUNS_BY_ID = "open_runs_by_id"
"""The partial index ``runs (run_id) WHERE <OPEN_RUN_PREDICATE>``: ``open_runs``' pages, in run id
order from a cursor, are range reads of it (ADR 0079)."""
LEASED_RUN_PREDICATE = f"{OPEN_RUN_PREDICATE} AND owner IS NOT NULL"
"""An open run some process holds (it has an owner, so a lease), in SQL: the predicate of
``leased_runs_by_id`` (schema version 10, ADR 0082), spelled so in its migrations and in the
expired read."""
OPEN_RUN_INDEX_PREDICATE = "closed_at IS NULL"
"""SQLite's predicate of ``open_runs_by_id`` since schema version 12 (ADR 0127): a term of
:data:`OPEN_RUN_PREDICATE`, which the queries keep whole, so SQLite still uses the index for them
and tests the status of each row it gives. It names no column a run's pending -> running sets, so
that update no longer rewrites the run's entry. PostgreSQL's index keeps the whole predicate."""
ENDED_UNCLOSED_PREDICATE = "closed_at IS NULL AND status NOT IN ('pending', 'running')"
"""A run whose status says it ended but which has no ``closed_at``: what a terminal status written
by anything but ``finish_run`` left until schema version 13 / PostgreSQL migration 13 (ADR 0134).
Every write of a terminal status now closes its run (``closes_run``, and each backend's
``close ended`` statement, ``WHERE run_id ... AND <this>``), and the migrations closed the ones
stored before, so SQLite's open-run indexes (``closed_at IS NULL``) hold open runs only."""


def closes_run(status: object) -> bool:
    """Whether writing ``status`` to a run ends it, so the write must also set its ``closed_at``
    (ADR 0134): any status but the open ones."""
    return status is not None and status not in OPEN_RUN_STATUSES


LEASED_RUN_INDEX_PREDICATE = f"{OPEN_RUN_INDEX_PREDICATE} AND owner IS NOT NULL"
"""SQLite's predicate of ``leased_runs_by_id`` since schema version 12 (ADR 0127): terms of
:data:`LEASED_RUN_PREDICATE`, as :data:`OPEN_RUN_INDEX_PREDICATE` is of the open runs'."""
LEASED_RUNS_BY_ID = "leased_runs_by_id"
"""The partial index ``runs (run_id) WHERE <LEASED_RUN_PREDICATE>``: the sweep's expired read
(``open_runs(expired=True)``) is a range read of it, which visits the runs held by a process --
at most the replicas' concurrency, plus those whose process is gone -- and none of the queued or
suspended runs, however many wait (ADR 0082). A lease renewal changes none of its columns: on
PostgreSQL it stays a heap-only update (ADR 0079)."""


def open_runs_where(
    placeholder: str, *, after: bool, run_ids: str | None, expired: str | None
) -> str:
    """``open_runs``' ``WHERE`` in both SQL backends: the open runs (the indexes' predicate word
    for word), after a cursor when ``after``, among ``run_ids`` (the backend's test of a list
    parameter) and, with ``expired`` (the backend's now), held by a process whose lease has
    expired by then (``leased_runs_by_id``'s predicate word for word: a run without an owner has
    no lease to expire)."""
    where = [LEASED_RUN_PREDICATE if expired is not None else OPEN_RUN_PREDICATE]
    if after:
        where.append(f"run_id > {placeholder}")
    if run_ids is not None:
        where.append(run_ids)
    if expired is not None:
        where.append(f"lease_expires_at <= {expired}")
    return " AND ".join(where)


LIFECYCLE_INDEX = "lifecycle_events"
"""The partial index ``events (run_id, seq) WHERE <LIFECYCLE_INDEX_PREDICATE>`` (schema version
8, ADR 0066): a run's lifecycle events in order, without an entry for any delta."""
LIFECYCLE_INDEX_TYPES: tuple[str, ...] = (
    "capability.resolved",
    "run.error",
    "run.failed",
    "run.interrupted",
    "run.resumed",
    "run.settlement.completed",
    "run.started",
    "task.completed",
    "task.started",
    "worker.completed",
)
"""The types ``lifecycle_events`` holds: every type the projection uses when the migration was
written. Fixed with it: a new type a check must read needs a new migration (a test compares
this with ``PROJECTED_EVENT_TYPES``); until then reading it walks the run's events."""
LIFECYCLE_INDEX_PREDICATE = "({})".format(
    " OR ".join(f"type = '{t}'" for t in LIFECYCLE_INDEX_TYPES)
)
"""The index's ``WHERE``, spelled in the migrations and in a query exactly so: both planners use
a partial index only for a query whose ``WHERE`` holds its predicate, and SQLite only word for
word. Equalities, not ``type IN (...)``: every append evaluates it for each event, and SQLite
builds a table of an ``IN`` list of more than two values for each row it inserts (in memory:
15.4 µs a row against 6.6 without the index, 7.3 with the equalities)."""


def typed_read_sql(
    placeholder: str,
    run_id: str,
    types: Iterable[str],
    *,
    after: int,
    limit: int | None,
    hint: str = "",
) -> tuple[str, tuple[Any, ...]]:
    """``read_types``' query in both SQL backends, and its parameters: the run's events of
    ``types`` with ``seq > after``, in order, at most ``limit``. When ``types`` are among
    ``LIFECYCLE_INDEX_TYPES`` (a check's are), through ``lifecycle_events``: the index's own
    predicate is added, and ``hint`` after the table's name (SQLite's ``INDEXED BY``: without
    statistics its planner prefers the primary key, which holds every column, to the index)."""
    typed, names = lifecycle_types_sql(placeholder, types)
    indexed = bool(names) and set(names) <= set(LIFECYCLE_INDEX_TYPES)
    select = SQLITE_EVENT_SELECT if placeholder == "?" else EVENT_SELECT
    source = f"{select}{hint}" if indexed else select
    partial = f" AND {LIFECYCLE_INDEX_PREDICATE}" if indexed else ""
    query = (
        f"{source} WHERE run_id = {placeholder} AND seq > {placeholder} AND {typed}{partial} "
        f"ORDER BY seq LIMIT {placeholder}"
    )
    return query, (run_id, max(after, 0), *names, SEQ_MAX if limit is None else max(limit, 0))


def run_row(run: RunRecord) -> tuple[Any, ...]:
    """The run's columns, its texts as the index keeps them (``storable_run``, ADR 0114)."""
    run = storable_run(run)
    return (
        run.run_id,
        run.prompt,
        run.model,
        run.chain_of_thought,
        run.worker_backend,
        run.status,
        run.created_at,
        run.updated_at,
        dumps(run.usage, what="run usage"),
        run.error,
        dumps(run.metadata, what="run metadata"),
        run.owner,
        run.lease_expires_at,
        run.started_by,
    )


def run_from_row(row: Sequence[Any], tasks: Iterable[TaskRecord] = ()) -> RunRecord:
    return RunRecord(
        row[0],
        row[1],
        model=row[2],
        chain_of_thought=row[3],
        worker_backend=row[4],
        status=cast(RunStatus, row[5]),
        created_at=row[6],
        updated_at=row[7],
        usage=decode_object(row[8]),
        error=row[9],
        metadata=decode_object(row[10]),
        tasks=list(tasks),
        owner=row[11],
        lease_expires_at=row[12],
        started_by=row[13],
    )


def runs_from_rows(
    runs: Sequence[Sequence[Any]], tasks: Iterable[Sequence[Any]]
) -> list[RunRecord]:
    """Run records for ``runs`` (run columns first), each with its rows of ``tasks`` (task
    columns, in index order)."""
    by_run: dict[str, list[TaskRecord]] = {}
    for t in tasks:
        by_run.setdefault(t[0], []).append(task_from_row(t))
    return [run_from_row(r, by_run.get(r[0], ())) for r in runs]


def task_row(task: TaskRecord) -> tuple[Any, ...]:
    """The task's columns, its texts as the index keeps them (``storable_task``, ADR 0114)."""
    task = storable_task(task)
    return (
        task.run_id,
        task.task_id,
        task.index,
        task.prompt,
        task.status,
        task.output,
        task.reasoning,
        dumps(task.usage, what="task usage"),
        task.error,
        task.model,
        task.backend,
    )


def task_from_row(row: Sequence[Any]) -> TaskRecord:
    return TaskRecord(
        row[1],
        row[0],
        row[2],
        row[3],
        status=cast(TaskStatus, row[4]),
        output=row[5],
        reasoning=row[6],
        usage=decode_object(row[7]),
        error=row[8],
        model=row[9],
        backend=row[10],
    )


def key_row(key: ApiKeyRecord) -> tuple[Any, ...]:
    return (key.key_id, key.name, key.role, key.key_hash, key.created_at, key.revoked_at)


def key_from_row(row: Sequence[Any]) -> ApiKeyRecord:
    return ApiKeyRecord(row[0], row[1], row[2], row[3], created_at=row[4], revoked_at=row[5])


def spec_row(spec: RunSpecRecord, *, created_at: float) -> tuple[Any, ...]:
    return (
        spec.run_id,
        dumps(spec.spec, what="run spec"),
        spec.key_id,
        spec.durable,
        spec.resume,
        spec.queue,
        spec.attempts,
        spec.queued_at,
        created_at,
    )


def spec_from_row(row: Sequence[Any]) -> RunSpecRecord:
    return RunSpecRecord(
        str(row[0]),
        decode_object(row[1]),
        key_id=None if row[2] is None else str(row[2]),
        durable=bool(row[3]),
        resume="queue" if row[4] == "queue" else "manual",
        queue=None if row[5] is None else str(row[5]),
        attempts=int(row[6]),
        queued_at=None if row[7] is None else float(row[7]),
        created_at=float(row[8]),
    )


def merged_metadata(current: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``update_run(metadata=...)`` merges top-level keys, like the memory store."""
    return {**current, **update}
