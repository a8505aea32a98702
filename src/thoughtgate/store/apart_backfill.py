"""Reasoning kept apart in rows written before ADR 0160: the backfill that moves it (ADR 0167).

ADR 0160 keeps what the declarations class as reasoning or trace (and a continuity carrier's
bytes) apart from an event's row, so that a read for a reader who may not see it never loads it.
Rows written before that version keep their payload whole: a viewer's read of them still loads
their reasoning (the filter withholds it, as it always did), so its time still grows with it.

The backfill stores those rows as the store writes an event now (``codec.moved_apart``: the same
split, ``codec._split``) and changes nothing else: the event's number, type, task, time, version
and -- read whole, by any reader -- its payload are what they were. Only where its bytes sit
changes. It walks the log in its key's order, ``(run_id, seq)``, a window of rows at a time, and
moves each window's rows in short write transactions of their own (:data:`BATCH` rows, and
:data:`BATCH_BYTES` of payload text at most): the daemon's appends go on between them (SQLite's one
writer, PostgreSQL's row locks on the rows being moved only). A row is moved at most once: a
transaction re-reads each row under its write lock and moves it only while nothing of it is kept
apart, so a crash, a failure, a second backfill at the same time or a rerun loses nothing and
moves nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from thoughtgate.errors import UsageError
from thoughtgate.store import codec

__all__ = [
    "BATCH",
    "BATCH_BYTES",
    "START",
    "WINDOW",
    "ApartPage",
    "ApartTotals",
    "Batch",
    "Cursor",
    "MovesApart",
    "move_all_apart",
    "window_sql",
]

Cursor = tuple[str, int]
"""Where the walk is: the ``(run_id, seq)`` of the last row looked at."""

START: Final[Cursor] = ("", -1)
"""Before every row of the log: ``(run_id, seq) > START`` holds for each (numbers start at 1)."""
WINDOW: Final = 2000
"""Rows of the log looked at per read (of every type: their types and markers only)."""
BATCH: Final = 100
"""Rows moved per write transaction, at most."""
BATCH_BYTES: Final = 4 << 20
"""Payload text moved per write transaction, at most (a row longer than it is moved alone): a
transaction's time, and SQLite's write lock, stay bounded however long the reasoning."""


def window_sql(placeholder: str) -> tuple[str, str, str]:
    """Both SQL stores' reads of a window, with their ``placeholder``: its last row (a range of
    the primary key, ``OFFSET WINDOW - 1``), and the keys of the rows in it still whole of the
    types that keep something apart (``codec.apart_types``) up to that row, or to the end of the
    log. Keys only: a marker of ``NULL`` takes no bytes of a SQLite record's body, no payload
    is read. Parameters: the cursor, the last row (the bounded one), the types."""
    p = placeholder
    end = (
        f"SELECT run_id, seq FROM events WHERE (run_id, seq) > ({p}, {p}) "
        f"ORDER BY run_id, seq LIMIT 1 OFFSET {p}"
    )
    typed, _ = codec.lifecycle_types_sql(p, codec.apart_types())
    rows = "SELECT run_id, seq FROM events WHERE (run_id, seq) > ({p}, {p}){upper} AND {typed} "
    rows += "AND apart IS NULL ORDER BY run_id, seq"
    bounded = rows.format(p=p, upper=f" AND (run_id, seq) <= ({p}, {p})", typed=typed)
    return end, bounded, rows.format(p=p, upper="", typed=typed)


@dataclass(frozen=True, slots=True)
class ApartPage:
    """One step of the walk (``EventStore.move_apart``)."""

    looked_at: int
    """Rows of the types that keep something apart (``codec.apart_types``) found whole."""
    moved: int
    """Of those, the rows moved (``dry_run``: that would be): each had something to keep apart."""
    refused: tuple[Cursor, ...] = ()
    """Rows whose payload the codec could not read or write again (not written by it): left as
    they are, named here."""
    after: Cursor | None = None
    """Where the next step starts; ``None``: the walk reached the end of the log."""


@dataclass(slots=True)
class ApartTotals:
    """What a whole walk did (:func:`move_all_apart`)."""

    looked_at: int = 0
    moved: int = 0
    refused: list[Cursor] = field(default_factory=list)
    steps: int = 0

    def add(self, page: ApartPage) -> None:
        self.looked_at += page.looked_at
        self.moved += page.moved
        self.refused.extend(page.refused)
        self.steps += 1


@dataclass(slots=True)
class Batch:
    """One transaction's rows, as a backend's loop goes through them (SQLite's and PostgreSQL's
    read and write the rows, this decides): :meth:`takes` the next row while the batch is under
    :data:`BATCH_BYTES` (its first row always), :meth:`split` says what to write for it."""

    done: int = 0
    moved: int = 0
    size: int = 0
    refused: list[Cursor] = field(default_factory=list)

    def takes(self) -> bool:
        if self.done and self.size >= BATCH_BYTES:
            return False
        self.done += 1
        return True

    def split(self, key: Cursor, event_type: str, payload: str) -> tuple[str, str] | None:
        """The row's texts moved apart (``codec.moved_apart``), or ``None``: it stays as it is
        (nothing to move, or a payload the codec did not write: named in ``refused``)."""
        self.size += len(payload)
        try:
            split = codec.moved_apart(event_type, payload)
        except UsageError:
            self.refused.append(key)
            return None
        self.moved += split is not None
        return split


class MovesApart:
    """What a store offers the backfill. The SQL stores implement it; a store that keeps no
    payload text (memory) has nothing inline: the defaults say so."""

    async def inline_candidates(self) -> int:
        """How many rows of the types that keep something apart are still whole (an upper
        bound of what a walk moves: most rows written since ADR 0160 hold nothing to keep
        apart and are whole too). One read of the log's types and markers, no payload."""
        return 0

    async def move_apart(
        self, after: Cursor | None = None, *, dry_run: bool = False, batch: int = BATCH
    ) -> ApartPage:
        """One step of the walk from ``after`` (``None``: the start of the log): the next
        :data:`WINDOW` rows looked at, those holding reasoning inline moved apart in write
        transactions of at most ``batch`` rows (``dry_run``: only counted, nothing written).
        A failure rolls back the transaction it happened in and raises; what earlier
        transactions moved stays moved, and a walk started again moves the rest."""
        return ApartPage(0, 0)


async def move_all_apart(
    store: MovesApart,
    *,
    dry_run: bool = False,
    batch: int = BATCH,
    each: Callable[[ApartPage], None] | None = None,
) -> ApartTotals:
    """The whole walk, from the start of the log, step by step (``each`` is told each step:
    a progress bar). Started again after a failure, it finds the rows moved before already
    apart, and moves the rest."""
    totals = ApartTotals()
    after: Cursor | None = None
    while True:
        page = await store.move_apart(after, dry_run=dry_run, batch=batch)
        totals.add(page)
        if each is not None:
            each(page)
        if page.after is None:
            return totals
        after = page.after
