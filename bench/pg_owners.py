"""Throwaway PostgreSQL schemas and databases that record the process owning them, and the sweep
that drops those whose owner is gone (ADR 0134; the tests' schemas since the fixtures of
``tests/support/pg.py``).

A name made here is ``tg_<kind>_o<owner>_<random>[_<label>]``: ``kind`` is ``test`` (the test
suite) or ``bench`` (``bench/``), ``owner`` the process's tag, ``label`` what the user adds
(``_workflows`` for DBOS's schema beside a store's, a bench's own word). An owner is alive while
its *keeper* is: a connection the process opens before it names anything and holds until it exits,
its ``application_name`` ``tg_<kind>_owner:<owner>``. A process killed mid-run (Ctrl-C twice, a
timeout, an OOM kill) cannot drop what it made, but its keeper ends with it (the server sees the
socket close), so the first name made by every later test or bench process sweeps them
(:func:`sweep_abandoned`): a schema or a database is dropped only when no session of the server is
its owner's keeper. A live process's (another xdist worker, a bench running beside the tests, a run
on another machine using the same server) and anything named otherwise are left alone.

Names that record no owner -- ``tg_test_<12 hex>`` and ``tg_bench_<12 hex>`` (with a label), made
before owners were recorded (ADR 0134) -- cannot be matched to a process. The sweep drops those
once they have gone unused for :data:`UNOWNED_AFTER` (ADR 0141): the first sweep that sees one
stamps it (``COMMENT``) with the server's time and a count of what was done in it (its tables'
scans and row changes for a schema, its transactions for a database); a later sweep that finds the
count changed, or the schema's tables locked, or a session in the database, stamps it again; one
that finds the stamp older than :data:`UNOWNED_AFTER` and nothing done since drops it. One sweep
at a time does this (an advisory lock; the others skip it). A name that carries a comment of
someone else's, or any other name, is never touched.

A sweep never fails or stalls the process that sweeps (ADR 0144): a statement that fails because
another session has the name at the same moment (another process's sweep dropping it, "tuple
concurrently updated", a deadlock, a lock, a database in use, a name already gone: :func:`taken`)
is passed over and logged at debug, as is a dead owner's name the listing saw in use (not
tried). All its statements together have :data:`SWEEP_BUDGET`, each under a
``statement_timeout`` no longer than what is left; the rest waits for the next sweep. Any other
error is raised.

``bench/`` holds this module because the bench cannot import the tests' support code, while the
tests load ``bench/`` modules already (``tests/support/bench_modules.py``).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import re
import secrets
import threading
import time
import uuid
from typing import Any, Literal

__all__ = [
    "KEEPER_PREFIXES",
    "LOCK_TIMEOUT",
    "SWEEP_BUDGET",
    "UNOWNED_AFTER",
    "Owner",
    "owner_of",
    "sweep_abandoned",
    "taken",
    "unowned",
]

Kind = Literal["test", "bench"]
KEEPER_PREFIXES: dict[str, str] = {"test": "tg_test_owner:", "bench": "tg_bench_owner:"}
"""The ``application_name`` of an owner's keeper, before the owner's tag, by kind."""
_OWNED: re.Pattern[str] = re.compile(r"tg_(?:test|bench)_o([0-9a-z]+)_[0-9a-f]{8}(?:_[a-z_]+)?")
"""A name :meth:`Owner.name` made: the owner's tag is group 1."""

_UNOWNED: re.Pattern[str] = re.compile(r"tg_(?:test|bench)_[0-9a-f]{12}(?:_[a-z_]+)?")
"""A name made before owners were recorded (``tg_test_<12 hex>``, ``tg_bench_<12 hex>_<label>``)."""
UNOWNED_AFTER = datetime.timedelta(hours=24)
"""How long an unowned schema or database must have gone unused before a sweep drops it: far
beyond any test or bench run, whose names are used all along (ADR 0141)."""
_STAMP: re.Pattern[str] = re.compile(
    r"thoughtgate sweep: unowned, unused since (\S+) \(done: (\d+)\)"
)
"""The comment a sweep leaves on an unowned name: when it was first seen unused, and the count of
what had been done in it then."""


def unowned(name: str) -> bool:
    """Whether ``name`` is a test's or the bench's made before owners were recorded."""
    return _UNOWNED.fullmatch(name) is not None


