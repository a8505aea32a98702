"""Finding runs: filtered, searchable keyset pages, and the change feed that keeps a list live.

Two capabilities every store backend offers beside its event log (``RunListing``; the shared
conformance suite checks them on every backend):

* ``query_runs(RunQuery)`` -- one page of runs, newest first, filtered by status, disclosure mode,
  model, the key that started them and a time range, and searched by prompt text. Pages are
  *keyset* pages: the next page starts strictly after the last run of this one (``RunPage.next``,
  an opaque cursor), never at an offset, so reading page 2,000 costs what reading page 1 costs,
  and a run created while someone pages through the list neither shifts nor repeats a row.
* ``run_changes(after=N)`` -- every run that changed (was created, or its status, usage, error or
  metadata changed) since change number ``N``, each once, in its latest state, in change order.
  A reader that resumes after ``N`` can never miss a change that committed late: on SQLite the
  single write lock hands numbers out in commit order (1, 2, 3, ...); on PostgreSQL a change is
  numbered by its transaction and read only once every transaction that could still number a
  change below it has ended (ADR 0140: numbers with gaps, and a committed change is read a moment
  later while an older transaction on the server still runs). ``latest_run_change()`` is never
  below a number a reader was given, and every change at or below it has committed. A live run
  list loads a page, notes ``latest_run_change()`` taken *before* the page, and follows the feed
  from there: a change seen twice is applied twice, harmlessly.

Ordering: newest ``created_at`` first; runs created at the same instant in the order the store
took them, newest first (SQLite's ``rowid``, PostgreSQL's ``insert_order``, the memory store's
counter): ``RunCursor.order``.

Search (``RunQuery.text``) is a case-insensitive substring match on the run's prompt (``%`` and
``_`` mean themselves). Case folding covers ASCII letters on every backend; PostgreSQL (``ILIKE``)
and the memory store also fold other letters, SQLite's ``LIKE`` does not.
"""

from __future__ import annotations

import abc
import base64
import binascii
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from thoughtgate.errors import UsageError
from thoughtgate.events.payloads import RunStatus
from thoughtgate.store.projection import unstorable
from thoughtgate.store.records import RunRecord

__all__ = [
    "MAX_SEARCH_CHARS",
    "RUN_LIST_WAKEUP",
    "RunChanges",
    "RunCursor",
    "RunListing",
    "RunPage",
    "RunQuery",
    "like_pattern",
    "matches",
    "page_query",
    "where_clauses",
]

MAX_SEARCH_CHARS: Final = 200
"""The longest search text a query takes (a prompt search is a scan: keep its input small)."""

RUN_LIST_WAKEUP: Final = "*runs"
"""The ``RunWakeups`` key a store notifies when a run changes (no run id can be this)."""