def owner_of(name: str) -> str | None:
    """The tag of the process that owns the schema or database ``name``; ``None`` when its name
    records none (named before owners were recorded, or not by the tests or the bench)."""
    found = _OWNED.fullmatch(name)
    return found.group(1) if found else None


class Owner:
    """This process, as the owner of the names it makes on one server (one per kind and URL)."""

    def __init__(self, url: str, kind: Kind) -> None:
        self.url = url
        self.kind = kind
        self._lock = threading.Lock()
        self._keeper: Any = None
        self._tag = ""

    def tag(self) -> str:
        """This process's tag, its keeper opened (and the abandoned names swept) the first
        time."""
        import psycopg

        with self._lock:
            if self._keeper is None or self._keeper.closed:
                tag = f"{os.getpid()}r{secrets.token_hex(3)}"
                keeper = psycopg.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=5,
                    application_name=KEEPER_PREFIXES[self.kind] + tag,
                )
                self._keeper, self._tag = keeper, tag
                atexit.register(keeper.close)  # it would end with the process anyway
                sweep_abandoned(keeper)
            return self._tag

    def name(self, suffix: str = "") -> str:
        """A new schema or database name owned by this process (not created: whoever uses it
        creates it). ``suffix`` (lower case and ``_`` only, starting with ``_``) is kept at the
        end."""
        return f"tg_{self.kind}_o{self.tag()}_{uuid.uuid4().hex[:8]}{suffix}"


_SCHEMAS = (
    "SELECT n.nspname, obj_description(n.oid, 'pg_namespace'), "
    "  (SELECT coalesce(sum(s.seq_scan + coalesce(s.idx_scan, 0) + s.n_tup_ins + s.n_tup_upd"
    "     + s.n_tup_del), 0)::bigint FROM pg_stat_all_tables s WHERE s.schemaname = n.nspname), "
    "  EXISTS (SELECT FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
    "     WHERE c.relnamespace = n.oid AND l.pid <> pg_backend_pid() "
    "     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())) "
    "FROM pg_namespace n WHERE nspname LIKE 'tg\\_test\\_%' OR nspname LIKE 'tg\\_bench\\_%'"
)
"""The tests' and the bench's schemas: name, comment, what was done in their tables (scans and
row changes), and whether another session holds a lock on one of them."""
_DATABASES = (
    "SELECT d.datname, shobj_description(d.oid, 'pg_database'), "
    "  coalesce(s.xact_commit + s.xact_rollback, 0), EXISTS (SELECT FROM pg_stat_activity a "
    "     WHERE a.datid = d.oid AND a.backend_type = 'client backend') "
    "FROM pg_database d LEFT JOIN pg_stat_database s ON s.datid = d.oid "
    "WHERE d.datname LIKE 'tg\\_test\\_%' OR d.datname LIKE 'tg\\_bench\\_%'"
)
"""The tests' and the bench's databases: name, comment, transactions done in them, and whether a
client is connected to one (an autovacuum worker is not a user)."""


_TRY_LOCK = "SELECT pg_try_advisory_lock(%s)"
_UNOWNED_LOCK = 0x7467_7377_6565_70  # "tgsweep": held by the sweep judging the unowned names

SWEEP_BUDGET = datetime.timedelta(seconds=5)
"""How long one sweep may take, all its statements together (ADR 0144): what is left when it runs
out waits for the next sweep (the next test or bench process to start)."""
LOCK_TIMEOUT = datetime.timedelta(seconds=2)
"""How long one ``DROP`` may wait for a lock: a name still locked is left for a later sweep."""

_SLACK_MS = 250
"""How far past its budget a sweep may run: the bound is set again only when it would outlast
what is left by more."""

_log = logging.getLogger("bench.pg_owners")

_TAKEN_STATES = {
    "55P03": "locked",  # lock_not_available: the lock timeout, or a NOWAIT
    "55006": "in use",  # object_in_use: a database someone is connected to
    "40P01": "deadlock",  # two sweeps dropping overlapping names in different orders
    "3F000": "gone",  # invalid_schema_name, invalid_catalog_name, undefined_object
    "3D000": "gone",  #   (a COMMENT on a name another sweep has just dropped)
    "42704": "gone",
}
_TAKEN_INTERNAL = (
    "tuple concurrently updated",
    "tuple concurrently deleted",
    "cache lookup failed",
)
"""PostgreSQL's internal errors (``XX000``) when another session changed or dropped the catalog
row a statement was about to change (another sweep dropping the same schema, a dependent object
dropped at the same moment): it has them, not something wrong."""


def taken(exc: BaseException) -> str | None:
    """Why a sweep's statement failed because another session has the name (another process's
    sweep got there first, its owner's session still holds it, the sweep's budget ran out while
    it waited), or ``None`` for a real error, which the sweep raises."""
    state = getattr(exc, "sqlstate", None)
    if state in _TAKEN_STATES:
        return _TAKEN_STATES[state]
    diag = getattr(exc, "diag", None)
    message = (getattr(diag, "message_primary", None) or "") if diag is not None else ""
    if state == "57014" and "statement timeout" in message:
        return "out of time"  # the sweep's budget: a cancel from anyone else is not ours
    if state == "XX000" and message.startswith(_TAKEN_INTERNAL):
        return "concurrently changed"
    return None


class _Budget:
    """The time one sweep has left: each statement runs under a ``statement_timeout`` (and a
    ``lock_timeout``) no longer than it."""

    def __init__(self, admin: Any, budget: datetime.timedelta) -> None:
        self.admin = admin
        self.deadline = time.monotonic() + budget.total_seconds()
        self._bound: int | None = None

    def left_ms(self) -> int:
        return int((self.deadline - time.monotonic()) * 1000)

    def execute(self, statement: Any, params: Any = None) -> Any:
        """Run ``statement`` bounded by what is left (``TimeoutError`` when nothing is)."""
        left = self.left_ms()
        if left < 10:
            raise TimeoutError("the sweep's budget is spent")
        if self._bound is None or self._bound > left + _SLACK_MS:
            # a round trip more only when the bound set last would outlast the budget by more
            # than the slack: a sweep that finds nothing to drop sets it once
            self.admin.execute(
                "SELECT set_config('statement_timeout', %s, false), "
                "set_config('lock_timeout', %s, false)",
                (str(left), str(min(left, int(LOCK_TIMEOUT.total_seconds() * 1000)))),
            )
            self._bound = left
        return self.admin.execute(statement, params)

    def attempt(self, what: str, statement: Any) -> bool:
        """Run ``statement``; ``False`` (logged at debug) when another session has ``what``."""
        import psycopg

        try:
            self.execute(statement)
        except psycopg.Error as exc:
            reason = taken(exc)
            if reason is None:
                raise
            _log.debug("sweep: left %s (%s): %s", what, reason, exc)
            return False
        return True


def sweep_abandoned(
    admin: Any,
    *,
    later: datetime.timedelta = datetime.timedelta(0),
    budget: datetime.timedelta = SWEEP_BUDGET,
) -> list[str]:
    """Drop every schema and database :meth:`Owner.name` made whose owner's keeper is gone, and
    every unowned one (:func:`unowned`) unused for :data:`UNOWNED_AFTER`, and return their names.
    ``admin``: an autocommit connection (``DROP DATABASE`` runs outside a transaction) to a
    database that is none of them. ``later``: judge the unowned names as if the server's clock
    were that much ahead (a test's day passes at once, for its own sweep only). ``budget``: how
    long the sweep may take; what it has not done by then is left for the next sweep.

    The names are listed before the live keepers: a name is made after its owner's keeper
    connected, so an owner alive when the names were listed is among the keepers. A schema still
    locked, or a database someone is still connected to (an orphaned daemon of its owner), is left
    for a later sweep rather than forced, as is a name another process's sweep is dropping at the
    same moment (:func:`taken`, ADR 0144): a sweep never fails its process for that."""
    import psycopg

    bounded = _Budget(admin, budget)
    gone: list[str] = []
    try:
        _sweep(bounded, later, gone)
    except TimeoutError:
        _log.debug("sweep: out of time, the rest is left for the next sweep")
    except psycopg.errors.QueryCanceled as exc:
        if taken(exc) is None:
            raise
        _log.debug("sweep: out of time listing the names, left for the next sweep")
    finally:
        admin.execute("RESET statement_timeout")
        admin.execute("RESET lock_timeout")
    return gone