@dataclass(frozen=True, slots=True)
class RunCursor:
    """Where a page ended: the last run's ``created_at`` and its place among equal times."""

    created_at: float
    order: int

    def encode(self) -> str:
        """Opaque to callers (they pass it back as it is)."""
        raw = json.dumps([self.created_at, self.order], separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode("ascii")).rstrip(b"=").decode("ascii")

    @classmethod
    def decode(cls, text: str) -> RunCursor:
        """The cursor ``encode`` wrote; ``UsageError`` for anything else."""
        bad = UsageError(f"not a run list cursor: {text[:40]!r}; pass the `next` of a page back")
        if len(text) > 200:
            raise bad
        try:
            value = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (ValueError, binascii.Error):
            raise bad from None
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not isinstance(value[0], int | float)
            or isinstance(value[0], bool)
            or not math.isfinite(value[0])
            or not isinstance(value[1], int)
            or isinstance(value[1], bool)
            or not 0 <= value[1] < 2**63
        ):
            raise bad
        return cls(float(value[0]), value[1])


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs, and how many. Empty filters match everything; filters combine with AND, the
    values of one filter with OR."""

    limit: int = 50
    before: RunCursor | None = None
    """Only runs after this cursor (the previous page's ``next``)."""
    statuses: tuple[RunStatus, ...] = ()
    modes: tuple[str, ...] = ()
    """Disclosure modes (``chain_of_thought``)."""
    model: str | None = None
    started_by: str | None = None
    """The id of the API key that started the run."""
    since: float | None = None
    """``created_at >= since``."""
    until: float | None = None
    """``created_at < until``."""
    text: str | None = None
    """A case-insensitive substring of the prompt."""

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise UsageError("a run list page holds at least one run")
        if self.text is not None and len(self.text) > MAX_SEARCH_CHARS:
            raise UsageError(f"search text is limited to {MAX_SEARCH_CHARS} characters")
        for what, value in (("search text", self.text), ("model", self.model)):
            held = None if value is None else unstorable(value)
            if held is not None:  # PostgreSQL refused NUL, SQL a surrogate (ADR 0120)
                raise UsageError(f"{what} {value!r} holds {held}, which no run's index holds")
        if self.started_by is not None and unstorable(self.started_by) is not None:
            raise UsageError(f"started_by {self.started_by!r} is not a key id")


@dataclass(frozen=True, slots=True)
class RunPage:
    """A page of runs (with their tasks), and the cursor of the next page (``None``: the last)."""

    runs: list[RunRecord]
    next: RunCursor | None = None


@dataclass(frozen=True, slots=True)
class RunChanges:
    """Runs changed after a change number, each with the number of its latest change."""

    changes: list[tuple[int, RunRecord]] = field(default_factory=list)

    @property
    def last(self) -> int | None:
        return self.changes[-1][0] if self.changes else None


class RunListing(abc.ABC):
    """The run-list capability of a store (see the module docstring)."""

    @abc.abstractmethod
    async def query_runs(self, query: RunQuery, *, apart: bool = True) -> RunPage:
        """One page of runs matching ``query``, newest first. ``apart=False``: for a reader who
        may see none of a task's fields kept apart (``access.filter.reads_task_apart``, ADR
        0160, amendment 1), those are left unread (``None``), as by ``get_run``."""

    @abc.abstractmethod
    async def run_changes(self, *, after: int, limit: int = 100, apart: bool = True) -> RunChanges:
        """Runs whose latest change number is above ``after``, in change order, at most
        ``limit``; ``apart``: as for ``query_runs``."""

    @abc.abstractmethod
    async def latest_run_change(self) -> int:
        """The highest change number a reader can read (0 for a store without runs)."""


def like_pattern(text: str) -> str:
    """``%text%`` for ``LIKE ... ESCAPE '\\'``, with ``%``, ``_`` and ``\\`` taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def matches(run: RunRecord, query: RunQuery, order: int) -> bool:
    """Whether ``run`` (at ``order`` among equal times) belongs in ``query``'s page, in Python
    (the memory store; SQL backends say the same in SQL)."""
    if query.before is not None and (run.created_at, order) >= (
        query.before.created_at,
        query.before.order,
    ):
        return False
    if query.statuses and run.status not in query.statuses:
        return False
    if query.modes and run.chain_of_thought not in query.modes:
        return False
    if query.model is not None and run.model != query.model:
        return False
    if query.started_by is not None and run.started_by != query.started_by:
        return False
    if query.since is not None and run.created_at < query.since:
        return False
    if query.until is not None and run.created_at >= query.until:
        return False
    return not query.text or query.text.casefold() in run.prompt.casefold()


def where_clauses(
    query: RunQuery, *, placeholder: str, order_column: str, like: str
) -> tuple[str, list[object]]:
    """The ``WHERE`` of ``query`` for the SQL backends (``placeholder``: ``?`` or ``%s``; ``like``:
    ``LIKE`` or ``ILIKE``), with its parameters; ``"1 = 1"`` when nothing filters."""
    p = placeholder
    clauses: list[str] = []
    params: list[object] = []

    def one_of(column: str, values: Sequence[str]) -> None:
        clauses.append(f"{column} IN ({', '.join([p] * len(values))})")
        params.extend(values)

    if query.statuses:
        one_of("status", query.statuses)
    if query.modes:
        one_of("chain_of_thought", query.modes)
    compared = (
        ("model =", query.model),
        ("started_by =", query.started_by),
        ("created_at >=", query.since),
        ("created_at <", query.until),
    )
    for test, value in compared:
        if value is not None:
            clauses.append(f"{test} {p}")
            params.append(value)
    if query.text:
        clauses.append(f"prompt {like} {p} ESCAPE '\\'")
        params.append(like_pattern(query.text))
    if query.before is not None:
        clauses.append(f"(created_at, {order_column}) < ({p}, {p})")
        params.extend((query.before.created_at, query.before.order))
    return (" AND ".join(clauses) or "1 = 1"), params


def page_query(
    query: RunQuery, *, columns: str, placeholder: str, order_column: str, like: str
) -> tuple[str, list[object]]:
    """The ``SELECT`` of ``query``'s page for the SQL backends, with its parameters: ``columns``
    and then ``order_column`` of one run more than the page holds (whether another page follows)."""
    where, params = where_clauses(
        query, placeholder=placeholder, order_column=order_column, like=like
    )
    statement = (
        f"SELECT {columns}, {order_column} FROM runs WHERE {where} "
        f"ORDER BY created_at DESC, {order_column} DESC LIMIT {placeholder}"
    )
    # one more than the page (whether another follows), within the databases' 64-bit integers
    return statement, [*params, min(query.limit, 2**63 - 2) + 1]