def _sweep(bounded: _Budget, later: datetime.timedelta, gone: list[str]) -> None:
    """:func:`sweep_abandoned`'s work, each statement under ``bounded``; what it drops is added to
    ``gone`` as it goes."""
    from psycopg import sql

    now: datetime.datetime = bounded.execute("SELECT now()").fetchone()[0] + later
    schemas = bounded.execute(_SCHEMAS).fetchall()
    databases = bounded.execute(_DATABASES).fetchall()
    live = set()
    for (name,) in bounded.execute(
        "SELECT application_name FROM pg_stat_activity "
        "WHERE application_name LIKE %s OR application_name LIKE %s",
        tuple(prefix + "%" for prefix in KEEPER_PREFIXES.values()),
    ).fetchall():
        live.add(name.partition(":")[2])
    # A name seen in use (a table of the schema locked, a client in the database: an orphaned
    # daemon of a dead owner) is left without trying: its DROP would wait for the lock timeout,
    # or 5 s for the database's sessions to go, before failing anyway.
    for drop, rows in (
        ("SCHEMA IF EXISTS {} CASCADE", schemas),
        ("DATABASE IF EXISTS {}", databases),
    ):
        for name, _, _, in_use in rows:
            if (
                not _kept(name, live)
                and _free(name, in_use)
                and bounded.attempt(name, sql.SQL("DROP " + drop).format(sql.Identifier(name)))
            ):
                gone.append(name)
    unowned_found = [
        (kind, row)
        for kind, rows in (("SCHEMA", schemas), ("DATABASE", databases))
        for row in rows
        if unowned(row[0])
    ]
    # One sweep at a time stamps and drops them: two sessions commenting on (or dropping)
    # one name at once fail with "tuple concurrently updated". Another sweep skips them.
    if unowned_found and bounded.execute(_TRY_LOCK, (_UNOWNED_LOCK,)).fetchone()[0]:
        try:
            for kind, (name, comment, done, in_use) in unowned_found:
                if _unused_long(bounded, kind, name, comment, done, in_use, now):
                    gone.append(name)
        finally:
            bounded.admin.execute("SELECT pg_advisory_unlock(%s)", (_UNOWNED_LOCK,))


def _free(name: str, in_use: bool) -> bool:
    """Whether a dead owner's ``name`` was seen free when listed (else said at debug)."""
    if in_use:
        _log.debug("sweep: left %s (in use)", name)
    return not in_use


def _kept(name: str, live: set[str]) -> bool:
    """Whether the owned sweep leaves ``name``: it records no owner, or a live one."""
    owner = owner_of(name)
    return owner is None or owner in live


def _unused_long(
    bounded: _Budget,
    kind: str,
    name: str,
    comment: str | None,
    done: int,
    in_use: bool,
    now: datetime.datetime,
) -> bool:
    """Drop the unowned schema or database ``name`` if it has gone unused for
    :data:`UNOWNED_AFTER` (and say so), else stamp it as unused from now if it carries no stamp,
    or was used since its stamp (``done``, what its statistics count, changed; ``in_use``, its
    tables locked or a session in it). One with a comment that is not a stamp is left alone."""
    import psycopg
    from psycopg import sql

    stamp = _STAMP.fullmatch(comment) if comment is not None else None
    if comment is not None and stamp is None:
        return False  # someone else's words on it: not ours to judge
    ident = sql.Identifier(name)
    try:
        if stamp is not None and not in_use and int(stamp.group(2)) == done:
            since = datetime.datetime.fromisoformat(stamp.group(1))
            if now - since < UNOWNED_AFTER:
                return False
            drop = "SCHEMA IF EXISTS {} CASCADE" if kind == "SCHEMA" else "DATABASE IF EXISTS {}"
            return bounded.attempt(name, sql.SQL("DROP " + drop).format(ident))
        words = f"thoughtgate sweep: unowned, unused since {now.isoformat()} (done: {done})"
        bounded.attempt(
            name, sql.SQL("COMMENT ON {} {} IS {}").format(sql.SQL(kind), ident, sql.Literal(words))
        )
    except psycopg.errors.InsufficientPrivilege:
        _log.debug("sweep: left %s (not its owner on this server)", name)
    return False
